"""Checkpoint and resume of the anneal drivers: a killed run resumes to the draws of an uninterrupted one."""

from __future__ import annotations

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
from test_anneal import fast_xla_compile  # noqa: F401  (autouse fixture)

import jaxsub.anneal as an
from jaxsub import checkpoint
from jaxsub.anneal import crosscat as cc

ROOT = Path(__file__).resolve().parent.parent
EXCLUDED = ("seconds", "compile_seconds")  # wall-clock


def _arrays(result) -> dict:
    """Every array of a fit result by its dotted path (wall-clock fields dropped)."""
    out = {}

    def walk(prefix, x):
        if hasattr(x, "_fields"):
            for name in x._fields:
                if name not in EXCLUDED:
                    walk(f"{prefix}.{name}", getattr(x, name))
        elif x is not None:
            out[prefix] = np.asarray(x)

    walk("", result)
    return out


def _assert_identical(a, b):
    a, b = _arrays(a), _arrays(b)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


MIXTURE_SETUP = textwrap.dedent("""
    import numpy as np
    import jax
    import jaxsub.anneal as an

    jax.config.update("jax_disable_most_optimizations", True)
    rng = np.random.default_rng(0)
    c = rng.integers(0, 2, 60)
    X = np.column_stack([np.where(c == 0, rng.integers(0, 2, 60), 2), rng.normal(3.0 * c, 0.7)])
    MODEL = an.MixtureModel(an.PitmanYor(1.0, 0.2), [an.DirichletCategorical(3), an.NormalInverseChiSquared()])
    SCHEDULE = an.linear_anneal(num_rows=50, num_assignments=1200)
    OPTIONS = an.FitOptions(num_chains=2, capacity=4, span=4, hyper_min_rows=10, sweep_growth=2.0)

    def run(checkpoint_dir=None, key=0):
        return an.fit(jax.random.key(key), X[:50], MODEL, SCHEDULE, test_data=X[50:],
                      options=OPTIONS._replace(checkpoint_dir=checkpoint_dir))
""")


def test_killed_mixture_fit_resumes_to_the_uninterrupted_draws(tmp_path):
    """A subprocess writing a checkpoint after every span is SIGKILLed once the first one exists; ``fit`` resumed
    here from the folder returns bit for bit the final state and trace of an uninterrupted run (300 spans)."""
    ckpt = tmp_path / "ckpt"
    script = tmp_path / "run.py"
    script.write_text(MIXTURE_SETUP + f"\nrun({str(ckpt)!r})\nprint('done')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while checkpoint.latest_step(ckpt / "layout") is None:
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = checkpoint.latest_step(ckpt / "layout")
    namespace = {}
    exec(compile(MIXTURE_SETUP, "setup", "exec"), namespace)
    assert killed_at < len(namespace["SCHEDULE"]) // 4  # it stopped part-way: 300 spans in all
    resumed = namespace["run"](ckpt)
    assert checkpoint.latest_step(ckpt / "layout") == resumed.trace.tick.shape[0] > killed_at
    whole = namespace["run"]()
    _assert_identical(resumed, whole)
    assert whole.trace.capacity[-1] > 4  # the capacity grew during the run (checkpoints of several shapes)
    # a different run (another key) refuses the folder
    with pytest.raises(ValueError, match="different run"):
        namespace["run"](ckpt, key=1)


def _crosscat_setup():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2, 16)
    t = np.column_stack([a, rng.normal(2.0 * a, 0.5), rng.integers(0, 3, 16)]).astype(float)
    t[rng.random(t.shape) < 0.1] = np.nan
    model = cc.CrossCatModel(
        an.CRP(1.0), an.CRP(1.0), (an.BetaBernoulli(), an.NormalInverseChiSquared(), an.DirichletCategorical(3))
    )
    return t, model, an.linear_anneal(num_rows=12, num_assignments=36)


@pytest.mark.slow  # compiles the CrossCat sweep twice (about 40 s); run with `python -m pytest -m slow`
def test_crosscat_fit_resumes_from_an_earlier_checkpoint_to_the_same_draws(tmp_path):
    """``crosscat.fit`` with a checkpoint per span; the newest checkpoint is deleted (a run killed after span
    ``k - 1``) and the resumed fit reruns the last span to the uninterrupted result, bit for bit."""
    t, model, sched = _crosscat_setup()
    opts = cc.FitOptions(num_chains=2, capacity=2, num_checkpoints=4, hyper_min_rows=4)
    cache = an.SweepCache()

    def run(**kw):
        return cc.fit(
            jax.random.key(5), t[:12], model, sched, test_data=t[12:], cache=cache, options=opts._replace(**kw)
        )

    whole = run()
    assert whole.trace_capacity[-1] > 2  # the capacity grew
    ckpt = tmp_path / "ckpt"
    first = run(checkpoint_dir=ckpt)
    _assert_identical(first, whole)
    last = checkpoint.latest_step(ckpt / "layout")
    assert last == whole.heldout.shape[0]
    for sub in ("layout", "state"):
        (ckpt / sub / f"ckpt-{last:012d}.npz").unlink()
    assert checkpoint.latest_step(ckpt / "layout") == last - 1
    _assert_identical(run(checkpoint_dir=ckpt), whole)
    assert checkpoint.latest_step(ckpt / "layout") == last
    # a finished run's folder returns the result without running again; another run refuses it
    _assert_identical(run(checkpoint_dir=ckpt), whole)
    with pytest.raises(ValueError, match="different run"):
        run(checkpoint_dir=ckpt, num_aux=2)
