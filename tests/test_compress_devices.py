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
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "_compress_devices_script.py")], env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
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
    procs = [subprocess.Popen([sys.executable, script, "distributed", str(i), port], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=300)
            assert p.returncode == 0, stderr[-3000:]
            outs.append(json.loads([l for l in stdout.splitlines() if l.startswith("RESULT ")][-1][len("RESULT "):]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    x = np.random.default_rng(0).standard_normal((3001, 3)).astype(np.float32)[:3000].astype(np.float64)
    ref = compress.cluster_shards(np.array_split(x, 2), 0.4)
    for out in outs:  # every process returns the same global clustering
        assert out["c"] == ref.c and out["labels"] == ref.labels.tolist() and out["counts"] == ref.counts.tolist()
        np.testing.assert_array_equal(np.asarray(out["centroids"]), ref.centroids)  # bit-exact exchange
        assert out["radius"] <= 0.4
    fn = compress.logdensity(lambda m: -0.5 * jnp.sum(m**2), lambda m, xi: -0.5 * jnp.sum((xi - m) ** 2), ref)
    value, grad = jax.value_and_grad(fn)(jnp.asarray([0.3, -0.2, 0.1], jnp.float32))
    for out in outs:
        # float32 partial sums over ~half the centroids each, added by the psum: reassociation only
        np.testing.assert_allclose(out["value"], float(value), rtol=2e-5)
        np.testing.assert_allclose(out["grad"], np.asarray(grad), rtol=2e-4, atol=2e-5 * abs(float(value)))
    # negative control: one process's shard alone is not the union
    assert ref.c > compress.cluster(x[:1500], 0.4).c
