"""No hidden state in the library (docs/architecture.md, "No hidden state"), checked by reading the source.

What is rejected, anywhere under ``jaxsub/``:

1. a ``functools.cache`` / ``lru_cache`` function whose body compiles
   (calls ``jax.jit`` / ``jit`` / ``jax.pmap``): a module-level cache of compiled programs;
2. mutable module state: a module-level ``dict``/``list``/``set`` that a function
   mutates (item assignment, ``del``, ``.append``/``.update``/``.setdefault``/...), or a
   ``global`` statement;
3. ``jax.jit`` evaluated at import time (a module-level ``@jax.jit`` decorator or
   ``f = jax.jit(...)`` at module level);
4. ``jax.jit`` anywhere but in the drivers listed in ``DRIVERS`` (host-side loops that
   compile afresh at each call, as ``blackjax.util.run_inference_algorithm`` does);
5. a PRNG key made inside the library (``jax.random.key(0)`` / ``PRNGKey(...)``
   as a default): keys are passed in.

Caches of pure host-side numbers (``lru_cache`` on a function of Python scalars
returning Python scalars, e.g. the ``b_normal`` threshold or the Feistel radices)
and of loaded datasets are allowed: they hold no compiled program and no state
that changes results.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jaxsub"

#: Functions allowed to call ``jax.jit``: drivers of host-side loops, compiling at each call.
DRIVERS = {
    "jaxsub/base.py": {"run_chain", "run_chains"},
    "jaxsub/racing/control_variates.py": {
        "parameter_taylor_control_variate"
    },  # one pass over the data in blocks, before sampling
    "jaxsub/coreference/fit.py": {"fit"},  # annealed sweeps driven from the host
}

#: Host-side driver modules whose module-level functions are compiled with ``jax.jit`` and
#: static arguments (the sanctioned pattern: JAX owns that cache, keyed by the static
#: arguments; nothing the library holds changes results). Only ``fit``-style drivers call them.
MODULE_JIT_DRIVERS = {"jaxsub/anneal/driver.py", "jaxsub/anneal/crosscat/fit.py"}
COMPILERS = {"jit", "pmap", "pjit"}
CACHES = {"cache", "lru_cache"}
MUTATORS = {"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "add", "remove", "discard"}


def _name(node) -> str | None:
    """``jax.jit`` -> ``jit``; ``functools.lru_cache`` -> ``lru_cache``; ``partial(jax.jit, ...)`` -> ``jit``."""
    if isinstance(node, ast.Call):
        if _name(node.func) == "partial" and node.args:
            return _name(node.args[0])
        return _name(node.func)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _compiles(node) -> bool:
    return any(isinstance(n, ast.Call) and _name(n.func) in COMPILERS for n in ast.walk(node)) or any(
        _name(d) in COMPILERS
        for n in ast.walk(node)
        if isinstance(n, (ast.FunctionDef, ast.Lambda))
        for d in getattr(n, "decorator_list", [])
    )


def _enclosing_functions(tree):
    """Map id(node) -> name of the outermost module-level function containing it."""
    owner = {}
    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(top):
                owner[id(n)] = top.name
        elif isinstance(top, ast.ClassDef):
            for item in top.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for n in ast.walk(item):
                        owner[id(n)] = f"{top.name}.{item.name}"
    return owner


def hidden_state(source: str, relpath: str) -> list[str]:
    tree = ast.parse(source)
    found = []
    owner = _enclosing_functions(tree)

    # 1. caches of compiled programs
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(_name(d) in CACHES for d in node.decorator_list) and _compiles(node):
                found.append(
                    f"{relpath}:{node.lineno}: {node.name} caches a compiled program (@{'/'.join(CACHES)} + jit)"
                )
        if isinstance(node, ast.Call) and _name(node.func) in CACHES and node.args and _compiles(node.args[0]):
            found.append(f"{relpath}:{node.lineno}: lru_cache/cache around a jitted function")

    # 2. mutable module state
    module_containers = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            value = stmt.value
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            mutable = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
                isinstance(value, ast.Call)
                and _name(value.func)
                in {"dict", "list", "set", "defaultdict", "OrderedDict", "WeakValueDictionary", "WeakKeyDictionary"}
            )
            if mutable:
                module_containers |= {t.id for t in targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if id(node) not in owner:
            continue
        if isinstance(node, ast.Global):
            found.append(f"{relpath}:{node.lineno}: global {', '.join(node.names)} (mutable module state)")
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for t in targets:
            if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in module_containers:
                found.append(f"{relpath}:{node.lineno}: {owner[id(node)]} writes into module-level {t.value.id}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in module_containers
        ):
            found.append(f"{relpath}:{node.lineno}: {owner[id(node)]} mutates module-level {node.func.value.id}")

    # 3. jit at import time
    for stmt in tree.body if relpath not in MODULE_JIT_DRIVERS else ():
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
            _name(d) in COMPILERS for d in stmt.decorator_list
        ):
            found.append(
                f"{relpath}:{stmt.lineno}: @jit on module-level {stmt.name} (compiled-program cache at import)"
            )
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Expr)) and _compiles(stmt):
            found.append(f"{relpath}:{stmt.lineno}: jax.jit evaluated at import time")

    # 4. jit outside the drivers
    allowed = DRIVERS.get(relpath, set())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in COMPILERS and id(node) in owner:
            if owner[id(node)] not in allowed:
                found.append(
                    f"{relpath}:{node.lineno}: jax.jit inside {owner[id(node)]} (only drivers compile: {sorted(allowed) or 'none here'})"
                )

    # 5. keys made inside the library
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and _name(node.func) in {"key", "PRNGKey"}
            and isinstance(node.func, ast.Attribute)
        ):
            if (
                isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "random"
                and all(isinstance(a, ast.Constant) for a in node.args)
            ):
                found.append(
                    f"{relpath}:{node.lineno}: a PRNG key made from a constant inside the library (pass keys in)"
                )
    return sorted(set(found))


def test_no_hidden_state_in_the_library():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        offenders += hidden_state(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    assert not offenders, "hidden state in jaxsub/ (see this test's docstring):\n" + "\n".join(offenders)


def test_scan_catches_each_kind():
    """Negative controls: each rule fires on a minimal offender and stays quiet on allowed code."""
    bad = {
        "cache": "import functools, jax\n@functools.lru_cache(None)\ndef prog(n):\n    return jax.jit(lambda x: x + n)\n",
        "dict": "import jax\n_PROGRAMS = {}\ndef get(k):\n    if k not in _PROGRAMS:\n        _PROGRAMS[k] = compile(k)\n    return _PROGRAMS[k]\n",
        "import": "import jax\n@jax.jit\ndef f(x):\n    return x\n",
        "import2": "import jax\nf = jax.jit(lambda x: x)\n",
        "inside": "import jax\ndef sampler(x):\n    return jax.jit(lambda y: y)(x)\n",
        "key": "import jax\ndef f(key=None):\n    key = jax.random.key(0) if key is None else key\n    return key\n",
        "global": "_N = 0\ndef bump():\n    global _N\n    _N += 1\n",
    }
    for kind, source in bad.items():
        assert hidden_state(source, "jaxsub/x.py"), f"rule missed: {kind}"
    ok = (
        "import functools, jax\n_TABLE = {'a': 1}\n@functools.lru_cache(64)\ndef radices(n: int):\n    return n, n\n"
        "def step(rng_key, state):\n    return jax.random.split(rng_key), _TABLE['a']\n"
    )
    assert hidden_state(ok, "jaxsub/x.py") == []
    driver = "import jax\ndef run_chain(step, x):\n    return jax.jit(step)(x)\n"
    assert hidden_state(driver, "jaxsub/base.py") == []
