"""ARCH(q) model selection (paper §5.2): ESS of q per second, racing vs exact sweeps, 16 chains.

Model and sweep: ``experiments/arch_model_selection.py`` (S&P 500 daily
log-returns 1950-2018, N = 17,315 likelihood factors, q ∈ {5, 10, ..., 30},
Carlin & Chib with Laplace pseudo-priors). Each sweep draws q by racing-Normal
Gibbs over the 6 models (second-order Taylor control variate per model, six
coefficients per datum and model: ``experiments._arch_model.cv_values``), moves
the active model's parameters by an SGLD proposal corrected by racing-Normal
MH, and redraws the others from their pseudo-priors; the exact sampler runs the
same sweep with every decision on all N data. Both use the same fixed adjusted
model priors (from the pilot's Laplace evidence), 16 chains from the same start.
The exact chains are timed both under ``jax.vmap`` and one after the other
(``lax.map``), and the faster layout is the baseline; the racing chains run as
one batch (``arch_model_selection.make_batched_sweep``: the 16 Gibbs races in one
``racing_gibbs.build_batched_kernel`` call, the 16 MH tests in one
``racing_mh.build_batched_kernel`` call, each round advancing only unfinished races).

Timing: :func:`benchmarks._common.compare`, twice (racing vs each exact layout;
alternating calls of one 16-chain run of ``S`` sweeps, medians, first call =
compile reported apart). ESS of q: BlackJAX's multi-chain ESS over all chains of
the timed calls (every call uses new keys). ESS(q)/s = ESS per call / median seconds per call. The
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
from experiments.arch_model_selection import NUM_MODELS, make_batched_sweep, make_sweep

TITLE = "ARCH(q) model selection (S&P 500, Q = {5..30}): ESS of q per second, racing vs exact, 16 chains"

NUM_CHAINS = 16
#: How the racing chains run: ``"batched"`` (:func:`make_batched_sweep`, one race batch per
#: sweep step across chains), ``"map"`` (``lax.map``: one chain after the other) or ``"vmap"``
#: (every racing loop runs until the slowest chain's race ends). The exact sweep is timed as
#: ``vmap`` and ``map`` and the faster one is the baseline.
RACING_LAYOUT = "batched"


def _chains_fn(sweep, num_sweeps, log_pi, layout):
    """``run(key) -> (k [C, S], evals [C, S])``: 16 chains of ``num_sweeps`` sweeps (``layout``: vmap or map)."""

    def chain(key):
        def body(state, k):
            state, rec = sweep(k, state, log_pi)
            return state, (rec["k"], rec["gibbs_evals"] + rec["mh_evals"])

        init = (jnp.asarray(NUM_MODELS - 1, jnp.int32), jnp.zeros((NUM_MODELS, P), jnp.float32))
        return jax.lax.scan(body, init, jax.random.split(key, num_sweeps))[1]

    over_chains = jax.vmap(chain) if layout == "vmap" else (lambda ks: jax.lax.map(chain, ks))
    return jax.jit(lambda key: over_chains(jax.random.split(key, NUM_CHAINS)))


def _batched_chains_fn(sweep, num_sweeps, log_pi):
    """``run(key) -> (k [C, S], evals [C, S])`` for a sweep over all chains at once (:func:`make_batched_sweep`)."""

    def run(key):
        def body(state, k):
            state, rec = sweep(k, state, log_pi)
            return state, (rec["k"], rec["gibbs_evals"] + rec["mh_evals"])

        init = (jnp.full(NUM_CHAINS, NUM_MODELS - 1, jnp.int32), jnp.zeros((NUM_CHAINS, NUM_MODELS, P), jnp.float32))
        ks, evals = jax.lax.scan(body, init, jax.random.split(key, num_sweeps))[1]
        return ks.T, evals.T

    return jax.jit(run)


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
    num_sweeps = 100 if quick else 150
    repeats = 2
    outs = {"exact vmap": [], "exact map": [], "racing": []}
    fns = {
        "exact vmap": _chains_fn(make_sweep(data, pilot, exact=True), num_sweeps, log_pi, "vmap"),
        "exact map": _chains_fn(make_sweep(data, pilot, exact=True), num_sweeps, log_pi, "map"),
        "racing": (
            _batched_chains_fn(make_batched_sweep(data, pilot, NUM_CHAINS), num_sweeps, log_pi)
            if RACING_LAYOUT == "batched"
            else _chains_fn(make_sweep(data, pilot, exact=False), num_sweeps, log_pi, RACING_LAYOUT)
        ),
    }
    fns = {name: _keeping(fn, outs[name]) for name, fn in fns.items()}
    keys = jax.random.split(jax.random.key(3), 100)
    t_vmap = compare(fns["exact vmap"], fns["racing"], lambda i: (keys[i],), repeats=repeats)
    t_map = compare(fns["exact map"], fns["racing"], lambda i: (keys[50 + i],), repeats=repeats)
    layout = "vmap" if t_vmap["baseline_s"] <= t_map["baseline_s"] else "map"
    t_exact = t_vmap if layout == "vmap" else t_map
    racing_s = float(np.median(t_vmap["candidate_times"] + t_map["candidate_times"]))
    outs["exact"] = outs.pop(f"exact {layout}")
    burn = num_sweeps // 10
    rows, freqs = [], {}
    timed = {
        "exact": outs["exact"][1:],  # the timed calls only (the first call compiles)
        "racing": outs["racing"][1 : 1 + repeats] + outs["racing"][2 + repeats :],
    }
    for name, seconds, first in (
        ("exact", t_exact["baseline_s"], t_exact["baseline_first_call_s"]),
        ("racing", racing_s, t_vmap["candidate_first_call_s"]),
    ):
        ks = np.concatenate([np.asarray(o[0])[:, burn:] for o in timed[name]])
        evals = np.concatenate([np.asarray(o[1]) for o in timed[name]])
        q = np.asarray(ORDERS, np.float32)[ks]
        ess = float(effective_sample_size(jnp.asarray(q), chain_axis=0, sample_axis=1))
        per_chain = np.stack([np.bincount(k, minlength=NUM_MODELS) / k.size for k in ks])
        freqs[name] = (per_chain.mean(0), per_chain.std(0, ddof=1) / np.sqrt(len(per_chain)))
        ess_per_call = ess / len(timed[name])
        rows.append(
            {
                "sampler": f"{name} sweep, {NUM_CHAINS} chains ({layout if name == 'exact' else RACING_LAYOUT})",
                "N": data.num_data,
                "sweeps_per_chain": num_sweeps,
                "s_per_call": seconds,
                "ms_per_sweep_all_chains": 1e3 * seconds / num_sweeps,
                "evals_per_sweep_per_chain": float(evals.mean()),
                "ess_q_per_call": ess_per_call,
                "ess_q_per_s": ess_per_call / seconds,
                "first_call_s": first,
                "adjusted_p_q": " ".join(f"{m:.3f}±{s:.3f}" for m, s in zip(*freqs[name])),
            }
        )
    ratio = rows[1]["ess_q_per_s"] / rows[0]["ess_q_per_s"]
    diff = np.abs(freqs["racing"][0] - freqs["exact"][0])
    se = np.sqrt(freqs["racing"][1] ** 2 + freqs["exact"][1] ** 2)
    rows[1]["ess_q_per_s_vs_exact"] = ratio
    rows[1]["max_z_p_q_vs_exact"] = float(np.max(diff / np.maximum(se, 1e-12)))
    rows[1]["p_q_agree_3se"] = bool(np.all(diff <= 3 * se))
    rows[0]["ess_q_per_s_vs_exact"] = 1.0
    rows[0]["s_per_call_vmap"] = t_vmap["baseline_s"]
    rows[0]["s_per_call_map"] = t_map["baseline_s"]
    print(
        f"ESS(q)/s racing / exact: {ratio:.2f}; max |p_racing - p_exact| / se = {rows[1]['max_z_p_q_vs_exact']:.2f}",
        flush=True,
    )
    return rows
