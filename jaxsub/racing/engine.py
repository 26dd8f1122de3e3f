"""Racing with a finite reward population: Alg. 1 of Chen & Ghahramani (2016).

This module is the *engine* of the racing family (:mod:`jaxsub.racing`, public alias
:mod:`jaxsub.discrete`); the racing MH / Gibbs kernels build on :func:`racing` and
:func:`racing_batch`. It wires small pure functions of a static
:class:`~jaxsub.racing.config.RaceConfig` into loops:

* :mod:`~jaxsub.racing.config` -- validation, the schedule and chunk sizes;
* :mod:`~jaxsub.racing.stage` -- a race's state and the stage body (moments, stage ends);
* :mod:`~jaxsub.racing.elimination` -- Alg. 1's elimination test (and the skewness guard);
* :mod:`~jaxsub.racing.compaction` -- work only on the surviving arms;
* :mod:`~jaxsub.racing.exact_pass` -- a late race reads all N data in order instead;
* :mod:`~jaxsub.racing.batching` -- many draws, paying only for the unfinished ones;
* :mod:`~jaxsub.racing.populations` -- block sampling units (``block_size``).

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
  with ``B_Normal(delta', N, m1)`` from :func:`jaxsub.racing.b_normal`;
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
  A batch of at most ``group_size`` draws (e.g. 16 MH chains) instead runs the first
  stage of every race as straight-line batched code (:func:`~jaxsub.racing.stage.first_stage`)
  and finishes its few undecided races one at a time
  (:func:`~jaxsub.racing.batching.run_sequential`); each draw's result is the same.
  Eliminated arms are masked (``log_factor_fn`` still returns all ``D``
  columns; ``info.num_evaluations`` counts only surviving arms, as in the paper).
  With ``log_factor_states_fn``, further loops per chunk size evaluate only the
  ``K_j`` first surviving arms once no more than ``K_j`` remain, for the
  compaction levels ``K_j = D // 4, D // 16, ..., K`` (:func:`~jaxsub.racing.compaction.compaction_levels`),
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
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxsub.racing.batching import first_round, run_batched, run_sequential
from jaxsub.racing.compaction import level_loops
from jaxsub.racing.config import (
    DEFAULT_EXACT_PASS_COST,
    DEFAULT_MAX_BLOCK,
    DEFAULT_SKEW_GUARD,
    LADDER,
    RaceConfig,
    RaceOptions,
    build_config,
    race_options,
)
from jaxsub.racing.data import resolve_num_data
from jaxsub.racing.exact_pass import pass_body, pass_chunk, pass_levels
from jaxsub.racing.info import RacingInfo, check_beta, check_factor_fn
from jaxsub.racing.stage import finish, first_stage, has_first_stage, init_race, stage_body
from jaxsub.types import Array, PRNGKey

__all__ = [
    "DEFAULT_EXACT_PASS_COST",
    "DEFAULT_MAX_BLOCK",
    "DEFAULT_SKEW_GUARD",
    "LADDER",
    "RaceOptions",
    "RacingBatchSampler",
    "RacingSampler",
    "loop_specs",
    "racing",
    "racing_batch",
    "run_draws",
    "run_single",
]


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


def racing(
    log_factor_fn: Callable[[Array], Array],
    num_states: int,
    num_data: int | None = None,
    *,
    delta: float,
    data=None,
    options: RaceOptions | None = None,
    **option_values,
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
        N >= 2 (use :func:`pad_populations` when arms have different ``N_i``): the number
        of data ``log_factor_fn`` indexes; optional when ``data`` is given.
    data
        Optional: the pytree of arrays (leading axis ``N``) that ``log_factor_fn`` indexes.
        When given, ``num_data`` may be omitted (it is the leading axis) and must equal it
        otherwise; NaN / inf in the data raises. Without it, ``num_data`` must equal the
        number of rows ``log_factor_fn`` indexes: it cannot be checked (a gather past the
        last row reads that row again).
    delta
        Error level in (0, 1): the total-variation distance to ``p`` is at most
        ``delta`` (Prop. 1; under the normal assumption for ``bound="normal"``).
    options, **option_values
        The race's options: the fields of :class:`~jaxsub.racing.config.RaceOptions`, where
        each is declared and documented once with its default (``first_batch_size``,
        ``bound``, ``variance``, ``reward_range``, ``control_variate``, ``gumbel_noise``,
        ``exact``, ``max_block_size``, ``log_factor_states_fn``, ``num_compact_states``,
        ``group_size``, ``exact_pass_cost``, ``skew_guard``, ``block_size``, ``schedule``), as keyword
        arguments or as one ``options=RaceOptions(...)`` record (keyword arguments
        override its fields).
        An unknown name raises ``TypeError``; a bad value ``ValueError``.

    Returns
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
        D < 2, unknown bound/variance, EBS without reward_range, N * D too large,
        ``num_data`` not the rows of ``data``, non-finite ``data``.

    References
    ----------
    Chen & Ghahramani (2016), Alg. 1, eqs. 6-9 and 12, §3.4.
    """
    opts = race_options(options, option_values, "racing")
    num_data = resolve_num_data(num_data, data, low=2)
    cfg, coef_a, coef_b = build_config(
        log_factor_fn, num_states, num_data, delta=delta, options=opts, with_params=False
    )
    check_factor_fn(log_factor_fn, cfg.num_states, (2,))
    gumbel_noise = opts.gumbel_noise
    loops = loop_specs(cfg)
    single = functools.partial(run_single, cfg, loops)
    batched = functools.partial(run_draws, cfg, loops)

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
    num_data: int | None = None,
    *,
    delta: float,
    data=None,
    options: RaceOptions | None = None,
    **option_values,
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
    num_states, num_data, delta, data
        As in :func:`racing`.
    options, **option_values
        The fields of :class:`~jaxsub.racing.config.RaceOptions`, as in :func:`racing`, with the
        model functions taking the draw's ``params`` last: ``control_variate`` is ``None`` or
        ``(h_fn, h_mean)`` with ``h_fn(indices, params) -> [m, D]`` and ``h_mean`` an array
        ``[D]`` or a function ``h_mean(params) -> [D]``; ``log_factor_states_fn(indices [m],
        states [K], params) -> [m, K]``; ``group_size`` (default 16) is the static number of
        draws advanced together (memory ``g * max_block_size * D``).

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
    opts = race_options(options, option_values, "racing_batch")
    num_data = resolve_num_data(num_data, data, low=2)
    cfg, coef_a, coef_b = build_config(log_factor_fn, num_states, num_data, delta=delta, options=opts, with_params=True)
    gumbel_noise = opts.gumbel_noise
    loops = loop_specs(cfg)
    single = functools.partial(run_single, cfg, loops)
    batched = functools.partial(run_draws, cfg, loops)

    def sample_batch(rng_keys: PRNGKey, log_f0s: Array, params=None, beta=None) -> tuple[Array, RacingInfo]:
        return batched(rng_keys, log_f0s, params, coef_a, coef_b, check_beta(beta, gumbel_noise))

    def sample_single(rng_key: PRNGKey, log_f0: Array, params=None, beta=None) -> tuple[Array, RacingInfo]:
        return single(rng_key, log_f0, params, coef_a, coef_b, check_beta(beta, gumbel_noise))

    return RacingBatchSampler(sample_batch, sample_single)


