"""Racing-Normal MH vs exact MH: ESS per second on Bayesian logistic regression (AER/Fertility).

For each N (random subsets of the 254,654 Fertility rows), both samplers use the
same Gaussian random-walk proposal (2.38/sqrt(d) x Laplace covariance) and the
same number of steps; the exact one is BlackJAX's
``additive_step_random_walk`` on the full log density (it caches the current
log density, so it reads N likelihood terms per step), the racing one is
``jaxsub.racing_mh`` with delta = 0.05, m_1 = 50 and the second-order Taylor
control variate around the MAP. Wall-clock comes from
:func:`benchmarks._common.compare` (alternating calls, medians, compile time
apart), one single-chain call of 2,000 steps per timing; ESS per step comes from 4
longer chains of each sampler (BlackJAX's multi-chain ESS, smallest coordinate),
and ESS/s = ESS per step / seconds per step. Moments are checked against a
BlackJAX NUTS reference on the full data (the exact MH row shows the Monte Carlo
error of the same check).

Optional peer row: NumPyro's ``HMCECS`` (energy-conserving subsampling HMC with
a Taylor proxy, Dang et al. 2019) on the same model, when numpyro imports.
"""
from __future__ import annotations

import time

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
from blackjax.mcmc.random_walk import normal

import jaxsub
from benchmarks._common import compare
from experiments._racing_models import (
    full_logdensity,
    load_logistic,
    logprior,
    loglikelihood,
    min_ess,
    moment_errors,
    nuts_reference,
)
from jaxsub.racing_mh import taylor_control_variate

TITLE = "Racing-Normal MH vs exact MH: ESS/s on logistic regression (Fertility), N = 1e4 .. 2.5e5"

DELTA = 0.05
FIRST_BATCH = 50
NUM_CHAINS = 4
#: Pass criterion of the issue: posterior moments within 0.1 posterior sd of the exact reference.
MOMENT_TOLERANCE = 0.1


def _single_chain_fn(algo, num_steps):
    def run(key, position):
        state = algo.init(position)
        keys = jax.random.split(key, num_steps)

        def body(s, k):
            s, info = algo.step(k, s)
            evals = getattr(info, "num_evaluations", jnp.zeros((), jnp.int32))
            return s, (s.position, evals)

        return jax.lax.scan(body, state, keys)[1]

    return jax.jit(run)


def _chains(fn, key, starts):
    outs = [fn(k, x0) for k, x0 in zip(jax.random.split(key, len(starts)), starts)]
    return np.stack([np.asarray(o[0]) for o in outs]), np.stack([np.asarray(o[1]) for o in outs])


def _hmcecs_row(problem, reference, num_samples, exact_time_per_ess):
    try:
        import numpyro
        import numpyro.distributions as dist
        from numpyro.infer import HMCECS, MCMC, NUTS
    except Exception as err:  # optional dependency
        return {"sampler": "numpyro HMCECS", "skipped": f"numpyro not importable: {err!r}"}
    x, y = np.asarray(problem.x), np.asarray(problem.y)
    n, d = x.shape
    x_j, y_j = jnp.asarray(x), jnp.asarray(y)
    subsample = 1000

    def model():
        theta = numpyro.sample("theta", dist.Normal(jnp.zeros(d), 10.0).to_event(1))
        with numpyro.plate("N", n, subsample_size=subsample) as idx:
            numpyro.sample("obs", dist.Bernoulli(logits=x_j[idx] @ theta), obs=y_j[idx])

    ref = {"theta": problem.map_position}
    kernel = HMCECS(
        NUTS(model, inverse_mass_matrix=problem.laplace_cov, adapt_mass_matrix=False, dense_mass=True),
        num_blocks=10,
        proxy=HMCECS.taylor_proxy(ref),
    )
    mcmc = MCMC(kernel, num_warmup=200, num_samples=num_samples, num_chains=1, progress_bar=False)
    try:
        start = time.perf_counter()
        mcmc.run(jax.random.key(11))
        first = time.perf_counter() - start
        draws = [np.asarray(mcmc.get_samples()["theta"])]
        mcmc.post_warmup_state = mcmc.last_state
        start = time.perf_counter()
        mcmc.run(mcmc.post_warmup_state.rng_key)
        sampling = time.perf_counter() - start
        draws.append(np.asarray(mcmc.get_samples()["theta"]))
    except Exception as err:  # numpyro/jax version mismatch etc.
        return {"sampler": "numpyro HMCECS", "skipped": f"HMCECS failed: {type(err).__name__}: {err}"}
    samples = np.stack(draws)
    ess = min_ess(samples) / len(draws)
    mean_err, sd_err = moment_errors(samples, reference)
    return {
        "sampler": "numpyro HMCECS (NUTS, Taylor proxy, m=1000)",
        "N": n,
        "seconds_per_chain": sampling,
        "first_run_s": first,
        "ess_per_chain": ess,
        "ess_per_s": ess / sampling,
        "ess_per_s_vs_exact_mh": (ess / sampling) * exact_time_per_ess,
        "mean_err_sd": mean_err,
        "sd_err_sd": sd_err,
        "note": "timed by numpyro's MCMC.run (second run, compiled); not via compare()",
    }


