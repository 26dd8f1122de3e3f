"""Models shared by the racing-MH experiment and benchmark: Bayesian logistic regression on AER/Fertility.

Model: ``y_n ~ Bernoulli(sigmoid(x_n^T θ))``, ``θ ~ N(0, PRIOR_SD^2 I)``, with
``x_n = (1, standardised age, standardised work, 5 indicator columns)`` (d = 8).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.datasets import load_fertility

#: Prior standard deviation of every coefficient: weakly informative on the
#: standardised scale (a unit change of a standardised feature moving the log-odds
#: by 10 is far outside anything plausible), so the likelihood dominates.
PRIOR_SD = 10.0
#: Roberts, Gelman & Gilks (1997): the optimal Gaussian random-walk scale is
#: 2.38 / sqrt(d) times the posterior covariance's square root (acceptance ~0.23).
RW_SCALE = 2.38


class LogisticProblem(NamedTuple):
    x: jnp.ndarray  # [N, d] float32
    y: jnp.ndarray  # [N] float32 in {0, 1}
    map_position: jnp.ndarray  # [d]
    laplace_cov: jnp.ndarray  # [d, d]
    feature_names: tuple
    description: str

    @property
    def data(self):
        return (self.x, self.y)

    @property
    def num_data(self) -> int:
        return int(self.x.shape[0])

    def rw_scale(self) -> jnp.ndarray:
        """Cholesky factor of (2.38^2 / d) x Laplace covariance: the RW proposal's linear map."""
        d = self.x.shape[1]
        return jnp.linalg.cholesky(self.laplace_cov) * (RW_SCALE / np.sqrt(d))


def logprior(theta):
    return -0.5 * jnp.sum(theta**2) / PRIOR_SD**2


def loglikelihood(theta, datum):
    """log p(y_n | x_n, θ) for one datum ``(x_n, y_n)``: y η - log(1 + e^η)."""
    x, y = datum
    eta = jnp.dot(x, theta)
    return y * eta - jax.nn.softplus(eta)


def full_logdensity(theta, data):
    x, y = data
    eta = x @ theta
    return logprior(theta) + jnp.sum(y * eta - jax.nn.softplus(eta))


def load_logistic(num_data: int | None = None, seed: int = 0) -> LogisticProblem:
    """Fertility as a logistic-regression problem; ``num_data`` rows chosen at random (all if None).

    Also computes the MAP (Newton's method, the log posterior is strictly concave)
    and the Laplace covariance (inverse negative Hessian at the MAP).
    """
    ds = load_fertility()
    x = ds.x.copy()
    for j in (0, 1):  # age, work: standardise
        x[:, j] = (x[:, j] - x[:, j].mean()) / x[:, j].std()
    x = np.column_stack([np.ones(len(x)), x])
    y = ds.y.astype(np.float64)
    if num_data is not None and num_data < len(x):
        rows = np.sort(np.random.default_rng(seed).choice(len(x), num_data, replace=False))
        x, y = x[rows], y[rows]
    # Newton's method in float64 (NumPy), then hand float32 arrays to the samplers.
    theta = np.zeros(x.shape[1])
    for _ in range(50):
        eta = x @ theta
        p = 1 / (1 + np.exp(-eta))
        grad = x.T @ (y - p) - theta / PRIOR_SD**2
        hess = -(x * (p * (1 - p))[:, None]).T @ x - np.eye(len(theta)) / PRIOR_SD**2
        step = np.linalg.solve(hess, grad)
        theta = theta - step
        if np.max(np.abs(step)) < 1e-12:
            break
    cov = np.linalg.inv(-hess)
    return LogisticProblem(
        x=jnp.asarray(x, jnp.float32),
        y=jnp.asarray(y, jnp.float32),
        map_position=jnp.asarray(theta, jnp.float32),
        laplace_cov=jnp.asarray(cov, jnp.float32),
        feature_names=("intercept",) + tuple(ds.feature_names),
        description=ds.description + (f" Random subset of {len(x):,} rows." if num_data else ""),
    )


def nuts_reference(problem: LogisticProblem, *, num_chains: int = 4, num_warmup: int = 200, num_draws: int = 1000, seed: int = 0):
    """Exact reference draws ``[num_chains, num_draws, d]`` from BlackJAX NUTS on the full data.

    The Laplace covariance is the inverse mass matrix, so the preconditioned
    posterior is close to a standard normal and a fixed step size of 0.8 (no
    adaptation needed; acceptance ~0.9 for d = 8) gives nearly independent draws.
    """
    import blackjax

    data = problem.data
    nuts = blackjax.nuts(lambda th: full_logdensity(th, data), step_size=0.8, inverse_mass_matrix=problem.laplace_cov)
    key = jax.random.key(seed)
    starts = problem.map_position + jax.random.normal(key, (num_chains, problem.map_position.shape[0])) @ jnp.linalg.cholesky(
        problem.laplace_cov
    ).T

    def chain(k, x0):
        _, positions = blackjax.util.run_inference_algorithm(
            k, nuts, num_warmup + num_draws, initial_position=x0, transform=lambda s, i: s.position
        )
        return positions[num_warmup:]

    keys = jax.random.split(jax.random.fold_in(key, 1), num_chains)
    return np.asarray(jax.jit(jax.vmap(chain))(keys, starts))


def moment_errors(samples, reference):
    """Max over coordinates of |mean - mean_ref| / sd_ref and |sd - sd_ref| / sd_ref."""
    s = np.asarray(samples, np.float64).reshape(-1, np.shape(samples)[-1])
    r = np.asarray(reference, np.float64).reshape(-1, np.shape(reference)[-1])
    sd_ref = r.std(axis=0, ddof=1)
    mean_err = np.abs(s.mean(0) - r.mean(0)) / sd_ref
    sd_err = np.abs(s.std(0, ddof=1) - sd_ref) / sd_ref
    return float(mean_err.max()), float(sd_err.max())


def min_ess(samples) -> float:
    """Smallest per-coordinate ESS (BlackJAX diagnostics) of ``[chains, draws, d]`` samples."""
    from blackjax.diagnostics import effective_sample_size

    return float(np.min(np.asarray(effective_sample_size(jnp.asarray(samples), chain_axis=0, sample_axis=1))))
