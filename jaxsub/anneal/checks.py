"""Construction-time checks of the kernels' ``init`` inputs (labels, shapes, data), as strict as the drivers'.

Shapes are static and always checked. Values are checked when they are concrete (a NumPy array or a concrete JAX
array) and let through when traced (``jax.jit(algo.init)``), as :func:`jaxsub.validation.check_hyperparameter`
does: a traced label out of range cannot raise, so validate before tracing.
"""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["check_data_finite", "check_labels", "is_concrete"]


def is_concrete(x) -> bool:
    """Whether no leaf of ``x`` is a JAX tracer (its values can be read on the host).

    Parameters
    ----------
    x
        Any pytree (an array, a NamedTuple of arrays, ...).

    Returns
    -------
    bool
        ``True`` when every leaf is concrete (NumPy, Python or a concrete JAX array).
    """
    return not any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(x))


def check_labels(name: str, labels, shape: tuple, low: int, high: int) -> None:
    """Check that ``labels`` has ``shape`` and (when concrete) integer values in ``[low, high)``.

    Parameters
    ----------
    name : str
        The argument's name, used in the error message.
    labels : array_like
        The labels (NumPy or JAX; a traced array only has its shape checked).
    shape : tuple of int
        The required shape.
    low, high : int
        The allowed range ``[low, high)`` of the label values.

    Raises
    ------
    ValueError
        Naming ``name``, for a wrong shape, a non-integer value or a label outside ``[low, high)``.
    """
    got = tuple(np.shape(labels))
    if got != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}; got {list(got)}")
    if not is_concrete(labels):
        return
    a = np.asarray(labels)
    if a.size == 0:
        return
    if not np.issubdtype(a.dtype, np.integer):
        if not np.issubdtype(a.dtype, np.number) or not np.all(np.isfinite(a)) or np.any(np.mod(a, 1) != 0):
            raise ValueError(f"{name} must hold integer labels in [{low}, {high}); got dtype {a.dtype}")
    lo, hi = int(a.min()), int(a.max())
    if lo < low or hi >= high:
        bad = lo if lo < low else hi
        raise ValueError(f"{name} must hold labels in [{low}, {high}); got {bad}")


def check_data_finite(name: str, array) -> None:
    """Check (when concrete) that ``array`` holds no NaN or infinite value.

    Integer arrays and traced arrays pass unchecked.

    Parameters
    ----------
    name : str
        The argument's name, used in the error message.
    array : array_like
        The data to check.

    Raises
    ------
    ValueError
        Naming ``name`` and the number of non-finite values.
    """
    if not is_concrete(array):
        return
    a = np.asarray(array)
    if a.size and np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a)):
        bad = int(a.size - np.count_nonzero(np.isfinite(a)))
        raise ValueError(f"{name} must be finite; found {bad} NaN/inf value(s)")
