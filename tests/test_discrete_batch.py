"""Batched racing: ``racing(...).batched`` and ``racing_batch`` (per-draw params).

The batched path runs the single-draw stage bodies on groups of unfinished
draws only, so each draw must be *the same draw* as the single-draw sampler
with the same key (x and every counter), and the empirical law of many batched
draws must be within delta (plus Monte Carlo error) of the exact p in total
variation, as for single draws (tests/test_discrete.py).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from discrete_problems import SMALL_D, SMALL_N, exact_probs, factor_fn, reward_table, small_racing, small_racing_jitted
from helpers import assert_tv_within, variants

from jaxsub import discrete

NUM_DRAWS = 20_000


def _as_np(tree):
    return jax.tree.map(np.asarray, tree)


def _assert_same_draws(a, b):
    (xa, ia), (xb, ib) = _as_np(a), _as_np(b)
    np.testing.assert_array_equal(xa, xb)
    for name in ("num_evaluations", "num_data_used", "num_stages", "is_exact", "has_nan", "num_alive"):
        np.testing.assert_array_equal(getattr(ia, name), getattr(ib, name), err_msg=name)


@pytest.mark.parametrize("variance", ["pairwise", pytest.param("marginal", marks=pytest.mark.slow)])
def test_batched_within_delta_in_tv(rng_key, variance):
    probs = [0.1, 0.35, 0.3, 0.15, 0.1]
    N, D, delta = 4000, 5, 0.05
    table = reward_table(probs, N, 4e-3, seed=2)
    # max_block_size=200: two chunk sizes (50, 200), so few loops to compile.
    sample = discrete.racing(factor_fn(table), D, N, delta=delta, variance=variance, max_block_size=200)
    keys = jax.random.split(rng_key, NUM_DRAWS)
    log_f0s = jnp.zeros((NUM_DRAWS, D), jnp.float32)
    x, info = _as_np(jax.jit(sample.batched)(keys, log_f0s))
    assert x.shape == (NUM_DRAWS,) and info.num_evaluations.shape == (NUM_DRAWS,)
    assert np.all(info.num_evaluations <= N * D) and not info.has_nan.any()
    # Draws finish at different stages (else the batching would be untested) and
    # eliminate (else the TV check would be vacuous).
    assert len(np.unique(info.num_stages)) >= 3
    assert info.num_evaluations.mean() < 0.8 * N * D
    assert_tv_within(x, exact_probs(table), slack=delta)


def test_racing_batch_per_draw_params_within_delta(rng_key):
    """Two targets in one batch (params tilt the log-factors); each draw's law
    matches its own target."""
    probs = np.array([0.1, 0.35, 0.3, 0.15, 0.1])
    N, D, delta = 4000, 5, 0.05
    table = reward_table(probs, N, 4e-3, seed=3)
    tilt = np.array([1.5, -1.0, 0.0, 0.5, 0.0])
    t, tilt_j = jnp.asarray(table, jnp.float32), jnp.asarray(tilt / N, jnp.float32)

    def fn(idx, p):  # target p_b(i) ∝ probs_i exp(p_b tilt_i)
        return t[idx] + p * tilt_j[None, :]

    sample = discrete.racing_batch(fn, D, N, delta=delta, group_size=8, max_block_size=200)
    keys = jax.random.split(rng_key, NUM_DRAWS)
    params = jnp.asarray(np.arange(NUM_DRAWS) % 2, jnp.float32)  # interleaved: groups mix the targets
    x, info = _as_np(jax.jit(sample)(keys, jnp.zeros((NUM_DRAWS, D), jnp.float32), params))
    assert np.all(info.num_evaluations <= N * D) and not info.has_nan.any()
    assert info.num_evaluations.mean() < 0.8 * N * D
    for p in (0, 1):
        assert_tv_within(x[p::2], exact_probs(table + p * tilt[None, :] / N), slack=delta)


def test_batched_equals_vmap_of_single_draws_jit_nojit_no_retracing(rng_key):
    """Shared target: ``sample.batched`` returns, draw by draw, what ``jax.vmap(sample)``
    does, with and without jit; the jitted batch is traced once for new keys / log_f0s.
    (The shared small race of tests/discrete_problems.py: its vmapped program is compiled once.)"""
    B = 16
    table = jnp.asarray(reward_table([0.2, 0.5, 0.3], SMALL_N, 4e-3, seed=12), jnp.float32)
    _, reference = small_racing_jitted()
    batched = variants(chex.assert_max_traces(lambda keys, log_f0s: small_racing(table).batched(keys, log_f0s), n=1))
    for i in range(2):
        keys = jax.random.split(jax.random.fold_in(rng_key, i), B)
        log_f0s = jnp.zeros((B, SMALL_D), jnp.float32).at[:, 0].set(jnp.linspace(-1, 1, B) + i)
        ref = reference(keys, table, log_f0s)
        assert len(np.unique(np.asarray(ref[1].num_stages))) >= 2
        _assert_same_draws(batched["with_jit"](keys, log_f0s), ref)
        if i == 0:
            _assert_same_draws(batched["without_jit"](keys, log_f0s), ref)
    chex.clear_trace_counter()


def test_batched_with_coefficients_equals_vmapped_with_coefficients(rng_key):
    """Thresholds as arguments (one compiled sampler for many deltas): the batched
    entry point gives the draws of the vmapped single-draw one."""
    N, D, B = 400, 3, 8
    table = reward_table([0.2, 0.5, 0.3], N, 4e-3, seed=13)
    sample = discrete.racing(
        factor_fn(table), D, N, delta=0.5, max_block_size=50, gumbel_noise=False, exact_pass_cost=None
    )
    keys = jax.random.split(rng_key, B)
    log_f0s = jax.random.gumbel(jax.random.fold_in(rng_key, 1), (B, D), jnp.float32)
    # One jitted function per path, built once: both deltas reuse their compiled programs
    # (a jax.jit(jax.vmap(...)) built inside the loop would compile a second time).
    vmapped = jax.jit(jax.vmap(sample.with_coefficients, in_axes=(0, 0, None, None)))
    batched = jax.jit(sample.batched_with_coefficients)
    for delta in (0.01, 0.2):
        a, b = (jnp.asarray(v, jnp.float32) for v in discrete.racing_coefficients(delta, D, N, 50))
        _assert_same_draws(batched(keys, log_f0s, a, b), vmapped(keys, log_f0s, a, b))
    assert vmapped._cache_size() == 1 and batched._cache_size() == 1


def test_batched_compact_states_and_control_variate_equal_single(rng_key):
    """The compact (K surviving arms) loops and a per-draw control variate with a
    params-dependent mean go through the batched path draw for draw like the
    single-draw sampler; B = 37 is not a multiple of the group size."""
    probs = np.exp(-0.3 * np.arange(8))
    N, D, B = 2000, 8, 37
    table = reward_table(probs / probs.sum(), N, 3e-3, seed=15)
    t = jnp.asarray(table, jnp.float32)
    h = 0.5 * t  # a crude control variate with a known mean, shifted per draw
    h_mean = jnp.mean(h, axis=0)
    cv = (lambda idx, p: h[idx] + p, lambda p: h_mean + p)
    sample = discrete.racing_batch(
        lambda idx, p: t[idx],
        D,
        N,
        delta=0.05,
        group_size=4,
        control_variate=cv,
        max_block_size=50,
        exact_pass_cost=None,
        log_factor_states_fn=lambda idx, states, p: t[idx[:, None], states[None, :]],
        num_compact_states=3,
    )
    keys = jax.random.split(rng_key, B)
    log_f0s = 0.3 * jax.random.normal(jax.random.key(1), (B, D), jnp.float32)
    params = jnp.linspace(-1.0, 1.0, B, dtype=jnp.float32)
    out = jax.jit(sample)(keys, log_f0s, params)
    ref = jax.jit(jax.vmap(sample.single))(keys, log_f0s, params)
    _assert_same_draws(out, ref)
    info = _as_np(out[1])
    assert info.num_evaluations.mean() < 0.5 * N * D and len(np.unique(info.num_stages)) >= 2


def test_batched_bad_inputs():
    N, D = 100, 3
    t = jnp.zeros((N, D), jnp.float32)
    with pytest.raises(ValueError, match="group_size"):
        discrete.racing_batch(lambda idx, p: t[idx], D, N, delta=0.1, group_size=0)
    sample = discrete.racing_batch(lambda idx, p: t[idx] + p, D, N, delta=0.1)
    keys = jax.random.split(jax.random.key(0), 4)
    with pytest.raises(ValueError, match="log_f0s"):
        sample(keys, jnp.zeros((4, D + 1), jnp.float32), jnp.zeros(4, jnp.float32))
    with pytest.raises(ValueError, match="leading axis"):
        sample(keys, jnp.zeros((4, D), jnp.float32), jnp.zeros(5, jnp.float32))


def test_first_stage_equals_the_generic_first_round():
    """``first_stage`` (the batched path's straight-line first stage) computes what the stage body's
    first iteration computes, race by race: same alive sets, decisions, counters and stages, moments
    equal up to float rounding; including a ``-inf`` reward (a zero factor), a ``-inf`` ``log f0``
    and a race decided at initialisation (one state left), which must keep its state."""
    import functools

    from jaxsub.racing.batching import first_round
    from jaxsub.racing.config import build_config, race_options
    from jaxsub.racing.engine import loop_specs
    from jaxsub.racing.stage import first_stage, has_first_stage, init_race

    N, D, B = 1000, 5, 24
    table = jnp.asarray(reward_table([0.1, 0.35, 0.3, 0.15, 0.1], N, 2e-2, seed=4), jnp.float32).at[7, 2].set(-jnp.inf)
    fn = lambda idx: table[idx]  # noqa: E731
    cfg, a, b = build_config(fn, D, N, delta=0.05, options=race_options(None, {}, "racing"), with_params=False)
    assert has_first_stage(cfg)
    lf0 = jnp.zeros((B, D)).at[3, 1].set(-jnp.inf).at[5, 1:].set(-jnp.inf)  # draw 5: one state left
    states, ctxs = jax.vmap(functools.partial(init_race, cfg), in_axes=(0, 0, None, None, None))(
        jax.random.split(jax.random.key(4), B), lf0, None, a, b
    )
    generic = _as_np(jax.jit(lambda s, c: first_round(loop_specs(cfg)[0], s, c))(states, ctxs))
    fast = _as_np(jax.jit(lambda s, c: first_stage(cfg, s, c))(states, ctxs))
    assert generic.done[5] and fast.count[5] == 0  # decided at initialisation: left alone
    for name in ("count", "alive", "done", "has_nan", "num_evaluations", "stage", "exact_pass"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(generic, name), err_msg=name)
    for name in ("mean_d", "m2", "m3"):
        np.testing.assert_allclose(getattr(fast, name), getattr(generic, name), rtol=1e-4, atol=1e-6, err_msg=name)
