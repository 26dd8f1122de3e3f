"""jaxsub.checkpoint and the drivers' ``checkpoint_dir``.

The module: exact round trips, atomic writes, refusal of a different run. The drivers: a
run killed (SIGKILL) after its first checkpoint and resumed returns bit for bit what an
uninterrupted run returns; a write killed half way never spoils the last good checkpoint;
a checkpoint of a different run is refused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsub
from jaxsub import checkpoint


def _tree(seed):
    key = jax.random.key(seed)
    return {
        "key": jax.random.split(key, 3),
        "x": jax.random.normal(key, (4, 2)),
        "n": jnp.arange(5, dtype=jnp.int32),
        "flag": np.array([True, False]),
        "count": 7,
    }


def test_round_trip_is_bit_exact_and_keeps_types(tmp_path):
    tree = _tree(0)
    checkpoint.save(tmp_path, 3, tree, meta={"run": "a", "n": 1})
    step, back = checkpoint.restore(tmp_path, _tree(1), meta={"run": "a", "n": 1})
    assert step == 3
    np.testing.assert_array_equal(jax.random.key_data(back["key"]), jax.random.key_data(tree["key"]))
    np.testing.assert_array_equal(back["x"], tree["x"])
    assert back["x"].dtype == tree["x"].dtype and isinstance(back["x"], jax.Array)
    assert isinstance(back["flag"], np.ndarray) and back["count"] == 7 and isinstance(back["count"], int)
    # the restored key draws what the saved one draws
    np.testing.assert_array_equal(jax.random.normal(back["key"][1], (3,)), jax.random.normal(tree["key"][1], (3,)))


def test_latest_keeps_newest_and_ignores_partial_writes(tmp_path):
    assert checkpoint.latest_step(tmp_path / "missing") is None
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, _tree(step), keep=2)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.npz")) == ["ckpt-000000000002.npz", "ckpt-000000000003.npz"]
    # a write killed before its rename leaves only a temporary file: the last good one stands
    (tmp_path / ".ckpt-000000000004.npz.tmp-123").write_bytes(b"truncated")
    assert checkpoint.latest_step(tmp_path) == 3
    step, back = checkpoint.restore(tmp_path, _tree(0))
    assert step == 3
    np.testing.assert_array_equal(back["x"], _tree(3)["x"])


def test_refuses_other_runs_and_other_structures(tmp_path):
    checkpoint.save(tmp_path, 0, _tree(0), meta={"seed": 0})
    with pytest.raises(ValueError, match="different run"):
        checkpoint.restore(tmp_path, _tree(0), meta={"seed": 1})
    with pytest.raises(ValueError, match="leaves"):
        checkpoint.restore(tmp_path, {"x": jnp.zeros((4, 2))})
    bad = dict(_tree(0), x=jnp.zeros((4, 3)))
    with pytest.raises(ValueError, match="shape"):
        checkpoint.restore(tmp_path, bad)
    with pytest.raises(FileNotFoundError):
        checkpoint.restore(tmp_path / "none", _tree(0))
    with pytest.raises(ValueError, match="keep"):
        checkpoint.save(tmp_path, 1, _tree(0), keep=0)
    with pytest.raises(ValueError, match="meta"):
        checkpoint.save(tmp_path, 1, _tree(0), meta={"a": [1]})


NUM_STEPS, EVERY = 60, 10

# The run: random-walk MH on a 2-d Gaussian, each step sleeping (on the host) so that a
# killed run stops part way. CALLS counts the steps run in this process.
RUN = """
import time
import blackjax
import jax
import jax.numpy as jnp

CALLS = []


def _pause(x):
    CALLS.append(1)
    time.sleep({pause})
    return x


def algorithm():
    rwmh = blackjax.additive_step_random_walk(lambda x: -0.5 * jnp.sum(x**2),
                                              blackjax.mcmc.random_walk.normal(jnp.asarray(0.8)))

    def step(key, state):
        state, info = rwmh.step(key, state)
        pos = jax.pure_callback(_pause, jax.ShapeDtypeStruct((2,), jnp.float32), state.position,
                                 vmap_method="sequential")
        return state._replace(position=pos), info

    return rwmh.init(jnp.zeros(2, jnp.float32)), step


def run(directory, num_chains=None, seed=0, num_steps={num_steps}, every={every}):
    init, step = algorithm()
    key = jax.random.key(seed)
    if num_chains is None:
        return jaxsub.run_chain(key, step, init, num_steps, checkpoint_dir=directory, checkpoint_every=every)
    inits = jax.tree.map(lambda x: jnp.stack([x] * num_chains), init)
    return jaxsub.run_chains(key, step, inits, num_steps, checkpoint_dir=directory, checkpoint_every=every)
