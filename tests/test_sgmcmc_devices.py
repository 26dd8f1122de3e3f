"""Multi-device and multi-host CG-DSGLD: same draws as one device / one process for the same keys.

The 8-device runs need ``XLA_FLAGS=--xla_force_host_platform_device_count=8``
set before JAX initialises, so they run in subprocesses
(``tests/_sgmcmc_devices_script.py``, ``examples/multihost_dsgld.py``).
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_mean_matches

import jaxsub

ROOT = Path(__file__).resolve().parent.parent


def _env():
    env = dict(os.environ)
    # The subprocesses compile a dozen small programs whose run time is negligible: XLA's backend (LLVM)
    # optimisation level 0 and single-threaded Eigen cut their CPU time (compile time, idle thread pools).
    # Codegen only: the HLO programs (and their collectives) are the same, and every comparison is between
    # runs under the same flags.
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0 --xla_cpu_multi_thread_eigen=false"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    return env


@pytest.mark.multidevice
def test_eight_devices_equal_one_device_and_only_chains_move():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_sgmcmc_devices_script.py")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT ") :])
    assert out["names"] == ["dsgld", "cg_dsgld", "cg_pytree_lowrank_nonuniform_partial"]
    for name in out["names"]:
        assert out[f"{name}_finite"]
        assert out[f"{name}_max_abs_diff"] <= 1e-5, out
        assert out[f"{name}_chain_ids_equal"] and out[f"{name}_acted_equal"]
        assert out[f"{name}_position_devices"] == 8
        assert out[f"{name}_draws_shape"][0][:2] == [16, 8]  # [chains, steps, ...]
        if name.endswith("partial"):  # idle rounds happen (5 of 8 devices, f ∝ N_s) but not always
            assert 0.1 < out[f"{name}_acted_fraction"] < 0.9
        else:
            assert out[f"{name}_acted_fraction"] == 1.0
        if name == "cg_dsgld":
            # collective permutes (one per leaf, slot and nonzero shift; only one shift runs per slot and
            # round) and no gather/reduce of data or states
            assert out[f"{name}_collective_permutes"] >= 1
            assert out[f"{name}_other_collectives"] == 0, out
        shifts = np.asarray(out[f"{name}_shifts"])
        assert shifts.shape == (8, 2) and len(np.unique(shifts)) > 1


def _start(cmd, log_dir: Path, name: str):
    """A subprocess writing to files (a full pipe would block it while its peers are polled)."""
    out, err = open(log_dir / f"{name}.out", "w"), open(log_dir / f"{name}.err", "w")
    proc = subprocess.Popen(cmd, env=_env(), stdout=out, stderr=err, text=True)
    out.close()
    err.close()
    proc.log = (log_dir / f"{name}.out", log_dir / f"{name}.err")
    return proc


def _wait_all(procs: dict, timeout: float) -> None:
    """Wait for every process; the first to fail (or the deadline) stops the others and fails the
    test with that process's stderr, so a dead peer never leaves the test waiting on the living."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            codes = {name: p.poll() for name, p in procs.items()}
            failed = [name for name, code in codes.items() if code not in (None, 0)]
            if failed:
                name = failed[0]
                pytest.fail(
                    f"{name} exited with status {codes[name]} (its peers were stopped):\n"
                    f"{procs[name].log[1].read_text()[-3000:]}"
                )
            if all(code == 0 for code in codes.values()):
                return
            if time.monotonic() > deadline:
                running = [name for name, code in codes.items() if code is None]
                pytest.fail(f"still running after {timeout:g} s: {running}")
            time.sleep(0.1)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)


def test_wait_all_fails_fast_when_a_peer_dies(tmp_path):
    """A peer that dies stops the wait at once, with its error; its partner is killed."""
    procs = {
        "dead": _start([sys.executable, "-c", "import sys; sys.exit('peer failed: boom')"], tmp_path, "dead"),
        "waiting": _start([sys.executable, "-c", "import time; time.sleep(120)"], tmp_path, "waiting"),
    }
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="(?s)dead exited with status 1.*peer failed: boom"):
        _wait_all(procs, timeout=120)
    assert time.monotonic() - start < 30
    assert procs["waiting"].poll() is not None


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multidevice
def test_two_processes_equal_one_process(tmp_path):
    """Multi-controller JAX on localhost (gloo CPU collectives): 2 processes x 4 devices vs 1 process x 8."""
    script = str(ROOT / "examples" / "multihost_dsgld.py")
    common = ["--rounds", "8", "--local-steps", "5"]
    port = _free_port()
    procs = {
        f"process {i}": _start(
            [
                sys.executable,
                script,
                "--num-processes",
                "2",
                "--process-id",
                str(i),
                "--address",
                f"127.0.0.1:{port}",
                "--init-timeout",
                "60",
                "--out",
                str(tmp_path / "multi.npz"),
                *common,
            ],
            tmp_path,
            f"process{i}",
        )
        for i in (0, 1)
    }
    procs["single"] = _start(
        [
            sys.executable,
            script,
            "--num-processes",
            "1",
            "--local-devices",
            "8",
            "--out",
            str(tmp_path / "single.npz"),
            *common,
        ],
        tmp_path,
        "single",
    )
    _wait_all(procs, timeout=300)
    multi, ref = np.load(tmp_path / "multi.npz"), np.load(tmp_path / "single.npz")
    assert int(multi["process_count"]) == 2 and int(ref["process_count"]) == 1
    assert int(multi["device_count"]) == int(ref["device_count"]) == 8
    assert multi["draws"].shape == (8, 16, 2)
    np.testing.assert_allclose(multi["draws"], ref["draws"], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(multi["chain_ids"], ref["chain_ids"])


def test_multi_device_layout_targets_the_posterior():
    """In-process (one device, vmapped layout): CG-DSGLD chains hopping by cyclic shifts hit the posterior mean."""
    rng = np.random.default_rng(3)
    sizes = (40, 60, 50, 30)
    shards = [(rng.uniform(-3, 3, size=2) + 0.35 * rng.normal(size=(n, 2))).astype(np.float32) for n in sizes]
    sur = jaxsub.sgmcmc.gaussian_surrogates([x.mean(0) for x in shards], [len(x) * np.eye(2) for x in shards])
    algo = jaxsub.sgmcmc.multi_device(
        lambda t: -0.5 * jnp.sum(t**2) / 5.0,
        lambda t, x: -0.5 * jnp.sum((x - t) ** 2),
        shards,
        step_size=4e-5,
        batch_size=10,
        local_steps=10,
        surrogates=sur,
        chains_per_shard=4,
    )
    N = sum(sizes)
    post_mean = np.concatenate(shards).mean(0) * N / (N + 0.2)
    state = algo.init(jnp.tile(jnp.asarray(post_mean, jnp.float32), (16, 1)))
    trace = jaxsub.run_chain(jax.random.key(0), algo, state, 1500)
    draws = np.asarray(jaxsub.sgmcmc.draws_by_chain(trace.states))  # [16, T, 2]
    ids = np.asarray(trace.states.chain_id)
    assert all(sorted(row.ravel().tolist()) == list(range(16)) for row in ids[::100])
    assert_mean_matches(draws[:, 100:], post_mean)
