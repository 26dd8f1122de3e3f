"""Racing with a finite reward population: Alg. 1 of Chen & Ghahramani (2016).

This module is the *engine* of :mod:`jaxsub.discrete`; the racing MH / Gibbs
kernels build on :func:`racing` directly.

Problem
-------
Draw ``x ~ p(x) ∝ f0(x) prod_{n=1..N} f_n(x)`` over ``D`` states. With Gumbel
noise ``eps_i ~ Gumbel(0, 1)`` (eq. 2-3)::

    x = argmax_i mu_i,    mu_i = (1/N) sum_n l_{i,n},
    l_{i,n} = log f_n(i) + (log f0(i) + eps_i) / N.

Racing (Alg. 1) draws a mini-batch of data indices *shared by all surviving
arms* without replacement, updates the mean (and variance) estimates, and
eliminates every arm ``i`` whose estimated gap to the leader ``x`` exceeds the
uncertainty bound::

    marginal:  mu_x - mu_i > G(delta/D, T, sigma_x, C_x) + G(delta/D, T, sigma_i, C_i)
    pairwise:  mu_x - mu_i > G(delta/(D-1), T, sigma_{x,i}, C_x + C_i)

with the doubling schedule ``T_t = m1 2^(t-1)`` (clipped to N). Two bounds:

* ``bound="normal"`` (eq. 9): ``G = sigma / sqrt(T) * sqrt(1 - (T-1)/(N-1)) * B_Normal``,
  with ``B_Normal(delta', N, m1)`` from :func:`jaxsub.discrete.b_normal`;
* ``bound="ebs"`` (eqs. 6-7): ``G = B_EBS(delta'/(t*-1), T, sigma, C)``, the
  empirical Bernstein-Serfling bound, which needs the reward range ``C``.

By Prop. 1 and Prop. 3, if the bound holds with probability ``1 - delta`` the
total-variation distance between the law of the returned state and ``p`` is at
most ``delta``; at most ``N * D`` rewards are ever computed, and if the race
reaches ``T = N`` the decision uses exact means.

Implementation notes
--------------------
* Indices without replacement: position ``T`` of a keyed pseudo-random
  permutation of ``[0, N)`` (:func:`jaxsub.subsample.permutation_indices`), so a
  stage of ``m`` new indices costs O(m), never O(N).
* Static shapes: stage ``t`` reads its ``m_t`` new indices in chunks of a
  static size ``m1 * 4^k <= m_t`` (capped at ``max_block_size``; the last,
  clipped stage masks its final chunk); consecutive stages with the same chunk
  size share one ``lax.while_loop`` whose body eliminates at stage ends, so a
  few loop bodies are compiled, not ``t*``. A finished draw runs zero further
  iterations; under ``vmap`` each loop runs until its slowest draw is done.
  :func:`racing_batch` (and ``sample.batched``) run the same loop bodies on
  many draws, in rounds that advance only the unfinished draws (compacted to
  the front, in ``vmap``-ed groups of a static size), so a batch costs the
  sum of its draws' work, not B times the slowest.
  Eliminated arms are masked (``log_factor_fn`` still returns all ``D``
  columns; ``info.num_evaluations`` counts only surviving arms, as in the paper).
  With ``log_factor_states_fn``, further loops per chunk size evaluate only the
  ``K_j`` first surviving arms once no more than ``K_j`` remain, for the
  compaction levels ``K_j = D // 4, D // 16, ..., K`` (:func:`_compaction_levels`),
  so the work (evaluations and ``K_j^2`` co-moments per datum) follows the count.
* Numerics: with pairwise variances each datum's rewards are centred by their
  mean over the surviving arms (this leaves every difference ``l_i - l_j``,
  hence the gaps and pairwise variances, unchanged, and removes the common mode
  that would swamp float32 when arms are strongly correlated). Marginal
  variances use the raw rewards (the paper's sigma_i); for strongly correlated
  arms prefer pairwise (or float64). Chunk moments are shifted sums around the
  running mean, merged with Chan et al.'s parallel update (stable for N up to
  1e7 in float32). NaN / inf in the running sums is checked once per stage.
* A state with ``log f0 = -inf`` or any ``log f_n = -inf`` has probability 0
  and is eliminated at once; it is never returned (unless every state has
  probability 0, which is flagged in ``info.has_nan``). NaN or ``+inf`` rewards
  of a surviving arm stop the race at the end of the stage and set
  ``info.has_nan``: that draw is not a valid sample.

References
----------
Y. Chen & Z. Ghahramani, "Scalable discrete sampling as a multi-armed bandit
problem", ICML 2016 (Alg. 1, eqs. 2-9, Props. 1, 3).
R. Bardenet & O.-A. Maillard, "Concentration inequalities for sampling without
replacement", Bernoulli 2015 (EBS bound).
T. F. Chan, G. H. Golub & R. J. LeVeque, "Algorithms for computing the sample
variance", 1979 (parallel variance merge).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.racing.bounds import KAPPA_EBS, b_normal, doubling_schedule, stage_sd
from jaxsub.subsample import permutation_indices, permutation_round_keys
from jaxsub.types import Array, PRNGKey
from jaxsub.validation import check_choice, check_int, check_real

__all__ = [
    "ControlVariate",
    "check_beta",
    "RacingBatchSampler",
    "RacingInfo",
    "RacingSampler",
    "as_control_variate",
    "pad_populations",
    "racing",
    "racing_batch",
    "racing_coefficients",
]

#: Largest N * D whose evaluation count fits the int32 counters of ``RacingInfo``.
MAX_EVALUATIONS = 2**31 - 1


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
        True when a NaN / ``+inf`` reward or ``log_f0`` was met, or no state had
        positive probability: the returned state is then *not* a valid sample.
    num_alive
        Arms still in the race when it stopped (1, unless it ran to ``T = N``).
    """

    num_evaluations: Array
    num_data_used: Array
    num_stages: Array
    is_exact: Array
    has_nan: Array
    num_alive: Array


class ControlVariate(NamedTuple):
    """A control variate ``h`` for the rewards (§3.4).

    Attributes
    ----------
    fn
        ``fn(indices) -> Array[m, D]``: ``h_{i,n}`` for the data indices given.
    mean
        ``Array[D]``: ``(1/N) sum_n h_{i,n}``, known in closed form.

    The racing rewards become ``l_{i,n} - h_{i,n} + mean_i``: same means, smaller
    variance when ``h ≈ l``.
    """

    fn: Callable[[Array], Array]
    mean: Array


