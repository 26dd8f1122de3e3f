"""The ARCH(q) model's second-order control variate (experiments/_arch_model.py).

The racing sweep of the ARCH benchmark reads six coefficients per datum and model instead of a
[P] gradient and a [P, P] Hessian; these tests check that the structured form *is* the
second-order Taylor expansion of the log-likelihood in the padded log-parameters (against
autodiff), and that its data mean, computed from the stored sums only, equals the mean of the
per-datum values (the control variate must have a known mean, or the race is biased).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import Z_CRITICAL

from experiments._arch_model import (
    MAX_LAG,
    NUM_CV,
    ORDERS,
    P,
    ArchData,
    control_variate_coefficients,
    control_variate_means,
    cv_mean_values,
    cv_terms,
    cv_values,
    loglik_theta,
    masks,
)

NUM = 48


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    r = rng.standard_t(5, NUM + MAX_LAG).astype(np.float32)
    lagged = np.stack([r[MAX_LAG - i : MAX_LAG - i + NUM] ** 2 for i in range(1, MAX_LAG + 1)], axis=1)
    data = ArchData(jnp.asarray(r[MAX_LAG:]), jnp.asarray(lagged), "synthetic")
    mk = masks()
    mu = np.zeros((len(ORDERS), P), np.float32)
    for k, q in enumerate(ORDERS):
        mu[k, 0] = np.log(0.4)
        mu[k, 1 : q + 1] = np.log(0.3 / q) + 0.2 * rng.standard_normal(q)
        mu[k, -1] = np.log(5.0)
    mu = jnp.asarray(mu) * mk
    alpha_hat = jnp.exp(mu[:, : MAX_LAG + 1]) * mk[:, : MAX_LAG + 1]
    coef = control_variate_coefficients(data, mu, alpha_hat)
    return data, mk, mu, alpha_hat, coef


def _model_values(data, mk, mu, alpha_hat, coef, k, theta, order):
    terms = jax.vmap(lambda lg: cv_terms(alpha_hat[k], mu[k], theta, lg))(data.lagged_sq)
    return cv_values(coef[:, k], *terms, order=order)


def test_cv_is_the_taylor_expansion_of_the_loglikelihood(problem):
    data, mk, mu, alpha_hat, coef = problem
    assert coef.shape == (NUM, len(ORDERS), NUM_CV)

    @jax.jit
    def check(k, key):  # one compile for every model k (traced)
        delta = 0.05 * jax.random.normal(key, (P,)) * mk[k]
        theta = mu[k] + delta

        def along(n):  # l_n(mu + t delta) and its first two t-derivatives at t = 0 (forward mode)
            f = lambda t: loglik_theta(mu[k] + t * delta, mk[k], (data.returns[n], data.lagged_sq[n]))  # noqa: E731
            df = lambda t: jax.jvp(f, (t,), (jnp.ones_like(t),))[1]  # noqa: E731
            t0 = jnp.zeros(())
            return f(t0), df(t0), jax.jvp(df, (t0,), (jnp.ones_like(t0),))[1], f(jnp.ones(()))

        value, first_d, second_d, exact = jax.vmap(along)(jnp.arange(NUM))
        first = _model_values(data, mk, mu, alpha_hat, coef, k, theta, order=1)
        second = _model_values(data, mk, mu, alpha_hat, coef, k, theta, order=2)
        return value + first_d, value + first_d + 0.5 * second_d, first, second, exact, 0.5 * second_d

    for k in (0, 3, 5):
        taylor1, taylor2, first, second, exact, half_second = check(k, jax.random.key(k))
        np.testing.assert_allclose(first, taylor1, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(second, taylor2, rtol=1e-5, atol=1e-5)
        # power: the second-order term is not negligible at this offset, and the
        # second-order proxy is closer to the true log-likelihood than the first-order one
        assert float(jnp.max(jnp.abs(half_second))) > 1e-3
        assert float(jnp.max(jnp.abs(second - exact))) < 0.2 * float(jnp.max(jnp.abs(first - exact)))


def test_cv_mean_from_stored_sums_equals_the_data_mean(problem):
    data, mk, mu, alpha_hat, coef = problem
    means = control_variate_means(data, coef)
    thetas = (mu + 0.1 * jax.random.normal(jax.random.key(7), mu.shape)) * mk

    @jax.jit
    def check(ks):
        out = {}
        for order in (1, 2):
            per_datum = jax.vmap(lambda k: _model_values(data, mk, mu, alpha_hat, coef, k, thetas[k], order), out_axes=1)(ks)
            one = jax.vmap(lambda k: cv_mean_values(jax.tree.map(lambda a: a[k], means), alpha_hat[k], mu[k], thetas[k], order=order))(ks)
            out[order] = (per_datum.mean(0), cv_mean_values(means, alpha_hat, mu, thetas, order=order), one)
        return out

    for order, (data_mean, all_models, one_model) in check(jnp.arange(len(ORDERS))).items():
        np.testing.assert_allclose(all_models, data_mean, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(one_model, all_models, rtol=1e-6, atol=1e-6)  # one model: everything sliced at k


def test_batched_sweep_decisions_match_exact_decisions(problem):
    """The benchmark's batched 16-chain racing sweep (arch_model_selection.make_batched_sweep: one
    racing-Gibbs batch for the model indicators, one racing-MH batch for the SGLD proposals, packed
    shuffled rows) makes each chain's decisions as the exact sweep would with the same noise:
    every Gibbs draw (argmax of log f0 + Gumbel noise + all N factors) and MH decision is re-made
    on all N data, and the error rates must be <= delta + MC error (decisions at delta = 0.05).
    Power: a plumbing error (a chain's model, coefficients or CV mean taken from the wrong model or
    row) makes races decide on a wrong estimate, far more often than delta. The batched kernels'
    options are exercised too: blocks of 2 rows (block_size, both kernels) and exact_pass_cost = None
    (no early exact pass: hard races read blocks at random to the end, Alg. 1 as in the paper; one loop
    less to compile than the default 0.25). Sizes: N = 400 returns
    (200 blocks), 16 chains, 8 sweeps; pilot = the fixture's perturbed centres with a Laplace scale
    of 0.1 (any centre keeps the control variate's mean exact)."""
    from experiments._arch_model import Pilot, control_variate_means as cv_means
    from experiments.arch_model_selection import DELTA, _exact_decision_errors, make_batched_sweep

    rng = np.random.default_rng(1)
    n, chains, sweeps = 400, 16, 8
    r = rng.standard_t(5, n + MAX_LAG).astype(np.float32)
    lagged = np.stack([r[MAX_LAG - i : MAX_LAG - i + n] ** 2 for i in range(1, MAX_LAG + 1)], axis=1)
    data = ArchData(jnp.asarray(r[MAX_LAG:]), jnp.asarray(lagged), "synthetic")
    _, mk, mu, alpha_hat, _ = problem
    coef = control_variate_coefficients(data, mu, alpha_hat)
    chol = jnp.where(mk[:, :, None] * jnp.eye(P) > 0, 0.1, 0.0) + (1 - mk)[:, :, None] * jnp.eye(P)
    pilot = Pilot(mu=mu, chol=chol, log_det_chol=jnp.sum(mk, axis=1) * np.log(0.1), laplace_log_evidence=jnp.zeros(len(ORDERS)),
                  alpha_hat=alpha_hat, cv_coef=coef, cv_mean=cv_means(data, coef), grad_w_at_map=jnp.zeros((len(ORDERS), P)))
    sweep = make_batched_sweep(data, pilot, chains, block_size=2, exact_pass_cost=None)

    @jax.jit
    def run(key):
        def body(state, k):
            return sweep(k, state, jnp.zeros(len(ORDERS)))

        init = (jnp.asarray(rng.integers(0, len(ORDERS), chains), jnp.int32), jnp.zeros((chains, len(ORDERS), P)))
        return jax.lax.scan(body, init, jax.random.split(key, sweeps))[1]

    recs = jax.tree.map(lambda a: np.asarray(a).reshape((-1,) + a.shape[2:]), run(jax.random.key(0)))
    m, gibbs_errors, mh_errors = _exact_decision_errors(data, pilot, recs, chains * sweeps)
    allowed = DELTA * m + Z_CRITICAL * np.sqrt(m * DELTA * (1 - DELTA))
    assert gibbs_errors <= allowed and mh_errors <= allowed, (gibbs_errors, mh_errors, allowed)
    assert not recs["has_nan"].any()
    assert len(set(recs["k"].tolist())) > 1 and 0 < recs["accepted"].mean() < 1  # models and decisions vary
    assert recs["gibbs_evals"].mean() < n * len(ORDERS)  # races stopped early
    assert np.all(recs["mh_evals"] % 2 == 0)  # blocks of 2 rows
