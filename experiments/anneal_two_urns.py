"""Figure 2 of Obermeyer, Glidden & Jonas (2014): the two-urn model, strategies vs the exact posterior.

N balls (2/5 red, 3/5 blue) come from a left urn (prior probability p = 0.45) or a
right urn; each urn's red probability has a Beta(alpha, alpha) prior (alpha = 1/2,
Jeffreys). The posterior over (#red left, #blue left) is exact
(:func:`jaxsub.anneal.exact.two_urn_log_posterior`). Every strategy makes 10 N
Gibbs assignments through the generic :func:`jaxsub.anneal.fit` (Finite prior,
Beta-Bernoulli feature), on many independent chains (vmap):

* Prior+Gibbs: N draws from the prior, then 10 N full-data Gibbs steps;
* Sequential+Gibbs: N sequential Gibbs additions, then 9 N Gibbs steps;
* Anneal: linear subsample annealing, 10 N assignments (section 2.4);
* Sequential: only the N sequential Gibbs additions (the paper's extra Fig. 2 panel);
* Anneal Energy: prior init, then 10 N Gibbs steps with the likelihood raised to
  beta = t / (0.9 T) (classical simulated annealing);
* Anneal Stepsize: prior init, then 10 N full-data *block* Gibbs steps moving a handful of
  floor(1 / beta) same-coloured balls of one urn at once, beta = t / T
  (:func:`jaxsub.anneal.anneal_stepsize`, run on the counts by
  :func:`jaxsub.anneal.two_urns.run_schedule`; the paper's section 3.2).

TVD is computed between the exact posterior and each strategy's final states after
binning both onto a coarse grid of (x, y) = (#red left / R, #blue left / B) (the
paper smooths histograms of 10^6 samples; we have fewer chains, so we bin). The
Monte Carlo floor is the TVD of the same number of exact posterior draws.
"""

from __future__ import annotations

import time

import jax
import numpy as np

import jaxsub.anneal as an
from experiments._common import Report, savefig
from jaxsub.anneal import exact

TITLE = "Subsample annealing: two-urn model (paper Figure 2), TVD to the exact posterior"


def _binned(prob_grid, bins):
    R1, B1 = prob_grid.shape
    ei = np.linspace(0, R1, bins + 1).astype(int)
    ej = np.linspace(0, B1, bins + 1).astype(int)
    return np.add.reduceat(np.add.reduceat(prob_grid, ei[:-1], axis=0), ej[:-1], axis=1), ei, ej


def _hist(i, j, R, B, bins):
    ei = np.linspace(0, R + 1, bins + 1).astype(int)
    ej = np.linspace(0, B + 1, bins + 1).astype(int)
    bi = np.searchsorted(ei, i, side="right") - 1
    bj = np.searchsorted(ej, j, side="right") - 1
    h = np.zeros((bins, bins))
    np.add.at(h, (bi, bj), 1.0)
    return h / h.sum()


