"""The kernel contract (docs/architecture.md), checked on every public constructor.

The constructors are discovered from the package (``contract_cases.discover_constructors``:
sampler modules, functions annotated ``-> SamplingAlgorithm`` and functions returning a
``NamedTuple`` of functions); each needs a case in ``tests/contract_cases/<family>.py``.
For every case the test checks:

* the result's type (``SamplingAlgorithm``, or the annotated ``NamedTuple`` of callables);
* ``init(position, ...)`` / ``step(rng_key, state)`` signatures, ``NamedTuple`` state and info,
  one trace under ``jit``, ``vmap`` over chains (``helpers.assert_follows_sampling_api``);
* ``vmap`` over each numeric hyperparameter of the case (``jax.vmap(lambda h: make(h).step(key, state))``),
  and that the vmapped steps equal concrete steps at each value;
* for sampler modules: ``as_top_level_api`` goes through ``build_kernel``, whose parameters
  are structure only (no ``*_fn`` model function, no data, no hyperparameter of the case),
  and the kernel it returns takes ``(rng_key, state, ...)``.

A source-level test also rejects functions with attributes attached (``fn.batched = ...``):
several functions are returned as a ``NamedTuple``.
"""

import ast
import inspect
import typing
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from blackjax.base import SamplingAlgorithm
from contract_cases import NUMERIC_HYPERPARAMETERS, all_cases, discover_constructors
from helpers import assert_follows_sampling_api

CASES = all_cases()
CONSTRUCTORS = discover_constructors()
PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "jaxsub"
# build_kernel takes the algorithm's structure; these parameter names are model or data.
MODEL_OR_DATA = ("data", "shards", "x", "y")


def test_every_public_constructor_has_a_case():
    missing = set(CONSTRUCTORS) - set(CASES)
    assert not missing, f"public constructors without a contract case in tests/contract_cases/: {sorted(missing)}"


def test_every_case_names_a_public_constructor():
    stale = set(CASES) - set(CONSTRUCTORS)
    assert not stale, (
        f"contract cases for names that are not discovered public constructors: {sorted(stale)} "
        "(export them in an __all__ and annotate the return type -> SamplingAlgorithm or a NamedTuple of Callables)"
    )


def _constructor_parameters(constructor) -> list[str]:
    fn = constructor.module.as_top_level_api if constructor.kind == "module" else constructor.obj
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
def test_case_traces_every_numeric_hyperparameter(name):
    """A constructor taking ``step_size``/``delta``/``temperature``/... must have it traced by its case (or say why not)."""
    if name not in CASES:
        pytest.fail(f"no contract case for {name}")
    case = CASES[name]()
    expected = [p for p in _constructor_parameters(CONSTRUCTORS[name]) if p in NUMERIC_HYPERPARAMETERS]
    untested = [p for p in expected if p not in case.hyperparameters and p not in case.static]
    assert not untested, (
        f"{name} takes {untested} but its case neither traces them (Case.hyperparameters) nor says why they are static (Case.static)"
    )
    for p, reason in case.static.items():
        assert isinstance(reason, str) and reason.strip(), f"{name}: give the reason why {p} is static"


def _result_type_ok(constructor, result):
    if constructor.kind == "namedtuple":
        assert isinstance(result, constructor.returns), (
            f"{constructor.name} returned {type(result)}, annotated {constructor.returns}"
        )
        for field in result._fields:
            assert callable(getattr(result, field)), f"{constructor.name}: field {field} is not callable"
    else:
        assert isinstance(result, SamplingAlgorithm), (
            f"{constructor.name} returned {type(result)}, not a SamplingAlgorithm"
        )


def _assert_trees_close(a, b, what):
    chex.assert_trees_all_equal_shapes_and_dtypes(a, b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        if np.issubdtype(x.dtype, np.inexact):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5, err_msg=what)
        elif jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            continue
        else:
            np.testing.assert_array_equal(x, y, err_msg=what)


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
def test_constructor_follows_contract(name):
    if name not in CASES:
        pytest.fail(f"no contract case for {name}")
    check_constructor(CONSTRUCTORS[name], CASES[name]())


def check_constructor(constructor, case):
    """Result type; SamplingAlgorithm API, or one jit trace of ``case.call`` for a NamedTuple of functions."""
    name = constructor.name
    result = case.make(**case.hyperparameters)
    _result_type_ok(constructor, result)
    if isinstance(result, SamplingAlgorithm) or (hasattr(result, "init") and hasattr(result, "step")):
        assert_follows_sampling_api(result, case.position, jax.random.key(0))
    else:
        assert case.call is not None, (
            f"{name}: the case must give call(result, rng_key) to exercise the returned functions"
        )

        @jax.jit
        @chex.assert_max_traces(n=1)
        def run(key):
            return case.call(result, key)

        first = run(jax.random.key(0))
        second = run(jax.random.key(1))
        chex.clear_trace_counter()
        chex.assert_trees_all_equal_shapes_and_dtypes(first, second)


