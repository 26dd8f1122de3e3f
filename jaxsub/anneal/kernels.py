"""Moves, schedule sweeps and the ``fit`` driver for subsample-annealed collapsed Gibbs.

Moves are pure functions of ``(rng_key, state, ...)``:

* :func:`tick` runs one schedule tick on one chain: an optional *remove* of a
  row (chosen by the schedule's policy) followed by an optional *assign* of an
  unassigned row, a Gibbs draw from eq. (star) of Obermeyer et al. (2014).
  With both, on a full subsample, it is the classic collapsed Gibbs step
  (Neal 2000, algorithm 3).
* :func:`resample_hypers` is one Gibbs sweep over the hyperparameters on
  discrete grids (alpha, d, Dirichlet/Beta pseudo-counts, NIX parameters),
  conditioned on the current partition; the kernels call it once per full
  cycle through the current subsample (section 2.4).
* :func:`build_sweep` returns a function that runs a span of a schedule for a
  batch of chains as one ``lax.scan`` of ``vmap``-ed ticks.
* :func:`fit` drives a whole schedule: compiled sweeps, capacity growth
  outside jit, checkpoints with held-out scores, wall-clock.
* :func:`collapsed_gibbs` is the BlackJAX-style ``SamplingAlgorithm`` of
  full-data random-scan collapsed Gibbs (one row per step).

No cluster is ever dropped: when a tick must add a row and every slot is
occupied, the chain *halts* before that tick (``state.halted``; ``info.overflow``)
and does nothing more until the state is reallocated with
:func:`jaxsub.anneal.mixture.grow` (``fit`` does this and resumes exactly where
the chain stopped: tick keys depend only on the tick index, so a grown run
reproduces the draws of a run that had the larger capacity from the start).
"""
from __future__ import annotations

import math
import time
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.anneal import mixture as mx
from jaxsub.anneal.model import (
    BetaBernoulli,
    DirichletCategorical,
    EncodedData,
    HyperGrids,
    Hypers,
    MixtureModel,
    PitmanYor,
    default_grids,
    encode,
    init_hypers,
)
from jaxsub.anneal.schedules import GIBBS, Schedule
from jaxsub.base import SamplingAlgorithm
from jaxsub.types import PRNGKey
from jaxsub.validation import check_int

__all__ = [
    "AnnealState",
    "FitResult",
    "FitTrace",
    "TickInfo",
    "build_sweep",
    "collapsed_gibbs",
    "fit",
    "heldout_score",
    "init",
    "resample_hypers",
    "schedule_windows",
    "tick",
]


class AnnealState(NamedTuple):
    """State of one chain running a subsample schedule.

    Attributes
    ----------
    mixture
        The collapsed :class:`~jaxsub.anneal.mixture.MixtureState`.
    order
        ``[N]`` int32 row order. Policy ``"random"``: ``order[:num_assigned]`` are the
        assigned rows, the rest unassigned (swap-to-end bookkeeping, O(1) per move).
        Policy ``"fifo"``: a fixed shuffled cycle; the subsample is the window
        ``order[(head + i) % N], i < num_assigned``.
    num_assigned
        Current subsample size.
    head
        Start of the FIFO window (unused by ``"random"``).
    cursor
        Index of the next schedule tick.
    since_hyper
        Adds since the last hyperparameter step.
    halted
        True when the chain stopped because an add found no empty cluster slot.
    """

    mixture: mx.MixtureState
    order: jnp.ndarray
    num_assigned: jnp.ndarray
    head: jnp.ndarray
    cursor: jnp.ndarray
    since_hyper: jnp.ndarray
    halted: jnp.ndarray


class TickInfo(NamedTuple):
    """What one tick did.

    Attributes
    ----------
    removed_row, added_row
        Rows touched (``-1`` when the tick had no such move).
    cluster
        Slot the added row joined (``-1`` if none).
    log_normalizer
        ``log sum_k exp(logits_k)`` of the assign step (unnormalised eq. star);
        ``log_normalizer - log(n + alpha)`` is the sequential predictive log density.
    overflow
        True if this tick needed a new cluster slot and none was free (the chain halted).
    """

    removed_row: jnp.ndarray
    added_row: jnp.ndarray
    cluster: jnp.ndarray
    log_normalizer: jnp.ndarray
    overflow: jnp.ndarray


