"""View (column) moves: Algorithm 8 over views and the new-view Metropolis-Hastings proposal.

* :func:`feature_gibbs`: Neal's (2000) Algorithm 8 for one feature, with ``num_aux`` auxiliary
  empty views whose row partitions are drawn from the row PY prior.
* :func:`new_view_mh`: split a feature off into a new view, refresh a singleton view's row
  partition, or merge a singleton into another view (the acceptance ratios are in the package
  docstring).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxsub.anneal.crosscat.model import (
    CrossCatData,
    CrossCatModel,
    CrossCatState,
    _level_mask,
    _window_rows,
    init_hypers,
)
from jaxsub.anneal.crosscat.partitions import _draw_partitions, _prior_partition
from jaxsub.anneal.crosscat.scores import _dm_marginal, _eppf, _nix_marginal
from jaxsub.types import PRNGKey

__all__ = ["feature_gibbs", "new_view_mh"]


def _stats_of_feature_under(model, state, data, f_kind, j, zrows, levels=None):
    """Stats of categorical (``f_kind = 0``, index ``j`` among cat features) or real feature under ``zrows`` ``[K, N]``.

    ``levels`` (static): the categorical counts cover levels ``0..levels-1`` only (default ``model.max_levels``;
    any bound on the feature's number of levels)."""
    n = zrows.shape[1]
    pos = (jnp.arange(n, dtype=jnp.int32) - state.head) % n  # window position of order[p]
    on = jnp.zeros(n, bool).at[state.order].set(pos < state.num_assigned)
    C = state.sizes.shape[1]
    if f_kind == 0:
        x = data.cat[:, j]

        L = model.max_levels if levels is None else levels

        def one(zz):  # scatter-add of the observed cells into [C, L] (O(N), not O(N L))
            w = (on & (x >= 0) & (zz >= 0)).astype(jnp.int32)
            flat = jnp.where(w > 0, zz * L + jnp.maximum(x, 0), C * L)
            return jnp.zeros((C * L + 1,), jnp.int32).at[flat].add(w)[: C * L].reshape(C, L)
    else:
        x, ob = data.real[:, j], data.real_obs[:, j]

        def one(zz):
            w = (on & ob & (zz >= 0)).astype(x.dtype)
            st = jnp.stack([w, w * x, w * x * x], -1)
            return jax.ops.segment_sum(st, jnp.where(w > 0, zz, C), C + 1)[:C]

    return jax.vmap(one)(zrows)


def _marg_of(model, state, f_kind, j, stats):
    """Log marginal of feature ``j`` for stacked stats ``[K, C, ...]`` -> ``[K]`` (categorical: the levels of
    ``stats``, see :func:`_stats_of_feature_under`)."""
    h = state.hypers
    if f_kind == 0:
        L = stats.shape[-1]
        mask = _level_mask(model)[j][None, :L]
        return jax.vmap(lambda c: _dm_marginal(model, h.cat_prior[j][None, :L], c[None], mask)[0])(stats)
    return jax.vmap(lambda s: _nix_marginal(h.nix[j], s))(stats)


def _set_feature(state, f, f_kind, j, w, stats_w):
    view_of = state.view_of.at[f].set(w)
    if f_kind == 0:  # stats_w may cover the first levels only (the rest of the feature's counts are zero)
        return state._replace(view_of=view_of, cat_counts=state.cat_counts.at[j, :, : stats_w.shape[-1]].set(stats_w))
    return state._replace(
        view_of=view_of, real_stats=state.real_stats.at[j].set(stats_w.astype(state.real_stats.dtype))
    )


def _clear_empty_views(model, state, init_h):
    """Unoccupied views hold no rows; their row hypers return to the model's values."""
    V = state.z.shape[0]
    nf = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V)
    occ = nf > 0
    h = state.hypers._replace(
        row_alpha=jnp.where(occ, state.hypers.row_alpha, init_h.row_alpha),
        row_d=jnp.where(occ, state.hypers.row_d, init_h.row_d),
    )
    return state._replace(
        z=jnp.where(occ[:, None], state.z, -1), sizes=jnp.where(occ[:, None], state.sizes, 0), hypers=h
    )


def _kind_index(model, f):
    """``f`` as (kind, index within kind, feature id, levels): static ``f``, ``(kind, traced j)`` or
    ``(kind, traced j, levels)`` with a static bound ``levels`` on a categorical feature's number of levels
    (its statistics are computed over those levels only; default ``model.max_levels``)."""
    if isinstance(f, tuple):
        kind, j = f[0], f[1]
        levels = f[2] if len(f) > 2 else None
        ids = model.cat_idx if kind == 0 else model.real_idx
        return kind, j, jnp.asarray(ids, jnp.int32)[j], levels
    kind = 0 if f in model.cat_idx else 1
    levels = model.features[f].num_levels if kind == 0 else None
    return kind, (model.cat_idx.index(f) if kind == 0 else model.real_idx.index(f)), f, levels


