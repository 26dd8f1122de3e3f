r"""The conducive gradient of Gaussian surrogates (El Mekkaoui et al. 2021, eq. 5) in affine form.

With ``q = ∏_s q_s`` the conducive gradient on shard ``s`` chosen with probability ``f_s`` is

.. math::

    g_s(θ) = ∇\log q(θ) - \frac{1}{f_s} ∇\log q_s(θ)
           = -\sum_k Λ_k(θ - μ_k) + \frac{1}{f_s} Λ_s(θ - μ_s),

and ``E_{s∼f}[g_s(θ)] = 0`` for every θ. Precomputing ``M_s = Λ_s/f_s - Λ`` and
``c_s = h - h_s/f_s`` makes ``g_s(θ) = M_s θ + c_s`` one matrix-vector product.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jaxsub.sgmcmc.surrogate_types import GaussianSurrogates
from jaxsub.types import Array, ArrayLikeTree

__all__ = [
    "ConduciveArrays",
    "apply_conducive",
    "conducive_arrays",
    "conducive_gradient",
    "curvature_excess",
    "shard_arrays",
]


class ConduciveArrays(NamedTuple):
    r"""Precomputed affine form of the conducive gradient: ``g_s(θ) = M_s θ + c_s``.

    ``M_s = Λ_s / f_s - Λ`` and ``c_s = h - h_s / f_s`` with ``Λ = Σ_k Λ_k``,
    ``h = Σ_k h_k``. Stored per structure of the surrogates:

    * full: ``matrix [S, d, d]``; diagonal: ``matrix [S, d]`` (the diagonal of ``M_s``);
    * low-rank plus diagonal (``Λ_s = D_s + U_s U_sᵀ``): ``matrix [S, d]`` holds
      ``D_s/f_s - Σ_k D_k``, ``factor [S, d, r]`` holds ``U_s / sqrt(f_s)`` and
      ``global_factor [d, S·r]`` holds ``[U_1 … U_S]`` (the same for every shard), so
      ``M_s θ = matrix_s ⊙ θ + F_s(F_sᵀθ) - G(Gᵀθ)``.

    ``c_s`` is ``offset [S, d]``. The exploration weight α is *not* folded in: kernels
    take it as a (traceable) hyperparameter and scale the shard's arrays once per round.
    One evaluation costs ``O(d²)`` (full), ``O(d)`` (diagonal) or ``O(d S r)`` (low rank),
    independent of the data size.
    """

    matrix: Array
    offset: Array
    factor: Array | None = None
    global_factor: Array | None = None


def conducive_arrays(surrogates: GaussianSurrogates, shard_probs, exploration: float = 1.0) -> ConduciveArrays:
    """Build :class:`ConduciveArrays` (in float64 on the host, then cast to the surrogates' dtype).

    ``exploration`` (default 1) is folded in here only for direct use with
    :func:`conducive_gradient`; the kernels pass α separately and use ``exploration=1``.

    Parameters
    ----------
    surrogates
        The :class:`~jaxsub.sgmcmc.surrogate_types.GaussianSurrogates`.
    shard_probs
        ``[S]`` shard probabilities ``f_s``.
    exploration
        α folded into the arrays (default 1).

    Returns
    -------
    ConduciveArrays

    Raises
    ------
    ValueError
        If ``shard_probs`` does not have one entry per surrogate.
    """
    probs = np.asarray(shard_probs, np.float64)
    if probs.shape != (surrogates.num_shards,):
        raise ValueError(
            f"shard_probs must have one entry per surrogate ({surrogates.num_shards}); got shape {probs.shape}"
        )
    prec = np.asarray(surrogates.precision, np.float64)
    shift = np.asarray(surrogates.shift, np.float64)
    total_prec, total_shift = prec.sum(0), shift.sum(0)
    inv_f = (1.0 / probs).reshape((-1,) + (1,) * (prec.ndim - 1))
    matrix = exploration * (prec * inv_f - total_prec)
    offset = exploration * (total_shift - shift / probs[:, None])
    dtype = surrogates.shift.dtype
    factor = global_factor = None
    if surrogates.factor is not None:
        u = np.asarray(surrogates.factor, np.float64)  # [S, d, r]
        factor = jnp.asarray(np.sqrt(exploration) * u / np.sqrt(probs)[:, None, None], dtype)
        global_factor = jnp.asarray(np.sqrt(exploration) * np.concatenate(list(u), axis=1), dtype)
    return ConduciveArrays(jnp.asarray(matrix, dtype), jnp.asarray(offset, dtype), factor, global_factor)


def shard_arrays(arrays: ConduciveArrays, shard: Array, exploration=1.0) -> ConduciveArrays:
    """Shard ``s``'s arrays scaled by ``α = exploration`` (gathered once per round; α may be traced).

    Parameters
    ----------
    arrays
        From :func:`conducive_arrays`.
    shard
        Index ``s``.
    exploration
        α.

    Returns
    -------
    ConduciveArrays
        One shard's arrays (no leading shard axis).
    """
    alpha = jnp.asarray(exploration, arrays.offset.dtype)
    factor = glob = None
    if arrays.factor is not None:
        root = jnp.sqrt(alpha)
        factor, glob = root * arrays.factor[shard], root * arrays.global_factor
    return ConduciveArrays(alpha * arrays.matrix[shard], alpha * arrays.offset[shard], factor, glob)


def apply_conducive(position: ArrayLikeTree, arrays: ConduciveArrays) -> ArrayLikeTree:
    """``M_s θ + c_s`` for one shard's arrays (from :func:`shard_arrays`), shaped like ``position``.

    Parameters
    ----------
    position
        θ (any pytree; flattened with ``ravel_pytree``).
    arrays
        One shard's :class:`ConduciveArrays`.

    Returns
    -------
    ArrayLikeTree
        Shaped like ``position``.
    """
    flat, unravel = ravel_pytree(position)
    dtype = flat.dtype
    matrix = arrays.matrix.astype(dtype)
    out = (matrix * flat if matrix.ndim == 1 else matrix @ flat) + arrays.offset.astype(dtype)
    if arrays.factor is not None:
        f, g = arrays.factor.astype(dtype), arrays.global_factor.astype(dtype)
        out = out + f @ (f.T @ flat) - g @ (g.T @ flat)
    return unravel(out)


def conducive_gradient(
    position: ArrayLikeTree, shard: Array, arrays: ConduciveArrays, exploration=1.0
) -> ArrayLikeTree:
    r"""``α g_s(θ) = α[-(Λθ - h) + (1/f_s)(Λ_s θ - h_s)]`` as a pytree shaped like ``position``.

    Parameters
    ----------
    position
        θ (any pytree; flattened with ``ravel_pytree``).
    shard
        Index ``s`` into the leading axis of ``arrays``.
    arrays
        From :func:`conducive_arrays` (which fixes ``f``).
    exploration
        α (may be traced).

    Returns
    -------
    ArrayLikeTree
        Shaped like ``position``.
    """
    return apply_conducive(position, shard_arrays(arrays, shard, exploration))


def curvature_excess(surrogates: GaussianSurrogates, shard_probs) -> np.ndarray:
    r"""Per shard, the largest eigenvalue of ``Λ_s / f_s - Λ`` (``Λ = Σ_k Λ_k``): a stability diagnostic.

    During local steps on shard ``s`` CG-DSGLD samples (up to the prior) from
    ``q(θ) (p_s(θ) / q_s(θ))^{1/f_s}``, whose log has Hessian
    ``-Λ + (1/f_s)(Λ_s - H_s(θ))`` with ``H_s`` the shard likelihood's curvature.
    Where this excess is positive the local target is proper only as long as the
    true likelihood supplies curvature ``H_s >= Λ_s - f_s Λ`` (a Gaussian
    likelihood does; a logistic likelihood's tails are linear and do not), so
    long local rounds can diverge. A large positive value flags a poor surrogate
    (or a shard whose likelihood has no Gaussian approximation, e.g. a separable one).

    For low-rank-plus-diagonal surrogates with ``d > 4096`` the value is an upper bound,
    ``max_i(D_s/f_s - Σ_k D_k)_i + λ_max(U_sᵀU_s)/f_s`` (the ``-Σ_k U_k U_kᵀ`` part is dropped).

    Parameters
    ----------
    surrogates
        The :class:`~jaxsub.sgmcmc.surrogate_types.GaussianSurrogates`.
    shard_probs
        ``[S]`` shard probabilities ``f_s``.

    Returns
    -------
    np.ndarray
        ``[S]``.
    """
    probs = np.asarray(shard_probs, np.float64)
    prec = np.asarray(surrogates.precision, np.float64)
    total = prec.sum(0)
    if surrogates.factor is not None:
        u = np.asarray(surrogates.factor, np.float64)
        dim = u.shape[1]
        if dim > 4096:
            return np.array(
                [np.max(p / f - total) + np.linalg.eigvalsh(us.T @ us).max() / f for p, us, f in zip(prec, u, probs)]
            )
        big_u = np.concatenate(list(u), axis=1)
        total_full = np.diag(total) + big_u @ big_u.T
        return np.array(
            [np.linalg.eigvalsh((np.diag(p) + us @ us.T) / f - total_full).max() for p, us, f in zip(prec, u, probs)]
        )
    if surrogates.diagonal:
        return np.max(prec / probs[:, None] - total, axis=1)
    return np.array([np.linalg.eigvalsh(p / f - total).max() for p, f in zip(prec, probs)])
