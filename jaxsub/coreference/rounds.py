"""Batched rounds: the updates of mentions of different blocks of a class, decided together.

:func:`class_lanes` deals a class's blocks to ``B`` lanes; :func:`batched_round` decides one
round (one mention per lane) from the same state and applies the moves
(:func:`~jaxsub.coreference.moves.move_batched`). The races go through
:func:`jaxsub.discrete.racing_batch` with the rewards of :mod:`jaxsub.coreference.rewards`.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.coreference.model import Blocks
from jaxsub.coreference.moves import move_batched
from jaxsub.coreference.options import ClassConfig, race_costs, race_pays
from jaxsub.coreference.rewards import (
    Model,
    RaceArms,
    control_variate_mean,
    control_variate_rewards,
    first_member_control_variate,
    member_at,
    padded_rewards,
    row,
)
from jaxsub.coreference.state import SweepInfo, view
from jaxsub.discrete import racing_batch
from jaxsub.validation import check_int

__all__ = ["Lanes", "batched_round", "class_lanes", "round_lanes"]


def class_lanes(blocks: Blocks, positions, batch_size: int) -> np.ndarray:
    """``[R, B]`` sorted positions (``-1`` = no update): round ``r`` updates ``lanes[r]`` together.

    Each lane (column) is a concatenation of whole blocks of the class, each block's positions in
    increasing order; blocks are dealt to ``B = min(batch_size, number of blocks)`` lanes largest
    first, each to the currently shortest lane (so ``R`` ≈ class size / B). A round therefore never
    holds two mentions of one block, and within a block the visiting order is the sequential sweep's.

    Parameters
    ----------
    blocks
        :class:`~jaxsub.coreference.Blocks`.
    positions
        Sorted positions of one class (:func:`~jaxsub.coreference.mention_classes`).
    batch_size
        B >= 1, the most lanes.

    Returns
    -------
    numpy.ndarray
        ``[R, B]`` int32.

    Raises
    ------
    ValueError
        ``batch_size < 1``.
    """
    batch_size = check_int("batch_size", batch_size, low=1)
    positions = np.asarray(positions)
    if positions.size == 0:
        return np.zeros((0, 1), np.int32)
    starts = blocks.start[positions]
    groups = [positions[starts == s0] for s0 in np.unique(starts)]
    groups.sort(key=lambda g: -g.size)
    b = max(1, min(int(batch_size), len(groups)))
    lanes = [[] for _ in range(b)]
    for g in groups:
        min(lanes, key=len).extend(g.tolist())
    out = np.full((max(len(lane) for lane in lanes), b), -1, np.int32)
    for c, lane in enumerate(lanes):
        out[: len(lane), c] = lane
    return out


class Lanes(NamedTuple):
    """The per-lane values of one round (arrays with leading axis ``B``), read before any move.

    Attributes mirror :class:`~jaxsub.coreference.update.Update` (``valid``: the lane has an update;
    ``col_w``: each window slot's column; ``skip_i``: ``i``'s slot in the window).
    """

    state: object
    valid: jax.Array
    i: jax.Array
    s: jax.Array
    n: jax.Array
    K: jax.Array
    a: jax.Array
    col_a: jax.Array
    nact: jax.Array
    ncols: jax.Array
    skip: jax.Array
    mem_w: jax.Array
    col_w: jax.Array
    skip_i: jax.Array
    k_noise: jax.Array
    k_race: jax.Array


def _lane_keys(key, q):
    return jax.random.split(jax.random.fold_in(key, q))


def round_lanes(cfg: ClassConfig, blocks_dev, packed, key, ps) -> Lanes:
    """The :class:`Lanes` of the round ``ps [B]`` (per-position keys: the sequential sweep's noise)."""
    order, start_arr, size_arr = blocks_dev
    state = view(packed)
    last_slot = state.labels.shape[0] - 1
    valid = ps >= 0
    p = jnp.maximum(ps, 0)
    keys = jax.vmap(partial(_lane_keys, key))(p)
    i, s, n = order[p], start_arr[p], size_arr[p]
    a = state.labels[i]
    nact = state.num_active[s]
    a_empty = state.sizes[a] == 1
    col_a = state.active_pos[a] - s
    mp_i = state.member_pos[i]
    skip = mp_i - state.seg_start[s + col_a]
    mem_w = state.members[jnp.clip(s[:, None] + jnp.arange(cfg.width, dtype=jnp.int32)[None, :], 0, last_slot)]
    col_w = state.active_pos[state.labels[mem_w]] - s[:, None]
    return Lanes(
        state,
        valid,
        i,
        s,
        n,
        jnp.where(valid, n - 1, 0),
        a,
        col_a,
        nact,
        nact + (~a_empty).astype(jnp.int32),
        skip,
        mem_w,
        col_w,
        mp_i - s,
        keys[:, 0],
        keys[:, 1],
    )


def _pair_factors(model: Model, lanes: Lanes, lane, js):
    """``β f(x_i, x_j)`` of lane ``lane[f]``'s mention and ``js[f]`` (flat pairs)."""
    xi = row(model.mentions, lanes.i[lane])
    return model.beta * jax.vmap(model.pairwise_log_factor)(xi, row(model.mentions, js))


def _flat_sums(cfg: ClassConfig, model: Model, lanes: Lanes, counts, member_fn, num_cols: int):
    """Σ β f(x_i, x_j) per (lane, column) over ``counts[b]`` members of each lane, in flat chunks."""
    chunk = cfg.options.chunk_size
    B = counts.shape[0]
    cum = jnp.cumsum(counts)
    total = cum[-1]
    nchunks = (total + chunk - 1) // chunk

    def body(c_):
        c, sums, bad = c_
        f = c * chunk + jnp.arange(chunk, dtype=jnp.int32)
        ok = f < total
        lane = jnp.minimum(jnp.searchsorted(cum, f, side="right"), B - 1).astype(jnp.int32)
        k = f - (cum[lane] - counts[lane])
        js, cols = member_fn(lane, k)
        val = jnp.where(ok, _pair_factors(model, lanes, lane, js), 0.0)
        nonfinite = ok & ~jnp.isfinite(val) & ~(val == -jnp.inf)
        bad = bad.at[lane].max(nonfinite)
        sums = sums.at[jnp.where(ok, lane, B), cols].add(val, mode="drop")
        return c + 1, sums, bad

    init_c = (jnp.zeros((), jnp.int32), jnp.zeros((B, num_cols), jnp.float32), jnp.zeros((B,), bool))
    _, sums, bad = jax.lax.while_loop(lambda c_: c_[0] < nchunks, body, init_c)
    return sums, bad


def _block_member(lanes: Lanes, lane, k):
    r = jnp.clip(k + (k >= lanes.skip_i[lane]).astype(jnp.int32), 0, lanes.mem_w.shape[1] - 1)
    return lanes.mem_w[lane, r], lanes.col_w[lane, r]


def _member_one(arms: RaceArms, k):
    js, c = member_at(arms, k[None])
    return js[0], c[0]


def _small_or_block_member(lanes: Lanes, small: RaceArms, use_race, lane, k):
    """Racing lanes: the ``k``-th member of their small arms; exact lanes: the ``k``-th block member."""
    je, ce = _block_member(lanes, lane, k)
    js, cs = jax.vmap(_member_one)(jax.tree.map(lambda v: v[lane], small), k)
    r = use_race[lane]
    return jnp.where(r, js, je), jnp.where(r, cs, ce)


class RoundArms(NamedTuple):
    """The race columns of every lane (``[B, D]``) and the round's race / exact choice."""

    large: jax.Array
    n_c: jax.Array
    g_c: jax.Array
    n_large: jax.Array
    n_small: jax.Array
    cum_large: jax.Array
    cum_small: jax.Array
    k_large: jax.Array
    k_small: jax.Array
    use_race: jax.Array
    width: jax.Array


def _round_arms(cfg: ClassConfig, lanes: Lanes, exact) -> RoundArms:
    o = cfg.options
    m1, D = o.first_batch_size, cfg.d_cap
    state = lanes.state
    ar_d = jnp.arange(D, dtype=jnp.int32)
    slots = jnp.clip(lanes.s[:, None] + ar_d[None, :], 0, state.labels.shape[0] - 1)
    n_c = jnp.where(ar_d[None, :] < lanes.nact[:, None], state.sizes[state.active[slots]], 0) - (
        ar_d[None, :] == lanes.col_a[:, None]
    ).astype(jnp.int32)
    g_c = state.seg_start[slots] - lanes.s[:, None]
    large = n_c > 0
    if o.min_arm_draws > 0:
        large = (
            large
            & (n_c >= m1)
            & (n_c.astype(jnp.float32) * m1 >= o.min_arm_draws * lanes.K[:, None].astype(jnp.float32))
        )
    n_large = jnp.where(large, n_c, 0)
    n_small = jnp.where(large, 0, n_c)
    cum_large = jnp.cumsum(n_large, axis=1)
    cum_small = jnp.cumsum(n_small, axis=1)
    k_large, k_small = cum_large[:, -1], cum_small[:, -1]
    use_race = lanes.valid & (lanes.ncols <= D) & (k_large >= 2 * m1)
    if not isinstance(exact, bool):
        use_race = use_race & ~exact
    width = jnp.sum(lanes.ncols[:, None] > jnp.asarray(cfg.widths[:-1], jnp.int32)[None, :], axis=1, dtype=jnp.int32)
    if o.race_cost > 0:
        use_race = use_race & race_pays(
            lanes.K, k_small, jnp.sum(large, axis=1, dtype=jnp.int32), race_costs(o.race_cost, cfg.widths), width, m1
        )
    return RoundArms(large, n_c, g_c, n_large, n_small, cum_large, cum_small, k_large, k_small, use_race, width)


def _lane_arms(model: Model, lanes: Lanes, ra: RoundArms, cum, count, h, h_mean) -> RaceArms:
    D = cum.shape[1]
    col = jnp.broadcast_to(jnp.arange(D, dtype=jnp.int32)[None, :], cum.shape)
    return RaceArms(
        row(model.mentions, lanes.i),
        lanes.mem_w,
        ra.g_c,
        col,
        lanes.col_a,
        lanes.skip,
        cum,
        count,
        jnp.maximum(ra.k_large, 1),
        h,
        h_mean,
    )


def _gumbels(k_noise, width: int):
    return jax.vmap(partial(jax.random.gumbel, shape=(width,)))(k_noise)


def _round_races(cfg: ClassConfig, model: Model, lanes: Lanes, ra: RoundArms, arms: RaceArms, sums):
    """The races of the round, one :func:`~jaxsub.discrete.racing_batch` call per width (lanes of other
    widths get one live arm, done at once). Returns ``(x [B], used [B], bad [B])``."""
    o = cfg.options
    N = cfg.n_cap
    B = lanes.i.shape[0]
    x_race = jnp.zeros((B,), jnp.int32)
    used = jnp.zeros((B,), jnp.int32)
    bad_race = jnp.zeros((B,), bool)
    cv = (partial(control_variate_rewards, num_data=N), control_variate_mean) if o.control_variate else None
    for wi, dw in enumerate(cfg.widths):
        ar = jnp.arange(dw, dtype=jnp.int32)
        sampler = racing_batch(
            partial(padded_rewards, model=model, num_data=N),
            dw,
            N,
            delta=o.delta,
            first_batch_size=o.first_batch_size,
            bound="normal",
            variance="marginal",
            control_variate=cv,
            gumbel_noise=False,
            exact_pass_cost=None,
            skew_guard=None,
            schedule=o.race_schedule,
        )
        mine = ra.use_race & (ra.width == wi)
        live = jnp.where(ar[None, :] < lanes.ncols[:, None], sums[:, :dw], -jnp.inf) + _gumbels(lanes.k_noise, dw)
        trivial = jnp.where(ar == 0, 0.0, -jnp.inf)[None, :]
        log_f0s = jnp.where(mine[:, None], live, trivial)
        sliced = arms._replace(
            seg=arms.seg[:, :dw],
            col=arms.col[:, :dw],
            cum=arms.cum[:, :dw],
            count=arms.count[:, :dw],
            h=arms.h[:, :dw],
            h_mean=arms.h_mean[:, :dw],
        )
        xw, rinfo = sampler(lanes.k_race, log_f0s, sliced)
        x_race = jnp.where(mine, xw, x_race)
        used = jnp.where(mine, rinfo.num_data_used, used)
        bad_race = jnp.where(mine, rinfo.has_nan, bad_race)
    return x_race, used, bad_race


def _round_check(cfg: ClassConfig, model: Model, lanes: Lanes, ra: RoundArms, check, x_race, bad_any):
    """``(errors [B], checked [B])``: each race's decision against the exact one under the same noise."""
    cnt_chk = jnp.where(ra.use_race & jnp.asarray(check), lanes.K, 0)
    chk_sums, bad_chk = _flat_sums(cfg, model, lanes, cnt_chk, partial(_block_member, lanes), cfg.d_cap)
    errs = jnp.zeros_like(x_race)
    for wi, dw in enumerate(cfg.widths):
        ar = jnp.arange(dw, dtype=jnp.int32)
        xe = jnp.argmax(
            jnp.where(ar[None, :] < lanes.ncols[:, None], chk_sums[:, :dw], -jnp.inf) + _gumbels(lanes.k_noise, dw),
            axis=1,
        ).astype(jnp.int32)
        errs = jnp.where(ra.width == wi, (xe != x_race).astype(jnp.int32), errs)
    ok = ra.use_race & jnp.asarray(check) & ~bad_any & ~bad_chk
    return jnp.where(ok, errs, 0), ok.astype(jnp.int32)


def batched_round(cfg: ClassConfig, blocks_dev, model: Model, exact, check, carry, ps):
    """One *round*: the updates of ``B`` mentions of ``B`` different blocks of a class, decided together.

    Mentions of different blocks have disjoint candidate clusters and factors, so their Gibbs updates
    commute: deciding them from the same state and then applying the moves is the systematic-scan
    sweep in another (equally valid) order, and each decision is exactly the sequential update's
    (:func:`~jaxsub.coreference.step.sequential_step`, same per-position keys). Per round: the candidates of every lane (one
    vectorised gather); all exact sums (exact lanes: their ``K`` members; racing lanes: their small
    arms) in one loop over a flat list of (lane, member) pairs, in chunks of ``chunk_size`` (work =
    the evaluations, not ``B`` times the largest); the races through
    :func:`jaxsub.discrete.racing_batch` (one call per race width, lanes of other widths given one
    live arm so they are done at once; the engine advances only unfinished races); then the ``B``
    moves one after another (O(D) each). The engine's fixed cost is paid once per round instead of
    once per race.

    Returns ``((packed, key), SweepInfo)``; ``ps [B]`` sorted positions, ``-1`` for no update.
    """
    packed, key = carry
    lanes = round_lanes(cfg, blocks_dev, packed, key, ps)
    B, W = ps.shape[0], cfg.width
    ar_w = jnp.arange(W, dtype=jnp.int32)
    racing = cfg.race and not (isinstance(exact, bool) and exact)
    if racing:
        ra = _round_arms(cfg, lanes, exact)
        small = _lane_arms(model, lanes, ra, ra.cum_small, ra.n_small, None, None)
        # exact lanes: all K members; racing lanes: the members of their small arms (one flat loop)
        sums, bad_sum = _flat_sums(
            cfg,
            model,
            lanes,
            jnp.where(ra.use_race, ra.k_small, lanes.K),
            partial(_small_or_block_member, lanes, small._replace(xi=None), ra.use_race),
            W,
        )
    else:
        sums, bad_sum = _flat_sums(cfg, model, lanes, lanes.K, partial(_block_member, lanes), W)
    # exact decisions (every lane; racing lanes overwrite theirs below)
    logits = jnp.where(ar_w[None, :] < lanes.ncols[:, None], sums, -jnp.inf) + _gumbels(lanes.k_noise, W)
    x = jnp.argmax(logits, axis=1).astype(jnp.int32)
    bad = bad_sum | ~jnp.isfinite(jnp.take_along_axis(logits, x[:, None], axis=1)[:, 0])
    evals = lanes.K
    num_races = errors = checked = jnp.zeros((B,), jnp.int32)
    if racing:
        num_cv = jnp.zeros((B,), jnp.int32)
        h = jnp.zeros((B, cfg.d_cap), jnp.float32)
        arms = _lane_arms(model, lanes, ra, ra.cum_large, ra.n_large, h, h)
        if cfg.options.control_variate:  # the raced lanes' first-member control variates
            h, num_cv = jax.vmap(partial(first_member_control_variate, model, max_large=cfg.max_large))(
                arms, ra.large & ra.use_race[:, None], lanes.ncols
            )
        arms = arms._replace(h=h, h_mean=h * ra.n_c.astype(jnp.float32) / cfg.n_cap)
        x_race, used, bad_race = _round_races(cfg, model, lanes, ra, arms, sums)
        if check is not False:
            errors, checked = _round_check(cfg, model, lanes, ra, check, x_race, bad_race | bad_sum)
        x = jnp.where(ra.use_race, x_race, x)
        bad = jnp.where(ra.use_race, bad_race | bad_sum, bad)
        evals = jnp.where(ra.use_race, used + ra.k_small + num_cv, lanes.K)
        num_races = ra.use_race.astype(jnp.int32)
    new = jnp.where(bad, lanes.a, lanes.state.active[jnp.clip(lanes.s + x, 0, lanes.state.labels.shape[0] - 1)])
    v32 = lanes.valid.astype(jnp.int32)
    infos = SweepInfo(
        evals * v32, num_races * v32, (1 - num_races) * v32, bad.astype(jnp.int32) * v32, errors * v32, checked * v32
    )
    info = jax.tree.map(lambda t: jnp.sum(t, dtype=jnp.int32), infos)
    # the B moves (disjoint rows) written together, chunk by chunk
    packed, info = move_batched(
        packed, lanes.i, lanes.a, new, lanes.s, lanes.n, cfg.move_chunk, lanes.valid & (new != lanes.a), info
    )
    return (packed, key), info
