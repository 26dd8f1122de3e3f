"""Shared pytest configuration: strict dtype promotion and fixed seeds.

Strict promotion (``jax.numpy_dtype_promotion('strict')``) turns silent
int/float or float32/float64 mixing inside a sampler into an error, so a
sampler that works in float32 does not quietly compute in float64 (or the
reverse). Python scalars stay weakly typed and are allowed.

One run of the suite shares a JAX persistent compilation cache between its xdist
workers and the subprocesses its tests start (documentation blocks, kill-and-resume
runs, multi-device scripts): a program compiled by one is loaded by the others. The
cache lives in a fresh temporary folder per run (``JAXSUB_TEST_COMPILATION_CACHE``
overrides it, ``off`` disables it) and is removed at the end, so no run starts warm.
"""

import os
import shutil
import tempfile
from pathlib import Path

_CACHE_SETTING = os.environ.get("JAXSUB_TEST_COMPILATION_CACHE", "")
if _CACHE_SETTING != "off":
    os.environ.setdefault("JAXSUB_TEST_RUN_ID", str(os.getpid()))  # set by the controller, inherited by workers
    _CACHE_DIR = (
        Path(_CACHE_SETTING or tempfile.gettempdir()) / f"jaxsub-test-jax-cache-{os.environ['JAXSUB_TEST_RUN_ID']}"
    )
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(_CACHE_DIR)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.3"

import jax  # noqa: E402  (after the cache settings, which jax reads at import)
import pytest  # noqa: E402

if _CACHE_SETTING != "off":
    jax.config.update("jax_compilation_cache_dir", str(_CACHE_DIR))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.3)


def pytest_sessionfinish(session, exitstatus):
    """The process that chose the run's id (the controller) removes its compilation cache."""
    if _CACHE_SETTING != "off" and os.environ["JAXSUB_TEST_RUN_ID"] == str(os.getpid()):
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def strict_dtype_promotion():
    with jax.numpy_dtype_promotion("strict"):
        yield


@pytest.fixture
def rng_key():
    """A fixed PRNG key: every statistical test is reproducible."""
    return jax.random.key(20261122)
