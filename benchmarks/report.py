"""The performance page: tables and plots from the committed benchmark snapshots.

``python -m benchmarks.report [--snapshots docs/performance] [--out docs/performance]`` reads
the JSON files written by ``python -m benchmarks --out docs/performance`` and writes
``index.md`` (one table per family: workload, baseline, ratio as median (range), what the
sampler read, and the machine, commit and date of the run) and one PNG plot per family.
Nothing is measured here: every figure is read from a snapshot.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "docs" / "performance"


class Ratio(NamedTuple):
    """A ratio with its range over the repeats of one run (``low``/``high`` NaN when not recorded)."""

    median: float
    low: float = math.nan
    high: float = math.nan


class Line(NamedTuple):
    """One row of a family's table."""

    workload: str
    baseline: str
    measure: str  # what the ratio is (direction included)
    ratio: Ratio | None
    work: str  # what the sampler read or produced, e.g. the evaluation ratio


class Family(NamedTuple):
    """A family's section: its title, the benchmarks it reads and how each one's rows become lines."""

    title: str
    benchmarks: tuple[str, ...]
    blurb: str


FAMILIES = (
    Family(
        "Discrete sampling and racing kernels",
        ("discrete", "racing_mh", "arch"),
        "Racing-Normal draws against the exact Gumbel-max sampler, racing MH against exact MH and NumPyro's "
        "HMCECS, racing Gibbs over the ARCH order against exact Gibbs.",
    ),
    Family(
        "Distributed SGLD",
        ("cgdsgld",),
        "Per-step cost of `jaxsub.dsgld` / `jaxsub.cg_dsgld` against `blackjax.sgld`, and the multi-device runner.",
    ),
    Family(
        "Compressed posteriors",
        ("compress", "compress_order"),
        "Gradient and end-to-end speed-ups of the compressed posterior against the full-data one, clustering "
        "throughput and compression against greedy leader clustering.",
    ),
    Family(
        "Subsample annealing",
        ("anneal",),
        "The compiled collapsed-Gibbs tick against a NumPy reference, annealing against Prior+Gibbs, CrossCat "
        "against pylace.",
    ),
    Family(
        "Coreference",
        ("coreference",),
        "A racing Gibbs sweep against the exact sweep, on single blocks and on author-like mentions.",
    ),
)


# --------------------------------------------------------------------------- ratio helpers


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def paired(row: dict, numerator: str, denominator: str) -> Ratio | None:
    """Median and range of the per-repeat ratios ``row[numerator][i] / row[denominator][i]``.

    Parameters
    ----------
    row
        A benchmark row holding two lists of timings of equal length.
    numerator, denominator
        Their keys (e.g. ``"exact_times"``, ``"racing_times"`` for a speed-up).

    Returns
    -------
    Ratio or None
        ``None`` when the lists are missing.
    """
    a, b = row.get(numerator), row.get(denominator)
    if not isinstance(a, list) or not isinstance(b, list) or not a or len(a) != len(b):
        return None
    ratios = [x / y for x, y in zip(a, b) if y > 0]
    return Ratio(statistics.median(ratios), min(ratios), max(ratios)) if ratios else None


def scalar(row: dict, key: str, range_key: str | None = None) -> Ratio | None:
    """The ratio ``row[key]``, with its range from ``row[range_key]`` (a ``[low, high]`` pair) or a list.

    Parameters
    ----------
    row
        A benchmark row.
    key
        The ratio's key.
    range_key
        Key of ``[low, high]`` or of the list of per-repeat ratios (optional).

    Returns
    -------
    Ratio or None
        ``None`` when ``row[key]`` is missing or not finite.
    """
    value = row.get(key)
    if not _finite(value):
        return None
    spread = row.get(range_key) if range_key else None
    if isinstance(spread, list) and spread and all(_finite(v) for v in spread):
        return Ratio(value, min(spread), max(spread))
    return Ratio(value)


