"""Row moves: one schedule tick removes and/or adds one row in every view at once.

:func:`row_tick` is the single-view eq. (star) kernel vmapped over views; each occupied view draws
the added row's cluster from ``(n_vc - d_v) p(x_v | X_vc)^beta`` or ``(alpha_v + K_v d_v) p(x_v)^beta``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxsub.anneal.crosscat.copy_avoidance import _apply_row_writes, _get, _get_col, _RowWrites
from jaxsub.anneal.crosscat.model import CrossCatData, CrossCatModel, CrossCatState
from jaxsub.anneal.crosscat.score_cache import (
    _cache_after_update,
    _cached_view_scores,
    _score_cache,
    _static_take,
)
from jaxsub.anneal.crosscat.scores import _prior_logw
from jaxsub.anneal.moves import _sample_index, _uniform_index_hl, bits_to_uniform, random_churn_reads
from jaxsub.types import PRNGKey

__all__ = ["TICK_WORDS", "row_tick", "tick_words"]


def _sample(u, logits):
    """The cluster index of :func:`jaxsub.anneal.moves._sample_index` (one inverse-CDF draw)."""
    return _sample_index(u, logits)[0]


def _update_feature_stats(model, state, data, row, kf, sign):
    """Add ``sign`` (-1, 0 or 1) copies of ``row`` to every feature's cluster ``kf[f]`` (``[F]``, the cluster of
    ``row`` in the view of feature ``f``; -1: none): one gather of the per-view clusters onto the features
    per tick side (``k_view[view_of]``), not one per feature kind and per use."""
    cc, rs = state.cat_counts, state.real_stats
    if len(model.cat_idx):
        x = data.cat[row]
        k = _static_take(kf, model.cat_idx)
        w = sign * ((x >= 0) & (k >= 0)).astype(jnp.int32)
        cc = cc.at[jnp.arange(k.shape[0]), jnp.maximum(k, 0), jnp.maximum(x, 0)].add(w)
    if len(model.real_idx):
        x, ob = data.real[row], data.real_obs[row]
        k = _static_take(kf, model.real_idx)
        w = (sign * (ob & (k >= 0)).astype(jnp.int32)).astype(rs.dtype)
        upd = jnp.stack([w, w * x, w * x * x], -1)
        rs = rs.at[jnp.arange(k.shape[0]), jnp.maximum(k, 0)].add(upd)
    return state._replace(cat_counts=cc, real_stats=rs)


def _row_plan(
    u, state: CrossCatState, code, beta, *, model: CrossCatModel, data: CrossCatData, cache=None, policy: str = "random"
):
    """:func:`row_tick` without its ``[V, N]``/``[N]`` writes: ``(state, writes, overflow, cache)``.

    Every read of ``z`` and ``order`` happens here, before any write; :func:`build_sweep` applies
    ``writes`` at the start of the next scan step, so XLA updates both arrays in place (a read
    scheduled after an in-place write forces a copy of the whole array, O(V N) per tick).
    ``cache``: the state's :class:`_ScoreCache` (default: built here, O(F C L)); the new state's is
    returned (updated at the clusters the tick touched). ``policy="fifo"``: remove the oldest row of the
    window, add the next one of the cycle (``order`` is not written).
    """
    cache = _score_cache(state) if cache is None else cache
    V, n_rows = state.z.shape
    code = jnp.asarray(code, jnp.int32)
    do_rem, do_add, prior_only = (code & 1) > 0, (code & 2) > 0, (code & 4) > 0
    m = state.num_assigned
    h = state.hypers
    nf = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V)
    occ_v = nf > 0
    active = ~state.halted & (code != 0)
    order = state.order
    if policy == "fifo":
        j_r = state.head
    else:
        # the three exact picks in one vectorised op: remove among m, add among n - m or n - m + 1 free rows
        picks = _uniform_index_hl(
            u[jnp.asarray([0, 2, 2])], u[jnp.asarray([1, 3, 3])], jnp.stack([m, n_rows - m, n_rows - m + 1])
        )
        j_r = jnp.clip(picks[0], 0, jnp.maximum(m - 1, 0))
    r = _get(order, j_r)
    k_r = _get_col(state.z, r)
    # overflow is decided before any change (so a halted tick writes nothing; no O(N) revert):
    # an occupied view can seat the added row iff it has an empty slot or the removal empties one
    would_rem = active & do_rem & (m > 0)
    frees = would_rem & (k_r >= 0) & (state.sizes[jnp.arange(V), jnp.maximum(k_r, 0)] == 1)
    can = jnp.any(state.sizes == 0, axis=1) | frees | ~occ_v
    m_after = m - would_rem.astype(jnp.int32)
    overflow = active & do_add & (m_after < n_rows) & ~jnp.all(can)
    active = active & ~overflow
    g_rem = active & do_rem & (m > 0)
    m1 = m - g_rem.astype(jnp.int32)
    g_add = active & do_add & (m1 < n_rows)
    head = state.head
    if policy == "fifo":  # the window slides: no order writes
        head = jnp.where(g_rem, (head + 1) % n_rows, head)
        a = _get(order, (head + m1) % n_rows)
    else:
        # all reads of order (positions as they will be after the removal swap j_r <-> last)
        a, order_pos, order_val = random_churn_reads(order, picks[1:], m, m1, j_r, r, g_rem, g_add)
    a_old = jnp.where(g_rem & (a == r), -1, _get_col(state.z, a))
    # remove: statistics only
    dr = -(g_rem & (k_r >= 0)).astype(jnp.int32)
    sr = -g_rem.astype(jnp.int32)  # per feature: dr[view_of[f]] == sr * (k_r[view_of[f]] >= 0)
    kf_r = k_r[state.view_of]
    st = _update_feature_stats(model, state, data, r, kf_r, sr)
    cache = _cache_after_update(model, st, cache, data, r, kf_r, sr)
    sizes = st.sizes.at[jnp.arange(V), jnp.maximum(k_r, 0)].add(dr)
    # add: eq. (star) in every view at once
    lik = _cached_view_scores(model, st, cache, data.cat[a], data.real[a], data.real_obs[a])
    lik = jnp.where(prior_only, 0.0, lik * beta)
    logits = jax.vmap(_prior_logw)(sizes, h.row_alpha, h.row_d) + lik
    k = jax.vmap(_sample)(bits_to_uniform(u[4:], logits.dtype), logits)
    k = jnp.where(occ_v, k, -1)
    da = (g_add & (k >= 0)).astype(jnp.int32)
    sa = g_add.astype(jnp.int32)
    kf_a = k[state.view_of]
    st = _update_feature_stats(model, st, data, a, kf_a, sa)
    cache = _cache_after_update(model, st, cache, data, a, kf_a, sa, lazy_real=True)
    sizes = sizes.at[jnp.arange(V), jnp.maximum(k, 0)].add(da)
    i32 = lambda *v: jnp.stack([jnp.asarray(x, jnp.int32) for x in v])  # noqa: E731
    z_val = jnp.stack([jnp.where(g_rem, -1, k_r), jnp.where(g_add, k, a_old)]).astype(jnp.int32)
    if policy == "fifo":  # order[j_r] == r: writing it back changes nothing
        writes = _RowWrites(i32(r, a), z_val, i32(j_r, j_r, j_r, j_r), i32(r, r, r, r))
    else:
        writes = _RowWrites(i32(r, a), z_val, order_pos, order_val)
    new = st._replace(
        sizes=sizes,
        num_assigned=m1 + g_add.astype(jnp.int32),
        head=head,
        cursor=state.cursor + (~(state.halted | overflow)).astype(jnp.int32),
        since_hyper=state.since_hyper + g_add.astype(jnp.int32),
        halted=state.halted | overflow,
    )
    return new, writes, overflow, cache


TICK_WORDS = 4  # uint32 words of a row tick before its per-view cluster draws (remove pick 2, add pick 2)


def tick_words(rng_key: PRNGKey, num_views: int) -> jnp.ndarray:
    """The ``[TICK_WORDS + num_views]`` uint32 random words one :func:`row_tick` / :func:`block_tick` consumes.

    Parameters
    ----------
    rng_key
        PRNG key of the tick.
    num_views
        View slots ``V``.

    Returns
    -------
    jnp.ndarray
        ``[TICK_WORDS + num_views]`` uint32.
    """
    return jax.random.bits(rng_key, (TICK_WORDS + num_views,), jnp.uint32)


def row_tick(u, state: CrossCatState, code, beta, *, model: CrossCatModel, data: CrossCatData, policy: str = "random"):
    """One schedule tick on one chain, in every view at once (random policy).

    ``u``: ``[4 + V]`` uint32 random words (:func:`tick_words`): words 0-1 the remove pick, 2-3 the add pick
    (exact uniform integers, :func:`~jaxsub.anneal.moves.uniform_index`), then one cluster draw per view. Remove
    (bit 0) takes a uniform assigned row out of every view; add (bit 1) puts a uniform
    unassigned row into every *occupied* view, drawing its cluster in view ``v`` from
    ``(n_vc - d_v) p(x_v | X_vc)^beta`` / ``(alpha_v + K_v d_v) p(x_v)^beta`` (bit 2: prior only).
    Returns ``(state, overflow)``; O(F x C + V x C) work, independent of N (inside
    :func:`build_sweep` the label/order writes are deferred so that they happen in place).
    ``policy="fifo"`` (a state from ``init(..., policy="fifo")``): remove the oldest row of the window,
    add the next row of the cycle (words 0-3 unused).

    Parameters
    ----------
    u
        ``[4 + V]`` uint32 random words (:func:`tick_words`).
    state
        One chain's :class:`~jaxsub.anneal.crosscat.CrossCatState`.
    model
        The :class:`~jaxsub.anneal.crosscat.CrossCatModel`.
    data
        Its :class:`~jaxsub.anneal.crosscat.CrossCatData`.
    code
        The tick code (int scalar, may be traced).
    beta
        Likelihood temperature.
    policy
        ``"random"`` or ``"fifo"`` (static).

    Returns
    -------
    tuple
        ``(CrossCatState, overflow)``.
    """
    new, writes, overflow, _ = _row_plan(u, state, code, beta, model=model, data=data, policy=policy)
    return _apply_row_writes(new, writes), overflow