def loop_specs(cfg: RaceConfig) -> list:
    """``[(cond, body), ...]``: the loops of a race, in order (``body(state, ctx) -> state``).

    Stages with the same chunk size share one loop (few loops: short compile). With
    compaction levels, one more loop per group and level evaluates only the ``<= K_j``
    surviving arms once no more than ``K_j`` remain. A race still running when it enters
    ``switch_stage`` takes the exact pass when that keeps its count within the exact
    sampler's (``num_evaluations <= N * D``): the stage body restarts its means at ``T = 0``
    and marks it; the pass loops then read all N data in order for its surviving arms.
    Other races go on with the random stages (same loops).
    """
    switch_stage = cfg.switch_stage
    loops = []

    def race_loops(last_stage: int, chunk_size: int):
        """Loops over the stages up to ``last_stage`` with one chunk size; draws that
        took the exact pass (at ``switch_stage``, in the stage body) are left alone."""

        def running(s):
            r = ~s.done & (s.stage <= last_stage)
            return r & ~s.exact_pass if switch_stage is not None else r

        return level_loops(cfg.levels, running, lambda k: functools.partial(stage_body, cfg, chunk_size, k))

    for chunk_size, last_stage in cfg.chunk_groups:
        loops += race_loops(last_stage, chunk_size)
    if switch_stage is not None:
        in_pass = lambda s: ~s.done & s.exact_pass  # noqa: E731
        # The pass reads chunks of max_block_size rows, but never more than the population: a
        # chunk past N would evaluate only masked rows (at N = 100, D = 20, a default chunk of
        # 16384 rows made one race cost ~100 exact draws).
        chunk = pass_chunk(cfg)
        loops += level_loops(pass_levels(cfg), in_pass, lambda k: functools.partial(pass_body, cfg, chunk, k))
    return loops


