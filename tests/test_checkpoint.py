"""jaxsub.checkpoint: exact round trips, atomic writes, refusal of a different run."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
