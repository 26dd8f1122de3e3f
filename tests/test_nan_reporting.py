"""NaN and impossible targets are never returned as plausible states, and drivers say so.

* the discrete samplers return ``INVALID_STATE`` (-1) whenever ``info.has_nan`` is set;
* ``jaxsub.base.checked`` raises under ``jit`` (checkify) when a problem flag is set;
* ``run_chain`` / ``run_chains`` warn at the end of a run with flagged steps (how many steps
  and chains), and raise at the flagged step with ``checked=True``.
"""

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import jaxsub
from jaxsub import discrete
from jaxsub.base import InvalidStateError, checked
from jaxsub.racing.info import INVALID_STATE

N, D = 200, 3


def _table(seed=0):
    return np.random.default_rng(seed).normal(size=(N, D)).astype(np.float32) * 0.01


def _fn(table):
    table = jnp.asarray(table)
    return lambda idx: table[idx]


def _impossible(idx):
    return jnp.full((idx.shape[0], D), -jnp.inf, jnp.float32)


SAMPLERS = {
    "gumbel_max": lambda f: discrete.gumbel_max(f, D, N),
    "racing": lambda f: discrete.racing(f, D, N, delta=0.1),
    "lil_ucb": lambda f: discrete.lil_ucb(f, D, N, delta=0.1, reward_range=1.0),
}


@pytest.mark.parametrize("which", sorted(SAMPLERS))
def test_one_nan_datum_gives_invalid_state(rng_key, which):
    """One NaN datum (read by every exact draw) used to give state 0 for every key."""
    table = _table()
    table[7, :] = np.nan
    keys = jax.random.split(rng_key, 16)
    x, info = jax.jit(jax.vmap(SAMPLERS[which](_fn(table)), in_axes=(0, None)))(keys, jnp.zeros(D, jnp.float32))
    x, flagged = np.asarray(x), np.asarray(info.has_nan)
    if which == "gumbel_max":
        assert flagged.all()
    assert flagged.any()
    np.testing.assert_array_equal(x[flagged], INVALID_STATE)
    assert np.all((x[~flagged] >= 0) & (x[~flagged] < D))


@pytest.mark.parametrize("which", sorted(SAMPLERS))
def test_all_impossible_gives_invalid_state(rng_key, which):
    """Every factor -inf: no state has positive probability; the old samplers returned 0."""
    x, info = SAMPLERS[which](_impossible)(rng_key, jnp.zeros(D, jnp.float32))
    assert bool(info.has_nan) and int(x) == INVALID_STATE


def test_ragged_impossible_and_bad_beta_flagged(rng_key):
    sample = discrete.racing_ragged(_impossible, D, N, delta=0.1)
    pops = jnp.full((D,), N, jnp.int32)
    x, info = sample(rng_key, jnp.zeros(D, jnp.float32), pops)
    assert bool(info.has_nan) and int(x) == INVALID_STATE
    # A traced beta <= 0 is flagged (a concrete one raises ValueError at the call).
    table = jnp.asarray(_table())
    ok = discrete.racing_ragged(lambda idx: table[idx, jnp.arange(D)], D, N, delta=0.1)  # idx [m, D]: per arm
    x, info = jax.jit(lambda b: ok(rng_key, jnp.zeros(D, jnp.float32), pops, b))(-1.0)
    assert bool(info.has_nan) and int(x) == INVALID_STATE


def test_traced_bad_beta_flagged_by_racing_and_gumbel(rng_key):
    for make in (SAMPLERS["racing"], SAMPLERS["gumbel_max"]):
        sample = make(_fn(_table()))
        x, info = jax.jit(lambda b: sample(rng_key, jnp.zeros(D, jnp.float32), b))(-2.0)
        assert bool(info.has_nan) and int(x) == INVALID_STATE
        x, info = jax.jit(lambda b: sample(rng_key, jnp.zeros(D, jnp.float32), b))(2.0)
        assert not bool(info.has_nan) and 0 <= int(x) < D


