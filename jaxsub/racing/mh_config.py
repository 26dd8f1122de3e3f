"""Static settings of the racing MH and Gibbs kernels, validated once at construction.

Every check raises a ``ValueError`` that names the parameter, the value received and
the allowed range (:mod:`jaxsub.validation`); traced values (``jax.vmap`` over a
hyperparameter) pass through unchecked.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxsub.racing.control_variates import ControlVariate
from jaxsub.validation import check_choice, check_int, check_real

__all__ = [
    "BOUNDS",
    "EXACT_BLOCK",
    "check_block_size",
    "check_control_variate",
    "check_exact_pass_cost",
    "check_step_size",
    "validate_racing_config",
]

#: Bounds understood by the racing engine (:func:`jaxsub.racing.racing`).
BOUNDS = ("normal", "ebs")

#: Data per block of the exact decision (``exact=True``): memory ``2 x EXACT_BLOCK`` log-likelihoods.
EXACT_BLOCK = 32768


def validate_racing_config(num_data: int, delta, first_batch_size, bound, exact: bool):
    """Validate the racing settings shared by the MH and Gibbs kernels.

    Parameters
    ----------
    num_data
        ``N >= 2``.
    delta
        Per-decision error bound in ``(0, 1)``; may be ``None`` when ``exact``.
    first_batch_size
        ``m_1`` in ``[2, N]``.
    bound
        One of :data:`BOUNDS`.
    exact
        ``True`` or ``False``.

    Returns
    -------
    (delta, first_batch_size, bound)
        The validated values (unchanged when ``exact`` and ``delta is None``).

    Raises
    ------
    ValueError
        Naming the first setting outside its range.
    """
    check_int("num_data", num_data, low=2)
    check_bool("exact", exact)
    if exact and delta is None:
        return None, first_batch_size, bound
    delta = check_real("delta", delta, low=0.0, high=1.0)
    first_batch_size = check_int("first_batch_size", first_batch_size, low=2, high=num_data)
    bound = check_choice("bound", bound, BOUNDS)
    return delta, first_batch_size, bound


def check_block_size(block_size, num_data: int, first_batch_size) -> int:
    """Validate the racing sampling unit ``block_size``.

    Parameters
    ----------
    block_size
        ``B >= 1`` rows per block.
    num_data
        ``N``.
    first_batch_size
        ``m_1``, counted in blocks when ``B > 1`` (``None``: not checked).

    Returns
    -------
    int
        ``block_size``.

    Raises
    ------
    ValueError
        If ``B < 1`` or ``ceil(N / B) < first_batch_size``.
    """
    block_size = check_int("block_size", block_size, low=1)
    if first_batch_size is not None and block_size > 1 and -(-num_data // block_size) < first_batch_size:
        raise ValueError(
            f"block_size must leave at least first_batch_size={first_batch_size} blocks of num_data={num_data} rows; "
            f"got block_size={block_size}"
        )
    return block_size


def check_exact_pass_cost(exact_pass_cost):
    """Validate the engine option ``exact_pass_cost``.

    Parameters
    ----------
    exact_pass_cost
        ``None`` (no early exact pass) or ``c`` in ``(0, 1]``.

    Returns
    -------
    float or None

    Raises
    ------
    ValueError
        If ``c`` is outside ``(0, 1]``.
    """
    if exact_pass_cost is None:
        return None
    return check_real("exact_pass_cost", exact_pass_cost, low=0.0, high=1.0, high_closed=True)


def check_control_variate(control_variate):
    """Accept ``None`` or a :class:`~jaxsub.racing.control_variates.ControlVariate`.

    Parameters
    ----------
    control_variate
        The MH kernels' ``control_variate`` argument.

    Returns
    -------
    ControlVariate or None

    Raises
    ------
    ValueError
        For any other type.
    """
    if control_variate is not None and not isinstance(control_variate, ControlVariate):
        raise ValueError(
            "control_variate must be a jaxsub.racing_mh.ControlVariate(value_fn, mean_fn) "
            f"(see parameter_taylor_control_variate) or None; got {type(control_variate).__name__}"
        )
    return control_variate


def check_bool(name: str, value) -> bool:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return value


def check_step_size(step_size):
    """Validate a concrete random-walk ``step_size`` (scalar, vector or matrix); a traced one passes through.

    Parameters
    ----------
    step_size
        Positive scalar, per-coordinate vector of positive scales, or a matrix (a linear map of
        the noise).

    Returns
    -------
    The ``step_size`` unchanged.

    Raises
    ------
    ValueError
        If it has more than 2 dimensions, is empty, is not finite, or a scalar/vector entry is ``<= 0``.
    """
    if isinstance(step_size, jax.core.Tracer):
        return step_size
    arr = np.asarray(step_size, dtype=np.float64)
    if arr.ndim > 2 or arr.size == 0:
        raise ValueError(f"step_size must be a positive scalar, vector or matrix; got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"step_size must be finite; got {step_size!r}")
    if arr.ndim <= 1 and np.any(arr <= 0):
        raise ValueError(f"step_size must be > 0; got {step_size!r}")
    return step_size
