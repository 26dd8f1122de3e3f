"""DSGLD vs CG-DSGLD on heterogeneous Gaussian blobs (El Mekkaoui et al. 2021, Sec. 5.1, Figure 1).

Setting (NOTES.md §2, the authors' public notebook): 10 shards of 200 points
in 2-D, blob centres ~ U([-6, 6]^2), each blob N(centre, 0.125 I); model
x | μ ~ N(μ, I), prior μ ~ N(0, 5 I); exact posterior
N(Σx / (N + 0.2), I / (N + 0.2)). ε = 1e-4, n = 10, f_s = 1/10, θ0 = 0,
80,000 SGLD steps in all per chain (rounds × local steps), burn-in 20,000
steps, thinning 100 steps; exact surrogates μ_s = shard mean, Λ_s = N_s I.
Local steps per round L ∈ {1, 20, 200}. Errors are averaged over independent
chains (one MSE per chain, then the mean), because the MSE of one chain's
posterior-mean estimate fluctuates like a χ²₂ variable.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxsub
from experiments._common import Report, progress, savefig
from experiments._sgld import jit

TITLE = "CG-DSGLD vs DSGLD on heterogeneous blobs (paper Sec. 5.1, Fig. 1)"

NUM_SHARDS, SHARD_SIZE, DIM = 10, 200, 2
BLOB_VAR = 0.125
PRIOR_VAR = 5.0
STEP_SIZE, BATCH = 1e-4, 10
THIN, LOCAL_STEPS = 100, (1, 20, 200)


def make_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-6, 6, size=(NUM_SHARDS, DIM))
    shards = [(c + np.sqrt(BLOB_VAR) * rng.normal(size=(SHARD_SIZE, DIM))).astype(np.float32) for c in centres]
    x = np.concatenate(shards).astype(np.float64)
    n = x.shape[0]
    post_mean = x.sum(0) / (n + 1 / PRIOR_VAR)
    post_cov = np.eye(DIM) / (n + 1 / PRIOR_VAR)
    return shards, post_mean, post_cov


def logprior(mu):
    return -0.5 * jnp.sum(mu**2) / PRIOR_VAR


def loglik(mu, x):
    return -0.5 * jnp.sum((x - mu) ** 2)


def sample(runner, surrogates, alpha, key, num_chains: int, local_steps: int):
    """Thinned draws ``[chains, total_steps / THIN, DIM]`` (every THIN-th SGLD step).

    ``runner`` is a jitted :func:`jaxsub.sgmcmc.sample_rounds` for ``local_steps``, shared by
    DSGLD (``alpha = 0``) and CG-DSGLD (``alpha = 1``): one compiled program per ``L``.
    """
    shards, arrays = surrogates
    _, draws = runner(
        key,
        jnp.zeros((num_chains, DIM), jnp.float32),
        shards.data,
        jnp.asarray(shards.sizes, jnp.int32),
        jnp.full(NUM_SHARDS, 1.0 / NUM_SHARDS, jnp.float32),
        arrays,
        STEP_SIZE,
        alpha,
    )
    draws = np.asarray(draws)
    if local_steps >= THIN:
        return draws.reshape(num_chains, -1, DIM)
    return draws[:, THIN // local_steps - 1 :: THIN // local_steps]


def make_runner(local_steps: int, total_steps: int, quick: bool = False):
    rounds = total_steps // local_steps
    if local_steps >= THIN:
        assert local_steps % THIN == 0
        transform = lambda s, i: i.local_positions[THIN - 1 :: THIN]  # noqa: E731
    else:
        assert THIN % local_steps == 0
        transform = lambda s, i: s.position  # noqa: E731
    return jit(
        jaxsub.sgmcmc.sample_rounds(
            logprior,
            loglik,
            batch_size=BATCH,
            local_steps=local_steps,
            num_rounds=rounds,
            shard_size=SHARD_SIZE,
            return_local_positions=local_steps >= THIN,
            transform=transform,
        ),
        quick=quick,
        level=0,
    )


def running_errors(draws, post_mean, post_cov):
    """Per-chain MSE of the running mean and covariance after k = 1..K draws, averaged over chains."""
    k = np.arange(1, draws.shape[1] + 1)[None, :, None]
    mean = np.cumsum(draws, axis=1) / k
    mse_mean = np.sum((mean - post_mean) ** 2, axis=-1)  # [chains, K]
    second = np.cumsum(draws[..., :, None] * draws[..., None, :], axis=1) / k[..., None]
    cov = second - mean[..., :, None] * mean[..., None, :]
    mse_cov = np.sum((cov - post_cov) ** 2, axis=(-1, -2))
    return mse_mean.mean(0), mse_cov.mean(0)


def run(out_dir: Path, *, quick: bool) -> dict:
    out_dir = Path(out_dir)
    total_steps = 12_000 if quick else 80_000
    burn_steps = 3_000 if quick else 20_000
    num_chains = 4 if quick else 16
    shards, post_mean, post_cov = make_data()
    surrogates = jaxsub.sgmcmc.gaussian_surrogates(
        [x.mean(0) for x in shards], [SHARD_SIZE * np.eye(DIM) for _ in shards]
    )
    probs = np.full(NUM_SHARDS, 1.0 / NUM_SHARDS)
    burn = burn_steps // THIN
    results, draws_keep = {}, {}
    rows = []
    packed = (jaxsub.sgmcmc.make_shards(shards), jaxsub.sgmcmc.conducive_arrays(surrogates, probs))
    for L in progress(LOCAL_STEPS, desc="local steps"):
        runner = make_runner(L, total_steps, quick)  # DSGLD is alpha = 0 of the same compiled program
        for name, alpha in (("DSGLD", 0.0), ("CG-DSGLD", 1.0)):
            start = time.perf_counter()
            draws = sample(runner, packed, alpha, jax.random.key(L), num_chains, L)[:, burn:]
            seconds = time.perf_counter() - start
            mse_mean, mse_cov = running_errors(draws, post_mean, post_cov)
            results[(name, L)] = (mse_mean, mse_cov)
            draws_keep[(name, L)] = draws[0]
            rows.append([name, L, draws.shape[1], float(mse_mean[-1]), float(mse_cov[-1]), seconds])
    cg = {L: results[("CG-DSGLD", L)][0][-1] for L in LOCAL_STEPS}
    ds = {L: results[("DSGLD", L)][0][-1] for L in LOCAL_STEPS}
    ratio_200 = ds[200] / cg[200]
    change_cg = max(cg[1], cg[200]) / min(cg[1], cg[200])
    metrics = {
        "quick": quick,
        "num_chains": num_chains,
        "total_steps": total_steps,
        "mse_mean_final": {f"{n}_L{L}": float(results[(n, L)][0][-1]) for (n, L) in results},
        "mse_cov_final": {f"{n}_L{L}": float(results[(n, L)][1][-1]) for (n, L) in results},
        "target_dsgld_over_cg_at_200": float(ratio_200),
        "target_cg_change_1_vs_200": float(change_cg),
        "targets_met": bool(ratio_200 >= 10 and change_cg <= 2),
    }

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = np.concatenate(shards)
    exact = np.random.default_rng(1).multivariate_normal(post_mean, post_cov, size=draws_keep[("CG-DSGLD", 1)].shape[0])
    fig, axes = plt.subplots(2, 4, figsize=(16, 8))
    panels = [("exact posterior", exact, None)] + [
        (f"{n}, L={L}", draws_keep[(n, L)], (n, L)) for n in ("DSGLD", "CG-DSGLD") for L in LOCAL_STEPS
    ]
    order = [0, 1, 2, 3, None, 4, 5, 6]
    for ax, idx in zip(axes.ravel(), order):
        if idx is None:  # zoom on the posterior: exact vs CG-DSGLD at L=200
            cg = draws_keep[("CG-DSGLD", 200)]
            ax.scatter(exact[:, 0], exact[:, 1], s=4, c="k", label="exact")
            ax.scatter(cg[:, 0], cg[:, 1], s=4, c="C0", alpha=0.6, label="CG-DSGLD L=200")
            ax.set_title("zoom: exact vs CG-DSGLD, L=200")
            ax.legend(fontsize=8)
            continue
        title, pts, _ = panels[idx]
        ax.scatter(data[:, 0], data[:, 1], s=1, c="0.85")
        ax.scatter(pts[:, 0], pts[:, 1], s=4, c="C3" if "DSGLD" == title.split(",")[0] else "C0")
        ax.plot(*post_mean, "k+", ms=12)
        ax.set_title(title)
        ax.set_xlim(-8, 8)
        ax.set_ylim(-8, 8)
    fig.suptitle("Draws (one chain, thinned every 100 steps) over the data (grey); + = exact posterior mean")
    fig_scatter = savefig(fig, out_dir, "scatter.png")

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for (name, L), (mm, mc) in results.items():
        ls = "-" if name == "CG-DSGLD" else "--"
        k = np.arange(1, mm.size + 1)
        axes[0].loglog(k, mm, ls, label=f"{name} L={L}")
        axes[1].loglog(k, mc, ls, label=f"{name} L={L}")
    axes[0].set_title("MSE of the posterior mean")
    axes[1].set_title("MSE of the posterior covariance (Frobenius²)")
    for ax in axes:
        ax.set_xlabel("number of samples (after burn-in, thin 100)")
        ax.legend(fontsize=8)
    fig_mse = savefig(fig, out_dir, "mse.png")

    rep = Report(TITLE, out_dir)
    rep.text(__doc__.split("\n", 2)[2])
    rep.text(
        f"Mode: {'quick' if quick else 'full'}; {num_chains} chains per method and L; {total_steps:,} SGLD "
        f"steps per chain; errors averaged over chains."
    )
    rep.table(rows, ["method", "local steps L", "samples/chain", "MSE mean", "MSE cov", "seconds"])
    rep.text(
        f"**Targets.** DSGLD/CG-DSGLD posterior-mean MSE at L=200: {ratio_200:.3g}x (target >= 10x). "
        f"CG-DSGLD MSE change between L=1 and L=200: {change_cg:.3g}x (target <= 2x). "
        f"Met: {metrics['targets_met']}."
    )
    rep.figure(fig_scatter, "Samples over the data; DSGLD drifts to a mixture of local posteriors as L grows")
    rep.figure(fig_mse, "MSE vs number of samples")
    rep.write()
    return metrics