def feature_gibbs(
    rng_key: PRNGKey,
    state: CrossCatState,
    f,
    *,
    model: CrossCatModel,
    data: CrossCatData,
    num_aux: int = 1,
    fresh=None,
    noise=None,
):
    """Neal's Algorithm 8 over views for feature ``f`` (a column index, or ``(kind, j)`` with ``j`` traced:
    the ``j``-th categorical (kind 0) or real (kind 1) feature). Returns ``(state, ok)``.

    ``ok`` is False when an auxiliary partition ran out of cluster slots (then the state is unchanged).
    ``fresh``: optional pre-drawn auxiliary partitions ``(z [num_aux, N], sizes [num_aux, C], ok [num_aux])``
    of the current subsample, independent of ``state`` and drawn from the PY prior of the auxiliary
    slots' row hyperparameters (:func:`feature_sweep` draws them for all features in one loop);
    default: drawn here with ``rng_key``. ``noise``: optional pre-drawn standard Gumbel ``[V]`` for the view
    draw (:func:`feature_sweep` draws all features' noise in one call; default: from ``rng_key``).

    Parameters
    ----------
    rng_key
        PRNG key.
    state
        One chain's :class:`~jaxsub.anneal.crosscat.CrossCatState`.
    model
        The :class:`~jaxsub.anneal.crosscat.CrossCatModel`.
    data
        Its :class:`~jaxsub.anneal.crosscat.CrossCatData`.
    f
        The feature (above).
    num_aux
        Auxiliary empty views (static).
    fresh, noise
        Optional pre-drawn partitions and Gumbel noise (above).

    Returns
    -------
    tuple
        ``(CrossCatState, ok)``.
    """
    V = state.z.shape[0]
    h = state.hypers
    f_kind, j, f, levels = _kind_index(model, f)
    v0 = state.view_of[f]
    nf = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V) - jax.nn.one_hot(v0, V, dtype=jnp.int32)
    singleton = nf[v0] == 0
    slots = jnp.arange(V)
    empty = nf == 0
    rank = jnp.where(empty, jnp.where((slots == v0) & singleton, -1, slots), V + slots)
    aux = jnp.argsort(rank)[:num_aux]  # first num_aux empty slots, the singleton's own view first
    keys = jax.random.split(rng_key, 2)
    if fresh is None:
        fresh = _draw_partitions(
            keys[1], _window_rows(state), state.num_assigned, h.row_alpha[aux], h.row_d[aux], state.sizes.shape[1]
        )
    keep_own = (aux == v0) & singleton
    aux_z = jnp.where(keep_own[:, None], state.z[aux], fresh[0])
    aux_sizes = jnp.where(keep_own[:, None], state.sizes[aux], fresh[1])
    ok = jnp.all(fresh[2] | keep_own)
    z_c = state.z.at[aux].set(aux_z)
    sizes_c = state.sizes.at[aux].set(aux_sizes)
    stats = _stats_of_feature_under(model, state, data, f_kind, j, z_c, levels)
    marg = _marg_of(model, state, f_kind, j, stats)
    K = jnp.sum(nf > 0).astype(h.view_alpha.dtype)
    is_aux = jnp.zeros((V,), bool).at[aux].set(True)
    logw = jnp.where(
        nf > 0,
        jnp.log(jnp.maximum(nf.astype(marg.dtype) - h.view_d, 1e-30)),
        jnp.where(is_aux, jnp.log(h.view_alpha + K * h.view_d) - math.log(num_aux), -jnp.inf),
    )
    if noise is None:
        noise = jax.random.gumbel(keys[0], (V,), marg.dtype)
    w = jnp.argmax(logw + marg + noise).astype(jnp.int32)  # Gumbel-max: a categorical draw
    new = state._replace(
        z=jnp.where((slots == w)[:, None], z_c, state.z), sizes=jnp.where((slots == w)[:, None], sizes_c, state.sizes)
    )
    new = _set_feature(new, f, f_kind, j, w, stats[w])
    new = _clear_empty_views(model, new, init_hypers(model, V, h.row_alpha.dtype))
    return jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, state), ok