def fmt_ratio(r: Ratio | None) -> str:
    """``5.14× (3.43–7.68)``, or ``5.14×`` when no range was recorded.

    Parameters
    ----------
    r
        The ratio (``None`` prints as a dash).

    Returns
    -------
    str
        The formatted cell.
    """
    if r is None:
        return "–"
    digits = ".3g" if abs(r.median) < 100 else ".0f"
    text = f"**{r.median:{digits}}×**"
    if _finite(r.low) and _finite(r.high):
        text += f" ({r.low:{digits}}–{r.high:{digits}})"
    return text


def _num(x, spec=".3g") -> str:
    return format(x, spec) if _finite(x) else "–"


def _n(x) -> str:
    return f"{int(x):,}" if _finite(x) else "?"


# --------------------------------------------------------------------------- per-benchmark lines


def discrete_lines(rows: list[dict]) -> list[Line]:
    """Lines of ``benchmarks/discrete.py`` (one per row; the floor rows say what they bound).

    Parameters
    ----------
    rows
        The benchmark's rows.

    Returns
    -------
    list of Line
        The table lines.
    """
    out = []
    for r in rows:
        draws = f", {r['draws']} draws batched" if r.get("draws", 1) > 1 else ""
        block = f", blocks of {r['B']}" if r.get("B", 1) > 1 else ""
        workload = f"{r['factor']}, N = {_n(r['N'])}, D = {r['D']}{draws}{block}"
        floor = "floor" in str(r.get("factor", ""))
        baseline = "exact `gumbel_max`" + (" (all D arms)" if floor else "")
        measure = "speed-up (exact time / racing time)" if not floor else "speed-up of the floor (bounds any race)"
        work = f"evaluation limit {_num(r.get('eval_ratio'))}×" + (
            f", data read N/T {_num(r.get('data_ratio'))}×" if _finite(r.get("data_ratio")) else ""
        )
        out.append(
            Line(
                workload,
                baseline,
                measure,
                paired(r, "exact_times", "racing_times") or scalar(r, "speedup", "speedup_range"),
                work,
            )
        )
    return out


def racing_mh_lines(rows: list[dict]) -> list[Line]:
    """Lines of ``benchmarks/racing_mh.py``: the racing row against exact MH and against HMCECS.

    Parameters
    ----------
    rows
        The benchmark's rows.

    Returns
    -------
    list of Line
        The table lines.
    """
    out = []
    for r in rows:
        if not str(r.get("sampler", "")).startswith("racing"):
            continue
        reads = r.get("evals_per_step_over_N")
        work = f"reads {100 * reads / 2:.2g}% of 2N per step" if _finite(reads) else ""
        out.append(
            Line(
                f"logistic regression, {r.get('chains', '?')} chains",
                "exact MH (BlackJAX RMH)",
                "cost per step (exact / racing)",
                scalar(r, "cost_ratio_per_step_vs_exact"),
                work,
            )
        )
        out.append(
            Line(
                f"logistic regression, {r.get('chains', '?')} chains",
                "exact MH (BlackJAX RMH)",
                "ESS per second (racing / exact)",
                scalar(r, "ess_per_s_vs_exact"),
                work,
            )
        )
        if "ess_per_s_vs_hmcecs" in r:
            out.append(
                Line(
                    f"logistic regression, {r.get('chains', '?')} chains",
                    "NumPyro HMCECS (peer)",
                    "ESS per second (racing / HMCECS), paired alternations",
                    scalar(r, "ess_per_s_vs_hmcecs", "ess_per_s_vs_hmcecs_paired"),
                    "",
                )
            )
    for r in rows:
        if "skipped" in r:
            out.append(Line("logistic regression", str(r.get("sampler", "peer")), f"not run: {r['skipped']}", None, ""))
    return out


def arch_lines(rows: list[dict]) -> list[Line]:
    """Lines of ``benchmarks/arch.py``: ESS of the ARCH order per second, racing / exact Gibbs.

    Parameters
    ----------
    rows
        The benchmark's rows.

    Returns
    -------
    list of Line
        The table lines.
    """
    out = []
    for r in rows:
        if "ess_q_per_s_vs_exact" in r and not str(r.get("sampler", "")).startswith("exact"):
            exact = next((x for x in rows if str(x.get("sampler", "")).startswith("exact")), {})
            e_ex, e_ra = exact.get("evals_per_sweep_per_chain"), r.get("evals_per_sweep_per_chain")
            work = f"evaluations exact / racing {e_ex / e_ra:.3g}×" if _finite(e_ex) and _finite(e_ra) and e_ra else ""
            out.append(
                Line(
                    f"ARCH(q) order selection, S&P 500, N = {_n(r.get('N'))}",
                    "exact Gibbs sweep",
                    "ESS(q) per second (racing / exact)",
                    scalar(r, "ess_q_per_s_vs_exact"),
                    work,
                )
            )
    return out


