"""XLA:CPU copy avoidance in the row sweep: deferred label writes and the split tick loop.

XLA updates a loop-carried array in place only when no read of it is scheduled after the write;
otherwise it copies the whole array. Two structures of :func:`~jaxsub.anneal.crosscat.sweep.build_sweep`
exist only to keep the per-tick cost independent of the table's size:

* **Deferred row writes** (:class:`_RowWrites`). A row tick reads the ``[V, N]`` labels and the ``[N]``
  order and writes two label columns and up to four order entries. :func:`~jaxsub.anneal.crosscat.rows._row_plan`
  does every read and returns the writes; the sweep applies them (:func:`_apply_row_writes`,
  dynamic-update-slices) at the start of the next scan step, before that step's reads. Written in the
  same step, a read after the write forces a copy of the whole ``[V, N]`` array: O(V N) per tick
  instead of O(V).
* **The split tick loop** (:func:`run_ticks`). The feature and hyper moves fire after a few ticks; a
  ``lax.cond`` holding them inside the tick loop's body makes XLA:CPU copy every carry array its
  branch writes (``view_of``, sizes, counts, hypers) on every tick, taken or not: 40.5 -> 51.4 us per
  tick on the full gss table. The ticks therefore run in an inner ``while`` loop that exits after a tick
  whose moves are due (a function of the tick counters), and the moves run outside it, in the outer
  loop. Same ticks, same moves, same order: the same draws.

A sweep of one chain also drops the chain axis (:func:`chain_map`), so no batch-index arithmetic
surrounds each gather, scatter and dynamic-update-slice of a tick (94 -> 78 fusions per tick on the
flights subset; same operations, same draws).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxsub.anneal.crosscat.model import CrossCatState

__all__: list = []


class _RowWrites(NamedTuple):
    """Pending writes of one row tick to the ``[V, N]`` labels and the ``[N]`` order (applied in order).

    ``z_pos`` ``[2]`` rows (removed, added), ``z_val`` ``[2, V]`` their new label columns;
    ``order_pos`` / ``order_val`` ``[4]``. An inactive move writes back the value it read.
    """

    z_pos: jnp.ndarray
    z_val: jnp.ndarray
    order_pos: jnp.ndarray
    order_val: jnp.ndarray


def _get(x, i):
    return jax.lax.dynamic_slice(x, (jnp.asarray(i, jnp.int32),), (1,))[0]


def _set(x, i, v):
    return jax.lax.dynamic_update_slice(x, jnp.asarray(v, x.dtype)[None], (jnp.asarray(i, jnp.int32),))


def _get_col(z, i):
    return jax.lax.dynamic_slice(z, (jnp.zeros((), jnp.int32), jnp.asarray(i, jnp.int32)), (z.shape[0], 1))[:, 0]


def _apply_row_writes(state: CrossCatState, w: _RowWrites) -> CrossCatState:
    """Apply a tick's pending ``[V, N]``/``[N]`` writes (dynamic-update-slices, in place inside a scan)."""
    z = state.z
    for i in range(w.z_pos.shape[0]):
        z = jax.lax.dynamic_update_slice(z, w.z_val[i][:, None].astype(z.dtype), (jnp.zeros((), jnp.int32), w.z_pos[i]))
    order = state.order
    for i in range(w.order_pos.shape[0]):
        order = _set(order, w.order_pos[i], w.order_val[i])
    return state._replace(z=z, order=order)


def _noop_row_writes(state: CrossCatState) -> _RowWrites:
    """Writes that change nothing (element 0 written back), for one chain."""
    zero = jnp.zeros((), jnp.int32)
    col = _get_col(state.z, zero)
    return _RowWrites(
        jnp.zeros((2,), jnp.int32),
        jnp.stack([col, col]),
        jnp.zeros((4,), jnp.int32),
        jnp.full((4,), _get(state.order, zero), jnp.int32),
    )


def _identity_map(f, in_axes=0):
    """:func:`chain_map` of a sweep of one chain: ``f`` itself (no chain axis)."""
    del in_axes
    return f


def chain_map(single: bool, f, in_axes=0):
    """``jax.vmap(f, in_axes)`` over the chains, or ``f`` itself when the sweep carries one chain unbatched."""
    return _identity_map(f) if single else jax.vmap(f, in_axes=in_axes)


def drop_chain_axis(tree):
    """A one-chain batch without its chain axis (the sweep of one chain runs unbatched)."""
    return jax.tree.map(lambda a: a[0], tree)


def _ticks_continue(span: int, c) -> jnp.ndarray:
    """The inner loop runs while ticks are left in the span and no chain's moves are due."""
    return (c[1] < span) & ~jnp.any(c[2])


def _inner_tick(tick: Callable, uniforms, c):
    carry, t, _ = c
    carry, needs = tick(carry, jax.lax.dynamic_index_in_dim(uniforms, t, keepdims=False))
    return carry, t + 1, needs


def _ticks_then_moves(tick: Callable, moves: Callable, uniforms, span: int, c):
    carry, t, needs = jax.lax.while_loop(partial(_ticks_continue, span), partial(_inner_tick, tick, uniforms), c)
    return moves(carry, needs), t, jnp.zeros_like(needs)


def _span_left(span: int, c) -> jnp.ndarray:
    return c[1] < span


def run_ticks(tick: Callable, moves: Callable | None, carry, uniforms, span: int, needs_shape: tuple):
    """Run ``span`` ticks ``carry, needs = tick(carry, uniforms[t])``, with ``moves(carry, needs)`` after a tick
    whose ``needs`` fire.

    Without moves (``moves=None``) a ``lax.scan``. With moves, an inner ``while`` loop of ticks that exits after a
    tick whose moves are due, and the moves outside it (the module docstring says why). Returns the final carry.
    """
    if moves is None:
        carry, _ = jax.lax.scan(tick, carry, uniforms)
        return carry
    needs0 = jnp.zeros(needs_shape, bool)
    carry, _, _ = jax.lax.while_loop(
        partial(_span_left, span),
        partial(_ticks_then_moves, tick, moves, uniforms, span),
        (carry, jnp.int32(0), needs0),
    )
    return carry