def run(out_dir, *, quick: bool = False) -> dict:
    import matplotlib.pyplot as plt

    if quick:
        num_red, num_blue, num_chains, bins = 400, 600, 256, 10
    else:
        num_red, num_blue, num_chains, bins = 8000, 12000, 512, 20
    n = num_red + num_blue
    alpha, p_left = 0.5, 0.45
    model = an.MixtureModel(an.Finite((p_left, 1 - p_left)), [an.BetaBernoulli(alpha, alpha)])
    data = np.r_[np.ones(num_red), np.zeros(num_blue)][:, None]
    steps = 10 * n
    schedules = [
        an.prior_gibbs(n, steps),
        an.sequential_gibbs(n, steps),
        an.linear_anneal(n, steps),
        an.simulated_annealing(n, steps),
        an.Schedule(np.full(n, an.ADD, np.int8), n, name="Sequential"),  # the paper's N sequential adds only
    ]
    logp = exact.two_urn_log_posterior(num_red, num_blue, alpha, p_left)
    post = np.exp(logp)
    post_b, _, _ = _binned(post, bins)
    rng = np.random.default_rng(0)
    flat = rng.choice(post.size, size=(20, num_chains), p=post.ravel() / post.sum())
    floor = [
        0.5 * np.abs(_hist(*np.unravel_index(f, post.shape), num_red, num_blue, bins) - post_b).sum() for f in flat
    ]
    rep = Report(TITLE, out_dir)
    rep.text(__doc__.split("\n\n", 1)[1])
    rows, metrics, hists = [], {"tvd": {}, "seconds": {}}, {}
    span = n  # one compiled sweep per policy/ramp, shared across schedules
    cache = an.SweepCache()
    stepsize = an.anneal_stepsize(n, steps)
    t0 = time.perf_counter()
    out = jax.jit(lambda key: an.two_urns.run_schedule(key, stepsize, num_red, num_blue, alpha, p_left, num_chains))(
        jax.random.key(99)
    )
    i, j = np.asarray(out.red_left), np.asarray(out.blue_left)
    wall = time.perf_counter() - t0
    h = _hist(i, j, num_red, num_blue, bins)
    hists[stepsize.name] = (i, j, h)
    metrics["tvd"][stepsize.name] = float(0.5 * np.abs(h - post_b).sum())
    metrics["seconds"][stepsize.name] = wall
    rows.append([stepsize.name, steps, len(stepsize), metrics["tvd"][stepsize.name], wall, wall])
    for k, sched in enumerate(schedules):
        t0 = time.perf_counter()
        res = an.fit(
            jax.random.key(100 + k),
            data,
            model,
            sched,
            num_chains=num_chains,
            grids=None,
            span=span,
            cache=cache,
            progress_bar=not quick,
        )
        wall = time.perf_counter() - t0
        z = np.asarray(res.state.mixture.assignments)
        red = data[:, 0] == 1
        i = ((z == 0) & red).sum(axis=1)
        j = ((z == 0) & ~red).sum(axis=1)
        h = _hist(i, j, num_red, num_blue, bins)
        hists[sched.name] = (i, j, h)
        tvd = 0.5 * np.abs(h - post_b).sum()
        metrics["tvd"][sched.name] = float(tvd)
        metrics["seconds"][sched.name] = float(res.trace.seconds[-1])
        rows.append([sched.name, sched.num_assignments, len(sched), tvd, res.trace.seconds[-1], wall])
    metrics["tvd_mc_floor_mean"] = float(np.mean(floor))
    metrics["tvd_mc_floor_sd"] = float(np.std(floor))
    metrics["anneal_beats_gibbs"] = bool(
        metrics["tvd"]["Anneal"] < min(metrics["tvd"]["Prior+Gibbs"], metrics["tvd"]["Sequential+Gibbs"])
    )
    rep.heading("Setup")
    rep.text(
        f"R = {num_red} red, B = {num_blue} blue (N = {n}), alpha = {alpha}, p = {p_left}, "
        f"{num_chains} independent chains per strategy, {steps} = 10N Gibbs assignments each "
        f"(Prior+Gibbs and Anneal Energy also make N prior draws first). TVD on a {bins} x {bins} grid. "
        f"Mode: {'quick' if quick else 'full'}."
    )
    rep.heading("Results")
    rep.table(rows, ["strategy", "assignments", "ticks", "TVD (binned)", "sampling s", "total s"])
    rep.text(
        f"Monte Carlo floor (TVD of {num_chains} exact posterior draws, same binning): "
        f"{np.mean(floor):.3f} +- {np.std(floor):.3f}. Target (paper's ordering): Anneal below both Gibbs "
        f"strategies: **{'met' if metrics['anneal_beats_gibbs'] else 'NOT met'}**."
    )
    schedules = schedules + [stepsize]
    fig, axes = plt.subplots(2, 4, figsize=(3.8 * 4, 3.8 * 2))
    axes = axes.ravel()
    extent = (0, 1, 0, 1)
    axes[0].imshow(post_b.T, origin="lower", extent=extent, aspect="auto", cmap="viridis")
    axes[0].set_title("exact posterior (binned)")
    for ax, sched in zip(axes[1:], schedules):
        i, j, h = hists[sched.name]
        ax.imshow(h.T, origin="lower", extent=extent, aspect="auto", cmap="viridis")
        ax.set_title(f"{sched.name}\nTVD {metrics['tvd'][sched.name]:.3f}")
    from scipy.stats import binom

    prior = (
        binom.pmf(np.arange(num_red + 1), num_red, p_left)[:, None]
        * binom.pmf(np.arange(num_blue + 1), num_blue, p_left)[None, :]
    )
    prior_b, _, _ = _binned(prior, bins)
    metrics["tvd"]["Prior (exact)"] = float(0.5 * np.abs(prior_b - post_b).sum())
    if 1 + len(schedules) < len(axes):
        ax = axes[1 + len(schedules)]
        ax.imshow(prior_b.T, origin="lower", extent=extent, aspect="auto", cmap="viridis")
        ax.set_title(f"prior (exact, binned)\nTVD {metrics['tvd']['Prior (exact)']:.3f}")
    for ax in axes[2 + len(schedules) :]:
        ax.axis("off")
    for ax in axes:
        ax.set_xlabel("#red left / R")
        ax.set_ylabel("#blue left / B")
    rep.figure(
        savefig(fig, out_dir, "two_urns.png"),
        "Distribution of (x, y) after 10N Gibbs assignments (Sequential: after its N adds): exact "
        "posterior, six strategies and the exact prior (the paper's eight Figure 2 panels)",
    )
    rep.write()
    return metrics