def _leading_axis(tree, size):
    for leaf in jax.tree.leaves(tree):
        assert leaf.shape[:1] == (size,), f"leaf of shape {leaf.shape} has no leading axis of size {size}"


def check_hyperparameter_traced(name, case, hyperparameter):
    """``jax.vmap`` over ``hyperparameter`` works and equals concrete steps at each value."""
    base = case.hyperparameters
    key = jax.random.key(1)
    value = base[hyperparameter]
    values = [value, value * 0.5]
    if case.call is not None:
        run = lambda h, k: case.call(case.make(**{**base, hyperparameter: h}), k)  # noqa: E731
    else:
        state = case.make(**base).init(case.position)
        run = lambda h, k: case.make(**{**base, hyperparameter: h}).step(k, state)  # noqa: E731

    batched = jax.vmap(run, in_axes=(0, None))(jnp.asarray(values), key)
    _leading_axis(batched, 2)
    for i, v in enumerate(values):
        concrete = jax.jit(lambda k, v=v: run(v, k))(key)
        _assert_trees_close(
            jax.tree.map(lambda x: x[i], batched),
            concrete,
            f"{name}: vmapped call at {hyperparameter}={v} differs from the concrete call",
        )


@pytest.mark.parametrize(
    "name,hyperparameter",
    sorted((n, h) for n in CONSTRUCTORS if n in CASES for h in CASES[n]().hyperparameters),
)
def test_hyperparameter_can_be_traced(name, hyperparameter):
    """BlackJAX habit: ``jax.vmap(lambda h: make(step_size=h).step(key, state))(step_sizes)``."""
    check_hyperparameter_traced(name, CASES[name](), hyperparameter)


MODULE_CONSTRUCTORS = sorted(n for n, c in CONSTRUCTORS.items() if c.kind == "module")


def check_module_contract(module, case, monkeypatch):
    """init(position, ...), build_kernel(structure), kernel(rng_key, state, ...), as_top_level_api via build_kernel."""
    for piece in ("init", "build_kernel", "as_top_level_api"):
        assert callable(getattr(module, piece, None)), f"{module.__name__} has no {piece}"
    params = list(inspect.signature(module.init).parameters)
    assert params[:1] == ["position"], f"{module.__name__}.init parameters are {params}"
    build_params = inspect.signature(module.build_kernel).parameters
    model = [p for p in build_params if p.endswith("_fn") or p in MODEL_OR_DATA]
    assert not model, f"{module.__name__}.build_kernel takes model functions or data {model}: pass them to the kernel"
    hypers = [p for p in build_params if p in case.hyperparameters]
    assert not hypers, (
        f"{module.__name__}.build_kernel takes hyperparameters {hypers}: pass them to the kernel (they may be traced)"
    )

    kernels = []
    original = module.build_kernel

    def recording_build_kernel(*args, **kwargs):
        kernel = original(*args, **kwargs)
        kernels.append(kernel)
        return kernel

    monkeypatch.setattr(module, "build_kernel", recording_build_kernel)
    case.make(**case.hyperparameters)
    monkeypatch.undo()
    assert kernels, f"{module.__name__}.as_top_level_api does not call build_kernel"
    for kernel in kernels:
        kernel_params = list(inspect.signature(kernel).parameters)
        assert kernel_params[:2] == ["rng_key", "state"], f"{module.__name__} kernel parameters are {kernel_params}"


#: Known departures from the module contract, each tracked in an open issue (strict: a fix turns
#: the case red until its entry is removed here).
KNOWN_MODULE_DEBT: dict[str, str] = {}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MODULE_DEBT[n]))
        if n in KNOWN_MODULE_DEBT
        else n
        for n in MODULE_CONSTRUCTORS
    ],
)
def test_build_kernel_takes_structure_and_kernel_takes_key_and_state(name, monkeypatch):
    if name not in CASES:
        pytest.fail(f"no contract case for {name}")
    check_module_contract(CONSTRUCTORS[name].module, CASES[name](), monkeypatch)


def test_checks_accept_blackjax_mala(monkeypatch):
    """Positive control: BlackJAX's own MALA (the convention we copy) passes every check above."""
    import blackjax
    from blackjax.mcmc import mala
    from contract_cases import Case

    logdensity = lambda x: -0.5 * jnp.sum(x**2)  # noqa: E731
    case = Case(lambda step_size: blackjax.mala(logdensity, step_size), jnp.zeros(2), {"step_size": 0.5})
    assert_follows_sampling_api(case.make(**case.hyperparameters), case.position, jax.random.key(0))
    check_hyperparameter_traced("blackjax.mala", case, "step_size")
    check_module_contract(mala, case, monkeypatch)


