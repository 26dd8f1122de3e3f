"""Synthetic racing problems with a known exact distribution (paper §5.1 style).

Rewards ``l_{i,n}`` are drawn from a population (normal, uniform, lognormal),
then standardised per arm *exactly* (empirical mean 0, sd 1) and rescaled to
``log(p_i) / N + sigma * z_{i,n}``, so that ``sum_n l_{i,n} = log p_i`` and the
exact target with ``log f0 = 0`` is ``p`` itself, whatever sigma.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def standardised(rng, dist: str, shape) -> np.ndarray:
    if dist == "normal":
        z = rng.standard_normal(shape)
    elif dist == "uniform":
        z = rng.uniform(0.0, 1.0, shape)
    elif dist == "lognormal":
        z = rng.lognormal(0.0, 2.0, shape)
    else:
        raise ValueError(dist)
    z = z - z.mean(axis=0, keepdims=True)
    return z / z.std(axis=0, keepdims=True)


def reward_table(probs, num_data: int, sigma: float, dist: str = "normal", seed: int = 0, correlated: float = 0.0):
    """``[N, D]`` float64 table with ``sum_n table[n, i] = log p_i`` exactly (up to round-off).

    ``correlated`` in [0, 1) mixes a shared per-datum component into every arm
    (positively correlated arms, the typical Bayesian case where pairwise
    variances pay off).
    """
    rng = np.random.default_rng(seed)
    probs = np.asarray(probs, np.float64)
    D = probs.size
    z = standardised(rng, dist, (num_data, D))
    if correlated:
        common = standardised(rng, dist, (num_data, 1))
        z = np.sqrt(1 - correlated**2) * z + correlated * common
        z = z - z.mean(axis=0, keepdims=True)
    table = np.log(probs)[None, :] / num_data + sigma * z
    # Re-centre in float64 so the sums are exactly log p (the exact target).
    table += (np.log(probs) - table.sum(axis=0))[None, :] / num_data
    return table


def exact_probs(table: np.ndarray, log_f0=None) -> np.ndarray:
    w = np.asarray(table, np.float64).sum(axis=0)
    if log_f0 is not None:
        w = w + np.asarray(log_f0, np.float64)
    w = w - w.max()
    p = np.exp(w)
    return p / p.sum()


def factor_fn(table, dtype=jnp.float32):
    t = jnp.asarray(table, dtype)
    return lambda idx: t[idx]


# --------------------------------------------------------------------------- one compiled small race
#: The small configuration shared by the jit / vmap / retracing / pinned-draw tests of
#: tests/test_discrete.py and tests/test_discrete_batch.py: N = 400, D = 3, delta = 0.05,
#: one chunk size (max_block_size = m1 = 50), no exact pass. The table is a jit *argument*, so
#: every table of this shape is raced by the same two compiled programs (single and vmapped).
SMALL_N, SMALL_D = 400, 3
SMALL_OPTIONS = dict(delta=0.05, max_block_size=50, exact_pass_cost=None, group_size=4, block_size=1)


def small_racing(table):
    """``racing`` on ``table`` [400, 3] in the shared small configuration (a traceable table)."""
    from jaxsub import discrete

    return discrete.racing(lambda idx: table[idx], SMALL_D, SMALL_N, **SMALL_OPTIONS)


@functools.cache
def small_racing_jitted():
    """``(single, vmapped)``: ``single(key, table, log_f0)`` and ``vmapped(keys [B], table, log_f0s [B, D])``,
    jitted once per process (a second table or new keys reuse the compiled programs)."""
    single = jax.jit(lambda key, table, log_f0: small_racing(table)(key, log_f0))
    vmapped = jax.jit(jax.vmap(lambda key, table, log_f0: small_racing(table)(key, log_f0), in_axes=(0, None, 0)))
    return single, vmapped
