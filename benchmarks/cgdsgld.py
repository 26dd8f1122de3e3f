"""DSGLD / CG-DSGLD cost: (a) vs blackjax.sgld doing the same work, (b) the conducive term, (c) 8 devices.

(a) One device. ``jaxsub.dsgld``'s round kernel (``local_steps`` SGLD steps
    on a shard chosen by ``f``) against ``blackjax.sgld`` doing the same work:
    the same number of steps, the same gradient estimator
    (``blackjax.sgmcmc.gradients.grad_estimator``), minibatches drawn without
    replacement with ``jaxsub.subsample.permutation_indices`` from the pooled rows
    of all shards (the centralised SGLD that DSGLD stands in for). Row (a0), at
    d = 50: the earlier baseline, blackjax.sgld on shard 0 only. Its working set
    (4 MB at d = 50) is 1/8 of the data's, so it stays in cache while DSGLD, which
    visits every shard, does not: the compiled SGLD steps are the same op for op
    (44 vs 45 non-trivial HLO instructions in the inner loop body), and
    DSGLD with one round of all its steps on one shard costs the same as (a0).
    Both jitted
    ``lax.scan`` loops take the data as an argument. Ratio = jaxsub / blackjax
    time per SGLD step (target <= 1.2). ``ratio`` compares medians of
    alternating calls; ``ratio_of_minimums`` compares the fastest calls, the
    better estimate of the uncontended cost on a shared machine.
(b) CG-DSGLD vs DSGLD, same settings: extra cost of the conducive term
    (one matrix-vector product per step with Gaussian surrogates; target <= 10%),
    for diagonal surrogates at every size and full surrogates at d = 50. (a') the traced-size
    minibatch draw of unequal shards, at d = 50 (report only).
(c) ``jaxsub.sgmcmc.multi_device`` with 8 simulated CPU devices (shard_map,
    chains hopping by collective permutes) vs the same chains vmapped on one
    device, in a subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``;
    and the bytes that cross devices per round. The simulated devices share
    this machine's cores, so (c) measures the overhead of the sharded program,
    not a speed-up; no GPU/multi-accelerator machine was available for this run.
(e) many clients and partial participation: 128 clients of unequal size, f ∝ N_s, 32 participating per round
    vs all, through ``multi_device_kernel`` on one device (rounds/s, fraction of chain-rounds that act).
(d) rounds/s of the MNIST experiment's sampler (``experiments/cgdsgld_mnist``, d = 39,760) on the default
    device -- the accelerator when the machine has one (run unchanged there) -- DSGLD and CG-DSGLD.

Model: Bayesian logistic regression with ``d`` features, ``S = 8`` shards of
``N_s = 20,000`` synthetic rows, minibatch 100.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import blackjax
import jax
import jax.numpy as jnp
import numpy as np

import jaxsub
import jaxsub.datasets
from benchmarks._common import compare
from jaxsub.subsample import permutation_indices

TITLE = "DSGLD/CG-DSGLD per-step cost vs blackjax.sgld, conducive overhead, 8 simulated devices"

NUM_SHARDS, SHARD_SIZE, BATCH = 8, 20_000, 100


SPARSE_DIM, NNZ = 100_000, 20  # d = 1e5: sparse features (per-datum cost O(NNZ), SGLD step O(d))
REPORT_DIM = 50  # the report-only rows (a': traced-size draw; b: full surrogates) run at this size only


def make_problem(dim: int, seed: int = 0):
    """Logistic regression, ``S = 8`` shards of 20,000 rows; dense features for small ``d``,
    ``NNZ`` hashed features per row for ``d = 1e5`` (the data would not fit densely)."""
    rng = np.random.default_rng(seed)
    if dim >= SPARSE_DIM:
        idx = rng.integers(0, dim, size=(NUM_SHARDS, SHARD_SIZE, NNZ)).astype(np.int32)
        val = rng.normal(size=(NUM_SHARDS, SHARD_SIZE, NNZ)).astype(np.float32)
        y = (rng.uniform(size=(NUM_SHARDS, SHARD_SIZE)) < 0.5).astype(np.float32)

        def loglik(theta, datum):
            i, v, yi = datum
            logit = jnp.dot(theta[i], v)
            return yi * logit - jnp.logaddexp(0.0, logit)

        data = (jnp.asarray(idx), jnp.asarray(val), jnp.asarray(y))
    else:
        x = rng.normal(size=(NUM_SHARDS, SHARD_SIZE, dim)).astype(np.float32)
        w = rng.normal(size=dim) / np.sqrt(dim)
        y = (rng.uniform(size=(NUM_SHARDS, SHARD_SIZE)) < 1 / (1 + np.exp(-(x @ w)))).astype(np.float32)

        def loglik(theta, datum):
            xi, yi = datum
            logit = xi @ theta
            return yi * logit - jnp.logaddexp(0.0, logit)

        data = (jnp.asarray(x), jnp.asarray(y))

    def logprior(theta):
        return -0.5 * jnp.sum(theta**2)

    return data, logprior, loglik


def _surrogates(dim: int, structure: str, seed: int = 1):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(NUM_SHARDS, dim))
    if structure == "diag":
        return jaxsub.sgmcmc.gaussian_surrogates(means, rng.uniform(100, 1000, size=(NUM_SHARDS, dim)))
    a = rng.normal(size=(NUM_SHARDS, dim, dim))
    return jaxsub.sgmcmc.gaussian_surrogates(means, np.einsum("sij,skj->sik", a, a) + dim * np.eye(dim))


def _row(part, what, dim, local_steps, num_steps, t, target):
    return {
        "part": part,
        "what": what,
        "dim": dim,
        "local_steps": local_steps,
        "steps": num_steps,
        "baseline_us_per_step": 1e6 * t["baseline_s"] / num_steps,
        "candidate_us_per_step": 1e6 * t["candidate_s"] / num_steps,
        "ratio": t["candidate_s"] / t["baseline_s"],
        "ratio_of_minimums": min(t["candidate_times"]) / min(t["baseline_times"]),
        "ratio_range_of_pairs": [
            min(c / b for b, c in zip(t["baseline_times"], t["candidate_times"])),
            max(c / b for b, c in zip(t["baseline_times"], t["candidate_times"])),
        ],
        "compile_s_baseline": t.get("baseline_first_call_s"),
        "compile_s_candidate": t.get("candidate_first_call_s"),
        "target": target,
        "load_average_1min": os.getloadavg()[0],
    }


def part_a_b(dim: int, local_steps: int, rounds: int, repeats: int) -> list[dict]:
    data, logprior, loglik = make_problem(dim)
    sizes = jnp.full((NUM_SHARDS,), SHARD_SIZE, jnp.int32)
    probs_np = np.full(NUM_SHARDS, 1.0 / NUM_SHARDS)
    probs = jnp.asarray(probs_np, jnp.float32)
    eps = 1e-6
    num_steps = rounds * local_steps
    theta0 = jnp.zeros(dim, jnp.float32)

    # blackjax.sgld, same estimator and minibatch scheme, on the pooled rows of all shards (the
    # centralised sampler DSGLD stands in for: same data, same working set) or on shard 0 only
    sgld = blackjax.sgld(blackjax.sgmcmc.gradients.grad_estimator(logprior, loglik, SHARD_SIZE * NUM_SHARDS))

    def blackjax_runner(pooled: bool):
        @jax.jit
        def run_blackjax(key, data):
            rows = NUM_SHARDS * SHARD_SIZE if pooled else SHARD_SIZE
            flat = jax.tree.map(lambda a: a.reshape((rows,) + a.shape[2:]) if pooled else a[0], data)

            def body(theta, k):
                kb, kn = jax.random.split(k)
                idx = permutation_indices(kb, jnp.arange(BATCH), rows)
                batch = jax.tree.map(lambda a: a[idx], flat)
                return sgld.step(kn, theta, batch, 0.5 * eps), None

            return jax.lax.scan(body, theta0, jax.random.split(key, num_steps))[0]

        return run_blackjax

    run_blackjax = blackjax_runner(pooled=True)

    def dsgld_runner(shard_size):
        ds_kernel = jaxsub.dsgld.build_kernel(batch_size=BATCH, local_steps=local_steps, shard_size=shard_size)

        @jax.jit
        def run_dsgld(key, data):
            def body(state, k):
                return ds_kernel(k, state, logprior, loglik, data, sizes, probs, eps)[0], None

            return jax.lax.scan(body, jaxsub.dsgld.init(theta0), jax.random.split(key, rounds))[0].position

        return run_dsgld

    # equal shards: as_top_level_api passes the common size (static-domain index draw)
    run_dsgld = dsgld_runner(SHARD_SIZE)
    keys = lambda i: (jax.random.key(i), data)  # noqa: E731
    rows = []
    t = compare(run_blackjax, run_dsgld, keys, keys, repeats=repeats)
    rows.append(
        _row(
            "a",
            "jaxsub.dsgld vs blackjax.sgld on the pooled data (same data, equal shards)",
            dim,
            local_steps,
            num_steps,
            t,
            "<= 1.2",
        )
    )
    if dim == REPORT_DIM:  # report-only rows at one size (each costs a compile)
        t = compare(blackjax_runner(pooled=False), run_dsgld, keys, keys, repeats=repeats)
        rows.append(
            _row(
                "a0",
                "jaxsub.dsgld vs blackjax.sgld on shard 0 only (1/8 of the working set)",
                dim,
                local_steps,
                num_steps,
                t,
                "report",
            )
        )
        t = compare(run_blackjax, dsgld_runner(None), keys, keys, repeats=repeats)
        rows.append(
            _row(
                "a'",
                "jaxsub.dsgld, traced-size index draw (unequal shards) vs blackjax.sgld",
                dim,
                local_steps,
                num_steps,
                t,
                "report",
            )
        )
    cg_kernel = jaxsub.cg_dsgld.build_kernel(batch_size=BATCH, local_steps=local_steps, shard_size=SHARD_SIZE)
    for structure in ("full", "diag") if dim == REPORT_DIM else ("diag",):
        arrays = jaxsub.sgmcmc.conducive_arrays(_surrogates(dim, structure), probs_np)

        @jax.jit
        def run_cg(key, data, arrays):
            def body(state, k):
                return cg_kernel(k, state, logprior, loglik, data, sizes, probs, arrays, eps, 1.0)[0], None

            return jax.lax.scan(body, jaxsub.cg_dsgld.init(theta0), jax.random.split(key, rounds))[0].position

        t = compare(run_dsgld, run_cg, keys, lambda i: (jax.random.key(i), data, arrays), repeats=repeats)
        rows.append(
            _row(
                "b",
                f"cg_dsgld vs dsgld ({structure} surrogates)",
                dim,
                local_steps,
                num_steps,
                t,
                "<= 1.10" if structure == "diag" else "report",
            )
        )
    return rows


DEVICE_SCRIPT = r"""
import json, os, sys, time
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp, numpy as np
import jaxsub
import jaxsub.datasets
from benchmarks.cgdsgld import make_problem, _surrogates, NUM_SHARDS
from benchmarks._common import compare
dim, chains, local_steps, rounds, repeats = (int(a) for a in sys.argv[2:7])
data, logprior, loglik = make_problem(dim)
shards = jaxsub.sgmcmc.Shards(data, np.full(NUM_SHARDS, data[0].shape[1]))
sur = _surrogates(dim, "full")
mesh = jax.make_mesh((NUM_SHARDS,), ("shards",))
runners = {}
for label, m in (("vmap_1_device", None), ("shard_map_8_devices", mesh)):
    fns = jaxsub.sgmcmc.multi_device_kernel(num_shards=NUM_SHARDS, batch_size=100, local_steps=local_steps,
                                            chains_per_shard=chains, mesh=m)
    inputs = fns.make_inputs(shards, surrogates=sur)
    state = fns.init(np.zeros((NUM_SHARDS * chains, dim), np.float32))

    def make(kernel=fns.kernel, state=state, inputs=inputs):
        @jax.jit
        def run(key, inputs):
            def body(s, k):
                return kernel(k, s, logprior, loglik, inputs, 1e-6)[0], None
            return jax.lax.scan(body, state, jax.random.split(key, rounds))[0].position
        compiled = run.lower(jax.random.key(0), inputs).compile()  # one compile: timed and inspected
        return (lambda key: compiled(key, inputs)), compiled
    runners[label] = make()
