"""Data helpers shared by the racing kernels (MH, Gibbs, SGLD-MH): the data is a pytree of
arrays with a leading data axis ``N``; a model's per-datum log-likelihood
``loglikelihood_fn(position, datum)`` is vmapped over the rows a race reads."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.types import Array, ArrayLikeTree, ArrayTree

__all__ = ["batch_loglikelihood", "data_fingerprint", "gather", "num_data_of", "resolve_num_data"]


def num_data_of(data: ArrayLikeTree) -> int:
    """``N``, the leading (data) axis shared by every leaf of ``data`` (``ValueError`` otherwise)."""
    leaves = jax.tree.leaves(data)
    if not leaves:
        raise ValueError("data must be a non-empty pytree of arrays with a leading data axis")
    sizes = {int(np.shape(leaf)[0]) if np.ndim(leaf) > 0 else -1 for leaf in leaves}
    if len(sizes) != 1 or -1 in sizes:
        raise ValueError(f"every leaf of data must share the leading (data) axis; got leading sizes {sorted(sizes)}")
    return sizes.pop()


def resolve_num_data(num_data, data, *, low: int = 1) -> int:
    """``N`` for a sampler that reads data through a closure: ``num_data``, or ``data``'s rows.

    The discrete samplers index the data only through ``log_factor_fn(indices)``, and a gather
    past the last row clamps silently (row ``N - 1`` would count many times). Passing the data
    lets the constructor derive ``N`` and check it.

    Parameters
    ----------
    num_data
        ``N``, or ``None`` to take it from ``data``.
    data
        ``None``, or the pytree of arrays (leading axis ``N``) that ``log_factor_fn`` indexes.
        Concrete floating leaves must be finite.
    low
        Smallest allowed ``N``.

    Returns
    -------
    int
        ``N``.

    Raises
    ------
    ValueError
        If neither is given, ``num_data`` differs from ``data``'s leading axis, the leaves of
        ``data`` do not share one, ``data`` holds NaN / inf, or ``N < low``.
    """
    from jaxsub.validation import check_int

    if data is None:
        if num_data is None:
            raise ValueError(
                "num_data is required when data is not given (it must equal the rows log_factor_fn indexes)"
            )
        return check_int("num_data", num_data, low=low)
    rows = num_data_of(data)
    if num_data is not None and check_int("num_data", num_data, low=low) != rows:
        raise ValueError(
            f"num_data must equal the rows of data (the leading axis log_factor_fn indexes); got num_data={num_data} "
            f"and {rows} rows (indices past the last row would read it again)"
        )
    for i, leaf in enumerate(jax.tree.leaves(data)):
        if isinstance(leaf, jax.core.Tracer) or not np.issubdtype(np.asarray(leaf).dtype, np.floating):
            continue
        bad = int(np.size(leaf) - np.count_nonzero(np.isfinite(np.asarray(leaf))))
        if bad:
            raise ValueError(f"data must be finite; leaf {i} has {bad} NaN/inf value(s)")
    return check_int("num_data", rows, low=low)


def data_fingerprint(data: ArrayLikeTree) -> tuple | None:
    """A cheap fingerprint of concrete data: ``(N, float64 sums of up to 257 evenly spaced rows per leaf)``.

    ``None`` for traced data (inside ``jit``), where only ``N`` can be checked. Used to check that a
    control variate was built on the data it is used with.

    Parameters
    ----------
    data : pytree
        The data set, every leaf with ``N`` leading rows.

    Returns
    -------
    tuple or None
        ``(N, sum_0, sum_1, ...)`` with one rounded float sum per leaf, or ``None`` when a leaf is traced.
    """
    leaves = jax.tree.leaves(data)
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
        return None
    n = num_data_of(data)
    rows = np.unique(np.linspace(0, n - 1, min(n, 257)).astype(np.int64))
    return (n,) + tuple(round(float(np.sum(np.asarray(leaf)[rows], dtype=np.float64)), 6) for leaf in leaves)


def gather(data: ArrayLikeTree, indices: Array) -> ArrayTree:
    """The rows ``indices`` of every leaf of ``data``."""
    return jax.tree.map(lambda a: jnp.take(a, indices, axis=0), data)


def batch_loglikelihood(
    loglikelihood_fn: Callable, position: ArrayLikeTree, data: ArrayLikeTree, indices: Array
) -> Array:
    """``[loglikelihood_fn(position, data[n]) for n in indices]`` (vmapped), shape ``[m]``."""
    return jax.vmap(loglikelihood_fn, in_axes=(None, 0))(position, gather(data, indices))
