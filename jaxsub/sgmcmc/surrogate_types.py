"""The Gaussian likelihood surrogates of CG-DSGLD: their type, fit record and checks.

``q_s(θ) = N(θ; μ_s, Λ_s^{-1})`` approximates shard ``s``'s likelihood; it is stored in natural
parameters ``Λ_s`` and ``h_s = Λ_s μ_s`` on the flattened position (``ravel_pytree`` order),
as NumPy arrays on the host in the sampler's dtype.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from jaxsub.types import Array

__all__ = ["GaussianSurrogates", "SurrogateFitInfo", "check_surrogates"]


class SurrogateFitInfo(NamedTuple):
    """Cost and diagnostics of a surrogate fit (``None`` fields for exact surrogates).

    Attributes
    ----------
    seconds
        Wall-clock time of the fit, compilation included.
    num_sgld_steps
        SGLD steps per shard (burn-in + kept draws × thinning).
    likelihood_gradient_evaluations
        Per-datum likelihood gradients evaluated over all shards: ``S × steps × batch_size``.
    clipped_eigenvalues
        Number of negative eigenvalues (per shard) set to 0 (after dividing out the
        prior for SGLD fits; of the shard Hessian for Laplace fits).
    method
        ``"sgld"`` (moment matching) or ``"laplace"``.
    gradient_norm
        Laplace fits: per shard, the norm of the damped objective's gradient at the
        expansion point, divided by ``N_s`` (how far the optimiser is from the shard's own
        damped mode; with a common expansion point, ``'fedsgd'`` or ``'fedavg'``, it is not
        expected to be small).
    expansion_point
        Laplace fits: ``[S, d]`` flattened points where each shard's likelihood was expanded
        (all rows equal for ``expansion='fedsgd'`` and ``'fedavg'``).
    """

    seconds: float
    num_sgld_steps: int
    likelihood_gradient_evaluations: int
    clipped_eigenvalues: np.ndarray
    method: str = "sgld"
    gradient_norm: np.ndarray | None = None
    expansion_point: np.ndarray | None = None


class GaussianSurrogates(NamedTuple):
    """Per-shard Gaussian surrogates of the shard likelihoods, in natural parameters.

    Attributes
    ----------
    precision
        ``[S, d, d]`` (full) or ``[S, d]`` (diagonal) precisions ``Λ_s``.
    shift
        ``[S, d]``: ``h_s = Λ_s μ_s``.
    mean
        ``[S, d]``: ``μ_s`` (pseudo-inverse solution when ``Λ_s`` is singular).
    diagonal
        Whether ``precision`` is diagonal (``[S, d]``).
    fit_info
        :class:`SurrogateFitInfo` when fitted, ``None`` for exact surrogates.
    factor
        ``None``, or ``[S, d, r]``: low-rank-plus-diagonal precisions
        ``Λ_s = diag(precision_s) + factor_s factor_sᵀ`` (then ``diagonal`` is true).
    """

    precision: Array
    shift: Array
    mean: Array
    diagonal: bool
    fit_info: SurrogateFitInfo | None = None
    factor: Array | None = None

    @property
    def num_shards(self) -> int:
        """``S``, the number of shards."""
        return int(np.shape(self.shift)[0])

    @property
    def dim(self) -> int:
        """``d``, the size of the flattened position."""
        return int(np.shape(self.shift)[1])


def from_exact(means, precisions) -> GaussianSurrogates:
    """Exact surrogates from ``means [S, d]`` and ``precisions [S, d, d]`` or ``[S, d]`` (``ValueError`` if malformed)."""
    means = np.asarray(means, dtype=np.float64)
    precisions = np.asarray(precisions, dtype=np.float64)
    if means.ndim != 2:
        raise ValueError(f"means must be [num_shards, dim]; got shape {means.shape}")
    num_shards, dim = means.shape
    check_finite_precision(precisions, "precisions")
    if not np.all(np.isfinite(means)):
        raise ValueError("means must be finite")
    if precisions.shape == (num_shards, dim, dim):
        diagonal = False
        if not np.allclose(precisions, np.swapaxes(precisions, 1, 2), rtol=1e-6, atol=1e-8):
            raise ValueError("precisions must be symmetric matrices")
        shift = np.einsum("sij,sj->si", precisions, means)
    elif precisions.shape == (num_shards, dim):
        diagonal = True
        shift = precisions * means
    else:
        raise ValueError(
            f"precisions must be [num_shards, dim, dim] = {[num_shards, dim, dim]} (full) or "
            f"[num_shards, dim] = {[num_shards, dim]} (diagonal), one per mean; got shape {precisions.shape}"
        )
    dtype = jax.dtypes.canonicalize_dtype(np.float64)
    return GaussianSurrogates(host(precisions, dtype), host(shift, dtype), host(means, dtype), diagonal, None)


def host(x, dtype) -> np.ndarray:
    """Surrogates live on the host (NumPy), in the sampler's dtype: building a sampler inside ``jit`` stays legal."""
    return np.asarray(x, dtype=np.dtype(dtype))


def check_finite_precision(precision, name: str) -> None:
    """Raise ``ValueError`` naming the shards whose concrete precision has NaN/inf entries."""
    if isinstance(precision, jax.core.Tracer) or np.ndim(precision) == 0:
        return
    bad = ~np.isfinite(np.asarray(precision, np.float64)).reshape(np.shape(precision)[0], -1).all(axis=1)
    if bad.any():
        raise ValueError(
            f"{name} must be finite; the surrogate precision of shard(s) {np.flatnonzero(bad).tolist()} "
            "has NaN/inf entries (a diverged fit? refit with more damping or a smaller learning rate)"
        )


def check_surrogates(surrogates: Any, num_shards: int) -> GaussianSurrogates:
    """Raise ``ValueError`` unless ``surrogates`` is a :class:`GaussianSurrogates` with one entry per shard.

    Parameters
    ----------
    surrogates
        The object to check.
    num_shards
        ``S``.

    Returns
    -------
    GaussianSurrogates
        ``surrogates``.

    Raises
    ------
    ValueError
        For another type, another number of shards, or non-finite precisions, factors or shifts.
    """
    if not isinstance(surrogates, GaussianSurrogates):
        raise ValueError(
            "surrogates must be a GaussianSurrogates (from jaxsub.sgmcmc.gaussian_surrogates); "
            f"got {type(surrogates).__name__}"
        )
    if surrogates.num_shards != num_shards:
        raise ValueError(
            f"surrogates must have one Gaussian per shard: got {surrogates.num_shards} surrogates "
            f"for {num_shards} shards"
        )
    check_finite_precision(surrogates.precision, "surrogates.precision")
    if surrogates.factor is not None:
        check_finite_precision(surrogates.factor, "surrogates.factor")
    if not isinstance(surrogates.shift, jax.core.Tracer) and not np.all(np.isfinite(np.asarray(surrogates.shift))):
        raise ValueError("surrogates.shift must be finite (NaN/inf in h_s = Λ_s μ_s)")
    return surrogates
