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
* ``hyperparameters`` maps the numeric hyperparameters that BlackJAX lets a user
  trace (e.g. ``{"step_size": 1e-3}``) to concrete values. The contract test
  vmaps ``make(**traced).step`` over two values of each; leave it empty only when
  the constructor has no numeric hyperparameter.
"""
import importlib
import pkgutil
from pathlib import Path
from typing import Any, Callable, NamedTuple


class Case(NamedTuple):
    make: Callable[..., Any]
    position: Any
    hyperparameters: dict


def all_cases() -> dict[str, Callable[[], Case]]:
    cases: dict[str, Callable[[], Case]] = {}
    for m in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        module = importlib.import_module(f"contract_cases.{m.name}")
        clash = set(cases) & set(module.CASES)
        assert not clash, f"contract cases defined twice: {sorted(clash)}"
        cases.update(module.CASES)
    return cases
