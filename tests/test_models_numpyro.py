"""jaxsub.models.from_numpyro: NumPyro models as input to every family.

Three models (a logistic GLM, a Poisson GLM with an offset, a hierarchical
normal model with a per-row group index): the adapter's prior plus summed
per-row log-likelihoods equals NumPyro's ``-potential_energy`` (and its
gradient) at random unconstrained positions. Then each family, fed the
adapter's functions unchanged, is compared with BlackJAX NUTS on the same
log density: posterior means within ``Z_CRITICAL`` Monte Carlo standard errors
of both runs (ESS-gated, ``tests/helpers.py``), fixed seeds. Negative controls:
the same comparison rejects a compressed posterior at a coarse radius, and the models the adapter cannot take raise a ``ValueError`` naming
the site.
"""

from functools import partial
from typing import NamedTuple

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_mean_matches, ess_per_coordinate

import jaxsub
from jaxsub.models import from_numpyro

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")
from numpyro.infer.util import potential_energy

NUM_CHAINS = 4


def logistic_model(x, y=None):
    beta = numpyro.sample("beta", dist.Normal(0.0, 2.0).expand([x.shape[1]]).to_event(1))
    intercept = numpyro.sample("intercept", dist.Normal(0.0, 2.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Bernoulli(logits=intercept + x @ beta), obs=y)


def poisson_model(x, offset, y=None):
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    with numpyro.plate("rows", x.shape[0]):
        numpyro.sample("y", dist.Poisson(jnp.exp(offset + x @ beta)), obs=y)


def hierarchical_model(num_groups, group, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    alpha = numpyro.sample("alpha", dist.Normal(mu, tau).expand([num_groups]).to_event(1))
    sigma = numpyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with numpyro.plate("data", group.shape[0]):
        numpyro.sample("y", dist.Normal(alpha[group], sigma), obs=y)


def logistic_data(num_data=400, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_data, 2)).astype(np.float32)
    logits = 0.5 + x @ np.array([1.0, -0.7])
    y = (rng.uniform(size=num_data) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    return dict(x=x, y=y)


def poisson_data(num_data=300, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_data, 2)).astype(np.float32)
    offset = np.log(rng.uniform(0.5, 2.0, size=num_data)).astype(np.float32)
    y = rng.poisson(np.exp(offset + x @ np.array([0.4, -0.3])))
    return dict(x=x, offset=offset, y=y.astype(np.int32))


def hierarchical_data(num_data=300, num_groups=5, seed=2):
    rng = np.random.default_rng(seed)
    group = rng.integers(0, num_groups, size=num_data).astype(np.int32)
    y = rng.normal(1.0, 1.0, size=num_groups)[group] + 0.8 * rng.normal(size=num_data)
    return dict(group=group, y=y.astype(np.float32))


CASES = {
    "logistic": (logistic_model, (), logistic_data),
    "poisson": (poisson_model, (), poisson_data),
    "hierarchical": (hierarchical_model, (5,), hierarchical_data),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_density_and_gradient_equal_numpyro_potential_energy(name):
    model_fn, args, make_data = CASES[name]
    data = make_data()
    m = from_numpyro(model_fn, *args, data=data)
    kwargs = {k: jnp.asarray(v) for k, v in data.items()}

    def numpyro_logdensity(position):
        with jax.numpy_dtype_promotion("standard"):  # NumPyro's own code mixes bool and float
            return -potential_energy(model_fn, args, kwargs, m.unravel(position))

    def ours(position):
        total = m.logprior_fn(position) + jnp.sum(jax.vmap(m.loglikelihood_fn, (None, 0))(position, m.data))
        return jnp.stack([m.logdensity_fn(position), total]), jax.grad(m.logdensity_fn)(position)

    def theirs(position):
        return numpyro_logdensity(position), jax.grad(numpyro_logdensity)(position)

    positions = 0.5 * jax.random.normal(jax.random.key(3), (4, m.initial_position.shape[0]))
    (values, grads), (expected, expected_grads) = (
        jax.jit(jax.vmap(ours))(positions),
        jax.jit(jax.vmap(theirs))(positions),
    )
    np.testing.assert_allclose(values, jnp.stack([expected, expected], axis=1), rtol=1e-5)
    scale = jnp.max(jnp.abs(expected_grads), axis=1, keepdims=True)
    np.testing.assert_allclose(grads / scale, expected_grads / scale, atol=1e-5)


def test_fields_constrain_and_integer_columns():
    data = hierarchical_data()
    m = from_numpyro(hierarchical_model, 5, data=data)
    assert m.site_names == ("alpha", "mu", "sigma", "tau")
    assert m.site_shapes == ((5,), (), (), ())
    assert m.plate_name == "data"
    assert m.data.shape == (300, 2) and m.initial_position.shape == (8,)
    row = m.datum_arguments(m.data[7])
    assert row["group"].dtype == jnp.int32 and int(row["group"][0]) == data["group"][7]
    values = m.constrain(m.initial_position)
    assert float(values["tau"]) == pytest.approx(1.0) and float(values["sigma"]) == pytest.approx(1.0)
    assert values["alpha"].shape == (5,)
    draws = jax.vmap(m.constrain)(jnp.zeros((3, 8)))
    assert draws["alpha"].shape == (3, 5)


def test_rejects_models_it_cannot_take():
    x, y = np.ones((10, 2), np.float32), np.ones(10, np.float32)

    def no_plate(x, y=None):
        beta = numpyro.sample("beta", dist.Normal(0, 1).expand([2]).to_event(1))
        numpyro.sample("obs", dist.Bernoulli(logits=x @ beta).to_event(1), obs=y)

    def outside(x, y=None, total=None):
        beta = numpyro.sample("beta", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=x @ beta), obs=y)
        numpyro.sample("total", dist.Normal(jnp.sum(beta), 1.0), obs=total)

    def discrete(x, y=None):
        k = numpyro.sample("k", dist.Bernoulli(0.5))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Normal(k, 1.0), obs=y)

    def local_latent(x, y=None):
        with numpyro.plate("data", x.shape[0]):
            z = numpyro.sample("z", dist.Normal(0, 1))
            numpyro.sample("y", dist.Normal(z, 1.0), obs=y)

    def fixed_size(x, y=None, num_data=10):
        beta = numpyro.sample("beta", dist.Normal(0, 1).expand([2]).to_event(1))
        with numpyro.plate("data", num_data):
            numpyro.sample("y", dist.Bernoulli(logits=x @ beta), obs=y)

    def data_sized(x, y=None):
        beta = numpyro.sample("beta", dist.Normal(0, 1).expand([x.shape[0]]).to_event(1))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=beta), obs=y)

    def prior_uses_rows(x, y=None):
        beta = numpyro.sample("beta", dist.Normal(0, x.shape[0]).expand([2]).to_event(1))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=x @ beta), obs=y)

    with pytest.raises(ValueError, match="a term outside the data plate depends on the rows"):
        from_numpyro(prior_uses_rows, data=dict(x=x, y=y))
    with pytest.raises(ValueError, match="observed site 'obs' is not in a plate over the N = 10"):
        from_numpyro(no_plate, data=dict(x=x, y=y))
    with pytest.raises(ValueError, match="observed site 'total' is outside the plate 'data'"):
        from_numpyro(outside, total=1.0, data=dict(x=x, y=y))
    with pytest.raises(ValueError, match="latent site 'k' is discrete"):
        from_numpyro(discrete, data=dict(x=x, y=y))
    with pytest.raises(ValueError, match="latent site 'z' is inside the data plate 'data'"):
        from_numpyro(local_latent, data=dict(x=x, y=y))
    with pytest.raises(ValueError, match="plate 'data' has size 10 when the model is given one data row"):
        from_numpyro(fixed_size, data=dict(x=x, y=y))
    with pytest.raises(ValueError, match="latent site 'beta' has shape"):
        from_numpyro(data_sized, data=dict(x=x, y=y))
    with pytest.raises(ValueError, match=r"data\['y'\] must have leading axis N = 10"):
        from_numpyro(fixed_size, data=dict(x=x, y=y[:5]))
    with pytest.raises(ValueError, match="below 1.67772e\\+07"):
        from_numpyro(fixed_size, data=dict(x=x, y=np.full(10, 2**25)))


