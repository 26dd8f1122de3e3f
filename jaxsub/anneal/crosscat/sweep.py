"""Schedule sweeps: ``span`` row ticks of vmapped chains, with the feature and hyper moves when due."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxsub.anneal.crosscat.blocks import block_tick
from jaxsub.anneal.crosscat.copy_avoidance import (
    _apply_row_writes,
    _noop_row_writes,
    chain_map,
    drop_chain_axis,
    run_ticks,
)
from jaxsub.anneal.crosscat.features import _check_widths, feature_sweep
from jaxsub.anneal.crosscat.grids import CrossCatGrids
from jaxsub.anneal.crosscat.hypers import HYPER_WIDTHS, _check_hyper_widths, _occupied_bound, resample_hypers
from jaxsub.anneal.crosscat.model import CrossCatModel
from jaxsub.anneal.crosscat.rows import TICK_WORDS, _row_plan
from jaxsub.anneal.crosscat.score_cache import _score_cache
from jaxsub.anneal.moves import check_sweep_growth, moves_due
from jaxsub.anneal.schedules import GIBBS
from jaxsub.validation import check_int

__all__ = ["SweepConfig", "build_sweep", "sweep", "sweep_config"]


class SweepConfig(NamedTuple):
    """The static configuration of a CrossCat schedule sweep (:func:`build_sweep`); every field a Python value."""

    model: CrossCatModel
    span: int
    energy_ramp: int
    grids: CrossCatGrids | None
    num_aux: int
    hyper_min_rows: int
    feature_moves: bool
    feature_min_rows: int
    policy: str
    blocked: bool
    feature_widths: tuple
    sweep_growth: float
    hyper_widths: tuple


class _Span(NamedTuple):
    """What one span's tick and move functions share: the configuration and the span's (traced) inputs."""

    config: SweepConfig
    single: bool  # one chain, carried without its chain axis
    fkeys: jnp.ndarray
    windows: jnp.ndarray
    base: jnp.ndarray
    data: object


def build_sweep(
    model: CrossCatModel,
    *,
    span: int,
    energy_ramp: int = 0,
    grids: CrossCatGrids | None = None,
    num_aux: int = 1,
    hyper_min_rows: int = 0,
    feature_moves: bool = True,
    feature_min_rows: int = 0,
    policy: str = "random",
    blocked: bool = False,
    feature_widths: tuple = (),
    sweep_growth: float = 0.0,
    hyper_widths: tuple = HYPER_WIDTHS,
):
    """``sweep(states, chain_keys, windows, data) -> states``: ``span`` ticks of vmapped chains (``lax.scan``).

    ``policy``: the schedule's row policy, ``"random"`` or ``"fifo"`` (states from ``init(..., policy="fifo")``).
    ``blocked``: the windows hold ``code + 8 * block`` (int32; a schedule with ``blocks``, e.g.
    :func:`~jaxsub.anneal.anneal_stepsize`): a GIBBS tick with ``block > 1`` is a :func:`block_tick`
    (every tick then also computes the block move: use it only for such schedules).

    After a tick that completes a cycle through the current subsample a chain runs the feature moves
    of :func:`feature_sweep` (once the subsample holds ``feature_min_rows`` rows) and then the hyper
    step :func:`resample_hypers` (once it holds ``hyper_min_rows`` rows), each behind a ``lax.cond``
    on "any chain needs it". Tick ``t`` of a chain uses ``fold_in(chain_key, t)``. With moves compiled in, the ticks
    run in an inner ``while`` loop that exits after a tick whose moves fire and the moves run outside it, so the
    tick loop's body holds no ``cond`` (one there made XLA:CPU copy the carry arrays its branches write every tick).

    ``hyper_widths``: the cluster widths of :func:`resample_hypers` (its ``widths``).

    The scan carries each chain's :class:`_ScoreCache` (per-cluster categorical cell counts and NIX
    Student-t parameters) beside its state: a tick updates it at the clusters it touches, so scoring a
    row costs no sum over levels and no ``lgamma``; it is rebuilt after feature and hyper moves.

    ``feature_widths`` (static increasing ints, default none): the feature moves run on the first ``w`` rows of
    each chain's subsample window (:func:`feature_sweep` ``width``), ``w`` the smallest of them that holds the
    largest subsample of the chains that need the moves (a ``lax.switch``, all ``N`` rows past the last), so
    their cost follows the subsample: each width compiles one more copy of the feature sweep (~2.5-4 CPU-s more
    for ``fit`` on the 11-feature flights table), so it is opt-in (:func:`width_ladder`).

    ``sweep_growth`` (static float, 0: off): the feature and hyper moves also run after a tick once the subsample
    holds ``sweep_growth`` times the rows it held at the chain's last feature / hyper step (``state.swept``), cycle
    or not. A schedule that only adds rows (the linear anneal at ``N`` assignments, a sequential phase) never
    completes a cycle, so without it its moves run once (at ``hyper_min_rows``); with ``sweep_growth=2`` they run
    at ~20, 40, 80, ... rows. It changes when the moves run (a function of the tick counters, not of the state's
    values), not what they do: each move still leaves the current subsample's posterior invariant.

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.crosscat.CrossCatModel`.
    span, energy_ramp, grids, num_aux, hyper_min_rows, feature_moves, feature_min_rows, policy, blocked
        As above; ``energy_ramp``: ticks over which the likelihood temperature rises to 1 (0: none).
    feature_widths, sweep_growth, hyper_widths
        As above.

    Returns
    -------
    Callable
        ``sweep(states, chain_keys, windows, data) -> states``, a pure function of :class:`SweepConfig` (the
        caller compiles it).

    Raises
    ------
    ValueError
        ``span < 1``, ``energy_ramp < 0``, ``num_aux < 1``, an unknown ``policy``, ``feature_widths`` that are not
        strictly increasing positive ints, or a ``sweep_growth`` that is neither 0 nor > 1.
    """
    config = sweep_config(
        model,
        span=span,
        energy_ramp=energy_ramp,
        grids=grids,
        num_aux=num_aux,
        hyper_min_rows=hyper_min_rows,
        feature_moves=feature_moves,
        feature_min_rows=feature_min_rows,
        policy=policy,
        blocked=blocked,
        feature_widths=feature_widths,
        sweep_growth=sweep_growth,
        hyper_widths=hyper_widths,
    )

    def run_sweep(states, chain_keys, windows, data):
        return sweep(config, states, chain_keys, windows, data)

    return run_sweep


def sweep_config(
    model: CrossCatModel,
    *,
    span: int,
    energy_ramp: int = 0,
    grids: CrossCatGrids | None = None,
    num_aux: int = 1,
    hyper_min_rows: int = 0,
    feature_moves: bool = True,
    feature_min_rows: int = 0,
    policy: str = "random",
    blocked: bool = False,
    feature_widths: tuple = (),
    sweep_growth: float = 0.0,
    hyper_widths: tuple = HYPER_WIDTHS,
) -> SweepConfig:
    """The validated :class:`SweepConfig` of :func:`build_sweep`'s arguments (``ValueError`` naming a bad one)."""
    if policy not in ("random", "fifo"):
        raise ValueError(f"policy must be 'random' or 'fifo'; got {policy!r}")
    return SweepConfig(
        model,
        check_int("span", span, low=1),
        check_int("energy_ramp", energy_ramp, low=0),
        grids,
        check_int("num_aux", num_aux, low=1),
        hyper_min_rows,
        bool(feature_moves),
        feature_min_rows,
        policy,
        bool(blocked),
        _check_widths(feature_widths),
        check_sweep_growth(sweep_growth),
        _check_hyper_widths(hyper_widths),
    )


def _tick_one(config: SweepConfig, state, cache, u, window, base, data):
    """One chain's tick: ``(state, writes, needs [2], cache)`` (``needs``: feature / hyper moves due)."""
    c = config
    cur = state.cursor
    raw = window[jnp.clip(cur - base, 0, c.span - 1)].astype(jnp.int32)
    past = (cur - base >= c.span) | (raw < 0)
    block = jnp.where(past, 1, raw >> 3) if c.blocked else 1
    code = jnp.where(past, 0, raw & 7)
    beta = jnp.minimum(1.0, (cur.astype(jnp.float32) + 1.0) / c.energy_ramp) if c.energy_ramp > 0 else 1.0
    new, writes, _, cache = _row_plan(u, state, code, beta, model=c.model, data=data, cache=cache, policy=c.policy)
    if c.blocked:
        use = (block > 1) & (code == GIBBS)
        new_b, _ = block_tick(u, state, block, model=c.model, data=data)
        sel = partial(_select, use)
        new, writes = sel(new_b, new), sel(_noop_row_writes(new_b), writes)
        cache = sel(_score_cache(new_b), cache)
    new = new._replace(cursor=jnp.where(past, cur, new.cursor))
    cycle = moves_due(new.since_hyper, new.num_assigned, new.swept, c.sweep_growth) & ~new.halted
    need_f = cycle & (new.num_assigned >= c.feature_min_rows) if c.feature_moves else jnp.zeros_like(cycle)
    need_h = cycle & (new.num_assigned >= c.hyper_min_rows) if c.grids is not None else jnp.zeros_like(cycle)
    return new, writes, jnp.stack([need_f, need_h]), cache


def _select(use, a, b):
    return jax.tree.map(lambda x, y: jnp.where(use, x, y), a, b)


def _pick(mask, a, b):
    """Per chain: ``a`` where ``mask`` else ``b`` (``mask`` has the chain axes of the leaves)."""
    return jax.tree.map(lambda x, y: jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim)), x, y), a, b)


def _tick(sp: _Span, carry, u):
    states, pending, caches = carry
    # the previous tick's [V, N] / [N] writes first, then this tick's reads (no copies)
    states = chain_map(sp.single, _apply_row_writes)(states, pending)
    states, pending, needs, caches = chain_map(sp.single, partial(_tick_one, sp.config), in_axes=(0, 0, 0, 0, 0, None))(
        states, caches, u, sp.windows, sp.base, sp.data
    )
    return (states, pending, caches), needs


def _chain_feature_sweep(config: SweepConfig, data, width, k, state, trip):
    return feature_sweep(k, state, model=config.model, data=data, num_aux=config.num_aux, trip=trip, width=width)


def _feature_sweep_at(sp: _Span, ks, trip, width, st):
    fn = partial(_chain_feature_sweep, sp.config, sp.data, width)
    return chain_map(sp.single, fn, in_axes=(0, 0, None))(ks, st, trip)


def _feature_moves(sp: _Span, need_f, ks, st):
    """The feature sweep of the chains that need it: ``(states, ok)``; prior-partition loops bounded by the largest
    subsample (unbatched), on the smallest width holding it (an unbatched switch index)."""
    trip = jnp.max(jnp.where(need_f, st.num_assigned, 0))
    ws = [w for w in sp.config.feature_widths if w < sp.data.cat.shape[0]]
    if ws:
        branches = [partial(_feature_sweep_at, sp, ks, trip, w) for w in ws + [None]]
        new, ok_f = jax.lax.switch(jnp.sum(trip > jnp.asarray(ws)).astype(jnp.int32), branches, st)
    else:
        new, ok_f = _feature_sweep_at(sp, ks, trip, None, st)
    return _pick(need_f & ok_f, new, st), ok_f | ~need_f


def _chain_hypers(config: SweepConfig, k, state, occupied):
    return resample_hypers(
        k, state, model=config.model, grids=config.grids, occupied=occupied, widths=config.hyper_widths
    )


def _fold_one(k):
    return jax.random.fold_in(k, 1)


def _hyper_moves(sp: _Span, need_h, ok, ks, st):
    kh = chain_map(sp.single, _fold_one)(ks)
    occ = _occupied_bound(sp.config.model, st)  # one width for every chain (a batched switch runs every branch)
    step = chain_map(sp.single, partial(_chain_hypers, sp.config), in_axes=(0, 0, None))
    return _pick(need_h & ok, step(kh, st, occ), st)


def _keep(st):
    return st


def _keep_with(ok, st):
    return st, ok


def _run_moves(sp: _Span, need_f, need_h, carry):
    """The feature then hyper moves of the chains whose ``needs`` fired; the score caches rebuilt."""
    c = sp.config
    st, pend, _ = carry
    st = chain_map(sp.single, _apply_row_writes)(st, pend)
    ks = chain_map(sp.single, jax.random.fold_in)(sp.fkeys, st.cursor)
    ok = jnp.ones_like(need_f)
    if c.feature_moves:
        st, ok = jax.lax.cond(jnp.any(need_f), partial(_feature_moves, sp, need_f, ks), partial(_keep_with, ok), st)
    if c.grids is not None:
        st = jax.lax.cond(jnp.any(need_h & ok), partial(_hyper_moves, sp, need_h, ok, ks), _keep, st)
    done = (need_f | need_h) & ok
    st = st._replace(
        since_hyper=jnp.where(done, 0, st.since_hyper),
        halted=st.halted | ~ok,
        swept=jnp.where(done, st.num_assigned, st.swept),
    )
    return st, chain_map(sp.single, _noop_row_writes)(st), _score_cache(st)


def _moves_after(sp: _Span, carry, needs):
    """The feature and hyper moves after a tick whose ``needs`` fired (behind a ``lax.cond``)."""
    need_f, need_h = needs[..., 0], needs[..., 1]
    return jax.lax.cond(jnp.any(need_f | need_h), partial(_run_moves, sp, need_f, need_h), _keep, carry)


def _second_key(k):
    return jax.random.split(k)[1]


def _span_words(span: int, num_u: int, chain_key, cursor):
    """The random words of ticks ``cursor .. cursor + span - 1`` of one chain, in one batch: ``[span, num_u]``."""
    ticks = cursor + jnp.arange(span, dtype=jnp.int32)
    return jax.vmap(lambda t: jax.random.bits(jax.random.fold_in(chain_key, t), (num_u,), jnp.uint32))(ticks)


def sweep(config: SweepConfig, states, chain_keys, windows, data):
    """``span`` ticks of the chains ``states`` (leading chain axis) under ``config``: see :func:`build_sweep`."""
    c = config
    base = states.cursor
    fkeys = jax.vmap(_second_key)(chain_keys)
    num_u = TICK_WORDS + states.z.shape[1]
    uniforms = jax.vmap(partial(_span_words, c.span, num_u), out_axes=1)(chain_keys, base)  # [span, chains, 4 + V]
    single = states.cursor.shape[0] == 1
    if single:
        states, fkeys, windows, base = drop_chain_axis((states, fkeys, windows, base))
        uniforms = uniforms[:, 0]
    sp = _Span(c, single, fkeys, windows, base, data)
    pending = chain_map(single, _noop_row_writes)(states)
    carry = (states, pending, _score_cache(states))
    moves = partial(_moves_after, sp) if (c.feature_moves or c.grids is not None) else None
    carry = run_ticks(partial(_tick, sp), moves, carry, uniforms, c.span, states.cursor.shape + (2,))
    states, pending, _ = carry
    states = chain_map(single, _apply_row_writes)(states, pending)
    return jax.tree.map(lambda a: a[None], states) if single else states
