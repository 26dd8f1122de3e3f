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

import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.anneal import mixture as mx
from jaxsub.anneal.checks import check_data_finite, check_labels, is_concrete
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
from jaxsub.subsample import bits_to_uniform
from jaxsub.types import PRNGKey
from jaxsub.validation import check_int

__all__ = ["AnnealState", "TickInfo", "check_sweep_growth", "init", "moves_due", "resample_hypers", "tick"]


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
    swept
        Subsample size at the last hyperparameter step (``num_assigned`` at :func:`init`; see
        :func:`moves_due`).
    """

    mixture: mx.MixtureState
    order: jnp.ndarray
    num_assigned: jnp.ndarray
    head: jnp.ndarray
    cursor: jnp.ndarray
    since_hyper: jnp.ndarray
    halted: jnp.ndarray
    swept: jnp.ndarray


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


def check_sweep_growth(sweep_growth) -> float:
    """``sweep_growth`` as a float: 0 (off) or a finite real > 1, else ``ValueError`` naming it.

    Parameters
    ----------
    sweep_growth : float
        The growth factor of :func:`moves_due` (``0`` turns growth-triggered moves off).

    Returns
    -------
    float
        ``sweep_growth`` as a Python float.

    Raises
    ------
    ValueError
        A bool, a non-real, or a value other than 0 that is not a finite real > 1.
    """
    if isinstance(sweep_growth, bool) or not isinstance(sweep_growth, numbers.Real):
        raise ValueError(f"sweep_growth must be 0 or a real number > 1; got {sweep_growth!r}")
    g = float(sweep_growth)
    if not (g == 0.0 or (math.isfinite(g) and g > 1.0)):
        raise ValueError(f"sweep_growth must be 0 or a real number > 1; got {sweep_growth!r}")
    return g


def moves_due(since_hyper, num_assigned, swept, sweep_growth: float = 0.0):
    """Whether a chain's once-per-cycle moves (hyper step; CrossCat's feature moves too) are due after a tick.

    Due when the tick completes a cycle through the subsample, ``since_hyper >= max(m, 1)`` (adds since the last
    moves against the subsample size ``m = num_assigned``), or, with ``sweep_growth = g > 0`` (static), once the
    subsample has grown by ``g`` since the last moves, ``m >= g * max(swept, 1)``. A schedule that only adds rows
    (``linear_anneal(N, N)``, a sequential phase) never completes a cycle after the first moves: without ``g``
    they run once, at ``hyper_min_rows`` rows; with ``g = 2`` at about 20, 40, 80, ... rows. The rule reads tick
    counters only, never the state's values, so it changes *when* posterior-invariant moves run, not what they do.
    ``m`` and ``swept`` are compared in float32 (exact below 2**24 rows).

    Parameters
    ----------
    since_hyper : jnp.ndarray
        Int scalar: rows added since the last moves.
    num_assigned : jnp.ndarray
        Int scalar: the subsample size ``m``.
    swept : jnp.ndarray
        Int scalar: the subsample size at the last moves.
    sweep_growth : float, default 0.0
        The static growth factor ``g`` (0 or > 1, see :func:`check_sweep_growth`).

    Returns
    -------
    jnp.ndarray
        Bool scalar: whether the moves run after this tick.
    """
    due = since_hyper >= jnp.maximum(num_assigned, 1)
    if sweep_growth:
        grown = num_assigned.astype(jnp.float32) >= jnp.float32(sweep_growth) * jnp.maximum(swept, 1).astype(
            jnp.float32
        )
        due = due | grown
    return due


def init(
    position,
    model: MixtureModel,
    data: EncodedData,
    capacity: int,
    *,
    rng_key: PRNGKey | None = None,
    policy: str = "random",
    hypers: Hypers | None = None,
    dtype=jnp.float32,
) -> AnnealState:
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

    Raises
    ------
    ValueError
        ``capacity < 1``, an unknown ``policy``, ``position`` not of shape ``[N]`` or (when concrete) holding
        labels outside ``[-1, capacity)``, data (when concrete) with non-finite reals or level codes outside the
        model's, a ``"fifo"`` start that is neither empty nor a full assignment, or ``"fifo"`` without ``rng_key``.
    """
    assignments = position
    n = data.cat.shape[0]
    capacity = check_int("capacity", capacity, low=1)
    if policy not in ("random", "fifo"):
        raise ValueError(f"policy must be 'random' or 'fifo'; got {policy!r}")
    check_data_finite("data.real", data.real)
    check_labels("data.cat", data.cat, data.cat.shape, 0, max(model.total_levels, 1))
    if assignments is not None:
        check_labels("position", assignments, (n,), -1, capacity)
        if policy == "fifo" and is_concrete(assignments) and 0 < int(np.sum(np.asarray(assignments) >= 0)) < n:
            raise ValueError("position for policy 'fifo' must be None (empty) or assign every row")
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
    return AnnealState(mixture, order, num, zero, zero, zero, jnp.zeros((), bool), num)