def as_control_variate(control_variate) -> ControlVariate | None:
    """Accept ``None``, a :class:`ControlVariate` or a ``(fn, mean)`` pair."""
    if control_variate is None:
        return None
    if isinstance(control_variate, ControlVariate):
        return control_variate
    try:
        fn, mean = control_variate
    except (TypeError, ValueError):
        raise ValueError(
            "control_variate must be None, a ControlVariate or a (fn, mean) pair with "
            f"fn(indices) -> [m, D] and mean of shape [D]; got {control_variate!r}"
        ) from None
    if not callable(fn):
        raise ValueError(f"control_variate's first element must be callable; got {fn!r}")
    return ControlVariate(fn, mean)


def pad_populations(log_factor_fn: Callable[[Array], Array], population_sizes) -> Callable[[Array], Array]:
    """Arms whose populations differ in size (``N_i`` factors for state ``i``, §5.3).

    ``log p~(i) = log f0(i) + sum_{n < N_i} log f_n(i)``. Padding every arm's
    population to ``N = max_i N_i`` with factors ``log f_n(i) = 0`` for
    ``n >= N_i`` leaves every sum, hence the target, unchanged, so the racing
    and exact samplers apply as they are with ``num_data = max(population_sizes)``.

    Parameters
    ----------
    log_factor_fn
        ``log_factor_fn(indices) -> [m, D]``; column ``i`` need only be valid
        for indices ``< N_i`` (other entries are replaced by 0).
    population_sizes
        Concrete integers ``N_i >= 1``, one per state.

    Returns
    -------
    Callable
        The padded ``log_factor_fn``; pass ``num_data=max(population_sizes)``.

    Notes
    -----
    The padded zeros make the reward populations of small arms a mixture
    (their variance grows by the spread between 0 and their mean), so racing
    spends more samples than per-arm schedules would; it stays correct, and
    keeps the shared indices that the pairwise variance needs.
    """
    sizes = np.asarray(population_sizes)
    if sizes.ndim != 1 or sizes.size < 2 or not np.issubdtype(sizes.dtype, np.integer) or np.any(sizes < 1):
        raise ValueError(f"population_sizes must be a 1-D array of >= 2 integers >= 1; got {population_sizes!r}")
    sizes_j = jnp.asarray(sizes, dtype=jnp.int32)

    def padded(indices):
        values = log_factor_fn(indices)
        inside = jnp.asarray(indices).astype(jnp.int32)[:, None] < sizes_j[None, :]
        return jnp.where(inside, values, jnp.zeros((), values.dtype))

    return padded


def _scale_range(reward_range, block_size: int):
    """Range of a block sum of B rewards whose per-row range is C: at most B C."""
    if reward_range is None:
        return None
    if isinstance(reward_range, jax.core.Tracer):
        return reward_range * block_size
    return np.asarray(reward_range, np.float64) * block_size


def _block_rows(block_indices: Array, num_rows: int, block_size: int) -> tuple[Array, Array]:
    """Row indices ``[m * B]`` of the blocks ``block_indices`` [m] (clipped to N - 1) and their validity."""
    rows = block_indices.astype(jnp.int32)[:, None] * block_size + jnp.arange(block_size, dtype=jnp.int32)[None, :]
    valid = rows < num_rows
    return jnp.minimum(rows, num_rows - 1).reshape(-1), valid


def _block_sum(values: Array, valid: Array) -> Array:
    """``[m * B, k]`` row rewards -> ``[m, k]`` block sums over the valid rows (a short last block
    sums its rows only). A ``-inf`` row reward makes its block sum ``-inf``; NaN stays NaN."""
    m, b = valid.shape
    values = jnp.asarray(values)
    # Sum on the transpose [k, m, B]: the B rows of a block are then the minor axis, which
    # XLA's CPU loops vectorise (the [m, B, k] reduction over the middle axis measured 2.4x
    # slower per row for k = 4, B = 64); the producer of ``values`` fuses into this layout.
    values_t = values.T.reshape((values.shape[1], m, b))
    return jnp.sum(jnp.where(valid[None, :, :], values_t, jnp.zeros((), values.dtype)), axis=2).T


def _blocked(log_factor_fn, log_factor_states_fn, cv, num_rows: int, block_size: int, num_blocks: int, with_params: bool):
    """The block population of ``racing(..., block_size=B)``: factor functions over block indices
    returning block sums, and the control variate with the per-block mean ``(N / num_blocks) h_mean``."""
    scale = num_rows / num_blocks

    def wrap(fn):
        if fn is None:
            return None

        def blocked(indices, *rest):
            rows, valid = _block_rows(jnp.asarray(indices), num_rows, block_size)
            return _block_sum(fn(rows, *rest), valid)

        return blocked

    new_cv = None
    if cv is not None:
        mean = cv.mean
        if callable(mean):
            new_mean = lambda params, mean=mean: jnp.asarray(mean(params)) * scale  # noqa: E731
        else:
            new_mean = jnp.asarray(mean) * scale
        new_cv = ControlVariate(wrap(cv.fn), new_mean)
    return wrap(log_factor_fn), wrap(log_factor_states_fn), new_cv


