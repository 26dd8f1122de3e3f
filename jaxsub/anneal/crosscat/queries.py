"""Queries of a fitted state: held-out scores, posterior predictive draws, feature dependence."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.anneal.crosscat.model import CrossCatData, CrossCatModel, CrossCatState, _level_mask
from jaxsub.anneal.crosscat.scores import _prior_logw, _view_scores
from jaxsub.types import PRNGKey

__all__ = ["depends_on", "heldout_rows", "predictive_samples"]


def heldout_rows(model: CrossCatModel, state: CrossCatState, test: CrossCatData) -> jnp.ndarray:
    """``[T]`` held-out log predictive per test row: ``sum_v log sum_c w_vc p(x_v | X_vc)`` (missing cells skipped).

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.crosscat.CrossCatModel`.
    state
        One chain's :class:`~jaxsub.anneal.crosscat.CrossCatState`.
    test
        Held-out rows as :class:`~jaxsub.anneal.crosscat.CrossCatData`.

    Returns
    -------
    jnp.ndarray
        ``[T]`` log predictive of each test row.
    """
    V = state.z.shape[0]
    nf = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V)
    h = state.hypers
    logw = jax.vmap(_prior_logw)(state.sizes, h.row_alpha, h.row_d)
    logw = logw - jax.nn.logsumexp(logw, axis=1, keepdims=True)

    def one(c, r, o):
        s = _view_scores(model, state, c, r, o)
        return jnp.sum(jnp.where(nf > 0, jax.nn.logsumexp(logw + s, axis=1), 0.0))

    return jax.lax.map(lambda a: one(*a), (test.cat, test.real, test.real_obs), batch_size=1024)


def predictive_samples(rng_key: PRNGKey, model: CrossCatModel, state: CrossCatState, num_samples: int) -> jnp.ndarray:
    """``[num_samples, F]`` draws from the posterior predictive of a new row (one chain's state).

    Per view: a cluster from eq. (star) prior weights; per feature: a level from
    ``(beta_l + c_l)/(B + n)`` or a real from the NIX posterior Student-t.

    Parameters
    ----------
    rng_key
        PRNG key.
    model
        The :class:`~jaxsub.anneal.crosscat.CrossCatModel`.
    state
        One chain's :class:`~jaxsub.anneal.crosscat.CrossCatState`.
    num_samples
        Rows to draw (static).

    Returns
    -------
    jnp.ndarray
        ``[num_samples, F]`` (categorical levels as floats).
    """
    h = state.hypers
    V = state.z.shape[0]
    logw = jax.vmap(_prior_logw)(state.sizes, h.row_alpha, h.row_d)

    def one(key):
        k1, k2, k3 = jax.random.split(key, 3)
        kv = jax.random.categorical(k1, logw, axis=-1)  # [V]
        out = jnp.zeros((model.num_features,), h.row_alpha.dtype)
        if len(model.cat_idx):
            ci = jnp.asarray(model.cat_idx)
            k = kv[state.view_of[ci]]
            c = state.cat_counts[jnp.arange(ci.shape[0]), k].astype(h.cat_prior.dtype)
            p = jnp.where(_level_mask(model), h.cat_prior + c, 0.0)
            lv = jax.random.categorical(k2, jnp.log(p), axis=-1)
            out = out.at[ci].set(lv.astype(out.dtype))
        if len(model.real_idx):
            ri = jnp.asarray(model.real_idx)
            k = kv[state.view_of[ri]]
            s = state.real_stats[jnp.arange(ri.shape[0]), k]
            mu0, k0, nu0, s2 = h.nix[:, 0], h.nix[:, 1], h.nix[:, 2], h.nix[:, 3]
            n, s1, sq = s[:, 0], s[:, 1], s[:, 2]
            kn, nun = k0 + n, nu0 + n
            mun = (k0 * mu0 + s1) / kn
            nus2 = jnp.maximum(nu0 * s2 + sq + k0 * mu0 * mu0 - kn * mun * mun, nu0 * s2 * 1e-6)
            scale = jnp.sqrt(nus2 / nun * (1.0 + 1.0 / kn))
            out = out.at[ri].set(mun + scale * jax.random.t(k3, nun))
        return out

    del V
    return jax.vmap(one)(jax.random.split(rng_key, num_samples))


def depends_on(view_of) -> np.ndarray:
    """``[F, F]`` fraction of samples (rows of ``view_of`` ``[S, F]``) in which two features share a view.

    Parameters
    ----------
    view_of
        ``[S, F]`` (or ``[..., F]``) view labels of the features in ``S`` samples.

    Returns
    -------
    np.ndarray
        ``[F, F]`` co-assignment frequencies.
    """
    v = np.asarray(view_of)
    v = v.reshape(-1, v.shape[-1])
    return (v[:, :, None] == v[:, None, :]).mean(axis=0)
