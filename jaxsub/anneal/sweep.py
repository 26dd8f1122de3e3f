"""Gibbs and schedule-sweep kernels built from the pure moves of :mod:`jaxsub.anneal.moves`.

* :func:`build_sweep` returns ``sweep(states, chain_keys, windows, data)``, a
  ``lax.scan`` over a span of schedule ticks of ``vmap``-ed chains with the
  hyperparameter step behind a ``lax.cond`` (once per full cycle through the
  current subsample).
* :func:`build_kernel` / :func:`as_top_level_api` (alias :func:`collapsed_gibbs`):
  the BlackJAX-style full-data random-scan collapsed Gibbs kernel
  ``kernel(rng_key, state, data)`` and its ``SamplingAlgorithm``.

Nothing here is jitted or cached: the caller (the :mod:`jaxsub.anneal.driver`,
or the user) compiles.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.anneal.model import EncodedData, HyperGrids, MixtureModel, encode, init_hypers
from jaxsub.anneal.moves import (
    TICK_WORDS,
    AnnealState,
    TickInfo,
    _apply_writes,
    _gated_hypers,
    _noop_writes,
    _tick_plan,
    check_sweep_growth,
    init,
    moves_due,
    resample_hypers,
    tick,
)
from jaxsub.anneal.schedules import GIBBS
from jaxsub.base import SamplingAlgorithm
from jaxsub.types import PRNGKey
from jaxsub.validation import check_int

__all__ = ["as_top_level_api", "build_kernel", "build_sweep", "collapsed_gibbs", "init", "schedule_windows"]


# --------------------------------------------------------------------------- sweeps
def build_sweep(
    model: MixtureModel,
    *,
    policy: str,
    span: int,
    energy_ramp: int = 0,
    grids: HyperGrids | None = None,
    hyper_min_rows: int = 0,
    sweep_growth: float = 0.0,
) -> Callable:
    """A function ``sweep(states, chain_keys, windows, data) -> states`` running ``span`` ticks of every chain.

    ``states`` is a batched :class:`AnnealState` (leading chain axis), ``chain_keys``
    one PRNG key per chain, ``windows`` ``[chains, span]`` the tick codes each chain
    runs next (codes ``schedule.codes[cursor : cursor + span]``, padded with ``-1``
    past the end; see :func:`schedule_windows`), ``data`` the :class:`EncodedData`.
    It is a ``lax.scan`` over ``span`` ticks of ``vmap(tick)``; the
    hyperparameter step sits behind a ``lax.cond`` on "any chain finished a
    cycle", so its grid evaluations are paid only when needed. A chain that
    halts (overflow) does nothing for the rest of the span and resumes at its
    own cursor in the next call. Tick ``t`` of a chain uses the random words of
    ``fold_in(chain_key, t)`` (drawn for the whole span in one batch before the
    scan), so results do not depend on ``span`` or on halts. Nothing here depends
    on the schedule's length, so one compiled sweep serves every schedule.
    Each tick's writes to the ``[N]`` arrays (``order``, assignments) are carried
    to the start of the next scan step and applied before that step's reads (and
    once more after the scan), so XLA updates them in place: O(1) per tick in N.
    ``hyper_min_rows`` may be a Python int or a traced int32 scalar (the driver passes it traced,
    so one compiled sweep serves every value). ``sweep_growth`` (static float, 0: off): the hyper step also
    runs once the subsample has grown by that factor since the last one (:func:`~jaxsub.anneal.moves.moves_due`).
    Not jitted here (the caller jits).

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.model.MixtureModel`.
    policy
        The schedule's row policy.
    span
        Ticks per call.
    energy_ramp
        Ticks over which the likelihood temperature rises to 1 (0: none).
    grids
        :class:`~jaxsub.anneal.model.HyperGrids` or ``None``.
    hyper_min_rows
        Subsample size from which the hyper step runs.
    sweep_growth
        0 or a factor > 1.

    Returns
    -------
    Callable
        ``sweep(states, chain_keys, windows, data) -> states``.

    Raises
    ------
    ValueError
        A ``sweep_growth`` that is neither 0 nor a real > 1.
    """
    config = SweepConfig(
        model,
        policy,
        span,
        energy_ramp,
        grids if grids is not None and not grids.empty else None,
        check_sweep_growth(sweep_growth),
    )

    def sweep(states, chain_keys, windows, data):
        return _sweep(config, hyper_min_rows, states, chain_keys, windows, data)

    return sweep


class SweepConfig(NamedTuple):
    """The static configuration of a mixture schedule sweep (:func:`build_sweep`); ``grids`` ``None``: no hyper step."""

    model: MixtureModel
    policy: str
    span: int
    energy_ramp: int
    grids: HyperGrids | None
    sweep_growth: float


def _one_tick(config: SweepConfig, hyper_min_rows, state, u, window, base, data):
    """One chain's tick: ``(state, writes, need)`` (``need``: the hyper step is due)."""
    c = config
    cur = state.cursor
    raw = window[jnp.clip(cur - base, 0, c.span - 1)].astype(jnp.int32)
    past = (cur - base >= c.span) | (raw < 0)  # -1 pads the window past the schedule's end
    code = jnp.where(past, 0, raw)
    if c.energy_ramp > 0:
        beta = jnp.minimum(1.0, (cur.astype(jnp.float32) + 1.0) / c.energy_ramp)
    else:
        beta = 1.0
    new, writes, _ = _tick_plan(u, state, code, beta, model=c.model, data=data, policy=c.policy)
    new = new._replace(cursor=jnp.where(past, cur, new.cursor))  # past the end: stay
    need = moves_due(new.since_hyper, new.num_assigned, new.swept, c.sweep_growth) & ~new.halted
    need = need & (new.num_assigned >= hyper_min_rows)
    return new, writes, need


def _span_uniforms(span: int, chain_key, cursor):
    """The random words of ticks ``cursor .. cursor + span - 1`` of one chain, drawn in one batch."""
    ticks = cursor + jnp.arange(span, dtype=jnp.int32)
    return jax.vmap(lambda t: jax.random.bits(jax.random.fold_in(chain_key, t), (TICK_WORDS,), jnp.uint32))(ticks)


def _run_hyper(config: SweepConfig, hyper_keys, need, st):
    k_hyp = jax.vmap(jax.random.fold_in)(hyper_keys, st.cursor)
    hyp = jax.vmap(partial(_gated_hypers, model=config.model, grids=config.grids))(k_hyp, st.mixture, need)
    return st._replace(
        mixture=st.mixture._replace(hypers=hyp),
        since_hyper=jnp.where(need, 0, st.since_hyper),
        swept=jnp.where(need, st.num_assigned, st.swept),
    )


def _keep(st):
    return st


def _sweep_body(config: SweepConfig, hyper_min_rows, hyper_keys, windows, base, data, carry, u):
    states, pending = carry
    # the previous tick's [N]-array writes first, then this tick's reads (no copies)
    states = jax.vmap(_apply_writes)(states, pending)
    states, pending, need = jax.vmap(partial(_one_tick, config, hyper_min_rows), in_axes=(0, 0, 0, 0, None))(
        states, u, windows, base, data
    )
    if config.grids is not None:
        states = jax.lax.cond(jnp.any(need), partial(_run_hyper, config, hyper_keys, need), _keep, states)
    return (states, pending), None


def _second_key(k):
    return jax.random.split(k)[1]


def _sweep(config: SweepConfig, hyper_min_rows, states, chain_keys, windows, data):
    """``span`` ticks of every chain under ``config``: see :func:`build_sweep`."""
    base = states.cursor
    uniforms = jax.vmap(partial(_span_uniforms, config.span), out_axes=1)(chain_keys, base)  # [span, chains, words]
    hyper_keys = jax.vmap(_second_key)(chain_keys)
    body = partial(_sweep_body, config, hyper_min_rows, hyper_keys, windows, base, data)
    pending = jax.vmap(partial(_noop_writes, policy=config.policy))(states)
    (states, pending), _ = jax.lax.scan(body, (states, pending), uniforms)
    return jax.vmap(_apply_writes)(states, pending)


def schedule_windows(codes: np.ndarray, cursors: np.ndarray, span: int, dtype=np.int8) -> np.ndarray:
    """``[chains, span]`` codes ``codes[cursor : cursor + span]`` per chain, ``-1``-padded (host side), as ``dtype``.

    Parameters
    ----------
    codes : np.ndarray
        The schedule's tick codes, one-dimensional.
    cursors : array_like
        ``[chains]`` positions in ``codes`` where each chain's next span starts.
    span : int
        The number of ticks per window.
    dtype : numpy dtype, default np.int8
        The output dtype.

    Returns
    -------
    np.ndarray
        ``[chains, span]`` codes, ``-1`` past the end of the schedule.
    """
    cursors = np.asarray(cursors, np.int64)
    idx = cursors[:, None] + np.arange(span)[None, :]
    return np.where(idx < codes.size, codes[np.minimum(idx, codes.size - 1)], -1).astype(dtype)


# --------------------------------------------------------------------------- SamplingAlgorithm
def _cycle_hypers(model: MixtureModel, grids: HyperGrids, k_hyp, st: AnnealState) -> AnnealState:
    """The hyperparameter step after a full cycle of the full-data Gibbs kernel."""
    mixture = resample_hypers(k_hyp, st.mixture, model=model, grids=grids)
    return st._replace(mixture=mixture, since_hyper=jnp.zeros_like(st.since_hyper))


def build_kernel(model: MixtureModel, grids: HyperGrids | None = None) -> Callable:
    """Full-data random-scan collapsed Gibbs kernel ``kernel(rng_key, state, data) -> (state, info)``.

    One step removes a uniformly random row and reassigns it from eq. (star) (one GIBBS
    tick of :func:`jaxsub.anneal.moves.tick`); with ``grids``, the hyperparameters are
    resampled (:func:`jaxsub.anneal.moves.resample_hypers`) after every ``N`` steps.
    ``state`` is an :class:`~jaxsub.anneal.moves.AnnealState` built by :func:`init` with
    every row assigned, ``data`` the :class:`~jaxsub.anneal.model.EncodedData`.

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.model.MixtureModel` (structure).
    grids
        :class:`~jaxsub.anneal.model.HyperGrids` or ``None`` (fixed hyperparameters).

    Returns
    -------
    Callable
        ``kernel(rng_key, state, data) -> (AnnealState, TickInfo)``.
    """
    do_hyper = grids is not None and not grids.empty

    def kernel(rng_key: PRNGKey, state: AnnealState, data: EncodedData) -> tuple[AnnealState, TickInfo]:
        k_tick, k_hyp = jax.random.split(rng_key)
        state, info = tick(k_tick, state, GIBBS, 1.0, model=model, data=data, policy="random")
        if do_hyper:
            need = (state.since_hyper >= state.num_assigned) & ~state.halted
            state = jax.lax.cond(need, partial(_cycle_hypers, model, grids, k_hyp), _keep, state)
        return state, info

    return kernel


def as_top_level_api(
    model: MixtureModel, data, capacity: int, *, grids: HyperGrids | None = None, dtype=jnp.float32
) -> SamplingAlgorithm:
    """Full-data random-scan collapsed Gibbs as a BlackJAX ``SamplingAlgorithm``.

    ``init(position)``: ``position`` is an ``[N]`` assignment vector with every label in
    ``[0, capacity)`` (all rows assigned; no key is needed). ``step(rng_key, state)``:
    :func:`build_kernel`'s kernel on ``data``. Returns ``(AnnealState, TickInfo)``.
    If a new cluster is needed while every slot is occupied the chain halts
    (``info.overflow``, ``state.halted``): grow it with :func:`jaxsub.anneal.mixture.grow`.

    Under ``vmap`` the hyperparameter ``lax.cond`` becomes a select that evaluates the grids
    at every step; :func:`jaxsub.anneal.driver.fit` avoids that cost for many chains.

    Raises
    ------
    ValueError
        ``capacity < 1``, a Finite prior with ``capacity`` != its number of components,
        or a data table that does not match ``model`` (see :func:`~jaxsub.anneal.model.encode`).

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.model.MixtureModel`.
    data
        ``[N, num_features]`` table or :class:`~jaxsub.anneal.model.EncodedData`.
    capacity
        Cluster slots (static).
    grids
        :class:`~jaxsub.anneal.model.HyperGrids` or ``None`` (fixed hyperparameters).
    dtype
        Float dtype of statistics.

    Returns
    -------
    SamplingAlgorithm
    """
    capacity = check_int("capacity", capacity, low=1)
    if model.is_finite and capacity != len(model.prior.weights):
        raise ValueError(f"capacity must equal the number of Finite components ({len(model.prior.weights)})")
    enc = encode(model, data, dtype)
    hypers = init_hypers(model, dtype)
    kernel = build_kernel(model, grids)

    def init_fn(position, rng_key=None):
        del rng_key  # the random-scan policy needs no key
        return init(position, model, enc, capacity, policy="random", hypers=hypers, dtype=dtype)

    def step_fn(rng_key, state):
        return kernel(rng_key, state, enc)

    return SamplingAlgorithm(init_fn, step_fn)


collapsed_gibbs = as_top_level_api
