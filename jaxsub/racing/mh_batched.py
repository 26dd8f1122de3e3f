"""Racing MH for many chains at once: C proposals, then one :func:`jaxsub.racing.racing_batch`.

``jax.vmap`` of the single-chain kernel (:mod:`jaxsub.racing.mh_kernel`) runs every race's
loops until the slowest chain's race is done; here the rounds of the batched race advance
only the unfinished races. Chain ``c`` gets the decision of the single-chain kernel built with
the same ``fused_random_bits`` and called with key ``rng_keys[c]``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxsub.racing.control_variates import ControlVariate, check_control_variate_matches
from jaxsub.racing.data import batch_loglikelihood, num_data_of
from jaxsub.racing.engine import DEFAULT_EXACT_PASS_COST, racing_batch
from jaxsub.racing.mh_config import (
    check_block_size,
    check_bool,
    check_control_variate,
    check_exact_pass_cost,
    validate_racing_config,
)
from jaxsub.racing.mh_kernel import RacingMHInfo, RacingMHState, propose
from jaxsub.validation import check_int

__all__ = ["BatchedMHConfig", "build_batched_kernel"]


class BatchedMHConfig(NamedTuple):
    """The validated static settings of :func:`build_batched_kernel`."""

    num_data: int
    delta: float
    first_batch_size: int
    bound: str
    group_size: int
    block_size: int
    exact_pass_cost: float | None
    max_block_size: int | None
    fused_random_bits: bool


def _pair_loglik(loglikelihood_fn, data, indices, params):
    x, xp = params
    return jnp.stack(
        [
            batch_loglikelihood(loglikelihood_fn, x, data, indices),
            batch_loglikelihood(loglikelihood_fn, xp, data, indices),
        ],
        axis=-1,
    )


def _pair_cv_values(control_variate: ControlVariate, indices, params):
    return jnp.stack([control_variate.value_fn(params[0], indices), control_variate.value_fn(params[1], indices)], -1)


def _pair_cv_means(control_variate: ControlVariate, params):
    return jnp.stack([control_variate.mean_fn(params[0]), control_variate.mean_fn(params[1])])


def _select(accept, new, old):
    return jnp.where(accept.reshape(accept.shape + (1,) * (jnp.ndim(old) - 1)), new, old)


def batched_step(
    cfg: BatchedMHConfig, rng_keys, states, logprior_fn, loglikelihood_fn, data, proposal, control_variate=None
):
    """One step of C chains (see :func:`build_batched_kernel`)."""
    control_variate = check_control_variate(control_variate)
    check_control_variate_matches(control_variate, data, None)
    if num_data_of(data) != cfg.num_data:
        raise ValueError(f"data has {num_data_of(data)} rows but the kernel was built for num_data={cfg.num_data}")
    propose_one = partial(propose, logprior_fn=logprior_fn, proposal=proposal, fused=cfg.fused_random_bits)
    proposed, logprior_new, log_u, gap, race_keys = jax.vmap(propose_one)(rng_keys, states)
    kwargs = {}
    if control_variate is not None:
        kwargs["control_variate"] = (
            partial(_pair_cv_values, control_variate),
            partial(_pair_cv_means, control_variate),
        )
    if cfg.block_size > 1:
        kwargs["block_size"] = cfg.block_size
    sample = racing_batch(
        partial(_pair_loglik, loglikelihood_fn, data),
        2,
        cfg.num_data,
        delta=cfg.delta,
        first_batch_size=cfg.first_batch_size,
        bound=cfg.bound,
        variance="pairwise",
        gumbel_noise=False,
        group_size=cfg.group_size,
        exact_pass_cost=cfg.exact_pass_cost,
        max_block_size=cfg.max_block_size,
        **kwargs,
    )
    choice, info = sample(race_keys, jnp.stack([log_u, gap], axis=-1), (states.position, proposed))
    has_nan = info.has_nan
    accept = (choice == 1) & ~has_nan
    pick = partial(_select, accept)
    new_states = RacingMHState(
        jax.tree.map(pick, proposed, states.position), pick(logprior_new.astype(states.logprior.dtype), states.logprior)
    )
    infos = RacingMHInfo(
        accept,
        info.num_evaluations,
        info.num_stages,
        info.is_exact,
        has_nan,
        proposed,
        log_u,
        gap,
        jnp.full(accept.shape, cfg.num_data, jnp.int32),
        jnp.full(accept.shape, control_variate is not None),
    )
    return new_states, infos


def build_batched_kernel(
    num_data: int,
    *,
    delta: float,
    first_batch_size: int = 50,
    bound: str = "normal",
    group_size: int = 16,
    block_size: int = 1,
    exact_pass_cost: float | None = DEFAULT_EXACT_PASS_COST,
    max_block_size: int | None = None,
    fused_random_bits: bool = True,
) -> Callable:
    """Racing MH for many chains at once, work proportional to the unfinished races.

    ``jax.vmap`` of :func:`~jaxsub.racing.mh_kernel.build_kernel`'s kernel runs every race's
    loops until the slowest chain's race is done. This kernel makes the C proposals, then decides
    all C tests with :func:`jaxsub.racing.racing_batch`, whose rounds advance only
    the unfinished races. Chain ``c`` gets the same decision as the single-chain
    kernel built with the same ``fused_random_bits`` and called with key ``rng_keys[c]``.

    Parameters
    ----------
    num_data
        ``N`` (static).
    delta
        Per-decision error bound in ``(0, 1)``.
    first_batch_size
        ``m_1`` in ``[2, N]``.
    bound
        ``"normal"`` only (Racing-Normal).
    group_size
        Races advanced together per round of :func:`jaxsub.racing.racing_batch` (``>= 1``).
    block_size
        As for :func:`~jaxsub.racing.mh_kernel.build_kernel`.
    exact_pass_cost
        :func:`jaxsub.racing.racing_batch`'s option (``c`` in ``(0, 1]``, or ``None``
        to disable): a race still running at the first stage whose new random data
        would reach ``c N`` finishes with one contiguous exact pass (this only removes
        error events). Default: the engine's.
    max_block_size
        The engine's largest chunk of a stage (``None``: its default). Stages with one chunk
        size share one loop, so a small value (e.g. ``first_batch_size``) leaves fewer loops
        per step, at more rounds for a rare long race.
    fused_random_bits
        :func:`~jaxsub.racing.mh_kernel.build_kernel`'s option (default ``True`` here): one
        threefry loop per step for a Gaussian random walk on float32 positions.

    Returns
    -------
    kernel
        ``kernel(rng_keys [C], states [C], logprior_fn, loglikelihood_fn, data, proposal,
        control_variate=None) -> (states [C], infos [C])``; ``proposal`` as for
        :func:`~jaxsub.racing.mh_kernel.build_kernel` (one chain; it is vmapped).

    Raises
    ------
    ValueError
        On a setting outside its range, or ``bound`` other than ``"normal"``.
    """
    delta, first_batch_size, bound = validate_racing_config(num_data, delta, first_batch_size, bound, False)
    if bound != "normal":
        raise ValueError(f"build_batched_kernel supports bound='normal' only; got {bound!r}")
    if max_block_size is not None:
        max_block_size = check_int("max_block_size", max_block_size, low=first_batch_size)
    cfg = BatchedMHConfig(
        num_data,
        delta,
        first_batch_size,
        bound,
        check_int("group_size", group_size, low=1),
        check_block_size(block_size, num_data, first_batch_size),
        check_exact_pass_cost(exact_pass_cost),
        max_block_size,
        check_bool("fused_random_bits", fused_random_bits),
    )
    return partial(batched_step, cfg)
