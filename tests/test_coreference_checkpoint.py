"""Checkpoint and resume of :func:`jaxsub.coreference.fit`: a run killed after a checkpoint resumes to the same draws."""

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxsub import checkpoint
from jaxsub import coreference as co

ROOT = Path(__file__).resolve().parent.parent
NUM_SWEEPS = 30

# The run: the same in the killed subprocess, the resumed run and the uninterrupted reference.
SCRIPT = """
import sys, time
import jax, jax.numpy as jnp, numpy as np
from jaxsub import coreference as co

def factor(xi, xj):
    return 2.0 - 4.0 * jnp.abs(xi["x"] - xj["x"])

def problem():
    rng = np.random.default_rng(3)
    keys = np.repeat([0, 1, 2], [30, 20, 5])
    x = (rng.integers(0, 4, keys.size) + 10 * keys) * 0.3 + rng.normal(0.0, 0.05, keys.size)
    return co.make_blocks(keys), {"x": jnp.asarray(x, jnp.float32)}

BETAS = np.linspace(0.5, 3.0, @NUM_SWEEPS@).astype(np.float32)

if __name__ == "__main__":
    blocks, mentions = problem()
    # slow sweeps (a sleeping callback), so that the parent kills the run between two checkpoints
    co.fit(jax.random.key(9), factor, mentions, blocks, BETAS, exact=True, checkpoint_dir=sys.argv[1],
           checkpoint_every=2, callback=lambda s, labels: time.sleep(0.3))
""".replace("@NUM_SWEEPS@", str(NUM_SWEEPS))


@pytest.fixture(scope="module")
def run_module(tmp_path_factory):
    path = tmp_path_factory.mktemp("coref_run") / "coref_run.py"
    path.write_text(SCRIPT)
    spec = importlib.util.spec_from_file_location("coref_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, vars(module)


def _fit(ns, **kw):
    blocks, mentions = ns["problem"]()
    return co.fit(jax.random.key(9), ns["factor"], mentions, blocks, ns["BETAS"], exact=True, **kw)


def _assert_same_run(a, b):
    (state_a, trace_a), (state_b, trace_b) = a, b
    for name, x, y in zip(co.CorefState._fields, state_a, state_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)
    for name in ("labels", "num_evaluations", "num_races", "num_exact", "num_nan", "num_errors", "num_checked"):
        got, want = getattr(trace_a, name), getattr(trace_b, name)
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_killed_run_resumes_to_the_uninterrupted_draws(run_module, tmp_path):
    script, ns = run_module
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ckpt)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while checkpoint.latest_step(ckpt) is None:
            assert proc.poll() is None, f"the run ended before its first checkpoint: {proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, "no checkpoint after 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    saved = checkpoint.latest_step(ckpt)
    assert 0 < saved < NUM_SWEEPS  # killed mid-run: the resumed run has sweeps left to do
    seen = []
    resumed = _fit(ns, checkpoint_dir=ckpt, checkpoint_every=2, callback=lambda s, labels: seen.append(s))
    assert seen == list(range(saved, NUM_SWEEPS))  # only the remaining sweeps ran
    reference = _fit(ns)
    _assert_same_run(resumed, reference)
    assert checkpoint.latest_step(ckpt) == NUM_SWEEPS
    # a finished run resumes to its end without a sweep
    _assert_same_run(_fit(ns, checkpoint_dir=ckpt, callback=lambda s, labels: seen.append(-1)), reference)
    assert -1 not in seen


def test_checkpoint_of_another_run_or_bad_interval_refused(run_module, tmp_path):
    _, ns = run_module
    blocks, mentions = ns["problem"]()
    betas = ns["BETAS"][:2]
    co.fit(jax.random.key(9), ns["factor"], mentions, blocks, betas, exact=True, checkpoint_dir=tmp_path)
    for changed in ({"rng_key": jax.random.key(10)}, {"temperatures": betas * 2}, {"exact": False}):
        args = {"rng_key": jax.random.key(9), "temperatures": betas, "exact": True, **changed}
        with pytest.raises(ValueError, match="different run"):
            co.fit(
                args["rng_key"],
                ns["factor"],
                mentions,
                blocks,
                args["temperatures"],
                exact=args["exact"],
                checkpoint_dir=tmp_path,
            )
    with pytest.raises(ValueError, match="checkpoint_every"):
        co.fit(
            jax.random.key(9), ns["factor"], mentions, blocks, betas, checkpoint_dir=tmp_path / "x", checkpoint_every=0
        )
