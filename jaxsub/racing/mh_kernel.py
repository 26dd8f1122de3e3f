"""The single-chain racing MH kernel: state, info, ``init`` and ``build_kernel`` (BlackJAX contract).

An MH step from ``x`` with proposal ``x' ~ q(.|x)`` and ``u ~ U(0, 1)`` accepts iff

.. math::

    \\log u + \\log p(x) + \\log q(x'|x) + \\sum_{n=1}^N \\log p(y_n|x)
    \\;<\\; \\log p(x') + \\log q(x|x') + \\sum_{n=1}^N \\log p(y_n|x'),

decided by the race of :func:`jaxsub.racing.mh_decision.mh_decision` on a subsample.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxsub.racing.control_variates import (
    ControlVariate,
    check_center_size,
    check_control_variate_matches,
)
from jaxsub.racing.data import num_data_of
from jaxsub.racing.mh_config import (
    check_block_size,
    check_bool,
    check_control_variate,
    validate_racing_config,
)
from jaxsub.racing.mh_decision import mh_decision, pair_cv, pair_loglikelihood
from jaxsub.racing.mh_inputs import check_position
from jaxsub.racing.proposals import can_fuse, flat_size, fused_draws
from jaxsub.types import Array, ArrayLikeTree, ArrayTree, PRNGKey

__all__ = ["RacingMHInfo", "RacingMHState", "build_kernel", "init", "propose"]


class RacingMHState(NamedTuple):
    """State of a racing MH chain.

    Attributes
    ----------
    position
        Current position (any pytree of arrays).
    logprior
        ``logprior_fn(position)``, cached so that each step evaluates the prior
        only at the proposal. No likelihood is cached: the racing test never
        sees all of it.
    """

    position: ArrayTree
    logprior: Array


class RacingMHInfo(NamedTuple):
    """What one racing MH transition did.

    Attributes
    ----------
    is_accepted
        Whether the proposal was accepted.
    num_evaluations
        Per-datum log-likelihood evaluations spent on the decision (both
        states count: a race that reads ``T`` data costs ``2T``; the exact
        test costs ``2N``).
    num_stages
        Stages of the doubling schedule used (``0`` for the exact test).
    is_exact
        Whether the decision read all ``N`` data (then it is the exact MH decision).
    has_nan
        A per-datum log-likelihood or the prior was NaN: the decision is not
        trustworthy (the proposal is rejected).
    proposal
        The proposed position ``x'``.
    log_uniform
        ``log u`` of the MH test.
    log_prior_proposal_ratio
        ``log p(x') + log q(x|x') - log p(x) - log q(x'|x)``. With ``log_uniform``
        it lets the exact decision be re-made offline, ``log_uniform <
        log_prior_proposal_ratio + sum_n [l_n(x') - l_n(x)]``, to measure the
        empirical decision error rate.
    num_data
        ``N`` (int32), so that :func:`~jaxsub.racing.mh_summary.info_summary` needs no other input.
    has_control_variate
        Whether the race read a control variate (the summary warns when it did not).
    """

    is_accepted: Array
    num_evaluations: Array
    num_stages: Array
    is_exact: Array
    has_nan: Array
    proposal: ArrayTree
    log_uniform: Array
    log_prior_proposal_ratio: Array
    num_data: Array | None = None
    has_control_variate: Array | None = None


def init(position: ArrayLikeTree, logprior_fn: Callable) -> RacingMHState:
    """Initial state of a racing MH chain.

    Parameters
    ----------
    position
        Initial position (pytree of arrays).
    logprior_fn
        ``logprior_fn(position) -> scalar``.

    Returns
    -------
    RacingMHState
        The position and its log prior (integer leaves are kept: a custom proposal may hold
        discrete coordinates fixed; :func:`jaxsub.racing.mh.as_top_level_api` promotes them for the
        Gaussian random walk).
    """
    return RacingMHState(position, jnp.asarray(logprior_fn(position)))


def propose(rng_key: PRNGKey, state: RacingMHState, logprior_fn: Callable, proposal: Callable, fused: bool):
    """One step's proposal, ``log u``, prior/proposal gap and race key.

    Without ``fused`` the key layout is blackjax's RMH one (split into proposal / accept keys,
    ``u`` from the accept key), so that with ``delta -> 0`` the chain is step-for-step
    ``blackjax.additive_step_random_walk``; with ``fused`` (and :func:`can_fuse`) everything
    comes from one :func:`fused_draws` call.

    Parameters
    ----------
    rng_key
        The step's key.
    state
        The chain's :class:`RacingMHState`.
    logprior_fn
        ``logprior_fn(position) -> scalar``.
    proposal
        ``proposal(rng_key, position) -> (proposed, log_q_ratio)``.
    fused
        Draw everything from one ``jax.random.bits`` call when the proposal allows it.

    Returns
    -------
    (proposed, logprior_new, log_u, log_f0_gap, race_key)
    """
    position = state.position
    if fused and can_fuse(proposal, position):
        normals, log_u, key_race = fused_draws(rng_key, flat_size(position), jnp.float32)
        proposed, log_q_ratio = proposal.from_normals(position, normals)
        logprior_new = jnp.asarray(logprior_fn(proposed))
        dtype = jnp.result_type(logprior_new)
        log_u = log_u.astype(dtype)
    else:
        key_proposal, key_accept = jax.random.split(rng_key)
        key_race = jax.random.fold_in(key_accept, 1)
        proposed, log_q_ratio = proposal(key_proposal, position)
        logprior_new = jnp.asarray(logprior_fn(proposed))
        dtype = jnp.result_type(logprior_new)
        log_u = jnp.log(jax.random.uniform(key_accept, dtype=dtype))
    log_f0_gap = (logprior_new - state.logprior + jnp.asarray(log_q_ratio, dtype)).astype(dtype)
    return proposed, logprior_new, log_u, log_f0_gap, key_race


def check_kernel_inputs(
    num_data: int, bound: str, exact: bool, state, loglikelihood_fn, data, control_variate, reward_range
):
    """The call-time checks of the racing MH kernel (``ValueError`` naming the argument; shapes only, no compute)."""
    check_position(state.position, loglikelihood_fn, data, name="state.position")
    control_variate = check_control_variate(control_variate)
    check_control_variate_matches(control_variate, data, None)
    if num_data_of(data) != num_data:
        raise ValueError(f"data has {num_data_of(data)} rows but the kernel was built for num_data={num_data}")
    check_center_size(control_variate, state.position)
    if bound == "ebs" and not exact and reward_range is None:
        raise ValueError(
            "bound='ebs' needs reward_range: a bound C on max_n d_n - min_n d_n of the per-datum "
            "log-likelihood differences d_n = l_n(x') - l_n(x) (scalar or callable (position, proposed) -> C)"
        )
    return control_variate


def build_kernel(
    num_data: int,
    *,
    delta: float | None,
    first_batch_size: int = 50,
    bound: str = "normal",
    exact: bool = False,
    block_size: int = 1,
    fused_random_bits: bool = False,
) -> Callable:
    """Build the racing MH kernel (BlackJAX contract: structure here, model and hyperparameters at call time).

    Parameters
    ----------
    num_data
        ``N``, the leading size of ``data`` (static).
    delta
        Allowed probability of a wrong accept/reject decision, in ``(0, 1)``
        (static: it fixes the ``B_Normal`` thresholds; ignored with ``exact=True``).
    first_batch_size
        ``m_1`` of the doubling schedule; the paper's robust default is 50.
    bound
        ``"normal"`` (Racing-Normal, ``B_Normal`` threshold) or ``"ebs"``
        (empirical Bernstein-Serfling; needs ``reward_range`` at call time).
    exact
        Use all ``N`` data in every decision (exact MH; for baselines and tests).
    block_size
        ``B >= 1``: the race samples blocks of ``B`` consecutive rows of ``data``
        (reward = block sum; :func:`jaxsub.racing.racing`'s ``block_size``):
        contiguous reads, one permutation index per block. ``first_batch_size``
        then counts blocks. The guarantee is unchanged (a finite population of
        ``ceil(N / B)`` blocks); shuffle sorted data once. ``B = 1``: rows.
    fused_random_bits
        With a :class:`~jaxsub.racing.proposals.GaussianRandomWalk` proposal and a float32
        position, draw the step's proposal normals, ``u`` and the race's permutation keys from
        one ``jax.random.bits`` call (:func:`~jaxsub.racing.proposals.fused_draws`: one threefry
        loop per step instead of six). Same law, other draws. Default ``False``: the key layout
        of ``blackjax.additive_step_random_walk`` (draws equal to it as ``delta -> 0``).
        Other proposals and dtypes take the default layout.

    Returns
    -------
    kernel
        ``kernel(rng_key, state, logprior_fn, loglikelihood_fn, data, proposal,
        control_variate=None, reward_range=None) -> (RacingMHState, RacingMHInfo)``
        where ``proposal(rng_key, position) -> (proposed, log_q_ratio)`` (e.g.
        :func:`~jaxsub.racing.proposals.gaussian_random_walk` of a possibly traced step size,
        like ``blackjax.additive_step_random_walk``'s ``random_step``) and
        ``reward_range`` is ``C``, a bound on ``max_n d_n - min_n d_n`` for the
        per-datum differences ``d_n = l_n(x') - l_n(x)`` (after the control
        variate): a scalar, or ``reward_range(position, proposed) -> C``.

    Raises
    ------
    ValueError
        On a setting outside its range (:func:`~jaxsub.racing.mh_config.validate_racing_config`,
        :func:`~jaxsub.racing.mh_config.check_block_size`); the kernel raises on data of another
        size, a control variate built on other data or for positions of another size, and
        ``bound="ebs"`` without ``reward_range``.
    """
    delta, first_batch_size, bound = validate_racing_config(num_data, delta, first_batch_size, bound, exact)
    block_size = check_block_size(block_size, num_data, first_batch_size)
    fused_random_bits = check_bool("fused_random_bits", fused_random_bits)
    engine_options = {"block_size": block_size} if block_size > 1 else {}

    def kernel(
        rng_key: PRNGKey,
        state: RacingMHState,
        logprior_fn: Callable,
        loglikelihood_fn: Callable,
        data: ArrayLikeTree,
        proposal: Callable,
        control_variate: ControlVariate | None = None,
        reward_range=None,
    ):
        control_variate = check_kernel_inputs(
            num_data, bound, exact, state, loglikelihood_fn, data, control_variate, reward_range
        )
        position = state.position
        proposed, logprior_new, log_u, log_f0_gap, key_race = propose(
            rng_key, state, logprior_fn, proposal, fused_random_bits
        )
        c_range = None
        if reward_range is not None and not exact:
            c_range = reward_range(position, proposed) if callable(reward_range) else reward_range
            # The race centres each datum's pair (l(x), l(x')) by its mean: each arm's
            # reward is then +-d_n / 2, whose range is C / 2.
            c_range = jnp.asarray(c_range, log_f0_gap.dtype) / 2
        accept, evals, stages, is_exact, has_nan = mh_decision(
            key_race,
            log_f0_gap,
            log_u,
            partial(pair_loglikelihood, loglikelihood_fn, data, position, proposed),
            num_data,
            delta=delta,
            first_batch_size=first_batch_size,
            bound=bound,
            exact=exact,
            pair_control_variate=pair_cv(control_variate, position, proposed),
            reward_range=c_range,
            **engine_options,
        )
        new_state = jax.lax.cond(
            accept,
            lambda: RacingMHState(proposed, logprior_new.astype(state.logprior.dtype)),
            lambda: state,
        )
        info = RacingMHInfo(
            accept,
            evals,
            stages,
            is_exact,
            has_nan,
            proposed,
            log_u,
            log_f0_gap,
            jnp.asarray(num_data, jnp.int32),
            jnp.asarray(control_variate is not None),
        )
        return new_state, info

    return kernel
