"""Mixture of ARCH(q) models with Student-t innovations, Carlin & Chib (1995) augmentation.

Model (Chen & Ghahramani 2016, §5.2):
``r_t = σ_t z_t``, ``z_t ~ t_ν`` (standard Student-t, ν degrees of freedom),
``σ_t² = α_0 + Σ_{i=1}^q α_i r_{t-i}²``, ``q ~ π`` over ``Q = {5, 10, ..., 30}``,
``α_i, ν ~ Gamma(1, 1)`` (= Exp(1)).

Every model conditions on the first ``max(Q) = 30`` returns, so all models share
the same ``N = T - 30`` likelihood factors (datum ``t`` = ``(r_t, r_{t-1}², ...,
r_{t-30}²)``).

Parametrisation. Model ``k`` has ``θ_k = (log α_0, log α_1..q_k, log ν)`` (the prior
on ``φ = log α`` is ``φ - e^φ``, Jacobian included). To give every model the same
static shape, ``θ`` is padded to ``P = 32`` entries: entries that model ``k`` does
not use are auxiliary ``N(0, 1)`` variables (they cancel in every ratio). Each
model is whitened by its pseudo-prior: ``θ_k = μ_k + L_k w_k`` with ``N(μ_k, L_k
L_k^T)`` the Laplace approximation of model ``k``'s posterior, so the
pseudo-prior of ``w_k`` is ``N(0, I)`` and samplers move ``w``.

Carlin & Chib joint: ``p(k, w, r) ∝ π̃_k p(r | θ_k, k) p(θ_k | k) ∏_{j≠k} ψ_j(θ_j)``
with pseudo-priors ``ψ_j``; π̃ are adjusted model priors. Gibbs sweep:

1. ``k | w``: ``p(k) ∝ exp(log π̃_k + log p(θ_k|k) - log ψ_k(θ_k)) ∏_t p(r_t|θ_k, k)``,
   a D = 6 discrete conditional with N factors (racing Gibbs);
2. ``w_k | k``: SGLD proposal + racing MH on model k's posterior;
3. ``w_j | k`` for ``j ≠ k``: exact draws from the pseudo-priors, ``N(0, I)``.

The posterior of q is recovered as ``p(q|r) ∝ π_q/π̃_q × p̃(q|r)``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.scipy.special import gammaln

from jaxsub.datasets import load_sp500_returns

ORDERS = (5, 10, 15, 20, 25, 30)
MAX_LAG = max(ORDERS)
#: Padded parameter size: log α_0, log α_1..30, log ν.
P = MAX_LAG + 2


class ArchData(NamedTuple):
    returns: jnp.ndarray  # [N]
    lagged_sq: jnp.ndarray  # [N, 30]: r_{t-1}^2 .. r_{t-30}^2
    description: str

    @property
    def num_data(self) -> int:
        return int(self.returns.shape[0])

    @property
    def data(self):
        return (self.returns, self.lagged_sq)


def load_arch_data(num_returns: int | None = None) -> ArchData:
    """S&P 500 daily log-returns (percent) with their 30 lagged squares; the last ``num_returns`` if given."""
    ds = load_sp500_returns()
    r = ds.x[:, 0]
    if num_returns is not None:
        r = r[-(num_returns + MAX_LAG) :]
    n = len(r) - MAX_LAG
    lagged = np.stack([r[MAX_LAG - i : MAX_LAG - i + n] ** 2 for i in range(1, MAX_LAG + 1)], axis=1)
    return ArchData(
        returns=jnp.asarray(r[MAX_LAG:], jnp.float32),
        lagged_sq=jnp.asarray(lagged, jnp.float32),
        description=ds.description + f" Modelled: the {n:,} returns after the first {MAX_LAG} (conditioning set).",
    )


def masks() -> jnp.ndarray:
    """``[6, P]`` 1 where model k uses the entry (α_0, α_1..q_k, ν)."""
    m = np.zeros((len(ORDERS), P), np.float32)
    for k, q in enumerate(ORDERS):
        m[k, : q + 1] = 1.0
        m[k, -1] = 1.0
    return jnp.asarray(m)


def loglik_theta(theta, mask, datum):
    """Per-datum log-likelihood of model with ``mask`` at padded log-parameters ``theta``.

    ``log p(r_t) = log t_ν(r_t / σ_t) - log σ_t`` with
    ``log t_ν(x) = lgamma((ν+1)/2) - lgamma(ν/2) - ½ log(νπ) - (ν+1)/2 log(1 + x²/ν)``.
    """
    r, lagged = datum
    alpha = jnp.exp(theta[: MAX_LAG + 1]) * mask[: MAX_LAG + 1]
    nu = jnp.exp(theta[-1])
    var = alpha[0] + jnp.dot(lagged, alpha[1:])
    return (
        gammaln((nu + 1) / 2)
        - gammaln(nu / 2)
        - 0.5 * jnp.log(nu * jnp.pi)
        - 0.5 * jnp.log(var)
        - (nu + 1) / 2 * jnp.log1p(r**2 / (var * nu))
    )


def logprior_theta(theta, mask):
    """Exp(1) priors on α and ν, in log space (``φ - e^φ``) on used entries; N(0, 1) on the padding."""
    used = mask * (theta - jnp.exp(theta))
    aux = (1 - mask) * (-0.5 * theta**2 - 0.5 * jnp.log(2 * jnp.pi))
    return jnp.sum(used + aux)


def all_models_loglik(thetas, data, indices):
    """``[m, 6]`` per-datum log-likelihoods of every model (each at its own θ_k) for ``indices``."""
    r, lagged = data
    r_b, lag_b = r[indices], lagged[indices]
    mk = masks()
    return jax.vmap(lambda th, m: jax.vmap(lambda rr, ll: loglik_theta(th, m, (rr, ll)))(r_b, lag_b), out_axes=1)(
        thetas, mk
    )


def _g(z, r):
    """Per-datum log-likelihood as a function of ``z = (s, φ) = (log σ_t², log ν)``."""
    s, phi = z[0], z[1]
    nu = jnp.exp(phi)
    return (
        gammaln((nu + 1) / 2)
        - gammaln(nu / 2)
        - 0.5 * jnp.log(nu * jnp.pi)
        - 0.5 * s
        - (nu + 1) / 2 * jnp.log1p(r**2 * jnp.exp(-s) / nu)
    )


#: Columns of the per-datum control-variate coefficients (one row of 6 per model).
CV_COLUMNS = ("l", "A", "g_phi", "C", "E", "g_phiphi")
NUM_CV = len(CV_COLUMNS)


class CVMeans(NamedTuple):
    """Data means of the second-order control variate's pieces, per model (see :func:`cv_values`)."""

    l: jnp.ndarray  # [6]
    ax: jnp.ndarray  # [6, 31]  mean_n A_n x_n
    g_phi: jnp.ndarray  # [6]
    cxx: jnp.ndarray  # [6, 31, 31]  mean_n C_n x_n x_n^T
    ex: jnp.ndarray  # [6, 31]  mean_n E_n x_n
    g_phiphi: jnp.ndarray  # [6]


