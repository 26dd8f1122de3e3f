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
    return jax.vmap(lambda th, m: jax.vmap(lambda rr, ll: loglik_theta(th, m, (rr, ll)))(r_b, lag_b), out_axes=1)(thetas, mk)


class Pilot(NamedTuple):
    """Per-model MAP, Laplace pseudo-prior and first-order control-variate tables."""

    mu: jnp.ndarray  # [6, P] MAP (padding 0)
    chol: jnp.ndarray  # [6, P, P] Cholesky of Laplace covariance (padding identity)
    log_det_chol: jnp.ndarray  # [6] sum log diag(chol) over used entries
    laplace_log_evidence: jnp.ndarray  # [6] Laplace estimate of log p(r | q)
    cv_value: jnp.ndarray  # [N, 6] l_t(θ̂_k)
    cv_grad: jnp.ndarray  # [N, 6, P] ∇_θ l_t(θ̂_k)
    grad_w_at_map: jnp.ndarray  # [6, P] full-data log-posterior gradient in whitened coordinates at w = 0


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

    @jax.jit
    def tables(idx):
        r_b, lag_b = data.returns[idx], data.lagged_sq[idx]

        def per_model(th, m):
            f = lambda t, rr, ll: loglik_theta(t, m, (rr, ll))  # noqa: E731
            vals = jax.vmap(f, in_axes=(None, 0, 0))(th, r_b, lag_b)
            grads = jax.vmap(jax.grad(f), in_axes=(None, 0, 0))(th, r_b, lag_b) * m
            return vals, grads

        return jax.vmap(per_model, out_axes=1)(mu, mk)

    n = data.num_data
    pieces = [tables(jnp.arange(s, min(s + 4096, n))) for s in range(0, n, 4096)]
    return Pilot(
        mu=mu,
        chol=chol,
        log_det_chol=jnp.asarray(logdets, jnp.float32),
        laplace_log_evidence=jnp.asarray(evidences, jnp.float32),
        cv_value=jnp.concatenate([p[0] for p in pieces]),
        cv_grad=jnp.concatenate([p[1] for p in pieces]),
        grad_w_at_map=jnp.asarray(np.stack(grad_w), jnp.float32),
    )
