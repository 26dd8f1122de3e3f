"""Adapted lil'UCB for a finite reward population (Chen & Ghahramani 2016, §3.2).

lil'UCB (Jamieson, Malloy, Nowak & Bubeck 2014, Fig. 1) keeps for every arm
the upper confidence bound::

    UCB_i = mu_i + (1 + beta)(1 + sqrt(eps)) sqrt(2 sigma^2 (1 + eps) log(log((1 + eps) T_i) / delta) / T_i)

pulls the arm with the largest bound, and stops when some arm has been pulled
more than ``1 + lambda`` times the others together (``T_i >= 1 + lambda sum_{j != i} T_j``),
returning the most pulled arm. The three modifications of §3.2:

1. rewards of each arm are drawn *without replacement* (an independent keyed
   permutation of ``[0, N)`` per arm), arms stay independent;
2. when ``T_i = N`` the mean is exact and ``UCB_i = mu_i``;
3. the algorithm also stops when the arm with the largest bound is exact, and
   returns it.

So ``T_i <= N`` and at most ``N D`` rewards are drawn (Prop. 2).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxsub.racing.control_variates import as_control_variate
from jaxsub.racing.data import resolve_num_data
from jaxsub.racing.info import RacingInfo, check_factor_fn, check_reward_range, check_sizes, flag_invalid
from jaxsub.subsample import permutation_indices, permutation_round_keys
from jaxsub.types import Array, PRNGKey
from jaxsub.validation import check_int, check_real

__all__ = ["lil_ucb"]


class _UCBState(NamedTuple):
    pulls: Array  # [D] int32, T_i
    mean: Array  # [D] running means of the raw rewards
    alive: Array  # [D] bool (False: probability 0)
    has_nan: Array
    stop: Array  # bool
    winner: Array  # int32
    steps: Array  # int32


@dataclasses.dataclass(frozen=True)
class LilUCBSampler:
    """What :func:`lil_ucb` returns: an immutable record of pure functions (Optax style).

    Calling it is calling ``sample``: ``sampler(rng_key, log_f0) -> (x, info)``, so
    ``jax.jit(sampler)`` and ``jax.vmap(sampler)`` work as before. (A ``NamedTuple`` cannot
    be weakly referenced, which ``jax.jit`` needs of the function it compiles.)

    Attributes
    ----------
    sample
        ``sample(rng_key, log_f0) -> (x, info)`` at the construction's ``delta``.
    with_delta
        ``with_delta(rng_key, log_f0, delta)``: the same sampler with a traceable ``delta``
        (one compiled sampler for many deltas).
    """

    sample: Callable
    with_delta: Callable

    def __call__(self, *args, **kwargs):
        return self.sample(*args, **kwargs)


def lil_ucb(
    log_factor_fn: Callable[[Array], Array],
    num_states: int,
    num_data: int | None = None,
    *,
    delta: float,
    data=None,
    reward_range=None,
    scale=None,
    epsilon: float = 0.01,
    beta: float = 0.5,
    stopping_ratio: float | None = None,
    batch_size: int = 1,
    control_variate=None,
    gumbel_noise: bool = True,
) -> LilUCBSampler:
    """Adapted lil'UCB sampler for ``p(x) ∝ f0(x) prod_n f_n(x)`` (§3.2).

    Parameters
    ----------
    log_factor_fn
        ``log_factor_fn(indices) -> Array[m, D]`` as for :func:`jaxsub.discrete.racing`.
    num_states, num_data
        D >= 2 and N >= 2 (``num_data``: the number of data ``log_factor_fn`` indexes;
        optional when ``data`` is given).
    delta
        Confidence parameter in (0, 1). Following the heuristic setting of
        Jamieson et al. (2014, §5) the bound uses ``delta / 5``.
    data
        Optional: the pytree of arrays (leading axis ``N``) that ``log_factor_fn`` indexes.
        When given, ``num_data`` may be omitted (it is the leading axis) and must equal it
        otherwise; NaN / inf in the data raises. Without it, ``num_data`` must equal the
        number of rows ``log_factor_fn`` indexes: it cannot be checked (a gather past the
        last row reads that row again).
    reward_range
        C (scalar or ``[D]``); the sub-Gaussian scale is ``sigma = C / 2`` as in
        the paper's §5.1 (a variable in a range of length C is C/2-sub-Gaussian).
    scale
        sigma directly (scalar or ``[D]``), instead of ``reward_range``.
    epsilon, beta
        lil'UCB parameters; defaults are the heuristic ``beta = 1/2`` and a small
        ``epsilon = 0.01`` (the heuristic's ``epsilon = 0`` makes ``log log T``
        undefined at ``T = 1``). ``log((1 + eps) T)`` is floored at 1 so the
        bonus is finite and positive for every T >= 1.
    stopping_ratio
        lambda of the stopping rule; default ``1 + 10 / D`` (the heuristic ``a``).
    batch_size
        Rewards drawn per pull of the chosen arm (1 in the paper). Larger
        batches cut the number of sequential steps; the bounds are anytime
        (they hold for every T), so the error guarantee is unchanged.
    control_variate
        As for :func:`jaxsub.discrete.racing`.
    gumbel_noise
        As for :func:`jaxsub.discrete.racing`.

    Returns
    -------
    sample
        ``sample(rng_key, log_f0) -> (x, info)`` (:class:`~jaxsub.discrete.RacingInfo`;
        ``num_stages`` counts pulls, ``num_evaluations = sum_i T_i``,
        ``num_data_used = max_i T_i`` (each arm has its own indices), ``is_exact``
        means every arm was fully evaluated).

    Raises
    ------
    ValueError
        Bad sizes, ``delta`` not in (0, 1), ``epsilon`` / ``beta`` / ``stopping_ratio`` not
        > 0, ``batch_size`` not in [1, N], not exactly one of ``reward_range`` / ``scale``
        (finite, >= 0), ``num_data`` not the rows of ``data``, non-finite ``data``.

    References
    ----------
    Jamieson, Malloy, Nowak & Bubeck, "lil'UCB: an optimal exploration algorithm
    for multi-armed bandits", COLT 2014 (Fig. 1, §5); Chen & Ghahramani (2016), §3.2.
    """
    num_states, num_data, _ = check_sizes(num_states, resolve_num_data(num_data, data, low=2), 2)
    delta = check_real("delta", delta, low=0.0, high=1.0)
    epsilon = check_real("epsilon", epsilon, low=0.0, low_closed=False)
    beta = check_real("beta", beta, low=0.0, low_closed=False)
    batch_size = check_int("batch_size", batch_size, low=1, high=num_data)
    if stopping_ratio is None:
        stopping_ratio = 1.0 + 10.0 / num_states
    stopping_ratio = check_real("stopping_ratio", stopping_ratio, low=0.0, low_closed=False)
    if (reward_range is None) == (scale is None):
        raise ValueError("lil_ucb needs exactly one of reward_range (C) or scale (sigma = C/2)")
    if scale is None:
        reward_range = check_reward_range(reward_range, num_states, required=True)
        sigma_spec, factor = reward_range, 0.5
    else:
        sigma_spec, factor = check_reward_range(scale, num_states, required=True), 1.0
    cv = as_control_variate(control_variate)
    check_factor_fn(log_factor_fn, num_states, (2,))
    D, N, b = num_states, num_data, batch_size
    bonus_coef = (1.0 + beta) * (1.0 + math.sqrt(epsilon)) * math.sqrt(2.0 * (1.0 + epsilon))

    def sample(rng_key: PRNGKey, log_f0: Array) -> tuple[Array, RacingInfo]:
        return sample_with_delta(rng_key, log_f0, delta)

    def sample_with_delta(rng_key, log_f0, delta):
        delta = jnp.asarray(delta)
        delta_l = delta / 5.0  # heuristic setting of Jamieson et al. (2014), §5
        log_f0 = jnp.asarray(log_f0)
        if log_f0.shape != (D,) or not jnp.issubdtype(log_f0.dtype, jnp.floating):
            raise ValueError(f"log_f0 must be a float array of shape ({D},); got {log_f0.shape} {log_f0.dtype}")
        dtype = log_f0.dtype
        key_perm, key_gumbel = jax.random.split(rng_key)
        arm_keys = jax.vmap(permutation_round_keys)(jax.random.split(key_perm, D))  # [D, rounds]
        offset = log_f0 + jax.random.gumbel(key_gumbel, (D,), dtype) if gumbel_noise else log_f0
        offset_mean = offset / N
        sigma = jnp.broadcast_to(jnp.asarray(sigma_spec, dtype) * factor, (D,))
        h_mean = None if cv is None else jnp.asarray(cv.mean, dtype)

        def rewards(indices):
            r = jnp.asarray(log_factor_fn(indices))
            if r.shape != (indices.shape[0], D):
                raise ValueError(f"log_factor_fn must return shape [m, {D}]; got {r.shape}")
            r = r.astype(dtype)
            if cv is not None:
                r = r - jnp.asarray(cv.fn(indices)).astype(dtype) + h_mean[None, :]
            return r

        # Initialisation: pull every arm once (a batch of b), one call for all arms.
        pos0 = jnp.arange(b, dtype=jnp.int32)
        idx0 = jax.vmap(lambda k: permutation_indices(k, pos0, N))(arm_keys)  # [D, b]
        r0 = rewards(idx0.reshape(-1)).reshape(D, b, D)
        r0 = jnp.diagonal(r0, axis1=0, axis2=2).T  # [D, b]: arm i's own rewards
        bad0 = jnp.any(jnp.isnan(r0) | (r0 == jnp.inf), axis=1) | jnp.isnan(offset) | (offset == jnp.inf)
        bad0 = bad0 | ~((delta > 0) & (delta < 1))  # a traced delta out of range
        alive0 = (offset > -jnp.inf) & jnp.all(r0 > -jnp.inf, axis=1) & ~bad0
        mean0 = jnp.where(alive0, jnp.mean(jnp.where(alive0[:, None], r0, 0), axis=1), 0).astype(dtype)
        state = _UCBState(
            pulls=jnp.full((D,), b, jnp.int32),
            mean=mean0,
            alive=alive0,
            has_nan=jnp.any(bad0),
            stop=jnp.any(bad0) | (jnp.sum(alive0, dtype=jnp.int32) <= 1),
            winner=jnp.argmax(jnp.where(alive0, offset, -jnp.inf)).astype(jnp.int32),
            steps=jnp.asarray(1, jnp.int32),
        )

        def ucb(s):
            t = s.pulls.astype(dtype)
            loglog = jnp.maximum(jnp.log((1 + epsilon) * t), 1.0)
            bonus = bonus_coef * sigma * jnp.sqrt(jnp.log(loglog / delta_l) / t)
            est = s.mean + offset_mean
            value = jnp.where(s.pulls >= N, est, est + bonus)  # modification 2
            return jnp.where(s.alive, value, -jnp.inf), est

        def check_stop(s):
            bounds, est = ucb(s)
            top = jnp.argmax(bounds).astype(jnp.int32)
            total = jnp.sum(jnp.where(s.alive, s.pulls, 0), dtype=jnp.int32)
            pulls = jnp.where(s.alive, s.pulls, 0)
            lil_stop = pulls.astype(dtype) >= 1 + stopping_ratio * (total - pulls).astype(dtype)
            exact_top = s.pulls[top] >= N  # modification 3
            winner = jnp.where(exact_top, top, jnp.argmax(jnp.where(s.alive, s.pulls, -1)).astype(jnp.int32))
            stop = s.stop | exact_top | jnp.any(lil_stop) | (jnp.sum(s.alive, dtype=jnp.int32) <= 1)
            winner = jnp.where(jnp.sum(s.alive, dtype=jnp.int32) <= 1, jnp.argmax(bounds).astype(jnp.int32), winner)
            return stop, jnp.where(s.stop, s.winner, winner), top

        def body(s):
            _, _, arm = check_stop(s)
            pos = s.pulls[arm] + jnp.arange(b, dtype=jnp.int32)
            valid = pos < N
            idx = permutation_indices(arm_keys[arm], jnp.minimum(pos, N - 1), N)
            r = jnp.take(rewards(idx), arm, axis=1)
            n_new = jnp.sum(valid, dtype=jnp.int32)
            bad = jnp.any(valid & (jnp.isnan(r) | (r == jnp.inf)))
            dead = jnp.any(valid & (r == -jnp.inf))
            batch_mean = jnp.sum(jnp.where(valid, r, 0)) / jnp.maximum(n_new, 1).astype(dtype)
            t_old = s.pulls[arm].astype(dtype)
            new_mean = s.mean[arm] + (batch_mean - s.mean[arm]) * (n_new.astype(dtype) / (t_old + n_new.astype(dtype)))
            alive = s.alive.at[arm].set(s.alive[arm] & ~dead & ~bad)
            s = s._replace(
                pulls=s.pulls.at[arm].add(n_new),
                mean=s.mean.at[arm].set(jnp.where(dead | bad, s.mean[arm], new_mean)),
                alive=alive,
                has_nan=s.has_nan | bad,
                stop=s.stop | bad,
                steps=s.steps + 1,
            )
            stop, winner, _ = check_stop(s)
            return s._replace(stop=stop, winner=winner)

        stop, winner, _ = check_stop(state)
        state = state._replace(stop=stop, winner=winner)
        state = jax.lax.while_loop(lambda s: ~s.stop, body, state)
        num_eval = jnp.sum(state.pulls, dtype=jnp.int32)
        has_nan = state.has_nan | ~jnp.any(state.alive)
        info = RacingInfo(
            num_evaluations=num_eval,
            num_data_used=jnp.max(state.pulls),
            num_stages=state.steps,
            is_exact=jnp.all(state.pulls >= N),
            has_nan=has_nan,
            num_alive=jnp.sum(state.alive, dtype=jnp.int32),
        )
        return flag_invalid(state.winner, has_nan), info

    # Lower-level entry point with a traceable delta (one compiled sampler for many deltas).
    return LilUCBSampler(sample, sample_with_delta)
