"""Checkpoint and resume for the host-side drivers (:func:`jaxsub.anneal.fit`, :func:`jaxsub.anneal.crosscat.fit`).

A driver saves, after every ``checkpoint_every`` compiled spans, its batched chain states, the trace so far and
its wall-clock counters with :mod:`jaxsub.checkpoint` (atomic writes). The cluster capacity grows during a run,
so the saved arrays' shapes vary: each checkpoint is two files, the *layout* ``[capacity, trace entries]`` in
``<dir>/layout`` and the tree in ``<dir>/state``, both under the same step (the number of spans run). The tree
is written first; a run killed between the two writes resumes from the previous layout's step, whose tree the
state folder still keeps (``keep=2``).

Every checkpoint carries a fingerprint of the run (key, data, model, schedule, test data and the options that
change draws): resuming from a folder written by a different run raises ``ValueError``. Sweeps are pure
functions of the states, the chain keys and the schedule, so a resumed run makes the same draws and traces as
an uninterrupted one (the wall-clock fields aside).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from jaxsub import checkpoint

__all__ = ["fingerprint", "restore", "save", "stack_rows", "unstack_rows"]


def _feed(h, part) -> None:
    if isinstance(part, (tuple, list)):
        h.update(f"seq{len(part)}".encode())
        for p in part:
            _feed(h, p)
        return
    if part is None or isinstance(part, (str, int, float, bool)) or not hasattr(part, "dtype"):
        h.update(repr(part).encode())
        return
    if jax.dtypes.issubdtype(part.dtype, jax.dtypes.prng_key):
        part = jax.random.key_data(part)
    a = np.asarray(part)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())


def fingerprint(*parts) -> str:
    """A SHA-256 digest of ``parts`` (arrays by dtype, shape and bytes; PRNG keys by their data; else ``repr``).

    Parameters
    ----------
    *parts
        Arrays, typed PRNG keys, NamedTuples (hashed through their leaves), nested tuples/lists of
        these, or any other value (hashed through its ``repr``).

    Returns
    -------
    str
        The hexadecimal digest; equal parts give equal digests across processes.
    """
    h = hashlib.sha256()
    for part in parts:
        _feed(h, jax.tree.leaves(part) if hasattr(part, "_fields") else part)
    return h.hexdigest()


def save(directory, step: int, tree, *, capacity: int, num_entries: int, meta: dict) -> None:
    """Write checkpoint ``step`` (the tree, then its layout ``[capacity, num_entries]``) atomically.

    Parameters
    ----------
    directory : str or Path
        The run's checkpoint folder (``state/`` and ``layout/`` are written under it).
    step : int
        The number of spans run.
    tree
        The pytree to save (batched chain states, trace, counters).
    capacity : int
        The chains' current cluster capacity.
    num_entries : int
        The number of trace entries so far.
    meta : dict
        The run's description (its :func:`fingerprint` among others), checked on restore.
    """
    directory = Path(directory)
    checkpoint.save(directory / "state", step, tree, meta=meta)
    checkpoint.save(directory / "layout", step, np.asarray([capacity, num_entries], np.int64), meta=meta)


def restore(directory, like_of: Callable[[int, int], object], *, meta: dict):
    """The newest checkpoint of ``directory``: ``(step, tree)`` with ``like_of(capacity, num_entries)`` giving the
    tree's structure, shapes and dtypes; ``None`` when the folder holds none.

    Parameters
    ----------
    directory : str, Path or None
        The run's checkpoint folder (``None``: no checkpointing, returns ``None``).
    like_of : callable
        ``like_of(capacity, num_entries)`` returns a pytree with the saved tree's structure, shapes and dtypes.
    meta : dict
        The run's description; it must equal the saved one.

    Returns
    -------
    tuple or None
        ``(step, tree)`` of the newest complete checkpoint, or ``None`` when there is none.

    Raises
    ------
    ValueError
        The checkpoint was written by a different run (``meta`` differs) or does not match ``like_of``.
    """
    if directory is None:
        return None
    directory = Path(directory)
    step = checkpoint.latest_step(directory / "layout")
    if step is None:
        return None
    _, layout = checkpoint.restore(directory / "layout", np.zeros(2, np.int64), step=step, meta=meta)
    capacity, num_entries = (int(v) for v in layout)
    return checkpoint.restore(directory / "state", like_of(capacity, num_entries), step=step, meta=meta)


def stack_rows(rows: list) -> tuple:
    """Trace entries (tuples of equal-shape fields) as one array per field, stacked along a leading axis.

    Parameters
    ----------
    rows : list of tuple
        A non-empty list of entries, each a tuple (or NamedTuple) of array-likes with the same shapes.

    Returns
    -------
    tuple of np.ndarray
        One ``[len(rows), ...]`` array per field.
    """
    return tuple(np.stack([np.asarray(r[i]) for r in rows]) for i in range(len(rows[0])))


def _fields(*fields) -> tuple:
    return fields


def unstack_rows(columns, make=_fields) -> list:
    """:func:`stack_rows`' inverse: ``make(*fields)`` of every entry (default: a tuple of the fields).

    Parameters
    ----------
    columns : sequence of array_like
        One array per field, all with the same leading length.
    make : callable, optional
        Builds an entry from its fields (e.g. a NamedTuple class); default: a plain tuple.

    Returns
    -------
    list
        ``[make(*fields_j) for each j]``, NumPy values.
    """
    return [make(*(np.asarray(c)[j] for c in columns)) for j in range(np.asarray(columns[0]).shape[0])]