class Pilot(NamedTuple):
    """Per-model MAP, Laplace pseudo-prior and the control variates' tables."""

    mu: jnp.ndarray  # [6, P] MAP (padding 0)
    chol: jnp.ndarray  # [6, P, P] Cholesky of Laplace covariance (padding identity)
    log_det_chol: jnp.ndarray  # [6] sum log diag(chol) over used entries
    laplace_log_evidence: jnp.ndarray  # [6] Laplace estimate of log p(r | q)
    alpha_hat: jnp.ndarray  # [6, 31] exp(MAP) on used α entries, 0 elsewhere
    cv_coef: jnp.ndarray  # [N, 6, NUM_CV] per-datum Taylor coefficients (CV_COLUMNS)
    cv_mean: CVMeans
    grad_w_at_map: jnp.ndarray  # [6, P] full-data log-posterior gradient in whitened coordinates at w = 0


def cv_terms(alpha_hat, mu, theta, lag):
    """``(u1, u2, Δφ)`` of :func:`cv_values` for one model: ``x·(α̂⊙Δ)``, ``x·(α̂⊙Δ²)`` with ``x = [1, lag]``."""
    d = theta[: MAX_LAG + 1] - mu[: MAX_LAG + 1]
    a1, a2 = alpha_hat * d, alpha_hat * d * d
    u1 = a1[0] + jnp.dot(lag, a1[1:])
    u2 = a2[0] + jnp.dot(lag, a2[1:])
    return u1, u2, theta[-1] - mu[-1]


