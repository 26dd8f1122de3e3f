"""Synthetic racing problems with a known exact distribution (paper §5.1 style).

Rewards ``l_{i,n}`` are drawn from a population (normal, uniform, lognormal),
then standardised per arm *exactly* (empirical mean 0, sd 1) and rescaled to
``log(p_i) / N + sigma * z_{i,n}``, so that ``sum_n l_{i,n} = log p_i`` and the
exact target with ``log f0 = 0`` is ``p`` itself, whatever sigma.
"""
from __future__ import annotations

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
