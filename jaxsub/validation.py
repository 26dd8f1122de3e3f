"""Configuration checks shared by every jaxsub constructor.

Static configuration (step sizes, confidence levels, batch sizes, names of
options) is validated once, when a sampler is built, outside any ``jit``.
Every failure is a :class:`ValueError` whose message names the parameter,
the value received and the allowed range, e.g.::

    ValueError: delta must be in (0, 1); got 1.5

Array-valued inputs that are traced under ``jit`` cannot be checked here;
numerical trouble in them is reported through each sampler's ``info``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "check_choice",
    "check_finite_array",
    "check_hyperparameter",
    "check_int",
    "check_probability_vector",
    "check_real",
]


def _fmt_interval(low, high, low_closed, high_closed) -> str:
    left = "[" if low_closed else "("
    right = "]" if high_closed else ")"
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    return f"{left}{lo}, {hi}{right}"


def check_real(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_closed: bool = False,
    high_closed: bool = False,
) -> float:
    """Check that ``value`` is a finite real number in an interval.

    Parameters
    ----------
    name
        Name of the parameter, used in the error message.
    value
        The value received (a Python or NumPy scalar; concrete, not traced).
    low, high
        Interval bounds; ``None`` means unbounded on that side.
    low_closed, high_closed
        Whether each bound is included.

    Returns
    -------
    The value as a Python ``float``.

    Raises
    ------
    ValueError
        If the value is not a real scalar, is NaN/inf, or lies outside the interval.
    """
    interval = _fmt_interval(low, high, low_closed, high_closed)
    try:
        as_float = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number in {interval}; got {value!r}") from None
    if np.ndim(value) != 0 or not math.isfinite(as_float):
        raise ValueError(f"{name} must be a finite real number in {interval}; got {value!r}")
    too_low = low is not None and (as_float < low or (as_float == low and not low_closed))
    too_high = high is not None and (as_float > high or (as_float == high and not high_closed))
    if too_low or too_high:
        raise ValueError(f"{name} must be in {interval}; got {value!r}")
    return as_float


def check_hyperparameter(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_closed: bool = False,
    high_closed: bool = False,
) -> Any:
    """Check a numeric hyperparameter that a user may trace (BlackJAX convention).

    A concrete value (Python/NumPy scalar or a concrete JAX array) is checked
    with :func:`check_real` and returned unchanged; a traced value (inside
    ``jax.jit``, ``jax.vmap`` or ``jax.grad``, e.g. a step-size sweep) cannot be
    inspected and is returned as it is. Use it for ``step_size``, ``delta``,
    temperatures and the like; use :func:`check_real` / :func:`check_int` for
    static settings (sizes, counts, names), which must be concrete. A sampler that
    accepts a traced value reports it out of range in its ``info`` (e.g.
    ``bad_hyperparameter``), since it cannot raise.

    Parameters
    ----------
    name
        Name of the parameter, used in the error message.
    value
        The value received (concrete or traced).
    low, high, low_closed, high_closed
        The interval, as in :func:`check_real`.

    Returns
    -------
    ``value``, unchanged (not converted to ``float``, so arrays keep their dtype).

    Raises
    ------
    ValueError
        If ``value`` is concrete and not a finite real in the interval.
    """
    import jax

    if isinstance(value, jax.core.Tracer):
        return value
    check_real(name, value, low=low, high=high, low_closed=low_closed, high_closed=high_closed)
    return value


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None) -> int:
    """Check that ``value`` is an integer in the closed range ``[low, high]``.

    Parameters
    ----------
    name
        Name of the parameter, used in the error message.
    value
        The value received (Python or NumPy integer).
    low, high
        Inclusive bounds; ``None`` means unbounded on that side.

    Returns
    -------
    int
        The value as a Python ``int``.

    Raises
    ------
    ValueError
        If the value is not an integer (bools are rejected) or is out of range.
    """
    interval = _fmt_interval(low, high, True, True)
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        raise ValueError(f"{name} must be an integer in {interval}; got {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be an integer in {interval}; got {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """Check that ``value`` is one of ``choices``.

    Parameters
    ----------
    name
        Name of the parameter, used in the error message.
    value
        The value received.
    choices
        The allowed values.

    Returns
    -------
    ``value``, unchanged.

    Raises
    ------
    ValueError
        Listing the allowed choices.
    """
    choices = tuple(choices)
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
    return value


def check_probability_vector(name: str, probs: Any, *, size: int | None = None, atol: float = 1e-6) -> np.ndarray:
    """Check a concrete probability vector: 1-D, finite, non-negative, sums to 1.

    Parameters
    ----------
    name
        Parameter name for the message.
    probs
        Array-like of probabilities.
    size
        Required length, if any.
    atol
        Absolute tolerance on ``sum(probs) == 1`` (float32 round-off).

    Returns
    -------
    The probabilities as a float64 NumPy array.

    Raises
    ------
    ValueError
        If the vector is not 1-D, has another length, holds negative or non-finite
        entries, or does not sum to 1.
    """
    arr = np.asarray(probs, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D probability vector; got shape {arr.shape}")
    if size is not None and arr.shape[0] != size:
        raise ValueError(f"{name} must have length {size}; got length {arr.shape[0]}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be finite and non-negative; got {arr.tolist()}")
    if abs(arr.sum() - 1.0) > atol:
        raise ValueError(f"{name} must sum to 1 (within {atol:g}); got sum {arr.sum():.8g}")
    return arr


def check_finite_array(name: str, value: Any, *, ndim: int | None = None, min_rows: int = 1) -> np.ndarray:
    """Check a concrete data array: numeric, finite (no NaN/inf), non-empty.

    Use on data handed to a constructor or a preprocessing function (outside jit).

    Parameters
    ----------
    name
        Name of the parameter, used in the error message.
    value
        Array-like data.
    ndim
        Required number of dimensions, if any.
    min_rows
        Smallest allowed length of the leading axis.

    Returns
    -------
    The array as NumPy (no copy when possible).

    Raises
    ------
    ValueError
        If the array is not numeric, has another number of dimensions, too few rows, or
        holds NaN / inf.
    """
    arr = np.asarray(value)
    if not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{name} must be a numeric array; got dtype {arr.dtype}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s); got shape {arr.shape}")
    if arr.ndim == 0 or arr.shape[0] < min_rows:
        raise ValueError(f"{name} must have at least {min_rows} row(s); got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} must be finite; found {bad} NaN/inf value(s)")
    return arr
