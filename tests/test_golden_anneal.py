"""Golden draws of the annealed samplers: fixed-seed fits compared with stored arrays.

Each case runs a small fit from a fixed key and compares its result with
``tests/golden/anneal_<case>.npz``: integer arrays (assignments, view labels, cursors, cluster
counts) exactly, float arrays (statistics, hyperparameters, log joints, held-out scores) with
``rtol=1e-5, atol=1e-6``. Any change to a move, a key split or the order of the random draws
changes the integers; a refactoring that keeps the programs keeps them.

Regenerate the stored arrays (only when a change is *meant* to change the draws; say why in the
commit message)::

    PYTHONPATH=. python tests/test_golden_anneal.py --regen
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxsub.anneal as an
from jaxsub.anneal import crosscat as cc

GOLDEN = Path(__file__).resolve().parent / "golden"
EXCLUDED = ("seconds", "compile_seconds")  # wall-clock: not part of the draws


def _mixture_table(seed=3, n=24):
    """``[n, 3]`` rows of a 2-cluster mixture: a 3-level categorical, a binary and a real column."""
    rng = np.random.default_rng(seed)
    c = rng.integers(0, 2, n)
    return np.column_stack(
        [
            np.where(c == 0, rng.integers(0, 2, n), 2),
            np.where(rng.random(n) < 0.8, c, 1 - c),
            rng.normal(3.0 * c - 1.5, 0.7),
        ]
    ).astype(np.float64)


def _mixture_case(prior):
    x = _mixture_table()
    model = an.MixtureModel(prior, [an.DirichletCategorical(3), an.BetaBernoulli(), an.NormalInverseChiSquared()])
    sched = an.linear_anneal(num_rows=20, num_assignments=60)
    return an.fit(
        jax.random.key(11),
        x[:20],
        model,
        sched,
        test_data=x[20:],
        options=an.FitOptions(num_chains=3, capacity=8, num_checkpoints=3, hyper_min_rows=5),
    )


def _crosscat_table(seed=5, n=22):
    """``[n, 5]`` table of two independent blocks of columns (2+ views), some cells missing."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 2, n), rng.integers(0, 3, n)
    t = np.column_stack(
        [
            np.where(rng.random(n) < 0.9, a, 1 - a),
            np.where(a == 1, rng.integers(0, 2, n), 2),
            rng.normal(2.0 * a - 1.0, 0.5),
            np.where(rng.random(n) < 0.9, b % 2, 1 - b % 2),
            rng.normal(1.5 * b - 1.5, 0.4),
        ]
    ).astype(np.float64)
    t[rng.random(t.shape) < 0.1] = np.nan
    return t


def _crosscat_case(schedule_of, **kwargs):
    t = _crosscat_table()
    model = cc.CrossCatModel(
        an.PitmanYor(1.0, 0.2),
        an.CRP(1.0),
        (
            an.BetaBernoulli(),
            an.DirichletCategorical(3),
            an.NormalInverseChiSquared(),
            an.BetaBernoulli(),
            an.NormalInverseChiSquared(),
        ),
    )
    options = cc.FitOptions(num_chains=2, capacity=8, num_checkpoints=2, hyper_min_rows=6)._replace(**kwargs)
    return cc.fit(jax.random.key(7), t[:18], model, schedule_of(18), test_data=t[18:], options=options)


CASES = {
    "mixture_dp": lambda: _mixture_case(an.CRP(1.0)),
    "mixture_py": lambda: _mixture_case(an.PitmanYor(1.0, 0.3)),
    "crosscat_anneal": lambda: _crosscat_case(
        lambda n: an.linear_anneal(num_rows=n, num_assignments=3 * n), feature_widths=(8,)
    ),
    "crosscat_loom": lambda: _crosscat_case(lambda n: an.loom(n, extra_passes=2.0, final_gibbs=n)),
    "crosscat_blocks": lambda: _crosscat_case(
        lambda n: an.anneal_stepsize(n, 2 * n, final_gibbs=n), grids=None, initial_views="one"
    ),
}


def _flatten(result) -> dict:
    """Every array of a fit result by its dotted path (wall-clock fields dropped)."""
    out = {}

    def walk(prefix, x):
        if hasattr(x, "_fields"):
            for name in x._fields:
                if name not in EXCLUDED:
                    walk(f"{prefix}.{name}" if prefix else name, getattr(x, name))
        elif x is not None:
            out[prefix] = np.asarray(x)

    walk("", result)
    return out


def _run(case) -> dict:
    old = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", True)  # as the other anneal tests compile
    try:
        arrays = _flatten(CASES[case]())
    finally:
        jax.config.update("jax_disable_most_optimizations", old)
    return arrays


@pytest.mark.parametrize(
    "case",
    # the two long CrossCat schedules run with `-m slow`; the block schedule covers the CrossCat sweep by default
    [
        pytest.param(c, marks=pytest.mark.slow) if c in ("crosscat_anneal", "crosscat_loom") else c
        for c in sorted(CASES)
    ],
)
def test_fit_reproduces_the_golden_draws(case):
    want = dict(np.load(GOLDEN / f"anneal_{case}.npz"))
    got = _run(case)
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape and g.dtype == w.dtype, name
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(g, w, err_msg=name)


def test_golden_cases_are_not_trivial():
    """The stored runs exercise what they claim: several clusters, 2+ views, missing cells."""
    for case in ("mixture_dp", "mixture_py"):
        g = dict(np.load(GOLDEN / f"anneal_{case}.npz"))
        assert g["labels"].max() >= 1 and np.all(g["state.num_assigned"] == 20)
    for case in ("crosscat_anneal", "crosscat_loom", "crosscat_blocks"):
        g = dict(np.load(GOLDEN / f"anneal_{case}.npz"))
        views = [len(set(v.tolist())) for v in g["state.view_of"]]
        assert max(views) >= 2, views
    assert np.isnan(_crosscat_table()).any()


if __name__ == "__main__":
    if "--regen" not in sys.argv[1:]:
        sys.exit("usage: PYTHONPATH=. python tests/test_golden_anneal.py --regen")
    GOLDEN.mkdir(exist_ok=True)
    for name in sorted(CASES):
        np.savez(GOLDEN / f"anneal_{name}.npz", **_run(name))
        print("wrote", GOLDEN / f"anneal_{name}.npz")
