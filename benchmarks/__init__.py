"""Benchmarks: wall-clock of each jaxsub sampler as a ratio to its exact baseline.

Each benchmark is a module ``benchmarks/<name>.py`` (not starting with ``_``)
defining::

    TITLE = "one line"
    def run(*, quick: bool) -> list[dict]:
        '''Return table rows (JSON-able dicts).'''

Timings must come from :func:`benchmarks._common.compare`, which alternates
baseline and candidate calls in the same run, takes medians, and reports
compile time separately: machines are noisy, so only ratios measured in one
run are meaningful. ``python -m benchmarks [NAMES...] [--quick]`` prints each
table and writes ``benchmarks/results/<name>.json``.
"""
import ast
import importlib
import pkgutil
from pathlib import Path

__all__ = ["registry", "load", "title"]


def registry() -> dict[str, str]:
    names = sorted(
        m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if not m.name.startswith("_")
    )
    return {name: f"benchmarks.{name}" for name in names}


def load(name: str):
    reg = registry()
    if name not in reg:
        raise ValueError(f"unknown benchmark {name!r}; available: {', '.join(reg) or '(none)'}")
    module = importlib.import_module(reg[name])
    if not callable(getattr(module, "run", None)):
        raise TypeError(f"benchmark module {reg[name]} defines no run(*, quick) function")
    return module


def title(name: str) -> str:
    """The benchmark's ``TITLE``, read from its source (nothing is imported)."""
    tree = ast.parse((Path(__file__).parent / f"{name}.py").read_text())
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TITLE" for t in stmt.targets):
            try:
                return str(ast.literal_eval(stmt.value))
            except ValueError:
                return ""
    return ""
