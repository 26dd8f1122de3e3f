"""Checks of the model inputs of the racing kernels, made once at construction or ``init``.

Invalid input is refused with a ``ValueError`` that names the argument: non-finite data (one
NaN row otherwise shifts a racing-MH posterior silently: the race never reads most rows), a
position the model cannot evaluate, a log-likelihood that is not a scalar per datum (e.g. a
``y`` of shape ``[N, 1]`` where ``[N]`` was meant), a step-size matrix of the wrong shape. The
position is checked against the model with :func:`jax.eval_shape` on one datum (no compute).
Traced values (inside ``jit``) are not inspected.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.types import ArrayLikeTree, ArrayTree

__all__ = ["check_finite_data", "check_position", "check_step_size_shape", "float_position"]


def _is_traced(leaf) -> bool:
    return isinstance(leaf, jax.core.Tracer)


def check_finite_data(data: ArrayLikeTree, name: str = "data") -> None:
    """Raise ``ValueError`` if a concrete floating leaf of ``data`` holds a NaN or an infinity.

    Parameters
    ----------
    data
        Pytree of arrays with a leading data axis (traced leaves are skipped).
    name
        The argument's name, for the message.

    Raises
    ------
    ValueError
        Naming the leaf, the number of non-finite values and the first row holding one.

    Returns
    -------
    None
    """
    leaves, treedef = jax.tree.flatten(data)
    for i, leaf in enumerate(leaves):
        if _is_traced(leaf):
            continue
        arr = np.asarray(leaf)
        if not np.issubdtype(arr.dtype, np.inexact):
            continue
        finite = np.isfinite(arr)
        if finite.all():
            continue
        rows = np.flatnonzero(~finite.reshape(arr.shape[0], -1).all(axis=1)) if arr.ndim else np.zeros(1, int)
        where = f"leaf {i} of {len(leaves)}" if len(leaves) > 1 else "it"
        raise ValueError(
            f"{name} must be finite: {where} has {int(arr.size - finite.sum())} NaN/inf value(s), first in row "
            f"{int(rows[0])} ({len(rows)} row(s) in all); drop or impute them (a racing decision reads a subsample, "
            "so a bad row would otherwise bias the chain silently or reject proposals at random)"
        )


def float_position(position: ArrayLikeTree) -> ArrayTree:
    """``position`` with integer or boolean leaves promoted to the default float dtype (floats unchanged).

    Parameters
    ----------
    position
        A position (pytree of arrays or scalars).

    Returns
    -------
    ArrayTree
        The same pytree with float leaves.
    """

    def promote(leaf):
        leaf = jnp.asarray(leaf)
        if jnp.issubdtype(leaf.dtype, jnp.inexact):
            return leaf
        return leaf.astype(jnp.result_type(float))

    return jax.tree.map(promote, position)


def _shapes(tree) -> str:
    return str(jax.tree.map(lambda leaf: tuple(np.shape(leaf)), tree))


def check_position(
    position: ArrayLikeTree,
    loglikelihood_fn: Callable,
    data: ArrayLikeTree,
    *,
    logprior_fn: Callable | None = None,
    name: str = "position",
) -> None:
    """Check a position against the model on one datum with :func:`jax.eval_shape` (no compute).

    Parameters
    ----------
    position
        A position (pytree of float arrays).
    loglikelihood_fn
        ``loglikelihood_fn(position, datum) -> scalar``.
    data
        Pytree of arrays with a leading data axis (row 0 is used).
    logprior_fn
        Optional ``logprior_fn(position) -> scalar``, checked too.
    name
        The argument's name, for the messages.

    Raises
    ------
    ValueError
        If evaluating the model at ``position`` fails (e.g. a position of the wrong size), or
        either function does not return a scalar (e.g. a ``y`` of shape ``[N, 1]``).

    Returns
    -------
    None
    """
    datum = jax.tree.map(lambda leaf: leaf[0], data)
    try:
        out = jax.eval_shape(loglikelihood_fn, position, datum)
    except Exception as err:  # noqa: BLE001 - reported with the argument's name
        raise ValueError(
            f"{name} (shapes {_shapes(position)}) does not fit the model: loglikelihood_fn(position, datum) "
            f"on one datum (shapes {_shapes(datum)}) failed with {type(err).__name__}: {err}"
        ) from None
    if jnp.shape(out) != ():
        raise ValueError(
            f"loglikelihood_fn(position, datum) must return a scalar per datum; got shape {jnp.shape(out)} for "
            f"{name} shapes {_shapes(position)} and one datum of shapes {_shapes(datum)} (a data leaf of shape "
            "[N, 1] where [N] was meant, e.g. y, broadcasts to a vector: pass y.reshape(-1))"
        )
    if logprior_fn is None:
        return
    try:
        prior = jax.eval_shape(logprior_fn, position)
    except Exception as err:  # noqa: BLE001 - reported with the argument's name
        raise ValueError(
            f"{name} (shapes {_shapes(position)}) does not fit logprior_fn: it failed with {type(err).__name__}: {err}"
        ) from None
    if jnp.shape(prior) != ():
        raise ValueError(f"logprior_fn(position) must return a scalar; got shape {jnp.shape(prior)}")


def check_step_size_shape(step_size, num_params: int) -> None:
    """Raise ``ValueError`` unless ``step_size`` is a scalar, a ``[d]`` vector or a ``[d, d]`` matrix.

    Parameters
    ----------
    step_size
        The random walk's scale (a concrete or traced array; only its shape is read).
    num_params
        ``d``, the size of the flattened position.

    Raises
    ------
    ValueError
        Naming the shape received and the shapes allowed.

    Returns
    -------
    None
    """
    shape = tuple(jnp.shape(step_size))
    if shape in ((), (1,), (num_params,), (num_params, num_params)):
        return
    raise ValueError(
        f"step_size must be a scalar, a vector of shape ({num_params},) or a matrix of shape "
        f"({num_params}, {num_params}) for a position of {num_params} parameters; got shape {shape}"
    )
