"""The racing MH decision (Chen & Ghahramani 2016, eq. 12): a two-armed race, or the exact sum.

The test ``log u < log_f0_gap + sum_n [l_n(x') - l_n(x)]`` is a race between the states
``{x, x'}`` with ``log f_0 = [log u, log_f0_gap]`` (eq. 12 divided by ``p(x) q(x'|x)``),
per-datum log-likelihoods as factors and no Gumbel noise (``u`` supplies the randomness).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax.numpy as jnp

from jaxsub.racing.control_variates import ControlVariate
from jaxsub.racing.data import batch_loglikelihood
from jaxsub.racing.engine import racing
from jaxsub.racing.exact import exact_sums
from jaxsub.racing.mh_config import EXACT_BLOCK
from jaxsub.types import Array, PRNGKey

__all__ = ["mh_decision", "pair_cv", "pair_loglikelihood"]


def exact_decision(log_f0: Array, pair_loglik_fn: Callable, num_data: int, dtype):
    """The exact MH decision from blocked, Kahan-compensated sums of ``l_n(x') - l_n(x)``."""
    sums, _, _ = exact_sums(pair_loglik_fn, 2, num_data, min(EXACT_BLOCK, num_data), dtype)
    gap = log_f0[1] - log_f0[0] + (sums[1] - sums[0])
    has_nan = jnp.isnan(gap)
    accept = jnp.logical_and(gap > 0, ~has_nan)
    evals = jnp.asarray(2 * num_data, jnp.int32)
    return accept, evals, jnp.asarray(0, jnp.int32), jnp.asarray(True), has_nan


def mh_decision(
    rng_key: PRNGKey,
    log_f0_gap: Array,
    log_uniform: Array,
    pair_loglik_fn: Callable[[Array], Array],
    num_data: int,
    *,
    delta: float | None,
    first_batch_size: int,
    bound: str,
    exact: bool,
    pair_control_variate: tuple[Callable, Array] | None = None,
    reward_range=None,
    coefficients: tuple[Array, Array] | None = None,
    **engine_options,
):
    """Decide ``log u < log_f0_gap + sum_n [l_n(x') - l_n(x)]`` by racing (or exactly).

    Parameters
    ----------
    rng_key
        Key for the racing subsample order.
    log_f0_gap
        ``log p(x') + log q(x|x') - log p(x) - log q(x'|x)``.
    log_uniform
        ``log u``.
    pair_loglik_fn
        ``indices -> [m, 2]`` per-datum log-likelihoods at ``(x, x')``.
    num_data
        ``N``.
    delta, first_batch_size, bound
        Racing settings (eq. 12 of Chen & Ghahramani 2016 with D = 2).
    exact
        Read all ``N`` data: the exact MH decision.
    pair_control_variate
        ``(h, h_mean)`` with ``h(indices) -> [m, 2]`` and ``h_mean`` its ``[2]`` mean.
    reward_range
        Per-arm reward range ``C_i`` (scalar or ``[2]``) for ``bound="ebs"``.
    coefficients
        ``None`` (the thresholds of ``delta``), or per-stage threshold coefficients
        ``(a_t, b_t)`` of :func:`jaxsub.racing.racing_coefficients` as (traceable)
        arrays: the same race with another threshold, e.g. a deliberately loosened
        one in a negative control, without a new compile.
    engine_options
        Further options of :func:`jaxsub.racing.racing` (e.g. ``skew_guard``).

    Returns
    -------
    (accept, num_evaluations, num_stages, is_exact, has_nan)
    """
    dtype = jnp.result_type(log_f0_gap)
    # Only the difference of the two log f0 entries matters to the race, so put
    # log u on arm 0 and the prior/proposal gap on arm 1 (eq. 12 divided by p(x) q(x'|x)).
    log_f0 = jnp.stack([log_uniform.astype(dtype), log_f0_gap])
    if exact:
        return exact_decision(log_f0, pair_loglik_fn, num_data, dtype)
    kwargs = {}
    if pair_control_variate is not None:
        kwargs["control_variate"] = pair_control_variate
    if reward_range is not None:
        kwargs["reward_range"] = reward_range
    kwargs.update(engine_options)
    sample = racing(
        pair_loglik_fn,
        2,
        num_data,
        delta=delta,
        first_batch_size=first_batch_size,
        bound=bound,
        variance="pairwise",
        gumbel_noise=False,
        **kwargs,
    )
    if coefficients is None:
        choice, info = sample(rng_key, log_f0)
    else:
        choice, info = sample.with_coefficients(rng_key, log_f0, *coefficients)
    has_nan = jnp.asarray(info.has_nan)
    accept = jnp.logical_and(choice == 1, ~has_nan)
    return (
        accept,
        jnp.asarray(info.num_evaluations, jnp.int32),
        jnp.asarray(info.num_stages, jnp.int32),
        jnp.asarray(info.is_exact),
        has_nan,
    )


def pair_loglikelihood(loglikelihood_fn: Callable, data, position, proposed, indices: Array) -> Array:
    """The per-datum log-likelihoods of the rows ``indices`` at ``(x, x')``.

    Parameters
    ----------
    loglikelihood_fn
        ``loglikelihood_fn(position, datum) -> scalar``.
    data
        Pytree of arrays with a leading data axis.
    position, proposed
        ``x`` and ``x'``.
    indices
        ``[m]`` row indices.

    Returns
    -------
    Array
        ``[m, 2]``.
    """
    return jnp.stack(
        [
            batch_loglikelihood(loglikelihood_fn, position, data, indices),
            batch_loglikelihood(loglikelihood_fn, proposed, data, indices),
        ],
        axis=-1,
    )


def _pair_values(control_variate: ControlVariate, position, proposal, indices):
    return jnp.stack(
        [control_variate.value_fn(position, indices), control_variate.value_fn(proposal, indices)], axis=-1
    )


def pair_cv(control_variate: ControlVariate | None, position, proposal):
    """Stack a position-form control variate into the ``[m, 2]`` pair form the race expects.

    Parameters
    ----------
    control_variate
        ``None`` or a position-form :class:`~jaxsub.racing.control_variates.ControlVariate`.
    position, proposal
        ``x`` and ``x'``.

    Returns
    -------
    ``None``, or ``(h, h_mean)`` with ``h(indices) -> [m, 2]`` and ``h_mean`` of shape ``[2]``.
    """
    if control_variate is None:
        return None
    means = jnp.stack([control_variate.mean_fn(position), control_variate.mean_fn(proposal)])
    return partial(_pair_values, control_variate, position, proposal), means
