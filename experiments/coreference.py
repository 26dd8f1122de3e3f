"""Figure 3 of Chen & Ghahramani (2016), §5.3: author coreference, Sub (racing) Gibbs vs exact Gibbs.

Model: the pairwise-factor CRF ``p(y|x) ∝ exp(β Σ_{i<j, y_i=y_j} f(x_i, x_j))`` with the default
similarity factor of :func:`jaxsub.coreference.similarity_factor` (evaluated in its packed form,
:func:`jaxsub.coreference.packed_similarity`: same values), blocking, every mention
starting alone (as in the paper), annealed Gibbs for MAP (β rising linearly over the sweeps).
Both samplers run the same sweep (:func:`jaxsub.coreference.fit`); Sub Gibbs resamples each
``y_i`` by Racing-Normal (δ = 0.05, m1 = 50) with the per-candidate control variate, candidate
clusters with fewer than m1 members (or m1 N_y / K < 1) being summed exactly; exact
Gibbs evaluates every factor of every candidate.

Data sets:

* **Author-like mentions** (:func:`jaxsub.coreference.synthetic.author_mentions`): entity sizes
  Zipf(2.2) truncated at 1,000 (the largest entity set to the cap), names from FEBRL's Australian
  name-frequency tables (``jaxsub.datasets.febrl_name_frequencies``), co-authors, venues, title
  words, years; blocking on ``<first initial> <surname>``. Full mode: 10^5 mentions
  (``JAXSUB_COREF_MENTIONS`` overrides the count) (clusters up
  to 1,000, hundreds of entities per block); quick mode: 3,000 mentions, entities up to 150.
* **FEBRL 3** (full mode only; ``jaxsub.datasets.load_febrl(3)``: 5,000 records, true ids from
  ``rec_id``), blocking on the first letter of the given name.

Samplers: exact Gibbs; Sub Gibbs racing wherever the rules allow (``race_cost=0``, the paper's
sampler: its evaluations, F1 curves and decision error; in full mode with the hybrid update,
``FULL_KW``: small arms summed exactly, only the large arms raced); in full mode also Sub Gibbs with the default
cost model (``race_cost``: race only where a race is expected to save more evaluations than its fixed
cost, else the exact update), timed the same way. Runs of the samplers are interleaved.

Plots: B³ F1 vs factor evaluations, vs wall-clock and vs sweeps, every run. The decision error
rate at δ = 0.05 is measured on a separate Sub run that recomputes every race exactly under the
same Gumbel noise (``check_decisions=True``; not timed).
"""

from __future__ import annotations

import math
import os
import time

import jax
import numpy as np

from experiments._common import Report, progress, savefig
from jaxsub import coreference as co
from jaxsub.coreference.synthetic import author_mentions
from jaxsub.datasets import febrl_name_frequencies, load_febrl

TITLE = "Racing Gibbs for author coreference (paper §5.3, Fig. 3): Sub vs exact Gibbs"

AUTHOR_KINDS = {"name": "string", "coauthors": "tokens", "venue": "categorical", "title": "tokens", "year": "numeric"}
AUTHOR_WEIGHTS = {"name": 2.0, "coauthors": 3.0, "venue": 0.5, "title": 3.0, "year": 1.0}
AUTHOR_THRESHOLDS = {"name": 0.6, "coauthors": 0.15, "title": 0.25}
FEBRL_KINDS = {
    "given_name": "string",
    "surname": "string",
    "street_number": "string",
    "address_1": "string",
    "suburb": "string",
    "postcode": "string",
    "state": "categorical",
    "date_of_birth": "string",
    "soc_sec_id": "string",
}
DELTA = 0.05
FULL_RUNS = 7  # runs per sampler in full mode (the paper's Fig. 3)
#: Sub Gibbs settings of full mode and of ``--large``: race wherever the rules allow, with the
#: hybrid update (small arms summed exactly over all candidates, the best as one race column; race widths
#: 4 and K / m1 + 1). Per converged sweep at M = 20,000 (crf): 2.09x fewer evaluations than exact against
#: 1.83x for the plain padded race, 4 / 7,041 decision errors (docs/guides/coreference.md).
FULL_KW = dict(race_cost=0.0, hybrid=True, race_widths=(4,))
TOLERANCE = 0.005  # "reached the exact sampler's converged F1" = within 0.005 of its mean final B3 F1


