"""Shared conventions: the sampling-algorithm contract and chain drivers.

Every jaxsub sampler follows BlackJAX's layout, one module per sampler:

* ``State`` and ``Info`` are ``NamedTuple`` pytrees;
* ``init(position, ...) -> State`` builds the initial state;
* ``build_kernel(...) -> kernel`` returns ``kernel(rng_key, state, ...) -> (State, Info)``;
  static settings (batch sizes, schedules, confidence levels) live in the
  closure, arrays are arguments;
* ``as_top_level_api(...)`` validates the static configuration (raising a
  ``ValueError`` that names the parameter, see :mod:`jaxsub.validation`) and
  returns a :class:`blackjax.base.SamplingAlgorithm` whose ``step`` has the
  signature ``step(rng_key, state) -> (state, info)``.

The PRNG key is always passed in and split, never stored in a state. The
library never calls ``jax.jit`` inside a sampler; :func:`run_chain` and
:func:`run_chains` are *drivers* (like ``blackjax.util.run_inference_algorithm``)
and compile the loop they run.
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
    """What :func:`run_chain` returns.

    Attributes
    ----------
    final_state
        The state after the last step.
    states
        The stacked (transformed) states, leading axis = step (and chain, for
        :func:`run_chains`: shape ``[num_chains, num_steps, ...]``).
    infos
        The stacked ``Info`` objects, same leading axes.
    """

    final_state: ArrayLikeTree
    states: ArrayLikeTree
    infos: ArrayLikeTree


def _step_fn(algorithm) -> Callable:
    return algorithm.step if hasattr(algorithm, "step") else algorithm


def _scan_chunk(step, transform, state, keys):
    def one_step(carry, key):
        new_state, info = step(key, carry)
        return new_state, transform(new_state, info)

    return jax.lax.scan(one_step, state, keys)


def run_chain(
    rng_key: PRNGKey,
    algorithm: SamplingAlgorithm | Callable,
    initial_state: ArrayLikeTree,
    num_steps: int,
    *,
    transform: Callable | None = None,
    progress_bar: bool = False,
    num_progress_updates: int = 20,
) -> ChainTrace:
    """Run one chain for ``num_steps`` steps with ``lax.scan``.

    Parameters
    ----------
    rng_key
        PRNG key; split into one key per step.
    algorithm
        A ``SamplingAlgorithm`` (its ``step`` is used) or a bare
        ``step(rng_key, state) -> (state, info)`` function.
    initial_state
        The state to start from (``algorithm.init(position)``).
    num_steps
        Number of transitions.
    transform
        ``transform(state, info) -> pytree`` applied to what is stored at each
        step (default: ``(state, info)``); use it to keep only positions.
    progress_bar
        Show a ``tqdm`` bar. The scan is then cut into ``num_progress_updates``
        equal chunks, each one compiled call of the same jitted function (one
        compilation in total), so the bar costs nothing inside the loop.
    num_progress_updates
        Number of chunks when ``progress_bar`` is true.

    Returns
    -------
    ChainTrace
        ``(final_state, states, infos)`` where ``states``/``infos`` are the
        two halves of ``transform``'s output when it returns a pair, otherwise
        ``states`` holds the transformed output and ``infos`` is ``None``.
    """
    num_steps = check_int("num_steps", num_steps, low=1)
    step = _step_fn(algorithm)
    if transform is None:
        transform = lambda state, info: (state, info)  # noqa: E731
    keys = jax.random.split(rng_key, num_steps)
    chunk_fn = jax.jit(partial(_scan_chunk, step, transform))
    if not progress_bar:
        final_state, history = chunk_fn(initial_state, keys)
    else:
        final_state, history = _run_chunked(chunk_fn, initial_state, keys, num_progress_updates)
    return _as_trace(final_state, history)


def _run_chunked(chunk_fn, state, keys, num_chunks):
    from tqdm.auto import tqdm  # optional dependency (experiments extra)

    num_steps = keys.shape[0]
    chunk = max(1, math.ceil(num_steps / max(1, num_chunks)))
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


def _as_trace(final_state, history) -> ChainTrace:
    if isinstance(history, tuple) and not hasattr(history, "_fields") and len(history) == 2:
        return ChainTrace(final_state, history[0], history[1])
    return ChainTrace(final_state, history, None)


def run_chains(
    rng_key: PRNGKey,
    algorithm: SamplingAlgorithm | Callable,
    initial_states: ArrayLikeTree,
    num_steps: int,
    *,
    transform: Callable | None = None,
    progress_bar: bool = False,
    num_progress_updates: int = 20,
) -> ChainTrace:
    """Run independent chains in parallel: ``vmap`` over chains of a ``lax.scan``.

    Parameters
    ----------
    rng_key
        PRNG key; split into one key per chain (then per step).
    algorithm
        As in :func:`run_chain`.
    initial_states
        A batched state: every leaf has a leading ``num_chains`` axis, e.g.
        ``jax.vmap(algorithm.init)(positions)``.
    num_steps, transform, progress_bar, num_progress_updates
        As in :func:`run_chain`.

    Returns
    -------
    ChainTrace
        Leaves of ``states``/``infos`` have shape ``[num_chains, num_steps, ...]``.
    """
    num_steps = check_int("num_steps", num_steps, low=1)
    leaves = jax.tree.leaves(initial_states)
    if not leaves:
        raise ValueError("initial_states must be a non-empty pytree of batched arrays")
    num_chains = leaves[0].shape[0]
    step = _step_fn(algorithm)
    if transform is None:
        transform = lambda state, info: (state, info)  # noqa: E731
    chain_keys = jax.random.split(rng_key, num_chains)
    # keys[t, c]: step-major so that chunks for the progress bar slice axis 0.
    keys = jax.vmap(lambda k: jax.random.split(k, num_steps), out_axes=1)(chain_keys)

    def chunk(states, step_keys):
        final, hist = jax.vmap(partial(_scan_chunk, step, transform), in_axes=(0, 1))(states, step_keys)
        return final, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), hist)

    chunk_fn = jax.jit(chunk)
    if not progress_bar:
        final_state, history = chunk_fn(initial_states, keys)
    else:
        final_state, history = _run_chunked(chunk_fn, initial_states, keys, num_progress_updates)
    history = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), history)
    return _as_trace(final_state, history)
