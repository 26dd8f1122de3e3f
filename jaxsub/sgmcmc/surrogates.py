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

__all__ = ["GaussianSurrogates", "SurrogateFitInfo", "ConduciveArrays", "gaussian_surrogates", "laplace_surrogates", "conducive_arrays", "shard_arrays",
           "conducive_gradient", "apply_conducive", "check_surrogates", "curvature_excess", "laplace_program",
           "LaplaceArrays"]


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
    _check_finite_precision(precisions, "precisions")
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
    return GaussianSurrogates(_host(precisions, dtype), _host(shift, dtype), _host(means, dtype), diagonal, None)


def _host(x, dtype) -> np.ndarray:
    """Surrogates live on the host (NumPy), in the sampler's dtype: building a sampler inside ``jit`` stays legal."""
    return np.asarray(x, dtype=np.dtype(dtype))


def _check_finite_precision(precision, name: str) -> None:
    if isinstance(precision, jax.core.Tracer) or np.ndim(precision) == 0:
        return
    bad = ~np.isfinite(np.asarray(precision, np.float64)).reshape(np.shape(precision)[0], -1).all(axis=1)
    if bad.any():
        raise ValueError(
            f"{name} must be finite; the surrogate precision of shard(s) {np.flatnonzero(bad).tolist()} "
            "has NaN/inf entries (a diverged fit? refit with more damping or a smaller learning rate)"
        )


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
    _check_finite_precision(surrogates.precision, "surrogates.precision")
    if surrogates.factor is not None:
        _check_finite_precision(surrogates.factor, "surrogates.factor")
    if not isinstance(surrogates.shift, jax.core.Tracer) and not np.all(np.isfinite(np.asarray(surrogates.shift))):
        raise ValueError("surrogates.shift must be finite (NaN/inf in h_s = Λ_s μ_s)")
    return surrogates


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
    """
    probs = np.asarray(shard_probs, np.float64)
    if probs.shape != (surrogates.num_shards,):
        raise ValueError(f"shard_probs must have one entry per surrogate ({surrogates.num_shards}); got shape {probs.shape}")
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
    """Shard ``s``'s arrays scaled by ``α = exploration`` (gathered once per round; α may be traced)."""
    alpha = jnp.asarray(exploration, arrays.offset.dtype)
    factor = glob = None
    if arrays.factor is not None:
        root = jnp.sqrt(alpha)
        factor, glob = root * arrays.factor[shard], root * arrays.global_factor
    return ConduciveArrays(alpha * arrays.matrix[shard], alpha * arrays.offset[shard], factor, glob)


def apply_conducive(position: ArrayLikeTree, arrays: ConduciveArrays) -> ArrayLikeTree:
    """``M_s θ + c_s`` for one shard's arrays (from :func:`shard_arrays`), shaped like ``position``."""
    flat, unravel = ravel_pytree(position)
    dtype = flat.dtype
    matrix = arrays.matrix.astype(dtype)
    out = (matrix * flat if matrix.ndim == 1 else matrix @ flat) + arrays.offset.astype(dtype)
    if arrays.factor is not None:
        f, g = arrays.factor.astype(dtype), arrays.global_factor.astype(dtype)
        out = out + f @ (f.T @ flat) - g @ (g.T @ flat)
    return unravel(out)


