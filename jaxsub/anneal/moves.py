"""Pure moves of subsample-annealed collapsed Gibbs: one tick (remove + assign) and the hyper Gibbs step.

* :func:`tick` runs one schedule tick on one chain: an optional *remove* of a
  row (chosen by the schedule's policy) followed by an optional *assign* of an
  unassigned row, a Gibbs draw from eq. (star) of Obermeyer et al. (2014).
  With both, on a full subsample, it is the classic collapsed Gibbs step
  (Neal 2000, algorithm 3).
* :func:`resample_hypers` is one Gibbs sweep over the hyperparameters on
  discrete grids (alpha, d, Dirichlet/Beta pseudo-counts, NIX parameters),
  conditioned on the current partition.

Everything here is a pure function of ``(rng_key or uniforms, state, ...)``,
jit/vmap-able, with no O(N) work. Sweeps over many ticks live in
:mod:`jaxsub.anneal.sweep`; the host-side driver in :mod:`jaxsub.anneal.driver`.

No cluster is ever dropped: when a tick must add a row and every slot is
occupied, the chain *halts* before that tick (``state.halted``; ``info.overflow``)
and does nothing more until the state is reallocated with
:func:`jaxsub.anneal.mixture.grow`.

References
----------
Obermeyer, Glidden & Jonas, "Scaling nonparametric Bayesian inference via
subsample-annealing", AISTATS 2014. Neal, "Markov chain sampling methods for
Dirichlet process mixture models", JCGS 2000.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxsub.anneal import mixture as mx
from jaxsub.anneal.model import (
    BetaBernoulli,
    DirichletCategorical,
    EncodedData,
    HyperGrids,
    Hypers,
    MixtureModel,
    PitmanYor,
    init_hypers,
)
from jaxsub.types import PRNGKey

__all__ = ["AnnealState", "TickInfo", "init", "resample_hypers", "tick"]


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


def init(position, model: MixtureModel, data: EncodedData, capacity: int, *, rng_key: PRNGKey | None = None,
         policy: str = "random", hypers: Hypers | None = None, dtype=jnp.float32) -> AnnealState:
    """Initial chain state (BlackJAX's ``init(position, ...)``): a given assignment vector, or an empty subsample.

    Parameters
    ----------
    position
        ``[N]`` labels in ``[-1, capacity)`` (``-1``: row not in the subsample), or ``None`` for
        the empty subsample that annealing schedules start from. For ``"random"`` the assigned
        rows are put first in ``order``; for ``"fifo"`` they must be a prefix of the shuffled
        order, so only ``None`` (empty) or a full assignment is accepted.
    model, data, capacity
        The mixture, its :class:`~jaxsub.anneal.model.EncodedData` and the number of cluster slots.
    rng_key
        Used for the shuffled FIFO order (policy ``"fifo"``, required there); ignored by
        ``"random"`` (may be ``None``).
    policy
        ``"random"`` or ``"fifo"`` (see :class:`~jaxsub.anneal.schedules.Schedule`).
    hypers
        Initial hyperparameters (default :func:`~jaxsub.anneal.model.init_hypers`).

    Returns
    -------
    AnnealState
    """
    assignments = position
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
        if rng_key is None:
            raise ValueError("rng_key is required for policy 'fifo' (the shuffled cycle)")
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


class ChurnReads(NamedTuple):
    """The ``order`` reads of one churn tick (:func:`churn_reads`), all taken before any write.

    ``a``: the row to add; ``head``: the window's new head (``"fifo"``); ``last``, ``o_last``,
    ``j_a``, ``m1c``, ``o_m1``: positions and values the ``"random"`` policy's swaps need
    (zeros under ``"fifo"``).
    """

    a: jnp.ndarray
    head: jnp.ndarray
    last: jnp.ndarray
    o_last: jnp.ndarray
    j_a: jnp.ndarray
    m1c: jnp.ndarray
    o_m1: jnp.ndarray


def churn_remove_position(u0, m, head, policy: str):
    """Position in ``order`` of the row a tick removes: uniform among the ``m`` assigned (``"random"``) or the head."""
    if policy == "fifo":
        return head
    return jnp.clip(jnp.floor(u0 * m.astype(u0.dtype)).astype(jnp.int32), 0, jnp.maximum(m - 1, 0))


def churn_reads(order, u1, m, m1, j_r, r, g_rem, head, policy: str) -> ChurnReads:
    """Every ``order`` read of a tick's add step, as the array will be after the removal (shared by the
    mixture and CrossCat ticks).

    ``"random"``: the removal swaps positions ``j_r`` and ``m - 1`` (assigned rows stay in
    ``order[:m1]``); the added row is uniform among ``order[m1:]``. ``"fifo"``: the window slides by one
    when a row was removed; the added row is the one after the window. ``m1``: rows assigned after the
    removal; ``r``: the removed row; ``g_rem``: whether the removal happened.
    """
    n_rows = order.shape[0]
    zero = jnp.zeros((), jnp.int32)
    if policy == "fifo":
        head = jnp.where(g_rem, (head + 1) % n_rows, head)
        return ChurnReads(_get(order, (head + m1) % n_rows), head, zero, zero, zero, zero, zero)
    last = jnp.maximum(m - 1, 0)
    o_last = _get(order, last)
    free = n_rows - m1
    j_a = m1 + jnp.clip(jnp.floor(u1 * free.astype(u1.dtype)).astype(jnp.int32), 0, jnp.maximum(free - 1, 0))
    j_a = jnp.minimum(j_a, n_rows - 1)
    m1c = jnp.minimum(m1, n_rows - 1)

    def after_removal_swap(pos, original):
        # value of order[pos] once the removal swap (j_r <-> last) is applied
        return jnp.where(g_rem & (pos == last), r, jnp.where(g_rem & (pos == j_r), o_last, original))

    a = after_removal_swap(j_a, _get(order, j_a))
    o_m1 = after_removal_swap(m1c, _get(order, m1c))
    return ChurnReads(a, head, last, o_last, j_a, m1c, o_m1)


def churn_order_writes(c: ChurnReads, j_r, r, g_rem, g_add):
    """The ``"random"`` policy's four ``order`` writes ``(positions, values)``: the removal swap
    ``j_r <-> last`` and the addition swap ``j_a <-> m1`` (an inactive move writes back what it read)."""
    i32 = lambda *v: jnp.stack([jnp.asarray(x, jnp.int32) for x in v])  # noqa: E731
    return (i32(j_r, c.last, c.j_a, c.m1c),
            i32(jnp.where(g_rem, c.o_last, r), jnp.where(g_rem, r, c.o_last),
                jnp.where(g_add, c.o_m1, c.a), jnp.where(g_add, c.a, c.o_m1)))


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
    j_r = churn_remove_position(u[0], m, state.head, policy)
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
    m1 = m - g_rem.astype(jnp.int32)
    g_add = go & do_add & (m1 < n_rows)
    c = churn_reads(order, u[1], m, m1, j_r, r, g_rem, state.head, policy)
    a, head = c.a, c.head
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
        order_pos, order_val = churn_order_writes(c, j_r, r, g_rem, g_add)
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


