"""Contract cases: one tiny problem per public constructor, one file per family.

Each family module here (``racing.py``, ``sgmcmc.py``, ``compress.py``, ``anneal.py``,
``coreference.py`` ...) defines ``CASES: dict[str, Callable[[], Case]]`` keyed by the
public constructor's dotted name under ``jaxsub`` (e.g. ``"racing_mh"``,
``"anneal.collapsed_gibbs"``). ``tests/test_signatures.py`` loads every module in
this package, so a family adds its cases without touching any other file.

A case returns ``Case(make, position, hyperparameters)``:

* ``make(**hyperparameters)`` builds the ``SamplingAlgorithm`` (or the
  NamedTuple of functions) for the tiny problem;
* ``position`` is a valid initial position;
* ``call`` (optional; required for a ``NamedTuple`` of functions) runs the result;
* ``static`` (optional) names hyperparameter-like parameters that stay static, with why;
* ``hyperparameters`` maps the numeric hyperparameters that BlackJAX lets a user
  trace (e.g. ``{"step_size": 1e-3}``) to concrete values. The contract test
  vmaps ``make(**traced).step`` over two values of each (the given value and half
  of it) and compares with concrete calls; leave it empty only when the
  constructor has no numeric hyperparameter.

Which constructors need a case is *discovered* from the package
(:func:`discover_constructors`), not listed by hand: every public name reachable
through ``jaxsub.__all__`` and the ``__all__`` of the subpackages and modules it
lists that is

(a) a sampler module or its ``TopLevelAPI`` wrapper (it has ``as_top_level_api``);
(b) a function annotated ``-> SamplingAlgorithm``;
(c) a function annotated to return a ``NamedTuple`` class whose fields are all
    annotated ``Callable`` (a "NamedTuple of pure functions", Optax style).

An object reachable under several names is keyed by the first name met in a
breadth-first walk (so ``jaxsub.dsgld`` wins over ``jaxsub.sgmcmc.dsgld``).
"""

import collections.abc
import importlib
import inspect
import pkgutil
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from blackjax.base import SamplingAlgorithm


class Case(NamedTuple):
    make: Callable[..., Any]
    position: Any
    hyperparameters: dict
    #: Constructor parameters named like numeric hyperparameters (``NUMERIC_HYPERPARAMETERS``)
    #: that are deliberately static here, each with the reason, e.g.
    #: ``{"delta": "b_normal is solved on the host per (delta, N, m)"}``.
    static: dict = {}
    #: For constructors that do not return a ``SamplingAlgorithm`` (a ``NamedTuple`` of
    #: functions): ``call(result, rng_key) -> pytree`` exercises the returned functions; the
    #: test jits it (one trace for two keys) and vmaps it over each hyperparameter.
    call: Callable[[Any, Any], Any] | None = None


#: Parameter names the contract test expects a case to trace when the constructor takes them.
NUMERIC_HYPERPARAMETERS = ("step_size", "delta", "temperature", "learning_rate")


def all_cases() -> dict[str, Callable[[], Case]]:
    cases: dict[str, Callable[[], Case]] = {}
    for m in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        module = importlib.import_module(f"contract_cases.{m.name}")
        clash = set(cases) & set(module.CASES)
        assert not clash, f"contract cases defined twice: {sorted(clash)}"
        cases.update(module.CASES)
    return cases


class Constructor(NamedTuple):
    """A discovered public constructor: ``kind`` is ``"module"``, ``"sampling_algorithm"`` or ``"namedtuple"``."""

    name: str
    obj: Any
    kind: str
    module: types.ModuleType | None  # the sampler module (kind "module")
    returns: type | None  # the annotated NamedTuple class (kind "namedtuple")


def _return_annotation(fn) -> Any:
    try:
        return typing.get_type_hints(fn).get("return")
    except Exception:  # unresolvable annotation: fall back to the raw one
        ann = getattr(fn, "__annotations__", {}).get("return")
        if isinstance(ann, str):
            try:
                return eval(ann, getattr(fn, "__globals__", {}))  # noqa: S307 - our own source
            except Exception:
                return ann
        return ann


def _is_callable_annotation(ann) -> bool:
    if ann is collections.abc.Callable or ann is typing.Callable:
        return True
    return typing.get_origin(ann) is collections.abc.Callable


def _namedtuple_of_functions(cls) -> bool:
    if not (isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")):
        return False
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        return False
    return bool(cls._fields) and all(_is_callable_annotation(hints.get(f)) for f in cls._fields)


def _classify(name: str, obj: Any) -> Constructor | None:
    if hasattr(obj, "as_top_level_api") and callable(obj.as_top_level_api):
        module = obj if isinstance(obj, types.ModuleType) else getattr(obj, "_module", None)
        return Constructor(name, obj, "module", module, None)
    if inspect.isfunction(obj):
        ret = _return_annotation(obj)
        if ret is SamplingAlgorithm or ret == "SamplingAlgorithm":
            return Constructor(name, obj, "sampling_algorithm", None, None)
        if _namedtuple_of_functions(ret):
            return Constructor(name, obj, "namedtuple", None, ret)
    return None


def discover_constructors() -> dict[str, Constructor]:
    """Every public constructor of ``jaxsub`` (see the module docstring for the rule)."""
    import jaxsub

    found: dict[str, Constructor] = {}
    seen: set[int] = set()
    queue: list[tuple[str, Any]] = [("", jaxsub)]
    visited_modules: set[str] = set()
    while queue:
        prefix, module = queue.pop(0)
        if module.__name__ in visited_modules:
            continue
        visited_modules.add(module.__name__)
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            name = f"{prefix}{attr}"
            constructor = _classify(name, obj)
            key = id(constructor.module) if constructor is not None and constructor.module is not None else id(obj)
            if constructor is not None and key not in seen:
                seen.add(key)
                found[name] = constructor
            if isinstance(obj, types.ModuleType) and obj.__name__.startswith("jaxsub.") and constructor is None:
                queue.append((f"{name}.", obj))
    return found
