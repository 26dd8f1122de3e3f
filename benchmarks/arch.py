"""ARCH(q) model selection (paper §5.2): ESS of q per second, racing vs exact sweeps, 16 chains.

Model and sweep: ``experiments/arch_model_selection.py`` (S&P 500 daily
log-returns 1950-2018, N = 17,315 likelihood factors, q ∈ {5, 10, ..., 30},
Carlin & Chib with Laplace pseudo-priors). Each sweep draws q by racing-Normal
Gibbs over the 6 models (first-order Taylor control variate per model), moves
the active model's parameters by an SGLD proposal corrected by racing-Normal
MH, and redraws the others from their pseudo-priors; the exact sampler runs the
same sweep with every decision on all N data. Both use the same fixed adjusted
model priors (from the pilot's Laplace evidence), 16 chains under ``jax.vmap``
from the same start.

Timing: :func:`benchmarks._common.compare` (alternating calls of one 16-chain
run of ``S`` sweeps each, medians, first call = compile reported apart). ESS of
q: BlackJAX's multi-chain ESS over all chains of the timed calls (every call
uses new keys). ESS(q)/s = ESS per call / median seconds per call. The
posterior of q is compared through the adjusted visit frequencies, with the
Monte Carlo standard error from the spread between chains.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from blackjax.diagnostics import effective_sample_size

from benchmarks._common import compare
from experiments._arch_model import ORDERS, P, fit_pilot, load_arch_data
from experiments.arch_model_selection import NUM_MODELS, make_sweep

TITLE = "ARCH(q) model selection (S&P 500, Q = {5..30}): ESS of q per second, racing vs exact, 16 chains"

NUM_CHAINS = 16


def _chains_fn(sweep, num_sweeps, log_pi):
    """``run(key) -> (k [C, S], evals [C, S])``: 16 chains of ``num_sweeps`` sweeps (vmap)."""

    def chain(key):
        def body(state, k):
            state, rec = sweep(k, state, log_pi)
            return state, (rec["k"], rec["gibbs_evals"] + rec["mh_evals"])

        init = (jnp.asarray(NUM_MODELS - 1, jnp.int32), jnp.zeros((NUM_MODELS, P), jnp.float32))
        return jax.lax.scan(body, init, jax.random.split(key, num_sweeps))[1]

    return jax.jit(lambda key: jax.vmap(chain)(jax.random.split(key, NUM_CHAINS)))


def _keeping(fn, store):
    def call(*args):
        out = fn(*args)
        store.append(out)
        return out

    return call


def run(*, quick: bool) -> list[dict]:
    data = load_arch_data(3000 if quick else None)
    pilot = fit_pilot(data, num_iters=60 if quick else 150)
    evidence = np.asarray(pilot.laplace_log_evidence, np.float64)
    log_pi = jnp.asarray(-(evidence - evidence.max()), jnp.float32)  # adjusted priors: flatten p(q|r)
    num_sweeps = 150 if quick else 400
    repeats = 2 if quick else 3
    outs = {"exact": [], "racing": []}
    fns = {name: _keeping(_chains_fn(make_sweep(data, pilot, exact=(name == "exact")), num_sweeps, log_pi), outs[name])
           for name in outs}
    keys = jax.random.split(jax.random.key(3), 100)
    timing = compare(fns["exact"], fns["racing"], lambda i: (keys[i],), repeats=repeats)
    burn = num_sweeps // 10
    rows, freqs = [], {}
    for name, seconds, first in (("exact", timing["baseline_s"], timing["baseline_first_call_s"]),
                                 ("racing", timing["candidate_s"], timing["candidate_first_call_s"])):
        ks = np.concatenate([np.asarray(o[0])[:, burn:] for o in outs[name][1:]])  # timed calls only
        evals = np.concatenate([np.asarray(o[1]) for o in outs[name][1:]])
        q = np.asarray(ORDERS, np.float32)[ks]
        ess = float(effective_sample_size(jnp.asarray(q), chain_axis=0, sample_axis=1))
        per_chain = np.stack([np.bincount(k, minlength=NUM_MODELS) / k.size for k in ks])
        freqs[name] = (per_chain.mean(0), per_chain.std(0, ddof=1) / np.sqrt(len(per_chain)))
        ess_per_call = ess / (len(outs[name]) - 1)
        rows.append({
            "sampler": f"{name} sweep, {NUM_CHAINS} chains (vmap)",
            "N": data.num_data,
            "sweeps_per_chain": num_sweeps,
            "s_per_call": seconds,
            "ms_per_sweep_all_chains": 1e3 * seconds / num_sweeps,
            "evals_per_sweep_per_chain": float(evals.mean()),
            "ess_q_per_call": ess_per_call,
            "ess_q_per_s": ess_per_call / seconds,
            "first_call_s": first,
            "adjusted_p_q": " ".join(f"{m:.3f}±{s:.3f}" for m, s in zip(*freqs[name])),
        })
    ratio = rows[1]["ess_q_per_s"] / rows[0]["ess_q_per_s"]
    diff = np.abs(freqs["racing"][0] - freqs["exact"][0])
    se = np.sqrt(freqs["racing"][1] ** 2 + freqs["exact"][1] ** 2)
    rows[1]["ess_q_per_s_vs_exact"] = ratio
    rows[1]["max_z_p_q_vs_exact"] = float(np.max(diff / np.maximum(se, 1e-12)))
    rows[1]["p_q_agree_3se"] = bool(np.all(diff <= 3 * se))
    rows[0]["ess_q_per_s_vs_exact"] = 1.0
    print(f"ESS(q)/s racing / exact: {ratio:.2f}; max |p_racing - p_exact| / se = {rows[1]['max_z_p_q_vs_exact']:.2f}", flush=True)
    return rows