def init(rng_key: PRNGKey, model: MixtureModel, data: EncodedData, capacity: int, *, policy: str = "random",
         assignments=None, hypers: Hypers | None = None, dtype=jnp.float32) -> AnnealState:
    """Initial chain state: empty subsample, or a given assignment vector.

    Parameters
    ----------
    rng_key
        Used for the shuffled FIFO order (policy ``"fifo"``); ignored by ``"random"``.
    assignments
        Optional ``[N]`` labels in ``[-1, capacity)``. For ``"random"`` the assigned
        rows are put first in ``order``; for ``"fifo"`` they must be a prefix of the
        shuffled order, so only ``None`` (empty) or a full assignment is accepted.
    """
    n = data.cat.shape[0]
    if hypers is None:
        hypers = init_hypers(model, dtype)
    if assignments is None:
        mixture = mx.empty_state(model, n, capacity, hypers, dtype)
        num = jnp.zeros((), jnp.int32)
        on = jnp.zeros((n,), bool)
    else:
        mixture = mx.state_from_assignments(model, data, assignments, capacity, hypers, dtype)
        on = mixture.assignments >= 0
        num = jnp.sum(on).astype(jnp.int32)
    if policy == "fifo":
        order = jax.random.permutation(rng_key, n).astype(jnp.int32)
    else:
        # assigned rows first (stable), so order[:num] is the subsample
        order = jnp.argsort(jnp.where(on, 0, 1), stable=True).astype(jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    return AnnealState(mixture, order, num, zero, zero, zero, jnp.zeros((), bool))


def _sample_index(u, logits):
    """Inverse-CDF draw from unnormalised ``logits`` with one uniform ``u`` in [0, 1)."""
    top = jnp.max(logits)
    p = jnp.exp(logits - top)
    c = jnp.cumsum(p)
    k = jnp.argmax(c > u * c[-1]).astype(jnp.int32)
    return k, top + jnp.log(c[-1])


def tick(rng_key: PRNGKey, state: AnnealState, code, beta, *, model: MixtureModel, data: EncodedData,
         policy: str = "random") -> tuple[AnnealState, TickInfo]:
    """One schedule tick (see :mod:`jaxsub.anneal.schedules` for the codes) on one chain.

    Remove (bit 0 of ``code``): policy ``"random"`` picks a uniform assigned row,
    ``"fifo"`` the oldest. Add (bit 1): ``"random"`` picks a uniform unassigned row,
    ``"fifo"`` the next in the cycle; its cluster is drawn from eq. (star) with the
    likelihood raised to ``beta`` (bit 2: likelihood ignored, a prior draw).
    Costs O(capacity x num_features), independent of N.
    """
    u = jax.random.uniform(rng_key, (3,))
    return _tick_uniforms(u, state, code, beta, model=model, data=data, policy=policy)


def _get(x, i):
    """``x[i]`` as a dynamic slice (XLA keeps in-place updates of ``x`` in loops)."""
    return jax.lax.dynamic_slice(x, (jnp.asarray(i, jnp.int32),), (1,))[0]


def _set(x, i, v):
    """``x.at[i].set(v)`` as a dynamic-update-slice."""
    return jax.lax.dynamic_update_slice(x, jnp.asarray(v, x.dtype)[None], (jnp.asarray(i, jnp.int32),))


class _Writes(NamedTuple):
    """Pending writes to the ``[N]`` arrays of a tick, applied in order by :func:`_apply_writes`.

    ``order_pos`` / ``order_val``: ``[4]`` (policy ``"random"``) or ``[0]`` (``"fifo"``);
    ``assign_pos`` / ``assign_val``: ``[2]``. An inactive move writes back the value it read.
    """

    order_pos: jnp.ndarray
    order_val: jnp.ndarray
    assign_pos: jnp.ndarray
    assign_val: jnp.ndarray


def _apply_writes(state: AnnealState, w: _Writes) -> AnnealState:
    """Apply a tick's pending ``[N]``-array writes (sequential dynamic-update-slices)."""
    assignments = state.mixture.assignments
    for i in range(w.assign_pos.shape[0]):
        assignments = _set(assignments, w.assign_pos[i], w.assign_val[i])
    order = state.order
    for i in range(w.order_pos.shape[0]):
        order = _set(order, w.order_pos[i], w.order_val[i])
    return state._replace(mixture=state.mixture._replace(assignments=assignments), order=order)


def _noop_writes(state: AnnealState, policy: str) -> _Writes:
    """Writes that change nothing (re-write element 0 of each array), for one chain."""
    z = jnp.zeros((), jnp.int32)
    n_order = 4 if policy == "random" else 0
    return _Writes(jnp.zeros((n_order,), jnp.int32), jnp.full((n_order,), _get(state.order, z), jnp.int32),
                   jnp.zeros((2,), jnp.int32), jnp.full((2,), _get(state.mixture.assignments, z), jnp.int32))


def _tick_uniforms(u, state, code, beta, *, model, data, policy):
    """:func:`tick` driven by three uniforms ``u`` (remove pick, add pick, cluster draw)."""
    new, writes, info = _tick_plan(u, state, code, beta, model=model, data=data, policy=policy)
    return _apply_writes(new, writes), info


def _tick_plan(u, state, code, beta, *, model, data, policy):
    """The tick without its ``[N]``-array writes: ``(state, writes, info)``.

    ``state`` keeps the input ``order`` and ``assignments``; applying ``writes``
    (:func:`_apply_writes`) completes the tick. :func:`build_sweep` applies them at the
    *start* of the next scan step, so within a step every read of the ``[N]`` arrays
    follows every write to them. XLA:CPU duplicates cheap scalar reads into the fusions
    that consume them; when such a read of the old array landed after the in-place write,
    XLA had to copy both ``[N]`` arrays on every tick (O(N) per tick).
    """
    n_rows = data.cat.shape[0]
    mix = state.mixture
    code = jnp.asarray(code, jnp.int32)
    do_remove = (code & 1) > 0
    do_add = (code & 2) > 0
    prior_only = (code & 4) > 0
    m = state.num_assigned
    order = state.order
    if policy == "random":
        j_r = jnp.clip(jnp.floor(u[0] * m.astype(u.dtype)).astype(jnp.int32), 0, jnp.maximum(m - 1, 0))
    else:
        j_r = state.head
    r = _get(order, j_r)
    k_old = _get(mix.assignments, r)
    singleton = (k_old >= 0) & (mix.sizes[jnp.maximum(k_old, 0)] == 1)
    if model.is_finite:
        can_add = jnp.asarray(True)
    else:
        can_add = jnp.any(mix.sizes == 0) | (do_remove & singleton)
    active = (~state.halted) & (code != 0)
    overflow = active & do_add & ~can_add
    go = active & ~overflow
    g_rem = go & do_remove & (m > 0)
    # All reads of the [N] arrays (order, assignments) happen before any write to them, so
    # XLA updates them in place inside a scan (a read after a write forces an O(N) copy).
    head = state.head
    m1 = m - g_rem.astype(jnp.int32)
    g_add = go & do_add & (m1 < n_rows)
    if policy == "random":
        last = jnp.maximum(m - 1, 0)
        o_last = _get(order, last)
        free = n_rows - m1
        j_a = m1 + jnp.clip(jnp.floor(u[1] * free.astype(u.dtype)).astype(jnp.int32), 0, jnp.maximum(free - 1, 0))
        j_a = jnp.minimum(j_a, n_rows - 1)
        m1c = jnp.minimum(m1, n_rows - 1)

        def after_removal_swap(pos, original):
            # value of order[pos] once the removal swap (j_r <-> last) is applied
            return jnp.where(g_rem & (pos == last), r, jnp.where(g_rem & (pos == j_r), o_last, original))

        a = after_removal_swap(j_a, _get(order, j_a))
        o_m1 = after_removal_swap(m1c, _get(order, m1c))
    else:
        head = jnp.where(g_rem, (head + 1) % n_rows, head)
        a = _get(order, (head + m1) % n_rows)
    a_old = jnp.where(g_rem & (a == r), -1, _get(mix.assignments, a))
    k_rem = jnp.maximum(k_old, 0)
    mix = mx.update_stats(mix, data, r, k_rem, -(g_rem & (k_old >= 0)).astype(jnp.int32))
    logits = mx.assign_logits(model, mix, data.cat[a], data.real[a], beta, prior_only)
    k, log_norm = _sample_index(u[2], logits)
    mix = mx.update_stats(mix, data, a, k, g_add.astype(jnp.int32))
    # writes (deferred: see _tick_plan)
    i32 = lambda *v: jnp.stack([jnp.asarray(x, jnp.int32) for x in v])  # noqa: E731
    assign_pos = i32(r, a)
    assign_val = i32(jnp.where(g_rem, -1, k_old), jnp.where(g_add, k, a_old))
    if policy == "random":
        order_pos = i32(j_r, last, j_a, m1c)
        order_val = i32(jnp.where(g_rem, o_last, r), jnp.where(g_rem, r, o_last),
                        jnp.where(g_add, o_m1, a), jnp.where(g_add, a, o_m1))
    else:
        order_pos = order_val = jnp.zeros((0,), jnp.int32)
    writes = _Writes(order_pos, order_val, assign_pos, assign_val)
    new_state = AnnealState(
        mixture=mix,
        order=order,
        num_assigned=m1 + g_add.astype(jnp.int32),
        head=head,
        cursor=state.cursor + (~(state.halted | overflow)).astype(jnp.int32),
        since_hyper=state.since_hyper + g_add.astype(jnp.int32),
        halted=state.halted | overflow,
    )
    info = TickInfo(
        removed_row=jnp.where(g_rem, r, -1),
        added_row=jnp.where(g_add, a, -1),
        cluster=jnp.where(g_add, k, -1),
        log_normalizer=jnp.where(g_add, log_norm, 0.0),
        overflow=overflow,
    )
    return new_state, writes, info


# --------------------------------------------------------------------------- hyperparameters
def _grid_draw(key, grid, logp):
    return grid[jax.random.categorical(key, logp)]


def resample_hypers(rng_key: PRNGKey, mixture: mx.MixtureState, *, model: MixtureModel,
                    grids: HyperGrids) -> mx.MixtureState:
    """One Gibbs sweep over the hyperparameters on their grids, given the partition.

    Each hyperparameter ``h`` with grid ``{h_1..h_G}`` (uniform prior on the grid) is
    drawn from ``p(h_g | rest) propto p(pi | alpha, d)`` (alpha, d: :func:`log_partition_prior`)
    or ``propto prod_k p(X_k | h_g, rest)`` (feature hyperparameters: Dirichlet-multinomial
    or NIX marginals). Cost O(G x capacity x levels), independent of N.
    """
    h = mixture.hypers
    dt = h.alpha.dtype
    keys = iter(jax.random.split(rng_key, 3 + 2 * len(model.cat_columns) + 4 * len(model.real_columns)))
    alpha, discount = h.alpha, h.discount
    if not model.is_finite:
        if grids.alpha is not None:
            g = jnp.asarray(grids.alpha, dt)
            alpha = _grid_draw(next(keys), g, mx.log_partition_prior(model, mixture.sizes, g, discount))
        if grids.discount is not None and isinstance(model.prior, PitmanYor):
            g = jnp.asarray(grids.discount, dt)
            discount = _grid_draw(next(keys), g, mx.log_partition_prior(model, mixture.sizes, alpha, g))
    cat_prior = h.cat_prior
    totals = []
    for j, i in enumerate(model.cat_columns):
        feat = model.features[i]
        off, L = model.level_offsets[j], feat.num_levels
        counts = mixture.cat_counts[:, off : off + L]
        cur = cat_prior[off : off + L]
        if isinstance(feat, DirichletCategorical) and grids.dirichlet is not None:
            g = jnp.asarray(grids.dirichlet, dt)
            cand = jnp.broadcast_to(g[:, None], (g.shape[0], L))
            cur = jnp.full((L,), _grid_draw(next(keys), g, mx.dirichlet_multinomial_log_marginal(cand, counts)))
        elif isinstance(feat, BetaBernoulli) and grids.beta is not None:
            g = jnp.asarray(grids.beta, dt)
            for level in (1, 0):  # a (level 1) then b (level 0)
                cand = jnp.broadcast_to(cur, (g.shape[0], L)).at[:, level].set(g)
                cur = cur.at[level].set(_grid_draw(next(keys), g, mx.dirichlet_multinomial_log_marginal(cand, counts)))
        cat_prior = cat_prior.at[off : off + L].set(cur)
        totals.append(jnp.sum(cur))
    cat_total = jnp.stack(totals).astype(dt) if totals else h.cat_total
    nix = h.nix
    nix_grids = (grids.nix_mu0, grids.nix_kappa0, grids.nix_nu0, grids.nix_sigma2)
    for j in range(len(model.real_columns)):
        params = nix[j]
        for p, grid in enumerate(nix_grids):
            if grid is None:
                continue
            g = jnp.asarray(grid, dt)
            cand = jnp.broadcast_to(params, (g.shape[0], 4)).at[:, p].set(g)
            params = params.at[p].set(
                _grid_draw(next(keys), g, mx.nix_log_marginal(cand, mixture.sizes, mixture.real_sums[:, j]))
            )
        nix = nix.at[j].set(params)
    return mixture._replace(hypers=Hypers(alpha, discount, cat_prior, cat_total, nix))


def _gated_hypers(key, mixture, need, *, model, grids):
    new = resample_hypers(key, mixture, model=model, grids=grids)
    return jax.tree.map(lambda a, b: jnp.where(need, a, b), new.hypers, mixture.hypers)


# --------------------------------------------------------------------------- sweeps
def build_sweep(model: MixtureModel, *, policy: str, span: int, energy_ramp: int = 0,
                grids: HyperGrids | None = None) -> Callable:
    """A function ``sweep(states, chain_keys, windows, data) -> states`` running ``span`` ticks of every chain.

    ``states`` is a batched :class:`AnnealState` (leading chain axis), ``chain_keys``
    one PRNG key per chain, ``windows`` ``[chains, span]`` the tick codes each chain
    runs next (codes ``schedule.codes[cursor : cursor + span]``, padded with ``-1``
    past the end; see :func:`schedule_windows`), ``data`` the :class:`EncodedData`.
    It is a ``lax.scan`` over ``span`` ticks of ``vmap(tick)``; the
    hyperparameter step sits behind a ``lax.cond`` on "any chain finished a
    cycle", so its grid evaluations are paid only when needed. A chain that
    halts (overflow) does nothing for the rest of the span and resumes at its
    own cursor in the next call. Tick ``t`` of a chain uses the uniforms of
    ``fold_in(chain_key, t)`` (drawn for the whole span in one batch before the
    scan), so results do not depend on ``span`` or on halts. Nothing here depends
    on the schedule's length, so one compiled sweep serves every schedule.
    Each tick's writes to the ``[N]`` arrays (``order``, assignments) are carried
    to the start of the next scan step and applied before that step's reads (and
    once more after the scan), so XLA updates them in place: O(1) per tick in N.
    Not jitted here (the caller jits).
    """
    do_hyper = grids is not None and not grids.empty

    def one_tick(state, u, window, base, data):
        cur = state.cursor
        raw = window[jnp.clip(cur - base, 0, span - 1)].astype(jnp.int32)
        past = (cur - base >= span) | (raw < 0)  # -1 pads the window past the schedule's end
        code = jnp.where(past, 0, raw)
        if energy_ramp > 0:
            beta = jnp.minimum(1.0, (cur.astype(jnp.float32) + 1.0) / energy_ramp)
        else:
            beta = 1.0
        new, writes, _ = _tick_plan(u, state, code, beta, model=model, data=data, policy=policy)
        new = new._replace(cursor=jnp.where(past, cur, new.cursor))  # past the end: stay
        need = (new.since_hyper >= jnp.maximum(new.num_assigned, 1)) & ~new.halted
        return new, writes, need

    def span_uniforms(chain_key, cursor):
        # uniforms of ticks cursor .. cursor + span - 1 of one chain, drawn in one batch
        ticks = cursor + jnp.arange(span, dtype=jnp.int32)
        return jax.vmap(lambda t: jax.random.uniform(jax.random.fold_in(chain_key, t), (3,)))(ticks)

    def sweep(states, chain_keys, windows, data):
        base = states.cursor
        uniforms = jax.vmap(span_uniforms, out_axes=1)(chain_keys, base)  # [span, chains, 3]
        hyper_keys = jax.vmap(lambda k: jax.random.split(k)[1])(chain_keys)

        def body(carry, u):
            states, pending = carry
            # the previous tick's [N]-array writes first, then this tick's reads (no copies)
            states = jax.vmap(_apply_writes)(states, pending)
            states, pending, need = jax.vmap(one_tick, in_axes=(0, 0, 0, 0, None))(states, u, windows, base, data)
            if do_hyper:
                def run_hyper(st):
                    k_hyp = jax.vmap(jax.random.fold_in)(hyper_keys, st.cursor)
                    hyp = jax.vmap(partial(_gated_hypers, model=model, grids=grids))(k_hyp, st.mixture, need)
                    return st._replace(mixture=st.mixture._replace(hypers=hyp),
                                       since_hyper=jnp.where(need, 0, st.since_hyper))

                states = jax.lax.cond(jnp.any(need), run_hyper, lambda st: st, states)
            return (states, pending), None

        pending = jax.vmap(partial(_noop_writes, policy=policy))(states)
        (states, pending), _ = jax.lax.scan(body, (states, pending), uniforms)
        return jax.vmap(_apply_writes)(states, pending)

    return sweep


def schedule_windows(codes: np.ndarray, cursors: np.ndarray, span: int) -> np.ndarray:
    """``[chains, span]`` codes ``codes[cursor : cursor + span]`` per chain, ``-1``-padded (host side)."""
    cursors = np.asarray(cursors, np.int64)
    idx = cursors[:, None] + np.arange(span)[None, :]
    return np.where(idx < codes.size, codes[np.minimum(idx, codes.size - 1)], -1).astype(np.int8)


_SWEEPS: dict = {}
_EXECUTABLES: dict = {}  # compiled sweeps by configuration and argument shapes (reused across fit calls)
_DRIVER_FNS: dict = {}


def _driver_fns(model):
    """Jitted (held-out score, cluster stats) functions, cached per model (data are arguments)."""
    if model not in _DRIVER_FNS:
        score = jax.jit(lambda st, test: heldout_score(model, st, test))
        stats = jax.jit(lambda st: (jax.vmap(mx.num_clusters)(st.mixture),
                                    jax.vmap(partial(mx.log_joint, model))(st.mixture)))
        _DRIVER_FNS[model] = (score, stats)
    return _DRIVER_FNS[model]


def _compiled_sweep(model, policy, span, energy_ramp, grids):
    key = (model, policy, span, energy_ramp, grids)
    if key not in _SWEEPS:
        _SWEEPS[key] = jax.jit(build_sweep(model, policy=policy, span=span, energy_ramp=energy_ramp, grids=grids))
    return _SWEEPS[key]


# --------------------------------------------------------------------------- driver
class FitTrace(NamedTuple):
    """Checkpoints of :func:`fit` (leading axis = checkpoint, then chain).

    Attributes
    ----------
    tick
        ``[K, chains]`` ticks done.
    num_assigned, num_clusters
        ``[K, chains]`` subsample size and number of clusters.
    log_joint
        ``[K, chains]`` ``log p(pi_S, X_S)`` of the current subsample (:func:`mixture.log_joint`).
    heldout
        ``[K, chains]`` summed held-out log predictive of the test rows (NaN without test data).
    alpha, discount
        ``[K, chains]`` partition hyperparameters.
    seconds
        ``[K]`` wall-clock of the sampling so far (compilation and scoring excluded).
    compile_seconds
        Total compilation time (one compile per capacity).
    capacity
        ``[K]`` cluster capacity at each checkpoint.
    """

    tick: np.ndarray
    num_assigned: np.ndarray
    num_clusters: np.ndarray
    log_joint: np.ndarray
    heldout: np.ndarray
    alpha: np.ndarray
    discount: np.ndarray
    seconds: np.ndarray
    compile_seconds: float
    capacity: np.ndarray


class FitResult(NamedTuple):
    """``state``: batched final :class:`AnnealState` (leading chain axis); ``trace``: :class:`FitTrace`."""

    state: AnnealState
    trace: FitTrace


def heldout_score(model: MixtureModel, state, test: EncodedData, batch_size: int = 8192) -> jnp.ndarray:
    """Summed held-out log predictive of ``test`` under a (possibly batched) state; ``[chains]`` or scalar."""
    mixture = state.mixture if hasattr(state, "mixture") else state
    fn = lambda m: jnp.sum(mx.heldout_log_predictive(model, m, test, batch_size))  # noqa: E731
    if mixture.sizes.ndim == 2:
        return jax.vmap(fn)(mixture)
    return fn(mixture)


def fit(rng_key: PRNGKey, data, model: MixtureModel, schedule: Schedule, *, num_chains: int = 1,
        capacity: int = 64, max_capacity: int = 4096, grids: HyperGrids | str | None = "default",
        test_data=None, num_checkpoints: int = 10, span: int | None = None, initial_assignments=None,
        dtype=jnp.float32, progress_bar: bool = False) -> FitResult:
    """Run a subsample schedule on ``num_chains`` independent chains (vmap) and trace scores.

    Parameters
    ----------
    rng_key
        PRNG key (split per chain).
    data
        ``[N, num_features]`` array (column ``j`` modelled by ``model.features[j]``) or
        :class:`EncodedData`.
    model
        :class:`MixtureModel`.
    schedule
        :class:`Schedule` with ``schedule.num_rows == N``.
    num_chains
        Independent chains, run together with ``vmap``.
    capacity, max_capacity
        Initial number of cluster slots and the most ``fit`` may grow to. A chain that
        needs a new cluster while all slots are full halts; ``fit`` then doubles the
        capacity (outside jit, one recompilation) and resumes it exactly; beyond
        ``max_capacity`` it raises :class:`~jaxsub.anneal.mixture.CapacityError`.
    grids
        :class:`HyperGrids` for the once-per-cycle hyperparameter Gibbs step,
        ``"default"`` (:func:`default_grids`) or ``None`` (fixed hyperparameters).
    test_data
        Optional held-out rows (same layout as ``data``): scored at every checkpoint.
    num_checkpoints
        The schedule is run in this many compiled spans; the trace has one entry per span.
    span
        Ticks per compiled span (overrides ``num_checkpoints``). Compiled sweeps are cached
        per ``(model, policy, span, energy_ramp, grids)`` and array shapes, so runs that share
        a span (e.g. schedules of different lengths on the same data) compile once.
    initial_assignments
        ``[N]`` or ``[num_chains, N]`` starting labels (required when ``schedule.initial_size > 0``).
    dtype
        Float dtype of statistics and scores.
    progress_bar
        Show a tqdm bar over spans.

    Returns
    -------
    FitResult
        ``(state, trace)``.
    """
    num_chains = check_int("num_chains", num_chains, low=1)
    capacity = check_int("capacity", capacity, low=1)
    max_capacity = check_int("max_capacity", max_capacity, low=capacity)
    num_checkpoints = check_int("num_checkpoints", num_checkpoints, low=1)
    if not isinstance(schedule, Schedule):
        raise ValueError(f"schedule must be a jaxsub.anneal.Schedule; got {type(schedule).__name__}")
    enc = encode(model, data, dtype)
    n = enc.cat.shape[0]
    if schedule.num_rows != n:
        raise ValueError(f"schedule is for {schedule.num_rows} rows but data has {n}")
    if model.is_finite:
        capacity = max_capacity = len(model.prior.weights)
    if isinstance(grids, str):
        if grids != "default":
            raise ValueError(f"grids must be a HyperGrids, 'default' or None; got {grids!r}")
        grids = default_grids(model)
    test = encode(model, test_data, dtype) if test_data is not None else None
    hypers = init_hypers(model, dtype)
    k_init, k_run = jax.random.split(rng_key)
    init_keys = jax.random.split(k_init, num_chains)
    chain_keys = jax.random.split(k_run, num_chains)
    if schedule.initial_size > 0 and initial_assignments is None:
        raise ValueError("initial_assignments are required for a schedule with initial_size > 0")
    if initial_assignments is not None:
        z = np.asarray(initial_assignments)
        z = np.broadcast_to(z, (num_chains, n)) if z.ndim == 1 else z
        if z.shape != (num_chains, n):
            raise ValueError(f"initial_assignments must have shape [{n}] or [{num_chains}, {n}]; got {z.shape}")
        if int(z.max()) >= capacity:
            raise ValueError(f"initial_assignments use label {int(z.max())} >= capacity {capacity}")
        sizes = (z >= 0).sum(axis=1)
        if np.any(sizes != schedule.initial_size):
            raise ValueError(f"initial_assignments assign {sizes.tolist()} rows; the schedule expects {schedule.initial_size}")
        if schedule.policy == "fifo" and schedule.initial_size not in (0, n):
            raise ValueError("a 'fifo' schedule can only start empty or from a full assignment")
        states = jax.vmap(lambda k, zz: init(k, model, enc, capacity, policy=schedule.policy, assignments=zz,
                                             hypers=hypers, dtype=dtype))(init_keys, jnp.asarray(z, jnp.int32))
    else:
        states = jax.vmap(lambda k: init(k, model, enc, capacity, policy=schedule.policy, hypers=hypers,
                                         dtype=dtype))(init_keys)
    num_ticks = len(schedule)
    span = math.ceil(num_ticks / num_checkpoints) if span is None else check_int("span", span, low=1)
    codes = np.asarray(schedule.codes)
    sweep_fn = _compiled_sweep(model, schedule.policy, span, schedule.energy_ramp, grids)
    compile_seconds = 0.0

    def get_sweep(windows):
        nonlocal compile_seconds
        sig = (model, schedule.policy, span, schedule.energy_ramp, grids,
               tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves((states, chain_keys, windows, enc))))
        if sig not in _EXECUTABLES:
            t0 = time.perf_counter()
            _EXECUTABLES[sig] = sweep_fn.lower(states, chain_keys, windows, enc).compile()
            compile_seconds += time.perf_counter() - t0
        return _EXECUTABLES[sig]

    score_fn, stats_fn = _driver_fns(model)
    rows = []
    elapsed = 0.0
    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_ticks, unit="tick", leave=False, desc=schedule.name)
    done = 0
    while True:
        windows = jnp.asarray(schedule_windows(codes, np.asarray(states.cursor), span))
        sweep = get_sweep(windows)
        t0 = time.perf_counter()
        states = sweep(states, chain_keys, windows, enc)
        jax.block_until_ready(states)
        elapsed += time.perf_counter() - t0
        cursor = np.asarray(states.cursor)
        if bool(np.any(np.asarray(states.halted))):
            if capacity >= max_capacity:
                raise mx.CapacityError(
                    f"a chain needs more than max_capacity={max_capacity} clusters at tick {int(cursor.min())}; "
                    "raise max_capacity (or capacity)"
                )
            capacity = min(2 * capacity, max_capacity)
            states = mx.grow(states, capacity)._replace(halted=jnp.zeros((num_chains,), bool))
        ncl, lj = stats_fn(states)
        held = np.asarray(score_fn(states, test)) if test is not None else np.full(num_chains, np.nan)
        h = states.mixture.hypers
        rows.append((cursor.copy(), np.asarray(states.num_assigned), np.asarray(ncl), np.asarray(lj), held,
                     np.asarray(h.alpha), np.asarray(h.discount), elapsed, capacity))
        if bar is not None:
            bar.update(int(cursor.min()) - done)
            done = int(cursor.min())
        if int(cursor.min()) >= num_ticks:
            break
    if bar is not None:
        bar.close()
    cols = list(zip(*rows))
    trace = FitTrace(
        tick=np.stack(cols[0]), num_assigned=np.stack(cols[1]), num_clusters=np.stack(cols[2]),
        log_joint=np.stack(cols[3]), heldout=np.stack(cols[4]), alpha=np.stack(cols[5]),
        discount=np.stack(cols[6]), seconds=np.asarray(cols[7]), compile_seconds=compile_seconds,
        capacity=np.asarray(cols[8]),
    )
    return FitResult(states, trace)