def conducive_gradient(position: ArrayLikeTree, shard: Array, arrays: ConduciveArrays, exploration=1.0) -> ArrayLikeTree:
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
    """
    probs = np.asarray(shard_probs, np.float64)
    prec = np.asarray(surrogates.precision, np.float64)
    total = prec.sum(0)
    if surrogates.factor is not None:
        u = np.asarray(surrogates.factor, np.float64)
        dim = u.shape[1]
        if dim > 4096:
            return np.array([np.max(p / f - total) + np.linalg.eigvalsh(us.T @ us).max() / f
                             for p, us, f in zip(prec, u, probs)])
        big_u = np.concatenate(list(u), axis=1)
        total_full = np.diag(total) + big_u @ big_u.T
        return np.array([np.linalg.eigvalsh((np.diag(p) + us @ us.T) / f - total_full).max()
                         for p, us, f in zip(prec, u, probs)])
    if surrogates.diagonal:
        return np.max(prec / probs[:, None] - total, axis=1)
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
    mean, cov = jax.vmap(fit_one)(keys, jnp.arange(shards.num_shards), jnp.asarray(step_sizes, dtype))
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
    return GaussianSurrogates(_host(prec, dtype), _host(shift, dtype), _host(means_out, dtype), diagonal, info)


def _shard_loglik_sum(loglikelihood_fn: Callable, unravel: Callable, data_s, mask_s):
    """``θ_flat -> Σ_i mask_i log p(x_i | θ)`` over one padded shard (padding rows weigh 0)."""

    def total(flat):
        theta = unravel(flat)
        per = jax.vmap(lambda x: loglikelihood_fn(theta, x))(data_s)
        return jnp.sum(jnp.where(mask_s, per, 0.0))

    return total


def _hvp(fn: Callable, flat: Array) -> Callable:
    grad = jax.grad(fn)
    return lambda v: jax.jvp(grad, (flat,), (v,))[1]


def _chunked_masked_sum(fn: Callable, data_s, mask_s, chunk: int, dim: int, dtype) -> Array:
    """``Σ_i mask_i fn(x_i)`` (``fn(x) -> [dim]``) over one padded shard, ``chunk`` rows at a time in a ``lax.scan``.

    The per-datum vectors of a chunk are reduced as they are made: the ``[N_s, d]`` matrix of per-datum
    gradients (or ``[N_s, k, d]`` Gauss-Newton columns) is never materialised, which at ``d = 4·10⁴``
    made the curvature pass memory-bound. Rows are padded to a multiple of ``chunk`` with copies of the
    first row, masked out.
    """
    n = int(np.shape(mask_s)[0])
    chunk = max(1, min(chunk, n))
    pad = (-n) % chunk
    grow = lambda a: jnp.concatenate([a, jnp.repeat(a[:1], pad, axis=0)]) if pad else a  # noqa: E731
    data_c = jax.tree.map(lambda a: grow(a).reshape((-1, chunk) + a.shape[1:]), data_s)
    mask_c = grow(mask_s).reshape(-1, chunk)
    if pad:
        mask_c = mask_c.at[-1, chunk - pad:].set(False)

    def body(total, xs):
        rows, m = xs
        per = jax.vmap(fn)(rows)
        return total + jnp.sum(jnp.where(m[:, None], per, 0.0), axis=0), None

    return jax.lax.scan(body, jnp.zeros(dim, dtype), (data_c, mask_c))[0]


class LaplaceArrays(NamedTuple):
    """Raw output of a :func:`laplace_program` run (flattened positions, ``S`` shards).

    ``expansion_point [S, d]``, likelihood gradient ``gradient [S, d]`` there, ``curvature``
    (``[S, d, d]`` full; ``[S, d]`` diagonal), low-rank ``factor [S, d, r]`` (``r = 0`` unless
    ``'lowrank'``) and the damped objective's ``gradient_norm [S]``.
    """

    expansion_point: Array
    gradient: Array
    curvature: Array
    factor: Array
    gradient_norm: Array


def laplace_program(logprior_fn: Callable, loglikelihood_fn: Callable, position: ArrayLikeTree, *,
                    structure: str = "full", rank: int = 10, curvature: str = "hessian", optimizer: Any = None,
                    num_steps: int = 500, expansion: str = "fedsgd", fedavg_local_steps: int = 20,
                    num_power_iterations: int = 3, gauss_newton: tuple | None = None) -> Callable:
    """The compute of :func:`laplace_surrogates` as a pure function of the data: jit it once, reuse it.

    ``laplace_surrogates`` builds this function on every call, so every call compiles it again
    (2-5 CPU-s for small networks). Build it once, ``jax.jit`` it, and pass it to every
    ``laplace_surrogates(..., program=...)`` call with the *same* settings (structure, rank,
    curvature, optimizer, num_steps, expansion, fedavg_local_steps, num_power_iterations, gauss_newton)
    and data of the same shapes (e.g. several splits of one data set): one compile for all of them.
    Settings are as in :func:`laplace_surrogates` (validated there).

    Returns
    -------
    ``run(data, mask, sizes, damping_weights, flat_position, keys) -> LaplaceArrays`` with the padded
    ``Shards.data``, its ``mask`` and ``sizes``, ``damping_weights = damping · N_s / N``, the flattened
    starting point and per-shard keys (read by ``'lowrank'`` only).
    """
    import optax

    flat_start, unravel = ravel_pytree(position)
    dim = int(flat_start.shape[0])
    dtype = flat_start.dtype
    if optimizer is None:
        optimizer = optax.adam(1e-2)
    prior_flat = lambda flat: logprior_fn(unravel(flat))  # noqa: E731

    def shard_objective(data_s, mask_s, n_s, w_s):
        loglik = _shard_loglik_sum(loglikelihood_fn, unravel, data_s, mask_s)
        return lambda flat: -(loglik(flat) + w_s * prior_flat(flat)) / n_s

    def optimise(start_flat, data_s, mask_s, n_s, w_s, length):
        objective = shard_objective(data_s, mask_s, n_s, w_s)

        def step(carry, _):
            flat, opt_state = carry
            grad = jax.grad(objective)(flat)
            updates, opt_state = optimizer.update(grad, opt_state, flat)
            return (optax.apply_updates(flat, updates), opt_state), None

        (flat, _), _ = jax.lax.scan(step, (start_flat, optimizer.init(start_flat)), None, length=length)
        return flat

    def expansion_points(data, mask, sizes_j, weights, flat0):
        if expansion == "local":
            return jax.vmap(lambda *a: optimise(flat0, *a, num_steps))(data, mask, sizes_j, weights)
        fedavg_weights = sizes_j / jnp.sum(sizes_j)
        if expansion == "fedsgd":
            def fedsgd_round(carry, _):
                centre, opt_state = carry
                grads = jax.vmap(lambda *a: jax.grad(shard_objective(*a))(centre))(data, mask, sizes_j, weights)
                updates, opt_state = optimizer.update(fedavg_weights @ grads, opt_state, centre)
                return (optax.apply_updates(centre, updates), opt_state), None

            centre = jax.lax.scan(fedsgd_round, (flat0, optimizer.init(flat0)), None, length=num_steps)[0][0]
            return jnp.broadcast_to(centre, (sizes_j.shape[0], dim))
        num_rounds = -(-num_steps // fedavg_local_steps)

        def fedavg_round(centre, _):
            local = jax.vmap(lambda *a: optimise(centre, *a, fedavg_local_steps))(data, mask, sizes_j, weights)
            return fedavg_weights @ local, None

        centre = jax.lax.scan(fedavg_round, flat0, None, length=num_rounds)[0]
        return jnp.broadcast_to(centre, (sizes_j.shape[0], dim))

    if curvature == "gauss_newton":
        model_fn, output_loglik_fn = gauss_newton

        def gn_factor(flat, x):
            """Per datum: the model output z and a square root A of the output curvature, A Aᵀ = -∇²_z log p(x|z)."""
            z = model_fn(unravel(flat), x)
            zf, unravel_z = ravel_pytree(z)
            hz = -jax.hessian(lambda v: output_loglik_fn(unravel_z(v), x))(zf)
            w, v = jnp.linalg.eigh(0.5 * (hz + hz.T))
            return zf, unravel_z, v * jnp.sqrt(jnp.maximum(w, 0.0))[None, :]

        def gn_diag_one(flat, x):
            _, unravel_z, a = gn_factor(flat, x)
            _, vjp = jax.vjp(lambda f: ravel_pytree(model_fn(unravel(f), x))[0], flat)
            cols = jax.vmap(lambda c: vjp(c)[0], in_axes=1)(a)  # [k, d]: Jᵀ A
            return jnp.sum(cols**2, axis=0)

        def gn_vp(flat, data_s, mask_s):
            """v -> Σ_x mask_x J_xᵀ (-∇²_z log p) J_x v (the Gauss-Newton matrix times v)."""

            def one(x, m, v):
                _, _, a = gn_factor(flat, x)
                fn = lambda f: ravel_pytree(model_fn(unravel(f), x))[0]  # noqa: E731
                jv = jax.jvp(fn, (flat,), (v,))[1]
                return m * jax.vjp(fn, flat)[1](a @ (a.T @ jv))[0]

            return lambda v: jnp.sum(jax.vmap(one, in_axes=(0, 0, None))(data_s, mask_s.astype(dtype), v), axis=0)

    def diag_curvature(loglik, flat, data_s, mask_s):
        if curvature == "gauss_newton":
            return _chunked_masked_sum(lambda x: gn_diag_one(flat, x), data_s, mask_s, 16, dim, dtype)
        if curvature == "fisher":
            per_sq = lambda x: jax.grad(lambda f: loglikelihood_fn(unravel(f), x))(flat) ** 2  # noqa: E731
            return _chunked_masked_sum(per_sq, data_s, mask_s, 128, dim, dtype)
        hv = _hvp(loglik, flat)
        return -jax.lax.map(lambda e: jnp.vdot(e, hv(e)), jnp.eye(dim, dtype=dtype), batch_size=min(dim, 256))

    def curvature_one(args):
        data_s, mask_s, flat, key, n_s, w_s = args
        loglik = _shard_loglik_sum(loglikelihood_fn, unravel, data_s, mask_s)
        grad = jax.grad(loglik)(flat)
        # convergence of step 1: the damped objective's gradient norm (computed here, inside one
        # compiled lax.map, rather than eagerly under vmap: one compile instead of dozens)
        grad_norm = jnp.linalg.norm((grad + w_s * jax.grad(prior_flat)(flat)) / n_s)
        if structure == "full":
            if curvature == "gauss_newton":
                gv = gn_vp(flat, data_s, mask_s)
                return grad, jax.lax.map(gv, jnp.eye(dim, dtype=dtype)), jnp.zeros((dim, 0), dtype), grad_norm
            return grad, -jax.hessian(loglik)(flat), jnp.zeros((dim, 0), dtype), grad_norm
        diag = diag_curvature(loglik, flat, data_s, mask_s)
        if structure == "diag":
            return grad, diag, jnp.zeros((dim, 0), dtype), grad_norm
        if curvature == "gauss_newton":
            neg_hv = jax.vmap(gn_vp(flat, data_s, mask_s), in_axes=1, out_axes=1)
        else:
            neg_hv = jax.vmap(lambda v: -_hvp(loglik, flat)(v), in_axes=1, out_axes=1)
        q, _ = jnp.linalg.qr(jax.random.normal(key, (dim, rank + 5), dtype))
        for _ in range(num_power_iterations):
            q, _ = jnp.linalg.qr(neg_hv(q))
        small = q.T @ neg_hv(q)
        evals, evecs = jnp.linalg.eigh(0.5 * (small + small.T))
        evals, evecs = evals[::-1][:rank], (q @ evecs[:, ::-1])[:, :rank]
        return grad, diag, evecs * jnp.sqrt(jnp.maximum(evals, 0.0))[None, :], grad_norm

    def run(data, mask, sizes, damping_weights, flat0, keys):
        sizes_j = jnp.asarray(sizes, dtype)
        with jax.numpy_dtype_promotion("standard"):  # optax mixes its int32 step count with floats
            modes = expansion_points(data, mask, sizes_j, damping_weights, flat0)
        # sequential over shards (lax.map): per-datum gradients / Hessians of all shards at once may not fit in memory
        grads, curv, factors, grad_norms = jax.lax.map(curvature_one, (data, mask, modes, keys, sizes_j,
                                                                       damping_weights))
        return LaplaceArrays(modes, grads, curv, factors, grad_norms)

    return run


def laplace_surrogates(
    logprior_fn: Callable,
    loglikelihood_fn: Callable,
    shards: Any,
    position: ArrayLikeTree,
    *,
    structure: str = "full",
    rank: int = 10,
    curvature: str = "hessian",
    damping: float = 1.0,
    optimizer: Any = None,
    num_steps: int = 500,
    rng_key: PRNGKey | None = None,
    num_power_iterations: int = 3,
    expansion: str = "fedsgd",
    fedavg_local_steps: int = 20,
    program: Callable | None = None,
    gauss_newton: tuple | None = None,
) -> GaussianSurrogates:
    r"""Laplace (second-order Taylor) surrogates of the shard likelihoods, fitted with optax.

    For every shard, in parallel (``vmap`` over shards):

    1. **Expansion point** ``θ̂_s``, from full-shard steps of an optax optimiser (default
       ``optax.adam(1e-2)``) on the *damped* shard objective
       ``F_s(θ) = -(1/N_s)[Σ_{x∈X_s} \log p(x|θ) + δ_s \log p_0(θ)]`` with ``δ_s = damping · N_s / N``
       (the shard's share of the prior, a "fractional prior"), started at ``position``:

       * ``expansion='fedavg'``: one **common** point ``θ̂_s = θ̄`` for every shard,
         found federatedly by FedAvg (McMahan et al. 2017): ``⌈num_steps / fedavg_local_steps⌉``
         rounds, each running ``fedavg_local_steps`` optimiser steps on every ``F_s`` from the current
         ``θ̄`` (fresh optimiser state) and setting ``θ̄ ← Σ_s (N_s/N) θ_s``. Only parameters cross
         shards. With one local step of plain gradient descent a round is a gradient step on the
         *global* objective ``-(1/N) \log[p_0^{damping} ∏_s p_s]`` (since ``Σ_s (N_s/N) ∇F_s`` is its
         gradient), so ``θ̄`` approaches the global (damped) mode; with more local steps it drifts
         towards a mixture of shard optima ("client drift") but stays a *shared* point.
       * ``expansion='fedsgd'`` (the default): one common point from FedSGD with a server
         optimiser: ``num_steps`` rounds, each computing every shard's full-shard gradient
         ``∇F_s(θ̄)`` at the current ``θ̄``, averaging them with weights ``N_s/N`` (the gradient of the global damped objective, so no
         client drift) and taking one ``optimizer`` step on ``θ̄``. It is the centralised full-batch
         optimiser, run federatedly (a gradient and the parameters cross shards per round); it reaches
         the global damped mode where FedAvg stops at a client-drifted point. Measured on label-skewed
         MNIST clients (``experiments/cgdsgld_mnist``): FedAvg centre 70-76% test accuracy, CG-DSGLD from
         it below DSGLD; FedSGD centre 92%, CG-DSGLD within 0.4 point of pooled SGLD, DSGLD 2-3 points
         below. More rounds than FedAvg (communication), no more gradient evaluations.
       * ``expansion='local'``: ``num_steps`` steps on each ``F_s`` separately (each shard's own
         fractional-prior mode).

       Why ``'fedsgd'`` is the default (measured, docs/sgmcmc.md, session 7): the conducive term's
       zero mean holds for any surrogates, but how much drift it removes depends on the
       surrogates agreeing with the shard likelihoods *where the chain runs*. Expanded at their own
       modes, the likelihoods of label-skewed shards are far from quadratic between those points
       and the global posterior; one common point near the global mode fixes that. With the same
       per-shard gradient budget, logistic regression on Beta(0.1, 0.1) label-skewed shards gives a
       posterior mean 0.65 Laplace sd from the MAP with FedSGD-centred surrogates (the same as
       surrogates expanded at the MAP itself), 1.70 FedAvg-centred, 23.0 with local expansions and
       37.1 for DSGLD; on label-skewed MNIST clients CG-DSGLD from the FedAvg centre falls below
       DSGLD and from the FedSGD centre is within 0.4 point of pooled SGLD; on the Fertility BNN the
       two centres tie. At a common point ``θ̄`` the conducive term at ``θ̄`` is exactly the gradient
       control variate ``Σ_k ∇ℓ_k(θ̄) - ∇ℓ_s(θ̄)/f_s``.
    2. **Curvature** ``Λ_s ≈ -∇²_θ Σ_{x∈X_s}\log p(x|θ)`` at ``θ̂_s`` (the likelihood only,
       prior not included), in one of three structures (``structure``):
       ``'full'`` (``jax.hessian``, ``O(d²)`` memory: small models); ``'diag'`` (the exact
       Hessian diagonal from ``d`` Hessian-vector products, ``curvature='hessian'``, or the
       empirical Fisher diagonal ``Σ_x (∇\log p(x|θ̂))²``, ``curvature='fisher'``, one
       per-datum gradient pass: networks); ``'lowrank'``: ``Λ_s = D_s + U_s U_sᵀ`` with
       ``U_s`` the top-``rank`` eigenpairs of the Hessian (randomised subspace iteration,
       ``rank + 5`` Hessian-vector products per iteration) and ``D_s`` the rest of the diagonal
       (``curvature`` as for ``'diag'``), clipped at 0. Negative Hessian eigenvalues
       (non-convex likelihoods) are clipped to 0 and counted in ``fit_info``.
       ``curvature='gauss_newton'`` (any structure) uses the generalised Gauss-Newton matrix
       ``Σ_x J_xᵀ (-∇²_z \log p(x|z)) J_x`` of the split ``\log p(x|θ) = ℓ(z, x)``, ``z = model_fn(θ, x)``
       (``gauss_newton=(model_fn, output_loglikelihood_fn)``, ``J_x = ∂z/∂θ``): positive semi-definite
       by construction (no clipping for non-convex networks) and, unlike the empirical Fisher, it does
       not vanish where a shard's data are fitted. The diagonal costs ``k`` vector-Jacobian products
       per datum (``k`` = output size), the low-rank part GGN-vector products.
    3. **Natural parameters** of the Taylor expansion ``\log p_s(θ) ≈ c + g_sᵀ(θ-θ̂_s)
       - ½(θ-θ̂_s)ᵀΛ_s(θ-θ̂_s)``: ``h_s = Λ_s θ̂_s + g_s`` with ``g_s`` the likelihood gradient
       at ``θ̂_s``. For a Gaussian likelihood this is exact at *any* ``θ̂_s``.

    **Damping rule (near-separable shards).** A shard whose likelihood has no maximum (a
    logistic shard with one label, or linearly separable) sends an undamped optimiser to
    infinity and its Hessian to 0 there. The fractional prior makes the objective proper
    whenever ``p_0`` is (``θ̂_s`` is then the mode of ``p_0^{N_s/N} p_s``, which stays in the
    region the global posterior occupies), and the gradient term ``g_s`` keeps ``q_s``'s
    natural parameters consistent with the true likelihood at that point. ``damping = 0``
    gives the plain Laplace approximation at the shard likelihood's mode (only for shards
    whose likelihood has one). The damping does not enter ``q_s``: the conducive term stays
    unbiased for any surrogate.

    Parameters
    ----------
    logprior_fn
        ``logprior_fn(position)``: the prior used for the damping.
    loglikelihood_fn
        ``loglikelihood_fn(position, datum)`` (BlackJAX SG-MCMC convention).
    shards
        As in :func:`jaxsub.sgmcmc.make_shards`.
    position
        Starting point of every shard's optimisation (pytree; fixes the flattening order).
    structure, rank, curvature
        ``'full'`` | ``'diag'`` | ``'lowrank'``; the rank of ``'lowrank'``; ``'hessian'`` | ``'fisher'`` |
        ``'gauss_newton'``.
    gauss_newton
        ``(model_fn, output_loglikelihood_fn)`` with ``loglikelihood_fn(θ, x) =
        output_loglikelihood_fn(model_fn(θ, x), x)``; required by (only by) ``curvature='gauss_newton'``.
    damping
        ``>= 0``, the multiple of the fractional prior ``N_s/N`` in the objective.
    optimizer
        An ``optax.GradientTransformation`` (default ``optax.adam(1e-2)``).
    num_steps
        Optimiser steps (full-shard gradients).
    rng_key
        Needed for ``'lowrank'`` (random start of the subspace iteration).
    num_power_iterations
        Subspace iterations for ``'lowrank'``.
    expansion
        ``'fedsgd'`` (one common point from FedSGD with ``optimizer`` on the server: the global damped
        mode; default), ``'fedavg'`` (one common expansion point from FedAvg) or ``'local'`` (each
        shard's own damped mode).
    fedavg_local_steps
        ``>= 1``, optimiser steps per shard per FedAvg round (``expansion='fedavg'``).
    program
        Optional: ``jax.jit(laplace_program(...))`` built with the same settings, to reuse one
        compiled program across calls with data of the same shapes (see :func:`laplace_program`);
        default: built here (compiled again on every call).

    Returns
    -------
    GaussianSurrogates
        ``fit_info.method == 'laplace'``; ``fit_info.gradient_norm`` reports convergence;
        ``fit_info.expansion_point`` the points used.

    References
    ----------
    El Mekkaoui et al., UAI 2021, Sec. 4.1 (Gaussian surrogates; Laplace as one choice).
    McMahan, Moore, Ramage, Hampson & Agüera y Arcas, "Communication-efficient learning of deep
    networks from decentralized data", AISTATS 2017 (FedAvg).
    """
    import optax

    structure = check_choice("structure", structure, ("full", "diag", "lowrank"))
    curvature = check_choice("curvature", curvature, ("hessian", "fisher", "gauss_newton"))
    if (curvature == "gauss_newton") != (gauss_newton is not None):
        raise ValueError("curvature='gauss_newton' needs gauss_newton=(model_fn, output_loglikelihood_fn), "
                         "and gauss_newton is used only with curvature='gauss_newton'")
    if gauss_newton is not None and (len(tuple(gauss_newton)) != 2 or not all(map(callable, gauss_newton))):
        raise ValueError("gauss_newton must be a pair (model_fn, output_loglikelihood_fn) of callables")
    damping = check_real("damping", damping, low=0.0, low_closed=True)
    num_steps = check_int("num_steps", num_steps, low=0)
    expansion = check_choice("expansion", expansion, ("fedavg", "fedsgd", "local"))
    fedavg_local_steps = check_int("fedavg_local_steps", fedavg_local_steps, low=1)
    shards = make_shards(shards)
    from jaxsub.sgmcmc.shards import check_finite_shards

    check_finite_shards(shards)
    flat0, unravel = ravel_pytree(position)
    dim = int(flat0.shape[0])
    dtype = flat0.dtype
    if structure == "lowrank":
        rank = check_int("rank", rank, low=1, high=dim)
        num_power_iterations = check_int("num_power_iterations", num_power_iterations, low=0)
        if rng_key is None:
            raise ValueError("rng_key is required for structure='lowrank' (random subspace iteration)")
    if optimizer is None:
        optimizer = optax.adam(1e-2)
    data = jax.tree.map(jnp.asarray, shards.data)
    sizes = np.asarray(shards.sizes, np.float64)
    mask = jnp.asarray(shards.mask)
    total_n = float(sizes.sum())
    weights = jnp.asarray(damping * sizes / total_n, dtype)
    program = program if program is not None else laplace_program(
        logprior_fn, loglikelihood_fn, position, structure=structure, rank=rank, curvature=curvature,
        optimizer=optimizer, num_steps=num_steps, expansion=expansion, fedavg_local_steps=fedavg_local_steps,
        num_power_iterations=num_power_iterations, gauss_newton=gauss_newton)
    # keys are read only by structure='lowrank', which requires rng_key (checked above); the other
    # structures get the shard index as a placeholder so that no key is made inside the library
    keys = jax.random.split(rng_key, shards.num_shards) if rng_key is not None else jnp.arange(shards.num_shards)
    start = time.perf_counter()
    modes, grads, curv, factors, grad_norms = program(data, mask, jnp.asarray(sizes, dtype), weights, flat0, keys)
    expected = (shards.num_shards, dim, dim) if structure == "full" else (shards.num_shards, dim)
    if tuple(np.shape(curv)) != expected or (structure == "lowrank") != (np.shape(factors)[-1] > 0):
        raise ValueError(f"program was built for another structure or dimension than structure={structure!r}, "
                         f"d={dim} (curvature of shape {np.shape(curv)}): build it with laplace_program and the "
                         "same settings")
    modes, grads, curv, factors = (np.asarray(x, np.float64) for x in (modes, grads, curv, factors))
    seconds = time.perf_counter() - start
    clipped = np.zeros(shards.num_shards, np.int64)
    factor_out = None
    if structure == "full":
        curv = 0.5 * (curv + np.swapaxes(curv, 1, 2))
        w, v = np.linalg.eigh(curv)
        clipped = np.sum(w < 0, axis=1)
        prec = np.einsum("sij,sj,skj->sik", v, np.maximum(w, 0.0), v)
        shift = np.einsum("sij,sj->si", prec, modes) + grads
        means = np.einsum("sij,sj->si", np.linalg.pinv(prec, hermitian=True), shift)
    else:
        if structure == "lowrank":
            factor_out = factors
            curv = curv - np.sum(factors**2, axis=2)
        clipped = np.sum(curv < 0, axis=1)
        prec = np.maximum(curv, 0.0)
        lin = prec * modes + (np.einsum("sij,sj->si", factors, np.einsum("sij,si->sj", factors, modes))
                              if factor_out is not None else 0.0)
        shift = lin + grads
        if factor_out is None:
            means = np.where(prec > 0, shift / np.where(prec > 0, prec, 1.0), modes)
        else:
            means = modes  # the expansion point (a dense solve would cost O(d^3))
    _check_finite_precision(prec, "the fitted precisions")
    if factor_out is not None:
        _check_finite_precision(factor_out, "the fitted low-rank factors")
    if not np.all(np.isfinite(shift)):
        raise ValueError("the Laplace fit produced a non-finite h_s (diverged optimiser: lower the learning rate)")
    evaluations = int(shards.num_shards * num_steps * int(np.max(sizes)))
    if expansion == "fedavg":
        evaluations = int(shards.num_shards * fedavg_local_steps * (-(-num_steps // fedavg_local_steps))
                          * int(np.max(sizes)))
    info = SurrogateFitInfo(seconds, 0, evaluations, clipped, "laplace", np.asarray(grad_norms), modes)
    return GaussianSurrogates(_host(prec, dtype), _host(shift, dtype), _host(means, dtype),
                              structure != "full", info, None if factor_out is None else _host(factor_out, dtype))
