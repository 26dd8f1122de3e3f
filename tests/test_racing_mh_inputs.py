"""Racing MH refuses invalid input loudly, warns where it knows the answer is poor, and its
acceptance test sees the prior (a strong-prior check with power in the default run)."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _racing_problems import gaussian_mean_problem
from helpers import Z_CRITICAL

import jaxsub


def _logistic(num_data=400, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_data, 3)).astype(np.float32)
    y = (rng.random(num_data) < 1 / (1 + np.exp(-x @ np.array([1.0, -0.5, 0.2])))).astype(np.float32)

    def logprior(theta):
        return -0.5 * jnp.sum(theta**2)

    def loglik(theta, datum):
        xn, yn = datum
        z = xn @ theta
        return yn * z - jnp.logaddexp(0.0, z)

    return jnp.asarray(x), jnp.asarray(y), logprior, loglik


# --------------------------------------------------------------------------- invalid input


def test_non_finite_data_is_refused_by_every_constructor():
    """One NaN row: racing MH would read it only when a race reaches it (a silent shift of the
    posterior); every constructor that takes data refuses it, naming the row."""
    x, y, logprior, loglik = _logistic()
    bad = x.at[7, 1].set(jnp.nan)
    data = (bad, y)
    with pytest.raises(ValueError, match="data must be finite.*row 7"):
        jaxsub.racing_mh(logprior, loglik, data, delta=0.05, step_size=0.1)
    with pytest.raises(ValueError, match="data must be finite"):
        jaxsub.sgld_racing_mh(logprior, loglik, data, step_size=1e-3, batch_size=20, delta=0.05)
    with pytest.raises(ValueError, match="data must be finite"):
        jaxsub.racing_mh.laplace_fit(logprior, loglik, data, jnp.zeros(3))
    with pytest.raises(ValueError, match="data must be finite"):
        jaxsub.racing_mh.parameter_taylor_control_variate(loglik, data, jnp.zeros(3))
    with pytest.raises(ValueError, match="data must be finite"):
        jaxsub.discrete.data_taylor_control_variate(
            lambda t, yn: -0.5 * (yn - t) ** 2, jnp.zeros(2), y.at[3].set(jnp.inf)
        )
    centres = jnp.asarray([-0.1, 0.0, 0.1])
    with pytest.raises(ValueError, match="data must be finite"):
        jaxsub.racing_gibbs(
            jnp.zeros(3), lambda idx: -0.5 * (bad[idx, :1] - centres[None, :]) ** 2, 400, delta=0.05, data=bad
        )
    with pytest.raises(ValueError, match="log_f0 must not hold NaN"):
        jaxsub.racing_gibbs(
            jnp.asarray([0.0, jnp.nan, 0.0]), lambda idx: -0.5 * (x[idx, :1] - centres) ** 2, 400, delta=0.05
        )


def test_position_is_checked_against_the_model_at_init():
    x, y, logprior, loglik = _logistic()
    algo = jaxsub.racing_mh(logprior, loglik, (x, y), delta=0.05, step_size=0.1)
    with pytest.raises(ValueError, match=r"initial position \(shapes \(4,\)\) does not fit the model"):
        algo.init(jnp.zeros(4))
    sgld = jaxsub.sgld_racing_mh(logprior, loglik, (x, y), step_size=1e-3, batch_size=20, delta=0.05)
    with pytest.raises(ValueError, match="does not fit the model"):
        sgld.init(jnp.zeros(2))
    with pytest.raises(ValueError, match="initial_position .* does not fit the model"):
        jaxsub.racing_mh.laplace_fit(logprior, loglik, (x, y), jnp.zeros(4))
    # the low-level kernel names the state's position too
    kernel = jaxsub.racing_mh.build_kernel(400, delta=0.05)
    state = jaxsub.racing_mh.init(jnp.zeros(2), logprior)
    with pytest.raises(ValueError, match="state.position .* does not fit the model"):
        kernel(jax.random.key(0), state, logprior, loglik, (x, y), jaxsub.racing_mh.gaussian_random_walk(0.1))


def test_column_shaped_y_is_named():
    """``y`` of shape [N, 1] makes each datum's log-likelihood a vector: named at init, not deep in the race."""
    x, y, logprior, loglik = _logistic()
    algo = jaxsub.racing_mh(logprior, loglik, (x, y[:, None]), delta=0.05, step_size=0.1)
    with pytest.raises(ValueError, match=r"scalar per datum; got shape \(1,\).*\[N, 1\]"):
        algo.init(jnp.zeros(3))
    centres = jnp.asarray([-0.1, 0.0, 0.1])
    with pytest.raises(ValueError, match=r"must return shape \[m, D\]"):
        jaxsub.racing_gibbs(jnp.zeros(3), lambda idx: -0.5 * (x[idx, :1] - centres[:2]) ** 2, 400, delta=0.05)


def test_step_size_matrix_of_wrong_shape_is_named():
    x, y, logprior, loglik = _logistic()
    algo = jaxsub.racing_mh(logprior, loglik, (x, y), delta=0.05, step_size=np.eye(2))
    with pytest.raises(ValueError, match=r"step_size must be .* \(3, 3\) .* got shape \(2, 2\)"):
        algo.init(jnp.zeros(3))
    kernel = jaxsub.racing_mh.build_kernel(400, delta=0.05)
    state = jaxsub.racing_mh.init(jnp.zeros(3), logprior)
    with pytest.raises(ValueError, match=r"got shape \(2, 2\)"):
        kernel(jax.random.key(0), state, logprior, loglik, (x, y), jaxsub.racing_mh.gaussian_random_walk(jnp.eye(2)))


