"""``python -m benchmarks [NAMES...] [--quick] [--out benchmarks/results]``."""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from benchmarks import load, registry
from benchmarks._common import format_rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    parser.add_argument("--out", default="benchmarks/results", help="folder for the JSON files")
    args = parser.parse_args(argv)
    reg = registry()
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
        print(f"\n== {name}: {getattr(module, 'TITLE', '')} ==")
        rows = module.run(quick=args.quick)
        print(format_rows(rows))
        (out / f"{name}.json").write_text(
            json.dumps({"benchmark": name, "quick": args.quick, "machine": machine, "rows": rows}, indent=2, default=float)
        )
        print(f"wrote {out / (name + '.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
