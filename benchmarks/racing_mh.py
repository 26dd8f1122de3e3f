"""Racing-Normal MH + control variate, 16 chains batched, vs exact MH and NumPyro HMCECS (Fertility, N = 254,654).

Model: Bayesian logistic regression on all 254,654 AER/Fertility rows (d = 8,
``experiments._racing_models``). Both MH samplers use the same Gaussian
random-walk proposal (2.38/sqrt(d) x the Laplace covariance's Cholesky factor):

* **exact MH**: BlackJAX's ``additive_step_random_walk`` on the full log density
  (it caches the current log density: N likelihood terms per step). Timed in two
  layouts, 16 chains under ``jax.vmap`` and one chain at a time; the faster one
  per chain-step is the baseline (on a CPU one chain at a time is usually
  faster; on a GPU the vmapped one is).
* **racing MH**: ``jaxsub.racing_mh.build_batched_kernel`` (``racing_batch``: every
  round advances only the unfinished races) over 16 chains, delta = 0.05,
  m_1 = 32 (50 is the paper's default), the second-order Taylor control variate at the MAP, data packed as one
  contiguous row per datum ``[x, y, l̂, a, c]`` (``experiments._racing_models.pack_logistic``:
  the proxy reads the likelihood's own row, one gather per datum instead of three).
  The batched kernel draws each step's randomness (proposal normals, ``u``, the
  race's permutation keys) with one ``jax.random.bits`` call per chain
  (``fused_random_bits=True``, its default: one threefry loop
  instead of six in the compiled step).
* **NumPyro HMCECS** (optional peer, Dang et al. 2019): NUTS with the Laplace
  covariance as mass matrix, Taylor proxy at the MAP, subsample 1,000, one chain;
  timed by its own second ``MCMC.run`` (compiled), not by ``compare``.

Wall-clock per step comes from :func:`benchmarks._common.compare` (alternating
calls, medians, first-call = compile time reported apart); ESS per chain-step
from 16 chains of each MH sampler (BlackJAX's multi-chain ESS, smallest
coordinate); ESS/s = ESS per chain-step x chains / seconds per step of all
chains. Moments of every sampler are compared with a BlackJAX NUTS reference on
the full data (the exact MH row shows the Monte Carlo error of that check).
"""

from __future__ import annotations

import time

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
from blackjax.mcmc.random_walk import normal

from benchmarks._common import compare
from experiments._racing_models import (
    full_logdensity,
    load_logistic,
    logprior,
    min_ess,
    moment_errors,
    nuts_reference,
    pack_logistic,
    packed_loglikelihood,
)
from jaxsub import racing_mh

TITLE = "Racing-Normal MH + CV (16 chains, batched) vs exact MH and NumPyro HMCECS: ESS/s, logistic N = 254,654"

DELTA = 0.05
#: First racing batch m_1. 32 (the paper's robust default is 50): with the Taylor
#: control variate 99% of races are decided by the first batch, so the first stage's 16 x m_1 random
#: row reads are most of a step; m_1 = 32 reads 30% fewer rows per chain-step (87 vs 124) at the same
#: acceptance, and the decision error measured on this problem is 0 of 3,600 decisions (3 of 3,600 at
#: m_1 = 50; delta = 0.05). Smaller m_1 leans harder on the Normal approximation of the first-stage mean
#: (docs/guides/discrete.md); keep ~30 or more.
FIRST_BATCH = 32
NUM_CHAINS = 16
#: Posterior moments within 0.1 posterior sd of the reference.
MOMENT_TOLERANCE = 0.1


def _exact_fns(problem, num_steps):
    """Exact RMH: ``(vmapped 16-chain run, single-chain run)``, data passed as an argument (no constant folding)."""
    scale = problem.rw_scale()

    def algo(data):
        return blackjax.additive_step_random_walk(lambda th: full_logdensity(th, data), normal(scale))

    @jax.jit
    def chains(key, starts, data):
        mh = algo(data)

        def body(states, k):
            states, _ = jax.vmap(mh.step)(jax.random.split(k, starts.shape[0]), states)
            return states, states.position

        return jax.lax.scan(body, jax.vmap(mh.init)(starts), jax.random.split(key, num_steps))[1]

    @jax.jit
    def single(key, start, data):
        mh = algo(data)

        def body(state, k):
            state, _ = mh.step(k, state)
            return state, state.position

        return jax.lax.scan(body, mh.init(start), jax.random.split(key, num_steps))[1]

    return chains, single