# --------------------------------------------------------------------------- SamplingAlgorithm
def collapsed_gibbs(model: MixtureModel, data, capacity: int, *, grids: HyperGrids | None = None,
                    dtype=jnp.float32) -> SamplingAlgorithm:
    """Full-data random-scan collapsed Gibbs as a BlackJAX ``SamplingAlgorithm``.

    ``init(position)``: ``position`` is an ``[N]`` assignment vector with every label in
    ``[0, capacity)`` (all rows assigned). ``step(rng_key, state)``: remove a uniformly
    random row and reassign it from eq. (star) (one GIBBS tick); with ``grids``, the
    hyperparameters are resampled after every ``N`` steps. Returns ``(AnnealState, TickInfo)``.
    If a new cluster is needed while every slot is occupied the chain halts
    (``info.overflow``, ``state.halted``): grow it with :func:`jaxsub.anneal.mixture.grow`.

    Under ``vmap`` the hyperparameter ``lax.cond`` becomes a select that evaluates the grids
    at every step; :func:`fit` avoids that cost for many chains.
    """
    capacity = check_int("capacity", capacity, low=1)
    if model.is_finite and capacity != len(model.prior.weights):
        raise ValueError(f"capacity must equal the number of Finite components ({len(model.prior.weights)})")
    enc = encode(model, data, dtype)
    hypers = init_hypers(model, dtype)
    do_hyper = grids is not None and not grids.empty

    def init_fn(position, rng_key=None):
        key = jax.random.key(0) if rng_key is None else rng_key
        return init(key, model, enc, capacity, policy="random", assignments=position, hypers=hypers, dtype=dtype)

    def step_fn(rng_key, state):
        k_tick, k_hyp = jax.random.split(rng_key)
        state, info = tick(k_tick, state, GIBBS, 1.0, model=model, data=enc, policy="random")
        if do_hyper:
            need = (state.since_hyper >= state.num_assigned) & ~state.halted

            def run_hyper(st):
                mixture = resample_hypers(k_hyp, st.mixture, model=model, grids=grids)
                return st._replace(mixture=mixture, since_hyper=jnp.zeros_like(st.since_hyper))

            state = jax.lax.cond(need, run_hyper, lambda st: st, state)
        return state, info

    return SamplingAlgorithm(init_fn, step_fn)
