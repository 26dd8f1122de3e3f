"""Tests of the shared conventions: chain drivers, validation, subsampling."""

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_follows_sampling_api, assert_mean_matches, assert_variance_matches
from scipy import stats

import jaxsub
from jaxsub import validation
from jaxsub.subsample import permutation_indices


def _rwmh(scale=1.0):
    return blackjax.additive_step_random_walk(
        lambda x: -0.5 * jnp.sum(x**2), blackjax.mcmc.random_walk.normal(jnp.asarray(scale))
    )


def test_run_chain_matches_manual_loop(rng_key):
    algo = _rwmh()
    state = algo.init(jnp.zeros(2))
    trace = jaxsub.run_chain(
        rng_key, algo, state, 25, transform=lambda s, i: s.position, info_transform=lambda s, i: i.is_accepted
    )
    keys = jax.random.split(rng_key, 25)
    manual = state
    for k in keys:
        manual, _ = algo.step(k, manual)
    np.testing.assert_allclose(trace.final_state.position, manual.position, rtol=1e-6)
    np.testing.assert_allclose(trace.states[-1], manual.position, rtol=1e-6)
    assert trace.states.shape == (25, 2) and trace.infos.shape == (25,)


def test_run_chain_progress_bar_same_result(rng_key):
    algo = _rwmh()
    state = algo.init(jnp.zeros(2))
    plain = jaxsub.run_chain(rng_key, algo, state, 40, transform=lambda s, i: s.position)
    bar = jaxsub.run_chain(
        rng_key, algo, state, 40, transform=lambda s, i: s.position, progress_bar=True, num_progress_updates=7
    )
    np.testing.assert_allclose(plain.states, bar.states, rtol=1e-6)
    assert plain.infos is None


def test_run_chains_vmap_matches_single_chains(rng_key):
    algo = _rwmh()
    positions = jnp.stack([jnp.zeros(2), jnp.ones(2), -jnp.ones(2)])
    states = jax.vmap(algo.init)(positions)
    trace = jaxsub.run_chains(rng_key, algo, states, 30, transform=lambda s, i: s.position)
    assert trace.states.shape == (3, 30, 2)
    chain_keys = jax.random.split(rng_key, 3)
    for c in range(3):
        single = jaxsub.run_chain(chain_keys[c], algo, algo.init(positions[c]), 30, transform=lambda s, i: s.position)
        np.testing.assert_allclose(trace.states[c], single.states, rtol=1e-5, atol=1e-6)
    bar = jaxsub.run_chains(
        rng_key, algo, states, 30, transform=lambda s, i: s.position, progress_bar=True, num_progress_updates=4
    )
    np.testing.assert_allclose(trace.states, bar.states, rtol=1e-6)


def test_run_chain_keeps_tuple_positions_whole(rng_key):
    """A transform returning a tuple (e.g. a position (w, b)) is kept whole in ``states``."""
    logdensity = lambda p: -0.5 * (jnp.sum(p[0] ** 2) + p[1] ** 2)  # noqa: E731
    algo = blackjax.mala(logdensity, 0.3)
    state = algo.init((jnp.zeros(2), jnp.asarray(0.0)))
    trace = jaxsub.run_chain(rng_key, algo, state, 20, transform=lambda s, i: s.position)
    w, b = trace.states
    assert w.shape == (20, 2) and b.shape == (20,) and trace.infos is None
    full = jaxsub.run_chain(rng_key, algo, state, 20)
    assert isinstance(full.states, type(state)) and hasattr(full.infos, "is_accepted")
    np.testing.assert_allclose(full.states.position[0], w, rtol=1e-6)
    chains = jax.vmap(algo.init)((jnp.zeros((3, 2)), jnp.zeros(3)))
    multi = jaxsub.run_chains(
        rng_key, algo, chains, 20, transform=lambda s, i: s.position, info_transform=lambda s, i: i.is_accepted
    )
    assert multi.states[0].shape == (3, 20, 2) and multi.states[1].shape == (3, 20) and multi.infos.shape == (3, 20)


def test_drivers_reject_bad_input(rng_key):
    algo = _rwmh()
    with pytest.raises(ValueError, match="num_steps must be an integer"):
        jaxsub.run_chain(rng_key, algo, algo.init(jnp.zeros(2)), 0)
    with pytest.raises(ValueError, match="algorithm must be a SamplingAlgorithm"):
        jaxsub.run_chain(rng_key, object(), algo.init(jnp.zeros(2)), 3)
    with pytest.raises(ValueError, match="leading num_chains axis"):
        jaxsub.run_chains(rng_key, algo, algo.init(jnp.zeros(2)), 3)


