"""One race's state and its stage body: read a chunk of data, update the moments, eliminate.

One draw is a ``(RaceState, RaceCtx)`` pair: :func:`init_race` builds it,
:func:`stage_body` advances it by one chunk of ``csize`` indices drawn without replacement
(position ``T`` of a keyed pseudo-random permutation, :func:`jaxsub.subsample.permutation_indices`),
and :func:`finish` reads the decision. At the end of a stage it runs Alg. 1's elimination
(:func:`jaxsub.racing.elimination.eliminate`), or the exact decision at ``t = t*``.

Numerics: with pairwise variances each datum's rewards are centred by their mean over
the surviving arms (differences, hence gaps and pairwise variances, are unchanged);
chunk moments are shifted sums merged with Chan et al.'s parallel update; third moments
(the skewness guard) with Pebay's. A ``-inf`` reward eliminates its arm at once (a zero
factor); NaN / ``+inf`` stop the race at the stage end and set ``has_nan``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.racing.compaction import alive_first
from jaxsub.racing.elimination import eliminate, estimates
from jaxsub.racing.info import RacingInfo, beta_is_bad, flag_invalid
from jaxsub.subsample import NUM_ROUNDS, permutation_indices, permutation_round_keys
from jaxsub.types import Array

__all__ = [
    "RaceCtx",
    "RaceState",
    "finish",
    "first_stage",
    "has_first_stage",
    "init_race",
    "call_model",
    "rewards",
    "rewards_states",
    "stage_body",
]


class RaceState(NamedTuple):
    """The running statistics of one race (the loops' carry)."""

    count: Array  # int32: indices drawn so far (T)
    mean_d: Array  # [D] running means (of per-datum centred rewards when pairwise)
    m2: Array  # [D, D] co-moments (pairwise) or [D] second central moments (marginal)
    alive: Array  # [D] bool
    done: Array  # bool
    has_nan: Array  # bool
    num_evaluations: Array  # int32
    stage: Array  # int32, index of the current stage (0-based)
    exact_pass: Array  # bool: finishing with the contiguous exact pass (``exact_pass_cost``)
    pass_comp: Array  # [D] Kahan compensation of the exact pass's sums
    m3: Array  # [D] third central moments of each arm's (centred) rewards (skewness guard)


class RaceCtx(NamedTuple):
    """Per-draw constants of a race (the stage body's second argument)."""

    round_keys: Array  # uint32 keys of the Feistel permutation
    offset_mean: Array  # [D] (log f0 + Gumbel noise) / N
    h_mean: Array | None  # [D] control-variate mean
    crange: Array | None  # [D] reward ranges C_i (EBS)
    coef_a: Array | None  # per-stage threshold coefficients a_t
    coef_b: Array | None  # per-stage b_t
    params: object  # per-draw parameters of log_factor_fn (racing_batch), or None


def is_round_keys(rng_key) -> bool:
    """Whether ``rng_key`` is an array of the permutation's ``NUM_ROUNDS`` uint32 round keys
    (:func:`jaxsub.subsample.permutation_round_keys`) rather than a PRNG key (a raw legacy key is
    ``uint32[2]``, a typed key has a key dtype)."""
    arr = jnp.asarray(rng_key) if not isinstance(rng_key, jax.Array) else rng_key
    return jnp.issubdtype(arr.dtype, jnp.uint32) and jnp.shape(arr) == (NUM_ROUNDS,)


def init_race(cfg, rng_key, log_f0, params, coef_a, coef_b, beta=None) -> tuple[RaceState, RaceCtx]:
    """The state and constants of a race before its first chunk (``beta``: inverse temperature)."""
    D, N, model = cfg.num_states, cfg.num_data, cfg.model
    cv, gumbel_noise, pairwise, can_eliminate = model.control_variate, cfg.gumbel_noise, cfg.pairwise, cfg.can_eliminate
    log_f0 = jnp.asarray(log_f0)
    if log_f0.shape != (D,) or not jnp.issubdtype(log_f0.dtype, jnp.floating):
        raise ValueError(f"log_f0 must be a float array of shape ({D},); got {log_f0.shape} {log_f0.dtype}")
    dtype = log_f0.dtype
    if is_round_keys(rng_key):
        # The caller drew the permutation's round keys itself (e.g. racing MH's batched kernel,
        # which draws a step's randomness with one threefry call): no key split, no Gumbel noise.
        if gumbel_noise:
            raise ValueError("rng_key: uint32 permutation round keys are accepted only with gumbel_noise=False")
        round_keys = jnp.asarray(rng_key, jnp.uint32)
        key_gumbel = None
    else:
        key_perm, key_gumbel = jax.random.split(rng_key)
        round_keys = permutation_round_keys(key_perm)
    offset = log_f0
    if gumbel_noise:
        noise = jax.random.gumbel(key_gumbel, (D,), dtype)
        if beta is not None:
            # p^beta: argmax_i beta S_i + eps_i = argmax_i S_i + eps_i / beta (beta > 0).
            noise = noise / jnp.asarray(beta, dtype)
        offset = offset + noise
    # Per-datum share of log f0 + eps (eq. 3); the gap is compared on the mean scale.
    offset_mean = offset / N
    alive0 = offset > -jnp.inf  # False for -inf and NaN
    bad0 = jnp.any(jnp.isnan(offset) | (offset == jnp.inf)) | beta_is_bad(beta)
    if cv is None:
        h_mean = None
    else:
        h_mean = jnp.asarray(model.h_mean_fn(params) if model.h_mean_fn is not None else cv.mean).astype(dtype)
        if h_mean.shape != (D,):
            raise ValueError(f"control_variate mean must have shape ({D},); got {h_mean.shape}")
    crange = None if model.reward_range is None else jnp.broadcast_to(jnp.asarray(model.reward_range, dtype), (D,))
    m2_shape = (D, D) if pairwise else (D,)
    state = RaceState(
        count=jnp.zeros((), jnp.int32),
        mean_d=jnp.zeros((D,), dtype),
        m2=jnp.zeros(m2_shape, dtype),
        alive=alive0,
        done=bad0 | (jnp.sum(alive0, dtype=jnp.int32) <= 1),
        has_nan=bad0,
        num_evaluations=jnp.zeros((), jnp.int32),
        stage=jnp.zeros((), jnp.int32),
        exact_pass=jnp.zeros((), bool),
        pass_comp=jnp.zeros((D,), dtype),
        m3=jnp.zeros((D,), dtype),
    )
    ctx = RaceCtx(
        round_keys=round_keys,
        offset_mean=offset_mean,
        h_mean=h_mean,
        crange=crange,
        coef_a=jnp.asarray(coef_a).astype(dtype) if can_eliminate else None,
        coef_b=jnp.asarray(coef_b).astype(dtype) if can_eliminate else None,
        params=params,
    )
    return state, ctx


def call_model(cfg, fn, indices, *args_and_params):
    """``fn(indices, *args, params)`` when the model takes per-draw params, else ``fn(indices, *args)``."""
    *args, params = args_and_params
    return fn(indices, *args, params) if cfg.with_params else fn(indices, *args)


def rewards(cfg, indices: Array, c: RaceCtx, dtype) -> Array:
    """``[m, D]`` rewards of all arms for the data ``indices`` (after the control variate)."""
    D, model = cfg.num_states, cfg.model
    cv = model.control_variate
    r = jnp.asarray(call_model(cfg, model.log_factor_fn, indices, c.params))
    if r.shape != (indices.shape[0], D):
        raise ValueError(f"log_factor_fn must return shape [m, {D}]; got {r.shape} for m={indices.shape[0]}")
    r = r.astype(dtype)
    if cv is not None:
        h = jnp.asarray(call_model(cfg, cv.fn, indices, c.params)).astype(dtype)
        r = r - h + c.h_mean[None, :]
    return r


def rewards_states(cfg, indices: Array, arms: Array, c: RaceCtx, dtype) -> Array:
    """``[m, k]`` rewards of the arms ``arms`` only (``log_factor_states_fn``, or a column gather)."""
    model = cfg.model
    cv = model.control_variate
    if model.log_factor_states_fn is None:  # column compaction only
        return rewards(cfg, indices, c, dtype)[:, arms]
    r = jnp.asarray(call_model(cfg, model.log_factor_states_fn, indices, arms, c.params))
    if r.shape != (indices.shape[0], arms.shape[0]):
        raise ValueError(f"log_factor_states_fn must return shape [m, {arms.shape[0]}]; got {r.shape}")
    r = r.astype(dtype)
    if cv is not None:  # the control variate is evaluated for all D states, then gathered
        r = r - jnp.asarray(call_model(cfg, cv.fn, indices, c.params)).astype(dtype)[:, arms] + c.h_mean[arms][None, :]
    return r


def stage_body(cfg, csize: int, k: int | None, s: RaceState, c: RaceCtx) -> RaceState:
    """One chunk of ``csize`` indices. ``k`` (a compaction level): only the first
    ``k`` surviving arms (all of them, since the loop runs when ``n_alive <= k``)
    are evaluated, through ``log_factor_states_fn``; statistics live in the
    full [D] arrays. ``k = None``: all D columns."""
    D, N, num_stages = cfg.num_states, cfg.num_data, cfg.num_stages
    pairwise, use_skew, can_eliminate, switch_stage = cfg.pairwise, cfg.use_skew, cfg.can_eliminate, cfg.switch_stage
    compact = k is not None
    dtype = s.mean_d.dtype
    stop = jnp.asarray(np.asarray(cfg.stage_ends, np.int32))[s.stage]
    pos = s.count + jnp.arange(csize, dtype=jnp.int32)
    valid = pos < stop
    indices = permutation_indices(c.round_keys, jnp.minimum(pos, N - 1), N)
    if compact:
        arms = alive_first(s.alive, k)  # alive arms first
        r = rewards_states(cfg, indices, arms, c, dtype)
        alive_c = s.alive[arms]
        mean_c = s.mean_d[arms]
    else:
        r = rewards(cfg, indices, c, dtype)
        alive_c = s.alive
        mean_c = s.mean_d
    # Work on the transpose [k, m]: the long data axis is then the minor one,
    # which XLA's CPU loops vectorise (measured 1.4-4x faster per datum than
    # the [m, k] layout for k = 10 .. 2).
    rt = r.T
    vmask = valid[None, :]
    neg = rt == -jnp.inf
    # A zero factor (log f_n(i) = -inf) gives state i probability 0.
    dead_c = jnp.any(neg & vmask, axis=1) & alive_c
    n_new = jnp.sum(valid, dtype=jnp.int32)
    num_eval = s.num_evaluations + n_new * jnp.sum(s.alive, dtype=jnp.int32)
    alive_c = alive_c & ~dead_c
    keep = vmask & alive_c[:, None] & ~neg
    rz = jnp.where(keep, rt, jnp.zeros((), dtype))
    if pairwise:
        # Centre each datum by its mean over the surviving arms: differences
        # l_i - l_j (hence gaps and pairwise variances) are unchanged.
        n_alive = jnp.maximum(jnp.sum(alive_c.astype(dtype)), 1)
        rz = rz - jnp.sum(rz, axis=0, keepdims=True) / n_alive
    # Shifted sums ("shifted data" algorithm): shift = running mean, or the
    # first datum of the first chunk, so the chunk moments stay small.
    shift = jnp.where(s.count > 0, mean_c, rz[:, 0])
    dz = jnp.where(vmask, rz - shift[:, None], jnp.zeros((), dtype))
    nb = n_new.astype(dtype)
    a = jnp.sum(dz, axis=1) / jnp.maximum(nb, 1)
    na = s.count.astype(dtype)
    n = jnp.maximum(na + nb, 1)
    dd = shift + a - mean_c
    new_mean_c = mean_c + dd * (nb / n)  # Chan et al. merge
    if pairwise:
        dm2 = (dz @ dz.T - nb * jnp.outer(a, a)) + jnp.outer(dd, dd) * (na * nb / n)
    else:
        dm2 = (jnp.sum(dz * dz, axis=1) - nb * a * a) + dd * dd * (na * nb / n)
    m3 = s.m3
    if use_skew:
        # Third central moments per arm, merged like the second (Pebay 2008).
        s2 = jnp.sum(dz * dz, axis=1)
        s3 = jnp.sum(dz * dz * dz, axis=1)
        m2_old = jnp.diagonal(s.m2) if pairwise else s.m2
        m2a = m2_old[arms] if compact else m2_old
        m2b = s2 - nb * a * a
        m3b = s3 - 3 * a * s2 + 2 * nb * a**3
        dm3 = m3b + dd**3 * (na * nb * (na - nb) / (n * n)) + 3 * dd * (na * m2b - nb * m2a) / n
        m3 = s.m3.at[arms].add(dm3) if compact else s.m3 + dm3
    if compact:
        mean_d = s.mean_d.at[arms].set(new_mean_c)
        m2 = s.m2.at[arms[:, None], arms[None, :]].add(dm2) if pairwise else s.m2.at[arms].add(dm2)
        alive = s.alive & ~jnp.zeros((D,), bool).at[arms].set(dead_c)
    else:
        mean_d, m2, alive = new_mean_c, s.m2 + dm2, alive_c
    count = s.count + n_new

    # End of a stage: NaN / +inf check (they poison the running sums),
    # then elimination (stages t < t*) or the exact decision (t = t*).
    at_end = count >= stop
    is_final = s.stage == num_stages - 1
    m2_diag = jnp.diagonal(m2) if pairwise else m2
    bad = at_end & jnp.any(alive & ~(jnp.isfinite(mean_d) & jnp.isfinite(m2_diag)))
    if can_eliminate:
        stage_c = jnp.minimum(s.stage, num_stages - 2)
        kept = eliminate(cfg, mean_d, m2, alive, stage_c, count, c, m3)
        alive = jnp.where(at_end & ~is_final & ~bad, kept, alive)
    done = s.done | bad | (jnp.sum(alive, dtype=jnp.int32) <= 1) | (at_end & is_final)
    exact_pass = s.exact_pass
    if switch_stage is not None:
        # Entering ``switch_stage`` still running: take the exact pass when it keeps the
        # count within N D (see ``exact_pass_cost``): restart the sums at T = 0; the race
        # loops (``~exact_pass`` in their conditions) then leave this draw to the pass loop.
        take = (
            at_end & ~done & (s.stage == switch_stage - 1) & (jnp.sum(alive, dtype=jnp.int32) * N <= N * D - num_eval)
        )
        count = jnp.where(take, 0, count).astype(jnp.int32)
        mean_d = jnp.where(take, jnp.zeros_like(mean_d), mean_d)  # the pass's running sums
        exact_pass = take
    return s._replace(
        count=count,
        mean_d=mean_d,
        m2=m2,
        m3=m3,
        alive=alive,
        done=done,
        has_nan=s.has_nan | bad,
        num_evaluations=num_eval,
        stage=s.stage + (at_end & ~done).astype(jnp.int32),
        exact_pass=exact_pass,
    )


def has_first_stage(cfg) -> bool:
    """Whether :func:`first_stage` applies: elimination on, more than one stage, and no exact
    pass taken at the end of the first stage (otherwise the generic stage body runs)."""
    return cfg.can_eliminate and cfg.num_stages > 1 and (cfg.switch_stage is None or cfg.switch_stage > 1)


def first_stage(cfg, states: RaceState, ctxs: RaceCtx) -> RaceState:
    """The first stage of B races at once, as straight-line code (states and ctxs with leading axis B).

    Every race starts at ``T = 0`` and reads the same number ``m_1`` of data, so the first
    stage needs no loop: indices ``pi_b(0..m_1-1)`` of each race's permutation, the ``[B, m_1, D]``
    rewards (the model's functions, ``vmap``-ed over the races), the moments and Alg. 1's
    elimination, all as batched array code. It computes what :func:`stage_body` computes at
    ``T = 0`` (the running-sum merge then reduces to the chunk's own moments: ``mean = shift + a``,
    ``M2 = dz^T dz - m a a^T``, ``M3 = S3 - 3 a S2 + 2 m a^3``), with the sums over the chunk
    written as element-wise products reduced along the data axis (one fused kernel each) instead
    of per-race matrix products, so results agree with the stage body up to float rounding.
    Races with ``done`` set (decided at initialisation) keep their state. Requires
    :func:`has_first_stage`.
    """
    D, N = cfg.num_states, cfg.num_data
    pairwise, use_skew = cfg.pairwise, cfg.use_skew
    m = int(cfg.stage_ends[0])
    dtype = states.mean_d.dtype
    pos = jnp.arange(m, dtype=jnp.int32)
    indices = jax.vmap(lambda rk: permutation_indices(rk, pos, N))(ctxs.round_keys)  # [B, m]
    r = jax.vmap(lambda idx, c: rewards(cfg, idx, c, dtype))(indices, ctxs)  # [B, m, D]
    rt = jnp.swapaxes(r, 1, 2)  # [B, D, m]: the data axis minor
    alive0 = states.alive
    neg = rt == -jnp.inf
    dead = jnp.any(neg, axis=2) & alive0
    num_eval = states.num_evaluations + m * jnp.sum(alive0, axis=1, dtype=jnp.int32)
    alive_c = alive0 & ~dead
    rz = jnp.where(alive_c[:, :, None] & ~neg, rt, jnp.zeros((), dtype))
    if pairwise:
        n_alive = jnp.maximum(jnp.sum(alive_c.astype(dtype), axis=1), 1)
        rz = rz - jnp.sum(rz, axis=1, keepdims=True) / n_alive[:, None, None]
    shift = rz[:, :, 0]
    dz = rz - shift[:, :, None]
    nb = jnp.asarray(m, dtype)
    a = jnp.sum(dz, axis=2) / nb
    mean_d = shift + a
    if pairwise:
        if D <= 16:  # products reduced along the data axis: one fused kernel for small D
            cross = jnp.sum(dz[:, :, None, :] * dz[:, None, :, :], axis=3)
        else:
            cross = jnp.einsum("bim,bjm->bij", dz, dz)
        m2 = cross - nb * a[:, :, None] * a[:, None, :]
        m2_diag = jnp.diagonal(m2, axis1=1, axis2=2)
    else:
        m2 = jnp.sum(dz * dz, axis=2) - nb * a * a
        m2_diag = m2
    m3 = states.m3
    if use_skew:
        s2 = jnp.sum(dz * dz, axis=2)
        s3 = jnp.sum(dz * dz * dz, axis=2)
        m3 = s3 - 3 * a * s2 + 2 * nb * a**3
    count = jnp.full_like(states.count, m)
    bad = jnp.any(alive_c & ~(jnp.isfinite(mean_d) & jnp.isfinite(m2_diag)), axis=1)
    kept = jax.vmap(lambda mu, mm, al, cc, c, m3_: eliminate(cfg, mu, mm, al, jnp.zeros((), jnp.int32), cc, c, m3_))(
        mean_d, m2, alive_c, count, ctxs, m3
    )
    alive = jnp.where(bad[:, None], alive_c, kept)
    done = states.done | bad | (jnp.sum(alive, axis=1, dtype=jnp.int32) <= 1)
    new = states._replace(
        count=count,
        mean_d=mean_d,
        m2=m2,
        m3=m3,
        alive=alive,
        done=done,
        has_nan=states.has_nan | bad,
        num_evaluations=num_eval,
        stage=states.stage + (~done).astype(jnp.int32),
    )
    run = ~states.done
    return jax.tree.map(lambda n, o: jnp.where(run.reshape(run.shape + (1,) * (n.ndim - 1)), n, o), new, states)


def finish(cfg, state: RaceState, c: RaceCtx) -> tuple[Array, RacingInfo]:
    """The decision ``argmax_i mu_i`` over the survivors and the :class:`RacingInfo` (rows, not blocks)."""
    D, N, block_size, num_rows = cfg.num_states, cfg.num_data, cfg.block_size, cfg.num_rows
    no_state = ~jnp.any(state.alive)
    x = flag_invalid(jnp.argmax(estimates(state.mean_d, state.alive, c)), state.has_nan | no_state)
    num_evaluations, num_used = state.num_evaluations, state.count
    if block_size > 1:  # counts in rows: blocks x B, capped at N (and N D)
        num_used = jnp.minimum(num_used * block_size, num_rows).astype(jnp.int32)
        num_evaluations = jnp.minimum(num_evaluations * block_size, num_rows * D).astype(jnp.int32)
    info = RacingInfo(
        num_evaluations=num_evaluations,
        num_data_used=num_used,
        num_stages=jnp.where(state.count > 0, state.stage + 1, 0).astype(jnp.int32),
        is_exact=state.count == N,
        has_nan=state.has_nan | no_state,
        num_alive=jnp.sum(state.alive, dtype=jnp.int32),
    )
    return x, info