#: ``high`` of :func:`jaxsub.coreference.crf_similarity` for the author fields (compatible above, 0 between)
AUTHOR_HIGH = {"name": 0.85, "coauthors": 0.45, "title": 0.55}
#: bias of the CRF factor: its templates average -0.2 within an entity and -7.3 across (300 mentions, M = 2,000)
AUTHOR_CRF_BIAS = 1.5


def _authors(quick: bool, factor: str | None = None):
    """Author mentions with the packed similarity (``factor="packed"``, default) or the thresholded CRF
    templates (``"crf"``, :func:`jaxsub.coreference.crf_similarity`); env ``JAXSUB_COREF_FACTOR`` sets the default."""
    factor = factor or os.environ.get("JAXSUB_COREF_FACTOR", "packed")
    m, cap = (3000, 150) if quick else (int(os.environ.get("JAXSUB_COREF_MENTIONS", 100_000)), 1000)
    gen = author_mentions(m, febrl_name_frequencies(), seed=0, max_entity_size=cap)
    enc = co.encode_mentions(gen.fields, AUTHOR_KINDS, hash_dim=32)
    if factor == "crf":
        sim = co.crf_similarity(
            AUTHOR_KINDS,
            AUTHOR_WEIGHTS,
            thresholds=AUTHOR_THRESHOLDS,
            high=AUTHOR_HIGH,
            scales={"year": 4.0},
            bias=AUTHOR_CRF_BIAS,
        )
    else:
        sim = co.packed_similarity(AUTHOR_KINDS, AUTHOR_WEIGHTS, thresholds=AUTHOR_THRESHOLDS, scales={"year": 4.0})
    return dict(
        name=f"author mentions (M = {m:,}, {factor} factor)",
        mentions=jax.jit(sim.pack)(enc),
        truth=gen.entity,
        factor=sim.factor,
        blocks=co.make_blocks(gen.block_keys),
        factor_name=factor,
    )


def _febrl():
    records, ids = load_febrl(3)
    enc = co.encode_mentions({k: records[k].tolist() for k in FEBRL_KINDS}, FEBRL_KINDS)
    sim = co.packed_similarity(FEBRL_KINDS, thresholds={k: 0.6 for k in FEBRL_KINDS})
    enc, f = jax.jit(sim.pack)(enc), sim.factor
    keys = [str(g)[:1] if g else "?" for g in records["given_name"]]
    return dict(name="FEBRL 3 (5,000 records)", mentions=enc, truth=ids, factor=f, blocks=co.make_blocks(keys))


def _describe(data):
    truth, blocks = data["truth"], data["blocks"]
    ent = np.bincount(np.unique(truth, return_inverse=True)[1])
    per_block = {}
    for p, i in enumerate(blocks.order):
        per_block.setdefault(int(blocks.start[p]), set()).add(int(truth[i]))
    epb = np.array([len(v) for v in per_block.values()])
    return dict(
        mentions=int(truth.size),
        entities=int(ent.size),
        max_entity=int(ent.max()),
        blocks=int(epb.size),
        max_block=int(blocks.size.max()),
        max_entities_per_block=int(epb.max()),
        exact_evals_per_sweep=int(np.sum(blocks.block_sizes() * (blocks.block_sizes() - 1))),
    )


