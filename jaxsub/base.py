"""Shared conventions: the sampling-algorithm contract and chain drivers.

Every jaxsub sampler follows BlackJAX's layout, one module per sampler:

* ``State`` and ``Info`` are ``NamedTuple`` pytrees;
* ``init(position, ...) -> State`` builds the initial state;
* ``build_kernel(<structure>) -> kernel`` takes static settings only (sizes,
  counts, schedules, names) and returns
  ``kernel(rng_key, state, <model functions and data>, <hyperparameters>) -> (State, Info)``;
  numeric hyperparameters (step sizes, confidence levels) may be traced;
* ``as_top_level_api(...)`` validates the static configuration (raising a
  ``ValueError`` that names the parameter, see :mod:`jaxsub.validation`) and
  returns a :class:`blackjax.base.SamplingAlgorithm` whose ``step`` has the
  signature ``step(rng_key, state) -> (state, info)``.

The PRNG key is always passed in and split, never stored in a state. The
library never calls ``jax.jit`` inside a sampler; :func:`run_chain` and
:func:`run_chains` are *drivers* (like ``blackjax.util.run_inference_algorithm``)
and compile the loop they run, afresh at each call (nothing is cached at module
level). The full contract is in ``docs/architecture.md``.

Problem flags
-------------
An ``Info`` field named in :data:`PROBLEM_FLAGS` (``has_nan`` set, ``is_finite`` unset,
``bad_hyperparameter`` set) marks a step whose state is not a valid sample. The drivers
count the steps that raised a flag and warn at the end of the run (``RuntimeWarning``,
naming the flag and how many steps and chains); with ``checked=True`` they raise
:class:`InvalidStateError` instead, naming the first flagged step. :func:`checked` wraps
any step or sampler so that it raises through :mod:`jax.experimental.checkify` (it works
on jitted functions).

Checkpoints
-----------
With ``checkpoint_dir``, the drivers run the scan in chunks of ``checkpoint_every``
steps and save after each chunk, atomically (:mod:`jaxsub.checkpoint`), the state, the
stacked traces so far, the per-step problem flags and the step index; a call that finds
a checkpoint of the same run resumes from it. The per-step keys are split from
``rng_key`` once for the whole run, so the result is the same whatever the chunking
and however often the run was interrupted.
"""

from __future__ import annotations

import functools
import hashlib
import math
import warnings
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from blackjax.base import SamplingAlgorithm
from jax.experimental import checkify

from jaxsub import checkpoint
from jaxsub.types import ArrayLikeTree, PRNGKey
from jaxsub.validation import check_int

__all__ = [
    "PROBLEM_FLAGS",
    "ChainTrace",
    "InvalidStateError",
    "SamplingAlgorithm",
    "checked",
    "problem_flags",
    "run_chain",
    "run_chains",
]

#: ``Info`` fields that mark a step whose state is not a valid sample, with the value that
#: does: ``has_nan`` (NaN / impossible target met), ``is_finite`` (the new position is not
#: finite), ``bad_hyperparameter`` (a traced hyperparameter out of its range).
PROBLEM_FLAGS = (("has_nan", True), ("is_finite", False), ("bad_hyperparameter", True))


class ChainTrace(NamedTuple):
    """What :func:`run_chain` and :func:`run_chains` return.

    Attributes
    ----------
    final_state
        The state after the last step (batched over chains for :func:`run_chains`).
    states
        What was kept at each step, stacked: the ``State`` itself, or the output of
        ``transform(state, info)`` *as one pytree* (a tuple position ``(w, b)`` stays a
        tuple). Leading axes ``[num_steps, ...]``, or ``[num_chains, num_steps, ...]``.
    infos
        The stacked ``Info`` (no ``transform`` given), the stacked output of
        ``info_transform(state, info)`` when given, else ``None``. Same leading axes.
    """

    final_state: ArrayLikeTree
    states: ArrayLikeTree
    infos: ArrayLikeTree


def _step_fn(algorithm) -> Callable:
    step = getattr(algorithm, "step", algorithm)
    if not callable(step):
        raise ValueError(
            "algorithm must be a SamplingAlgorithm (with step(rng_key, state)) or a "
            f"step(rng_key, state) -> (state, info) function; got {type(algorithm).__name__}"
        )
    return step


