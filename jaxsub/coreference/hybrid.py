"""The hybrid update: small arms summed exactly over all the candidates, only the large arms raced.

Over all the block's candidate columns (``W``): an arm is *large* when ``N_y >= m1`` and
``m1 N_y >= λ K``; every other candidate (small clusters and the empty one) is summed exactly and
perturbed by its Gumbel noise, and only the best of them enters the race, as one column with no
uncertainty. ``argmax`` over {best exact, large arms} is the Gumbel-max decision over all
candidates, so the exact part is exact and the race (over the large arms only, width
``#large + 1``) keeps its δ. The noise is the exact update's (``gumbel(k_noise, (W,))``).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxsub.coreference.options import ClassConfig, race_costs, race_pays
from jaxsub.coreference.race import race_conditional
from jaxsub.coreference.rewards import (
    Model,
    RaceArms,
    control_variate_rewards,
    factors,
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

__all__ = ["HybridArms", "hybrid_arms", "hybrid_update"]


class HybridArms(NamedTuple):
    """All the candidate columns (``[W]``) of a hybrid update, split into large and small arms.

    Attributes
    ----------
    n_w
        ``[W]`` members per column (``i`` removed).
    large_w
        ``[W]`` raced columns.
    n_small_w
        ``[W]`` members of the small columns.
    num_large, k_small, k_large
        Raced columns, members of the small ones, members of the large ones.
    slots
        ``[W]`` the block's slots.
    """

    n_w: jax.Array
    large_w: jax.Array
    n_small_w: jax.Array
    num_large: jax.Array
    k_small: jax.Array
    k_large: jax.Array
    slots: jax.Array


def hybrid_arms(cfg: ClassConfig, u: Update) -> HybridArms:
    """The :class:`HybridArms` of update ``u``.

    λ (the expected members of an arm in the first batch of the *shared* population) concerns the padded
    race only; a per-arm (ragged) race draws m1 members of each large arm whatever K.
    """
    o = cfg.options
    m1 = o.first_batch_size
    ar_w = jnp.arange(cfg.width, dtype=jnp.int32)
    state = u.state
    slots = jnp.clip(u.s + ar_w, 0, state.labels.shape[0] - 1)
    n_w = jnp.where(ar_w < u.nact, state.sizes[state.active[slots]], 0) - (ar_w == u.col_a).astype(jnp.int32)
    lam = o.min_arm_draws if o.schedule == "padded" else 0.0
    large_w = (n_w >= m1) & (n_w.astype(jnp.float32) * m1 >= lam * u.K.astype(jnp.float32))
    n_small_w = jnp.where(large_w, 0, jnp.maximum(n_w, 0))
    k_small = jnp.sum(n_small_w, dtype=jnp.int32)
    return HybridArms(n_w, large_w, n_small_w, jnp.sum(large_w, dtype=jnp.int32), k_small, u.K - k_small, slots)


def _small_member(k, u: Update, cum_small_w, n_small_w, g_w):
    """The ``k``-th member of the small columns (all ``W`` columns; a sorted search)."""
    w = cum_small_w.shape[0]
    c = jnp.minimum(jnp.searchsorted(cum_small_w, k, side="right", method="scan_unrolled").astype(jnp.int32), w - 1)
    off = k - (cum_small_w[c] - n_small_w[c])
    off = off + ((c == u.col_a) & (off >= u.skip)).astype(jnp.int32)
    return u.mem_w[jnp.clip(g_w[c] + off, 0, w - 1)], c


def _mean_control_variate(cfg: ClassConfig, model: Model, u: Update, arms: RaceArms, live_r):
    """``(h, h_mean, evaluations)``: ``h_y`` = mean factor over the first ``cv_members`` members of ``C_y``
    other than ``i`` (fewer than ``m1 <= N_y``)."""
    q_members = cfg.options.cv_members
    q = jnp.arange(q_members, dtype=jnp.int32)
    off = q[None, :] + ((arms.col[:, None] == u.col_a) & (q[None, :] >= u.skip)).astype(jnp.int32)
    reps = u.mem_w[jnp.clip(arms.seg[:, None] + off, 0, cfg.width - 1)]
    h = jnp.mean(factors(model, u.xi, reps.reshape(-1)).reshape(reps.shape), axis=1)
    h = jnp.where(live_r & jnp.isfinite(h), h, 0.0)
    return h, h * arms.count.astype(jnp.float32) / cfg.n_cap


def _hybrid_race(cfg: ClassConfig, model: Model, u: Update, ha: HybridArms, check, width: int, _=None):
    """The hybrid race at static width ``width`` (``num_large + 1 <= width``). Everything here is computed
    only when the update races (inside the switch branch): the exact updates pay only the masks."""
    o = cfg.options
    ar_w = jnp.arange(cfg.width, dtype=jnp.int32)
    g_w = u.state.seg_start[ha.slots] - u.s
    cum_small_w = jnp.cumsum(ha.n_small_w)
    noise_w = jax.random.gumbel(u.k_noise, (cfg.width,))
    ar_r = jnp.arange(width, dtype=jnp.int32)
    lc_r = (
        jnp.zeros((width,), jnp.int32)
        .at[jnp.where(ha.large_w, jnp.cumsum(ha.large_w) - 1, width)]
        .set(ar_w, mode="drop")
    )
    live_r = ar_r < ha.num_large
    n_r = jnp.where(live_r, ha.n_w[lc_r], 0)
    zeros = jnp.zeros((width,), jnp.float32)
    arms = RaceArms(
        u.xi, u.mem_w, g_w[lc_r], lc_r, u.col_a, u.skip, jnp.cumsum(n_r), n_r, jnp.maximum(ha.k_large, 1), zeros, zeros
    )
    small_sums, bad_small = chunk_sums(
        partial(factors, model, u.xi),
        ha.k_small,
        partial(_small_member, u=u, cum_small_w=cum_small_w, n_small_w=ha.n_small_w, g_w=g_w),
        cfg.width,
        cfg.small_chunk,
    )
    exact_logits = jnp.where((ar_w < u.ncols) & ~ha.large_w, small_sums, -jnp.inf) + noise_w
    best_col = jnp.argmax(exact_logits).astype(jnp.int32)
    # columns: the large arms (compacted), then the best exact candidate, then nothing
    log_f0 = jnp.where(live_r, noise_w[lc_r], jnp.where(ar_r == ha.num_large, exact_logits[best_col], -jnp.inf))
    num_cv = jnp.zeros((), jnp.int32)
    common = {"num_states": width, "num_data": cfg.n_cap, "delta": o.delta, "first_batch_size": o.first_batch_size}
    if o.schedule == "ragged":
        x, rinfo = race_conditional(
            u.k_race,
            log_f0,
            partial(ragged_rewards, arms=arms, model=model),
            schedule="ragged",
            population_sizes=n_r,
            **common,
        )
        used = rinfo.num_evaluations + ha.k_small
    else:
        cv = None
        if o.control_variate:
            h, h_mean = _mean_control_variate(cfg, model, u, arms, live_r)
            arms = arms._replace(h=h, h_mean=h_mean)
            num_cv = ha.num_large * o.cv_members
            cv = (partial(control_variate_rewards, arms=arms, num_data=cfg.n_cap), h_mean)
        x, rinfo = race_conditional(
            u.k_race,
            log_f0,
            partial(padded_rewards, arms=arms, model=model, num_data=cfg.n_cap),
            schedule="padded",
            control_variate=cv,
            race_schedule=o.race_schedule,
            **common,
        )
        used = rinfo.num_data_used + ha.k_small
    bad = rinfo.has_nan | bad_small
    x_col = jnp.where(x < ha.num_large, lc_r[jnp.minimum(x, width - 1)], best_col)
    new = jnp.where(bad, u.a, column_id(u, x_col))
    return new, checked_info(cfg, model, u, check, bad, used + num_cv, x_col, noise_w)


def hybrid_update(cfg: ClassConfig, model: Model, u: Update, exact, check):
    """Race (the large arms plus the best exact candidate) or exact update, by ``lax.switch``.

    The race when there is a large arm, its members are at least ``2 m1`` and the cost model says it
    pays; at the narrowest hybrid width holding ``#large + 1`` columns. Returns ``(new cluster id, SweepInfo)``.
    """
    o = cfg.options
    ha = hybrid_arms(cfg, u)
    use_race = (ha.k_large >= 2 * o.first_batch_size) & (ha.num_large >= 1)
    if not isinstance(exact, bool):
        use_race = use_race & ~exact
    width = jnp.sum(ha.num_large + 1 > jnp.asarray(cfg.hybrid_widths[:-1], jnp.int32), dtype=jnp.int32)
    if o.race_cost > 0:
        use_race = use_race & race_pays(
            u.K, ha.k_small, ha.num_large, race_costs(o.race_cost, cfg.hybrid_widths), width, o.first_batch_size
        )
    branches = [partial(exact_update, cfg, model, u)] + [
        partial(_hybrid_race, cfg, model, u, ha, check, w) for w in cfg.hybrid_widths
    ]
    return jax.lax.switch(jnp.where(use_race, 1 + width, 0), branches, None)