# ---- every family on the logistic GLM, against BlackJAX NUTS on the same density ----


class Reference(NamedTuple):
    """Full-data NUTS on the adapter's ``logdensity_fn``: posterior mean, its MCSE, covariance."""

    mean: np.ndarray
    mcse: np.ndarray
    cov: np.ndarray


@pytest.fixture(scope="module")
def glm():
    return from_numpyro(logistic_model, data=logistic_data())


def _starts(reference, key):
    noise = jax.random.normal(key, (NUM_CHAINS, reference.mean.shape[0]))
    return jnp.asarray(reference.mean + 0.5 * noise @ np.linalg.cholesky(reference.cov).T, jnp.float32)


def _nuts_draws(logdensity_fn, key, num_steps, inverse_mass_matrix, starts):
    algo = blackjax.nuts(logdensity_fn, step_size=0.5, inverse_mass_matrix=inverse_mass_matrix)
    trace = jaxsub.run_chains(key, algo, jax.vmap(algo.init)(starts), num_steps, transform=lambda s, i: s.position)
    return trace.states


@pytest.fixture(scope="module")
def reference(glm):
    """NUTS from the prior's scale (sd 0.1 is the posterior's order for N = 400 rows; a NUTS tree adapts to it)."""
    d = glm.initial_position.shape[0]
    starts = 0.1 * jax.random.normal(jax.random.key(9), (NUM_CHAINS, d))
    draws = np.asarray(_nuts_draws(glm.logdensity_fn, jax.random.key(10), 600, jnp.full(d, 0.04), starts))[:, 100:]
    ess = ess_per_coordinate(draws)
    assert np.all(ess >= 1000), ess
    flat = draws.reshape(-1, d)
    return Reference(flat.mean(0), flat.std(0, ddof=1) / np.sqrt(ess), np.cov(flat.T))