def test_check_hyperparameter_checks_concrete_and_passes_tracers():
    with pytest.raises(ValueError, match=r"step_size must be in \(0, inf\); got -1"):
        validation.check_hyperparameter("step_size", -1.0, low=0)
    with pytest.raises(ValueError, match="step_size"):
        validation.check_hyperparameter("step_size", jnp.asarray(float("nan")), low=0)
    value = jnp.asarray(0.5, jnp.float32)
    assert validation.check_hyperparameter("step_size", value, low=0) is value
    out = jax.vmap(lambda h: validation.check_hyperparameter("step_size", h, low=0) * 2)(jnp.asarray([0.1, 0.2]))
    np.testing.assert_allclose(out, [0.2, 0.4])


def test_statistical_helpers_accept_truth_and_reject_bias(rng_key):
    """The MCSE-based assertions pass on N(0,1) chains and fail on a biased target."""
    algo = _rwmh(2.4)
    states = jax.vmap(algo.init)(jnp.zeros((4, 1)))
    trace = jaxsub.run_chains(rng_key, algo, states, 4000, transform=lambda s, i: s.position)
    assert_mean_matches(trace.states, jnp.zeros(1))
    assert_variance_matches(trace.states, jnp.ones(1))
    with pytest.raises(AssertionError):
        assert_mean_matches(trace.states, jnp.full(1, 0.3))
    with pytest.raises(AssertionError, match="ESS gate"):
        assert_mean_matches(trace.states[:, :50], jnp.zeros(1))


def test_blackjax_algorithm_follows_api(rng_key):
    assert_follows_sampling_api(_rwmh(), jnp.zeros(2), rng_key)


@pytest.mark.parametrize("num_items", [1, 2, 3, 7, 64, 1000, 4097])
def test_permutation_is_bijection(num_items):
    for seed in range(3):
        perm = np.asarray(permutation_indices(jax.random.key(seed), jnp.arange(num_items), num_items))
        assert sorted(perm.tolist()) == list(range(num_items))


def test_permutation_is_uniform():
    """First-position frequencies and pair co-inclusion are uniform within MC error."""
    n, m, reps = 20, 5, 4000
    keys = jax.random.split(jax.random.key(1), reps)
    batches = np.asarray(jax.vmap(lambda k: permutation_indices(k, jnp.arange(m), n))(keys))
    # inclusion counts: each index lands in the first m positions with prob m/n
    counts = np.bincount(batches.ravel(), minlength=n)
    stat = ((counts - reps * m / n) ** 2 / (reps * m / n)).sum()
    assert stats.chi2.sf(stat, n - 1) > 1e-4
    first = np.bincount(batches[:, 0], minlength=n)
    stat = ((first - reps / n) ** 2 / (reps / n)).sum()
    assert stats.chi2.sf(stat, n - 1) > 1e-4
    # batches never repeat an index (without replacement)
    assert all(len(set(b.tolist())) == m for b in batches)


def test_permutation_large_population_cheap():
    jitted = jax.jit(lambda k, t: permutation_indices(k, t, 10**7))
    out = np.asarray(jitted(jax.random.key(0), jnp.arange(10_000)))
    assert out.min() >= 0 and out.max() < 10**7 and np.unique(out).size == 10_000


def test_validation_messages():
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\); got 1.5"):
        validation.check_real("delta", 1.5, low=0, high=1)
    with pytest.raises(ValueError, match=r"batch_size must be an integer in \[2, 10\]; got 1"):
        validation.check_int("batch_size", 1, low=2, high=10)
    with pytest.raises(ValueError, match="bound must be one of 'normal', 'ebs'; got 'foo'"):
        validation.check_choice("bound", "foo", ("normal", "ebs"))
    with pytest.raises(ValueError, match="shard_probs must sum to 1"):
        validation.check_probability_vector("shard_probs", [0.5, 0.6])
    with pytest.raises(ValueError, match="non-negative"):
        validation.check_probability_vector("shard_probs", [1.5, -0.5])
    with pytest.raises(ValueError, match="NaN/inf"):
        validation.check_finite_array("x", np.array([[1.0, np.nan]]))
    with pytest.raises(ValueError, match="at least 1 row"):
        validation.check_finite_array("x", np.zeros((0, 3)))
    assert validation.check_int("n", np.int64(3), low=1) == 3
    with pytest.raises(ValueError):
        validation.check_int("n", True)