t = compare(runners["vmap_1_device"][0], runners["shard_map_8_devices"][0], lambda i: (jax.random.key(i),),
            lambda i: (jax.random.key(i),), repeats=repeats)
hlo = runners["shard_map_8_devices"][1].as_text()
b = jaxsub.sgmcmc.bytes_per_round(np.zeros(dim, np.float32), NUM_SHARDS, chains)
print("RESULT " + json.dumps({
    "devices": jax.device_count(), "chains": NUM_SHARDS * chains, "rounds": rounds, "local_steps": local_steps,
    "vmap_rounds_per_s": rounds / t["baseline_s"], "shard_map_rounds_per_s": rounds / t["candidate_s"],
    "speedup_8dev_over_1dev": t["speedup"],
    "collective_permutes_in_program": hlo.count("collective-permute-start") or hlo.count("collective-permute("),
    "other_collectives_in_program": sum(hlo.count(op) for op in ("all-gather", "all-to-all", "all-reduce", "reduce-scatter")),
    "bytes_per_round_worst": b["worst"], "bytes_per_round_expected": b["expected"],
    "data_bytes_never_moved": int(sum(np.asarray(a).nbytes for a in data))}))
"""


def part_c(dim: int, chains: int, local_steps: int, rounds: int, repeats: int) -> dict:
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_PLATFORMS"] = "cpu"  # 8 simulated *CPU* devices, also on a machine with an accelerator
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            DEVICE_SCRIPT,
            str(root),
            str(dim),
            str(chains),
            str(local_steps),
            str(rounds),
            str(repeats),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    out = json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
    out.update(
        {
            "part": "c",
            "what": "multi_device: 8 simulated CPU devices vs vmap on 1 device",
            "dim": dim,
            "note": "simulated devices share the same CPU cores; no GPU in this run",
        }
    )
    return out


def part_d(rounds: int, repeats: int) -> dict:
    """Rounds/s of the MNIST experiment's sampler on the default device (the accelerator when there is one).

    ``experiments/cgdsgld_mnist``'s program (``jaxsub.sgmcmc.sample_rounds``: MLP 784-50-10, d = 39,760,
    10 label-skewed clients of the quick split's 10,000 rows, 20 local steps per round, minibatch 32,
    one chain), DSGLD (α = 0) against CG-DSGLD (α = 1, diagonal surrogates): one compiled program for both.
    The surrogates' values do not change the cost (a constant diagonal precision per client here)."""
    from experiments import cgdsgld_mnist as mnist

    data = jaxsub.datasets.load_mnist()
    rng = np.random.default_rng(0)
    keep = rng.choice(data.x.shape[0], 10_000, replace=False)
    clients = mnist.make_clients(data.x[keep], data.y[keep], 10, rng)
    packed = jaxsub.sgmcmc.make_shards(clients)
    params0 = mnist.init_params(0)
    dim = sum(int(np.size(p)) for p in jax.tree.leaves(params0))
    probs = np.full(10, 0.1)
    sur = jaxsub.sgmcmc.gaussian_surrogates(np.zeros((10, dim)), np.full((10, dim), 10.0))
    arrays = jaxsub.sgmcmc.conducive_arrays(sur, probs)
    chains, local_steps = 1, 20
    runner = jax.jit(
        jaxsub.sgmcmc.sample_rounds(
            mnist.logprior, mnist.loglik, batch_size=mnist.BATCH, local_steps=local_steps, num_rounds=rounds
        )
    )
    positions = jax.tree.map(lambda v: jnp.stack([v] * chains), params0)
    args = (
        packed.data,
        jnp.asarray(packed.sizes, jnp.int32),
        jnp.asarray(probs, jnp.float32),
        arrays,
        2 * mnist.LR / 10_000,
    )

    def call(alpha):
        return lambda i: (jax.random.key(i), positions, *args, alpha)

    t = compare(runner, runner, call(0.0), call(1.0), repeats=repeats)
    return {
        "part": "d",
        "what": "MNIST experiment sampler (MLP 784-50-10, 10 clients, L = 20, batch 32, 1 chain)",
        "dim": dim,
        "device": str(jax.devices()[0]),
        "platform": jax.default_backend(),
        "rounds": rounds,
        "dsgld_rounds_per_s": rounds / t["baseline_s"],
        "cg_dsgld_rounds_per_s": rounds / t["candidate_s"],
        "ratio": t["candidate_s"] / t["baseline_s"],
        "compile_s": t.get("baseline_first_call_s"),
        "load_average_1min": os.getloadavg()[0],
    }


