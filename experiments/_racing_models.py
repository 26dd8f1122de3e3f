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


class PackedLogistic(NamedTuple):
    """One contiguous table for racing MH: ``rows [N, d + 4] = [x_n, y_n, l̂_n, a_n, c_n]`` and its CV.

    With ``ŝ_n = x_n·θ̂``: ``l̂_n = l_n(θ̂)``, ``a_n = y_n - σ(ŝ_n)``, ``c_n = -σ(ŝ_n)(1 - σ(ŝ_n))`` at the
    centre ``θ̂`` (the MAP). ``l_n`` depends on ``θ`` only through ``s_n = x_n·θ``, so the
    second-order Taylor control variate is ``h_n(θ) = l̂_n + a_n (s_n - ŝ_n) + ½ c_n (s_n - ŝ_n)²``
    (the same function as :func:`jaxsub.racing_mh.parameter_taylor_control_variate`'s second order) and
    costs no data read beyond the likelihood's own row (``s_n - ŝ_n = x_n·(θ - θ̂)``): one row of
    ``d + 4`` floats per datum instead of ``x``, ``y`` and a ``[1 + d + d(d+1)/2]``-float table.
    Its mean is ``mean l̂ + mean(a x)·Δ + ½ Δᵀ mean(c x xᵀ) Δ`` (``Δ = θ - θ̂``, sums stored).
    """

    rows: jnp.ndarray  # [N, d + 4] float32
    centre: jnp.ndarray  # [d]
    mean_l: jnp.ndarray  # scalar
    mean_ax: jnp.ndarray  # [d]
    mean_cxx: jnp.ndarray  # [d, d]

    @property
    def num_data(self) -> int:
        return int(self.rows.shape[0])

    def control_variate(self, rows=None):
        """The :class:`jaxsub.racing_mh.ControlVariate` reading ``rows`` (default ``self.rows``).

        Pass the very array the kernel gets as ``data`` (e.g. a jitted function's argument):
        the proxy and the likelihood then gather the same rows, which XLA reads once.
        """
        from jaxsub import racing_mh

        rows = self.rows if rows is None else rows
        d = self.centre.shape[0]
        centre, mean_l, mean_ax, mean_cxx = self.centre, self.mean_l, self.mean_ax, self.mean_cxx

        def value_fn(theta, indices):
            b = rows[indices]
            ds = b[:, :d] @ (theta - centre)
            return b[:, d + 1] + b[:, d + 2] * ds + 0.5 * b[:, d + 3] * ds * ds

        def mean_fn(theta):
            delta = theta - centre
            return mean_l + jnp.dot(mean_ax, delta) + 0.5 * delta @ mean_cxx @ delta

        return racing_mh.ControlVariate(
            value_fn, mean_fn, num_data=int(rows.shape[0]), fingerprint=racing_mh.data_fingerprint(rows), center_size=d
        )


def packed_loglikelihood(theta, row):
    """:func:`loglikelihood` for one packed row ``[x, y, ...]`` (the dimension is ``theta``'s)."""
    d = theta.shape[0]
    eta = jnp.dot(row[:d], theta)
    return row[d] * eta - jax.nn.softplus(eta)


def pack_logistic(problem: LogisticProblem, center=None) -> PackedLogistic:
    """:class:`PackedLogistic` of ``problem``, control variate centred at ``center`` (default the MAP)."""
    x = np.asarray(problem.x, np.float64)
    y = np.asarray(problem.y, np.float64)
    n = x.shape[0]
    theta_hat = np.asarray(problem.map_position if center is None else center, np.float64)
    s_hat = x @ theta_hat
    p = 1 / (1 + np.exp(-s_hat))
    l_hat = y * s_hat - np.logaddexp(0.0, s_hat)
    a, c = y - p, -p * (1 - p)
    return PackedLogistic(
        rows=jnp.asarray(np.column_stack([x, y, l_hat, a, c]), jnp.float32),
        centre=jnp.asarray(theta_hat, jnp.float32),
        mean_l=jnp.asarray(l_hat.mean(), jnp.float32),
        mean_ax=jnp.asarray((a[:, None] * x).mean(0), jnp.float32),
        mean_cxx=jnp.asarray(np.einsum("n,ni,nj->ij", c, x, x, optimize=True) / n, jnp.float32),
    )


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


def nuts_reference(
    problem: LogisticProblem, *, num_chains: int = 4, num_warmup: int = 200, num_draws: int = 1000, seed: int = 0
):
    """Exact reference draws ``[num_chains, num_draws, d]`` from BlackJAX NUTS on the full data.

    The Laplace covariance is the inverse mass matrix, so the preconditioned
    posterior is close to a standard normal and a fixed step size of 0.8 (no
    adaptation needed; acceptance ~0.9 for d = 8) gives nearly independent draws.
    """
    import blackjax

    data = problem.data
    nuts = blackjax.nuts(lambda th: full_logdensity(th, data), step_size=0.8, inverse_mass_matrix=problem.laplace_cov)
    key = jax.random.key(seed)
    starts = (
        problem.map_position
        + jax.random.normal(key, (num_chains, problem.map_position.shape[0]))
        @ jnp.linalg.cholesky(problem.laplace_cov).T
    )

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
