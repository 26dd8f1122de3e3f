"""Grid Gibbs of every hyperparameter given the partitions (:func:`resample_hypers`)."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

from jaxsub.anneal.crosscat.grids import CrossCatGrids
from jaxsub.anneal.crosscat.model import CrossCatHypers, CrossCatModel, CrossCatState, _level_mask
from jaxsub.anneal.crosscat.scores import _eppf, _nix_marginal
from jaxsub.types import PRNGKey

__all__ = ["HYPER_WIDTHS", "resample_hypers"]


#: Default cluster widths of :func:`resample_hypers`' Dirichlet and NIX loops below the capacity.
HYPER_WIDTHS = (8, 16, 32)


def _check_hyper_widths(widths) -> tuple:
    """``widths`` as a tuple of strictly increasing positive ints (empty: always the full capacity)."""
    try:
        out = tuple(int(w) for w in widths)
    except TypeError:
        raise ValueError(f"hyper_widths must be a tuple of ints; got {widths!r}") from None
    if any(w < 1 for w in out) or any(b <= a for a, b in zip(out, out[1:])) or any(int(w) != w for w in widths):
        raise ValueError(f"hyper_widths must be strictly increasing positive ints; got {widths!r}")
    return out


def _occupied_bound(model: CrossCatModel, state: CrossCatState) -> jnp.ndarray:
    """``[2]`` int32: the most clusters holding cells of any categorical (0) / real (1) feature, over every
    feature and every leading batch axis (chain) of ``state``: :func:`resample_hypers`' ``occupied``."""
    out = []
    for idx, occ in (
        (model.cat_idx, lambda: jnp.sum(state.cat_counts, -1) > 0),
        (model.real_idx, lambda: state.real_stats[..., 0] > 0),
    ):
        out.append(jnp.max(jnp.sum(occ(), -1)).astype(jnp.int32) if len(idx) else jnp.zeros((), jnp.int32))
    return jnp.stack(out)


def _draw(k, g, lp):
    """A draw from the grid ``g`` with log weights ``lp`` (last axis)."""
    return g[jax.random.categorical(k, lp, axis=-1)]


def _switch_width(widths: tuple, capacity: int, occupied, branch, operand):
    """``branch(width)(operand)`` at the smallest of ``widths`` (or ``capacity``) holding ``occupied`` clusters."""
    ws = [w for w in widths if w < capacity] + [capacity]
    if len(ws) == 1:
        return branch(capacity, operand)
    return jax.lax.switch(jnp.sum(jnp.asarray(ws[:-1]) < occupied), [partial(branch, w) for w in ws], operand)


def _partition_hypers(keys, state: CrossCatState, grids: CrossCatGrids, dt):
    """The view-partition ``(alpha_v, d_v)`` and every occupied view's row ``(alpha, d)``, in that order."""
    h = state.hypers
    V = state.z.shape[0]
    nf = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V)
    occ = nf > 0
    va, vd = h.view_alpha, h.view_d
    if grids.view_alpha is not None:
        g = jnp.asarray(grids.view_alpha, dt)
        va = _draw(next(keys), g, _eppf(nf, g, vd))
    if grids.view_d is not None:
        g = jnp.asarray(grids.view_d, dt)
        vd = _draw(next(keys), g, _eppf(nf, va, g))
    ra, rd = h.row_alpha, h.row_d
    if grids.row_alpha is not None:
        g = jnp.asarray(grids.row_alpha, dt)
        lp = jax.vmap(lambda s, d: _eppf(s, g, d))(state.sizes, rd)
        ra = jnp.where(occ, _draw(next(keys), g, lp), ra)
    if grids.row_d is not None:
        g = jnp.asarray(grids.row_d, dt)
        lp = jax.vmap(lambda s, a: _eppf(s, a, g))(state.sizes, ra)
        rd = jnp.where(occ, _draw(next(keys), g, lp), rd)
    return va, vd, ra, rd


