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