def _mul_u32(a, b):
    """Full 64-bit product of uint32 ``a`` and ``b`` as ``(high word, low word)`` (16-bit halves, no x64)."""
    m16 = jnp.uint32(0xFFFF)
    a0, a1, b0, b1 = a & m16, a >> 16, b & m16, b >> 16
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> 16) + (p01 & m16) + (p10 & m16)  # < 3 * 2^16
    return p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16), (mid << 16) | (p00 & m16)


def uniform_index(words, m):
    """A uniform integer in ``[0, m)`` from two uniform uint32 words ``words[..., 0:2]`` (``m >= 1``; ``m <= 0``
    gives 0): ``floor(W m / 2^64)`` with ``W = words[0] 2^32 + words[1]``, exact integer arithmetic.

    Each value gets ``floor(2^64 / m)`` or one more of the ``2^64`` words: its probability is ``1 / m`` up to a
    relative ``m / 2^64`` (``< 1e-13`` for ``m < 2^31``). ``floor(u m)`` with a float32 uniform ``u`` (2^23
    grid points, then a rounded product) is off by up to ``~m / 2^23`` relative: ~4 % at ``m = 3e5``.
    """
    words = jnp.asarray(words, jnp.uint32)
    return _uniform_index_hl(words[..., 0], words[..., 1], m)


def _uniform_index_hl(hi, lo, m):
    """:func:`uniform_index` with the high and low words as separate arrays."""
    mu = jnp.maximum(jnp.asarray(m, jnp.int32), 0).astype(jnp.uint32)
    h1, l1 = _mul_u32(hi, mu)
    h2, _ = _mul_u32(lo, mu)
    s = l1 + h2  # wraps mod 2^32: carry into the high word iff it wrapped
    return (h1 + (s < l1).astype(jnp.uint32)).astype(jnp.int32)


def _first_true(b, axis: int = -1):
    """``jnp.argmax(b, axis)`` of a boolean array (the first ``True``; 0 when there is none) as a ``min`` over
    ``where(b, index, n)``: the same integers, but a plain reduction that XLA:CPU vectorises instead of the
    (value, index) pair reduction of ``argmax`` (measured ~5x cheaper on ``[8, 12, 64]``)."""
    n = b.shape[axis]
    shape = [1] * b.ndim
    shape[axis] = n
    i = jnp.min(jnp.where(b, jnp.arange(n, dtype=jnp.int32).reshape(shape), n), axis=axis)
    return jnp.where(i == n, 0, i)


def _prefix_sum(x, block: int = 16):
    """``jnp.cumsum(x, -1)`` in O(n) adds, bit for bit what XLA:CPU computes for it.

    ``jnp.cumsum`` lowers to a ``reduce_window`` that XLA:CPU rewrites into blocks of 16 (a left-to-right running
    sum within each block, plus the running sum of the block totals); that still costs O(16 n) per row and,
    under ``vmap`` over chains, ~1.4 us per chain of a CrossCat tick (``[V, C]`` = 12 x 64,
    measured). This is the same sums in the same order as unrolled adds (so the draws of the
    samplers are unchanged; checked against ``jnp.cumsum`` for n = 5 ... 512 in ``tests/test_crosscat.py``)."""
    n = x.shape[-1]

    def running(v):  # left-to-right running sum along the last axis, unrolled
        outs = [v[..., 0]]
        for i in range(1, v.shape[-1]):
            outs.append(outs[-1] + v[..., i])
        return jnp.stack(outs, -1)

    if n <= block:
        return running(x)
    nb = -(-n // block)
    w = running(jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, nb * block - n)]).reshape(x.shape[:-1] + (nb, block)))
    tot = _prefix_sum(w[..., -1], block)
    before = jnp.concatenate([jnp.zeros_like(tot[..., :1]), tot[..., :-1]], -1)
    return (before[..., None] + w).reshape(x.shape[:-1] + (nb * block,))[..., :n]


