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
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from blackjax.base import SamplingAlgorithm

from jaxsub.types import ArrayLikeTree, PRNGKey
from jaxsub.validation import check_int

__all__ = ["SamplingAlgorithm", "run_chain", "run_chains", "ChainTrace"]


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


def _recorder(transform: Callable | None, info_transform: Callable | None) -> Callable:
    """``record(state, info) -> (kept_state, kept_info)``, the pair stored at each step."""
    if transform is None and info_transform is None:
        return lambda state, info: (state, info)
    keep_state = transform if transform is not None else (lambda state, info: state)
    keep_info = info_transform if info_transform is not None else (lambda state, info: None)
    return lambda state, info: (keep_state(state, info), keep_info(state, info))


def _scan_chunk(step, record, state, keys):
    def one_step(carry, key):
        new_state, info = step(key, carry)
        return new_state, record(new_state, info)

    return jax.lax.scan(one_step, state, keys)


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
        equal chunks, each one call of the same jitted function (at most two
        compilations: full chunks and the last one), so the bar costs nothing
        inside the loop.
    num_progress_updates
        Number of chunks when ``progress_bar`` is true.

    Returns
    -------
    ChainTrace
        ``(final_state, states, infos)``, leaves of ``states``/``infos`` with a
        leading ``num_steps`` axis.

    Examples
    --------
    >>> trace = run_chain(key, algo, algo.init(x0), 1000, transform=lambda s, i: s.position,
    ...                   info_transform=lambda s, i: i.is_accepted)
    """
    num_steps = check_int("num_steps", num_steps, low=1)
    step = _step_fn(algorithm)
    record = _recorder(transform, info_transform)
    keys = jax.random.split(rng_key, num_steps)
    chunk_fn = jax.jit(partial(_scan_chunk, step, record))
    if not progress_bar:
        final_state, (states, infos) = chunk_fn(initial_state, keys)
    else:
        final_state, (states, infos) = _run_chunked(chunk_fn, initial_state, keys, num_progress_updates)
    return ChainTrace(final_state, states, infos)


def _run_chunked(chunk_fn, state, keys, num_chunks):
    from tqdm.auto import tqdm

    num_chunks = check_int("num_progress_updates", num_chunks, low=1)
    num_steps = keys.shape[0]
    chunk = max(1, math.ceil(num_steps / num_chunks))
    pieces = []
    with tqdm(total=num_steps, unit="step", leave=False) as bar:
        for start in range(0, num_steps, chunk):
            stop = min(num_steps, start + chunk)
            state, hist = chunk_fn(state, keys[start:stop])
            jax.block_until_ready(state)
            pieces.append(hist)
            bar.update(stop - start)
    history = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *pieces)
    return state, history


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

    Returns
    -------
    ChainTrace
        Leaves of ``states``/``infos`` have shape ``[num_chains, num_steps, ...]``
        (chains first, as ``blackjax.diagnostics`` expects).
    """
    num_steps = check_int("num_steps", num_steps, low=1)
    leaves = jax.tree.leaves(initial_states)
    if not leaves:
        raise ValueError("initial_states must be a non-empty pytree of batched arrays")
    leading = {jnp.shape(leaf)[:1] for leaf in leaves}
    if len(leading) != 1 or () in leading:
        raise ValueError(
            "initial_states must have one leading num_chains axis on every leaf "
            f"(e.g. jax.vmap(algorithm.init)(positions)); got leading shapes {sorted(leading)}"
        )
    num_chains = jnp.shape(leaves[0])[0]
    step = _step_fn(algorithm)
    record = _recorder(transform, info_transform)
    chain_keys = jax.random.split(rng_key, num_chains)
    # keys[t, c]: step-major so that chunks for the progress bar slice axis 0.
    keys = jax.vmap(lambda k: jax.random.split(k, num_steps), out_axes=1)(chain_keys)

    def chunk(states, step_keys):
        final, hist = jax.vmap(partial(_scan_chunk, step, record), in_axes=(0, 1))(states, step_keys)
        return final, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), hist)

    chunk_fn = jax.jit(chunk)
    if not progress_bar:
        final_state, history = chunk_fn(initial_states, keys)
    else:
        final_state, history = _run_chunked(chunk_fn, initial_states, keys, num_progress_updates)
    states, infos = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), history)
    return ChainTrace(final_state, states, infos)
