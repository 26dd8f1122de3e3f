"""No module-level tuning knobs in the library, and no patching of library modules, checked by reading the source.

1. Under ``jaxsub/``: a module-level name bound to a bool/int/float literal (``_CHUNK = 512``,
   ``_FLAG = True``, ``1 << 20``, ``-1e-9``) or to a mutable container (a list, dict or set
   display or ``list()``/``dict()``/``set()`` call) is a tuning knob that a caller can only change
   by patching the module: hidden global state. Settings belong in an options ``NamedTuple``
   passed in (``jaxsub.compress.ClusterOptions``). Dunder names (``__all__``) and the entries of
   ``ALLOWED`` below (mathematical or format constants, each with its reason) are exempt.
2. Under ``tests/`` and ``benchmarks/``: ``setattr(module, ...)``, ``monkeypatch.setattr(module, ...)``
   (or ``monkeypatch.setattr("jaxsub....", ...)``) and ``module.NAME = ...`` where ``module`` is a
   ``jaxsub`` module: tests and benchmarks pass options instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jaxsub"

#: (path relative to the repository, name) -> why the module-level number or container is a true
#: constant, not a tuning knob. Entries marked ``PENDING`` are engine defaults that no options record
#: carries yet (a known gap: each is a candidate field of ``RaceOptions`` or a sampler's options).
PENDING = "an engine default that no options record carries yet"

ALLOWED: dict[tuple[str, str], str] = {
    ("jaxsub/anneal/crosscat/rows.py", "TICK_WORDS"): "format: uint32 words of a row tick in the key layout",
    ("jaxsub/anneal/moves.py", "TICK_WORDS"): "format: uint32 words per mixture tick in the key layout",
    ("jaxsub/anneal/two_urns.py", "TICK_WORDS"): "format: uint32 words per block tick in the key layout",
    ("jaxsub/racing/info.py", "INVALID_STATE"): "format: the sentinel state a flagged draw returns",
    ("jaxsub/arviz.py", "STAT_NAMES"): "format: jaxsub info field to ArviZ sample-stat name",
    ("jaxsub/racing/bounds.py", "_Z_LOW"): "maths: lower end of the quadrature grid, P(z < -9) = 1e-19",
    ("jaxsub/racing/bounds.py", "_Z_STEP"): "maths: quadrature step, agrees with a 4x finer grid to 1e-4",
    ("jaxsub/racing/info.py", "MAX_EVALUATIONS"): "format: the int32 range of the evaluation counters",
    ("jaxsub/subsample.py", "MAX_DOMAIN"): "format: indices are uint32",
    ("jaxsub/subsample.py", "_MAX_RADIX"): "format: Lemire's reduction is exact in 32 bits up to 2^16",
    (
        "jaxsub/subsample.py",
        "NUM_ROUNDS",
    ): "format: Feistel rounds define the permutation (changing them changes every draw)",
    ("jaxsub/subsample.py", "_ROUND_BITS"): "format: Feistel round budget defines the permutation",
    # tuning knobs outside jaxsub/compress: their owners move them into options
    (
        "jaxsub/coreference/options.py",
        "DEFAULT_MIN_ARM_DRAWS",
    ): "default of CorefOptions.min_arm_draws (the record carries it)",
    (
        "jaxsub/coreference/options.py",
        "DEFAULT_BATCH_SIZE",
    ): "default of CorefOptions.batch_size (the record carries it)",
    ("jaxsub/coreference/options.py", "DEFAULT_RACE_COST"): "default of CorefOptions.race_cost (the record carries it)",
    ("jaxsub/coreference/options.py", "WIDTH_COST_OFFSET"): "cost model: measured engine overhead per race, in µs",
    (
        "jaxsub/coreference/options.py",
        "SMALL_CLASS_CAP",
    ): "layout: blocks up to this size share one compiled update (no draw depends on it)",
    ("jaxsub/racing/compaction.py", "COLUMN_COMPACT_MIN_D"): PENDING,
    ("jaxsub/racing/compaction.py", "LEVEL_RATIO"): PENDING,
    ("jaxsub/racing/config.py", "DEFAULT_MAX_BLOCK"): PENDING,
    ("jaxsub/racing/config.py", "DEFAULT_EXACT_PASS_COST"): PENDING,
    ("jaxsub/racing/config.py", "LARGE_D_PASS"): PENDING,
    ("jaxsub/racing/config.py", "LARGE_D_EXACT_PASS_COST"): PENDING,
    ("jaxsub/racing/config.py", "DEFAULT_SKEW_GUARD"): PENDING,
    ("jaxsub/racing/config.py", "LADDER"): PENDING,
    ("jaxsub/racing/elimination.py", "SKEW_WAIVER"): PENDING,
    ("jaxsub/racing/exact.py", "TRANSPOSED_SUM_MAX_K"): PENDING,
    ("jaxsub/racing/exact.py", "SUB_BLOCK"): PENDING,
    ("jaxsub/racing/exact_pass.py", "PASS_ROWS"): PENDING,
    ("jaxsub/racing/exact_pass.py", "ROW_PASS"): PENDING,
    ("jaxsub/racing/exact_pass.py", "PASS_LADDER"): PENDING,
    ("jaxsub/racing/mh_config.py", "EXACT_BLOCK"): PENDING,
    ("jaxsub/subsample.py", "_BLOCK"): PENDING,
    ("jaxsub/subsample.py", "_WALK_TAIL"): PENDING,
}

#: (path, patched module) -> why a test patches a library module (entries name tests of other packages).
PATCHES_ALLOWED: dict[tuple[str, str], str] = {
    ("tests/test_datasets.py", "jaxsub.datasets"): "stubs the source-checkout locator (the file system, not a setting)",
    ("tests/test_crosscat.py", "jaxsub.anneal.crosscat"): "patches _HYPER_WIDTHS, a knob to move into options (owner)",
    (
        "tests/test_discrete.py",
        "jaxsub.racing.exact_pass",
    ): "patches ROW_PASS / PASS_LADDER, knobs to move into options (owner)",
}


def _is_knob_value(node: ast.AST) -> bool:
    """A bool/int/float literal (possibly signed or built from literals by arithmetic), or a mutable container."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (bool, int, float)) and node.value is not None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _is_knob_value(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_knob_value(node.left) and _is_knob_value(node.right)
    if isinstance(node, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"list", "dict", "set"}:
        return True
    return False


