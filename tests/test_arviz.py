"""jaxsub.to_arviz: ChainTrace -> arviz.InferenceData (names, shapes, sample stats, axis checks)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsub
from jaxsub.racing.mh import RacingMHInfo

az = pytest.importorskip("arviz")
numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")

CHAINS, DRAWS = 4, 200


def hierarchical_model(num_groups, group, y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    alpha = numpyro.sample("alpha", dist.Normal(mu, tau).expand([num_groups]).to_event(1))
    sigma = numpyro.sample("sigma", dist.LogNormal(0.0, 1.0))
    with numpyro.plate("data", group.shape[0]):
        numpyro.sample("y", dist.Normal(alpha[group], sigma), obs=y)


def racing_trace(d=3, seed=0):
    """A ChainTrace shaped like run_chains' output for racing MH (iid draws, made-up info)."""
    rng = np.random.default_rng(seed)
    positions = rng.normal(size=(CHAINS, DRAWS, d)).astype(np.float32)
    info = RacingMHInfo(
        is_accepted=rng.uniform(size=(CHAINS, DRAWS)) < 0.3,
        num_evaluations=rng.integers(100, 200, size=(CHAINS, DRAWS)).astype(np.int32),
        num_stages=np.ones((CHAINS, DRAWS), np.int32),
        is_exact=np.zeros((CHAINS, DRAWS), bool),
        has_nan=np.zeros((CHAINS, DRAWS), bool),
        proposal=positions + 0.1,
        log_uniform=np.log(rng.uniform(size=(CHAINS, DRAWS))).astype(np.float32),
        log_prior_proposal_ratio=np.zeros((CHAINS, DRAWS), np.float32),
    )
    return jaxsub.ChainTrace(None, positions, info)


def test_numpyro_model_draws_are_constrained_named_sites():
    rng = np.random.default_rng(1)
    group = rng.integers(0, 5, size=50).astype(np.int32)
    model = jaxsub.models.from_numpyro(hierarchical_model, 5, data={"group": group, "y": rng.normal(size=50)})
    positions = rng.normal(size=(CHAINS, DRAWS, 8)).astype(np.float32)
    idata = jaxsub.to_arviz(jaxsub.ChainTrace(None, positions, None), model)
    post = idata.posterior
    assert set(post.data_vars) == {"alpha", "mu", "sigma", "tau"}
    assert post["alpha"].shape == (CHAINS, DRAWS, 5) and post["tau"].shape == (CHAINS, DRAWS)
    assert float(post["tau"].min()) > 0 and float(post["sigma"].min()) > 0
    # tau is exp of the unconstrained coordinate after alpha (5) and mu (1)
    np.testing.assert_allclose(post["tau"].values, np.exp(positions[..., 7]), rtol=1e-5)
    summary = az.summary(idata)
    assert list(summary.index) == [f"alpha[{i}]" for i in range(5)] + ["mu", "sigma", "tau"]
    assert np.all(az.ess(idata)["alpha"].values > 0.5 * CHAINS * DRAWS)  # iid draws


def test_flat_positions_and_racing_stats():
    trace = racing_trace()
    idata = jaxsub.to_arviz(trace, num_data=500)
    assert list(az.summary(idata).index) == ["x[0]", "x[1]", "x[2]"]
    stats = idata.sample_stats
    assert stats["acceptance_rate"].dtype == np.float64
    np.testing.assert_allclose(float(stats["acceptance_rate"].mean()), trace.infos.is_accepted.mean())
    np.testing.assert_allclose(stats["share_of_data_read"].values, trace.infos.num_evaluations / 1000.0)
    assert {"has_nan", "num_evaluations", "is_exact", "num_stages", "proposal"} <= set(stats.data_vars)
    assert stats["proposal"].shape == (CHAINS, DRAWS, 3)
    assert "share_of_data_read" not in jaxsub.to_arviz(trace).sample_stats  # no N, no share
    ess = az.ess(idata)["x"].values
    assert ess.shape == (3,) and np.all(ess > 0.5 * CHAINS * DRAWS)


def test_plot_trace_and_warmup_groups():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    idata = jaxsub.to_arviz(racing_trace(d=2), num_warmup=50, attrs={"sampler": "racing_mh"})
    assert idata.posterior["x"].shape == (CHAINS, DRAWS - 50, 2)
    assert idata.warmup_posterior["x"].shape == (CHAINS, 50, 2)
    assert idata.warmup_sample_stats["acceptance_rate"].shape == (CHAINS, 50)
    assert idata.posterior.attrs["sampler"] == "racing_mh"
    axes = az.plot_trace(idata, var_names=["x"])
    assert axes.shape == (1, 2)
    plt.close("all")


def test_dict_positions_full_states_and_nuts_names():
    import blackjax

    def logdensity(p):
        return -0.5 * (jnp.sum(p["a"] ** 2) + p["b"] ** 2)

    algo = blackjax.nuts(logdensity, step_size=0.8, inverse_mass_matrix=jnp.ones(3))
    starts = jax.vmap(algo.init)({"a": jnp.zeros((CHAINS, 2)), "b": jnp.zeros(CHAINS)})
    trace = jaxsub.run_chains(jax.random.key(0), algo, starts, 60)  # full State and Info kept
    idata = jaxsub.to_arviz(trace)
    assert idata.posterior["a"].shape == (CHAINS, 60, 2) and idata.posterior["b"].shape == (CHAINS, 60)
    stats = set(idata.sample_stats.data_vars)
    assert {"acceptance_rate", "diverging", "n_steps", "tree_depth", "energy"} <= stats
    assert not {"momentum", "trajectory_leftmost_state"} & stats  # pytrees of several arrays are left out


def test_run_chain_trace_needs_chain_axis_false():
    trace = racing_trace()
    single = jaxsub.ChainTrace(None, trace.states[0], jax.tree.map(lambda a: a[0], trace.infos))
    with pytest.raises(ValueError, match="more chains \\(200\\) than draws \\(3\\).*chain_axis=False"):
        jaxsub.to_arviz(single)
    idata = jaxsub.to_arviz(single, chain_axis=False)
    assert idata.posterior["x"].shape == (1, DRAWS, 3)


def test_wrong_axes_raise_named_errors():
    trace = racing_trace()
    short = trace.infos._replace(has_nan=trace.infos.has_nan[:, :10])
    with pytest.raises(
        ValueError, match="sample_stats 'has_nan' must have leading axes \\[chains, draws\\] = \\(4, 200\\)"
    ):
        jaxsub.to_arviz(trace._replace(infos=short))
    with pytest.raises(ValueError, match="posterior 'x\\[1\\]' must have leading axes"):
        jaxsub.to_arviz(jaxsub.ChainTrace(None, (trace.states, trace.states[:, :5]), None))
    with pytest.raises(ValueError, match="posterior 'x' must have leading axes \\[chains, draws, ...\\]"):
        jaxsub.to_arviz(jaxsub.ChainTrace(None, np.zeros(10), None))
    with pytest.raises(ValueError, match="num_warmup must be"):
        jaxsub.to_arviz(trace, num_warmup=DRAWS)
    with pytest.raises(ValueError, match="trace must be a jaxsub.ChainTrace"):
        jaxsub.to_arviz(trace.states)
    rng = np.random.default_rng(1)
    group = rng.integers(0, 5, size=50).astype(np.int32)
    model = jaxsub.models.from_numpyro(hierarchical_model, 5, data={"group": group, "y": rng.normal(size=50)})
    with pytest.raises(ValueError, match="positions must be \\[chains, draws, d = 8\\]"):
        jaxsub.to_arviz(trace, model)
