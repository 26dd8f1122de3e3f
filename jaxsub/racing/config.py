"""The static configuration of a race: every setting validated once, at construction.

:func:`build_config` turns the keyword arguments of :func:`jaxsub.racing.racing` /
:func:`jaxsub.racing.racing_batch` into a :class:`RaceConfig` (a ``NamedTuple`` of Python
values and the model's functions, :class:`RaceModel`); the engine's pieces (stage body,
elimination, compaction, exact pass, batching) are pure functions of it.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from jaxsub.racing.bounds import doubling_schedule, racing_coefficients, stage_sd
from jaxsub.racing.compaction import COLUMN_COMPACT_MIN_D, compaction_levels
from jaxsub.racing.control_variates import ControlVariate, as_control_variate
from jaxsub.racing.exact_pass import switch_stage_of
from jaxsub.racing.info import check_reward_range, check_sizes
from jaxsub.racing.populations import blocked, scale_range
from jaxsub.validation import check_choice, check_int, check_real

__all__ = [
    "DEFAULT_EXACT_PASS_COST",
    "DEFAULT_MAX_BLOCK",
    "DEFAULT_SKEW_GUARD",
    "LADDER",
    "RaceConfig",
    "RaceModel",
    "build_config",
    "chunk_groups",
]

#: Default cap on the chunk of indices evaluated at once (memory ``16384 x D``
#: rewards, 6.5 MB at D = 100 in float32). Each chunk is one ``while_loop``
#: iteration with a fixed cost of tens of microseconds on CPU (end-of-stage
#: elimination, loop bookkeeping), so large chunks cut the per-datum cost of late
#: stages (measured 1.2-1.3x faster than 4096 at N = 1e6, D = 10) and of the
#: exact pass, which reads N data in chunks of this size.
DEFAULT_MAX_BLOCK = 16384

#: Default ``exact_pass_cost``: with the Gaussian factor of benchmarks/discrete.py
#: at N = 1e6, D = 10, a datum drawn at random costs ~11 ns in the race (permutation,
#: random gather, k x k co-moments) and a datum read in order in the pass 2.5-5 ns
#: (one fused subtract-and-sum), a ratio of 0.2-0.45; 0.25 switches once the next
#: stage would add >= N / 4 random data. For factors whose evaluation dominates
#: (the ratio tends to 1) pass a larger value, or None to keep Alg. 1 as it is.
DEFAULT_EXACT_PASS_COST = 0.25

#: Default ``skew_guard`` (issue 16, item 7). Racing-Normal assumes each stage mean
#: is Normal; with skewed rewards (heavy-tailed residuals) a race that stops after
#: the first batch is wrong more often than delta. With the guard, the threshold
#: is the Cornish-Fisher quantile ``B + g_T (B^2 - 1) / 6`` of the stage mean,
#: ``g_T = skew / sqrt(T)`` from the running third moments, and no arm is
#: eliminated while ``g_T`` exceeds the guard. See docs/racing_kernels.md for the
#: measurements that chose it.
DEFAULT_SKEW_GUARD = 0.5

#: Ratio between successive chunk sizes m1 * LADDER^k: a stage of m_t new indices
#: is read in chunks of the largest such size <= m_t (at most 3 chunks of 4 per
#: stage below the cap), so only a handful of distinct loop bodies are compiled.
LADDER = 4


class RaceModel(NamedTuple):
    """The functions a race reads (already wrapped into block sums when ``block_size > 1``).

    ``log_factor_fn(indices[, params]) -> [m, D]``; ``log_factor_states_fn(indices, states[,
    params]) -> [m, k]`` or None; ``control_variate`` a :class:`ControlVariate` or None;
    ``h_mean_fn(params) -> [D]`` the per-draw control-variate mean (``racing_batch``) or None;
    ``reward_range`` the ranges ``C_i`` (``bound="ebs"``) or None.
    """

    log_factor_fn: Callable
    log_factor_states_fn: Callable | None
    control_variate: ControlVariate | None
    h_mean_fn: Callable | None
    reward_range: object


class RaceConfig(NamedTuple):
    """Static settings of one race (Python values, fixed at construction; see :func:`build_config`).

    Attributes
    ----------
    num_states, num_data
        ``D`` and the population size ``N`` (blocks when ``block_size > 1``).
    num_rows, block_size
        Rows of data and the sampling unit ``B`` (``num_data = ceil(num_rows / B)``).
    stage_ends
        ``T_1 < T_2 < ... < T_{t*} = N``, the doubling schedule.
    chunk_groups
        ``((chunk_size, last_stage), ...)``: consecutive stages sharing one loop.
    max_block_size
        Largest chunk (also the exact pass's chunk).
    pairwise, gumbel_noise, can_eliminate
        Pairwise variances; Gumbel noise on ``log f0``; elimination on (not ``exact``, ``t* > 1``).
    levels
        Compaction levels ``K_1 > K_2 > ...`` (empty: no compaction).
    switch_stage
        Stage at which a running race takes the exact pass, or None.
    use_skew, skew_guard, b_threshold
        The skewness guard (Racing-Normal), its level and the first stage's ``B_Normal``.
    group_size, with_params
        Draws advanced together by the batched path; whether the model takes per-draw ``params``.
    model
        The :class:`RaceModel`.
    """

    num_states: int
    num_data: int
    num_rows: int
    block_size: int
    stage_ends: tuple
    chunk_groups: tuple
    max_block_size: int
    pairwise: bool
    gumbel_noise: bool
    can_eliminate: bool
    levels: tuple
    switch_stage: int | None
    use_skew: bool
    skew_guard: float | None
    b_threshold: float
    group_size: int
    with_params: bool
    model: RaceModel

    @property
    def num_stages(self) -> int:
        return len(self.stage_ends)


def chunk_groups(sizes, first_batch_size: int, max_block_size: int) -> list[tuple[int, int]]:
    """``[(chunk_size, last_stage_index), ...]``: consecutive stages sharing a chunk size.

    Stage t reads ``m_t = T_t - T_{t-1}`` new indices in chunks of
    ``c_t = max{m1 * LADDER^k <= min(m_t, max_block_size)}``, and at least
    ``c_{t-1}``. For t < t*, ``m_t`` and ``T_{t-1}`` are ``m1`` times powers of
    two, so chunks tile the stage exactly; the last stage (clipped to N) masks
    its final chunk (with ``m_t < c_{t-1}``, part of its only chunk).
    """
    ladder = [first_batch_size]
    while ladder[-1] * LADDER <= max_block_size:
        ladder.append(ladder[-1] * LADDER)
    groups: list[tuple[int, int]] = []
    prev = 0
    for t, stop in enumerate(sizes):
        m_t = stop - prev
        prev = stop
        c = max(c for c in ladder if c <= max(m_t, first_batch_size))
        if groups:
            # Never a smaller chunk than the previous stage's: only the last, clipped stage
            # can have fewer new indices (m_t < m_{t-1}); it masks part of one larger chunk
            # instead of adding a loop (one loop body fewer to compile).
            c = max(c, groups[-1][0])
        if groups and groups[-1][0] == c:
            groups[-1] = (c, t)
        else:
            groups.append((c, t))
    return groups


def build_config(
    log_factor_fn, num_states, num_data, *, delta, first_batch_size, bound, variance, reward_range, control_variate,
    gumbel_noise, exact, max_block_size, log_factor_states_fn, num_compact_states, group_size, exact_pass_cost,
    with_params, skew_guard=DEFAULT_SKEW_GUARD, block_size=1,
) -> tuple[RaceConfig, np.ndarray, np.ndarray]:
    """Validate the settings of :func:`jaxsub.racing.racing` / ``racing_batch`` (``ValueError`` naming
    the parameter) and return ``(config, coef_a, coef_b)``, the per-stage threshold coefficients
    of :func:`jaxsub.racing.racing_coefficients` beside the static :class:`RaceConfig`."""
    block_size = check_int("block_size", block_size, low=1)
    num_rows = check_int("num_data", num_data, low=2)
    if block_size > 1:
        check_sizes(num_states, num_rows, 2)  # N * D within the int32 counters (in rows)
        num_data = -(-num_rows // block_size)  # the population: ceil(N / B) blocks
        if num_data < 2:
            raise ValueError(f"block_size must leave >= 2 blocks (block_size < num_data = {num_rows}); got {block_size}")
    num_states, num_data, first_batch_size = check_sizes(num_states, num_data, first_batch_size)
    delta = check_real("delta", delta, low=0.0, high=1.0)
    bound = check_choice("bound", bound, ("normal", "ebs"))
    variance = check_choice("variance", variance, ("pairwise", "marginal"))
    reward_range = check_reward_range(reward_range, num_states, required=(bound == "ebs"))
    if bound == "normal" and reward_range is not None:
        reward_range = None  # the normal bound does not use C
    cv = as_control_variate(control_variate)
    if block_size > 1:
        if bound == "ebs":
            if num_rows % block_size:
                raise ValueError(
                    f"block_size must divide num_data with bound='ebs' (a short last block has no range "
                    f"bound B C); got num_data={num_rows}, block_size={block_size}"
                )
            reward_range = scale_range(reward_range, block_size)
        log_factor_fn, log_factor_states_fn, cv = blocked(
            log_factor_fn, log_factor_states_fn, cv, num_rows, block_size, num_data
        )
    if max_block_size is None:
        default_block = DEFAULT_MAX_BLOCK
        if block_size > 1:
            # Units are blocks: keep a chunk at about DEFAULT_MAX_BLOCK rows, and never above
            # the population (a chunk past N would only read masked, padded rows).
            default_block = min(max(DEFAULT_MAX_BLOCK // block_size, 1), num_data)
        max_block_size = max(default_block, first_batch_size)
    max_block_size = check_int("max_block_size", max_block_size, low=first_batch_size)
    if not callable(log_factor_fn):
        raise ValueError(f"log_factor_fn must be callable; got {log_factor_fn!r}")
    gumbel_noise = bool(gumbel_noise)
    exact = bool(exact)
    # Compaction levels K_1 > K_2 > ... > K_last: while more than K_1 arms are alive
    # every column is used; once at most K_j are, only the first K_j alive arms are
    # evaluated (with log_factor_states_fn) and enter the K_j x K_j co-moments.
    levels: list[int] = []
    if log_factor_states_fn is not None:
        if not callable(log_factor_states_fn):
            raise ValueError(f"log_factor_states_fn must be callable; got {log_factor_states_fn!r}")
        if num_states > 2:
            default_k = min(4, num_states - 1)
            k_min = check_int("num_compact_states", default_k if num_compact_states is None else num_compact_states, low=2, high=num_states - 1)
            levels = compaction_levels(num_states, k_min)
    elif variance == "pairwise" and num_states >= COLUMN_COMPACT_MIN_D:
        # No per-state factor: all D columns are still evaluated, but once at most
        # K_j arms survive only their columns enter the K_j x K_j co-moment update
        # (the D x D one dominates the cost per datum for large D).
        levels = compaction_levels(num_states, 4)

    D, N = num_states, num_data
    sizes = doubling_schedule(N, first_batch_size)
    num_stages = len(sizes)
    can_eliminate = not exact and num_stages > 1
    switch_stage = None
    if exact_pass_cost is not None:
        exact_pass_cost = check_real("exact_pass_cost", exact_pass_cost, low=0.0, high=1.0, high_closed=True)
        switch_stage = switch_stage_of(sizes, N, D, exact_pass_cost, can_eliminate)
    coef_a, coef_b = racing_coefficients(delta, D, N, first_batch_size, bound=bound, variance=variance)
    if skew_guard is not None:
        skew_guard = check_real("skew_guard", skew_guard, low=0.0)
    use_skew = skew_guard is not None and bound == "normal"
    b_threshold = float(coef_a[0] / stage_sd(N, sizes[:1])[0]) if use_skew and len(coef_a) else 0.0
    groups = chunk_groups(sizes, first_batch_size, max_block_size)
    group_size = check_int("group_size", group_size, low=1)
    h_mean_fn = None
    if cv is not None and with_params and callable(cv.mean):
        h_mean_fn = cv.mean  # per-draw mean h_mean(params) -> [D]
    model = RaceModel(log_factor_fn, log_factor_states_fn, cv, h_mean_fn, reward_range)
    config = RaceConfig(
        num_states=D, num_data=N, num_rows=num_rows, block_size=block_size, stage_ends=tuple(int(t) for t in sizes),
        chunk_groups=tuple(groups), max_block_size=max_block_size, pairwise=variance == "pairwise",
        gumbel_noise=gumbel_noise, can_eliminate=can_eliminate, levels=tuple(levels), switch_stage=switch_stage,
        use_skew=use_skew, skew_guard=skew_guard, b_threshold=b_threshold, group_size=group_size,
        with_params=bool(with_params), model=model,
    )
    return config, coef_a, coef_b
