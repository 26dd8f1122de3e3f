"""The full-data block Gibbs tick of the *Anneal Stepsize* strategy (:func:`block_tick`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln

from jaxsub.anneal import mixture as mx
from jaxsub.anneal.crosscat.copy_avoidance import _get_col
from jaxsub.anneal.crosscat.model import CrossCatData, CrossCatModel, CrossCatState
from jaxsub.anneal.crosscat.rows import _sample
from jaxsub.anneal.crosscat.scores import _dm_cluster_marginals
from jaxsub.anneal.moves import _first_true, bits_to_uniform, uniform_index

__all__ = ["block_tick"]


def _handful(state: CrossCatState, r, block):
    """``[V, N]`` mask of the handful moved with row ``r``: in each occupied view the first ``min(block, n)``
    members of ``r``'s cluster (size ``n``) in cyclic row order starting at ``r`` (``r`` itself first)."""
    V, n_rows = state.z.shape
    k_r = _get_col(state.z, r)
    cyc = (r + jnp.arange(n_rows, dtype=jnp.int32)) % n_rows
    member = (state.z[:, cyc] == k_r[:, None]) & (k_r >= 0)[:, None]
    take = member & (jnp.cumsum(member, axis=1) <= block)
    return jnp.zeros((V, n_rows), bool).at[:, cyc].set(take), k_r


def _handful_stats(model, state, data, hand):
    """Sufficient statistics of the handful of each feature's view: ``([Fc, L] counts, [Fr, 3] NIX sums)``."""
    cc, rs = None, None
    if len(model.cat_idx):
        ci = jnp.asarray(model.cat_idx)
        x = data.cat.T  # [Fc, N]
        w = (hand[state.view_of[ci]] & (x >= 0)).astype(state.cat_counts.dtype)
        cc = (
            jnp.zeros(state.cat_counts.shape[::2], state.cat_counts.dtype)
            .at[jnp.arange(ci.shape[0])[:, None], jnp.maximum(x, 0)]
            .add(w)
        )
    if len(model.real_idx):
        ri = jnp.asarray(model.real_idx)
        x = data.real.T.astype(state.real_stats.dtype)
        w = (hand[state.view_of[ri]] & data.real_obs.T).astype(x.dtype)
        rs = jnp.stack([jnp.sum(w, 1), jnp.sum(w * x, 1), jnp.sum(w * x * x, 1)], -1)
    return cc, rs


def _add_handful(model, state, k_view, cc, rs, sign):
    """Add ``sign`` times the handful's statistics to every feature's cluster ``k_view[view_of[f]]``."""
    cat_counts, real_stats = state.cat_counts, state.real_stats
    if cc is not None:
        ci = jnp.asarray(model.cat_idx)
        k = jnp.maximum(k_view[state.view_of[ci]], 0)
        cat_counts = cat_counts.at[jnp.arange(ci.shape[0]), k].add(sign * cc)
    if rs is not None:
        ri = jnp.asarray(model.real_idx)
        k = jnp.maximum(k_view[state.view_of[ri]], 0)
        real_stats = real_stats.at[jnp.arange(ri.shape[0]), k].add(sign * rs)
    return state._replace(cat_counts=cat_counts, real_stats=real_stats)


def _nix_per_cluster(params, stats):
    """``[C]`` NIX log marginal of each cluster's statistics ``stats`` ``[C, 3]`` alone."""
    return jax.vmap(lambda s_: mx.nix_log_marginal(params, s_[None, 0], s_[None, 1:]))(stats)