def _compiled(data, shared: bool, **kw):
    """``{mode: compiled sweep(key, state, mentions, beta)}`` for modes "exact", "sub", "check".

    ``shared`` (quick mode): one compilation with traced ``exact`` / ``check_decisions`` flags
    serves the three (a ``lax.cond`` per update selects the branch). Otherwise the exact sweep is
    compiled with ``exact=True`` static (no racing code in it) and Sub Gibbs / the check share one
    compilation with a traced ``check_decisions`` flag.
    """
    kernel = co.build_kernel(data["blocks"], delta=DELTA, **kw)
    factor = data["factor"]
    state = co.init(None, data["blocks"])
    args = (jax.random.key(0), state, data["mentions"], np.float32(1.0))
    t_bool, f_bool = np.bool_(True), np.bool_(False)
    out, seconds = {}, {}
    t0 = time.perf_counter()
    if shared:
        c = jax.jit(lambda k, s, x, b, e, ch: kernel(k, s, factor, x, b, e, ch)).lower(*args, t_bool, t_bool).compile()
        out["exact"] = lambda k, s, x, b: c(k, s, x, b, t_bool, f_bool)
        out["sub"] = lambda k, s, x, b: c(k, s, x, b, f_bool, f_bool)
        out["check"] = lambda k, s, x, b: c(k, s, x, b, f_bool, t_bool)
        seconds["exact"] = seconds["sub"] = time.perf_counter() - t0
        return out, seconds
    c = jax.jit(lambda k, s, x, b: kernel(k, s, factor, x, b, True)).lower(*args).compile()
    out["exact"] = c
    seconds["exact"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    c2 = jax.jit(lambda k, s, x, b, ch: kernel(k, s, factor, x, b, False, ch)).lower(*args, t_bool).compile()
    out["sub"] = lambda k, s, x, b: c2(k, s, x, b, f_bool)
    out["check"] = lambda k, s, x, b: c2(k, s, x, b, t_bool)
    seconds["sub"] = time.perf_counter() - t0
    return out, seconds


def _run(data, betas, kernel, seed):
    f1, pw = [], []

    def score(_, labels):
        f1.append(co.b_cubed(labels, data["truth"]).f1)
        pw.append(co.pairwise_f1(labels, data["truth"]).f1)

    _, tr = co.fit(
        jax.random.key(seed), data["factor"], data["mentions"], data["blocks"], betas, sweep=kernel, callback=score
    )
    return dict(
        f1=np.asarray(f1),
        pairwise=np.asarray(pw),
        evals=np.cumsum(tr.num_evaluations),
        seconds=np.cumsum(tr.seconds),
        races=tr.num_races,
        exact=tr.num_exact,
        errors=tr.num_errors,
        checked=tr.num_checked,
        nan=tr.num_nan,
    )


def _reach(runs, threshold, key):
    """Per run: the cumulative ``key`` at the first sweep whose F1 >= threshold (NaN if never)."""
    out = []
    for r in runs:
        hit = np.flatnonzero(r["f1"] >= threshold)
        out.append(float(r[key][hit[0]]) if hit.size else math.nan)
    return np.asarray(out)


def _wilson(k, n, z=1.96):
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (c - h, c + h)


def _study(data, betas, num_runs, rep, out_dir, tag, bar, kw, shared, cost_kw=None):
    """Exact vs Sub Gibbs (``kw``) runs, the decision check; with ``cost_kw`` also Sub Gibbs with those
    settings (the cost model), timed runs only. Runs are interleaved (run r of every sampler, then r + 1)
    so that load drifts hit all samplers alike."""
    sweeps, seconds = _compiled(data, shared, **kw)
    compile_s = {True: seconds["exact"], False: seconds["sub"]}
    modes = ["exact", "sub"]
    if cost_kw is not None:
        cost_sweeps, cost_seconds = _compiled(data, False, **cost_kw)
        sweeps["cost"] = cost_sweeps["sub"]
        compile_s["cost"] = cost_seconds["sub"]
        modes.append("cost")
    res = {mode: [] for mode in modes}
    for r in range(num_runs):
        for mode in modes:
            res[mode].append(_run(data, betas, sweeps[mode], seed=100 + r))
            bar.update(1)
    check = _run(data, betas, sweeps["check"], seed=999)
    bar.update(1)
    ex, sub = res["exact"], res["sub"]
    converged = float(np.mean([r["f1"][-1] for r in ex]))
    thr = converged - TOLERANCE
    reach = {k: (_reach(ex, thr, k), _reach(sub, thr, k)) for k in ("evals", "seconds")}
    ratio = {
        k: float(np.nanmedian(a) / np.nanmedian(b)) if np.isfinite(np.nanmedian(b)) else math.nan
        for k, (a, b) in reach.items()
    }
    final_ratio_evals = float(np.median([e["evals"][-1] for e in ex]) / np.median([s["evals"][-1] for s in sub]))
    last_sweep_evals = float(
        np.median([np.diff(np.r_[0, e["evals"]])[-1] for e in ex])
        / np.median([np.diff(np.r_[0, s["evals"]])[-1] for s in sub])
    )
    last_sweep_time = float(
        np.median([np.diff(np.r_[0, e["seconds"]])[-1] for e in ex])
        / np.median([np.diff(np.r_[0, s["seconds"]])[-1] for s in sub])
    )
    f1_ex = np.array([r["f1"] for r in ex])
    f1_sub = np.array([r["f1"] for r in sub])
    spread = float(np.max(f1_ex.max(0) - f1_ex.min(0)))
    gap = float(np.max(np.abs(f1_ex.mean(0) - f1_sub.mean(0))))
    errors, checked = int(check["errors"].sum()), int(check["checked"].sum())
    metrics = dict(
        data=_describe(data),
        betas=betas.tolist(),
        runs=num_runs,
        converged_exact_b3_f1=converged,
        final_b3_f1_exact=f1_ex[:, -1].tolist(),
        final_b3_f1_sub=f1_sub[:, -1].tolist(),
        final_pairwise_f1_exact=[r["pairwise"][-1] for r in ex],
        final_pairwise_f1_sub=[r["pairwise"][-1] for r in sub],
        evals_to_converged_exact=reach["evals"][0].tolist(),
        evals_to_converged_sub=reach["evals"][1].tolist(),
        seconds_to_converged_exact=reach["seconds"][0].tolist(),
        seconds_to_converged_sub=reach["seconds"][1].tolist(),
        evaluation_ratio_to_converged=ratio["evals"],
        wallclock_ratio_to_converged=ratio["seconds"],
        evaluation_ratio_all_sweeps=final_ratio_evals,
        evaluation_ratio_last_sweep=last_sweep_evals,
        wallclock_ratio_last_sweep=last_sweep_time,
        f1_vs_sweep_max_mean_gap=gap,
        f1_vs_sweep_max_exact_spread=spread,
        decision_errors=errors,
        decisions_checked=checked,
        decision_error_rate=errors / checked if checked else math.nan,
        error_rate_ci95=_wilson(errors, checked),
        nan_updates=int(sum(r["nan"].sum() for r in ex + sub)),
        compile_seconds_exact=compile_s[True],
        compile_seconds_sub=compile_s[False],
        kernel_settings=kw,
        races_per_sweep_sub=sub[0]["races"].tolist(),
        exact_updates_per_sweep_sub=sub[0]["exact"].tolist(),
    )
    if "cost" in res:
        cost = res["cost"]
        reach_c = {k: _reach(cost, thr, k) for k in ("evals", "seconds")}
        metrics.update(
            cost_model_settings=cost_kw,
            compile_seconds_cost=compile_s["cost"],
            final_b3_f1_cost=[r["f1"][-1] for r in cost],
            evals_to_converged_cost=reach_c["evals"].tolist(),
            seconds_to_converged_cost=reach_c["seconds"].tolist(),
            evaluation_ratio_to_converged_cost=float(np.nanmedian(reach["evals"][0]) / np.nanmedian(reach_c["evals"])),
            wallclock_ratio_to_converged_cost=float(
                np.nanmedian(reach["seconds"][0]) / np.nanmedian(reach_c["seconds"])
            ),
            f1_vs_sweep_max_mean_gap_cost=float(np.max(np.abs(f1_ex.mean(0) - np.mean([r["f1"] for r in cost], 0)))),
            races_per_sweep_cost=cost[0]["races"].tolist(),
        )
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    curves = [(ex, "C0", "exact Gibbs"), (sub, "C3", "Sub Gibbs (racing)")]
    if "cost" in res:
        curves.append((res["cost"], "C2", "Sub Gibbs, cost model"))
    for runs, colour, label in curves:
        for k, r in enumerate(runs):
            kw = dict(color=colour, alpha=0.6, label=label if k == 0 else None)
            axes[0].plot(r["evals"], r["f1"], **kw)
            axes[1].plot(r["seconds"], r["f1"], **kw)
            axes[2].plot(np.arange(1, r["f1"].size + 1), r["f1"], **kw)
    for ax, xl in zip(axes, ("factor evaluations", "wall-clock (s, compile excluded)", "sweeps")):
        ax.set_xlabel(xl)
        ax.set_ylabel("B³ F1")
        ax.axhline(thr, color="grey", ls=":", lw=1)
        ax.legend()
    axes[0].set_xscale("log")
    bar.set_postfix_str(f"{tag} done")
    fig.suptitle(data["name"])
    rep.heading(data["name"])
    d = metrics["data"]
    rep.text(
        f"{d['mentions']:,} mentions, {d['entities']:,} entities (largest {d['max_entity']:,}), "
        f"{d['blocks']:,} blocks (largest {d['max_block']:,} mentions, up to {d['max_entities_per_block']} "
        f"entities per block), exact Gibbs: {d['exact_evals_per_sweep']:,} factor evaluations per sweep. "
        f"{len(betas)} sweeps, β from {betas[0]:.2f} to {betas[-1]:.2f}; {num_runs} runs per sampler."
    )
    rep.figure(
        savefig(fig, out_dir, f"fig3_{tag}.png"), f"{data['name']}: B³ F1 vs factor evaluations, wall-clock, sweeps"
    )
    rows = [
        ["converged B³ F1 (exact, mean of final)", f"{converged:.4f}", ""],
        ["final B³ F1 exact / Sub (mean)", f"{f1_ex[:, -1].mean():.4f}", f"{f1_sub[:, -1].mean():.4f}"],
        [
            "final pairwise F1 exact / Sub (mean)",
            f"{np.mean(metrics['final_pairwise_f1_exact']):.4f}",
            f"{np.mean(metrics['final_pairwise_f1_sub']):.4f}",
        ],
        [
            "evaluations to reach converged − 0.005 (median) exact / Sub",
            f"{np.nanmedian(reach['evals'][0]):.3g}",
            f"{np.nanmedian(reach['evals'][1]):.3g}",
        ],
        ["  ratio exact / Sub (target ≥ 3)", f"{ratio['evals']:.2f}", ""],
        [
            "wall-clock to reach it (s, median) exact / Sub",
            f"{np.nanmedian(reach['seconds'][0]):.3g}",
            f"{np.nanmedian(reach['seconds'][1]):.3g}",
        ],
        ["  ratio exact / Sub (target ≥ 2)", f"{ratio['seconds']:.2f}", ""],
        ["last sweep: evaluation ratio / wall-clock ratio", f"{last_sweep_evals:.2f}", f"{last_sweep_time:.2f}"],
        ["F1-vs-sweep: max |mean gap| / max exact run-to-run spread", f"{gap:.4f}", f"{spread:.4f}"],
        [
            f"decision error rate at δ = {DELTA} (95% CI)",
            f"{metrics['decision_error_rate']:.4f}",
            f"[{metrics['error_rate_ci95'][0]:.4f}, {metrics['error_rate_ci95'][1]:.4f}] ({errors}/{checked})",
        ],
        ["compile s exact / Sub", f"{metrics['compile_seconds_exact']:.1f}", f"{metrics['compile_seconds_sub']:.1f}"],
    ]
    if "cost" in res:
        rows += [
            [
                "Sub with the cost model (race_cost default): evaluation / wall-clock ratio to converged",
                f"{metrics['evaluation_ratio_to_converged_cost']:.2f}",
                f"{metrics['wallclock_ratio_to_converged_cost']:.2f}",
            ],
            [
                "  races per sweep (first run) / F1 max |mean gap| vs exact",
                str(metrics["races_per_sweep_cost"]),
                f"{metrics['f1_vs_sweep_max_mean_gap_cost']:.4f}",
            ],
        ]
    rep.table(rows, ["quantity", "value", ""])
    return metrics


def run(out_dir, *, quick: bool) -> dict:
    rep = Report(TITLE, out_dir)
    rep.text(f"Mode: **{'quick' if quick else 'full'}**. " + __doc__.split("\n\n", 1)[1])
    # quick: one raced class of block sizes (min_race_size=256) to keep compilation short
    # race_cost=0 in quick mode: at 3,000 mentions (blocks <= ~300) the cost model would update every
    # mention exactly (no race pays on a CPU below ~1,200 other mentions); quick mode exercises the races
    quick_kw = dict(min_race_size=256, max_candidates=32, race_widths=(), race_cost=0.0)  # one width: one compile
    # full mode: 7 runs per sampler (the paper's Fig. 3); quick: 2
    # full mode: Sub Gibbs races wherever the rules allow (race_cost=0, the paper's sampler: its evaluations
    # and decision error), and Sub Gibbs with the default cost model (race vs exact per update) is timed too
    full_kw = FULL_KW
    datasets = [
        ("authors", _authors(quick), 2 if quick else FULL_RUNS, 5 if quick else 6, quick_kw if quick else full_kw)
    ]
    if not quick:
        datasets.append(("febrl3", _febrl(), FULL_RUNS, 6, full_kw))
    total = sum((2 if quick else 3) * r + 1 for _, _, r, _, _ in datasets)
    metrics = {"mode": "quick" if quick else "full"}
    t0 = time.perf_counter()
    with progress(total=total, desc="coreference runs") as bar:
        for tag, data, runs, sweeps, kw in datasets:
            betas = np.linspace(0.3, 2.0, sweeps).astype(np.float32)
            metrics[tag] = _study(
                data, betas, runs, rep, out_dir, tag, bar, kw, shared=quick, cost_kw=None if quick else {}
            )
    metrics["seconds"] = time.perf_counter() - t0
    rep.text(f"Total time {metrics['seconds']:.0f} s (shared 2-core CPU; load printed by the runner's caller).")
    rep.write()
    return metrics


def large_run(num_mentions: int = 100_000, sweeps: int = 6, seed: int = 100, **kernel_kwargs) -> dict:
    """One annealed run of exact and of Sub Gibbs on ``num_mentions`` author mentions (entities up to 1,000).

    The large run (>= 10^5 mentions, clusters >= 10^3, D >= 100 candidates): same generator,
    factor, blocking and β schedule (0.3 -> 2.0) as the experiment; prints, per sweep, B³ F1,
    factor evaluations, wall-clock and races / exact updates, then the ratios (exact / Sub) of the
    total evaluations and wall-clock and of the last sweep's, and the most candidates met by one
    update (at the start every mention is alone: a block's size). Compile time is reported apart.
    ``python -m experiments.coreference --large [M]``.
    """
    os.environ["JAXSUB_COREF_MENTIONS"] = str(num_mentions)
    data = _authors(False)
    d = _describe(data)
    print(
        f"{d['mentions']:,} mentions, {d['entities']:,} entities (largest {d['max_entity']:,}), {d['blocks']:,} blocks "
        f"(largest {d['max_block']:,}, up to {d['max_entities_per_block']} entities per block); exact Gibbs: "
        f"{d['exact_evals_per_sweep']:,} evaluations per sweep",
        flush=True,
    )
    sweeps_c, compile_s = _compiled(data, False, **kernel_kwargs)
    print(f"compile (s): exact {compile_s['exact']:.0f}, Sub {compile_s['sub']:.0f}", flush=True)
    betas = np.linspace(0.3, 2.0, sweeps).astype(np.float32)
    out = dict(data=d, compile_seconds=compile_s, betas=betas.tolist())
    for mode in ("exact", "sub"):
        r = _run(data, betas, sweeps_c[mode], seed)
        out[mode] = {k: np.asarray(v).tolist() for k, v in r.items()}
        for s in range(sweeps):
            print(
                f"{mode:5s} sweep {s}: B3 F1 {r['f1'][s]:.4f}  evaluations {np.diff(np.r_[0, r['evals']])[s]:.3e}  "
                f"seconds {np.diff(np.r_[0, r['seconds']])[s]:.1f}  races {r['races'][s]}  exact {r['exact'][s]}",
                flush=True,
            )
    ex, sub = out["exact"], out["sub"]
    out["evaluation_ratio_total"] = ex["evals"][-1] / sub["evals"][-1]
    out["wallclock_ratio_total"] = ex["seconds"][-1] / sub["seconds"][-1]
    out["evaluation_ratio_last_sweep"] = (ex["evals"][-1] - ex["evals"][-2]) / (sub["evals"][-1] - sub["evals"][-2])
    out["wallclock_ratio_last_sweep"] = (ex["seconds"][-1] - ex["seconds"][-2]) / (
        sub["seconds"][-1] - sub["seconds"][-2]
    )
    print({k: round(v, 3) for k, v in out.items() if k.endswith(("_total", "_sweep"))}, flush=True)
    return out


if __name__ == "__main__":
    import sys

    if len(sys.argv) >= 2 and sys.argv[1] == "--large":
        large_run(int(sys.argv[2]) if len(sys.argv) > 2 else 100_000, **FULL_KW)
    else:
        sys.exit(
            "usage: python -m experiments.coreference --large [NUM_MENTIONS]  (the experiment: python -m experiments coreference)"
        )