def cgdsgld_lines(rows: list[dict]) -> list[Line]:
    """Lines of ``benchmarks/cgdsgld.py``: per-step overheads (lower is cheaper) and the device runner.

    Parameters
    ----------
    rows
        The benchmark's rows.

    Returns
    -------
    list of Line
        The table lines.
    """
    out = []
    for r in rows:
        what, part = str(r.get("what", "")), r.get("part")
        if "ratio" in r:
            # (a*) DSGLD against blackjax.sgld; (b) and (d) CG-DSGLD against DSGLD (d: alpha 1 vs 0, same program)
            baseline = "`blackjax.sgld`" if part in ("a", "a0", "a'") else "`jaxsub.dsgld`"
            dim = f", d = {r['dim']}" if "dim" in r else ""
            out.append(
                Line(
                    f"({part}) {what}{dim}",
                    baseline,
                    "time per step (candidate / baseline; < 1 is cheaper)",
                    scalar(r, "ratio", "ratio_range_of_pairs"),
                    "",
                )
            )
        elif "speedup_8dev_over_1dev" in r:
            out.append(
                Line(
                    f"({part}) {what}",
                    "the same kernel vmapped on 1 device",
                    "rounds per second (8 devices / 1)",
                    scalar(r, "speedup_8dev_over_1dev"),
                    "",
                )
            )
        elif "rounds_per_s_partial" in r and _finite(r.get("rounds_per_s_all")):
            out.append(
                Line(
                    f"({part}) {what}",
                    "all clients participating",
                    "rounds per second (partial / all)",
                    Ratio(r["rounds_per_s_partial"] / r["rounds_per_s_all"]),
                    "",
                )
            )
    return out


def compress_lines(rows: list[dict]) -> list[Line]:
    """Lines of ``benchmarks/compress.py`` (parts a, b, c, e) and ``benchmarks/compress_order.py``.

    Parameters
    ----------
    rows
        The benchmark's rows.

    Returns
    -------
    list of Line
        The table lines.
    """
    out = []
    for r in rows:
        part, data = r.get("part"), r.get("dataset", r.get("data", ""))
        where = f"{data}, N = {_n(r.get('n', r.get('N')))}, δ = {r.get('delta')}"
        if part == "a":
            out.append(
                Line(
                    f"(a) gradient, {where}",
                    "full-data gradient",
                    "speed-up (full / compressed)",
                    scalar(r, "speedup", "speedup_range"),
                    f"c = {_n(r.get('c'))} clusters (ρ = {_num(r.get('rho'))})",
                )
            )
        elif part == "b":
            out.append(
                Line(
                    f"(b) clustering + HMC, {where}",
                    "HMC on the full data",
                    "end-to-end speed-up",
                    scalar(r, "end_to_end_speedup"),
                    f"c = {_n(r.get('c'))}",
                )
            )
        elif part == "c":
            out.append(
                Line(
                    f"(c) clustering, {where}, d = {r.get('d')}",
                    "greedy leader + repair (clusters)",
                    "clusters c / leader + repair c (< 1 compresses more)",
                    scalar(r, "ratio_to_leader"),
                    f"{_num(r.get('rows_per_s'))} rows/s, c = {_n(r.get('c'))}",
                )
            )
        elif part == "e" and r.get("method") != "exact":
            out.append(
                Line(
                    f"(e) time to posterior error ε, {where}, {r.get('method')}",
                    "the exact chain",
                    "speed-up to ε (exact time / this time)",
                    scalar(r, "speedup_to_eps"),
                    f"bias {_num(r.get('bias_sd'))} sd",
                )
            )
        elif "rho" in r and "data" in r:
            out.append(
                Line(
                    f"shuffled stream, {where}",
                    "–",
                    "compression ρ = c / N",
                    None,
                    f"ρ = {_num(r.get('rho'))}, c = {_n(r.get('c'))}",
                )
            )
    return out


