"""One Gibbs update's context and its exact parts: the block window, the exact sums and the exact update.

An update of the mention at sorted position ``p`` reads an O(W) window of the state
(:class:`Update`, :func:`update_context`); its candidates are *columns*: column
``c < num_active`` is the non-empty cluster ``active[s + c]`` (``i``'s own cluster ``a`` included,
with ``i`` removed); if ``i`` was alone, ``a``'s column is the empty candidate, else column
``num_active`` (the id ``active[s + num_active]``). The exact update sums all ``K`` factors per
column (:func:`chunk_sums`) and draws by the Gumbel-max trick (:func:`exact_update`);
:func:`checked_info` re-makes a race's decision exactly under the same noise.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxsub.coreference.options import ClassConfig
from jaxsub.coreference.rewards import Model, factors, row
from jaxsub.coreference.state import SweepInfo, view

__all__ = [
    "Update",
    "block_member",
    "block_window",
    "checked_info",
    "chunk_sums",
    "column_id",
    "exact_update",
    "update_context",
]


class Update(NamedTuple):
    """The values one update reads from the state before deciding (traced scalars and the window).

    Attributes
    ----------
    state
        The packed state's column views (:func:`~jaxsub.coreference.state.view`).
    i, s, n, K
        The mention, its block's first slot, the block size and ``K = n - 1``.
    a, col_a
        ``i``'s cluster and its column.
    nact, ncols
        Non-empty clusters of the block, candidate columns.
    mp_i, skip
        ``i``'s slot in ``members`` and its offset in ``a``'s segment.
    xi
        ``i``'s row of the mentions.
    mem_w
        ``[W]`` the block's slots of ``members`` (gathered once, outside every loop: a loop reading an
        ``[M]`` array that the update then writes made XLA copy it at every update).
    k_noise, k_race
        The update's keys (the class key folded with ``p``: batched rounds draw the same noise).
    """

    state: object
    i: jax.Array
    s: jax.Array
    n: jax.Array
    K: jax.Array
    a: jax.Array
    col_a: jax.Array
    nact: jax.Array
    ncols: jax.Array
    mp_i: jax.Array
    skip: jax.Array
    xi: object
    mem_w: jax.Array
    k_noise: jax.Array
    k_race: jax.Array


def update_context(cfg: ClassConfig, blocks_dev, model: Model, packed, key, p) -> Update:
    """The :class:`Update` of the mention at sorted position ``p`` (``blocks_dev = (order, start, size)``)."""
    order, start_arr, size_arr = blocks_dev
    state = view(packed)
    k_noise, k_race = jax.random.split(jax.random.fold_in(key, p))
    last_slot = state.labels.shape[0] - 1
    i, s, n = order[p], start_arr[p], size_arr[p]
    a = state.labels[i]
    nact = state.num_active[s]
    a_empty = state.sizes[a] == 1  # i alone: a is the empty candidate
    col_a = state.active_pos[a] - s
    mp_i = state.member_pos[i]
    skip = mp_i - state.seg_start[s + col_a]  # i's offset in a's segment
    xi = row(model.mentions, i)
    mem_w = state.members[jnp.clip(s + jnp.arange(cfg.width, dtype=jnp.int32), 0, last_slot)]
    return Update(
        state,
        i,
        s,
        n,
        n - 1,
        a,
        col_a,
        nact,
        nact + (~a_empty).astype(jnp.int32),
        mp_i,
        skip,
        xi,
        mem_w,
        k_noise,
        k_race,
    )


def column_id(u: Update, c):
    """The cluster id of column ``c``."""
    return u.state.active[jnp.clip(u.s + c, 0, u.state.labels.shape[0] - 1)]


def block_window(u: Update):
    """``(mem_w, col_w, skip_i)``: the window, each slot's column (O(W)) and ``i``'s slot in the window."""
    col_w = u.state.active_pos[u.state.labels[u.mem_w]] - u.s
    return u.mem_w, col_w, u.mp_i - u.s


def block_member(k, window):
    """The ``k``-th other mention of the block (segment order) and its column (``window`` from :func:`block_window`)."""
    mem_w, col_w, skip_i = window
    r = jnp.clip(k + (k >= skip_i).astype(jnp.int32), 0, mem_w.shape[0] - 1)
    return mem_w[r], col_w[r]


def chunk_sums(factors_at, count, member_col, num_cols: int, chunk: int):
    """Σ β f(x_i, x_j) per column over ``count`` members, ``chunk`` at a time.

    ``member_col(k) -> (mentions, columns)``; ``factors_at(js) -> β f(x_i, x_j)``. Returns ``(sums
    [num_cols], bad)``, ``bad`` when a factor was NaN or +inf.
    """
    nchunks = (count + chunk - 1) // chunk

    def body(carry):
        c, sums, bad = carry
        k = c * chunk + jnp.arange(chunk, dtype=jnp.int32)
        valid = k < count
        js, cols = member_col(k)
        f = jnp.where(valid, factors_at(js), 0.0)
        bad = bad | jnp.any(valid & ~jnp.isfinite(f) & ~(f == -jnp.inf))
        sums = sums.at[jnp.where(valid, cols, num_cols)].add(f, mode="drop")
        return c + 1, sums, bad

    init_c = (jnp.zeros((), jnp.int32), jnp.zeros((num_cols,), jnp.float32), jnp.zeros((), bool))
    _, sums, bad = jax.lax.while_loop(lambda c: c[0] < nchunks, body, init_c)
    return sums, bad


def exact_update(cfg: ClassConfig, model: Model, u: Update, _=None):
    """The exact Gibbs update: all ``K`` factors summed per column, Gumbel-max over the columns.

    Returns ``(new cluster id, SweepInfo)``; a NaN / +inf factor keeps ``i`` in its cluster.
    """
    ar_w = jnp.arange(cfg.width, dtype=jnp.int32)
    sums, bad = chunk_sums(
        partial(factors, model, u.xi), u.K, partial(block_member, window=block_window(u)), cfg.width, cfg.chunk
    )
    logits = jnp.where(ar_w < u.ncols, sums, -jnp.inf) + jax.random.gumbel(u.k_noise, (cfg.width,))
    x = jnp.argmax(logits)
    bad = bad | ~jnp.isfinite(logits[x])
    new = jnp.where(bad, u.a, column_id(u, x))
    zero = jnp.zeros((), jnp.int32)
    return new, SweepInfo(u.K.astype(jnp.int32), zero, jnp.ones((), jnp.int32), bad.astype(jnp.int32), zero, zero)


def _check_decision(cfg, model, u, bad, x_col, num_cols, noise, _):
    sums, bad_x = chunk_sums(
        partial(factors, model, u.xi), u.K, partial(block_member, window=block_window(u)), num_cols, cfg.chunk
    )
    x_exact = jnp.argmax(jnp.where(jnp.arange(num_cols) < u.ncols, sums, -jnp.inf) + noise)
    ok = ~bad & ~bad_x
    return (ok & (x_exact != x_col)).astype(jnp.int32), ok.astype(jnp.int32)


def _no_check(_):
    return jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)


def checked_info(cfg: ClassConfig, model: Model, u: Update, check, bad, used, x_col, noise):
    """``SweepInfo`` of a raced update; with ``check`` (static or traced) the exact Gumbel-max decision
    under the same noise (all ``K`` members summed over ``noise.shape[0]`` columns) is compared with ``x_col``."""
    do_check = partial(_check_decision, cfg, model, u, bad, x_col, noise.shape[0], noise)
    if isinstance(check, bool):
        errors, checked = (do_check if check else _no_check)(None)
    else:
        errors, checked = jax.lax.cond(check, do_check, _no_check, None)
    return SweepInfo(
        used.astype(jnp.int32),
        jnp.ones((), jnp.int32),
        jnp.zeros((), jnp.int32),
        bad.astype(jnp.int32),
        errors,
        checked,
    )
