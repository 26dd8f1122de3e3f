"""Time each jaxsub sampler against its exact baseline, in the same run.

``python -m benchmarks [NAMES...] [--quick] [--out benchmarks/results]``: ratios
measured with alternating calls (medians; compile time reported apart). Each
benchmark prints its table and writes ``OUT/NAME.json``, which records the mode
(``"quick": true/false``), the machine (platform, cores, JAX devices and the load
average before and after the run), the commit and the date.
``python -m benchmarks.report`` turns the JSON files of ``docs/performance/`` into
the performance page.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import load, registry, title
from benchmarks._common import format_rows

ROOT = Path(__file__).resolve().parent.parent


def commit_of(root: Path = ROOT) -> str:
    """The checkout's commit hash, with ``+dirty`` when tracked files differ from it ("unknown" outside git).

    Parameters
    ----------
    root
        A folder inside the git checkout.

    Returns
    -------
    str
        The hash of ``HEAD`` (``+dirty`` appended when ``git status`` lists modified tracked files).
    """
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``None`` where the platform has none).

    Returns
    -------
    list of float or None
        ``os.getloadavg()`` as a list.
    """
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine_info() -> dict:
    """What the timings ran on: platform, processor, cores, JAX version and devices.

    Returns
    -------
    dict
        JSON-able description of the machine.
    """
    import jax

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
    }


def run_one(name: str, quick: bool, machine: dict) -> dict:
    """Run one benchmark and return its JSON record (rows plus provenance).

    Parameters
    ----------
    name
        A benchmark of :func:`benchmarks.registry`.
    quick
        Smaller sizes and fewer repeats.
    machine
        :func:`machine_info` of this machine.

    Returns
    -------
    dict
        ``benchmark``, ``quick``, ``machine``, ``commit``, ``date`` (UTC, ISO 8601, at the start),
        ``load_average`` (``before`` and ``after``), ``wall_s`` and ``rows``.
    """
    module = load(name)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    commit = commit_of()  # the code measured: taken before the run, as edits may follow
    before = load_average()
    start = time.perf_counter()
    rows = module.run(quick=quick)
    wall = time.perf_counter() - start
    return {
        "benchmark": name,
        "title": getattr(module, "TITLE", ""),
        "quick": quick,
        "machine": machine,
        "commit": commit,
        "date": date,
        "load_average": {"before": before, "after": load_average()},
        "wall_s": round(wall, 1),
        "rows": rows,
    }


def main(argv=None) -> int:
    """Command line: run the named benchmarks (default all) and write their JSON files.

    Parameters
    ----------
    argv
        Arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status.
    """
    reg = registry()
    listing = "benchmarks:\n" + "\n".join(f"  {name:<16} {title(name)}" for name in reg)
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        epilog=listing,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    parser.add_argument("--out", default="benchmarks/results", help="folder for the JSON files")
    args = parser.parse_args(argv)
    names = args.names or list(reg)
    unknown = [n for n in names if n not in reg]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; available: {list(reg)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    for name in names:
        print(f"\n== {name} ({'quick' if args.quick else 'full'} mode): {title(name)} ==", flush=True)
        record = run_one(name, args.quick, machine)
        print(format_rows(record["rows"]))
        (out / f"{name}.json").write_text(json.dumps(record, indent=2, default=float) + "\n")
        print(f"wrote {out / (name + '.json')} ({record['wall_s']} s, load {record['load_average']})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
