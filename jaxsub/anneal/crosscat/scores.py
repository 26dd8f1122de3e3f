"""Collapsed scores: row predictives, cluster marginals, the PY prior weights and the log joint.

Categorical features are Dirichlet-multinomial (per-level pseudo-counts ``cat_prior``), real ones
Normal-inverse-chi-squared with a Student-t predictive; a missing cell contributes no factor.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln

from jaxsub.anneal import mixture as mx
from jaxsub.anneal.crosscat.model import CrossCatModel, CrossCatState, _level_mask
from jaxsub.anneal.model import CRP, BetaBernoulli, MixtureModel
from jaxsub.anneal.moves import _first_true

__all__ = ["log_joint"]

_LOG_PI = math.log(math.pi)
_EPPF_MODEL = MixtureModel(CRP(1.0), (BetaBernoulli(),))  # stand-in: mx.log_partition_prior needs a non-Finite model


def _eppf(sizes, alpha, discount):
    return mx.log_partition_prior(_EPPF_MODEL, sizes, alpha, discount)


def _cat_pred(model, hyp, counts, x):
    """``[Fc, C]`` log predictive of levels ``x`` ``[Fc]`` (missing -> 0)."""
    mask = _level_mask(model)
    beta = hyp.cat_prior
    B = jnp.sum(jnp.where(mask, beta, 0.0), -1)
    c = jnp.take_along_axis(counts, jnp.maximum(x, 0)[:, None, None], 2)[..., 0].astype(beta.dtype)
    n = jnp.sum(counts, -1).astype(beta.dtype)
    b = jnp.take_along_axis(beta, jnp.maximum(x, 0)[:, None], 1)
    return jnp.where((x >= 0)[:, None], jnp.log(b + c) - jnp.log(B[:, None] + n), 0.0)


def _nix_pred_params(nix, stats):
    """Student-t predictive of NIX clusters: params ``[..., 4]`` (mu0, kappa0, nu0, sigma2) and stats ``[..., 3]``
    (n, sum, sum of squares) -> ``[..., 4]`` = ``(mu_n, 1 / (nu_n s2), (nu_n + 1) / 2, log normaliser)`` with
    ``s2 = nu_n sigma_n^2 / nu_n (1 + 1 / kappa_n)``, so ``log p(x) = const - (nu_n + 1)/2 log1p((x - mu_n)^2 / (nu_n s2))``.

    These change only when a row joins or leaves the cluster (or the NIX parameters change), so the
    row sweep keeps them per cluster (:class:`_ScoreCache`) instead of two ``lgamma`` per cluster,
    feature and tick."""
    mu0, k0, nu0, s2 = nix[..., 0], nix[..., 1], nix[..., 2], nix[..., 3]
    n, s1, sq = stats[..., 0], stats[..., 1], stats[..., 2]
    kn, nun = k0 + n, nu0 + n
    mun = (k0 * mu0 + s1) / kn
    nus2 = jnp.maximum(nu0 * s2 + sq + k0 * mu0 * mu0 - kn * mun * mun, nu0 * s2 * 1e-6)
    scale2 = nus2 / nun * (1.0 + 1.0 / kn)
    half = 0.5 * (nun + 1.0)
    const = gammaln(half) - gammaln(0.5 * nun) - 0.5 * (jnp.log(nun * scale2) + _LOG_PI)
    return jnp.stack([mun, 1.0 / (nun * scale2), half, const], -1)


def _t_logpdf(params, x, obs):
    """``[Fr, C]`` Student-t log predictive from :func:`_nix_pred_params` ``[Fr, C, 4]`` at ``x`` ``[Fr]``; missing -> 0."""
    t = (x[:, None] - params[..., 0]) ** 2 * params[..., 1]
    return jnp.where(obs[:, None], params[..., 3] - params[..., 2] * jnp.log1p(t), 0.0)


def _real_pred(hyp, stats, x, obs):
    """``[Fr, C]`` Student-t log predictive (NIX), missing -> 0."""
    return _t_logpdf(_nix_pred_params(hyp.nix[:, None, :], stats), x, obs)


def _view_scores(model, state, cat_row, real_row, real_obs):
    """``[V, C]`` sum over each view's features of the row's log predictive in every cluster."""
    V = state.z.shape[0]
    C = state.sizes.shape[1]
    dt = state.hypers.row_alpha.dtype
    out = jnp.zeros((V, C), dt)
    if len(model.cat_idx):
        s = _cat_pred(model, state.hypers, state.cat_counts, cat_row).astype(dt)
        out = out + jax.ops.segment_sum(s, state.view_of[jnp.asarray(model.cat_idx)], V)
    if len(model.real_idx):
        s = _real_pred(state.hypers, state.real_stats, real_row.astype(dt), real_obs).astype(dt)
        out = out + jax.ops.segment_sum(s, state.view_of[jnp.asarray(model.real_idx)], V)
    return out


def _prior_logw(sizes, alpha, d):
    """Eq. (star) prior weights of one view ``[C]``: occupied ``log(n_k - d)``, first empty ``log(alpha + K d)``."""
    occ = sizes > 0
    first = _first_true(~occ)
    k = jnp.sum(occ).astype(alpha.dtype)
    slot = jnp.arange(sizes.shape[0])
    return jnp.where(
        occ,
        jnp.log(jnp.where(occ, sizes.astype(alpha.dtype) - d, 1.0)),
        jnp.where((slot == first) & ~jnp.all(occ), jnp.log(alpha + k * d), -jnp.inf),
    )


def _dm_cluster_marginals(model, beta, counts, mask=None):
    """``log p(X_c)`` per categorical feature and cluster: beta ``[..., Fc, L]``, counts ``[..., Fc, C, L]`` ->
    ``[..., Fc, C]``.

    ``mask`` ``[Fc, L]`` marks real levels (default: the model's); padding levels are ignored."""
    mask = _level_mask(model) if mask is None else mask
    bb = jnp.where(mask, beta, 1.0)
    B = jnp.sum(jnp.where(mask, beta, 0.0), -1)
    c = counts.astype(beta.dtype)
    n = jnp.sum(c, -1)
    return (
        gammaln(B[..., None])
        - gammaln(B[..., None] + n)
        + jnp.sum(jnp.where(mask[:, None, :], gammaln(bb[..., None, :] + c) - gammaln(bb[..., None, :]), 0.0), -1)
    )


def _dm_marginal(model, beta, counts, mask=None):
    """``sum_c log p(X_c)`` per categorical feature: beta ``[..., Fc, L]``, counts ``[..., Fc, C, L]`` -> ``[..., Fc]``."""
    return jnp.sum(_dm_cluster_marginals(model, beta, counts, mask), -1)


def _nix_marginal(params, stats):
    """``sum_c log p(X_c)`` of one real feature: params ``[..., 4]``, stats ``[C, 3]``."""
    return mx.nix_log_marginal(params, stats[:, 0], stats[:, 1:])


def _feature_marginals(model, state):
    """``[F]`` collapsed log marginal of each feature given its view's row partition."""
    h = state.hypers
    out = jnp.zeros((model.num_features,), h.row_alpha.dtype)
    if len(model.cat_idx):
        out = out.at[jnp.asarray(model.cat_idx)].set(_dm_marginal(model, h.cat_prior, state.cat_counts))
    if len(model.real_idx):
        out = out.at[jnp.asarray(model.real_idx)].set(jax.vmap(_nix_marginal)(h.nix, state.real_stats))
    return out


def log_joint(model: CrossCatModel, state: CrossCatState) -> jnp.ndarray:
    """``log p(view partition, row partitions, X_S)`` of the current subsample (hypers fixed).

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.crosscat.CrossCatModel`.
    state
        One chain's :class:`~jaxsub.anneal.crosscat.CrossCatState`.

    Returns
    -------
    jnp.ndarray
        Scalar log joint.
    """
    h = state.hypers
    V = state.z.shape[0]
    nf = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V)
    occ = nf > 0
    lp = _eppf(nf, h.view_alpha, h.view_d)
    rows = jax.vmap(_eppf)(state.sizes, h.row_alpha, h.row_d)
    return lp + jnp.sum(jnp.where(occ, rows, 0.0)) + jnp.sum(_feature_marginals(model, state))