def _run_loops(state, ctx, loops):
    for cond, body in loops:
        state = jax.lax.while_loop(cond, lambda s, body=body: body(s, ctx), state)
    return state


def run_single(cfg: RaceConfig, loops, rng_key, log_f0, params, coef_a, coef_b, beta=None):
    """One draw: ``init_race``, the loops as ``lax.while_loop``s, ``finish``."""
    state, ctx = init_race(cfg, rng_key, log_f0, params, coef_a, coef_b, beta)
    state = _run_loops(state, ctx, loops[:1])
    if len(loops) > 1:
        # A race decided in the first loop (most races with a good control variate, or
        # far-apart arms) skips the other loops' entry checks in one conditional.
        state = jax.lax.cond(state.done, lambda s: s, lambda s: _run_loops(s, ctx, loops[1:]), state)
    return finish(cfg, state, ctx)


def run_draws(cfg: RaceConfig, loops, rng_keys, log_f0s, params, coef_a, coef_b, beta=None):
    """B draws with per-draw keys, ``log_f0s`` [B, D] and ``params``: each loop through
    :func:`~jaxsub.racing.batching.run_batched` (work only on the unfinished draws)."""
    D = cfg.num_states
    log_f0s = jnp.asarray(log_f0s)
    if log_f0s.ndim != 2 or log_f0s.shape[1] != D or not jnp.issubdtype(log_f0s.dtype, jnp.floating):
        raise ValueError(f"log_f0s must be a float array of shape (B, {D}); got {log_f0s.shape} {log_f0s.dtype}")
    B = log_f0s.shape[0]
    lead = {jnp.shape(leaf)[0] if jnp.ndim(leaf) else None for leaf in jax.tree.leaves((rng_keys, params))}
    if lead != {B}:
        raise ValueError(f"rng_keys and every params leaf must have leading axis {B} (= log_f0s.shape[0])")
    beta_axis = None if beta is None or jnp.ndim(beta) == 0 else 0
    init = functools.partial(init_race, cfg)
    states, ctxs = jax.vmap(init, in_axes=(0, 0, 0, None, None, beta_axis))(
        rng_keys, log_f0s, params, coef_a, coef_b, beta
    )
    if B > cfg.group_size:
        # Many draws: rounds over the unfinished ones (measured: no gain from the
        # straight-line first stage at B = 256, N = 1e6 -- 0.96x, a longer compile -- since
        # those races run many stages).
        return jax.vmap(functools.partial(finish, cfg))(_run_rounds(loops, states, ctxs, cfg.group_size), ctxs)
    # At most one group (e.g. 16 MH chains): the first stage of every race as straight-line
    # code, then the few undecided races one at a time; most races are decided by their first
    # chunk (a good control variate, far-apart arms), and then the rest is skipped in one conditional.
    if has_first_stage(cfg):
        states = first_stage(cfg, states, ctxs)
    else:
        states = first_round(loops[0], states, ctxs)
    rest = functools.partial(run_sequential, loops, ctxs=ctxs)
    states = jax.lax.cond(jnp.any(~states.done), rest, lambda st: st, states)
    return jax.vmap(functools.partial(finish, cfg))(states, ctxs)


def _run_rounds(loops, states, ctxs, group_size: int):
    for cond, body in loops:
        states = run_batched(cond, body, states, ctxs, group_size)
    return states