def _step_scale(reference):
    """Random-walk scale ``2.38 / sqrt(d)`` times the posterior's Cholesky factor (Roberts, Gelman & Gilks 1997)."""
    return jnp.asarray(2.38 / np.sqrt(len(reference.mean)) * np.linalg.cholesky(reference.cov), jnp.float32)


def _agrees(draws, reference, min_ess=200.0):
    assert_mean_matches(draws, reference.mean, min_ess=min_ess, extra_sd=reference.mcse)


def test_racing_mh_with_taylor_control_variate_agrees_with_nuts(glm, reference):
    m = glm
    center = jnp.asarray(reference.mean, jnp.float32)
    cv = jaxsub.racing_mh.parameter_taylor_control_variate(m.loglikelihood_fn, m.data, center)
    algo = jaxsub.racing_mh(
        m.logprior_fn, m.loglikelihood_fn, m.data, delta=0.05, step_size=_step_scale(reference), control_variate=cv
    )
    key = jax.random.key(11)
    trace = jaxsub.run_chains(
        key,
        algo,
        jax.vmap(algo.init)(_starts(reference, key)),
        1500,
        transform=lambda s, i: s.position,
        info_transform=lambda s, i: i.num_evaluations,
    )
    _agrees(trace.states, reference)
    assert float(jnp.mean(trace.infos)) < m.data.shape[0]  # the race reads less than the two full passes


def test_sgld_racing_mh_agrees_with_nuts(glm, reference):
    m = glm
    sd = float(np.sqrt(np.min(np.diag(reference.cov))))
    algo = jaxsub.sgld_racing_mh(
        m.logprior_fn, m.loglikelihood_fn, m.data, step_size=0.5 * sd**2, batch_size=50, delta=0.05
    )
    key = jax.random.key(12)
    trace = jaxsub.run_chains(
        key, algo, jax.vmap(algo.init)(_starts(reference, key)), 2000, transform=lambda s, i: s.position
    )
    _agrees(trace.states, reference)


def _compressed_nuts(m, data, weights, key, inverse_mass_matrix, starts):
    """NUTS on the compressed posterior of ``Pseudodata(data, weights)``: padded clusterings share one program."""
    pseudo = jaxsub.compress.Pseudodata(data, weights)
    logdensity = jaxsub.compress.logdensity(m.logprior_fn, m.loglikelihood_fn, pseudo)
    return _nuts_draws(logdensity, key, 400, inverse_mass_matrix, starts)


def test_compressed_nuts_agrees_with_nuts_and_a_coarse_radius_does_not(glm, reference):
    m = glm
    run = jax.jit(partial(_compressed_nuts, m))
    key = jax.random.key(13)
    # radius 0.45 < 0.5 keeps the 0/1 labels apart (an averaged label is outside Bernoulli's
    # support, -inf in NumPyro) but merges covariates enough to bias the posterior by several MCSE
    for radius, agrees in ((0.1, True), (0.45, False)):
        clustering = jaxsub.compress.cluster(np.asarray(m.data), radius)
        assert clustering.c < m.data.shape[0]
        pseudo = jaxsub.compress.pseudodata(clustering, size=m.data.shape[0])
        draws = np.asarray(
            run(
                jnp.asarray(pseudo.data, jnp.float32),
                jnp.asarray(pseudo.weights, jnp.float32),
                key,
                jnp.asarray(np.diag(reference.cov), jnp.float32),
                _starts(reference, key),
            )
        )
        if agrees:
            _agrees(draws, reference)
        else:
            with pytest.raises(AssertionError, match="differs"):
                _agrees(draws, reference)


@pytest.mark.parametrize("conducive", [False, True])
def test_dsgld_over_shards_agrees_with_nuts(glm, reference, conducive):
    m = glm
    shards = [m.data[i::4] for i in range(4)]
    sd = float(np.sqrt(np.min(np.diag(reference.cov))))
    settings = dict(step_size=0.05 * sd**2, batch_size=25, local_steps=10)
    if conducive:
        center = jnp.asarray(reference.mean, jnp.float32)
        surrogates = jaxsub.sgmcmc.laplace_surrogates(m.logprior_fn, m.loglikelihood_fn, shards, center)
        algo = jaxsub.cg_dsgld(m.logprior_fn, m.loglikelihood_fn, shards, surrogates=surrogates, **settings)
    else:
        algo = jaxsub.dsgld(m.logprior_fn, m.loglikelihood_fn, shards, **settings)
    key = jax.random.key(14)
    trace = jaxsub.run_chains(
        key, algo, jax.vmap(algo.init)(_starts(reference, key)), 2000, transform=lambda s, i: s.position
    )
    _agrees(trace.states, reference)
