"""Compaction: once few arms survive, work only on them (evaluations and k x k co-moments).

With ``log_factor_states_fn``, once at most ``K_j`` arms are alive only those ``K_j``
are evaluated; without it (pairwise variances, ``D >= COLUMN_COMPACT_MIN_D``) all ``D``
columns are evaluated but only the survivors' enter the co-moment update. The levels
``K_j = D // 4, D // 16, ..., K`` are static, so each is one compiled loop body.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxsub.types import Array

__all__ = ["COLUMN_COMPACT_MIN_D", "alive_first", "compaction_levels", "level_loops", "num_alive"]

#: Without ``log_factor_states_fn``, the pairwise co-moments are restricted to the
#: surviving columns (levels D // 4, D // 16, ..., 4) once at most that many arms
#: are alive, for D >= this.
COLUMN_COMPACT_MIN_D = 32

#: Ratio between successive compaction levels (co-moment work per datum drops 16x per level).
LEVEL_RATIO = 4


def compaction_levels(num_states: int, k_min: int) -> list[int]:
    """``[D // 4, D // 16, ..., k_min]``: each level a quarter of the previous one
    (co-moment work per datum drops 16x per level), stopping before a level
    would be under twice ``k_min``; at least ``[k_min]``."""
    levels = []
    k = num_states // LEVEL_RATIO
    while k >= 2 * k_min:
        levels.append(k)
        k //= LEVEL_RATIO
    return levels + [k_min]


def alive_first(alive: Array, k: int) -> Array:
    """The ``k`` first surviving arms (int32 ``[k]``; all survivors when at most ``k`` are alive)."""
    return jnp.argsort(~alive, stable=True)[:k].astype(jnp.int32)


def num_alive(state) -> Array:
    """Arms still in the race (int32)."""
    return jnp.sum(state.alive, dtype=jnp.int32)


def level_loops(levels, running, make) -> list:
    """``[(cond, body), ...]``: a loop over all D columns while more than ``K_1`` arms are
    alive, then one loop per compaction level ``K_j`` (``make(None)`` / ``make(K_j)`` build the
    bodies); without levels, one loop. ``running(state)`` says whether a draw still runs."""
    if not levels:
        return [(running, make(None))]
    loops = [(lambda s: running(s) & (num_alive(s) > levels[0]), make(None))]
    for j, k in enumerate(levels):
        below = levels[j + 1] if j + 1 < len(levels) else 0
        loops.append((lambda s, below=below: running(s) & (num_alive(s) > below), make(k)))
    return loops
