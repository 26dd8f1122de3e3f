"""Experiments that reproduce the papers' figures and tables on real data.

Each experiment is a module ``experiments/<name>.py`` (names not starting
with ``_``) that defines::

    TITLE = "one line"
    def run(out_dir: pathlib.Path, *, quick: bool) -> dict:
        '''Write report.md and PNG plots into out_dir; return JSON-able metrics.'''

The runner (``python -m experiments [NAMES...] [--quick]``) discovers the
modules, runs them with a progress bar, writes ``results/<name>/metrics.json``
and the index ``results/index.md``. Use :mod:`experiments._common` for the
report writer, plotting and progress bars.
"""
import importlib
import pkgutil
from pathlib import Path

__all__ = ["registry"]


def registry() -> dict[str, object]:
    """All experiment modules by name, in alphabetical order (imported lazily)."""
    names = sorted(
        m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if not m.name.startswith("_")
    )
    return {name: f"experiments.{name}" for name in names}


def load(name: str):
    """Import one experiment module by name."""
    reg = registry()
    if name not in reg:
        raise ValueError(f"unknown experiment {name!r}; available: {', '.join(reg) or '(none)'}")
    module = importlib.import_module(reg[name])
    if not callable(getattr(module, "run", None)):
        raise TypeError(f"experiment module {reg[name]} defines no run(out_dir, *, quick) function")
    return module