MANY_CLIENTS, MANY_PARTICIPATING = 128, 32


def part_e(rounds: int, repeats: int, local_steps: int = 20) -> dict:
    """Many clients and partial participation: ``S = 128`` clients of unequal size (128-383 rows, d = 10 logistic),
    one chain per client, ``f ∝ N_s``, CG-DSGLD with diagonal surrogates through ``multi_device_kernel``
    (the one-device layout, ``mesh=None``: the same program as one client per device, vmapped). ``m = 32``
    participating clients per round against all 128: rounds/s, the fraction of chain-rounds that act (idle
    rounds realise f and m, see docs/guides/sgmcmc.md) and acting chain-rounds per second; bytes per round if every
    client were its own device."""
    rng = np.random.default_rng(3)
    dim = 10
    sizes = rng.integers(128, 384, size=MANY_CLIENTS)
    w = rng.normal(size=dim) / np.sqrt(dim)
    shards = []
    for n in sizes:
        x = (rng.normal(size=(n, dim)) + rng.normal(size=dim)).astype(np.float32)
        shards.append((x, (rng.uniform(size=n) < 1 / (1 + np.exp(-(x @ w)))).astype(np.float32)))

    def loglik(theta, datum):
        logit = datum[0] @ theta
        return datum[1] * logit - jnp.logaddexp(0.0, logit)

    def logprior(theta):
        return -0.5 * jnp.sum(theta**2)

    sur = jaxsub.sgmcmc.gaussian_surrogates(
        rng.normal(size=(MANY_CLIENTS, dim)), rng.uniform(50, 200, size=(MANY_CLIENTS, dim))
    )
    probs = sizes / sizes.sum()
    runners, acted = {}, {}
    for m in (MANY_CLIENTS, MANY_PARTICIPATING):
        fns = jaxsub.sgmcmc.multi_device_kernel(
            num_shards=MANY_CLIENTS, chains_per_shard=1, batch_size=32, local_steps=local_steps, participating=m
        )
        inputs = fns.make_inputs(shards, probs, sur)
        state = fns.init(np.zeros((MANY_CLIENTS, dim), np.float32))

        def make(kernel=fns.kernel, state=state):
            @jax.jit
            def run(key, inputs):
                def body(s, k):
                    s, info = kernel(k, s, logprior, loglik, inputs, 1e-4)
                    return s, jnp.mean(info.acted)

                final, act = jax.lax.scan(body, state, jax.random.split(key, rounds))
                return final.position, jnp.mean(act)

            return run

        runners[m] = (make(), inputs)
    t = compare(
        lambda key: runners[MANY_CLIENTS][0](key, runners[MANY_CLIENTS][1]),
        lambda key: runners[MANY_PARTICIPATING][0](key, runners[MANY_PARTICIPATING][1]),
        lambda i: (jax.random.key(i),),
        lambda i: (jax.random.key(i),),
        repeats=repeats,
    )
    for m in runners:
        acted[m] = float(runners[m][0](jax.random.key(0), runners[m][1])[1])
    b = jaxsub.sgmcmc.bytes_per_round(np.zeros(dim, np.float32), MANY_CLIENTS, 1)
    return {
        "part": "e",
        "what": f"{MANY_CLIENTS} clients (f ∝ N_s), {MANY_PARTICIPATING} vs all participating, "
        "CG-DSGLD diag, one-device layout",
        "dim": dim,
        "rounds": rounds,
        "local_steps": local_steps,
        "rounds_per_s_all": rounds / t["baseline_s"],
        "rounds_per_s_partial": rounds / t["candidate_s"],
        "acted_fraction_all": acted[MANY_CLIENTS],
        "acted_fraction_partial": acted[MANY_PARTICIPATING],
        "acting_chain_rounds_per_s_all": MANY_CLIENTS * acted[MANY_CLIENTS] * rounds / t["baseline_s"],
        "acting_chain_rounds_per_s_partial": MANY_CLIENTS * acted[MANY_PARTICIPATING] * rounds / t["candidate_s"],
        "bytes_per_round_expected": b["expected"],
        "compile_s": t.get("baseline_first_call_s"),
        "load_average_1min": os.getloadavg()[0],
    }


