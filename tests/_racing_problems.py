"""Small problems with known answers shared by the racing-kernel tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

#: Gaussian-mean model y_n ~ N(θ, I_2), θ ~ N(0, PRIOR_VAR I_2): posterior N(Σy/(N + 1/PRIOR_VAR), I/(N + 1/PRIOR_VAR)).
PRIOR_VAR = 100.0


def gaussian_mean_problem(num_data: int = 1000, dim: int = 2, seed: int = 0):
    """Data, log prior, per-datum log-likelihood and the analytic posterior (mean, variance)."""
    rng = np.random.default_rng(seed)
    y = rng.standard_normal((num_data, dim)) + np.linspace(-1.0, 1.0, dim)
    precision = num_data + 1.0 / PRIOR_VAR
    post_mean = y.sum(axis=0) / precision
    post_var = np.full(dim, 1.0 / precision)

    def logprior(theta):
        return -0.5 * jnp.sum(theta**2) / PRIOR_VAR

    def loglikelihood(theta, datum):
        return -0.5 * jnp.sum((datum - theta) ** 2)

    return jnp.asarray(y, jnp.float32), logprior, loglikelihood, post_mean, post_var


def full_logdensity(logprior, loglikelihood, data):
    def logdensity(theta):
        return logprior(theta) + jnp.sum(jax.vmap(loglikelihood, in_axes=(None, 0))(theta, data))

    return logdensity
