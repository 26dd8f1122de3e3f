"""Racing (Sub) Gibbs sweep vs exact Gibbs sweep for pairwise-factor clustering (paper §5.3).

One block holding D clusters of N_y mentions each, at the true clustering (the converged regime
of annealed Gibbs), β = 1. Mentions are unit vectors ``c_y + 0.12 ε`` (ε standard normal) in R^32 (cluster centres
``c_y`` random), factor ``f = 4 (cos - 0.5)`` (:func:`jaxsub.coreference.similarity_factor` on a
``"tokens"`` field): members of one cluster attract (f ≈ +1.5), others repel (f ≈ -2).
A "sweep" updates the same V mentions (all of the block when it has at most 256 mentions,
else 64 spread over the clusters, 16 for the block of 200,000: ``visit``) with δ = 0.05, m1 = 50,
``max_candidates = 32``, the default race widths (16 and 32) and the default cost model
(``race_cost``: an update races only where it is expected to save more evaluations than a race's
fixed cost, so blocks below ~1,200 mentions are updated exactly). With the default small-arm rule
(``min_arm_draws=1``: arms with N_y < m1 or m1 N_y / K < 1 are summed exactly) the N_y = 10 rows and
the D = 200 rows (m1 N_y / K = 0.25; also more than ``max_candidates`` candidates) are exact updates inside the racing sweep. Timings alternate exact
and racing calls in one run (``benchmarks._common.compare``, medians; compile time apart); the
evaluation ratio comes from the sweeps' ``info.num_evaluations``.

Grid points with the same block size (N_y D) share one compiled sweep (the block structure is the
same; mentions and state are arguments), with a traced ``exact`` flag serving both samplers, so the
full grid compiles 5 sweeps plus 4 ragged ones. Each point also times the engine's per-arm schedules
(``schedule="ragged"``, :func:`jaxsub.discrete.racing_ragged`) against the padded shared population
(``schedule="padded"``, the default), alternating in one run, for blocks up to ``RAGGED_MAX_BLOCK``.
``--quick``: N_y ∈ {100, 1000}, D = 20. Full mode also prints the wall-clock target rows: one exact
vs one Sub sweep of 20,000 author mentions at the converged state (:func:`authors_sweep`), Sub with the
default cost model, with ``race_cost=0`` (racing wherever the rules allow) and with ``race_cost=0`` and the
hybrid update (``hybrid=True``, race widths 4 and K / m1 + 1: small arms summed exactly, only the large arms
raced), the same with the engine's single-test schedule (``race_schedule="fixed"``),
and the race's fixed cost in evaluations calibrated from each racing row; then the sufficient-statistics exact
sweep, and the per-update floor (the same mentions in blocks of 2, one evaluation per update).
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._common import compare
from jaxsub import coreference as co

TITLE = "coreference: racing Gibbs sweep vs exact Gibbs sweep (N_y x D grid)"
#: The ragged schedule is timed up to this block size (its sweep at 200,000 mentions takes ~15 s a call).
RAGGED_MAX_BLOCK = 20_000
SIM = co.packed_similarity({"v": "tokens"}, {"v": 4.0}, thresholds={"v": 0.5})
FACTOR = SIM.factor  # on rows of SIM.pack(mentions) (one dot product per pair batch)


def _problem(n_y: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(d, 32))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    truth = np.repeat(np.arange(d), n_y)
    v = centres[truth] + 0.12 * rng.normal(size=(truth.size, 32))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    mentions = SIM.pack({"v": jnp.asarray(v, jnp.float32)})
    blocks = co.make_blocks(np.zeros(truth.size, int))
    labels = blocks.position[np.searchsorted(truth, truth)]  # first mention of each cluster as its id
    return mentions, blocks, co.init(jnp.asarray(labels, jnp.int32), blocks)


def _visit(m: int) -> np.ndarray:
    if m <= 256:
        return np.arange(m)
    return np.linspace(0, m - 1, 16 if m > 100_000 else 64).astype(np.int64)


def _load() -> float:
    return os.getloadavg()[0]


def _sweeps(m: int):
    """Compiled sweeps for a block of m mentions: (exact-or-Sub with a traced flag, ragged)."""
    blocks = co.make_blocks(np.zeros(m, int))
    kw = dict(visit=_visit(m), max_candidates=32, delta=0.05)
    k_pad = co.build_kernel(blocks, **kw)
    k_rag = co.build_kernel(blocks, schedule="ragged", **kw)
    pad = jax.jit(lambda k, s, x, e: k_pad(k, s, FACTOR, x, 1.0, exact=e))
    rag = jax.jit(lambda k, s, x: k_rag(k, s, FACTOR, x, 1.0))  # compiled on first call (m <= RAGGED_MAX_BLOCK)
    return pad, rag


def run(*, quick: bool = False) -> list[dict]:
    grid = [(100, 20), (1000, 20)] if quick else [(n, d) for n in (10, 100, 1000) for d in (2, 20, 200)]
    grid = sorted(grid, key=lambda g: g[0] * g[1])
    rows, compiled = [], {}
    t_exact, t_sub = np.bool_(True), np.bool_(False)
    for n_y, d in grid:
        mentions, blocks, state = _problem(n_y, d)
        m = n_y * d
        t0 = time.perf_counter()
        if m not in compiled:
            compiled[m] = _sweeps(m)
        pad, rag = compiled[m]
        info_e = jax.block_until_ready(pad(jax.random.key(0), state, mentions, t_exact)[1])
        info_s = jax.block_until_ready(pad(jax.random.key(0), state, mentions, t_sub)[1])
        t1 = time.perf_counter()
        load0 = _load()
        timing = compare(
            lambda k: pad(k, state, mentions, t_exact)[0].labels,
            lambda k: pad(k, state, mentions, t_sub)[0].labels,
            lambda i: (jax.random.key(i),),
            lambda i: (jax.random.key(i),),
            repeats=3,
        )
        nan = float("nan")
        info_r, vs_pad, t2 = None, {"candidate_s": nan, "speedup": nan}, t1
        if m <= RAGGED_MAX_BLOCK:
            info_r = jax.block_until_ready(rag(jax.random.key(0), state, mentions)[1])
            t2 = time.perf_counter()
            vs_pad = compare(
                lambda k: pad(k, state, mentions, t_sub)[0].labels,
                lambda k: rag(k, state, mentions)[0].labels,
                lambda i: (jax.random.key(i),),
                lambda i: (jax.random.key(i),),
                repeats=3,
            )
        rows.append(
            {
                "N_y": n_y,
                "D": d,
                "block": m,
                "updates": int(_visit(m).size),
                "exact_s": timing["baseline_s"],
                "racing_s": timing["candidate_s"],
                "wallclock_ratio": timing["speedup"],
                "evaluation_ratio": int(info_e.num_evaluations) / max(int(info_s.num_evaluations), 1),
                "ragged_s": vs_pad["candidate_s"],
                "ragged_vs_padded_wallclock": vs_pad["speedup"],
                "ragged_evaluation_ratio": (
                    nan if info_r is None else int(info_e.num_evaluations) / max(int(info_r.num_evaluations), 1)
                ),
                "races": int(info_s.num_races),
                "exact_updates_in_racing_sweep": int(info_s.num_exact),
                "padded_first_calls_s": round(t1 - t0, 2),
                "ragged_first_call_s": round(t2 - t1, 2),
                "load_1min": round((load0 + _load()) / 2, 2),
            }
        )
    print(markdown(rows))
    if not quick:
        authors = authors_sweep()
        print(authors_markdown(authors))
        rows.extend(authors)
    return rows


def authors_sweep(num_mentions: int = 20_000, batch_size: int = 1) -> list[dict]:
    """The wall-clock target: one exact vs one Sub sweep on author mentions at the converged state.

    The author-mention generator of ``experiments.coreference`` (M = ``num_mentions``, entities up to
    1,000, blocking on first initial + surname, the packed similarity), δ = 0.05; exact Gibbs is
    compiled with ``exact=True`` (no racing code), Sub Gibbs apart, once with the default cost model
    (``race_cost``) and once with ``race_cost=0`` (every update the rules allow races); 6 exact annealed
    sweeps (β 0.3 → 2.0, seed 100) reach the converged state, then each Sub sweep alternates with the
    exact one at β = 2 (``compare``, 3 each, medians). Also returns the race's fixed cost calibrated
    from the ``race_cost=0`` pair, in evaluations of the exact sweep:
    ``F = (T_sub - T_exact E_sub / E_exact) / (races T_exact / E_exact)`` (all of the Sub sweep's time
    beyond its evaluations charged to its races; the cost model's ``race_cost`` is this figure).
    """
    os.environ.setdefault("JAXSUB_COREF_MENTIONS", str(num_mentions))
    from experiments.coreference import AUTHOR_KINDS, AUTHOR_THRESHOLDS, AUTHOR_WEIGHTS, _authors

    data = _authors(False)
    blocks, factor, mentions = data["blocks"], data["factor"], data["mentions"]
    state = co.init(None, blocks)
    suff_kernel = co.sufficient.build_kernel(
        blocks, AUTHOR_KINDS, AUTHOR_WEIGHTS, thresholds=AUTHOR_THRESHOLDS, scales={"year": 4.0}
    )
    args = (jax.random.key(0), state, jnp.float32(1.0))

    def compiled(**kw):
        kernel = co.build_kernel(blocks, delta=0.05, batch_size=batch_size, **kw)
        t0 = time.perf_counter()
        c = jax.jit(lambda k, s, b: kernel(k, s, factor, mentions, b, exact=False)).lower(*args).compile()
        return c, round(time.perf_counter() - t0, 1)

    kernel = co.build_kernel(blocks, delta=0.05, batch_size=batch_size)
    t0 = time.perf_counter()
    exact = jax.jit(lambda k, s, b: kernel(k, s, factor, mentions, b, exact=True)).lower(*args).compile()
    compile_exact = round(time.perf_counter() - t0, 1)
    for s_, beta in enumerate(np.linspace(0.3, 2.0, 6)):
        state, _ = exact(jax.random.key(100 + s_), state, jnp.float32(beta))
    f1 = co.b_cubed(np.asarray(state.labels), data["truth"]).f1
    info_e = exact(jax.random.key(1), state, jnp.float32(2.0))[1]
    rows = []
    for label, kw in (
        ("default", {}),
        ("0", {"race_cost": 0.0}),
        ("0, hybrid", {"race_cost": 0.0, "hybrid": True, "race_widths": (4,)}),
        ("0, hybrid, fixed", {"race_cost": 0.0, "hybrid": True, "race_widths": (4,), "race_schedule": "fixed"}),
    ):
        sub, compile_sub = compiled(**kw)
        info_s = sub(jax.random.key(1), state, jnp.float32(2.0))[1]
        load0 = _load()
        timing = compare(
            lambda k: exact(k, state, jnp.float32(2.0))[0].labels,
            lambda k: sub(k, state, jnp.float32(2.0))[0].labels,
            lambda i: (jax.random.key(1000 + i),),
            lambda i: (jax.random.key(1000 + i),),
            repeats=3,
        )
        e_ex, e_sub, races = int(info_e.num_evaluations), int(info_s.num_evaluations), int(info_s.num_races)
        t_eval = timing["baseline_s"] / e_ex
        cost = (timing["candidate_s"] - t_eval * e_sub) / (races * t_eval) if races else float("nan")
        rows.append(
            {
                "M": int(blocks.num_mentions),
                "race_cost": label,
                "b3_f1": float(f1),
                "exact_s": timing["baseline_s"],
                "sub_s": timing["candidate_s"],
                "wallclock_ratio": timing["speedup"],
                "evaluation_ratio": e_ex / max(e_sub, 1),
                "races": races,
                "exact_updates_in_sub_sweep": int(info_s.num_exact),
                "race_fixed_cost_evaluations": cost,
                "compile_exact_s": compile_exact,
                "compile_sub_s": compile_sub,
                "load_1min": round((load0 + _load()) / 2, 2),
            }
        )
    # the sufficient-statistics exact sweep (co.sufficient) vs the pairwise exact sweep, same converged state
    s_state = co.sufficient.init(state.labels, blocks)
    suff, compile_suff = _compiled_sweep(lambda k, s, b: suff_kernel.step(k, s, mentions, b), s_state)
    info_f = suff(jax.random.key(1), s_state, jnp.float32(2.0))[1]
    rows.append(
        _exact_vs_row(
            "sufficient statistics",
            exact,
            state,
            suff,
            s_state,
            f1,
            int(info_e.num_evaluations) / max(int(info_f.num_candidates), 1),
            compile_exact,
            compile_suff,
            member_terms=int(info_f.num_member_terms),
        )
    )
    rows.append(_update_floor_row(data, state, exact, f1))
    return rows


def _compiled_sweep(fn, state):
    """``fn(key, state, beta)`` jitted and compiled ahead of time, with its compile seconds."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(jax.random.key(0), state, jnp.float32(1.0)).compile()
    return compiled, round(time.perf_counter() - t0, 1)


def _exact_vs_row(
    label, exact, state, other, other_state, f1, evaluation_ratio, compile_exact, compile_other, **extra
) -> dict:
    """An author row for an exact sweep ``other`` (no races) timed against ``exact`` at β = 2, same run."""
    load0 = _load()
    timing = compare(
        lambda k: exact(k, state, jnp.float32(2.0))[0].labels,
        lambda k: other(k, other_state, jnp.float32(2.0))[0].labels,
        lambda i: (jax.random.key(1000 + i),),
        lambda i: (jax.random.key(1000 + i),),
        repeats=3,
    )
    m = int(state.labels.shape[0])
    return {
        "M": m,
        "race_cost": label,
        "b3_f1": float(f1),
        "exact_s": timing["baseline_s"],
        "sub_s": timing["candidate_s"],
        "wallclock_ratio": timing["speedup"],
        "evaluation_ratio": evaluation_ratio,
        "races": 0,
        "exact_updates_in_sub_sweep": m,
        "race_fixed_cost_evaluations": float("nan"),
        "compile_exact_s": compile_exact,
        "compile_sub_s": compile_other,
        "load_1min": round((load0 + _load()) / 2, 2),
        **extra,
    }


def _update_floor_row(data, state, exact, f1) -> dict:
    """The per-update floor of a sequential sweep, same run (docs/guides/coreference.md).

    The same mentions, factor and exact kernel with the mentions paired into blocks of 2 (one
    candidate cluster plus the empty one: one factor evaluation per update), timed against the
    exact sweep at the converged state. Every update of a mention in a block of two or more costs at
    least the floor's per-update time (blocks of one are skipped), so ``exact / (floor U / M)``, with
    ``U`` the updated mentions, bounds the wall-clock ratio of every sampler built on these updates,
    however few evaluations its updates read. In the "Sub" columns: the floor sweep.
    """
    blocks, factor, mentions = data["blocks"], data["factor"], data["mentions"]
    pairs = co.make_blocks(np.arange(int(blocks.num_mentions)) // 2)
    p_state = co.init(None, pairs)
    kernel = co.build_kernel(pairs, delta=0.05)
    floor, compile_floor = _compiled_sweep(lambda k, s, b: kernel(k, s, factor, mentions, b, exact=True), p_state)
    e_ex = int(exact(jax.random.key(1), state, jnp.float32(2.0))[1].num_evaluations)
    e_fl = int(floor(jax.random.key(1), p_state, jnp.float32(2.0))[1].num_evaluations)
    return _exact_vs_row(
        "floor: blocks of 2", exact, state, floor, p_state, f1, e_ex / max(e_fl, 1), "–", compile_floor
    )


def authors_markdown(rows: list[dict]) -> str:
    """The author-mentions rows (targets: ≥ 2× wall-clock, ≥ 3× fewer evaluations per sweep).

    The row ``sufficient statistics`` is the exact sweep of :mod:`jaxsub.coreference.sufficient` in the "Sub"
    columns (its "evaluation ratio" is pairwise factor evaluations / candidate clusters scored, each an
    ``O(P)`` dot product with a cluster sum, plus one scalar categorical/numeric term per block member).
    The row ``floor: blocks of 2`` is :func:`_update_floor_row`: the exact sweep of the same mentions paired
    into blocks of 2 in the "Sub" columns, the per-update floor of every sequential sweep.
    """
    lines = [
        "| author mentions M | race_cost | B³ F1 | exact sweep s | Sub sweep s | wall-clock ratio | evaluation ratio | "
        "races / exact updates (Sub) | race fixed cost (evaluations) | compile s exact / Sub | load |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        lines.append(
            f"| {r['M']:,} | {r['race_cost']} | {r['b3_f1']:.4f} | {r['exact_s']:.3g} | {r['sub_s']:.3g} | "
            f"{r['wallclock_ratio']:.2f} | {r['evaluation_ratio']:.3g} | {r['races']:,} / "
            f"{r['exact_updates_in_sub_sweep']:,} | {r['race_fixed_cost_evaluations']:.0f} | "
            f"{r['compile_exact_s']} / {r['compile_sub_s']} | {r['load_1min']:.1f} |"
        )
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    """The benchmark's table in markdown (the docs' format)."""
    head = (
        "| N_y | D | block | V | exact s | racing s | wall-clock ratio | evaluation ratio | "
        "ragged vs padded wall-clock | exact / ragged evaluations | load |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r['N_y']} | {r['D']} | {r['block']:,} | {r['updates']} | {r['exact_s']:.3g} | "
            f"{r['racing_s']:.3g} | {r['wallclock_ratio']:.2f} | {r['evaluation_ratio']:.3g} | "
            f"{r['ragged_vs_padded_wallclock']:.2f} | {r['ragged_evaluation_ratio']:.3g} | "
            f"{r['load_1min']:.1f} |"
        )
    return "\n".join(lines)
