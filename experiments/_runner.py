"""One experiment run, importable by worker processes (``spawn`` pickles functions by module name,
and ``python -m experiments`` runs its ``__main__`` under the name ``__main__``)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from pathlib import Path

from experiments import load
from experiments._common import stamp_report, to_jsonable

__all__ = ["run_one", "command"]


def run_one(name: str, out_root: str, quick: bool, log_name: str | None):
    """Run one experiment; write its metrics.json and stamp its report. Returns (name, status, seconds)."""
    out_dir = Path(out_root) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    log = open(out_dir / log_name, "w") if log_name else None
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(log or sys.stdout), contextlib.redirect_stderr(log or sys.stderr):
            try:
                metrics = load(name).run(out_dir, quick=quick)
                status = "ok"
            except Exception:  # keep going; report the failure in the index
                traceback.print_exc()
                metrics, status = {"error": traceback.format_exc(limit=3)}, "FAILED"
    finally:
        if log:
            log.close()
    elapsed = time.perf_counter() - start
    stamp_report(out_dir / "report.md", quick=quick, seconds=elapsed, command=command(name, quick))
    metrics = dict(metrics or {})
    metrics["_runner"] = {"quick": quick, "mode": "quick" if quick else "full", "seconds": elapsed, "status": status}
    (out_dir / "metrics.json").write_text(json.dumps(to_jsonable(metrics), indent=2))
    return name, status, elapsed


def command(name: str, quick: bool) -> str:
    return f"python -m experiments {name} {'--quick' if quick else '--full'}"
