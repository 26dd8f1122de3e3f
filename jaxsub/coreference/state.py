"""The state of the coreference sweep: cluster membership with per-block indexes, and its packed form.

:class:`CorefState` holds the labels and the indexes that make one Gibbs update cost
O(candidates + data read); :func:`init` builds it from labels. The sweep works on the state
packed as one ``[M, 8]`` int32 array (columns in :class:`CorefState`'s field order, :func:`pack`):
one scatter per update and no copies (see :mod:`jaxsub.coreference.moves`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.coreference.model import Blocks

__all__ = [
    "CorefState",
    "SweepInfo",
    "add_info",
    "check_labels",
    "init",
    "pack",
    "unpack",
    "view",
    "zero_info",
]


class CorefState(NamedTuple):
    """Cluster membership, with the per-block indexes that make one update O(candidates + data read).

    Index spaces: *mention* (``i``), *cluster id* (block ``b`` owns the ids ``[s_b, s_b + n_b)``, its
    sorted positions, see :class:`~jaxsub.coreference.Blocks`) and *slot* (a block's
    ``[s_b, s_b + n_b)`` range of the per-block arrays below).

    Attributes
    ----------
    labels
        ``[M]`` int32 cluster id of every mention.
    sizes
        ``[M]`` int32 number of mentions in each cluster id (0 = empty).
    members
        ``[M]`` int32 by slot: the block's mentions grouped by cluster, one contiguous segment per
        non-empty cluster, segments in the order of ``active``.
    member_pos
        ``[M]`` int32 by mention: its slot in ``members``.
    active
        ``[M]`` int32 by slot: a permutation of the block's cluster ids, the ``num_active`` non-empty
        ones first; ``active[s_b + num_active]`` is the block's next empty id (the "new cluster").
    active_pos
        ``[M]`` int32 by cluster id: its slot in ``active`` (the inverse permutation).
    seg_start
        ``[M]`` int32 by slot of ``active``: the slot in ``members`` where that cluster's segment starts
        (meaningful for the non-empty clusters).
    num_active
        ``[M]`` int32: number of non-empty clusters of the block, stored at the block's first slot.

    A move of one mention costs O(number of non-empty clusters between its old and new cluster's
    slots) (segments shift by one member each, swap-remove style); see :func:`init` for the layout.
    """

    labels: jnp.ndarray
    sizes: jnp.ndarray
    members: jnp.ndarray
    member_pos: jnp.ndarray
    active: jnp.ndarray
    active_pos: jnp.ndarray
    seg_start: jnp.ndarray
    num_active: jnp.ndarray


class SweepInfo(NamedTuple):
    """Counts over one sweep (all int32 scalars).

    Attributes
    ----------
    num_evaluations
        Factor evaluations ``f(x_i, x_j)`` computed for the decisions (exact: ``K`` per
        mention; racing: the drawn indices plus the control variate's D - 1).
    num_races
        Updates decided by racing.
    num_exact
        Updates computed exactly (exact sweep, small blocks, more than ``max_candidates``).
    num_nan
        Updates that met a NaN / +inf factor: the mention kept its cluster (not a valid draw).
    num_errors
        Races whose decision differs from the exact Gumbel-max decision under the same noise
        (only counted with ``check_decisions=True``; otherwise 0).
    num_checked
        Races checked against the exact decision.
    """

    num_evaluations: jnp.ndarray
    num_races: jnp.ndarray
    num_exact: jnp.ndarray
    num_nan: jnp.ndarray
    num_errors: jnp.ndarray
    num_checked: jnp.ndarray


def zero_info() -> SweepInfo:
    """A :class:`SweepInfo` of zeros (int32 scalars)."""
    z = jnp.zeros((), jnp.int32)
    return SweepInfo(z, z, z, z, z, z)


def add_info(a: SweepInfo, b: SweepInfo) -> SweepInfo:
    """Field-wise sum of two :class:`SweepInfo`."""
    return SweepInfo(*(x + y for x, y in zip(a, b)))


# columns of the packed state (CorefState's field order)
LABELS, SIZES, MEMBERS, MEMBER_POS, ACTIVE, ACTIVE_POS, SEG_START, NUM_ACTIVE = range(8)


def pack(state: CorefState):
    """The state as one ``[M, 8]`` int32 array (columns in :class:`CorefState`'s field order)."""
    return jnp.stack([jnp.asarray(a, jnp.int32) for a in state], axis=1)


def unpack(packed) -> CorefState:
    """Inverse of :func:`pack`."""
    return CorefState(*(packed[:, c] for c in range(8)))


class Column:
    """Read-only view of one column of the packed state (``col[idx]`` gathers ``packed[idx, c]``)."""

    def __init__(self, packed, c):
        self._packed, self._c = packed, c
        self.shape = packed.shape[:1]

    def __getitem__(self, idx):
        return self._packed[idx, self._c]


def view(packed) -> CorefState:
    """A :class:`CorefState` of :class:`Column` views of the packed state (reads gather from ``packed``)."""
    return CorefState(*(Column(packed, c) for c in range(8)))


def check_labels(position, blocks: Blocks):
    """``position`` as ``[M]`` int32 cluster ids, each inside its mention's block range.

    Parameters
    ----------
    position
        ``[M]`` integer labels (a traced array is checked for shape and dtype only).
    blocks
        :class:`~jaxsub.coreference.Blocks`.

    Returns
    -------
    jax.Array
        The labels as int32.

    Raises
    ------
    ValueError
        ``blocks`` is not a :class:`~jaxsub.coreference.Blocks`; ``position`` has the wrong shape, is not of an
        integer dtype (floats, NaN included, are refused), or holds a label outside its mention's block range
        ``[start, start + size)``.
    """
    if not isinstance(blocks, Blocks):
        raise ValueError(f"blocks must be a Blocks (from make_blocks); got {type(blocks).__name__}")
    m = blocks.num_mentions
    labels = position if isinstance(position, jax.core.Tracer) else np.asarray(position)
    if labels.shape != (m,) or not jnp.issubdtype(labels.dtype, jnp.integer):
        raise ValueError(f"position must be an integer array of shape ({m},); got {labels.shape} {labels.dtype}")
    if not isinstance(labels, jax.core.Tracer):
        lo = blocks.start[blocks.position]
        bad = (labels < lo) | (labels >= lo + blocks.size[blocks.position])
        if np.any(bad):
            first = int(np.flatnonzero(bad)[0])
            raise ValueError(
                "position: every label must be a cluster id of its mention's block (a sorted position "
                f"in [start, start + size) of that block); mention {first} has label {int(labels[first])}, "
                f"its block's range is [{int(lo[first])}, {int(lo[first] + blocks.size[blocks.position][first])})"
            )
    return jnp.asarray(labels).astype(jnp.int32)


def init(position, blocks: Blocks) -> CorefState:
    """State from cluster labels (``None``: every mention alone, as in the paper).

    Traceable (``jax.vmap(lambda p: init(p, blocks))`` works); the indexes of :class:`CorefState` are
    built by two sorts: ``active`` lists each block's non-empty ids (increasing) then its empty ids
    (increasing), ``members`` groups the mentions by the ``active`` slot of their cluster (then by sorted
    position), and ``seg_start`` is the exclusive cumulative sum of the sizes in ``active`` order (it
    equals ``s_b`` at a block's first slot since every block's mentions sit in its own clusters).

    Parameters
    ----------
    position
        ``None`` or ``[M]`` integer cluster ids, each inside its mention's block range (e.g.
        ``state.labels`` of an earlier run).
    blocks
        :class:`~jaxsub.coreference.Blocks`.

    Returns
    -------
    CorefState

    Raises
    ------
    ValueError
        As :func:`check_labels`.
    """
    if not isinstance(blocks, Blocks):
        raise ValueError(f"blocks must be a Blocks (from make_blocks); got {type(blocks).__name__}")
    m = blocks.num_mentions
    labels = jnp.asarray(blocks.position, jnp.int32) if position is None else check_labels(position, blocks)
    ids = jnp.arange(m, dtype=jnp.int32)
    start = jnp.asarray(blocks.start, jnp.int32)
    sizes = jnp.zeros((m,), jnp.int32).at[labels].add(1)
    empty = (sizes == 0).astype(jnp.int32)
    active = jnp.lexsort((ids, empty, start)).astype(jnp.int32)
    active_pos = jnp.zeros((m,), jnp.int32).at[active].set(ids)
    members = jnp.lexsort((jnp.asarray(blocks.position, jnp.int32), active_pos[labels])).astype(jnp.int32)
    member_pos = jnp.zeros((m,), jnp.int32).at[members].set(ids)
    size_act = sizes[active]
    seg_start = (jnp.cumsum(size_act) - size_act).astype(jnp.int32)
    num_active = jnp.zeros((m,), jnp.int32).at[start].add(1 - empty)
    return CorefState(labels, sizes, members, member_pos, active, active_pos, seg_start, num_active)
