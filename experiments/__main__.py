"""``python -m experiments [NAMES...] [--quick] [--out results]``."""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from experiments import load, registry
from experiments._common import to_jsonable


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__)
    parser.add_argument("names", nargs="*", help="experiments to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes: every experiment in minutes")
    parser.add_argument("--out", default="results", help="output folder (default: results)")
    parser.add_argument("--list", action="store_true", help="list the registered experiments and exit")
    args = parser.parse_args(argv)

    reg = registry()
    if args.list:
        for name in reg:
            print(name, "-", getattr(load(name), "TITLE", ""))
        return 0
    names = args.names or list(reg)
    unknown = [n for n in names if n not in reg]
    if unknown:
        parser.error(f"unknown experiment(s) {unknown}; available: {list(reg)}")

    from tqdm.auto import tqdm

    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    summary, failures = [], []
    for name in tqdm(names, desc="experiments", unit="exp"):
        out_dir = out_root / name
        out_dir.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        try:
            module = load(name)
            metrics = module.run(out_dir, quick=args.quick)
            status = "ok"
        except Exception:  # keep going; report the failure in the index
            traceback.print_exc()
            metrics, status = {"error": traceback.format_exc(limit=3)}, "FAILED"
            failures.append(name)
        elapsed = time.perf_counter() - start
        metrics = dict(metrics or {})
        metrics["_runner"] = {"quick": args.quick, "seconds": elapsed, "status": status}
        (out_dir / "metrics.json").write_text(json.dumps(to_jsonable(metrics), indent=2))
        summary.append((name, status, elapsed, getattr(sys.modules.get(f"experiments.{name}"), "TITLE", "")))
        _write_index(out_root, summary, args.quick)
    _write_index(out_root, summary, args.quick)
    print(f"wrote {out_root / 'index.md'}")
    return 1 if failures else 0


def _write_index(out_root: Path, summary, quick: bool) -> None:
    lines = [
        "# jaxsub experiment results",
        "",
        f"Mode of this run: {'quick' if quick else 'full'}. Each row links the experiment's report; "
        "figures and metrics.json sit beside it.",
        "",
        "| experiment | status | seconds | what |",
        "|---|---|---|---|",
    ]
    rows = {name: (status, f"{elapsed:.1f}", title) for name, status, elapsed, title in summary}
    # Keep earlier results of experiments not run this time (e.g. `python -m experiments NAME`).
    for metrics_file in sorted(out_root.glob("*/metrics.json")):
        name = metrics_file.parent.name
        if name in rows:
            continue
        try:
            runner = json.loads(metrics_file.read_text()).get("_runner", {})
        except (OSError, ValueError):
            continue
        mode = "quick" if runner.get("quick") else "full"
        title = getattr(load(name), "TITLE", "") if name in registry() else ""
        rows[name] = (f"{runner.get('status', '?')} (earlier {mode} run)", f"{runner.get('seconds', float('nan')):.1f}", title)
    for name in sorted(rows):
        status, seconds, title = rows[name]
        link = f"[{name}]({name}/report.md)" if (out_root / name / "report.md").exists() else name
        lines.append(f"| {link} | {status} | {seconds} | {title} |")
    if not summary:
        lines.append("| (no experiments registered) | | | |")
    (out_root / "index.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
