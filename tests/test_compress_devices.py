"""Scale-out of jaxsub.compress on 8 simulated CPU devices (subprocess: XLA_FLAGS must be set before JAX starts)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _env():
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    return env


@pytest.mark.multidevice
def test_sharded_logdensity_and_per_shard_clustering_equal_single_device():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "_compress_devices_script.py")],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT ") :])
    # value and gradient of the sharded compressed log-density equal the single-device ones
    # up to float32 reassociation of the sums (relative ~1e-7 per term, ~1e3 terms)
    assert out["rel_diff"] <= 2e-5, out
    # one all-reduce (the psum of the log-density; its transpose reduces the gradient) per evaluation
    assert out["all_reduces"] == 1, out
    # blackjax.nuts unchanged: the same 20 draws from the same keys
    assert out["nuts_max_abs_diff"] <= 1e-4, out
    # per-device clustering of a sharded array = clustering each device's slice; union keeps delta
    assert out["shards_c"] == out["shards_c_expected"] and out["shards_labels_equal"], out
    assert out["shards_radius_ok"] and out["shards_dist_ok"], out
    # clusters cannot span shards: 8 shards need more clusters than one
    assert out["shards_c"] > out["one_device_c"], out


def run_peers(commands, env, timeout: float, poll: float = 0.1) -> list[str]:
    """Run peer processes that wait on each other (``jax.distributed``) and fail fast.

    Returns every process's stdout once all exit with status 0. As soon as one exits with another
    status, the others get 5 s to exit, then (blocked in a collective that will never complete)
    are killed, and the assertion shows every failed peer's stderr, the first to fail first; past ``timeout`` seconds every peer is killed and
    the assertion shows all their stderr. Output goes to temporary files, so a chatty peer never
    blocks on a full pipe.
    """
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as tmp:
        files = [
            (open(os.path.join(tmp, f"{i}.out"), "w+"), open(os.path.join(tmp, f"{i}.err"), "w+"))
            for i in range(len(commands))
        ]
        procs = [subprocess.Popen(cmd, env=env, stdout=o, stderr=e, text=True) for cmd, (o, e) in zip(commands, files)]

        def text(i, k):
            files[i][k].flush()
            files[i][k].seek(0)
            return files[i][k].read()

        start, exited, failure = time.monotonic(), {}, None
        try:
            while True:
                for i, p in enumerate(procs):
                    if i not in exited and p.poll() is not None:
                        exited[i] = time.monotonic()  # exit order: the root cause fails first
                failed = [i for i in exited if procs[i].returncode != 0]
                if failed:
                    grace = time.monotonic() + 5.0  # peers failing in the collective exit too
                    while time.monotonic() < grace and any(p.poll() is None for p in procs):
                        time.sleep(poll)
                    failed += [i for i, p in enumerate(procs) if i not in failed and p.poll() not in (None, 0)]
                    failure = "\n".join(
                        f"peer {i} exited with status {procs[i].returncode}; its stderr:\n{text(i, 1)[-2000:]}"
                        for i in failed
                    )
                    break
                if len(exited) == len(procs):
                    return [text(i, 0) for i in range(len(procs))]
                if time.monotonic() - start > timeout:
                    failure = f"peers still running after {timeout:.0f} s; stderr:\n" + "\n".join(
                        f"--- peer {i}:\n{text(i, 1)[-1500:]}" for i in range(len(procs))
                    )
                    break
                time.sleep(poll)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for o, e in files:
                o.close()
                e.close()
        raise AssertionError(failure)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multidevice
def test_two_process_distributed_clustering_and_logdensity_equal_single_process():
    """Two jax.distributed processes on 127.0.0.1 (CPU, one device each): each clusters its shard of a
    global array; the gathered union equals single-process cluster_shards of the same two shards, and
    the log-density summed across the processes (one psum) equals the single-device one."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxsub import compress

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    port = str(_free_port())
    script = str(ROOT / "tests" / "_compress_devices_script.py")
    stdouts = run_peers([[sys.executable, script, "distributed", str(i), port] for i in range(2)], env, timeout=300.0)
    outs = [
        json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][len("RESULT ") :]) for out in stdouts
    ]
    x = np.random.default_rng(0).standard_normal((3001, 3)).astype(np.float32)[:3000].astype(np.float64)
    ref = compress.cluster_shards(np.array_split(x, 2), 0.4)
    for out in outs:  # every process returns the same global clustering
        assert out["c"] == ref.c and out["labels"] == ref.labels.tolist() and out["counts"] == ref.counts.tolist()
        np.testing.assert_array_equal(np.asarray(out["centroids"]), ref.centroids)  # bit-exact exchange
        assert out["radius"] <= 0.4
    fn = compress.logdensity(
        lambda m: -0.5 * jnp.sum(m**2), lambda m, xi: -0.5 * jnp.sum((xi - m) ** 2), ref, second_order=False
    )  # the sharded log-density is first order
    value, grad = jax.value_and_grad(fn)(jnp.asarray([0.3, -0.2, 0.1], jnp.float32))
    for out in outs:
        # float32 partial sums over ~half the centroids each, added by the psum: reassociation only
        np.testing.assert_allclose(out["value"], float(value), rtol=2e-5)
        np.testing.assert_allclose(out["grad"], np.asarray(grad), rtol=2e-4, atol=2e-5 * abs(float(value)))
    # negative control: one process's shard alone is not the union
    assert ref.c > compress.cluster(x[:1500], 0.4).c
