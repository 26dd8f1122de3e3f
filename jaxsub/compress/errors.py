r"""Errors of compressed posteriors: the KL bound of Theorem 1, approxKL (Lemma 1), posterior-sd units.

References
----------
Q. Song. Approximate Inference via Clustering. arXiv:2111.14219 (2021), Theorem 1, Lemma 1, §4
(approxKL).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxsub.validation import check_real

__all__ = ["PosteriorError", "gaussian_kl", "kl_bound", "posterior_error"]


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

    Raises
    ------
    ValueError
        ``num_data <= 0``, ``radius``, ``L1`` or ``L2`` negative, ``gamma <= 0``, or a non-finite value.
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


class PosteriorError(NamedTuple):
    """Error of approximate posterior draws against reference draws, in reference-posterior sd units.

    Attributes
    ----------
    max_mean_sd
        ``max_k |mean_k - ref_mean_k| / ref_sd_k``: the *worst* coordinate's mean error (also
        readable as ``mean_sd``, its former name, which is the same maximum, not an average).
    sd_ratio_min, sd_ratio_max
        Smallest and largest ``sd_k / ref_sd_k``.
    mean_sd_per_dim, sd_ratio_per_dim
        The per-coordinate values (``[D]``, trailing axes flattened).
    """

    max_mean_sd: float
    sd_ratio_min: float
    sd_ratio_max: float
    mean_sd_per_dim: np.ndarray
    sd_ratio_per_dim: np.ndarray

    @property
    def mean_sd(self) -> float:
        """Alias of :attr:`max_mean_sd` (the maximum over coordinates)."""
        return self.max_mean_sd


def posterior_error(reference_draws, draws) -> PosteriorError:
    r"""Posterior error in posterior-sd units: :math:`|\bar\theta_k - \bar\theta^{\rm ref}_k| / s^{\rm ref}_k`.

    What a Bayesian reads off a table: how many reference-posterior standard
    deviations the approximate posterior mean is off, per coordinate, and the
    ratio of the marginal sds. ``reference_draws`` are e.g. exact NUTS draws.

    Parameters
    ----------
    reference_draws
        ``[num_samples, ...]`` (chains flattened into the first axis).
    draws
        ``[num_samples', ...]`` with the same trailing shape.

    Returns
    -------
    PosteriorError
        ``max_mean_sd`` (the worst coordinate), the sd ratios and the per-coordinate values.

    Raises
    ------
    ValueError
        Trailing shapes differ (the message names both shapes), fewer than 2 draws, non-finite
        draws, or a zero reference sd.

    Notes
    -----
    Monte Carlo error of the two means enters too; with effective sample sizes ``n1, n2`` it is
    about ``sqrt(1/n1 + 1/n2)`` sd units per coordinate.
    """
    ref_shape, shape = np.shape(reference_draws)[1:], np.shape(draws)[1:]
    if ref_shape != shape:
        raise ValueError(
            f"draws must have the trailing shape of reference_draws: draws has shape {np.shape(draws)}, "
            f"reference_draws {np.shape(reference_draws)}"
        )
    mr, vr = _moments(reference_draws, True)
    ma, va = _moments(draws, True)
    sr = np.sqrt(vr)
    if np.any(sr <= 0):
        raise ValueError("a reference marginal sd is zero")
    z = np.abs(ma - mr) / sr
    ratio = np.sqrt(va) / sr
    return PosteriorError(float(z.max()), float(ratio.min()), float(ratio.max()), z, ratio)
