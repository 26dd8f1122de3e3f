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

# Modules of this package that are tools, not benchmarks.
TOOLS = ("report",)


def registry() -> dict[str, str]:
    """Every benchmark: module ``benchmarks/<name>.py`` not starting with ``_`` and not a tool.

    Returns
    -------
    dict
        ``name -> module path``, sorted by name.
    """
    names = sorted(
        m.name
        for m in pkgutil.iter_modules([str(Path(__file__).parent)])
        if not m.name.startswith("_") and m.name not in TOOLS
    )
    return {name: f"benchmarks.{name}" for name in names}


def load(name: str):
    """Import the benchmark ``name``.

    Parameters
    ----------
    name
        A key of :func:`registry`.

    Returns
    -------
    module
        The benchmark module (it defines ``run(*, quick)``).

    Raises
    ------
    ValueError
        When ``name`` is not a benchmark.
    TypeError
        When the module defines no ``run`` function.
    """
    reg = registry()
    if name not in reg:
        raise ValueError(f"unknown benchmark {name!r}; available: {', '.join(reg) or '(none)'}")
    module = importlib.import_module(reg[name])
    if not callable(getattr(module, "run", None)):
        raise TypeError(f"benchmark module {reg[name]} defines no run(*, quick) function")
    return module


def title(name: str) -> str:
    """The benchmark's ``TITLE``, read from its source (nothing is imported).

    Parameters
    ----------
    name
        A key of :func:`registry`.

    Returns
    -------
    str
        The title, or ``""`` when the module has none.
    """
    tree = ast.parse((Path(__file__).parent / f"{name}.py").read_text())
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TITLE" for t in stmt.targets):
            try:
                return str(ast.literal_eval(stmt.value))
            except ValueError:
                return ""
    return ""