def module_knobs(source: str) -> list[tuple[str, int]]:
    """``(name, line)`` of every module-level knob in ``source`` (rule 1 of the module docstring)."""
    out = []
    for stmt in ast.parse(source).body:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        if not _is_knob_value(value):
            continue
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name) and not (name.id.startswith("__") and name.id.endswith("__")):
                    out.append((name.id, stmt.lineno))
    return out


def _is_module(dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[0] != "jaxsub":
        return False
    path = ROOT.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted ``jaxsub`` module it is bound to by an import statement of the file."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "jaxsub":
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        aliases["jaxsub"] = "jaxsub"
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "jaxsub"
            and not node.level
        ):
            for a in node.names:
                if _is_module(f"{node.module}.{a.name}"):
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return None if base is None else f"{base}.{node.attr}"
    return None


def module_patches(source: str) -> list[tuple[str, int]]:
    """``(target, line)`` of every patch of a ``jaxsub`` module in ``source`` (rule 2 of the module docstring)."""
    tree = ast.parse(source)
    aliases = _module_aliases(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name != "setattr" or not node.args:
                continue
            target = node.args[0]
            if (
                isinstance(target, ast.Constant)
                and isinstance(target.value, str)
                and target.value.startswith("jaxsub.")
            ):
                out.append((target.value, node.lineno))
                continue
            dotted = _dotted(target, aliases)
            if dotted is not None and _is_module(dotted):
                out.append((dotted, node.lineno))
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                        dotted = _dotted(sub.value, aliases)
                        if dotted is not None and _is_module(dotted):
                            out.append((f"{dotted}.{sub.attr}", node.lineno))
    return out


def test_library_has_no_module_level_tuning_knobs():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for name, line in module_knobs(path.read_text()):
            if (rel, name) not in ALLOWED:
                found.append(f"{rel}:{line} {name}")
    assert not found, "module-level tuning knobs (move them into an options NamedTuple):\n" + "\n".join(found)


def test_allowlist_names_existing_constants():
    """Every allowlisted entry still exists (a stale entry would hide a future knob of that name)."""
    stale = []
    for rel, name in ALLOWED:
        path = ROOT / rel
        if not path.is_file() or name not in {n for n, _ in module_knobs(path.read_text())}:
            stale.append(f"{rel} {name}")
    assert not stale, stale


def test_tests_and_benchmarks_do_not_patch_library_modules():
    found = []
    for folder in ("tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for target, line in module_patches(path.read_text()):
                if (rel, target) in PATCHES_ALLOWED:
                    continue
                found.append(f"{path.relative_to(ROOT).as_posix()}:{line} {target}")
    assert not found, "patches of jaxsub modules (pass options instead):\n" + "\n".join(found)


def test_scanners_catch_known_offenders():
    """Negative controls: the scanners flag the patterns they exist for, and pass true constants."""
    knobs = module_knobs(
        "_CHUNK = 512\n_FLAG = True\n_MIN = 1 << 20\n_EPS = -1e-9\n_CACHE = {}\n_SEEN: list = []\n"
        "RULES = ('a', 'b')\nNAME = 'x'\n__all__ = ['f']\n"
    )
    assert [n for n, _ in knobs] == ["_CHUNK", "_FLAG", "_MIN", "_EPS", "_CACHE", "_SEEN"]
    patches = module_patches(
        "import jaxsub.compress.api as impl\nfrom jaxsub.compress import options\nimport jaxsub\n"
        "def t(monkeypatch):\n"
        "    monkeypatch.setattr(impl, 'X', 1)\n"
        "    setattr(options, 'Y', 2)\n"
        "    monkeypatch.setattr('jaxsub.compress.api.Z', 3)\n"
        "    impl.W = 4\n"
        "    monkeypatch.setattr(jaxsub.compress, 'cluster', None)\n"
        "    import concurrent.futures as cf\n"
        "    monkeypatch.setattr(cf, 'ThreadPoolExecutor', None)\n"
    )
    assert sorted(t for t, _ in patches) == sorted(
        [
            "jaxsub.compress.api",
            "jaxsub.compress.options",
            "jaxsub.compress.api.Z",
            "jaxsub.compress.api.W",
            "jaxsub.compress",
        ]
    )