def block_tick(u, state: CrossCatState, block, *, model: CrossCatModel, data: CrossCatData):
    """One full-data block Gibbs tick of the paper's *Anneal Stepsize* strategy, in every view at once.

    ``u``: ``[4 + V]`` uint32 words as for :func:`row_tick` (0-1 the row pick, 2-3 unused, one cluster draw per
    view); ``block`` (traced int)
    the handful size. A uniform row ``r`` is picked; in each occupied view ``v`` its handful ``S_v`` is
    the first ``b_v = min(block, n_{v,k})`` members of ``r``'s cluster ``k`` in cyclic row order from
    ``r``; ``S_v`` leaves its cluster and joins one cluster jointly, drawn from::

        existing c:  Gamma(n_c + b_v - d_v) / Gamma(n_c - d_v)       * p(x_{S_v} | X_{vc})
        new:         (alpha_v + K_v d_v) Gamma(b_v - d_v) / Gamma(1 - d_v) * p(x_{S_v})

    (the PY prior of seating ``b_v`` rows together, times their joint collapsed predictive in the view's
    features; ``p(x_S | X) = exp(log Z(X + S) - log Z(X))`` from the conjugate marginals). With
    ``block = 1`` this is exactly the single-row full-data Gibbs tick (posterior invariant). With
    ``block > 1`` the handful depends on the state, so the move is the paper's heuristic (in the
    continuum limit, moving ``1 / beta`` rows at once takes the steps subsample annealing takes at
    inverse temperature ``beta``), not a reversible kernel: :func:`~jaxsub.anneal.anneal_stepsize`
    shrinks the blocks to 1 and its final single-row passes are what reach the posterior. Needs every row
    assigned (otherwise the state is returned unchanged, ``cursor`` advanced); O(V N + F N) work.
    Returns ``(state, overflow)``: a view with no empty slot for a new cluster halts the chain before any change.

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
    block
        The handful size (int scalar, may be traced).

    Returns
    -------
    tuple
        ``(CrossCatState, overflow)``.
    """
    V, n_rows = state.z.shape
    C = state.sizes.shape[1]
    h = state.hypers
    dt = h.row_alpha.dtype
    active = ~state.halted & (state.num_assigned == n_rows)
    r = jnp.clip(uniform_index(u[0:2], n_rows), 0, n_rows - 1)
    hand, k_r = _handful(state, r, block)
    occ_v = k_r >= 0
    bsz = jnp.sum(hand, 1).astype(state.sizes.dtype)
    cc, rs = _handful_stats(model, state, data, hand)
    st = _add_handful(model, state, k_r, cc, rs, -1)
    sizes = state.sizes.at[jnp.arange(V), jnp.maximum(k_r, 0)].add(jnp.where(occ_v, -bsz, 0))
    overflow = active & jnp.any(occ_v & ~jnp.any(sizes == 0, axis=1))
    go = active & ~overflow
    # joint predictive of each view's handful in every slot: log Z(stats_c + S) - log Z(stats_c), per feature
    lik = jnp.zeros((V, C), dt)
    if cc is not None:
        ci = jnp.asarray(model.cat_idx)
        base = _dm_cluster_marginals(model, h.cat_prior, st.cat_counts)
        plus = _dm_cluster_marginals(model, h.cat_prior, st.cat_counts + cc[:, None, :])
        lik = lik + jax.ops.segment_sum(plus - base, st.view_of[ci], V)
    if rs is not None:
        ri = jnp.asarray(model.real_idx)
        base = jax.vmap(_nix_per_cluster)(h.nix, st.real_stats)
        plus = jax.vmap(_nix_per_cluster)(h.nix, st.real_stats + rs[:, None, :])
        lik = lik + jax.ops.segment_sum(plus - base, st.view_of[ri], V)
    occ = sizes > 0
    b = bsz.astype(dt)[:, None]
    d = h.row_d[:, None]
    first = _first_true(~occ, axis=1)[:, None]
    k_occ = jnp.sum(occ, 1).astype(dt)[:, None]
    nc = jnp.where(occ, sizes.astype(dt), 1.0)
    prior = jnp.where(
        occ,
        gammaln(nc + b - d) - gammaln(nc - d),
        jnp.where(
            jnp.arange(C)[None, :] == first,
            jnp.log(h.row_alpha[:, None] + k_occ * d) + gammaln(b - d) - gammaln(1.0 - d),
            -jnp.inf,
        ),
    )
    k_new = jax.vmap(_sample)(bits_to_uniform(u[4:], dt), prior + lik)
    k_new = jnp.where(occ_v, k_new, -1)
    st = _add_handful(model, st, k_new, cc, rs, 1)
    sizes = sizes.at[jnp.arange(V), jnp.maximum(k_new, 0)].add(jnp.where(occ_v, bsz, 0))
    moved = st._replace(sizes=sizes, z=jnp.where(hand, k_new[:, None], state.z))
    new = jax.tree.map(lambda a, b_: jnp.where(go, a, b_), moved, state)
    new = new._replace(
        cursor=state.cursor + (~(state.halted | overflow)).astype(jnp.int32),
        since_hyper=state.since_hyper + go.astype(jnp.int32),
        halted=state.halted | overflow,
    )
    return new, overflow