def test_integer_initial_position_is_promoted_to_float():
    x, y, logprior, loglik = _logistic()
    algo = jaxsub.racing_mh(logprior, loglik, (x, y), delta=0.05, step_size=0.1)
    state = algo.init(jnp.zeros(3, jnp.int32))
    assert jnp.issubdtype(state.position.dtype, jnp.floating)
    new, info = algo.step(jax.random.key(0), state)
    assert new.position.dtype == state.position.dtype and np.all(np.isfinite(np.asarray(new.position)))
    fit = jaxsub.racing_mh.laplace_fit(logprior, loglik, (x, y), jnp.zeros(3, jnp.int32))
    assert jnp.issubdtype(fit.position.dtype, jnp.floating)


# --------------------------------------------------------------------------- warnings of info_summary


def _one_step_infos(algo, position, num_keys=64):
    keys = jax.random.split(jax.random.key(5), num_keys)
    return jax.jit(jax.vmap(algo.step, in_axes=(0, None)))(keys, algo.init(position))[1]


def test_info_summary_reads_num_data_and_warns_without_control_variate():
    y, logprior, loglik, post_mean, _ = gaussian_mean_problem(num_data=1000)
    plain = jaxsub.racing_mh(logprior, loglik, y, delta=0.05, step_size=0.03)
    infos = _one_step_infos(plain, jnp.asarray(post_mean, jnp.float32))
    with pytest.warns(RuntimeWarning, match="without a control variate.*parameter_taylor_control_variate"):
        out = jaxsub.racing_mh.info_summary(infos)  # N read from the info
    assert out["control_variate_rate"] == 0.0
    assert out["share_of_data_read"] == pytest.approx(np.mean(np.asarray(infos.num_evaluations)) / 2000)
    fit = jaxsub.racing_mh.laplace_fit(logprior, loglik, y, jnp.zeros(2))
    cv = jaxsub.racing_mh.parameter_taylor_control_variate(loglik, y, fit.position)
    with_cv = jaxsub.racing_mh(logprior, loglik, y, delta=0.05, step_size=fit.step_size, control_variate=cv)
    infos = _one_step_infos(with_cv, fit.position)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # negative control: a racing run with a control variate reading little
        out = jaxsub.racing_mh.info_summary(infos)
    assert out["control_variate_rate"] == 1.0 and out["share_of_data_read"] < 0.5


def test_info_summary_warns_when_most_data_is_read():
    info = jaxsub.racing_mh.RacingMHInfo(
        is_accepted=np.array([True, False]),
        num_evaluations=np.array([180, 200]),
        num_stages=np.ones(2),
        is_exact=np.array([False, True]),
        has_nan=np.zeros(2, bool),
        proposal=np.zeros(2),
        log_uniform=np.zeros(2),
        log_prior_proposal_ratio=np.zeros(2),
        num_data=np.array([100, 100]),
        has_control_variate=np.ones(2, bool),
    )
    with pytest.warns(RuntimeWarning, match="read 95% of the data"):
        jaxsub.racing_mh.info_summary(info)
    info = info._replace(num_data=None)
    with pytest.raises(ValueError, match="needs num_data"):
        jaxsub.racing_mh.info_summary(info)


# --------------------------------------------------------------------------- power: the prior ratio


def test_acceptance_with_flat_likelihood_equals_prior_ratio_expectation():
    """log-likelihood ≡ 0: the racing decision is the prior's MH test alone, so over one step from
    x0 the acceptance indicator must average E[min(1, p(x')/p(x0))] (computed per key from the
    proposal in ``info``) within Monte Carlo error. The fast tests' priors are 100x wider than
    their posteriors, so a kernel that drops log p(x') - log p(x) from ``log_f0_gap`` passes them;
    here it would accept every proposal (log u < 0), which the negative control shows is detectable."""
    num_keys = 4000
    data = jnp.zeros((200, 1), jnp.float32)
    logprior = lambda t: -0.5 * jnp.sum(t**2)  # noqa: E731  N(0, 1)
    loglik = lambda t, d: 0.0 * jnp.sum(t) * jnp.sum(d)  # noqa: E731  ≡ 0
    x0 = jnp.asarray([1.0], jnp.float32)
    for name, kwargs in [
        ("raced", {"delta": 0.05}),
        ("block", {"delta": 0.05, "block_size": 4}),
        ("exact", {"delta": None, "exact": True}),
    ]:
        algo = jaxsub.racing_mh(logprior, loglik, data, step_size=1.5, **kwargs)
        infos = _one_step_infos(algo, x0, num_keys)
        prop = np.asarray(infos.proposal, np.float64)[:, 0]
        a = np.minimum(1.0, np.exp(-0.5 * prop**2 + 0.5 * 1.0))
        accepted = np.asarray(infos.is_accepted, np.float64)
        se = np.sqrt(np.mean(a * (1 - a)) / num_keys)
        assert abs(accepted.mean() - a.mean()) < Z_CRITICAL * se, (name, accepted.mean(), a.mean(), se)
        # power: a kernel blind to the prior accepts every proposal here
        assert abs(1.0 - a.mean()) > 10 * Z_CRITICAL * se
