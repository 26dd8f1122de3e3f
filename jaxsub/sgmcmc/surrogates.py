r"""Gaussian likelihood surrogates and the conducive gradient (El Mekkaoui et al. 2021, Sec. 4).

For every shard ``s`` a Gaussian ``q_s(θ) = N(θ; μ_s, Λ_s^{-1})`` approximates
the *shard likelihood* ``∏_{x∈X_s} p(x|θ)`` (not the local posterior). With
``q = ∏_s q_s`` the conducive gradient on shard ``s`` chosen with probability
``f_s`` is (paper eq. 5; NOTES.md §2)

.. math::

    g_s(θ) = ∇\log q(θ) - \frac{1}{f_s} ∇\log q_s(θ)
           = -\sum_k Λ_k(θ - μ_k) + \frac{1}{f_s} Λ_s(θ - μ_s),

and ``E_{s∼f}[g_s(θ)] = 0`` for every θ: adding ``α g_s`` to the DSGLD
gradient keeps it unbiased for any α (the paper's Remark 1). We store the
natural parameters ``Λ_s`` and ``h_s = Λ_s μ_s`` and precompute, per shard,
``M_s = Λ_s/f_s - Λ`` and ``c_s = h - h_s/f_s`` (``Λ = Σ_k Λ_k``,
``h = Σ_k h_k``), so ``g_s(θ) = M_s θ + c_s`` costs one matrix-vector
product, ``O(d^2)`` (``O(d)`` for diagonal surrogates), independent of the
data size.

Positions may be pytrees: surrogates live on the flattened position
(``jax.flatten_util.ravel_pytree`` order).
"""
from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
from blackjax.sgmcmc import gradients
from jax.flatten_util import ravel_pytree

from jaxsub.sgmcmc.shards import Shards, check_batch_size, make_shards, minibatch_indices, shard_gather
from jaxsub.types import Array, ArrayLikeTree, PRNGKey
from jaxsub.validation import check_choice, check_int, check_real

__all__ = ["GaussianSurrogates", "SurrogateFitInfo", "ConduciveArrays", "gaussian_surrogates", "conducive_arrays",
           "conducive_gradient", "apply_conducive", "check_surrogates", "curvature_excess"]


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
        Number of negative eigenvalues (per shard) set to 0 after dividing out the prior.
    """

    seconds: float
    num_sgld_steps: int
    likelihood_gradient_evaluations: int
    clipped_eigenvalues: np.ndarray


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
        Whether ``precision`` is diagonal.
    fit_info
        :class:`SurrogateFitInfo` when fitted, ``None`` for exact surrogates.
    """

    precision: Array
    shift: Array
    mean: Array
    diagonal: bool
    fit_info: SurrogateFitInfo | None = None

    @property
    def num_shards(self) -> int:
        return int(np.shape(self.shift)[0])

    @property
    def dim(self) -> int:
        return int(np.shape(self.shift)[1])


def _from_exact(means, precisions) -> GaussianSurrogates:
    means = np.asarray(means, dtype=np.float64)
    precisions = np.asarray(precisions, dtype=np.float64)
    if means.ndim != 2:
        raise ValueError(f"means must be [num_shards, dim]; got shape {means.shape}")
    num_shards, dim = means.shape
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
    if not (np.all(np.isfinite(means)) and np.all(np.isfinite(precisions))):
        raise ValueError("means and precisions must be finite")
    return GaussianSurrogates(jnp.asarray(precisions), jnp.asarray(shift),
                              jnp.asarray(means), diagonal, None)


def check_surrogates(surrogates: Any, num_shards: int) -> GaussianSurrogates:
    """Raise ``ValueError`` unless ``surrogates`` is a :class:`GaussianSurrogates` with one entry per shard."""
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
    return surrogates


class ConduciveArrays(NamedTuple):
    r"""Precomputed affine form of the conducive gradient: ``α g_s(θ) = M_s θ + c_s``.

    ``M_s = α(Λ_s / f_s - Λ)`` (``[S, d, d]``, or ``[S, d]`` for diagonal
    surrogates) and ``c_s = α(h - h_s / f_s)`` (``[S, d]``), with
    ``Λ = Σ_k Λ_k``, ``h = Σ_k h_k``. One evaluation is a single
    matrix-vector product (``O(d²)``, ``O(d)`` diagonal), and the kernels gather
    ``M_s, c_s`` once per round, not once per local step.
    """

    matrix: Array
    offset: Array


