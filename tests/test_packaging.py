"""Packaging: what the wheel ships, what the library imports, and a fresh-venv install.

* fast: every module the library imports is a declared dependency (module-level
  imports: core dependencies; imports inside a function: core or an extra);
* fast: the package list of the wheel is ``jaxsub`` and its subpackages only;
* slow (``-m slow``, also run by ``.ci/run``): build the wheel, install it into a
  fresh virtual environment (dependencies from the package index, or pip's cache),
  and run the README quickstart from outside the source tree with small sizes.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from _docblocks import ROOT, python_blocks

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _dist_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imports(path: Path):
    """(module, at_module_level) for every absolute import in a file."""
    tree = ast.parse(path.read_text(), str(path))
    function_nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function_nodes |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            yield name.split(".")[0], id(node) not in function_nodes


def test_library_imports_are_declared():
    core = {_dist_name(r) for r in PYPROJECT["project"]["dependencies"]}
    extras = {_dist_name(r) for reqs in PYPROJECT["project"]["optional-dependencies"].values() for r in reqs}
    dists_of = importlib.metadata.packages_distributions()
    problems = []
    for path in sorted((ROOT / "jaxsub").rglob("*.py")):
        for module, top_level in _imports(path):
            if module in sys.stdlib_module_names or module in ("jaxsub", "__future__"):
                continue
            dists = {d.lower().replace("_", "-") for d in dists_of.get(module, [module])}
            allowed = core if top_level else core | extras
            if not dists & allowed:
                where = "at module level (must be a core dependency)" if top_level else "(not in any dependency list)"
                problems.append(f"{path.relative_to(ROOT)} imports {module} {where}")
    assert not problems, "undeclared imports:\n" + "\n".join(sorted(set(problems)))


def test_wheel_ships_only_jaxsub():
    from setuptools import find_packages

    spec = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(where=str(ROOT), include=spec["include"], exclude=spec.get("exclude", ()))
    assert "jaxsub" in packages and "jaxsub.sgmcmc" in packages
    assert all(p == "jaxsub" or p.startswith("jaxsub.") for p in packages), packages
    assert not {"experiments", "benchmarks", "tests"} & set(packages)


def _run(cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result


@pytest.mark.slow
@pytest.mark.packaging
def test_wheel_installs_in_fresh_venv_and_runs_quickstart(tmp_path):
    dist = tmp_path / "dist"
    # Build from a clean copy (a stale build/ folder could otherwise leak old files into the wheel);
    # pip builds in an isolated build environment (setuptools from the index or pip's cache).
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".ci", "build", "dist", "*.egg-info", "__pycache__", "results", ".pytest_cache", ".benchmarks"
        ),
    )
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), str(source)])
    (wheel,) = dist.glob("jaxsub-*.whl")
    top = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert top == {"jaxsub", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, top

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    _run([str(python), "-m", "pip", "install", "--quiet", str(wheel)])

    (quickstart,) = [b for b in python_blocks(ROOT / "README.md") if "jaxsub" in b.code][:1]
    script = tmp_path / "quickstart.py"
    script.write_text(
        "import jaxsub, pathlib\n"
        f"assert pathlib.Path(jaxsub.__file__).is_relative_to({str(env_dir)!r}), jaxsub.__file__\n"
        "import jaxsub.datasets\n" + quickstart.source("small")
    )
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JAXSUB_DATA_DIR")}
    out = _run([str(python), str(script)], cwd=tmp_path, env=clean_env, timeout=600)
    print(out.stdout)