def anneal_lines(rows: list[dict]) -> list[Line]:
    """Lines of ``benchmarks/anneal.py``: the JAX tick against NumPy, annealing against Prior+Gibbs, peers.

    Parameters
    ----------
    rows
        The benchmark's rows.

    Returns
    -------
    list of Line
        The table lines.
    """
    out = []
    rates = {(r.get("N"), r.get("chains")): r.get("assignments_per_s") for r in rows if r.get("case") == "kernel"}
    for r in rows:
        case = r.get("case")
        if case == "numpy_reference":
            one = rates.get((r.get("N"), 1))
            work = f"{_num(one)} assignments/s per chain" + (
                f", identical assignments {r['identical_assignments_fraction']:.0%}"
                if _finite(r.get("identical_assignments_fraction"))
                else ""
            )
            out.append(
                Line(
                    f"collapsed Gibbs ticks, military rows, N = {_n(r.get('N'))}",
                    "NumPy reference (same decisions)",
                    "assignments per second (JAX 1 chain / NumPy)",
                    scalar(r, "speedup_jax_1chain_vs_numpy"),
                    work,
                )
            )
        elif case == "anneal_vs_prior_gibbs":
            out.append(
                Line(
                    f"DP mixture fit, N = {_n(r.get('N'))}, {r.get('chains')} chains",
                    "Prior+Gibbs schedule",
                    "wall-clock (Prior+Gibbs / anneal)",
                    scalar(r, "speedup", "speedup_range"),
                    f"ticks {_n(r.get('anneal_ticks'))} vs {_n(r.get('prior_gibbs_ticks'))}",
                )
            )
        elif case == "crosscat_rows":
            out.append(
                Line(
                    f"CrossCat row ticks, N = {_n(r.get('N'))}, {r.get('chains')} chain(s), {r.get('features')} columns",
                    "–",
                    "throughput",
                    None,
                    f"{_num(r.get('view_row_assignments_per_s'))} view-row assignments/s",
                )
            )
        elif str(case).startswith("heldout per test row over seeds"):
            out.append(
                Line(
                    f"CrossCat held-out log predictive per test row, {r.get('table')}, {r.get('budget_N')}N budget",
                    "pylace at Anneal's seconds (peer)",
                    f"Anneal − pylace, mean over {r.get('pairs')} seeds (± se)",
                    None,
                    f"{_num(r.get('diff_mean'), '+.2f')} ± {_num(r.get('diff_se'), '.2f')}",
                )
            )
        elif str(case).startswith("jaxsub 1 chain / pylace"):
            out.append(
                Line(
                    f"CrossCat row sweep, N = {_n(r.get('N'))}",
                    "pylace, 1 state (peer)",
                    "view-row assignments per CPU-second (jaxsub 1 chain / pylace)",
                    scalar(r, "value"),
                    "",
                )
            )
    return out


def coreference_lines(rows: list[dict]) -> list[Line]:
    """Lines of ``benchmarks/coreference.py``: single blocks, then the author-mention sweeps.

    Parameters
    ----------
    rows
        The benchmark's rows.

    Returns
    -------
    list of Line
        The table lines.
    """
    out = []
    for r in rows:
        evals = f"evaluations exact / racing {_num(r.get('evaluation_ratio'))}×"
        if "N_y" in r:
            out.append(
                Line(
                    f"one block, clusters of N_y = {_n(r['N_y'])}, D = {r['D']} candidates",
                    "exact Gibbs sweep",
                    "wall-clock (exact / racing)",
                    scalar(r, "wallclock_ratio", "speedup_range"),
                    evals,
                )
            )
        elif "M" in r:
            label = r.get("race_cost")
            out.append(
                Line(
                    f"author mentions M = {_n(r['M'])}, {label}",
                    "exact Gibbs sweep",
                    "wall-clock (exact / this sweep)",
                    scalar(r, "wallclock_ratio", "speedup_range"),
                    evals,
                )
            )
    return out