def _timed(fn, *args, **kwargs):
    """``(fn(...), wall seconds, CPU seconds of this process and its children)``."""
    import resource
    import time

    def cpu():
        return sum(
            getattr(resource.getrusage(w), f)
            for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
            for f in ("ru_utime", "ru_stime")
        )

    w0, c0 = time.perf_counter(), cpu()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - w0, cpu() - c0


def markdown(rows: list[dict]) -> str:
    """The issue's table: overhead ratios per d (ratio of medians [ratio of minimums]), (c) and (d)."""
    dims = (10, REPORT_DIM, SPARSE_DIM)
    lines = ["| part | d = 10 | d = 50 | d = 10⁵ | target |", "|---|---|---|---|---|"]
    for part, what in (("a", "jaxsub.dsgld"), ("a0", "shard 0"), ("a'", "traced-size"), ("b", "diag"), ("b", "full")):
        picked = [r for r in rows if r.get("part") == part and what in r["what"]]
        if not picked:
            continue
        cells = []
        for d in dims:
            r = next((r for r in picked if r["dim"] == d), None)
            cells.append("" if r is None else f"{r['ratio']:.2f} [{r['ratio_of_minimums']:.2f}]")
        lines.append(f"| ({part}) {picked[0]['what']} | " + " | ".join(cells) + f" | {picked[0]['target']} |")
    for r in rows:
        if r.get("part") == "c":
            lines.append(
                f"| (c) 8 simulated CPU devices / vmap on 1 device, {r['chains']} chains | "
                f"{r['speedup_8dev_over_1dev']:.2f}x rounds/s ({r['shard_map_rounds_per_s']:.1f} vs "
                f"{r['vmap_rounds_per_s']:.1f}); {r['bytes_per_round_expected']:,.0f} B expected "
                f"({r['bytes_per_round_worst']:,.0f} B worst) per round; {r['collective_permutes_in_program']} "
                f"collective permutes, {r['other_collectives_in_program']} other collectives | | | report |"
            )
        if r.get("part") == "e":
            lines.append(
                f"| (e) {r['what']} | all: {r['rounds_per_s_all']:.1f} rounds/s, {r['acted_fraction_all']:.3f} "
                f"of chain-rounds act; {MANY_PARTICIPATING}: {r['rounds_per_s_partial']:.1f} rounds/s, "
                f"{r['acted_fraction_partial']:.3f} act; {r['bytes_per_round_expected']:,.0f} B per round "
                "(one client per device) | | | report |"
            )
        if r.get("part") == "d":
            lines.append(
                f"| (d) MNIST sampler (d = {r['dim']:,}), {r['platform']} ({r['device']}) | DSGLD "
                f"{r['dsgld_rounds_per_s']:.1f} rounds/s, CG-DSGLD {r['cg_dsgld_rounds_per_s']:.1f} rounds/s "
                f"(CG / DSGLD time {r['ratio']:.2f}) | | | report |"
            )
    parts = {}
    for r in rows:
        parts.setdefault(r["part"], [0.0, 0.0])
        parts[r["part"]][0] += r.get("part_wall_s", 0.0)
        parts[r["part"]][1] += r.get("part_cpu_s", 0.0)
    load = [r["load_average_1min"] for r in rows if "load_average_1min" in r]
    lines.append("")
    lines.append(
        "wall / CPU seconds per part (compiles included): "
        + ", ".join(f"{k} {w:.0f} / {c:.0f}" for k, (w, c) in parts.items())
        + f"; 1-min load average {min(load):.1f}-"
        f"{max(load):.1f}"
    )
    return "\n".join(lines)


