"""Timing helpers: A/B comparison in one run, medians, compile time apart."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

__all__ = ["Timing", "compare", "time_call", "format_rows"]


def _block(out):
    jax.block_until_ready(out)
    return out


def time_call(fn: Callable, *args) -> float:
    """Seconds for one call of ``fn(*args)``, waiting for device results."""
    start = time.perf_counter()
    _block(fn(*args))
    return time.perf_counter() - start


class Timing(dict):
    """Result of :func:`compare` (a dict, so it serialises to JSON directly)."""


def compare(
    baseline: Callable,
    candidate: Callable,
    baseline_args: Sequence[Any] = (),
    candidate_args: Sequence[Any] | None = None,
    *,
    repeats: int = 7,
    min_seconds: float = 0.0,
) -> Timing:
    """Time ``candidate`` against ``baseline`` in the same run.

    Both functions should already be jitted. The first call of each is timed
    separately as ``*_first_call_s`` (compilation + one run). Then the two are
    called alternately in rounds whose order flips (A, B, B, A, A, B, ...)
    ``repeats`` times each, so drifts in machine load and a call slowed by the
    one before it hit both alike; the medians give ``speedup = baseline /
    candidate``.

    Parameters
    ----------
    baseline, candidate
        Callables returning JAX arrays (results are blocked on).
    baseline_args, candidate_args
        Positional arguments; ``candidate_args`` defaults to ``baseline_args``.
        Pass a callable ``i -> args`` instead to vary inputs per repeat (e.g. new keys).
    repeats
        Timed calls of each.
    min_seconds
        Keep alternating past ``repeats`` until each side has this much timed total.

    Returns
    -------
    Timing
        ``baseline_s``, ``candidate_s`` (medians), ``speedup`` (their ratio),
        ``speedup_range`` (smallest and largest per-round ratio), the first-call
        times, ``repeats`` and the raw lists. Keep ``speedup_range`` in a row and the
        performance page shows the range beside the median.
    """
    if candidate_args is None:
        candidate_args = baseline_args

    def args_for(spec, i):
        return spec(i) if callable(spec) else tuple(spec)

    base_first = time_call(baseline, *args_for(baseline_args, 0))
    cand_first = time_call(candidate, *args_for(candidate_args, 0))
    base_times, cand_times = [], []
    i = 0
    while i < repeats or (min(sum(base_times), sum(cand_times)) < min_seconds and i < 1000):
        i += 1
        b_args, c_args = args_for(baseline_args, i), args_for(candidate_args, i)
        # Rounds alternate A, B and B, A: the call right after the exact sampler was measured
        # 1.14x slower on the discrete benchmark, so neither side always takes that slot.
        if i % 2:
            base_times.append(time_call(baseline, *b_args))
            cand_times.append(time_call(candidate, *c_args))
        else:
            cand_times.append(time_call(candidate, *c_args))
            base_times.append(time_call(baseline, *b_args))
    base_med = statistics.median(base_times)
    cand_med = statistics.median(cand_times)
    pairs = [b / c for b, c in zip(base_times, cand_times) if c > 0]
    return Timing(
        baseline_s=base_med,
        candidate_s=cand_med,
        speedup=base_med / cand_med if cand_med > 0 else float("inf"),
        speedup_range=[min(pairs), max(pairs)] if pairs else [float("nan"), float("nan")],
        baseline_first_call_s=base_first,
        candidate_first_call_s=cand_first,
        repeats=len(base_times),
        baseline_times=base_times,
        candidate_times=cand_times,
    )


def format_rows(rows: Sequence[dict]) -> str:
    """A plain-text table of the rows' scalar columns (lists are left out)."""
    if not rows:
        return "(no rows)"
    cols = [k for k in rows[0] if not isinstance(rows[0][k], (list, tuple, dict))]
    for r in rows[1:]:
        cols += [k for k in r if k not in cols and not isinstance(r[k], (list, tuple, dict))]

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    table = [cols] + [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table)
