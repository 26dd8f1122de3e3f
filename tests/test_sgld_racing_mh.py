"""SGLD proposal + racing MH correction (jaxsub.sgld_racing_mh)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _racing_problems import gaussian_mean_problem
from blackjax.sgmcmc.gradients import grad_estimator
from helpers import assert_mean_matches, assert_variance_matches

import jaxsub
from jaxsub.sgld_racing_mh import sgld_proposal
from jaxsub.subsample import permutation_indices


def test_log_proposal_ratio_uses_the_same_minibatch_both_ways():
    y, logprior, loglik, _, _ = gaussian_mean_problem(num_data=200)
    grad = grad_estimator(logprior, loglik, 200)
    eps = 1e-3
    prop = sgld_proposal(grad, y, 200, 20, eps)
    key = jax.random.key(0)
    x = jnp.asarray([0.3, -0.2], jnp.float32)
    x_new, log_ratio = prop(key, x)
    key_batch, _ = jax.random.split(key)
    batch = y[permutation_indices(key_batch, jnp.arange(20), 200)]
    g_x, g_new = grad(x, batch), grad(x_new, batch)

    def log_q(to, frm, g):  # N(to; frm + eps g, 2 eps I)
        return float(jnp.sum(-((to - frm - eps * g) ** 2) / (4 * eps)))

    expected = log_q(x, x_new, g_new) - log_q(x_new, x, g_x)
    np.testing.assert_allclose(float(log_ratio), expected, rtol=1e-4, atol=1e-4)


# The exact-MH variant is slow: the racing variant (same posterior check) and
# test_log_proposal_ratio_uses_the_same_minibatch_both_ways stay fast.
@pytest.mark.parametrize("exact", [pytest.param(True, marks=pytest.mark.slow), False], ids=["exact_mh", "racing_mh"])
def test_corrected_sgld_targets_the_posterior(exact):
    """A step size at which plain SGLD is visibly biased; the MH-corrected chain is not."""
    y, logprior, loglik, post_mean, post_var = gaussian_mean_problem(num_data=2000)
    eps = 0.6 * float(post_var[0])  # Langevin on N(m, s^2) with eps/s^2 = 0.6: uncorrected variance s^2/(1 - 0.3)
    algo = jaxsub.sgld_racing_mh(
        logprior, loglik, y, step_size=eps, batch_size=500, delta=None if exact else 0.05, exact=exact
    )
    starts = jnp.asarray(post_mean, jnp.float32) + 0.02 * jax.random.normal(jax.random.key(0), (4, 2))
    keep = lambda s, i: (s.position, i.is_accepted)  # noqa: E731
    # 4 x 1500 steps (ESS >= 300 gated below; tolerances from the ESS-based Monte Carlo error)
    trace = jaxsub.run_chains(
        jax.random.key(1),
        algo,
        jax.vmap(algo.init)(starts),
        1500,
        transform=lambda s, i: keep(s, i)[0],
        info_transform=lambda s, i: keep(s, i)[1],
    )
    samples = np.asarray(trace.states)[:, 150:]
    acc = float(np.mean(np.asarray(trace.infos)))
    assert 0.2 < acc < 0.9  # the correction is doing something
    assert_mean_matches(samples, post_mean, min_ess=300)
    assert_variance_matches(samples, post_var, min_ess=300)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(step_size=0.0, batch_size=10, delta=0.05), "step_size"),
        (dict(step_size=1e-3, batch_size=0, delta=0.05), "batch_size"),
        (dict(step_size=1e-3, batch_size=10, delta=2.0), "delta"),
        (dict(step_size=1e-3, batch_size=10, delta=0.05, grad_estimator=3), "grad_estimator"),
    ],
)
def test_bad_configuration_raises(kwargs, match):
    y, logprior, loglik, _, _ = gaussian_mean_problem(num_data=100)
    with pytest.raises(ValueError, match=match):
        jaxsub.sgld_racing_mh(logprior, loglik, y, **kwargs)


# The fast contract test (tests/test_signatures.py::test_hyperparameter_can_be_traced[sgld_racing_mh-step_size])
# checks the same property on one step; this 10-step chain version (two compiled chains) is slow.
@pytest.mark.slow
def test_traced_step_size_under_vmap():
    """BlackJAX contract: the step size is a traced hyperparameter (one trace under jax.vmap)."""
    y, logprior, loglik, _, _ = gaussian_mean_problem(num_data=400)

    def run(step):
        algo = jaxsub.sgld_racing_mh(logprior, loglik, y, step_size=step, batch_size=40, delta=0.05)
        return jaxsub.run_chain(
            jax.random.key(0), algo, algo.init(jnp.zeros(2)), 10, transform=lambda s, i: s.position
        ).states

    traced = jax.jit(jax.vmap(run))(jnp.asarray([1e-4, 1e-3], jnp.float32))
    concrete = jax.jit(lambda: run(1e-3))()
    np.testing.assert_allclose(np.asarray(traced[1]), np.asarray(concrete), rtol=1e-5, atol=1e-6)