@dataclasses.dataclass(frozen=True)
class RacingSampler:
    """What :func:`racing` returns: an immutable record of pure functions (Optax style).

    Calling it is calling ``sample``: ``sampler(rng_key, log_f0, beta=None) -> (x, info)``, so
    ``jax.jit(sampler)`` / ``jax.vmap(sampler)`` and ``sampler.batched(...)`` work as before.
    (Not a ``NamedTuple``: ``jax.jit`` keeps a weak reference to the function it compiles,
    which tuples do not allow.)

    Attributes
    ----------
    sample
        ``sample(rng_key, log_f0, beta=None) -> (x, info)``: one draw.
    batched
        ``batched(rng_keys [B], log_f0s [B, D], beta=None) -> (x [B], info)``: B draws,
        work proportional to the unfinished draws (same draws as ``jax.vmap(sample)``).
    with_coefficients
        ``with_coefficients(rng_key, log_f0, coef_a, coef_b)``: the per-stage threshold
        coefficients of :func:`racing_coefficients` as (traceable) arguments.
    batched_with_coefficients
        ``batched_with_coefficients(rng_keys, log_f0s, coef_a, coef_b)``.
    """

    sample: Callable
    batched: Callable
    with_coefficients: Callable
    batched_with_coefficients: Callable

    def __call__(self, *args, **kwargs):
        return self.sample(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class RacingBatchSampler:
    """What :func:`racing_batch` returns: an immutable record of pure functions.

    Calling it is calling ``sample_batch`` (``jax.jit(sampler)`` works as before).

    Attributes
    ----------
    sample_batch
        ``sample_batch(rng_keys [B], log_f0s [B, D], params=None, beta=None) -> (x [B], info)``.
    single
        ``single(rng_key, log_f0, params=None, beta=None) -> (x, info)``: one draw (draw b of
        ``sample_batch`` equals ``single`` with that draw's key, ``log_f0`` and ``params``).
    """

    sample_batch: Callable
    single: Callable

    def __call__(self, *args, **kwargs):
        return self.sample_batch(*args, **kwargs)


class _RaceState(NamedTuple):
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


def check_beta(beta, gumbel_noise: bool = True):
    """Validate ``beta``, the inverse temperature (traceable): ``None`` or ``> 0`` (``inf`` allowed: the MAP).

    A concrete value is checked (scalar, or ``[B]`` for batches); a traced one
    passes through. Raises ``ValueError`` naming ``beta``.
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


def _check_common(num_states, num_data, first_batch_size):
    num_states = check_int("num_states", num_states, low=2)
    num_data = check_int("num_data", num_data, low=2)
    first_batch_size = check_int("first_batch_size", first_batch_size, low=2, high=num_data)
    if num_states * num_data > MAX_EVALUATIONS:
        raise ValueError(
            f"num_states * num_data must be <= {MAX_EVALUATIONS} (int32 evaluation counters); "
            f"got {num_states} * {num_data}"
        )
    return num_states, num_data, first_batch_size


def _reward_range(reward_range, num_states, required: bool):
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


def _ebs_rho(t: int, n: int) -> float:
    """rho_n of eq. 6: 1 - (n-1)/N for n <= N/2, else (1 - n/N)(1 + 1/n)."""
    if t <= n / 2:
        return 1.0 - (t - 1.0) / n
    return (1.0 - t / n) * (1.0 + 1.0 / t)


#: Default cap on the chunk of indices evaluated at once (memory ``16384 x D``
#: rewards, 6.5 MB at D = 100 in float32). Each chunk is one ``while_loop``
#: iteration with a fixed cost of tens of microseconds on CPU (end-of-stage
#: elimination, loop bookkeeping), so large chunks cut the per-datum cost of late
#: stages (measured 1.2-1.3x faster than 4096 at N = 1e6, D = 10) and of the
#: exact pass, which reads N data in chunks of this size.
DEFAULT_MAX_BLOCK = 16384
#: Without ``log_factor_states_fn``, the pairwise co-moments are restricted to the
#: surviving columns (levels D // 4, D // 16, ..., 4) once at most that many arms
#: are alive, for D >= this.
COLUMN_COMPACT_MIN_D = 32

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
#: Gaps larger than this many thresholds are decided whatever the skewness (see ``eliminate``).
SKEW_WAIVER = 100.0

#: Ratio between successive chunk sizes m1 * LADDER^k: a stage of m_t new indices
#: is read in chunks of the largest such size <= m_t (at most 3 chunks of 4 per
#: stage below the cap), so only a handful of distinct loop bodies are compiled.
LADDER = 4


def _chunk_groups(sizes, first_batch_size: int, max_block_size: int) -> list[tuple[int, int]]:
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


#: Largest number of columns summed on the transpose by ``_relative_block_sum`` (measured).
TRANSPOSED_SUM_MAX_K = 32


def _relative_block_sum(r: Array, valid: Array) -> Array:
    """``sum_n (r[n, i] - ref_n)`` over the valid rows of a block ``r`` [m, k].

    ``ref_n`` is the row's first entry when finite (else 0): a per-datum constant,
    so differences between columns are unchanged while the common level of the
    factors is removed (float32 keeps its precision in the sums). A ``-inf``
    entry makes its column's sum ``-inf``; NaN / ``+inf`` make it NaN / ``+inf``.
    Shared by :func:`jaxsub.discrete.gumbel_max` and racing's exact pass.
    """
    zero = jnp.zeros((), r.dtype)
    if r.shape[1] <= TRANSPOSED_SUM_MAX_K:
        # Few columns: sum on the transpose [k, m] (the long data axis minor, which XLA's CPU
        # loops vectorise): gumbel_max at N = 1e6 measured 2.5x (D = 10), 1.9x (D = 32) and
        # 3.2x (D = 4) faster in CPU time than the [m, k] column reduction; at D = 100 the
        # [m, k] form is faster (1.35x), so it is kept there.
        rt = r.T
        ref = rt[:1, :]
        ref = jnp.where(jnp.isfinite(ref), ref, zero)
        return jnp.sum(jnp.where(valid.T, rt - ref, zero), axis=1)
    ref = r[:, :1]
    ref = jnp.where(jnp.isfinite(ref), ref, zero)
    return jnp.sum(jnp.where(valid, r - ref, zero), axis=0)


def _kahan_add(total: Array, comp: Array, y: Array) -> tuple[Array, Array]:
    """Kahan-compensated ``total + y``; the compensation is reset where the total
    is not finite (a -inf / NaN column would otherwise turn it into NaN)."""
    y = y - comp
    t = total + y
    return t, jnp.where(jnp.isfinite(t), (t - total) - y, jnp.zeros((), t.dtype))


def _compaction_levels(num_states: int, k_min: int) -> list[int]:
    """``[D // 4, D // 16, ..., k_min]``: each level a quarter of the previous one
    (co-moment work per datum drops 16x per level), stopping before a level
    would be under twice ``k_min``; at least ``[k_min]``."""
    levels = []
    k = num_states // LADDER
    while k >= 2 * k_min:
        levels.append(k)
        k //= LADDER
    return levels + [k_min]


def racing(
    log_factor_fn: Callable[[Array], Array],
    num_states: int,
    num_data: int,
    *,
    delta: float,
    first_batch_size: int = 50,
    bound: str = "normal",
    variance: str = "pairwise",
    reward_range=None,
    control_variate=None,
    gumbel_noise: bool = True,
    exact: bool = False,
    max_block_size: int | None = None,
    log_factor_states_fn: Callable[[Array, Array], Array] | None = None,
    num_compact_states: int | None = None,
    group_size: int = 16,
    exact_pass_cost: float | None = DEFAULT_EXACT_PASS_COST,
    skew_guard: float | None = DEFAULT_SKEW_GUARD,
    block_size: int = 1,
) -> RacingSampler:
    """Racing sampler for ``p(x) ∝ f0(x) prod_n f_n(x)`` (Alg. 1, doubling schedule).

    Parameters
    ----------
    log_factor_fn
        ``log_factor_fn(indices) -> Array[m, D]``: ``log f_n(i)`` for the data
        indices ``indices`` (int32 ``[m]``, values in ``[0, N)``) and every state
        ``i``. It is traced once per stage shape.
    num_states
        D >= 2.
    num_data
        N >= 2 (use :func:`pad_populations` when arms have different ``N_i``).
    delta
        Error level in (0, 1): the total-variation distance to ``p`` is at most
        ``delta`` (Prop. 1; under the normal assumption for ``bound="normal"``).
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
        ``None`` or ``(h_fn, h_mean)`` (see :class:`ControlVariate` and
        :func:`jaxsub.discrete.taylor_control_variate`): rewards become
        ``l - h + h_mean`` (§3.4).
    gumbel_noise
        If True (default), add ``Gumbel(0, 1)`` noise to ``log_f0`` (a draw from
        ``p``). If False, no noise is added and ``sample`` returns the argmax of
        ``log_f0 + sum_n log f_n`` found by racing: e.g. racing MH (eq. 12) with
        ``D = 2``, ``log_f0 = [log u + log p(x) + log q(x'|x), log p(x') + log q(x|x')]``
        and per-datum log-likelihoods at ``[x, x']``; 1 means accept.
    exact
        If True, never eliminate: every draw uses all N data (the exact result
        through the racing code path). A tiny ``delta`` tends to this.
    max_block_size
        Largest chunk of indices evaluated at once (memory ``max_block_size x D``);
        at least ``first_batch_size``; default ``max(16384, first_batch_size)``.
    log_factor_states_fn
        Optional ``fn(indices [m], states [k]) -> Array[m, k]``: ``log f_n(i)`` for
        the given states only. When given, once at most ``k`` arms survive only
        those are evaluated, for the static levels ``k = D // 4, D // 16, ...,
        K`` (each a quarter of the previous, none under ``2 K`` but the last),
        so the wall-clock work follows ``num_evaluations`` instead of
        ``num_data_used * D`` (eliminated arms cost nothing, as in the paper).
        Must agree with ``log_factor_fn``; it is traced once per level. Without
        it, for ``variance="pairwise"`` and ``D >= 32``, all D columns are
        evaluated but once at most ``k`` arms survive only theirs enter the
        co-moment update (same statistics, ``k^2`` instead of ``D^2`` work per datum).
    num_compact_states
        K, the smallest number of states passed to ``log_factor_states_fn``
        (``2 <= K < D``; default ``min(4, D - 1)``).
    group_size
        Draws advanced together by ``sample.batched`` (see :func:`racing_batch`).
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
        default 0.25 is the measured ratio on CPU (see ``DEFAULT_EXACT_PASS_COST``).
        Ignored when ``exact=True``.
    skew_guard
        ``g >= 0`` or None (``bound="normal"`` only). Racing-Normal assumes Normal
        stage means; with skewed rewards it errs more often than ``delta``. The
        guard keeps third moments of each arm's rewards, uses the Cornish-Fisher
        threshold ``B + g_T (B^2 - 1) / 6`` (``g_T = skew / sqrt(T)``, the larger
        of the pair's) and eliminates nothing while ``g_T > g``. Default 0.5,
        chosen by measurement (docs/racing_kernels.md); None is the paper's rule.
    block_size
        B >= 1, the sampling unit (issue 16, item 3). With ``B > 1`` the race
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
    -------
    sample
        ``sample(rng_key, log_f0, beta=None) -> (x, info)`` with ``log_f0`` of shape ``[D]``
        (float32 or float64; rewards are computed in its dtype), ``x`` an int32
        state and ``info`` a :class:`RacingInfo`. Pure: ``jit`` and ``vmap`` it.
        ``beta`` (traceable inverse temperature, ``None`` for 1, ``inf`` for the
        MAP state) makes the draw follow ``p^beta`` (annealed Gibbs, paper §5.3):
        ``argmax_i beta S_i + eps_i = argmax_i S_i + eps_i / beta``, so only the
        Gumbel noise is rescaled and the race is unchanged.
        ``sample.batched(rng_keys [B], log_f0s [B, D]) -> (x [B], info)`` draws B
        samples with work proportional to the unfinished draws (same results as
        ``jax.vmap(sample)``, which runs every loop until its slowest draw is done).

    Raises
    ------
    ValueError
        Bad configuration: delta not in (0, 1), first_batch_size < 2 or > N,
        D < 2, unknown bound/variance, EBS without reward_range, N * D too large.

    References
    ----------
    Chen & Ghahramani (2016), Alg. 1, eqs. 6-9 and 12, §3.4.
    """
    single, batched, coef_a, coef_b = _build_racing(
        log_factor_fn, num_states, num_data, delta=delta, first_batch_size=first_batch_size, bound=bound,
        variance=variance, reward_range=reward_range, control_variate=control_variate, gumbel_noise=gumbel_noise,
        exact=exact, max_block_size=max_block_size, log_factor_states_fn=log_factor_states_fn,
        num_compact_states=num_compact_states, group_size=group_size, exact_pass_cost=exact_pass_cost, with_params=False, skew_guard=skew_guard,
        block_size=block_size,
    )

    def sample(rng_key: PRNGKey, log_f0: Array, beta=None) -> tuple[Array, RacingInfo]:
        return single(rng_key, log_f0, None, coef_a, coef_b, check_beta(beta, gumbel_noise))

    def sample_with_coefficients(rng_key, log_f0, coef_a, coef_b):
        return single(rng_key, log_f0, None, coef_a, coef_b)

    def sample_batched(rng_keys: PRNGKey, log_f0s: Array, beta=None) -> tuple[Array, RacingInfo]:
        return batched(rng_keys, log_f0s, None, coef_a, coef_b, check_beta(beta, gumbel_noise))

    def sample_batched_with_coefficients(rng_keys, log_f0s, coef_a, coef_b):
        return batched(rng_keys, log_f0s, None, coef_a, coef_b)

    # with_coefficients: the threshold coefficients of racing_coefficients() as (traceable)
    # arguments, so one compiled sampler serves many deltas (experiments/racing_synthetic.py
    # vmaps over delta); batched: many draws at once, work proportional to the unfinished draws.
    return RacingSampler(sample, sample_batched, sample_with_coefficients, sample_batched_with_coefficients)


def racing_batch(
    log_factor_fn: Callable[[Array, object], Array],
    num_states: int,
    num_data: int,
    *,
    delta: float,
    group_size: int = 16,
    first_batch_size: int = 50,
    bound: str = "normal",
    variance: str = "pairwise",
    reward_range=None,
    control_variate=None,
    gumbel_noise: bool = True,
    exact: bool = False,
    max_block_size: int | None = None,
    log_factor_states_fn: Callable[[Array, Array, object], Array] | None = None,
    num_compact_states: int | None = None,
    exact_pass_cost: float | None = DEFAULT_EXACT_PASS_COST,
    skew_guard: float | None = DEFAULT_SKEW_GUARD,
    block_size: int = 1,
) -> RacingBatchSampler:
    """Racing for a batch of B draws whose targets differ by per-draw parameters.

    ``jax.vmap(racing(...))`` runs every loop until the slowest of the B draws
    finishes, so a batch costs about B times its slowest draw (with a few hundred
    draws, some draw needs all N data). ``racing_batch`` runs the same stage
    bodies (one engine: :func:`racing`'s) on the *unfinished* draws only: each
    round moves the active draws to the front and advances them one chunk, in
    ``vmap``-ed groups of ``group_size`` plus single draws for the remainder, so
    the work is the sum over draws of what each one needs.

    Parameters
    ----------
    log_factor_fn
        ``log_factor_fn(indices [m], params) -> Array[m, D]``: ``log f_n(i)`` of
        one draw's target, ``params`` being that draw's slice of the ``params``
        pytree passed to ``sample_batch`` (e.g. the chain's current state in a
        Gibbs sweep). It is ``vmap``-ed over groups of draws.
    num_states, num_data, delta, first_batch_size, bound, variance, reward_range, gumbel_noise, exact, max_block_size, num_compact_states
        As in :func:`racing`.
    group_size
        g >= 1, the static number of draws advanced together (memory
        ``g * max_block_size * D``); the default 16 amortises the per-iteration
        overhead on small chunks while wasting nothing on finished draws.
    control_variate
        ``None`` or ``(h_fn, h_mean)`` with ``h_fn(indices, params) -> [m, D]`` and
        ``h_mean`` an array ``[D]`` or a function ``h_mean(params) -> [D]``.
    log_factor_states_fn
        Optional ``fn(indices [m], states [K], params) -> Array[m, K]`` (see :func:`racing`).
    exact_pass_cost
        As in :func:`racing`.

    Returns
    -------
    sample_batch
        ``sample_batch(rng_keys [B], log_f0s [B, D], params) -> (x [B], info)``
        with ``info`` a :class:`RacingInfo` of ``[B]`` arrays; every leaf of
        ``params`` has leading axis B (``params=None`` for a shared target).
        Draw b equals ``sample_batch.single(rng_keys[b], log_f0s[b], params_b)``,
        the single-draw sampler. Pure; ``jit`` it (B is static).
        For a ``log_factor_fn(indices)`` shared by all draws, use
        ``racing(...).batched(rng_keys, log_f0s)``.

    Notes
    -----
    Plain ``jax.vmap(racing(...))`` is not redirected here: ``log_factor_fn``
    may close over batched values, which a batching rule cannot gather per group.
    Pass them as ``params`` instead.
    """
    single, batched, coef_a, coef_b = _build_racing(
        log_factor_fn, num_states, num_data, delta=delta, first_batch_size=first_batch_size, bound=bound,
        variance=variance, reward_range=reward_range, control_variate=control_variate, gumbel_noise=gumbel_noise,
        exact=exact, max_block_size=max_block_size, log_factor_states_fn=log_factor_states_fn,
        num_compact_states=num_compact_states, group_size=group_size, exact_pass_cost=exact_pass_cost, with_params=True, skew_guard=skew_guard,
        block_size=block_size,
    )

    def sample_batch(rng_keys: PRNGKey, log_f0s: Array, params=None, beta=None) -> tuple[Array, RacingInfo]:
        return batched(rng_keys, log_f0s, params, coef_a, coef_b, check_beta(beta, gumbel_noise))

    def sample_single(rng_key: PRNGKey, log_f0: Array, params=None, beta=None) -> tuple[Array, RacingInfo]:
        return single(rng_key, log_f0, params, coef_a, coef_b, check_beta(beta, gumbel_noise))

    return RacingBatchSampler(sample_batch, sample_single)


def _build_racing(
    log_factor_fn, num_states, num_data, *, delta, first_batch_size, bound, variance, reward_range, control_variate,
    gumbel_noise, exact, max_block_size, log_factor_states_fn, num_compact_states, group_size, exact_pass_cost,
    with_params, skew_guard=DEFAULT_SKEW_GUARD, block_size=1,
):
    """Validate the configuration and build the engine (see :func:`racing`, :func:`racing_batch`).

    Returns ``(single, batched, coef_a, coef_b)``: ``single(key, log_f0, params, a, b)`` and
    ``batched(keys, log_f0s, params, a, b)``; ``params`` is ``None`` unless ``with_params``
    (then ``log_factor_fn(indices, params)`` etc.).
    """
    block_size = check_int("block_size", block_size, low=1)
    num_rows = check_int("num_data", num_data, low=2)
    if block_size > 1:
        _check_common(num_states, num_rows, 2)  # N * D within the int32 counters (in rows)
        num_data = -(-num_rows // block_size)  # the population: ceil(N / B) blocks
        if num_data < 2:
            raise ValueError(f"block_size must leave >= 2 blocks (block_size < num_data = {num_rows}); got {block_size}")
    num_states, num_data, first_batch_size = _check_common(num_states, num_data, first_batch_size)
    delta = check_real("delta", delta, low=0.0, high=1.0)
    bound = check_choice("bound", bound, ("normal", "ebs"))
    variance = check_choice("variance", variance, ("pairwise", "marginal"))
    reward_range = _reward_range(reward_range, num_states, required=(bound == "ebs"))
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
            reward_range = _scale_range(reward_range, block_size)
        log_factor_fn, log_factor_states_fn, cv = _blocked(
            log_factor_fn, log_factor_states_fn, cv, num_rows, block_size, num_data, with_params
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
            levels = _compaction_levels(num_states, k_min)
    elif variance == "pairwise" and num_states >= COLUMN_COMPACT_MIN_D:
        # No per-state factor: all D columns are still evaluated, but once at most
        # K_j arms survive only their columns enter the K_j x K_j co-moment update
        # (the D x D one dominates the cost per datum for large D).
        levels = _compaction_levels(num_states, 4)
    compact_enabled = bool(levels)

    D, N = num_states, num_data
    sizes = doubling_schedule(N, first_batch_size)
    num_stages = len(sizes)
    pairwise = variance == "pairwise"

    can_eliminate = not exact and num_stages > 1
    # Stage at which a still-running race switches to one contiguous exact pass
    # (see ``exact_pass_cost``); None: the race runs all its stages at random.
    switch_stage = None
    if exact_pass_cost is not None:
        exact_pass_cost = check_real("exact_pass_cost", exact_pass_cost, low=0.0, high=1.0, high_closed=True)
        # With D = 2 a running race has both arms alive, and the pass (2 N more rewards) would
        # always push its count past N D: it is never taken, so its loops are not compiled.
        if can_eliminate and num_states > 2:
            for t in range(1, num_stages):
                if sizes[t] - sizes[t - 1] >= exact_pass_cost * N:
                    switch_stage = t
                    break
    coef_a, coef_b = racing_coefficients(delta, D, N, first_batch_size, bound=bound, variance=variance)
    if skew_guard is not None:
        skew_guard = check_real("skew_guard", skew_guard, low=0.0)
    use_skew = skew_guard is not None and bound == "normal"
    b_threshold = float(coef_a[0] / stage_sd(N, sizes[:1])[0]) if use_skew and len(coef_a) else 0.0
    groups = _chunk_groups(sizes, first_batch_size, max_block_size)
    group_size = check_int("group_size", group_size, low=1)
    h_mean_fn = None
    if cv is not None and with_params and callable(cv.mean):
        h_mean_fn = cv.mean  # per-draw mean h_mean(params) -> [D]

    def call_factor(indices, params):
        return log_factor_fn(indices, params) if with_params else log_factor_fn(indices)

    def call_states(indices, arms, params):
        return log_factor_states_fn(indices, arms, params) if with_params else log_factor_states_fn(indices, arms)

    def call_cv(indices, params):
        return cv.fn(indices, params) if with_params else cv.fn(indices)

    # ------------------------------------------------------------------ engine
    # One draw is a (_RaceState, _Ctx) pair. ``init`` builds it, the stage body
    # ``make_body(chunk, compact)(s, c)`` advances it by one chunk of indices,
    # ``loop_specs`` lists the (cond, body) of the chunk-size loops in order, and
    # ``finish`` reads the decision. The single-draw path runs each loop as a
    # ``lax.while_loop``; the batched path (``_run_batched``) runs the same bodies
    # on groups of unfinished draws only.

    def init(rng_key, log_f0, params, coef_a, coef_b, beta=None):
        log_f0 = jnp.asarray(log_f0)
        if log_f0.shape != (D,) or not jnp.issubdtype(log_f0.dtype, jnp.floating):
            raise ValueError(f"log_f0 must be a float array of shape ({D},); got {log_f0.shape} {log_f0.dtype}")
        dtype = log_f0.dtype
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
        bad0 = jnp.any(jnp.isnan(offset) | (offset == jnp.inf))
        if cv is None:
            h_mean = None
        else:
            h_mean = jnp.asarray(h_mean_fn(params) if h_mean_fn is not None else cv.mean).astype(dtype)
            if h_mean.shape != (D,):
                raise ValueError(f"control_variate mean must have shape ({D},); got {h_mean.shape}")
        crange = None if reward_range is None else jnp.broadcast_to(jnp.asarray(reward_range, dtype), (D,))
        m2_shape = (D, D) if pairwise else (D,)
        state = _RaceState(
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
        ctx = _Ctx(
            round_keys=round_keys,
            offset_mean=offset_mean,
            h_mean=h_mean,
            crange=crange,
            coef_a=jnp.asarray(coef_a).astype(dtype) if can_eliminate else None,
            coef_b=jnp.asarray(coef_b).astype(dtype) if can_eliminate else None,
            params=params,
        )
        return state, ctx

    stage_ends_np = np.asarray(sizes, np.int32)

    def rewards(indices, c, dtype):
        r = jnp.asarray(call_factor(indices, c.params))
        if r.shape != (indices.shape[0], D):
            raise ValueError(f"log_factor_fn must return shape [m, {D}]; got {r.shape} for m={indices.shape[0]}")
        r = r.astype(dtype)
        if cv is not None:
            h = jnp.asarray(call_cv(indices, c.params)).astype(dtype)
            r = r - h + c.h_mean[None, :]
        return r

    def rewards_states(indices, arms, c, dtype):
        if log_factor_states_fn is None:  # column compaction only
            return rewards(indices, c, dtype)[:, arms]
        r = jnp.asarray(call_states(indices, arms, c.params))
        if r.shape != (indices.shape[0], arms.shape[0]):
            raise ValueError(f"log_factor_states_fn must return shape [m, {arms.shape[0]}]; got {r.shape}")
        r = r.astype(dtype)
        if cv is not None:  # the control variate is evaluated for all D states, then gathered
            r = r - jnp.asarray(call_cv(indices, c.params)).astype(dtype)[:, arms] + c.h_mean[arms][None, :]
        return r

    def estimates(mean_d, alive, c):
        return jnp.where(alive, mean_d + c.offset_mean, -jnp.inf)

    def skew_factor(m2_diag, m3, best, T):
        """Skewness guard (issue 16, item 7): ``(factor [D], allowed [D])`` for each pair (best, i).

        ``g = max(|skew_best|, |skew_i|)`` of the arms' (centred) rewards, ``g_T = g / sqrt(T)``
        the skewness of their mean. The normal threshold ``B`` becomes the Cornish-Fisher
        quantile ``B + g_T (B^2 - 1) / 6`` and no elimination is allowed while
        ``g_T > skew_guard`` (the Edgeworth expansion is then no guide).
        """
        var = jnp.maximum(m2_diag / T, jnp.finfo(m2_diag.dtype).tiny)
        g = jnp.abs(m3 / T) / var**1.5
        g = jnp.maximum(g[best], g)
        g_t = g / jnp.sqrt(T)
        factor = 1 + g_t * (b_threshold**2 - 1) / (6 * b_threshold)
        return jnp.maximum(factor, 1), g_t <= skew_guard

    def eliminate(mean_d, m2, alive, stage, count, c, m3=None):
        """Alg. 1's elimination step at the end of stage ``stage`` (T = count)."""
        mu = estimates(mean_d, alive, c)
        best = jnp.argmax(mu)
        gap = mu[best] - mu
        T = count.astype(mean_d.dtype)
        a_t = c.coef_a[stage]
        if use_skew:
            factor, allowed = skew_factor(jnp.diagonal(m2) if pairwise else m2, m3, best, T)
            a_t = a_t * factor
        if pairwise:
            var = (m2[best, best] + jnp.diagonal(m2) - 2 * m2[best]) / T
            threshold = a_t * jnp.sqrt(jnp.maximum(var, 0))
            if c.crange is not None:
                threshold = threshold + c.coef_b[stage] * (c.crange[best] + c.crange)
        else:
            g = a_t * jnp.sqrt(jnp.maximum(m2 / T, 0))
            if c.crange is not None:
                g = g + c.coef_b[stage] * c.crange
            threshold = g[best] + g
        out = gap > threshold
        if use_skew:
            # The gate is waived for gaps beyond SKEW_WAIVER times the (inflated) threshold:
            # rewards that are constant up to float rounding (an exact control variate) have
            # a meaningless sample skewness and would otherwise never be decided early.
            out = out & (allowed | (gap > SKEW_WAIVER * threshold))
        return alive & ~out

    def make_body(csize: int, k: int | None):
        """One chunk of ``csize`` indices. ``k`` (a compaction level): only the first
        ``k`` surviving arms (all of them, since the loop runs when ``n_alive <= k``)
        are evaluated, through ``log_factor_states_fn``; statistics live in the
        full [D] arrays. ``k = None``: all D columns."""
        compact = k is not None

        def body(s: _RaceState, c: _Ctx) -> _RaceState:
            dtype = s.mean_d.dtype
            stop = jnp.asarray(stage_ends_np)[s.stage]
            pos = s.count + jnp.arange(csize, dtype=jnp.int32)
            valid = pos < stop
            indices = permutation_indices(c.round_keys, jnp.minimum(pos, N - 1), N)
            if compact:
                arms = jnp.argsort(~s.alive, stable=True)[:k].astype(jnp.int32)  # alive arms first
                r = rewards_states(indices, arms, c, dtype)
                alive_c = s.alive[arms]
                mean_c = s.mean_d[arms]
            else:
                r = rewards(indices, c, dtype)
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
                kept = eliminate(mean_d, m2, alive, stage_c, count, c, m3)
                alive = jnp.where(at_end & ~is_final & ~bad, kept, alive)
            done = s.done | bad | (jnp.sum(alive, dtype=jnp.int32) <= 1) | (at_end & is_final)
            exact_pass = s.exact_pass
            if switch_stage is not None:
                # Entering ``switch_stage`` still running: take the exact pass when it keeps the
                # count within N D (see ``exact_pass_cost``): restart the sums at T = 0; the race
                # loops (``~exact_pass`` in their conditions) then leave this draw to the pass loop.
                take = (at_end & ~done & (s.stage == switch_stage - 1)
                        & (jnp.sum(alive, dtype=jnp.int32) * N <= N * D - num_eval))
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

        return body

    def make_pass_body(csize: int, k: int | None):
        """One chunk of the exact pass: indices ``count, ..., count + csize - 1`` in
        order (up to N), plain sums of the surviving arms' rewards in ``mean_d``.

        As in :func:`jaxsub.discrete.gumbel_max`, each datum's rewards are taken
        relative to its first evaluated column (a per-datum constant: differences
        are unchanged, the common level is removed), chunk sums are added with
        Kahan compensation, and a ``-inf`` reward shows as a ``-inf`` sum (read
        at the end of the pass) instead of an element-wise test. The alive set is
        fixed during the pass, so a level ``k`` evaluates the same k arms throughout.
        """
        compact = k is not None

        def body(s: _RaceState, c: _Ctx) -> _RaceState:
            dtype = s.mean_d.dtype
            pos = s.count + jnp.arange(csize, dtype=jnp.int32)
            valid = (pos < N)[:, None]
            indices = jnp.minimum(pos, N - 1)
            if compact:
                arms = jnp.argsort(~s.alive, stable=True)[:k].astype(jnp.int32)
                r = rewards_states(indices, arms, c, dtype)
            else:
                r = rewards(indices, c, dtype)
            y = _relative_block_sum(r, valid)
            if compact:
                y = jnp.zeros((D,), dtype).at[arms].set(jnp.where(s.alive[arms], y, 0))
            total, comp = _kahan_add(s.mean_d, s.pass_comp, jnp.where(s.alive, y, jnp.zeros((), dtype)))
            n_new = jnp.minimum(N - s.count, csize).astype(jnp.int32)
            count = s.count + n_new
            num_eval = s.num_evaluations + n_new * jnp.sum(s.alive, dtype=jnp.int32)
            at_end = count >= N
            # End of the pass: totals -> means; -inf sums are zero factors; NaN / +inf are flagged.
            dead = at_end & (total == -jnp.inf)
            alive = s.alive & ~dead
            bad = at_end & jnp.any(alive & ~jnp.isfinite(total))
            mean_d = jnp.where(at_end, jnp.where(alive, total / N, jnp.zeros((), dtype)), total)
            return s._replace(
                count=count, mean_d=mean_d, alive=alive, pass_comp=comp,
                done=s.done | at_end | bad | ~jnp.any(alive), has_nan=s.has_nan | bad, num_evaluations=num_eval,
            )

        return body

    # Stages with the same chunk size share one loop (few loops: short compile).
    # With compaction levels, one more loop per group and level evaluates only the
    # <= K_j surviving arms once no more than K_j remain.
    loop_specs = []

    def n_alive(s):
        return jnp.sum(s.alive, dtype=jnp.int32)

    def level_specs(running, make):
        """(cond, body) for all D columns, then each compaction level in turn."""
        if not levels:
            loop_specs.append((running, make(None)))
            return
        loop_specs.append((lambda s: running(s) & (n_alive(s) > levels[0]), make(None)))
        for j, k in enumerate(levels):
            below = levels[j + 1] if j + 1 < len(levels) else 0
            loop_specs.append((lambda s, below=below: running(s) & (n_alive(s) > below), make(k)))

    def race_specs(first_stage: int, last_stage: int, chunk_size: int):
        """Loops over stages first_stage..last_stage with one chunk size; draws that
        took the exact pass (at ``switch_stage``, in the stage body) are left alone."""

        def running(s):
            r = ~s.done & (s.stage <= last_stage)
            return r & ~s.exact_pass if switch_stage is not None else r

        level_specs(running, lambda k: make_body(chunk_size, k))

    # A race still running when it enters ``switch_stage`` takes the exact pass when that
    # keeps its count within the exact sampler's (num_evaluations <= N * D): the stage body
    # restarts its means at T = 0 and marks it; the pass loop then reads all N data in order
    # for its surviving arms. Other races go on with the random stages (same loops).
    first = 0
    for chunk_size, last_stage in groups:
        race_specs(first, last_stage, chunk_size)
        first = last_stage + 1
    if switch_stage is not None:
        in_pass = lambda s: ~s.done & s.exact_pass  # noqa: E731
        level_specs(in_pass, lambda k: make_pass_body(max_block_size, k))

    def finish(state, c):
        x = jnp.argmax(estimates(state.mean_d, state.alive, c)).astype(jnp.int32)
        no_state = ~jnp.any(state.alive)
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

    def run_loops(state, ctx, specs):
        for cond, body in specs:
            if cond == "map":
                state = body(state, ctx)
            else:
                state = jax.lax.while_loop(cond, lambda s, body=body: body(s, ctx), state)
        return state

    def single(rng_key, log_f0, params, coef_a, coef_b, beta=None):
        state, ctx = init(rng_key, log_f0, params, coef_a, coef_b, beta)
        state = run_loops(state, ctx, loop_specs[:1])
        if len(loop_specs) > 1:
            # A race decided in the first loop (most races with a good control variate, or
            # far-apart arms) skips the other loops' entry checks in one conditional.
            state = jax.lax.cond(state.done, lambda s: s, lambda s: run_loops(s, ctx, loop_specs[1:]), state)
        return finish(state, ctx)

    def batched(rng_keys, log_f0s, params, coef_a, coef_b, beta=None):
        log_f0s = jnp.asarray(log_f0s)
        if log_f0s.ndim != 2 or log_f0s.shape[1] != D or not jnp.issubdtype(log_f0s.dtype, jnp.floating):
            raise ValueError(f"log_f0s must be a float array of shape (B, {D}); got {log_f0s.shape} {log_f0s.dtype}")
        B = log_f0s.shape[0]
        lead = {jnp.shape(leaf)[0] if jnp.ndim(leaf) else None for leaf in jax.tree.leaves((rng_keys, params))}
        if lead != {B}:
            raise ValueError(f"rng_keys and every params leaf must have leading axis {B} (= log_f0s.shape[0])")
        beta_axis = None if beta is None or jnp.ndim(beta) == 0 else 0
        states, ctxs = jax.vmap(init, in_axes=(0, 0, 0, None, None, beta_axis))(
            rng_keys, log_f0s, params, coef_a, coef_b, beta
        )
        for cond, body in loop_specs:
            if cond == "map":
                states = jax.vmap(body)(states, ctxs)
            else:
                states = _run_batched(cond, body, states, ctxs, min(group_size, B))
        return jax.vmap(finish)(states, ctxs)

    return single, batched, coef_a, coef_b


class _Ctx(NamedTuple):
    """Per-draw constants of a race (the stage body's second argument)."""

    round_keys: Array  # uint32 keys of the Feistel permutation
    offset_mean: Array  # [D] (log f0 + Gumbel noise) / N
    h_mean: Array | None  # [D] control-variate mean
    crange: Array | None  # [D] reward ranges C_i (EBS)
    coef_a: Array | None  # per-stage threshold coefficients a_t
    coef_b: Array | None  # per-stage b_t
    params: object  # per-draw parameters of log_factor_fn (racing_batch), or None


def _run_batched(cond, body, states, ctxs, group_size: int):
    """Run ``while cond(s): s = body(s, c)`` for every draw of a batch, paying only for unfinished draws.

    Each *round* advances every draw with ``cond`` true by one chunk: the active
    draws are moved to the front (a stable ``argsort`` of the B flags, O(B log B)),
    then a ``while_loop`` over the ``n_active // g`` full groups gathers ``g``
    draws, runs the stage body ``vmap``-ed over them and scatters them back; the
    ``n_active % g`` remaining draws go one at a time, so no work is spent on
    finished draws. Under plain ``vmap`` every draw would pay for the slowest.
    Results are those of the single-draw loop for each draw.
    """
    B = jax.tree.leaves(states)[0].shape[0]
    g = group_size
    body_g = jax.vmap(body)
    cond_b = jax.vmap(cond)

    def gather(tree, sel):
        return jax.tree.map(lambda a: a[sel], tree)

    def scatter(tree, sel, new):
        return jax.tree.map(lambda a, v: a.at[sel].set(v), tree, new)

    def round_(states):
        active = cond_b(states)
        order = jnp.argsort(~active, stable=True).astype(jnp.int32)  # active draws first
        n_active = jnp.sum(active, dtype=jnp.int32)
        n_full = n_active // g

        def full_group(j, st):
            sel = jax.lax.dynamic_slice(order, (j * g,), (g,))
            return scatter(st, sel, body_g(gather(st, sel), gather(ctxs, sel)))

        states = jax.lax.fori_loop(0, n_full, full_group, states)
        if g > 1:

            def one(j, st):
                i = order[j]
                new = body(gather(st, i), gather(ctxs, i))
                return jax.tree.map(lambda a, v: a.at[i].set(v), st, new)

            states = jax.lax.fori_loop(n_full * g, n_active, one, states)
        return states

    return jax.lax.while_loop(lambda st: jnp.any(cond_b(st)), round_, states)


def racing_coefficients(
    delta: float, num_states: int, num_data: int, first_batch_size: int = 50, *, bound: str = "normal", variance: str = "pairwise"
) -> tuple[np.ndarray, np.ndarray]:
    """Per-stage coefficients ``(a_t, b_t)`` of ``G(T_t, sigma, C) = a_t sigma + b_t C``, t < t*.

    * normal (eq. 9): ``a_t = sqrt((1/T_t)(1 - (T_t - 1)/(N - 1))) B_Normal(delta')``, ``b_t = 0``;
    * EBS (eqs. 6-7): ``a_t = sqrt(2 rho_T log(5/delta'') / T_t)``,
      ``b_t = kappa log(5/delta'') / T_t`` with ``delta'' = delta' / (t* - 1)``;

    where ``delta' = delta / (D - 1)`` (pairwise) or ``delta / D`` (marginal).
    Returns float64 arrays of length ``t* - 1``.
    """
    delta = check_real("delta", delta, low=0.0, high=1.0)
    num_states, num_data, first_batch_size = _check_common(num_states, num_data, first_batch_size)
    bound = check_choice("bound", bound, ("normal", "ebs"))
    variance = check_choice("variance", variance, ("pairwise", "marginal"))
    D, N = num_states, num_data
    sizes = doubling_schedule(N, first_batch_size)
    num_stages = len(sizes)
    arm_delta = delta / (D - 1 if variance == "pairwise" else D)
    if num_stages == 1:
        return np.zeros(0), np.zeros(0)
    if bound == "normal":
        bn = b_normal(arm_delta, N, first_batch_size)
        return stage_sd(N, sizes[:-1]) * bn, np.zeros(num_stages - 1)
    log_term = math.log(5.0 * (num_stages - 1) / arm_delta)  # log(5 / (delta' / (t* - 1)))
    a = np.array([math.sqrt(2.0 * _ebs_rho(t, N) * log_term / t) for t in sizes[:-1]])
    b = np.array([KAPPA_EBS * log_term / t for t in sizes[:-1]])
    return a, b