def run(*, quick: bool) -> list[dict]:
    # full mode: 5 alternating repeats of 50 rounds x 100 local steps (5,000 SGLD steps per call; 500 at
    # d = 1e5): the whole command must stay within 3 minutes, and compilation (reported apart) dominates it
    repeats = 3 if quick else 5
    rounds = 25 if quick else 50
    rows = []
    for dim in (10, 50, SPARSE_DIM):
        new, wall, cpu = _timed(
            part_a_b, dim, local_steps=100, rounds=rounds if dim < SPARSE_DIM else max(5, rounds // 10), repeats=repeats
        )
        for r in new:  # the part's wall/CPU time is shared out over its rows (report only)
            r.update(part_wall_s=wall / len(new), part_cpu_s=cpu / len(new))
        rows += new
    new, wall, cpu = _timed(part_c, dim=10, chains=4, local_steps=20, rounds=rounds, repeats=repeats)
    rows.append(dict(new, part_wall_s=wall, part_cpu_s=cpu))
    new, wall, cpu = _timed(part_e, rounds=max(5, rounds // 5), repeats=repeats)
    rows.append(dict(new, part_wall_s=wall, part_cpu_s=cpu))
    # (d): 10 rounds per call on a CPU (about 0.1 s a round on 2 shared cores), 200 on an accelerator
    cpu_backend = jax.default_backend() == "cpu"
    new, wall, cpu = _timed(part_d, rounds=10 if cpu_backend else 200, repeats=3 if cpu_backend else repeats)
    rows.append(dict(new, part_wall_s=wall, part_cpu_s=cpu))
    print(markdown(rows))
    return rows
