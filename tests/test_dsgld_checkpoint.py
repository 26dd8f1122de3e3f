"""Checkpoint and resume of the multi-device CG-DSGLD drivers.

* ``jaxsub.sgmcmc.multi_device`` under ``jaxsub.run_chain(..., checkpoint_dir=...)``: a run
  killed (SIGKILL) after its first checkpoint and resumed gives bit for bit the rounds of an
  uninterrupted run;
* ``examples/multihost_dsgld.py --checkpoint-dir``: a run resumed from an earlier checkpoint
  (the newest one lost) writes the same draws as the uninterrupted run.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxsub import checkpoint

ROOT = Path(__file__).resolve().parent.parent
NUM_ROUNDS, EVERY = 12, 3

SCRIPT = """
import sys, time
import jax, jax.numpy as jnp, numpy as np
import jaxsub

CALLS = []


def _pause(x):
    CALLS.append(1)
    time.sleep(PAUSE)
    return x


def run(directory):
    rng = np.random.default_rng(0)
    shards = [(rng.normal(size=(n, 2)) + rng.uniform(-3, 3, size=2)).astype(np.float32) for n in (20, 30, 25)]
    sur = jaxsub.sgmcmc.gaussian_surrogates([x.mean(0) for x in shards], [len(x) * np.ones(2) for x in shards])
    algo = jaxsub.sgmcmc.multi_device(lambda t: -0.5 * jnp.sum(t**2) / 5.0, lambda t, x: -0.5 * jnp.sum((x - t) ** 2),
                                      shards, step_size=1e-3, batch_size=5, local_steps=3, surrogates=sur,
                                      chains_per_shard=2)

    def step(key, state):
        data = jax.random.key_data(key)
        data = jax.pure_callback(_pause, jax.ShapeDtypeStruct(data.shape, data.dtype), data)
        key = jax.random.wrap_key_data(data)
        return algo.step(key, state)

    state = algo.init(jnp.zeros((6, 2), jnp.float32))
    return jaxsub.run_chain(jax.random.key(3), step, state, NUM_ROUNDS, checkpoint_dir=directory,
                            checkpoint_every=EVERY, transform=lambda s, i: s, info_transform=lambda s, i: i.acted)
"""


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _namespace(pause):
    ns = {}
    exec(SCRIPT.replace("PAUSE", repr(pause)).replace("NUM_ROUNDS", str(NUM_ROUNDS)).replace("EVERY", str(EVERY)), ns)  # noqa: S102
    return ns


def _equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_multi_device_run_killed_and_resumed_is_bit_identical(tmp_path):
    directory = tmp_path / "ckpt"
    script = tmp_path / "run.py"
    body = SCRIPT.replace("PAUSE", "0.1").replace("NUM_ROUNDS", str(NUM_ROUNDS)).replace("EVERY", str(EVERY))
    script.write_text(
        body
        + textwrap.dedent(f"""
        run({str(directory)!r})
    """)
    )
    proc = subprocess.Popen([sys.executable, str(script)], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while checkpoint.latest_step(directory) is None:
            if proc.poll() is not None:
                pytest.fail(f"the run exited ({proc.returncode}) early: {proc.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "no checkpoint within 180 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    stopped = checkpoint.latest_step(directory)
    assert 0 < stopped < NUM_ROUNDS, stopped
    ns = _namespace(0.0)
    resumed = ns["run"](directory)
    assert len(ns["CALLS"]) == NUM_ROUNDS - stopped
    fresh = _namespace(0.0)["run"](tmp_path / "fresh")
    _equal(resumed, fresh)


@pytest.mark.multidevice
def test_multihost_example_resumes_to_the_same_draws(tmp_path):
    script = str(ROOT / "examples" / "multihost_dsgld.py")
    env = dict(_env(), XLA_FLAGS="--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false")
    common = [
        sys.executable,
        script,
        "--num-processes",
        "1",
        "--local-devices",
        "8",
        "--rounds",
        "8",
        "--local-steps",
        "3",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--checkpoint-every",
        "2",
    ]
    first = subprocess.run(
        common + ["--out", str(tmp_path / "a.npz")], env=env, capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0, first.stderr[-3000:]
    folder = tmp_path / "ckpt" / "process-0"
    assert checkpoint.latest_step(folder) == 8
    (folder / "ckpt-000000000008.npz").unlink()  # lost: the resumed run recomputes rounds 6-8
    assert checkpoint.latest_step(folder) == 6
    second = subprocess.run(
        common + ["--out", str(tmp_path / "b.npz")], env=env, capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stderr[-3000:]
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    np.testing.assert_array_equal(a["draws"], b["draws"])
    np.testing.assert_array_equal(a["chain_ids"], b["chain_ids"])
    assert a["draws"].shape == (8, 16, 2)