def cv_values(coef, u1, u2, dphi, order: int = 2):
    """Taylor control variate ``h_n(θ)`` of one model around its MAP ``θ̂`` from the per-datum coefficients.

    ``l_n`` depends on ``θ`` only through ``s_n = log σ_n² = log(α·x_n)`` and ``φ = log ν``
    (``x_n = [1, r_{n-1}², ..., r_{n-30}²]``, ``α = e^θ`` on the model's entries), so with
    ``p_n = α̂ ⊙ x_n / σ̂_n²`` its θ-derivatives are ``∂l = g_s p``, ``∂²l = (g_ss - g_s) p pᵀ +
    g_s diag(p)`` (and ``g_sφ p``, ``g_φφ`` for ν). The second-order Taylor expansion is then

    ``h_n = l̂ + A u1 + g_φ Δφ + ½ (C u1² + A u2 + 2 E u1 Δφ + g_φφ Δφ²)``

    with ``u1 = x_n·(α̂⊙Δ)``, ``u2 = x_n·(α̂⊙Δ²)``, ``A = g_s/σ̂²``, ``C = (g_ss - g_s)/σ̂⁴``,
    ``E = g_sφ/σ̂²``: six numbers per datum and model instead of a ``[P]`` gradient and a
    ``[P, P]`` Hessian, and two dot products with the lagged row the likelihood reads anyway.
    ``order=1`` keeps the first-order terms only. ``coef[..., j]`` follows ``CV_COLUMNS``.
    """
    l_, a, gp, c, e, gpp = (coef[..., j] for j in range(NUM_CV))
    h = l_ + a * u1 + gp * dphi
    if order == 2:
        h = h + 0.5 * (c * u1 * u1 + a * u2 + 2 * e * u1 * dphi + gpp * dphi * dphi)
    return h


def cv_mean_values(means: CVMeans, alpha_hat, mu, thetas, order: int = 2):
    """``(1/N) Σ_n h_n(θ_k)`` for every model ``k`` (``thetas [6, P]``), from :class:`CVMeans` only.

    Also for one model: ``means``, ``alpha_hat``, ``mu`` and ``thetas`` sliced at ``k`` (no model axis).
    """
    d = thetas[..., : MAX_LAG + 1] - mu[..., : MAX_LAG + 1]
    a1, a2 = alpha_hat * d, alpha_hat * d * d
    dphi = thetas[..., -1] - mu[..., -1]
    h = means.l + jnp.sum(means.ax * a1, axis=-1) + means.g_phi * dphi
    if order == 2:
        quad = jnp.einsum("...i,...ij,...j->...", a1, means.cxx, a1)
        h = h + 0.5 * (
            quad
            + jnp.sum(means.ax * a2, axis=-1)
            + 2 * jnp.sum(means.ex * a1, axis=-1) * dphi
            + means.g_phiphi * dphi**2
        )
    return h


