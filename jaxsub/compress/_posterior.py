r"""Compressed log-densities, the KL bound of Theorem 1 and the approxKL of Lemma 1.

The compressed posterior (Song 2021, eq. 2) replaces the data of cluster
:math:`S_j` by its centroid :math:`\mu_j` with multiplicity :math:`n_j`:

.. math::
    \tilde p(\theta \mid X) \propto p(\theta) \prod_{j=1}^{c} p(\mu_j \mid \theta)^{n_j},

so every evaluation of the log-density or its gradient costs O(c) instead of
O(N). :func:`logdensity` returns this log-density as a plain
``logdensity_fn(position)``, a drop-in for ``blackjax.hmc``, ``blackjax.nuts``
or any other BlackJAX algorithm.

References
----------
Q. Song. Approximate Inference via Clustering. arXiv:2111.14219 (2021), eq. (2),
Theorem 1, Lemma 1, §4 (approxKL).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.compress._cluster import Clustering
from jaxsub.types import LogDensityFn, LogLikelihoodFn, LogPriorFn
from jaxsub.validation import check_real

__all__ = ["Pseudodata", "logdensity", "kl_bound", "gaussian_kl"]


class Pseudodata(NamedTuple):
    """Weighted pseudo-data: ``data`` (a pytree of arrays with a leading axis ``c``) and ``weights [c]``."""

    data: Any
    weights: Any


def _as_pseudodata(obj) -> Pseudodata:
    if isinstance(obj, Clustering):
        return Pseudodata(obj.pseudodata(), obj.counts)
    if isinstance(obj, Pseudodata):
        return obj
    # plain data: every datum with weight 1, i.e. the exact log-density
    leaves = jax.tree.leaves(obj)
    if not leaves:
        raise ValueError("clustering_or_pseudodata must be a Clustering, a Pseudodata or a non-empty pytree of arrays")
    return Pseudodata(obj, np.ones(np.shape(leaves[0])[0]))


def logdensity(
    logprior_fn: LogPriorFn,
    loglikelihood_fn: LogLikelihoodFn,
    clustering_or_pseudodata,
) -> LogDensityFn:
    r"""The compressed log-posterior :math:`\log p(\theta) + \sum_j n_j \log p(\mu_j \mid \theta)`.

    Parameters
    ----------
    logprior_fn
        ``logprior_fn(position) -> scalar``.
    loglikelihood_fn
        ``loglikelihood_fn(position, datum) -> scalar`` for ONE datum (the
        BlackJAX SG-MCMC convention); for supervised data the datum is
        ``(x, y)``.
    clustering_or_pseudodata
        * a :class:`~jaxsub.compress.Clustering`: data = its centroids (and
          targets), weights = its counts;
        * a :class:`Pseudodata` ``(data, weights)``;
        * any pytree of data arrays with a leading axis: every datum with
          weight 1, i.e. the *exact* log-posterior (the baseline, same code path).

        May be JAX tracers (build the log-density inside a jitted function that
        takes the pseudo-data as arguments, so they are not compiled in as
        constants); then only shapes are validated.

    Returns
    -------
    logdensity_fn
        ``logdensity_fn(position) -> scalar``; pure, jit/vmap/grad-able, usable
        as ``blackjax.hmc(logdensity_fn, ...)``. The likelihood is vmapped over
        the ``c`` pseudo-data (cost O(c) per call) and weighted by the counts
        (cast to the likelihood's dtype).

    Raises
    ------
    ValueError
        Weights not 1-D, of a length different from the data's leading axis,
        negative or non-finite; data leaves with different leading axes; NaN data.
    """
    pseudo = _as_pseudodata(clustering_or_pseudodata)
    traced = any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(pseudo))
    if traced:
        # built inside a jitted function with the pseudo-data as arguments (so the
        # data are not baked into the compiled program as constants): only the
        # static shapes can be checked here
        weights = pseudo.weights
        if jnp.ndim(weights) != 1:
            raise ValueError(f"weights must be 1-D [c]; got shape {jnp.shape(weights)}")
    else:
        weights = np.asarray(pseudo.weights)
        if weights.ndim != 1:
            raise ValueError(f"weights must be 1-D [c]; got shape {weights.shape}")
        if not np.all(np.isfinite(weights)) or np.any(weights < 0):
            raise ValueError("weights must be finite and non-negative")
    for leaf in jax.tree.leaves(pseudo.data):
        shape = jnp.shape(leaf)
        if len(shape) == 0 or shape[0] != weights.shape[0]:
            raise ValueError(
                f"every data leaf must have leading axis c = {weights.shape[0]} (the number of weights); got shape {shape}"
            )
        if not traced:
            arr = np.asarray(leaf)
            if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
                raise ValueError("pseudo-data must be finite; found NaN/inf")
    data = jax.tree.map(jnp.asarray, pseudo.data)
    weights = jnp.asarray(weights)

    def logdensity_fn(position):
        loglik = jax.vmap(loglikelihood_fn, in_axes=(None, 0))(position, data)
        return logprior_fn(position) + jnp.sum(weights.astype(loglik.dtype) * loglik)

    return logdensity_fn


def kl_bound(num_data: int, radius: float, L1: float, L2: float, gamma: float) -> float:
    r"""Theorem 1: :math:`\mathrm{KL}(p \,\|\, \tilde p) \le K_0 \delta^2`, :math:`K_0 = 2 L_1 L_2 N + N / \gamma`.

    Parameters
    ----------
    num_data
        :math:`N`.
    radius
        The global radius :math:`\delta = \max_j \max_{i\in S_j}\|x_i-\mu_j\|` (``Clustering.radius``).
    L1
        Lipschitz constant of :math:`x \mapsto \log p(x\mid\theta)` (Assumption 2).
    L2
        Lipschitz constant of :math:`x \mapsto \nabla \log p(x\mid\theta)`
        (Assumption 2; the gradient in the datum, as used in the proof, eq. 8).
    gamma
        Smoothness: :math:`x \mapsto \log p(x \mid \theta)` is :math:`1/\gamma`-smooth (Assumption 1).

    Returns
    -------
    float
        :math:`(2 L_1 L_2 N + N/\gamma)\,\delta^2`.
    """
    n = check_real("num_data", num_data, low=0.0)
    delta = check_real("radius", radius, low=0.0, low_closed=True)
    l1 = check_real("L1", L1, low=0.0, low_closed=True)
    l2 = check_real("L2", L2, low=0.0, low_closed=True)
    g = check_real("gamma", gamma, low=0.0)
    return (2.0 * l1 * l2 * n + n / g) * delta**2


def _moments(samples, diagonal: bool):
    arr = np.asarray(samples, dtype=np.float64)
    if arr.ndim < 2:
        raise ValueError(f"samples must be shaped [num_samples, ...]; got shape {arr.shape}")
    arr = arr.reshape(arr.shape[0], -1)
    if arr.shape[0] < 2:
        raise ValueError("need at least 2 samples to estimate a covariance")
    if not np.all(np.isfinite(arr)):
        raise ValueError("samples must be finite")
    mean = arr.mean(axis=0)
    centred = arr - mean
    if diagonal:
        return mean, (centred**2).sum(axis=0) / (arr.shape[0] - 1)
    return mean, centred.T @ centred / (arr.shape[0] - 1)


def gaussian_kl(samples_p, samples_q, *, diagonal: bool = False, jitter: float = 0.0) -> float:
    r"""approxKL: :math:`\mathrm{KL}(\mathcal N(m_p, \Sigma_p) \,\|\, \mathcal N(m_q, \Sigma_q))` of moment-matched Gaussians.

    The paper's approxKL (§4, following Xu et al. 2014): fit a Gaussian with
    the sample mean and covariance to each set of draws, then Lemma 1:

    .. math::
        \mathrm{KL} = \tfrac12\big[\ln|\Sigma_q| - \ln|\Sigma_p| - D
        + \mathrm{tr}(\Sigma_q^{-1}\Sigma_p) + (m_p - m_q)^\top \Sigma_q^{-1} (m_p - m_q)\big].

    Parameters
    ----------
    samples_p, samples_q
        Draws ``[num_samples, ...]`` (trailing axes flattened to ``D``), e.g.
        exact-posterior HMC draws and compressed-posterior draws.
    diagonal
        Fit diagonal Gaussians (needed when ``num_samples <= D``, where the
        sample covariance is singular; e.g. MNIST's 7,850 weights).
    jitter
        Added to the diagonal of both covariances (0 by default).

    Returns
    -------
    float
        The KL divergence in nats (float64).

    Raises
    ------
    ValueError
        Different dimensions, fewer than 2 samples, non-finite draws, or a
        singular covariance (use ``diagonal=True`` or ``jitter``).
    """
    jitter = check_real("jitter", jitter, low=0.0, low_closed=True)
    mp, sp = _moments(samples_p, diagonal)
    mq, sq = _moments(samples_q, diagonal)
    if mp.shape != mq.shape:
        raise ValueError(f"samples_p and samples_q must have the same dimension; got {mp.shape[0]} and {mq.shape[0]}")
    dim = mp.shape[0]
    diff = mp - mq
    if diagonal:
        vp, vq = sp + jitter, sq + jitter
        if np.any(vp <= 0) or np.any(vq <= 0):
            raise ValueError("a marginal variance is zero; add jitter")
        return float(0.5 * np.sum(np.log(vq) - np.log(vp) - 1.0 + vp / vq + diff**2 / vq))
    sp = sp + jitter * np.eye(dim)
    sq = sq + jitter * np.eye(dim)
    sign_p, logdet_p = np.linalg.slogdet(sp)
    sign_q, logdet_q = np.linalg.slogdet(sq)
    singular_msg = "a sample covariance is singular (num_samples <= dimension?); use diagonal=True or jitter > 0"
    if sign_p <= 0 or sign_q <= 0:
        raise ValueError(singular_msg)
    try:
        chol = np.linalg.cholesky(sq)
        np.linalg.cholesky(sp)
    except np.linalg.LinAlgError:
        # rank-deficient up to round-off: slogdet's sign can still come out positive
        raise ValueError(singular_msg) from None
    sol = np.linalg.solve(chol, np.column_stack([sp, diff]))
    # tr(Sq^-1 Sp) = ||L^-1 Sp L^-T||_F... computed as tr(L^-T L^-1 Sp) via solves
    a = np.linalg.solve(chol.T, sol[:, :dim])
    trace = float(np.trace(a))
    maha = float(np.sum(np.linalg.solve(chol, diff) ** 2))
    return 0.5 * (logdet_q - logdet_p - dim + trace + maha)
