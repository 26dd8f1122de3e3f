"""Federated Bayesian MLP on MNIST with label-skewed clients (El Mekkaoui et al. 2021, Sec. 5.3 setting).

Data: MNIST (``jaxsub.datasets.load_mnist``). Clients: the training rows sorted by
label are cut into ``2 S`` equal chunks and every client gets two chunks, so each
client holds mostly one or two digits (the "pathological non-IID" split of McMahan
et al. 2017). Model: a Bayesian MLP 784-50-10 (tanh), prior N(0, I) on every weight,
softmax likelihood; the position is the parameter pytree. Samplers, all from the
same start -- the FedSGD centre below -- and with the same number of SGLD steps and minibatch:

* SGLD on the pooled data (``blackjax.sgld``; the centralised reference);
* DSGLD, ``L`` local steps per round, ``f_s = 1/S`` (``jaxsub.sgmcmc.sample_rounds`` at α = 0);
* CG-DSGLD with diagonal Laplace surrogates expanded at one common point near the global mode:
  ``jaxsub.sgmcmc.laplace_surrogates(structure='diag', expansion='fedsgd')`` -- ``θ̄`` from FedSGD
  (every round each client sends its full-shard gradient, the server averages them and takes an Adam
  step: 50 rounds at lr 0.02 in quick mode, 300 at 0.01 in full mode), then every client's curvature at ``θ̄``:
  the empirical Fisher diagonal in quick mode (cheaper), the Gauss-Newton diagonal in full mode;
* (the FedAvg-centred surrogates, whose centre is client-drifted and whose CG-DSGLD falls below DSGLD, are
  compared at quick sizes by ``expansion_study``; full mode no longer fits them: 30 x 20 full-client Adam
  passes over 60,000 rows cost twice the FedSGD fit.)

All samplers run 3 independent chains from ``θ̄`` with the same step size, minibatch, rounds and local
steps, so the same number of SGLD gradient evaluations; the surrogate fit runs once before sampling and
also supplies every sampler's start.

Metric: test accuracy of the posterior predictive (class probabilities averaged over
the draws after burn-in, one draw per round), and its trajectory over rounds.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

import jaxsub
import jaxsub.datasets
from experiments._common import Report, progress, savefig
from experiments._sgld import jit, pooled_sgld_round

TITLE = "CG-DSGLD vs DSGLD vs centralised SGLD: Bayesian MLP on label-skewed MNIST clients"

HIDDEN = 50
BATCH = 32
LR = 0.1  # drift per step = LR x mean per-datum gradient, i.e. ε = 2 LR / N


def _pooled_sgld_chains(logprior, loglik, clients, local_steps, step_size, rounds, quick):
    """Centralised SGLD on the pooled client data, vmapped over chain keys: ``(theta0, keys) -> [chains, rounds, ...]``."""
    px = jnp.asarray(np.concatenate([c[0] for c in clients]))
    py = jnp.asarray(np.concatenate([c[1] for c in clients]))
    sgld_round = pooled_sgld_round(logprior, loglik, px, py, batch=BATCH, local_steps=local_steps, step_size=step_size)
    return jit(
        jax.vmap(lambda t, k: jax.lax.scan(sgld_round, t, jax.random.split(k, rounds))[1], in_axes=(None, 0)),
        quick=quick,
    )


def init_params(seed: int):
    """Glorot-style start (NumPy's generator: a jax.random.normal call would compile a program of its own)."""
    rng = np.random.default_rng(seed)
    return {
        "w1": jnp.asarray(rng.normal(size=(784, HIDDEN)) * np.sqrt(1.0 / 784), jnp.float32),
        "b1": jnp.zeros(HIDDEN),
        "w2": jnp.asarray(rng.normal(size=(HIDDEN, 10)) * np.sqrt(1.0 / HIDDEN), jnp.float32),
        "b2": jnp.zeros(10),
    }


def logits_fn(params, x):
    return jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def loglik(params, datum):
    x, y = datum
    logits = logits_fn(params, x)
    return logits[y] - jax.nn.logsumexp(logits)


def logprior(params):
    return -0.5 * sum(jnp.sum(p**2) for p in jax.tree.leaves(params))


def make_clients(x, y, num_clients, rng):
    order = np.argsort(y, kind="stable")
    chunks = np.array_split(order, 2 * num_clients)
    perm = rng.permutation(2 * num_clients)
    clients = []
    for c in range(num_clients):
        idx = np.concatenate([chunks[perm[2 * c]], chunks[perm[2 * c + 1]]])
        clients.append((x[idx], y[idx]))
    return clients


FEDAVG_ROUNDS, FEDAVG_STEPS = 6, 20  # quick mode; 5x as many rounds in full mode
#: FedSGD centre: (rounds, server Adam learning rate), quick mode / full mode. Quick: 50 rounds at 0.02 (
#: 100 at 0.01 before: centre 92.1% vs 91.1%, CG-DSGLD 0.35 / 0.30 point below pooled SGLD, half the fit's CPU)
FEDSGD_QUICK, FEDSGD_FULL = (50, 2e-2), (300, 1e-2)
SEEDS = (1, 2, 3)  # three independent chains per sampler


@jax.jit
def _conducive_ratio(theta, shard, arrays, xs, ys, scale):
    """‖conducive term‖ / ‖scaled minibatch likelihood gradient‖ at θ on one client (one compiled program)."""
    g_cg = jax.flatten_util.ravel_pytree(jaxsub.sgmcmc.conducive_gradient(theta, shard, arrays))[0]
    g_ll = jax.grad(lambda p: jnp.sum(jax.vmap(loglik, in_axes=(None, 0))(p, (xs, ys))))(theta)
    return jnp.linalg.norm(g_cg) / (scale * jnp.linalg.norm(jax.flatten_util.ravel_pytree(g_ll)[0]))


@jax.jit
def _predict(draws, x):  # one compiled program for every sampler (same shapes)
    return jax.lax.map(lambda p: jax.nn.softmax(logits_fn(p, x)), draws)


def predictive_curves(draws, x_test, y_test):
    """Running posterior-predictive test accuracy and log-likelihood per point after each draw;
    draws: pytree with leaves [T, ...]. Returns ``(accuracy [T], loglik [T])``."""
    probs = _predict(draws, x_test)  # [T, n, 10]
    cum = np.cumsum(np.asarray(probs, np.float64), axis=0) / np.arange(1, probs.shape[0] + 1)[:, None, None]
    loglik = np.log(np.maximum(np.take_along_axis(cum, y_test[None, :, None], axis=-1)[..., 0], 1e-12)).mean(1)
    return (cum.argmax(-1) == y_test[None, :]).mean(1), loglik


def predictive_accuracy(draws, x_test, y_test):
    """Running posterior-predictive accuracy; draws: pytree with leaves [T, ...]."""
    return predictive_curves(draws, x_test, y_test)[0]


def model_fn(params, datum):
    """Network output (logits) for one datum: the Gauss-Newton split ``loglik = output_loglik(model_fn)``."""
    return logits_fn(params, datum[0])


def output_loglik(logits, datum):
    return logits[datum[1]] - jax.nn.logsumexp(logits)


def surrogate_settings(quick: bool, expansion: str = "fedsgd") -> dict:
    """Settings of ``laplace_surrogates`` for this experiment (see the module docstring)."""
    if expansion == "fedsgd":
        curvature = (
            dict(curvature="fisher")
            if quick
            else dict(curvature="gauss_newton", gauss_newton=(model_fn, output_loglik))
        )
        rounds, lr = FEDSGD_QUICK if quick else FEDSGD_FULL
        return dict(structure="diag", expansion="fedsgd", num_steps=rounds, optimizer=optax.adam(lr), **curvature)
    return dict(
        structure="diag",
        curvature="fisher",
        expansion="fedavg",
        fedavg_local_steps=FEDAVG_STEPS,
        num_steps=FEDAVG_ROUNDS * FEDAVG_STEPS * (1 if quick else 5),
        optimizer=optax.adam(1e-2),
    )


def run(out_dir: Path, *, quick: bool) -> dict:
    out_dir = Path(out_dir)
    data = jaxsub.datasets.load_mnist()
    rng = np.random.default_rng(0)
    num_clients = 10
    n_train = 10_000 if quick else 60_000
    n_test = 2_000 if quick else 10_000
    rounds = 60 if quick else 600
    local_steps = 20 if quick else 50
    seeds = SEEDS
    keep = rng.choice(data.x.shape[0], n_train, replace=False)
    x, y = data.x[keep], data.y[keep]
    x_test, y_test = jnp.asarray(data.x_test[:n_test]), np.asarray(data.y_test[:n_test])
    clients = make_clients(x, y, num_clients, rng)
    digits = [np.bincount(c[1], minlength=10) for c in clients]
    top2 = float(np.mean([np.sort(d)[-2:].sum() / d.sum() for d in digits]))
    n_total = sum(len(c[1]) for c in clients)
    step_size = 2 * LR / n_total
    params0 = init_params(0)
    dim = sum(int(np.size(p)) for p in jax.tree.leaves(params0))
    burn = rounds // 3
    metrics = {
        "quick": quick,
        "clients": num_clients,
        "train_rows": n_total,
        "test_rows": n_test,
        "dim": dim,
        "architecture": f"MLP 784-{HIDDEN}-10 tanh, N(0, I) prior",
        "rounds": rounds,
        "local_steps": local_steps,
        "batch": BATCH,
        "step_size": step_size,
        "chains_per_sampler": len(seeds),
        "sgld_steps_per_run": rounds * local_steps,
        "mean_fraction_of_top_two_digits_per_client": top2,
    }
    probs = np.full(num_clients, 1.0 / num_clients)
    # Surrogates (the measured cause: what decides is the *expansion point*, not the curvature):
    # every client's likelihood is expanded at one common point θ̄ near the global (damped) mode, found by
    # FedSGD -- each round every client sends its full-shard gradient at θ̄, the server averages them
    # (size-weighted: the global gradient) and takes an Adam step -- with the empirical Fisher (quick) or
    # Gauss-Newton (full) diagonal of every client's likelihood at θ̄.
    fits = {"fedsgd": None}
    for expansion in fits:
        start = time.perf_counter()
        kw = surrogate_settings(quick, expansion)
        program = jit(jaxsub.sgmcmc.laplace_program(logprior, loglik, params0, **kw), quick=quick)
        fits[expansion] = jaxsub.sgmcmc.laplace_surrogates(logprior, loglik, clients, params0, program=program, **kw)
        metrics[f"laplace_fit_seconds_{expansion}"] = time.perf_counter() - start
        metrics[f"laplace_fit_gradient_evaluations_{expansion}"] = fits[
            expansion
        ].fit_info.likelihood_gradient_evaluations
    sur = fits["fedsgd"]
    unravel = jax.flatten_util.ravel_pytree(params0)[1]
    centre = unravel(jnp.asarray(sur.fit_info.expansion_point[0], jnp.float32))
    metrics["centre_test_accuracy"] = float(np.mean(np.asarray(logits_fn(centre, x_test)).argmax(-1) == y_test))
    metrics["curvature_excess_max"] = float(jaxsub.sgmcmc.curvature_excess(sur, probs).max())
    if not quick:  # diagnostic (a compile of its own): the conducive term against the DSGLD gradient at the start
        arrays = jaxsub.sgmcmc.conducive_arrays(sur, probs)
        metrics["conducive_to_likelihood_gradient_norm_at_start"] = [
            float(
                _conducive_ratio(
                    centre,
                    s,
                    arrays,
                    jnp.asarray(clients[s][0][:BATCH]),
                    jnp.asarray(clients[s][1][:BATCH]),
                    len(clients[s][1]) / (BATCH * probs[s]),
                )
            )
            for s in range(num_clients)
        ]
    # DSGLD (α = 0) and every CG-DSGLD variant share one compiled program (data, surrogates, α are arguments)
    runner = jit(
        jaxsub.sgmcmc.sample_rounds(logprior, loglik, batch_size=BATCH, local_steps=local_steps, num_rounds=rounds),
        quick=quick,
    )
    packed = jaxsub.sgmcmc.make_shards(clients)
    algos = {"DSGLD": (sur, 0.0), "CG-DSGLD": (sur, 1.0)}
    # every sampler starts at the same point θ̄ (the federated pipeline has it before sampling), with the
    # same step size, minibatch and number of SGLD steps
    curves, per_seed, seconds, test_ll = {}, {}, {}, {}
    for name, (surrogates, alpha) in progress(algos.items(), desc="samplers"):
        start_point = centre
        start = time.perf_counter()
        # the seeds are independent chains of one call (chain c's key: split(key(1), chains)[c])
        _, trace = runner(
            jax.random.key(1),
            jax.tree.map(lambda v: jnp.stack([v] * len(seeds)), start_point),
            packed.data,
            jnp.asarray(packed.sizes, jnp.int32),
            jnp.asarray(probs, jnp.float32),
            jaxsub.sgmcmc.conducive_arrays(surrogates, probs),
            step_size,
            alpha,
        )
        jax.block_until_ready(trace)
        seconds[name] = time.perf_counter() - start
        pc = [predictive_curves(jax.tree.map(lambda a: a[c, burn:], trace), x_test, y_test) for c in range(len(seeds))]
        curves[name] = (np.mean([p[0] for p in pc], 0), np.mean([p[1] for p in pc], 0))
        per_seed[name], test_ll[name] = [float(p[0][-1]) for p in pc], float(np.mean([p[1][-1] for p in pc]))
    # centralised SGLD on the pooled data, same steps, one draw per L steps
    sgld_chains = _pooled_sgld_chains(logprior, loglik, clients, local_steps, step_size, rounds, quick)
    start = time.perf_counter()
    path = jax.block_until_ready(sgld_chains(centre, jax.random.split(jax.random.key(1), len(seeds))))
    seconds["SGLD (pooled)"] = time.perf_counter() - start
    pc = [predictive_curves(jax.tree.map(lambda a: a[c, burn:], path), x_test, y_test) for c in range(len(seeds))]
    curves["SGLD (pooled)"] = (np.mean([p[0] for p in pc], 0), np.mean([p[1] for p in pc], 0))
    per_seed["SGLD (pooled)"] = [float(p[0][-1]) for p in pc]
    test_ll["SGLD (pooled)"] = float(np.mean([p[1][-1] for p in pc]))
    mean = {k: float(np.mean(v)) for k, v in per_seed.items()}
    rows = [
        [k, 100 * mean[k], " / ".join(f"{100 * a:.2f}" for a in per_seed[k]), test_ll[k], seconds[k]] for k in per_seed
    ]
    rows.append(["(FedSGD centre alone)", 100 * metrics["centre_test_accuracy"], "", "", ""])
    metrics["final_accuracy"] = mean
    metrics["final_test_loglik_per_point"] = test_ll
    metrics["sampling_seconds_all_chains"] = seconds
    metrics["final_accuracy_per_seed"] = per_seed
    gap = mean["SGLD (pooled)"] - mean["CG-DSGLD"]
    metrics["cg_gap_to_sgld_points"] = 100 * gap
    metrics["target_cg_within_1_point"] = bool(100 * gap <= 1.0)
    metrics["dsgld_below_both"] = bool(mean["DSGLD"] < min(mean["SGLD (pooled)"], mean["CG-DSGLD"]))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for name, style in (("SGLD (pooled)", ":"), ("DSGLD", "--"), ("CG-DSGLD", "-")):
        acc, ll = curves[name]
        rr = np.arange(burn + 1, rounds + 1)
        secs = seconds[name] * rr / rounds  # sampling wall-clock (all chains, one call) up to that round
        axes[0, 0].plot(rr, 100 * acc, style, label=name)
        axes[1, 0].plot(rr, ll, style, label=name)
        axes[0, 1].plot(secs, 100 * acc, style, label=name)
        axes[1, 1].plot(secs, ll, style, label=name)
    for ax in axes[:, 0]:
        ax.set_xlabel("round (draws after burn-in averaged)")
    for ax in axes[:, 1]:
        ax.set_xlabel(f"sampling wall-clock seconds ({len(seeds)} chains in one call)")
    for ax in axes[0]:
        ax.set_ylabel(f"posterior-predictive test accuracy (%), mean of {len(seeds)} chains")
    for ax in axes[1]:
        ax.set_ylabel("held-out log-likelihood per point")
    for ax in axes.ravel():
        ax.legend()
    fig.tight_layout()
    fig_name = savefig(fig, out_dir, "accuracy.png")
    rep = Report(TITLE, out_dir)
    rep.text(__doc__.split("\n", 2)[2])
    rep.text(
        f"Mode: {'quick' if quick else 'full'}; {num_clients} clients, {n_total:,} training rows "
        f"(mean share of a client's top two digits {top2:.2f}), {n_test:,} test rows; {rounds} rounds x "
        f"{local_steps} local steps, minibatch {BATCH}, ε = {step_size:.3g}; d = {dim:,} parameters; "
        f"burn-in {burn} rounds; {len(seeds)} independent chains per sampler (one call, split keys)."
    )
    rep.table(
        rows,
        [
            "method",
            "posterior-predictive test accuracy (%), mean",
            "per chain",
            "held-out log-lik / point (mean of chains)",
            "sampling seconds (all chains)",
        ],
    )
    rep.text(
        f"CG-DSGLD vs centralised SGLD: {-100 * gap:+.2f} points (target: within 1 point); "
        f"DSGLD below both: {metrics['dsgld_below_both']}. Surrogate fit (once, shared by all samplers as "
        f"their start): {metrics['laplace_fit_seconds_fedsgd']:.1f} s, "
        f"{metrics['laplace_fit_gradient_evaluations_fedsgd']:,} per-datum gradients; sampling: "
        f"{rounds * local_steps * BATCH:,} per run."
    )
    rep.figure(
        fig_name,
        "Running posterior-predictive test accuracy and held-out log-likelihood vs rounds and vs sampling wall-clock",
    )
    rep.write()
    return metrics


def local_steps_study(local_steps=(20, 5, 1), curvature_scales=(1.0, 0.1, 0.0), seeds=(1, 2), *, quick=True):
    """What closes the gap to pooled SGLD: shorter rounds (same total SGLD steps) or damped surrogate curvature?

    From the FedAvg centre, for every ``L`` in ``local_steps`` (``total / L`` rounds, the quick run's
    1,200 SGLD steps in all) run DSGLD and CG-DSGLD with the FedAvg-centred surrogates' curvature scaled by
    ``c`` in ``curvature_scales`` -- ``Λ_s ← c Λ_s`` with the expansion point θ̄ kept (``h_s = c Λ_s θ̄ + g_s``,
    so ``c = 0`` is the pure gradient control variate ``Σ_k ∇ℓ_k(θ̄) - ∇ℓ_s(θ̄)/f_s``), and pooled SGLD,
    for each seed. Returns ``{row: [accuracy per seed]}`` (posterior predictive, draws after a third of the
    rounds, thinned to one per 20 SGLD steps like the main run). Not part of ``run`` (a study
    from the FedAvg centre; ``expansion_study`` compares expansion points).
    """
    data = jaxsub.datasets.load_mnist()
    rng = np.random.default_rng(0)
    n_train, n_test, total_steps = (10_000, 2_000, 1_200) if quick else (60_000, 10_000, 30_000)
    keep = rng.choice(data.x.shape[0], n_train, replace=False)
    x_test, y_test = jnp.asarray(data.x_test[:n_test]), np.asarray(data.y_test[:n_test])
    clients = make_clients(data.x[keep], data.y[keep], 10, rng)
    n_total = sum(len(c[1]) for c in clients)
    step_size = 2 * LR / n_total
    params0 = init_params(0)
    probs = np.full(10, 0.1)
    sur = jaxsub.sgmcmc.laplace_surrogates(
        logprior,
        loglik,
        clients,
        params0,
        structure="diag",
        curvature="fisher",
        num_steps=FEDAVG_ROUNDS * FEDAVG_STEPS * (1 if quick else 5),
        fedavg_local_steps=FEDAVG_STEPS,
        optimizer=optax.adam(1e-2),
        expansion="fedavg",
    )
    theta_bar = np.asarray(sur.fit_info.expansion_point[0])
    centre = jax.flatten_util.ravel_pytree(params0)[1](jnp.asarray(theta_bar, jnp.float32))
    prec = np.asarray(sur.precision, np.float64)
    grads = np.asarray(sur.shift, np.float64) - prec * theta_bar

    def scaled(c):
        return sur._replace(
            precision=(c * prec).astype(np.float32), shift=(c * prec * theta_bar + grads).astype(np.float32)
        )

    packed = jaxsub.sgmcmc.make_shards(clients)
    results = {}
    for L in local_steps:
        rounds = total_steps // L
        burn, thin = rounds // 3, max(1, 20 // L)
        runner = jit(
            jaxsub.sgmcmc.sample_rounds(logprior, loglik, batch_size=BATCH, local_steps=L, num_rounds=rounds),
            quick=quick,
        )
        for name, surrogates, alpha in [("DSGLD", sur, 0.0)] + [
            (f"CG-DSGLD c={c:g}", scaled(c), 1.0) for c in curvature_scales
        ]:
            accs = []
            for seed in seeds:
                _, trace = runner(
                    jax.random.key(seed),
                    jax.tree.map(lambda v: v[None], centre),
                    packed.data,
                    jnp.asarray(packed.sizes, jnp.int32),
                    jnp.asarray(probs, jnp.float32),
                    jaxsub.sgmcmc.conducive_arrays(surrogates, probs),
                    step_size,
                    alpha,
                )
                draws = jax.tree.map(lambda a: a[0, burn:][thin - 1 :: thin], trace)
                accs.append(float(predictive_accuracy(draws, x_test, y_test)[-1]))
            results[f"L={L} {name}"] = accs
    px = jnp.asarray(np.concatenate([c[0] for c in clients]))
    py = jnp.asarray(np.concatenate([c[1] for c in clients]))
    sgld_round = pooled_sgld_round(logprior, loglik, px, py, batch=BATCH, local_steps=20, step_size=step_size)
    chain = jit(lambda t, k: jax.lax.scan(sgld_round, t, k), quick=quick)
    accs = []
    for seed in seeds:
        _, path = chain(centre, jax.random.split(jax.random.key(seed), total_steps // 20))
        accs.append(
            float(predictive_accuracy(jax.tree.map(lambda a: a[(total_steps // 20) // 3 :], path), x_test, y_test)[-1])
        )
    results["SGLD (pooled)"] = accs
    return results


def expansion_study(chains: int = 3, local_steps: int = 20, total_steps: int = 1_200) -> dict:
    """What decides CG-DSGLD on this network: the expansion point or the curvature? (quick sizes)

    For two common expansion points -- a FedAvg centre (a former library default; 6 rounds x 20 local Adam
    steps) and the FedSGD centre of ``run`` in quick mode (the global damped mode) --
    and from that point: DSGLD, CG-DSGLD with the gradient control variate only (``Λ_s = 0``), with the
    empirical Fisher diagonal and with the Gauss-Newton diagonal at the point, and pooled SGLD; ``L``
    local steps, ``total_steps`` SGLD steps in all, ``chains`` chains each (one call). Returns
    ``{centre: {sampler: [accuracy per chain]}}`` plus each centre's own test accuracy.
    ``python -m experiments.cgdsgld_mnist`` prints it.
    """
    data = jaxsub.datasets.load_mnist()
    rng = np.random.default_rng(0)
    keep = rng.choice(data.x.shape[0], 10_000, replace=False)
    x_test, y_test = jnp.asarray(data.x_test[:2_000]), np.asarray(data.y_test[:2_000])
    clients = make_clients(data.x[keep], data.y[keep], 10, rng)
    step_size = 2 * LR / sum(len(c[1]) for c in clients)
    params0 = init_params(0)
    unravel = jax.flatten_util.ravel_pytree(params0)[1]
    probs = np.full(10, 0.1)
    packed = jaxsub.sgmcmc.make_shards(clients)
    rounds = total_steps // local_steps
    burn = rounds // 3
    runner = jit(
        jaxsub.sgmcmc.sample_rounds(logprior, loglik, batch_size=BATCH, local_steps=local_steps, num_rounds=rounds),
        quick=True,
    )
    sgld_chains = _pooled_sgld_chains(logprior, loglik, clients, local_steps, step_size, rounds, True)

    def accuracies(trace):
        return [
            round(100 * float(predictive_accuracy(jax.tree.map(lambda a: a[c, burn:], trace), x_test, y_test)[-1]), 2)
            for c in range(chains)
        ]

    out = {}
    for centre_name in ("fedavg", "fedsgd"):
        kw = surrogate_settings(True, centre_name)
        sur = jaxsub.sgmcmc.laplace_surrogates(logprior, loglik, clients, params0, **kw)
        theta_bar = np.asarray(sur.fit_info.expansion_point[0], np.float64)
        centre = unravel(jnp.asarray(theta_bar, jnp.float32))
        grads = np.asarray(sur.shift, np.float64) - np.asarray(sur.precision, np.float64) * theta_bar
        gn = jaxsub.sgmcmc.laplace_surrogates(
            logprior,
            loglik,
            clients,
            centre,
            structure="diag",
            curvature="gauss_newton",
            gauss_newton=(model_fn, output_loglik),
            num_steps=0,
            expansion="fedsgd",
        )
        zero = sur._replace(precision=np.zeros_like(sur.precision), shift=grads.astype(np.float32))
        res = {
            "centre_test_accuracy": round(
                100 * float(np.mean(np.asarray(logits_fn(centre, x_test)).argmax(-1) == y_test)), 2
            )
        }
        positions = jax.tree.map(lambda v: jnp.stack([v] * chains), centre)
        for name, surrogates, alpha in (
            ("DSGLD", sur, 0.0),
            ("CG, control variate only", zero, 1.0),
            ("CG, empirical Fisher diag", sur, 1.0),
            ("CG, Gauss-Newton diag", gn, 1.0),
        ):
            _, trace = runner(
                jax.random.key(1),
                positions,
                packed.data,
                jnp.asarray(packed.sizes, jnp.int32),
                jnp.asarray(probs, jnp.float32),
                jaxsub.sgmcmc.conducive_arrays(surrogates, probs),
                step_size,
                alpha,
            )
            res[name] = accuracies(trace)
        res["SGLD (pooled)"] = accuracies(sgld_chains(centre, jax.random.split(jax.random.key(1), chains)))
        out[centre_name] = res
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(expansion_study(), indent=1))