def test_checks_reject_model_bound_at_build_time(monkeypatch):
    """Negative control: a build_kernel that binds the model function is rejected."""
    import types

    from contract_cases import Case

    module = types.ModuleType("fake_sampler")
    module.init = lambda position: position
    module.build_kernel = lambda logdensity_fn: lambda rng_key, state: (state, ())
    module.as_top_level_api = lambda: None
    case = Case(lambda: None, jnp.zeros(2), {})
    with pytest.raises(AssertionError, match="model functions or data"):
        check_module_contract(module, case, monkeypatch)


def _functions_with_attributes(tree: ast.AST):
    """(line, function, attribute) for every ``f.attr = ...`` / ``setattr(f, ...)`` where ``f`` is a function defined in the same scope."""
    hits = []
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in scopes:
        body_nodes = list(ast.iter_child_nodes(scope))
        local_functions = {n.name for n in body_nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        local_functions |= {
            t.id
            for n in body_nodes
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Lambda)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in body_nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id in local_functions
                    ):
                        hits.append((node.lineno, target.value.id, target.attr))
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                call = node.value
                if isinstance(call.func, ast.Name) and call.func.id == "setattr" and call.args:
                    arg = call.args[0]
                    if isinstance(arg, ast.Name) and arg.id in local_functions:
                        hits.append((node.lineno, arg.id, "setattr"))
    return hits


def test_no_function_has_attributes_attached():
    """Constructors that return several functions return a NamedTuple, never ``fn.extra = ...``."""
    offenders = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        for line, fn, attr in _functions_with_attributes(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{line}: {fn}.{attr}")
    assert not offenders, "functions with attributes attached (return a NamedTuple instead):\n" + "\n".join(offenders)


def test_attribute_scan_catches_a_known_offender():
    """Negative control for the source scan above."""
    source = "def make():\n    def sample(k):\n        return k\n    sample.batched = sample\n    return sample\n"
    assert _functions_with_attributes(ast.parse(source)) == [(4, "sample", "batched")]
    clean = "class A(NamedTuple):\n    f: int\ndef make():\n    def f(k):\n        return k\n    return A(f)\n"
    assert _functions_with_attributes(ast.parse(clean)) == []


def test_contract_example_in_architecture_doc_passes_the_checks(monkeypatch):
    """The minimal sampler written out in docs/architecture.md is itself checked (the template is compliant)."""
    import types

    from _docblocks import ROOT, python_blocks
    from contract_cases import Case

    (block,) = [b for b in python_blocks(ROOT / "docs" / "architecture.md") if "def build_kernel" in b.code]
    module = types.ModuleType("contract_example")
    exec(compile(block.code, block.id, "exec"), module.__dict__)  # noqa: S102 - our own documentation
    logdensity = module.logdensity
    case = Case(
        lambda step_size: module.as_top_level_api(logdensity, step_size=step_size), jnp.zeros(2), {"step_size": 0.5}
    )
    assert_follows_sampling_api(case.make(**case.hyperparameters), case.position, jax.random.key(0))
    check_hyperparameter_traced("docs/architecture.md example", case, "step_size")
    check_module_contract(module, case, monkeypatch)


class _Pair(typing.NamedTuple):
    sample: typing.Callable
    sample_many: typing.Callable


def _pair_constructor(temperature: float) -> _Pair:
    """A NamedTuple-of-functions constructor with a traceable hyperparameter (test fixture)."""

    def sample(rng_key, logits):
        return jax.random.categorical(rng_key, logits / temperature)

    def sample_many(rng_key, logits, num):
        return jax.random.categorical(rng_key, logits / temperature, shape=(num,))

    return _Pair(sample, sample_many)


def test_namedtuple_of_functions_path():
    """The checks for kind (c) constructors: discovery of the annotation, one trace, traced hyperparameter."""
    from contract_cases import Case, Constructor, _classify

    discovered = _classify("pair", _pair_constructor)
    assert discovered == Constructor("pair", _pair_constructor, "namedtuple", None, _Pair)
    logits = jnp.log(jnp.asarray([0.2, 0.3, 0.5]))
    case = Case(
        _pair_constructor,
        None,
        {"temperature": 1.0},
        call=lambda fns, key: (fns.sample(key, logits), fns.sample_many(key, logits, 4)),
    )
    check_constructor(discovered, case)
    check_hyperparameter_traced("pair", case, "temperature")
    with pytest.raises(AssertionError, match="must give call"):
        check_constructor(discovered, case._replace(call=None))