# Keys of a ratio measured against a baseline in one run, in order of preference (used for rows
# without a dedicated reader).
GENERIC_RATIO_KEYS = ("speedup", "wallclock_ratio", "ratio_vs_pylace", "speedup_vs_pylace")


def _generic_line(row: dict) -> Line | None:
    for key in GENERIC_RATIO_KEYS:
        if _finite(row.get(key)):
            label = ", ".join(
                f"{k} = {v}" for k, v in row.items() if isinstance(v, (str, int)) and not isinstance(v, bool)
            )
            return Line(label[:120], "see the benchmark", key, scalar(row, key), "")
    return None


READERS: dict[str, Callable[[list[dict]], list[Line]]] = {
    "discrete": discrete_lines,
    "racing_mh": racing_mh_lines,
    "arch": arch_lines,
    "cgdsgld": cgdsgld_lines,
    "compress": compress_lines,
    "compress_order": compress_lines,
    "anneal": anneal_lines,
    "coreference": coreference_lines,
}


# --------------------------------------------------------------------------- page


def load_snapshots(folder: Path) -> dict[str, dict]:
    """The JSON records of ``folder`` keyed by benchmark name.

    Parameters
    ----------
    folder
        Where ``python -m benchmarks --out`` wrote them.

    Returns
    -------
    dict
        ``name -> record``.
    """
    return {p.stem: json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))}


def _date(iso) -> str:
    return str(iso).replace("T", " ").replace("+00:00", " UTC") if iso else "date not recorded"


def provenance(record: dict) -> str:
    """One line: mode, machine, load average, commit and date of a snapshot.

    Parameters
    ----------
    record
        A JSON record of ``python -m benchmarks``.

    Returns
    -------
    str
        Markdown text.
    """
    m = record.get("machine", {})
    load = record.get("load_average") or {}
    before, after = load.get("before"), load.get("after")
    load_text = f"load average {before[0]:.1f} → {after[0]:.1f}" if before and after else "load not recorded"
    cores = f"{m.get('cpu_count')} cores, " if m.get("cpu_count") else ""
    devices = ", ".join(sorted(set(m.get("devices", [])))[:2])
    full = str(record.get("commit", "unknown"))
    commit = full[:12] + (" with uncommitted changes" if full.endswith("+dirty") else "")
    mode = "quick" if record.get("quick") else "full"
    wall = f", {record['wall_s']:.0f} s" if _finite(record.get("wall_s")) else ""
    return (
        f"`python -m benchmarks {record.get('benchmark')}{' --quick' if record.get('quick') else ''}` "
        f"({mode} mode{wall}): {m.get('processor') or m.get('platform', '?')}, {cores}JAX {m.get('jax', '?')} "
        f"on {devices or '?'}; {load_text}; commit `{commit}`; {_date(record.get('date'))}."
    )


def table(lines: list[Line]) -> str:
    """A Markdown table of the lines.

    Parameters
    ----------
    lines
        The table lines.

    Returns
    -------
    str
        Markdown.
    """
    head = "| workload | baseline | ratio | median (range) | read / produced |\n|---|---|---|---|---|\n"
    return head + "".join(
        f"| {ln.workload} | {ln.baseline} | {ln.measure} | {fmt_ratio(ln.ratio)} | {ln.work} |\n" for ln in lines
    )