def _racing_fn(problem, packed, num_steps):
    """Batched racing MH over the chains: positions ``[steps, C, d]`` and evaluations ``[steps, C]``.

    ``data`` is ``packed.rows``; the control variate is built on that argument so that the
    proxy and the likelihood gather the same rows.
    """
    kernel = racing_mh.build_batched_kernel(problem.num_data, delta=DELTA, first_batch_size=FIRST_BATCH)
    proposal = racing_mh.gaussian_random_walk(problem.rw_scale())

    @jax.jit
    def chains(key, starts, data):
        cv = packed.control_variate(data)

        def body(states, k):
            states, info = kernel(
                jax.random.split(k, starts.shape[0]), states, logprior, packed_loglikelihood, data, proposal, cv
            )
            return states, (states.position, info.num_evaluations, info.is_accepted)

        states = jax.vmap(lambda x: racing_mh.init(x, logprior))(starts)
        return jax.lax.scan(body, states, jax.random.split(key, num_steps))[1]

    return chains


def _hmcecs_row(problem, reference, num_samples, exact_ess_per_s, racing_call=None, repeats: int = 3):
    try:
        import numpyro
        import numpyro.distributions as dist
        from numpyro.infer import HMCECS, NUTS
    except Exception as err:  # optional dependency (the `peers` extra)
        return {"sampler": "numpyro HMCECS", "skipped": f"numpyro not importable: {err!r}"}
    x, y = jnp.asarray(problem.x), jnp.asarray(problem.y)
    n, d = x.shape

    def model():
        theta = numpyro.sample("theta", dist.Normal(jnp.zeros(d), 10.0).to_event(1))
        with numpyro.plate("N", n, subsample_size=1000) as idx:
            numpyro.sample("obs", dist.Bernoulli(logits=x[idx] @ theta), obs=y[idx])

    kernel = HMCECS(
        NUTS(model, inverse_mass_matrix=problem.laplace_cov, adapt_mass_matrix=False, dense_mass=True),
        num_blocks=10,
        proxy=HMCECS.taylor_proxy({"theta": problem.map_position}),
    )
    num_warmup = 200
    try:
        # One compiled scan over HMCECS.sample (no MCMC.run): numpyro 0.21's MCMC.run calls
        # HMCECS.init again on a second run, which wraps the model in a second likelihood
        # estimator ("duplicate site _biased_corrected_log_likelihood"); 0.22 does not. The
        # first call (compile + warmup + draws) is timed apart; the second call continues from
        # its state past warmup (no adaptation) and is the timed sampling run.
        state = kernel.init(jax.random.key(11), num_warmup, None, (), {})

        @jax.jit
        def steps(st):
            def body(s, _):
                s = kernel.sample(s, (), {})
                return s, s.z["theta"]

            return jax.lax.scan(body, st, None, length=num_warmup + num_samples)

        start = time.perf_counter()
        state, warm = jax.block_until_ready(steps(state))
        first = time.perf_counter() - start
        # Timed calls continue from the state past warmup, alternating with one call of the racing
        # chains (``racing_call() -> seconds per 16-chain step``) when given, so that load drifts hit
        # both samplers alike (unpaired, the ratio swung 0.7-4x at load 3-8).
        draws, sampling_runs, racing_steps = [np.asarray(warm)[num_warmup:]], [], []
        for _ in range(repeats if racing_call is not None else 1):
            start = time.perf_counter()
            state, timed = jax.block_until_ready(steps(state))
            sampling_runs.append(time.perf_counter() - start)
            draws.append(np.asarray(timed)[num_warmup:])
            if racing_call is not None:
                racing_steps.append(racing_call())
        sampling = float(np.median(sampling_runs))
        num_timed = num_warmup + num_samples
    except Exception as err:  # numpyro/jax version mismatch etc.
        return {"sampler": "numpyro HMCECS", "skipped": f"HMCECS failed: {type(err).__name__}: {err}"}
    samples = np.stack(draws[:2])  # the same draws as before pairing (warmup call + first timed call)
    ess_per_draw = min_ess(samples) / samples.size * d
    mean_err, sd_err = moment_errors(samples, reference)
    rate = ess_per_draw * num_timed / sampling
    paired = {}
    if racing_steps:
        paired = {
            "paired_hmcecs_ms_per_draw": [1e3 * t / num_timed for t in sampling_runs],
            "paired_racing_ms_per_step": [1e3 * t for t in racing_steps],
            # racing ESS/s / HMCECS ESS/s per alternation = (s_HMCECS per draw / ESS per draw) /
            # (s_racing per step / ESS per step): filled in by run() with racing's ESS per step.
            "_paired": (sampling_runs, racing_steps, num_timed, ess_per_draw),
        }
    return {
        "sampler": "numpyro HMCECS (NUTS, Taylor proxy, m=1000), 1 chain",
        "chains": 1,
        "numpyro": numpyro.__version__,
        "ms_per_step_all_chains": 1e3 * sampling / num_timed,
        "first_call_s": first,
        "ess_per_chain_step": ess_per_draw,
        "ess_per_s": rate,
        "ess_per_s_vs_exact": rate / exact_ess_per_s,
        "mean_err_sd": mean_err,
        "sd_err_sd": sd_err,
        "moments_ok": bool(max(mean_err, sd_err) <= MOMENT_TOLERANCE),
        "note": "timed by calls of one jitted scan over HMCECS.sample (past warmup), alternating with racing calls",
        **paired,
    }


