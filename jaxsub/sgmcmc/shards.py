"""Data shards of unequal sizes: a padded, masked layout that ``jit``/``vmap``/``shard_map`` can carry.

Shard ``s`` holds ``N_s`` data points. All shards are stored in one pytree of
arrays with leading axes ``[S, N_max, ...]`` (``N_max = max_s N_s``); rows
``N_s..N_max-1`` of shard ``s`` are padding (copies of the shard's first row,
so that any function evaluated on them stays finite) and are never drawn into
a minibatch: minibatch indices are drawn in ``[0, N_s)`` (see
:func:`minibatch_indices`). ``mask[s, i] = i < N_s`` marks the real rows for
full-shard computations (e.g. an exact full-data gradient in a test).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.subsample import _domain_dynamic, _permute, permutation_round_keys
from jaxsub.types import Array, ArrayTree, PRNGKey
from jaxsub.validation import check_int

__all__ = ["Shards", "check_finite_shards", "make_shards", "minibatch_indices", "shard_gather"]


class Shards(NamedTuple):
    """Padded shards.

    Attributes
    ----------
    data
        Pytree of arrays shaped ``[S, N_max, ...]`` (NumPy or JAX, possibly a
        global array sharded over devices/hosts along axis 0).
    sizes
        ``int64`` NumPy array ``[S]`` of true shard sizes ``N_s`` (concrete:
        sizes are static metadata every worker knows).
    """

    data: ArrayTree
    sizes: np.ndarray

    @property
    def num_shards(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def mask(self) -> np.ndarray:
        """``[S, N_max]`` boolean mask of the real (non-padding) rows."""
        n_max = jax.tree.leaves(self.data)[0].shape[1]
        return np.arange(n_max)[None, :] < self.sizes[:, None]


def _as_shards_list(shards: Sequence[Any]) -> Shards:
    shards = list(shards)
    if not shards:
        raise ValueError("shards must contain at least one shard; got an empty sequence")
    structure = jax.tree.structure(shards[0])
    sizes, leaves_per_shard = [], []
    for s, shard in enumerate(shards):
        if jax.tree.structure(shard) != structure:
            raise ValueError(
                f"shards[{s}] has pytree structure {jax.tree.structure(shard)}, "
                f"but shards[0] has {structure}: every shard must hold the same kind of data"
            )
        leaves = [np.asarray(x) for x in jax.tree.leaves(shard)]
        if not leaves or any(x.ndim == 0 for x in leaves):
            raise ValueError(f"shards[{s}] must be a pytree of arrays with a leading data axis")
        n = leaves[0].shape[0]
        for i, (x, x0) in enumerate(zip(leaves, jax.tree.leaves(shards[0]))):
            if x.shape[0] != n:
                raise ValueError(
                    f"shards[{s}] has leaves with different numbers of rows ({n} and {x.shape[0]}); "
                    "every leaf of a shard must have the same leading size"
                )
            if x.shape[1:] != np.shape(x0)[1:]:
                raise ValueError(
                    f"shards[{s}] leaf {i} has per-datum shape {x.shape[1:]}, but shards[0] has "
                    f"{np.shape(x0)[1:]}: data points must have the same shape in every shard"
                )
        if n < 1:
            raise ValueError(f"shards[{s}] is empty; every shard needs at least one data point")
        sizes.append(n)
        leaves_per_shard.append(leaves)
    n_max = max(sizes)
    stacked = []
    for i in range(len(leaves_per_shard[0])):
        padded = []
        for leaves, n in zip(leaves_per_shard, sizes):
            x = leaves[i]
            if n < n_max:  # pad with copies of the first row: finite wherever the real data is
                x = np.concatenate([x, np.repeat(x[:1], n_max - n, axis=0)], axis=0)
            padded.append(x)
        stacked.append(np.stack(padded))
    return Shards(jax.tree.unflatten(structure, stacked), np.asarray(sizes, dtype=np.int64))


def make_shards(shards: Any, sizes: Sequence[int] | None = None) -> Shards:
    """Build the padded layout.

    Parameters
    ----------
    shards
        One of: a :class:`Shards` (returned as is, after checks); a list/tuple of
        per-shard pytrees (each leaf ``[N_s, ...]``, sizes may differ); or one
        pytree of arrays with leading axes ``[S, N_max, ...]`` (already padded),
        in which case ``sizes`` gives the true sizes (default: all ``N_max``).
    sizes
        True shard sizes for the pre-stacked form.

    Returns
    -------
    Shards

    Raises
    ------
    ValueError
        For mismatched shapes or structures across shards or leaves, empty
        shards, or sizes outside ``[1, N_max]``.
    """
    if isinstance(shards, Shards):
        data, sizes = shards.data, shards.sizes
    elif isinstance(shards, (list, tuple)) and not hasattr(shards, "_fields"):
        if sizes is not None:
            raise ValueError("sizes is only used with pre-stacked shards; a list of shards carries its own sizes")
        return _as_shards_list(shards)
    else:
        data = shards
    leaves = jax.tree.leaves(data)
    if not leaves or any(np.ndim(x) < 2 for x in leaves):
        raise ValueError(
            "stacked shards must be a pytree of arrays shaped [num_shards, shard_size, ...]; "
            f"got leaf shapes {[np.shape(x) for x in leaves]}"
        )
    num_shards, n_max = np.shape(leaves[0])[:2]
    for x in leaves:
        if np.shape(x)[:2] != (num_shards, n_max):
            raise ValueError(
                f"every leaf of the stacked shards must start with [num_shards, shard_size] = "
                f"{[num_shards, n_max]}; got a leaf of shape {np.shape(x)}"
            )
    if sizes is None:
        sizes = np.full(num_shards, n_max, dtype=np.int64)
    sizes = np.asarray(sizes)
    if sizes.shape != (num_shards,) or not np.issubdtype(sizes.dtype, np.integer):
        raise ValueError(f"sizes must be {num_shards} integers (one per shard); got {sizes!r}")
    if np.any(sizes < 1) or np.any(sizes > n_max):
        raise ValueError(f"sizes must lie in [1, {n_max}] (the padded shard length); got {sizes.tolist()}")
    return Shards(data, sizes.astype(np.int64))


def minibatch_indices(rng_key: PRNGKey, batch_size: int, num_items: Array) -> Array:
    """``batch_size`` distinct indices drawn without replacement from ``[0, num_items)``, in O(batch_size).

    Same construction as :func:`jaxsub.subsample.permutation_indices` (the
    mixed-radix Feistel bijection with cycle walking, ``jaxsub.subsample._permute``;
    positions ``0..batch_size-1`` of the permutation) except that ``num_items`` may be
    a *traced* integer: the shard is chosen at run time, so its size is not static.
    The radices are then ``a ~ sqrt(N_s)``, ``b = ceil(N_s / a)`` computed at run
    time (``jaxsub.subsample._domain_dynamic``), so the domain ``a b < N_s + a``
    exceeds ``N_s`` by a fraction below ``1/b`` and cycle walking stays O(1)
    expected per index.

    Parameters
    ----------
    rng_key
        PRNG key.
    batch_size
        Static number of indices; must not exceed ``num_items`` (checked when
        the sampler is built).
    num_items
        Population size ``N_s`` (scalar integer array, ``1 <= N_s < 2^32``).

    Returns
    -------
    Array
        ``int32 [batch_size]`` distinct indices in ``[0, num_items)``.
    """
    round_keys = permutation_round_keys(rng_key)
    positions = jnp.arange(batch_size, dtype=jnp.uint32)
    return _permute(round_keys, positions, _domain_dynamic(num_items)).astype(jnp.int32)


def shard_gather(data: ArrayTree, shard: Array, indices: Array) -> ArrayTree:
    """Rows ``indices`` of shard ``shard``: O(len(indices)) gather, never a copy of the whole shard.

    The ``[S, N_max, ...]`` leaves are viewed as ``[S·N_max, ...]`` (a free reshape) and gathered at
    ``shard·N_max + indices``: a one-axis gather, which XLA:CPU runs markedly faster than the
    two-axis gather ``x[shard, indices]`` (about 1.3x per SGLD step at d = 50 in benchmarks/cgdsgld.py).

    Parameters
    ----------
    data
        The padded ``[S, N_max, ...]`` pytree (``Shards.data``).
    shard
        ``int32`` scalar, the shard.
    indices
        ``int32 [m]`` rows of that shard.

    Returns
    -------
    The rows, leaves ``[m, ...]``.
    """

    def gather(x):
        x = jnp.asarray(x)
        n_max = x.shape[1]
        flat = x.reshape((x.shape[0] * n_max,) + x.shape[2:])
        return flat[jnp.asarray(shard, jnp.int32) * n_max + indices]

    return jax.tree.map(gather, data)


def check_batch_size(batch_size: Any, sizes: np.ndarray) -> int:
    """``batch_size`` must be an integer in ``[1, min_s N_s]`` (minibatches are drawn without replacement)."""
    return check_int("batch_size", batch_size, low=1, high=int(np.min(sizes)))


def check_finite_shards(shards: Shards) -> None:
    """``ValueError`` if a concrete floating-point leaf of the shards holds NaN/inf in a real (non-padding) row.

    Leaves that are not fully addressable from this process (a global array spanning
    other hosts, see ``examples/multihost_dsgld.py``) cannot be read here and are
    skipped: each host should check its own rows.

    Parameters
    ----------
    shards
        A :class:`Shards`.

    Raises
    ------
    ValueError
        Naming the leaf and the number of non-finite values.
    """
    mask = shards.mask
    for i, leaf in enumerate(jax.tree.leaves(shards.data)):
        if isinstance(leaf, jax.core.Tracer):
            continue
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            continue
        arr = np.asarray(leaf)
        if not np.issubdtype(arr.dtype, np.inexact):
            continue
        finite = np.isfinite(arr).reshape(arr.shape[:2] + (-1,)).all(axis=-1)
        bad = mask & ~finite
        if bad.any():
            s = int(np.argmax(bad.any(axis=1)))
            raise ValueError(
                f"shards must be finite: data leaf {i} has {int(bad.sum())} row(s) with NaN/inf "
                f"(first in shard {s}); remove or impute them before sampling"
            )