def slug(title: str) -> str:
    """The heading's anchor as MkDocs writes it (lower case, words joined by dashes).

    Parameters
    ----------
    title
        The heading.

    Returns
    -------
    str
        The anchor, without ``#``.
    """
    return "-".join("".join(c if c.isalnum() else " " for c in title.lower()).split())


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def plot_family(family: Family, lines: list[Line], out: Path) -> Path | None:
    """A horizontal bar chart of the family's ratios (median, range as error bars, log scale).

    Parameters
    ----------
    family
        The family.
    lines
        Its table lines; lines without a ratio are left out.
    out
        Folder of the PNG.

    Returns
    -------
    Path or None
        The PNG written, or ``None`` when no line has a ratio.
    """
    shown = [ln for ln in lines if ln.ratio is not None and ln.ratio.median > 0]
    if not shown:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 0.55 * len(shown) + 1.4))
    y = list(range(len(shown)))[::-1]
    med = [ln.ratio.median for ln in shown]
    low = [ln.ratio.median - ln.ratio.low if _finite(ln.ratio.low) else 0 for ln in shown]
    high = [ln.ratio.high - ln.ratio.median if _finite(ln.ratio.high) else 0 for ln in shown]
    ax.errorbar(med, y, xerr=[low, high], fmt="o", color="#4c72b0", ecolor="#333333", capsize=3)
    ax.axvline(1.0, color="#c44e52", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(y, [f"{_short(ln.workload)}\n{_short(ln.measure)}" for ln in shown], fontsize=7)
    ax.set_ylim(-0.6, len(shown) - 0.4)
    ax.set_xlabel("ratio (median, range over repeats); 1 = the baseline")
    ax.set_title(family.title, fontsize=10)
    fig.tight_layout()
    path = out / f"{slug(family.title)}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render(snapshots: dict[str, dict], out: Path, plots: bool = True) -> str:
    """The performance page's Markdown (and, with ``plots``, its PNGs written to ``out``).

    Parameters
    ----------
    snapshots
        :func:`load_snapshots` of the snapshot folder.
    out
        Folder of the page and plots.
    plots
        Draw the PNGs (needs matplotlib).

    Returns
    -------
    str
        The page.
    """
    parts = [
        "# Performance\n\n",
        "How fast each sampler is now, as a ratio to its exact baseline (and peers) **measured in the same run**: "
        "the benchmark alternates the two calls (the order flips every round), compile time is reported apart, "
        "and a ratio is the median over the repeats with its range (smallest – largest per-repeat ratio) where "
        "the benchmark records the repeats. A dash in the range means the benchmark records only the median. "
        "Each table says which command produced it, on which machine, at which load, commit and date. "
        "Ratios measured at a high load average are indicative: timings need an idle machine.\n\n",
        "This page is generated by `python -m benchmarks.report` from the JSON snapshots in `docs/performance/` "
        "(`python -m benchmarks --quick --out docs/performance`); do not edit it by hand.\n\n",
    ]
    for family in FAMILIES:
        parts.append(f"## {family.title}\n\n{family.blurb}\n\n")
        lines_all = []
        for name in family.benchmarks:
            record = snapshots.get(name)
            if record is None:
                parts.append(
                    f"`{name}`: no snapshot yet (`python -m benchmarks {name} --quick --out docs/performance`).\n\n"
                )
                continue
            lines = READERS.get(name, lambda rows: [ln for ln in map(_generic_line, rows) if ln])(
                record.get("rows", [])
            )
            lines_all += lines
            parts.append(f"**{record.get('title') or name}**. {provenance(record)}\n\n")
            parts.append(table(lines) + "\n" if lines else "(no rows)\n\n")
        if any(ln.ratio is not None and ln.ratio.median > 0 for ln in lines_all):
            if plots:
                plot_family(family, lines_all, out)
            parts.append(f"![{family.title}: ratios to the baseline]({slug(family.title)}.png)\n\n")
    return "".join(parts)


def main(argv=None) -> int:
    """Command line: write the performance page from the snapshots.

    Parameters
    ----------
    argv
        Arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status.
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    parser.add_argument("--snapshots", default=str(DEFAULT_DIR), help="folder of the benchmark JSON files")
    parser.add_argument("--out", default=None, help="folder of index.md and the plots (default: --snapshots)")
    parser.add_argument("--no-plots", action="store_true", help="write the page without drawing the PNGs")
    args = parser.parse_args(argv)
    snapshots = load_snapshots(Path(args.snapshots))
    out = Path(args.out or args.snapshots)
    out.mkdir(parents=True, exist_ok=True)
    page = render(snapshots, out, plots=not args.no_plots)
    (out / "index.md").write_text(page)
    print(f"wrote {out / 'index.md'} from {len(snapshots)} snapshot(s): {', '.join(snapshots) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