def test_checked_raises_under_jit(rng_key):
    table = _table()
    good = checked(jax.jit(discrete.gumbel_max(_fn(table), D, N)))
    x, _ = good(rng_key, jnp.zeros(D, jnp.float32))
    assert 0 <= int(x) < D
    table[3, 1] = np.nan
    bad = checked(jax.jit(discrete.gumbel_max(_fn(table), D, N)))
    with pytest.raises(checkify.JaxRuntimeError, match="has_nan"):
        bad(rng_key, jnp.zeros(D, jnp.float32))


class _Info(NamedTuple):
    has_nan: jax.Array


def _flagging_step(bad_steps):
    """A counter whose info flags the steps whose new state is in ``bad_steps``."""
    bad = jnp.asarray(bad_steps)

    def step(key, state):
        new = state + 1
        return new, _Info(jnp.any(new == bad))

    return step


def test_run_chain_warns_with_counts(rng_key):
    with pytest.warns(RuntimeWarning, match=r"info.has_nan was True at 2 of 10 steps \(first at step 3\)"):
        trace = jaxsub.run_chain(rng_key, _flagging_step([4, 8]), jnp.asarray(0), 10)
    assert int(trace.final_state) == 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jaxsub.run_chain(rng_key, _flagging_step([40]), jnp.asarray(0), 10)
        # Flags are read from the raw info even when only a transform is kept.
    with pytest.warns(RuntimeWarning, match="at 1 of 10 steps"):
        jaxsub.run_chain(rng_key, _flagging_step([5]), jnp.asarray(0), 10, transform=lambda s, i: s)


def test_run_chains_warns_with_chain_count(rng_key):
    starts = jnp.asarray([0, 100, 200])  # only chain 0 passes 4 and 8
    with pytest.warns(RuntimeWarning, match="at 2 of 30 steps, in 1 of 3 chains"):
        jaxsub.run_chains(rng_key, _flagging_step([4, 8]), starts, 10)


def test_run_chain_checked_raises_at_step(rng_key):
    with pytest.raises(InvalidStateError, match=r"run_chain: info.has_nan was True at step 3: "):
        jaxsub.run_chain(rng_key, _flagging_step([4, 8]), jnp.asarray(0), 10, checked=True)
    trace = jaxsub.run_chain(rng_key, _flagging_step([40]), jnp.asarray(0), 10, checked=True)
    assert int(trace.final_state) == 10


def test_racing_gibbs_chain_with_nan_warns(rng_key):
    """End to end: a Gibbs chain on a table with a NaN datum warns at the end of the run."""
    table = _table()
    table[0, :] = np.nan
    sample = discrete.gumbel_max(_fn(table), D, N)

    def step(key, state):
        x, info = sample(key, jnp.zeros(D, jnp.float32))
        return jnp.where(info.has_nan, state, x), info

    with pytest.warns(RuntimeWarning, match="at 5 of 5 steps"):
        trace = jaxsub.run_chain(rng_key, step, jnp.asarray(1, jnp.int32), 5)
    np.testing.assert_array_equal(trace.infos.has_nan, True)


def test_run_chains_checked_raises_and_racing_chains_check(rng_key):
    starts = jnp.asarray([0, 100, 200])
    with pytest.raises(InvalidStateError, match=r"run_chains: info.has_nan was True at step 3 \(chains \[0\]\)"):
        jaxsub.run_chains(rng_key, _flagging_step([4, 8]), starts, 10, checked=True)
    with pytest.raises(InvalidStateError, match="at step 7"):  # the first flagged step of a later chunk
        jaxsub.run_chain(
            rng_key, _flagging_step([8]), jnp.asarray(0), 10, checked=True, progress_bar=True, num_progress_updates=4
        )
    # A step with a while_loop (a race) under vmap over chains: checkified per chain.
    sample = discrete.racing(_fn(_table()), D, N, delta=0.1)

    def step(key, state):
        x, info = sample(key, jnp.zeros(D, jnp.float32))
        return x, info

    trace = jaxsub.run_chains(rng_key, step, jnp.zeros(2, jnp.int32), 3, checked=True)
    assert trace.states.shape == (2, 3)
