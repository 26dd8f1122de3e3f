"""One docstring style (numpydoc) on every public callable, and an API page for every public name.

The public names are found by walking ``jaxsub.__all__`` and the ``__all__`` of every module
or callable sampler module it reaches (``jaxsub.anneal``, ``jaxsub.racing_mh``,
``jaxsub.anneal.crosscat``, ...). A public function needs a summary line, a ``Parameters``
section when it takes parameters, a ``Returns`` (or ``Yields``) section when it returns a
value, and a ``Raises`` section when its own body raises ``ValueError`` or ``TypeError``
(found by reading its source with :mod:`ast`); a public class needs a summary line.

Every public name must be rendered by some page of ``docs/api/``: a ``::: module`` directive
renders the names of that module's ``__all__`` (mkdocstrings), ``::: module.name`` one name.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
from pathlib import Path
from typing import NamedTuple

import pytest

import jaxsub

ROOT = Path(__file__).resolve().parent.parent
API_DIR = ROOT / "docs" / "api"


class Public(NamedTuple):
    path: str  # the public dotted path, e.g. "jaxsub.discrete.racing"
    module: types.ModuleType  # the module whose __all__ lists it
    module_path: str  # that module's public dotted path, e.g. "jaxsub.racing_mh"
    name: str
    obj: object


def _as_module(obj):
    if isinstance(obj, types.ModuleType):
        return obj
    module = getattr(obj, "_module", None)  # jaxsub._toplevel.TopLevelAPI: a callable sampler module
    return module if isinstance(module, types.ModuleType) else None


def public_names() -> list[Public]:
    """Every name of ``jaxsub.__all__`` and of the ``__all__`` of each module reached through it."""
    found, seen = [], set()
    todo = [("jaxsub", jaxsub)]
    while todo:
        path, module = todo.pop(0)
        if module.__name__ in seen:
            continue
        seen.add(module.__name__)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            found.append(Public(f"{path}.{name}", module, path, name, obj))
            sub = _as_module(obj)
            if sub is not None and sub.__name__.startswith("jaxsub"):
                todo.append((f"{path}.{name}", sub))
    return found


PUBLIC = public_names()


# --------------------------------------------------------------------------- docstring style

_SECTION = r"^[ \t]*{}[ \t]*\n[ \t]*-{{3,}}[ \t]*$"


def has_section(doc: str, *titles: str) -> bool:
    """True when the numpydoc docstring has one of the sections (title line underlined by dashes)."""
    return any(re.search(_SECTION.format(re.escape(t)), doc, re.M) for t in titles)


def _function_node(fn) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == fn.__name__:
            return node
    return None


def _own_nodes(func: ast.AST):
    """The nodes of a function body, without those of the functions and classes defined inside it."""
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def raised_errors(func: ast.AST) -> set[str]:
    """Names of ``ValueError`` / ``TypeError`` raised by the function's own body."""
    names = set()
    for node in _own_nodes(func):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id in ("ValueError", "TypeError"):
                names.add(exc.id)
    return names


def returns_value(func: ast.AST) -> bool:
    """True when the function's own body returns a value (or yields)."""
    for node in _own_nodes(func):
        if isinstance(node, ast.Return) and node.value is not None:
            if not (isinstance(node.value, ast.Constant) and node.value.value is None):
                return True
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
    return False


def style_problems(obj) -> list[str]:
    """What the public callable's docstring misses (empty when it follows numpydoc)."""
    doc = inspect.getdoc(obj) or ""
    if not doc.strip():
        return ["no docstring"]
    problems = []
    if inspect.isclass(obj):
        return problems
    fn = inspect.unwrap(obj)
    if not inspect.isfunction(fn):
        return problems
    params = [p for p in inspect.signature(fn).parameters.values() if p.name not in ("self", "cls")]
    if params and not has_section(doc, "Parameters"):
        problems.append("no Parameters section")
    node = _function_node(fn)
    if node is None:
        return problems
    if returns_value(node) and not has_section(doc, "Returns", "Yields"):
        problems.append("no Returns section")
    raised = raised_errors(node)
    if raised and not has_section(doc, "Raises"):
        problems.append(f"raises {'/'.join(sorted(raised))} but has no Raises section")
    return problems


def _callables():
    out, seen = {}, set()
    for pub in PUBLIC:
        obj = pub.obj
        if _as_module(obj) is not None or not callable(obj) or id(obj) in seen:
            continue
        if not (getattr(obj, "__module__", "") or "").startswith("jaxsub"):
            continue  # re-exported from another library (e.g. blackjax's SamplingAlgorithm)
        seen.add(id(obj))
        out[pub.path] = obj
    return out


CALLABLES = _callables()


def test_the_walk_finds_the_families():
    paths = {p.path for p in PUBLIC}
    for expected in (
        "jaxsub.run_chain",
        "jaxsub.discrete.racing",
        "jaxsub.racing_mh.laplace_fit",
        "jaxsub.compress.cluster",
        "jaxsub.anneal.fit",
        "jaxsub.anneal.crosscat.fit",
        "jaxsub.coreference.fit",
        "jaxsub.sgmcmc.gaussian_surrogates",
    ):
        assert expected in paths
    assert len(CALLABLES) > 150


