"""Time each jaxsub sampler against its exact baseline, in the same run.

``python -m benchmarks [NAMES...] [--quick] [--out benchmarks/results]``: ratios
measured with alternating calls (medians; compile time reported apart). Each
benchmark prints its table and writes ``OUT/NAME.json``, which records the mode
(``"quick": true/false``) and the machine.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from benchmarks import load, registry, title
from benchmarks._common import format_rows


def main(argv=None) -> int:
    reg = registry()
    listing = "benchmarks:\n" + "\n".join(f"  {name:<16} {title(name)}" for name in reg)
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, epilog=listing,
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
    import jax

    machine = {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "jax": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
    }
    for name in names:
        module = load(name)
        print(f"\n== {name} ({'quick' if args.quick else 'full'} mode): {getattr(module, 'TITLE', '')} ==")
        rows = module.run(quick=args.quick)
        print(format_rows(rows))
        (out / f"{name}.json").write_text(
            json.dumps({"benchmark": name, "quick": args.quick, "machine": machine, "rows": rows}, indent=2, default=float)
        )
        print(f"wrote {out / (name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