def problem_flags(info) -> dict:
    """The problem flags of one step's ``info``, each reduced to one boolean.

    Parameters
    ----------
    info
        A step's ``Info`` (a ``NamedTuple``; fields that are ``NamedTuple`` s are searched
        too). Other pytrees have no flags.

    Returns
    -------
    dict
        ``{name: bool scalar}`` for every field of :data:`PROBLEM_FLAGS` found, True when
        the step raised it (any element, for batched fields such as a Gibbs sweep's).
    """
    found = {}
    if not hasattr(info, "_fields"):
        return found
    signals = dict(PROBLEM_FLAGS)
    for name in info._fields:
        value = getattr(info, name)
        if name in signals and value is not None:
            flag = jnp.asarray(value, bool)
            found[name] = jnp.any(flag) if signals[name] else ~jnp.all(flag)
        elif hasattr(value, "_fields"):
            for sub, flag in problem_flags(value).items():
                found[sub] = found[sub] | flag if sub in found else flag
    return found


def _check_flags(out):
    """``checkify.check`` that no problem flag is raised in ``out = (state, info)``."""
    info = out[1] if isinstance(out, tuple) and len(out) == 2 else out
    for name, flag in problem_flags(info).items():
        checkify.check(~flag, f"info.{name} signals an invalid state")


def _call_and_check(fn, *args, **kwargs):
    out = fn(*args, **kwargs)
    _check_flags(out)
    return out


def checked(fn: Callable) -> Callable:
    """Make a step or sampler raise when its ``info`` signals a problem.

    ``checked(fn)(*args)`` calls ``fn(*args) -> (state, info)`` under
    :func:`jax.experimental.checkify.checkify` with one check per problem flag of
    ``info`` (:data:`PROBLEM_FLAGS`) and raises at once when one is set. ``fn`` may be
    jitted: ``checked(jax.jit(sampler))(key, log_f0)`` raises for a NaN factor.

    Parameters
    ----------
    fn
        ``fn(*args, **kwargs) -> (state, info)`` (or ``-> info``).

    Returns
    -------
    Callable
        Same signature and outputs as ``fn``.

    Raises
    ------
    jax.experimental.checkify.JaxRuntimeError
        (when the returned function is called) naming the raised flag.

    Notes
    -----
    Checkify cannot transform a ``vmap`` of a ``while_loop`` (e.g. ``jax.vmap`` of a race);
    the drivers' ``checked=True`` reads the recorded flags instead and has no such limit.
    """
    checkified = checkify.checkify(partial(_call_and_check, fn))

    @functools.wraps(fn)
    def run(*args, **kwargs):
        err, out = checkified(*args, **kwargs)
        err.throw()
        return out

    return run


def _step_fn(algorithm) -> Callable:
    step = getattr(algorithm, "step", algorithm)
    if not callable(step):
        raise ValueError(
            "algorithm must be a SamplingAlgorithm (with step(rng_key, state)) or a "
            f"step(rng_key, state) -> (state, info) function; got {type(algorithm).__name__}"
        )
    return step


class _Loop(NamedTuple):
    """The static pieces of a driver's scan: the step and what to keep."""

    step: Callable
    transform: Callable | None
    info_transform: Callable | None


def _record(loop: _Loop, state, info):
    """``(kept_state, kept_info, flags)``, what is stored at each step."""
    if loop.transform is None and loop.info_transform is None:
        kept = (state, info)
    else:
        keep_state = state if loop.transform is None else loop.transform(state, info)
        keep_info = None if loop.info_transform is None else loop.info_transform(state, info)
        kept = (keep_state, keep_info)
    return kept + (problem_flags(info),)


def _one_step(loop: _Loop, carry, key):
    new_state, info = loop.step(key, carry)
    return new_state, _record(loop, new_state, info)


def _scan_chunk(loop: _Loop, state, keys):
    return jax.lax.scan(partial(_one_step, loop), state, keys)


def _scan_chains(loop: _Loop, states, keys):
    """Chains: ``keys[t, c]`` (step-major); history comes back step-major too."""
    final, hist = jax.vmap(partial(_scan_chunk, loop), in_axes=(0, 1))(states, keys)
    return final, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), hist)


class InvalidStateError(RuntimeError):
    """A driver run with ``checked=True`` met a step whose ``info`` raised a problem flag."""