def _sample_index(u, logits):
    """Inverse-CDF draw from unnormalised ``logits`` with one uniform ``u`` in [0, 1): ``(index, log normaliser)``.
    The running sum and the first-``True`` index are :func:`_prefix_sum` and :func:`_first_true` (the same floats and
    integers as ``jnp.cumsum`` / ``jnp.argmax`` on XLA:CPU, cheaper there; shared by the mixture and CrossCat ticks)."""
    top = jnp.max(logits)
    c = _prefix_sum(jnp.exp(logits - top))
    return _first_true(c > u * c[-1]), top + jnp.log(c[-1])


def tick(
    rng_key: PRNGKey, state: AnnealState, code, beta, *, model: MixtureModel, data: EncodedData, policy: str = "random"
) -> tuple[AnnealState, TickInfo]:
    """One schedule tick (see :mod:`jaxsub.anneal.schedules` for the codes) on one chain.

    Remove (bit 0 of ``code``): policy ``"random"`` picks a uniform assigned row,
    ``"fifo"`` the oldest. Add (bit 1): ``"random"`` picks a uniform unassigned row,
    ``"fifo"`` the next in the cycle; its cluster is drawn from eq. (star) with the
    likelihood raised to ``beta`` (bit 2: likelihood ignored, a prior draw).
    Costs O(capacity x num_features), independent of N.

    Parameters
    ----------
    rng_key
        PRNG key of this tick.
    state
        One chain's :class:`AnnealState`.
    code
        The tick code (int scalar, may be traced).
    beta
        Likelihood temperature.
    model
        The :class:`~jaxsub.anneal.model.MixtureModel`.
    data
        The :class:`~jaxsub.anneal.model.EncodedData`.
    policy
        ``"random"`` or ``"fifo"`` (static).

    Returns
    -------
    tuple
        ``(AnnealState, TickInfo)``; a chain that must open a cluster with every slot full halts.
    """
    bits = jax.random.bits(rng_key, (TICK_WORDS,), jnp.uint32)
    return _tick_uniforms(bits, state, code, beta, model=model, data=data, policy=policy)


def _get(x, i):
    """``x[i]`` as a dynamic slice (XLA keeps in-place updates of ``x`` in loops)."""
    return jax.lax.dynamic_slice(x, (jnp.asarray(i, jnp.int32),), (1,))[0]


def _set(x, i, v):
    """``x.at[i].set(v)`` as a dynamic-update-slice."""
    return jax.lax.dynamic_update_slice(x, jnp.asarray(v, x.dtype)[None], (jnp.asarray(i, jnp.int32),))


def random_churn_reads(order, w_add, m, m1, j_r, r, g_rem, g_add):
    """The ``random`` churn policy's reads of ``order`` and its deferred swap writes.

    The subsample is ``order[:m]``. A removal (when ``g_rem``) swaps the removed row's position
    ``j_r`` (row ``r``) with the last assigned position ``m - 1``; the added row is a uniform draw
    among the unassigned positions ``order[m1:]`` (``m1`` = size after the removal), swapped into
    position ``m1`` (when ``g_add``). All reads happen before any write to ``order``, so XLA updates
    it in place inside a scan (a read after a write forces an ``O(N)`` copy); the writes are
    returned as 4 (position, value) pairs applied in order.

    Args:
        order: ``[N]`` row permutation.
        w_add: two uint32 words choosing the added row (exact uniform pick, :func:`uniform_index`), or
            int32 ``[2]`` such picks already made among ``N - m`` and ``N - m + 1`` free rows (the
            CrossCat tick computes all its picks in one op); the one for ``N - m1`` is used.
        m, m1: subsample size before and after the removal.
        j_r, r: position and row of the removed row.
        g_rem, g_add: whether the removal / the addition happens.

    Returns:
        ``(a, order_pos, order_val)``: the added row (as read once the removal swap is applied)
        and the ``[4]`` int32 positions and values of the two swaps.
    """
    n_rows = order.shape[0]
    last = jnp.maximum(m - 1, 0)
    o_last = _get(order, last)
    free = n_rows - m1
    if w_add.dtype == jnp.uint32:
        off = uniform_index(w_add, free)
    else:  # pre-computed picks [2]: for free = n_rows - m and n_rows - m + 1 (no removal / a removal)
        off = jnp.where(m1 < m, w_add[1], w_add[0])
    j_a = m1 + jnp.clip(off, 0, jnp.maximum(free - 1, 0))
    j_a = jnp.minimum(j_a, n_rows - 1)
    m1c = jnp.minimum(m1, n_rows - 1)

    def after_removal_swap(pos, original):
        return jnp.where(g_rem & (pos == last), r, jnp.where(g_rem & (pos == j_r), o_last, original))

    a = after_removal_swap(j_a, _get(order, j_a))
    o_m1 = after_removal_swap(m1c, _get(order, m1c))
    i32 = lambda *v: jnp.stack([jnp.asarray(x, jnp.int32) for x in v])  # noqa: E731
    order_pos = i32(j_r, last, j_a, m1c)
    order_val = i32(
        jnp.where(g_rem, o_last, r), jnp.where(g_rem, r, o_last), jnp.where(g_add, o_m1, a), jnp.where(g_add, a, o_m1)
    )
    return a, order_pos, order_val


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
    return _Writes(
        jnp.zeros((n_order,), jnp.int32),
        jnp.full((n_order,), _get(state.order, z), jnp.int32),
        jnp.zeros((2,), jnp.int32),
        jnp.full((2,), _get(state.mixture.assignments, z), jnp.int32),
    )