def conducive_arrays(surrogates: GaussianSurrogates, shard_probs, exploration: float = 1.0) -> ConduciveArrays:
    """Build :class:`ConduciveArrays` (in float64, then cast to the surrogates' dtype)."""
    probs = np.asarray(shard_probs, np.float64)
    prec = np.asarray(surrogates.precision, np.float64)
    shift = np.asarray(surrogates.shift, np.float64)
    total_prec, total_shift = prec.sum(0), shift.sum(0)
    inv_f = (1.0 / probs).reshape((-1,) + (1,) * (prec.ndim - 1))
    matrix = exploration * (prec * inv_f - total_prec)
    offset = exploration * (total_shift - shift / probs[:, None])
    dtype = surrogates.shift.dtype
    return ConduciveArrays(jnp.asarray(matrix, dtype), jnp.asarray(offset, dtype))


def apply_conducive(position: ArrayLikeTree, matrix: Array, offset: Array, *, diagonal: bool) -> ArrayLikeTree:
    """``M θ + c`` for one shard's ``(M_s, c_s)``, shaped like ``position``."""
    flat, unravel = ravel_pytree(position)
    dtype = flat.dtype
    matrix, offset = matrix.astype(dtype), offset.astype(dtype)
    out = (matrix * flat if diagonal else matrix @ flat) + offset
    return unravel(out)