def _raise_problems(driver: str, flags: dict, first_step: int) -> None:
    """``InvalidStateError`` naming the first flagged step (and its chains) of a chunk, if any."""
    for name, raised in flags.items():
        raised = np.asarray(raised)
        if not raised.any():
            continue
        per_step = raised.reshape(raised.shape[0], -1)
        t = int(np.argmax(per_step.any(axis=1)))
        chains = "" if raised.ndim == 1 else f" (chains {np.flatnonzero(per_step[t]).tolist()})"
        raise InvalidStateError(
            f"{driver}: info.{name} was {dict(PROBLEM_FLAGS)[name]} at step {first_step + t}{chains}: "
            "that state is not a valid sample"
        )


class _Checkpoints(NamedTuple):
    """Where and how often a driver saves, and what identifies its run."""

    directory: object
    every: int
    meta: dict


def _fingerprint(tree) -> str:
    digest = hashlib.sha1()
    for leaf in jax.tree.leaves(tree):
        if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        arr = np.asarray(leaf)
        digest.update(f"{arr.dtype}{arr.shape}".encode())
        digest.update(np.ascontiguousarray(arr).tobytes())
    return digest.hexdigest()[:16]


def _checkpoints(checkpoint_dir, checkpoint_every, driver, rng_key, initial_state, num_steps) -> _Checkpoints | None:
    if checkpoint_dir is None:
        return None
    every = check_int("checkpoint_every", checkpoint_every, low=1)
    meta = {
        "driver": driver,
        "num_steps": num_steps,
        "checkpoint_every": every,
        "rng_key": _fingerprint(rng_key),
        "initial_state": _fingerprint(initial_state),
    }
    return _Checkpoints(checkpoint_dir, every, meta)


def _history_like(chunk_fn, state, keys, num_done: int):
    """Zeros shaped like the history of the first ``num_done`` steps (for ``restore``)."""
    _, one = jax.eval_shape(chunk_fn, state, keys[:1])
    return jax.tree.map(lambda s: np.zeros((num_done,) + s.shape[1:], s.dtype), one)


def _resume(ckpt: _Checkpoints | None, chunk_fn, state, keys):
    """``(start, state, pieces)``: where a previous run of the same call stopped, if it did."""
    if ckpt is None:
        return 0, state, []
    done = checkpoint.latest_step(ckpt.directory)
    if done is None:
        return 0, state, []
    like = {"state": state, "history": _history_like(chunk_fn, state, keys, done)}
    _, tree = checkpoint.restore(ckpt.directory, like, step=done, meta=ckpt.meta)
    return done, tree["state"], [tree["history"]]


def _concat(pieces):
    return jax.tree.map(lambda *xs: np.concatenate([np.asarray(x) for x in xs], axis=0), *pieces)


def _chunk_size(num_steps: int, ckpt, progress_bar: bool, num_progress_updates) -> int:
    if ckpt is not None:
        return ckpt.every
    if progress_bar:
        return max(1, math.ceil(num_steps / check_int("num_progress_updates", num_progress_updates, low=1)))
    return num_steps


class _Run(NamedTuple):
    """How a driver runs its chunks: its name, the chunk length, checkpoints, checks, bar."""

    driver: str
    chunk: int
    checkpoints: _Checkpoints | None
    checked: bool
    progress_bar: bool


def _drive(run: _Run, chunk_fn, state, keys):
    """Run the chunks from the last checkpoint on; ``(final_state, history)``, step-major.

    ``chunk_fn(state, keys) -> (state, (kept_states, kept_infos, flags))`` is the compiled scan."""
    num_steps, ckpt = keys.shape[0], run.checkpoints
    start, state, pieces = _resume(ckpt, chunk_fn, state, keys)
    bar = _progress(num_steps, start) if run.progress_bar else None
    for lo in range(start, num_steps, run.chunk):
        hi = min(num_steps, lo + run.chunk)
        state, hist = chunk_fn(state, keys[lo:hi])
        jax.block_until_ready(state)
        if run.checked:
            _raise_problems(run.driver, hist[2], lo)
        pieces.append(hist)
        if ckpt is not None:
            pieces = [_concat(pieces)]
            checkpoint.save(ckpt.directory, hi, {"state": state, "history": pieces[0]}, meta=ckpt.meta)
        if bar is not None:
            bar.update(hi - lo)
    if bar is not None:
        bar.close()
    if len(pieces) == 1:
        return state, jax.tree.map(jnp.asarray, pieces[0])
    return state, jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *pieces)