def _group_ess(samples, groups: int = 4) -> np.ndarray:
    """ESS per chain-step, averaged over the coordinates, of each of ``groups`` disjoint groups of
    chains (their spread over the independent groups gives the Monte Carlo error). The average over
    coordinates, not the minimum: the minimum of noisy small-group estimates is biased low."""
    from blackjax.diagnostics import effective_sample_size

    parts = np.array_split(np.asarray(samples), groups, axis=0)
    return np.array(
        [
            float(np.mean(np.asarray(effective_sample_size(jnp.asarray(g), chain_axis=0, sample_axis=1))))
            / g[:, :, 0].size
            for g in parts
        ]
    )


def run(*, quick: bool) -> list[dict]:
    problem = load_logistic(None)
    n, d = problem.num_data, problem.map_position.shape[0]
    packed = pack_logistic(problem)
    data, rows = problem.data, packed.rows
    exact_steps, racing_steps = (300, 1500) if quick else (1000, 2000)
    exact_timed, racing_timed = (50, 500) if quick else (100, 1000)
    repeats = 3 if quick else 5
    chol = np.linalg.cholesky(np.asarray(problem.laplace_cov))
    starts = np.asarray(problem.map_position) + np.random.default_rng(0).standard_normal((NUM_CHAINS, d)) @ chol.T
    starts = jnp.asarray(starts, jnp.float32)

    exact_chains, exact_single = _exact_fns(problem, exact_timed)
    racing_chains = _racing_fn(problem, packed, racing_timed)
    keys = jax.random.split(jax.random.key(7), 1000)
    # Wall-clock: one call = `*_timed` steps of all 16 chains (exact: also of one chain), alternating.
    vm = compare(
        exact_chains,
        racing_chains,
        lambda i: (keys[i], starts, data),
        lambda i: (keys[i], starts, rows),
        repeats=repeats,
    )
    single = compare(
        exact_single,
        racing_chains,
        lambda i: (keys[i], starts[0], data),
        lambda i: (keys[i], starts, rows),
        repeats=repeats,
    )
    exact_vmap_step = vm["baseline_s"] / exact_timed  # all 16 chains
    exact_single_chain_step = single["baseline_s"] / exact_timed  # one chain
    racing_step = np.median([vm["candidate_s"], single["candidate_s"]]) / racing_timed  # all 16 chains
    exact_step = min(exact_vmap_step, NUM_CHAINS * exact_single_chain_step)
    exact_layout = "vmap" if exact_vmap_step <= NUM_CHAINS * exact_single_chain_step else "one chain at a time"

    # ESS per chain-step from 16 chains of each sampler.
    reference = nuts_reference(problem, num_draws=400 if quick else 1000, num_warmup=100 if quick else 200)
    ess_vmap, ess_single = _exact_fns(problem, exact_steps)
    if exact_layout == "vmap":
        ex = np.asarray(ess_vmap(jax.random.key(1), starts, data))
    else:  # the same chains one at a time (lax.map), the faster layout here
        ex_keys = jax.random.split(jax.random.key(1), NUM_CHAINS)
        ex = np.swapaxes(
            np.asarray(
                jax.jit(lambda ks, xs, dd: jax.lax.map(lambda a: ess_single(a[0], a[1], dd), (ks, xs)))(
                    ex_keys, starts, data
                )
            ),
            0,
            1,
        )
    ra_pos, ra_evals, ra_acc = _racing_fn(problem, packed, racing_steps)(jax.random.key(2), starts, rows)
    ra = np.asarray(ra_pos)
    ex, ra = np.swapaxes(ex, 0, 1)[:, exact_steps // 10 :], np.swapaxes(ra, 0, 1)[:, racing_steps // 10 :]
    ex_ess = min_ess(ex) / ex[:, :, 0].size  # per chain-step
    ra_ess = min_ess(ra) / ra[:, :, 0].size
    # Both MH samplers use the same proposal, and racing's decisions are exact MH's except with
    # probability <= delta, so their ESS per chain-step should agree: check it with the Monte
    # Carlo error of the estimates (4 groups of 4 independent chains each, ESS averaged over the
    # coordinates), then compare ESS/s also with one common ESS per chain-step, i.e. by the cost per step.
    ex_groups, ra_groups = _group_ess(ex), _group_ess(ra)
    ex_se, ra_se = (np.std(g, ddof=1) / np.sqrt(len(g)) for g in (ex_groups, ra_groups))
    z_ess = (np.mean(ra_groups) - np.mean(ex_groups)) / np.hypot(ex_se, ra_se)
    common_ess = (np.mean(ex_groups) / ex_se**2 + np.mean(ra_groups) / ra_se**2) / (1 / ex_se**2 + 1 / ra_se**2)
    ex_rate = ex_ess * NUM_CHAINS / exact_step
    ra_rate = ra_ess * NUM_CHAINS / racing_step
    cost_ratio = exact_step / racing_step
    print(
        f"cost per 16-chain step: exact {1e3 * exact_step:.3f} ms ({exact_layout}), racing {1e3 * racing_step:.4f} ms: "
        f"x{cost_ratio:.1f}",
        flush=True,
    )
    print(
        f"mean-coordinate ESS per chain-step (4 groups of 4 chains, mean +- se): exact {np.mean(ex_groups):.4f} +- {ex_se:.4f} "
        f"({exact_steps} steps), racing {np.mean(ra_groups):.4f} +- {ra_se:.4f} ({racing_steps} steps), z = {z_ess:.2f}; "
        f"common {common_ess:.4f}: ESS/s ratio with the common ESS = cost ratio x{cost_ratio:.1f}",
        flush=True,
    )
    rows = []
    for name, ess, step, rate, samples, extra in (
        (
            f"exact MH (BlackJAX RMH), 16 chains, {exact_layout}",
            ex_ess,
            exact_step,
            ex_rate,
            ex,
            {
                "evals_per_step_over_N": 1.0,
                "ms_per_step_vmap16": 1e3 * exact_vmap_step,
                "ms_per_step_one_chain": 1e3 * exact_single_chain_step,
                "first_call_s": min(vm["baseline_first_call_s"], single["baseline_first_call_s"]),
            },
        ),
        (
            "racing MH + Taylor CV, 16 chains batched",
            ra_ess,
            racing_step,
            ra_rate,
            ra,
            {
                "evals_per_step_over_N": float(np.mean(np.asarray(ra_evals))) / n,
                "cost_ratio_per_step_vs_exact": cost_ratio,
                "ess_per_chain_step_z_vs_exact": float(z_ess),
                "ess_per_chain_step_common": float(common_ess),
                "acceptance": float(np.mean(np.asarray(ra_acc))),
                "first_call_s": vm["candidate_first_call_s"],
            },
        ),
    ):
        mean_err, sd_err = moment_errors(samples, reference)
        rows.append(
            {
                "sampler": name,
                "chains": NUM_CHAINS,
                "ms_per_step_all_chains": 1e3 * step,
                "ess_per_chain_step": ess,
                "ess_per_s": rate,
                "ess_per_s_vs_exact": rate / ex_rate,
                "mean_err_sd": mean_err,
                "sd_err_sd": sd_err,
                "moments_ok": bool(max(mean_err, sd_err) <= MOMENT_TOLERANCE),
                **extra,
            }
        )
        print(
            f"{name}: {1e3 * step:.3f} ms/step (all chains), ESS/chain-step {ess:.4f}, ESS/s {rate:.1f} "
            f"(x{rate / ex_rate:.1f} exact), moment errors {mean_err:.3f}/{sd_err:.3f} sd",
            flush=True,
        )
    racing_keys = [keys[500 + i] for i in range(repeats)]  # built before any clock starts
    calls = iter(racing_keys)

    def racing_call():
        key = next(calls)
        start = time.perf_counter()
        jax.block_until_ready(racing_chains(key, starts, packed.rows))
        return (time.perf_counter() - start) / racing_timed

    rows.append(_hmcecs_row(problem, reference, 1000 if quick else 2000, ex_rate, racing_call, repeats=repeats))
    if "ess_per_s" in rows[-1]:
        rows[1]["ess_per_s_vs_hmcecs_unpaired"] = ra_rate / rows[-1]["ess_per_s"]
        hm_runs, ra_runs, num_timed, hm_ess = rows[-1].pop("_paired")
        ratios = [(ra_ess * NUM_CHAINS / r) / (hm_ess * num_timed / h) for h, r in zip(hm_runs, ra_runs)]
        rows[1]["ess_per_s_vs_hmcecs_paired"] = ratios
        rows[1]["ess_per_s_vs_hmcecs"] = float(np.median(ratios))
        print(
            f"racing / HMCECS ESS/s: {rows[1]['ess_per_s_vs_hmcecs']:.2f} (median of {len(ratios)} alternations of "
            f"one HMCECS call and one racing call: {', '.join(f'{v:.2f}' for v in ratios)}; unpaired, with the "
            f"racing step of compare(): {rows[1]['ess_per_s_vs_hmcecs_unpaired']:.2f})",
            flush=True,
        )
    return rows