class _DirichletGibbs(NamedTuple):
    """The inputs of the Dirichlet pseudo-count Gibbs loop (one chain): clusters sorted by size per feature."""

    g: jnp.ndarray  # [G] grid
    lg_g: jnp.ndarray  # [G] lgamma of the grid
    mask: jnp.ndarray  # [Fc, L] real levels
    pf: jnp.ndarray  # [P] feature of each (feature, level) pair
    pl: jnp.ndarray  # [P] level of each pair
    gumbels: jnp.ndarray  # [P, G]
    counts_s: jnp.ndarray  # [Fc, C, L] counts, clusters by decreasing size
    n_s: jnp.ndarray  # [Fc, C] observed cells, same order


def _dirichlet_level(d: _DirichletGibbs, i, cp):
    """Gibbs draw of pair ``i``'s pseudo-count from its grid conditional (``d`` holds the clusters in use).

    ``log p(X | beta_fl = g)`` up to terms free of ``beta_fl``, with ``B_rest`` the sum of the feature's other
    levels: ``sum_c [lgamma(B_rest + g) - lgamma(B_rest + g + n_c) + lgamma(g + c_cl) - lgamma(g)]`` (the
    Dirichlet-multinomial marginal of ``_dm_marginal``; O(width G) per pair); a Gumbel-max draw.
    """
    f, lvl = d.pf[i], d.pl[i]
    row = cp[f]  # [L]
    col = row[lvl]
    b_rest = jnp.sum(jnp.where(d.mask[f], row, 0.0)) - col
    n_f = d.n_s[f]  # [width]
    c_l = d.counts_s[f, :, lvl]  # [width]
    bg = b_rest + d.g  # [G]
    lp = jnp.sum(gammaln(bg[:, None]) - gammaln(bg[:, None] + n_f[None, :]), -1) + jnp.sum(
        gammaln(d.g[:, None] + c_l[None, :]) - d.lg_g[:, None], -1
    )  # [G]
    return cp.at[f, lvl].set(d.g[jnp.argmax(lp + d.gumbels[i])])


def _dirichlet_at_width(d: _DirichletGibbs, width: int, cp):
    """The Dirichlet Gibbs loop over every pair on the ``width`` largest clusters of each feature."""
    d = d._replace(counts_s=d.counts_s[:, :width], n_s=d.n_s[:, :width])
    return jax.lax.fori_loop(0, d.pf.shape[0], partial(_dirichlet_level, d), cp)


def _dirichlet_hypers(key, model: CrossCatModel, state: CrossCatState, cp, grid, dt, occupied, widths):
    """Every real (feature, level) pair's Dirichlet pseudo-count from its grid conditional (Gibbs, fixed order).

    Padding levels of short features are skipped. Only the clusters holding cells of a feature enter its
    conditionals (an empty slot's terms are 0): the slots are sorted by size per feature and the loop runs on
    the first ``width`` of them (:func:`_switch_width`): the same conditionals at a fraction of the
    ``O(C G)`` lgammas per pair when few clusters are occupied, e.g. early in an anneal.
    """
    g = jnp.asarray(grid, dt)
    counts = state.cat_counts.astype(dt)  # [Fc, C, L]
    n_c = jnp.sum(counts, -1)  # [Fc, C] observed cells per cluster
    pf = np.asarray([j for j, i in enumerate(model.cat_idx) for _ in range(model.features[i].num_levels)], np.int32)
    pl = np.asarray([lv for i in model.cat_idx for lv in range(model.features[i].num_levels)], np.int32)
    gumbels = jax.random.gumbel(key, (pf.size, g.shape[0]), dt)  # one call for every pair
    by_size = jnp.argsort(-n_c, axis=1)  # [Fc, C]
    d = _DirichletGibbs(
        g,
        gammaln(g),
        _level_mask(model),
        jnp.asarray(pf),
        jnp.asarray(pl),
        gumbels,
        jnp.take_along_axis(counts, by_size[:, :, None], axis=1),
        jnp.take_along_axis(n_c, by_size, axis=1),
    )
    occ = jnp.max(jnp.sum(n_c > 0, 1)) if occupied is None else jnp.asarray(occupied)[0]
    return _switch_width(widths, counts.shape[1], occ, partial(_dirichlet_at_width, d), cp)