TICK_WORDS = 5  # uint32 words per mixture tick: remove pick (2), add pick (2), cluster draw (1)


def _tick_uniforms(u, state, code, beta, *, model, data, policy):
    """:func:`tick` driven by ``TICK_WORDS`` uint32 random words ``u``: words 0-1 the remove pick, 2-3 the add pick
    (exact uniform integers, :func:`uniform_index`), word 4 the cluster draw's uniform."""
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
        j_r = jnp.clip(uniform_index(u[0:2], m), 0, jnp.maximum(m - 1, 0))
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
        a, order_pos, order_val = random_churn_reads(order, u[2:4], m, m1, j_r, r, g_rem, g_add)
    else:
        head = jnp.where(g_rem, (head + 1) % n_rows, head)
        a = _get(order, (head + m1) % n_rows)
    a_old = jnp.where(g_rem & (a == r), -1, _get(mix.assignments, a))
    k_rem = jnp.maximum(k_old, 0)
    mix = mx.update_stats(mix, data, r, k_rem, -(g_rem & (k_old >= 0)).astype(jnp.int32))
    logits = mx.assign_logits(model, mix, data.cat[a], data.real[a], beta, prior_only)
    k, log_norm = _sample_index(bits_to_uniform(u[4], logits.dtype), logits)
    mix = mx.update_stats(mix, data, a, k, g_add.astype(jnp.int32))
    # writes (deferred: see _tick_plan)
    i32 = lambda *v: jnp.stack([jnp.asarray(x, jnp.int32) for x in v])  # noqa: E731
    assign_pos = i32(r, a)
    assign_val = i32(jnp.where(g_rem, -1, k_old), jnp.where(g_add, k, a_old))
    if policy != "random":
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
        swept=state.swept,
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


def resample_hypers(
    rng_key: PRNGKey, mixture: mx.MixtureState, *, model: MixtureModel, grids: HyperGrids
) -> mx.MixtureState:
    """One Gibbs sweep over the hyperparameters on their grids, given the partition.

    Each hyperparameter ``h`` with grid ``{h_1..h_G}`` (uniform prior on the grid) is
    drawn from ``p(h_g | rest) propto p(pi | alpha, d)`` (alpha, d: :func:`log_partition_prior`)
    or ``propto prod_k p(X_k | h_g, rest)`` (feature hyperparameters: Dirichlet-multinomial
    or NIX marginals). Cost O(G x capacity x levels), independent of N.

    Parameters
    ----------
    rng_key
        PRNG key.
    mixture
        One chain's :class:`~jaxsub.anneal.mixture.MixtureState`.
    model
        The :class:`~jaxsub.anneal.model.MixtureModel`.
    grids
        :class:`~jaxsub.anneal.model.HyperGrids`; a ``None`` grid keeps its hyperparameter fixed.

    Returns
    -------
    MixtureState
        With new ``hypers``.
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
