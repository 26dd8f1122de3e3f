r"""The rewards of a race over candidate clusters: one builder for the sequential, hybrid and batched races.

A race's columns are candidate clusters of mention ``i``'s block; column ``c`` holds the members of
one segment of the block's ``members`` window (``mem_w``), ``i`` itself skipped. :class:`RaceArms`
describes them (per update, or per lane with a leading axis for
:func:`jaxsub.discrete.racing_batch`), and every race reads its rewards through the functions here:

* padded population (one shared index set, :func:`padded_rewards`): population index
  ``n ∈ [0, N)`` maps to the ``(n mod K_L)``-th member of the raced columns (``K_L`` members in all)
  with reward ``β f(x_i, x_j) / c_k``, ``c_k = #{n < N : n mod K_L = k}``, in its own column and 0 in
  the others, so every per-arm sum over the population is exact;
* its control variate (:func:`control_variate_rewards`): ``h_y / c_k`` in the same column, with ``h_y``
  from :func:`first_member_control_variate` (sequential and batched races) or the hybrid's mean over a
  few members;
* ragged populations (:func:`ragged_rewards`): index ``n`` of column ``c`` is the ``n``-th member of
  that column's cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "Model",
    "RaceArms",
    "control_variate_mean",
    "control_variate_rewards",
    "factors",
    "first_member_control_variate",
    "member_at",
    "padded_rewards",
    "population_member",
    "ragged_rewards",
    "row",
]


class Model(NamedTuple):
    """The model a sweep reads: the pairwise factor, the mentions and the inverse temperature.

    Attributes
    ----------
    pairwise_log_factor
        ``f(x_i, x_j) -> scalar`` on single rows of ``mentions``.
    mentions
        Pytree of arrays with leading axis M.
    beta
        Inverse temperature β (float32 scalar, traceable).
    """

    pairwise_log_factor: Callable
    mentions: object
    beta: jax.Array


def row(tree, i):
    """Row ``i`` of every leaf of ``tree``."""
    return jax.tree.map(lambda a: a[i], tree)


def factors(model: Model, xi, js):
    """``β f(x_i, x_j)`` for the mentions ``js`` (``xi`` one row of the mentions)."""
    xj = row(model.mentions, js)
    return model.beta * jax.vmap(model.pairwise_log_factor, in_axes=(None, 0))(xi, xj)


class RaceArms(NamedTuple):
    """The columns of one race (``R`` columns; a leading lane axis in batched rounds).

    Attributes
    ----------
    xi
        Row of the updated mention ``i`` (pytree).
    mem_w
        ``[W]`` the block's ``members`` window (mention ids by slot, relative to the block's first slot).
    seg
        ``[R]`` segment start of each column's cluster in ``mem_w``.
    col
        ``[R]`` the block column of each race column (to skip ``i`` in its own cluster's segment).
    col_a
        The block column of ``i``'s cluster.
    skip
        ``i``'s offset in its cluster's segment.
    cum, count
        ``[R]`` members per column counted for this population, and their cumulative sum.
    num_pop
        ``K_L >= 1``, the members of the population (padded race).
    h, h_mean
        ``[R]`` control variate per column and its per-draw mean (zeros without one).
    """

    xi: object
    mem_w: jax.Array
    seg: jax.Array
    col: jax.Array
    col_a: jax.Array
    skip: jax.Array
    cum: jax.Array
    count: jax.Array
    num_pop: jax.Array
    h: jax.Array
    h_mean: jax.Array


def member_at(arms: RaceArms, k):
    """The ``k``-th members (``[m]``) among the counted members of the columns, and their columns."""
    width = arms.cum.shape[-1]
    c = jnp.minimum(jnp.sum(arms.cum[None, :] <= k[:, None], axis=1, dtype=jnp.int32), width - 1)
    off = k - (arms.cum[c] - arms.count[c])
    off = off + ((arms.col[c] == arms.col_a) & (off >= arms.skip)).astype(jnp.int32)
    return arms.mem_w[jnp.clip(arms.seg[c] + off, 0, arms.mem_w.shape[-1] - 1)], c


def population_member(arms: RaceArms, idx, num_data: int):
    """Population indices ``idx`` -> (members, columns, multiplicities ``c_k``) of the padded population."""
    k = idx.astype(jnp.int32) % arms.num_pop
    c_k = (num_data // arms.num_pop + (k < num_data % arms.num_pop).astype(jnp.int32)).astype(jnp.float32)
    js, cols = member_at(arms, k)
    return js, cols, c_k


def _in_columns(values, cols, width: int):
    """``[m, width]``: ``values[n]`` in column ``cols[n]``, 0 elsewhere."""
    return jnp.where(cols[:, None] == jnp.arange(width, dtype=jnp.int32)[None, :], values[:, None], 0.0)


def padded_rewards(idx, arms: RaceArms, *, model: Model, num_data: int):
    """The padded race's ``log_factor_fn``: ``[m, R]`` rewards of the population indices ``idx``."""
    js, cols, c_k = population_member(arms, idx, num_data)
    return _in_columns(factors(model, arms.xi, js) / c_k, cols, arms.cum.shape[-1])


def control_variate_rewards(idx, arms: RaceArms, *, num_data: int):
    """The padded race's control variate ``h_fn``: ``[m, R]`` with ``h_y / c_k`` in the member's column."""
    _, cols, c_k = population_member(arms, idx, num_data)
    return _in_columns(arms.h[cols] / c_k, cols, arms.cum.shape[-1])


def control_variate_mean(arms: RaceArms):
    """The per-draw mean of the control variate (``racing_batch``'s ``h_mean(params)``)."""
    return arms.h_mean


def ragged_rewards(idx, arms: RaceArms, *, model: Model):
    """The ragged race's ``log_factor_fn``: ``idx [m, R]``, the ``idx``-th member of each column's cluster."""
    off = idx.astype(jnp.int32)
    off = off + ((arms.col[None, :] == arms.col_a) & (off >= arms.skip)).astype(jnp.int32)
    js = arms.mem_w[jnp.clip(arms.seg[None, :] + off, 0, arms.mem_w.shape[-1] - 1)]
    return factors(model, arms.xi, js.reshape(-1)).reshape(js.shape)


def first_member_control_variate(model: Model, arms: RaceArms, large, ncols, *, max_large: int):
    """``(h [R], evaluations)``: ``h_y = β f(x_i, r_y)``, ``r_y`` the first member of ``C_y`` other than ``i``.

    Evaluated for the ``large`` columns below ``ncols`` only, compacted to the static bound ``max_large`` on
    them (one factor evaluation each, counted); 0 elsewhere and where the factor is not finite.
    """
    width = arms.cum.shape[-1]
    ar = jnp.arange(width, dtype=jnp.int32)
    nl = min(max_large, width)
    has_rep = large & (ar < ncols)
    lc = jnp.zeros((nl,), jnp.int32).at[jnp.where(has_rep, jnp.cumsum(has_rep) - 1, nl)].set(ar, mode="drop")
    num_cv = jnp.sum(has_rep, dtype=jnp.int32)
    first = arms.seg[lc] + ((lc == arms.col_a) & (arms.skip == 0)).astype(jnp.int32)
    h_l = factors(model, arms.xi, arms.mem_w[jnp.clip(first, 0, arms.mem_w.shape[-1] - 1)])
    h_l = jnp.where((jnp.arange(nl) < num_cv) & jnp.isfinite(h_l), h_l, 0.0)
    h = jnp.zeros((width,), jnp.float32).at[jnp.where(jnp.arange(nl) < num_cv, lc, width)].set(h_l, mode="drop")
    return h, num_cv
