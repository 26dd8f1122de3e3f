"""Draws of Pitman-Yor row partitions of the subsample (auxiliary views, MH proposals) and of the view prior."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxsub.anneal.crosscat.model import CrossCatModel, _window_rows
from jaxsub.anneal.moves import bits_to_uniform, uniform_index
from jaxsub.types import PRNGKey

__all__ = ["prior_view_partition"]


class _Seating(NamedTuple):
    """What the sequential seating loop of :func:`_draw_partitions` reads (``alpha``, ``d`` ``[P]``)."""

    key: jnp.ndarray
    alpha: jnp.ndarray
    d: jnp.ndarray
    num_assigned: jnp.ndarray
    capacity: int
    pidx: jnp.ndarray
    block: int


def _seat_row(seat: _Seating, i, ws, carry):
    """Seat subsample row ``i`` in every partition (random words ``ws`` ``[P, 4]``)."""
    alpha, d, num_assigned, capacity, pidx = seat.alpha, seat.d, seat.num_assigned, seat.capacity, seat.pidx
    n = carry[1].shape[1]
    dt = alpha.dtype
    u, w = bits_to_uniform(ws[:, :2], dt), ws[:, 2:]
    lab, joined, sizes, tables, bad = carry
    fi, ft = i.astype(dt), tables.astype(dt)
    new = u[:, 0] * (fi + alpha) < alpha + ft * d
    n_join = i - tables  # earlier rows that joined an existing table
    from_join = u[:, 1] * (fi - ft * d) < n_join.astype(dt)
    pos = jnp.minimum(uniform_index(w, n_join), jnp.maximum(n_join - 1, 0))  # exact integer draws
    copied = joined[pidx, pos]
    uniform_table = jnp.minimum(uniform_index(w, tables), jnp.maximum(tables - 1, 0))
    k = jnp.where(new, tables, jnp.where(from_join, copied, uniform_table))
    on = i < num_assigned
    full = new & (tables >= capacity)
    g = on & ~full & ~bad
    k = jnp.where(g, k, -1)
    lab = jax.lax.dynamic_update_slice(lab, k[:, None], (jnp.zeros((), jnp.int32), i))  # lab has `block` spare columns
    joined = joined.at[pidx, jnp.where(g & ~new, n_join, n)].set(k, mode="drop")
    sizes = sizes.at[pidx, jnp.where(g, k, capacity)].add(1, mode="drop")
    return lab, joined, sizes, tables + (g & new).astype(jnp.int32), bad | (on & full)


def _seat_chunk(seat: _Seating, c, carry):
    """Seat rows ``c * block ... (c + 1) * block - 1``, their random words drawn in one call."""
    ws = jax.random.bits(jax.random.fold_in(seat.key, c), (seat.block, seat.alpha.shape[0], 4), jnp.uint32)
    return jax.lax.fori_loop(0, seat.block, lambda j, cr: _seat_row(seat, c * seat.block + j, ws[j], cr), carry)


def _draw_partitions(key, order, num_assigned, alpha, d, capacity, trip=None):
    """Independent PY(alpha[i], d[i]) partitions of the assigned rows ``order[:num_assigned]``, one per entry of
    ``alpha`` ``[P]``: ``(z [P, N], sizes [P, C], ok [P])`` (``ok`` False: a partition ran out of slots).

    Sequential seating in ``order`` (the PY prior's predictive rule), all ``P`` partitions in one loop
    over the subsample only: ``trip`` (default ``num_assigned``, any bound ``>= num_assigned``) steps of
    O(P) work each. Under ``vmap`` over chains pass an unbatched ``trip`` (the largest subsample) so
    the loop's condition is not batched (a batched ``while_loop`` selects its whole ``[P, N]`` carry
    on every step).

    Row ``i`` (``K`` tables so far) opens table ``K`` (the first empty slot) with probability
    ``(alpha + K d) / (i + alpha)``, else joins table ``k`` with probability ``(n_k - d) / (i - K d)``,
    drawn in O(1) without scanning the slots: ``n_k - d = (n_k - 1) + (1 - d)``, so with probability
    ``(i - K) / (i - K d)`` it copies the table of a uniform row among the ``i - K`` earlier rows that
    joined an existing table (each table ``k`` holds ``n_k - 1`` of them), else it picks a uniform table.
    """
    n = order.shape[0]
    num = alpha.shape[0]
    trip = num_assigned if trip is None else trip
    pidx = jnp.arange(num)
    block = min(32, n)  # random words drawn per block of rows (one threefry call, not one per row)

    seat = _Seating(key, alpha, d, num_assigned, capacity, pidx, block)
    init = (
        jnp.full((num, n + block), -1, jnp.int32),
        jnp.zeros((num, n), jnp.int32),
        jnp.zeros((num, capacity), jnp.int32),
        jnp.zeros((num,), jnp.int32),
        jnp.zeros((num,), bool),
    )
    lab, _, sizes, _, bad = jax.lax.fori_loop(0, (trip + block - 1) // block, partial(_seat_chunk, seat), init)
    lab = lab[:, :n]
    return jnp.full((num, n), -1, jnp.int32).at[:, order].set(lab), sizes, ~bad


def _draw_crp_partitions(key, order, num_assigned, alpha, capacity):
    """:func:`_draw_partitions` for discount 0 (CRP), without a loop over the rows: ``(z [P, N], sizes [P, C], ok [P])``.

    Row ``i`` of the subsample (in ``order``) opens a new table with probability ``alpha / (i + alpha)``
    (independently of the other rows when ``d = 0``), else it joins the table of a uniform earlier row
    (table ``k`` with probability ``n_k / (i + alpha)``: the CRP's predictive rule). The rows and their
    "earlier row" pointers form a forest whose roots are the table openers; each row's root is found by
    pointer doubling (until no pointer moves), its table is the number of openers up to the root.
    The same law as the sequential seating, O(P N log N) work in a few kernels instead of N loop steps.
    """
    n = order.shape[0]
    num = alpha.shape[0]
    dt = alpha.dtype
    ws = jax.random.bits(key, (num, n, 3), jnp.uint32)
    u = bits_to_uniform(ws[..., 0], dt)
    i = jnp.arange(n, dtype=jnp.int32)
    new = (u * (i.astype(dt) + alpha[:, None]) < alpha[:, None]) | (i == 0)
    # exact integer draw: floor(u * i) from a float32 uniform is visibly non-uniform for i ~ 1e5 (2^23 grid points)
    parent = jnp.minimum(uniform_index(ws[..., 1:], i), jnp.maximum(i - 1, 0))
    ptr = jnp.where(new, i, parent)

    def double(c):
        p, _ = c
        q = jnp.take_along_axis(p, p, axis=1)
        return q, jnp.any(q != p)

    # until every pointer is a root (depth of a random recursive tree: O(log N) w.h.p., so ~log2 log N rounds)
    ptr, _ = jax.lax.while_loop(lambda c: c[1], double, (ptr, jnp.asarray(True)))
    opened = jax.lax.associative_scan(jnp.add, new.astype(jnp.int32), axis=1)  # tables opened among rows 0..i
    on = i < num_assigned
    lab = jnp.take_along_axis(opened, ptr, axis=1) - 1
    ok = jnp.max(jnp.where(on, opened, 0), axis=1) <= capacity
    lab = jnp.where(on & (lab < capacity), lab, -1)
    sizes = (
        jnp.zeros((num, capacity), jnp.int32)
        .at[jnp.arange(num)[:, None], jnp.where(lab >= 0, lab, capacity)]
        .add(1, mode="drop")
    )
    return jnp.full((num, n), -1, jnp.int32).at[:, order].set(lab), sizes, ok


def _prior_partition(key, state, alpha, d):
    """A PY(alpha, d) partition of the assigned rows (sequential seating in ``order``): ``(z [N], sizes [C], ok)``."""
    z, sizes, ok = _draw_partitions(
        key,
        _window_rows(state),
        state.num_assigned,
        jnp.reshape(alpha, (1,)),
        jnp.reshape(d, (1,)),
        state.sizes.shape[1],
    )
    return z[0], sizes[0], ok[0]


def prior_view_partition(rng_key: PRNGKey, model: CrossCatModel, num_aux: int = 1) -> jnp.ndarray:
    """``[F]`` view labels of the features drawn from the view prior ``PY(alpha_v, d_v)`` (sequential seating
    in column order; labels ``0..K-1`` in order of first appearance, ``K <= F < F + num_aux`` view slots).

    Parameters
    ----------
    rng_key
        PRNG key.
    model
        The :class:`~jaxsub.anneal.crosscat.CrossCatModel`.
    num_aux
        Auxiliary view slots (``F + num_aux`` slots in all).

    Returns
    -------
    jnp.ndarray
        ``[F]`` int32 view labels.
    """
    F = model.num_features
    dt = jnp.float32
    z, _, _ = _draw_partitions(
        rng_key,
        jnp.arange(F, dtype=jnp.int32),
        jnp.asarray(F, jnp.int32),
        jnp.full((1,), model.view_prior.alpha, dt),
        jnp.full((1,), model.view_prior.discount, dt),
        F + num_aux,
    )
    return z[0]
