r"""Gaussian surrogates of the shard likelihoods: exact, or fitted to local SGLD draws (El Mekkaoui et al. 2021, App. E)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
from blackjax.sgmcmc import gradients
from jax.flatten_util import ravel_pytree

from jaxsub.sgmcmc.shards import (
    check_batch_size,
    make_shards,
    minibatch_indices,
    shard_gather,
)
from jaxsub.sgmcmc.surrogate_types import (
    GaussianSurrogates,
    SurrogateFitInfo,
    from_exact,
    host,
)
from jaxsub.types import ArrayLikeTree, PRNGKey
from jaxsub.validation import check_choice, check_int, check_real

__all__ = ["gaussian_surrogates"]


def prior_natural(prior, dim: int, diagonal: bool):
    """``(mean [d], precision)`` of a Gaussian prior ``(mean, precision)``, precision as ``[d]`` or ``[d, d]``."""
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


def moments_to_natural(mean, cov, diagonal: bool, prior_nat):
    """Natural parameters from per-shard draw moments, with the Gaussian prior divided out.

    Parameters
    ----------
    mean, cov
        ``[S, d]`` and ``[S, d, d]`` (or ``[S, d]`` diagonal) moments of the draws (float64).
    diagonal
        Whether ``cov`` is diagonal.
    prior_nat
        ``None`` or ``(mean0, prec0)`` from :func:`prior_natural` (divided out, negative
        eigenvalues clipped to 0).

    Returns
    -------
    (precision, shift, means, clipped)
    """
    if diagonal:
        prec = 1.0 / cov
        shift = prec * mean
    else:
        prec = np.linalg.inv(cov)
        prec = 0.5 * (prec + np.swapaxes(prec, 1, 2))
        shift = np.einsum("sij,sj->si", prec, mean)
    clipped = np.zeros(mean.shape[0], dtype=np.int64)
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
    return prec, shift, means_out, clipped


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

    Raises
    ------
    ValueError
        On malformed exact parameters, exact and fitting arguments mixed, a missing fitting argument,
        or a setting outside its range. ``FloatingPointError`` if the SGLD draws are not finite.
    """
    fitting = (shards, loglikelihood_fn, rng_key, position, step_size, batch_size)
    if means is not None or precisions is not None:
        if means is None or precisions is None:
            raise ValueError("exact surrogates need both means and precisions")
        if any(a is not None for a in fitting) or logprior_fn is not None or prior is not None:
            raise ValueError("give either exact (means, precisions) or the fitting arguments, not both")
        return from_exact(means, precisions)
    missing = [
        n
        for n, a in zip(("shards", "loglikelihood_fn", "rng_key", "position", "step_size", "batch_size"), fitting)
        if a is None
    ]
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
        raise ValueError(
            "logprior_fn and prior go together: a fit that targets prior x likelihood "
            "must say which Gaussian prior (mean, precision) to divide out"
        )
    if step_sizes.size not in (1, shards.num_shards):
        raise ValueError(
            f"step_size must be a scalar or one value per shard ({shards.num_shards}); got {step_sizes.size} values"
        )
    step_sizes = np.broadcast_to(step_sizes, (shards.num_shards,))
    flat0, unravel = ravel_pytree(position)
    dim = flat0.shape[0]
    prior_nat = prior_natural(prior, dim, diagonal)
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
    mean, cov = jax.vmap(fit_one)(keys, jnp.arange(shards.num_shards), jnp.asarray(step_sizes, dtype))
    mean, cov = np.asarray(mean, np.float64), np.asarray(cov, np.float64)
    seconds = time.perf_counter() - start
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(cov))):
        raise FloatingPointError("surrogate fit produced NaN/inf draws; lower step_size")
    prec, shift, means_out, clipped = moments_to_natural(mean, cov, diagonal, prior_nat)
    info = SurrogateFitInfo(seconds, num_steps, shards.num_shards * num_steps * batch_size, clipped)
    return GaussianSurrogates(host(prec, dtype), host(shift, dtype), host(means_out, dtype), diagonal, info)
