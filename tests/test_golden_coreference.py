"""Golden draws of the coreference Gibbs sweep: fixed-seed runs compared exactly with stored arrays.

Each case runs a few sweeps of the kernel (or :func:`jaxsub.coreference.fit`) on a small fixed
problem — exact Gibbs, the padded race (with the decision check), the ragged race, the hybrid update
(padded and ragged), the single-test ``"fixed"`` schedule, batched rounds and one sweep compiled with
traced flags — and compares the labels after every sweep and every ``SweepInfo`` count with
``tests/golden/coreference_draws.npz``. Any change of the sampler's arithmetic, of its key
splitting or of its visiting order shows up here as a changed draw.

Four kernel cases and the exact ``fit`` run by default (about 25 CPU-s, the compilations of the
racing code); the others are marked ``slow`` (``pytest -n0 -m slow tests/test_golden_coreference.py``).

The exact sweep of :mod:`jaxsub.coreference.sufficient` (labels, counts and its reference log
conditional) is compared in the same way with ``tests/golden/coreference_sufficient.npz``.

Regenerate (only when a change of the draws is intended, and say why in the commit)::

    PYTHONPATH=. python tests/test_golden_coreference.py --regenerate              # the Gibbs sweep and fit
    PYTHONPATH=. python tests/test_golden_coreference.py --regenerate sufficient   # co.sufficient
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsub import coreference as co

GOLDEN = Path(__file__).resolve().parent / "golden" / "coreference_draws.npz"
GOLDEN_SUFFICIENT = Path(__file__).resolve().parent / "golden" / "coreference_sufficient.npz"
NUM_SWEEPS = 3
BETAS = np.asarray([0.5, 1.0, 2.0], np.float32)

#: Racing settings small enough for blocks of ~50 mentions (class K <= 64 races: min_race_size <= 64).
BASE = dict(
    delta=0.1, first_batch_size=5, min_race_size=10, max_candidates=8, min_arm_draws=1.0, race_widths=(), race_cost=0.0
)

#: name -> (build_kernel settings, exact, check_decisions); ``traced`` compiles the flags as traced bools.
CASES = {
    "exact": ({}, True, False),
    "padded": ({"race_widths": (4,)}, False, True),
    "ragged": ({"schedule": "ragged"}, False, False),
    "hybrid": ({"hybrid": True, "cv_members": 2}, False, True),
    "hybrid_ragged": ({"hybrid": True, "schedule": "ragged"}, False, False),
    "fixed": ({"race_schedule": "fixed", "control_variate": False}, False, False),
    "batched": ({"batch_size": 2}, False, True),
    "traced": ({}, "traced", "traced"),
}


def _factor(xi, xj):
    return 2.0 - 4.0 * jnp.abs(xi["x"] - xj["x"])


def _problem():
    """Two blocks of 48 and 40 mentions (six true entities each), one of 6, one singleton; noisy start."""
    rng = np.random.default_rng(7)
    sizes = [48, 40, 6, 1]
    keys = np.repeat(np.arange(len(sizes)), sizes)
    entity = np.concatenate([rng.integers(0, 6, n) + 10 * b for b, n in enumerate(sizes)])
    x = entity * 0.3 + rng.normal(0.0, 0.05, entity.size)
    blocks = co.make_blocks(keys)
    # start: every block's mentions spread over four clusters at random (cluster ids = sorted positions)
    pos = np.asarray(blocks.position)
    start = np.asarray(blocks.start)[pos]
    size = np.asarray(blocks.size)[pos]
    labels = start + rng.integers(0, 4, entity.size) % size
    return blocks, {"x": jnp.asarray(x, jnp.float32)}, jnp.asarray(labels, jnp.int32)


def _run_case(name):
    settings, exact, check = CASES[name]
    blocks, mentions, labels = _problem()
    kernel = co.build_kernel(blocks, **{**BASE, **settings})
    if exact == "traced":
        jitted = jax.jit(lambda k, s, b, e, c: kernel(k, s, _factor, mentions, b, e, c))
        sweep = lambda k, s, b: jitted(k, s, b, jnp.bool_(False), jnp.bool_(True))
    else:
        sweep = jax.jit(lambda k, s, b: kernel(k, s, _factor, mentions, b, exact, check))
    state = co.init(labels, blocks)
    out_labels, out_info = [], []
    for s in range(NUM_SWEEPS):
        state, info = sweep(jax.random.fold_in(jax.random.key(11), s), state, jnp.float32(BETAS[s]))
        out_labels.append(np.asarray(state.labels))
        out_info.append(np.asarray([int(v) for v in info], np.int64))
    return {f"{name}/labels": np.stack(out_labels), f"{name}/info": np.stack(out_info)}


def _run_fit(exact):
    blocks, mentions, labels = _problem()
    name = "fit_exact" if exact else "fit_raced"
    state, trace = co.fit(jax.random.key(5), _factor, mentions, blocks, BETAS, position=labels, exact=exact, **BASE)
    counts = np.stack(
        [trace.num_evaluations, trace.num_races, trace.num_exact, trace.num_nan, trace.num_errors, trace.num_checked]
    ).astype(np.int64)
    return {f"{name}/labels": np.asarray(state.labels), f"{name}/trace": counts}


#: ``co.sufficient`` (exact Gibbs with per-cluster sums): packed similarity of a string, a categorical and a
#: numeric field; small candidate / member chunks so that both streamed loops take several steps.
SUFFICIENT_KINDS = {"name": "string", "venue": "categorical", "year": "numeric"}
SUFFICIENT_SETTINGS = dict(
    weights={"name": 2.0, "venue": 0.5, "year": 1.0}, thresholds={"name": 0.7}, scales={"year": 3.0}, bias=-1.5
)


def _run_sufficient():
    blocks, _, labels = _problem()
    rng = np.random.default_rng(8)
    m = blocks.num_mentions
    names = [f"{'abcdef'[e % 6]}{'ghij'[e % 4]} smith" for e in rng.integers(0, 12, m)]
    fields = {
        "name": names,
        "venue": [None if v < 0 else "v" + str(v) for v in rng.integers(-1, 3, m)],
        "year": [float("nan") if y < 1992 else float(y) for y in rng.integers(1990, 2000, m)],
    }
    mentions = co.encode_mentions(fields, SUFFICIENT_KINDS, hash_dim=8)
    packed = co.packed_similarity(SUFFICIENT_KINDS, **SUFFICIENT_SETTINGS).pack(mentions)
    suff = co.sufficient.build_kernel(
        blocks, SUFFICIENT_KINDS, **SUFFICIENT_SETTINGS, candidate_chunk=3, member_chunk=7
    )
    step = jax.jit(suff.step)
    state = co.sufficient.init(labels, blocks)
    out_labels, out_info = [], []
    for s in range(NUM_SWEEPS):
        state, info = step(jax.random.fold_in(jax.random.key(21), s), state, packed, jnp.float32(BETAS[s]))
        out_labels.append(np.asarray(state.labels))
        out_info.append(np.asarray([int(v) for v in info], np.int64))
    conditional = np.stack([np.asarray(suff.log_conditional(state, packed, i, 1.5)) for i in (0, 50, 90)])
    return {
        "sufficient/labels": np.stack(out_labels),
        "sufficient/info": np.stack(out_info),
        "sufficient/log_conditional": conditional,
    }


def _generate():
    out = {}
    for name in CASES:
        out.update(_run_case(name))
    for exact in (True, False):
        out.update(_run_fit(exact))
    return out


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN) as z:
        return dict(z)


#: Cases run by default (the others compile ~5 CPU-s each and run with ``-m slow``).
FAST = ("exact", "padded", "hybrid", "batched")


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in CASES])
def test_kernel_draws_match_golden(golden, name):
    got = _run_case(name)
    for k, v in got.items():
        np.testing.assert_array_equal(v, golden[k], err_msg=k)
    if name != "exact":  # the racing cases race (otherwise they would not test the race)
        assert golden[f"{name}/info"][:, 1].sum() > 0


def test_sufficient_draws_match_golden():
    with np.load(GOLDEN_SUFFICIENT) as golden:
        for k, v in _run_sufficient().items():
            np.testing.assert_array_equal(v, golden[k], err_msg=k)


@pytest.mark.parametrize("exact", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_fit_draws_match_golden(golden, exact):
    for k, v in _run_fit(exact).items():
        np.testing.assert_array_equal(v, golden[k], err_msg=k)


if __name__ == "__main__":
    if sys.argv[1:] not in (["--regenerate"], ["--regenerate", "sufficient"]):
        sys.exit("usage: PYTHONPATH=. python tests/test_golden_coreference.py --regenerate [sufficient]")
    if sys.argv[2:]:
        arrays = _run_sufficient()
        np.savez_compressed(GOLDEN_SUFFICIENT, **arrays)
    else:
        arrays = _generate()
        np.savez_compressed(GOLDEN, **arrays)
    for k, v in arrays.items():
        print(k, v.shape, v.reshape(v.shape[0], -1)[:, :8].tolist() if v.ndim > 1 else v[:8].tolist())