def conducive_gradient(position: ArrayLikeTree, shard: Array, arrays: ConduciveArrays, *, diagonal: bool) -> ArrayLikeTree:
    r"""``α g_s(θ) = α[-(Λθ - h) + (1/f_s)(Λ_s θ - h_s)]`` as a pytree shaped like ``position``.

    Parameters
    ----------
    position
        θ (any pytree; flattened with ``ravel_pytree``).
    shard
        Index ``s`` into the leading axis of ``arrays``.
    arrays
        From :func:`conducive_arrays` (which fixes ``f`` and ``α``).
    diagonal
        Static: whether the surrogates are diagonal.
    """
    return apply_conducive(position, arrays.matrix[shard], arrays.offset[shard], diagonal=diagonal)


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
    """
    probs = np.asarray(shard_probs, np.float64)
    prec = np.asarray(surrogates.precision, np.float64)
    if surrogates.diagonal:
        total = prec.sum(0)
        return np.max(prec / probs[:, None] - total, axis=1)
    total = prec.sum(0)
    return np.array([np.linalg.eigvalsh(p / f - total).max() for p, f in zip(prec, probs)])


def _prior_natural(prior, dim: int, diagonal: bool):
    if prior is None:
        return None
    try:
        mean0, prec0 = prior
    except (TypeError, ValueError):
        raise ValueError("prior must be a pair (mean, precision) of the Gaussian prior to divide out") from None
    mean0 = np.broadcast_to(np.asarray(mean0, np.float64), (dim,))
    prec0 = np.asarray(prec0, np.float64)
    if prec0.ndim == 0:
        prec0 = np.full(dim, float(prec0)) if diagonal else float(prec0) * np.eye(dim)
    elif prec0.ndim == 1:
        if prec0.shape != (dim,):
            raise ValueError(f"prior precision must have shape ({dim},) or ({dim}, {dim}); got {prec0.shape}")
        prec0 = prec0 if diagonal else np.diag(prec0)
    elif prec0.shape == (dim, dim):
        if diagonal:
            prec0 = np.diag(prec0)
    else:
        raise ValueError(f"prior precision must be a scalar, ({dim},) or ({dim}, {dim}); got {prec0.shape}")
    return mean0, prec0


def gaussian_surrogates(
    means: Any = None,
    precisions: Any = None,
    *,
    shards: Any = None,
    loglikelihood_fn: Callable | None = None,
    rng_key: PRNGKey | None = None,
    position: ArrayLikeTree | None = None,
    step_size: float | None = None,
    batch_size: int | None = None,
    num_samples: int = 1000,
    num_burnin: int = 1000,
    thinning: int = 1,
    covariance: str = "full",
    logprior_fn: Callable | None = None,
    prior: tuple | None = None,
) -> GaussianSurrogates:
    r"""Gaussian surrogates of the shard likelihoods: exact, or fitted to local SGLD draws.

    **Exact**: ``gaussian_surrogates(means, precisions)`` with ``means [S, d]``
    and ``precisions [S, d, d]`` (or ``[S, d]`` diagonal).

    **Fitted** (the paper's Sec. 5.2-5.3 and App. E): for every shard in
    parallel (``vmap`` over shards), run SGLD (``blackjax.sgld``'s kernel,
    gradient from ``blackjax.sgmcmc.gradients.grad_estimator`` with data size
    ``N_s``) targeting either the shard likelihood alone (``logprior_fn=None``)
    or ``p_0(θ) ∏_{x∈X_s} p(x|θ)``, keep ``num_samples`` draws after
    ``num_burnin``, and match moments: ``μ̂_s``, ``Σ̂_s`` (full or diagonal),
    ``Λ̂_s = Σ̂_s^{-1}``. When the fit targeted prior × likelihood, the Gaussian
    prior ``p_0 = N(μ_0, Λ_0^{-1})`` (``prior=(μ_0, Λ_0)``) is divided out:
    ``Λ_s = Λ̂_s - Λ_0``, ``h_s = Λ̂_s μ̂_s - Λ_0 μ_0``; negative eigenvalues of
    ``Λ_s`` (Monte Carlo noise) are set to 0 and counted in ``fit_info``.

    Parameters
    ----------
    means, precisions
        Exact surrogate parameters (then every fitting argument must be left out).
    shards
        The shards (see :func:`jaxsub.sgmcmc.make_shards`).
    loglikelihood_fn
        ``loglikelihood_fn(position, datum)`` (BlackJAX SG-MCMC convention).
    rng_key
        PRNG key for the fit.
    position
        Initial position of every shard's SGLD chain (pytree).
    step_size
        SGLD step size ``ε > 0`` in the paper's convention (drift ``ε/2``, noise
        variance ``ε``), as in :func:`jaxsub.dsgld`; a scalar or one per shard
        (shards of different sizes and curvatures need different steps). Keep
        the minibatch-noise inflation of the fitted variances small: it is about
        ``ε N_s² v / (4 n)`` relative, with ``v`` the per-datum gradient variance,
        so prefer a large ``batch_size`` for the fit (it runs once).
    batch_size
        Minibatch size (``1..min N_s``).
    num_samples, num_burnin, thinning
        Kept draws, discarded initial steps, and steps between kept draws.
    covariance
        ``'full'`` or ``'diag'``.
    logprior_fn
        If given, the fit targets prior × shard likelihood and ``prior`` must be given.
    prior
        ``(mean, precision)`` of the Gaussian prior to divide out; precision a
        scalar, vector (diagonal) or matrix.

    Returns
    -------
    GaussianSurrogates
        ``fit_info`` reports the cost (seconds, SGLD steps, likelihood-gradient evaluations).

    References
    ----------
    El Mekkaoui, Mesquita, Blomstedt & Kaski, "Federated stochastic gradient
    Langevin dynamics", UAI 2021, Sec. 4 and App. E.
    """
    fitting = (shards, loglikelihood_fn, rng_key, position, step_size, batch_size)
    if means is not None or precisions is not None:
        if means is None or precisions is None:
            raise ValueError("exact surrogates need both means and precisions")
        if any(a is not None for a in fitting) or logprior_fn is not None or prior is not None:
            raise ValueError("give either exact (means, precisions) or the fitting arguments, not both")
        return _from_exact(means, precisions)
    missing = [n for n, a in zip(("shards", "loglikelihood_fn", "rng_key", "position", "step_size", "batch_size"), fitting) if a is None]
    if missing:
        raise ValueError(f"fitting surrogates needs {', '.join(missing)} (or pass exact means and precisions)")
    covariance = check_choice("covariance", covariance, ("full", "diag"))
    diagonal = covariance == "diag"
    step_sizes = np.atleast_1d(np.asarray(step_size, dtype=np.float64))
    if step_sizes.ndim != 1:
        raise ValueError(f"step_size must be a scalar or one value per shard; got shape {step_sizes.shape}")
    for i, eps in enumerate(step_sizes):
        check_real("step_size" if step_sizes.size == 1 else f"step_size[{i}]", eps, low=0.0)
    num_samples = check_int("num_samples", num_samples, low=2)
    num_burnin = check_int("num_burnin", num_burnin, low=0)
    thinning = check_int("thinning", thinning, low=1)
    shards = make_shards(shards)
    batch_size = check_batch_size(batch_size, shards.sizes)
    if (logprior_fn is None) != (prior is None):
        raise ValueError("logprior_fn and prior go together: a fit that targets prior x likelihood "
                         "must say which Gaussian prior (mean, precision) to divide out")
    if step_sizes.size not in (1, shards.num_shards):
        raise ValueError(f"step_size must be a scalar or one value per shard ({shards.num_shards}); "
                         f"got {step_sizes.size} values")
    step_sizes = np.broadcast_to(step_sizes, (shards.num_shards,))
    flat0, unravel = ravel_pytree(position)
    dim = flat0.shape[0]
    prior_nat = _prior_natural(prior, dim, diagonal)
    dtype = flat0.dtype
    sgld_kernel = blackjax.sgmcmc.sgld.build_kernel()
    base_prior = logprior_fn if logprior_fn is not None else (lambda p: jnp.zeros((), dtype))
    sizes = jnp.asarray(shards.sizes, jnp.int32)
    num_steps = num_burnin + num_samples * thinning

    def fit_one(key, shard, eps):
        n_s = sizes[shard]
        grad_fn = gradients.grad_estimator(base_prior, loglikelihood_fn, n_s.astype(dtype))

        def step(pos, k):
            kb, kn = jax.random.split(k)
            batch = shard_gather(shards.data, shard, minibatch_indices(kb, batch_size, n_s))
            new = sgld_kernel(kn, pos, grad_fn, batch, 0.5 * eps)  # ε/2 in blackjax's convention
            return new, ravel_pytree(new)[0]

        _, draws = jax.lax.scan(step, position, jax.random.split(key, num_steps))
        kept = draws[num_burnin:][thinning - 1 :: thinning]
        mean = kept.mean(axis=0)
        centred = kept - mean
        if diagonal:
            cov = jnp.mean(centred**2, axis=0) * (num_samples / (num_samples - 1))
        else:
            cov = centred.T @ centred / (num_samples - 1)
        return mean, cov

    start = time.perf_counter()
    keys = jax.random.split(rng_key, shards.num_shards)
    mean, cov = jax.jit(jax.vmap(fit_one))(keys, jnp.arange(shards.num_shards), jnp.asarray(step_sizes, dtype))
    mean, cov = np.asarray(mean, np.float64), np.asarray(cov, np.float64)
    seconds = time.perf_counter() - start
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(cov))):
        raise FloatingPointError("surrogate fit produced NaN/inf draws; lower step_size")
    if diagonal:
        prec = 1.0 / cov
        shift = prec * mean
    else:
        prec = np.linalg.inv(cov)
        prec = 0.5 * (prec + np.swapaxes(prec, 1, 2))
        shift = np.einsum("sij,sj->si", prec, mean)
    clipped = np.zeros(shards.num_shards, dtype=np.int64)
    if prior_nat is not None:
        mean0, prec0 = prior_nat
        prec = prec - prec0
        shift = shift - (prec0 * mean0 if diagonal else prec0 @ mean0)
        if diagonal:
            clipped = np.sum(prec < 0, axis=1)
            prec = np.maximum(prec, 0.0)
        else:
            w, v = np.linalg.eigh(prec)
            clipped = np.sum(w < 0, axis=1)
            prec = np.einsum("sij,sj,skj->sik", v, np.maximum(w, 0.0), v)
    if diagonal:
        means_out = np.where(prec > 0, shift / np.where(prec > 0, prec, 1.0), 0.0)
    else:
        means_out = np.einsum("sij,sj->si", np.linalg.pinv(prec, hermitian=True), shift)
    info = SurrogateFitInfo(seconds, num_steps, shards.num_shards * num_steps * batch_size, clipped)
    return GaussianSurrogates(jnp.asarray(prec, dtype), jnp.asarray(shift, dtype), jnp.asarray(means_out, dtype), diagonal, info)