@pytest.mark.parametrize("path", sorted(CALLABLES))
def test_public_callable_docstring_follows_numpydoc(path):
    problems = style_problems(CALLABLES[path])
    assert not problems, f"{path}: {', '.join(problems)}"


def test_style_checks_can_fail():
    def good(x, y=1):
        """Add.

        Parameters
        ----------
        x, y
            Numbers.

        Returns
        -------
        number
            The sum.

        Raises
        ------
        ValueError
            When ``x`` is negative.
        """
        if x < 0:
            raise ValueError("x must be >= 0")
        return x + y

    def google(x):
        """Add one.

        Args:
            x: a number.

        Returns:
            x + 1.
        """
        if x is None:
            raise TypeError("x")
        return x + 1

    def silent(x):
        """Validate."""

        def inner():
            raise ValueError("only the closure raises")

        return None

    assert style_problems(good) == []
    assert style_problems(google) == [
        "no Parameters section",
        "no Returns section",
        "raises TypeError but has no Raises section",
    ]
    assert style_problems(silent) == ["no Parameters section"]


# --------------------------------------------------------------------------- API pages

_DIRECTIVE = re.compile(r"^:::[ \t]+([\w.]+)[ \t]*$", re.M)


def api_directives() -> set[str]:
    """The targets of the ``::: target`` directives of ``docs/api/*.md``."""
    return {m.group(1) for page in sorted(API_DIR.glob("*.md")) for m in _DIRECTIVE.finditer(page.read_text())}


def _griffe_module_names() -> dict[str, bool]:
    """For each ``module.name`` reached by a module directive: whether griffe sees a module there (empty without griffe).

    mkdocstrings (through griffe) skips submodules on a module's page, so a function whose
    name is also a submodule's (``jaxsub.discrete.lil_ucb``) needs its own directive.
    """
    try:
        import griffe
    except ImportError:  # the docs extra is not installed: check the directives alone
        return {}
    package = griffe.load("jaxsub", search_paths=[str(ROOT)], resolve_aliases=True, resolve_external=False)
    kinds = {}
    for pub in PUBLIC:
        for module_path in (pub.module_path, pub.module.__name__):
            try:
                kinds[f"{module_path}.{pub.name}"] = package[f"{module_path}.{pub.name}"[len("jaxsub.") :]].is_module
            except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
    return kinds


def uncovered_names(directives: set[str], griffe_kinds: dict[str, bool] | None = None) -> list[str]:
    """Public names that no API directive renders (a name is covered through any of its paths)."""
    covered = set()
    for pub in PUBLIC:
        if not (getattr(pub.obj, "__module__", None) or "jaxsub").startswith("jaxsub"):
            covered.add(id(pub.obj))  # re-exported from another library: its own docs (e.g. SamplingAlgorithm)
            continue
        module_paths = (pub.module_path, pub.module.__name__)
        sub = _as_module(pub.obj)
        own = {f"{m}.{pub.name}" for m in module_paths}
        if sub is not None:
            own.add(sub.__name__)
        qualname = getattr(pub.obj, "__qualname__", None)
        if qualname and isinstance(getattr(pub.obj, "__module__", None), str):
            own.add(f"{pub.obj.__module__}.{qualname}")
        if own & directives:
            covered.add(id(pub.obj))
            continue
        for module_path in module_paths:
            shown_as_module = (griffe_kinds or {}).get(f"{module_path}.{pub.name}", False) and sub is None
            if module_path in directives and not shown_as_module:
                covered.add(id(pub.obj))
    return sorted({pub.path for pub in PUBLIC if id(pub.obj) not in covered})


def test_every_public_name_is_on_an_api_page():
    missing = uncovered_names(api_directives(), _griffe_module_names())
    assert not missing, f"public names on no docs/api page (add a ::: directive): {missing}"


def test_api_directives_name_public_objects():
    public = {p.path for p in PUBLIC} | {p.module.__name__ for p in PUBLIC} | {"jaxsub"}
    public |= {f"{p.module.__name__}.{p.name}" for p in PUBLIC}
    public |= {_as_module(p.obj).__name__ for p in PUBLIC if _as_module(p.obj) is not None}
    public |= {f"{p.obj.__module__}.{p.obj.__qualname__}" for p in PUBLIC if hasattr(p.obj, "__qualname__")}
    stray = sorted(d for d in api_directives() if d not in public)
    assert not stray, f"docs/api directives naming no public object: {stray}"


def test_coverage_check_can_fail():
    assert "jaxsub.compress.cluster" in uncovered_names({"jaxsub.discrete"})
    assert "jaxsub.compress.cluster" not in uncovered_names({"jaxsub.compress"})


def test_a_function_named_like_a_submodule_needs_its_own_directive():
    kinds = _griffe_module_names()
    if not kinds:
        pytest.skip("griffe (the docs extra) is not installed")
    assert "jaxsub.discrete.lil_ucb" in uncovered_names({"jaxsub.discrete"}, kinds)
    assert "jaxsub.discrete.lil_ucb" not in uncovered_names({"jaxsub.discrete", "jaxsub.racing.lil_ucb.lil_ucb"}, kinds)