def _new_view_proposal(rng_key, state, f, *, model, data, fresh=None, noise=None):
    """The MH proposal of :func:`new_view_mh` for feature ``f``: ``(proposed_state, log_accept, ok)``.

    ``fresh``: optional pre-drawn ``(z [N], sizes [C], ok, alpha_q, d_q)``, a PY(alpha_q, d_q) partition of the
    subsample independent of ``state``; where ``(alpha_q, d_q)`` differ from the target slot's row
    hyperparameters the acceptance carries the ratio of the two EPPFs (exact for split and refresh).
    ``noise``: optional pre-drawn ``(u_move, gumbel [V])`` (refresh-or-merge coin, merge-target draw).
    """
    V = state.z.shape[0]
    h = state.hypers
    f_kind, j, f, levels = _kind_index(model, f)
    k_move, k_part, k_tgt = jax.random.split(rng_key, 3)
    if noise is None:
        noise = (jax.random.uniform(k_move), jax.random.gumbel(k_tgt, (V,)))
    u_move, gumbel = noise
    v0 = state.view_of[f]
    nf_all = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V)
    K = jnp.sum(nf_all > 0)
    n0 = nf_all[v0]
    singleton = n0 == 1
    slots = jnp.arange(V)
    # target slot for split / refresh: a free slot (split) or the feature's own view (refresh)
    free_slot = jnp.argmax(nf_all == 0)
    refresh = singleton & (u_move < 0.5)
    merge = singleton & ~refresh & (K > 1)
    split = ~singleton
    s = jnp.where(split, free_slot, v0)
    if fresh is None:
        zp, sp, ok = _prior_partition(k_part, state, h.row_alpha[s], h.row_d[s])
        a_q, d_q = h.row_alpha[s], h.row_d[s]
    else:
        zp, sp, ok, a_q, d_q = fresh
    # merge target: uniform among the other occupied views
    others = (nf_all > 0) & (slots != v0)
    wt = jnp.argmax(jnp.where(others, gumbel, -jnp.inf)).astype(jnp.int32)  # uniform among the others
    tgt = jnp.where(merge, wt, s)
    z_t = jnp.where(merge, state.z[wt], zp)
    stats = _stats_of_feature_under(model, state, data, f_kind, j, jnp.stack([state.z[v0], z_t]), levels)
    marg = _marg_of(model, state, f_kind, j, stats)
    dt = marg.dtype
    a, d = h.view_alpha, h.view_d
    Kf = K.astype(dt)
    lr_split = jnp.log(a + Kf * d) - jnp.log(n0.astype(dt) - 1.0 - d) - jnp.log(2.0 * Kf)
    n_w = nf_all[wt].astype(dt)
    lr_merge = jnp.log(n_w - d) - jnp.log(a + (Kf - 1.0) * d) + jnp.log(2.0 * jnp.maximum(Kf - 1.0, 1.0))
    # proposal density vs prior of the proposed partition (and, for refresh, of the one it replaces): both
    # PY EPPFs of the subsample; they cancel (zero here) when the draw used the slot's own (alpha, d)
    a_s, d_s = h.row_alpha[s], h.row_d[s]
    corr_new = _eppf(sp, a_s, d_s) - _eppf(sp, a_q, d_q)
    corr_old = _eppf(state.sizes[v0], a_q, d_q) - _eppf(state.sizes[v0], a_s, d_s)
    corr = jnp.where(split, corr_new, jnp.where(refresh, corr_new + corr_old, 0.0))
    log_acc = marg[1] - marg[0] + jnp.where(split, lr_split, jnp.where(merge, lr_merge, 0.0)) + corr
    new = state._replace(
        z=jnp.where(((slots == tgt) & ~merge)[:, None], z_t, state.z),
        sizes=jnp.where(((slots == tgt) & ~merge)[:, None], sp, state.sizes),
    )
    new = _set_feature(new, f, f_kind, j, tgt, stats[1])
    new = _clear_empty_views(model, new, init_hypers(model, V, h.row_alpha.dtype))
    valid = ok & (split | refresh | merge)
    return new, log_acc, valid


def new_view_mh(
    rng_key: PRNGKey, state: CrossCatState, f, *, model: CrossCatModel, data: CrossCatData, fresh=None, noise=None
):
    """One Metropolis-Hastings step proposing a new feature set (view) for feature ``f``; ``(state, accepted)``.

    ``fresh``: optional pre-drawn proposal partition ``(z [N], sizes [C], ok, alpha_q, d_q)`` (see
    :func:`_new_view_proposal`); default: drawn here from the target slot's PY prior. ``noise``: optional
    pre-drawn ``(u_move, u_accept, gumbel [V])`` (default: from ``rng_key``).

    Parameters
    ----------
    rng_key
        PRNG key.
    state
        One chain's :class:`~jaxsub.anneal.crosscat.CrossCatState`.
    model
        The :class:`~jaxsub.anneal.crosscat.CrossCatModel`.
    data
        Its :class:`~jaxsub.anneal.crosscat.CrossCatData`.
    f
        The feature: a column index or ``(kind, j)`` as for :func:`feature_gibbs`.
    fresh, noise
        Optional pre-drawn proposal partition and random numbers (above).

    Returns
    -------
    tuple
        ``(CrossCatState, accepted)``.
    """
    k_prop, k_acc = jax.random.split(rng_key)
    if noise is None:
        prop_noise, u_acc = None, jax.random.uniform(k_acc)
    else:
        prop_noise, u_acc = (noise[0], noise[2]), noise[1]
    prop, log_acc, valid = _new_view_proposal(k_prop, state, f, model=model, data=data, fresh=fresh, noise=prop_noise)
    acc = valid & (jnp.log(u_acc) < log_acc)
    return jax.tree.map(lambda a, b: jnp.where(acc, a, b), prop, state), acc