def _progress(total: int, initial: int):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="step", leave=False)


def _warn_problems(driver: str, flags: dict, chain_axis: bool) -> None:
    """One ``RuntimeWarning`` per raised flag: how many steps (and chains) raised it."""
    for name, raised in flags.items():
        raised = np.asarray(raised)
        total = int(raised.sum())
        if total == 0:
            continue
        value = dict(PROBLEM_FLAGS)[name]
        where = f"info.{name} was {value}"
        if chain_axis:
            per_chain = raised.reshape(raised.shape[0], -1).any(axis=1)
            count = f"{total} of {raised.size} steps, in {int(per_chain.sum())} of {raised.shape[0]} chains"
        else:
            first = int(np.argmax(raised))
            count = f"{total} of {raised.size} steps (first at step {first})"
        warnings.warn(f"{driver}: {where} at {count}; those states are not valid samples", RuntimeWarning, stacklevel=3)


def run_chain(
    rng_key: PRNGKey,
    algorithm: SamplingAlgorithm | Callable,
    initial_state: ArrayLikeTree,
    num_steps: int,
    *,
    transform: Callable | None = None,
    info_transform: Callable | None = None,
    progress_bar: bool = False,
    num_progress_updates: int = 20,
    checked: bool = False,
    checkpoint_dir=None,
    checkpoint_every: int = 1000,
) -> ChainTrace:
    """Run one chain for ``num_steps`` steps with ``lax.scan`` (a jitted driver).

    Parameters
    ----------
    rng_key
        PRNG key; split into one key per step (``jax.random.split(rng_key, num_steps)``).
    algorithm
        A ``SamplingAlgorithm`` (its ``step`` is used) or a bare
        ``step(rng_key, state) -> (state, info)`` function.
    initial_state
        The state to start from (``algorithm.init(position)``).
    num_steps
        Number of transitions.
    transform
        ``transform(state, info) -> pytree`` kept at each step in ``states``, whole
        (any pytree: a position, a tuple ``(w, b)``, a dict). Default: the state.
    info_transform
        ``info_transform(state, info) -> pytree`` kept at each step in ``infos``.
        Default: the full ``Info`` when no ``transform`` is given, else nothing
        (``infos`` is ``None``).
    progress_bar
        Show a ``tqdm`` bar. The scan is then cut into ``num_progress_updates``
        equal chunks (or the checkpoint chunks), each one call of the same jitted
        function (at most two compilations: full chunks and the last one), so the
        bar costs nothing inside the loop.
    num_progress_updates
        Number of chunks when ``progress_bar`` is true (and no ``checkpoint_dir``).
    checked
        Raise :class:`InvalidStateError` at the end of the chunk (the whole run, or a
        checkpoint or progress chunk) in which a step first raised a problem flag
        (:data:`PROBLEM_FLAGS`), naming the flag and the step, instead of warning at the
        end of the run. (The flags are read from the recorded trace, so every step works,
        including those :func:`checked`'s checkify cannot transform, e.g. a ``vmap`` of a
        ``while_loop``.)
    checkpoint_dir
        Folder for this run's checkpoints (``None``: none). The scan runs in chunks of
        ``checkpoint_every`` steps; after each, the state, the traces so far and the step
        index are saved atomically with :func:`jaxsub.checkpoint.save`. When the folder
        already holds a checkpoint of this call (same ``num_steps``, ``checkpoint_every``,
        ``rng_key`` and ``initial_state``), the run resumes from it and returns exactly what
        an uninterrupted run returns.
    checkpoint_every
        Steps per chunk when ``checkpoint_dir`` is given (``>= 1``). Each save writes the
        whole trace so far: keep the kept pytrees small (``transform``) on long runs.

    Returns
    -------
    ChainTrace
        ``(final_state, states, infos)``, leaves of ``states``/``infos`` with a
        leading ``num_steps`` axis.

    Raises
    ------
    ValueError
        If ``num_steps``, ``num_progress_updates`` or ``checkpoint_every`` is not a positive
        integer, ``algorithm`` has no step, or the checkpoint in ``checkpoint_dir`` was
        written by a different run.
    InvalidStateError
        With ``checked=True``, when a step raised a problem flag.

    Warns
    -----
    RuntimeWarning
        When some step raised a problem flag (and ``checked`` is false), with the
        number of such steps and the first one.

    Examples
    --------
    >>> trace = run_chain(key, algo, algo.init(x0), 1000, transform=lambda s, i: s.position,
    ...                   info_transform=lambda s, i: i.is_accepted)
    """
    num_steps = check_int("num_steps", num_steps, low=1)
    loop = _Loop(_step_fn(algorithm), transform, info_transform)
    ckpt = _checkpoints(checkpoint_dir, checkpoint_every, "run_chain", rng_key, initial_state, num_steps)
    run = _Run(
        "run_chain", _chunk_size(num_steps, ckpt, progress_bar, num_progress_updates), ckpt, bool(checked), progress_bar
    )
    keys = jax.random.split(rng_key, num_steps)
    final_state, (states, infos, flags) = _drive(run, jax.jit(partial(_scan_chunk, loop)), initial_state, keys)
    _warn_problems("run_chain", flags, chain_axis=False)
    return ChainTrace(final_state, states, infos)