def run(*, quick: bool) -> list[dict]:
    sizes = (10_000, 100_000) if quick else (10_000, 100_000, 250_000)
    timing_steps = 2000
    ess_steps = 4000 if quick else 20000
    repeats = 3 if quick else 5
    rows = []
    for n in sizes:
        problem = load_logistic(n, seed=0)
        scale = problem.rw_scale()
        exact = blackjax.additive_step_random_walk(lambda th, data=problem.data: full_logdensity(th, data), normal(scale))
        cv = taylor_control_variate(loglikelihood, problem.data, problem.map_position)
        racing = jaxsub.racing_mh(
            logprior, loglikelihood, problem.data, delta=DELTA, first_batch_size=FIRST_BATCH, step_size=scale, control_variate=cv
        )
        x0 = problem.map_position
        keys = jax.random.split(jax.random.key(n), 1000)
        timing = compare(
            _single_chain_fn(exact, timing_steps), _single_chain_fn(racing, timing_steps), lambda i: (keys[i], x0), repeats=repeats
        )
        exact_step_s = timing["baseline_s"] / timing_steps
        racing_step_s = timing["candidate_s"] / timing_steps

        reference = nuts_reference(problem, num_draws=500 if quick else 1000, num_warmup=100 if quick else 200)
        chol = np.linalg.cholesky(np.asarray(problem.laplace_cov))
        starts = np.asarray(x0) + np.random.default_rng(n).standard_normal((NUM_CHAINS, x0.shape[0])) @ chol.T
        starts = jnp.asarray(starts, jnp.float32)
        ex_samples, _ = _chains(_single_chain_fn(exact, ess_steps), jax.random.key(1), starts)
        ra_samples, ra_evals = _chains(_single_chain_fn(racing, ess_steps), jax.random.key(2), starts)
        burn = ess_steps // 10
        kept = ess_steps - burn
        ex_ess = min_ess(ex_samples[:, burn:]) / NUM_CHAINS
        ra_ess = min_ess(ra_samples[:, burn:]) / NUM_CHAINS
        ex_mean_err, ex_sd_err = moment_errors(ex_samples[:, burn:], reference)
        ra_mean_err, ra_sd_err = moment_errors(ra_samples[:, burn:], reference)
        # ESS per second = (ESS per step) / (seconds per step), seconds from compare().
        ex_rate = ex_ess / kept / exact_step_s
        ra_rate = ra_ess / kept / racing_step_s
        rows.append(
            {
                "N": n,
                "exact_ms_per_step": 1e3 * exact_step_s,
                "racing_ms_per_step": 1e3 * racing_step_s,
                "time_speedup": timing["speedup"],
                "ess_steps_per_chain": kept,
                "exact_ess_per_chain": ex_ess,
                "racing_ess_per_chain": ra_ess,
                "exact_ess_per_s": ex_rate,
                "racing_ess_per_s": ra_rate,
                "ess_per_s_ratio": ra_rate / ex_rate,
                "eval_fraction": float(np.mean(ra_evals)) / n,
                "exact_mean_err_sd": ex_mean_err,
                "exact_sd_err_sd": ex_sd_err,
                "racing_mean_err_sd": ra_mean_err,
                "racing_sd_err_sd": ra_sd_err,
                "moments_ok": bool(max(ra_mean_err, ra_sd_err) <= MOMENT_TOLERANCE),
                "reference_ess": min_ess(reference),
                "exact_first_call_s": timing["baseline_first_call_s"],
                "racing_first_call_s": timing["candidate_first_call_s"],
            }
        )
        print(
            f"N={n}: ESS/s ratio {ra_rate / ex_rate:.2f} (time x{timing['speedup']:.2f}), "
            f"eval fraction {rows[-1]['eval_fraction']:.4f}, moment errors racing {ra_mean_err:.3f}/{ra_sd_err:.3f} sd, "
            f"exact {ex_mean_err:.3f}/{ex_sd_err:.3f} sd"
        )
    largest = rows[-1]
    problem = load_logistic(largest["N"], seed=0)
    peer = _hmcecs_row(
        problem,
        nuts_reference(problem, num_draws=500 if quick else 1000, num_warmup=100 if quick else 200),
        num_samples=1000 if quick else 2000,
        exact_time_per_ess=1.0 / largest["exact_ess_per_s"],
    )
    rows.append(peer)
    return rows
