"""What every racing sampler reports, and the checks shared by the racing constructors.

:class:`RacingInfo` is returned by :func:`~jaxsub.racing.racing`, :func:`~jaxsub.racing.gumbel_max`,
:func:`~jaxsub.racing.lil_ucb` and :func:`~jaxsub.racing.racing_ragged`; the checks raise
``ValueError`` naming the parameter (concrete values only: traced ones pass through).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.types import Array
from jaxsub.validation import check_int

__all__ = [
    "INVALID_STATE",
    "MAX_EVALUATIONS",
    "RacingInfo",
    "check_beta",
    "check_factor_fn",
    "check_reward_range",
    "check_sizes",
    "flag_invalid",
]

#: Largest N * D whose evaluation count fits the int32 counters of ``RacingInfo``.
MAX_EVALUATIONS = 2**31 - 1

#: The state every :mod:`jaxsub.discrete` sampler returns with ``info.has_nan`` set: ``-1``
#: is no state in ``[0, D)``, so a flagged draw cannot pass for a sample (indexing with it
#: is the caller's bug; ``jnp.where(info.has_nan, old, x)`` is the intended use).
INVALID_STATE = -1


class RacingInfo(NamedTuple):
    """What every :mod:`jaxsub.discrete` sampler reports with a draw.

    Attributes
    ----------
    num_evaluations
        Number of rewards ``l_{i,n}`` computed for arms still in the race
        (int32; the paper's count, at most ``N * D``).
    num_data_used
        Number of distinct data indices drawn, ``T`` (int32; at most ``N``).
        ``log_factor_fn`` is called on ``num_data_used`` indices in all (for
        all ``D`` columns).
    num_stages
        Number of racing stages run (int32).
    is_exact
        True when the decision used all ``N`` data (exact means).
    has_nan
        True when a NaN / ``+inf`` reward or ``log_f0`` was met, no state had
        positive probability, or a traced ``beta`` was not ``> 0``: the returned
        state is then :data:`INVALID_STATE` (``-1``), not a sample.
    num_alive
        Arms still in the race when it stopped (1, unless it ran to ``T = N``).
    """

    num_evaluations: Array
    num_data_used: Array
    num_stages: Array
    is_exact: Array
    has_nan: Array
    num_alive: Array


def flag_invalid(x: Array, has_nan: Array) -> Array:
    """``x`` where the draw is valid, :data:`INVALID_STATE` where ``has_nan`` is set.

    Parameters
    ----------
    x
        The drawn state(s), int32.
    has_nan
        The draw's problem flag(s), same shape as ``x``.

    Returns
    -------
    Array
        ``jnp.where(has_nan, INVALID_STATE, x)`` as int32.
    """
    return jnp.where(has_nan, INVALID_STATE, x).astype(jnp.int32)


def beta_is_bad(beta) -> Array:
    """True where a (possibly traced) inverse temperature is not ``> 0`` (NaN included); False for ``None``."""
    if beta is None:
        return jnp.asarray(False)
    return ~(jnp.asarray(beta) > 0)


def check_beta(beta, gumbel_noise: bool = True):
    """Validate ``beta``, the inverse temperature (traceable): ``None`` or ``> 0`` (``inf`` allowed: the MAP).

    A concrete value is checked (scalar, or ``[B]`` for batches); a traced one
    passes through (the samplers then flag a value not ``> 0`` in ``info.has_nan``).

    Parameters
    ----------
    beta
        ``None``, a scalar or a ``[B]`` array.
    gumbel_noise
        Whether the sampler adds Gumbel noise (``beta`` scales it, so it needs it).

    Returns
    -------
    ``beta``, unchanged.

    Raises
    ------
    ValueError
        Naming ``beta``, when it is concrete and not ``> 0``, has more than one dimension,
        or is given with ``gumbel_noise=False``.
    """
    if beta is None:
        return None
    if not gumbel_noise:
        raise ValueError("beta (the inverse temperature) needs gumbel_noise=True: it scales the Gumbel noise")
    if not isinstance(beta, jax.core.Tracer):
        arr = np.asarray(beta, dtype=np.float64)
        if arr.ndim > 1 or np.any(~(arr > 0)):
            raise ValueError(f"beta must be > 0 (inverse temperature; inf gives the MAP state); got {beta!r}")
    return beta


def check_factor_fn(log_factor_fn, num_states: int, index_shape: tuple) -> None:
    """Check once, at construction, that ``log_factor_fn`` maps indices to ``[m, D]`` rewards.

    The function is traced on abstract ``int32`` indices (``jax.eval_shape``: nothing runs), so a
    factor built for another number of states fails here, naming the shapes, rather than
    inside the first compiled race.

    Parameters
    ----------
    log_factor_fn
        ``log_factor_fn(indices) -> Array[m, D]``.
    num_states
        ``D``.
    index_shape
        Shape of the probe indices: ``(m,)``, or ``(m, D)`` for per-arm indices.

    Raises
    ------
    ValueError
        If ``log_factor_fn`` is not callable, fails on such indices, or returns another shape.
    """
    if not callable(log_factor_fn):
        raise ValueError(f"log_factor_fn must be callable; got {log_factor_fn!r}")
    try:
        out = jax.eval_shape(log_factor_fn, jax.ShapeDtypeStruct(index_shape, jnp.int32))
    except Exception as err:  # any failure of the user's function on int32 indices
        raise ValueError(
            f"log_factor_fn failed on int32 indices of shape {index_shape}: {type(err).__name__}: {err}"
        ) from err
    expected = (index_shape[0], num_states)
    if getattr(out, "shape", None) != expected:
        raise ValueError(
            f"log_factor_fn(indices of shape {index_shape}) must return shape [m, D] = {expected}; got {out}"
        )


def check_sizes(num_states, num_data, first_batch_size):
    """Validate ``D >= 2``, ``N >= 2``, ``2 <= m1 <= N`` and ``N D`` within the int32 counters; returns them."""
    num_states = check_int("num_states", num_states, low=2)
    num_data = check_int("num_data", num_data, low=2)
    first_batch_size = check_int("first_batch_size", first_batch_size, low=2, high=num_data)
    if num_states * num_data > MAX_EVALUATIONS:
        raise ValueError(
            f"num_states * num_data must be <= {MAX_EVALUATIONS} (int32 evaluation counters); "
            f"got {num_states} * {num_data}"
        )
    return num_states, num_data, first_batch_size


def check_reward_range(reward_range, num_states, required: bool):
    """Concrete ranges are validated; traced ranges (inside a kernel) are passed through."""
    if reward_range is None:
        if required:
            raise ValueError("reward_range is required with bound='ebs' (the range C of the rewards, eq. 6)")
        return None
    if isinstance(reward_range, jax.core.Tracer):
        if jnp.ndim(reward_range) not in (0, 1):
            raise ValueError(f"reward_range must be a scalar or shape [{num_states}]")
        return reward_range
    arr = np.asarray(reward_range, dtype=np.float64)
    if arr.ndim not in (0, 1) or (arr.ndim == 1 and arr.shape[0] != num_states):
        raise ValueError(f"reward_range must be a scalar or have shape [{num_states}]; got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"reward_range must be finite and >= 0; got {reward_range!r}")
    return reward_range