def _num_chains(initial_states) -> int:
    leaves = jax.tree.leaves(initial_states)
    if not leaves:
        raise ValueError("initial_states must be a non-empty pytree of batched arrays")
    leading = {jnp.shape(leaf)[:1] for leaf in leaves}
    if len(leading) != 1 or () in leading:
        raise ValueError(
            "initial_states must have one leading num_chains axis on every leaf "
            f"(e.g. jax.vmap(algorithm.init)(positions)); got leading shapes {sorted(leading)}"
        )
    return jnp.shape(leaves[0])[0]


def run_chains(
    rng_key: PRNGKey,
    algorithm: SamplingAlgorithm | Callable,
    initial_states: ArrayLikeTree,
    num_steps: int,
    *,
    transform: Callable | None = None,
    info_transform: Callable | None = None,
    progress_bar: bool = False,
    num_progress_updates: int = 20,
    checked: bool = False,
    checkpoint_dir=None,
    checkpoint_every: int = 1000,
) -> ChainTrace:
    """Run independent chains in parallel: ``vmap`` over chains of a ``lax.scan``.

    Chain ``c`` uses the key ``jax.random.split(rng_key, num_chains)[c]``, so it
    reproduces ``run_chain`` started from that key.

    Parameters
    ----------
    rng_key
        PRNG key; split into one key per chain (then per step).
    algorithm
        As in :func:`run_chain`.
    initial_states
        A batched state: every leaf has the same leading ``num_chains`` axis, e.g.
        ``jax.vmap(algorithm.init)(positions)``.
    num_steps, transform, info_transform, progress_bar, num_progress_updates
        As in :func:`run_chain`.
    checked, checkpoint_dir, checkpoint_every
        As in :func:`run_chain` (one checkpoint holds every chain).

    Returns
    -------
    ChainTrace
        Leaves of ``states``/``infos`` have shape ``[num_chains, num_steps, ...]``
        (chains first, as ``blackjax.diagnostics`` expects).

    Raises
    ------
    ValueError
        As :func:`run_chain`, and if the leaves of ``initial_states`` do not share one
        leading ``num_chains`` axis.

    Warns
    -----
    RuntimeWarning
        When some step raised a problem flag, with the number of steps and chains.
    """
    num_steps = check_int("num_steps", num_steps, low=1)
    num_chains = _num_chains(initial_states)
    loop = _Loop(_step_fn(algorithm), transform, info_transform)
    ckpt = _checkpoints(checkpoint_dir, checkpoint_every, "run_chains", rng_key, initial_states, num_steps)
    run = _Run(
        "run_chains",
        _chunk_size(num_steps, ckpt, progress_bar, num_progress_updates),
        ckpt,
        bool(checked),
        progress_bar,
    )
    chain_keys = jax.random.split(rng_key, num_chains)
    # keys[t, c]: step-major so that chunks slice axis 0.
    keys = jax.vmap(lambda k: jax.random.split(k, num_steps), out_axes=1)(chain_keys)
    final_state, history = _drive(run, jax.jit(partial(_scan_chains, loop)), initial_states, keys)
    states, infos, flags = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), history)
    _warn_problems("run_chains", flags, chain_axis=True)
    return ChainTrace(final_state, states, infos)