def fit_pilot(data: ArchData, num_iters: int = 300) -> Pilot:
    """MAP of every model by L-BFGS (optax) on the full data, Laplace covariance, CV tables.

    One compiled optimiser, vmapped over the 6 models (the mask is an argument).
    """
    mk = masks()
    var0 = float(jnp.var(data.returns))

    def neg_logpost(theta, mask):
        ll = jax.vmap(lambda rr, ll_: loglik_theta(theta, mask, (rr, ll_)))(*data.data)
        return -(jnp.sum(ll) + logprior_theta(theta, mask))

    init = np.zeros((len(ORDERS), P), np.float32)
    for k, q in enumerate(ORDERS):
        init[k, 0] = np.log(0.3 * var0)
        init[k, 1 : q + 1] = np.log(0.5 / q)
        init[k, -1] = np.log(6.0)
    opt = optax.lbfgs()

    def run_opt(theta, mask):
        fn = lambda th: neg_logpost(th * mask, mask)  # noqa: E731  padding pinned at 0
        value_and_grad = optax.value_and_grad_from_state(fn)

        def body(carry, _):
            th, st = carry
            value, grad = value_and_grad(th, state=st)
            updates, st = opt.update(grad, st, th, value=value, grad=grad, value_fn=fn)
            return (optax.apply_updates(th, updates), st), value

        (th, _), _ = jax.lax.scan(body, (theta, opt.init(theta)), None, length=num_iters)
        th = th * mask
        return th, jax.hessian(neg_logpost)(th, mask), jax.grad(neg_logpost)(th, mask)

    thetas, hessians, grads = jax.jit(jax.vmap(run_opt))(jnp.asarray(init), mk)
    mus, chols, logdets, evidences, grad_w = [], [], [], [], []
    for k in range(len(ORDERS)):
        used = np.asarray(mk[k]) > 0
        h_used = np.asarray(hessians[k], np.float64)[np.ix_(used, used)]
        cov_used = np.linalg.inv(h_used)
        cov_used = 0.5 * (cov_used + cov_used.T)
        chol_used = np.linalg.cholesky(cov_used)
        chol = np.eye(P)
        chol[np.ix_(used, used)] = chol_used
        d = int(used.sum())
        logdet = float(np.sum(np.log(np.diag(chol_used))))
        evidence = -float(neg_logpost(thetas[k], mk[k])) + 0.5 * d * np.log(2 * np.pi) + logdet
        mus.append(np.asarray(thetas[k]))
        chols.append(chol)
        logdets.append(logdet)
        evidences.append(evidence)
        # gradient of the log posterior w.r.t. whitened w at w = 0 (≈ 0 at the MAP; kept exact for the CV gradient)
        grad_w.append(-(chol.T @ (np.asarray(grads[k], np.float64) * used)))
    mu = jnp.asarray(np.stack(mus), jnp.float32)
    chol = jnp.asarray(np.stack(chols), jnp.float32)
    alpha_hat = jnp.exp(mu[:, : MAX_LAG + 1]) * mk[:, : MAX_LAG + 1]
    coef = control_variate_coefficients(data, mu, alpha_hat)
    means = control_variate_means(data, coef)
    return Pilot(
        mu=mu,
        chol=chol,
        log_det_chol=jnp.asarray(logdets, jnp.float32),
        laplace_log_evidence=jnp.asarray(evidences, jnp.float32),
        alpha_hat=alpha_hat,
        cv_coef=coef,
        cv_mean=means,
        grad_w_at_map=jnp.asarray(np.stack(grad_w), jnp.float32),
    )


def control_variate_coefficients(data: ArchData, mu, alpha_hat) -> jnp.ndarray:
    """``[N, 6, NUM_CV]`` per-datum coefficients of :func:`cv_values` at every model's MAP (blocks of 4096)."""

    @jax.jit
    def block(r_b, lag_b):
        def one(rr, lag):
            def per_model(m, a):
                var = a[0] + jnp.dot(lag, a[1:])
                z = jnp.stack([jnp.log(var), m[-1]])
                g1 = jax.grad(_g)(z, rr)
                g2 = jax.hessian(_g)(z, rr)
                return jnp.stack([_g(z, rr), g1[0] / var, g1[1], (g2[0, 0] - g1[0]) / var**2, g2[0, 1] / var, g2[1, 1]])

            return jax.vmap(per_model)(mu, alpha_hat)

        return jax.vmap(one)(r_b, lag_b)

    n = data.num_data
    size = min(4096, n)
    pieces = []
    for s in range(0, n, size):
        r_b, lag_b = data.returns[s : s + size], data.lagged_sq[s : s + size]
        pad = size - r_b.shape[0]
        if pad:  # one compiled shape: pad the last block
            r_b = jnp.concatenate([r_b, jnp.zeros(pad, r_b.dtype)])
            lag_b = jnp.concatenate([lag_b, jnp.ones((pad, MAX_LAG), lag_b.dtype)])
        pieces.append(block(r_b, lag_b)[: size - pad])
    return jnp.concatenate(pieces)


def control_variate_means(data: ArchData, coef) -> CVMeans:
    """:class:`CVMeans` of the coefficients ``coef [N, 6, NUM_CV]`` (float64 sums over the data, stored float32)."""
    x = np.concatenate([np.ones((data.num_data, 1)), np.asarray(data.lagged_sq, np.float64)], axis=1)  # [N, 31]
    c64 = np.asarray(coef, np.float64)
    n = data.num_data
    means = CVMeans(
        l=c64[:, :, 0].mean(0),
        ax=np.einsum("nk,ni->ki", c64[:, :, 1], x) / n,
        g_phi=c64[:, :, 2].mean(0),
        cxx=np.einsum("nk,ni,nj->kij", c64[:, :, 3], x, x, optimize=True) / n,
        ex=np.einsum("nk,ni->ki", c64[:, :, 4], x) / n,
        g_phiphi=c64[:, :, 5].mean(0),
    )
    return CVMeans(*(jnp.asarray(m, jnp.float32) for m in means))
