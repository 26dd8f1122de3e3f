"""The static configuration of a race: every setting validated once, at construction.

:class:`RaceOptions` declares the options of :func:`jaxsub.racing.racing` /
:func:`jaxsub.racing.racing_batch` once (names, defaults, documentation); both constructors
take them as keyword arguments (or an ``options=RaceOptions(...)`` record) and
:func:`build_config` turns them into a :class:`RaceConfig` (a ``NamedTuple`` of Python
values and the model's functions, :class:`RaceModel`); the engine's pieces (stage body,
elimination, compaction, exact pass, batching) are pure functions of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from jaxsub.racing.bounds import SCHEDULES, race_schedule, racing_coefficients, stage_sd
from jaxsub.racing.compaction import COLUMN_COMPACT_MIN_D, compaction_levels
from jaxsub.racing.control_variates import ControlVariate, as_control_variate
from jaxsub.racing.elimination import SKEW_WAIVER, cantelli_waiver
from jaxsub.racing.exact_pass import switch_stage_of
from jaxsub.racing.info import check_reward_range, check_sizes
from jaxsub.racing.populations import blocked, scale_range
from jaxsub.validation import check_choice, check_int, check_real

__all__ = [
    "DEFAULT_EXACT_PASS_COST",
    "DEFAULT_MAX_BLOCK",
    "DEFAULT_SKEW_GUARD",
    "LADDER",
    "LARGE_D_EXACT_PASS_COST",
    "LARGE_D_PASS",
    "RaceConfig",
    "RaceModel",
    "RaceOptions",
    "build_config",
    "chunk_groups",
    "race_options",
    "resolve_exact_pass_cost",
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

#: ``exact_pass_cost="auto"`` (the default of :class:`RaceOptions`): ``DEFAULT_EXACT_PASS_COST``
#: below ``LARGE_D_PASS`` states, ``LARGE_D_EXACT_PASS_COST`` from it. Measured
#: (benchmarks/discrete.py, B = 64, A/B in one process): at D = 100 the race before the switch
#: runs with up to D // 4 = 25 arms per row (7.5 ns per row) while the exact pass over the few
#: survivors (its own compaction ladder) costs 1-2 ns per row, so switching at m_t >= N / 16
#: instead of N / 4 made a draw 1.34x (Gaussian, N = 1e6) and 1.59x (logistic, N = 2.5e5)
#: cheaper against N / 4; at D = 10 it was 0.74x (N / 8: 0.91x), so small D keeps 0.25.
LARGE_D_PASS = 64
LARGE_D_EXACT_PASS_COST = 0.0625


def resolve_exact_pass_cost(exact_pass_cost, num_states: int):
    """The ``exact_pass_cost`` a race uses: ``"auto"`` -> 0.25 for D < 64, 1/16 from D = 64."""
    if isinstance(exact_pass_cost, str) and exact_pass_cost == "auto":
        return DEFAULT_EXACT_PASS_COST if num_states < LARGE_D_PASS else LARGE_D_EXACT_PASS_COST
    return exact_pass_cost


#: Default ``skew_guard``. Racing-Normal assumes each stage mean
#: is Normal; with skewed rewards (heavy-tailed residuals) a race that stops after
#: the first batch is wrong more often than delta. With the guard, the threshold
#: is the Cornish-Fisher quantile ``B + g_T (B^2 - 1) / 6`` of the stage mean,
#: ``g_T = skew / sqrt(T)`` from the running third moments, and no arm is
#: eliminated while ``g_T`` exceeds the guard. See docs/guides/discrete.md ("What the
#: guarantee assumes, and where it is strained") for the measurements that chose it.
DEFAULT_SKEW_GUARD = 0.5

#: Ratio between successive chunk sizes m1 * LADDER^k: a stage of m_t new indices
#: is read in chunks of the largest such size <= m_t (at most 3 chunks of 4 per
#: stage below the cap), so only a handful of distinct loop bodies are compiled.
LADDER = 4


class RaceOptions(NamedTuple):
    """The options of :func:`jaxsub.racing.racing` and :func:`jaxsub.racing.racing_batch`, declared once.

    Pass them as keyword arguments (``racing(fn, D, N, delta=0.05, block_size=64)``), or as one
    record (``racing(fn, D, N, delta=0.05, options=RaceOptions(block_size=64))``; keyword
    arguments then override its fields). Every option is static (a Python value fixed at
    construction) and validated by :func:`build_config` (``ValueError`` naming it).

    Attributes
    ----------
    first_batch_size
        m1, the first mini-batch, 2 <= m1 <= N. The paper uses 50.
    bound
        ``"normal"`` (Racing-Normal, eq. 9) or ``"ebs"`` (Racing-EBS, eq. 7).
    variance
        ``"pairwise"`` (sigma_{x,i} of the differences, delta/(D-1); O(D^2) per
        datum) or ``"marginal"`` (sigma_i per arm, delta/D; O(D) per datum).
    reward_range
        C_i, scalar or ``[D]``: a bound on ``max_n l_{i,n} - min_n l_{i,n}``
        (after the control variate). Required by ``bound="ebs"``.
    control_variate
        ``None``, a :class:`~jaxsub.racing.ControlVariate` or ``(h_fn, h_mean)``
        (see :func:`jaxsub.discrete.data_taylor_control_variate`): rewards become
        ``l - h + h_mean`` (§3.4). With :func:`~jaxsub.racing.racing_batch`,
        ``h_fn(indices, params)`` and ``h_mean`` an array or ``h_mean(params)``.
    gumbel_noise
        If True (default), add ``Gumbel(0, 1)`` noise to ``log_f0`` (a draw from
        ``p``). If False, no noise is added and the sampler returns the argmax of
        ``log_f0 + sum_n log f_n`` found by racing: e.g. racing MH (eq. 12) with
        ``D = 2``, ``log_f0 = [log u + log p(x) + log q(x'|x), log p(x') + log q(x|x')]``
        and per-datum log-likelihoods at ``[x, x']``; 1 means accept.
    exact
        If True, never eliminate: every draw uses all N data (the exact result
        through the racing code path). A tiny ``delta`` tends to this.
    max_block_size
        Largest chunk of indices evaluated at once (memory ``max_block_size x D``);
        at least ``first_batch_size``; default ``max(16384, first_batch_size)``
        (``16384 // block_size`` blocks with blocks, at most the population).
    log_factor_states_fn
        Optional ``fn(indices [m], states [k]) -> Array[m, k]`` (``racing_batch``:
        ``fn(indices, states, params)``): ``log f_n(i)`` for the given states only. When
        given, once at most ``k`` arms survive only those are evaluated, for the static
        levels ``k = D // 4, D // 16, ..., K`` (each a quarter of the previous, none under
        ``2 K`` but the last), so the wall-clock work follows ``num_evaluations`` instead
        of ``num_data_used * D`` (eliminated arms cost nothing, as in the paper). Must
        agree with ``log_factor_fn``; it is traced once per level. Without it, for
        ``variance="pairwise"`` and ``D >= 32``, all D columns are evaluated but once at
        most ``k`` arms survive only theirs enter the co-moment update (same statistics,
        ``k^2`` instead of ``D^2`` work per datum).
    num_compact_states
        K, the smallest number of states passed to ``log_factor_states_fn``
        (``2 <= K < D``; default ``min(4, D - 1)``).
    group_size
        g >= 1, the static number of draws advanced together by the batched path
        (``sample.batched``, ``racing_batch``; memory ``g * max_block_size * D``); the
        default 16 amortises the per-iteration overhead on small chunks while wasting
        nothing on finished draws.
    exact_pass_cost
        c in (0, 1], or None to disable. The cost of one pass over all N data in
        index order (contiguous reads, no permutation, no co-moments), relative
        to drawing N data at random. At the first stage t >= 2 whose new random
        data would cost more, ``m_t = T_t - T_{t-1} >= c N``, a race still
        running stops drawing at random and computes the exact means of the
        surviving arms in that pass, then returns their argmax. This only
        removes error events (the decision among survivors becomes exact), so
        the TV bound of Prop. 1 still holds; ``info.num_evaluations`` counts
        the pass's ``N x (surviving arms)`` rewards on top of the race's. The
        default ``"auto"`` is 0.25, the measured ratio on CPU (see ``DEFAULT_EXACT_PASS_COST``),
        below 64 states and 1/16 from 64 states, where the race before the switch evaluates many
        more arms per datum than the pass (``LARGE_D_EXACT_PASS_COST``, measured at D = 100).
        Ignored when ``exact=True``.
    skew_guard
        ``g >= 0`` or None (``bound="normal"`` only). Racing-Normal assumes Normal
        stage means; with skewed rewards it errs more often than ``delta``. The
        guard keeps third moments of each arm's rewards, uses the Cornish-Fisher
        threshold ``B + g_T (B^2 - 1) / 6`` (``g_T = skew / sqrt(T)``, the larger
        of the pair's) and eliminates nothing while ``g_T > g``. Default 0.5,
        chosen by measurement (docs/guides/discrete.md); None is the paper's rule.
    block_size
        B >= 1, the sampling unit. With ``B > 1`` the race
        samples *blocks* of B consecutive rows ``[jB, min((j+1)B, N))`` (the
        population is the ``ceil(N / B)`` blocks, the reward of a block is the
        sum of its rows' rewards; a last block of ``N mod B`` rows is summed over
        its rows only, so every arm's total is exact). Prop. 1 holds for this
        finite population unchanged; the permutation, the k x k co-moments and
        the elimination test are paid once per block, and block sums are closer
        to Normal. ``first_batch_size``, ``max_block_size`` and the schedule
        count *blocks*; ``info`` counts rows (blocks x B, capped at N).
        Blocks are consecutive rows in the order ``log_factor_fn`` indexes
        them: if the data are sorted (by time, class, ...), shuffle them once
        (the result stays exact; heterogeneous blocks only cost samples).
        ``bound="ebs"`` needs ``N`` divisible by B (the block range is B C).
        B = 1 (default) is the per-row race, unchanged.
    schedule
        ``"doubling"`` (default; Alg. 1's ``T_t = m1 2^(t-1)``) or ``"fixed"``: one elimination
        test after ``m1`` data, then the surviving arms on all N data (in one contiguous exact
        pass when ``exact_pass_cost`` allows and ``D > 2``; otherwise the rest of the random
        order). For small populations (N up to a few thousand) and inside jitted sweeps: two
        stage loops are compiled instead of one per chunk size, and no further tests are paid
        for. Guarantee: the single test uses the one-stage quantile
        ``B = Phi^-1(1 - delta / (D - 1))`` (pairwise; ``delta / D`` marginal), so by the union
        bound over the ``D - 1`` pairs with the best arm the best arm is eliminated with
        probability at most ``delta`` when the ``m1``-sample mean differences are Normal (the
        skewness guard applies as for the doubling schedule), and Prop. 1 gives TV <= delta.
        Racing-EBS with ``"fixed"`` needs no normality (``delta'' = delta'``).
    """

    first_batch_size: int = 50
    bound: str = "normal"
    variance: str = "pairwise"
    reward_range: object = None
    control_variate: object = None
    gumbel_noise: bool = True
    exact: bool = False
    max_block_size: int | None = None
    log_factor_states_fn: Callable | None = None
    num_compact_states: int | None = None
    group_size: int = 16
    exact_pass_cost: float | str | None = "auto"
    skew_guard: float | None = DEFAULT_SKEW_GUARD
    block_size: int = 1
    schedule: str = "doubling"


def race_options(options: RaceOptions | None, overrides: dict, caller: str) -> RaceOptions:
    """``options`` (default :class:`RaceOptions`) with the keyword ``overrides`` applied.

    Raises ``TypeError`` naming an unknown option (as Python does for an unexpected
    keyword argument) and ``ValueError`` when ``options`` is not a :class:`RaceOptions`.
    """
    if options is None:
        options = RaceOptions()
    elif not isinstance(options, RaceOptions):
        raise ValueError(f"options must be a RaceOptions (or None); got {type(options).__name__}")
    unknown = sorted(set(overrides) - set(RaceOptions._fields))
    if unknown:
        raise TypeError(f"{caller}() got unexpected option(s) {unknown}; the options are {list(RaceOptions._fields)}")
    return options._replace(**overrides)


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
    #: With ``block_size > 1``: the user's per-row functions (``log_factor_fn``,
    #: ``log_factor_states_fn``, control variate), read by the exact pass, which sums rows in
    #: order and has no use for block sums (None when ``block_size == 1``).
    row_functions: tuple | None = None


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
    use_skew, skew_guard, b_threshold, skew_waiver
        The skewness guard (Racing-Normal), its level, the first stage's ``B_Normal`` and the
        gap (in thresholds) beyond which the guard is waived
        (:func:`~jaxsub.racing.elimination.cantelli_waiver`).
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
    skew_waiver: float
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
    log_factor_fn,
    num_states,
    num_data,
    *,
    delta,
    options: RaceOptions,
    with_params: bool,
) -> tuple[RaceConfig, np.ndarray, np.ndarray]:
    """Validate the settings of :func:`jaxsub.racing.racing` / ``racing_batch`` (``ValueError`` naming
    the parameter) and return ``(config, coef_a, coef_b)``, the per-stage threshold coefficients
    of :func:`jaxsub.racing.racing_coefficients` beside the static :class:`RaceConfig`.

    ``options`` is a :class:`RaceOptions`; ``with_params``: the model functions take per-draw
    ``params`` (``racing_batch``)."""
    o = options
    first_batch_size, bound, variance, reward_range = o.first_batch_size, o.bound, o.variance, o.reward_range
    gumbel_noise, exact, max_block_size, group_size = o.gumbel_noise, o.exact, o.max_block_size, o.group_size
    log_factor_states_fn, num_compact_states = o.log_factor_states_fn, o.num_compact_states
    exact_pass_cost, skew_guard, block_size = o.exact_pass_cost, o.skew_guard, o.block_size
    block_size = check_int("block_size", block_size, low=1)
    num_rows = check_int("num_data", num_data, low=2)
    if block_size > 1:
        check_sizes(num_states, num_rows, 2)  # N * D within the int32 counters (in rows)
        num_data = -(-num_rows // block_size)  # the population: ceil(N / B) blocks
        if num_data < 2:
            raise ValueError(
                f"block_size must leave >= 2 blocks (block_size < num_data = {num_rows}); got {block_size}"
            )
    num_states, num_data, first_batch_size = check_sizes(num_states, num_data, first_batch_size)
    delta = check_real("delta", delta, low=0.0, high=1.0)
    bound = check_choice("bound", bound, ("normal", "ebs"))
    variance = check_choice("variance", variance, ("pairwise", "marginal"))
    reward_range = check_reward_range(reward_range, num_states, required=(bound == "ebs"))
    if bound == "normal" and reward_range is not None:
        reward_range = None  # the normal bound does not use C
    cv = as_control_variate(o.control_variate)
    row_functions = None
    if block_size > 1:
        row_functions = (log_factor_fn, log_factor_states_fn, cv)
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
            k_min = check_int(
                "num_compact_states",
                default_k if num_compact_states is None else num_compact_states,
                low=2,
                high=num_states - 1,
            )
            levels = compaction_levels(num_states, k_min)
    elif variance == "pairwise" and num_states >= COLUMN_COMPACT_MIN_D:
        # No per-state factor: all D columns are still evaluated, but once at most
        # K_j arms survive only their columns enter the K_j x K_j co-moment update
        # (the D x D one dominates the cost per datum for large D).
        levels = compaction_levels(num_states, 4)

    D, N = num_states, num_data
    schedule = check_choice("schedule", o.schedule, SCHEDULES)
    sizes = race_schedule(N, first_batch_size, schedule)
    num_stages = len(sizes)
    can_eliminate = not exact and num_stages > 1
    switch_stage = None
    exact_pass_cost = resolve_exact_pass_cost(exact_pass_cost, D)
    if exact_pass_cost is not None:
        exact_pass_cost = check_real("exact_pass_cost", exact_pass_cost, low=0.0, high=1.0, high_closed=True)
        switch_stage = switch_stage_of(sizes, N, D, exact_pass_cost, can_eliminate)
    coef_a, coef_b = racing_coefficients(
        delta, D, N, first_batch_size, bound=bound, variance=variance, schedule=schedule
    )
    if skew_guard is not None:
        skew_guard = check_real("skew_guard", skew_guard, low=0.0)
    use_skew = skew_guard is not None and bound == "normal"
    b_threshold = float(coef_a[0] / stage_sd(N, sizes[:1])[0]) if use_skew and len(coef_a) else 0.0
    skew_waiver = (
        cantelli_waiver(delta, D, num_stages, variance == "pairwise", b_threshold) if use_skew else SKEW_WAIVER
    )
    groups = chunk_groups(sizes, first_batch_size, max_block_size)
    group_size = check_int("group_size", group_size, low=1)
    h_mean_fn = None
    if cv is not None and with_params and callable(cv.mean):
        h_mean_fn = cv.mean  # per-draw mean h_mean(params) -> [D]
    model = RaceModel(log_factor_fn, log_factor_states_fn, cv, h_mean_fn, reward_range, row_functions)
    config = RaceConfig(
        num_states=D,
        num_data=N,
        num_rows=num_rows,
        block_size=block_size,
        stage_ends=tuple(int(t) for t in sizes),
        chunk_groups=tuple(groups),
        max_block_size=max_block_size,
        pairwise=variance == "pairwise",
        gumbel_noise=gumbel_noise,
        can_eliminate=can_eliminate,
        levels=tuple(levels),
        switch_stage=switch_stage,
        use_skew=use_skew,
        skew_guard=skew_guard,
        b_threshold=b_threshold,
        skew_waiver=skew_waiver,
        group_size=group_size,
        with_params=bool(with_params),
        model=model,
    )
    return config, coef_a, coef_b
