"""The raced update (padded or ragged population) and :func:`race_conditional`, the one adapter into the engine.

**Racing** (Sub Gibbs, §5.3): a race over the D candidates whose rewards are the factors of a
subsample of the block's mentions. Arm ``y``'s population is ``C_y``; since the engine draws one
shared index set for all arms, a drawn mention ``j`` is a reward for its own cluster's arm and 0
for the others (:func:`~jaxsub.coreference.rewards.padded_rewards`, one factor evaluation per drawn
mention instead of D). The race's population is the members of the *large* candidates (small ones,
``N_y < m1`` or ``m1 N_y / K < λ``, are summed exactly, ``min_arm_draws``). A control variate
``h_y = β f(x_i, r_y)`` per large candidate (``r_y`` one member of ``C_y``; one extra evaluation
each, counted) makes a member's reward ``β (f - f(x_i, r_y))``, whose spread is small when clusters
are tight. The race runs at the narrowest static width in ``race_widths`` holding the candidates.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxsub.coreference.options import ClassConfig, race_costs, race_pays
from jaxsub.coreference.rewards import (
    Model,
    RaceArms,
    control_variate_rewards,
    factors,
    first_member_control_variate,
    member_at,
    padded_rewards,
    ragged_rewards,
)
from jaxsub.coreference.update import (
    Update,
    checked_info,
    chunk_sums,
    column_id,
    exact_update,
)
from jaxsub.discrete import racing

__all__ = ["Candidates", "candidates", "race_conditional", "raced_update"]


def race_conditional(
    rng_key,
    log_f0,
    log_factor_fn,
    *,
    schedule: str,
    num_states: int,
    num_data: int,
    delta: float,
    first_batch_size: int,
    log_factor_states_fn=None,
    control_variate=None,
    population_sizes=None,
    race_schedule: str = "doubling",
):
    """The one call into the racing engine of :mod:`jaxsub.discrete`.

    Draws ``argmax_y log_f0[y] + S_y`` by Racing-Normal; ``log_f0`` already carries the Gumbel noise
    (``gumbel_noise=False``), so the exact decision under the same noise can be re-made by the caller.

    * ``schedule="padded"``: :func:`jaxsub.discrete.racing` over one shared population of
      ``num_data`` indices (``log_factor_fn(indices [m]) -> [m, D]``), marginal variances,
      optional control variate, exact pass off (``info.num_data_used`` = drawn indices).
      The sweep passes no ``log_factor_states_fn``: its ``log_factor_fn`` evaluates one factor per
      drawn index whatever D (the other columns are zeros), so the engine's compaction levels would
      save no evaluation; without them the race compiles to half the code (1,104 -> 570 fusions in
      a 1,024-mention block's sweep, compile 18.7 -> 11.4 CPU-s) at the same decisions and run time
      (docs/guides/coreference.md).
    * ``schedule="ragged"``: :func:`jaxsub.discrete.racing_ragged`, one doubling schedule per arm
      over its own ``population_sizes[y]`` members (``log_factor_fn(indices [m, D]) -> [m, D]``),
      ``num_data`` = the static bound on every population.
    * ``race_schedule`` (padded only): the engine's stage schedule, ``"doubling"`` (Alg. 1) or
      ``"fixed"`` (one elimination test after ``first_batch_size`` draws with the one-stage quantile,
      then the surviving arms on the rest of the ``num_data`` indices; no doubling loops).

    Parameters
    ----------
    rng_key
        The race's key.
    log_f0
        ``[D]`` the candidates' exact parts, Gumbel noise included.
    log_factor_fn
        The rewards (see the schedules above).
    schedule
        ``"padded"`` or ``"ragged"``.
    num_states, num_data
        D and N (static).
    delta, first_batch_size
        The race's δ and m1.
    log_factor_states_fn, control_variate
        Passed to :func:`jaxsub.discrete.racing` (padded).
    population_sizes
        ``[D]`` per-arm populations (ragged).
    race_schedule
        ``"doubling"`` or ``"fixed"`` (padded).

    Returns
    -------
    tuple
        ``(x, RacingInfo)``.
    """
    if schedule == "ragged":
        from jaxsub.discrete import racing_ragged

        sample = racing_ragged(
            log_factor_fn, num_states, num_data, delta=delta, first_batch_size=first_batch_size, gumbel_noise=False
        )
        return sample(rng_key, log_f0, population_sizes)
    sample = racing(
        log_factor_fn,
        num_states,
        num_data,
        delta=delta,
        first_batch_size=first_batch_size,
        bound="normal",
        variance="marginal",
        control_variate=control_variate,
        gumbel_noise=False,
        log_factor_states_fn=log_factor_states_fn,
        exact_pass_cost=None,
        schedule=race_schedule,
        # The padded population (a cluster's few rewards among zeros) is skewed by design, so the
        # engine's default skew guard stops no race early here (every race reads all N); the
        # figures in docs/guides/coreference.md were measured with the paper's rule (guard off), which
        # is what this keeps. Its measured decision error is in docs/guides/coreference.md.
        skew_guard=None,
    )
    return sample(rng_key, log_f0)


class Candidates(NamedTuple):
    """The first ``d_cap`` candidate columns of an update, split into large (raced) and small arms.

    Attributes
    ----------
    n_c
        ``[D]`` members per column (``i`` removed).
    g_c
        ``[D]`` segment starts, relative to the block's first slot.
    large
        ``[D]`` raced columns.
    n_large, n_small, cum_large, cum_small
        ``[D]`` members of the large / small columns and their cumulative sums.
    k_large, k_small
        Their totals.
    """

    n_c: jax.Array
    g_c: jax.Array
    large: jax.Array
    n_large: jax.Array
    n_small: jax.Array
    cum_large: jax.Array
    cum_small: jax.Array
    k_large: jax.Array
    k_small: jax.Array


def candidates(cfg: ClassConfig, u: Update) -> Candidates:
    """The :class:`Candidates` of update ``u``.

    Small arms (padded schedule): a candidate with fewer members than the first batch (``N_y < m1``) or
    whose expected number of members in the first batch, ``m1 N_y / K``, is below ``min_arm_draws`` is
    summed exactly (``N_y`` evaluations) and left out of the race, whose shared population is the members
    of the large arms.
    """
    o = cfg.options
    ar_d = jnp.arange(cfg.d_cap, dtype=jnp.int32)
    state = u.state
    slots = jnp.clip(u.s + ar_d, 0, state.labels.shape[0] - 1)
    n_c = jnp.where(ar_d < u.nact, state.sizes[state.active[slots]], 0) - (ar_d == u.col_a).astype(jnp.int32)
    g_c = state.seg_start[slots] - u.s
    large = n_c > 0
    if o.min_arm_draws > 0 and o.schedule == "padded":  # λ = 0: every arm raced (the paper's rule)
        m1 = o.first_batch_size
        large = large & (n_c >= m1) & (n_c.astype(jnp.float32) * m1 >= o.min_arm_draws * u.K.astype(jnp.float32))
    n_large = jnp.where(large, n_c, 0)
    n_small = jnp.where(large, 0, n_c)
    cum_large = jnp.cumsum(n_large)
    cum_small = jnp.cumsum(n_small)
    return Candidates(n_c, g_c, large, n_large, n_small, cum_large, cum_small, cum_large[-1], cum_small[-1])


def _race_branch(cfg: ClassConfig, model: Model, u: Update, cand: Candidates, check, width: int, _=None):
    """The racing update at static race width ``width`` (columns ``>= width`` are empty: ``ncols <= width``)."""
    o = cfg.options
    padded = o.schedule == "padded"
    n_c, large = cand.n_c[:width], cand.large[:width]
    ar = jnp.arange(width, dtype=jnp.int32)
    zeros = jnp.zeros((width,), jnp.float32)
    arms = RaceArms(
        u.xi,
        u.mem_w,
        cand.g_c[:width],
        ar,
        u.col_a,
        u.skip,
        cand.cum_large[:width],
        cand.n_large[:width],
        jnp.maximum(cand.k_large, 1),
        zeros,
        zeros,
    )
    num_cv = jnp.zeros((), jnp.int32)
    cv = None
    if o.control_variate and padded:
        h, num_cv = first_member_control_variate(model, arms, large, u.ncols, max_large=cfg.max_large)
        h_mean = h * n_c.astype(jnp.float32) / cfg.n_cap
        arms = arms._replace(h=h, h_mean=h_mean)
        cv = (partial(control_variate_rewards, arms=arms, num_data=cfg.n_cap), h_mean)
    noise = jax.random.gumbel(u.k_noise, (width,))
    small_sums, bad_small = zeros, jnp.zeros((), bool)
    if padded:
        small = arms._replace(cum=cand.cum_small[:width], count=cand.n_small[:width])
        small_sums, bad_small = chunk_sums(
            partial(factors, model, u.xi), cand.k_small, partial(member_at, small), width, cfg.small_chunk
        )
    log_f0 = jnp.where(ar < u.ncols, small_sums, -jnp.inf) + noise
    common = {"num_states": width, "num_data": cfg.n_cap, "delta": o.delta, "first_batch_size": o.first_batch_size}
    if padded:
        x, rinfo = race_conditional(
            u.k_race,
            log_f0,
            partial(padded_rewards, arms=arms, model=model, num_data=cfg.n_cap),
            schedule="padded",
            control_variate=cv,
            race_schedule=o.race_schedule,
            **common,
        )
        used = rinfo.num_data_used + cand.k_small
    else:
        x, rinfo = race_conditional(
            u.k_race,
            log_f0,
            partial(ragged_rewards, arms=arms, model=model),
            schedule="ragged",
            population_sizes=n_c,
            **common,
        )
        used = rinfo.num_evaluations
    bad = rinfo.has_nan | bad_small
    new = jnp.where(bad, u.a, column_id(u, x))
    return new, checked_info(cfg, model, u, check, bad, used + num_cv, x, noise)


def raced_update(cfg: ClassConfig, model: Model, u: Update, exact, check):
    """Race or exact update (``lax.switch``): the race when the candidates fit the widest race, enough
    members remain for it and the cost model says it pays; at the narrowest width holding the candidates."""
    o = cfg.options
    cand = candidates(cfg, u)
    use_race = u.ncols <= cfg.d_cap
    if o.schedule == "padded":
        use_race = use_race & (cand.k_large >= 2 * o.first_batch_size)
    if not isinstance(exact, bool):
        use_race = use_race & ~exact
    width = jnp.sum(u.ncols > jnp.asarray(cfg.widths[:-1], jnp.int32), dtype=jnp.int32)
    if o.race_cost > 0:
        use_race = use_race & race_pays(
            u.K,
            cand.k_small,
            jnp.sum(cand.large, dtype=jnp.int32),
            race_costs(o.race_cost, cfg.widths),
            width,
            o.first_batch_size,
        )
    branches = [partial(exact_update, cfg, model, u)] + [
        partial(_race_branch, cfg, model, u, cand, check, w) for w in cfg.widths
    ]
    return jax.lax.switch(jnp.where(use_race, 1 + width, 0), branches, None)
