"""Atomic checkpoints of pytrees, for long runs that must survive being killed.

A checkpoint is one ``.npz`` file per saved step, ``ckpt-<step>.npz`` in a directory of
its own. :func:`save` writes it to a temporary file in the same directory, flushes and
``fsync``\\ s it, then renames it over the final name with :func:`os.replace` (atomic on
POSIX and Windows), so a process killed mid-write leaves the previous checkpoint intact and
at worst a stray temporary file, which :func:`latest_step` and :func:`restore` ignore.

Leaves are stored bit for bit (NumPy arrays of the leaf's dtype); typed PRNG keys are stored
as their key data and re-wrapped with the same implementation, so a run resumed from a
checkpoint continues with exactly the keys, states and traces it had.

The format is a plain pytree writer rather than a checkpoint library: drivers checkpoint small
host-side pytrees (chain states, traces, a step counter) synchronously between compiled
chunks, on one host, and need exact round trips and an atomic rename; Orbax's
``CheckpointManager`` does this too but brings thirteen more packages (TensorStore, protobuf,
an async event loop) and asynchronous writes that a resumable driver would have to wait on.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = ["save", "latest_step", "restore"]

_NAME = re.compile(r"^ckpt-(\d{12})\.npz$")


def _path(directory: Path, step: int) -> Path:
    return directory / f"ckpt-{step:012d}.npz"


def _steps(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := _NAME.match(p.name)))


def _is_key(leaf) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _check_meta(meta) -> dict:
    meta = {} if meta is None else dict(meta)
    for name, value in meta.items():
        if not isinstance(name, str) or not isinstance(value, (str, int, float, bool)):
            raise ValueError(f"meta must map str to str/int/float/bool; got {name!r}: {value!r}")
    return meta


def save(directory, step: int, tree, *, meta: Mapping[str, Any] | None = None, keep: int = 2) -> Path:
    """Write ``tree`` as the checkpoint of ``step`` in ``directory``, atomically.

    Parameters
    ----------
    directory
        Folder of this run's checkpoints; created if missing.
    step
        Non-negative progress counter (steps, sweeps, rounds) the checkpoint holds.
    tree
        Pytree of arrays, NumPy/Python scalars and typed PRNG keys.
    meta
        Description of the run (``str`` to ``str``/``int``/``float``/``bool``) stored with the
        checkpoint; :func:`restore` refuses a checkpoint whose ``meta`` differs from its own.
    keep
        How many of the newest checkpoints to keep (at least 1); older ones are deleted after
        the new one is in place.

    Returns
    -------
    Path
        The checkpoint file written.

    Raises
    ------
    ValueError
        If ``step`` is negative, ``keep`` < 1 or ``meta`` is not a flat mapping of scalars.
    """
    if int(step) < 0:
        raise ValueError(f"step must be >= 0; got {step}")
    if int(keep) < 1:
        raise ValueError(f"keep must be >= 1; got {keep}")
    meta = _check_meta(meta)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    leaves = jax.tree.leaves(tree)
    arrays, impls = {}, []
    for i, leaf in enumerate(leaves):
        if _is_key(leaf):
            impls.append(str(jax.random.key_impl(leaf)))
            leaf = jax.random.key_data(leaf)
        else:
            impls.append("")
        arrays[f"leaf_{i}"] = np.asarray(leaf)
    header = {"meta": meta, "impls": impls, "num_leaves": len(leaves), "step": int(step)}
    arrays["__header__"] = np.array(json.dumps(header))
    final = _path(directory, int(step))
    tmp = directory / f".{final.name}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(directory)
    for old in _steps(directory)[: -int(keep)]:
        _path(directory, old).unlink(missing_ok=True)
    return final


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows: directories cannot be opened
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def latest_step(directory) -> int | None:
    """Return the newest complete checkpoint's step in ``directory``, or ``None``.

    Parameters
    ----------
    directory
        Folder of this run's checkpoints (it need not exist).

    Returns
    -------
    int or None
        The largest saved step; ``None`` when the folder has no complete checkpoint.
    """
    steps = _steps(Path(directory))
    return steps[-1] if steps else None


def _restore_leaf(stored: np.ndarray, like, impl: str, index: int):
    if impl:
        return jax.random.wrap_key_data(stored, impl=impl)
    like_arr = np.asarray(like)
    if stored.shape != like_arr.shape or stored.dtype != like_arr.dtype:
        raise ValueError(
            f"checkpoint leaf {index} has shape {stored.shape} and dtype {stored.dtype}; "
            f"like expects {like_arr.shape} and {like_arr.dtype}"
        )
    if isinstance(like, jax.Array):
        return jax.numpy.asarray(stored)
    if isinstance(like, np.ndarray):
        return stored
    return type(like)(stored.item()) if isinstance(like, (bool, int, float)) else stored


def restore(directory, like, *, step: int | None = None, meta: Mapping[str, Any] | None = None):
    """Read a checkpoint of ``directory`` into the structure of ``like``.

    Parameters
    ----------
    directory
        Folder of this run's checkpoints.
    like
        Pytree with the structure, shapes and dtypes of the saved tree (e.g. the initial
        state of the run being resumed); JAX-array leaves come back as JAX arrays.
    step
        Which checkpoint to read; default the newest.
    meta
        The resuming run's description; must equal the stored one.

    Returns
    -------
    tuple
        ``(step, tree)``.

    Raises
    ------
    FileNotFoundError
        If ``directory`` holds no checkpoint (of ``step``, when given).
    ValueError
        If the stored ``meta``, number of leaves, shapes or dtypes differ from ``meta`` and
        ``like``.
    """
    directory = Path(directory)
    step = latest_step(directory) if step is None else int(step)
    if step is None or not _path(directory, step).exists():
        raise FileNotFoundError(f"no checkpoint{'' if step is None else f' of step {step}'} in {directory}")
    with np.load(_path(directory, step), allow_pickle=False) as stored:
        header = json.loads(str(stored["__header__"]))
        arrays = [stored[f"leaf_{i}"] for i in range(header["num_leaves"])]
    expected = _check_meta(meta)
    if meta is not None and header["meta"] != expected:
        diff = sorted(k for k in set(expected) | set(header["meta"]) if expected.get(k) != header["meta"].get(k))
        raise ValueError(f"checkpoint in {directory} was written by a different run (meta differs in {diff})")
    like_leaves, treedef = jax.tree.flatten(like)
    if len(like_leaves) != len(arrays):
        raise ValueError(f"checkpoint has {len(arrays)} leaves; like has {len(like_leaves)}")
    leaves = [
        _restore_leaf(a, lk, impl, i) for i, (a, lk, impl) in enumerate(zip(arrays, like_leaves, header["impls"]))
    ]
    return step, jax.tree.unflatten(treedef, leaves)
