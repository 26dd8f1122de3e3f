"""Shared pytest configuration: strict dtype promotion and fixed seeds.

Strict promotion (``jax.numpy_dtype_promotion('strict')``) turns silent
int/float or float32/float64 mixing inside a sampler into an error, so a
sampler that works in float32 does not quietly compute in float64 (or the
reverse). Python scalars stay weakly typed and are allowed.
"""

import jax
import pytest


@pytest.fixture(autouse=True)
def strict_dtype_promotion():
    with jax.numpy_dtype_promotion("strict"):
        yield


@pytest.fixture
def rng_key():
    """A fixed PRNG key: every statistical test is reproducible."""
    return jax.random.key(20261122)