def _nix_at_width(nix_grids, nix_keys, logprior, rs_s, dt, width, nix):
    """Grid Gibbs of the NIX parameters (mu0, kappa0, nu0, sigma2 in turn) on the ``width`` largest clusters."""
    stats = rs_s[:, :width]
    for p, grid in enumerate(nix_grids):
        if grid is None:
            continue
        g = jnp.asarray(grid, dt)
        cand = jnp.broadcast_to(nix[:, None, :], (nix.shape[0], g.shape[0], 4)).at[:, :, p].set(g[None])
        lp = jax.vmap(_nix_marginal)(cand, stats)  # [Fr, G]
        if logprior is not None and logprior[p] is not None:
            lp = lp + jnp.asarray(logprior[p], dt)[None]  # the grid points' prior weights
        nix = nix.at[:, p].set(_draw(nix_keys[p], g, lp))
    return nix


def _nix_hypers(keys, state: CrossCatState, nix, grids: CrossCatGrids, dt, occupied, widths):
    """The NIX parameters of every real feature; as for the Dirichlet levels, only the clusters holding a
    feature's cells enter (an empty slot's NIX term is 0), on the largest ``width`` slots of each feature."""
    nix_grids = (grids.nix_mu0, grids.nix_kappa0, grids.nix_nu0, grids.nix_sigma2)
    rs = state.real_stats
    by_size = jnp.argsort(-rs[..., 0], axis=1)  # [Fr, C]
    rs_s = jnp.take_along_axis(rs, by_size[:, :, None], axis=1)
    nix_keys = [next(keys) if gr is not None else None for gr in nix_grids]
    occ = jnp.max(jnp.sum(rs[..., 0] > 0, 1)) if occupied is None else jnp.asarray(occupied)[1]
    branch = partial(_nix_at_width, nix_grids, nix_keys, grids.nix_logprior, rs_s, dt)
    return _switch_width(widths, rs.shape[1], occ, branch, nix)


def resample_hypers(
    rng_key: PRNGKey,
    state: CrossCatState,
    *,
    model: CrossCatModel,
    grids: CrossCatGrids,
    occupied=None,
    widths: tuple = HYPER_WIDTHS,
) -> CrossCatState:
    """Grid Gibbs of all hyperparameters given the partitions (cost independent of N).

    The view-partition ``(alpha_v, d_v)``, every occupied view's row ``(alpha, d)``, every categorical level's
    Dirichlet pseudo-count and every NIX parameter, each from its grid conditional (uniform priors on the
    grids, or ``grids.nix_logprior``); a ``None`` grid keeps its hyperparameter fixed.

    Parameters
    ----------
    rng_key
        PRNG key.
    state
        One chain's :class:`~jaxsub.anneal.crosscat.CrossCatState`.
    model
        The :class:`~jaxsub.anneal.crosscat.CrossCatModel`.
    grids
        :class:`~jaxsub.anneal.crosscat.CrossCatGrids`.
    occupied
        Optional ``[2]`` int (``_occupied_bound``): an upper bound on the occupied clusters of any categorical /
        real feature, used to pick the loop width instead of this state's own count (same conditionals and draws
        at any width that holds them). Under ``vmap`` pass one bound for all chains (``in_axes=None``): a batched
        switch index runs *every* width's branch for every chain.
    widths
        Static increasing cluster widths (default :data:`HYPER_WIDTHS`): the Dirichlet and NIX grid conditionals
        run on the largest ``width`` cluster slots of each feature, the smallest of ``widths`` (or the capacity)
        that holds every feature's occupied clusters (a ``lax.switch``); ``()``: always the full capacity.

    Returns
    -------
    CrossCatState
        ``state`` with new ``hypers``.
    """
    widths = _check_hyper_widths(widths)
    h = state.hypers
    dt = h.row_alpha.dtype
    keys = iter(jax.random.split(rng_key, 8))
    va, vd, ra, rd = _partition_hypers(keys, state, grids, dt)
    cp = h.cat_prior
    if grids.dirichlet is not None and len(model.cat_idx):
        cp = _dirichlet_hypers(next(keys), model, state, cp, grids.dirichlet, dt, occupied, widths)
    nix = h.nix
    nix_grids = (grids.nix_mu0, grids.nix_kappa0, grids.nix_nu0, grids.nix_sigma2)
    if len(model.real_idx) and any(gr is not None for gr in nix_grids):
        nix = _nix_hypers(keys, state, nix, grids, dt, occupied, widths)
    return state._replace(hypers=CrossCatHypers(va, vd, ra, rd, cp, nix))