"""


def _module(pause: float):
    namespace = {"jaxsub": jaxsub}
    exec(RUN.format(pause=pause, num_steps=NUM_STEPS, every=EVERY), namespace)  # noqa: S102
    return namespace


def _assert_same(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _kill_after_first_checkpoint(tmp_path, directory, num_chains):
    script = tmp_path / "run.py"
    script.write_text(
        "import jaxsub\n"
        + RUN.format(pause=0.05, num_steps=NUM_STEPS, every=EVERY)
        + textwrap.dedent(f"""
        run({str(directory)!r}, num_chains={num_chains})
        print("finished")
    """)
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(Path(jaxsub.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while checkpoint.latest_step(directory) is None:
            if proc.poll() is not None:
                pytest.fail(
                    f"the run exited ({proc.returncode}) before its first checkpoint: {proc.stderr.read().decode()[-2000:]}"
                )
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return checkpoint.latest_step(directory)


@pytest.mark.parametrize("num_chains", [None, 3])
def test_killed_run_resumes_bit_identical(tmp_path, num_chains):
    directory = tmp_path / "ckpt"
    stopped = _kill_after_first_checkpoint(tmp_path, directory, num_chains)
    assert stopped is not None and 0 < stopped < NUM_STEPS, stopped  # the kill interrupted the run
    mod = _module(pause=0.0)
    resumed = mod["run"](directory, num_chains)
    assert len(mod["CALLS"]) == (NUM_STEPS - stopped) * (num_chains or 1)  # it resumed, not restarted
    again = _module(pause=0.0)
    uninterrupted = again["run"](tmp_path / "fresh", num_chains)
    _assert_same(resumed, uninterrupted)
    # The chunking does not change the draws: a run without checkpoints gives the same trace.
    init, step = again["algorithm"]()
    key = jax.random.key(0)
    if num_chains is None:
        plain = jaxsub.run_chain(key, step, init, NUM_STEPS)
    else:
        plain = jaxsub.run_chains(key, step, jax.tree.map(lambda x: jnp.stack([x] * num_chains), init), NUM_STEPS)
    _assert_same(resumed, plain)


def test_finished_run_is_read_back(tmp_path):
    mod = _module(pause=0.0)
    first = mod["run"](tmp_path)
    calls = len(mod["CALLS"])
    second = mod["run"](tmp_path)
    assert len(mod["CALLS"]) == calls  # nothing recomputed
    _assert_same(first, second)


def test_killed_write_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    tree = {"x": jnp.arange(3.0), "key": jax.random.key(1)}
    checkpoint.save(tmp_path, 10, tree)
    # A write killed before its rename: a truncated temporary file is left behind.
    (tmp_path / ".ckpt-000000000020.npz.tmp-999").write_bytes(b"PK\x03\x04trunc")

    def killed(fd):
        raise KeyboardInterrupt("killed during fsync")

    monkeypatch.setattr(os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path, 30, {"x": jnp.arange(3.0) + 1, "key": jax.random.key(2)})
    monkeypatch.undo()
    assert checkpoint.latest_step(tmp_path) == 10
    step, back = checkpoint.restore(tmp_path, tree)
    assert step == 10
    _assert_same(back, tree)


def test_driver_resumes_past_a_leftover_temp_file(tmp_path):
    """Killed while writing step 60: step 50 and a truncated temporary file remain."""
    mod = _module(pause=0.0)
    full = mod["run"](tmp_path)
    (tmp_path / "ckpt-000000000060.npz").unlink()
    (tmp_path / ".ckpt-000000000060.npz.tmp-4242").write_bytes(b"PK\x03\x04trunc")
    assert checkpoint.latest_step(tmp_path) == NUM_STEPS - EVERY
    calls = len(mod["CALLS"])
    resumed = mod["run"](tmp_path)
    assert len(mod["CALLS"]) - calls == EVERY
    _assert_same(resumed, full)


def test_meta_mismatch_refuses_to_resume(tmp_path):
    mod = _module(pause=0.0)
    mod["run"](tmp_path)
    with pytest.raises(ValueError, match="different run"):
        mod["run"](tmp_path, seed=1)
    with pytest.raises(ValueError, match="different run"):
        mod["run"](tmp_path, every=EVERY // 2)
    with pytest.raises(ValueError, match="checkpoint_every must be an integer"):
        mod["run"](tmp_path, every=0)


def test_checked_run_with_checkpoints_resumes_and_keeps_flags(tmp_path):
    """``checked=True`` and the warning's flag counts survive a resume (flags are checkpointed)."""
    from typing import NamedTuple

    class Info(NamedTuple):
        has_nan: jax.Array

    def step(key, state):
        new = state + jax.random.uniform(key)
        return new, Info(new > 1e9)

    full = jaxsub.run_chain(
        jax.random.key(0), step, jnp.asarray(0.0), 20, checked=True, checkpoint_dir=tmp_path / "a", checkpoint_every=6
    )
    (tmp_path / "a" / "ckpt-000000000020.npz").unlink()
    again = jaxsub.run_chain(
        jax.random.key(0), step, jnp.asarray(0.0), 20, checked=True, checkpoint_dir=tmp_path / "a", checkpoint_every=6
    )
    _assert_same(full, again)

    def flagged(key, state):
        return state + 1, Info(state + 1 <= 4)  # steps 0..3 flagged, all in the first chunk

    with pytest.warns(RuntimeWarning, match="at 4 of 10 steps"):
        jaxsub.run_chain(
            jax.random.key(0), flagged, jnp.asarray(0), 10, checkpoint_dir=tmp_path / "b", checkpoint_every=5
        )
    (tmp_path / "b" / "ckpt-000000000010.npz").unlink()
    with pytest.warns(RuntimeWarning, match="at 4 of 10 steps"):
        jaxsub.run_chain(
            jax.random.key(0), flagged, jnp.asarray(0), 10, checkpoint_dir=tmp_path / "b", checkpoint_every=5
        )
