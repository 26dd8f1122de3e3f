"""The exact pass: a race still running at a late stage reads all N data in order instead.

At the first stage ``t >= 2`` whose new random data would cost more than one pass over
all ``N`` data in index order (``m_t = T_t - T_{t-1} >= c N``, ``c = exact_pass_cost``),
a running race restarts its sums at ``T = 0`` and computes the exact means of its
surviving arms (contiguous reads, no permutation, no co-moments), then returns their
argmax. This only removes error events, so Prop. 1's bound still holds.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxsub.racing.compaction import alive_first
from jaxsub.racing.exact import kahan_add, relative_block_sum
from jaxsub.racing.stage import RaceCtx, RaceState, call_model, rewards, rewards_states

__all__ = ["PASS_ROWS", "pass_body", "pass_chunk", "pass_levels", "switch_stage_of"]

#: Rows per chunk of the exact pass with ``block_size > 1`` (the pass reads rows in order through
#: the user's per-row functions; ``jaxsub.racing.gumbel_max`` reads blocks of 32768 rows).
PASS_ROWS = 32768

#: Whether the pass reads rows (``block_size > 1``); False: block sums (kept for A/B measurements only).
ROW_PASS = True


#: Whether the pass has its own finer compaction ladder (:func:`pass_levels`); False: the race's
#: levels (kept for A/B measurements only).
PASS_LADDER = True


def pass_levels(cfg) -> tuple:
    """Compaction levels of the exact pass: the race's levels ``K_1 > ... > K_last`` and the
    halvings ``ceil(K_1 / 2), ceil(K_1 / 4), ..., 2`` (e.g. D = 100: 25, 13, 7, 4, 2).

    The pass has no co-moments, so its cost per row is the factor evaluations of the ``k``
    arms it evaluates: a finer ladder evaluates at most about twice the survivors (2 survivors
    at level 4 evaluated 4 arms). Only with ``log_factor_states_fn`` (without it every column is
    evaluated anyway). Each level is one more (small) compiled loop."""
    levels = tuple(cfg.levels)
    if not levels or not PASS_LADDER or cfg.model.log_factor_states_fn is None:
        return levels
    out, k = set(levels), levels[0]
    while k > 2:
        k = -(-k // 2)
        out.add(k)
    return tuple(sorted(out, reverse=True))


def pass_chunk(cfg) -> int:
    """Population units (rows, or blocks when ``block_size > 1``) per chunk of the exact pass:
    never more than the population (a chunk past N would evaluate only masked rows)."""
    if cfg.block_size > 1 and ROW_PASS:
        return max(1, min(PASS_ROWS // cfg.block_size, cfg.num_data))
    return min(cfg.max_block_size, cfg.num_data)


def _row_rewards(cfg, rows, arms, c: RaceCtx, dtype):
    """``[m, D]`` (``arms`` None) or ``[m, k]`` rewards of single rows (``block_size > 1``): the
    user's per-row functions, and the control variate with its per-row mean."""
    fn, states_fn, cv = cfg.model.row_functions
    if arms is None:
        r = jnp.asarray(call_model(cfg, fn, rows, c.params)).astype(dtype)
    elif states_fn is None:
        r = jnp.asarray(call_model(cfg, fn, rows, c.params)).astype(dtype)[:, arms]
    else:
        r = jnp.asarray(call_model(cfg, states_fn, rows, arms, c.params)).astype(dtype)
    if cv is not None:
        h = jnp.asarray(call_model(cfg, cv.fn, rows, c.params)).astype(dtype)
        h_mean = c.h_mean * jnp.asarray(cfg.num_data / cfg.num_rows, dtype)  # per block -> per row
        if arms is not None:
            h, h_mean = h[:, arms], h_mean[arms]
        r = r - h + h_mean[None, :]
    return r


def switch_stage_of(sizes, num_data: int, num_states: int, exact_pass_cost: float, can_eliminate: bool) -> int | None:
    """The stage at which a running race takes the exact pass, or None (never)."""
    # With D = 2 a running race has both arms alive, and the pass (2 N more rewards) would
    # always push its count past N D: it is never taken, so its loops are not compiled.
    if not can_eliminate or num_states <= 2:
        return None
    for t in range(1, len(sizes)):
        if sizes[t] - sizes[t - 1] >= exact_pass_cost * num_data:
            return t
    return None


def pass_body(cfg, csize: int, k: int | None, s: RaceState, c: RaceCtx) -> RaceState:
    """One chunk of the exact pass: indices ``count, ..., count + csize - 1`` in
    order (up to N), plain sums of the surviving arms' rewards in ``mean_d``.

    As in :func:`jaxsub.racing.gumbel_max` (:func:`jaxsub.racing.exact.exact_sums`), each
    datum's rewards are taken relative to its first evaluated column (a per-datum
    constant: differences are unchanged, the common level is removed), chunk sums are
    added with Kahan compensation, and a ``-inf`` reward shows as a ``-inf`` sum (read
    at the end of the pass) instead of an element-wise test. The alive set is
    fixed during the pass, so a level ``k`` evaluates the same k arms throughout.
    """
    D, N = cfg.num_states, cfg.num_data
    compact = k is not None
    dtype = s.mean_d.dtype
    arms = alive_first(s.alive, k) if compact else None
    if cfg.block_size > 1 and ROW_PASS:
        # Blocks count, b, ..., b + csize - 1 are the rows b B, ..., (b + csize) B - 1: read them
        # in order through the per-row functions (no block sums: the pass only adds).
        rows = s.count * cfg.block_size + jnp.arange(csize * cfg.block_size, dtype=jnp.int32)
        valid = (rows < cfg.num_rows)[:, None]
        r = _row_rewards(cfg, jnp.minimum(rows, cfg.num_rows - 1), arms, c, dtype)
    else:
        pos = s.count + jnp.arange(csize, dtype=jnp.int32)
        valid = (pos < N)[:, None]
        indices = jnp.minimum(pos, N - 1)
        r = rewards_states(cfg, indices, arms, c, dtype) if compact else rewards(cfg, indices, c, dtype)
    y = relative_block_sum(r, valid)
    if compact:
        y = jnp.zeros((D,), dtype).at[arms].set(jnp.where(s.alive[arms], y, 0))
    total, comp = kahan_add(s.mean_d, s.pass_comp, jnp.where(s.alive, y, jnp.zeros((), dtype)))
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
        count=count,
        mean_d=mean_d,
        alive=alive,
        pass_comp=comp,
        done=s.done | at_end | bad | ~jnp.any(alive),
        has_nan=s.has_nan | bad,
        num_evaluations=num_eval,
    )
