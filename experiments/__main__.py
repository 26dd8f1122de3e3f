"""Run the experiments that reproduce the papers' figures and tables.

``python -m experiments``               every experiment, QUICK mode (small sizes, minutes in total)
``python -m experiments --full``        every experiment at the papers' sizes (an hour or more)
``python -m experiments NAME [NAME...]`` the named experiments at full size (add --quick for small sizes)
``python -m experiments --list``        names, titles, run times and the datasets each one needs

Each run writes ``OUT/<name>/report.md`` (stamped with the mode that produced it),
PNG plots, ``metrics.json`` and the index ``OUT/index.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from experiments import describe, registry
from experiments._runner import run_one as _run_one


def resolve_mode(names, quick: bool, full: bool) -> bool:
    """``True`` for quick mode. No names: quick unless ``--full``; named experiments: full unless ``--quick``."""
    if quick and full:
        raise ValueError("--quick and --full exclude each other")
    if quick or full:
        return quick
    return not names


def _last_runs(out_root: Path, name: str) -> str:
    path = out_root / name / "metrics.json"
    try:
        runner = json.loads(path.read_text()).get("_runner", {})
    except (OSError, ValueError):
        return "no run recorded in " + str(out_root)
    mode = "quick" if runner.get("quick") else "full"
    return f"last run here: {mode}, {runner.get('seconds', float('nan')):.0f} s, {runner.get('status', '?')}"


def print_list(out_root: Path) -> None:
    for name in registry():
        info = describe(name)
        print(f"{name} - {info['title']}")
        print(f"    run time: {info['run_time'] or 'not declared'}; {_last_runs(out_root, name)}")
        if not info["data"]:
            print("    data: none (synthetic)")
        for d in info["data"]:
            status = "available" if d["available"] else "MISSING"
            print(f"    data: {d['source']} via jaxsub.datasets.{d['loader']} ({status})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="experiments: " + ", ".join(registry()),
    )
    parser.add_argument("names", nargs="*", help="experiments to run (default: all, in quick mode)")
    parser.add_argument("--quick", action="store_true", help="small sizes (the default when no names are given)")
    parser.add_argument("--full", action="store_true", help="the papers' sizes (the default for named experiments)")
    parser.add_argument("--out", default="results", help="output folder (default: results)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="experiments run at once, each in its own process (default: one per CPU core)",
    )
    parser.add_argument("--list", action="store_true", help="list experiments with run time and data needs, and exit")
    args = parser.parse_args(argv)

    reg = registry()
    if args.list:
        print_list(Path(args.out))
        return 0
    try:
        quick = resolve_mode(args.names, args.quick, args.full)
    except ValueError as err:
        parser.error(str(err))
    names = args.names or list(reg)
    unknown = [n for n in names if n not in reg]
    if unknown:
        parser.error(f"unknown experiment(s) {unknown}; available: {list(reg)}")
    mode = "quick" if quick else "full"
    hint = "small sizes; --full for the papers' sizes" if quick else "the papers' sizes; --quick for small sizes"
    print(f"mode: {mode} ({hint})")

    from tqdm.auto import tqdm

    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    try:
        jobs = _jobs(args.jobs, len(names))
    except ValueError as err:
        parser.error(str(err))
    summary, failures = [], []
    for name, status, elapsed in _run_all(names, out_root, quick, jobs, tqdm):
        if status != "ok":
            failures.append(name)
        summary.append((name, status, elapsed, describe(name)["title"]))
        _write_index(out_root, summary, quick)
    _write_index(out_root, summary, quick)
    print(f"wrote {out_root / 'index.md'}")
    return 1 if failures else 0


def _jobs(requested: int | None, n: int) -> int:
    """Worker processes: ``--jobs`` if given, else one per CPU core (at most one per experiment)."""
    if requested is not None and requested < 1:
        raise ValueError(f"--jobs must be >= 1; got {requested}")
    jobs = requested if requested is not None else (os.cpu_count() or 1)
    return max(1, min(jobs, n))


def _run_all(names, out_root: Path, quick: bool, jobs: int, tqdm):
    """Yield ``(name, status, seconds)`` as experiments finish.

    With one job the experiments run here, one after the other, their progress bars on the
    terminal. With several, each runs in its own fresh process (``spawn``: JAX must not be
    forked) and its output goes to ``OUT/<name>/log.txt``; compilation is single-threaded,
    so on 2 cores two experiments at a time finish the quick suite in little more than half
    the time.
    """
    bar = tqdm(total=len(names), desc="experiments", unit="exp")
    if jobs == 1:
        for name in names:
            yield _run_one(name, str(out_root), quick, None)
            bar.update()
        bar.close()
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_run_one, name, str(out_root), quick, "log.txt") for name in names]
        for future in as_completed(futures):
            name, status, elapsed = future.result()
            bar.set_postfix_str(f"{name} {status} {elapsed:.0f} s")
            bar.update()
            if status != "ok":
                print(f"{name} FAILED: see {out_root / name / 'log.txt'}", file=sys.stderr)
            yield name, status, elapsed
    bar.close()


def _write_index(out_root: Path, summary, quick: bool) -> None:
    lines = [
        "# jaxsub experiment results",
        "",
        f"Mode of this run: {'quick (small sizes)' if quick else 'full (the papers’ sizes)'}; the mode column says "
        "which mode produced each row. Each row links the experiment's report; figures and metrics.json sit beside it.",
        "",
        "| experiment | mode | status | seconds | what |",
        "|---|---|---|---|---|",
    ]
    this_mode = "quick" if quick else "full"
    rows = {name: (this_mode, status, f"{elapsed:.1f}", title) for name, status, elapsed, title in summary}
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
        title = describe(name)["title"] if name in registry() else ""
        rows[name] = (
            mode,
            f"{runner.get('status', '?')} (earlier run)",
            f"{runner.get('seconds', float('nan')):.1f}",
            title,
        )
    for name in sorted(rows):
        mode, status, seconds, title = rows[name]
        link = f"[{name}]({name}/report.md)" if (out_root / name / "report.md").exists() else name
        lines.append(f"| {link} | {mode} | {status} | {seconds} | {title} |")
    if not summary:
        lines.append("| (no experiments registered) | | | | |")
    (out_root / "index.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
