"""Song (2021) Table 3: exact MCMC vs MCMC on clustered (compressed) posteriors vs mean-field VI.

For each dataset: standardise, cluster at three radii (jaxsub.compress.cluster,
Algorithm 1), run BlackJAX NUTS preconditioned by the Laplace fit of the exact posterior
(coordinates theta = mode + chol z; step size and diagonal mass matrix in z tuned once by window
adaptation on the exact posterior and shared by all runs; MNIST, 7,850 parameters (docs/guides/compress.md
for why not NUTS there): HMC with 10 leapfrog steps, tuned the same way; quick mode: HMC
in the same whitened coordinates with no warm-up, its step size set by the dimension (QUICK_STEP_SCALE),
quick MNIST as MNIST) on the exact and on each compressed posterior, and BlackJAX meanfield_vi as the reference approximation. Columns as in
the paper: N, c, delta, rho, approxKL (moment-matched Gaussians, Lemma 1, against the exact
chain's draws), test error (or MSE), time = clustering + sampling; plus the posterior error in
posterior-sd units and each chain's smallest effective sample size. (NUTS replaces the HMC that
every dataset used before: on flights and mortgages that HMC had a minimum ESS of 3-5 in 400
draws, so its sd-unit columns were Monte Carlo error; docs/guides/compress.md.)

Datasets: MNIST (multiclass logistic, 10 classes), California housing
(= LIBSVM cadata; linear regression), nycflights13 flights as the >= 2.5e5-row
stand-in for covtype (multiclass logistic: predict the origin airport EWR/JFK/LGA
from the 9 numeric columns), and covtype itself when its file exists. Full mode adds three
more real tables in the paper's range: ggplot2/diamonds and AER/CPSSW8 (linear regression of
log price / log earnings, joint (x, y) clustering as cadata) and causaldata/mortgages (binary
logistic: home ownership). ``JAXSUB_COMPRESSED_HMC_DATASETS=a,b`` restricts the datasets and
``JAXSUB_COMPRESSED_HMC_MAX_ROWS=n`` keeps the first ``n`` (random) training rows of each and
``JAXSUB_COMPRESSED_HMC_TRIALS=t`` runs ``t`` trials instead of 5, for runs that must fit a time
budget (the report says so); ``JAXSUB_COMPRESSED_HMC_SEED=s`` changes every random key. ``JAXSUB_COMPRESSED_HMC_SAMPLER`` picks the sampler: ``auto`` (the
default: for models of at most ``LAPLACE_MAX_PARAMS`` parameters NUTS with the Laplace
preconditioning in full mode and the whitened fixed-step HMC in quick mode, HMC above), ``nuts``
(NUTS in the whitened coordinates for every model: window adaptation in full mode, the fixed step
and no warm-up in quick mode) or ``hmc`` (the adapted HMC without whitening for
every model: the previous quick mode).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import blackjax
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from experiments._common import Report, progress, savefig
from jaxsub import compress, datasets, racing_mh

TITLE = "Compressed posteriors by clustering: Song (2021) Table 3 (MNIST, cadata, flights stand-in for covtype)"

#: Paper's Table 3 rows (c, delta, rho %, approxKL, test error %, time) for comparison.
PAPER = {
    "covtype": {
        "exact": (34.35, 143.82),
        "rows": [
            (283690, 0.05, 54.23, 0.92e4, 34.64, "2.54+86.80"),
            (150668, 0.10, 28.80, 1.01e4, 35.01, "1.86+45.52"),
            (62409, 0.20, 11.93, 1.62e4, 34.89, "1.05+47.34"),
        ],
        "vi": (2.75e4, 35.45, 24.48),
    },
    "mnist": {
        "exact": (14.58, 65.48),
        "rows": [
            (22890, 0.08, 38.15, 1.64e6, 14.90, "1.95+45.43"),
            (14286, 0.10, 23.81, 2.31e6, 14.98, "1.42+26.44"),
            (9458, 0.15, 15.76, 3.55e6, 15.89, "1.22+21.84"),
        ],
        "vi": (6.62e6, 19.85, 19.64),
    },
}

PRIOR_SD = 1.0

#: The sampler: NUTS in the coordinates whitened by the Laplace fit of the exact
#: posterior (theta = mode + chol z, window adaptation of a diagonal mass matrix in z, on the exact
#: posterior, shared by every chain) for models of at most this many parameters; above (MNIST,
#: 7,850), where the Hessian is not affordable, HMC with 10 leapfrog steps as before. Table 3's
#: earlier HMC did not mix on the flights and mortgages models (docs/guides/compress.md).
LAPLACE_MAX_PARAMS = 500

#: Quick mode: HMC in the Laplace-whitened coordinates for models of at most this many
#: parameters (as full mode's NUTS: cadata, flights; not the 2x2-pooled quick MNIST's 1,970, on
#: which this fixed rule is accepted 13 % of the time, docs/guides/compress.md), with **no
#: warm-up**: in the whitened coordinates the exact posterior is close to N(0, I), so the step size
#: is set by the dimension, ``QUICK_STEP_SCALE * d**-0.25`` (the leapfrog energy error on N(0, I_d)
#: grows like d eps^4), the mass matrix is the identity and the trajectory length is
#: ``QUICK_TRAJECTORY`` (``ceil(QUICK_TRAJECTORY / eps)`` leapfrog steps; on N(0, I) a draw's
#: lag-1 correlation is about cos(1.5) = 0.07). Quick mode no longer depends on a 40-step window
#: adaptation landing on a usable step size (with it, exact chains' min ESS was 3-5 of 80 draws;
#: without, 54-56 on cadata and flights); 3-4 leapfrog steps per draw instead of 10, no warm-up compile.
QUICK_LAPLACE_MAX_PARAMS = LAPLACE_MAX_PARAMS
QUICK_STEP_SCALE = 1.0
QUICK_TRAJECTORY = 1.5

#: L-BFGS steps of the Laplace fit (``jaxsub.racing_mh.laplace_fit``, the library's one MAP/Laplace
#: helper). 400 reach the damped-Newton mode used before within 0.001 posterior sd on flights (294,611 rows;
#: 100 stop 6 sd short), cadata and mortgages.
LAPLACE_STEPS = 400


def _laplace(logprior, loglik, init, data):
    """Mode (flat, float64) and Cholesky factor of the covariance of the exact posterior's Laplace
    fit. The fit only preconditions and starts the chains (the reference stays the exact chain)."""
    fit = racing_mh.laplace_fit(logprior, loglik, data, init, num_steps=LAPLACE_STEPS)
    mode = np.asarray(jax.flatten_util.ravel_pytree(fit.position)[0], np.float64)
    return mode, np.asarray(fit.cov_cholesky, np.float64)


#: Trials per setting in full mode (the paper averages 5); quick mode runs one.
TRIALS = 5

#: Trials after the first reuse its exact reference (window adaptation, exact-chain draws, VI): the
#: exact posterior does not depend on a trial's row order, and on the >= 2.5e5-row tables the
#: exact chain and VI are most of the run (flights: about 25 of 27 minutes per trial at load 11),
#: so the trials vary what the table compares (clustering order, compressed chains' keys) at a
#: fifth of the cost. The exact and VI rows then carry no spread over trials.
SHARED_EXACT = True

#: Columns averaged over trials (reported as mean and sd).
_AVERAGED = (
    "c",
    "rho",
    "approx_kl",
    "mean_sd",
    "sd_ratio_min",
    "sd_ratio_max",
    "test_error",
    "cluster_s",
    "sample_s",
    "accept",
    "achieved_delta",
    "ess_min",
    "grads_per_draw",
)


def _aggregate(trial_rows):
    """Rows of several trials (same methods in the same order) -> mean rows with ``<col>_sd``."""
    out = []
    for group in zip(*trial_rows):
        row = dict(group[0])
        for k in _AVERAGED:
            if k in row:
                vals = np.asarray([g[k] for g in group], np.float64)
                row[k], row[k + "_sd"] = float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        out.append(row)
    return out


def _pm(row, k, spec):
    """``mean`` or ``mean ± sd`` (several trials) of a column."""
    sd = row.get(k + "_sd", 0.0)
    return format(row[k], spec) + (f" ± {format(sd, spec)}" if sd else "")


def _zscore(x, x_test):
    mu, sd = x.mean(axis=0), x.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    return (x - mu) / sd, (x_test - mu) / sd


def _compile(fn, *args):
    """``jax.jit(fn)`` lowered and compiled for ``args`` (compile time kept apart from run time)."""
    return jax.jit(fn).lower(*args).compile()


def _split(n, frac_test, seed):
    perm = np.random.default_rng(seed).permutation(n)
    k = int(round(n * frac_test))
    return perm[k:], perm[:k]


# ----------------------------------------------------------------------------- models


def _logistic(num_features, num_classes):
    def logprior(p):
        return -0.5 * (jnp.sum(p["W"] ** 2) + jnp.sum(p["b"] ** 2)) / PRIOR_SD**2

    def loglik(p, datum):
        x, y = datum
        return jax.nn.log_softmax(x @ p["W"] + p["b"])[y]

    def per_draw(samples, x_test):  # [S, n, K] class probabilities of every draw (NumPy: no compiles)
        w = np.asarray(samples["W"], np.float64)  # [S, d, K]: one GEMM for all draws
        logits = (x_test @ w.transpose(1, 0, 2).reshape(w.shape[1], -1)).reshape(x_test.shape[0], w.shape[0], -1)
        logits = logits.transpose(1, 0, 2) + np.asarray(samples["b"], np.float64)[:, None, :]
        logits -= logits.max(axis=-1, keepdims=True)
        probs = np.exp(logits)
        return probs / probs.sum(axis=-1, keepdims=True)

    def error(mean_prediction, y_test):  # test error % of the posterior-averaged probabilities
        return 100.0 * float(np.mean(np.argmax(mean_prediction, axis=-1) != y_test))

    init = {"W": jnp.zeros((num_features, num_classes)), "b": jnp.zeros(num_classes)}
    return logprior, loglik, per_draw, error, init


def _linear(num_features, noise_sd, y_scale):
    def logprior(p):
        return -0.5 * (jnp.sum(p["beta"] ** 2) + p["b0"] ** 2) / PRIOR_SD**2

    def loglik(p, datum):
        x, y = datum
        return -0.5 * ((y - x @ p["beta"] - p["b0"]) / noise_sd) ** 2

    def per_draw(samples, x_test):  # [S, n] predictions of every draw
        return (np.asarray(samples["beta"], np.float64) @ x_test.T) + np.asarray(samples["b0"], np.float64)[:, None]

    def error(mean_prediction, y_test):  # test MSE in the original units
        return float(np.mean((y_scale * (mean_prediction - y_test)) ** 2))

    init = {"beta": jnp.zeros(num_features), "b0": jnp.zeros(())}
    return logprior, loglik, per_draw, error, init


def _ess_min(flat):
    """Smallest effective sample size over the columns of one chain's draws ``[S, P]``
    (``blackjax.diagnostics.effective_sample_size``, the diagnostic every other experiment uses), jitted: eagerly it
    costs 3-4 CPU s per shape and dataset in quick mode, 0.5-0.7 s as one program (docs/guides/compress.md)."""
    ess = np.asarray(
        jax.jit(blackjax.diagnostics.effective_sample_size)(jnp.asarray(flat, jnp.float32)[None]), np.float64
    )
    return float(np.nanmin(ess)) if np.isfinite(ess).any() else float("nan")


def _flat(samples):
    leaves = jax.tree.leaves(samples)
    return np.concatenate([np.asarray(l).reshape(l.shape[0], -1) for l in leaves], axis=1)


# ----------------------------------------------------------------------------- one dataset


def _prepare(name, quick):
    """(x, y, x_test, y_test, kind, radii, description) in the clustering space."""
    if name == "mnist":
        ds = datasets.load_mnist()
        x, y, xt, yt = ds.x, ds.y, ds.x_test, ds.y_test
        note = "MNIST 60,000/10,000, 784 pixels in [0, 1]"
        if quick:  # 2x2 average pooling (196 features) and a 1,500-image subsample
            pool = lambda a: a.reshape(-1, 14, 2, 14, 2).mean(axis=(2, 4)).reshape(-1, 196)  # noqa: E731
            x, xt = pool(x[:1500]), pool(xt[:1000])
            y, yt = y[:1500], yt[:1000]
            note = "QUICK: first 1,500 train / 1,000 test images, 2x2-pooled to 196 features"
        r = np.sqrt((x.astype(np.float64) ** 2).sum(axis=1).max())
        return x / r, y, xt / r, yt, "logistic", (0.08, 0.10, 0.15), note
    if name == "flights":
        ds = datasets.load_flights()
        tr, te = _split(ds.x.shape[0], 0.1, 0)
        x, xt = _zscore(ds.x[tr], ds.x[te])
        y, yt = ds.extras["origin"][tr], ds.extras["origin"][te]
        note = f"nycflights13 flights, {ds.x.shape[0]:,} rows, 90/10 split, 9 z-scored features, class = origin (3)"
        if quick:
            x, y, xt, yt = x[:12000], y[:12000], xt[:5000], yt[:5000]
            note = "QUICK: first 12,000 train / 5,000 test rows of " + note
        r = np.sqrt((x**2).sum(axis=1).max())
        return x / r, y, xt / r, yt, "logistic", (0.05, 0.10, 0.20), note
    if name == "covtype":
        ds = datasets.load_covtype()
        tr, te = _split(ds.x.shape[0], 0.1, 0)
        x, xt = _zscore(ds.x[tr], ds.x[te])
        y, yt = ds.y[tr], ds.y[te]
        if quick:
            x, y, xt, yt = x[:40000], y[:40000], xt[:5000], yt[:5000]
        r = np.sqrt((x**2).sum(axis=1).max())
        return x / r, y, xt / r, yt, "logistic", (0.05, 0.10, 0.20), "UCI covtype, 7 classes, 90/10 split"
    if name == "cadata":
        ds = datasets.load_california_housing()
        tr, te = _split(ds.x.shape[0], 4128 / 20640, 0)  # 16,512 / 4,128 as LIBSVM cadata
        x, xt = _zscore(ds.x[tr], ds.x[te])
        ybar = ds.y[tr].mean()
        y, yt = ds.y[tr] - ybar, ds.y[te] - ybar
        r = np.sqrt((x**2).sum(axis=1).max() + (y**2).max())  # joint (x, y) scale
        return (
            x / r,
            y / r,
            xt / r,
            yt / r,
            "linear",
            (0.02, 0.05, 0.10),
            (f"California housing (= cadata) 16,512/4,128, 8 z-scored features; joint (x, y) clustering; R = {r:.3g}"),
        )
    if name in ("diamonds", "cpssw8"):  # regressions on a random 80/20 split, joint (x, y) clustering as cadata
        ds = datasets.load_diamonds() if name == "diamonds" else datasets.load_cpssw8()
        tr, te = _split(ds.x.shape[0], 0.2, 0)
        x, xt = _zscore(ds.x[tr], ds.x[te])
        ybar = ds.y[tr].mean()
        y, yt = ds.y[tr] - ybar, ds.y[te] - ybar
        if quick:
            x, y, xt, yt = x[:5000], y[:5000], xt[:2000], yt[:2000]
        r = np.sqrt((x**2).sum(axis=1).max() + (y**2).max())
        return (
            x / r,
            y / r,
            xt / r,
            yt / r,
            "linear",
            (0.02, 0.05, 0.10),
            (
                f"{ds.description} {x.shape[0]:,}/{xt.shape[0]:,} split (80/20), {x.shape[1]} z-scored features; "
                f"joint (x, y) clustering; R = {r:.3g}"
            ),
        )
    if name == "mortgages":  # binary logistic (2-class softmax), clustering within each class
        ds = datasets.load_mortgages()
        tr, te = _split(ds.x.shape[0], 0.1, 0)
        x, xt = _zscore(ds.x[tr], ds.x[te])
        y, yt = ds.y[tr], ds.y[te]
        if quick:
            x, y, xt, yt = x[:12000], y[:12000], xt[:5000], yt[:5000]
        r = np.sqrt((x**2).sum(axis=1).max())
        return (
            x / r,
            y,
            xt / r,
            yt,
            "logistic",
            (0.05, 0.10, 0.20),
            (f"{ds.description} 90/10 split, {x.shape[1]} z-scored features"),
        )
    raise ValueError(name)


def _cap_rows(prepared):
    """``JAXSUB_COMPRESSED_HMC_MAX_ROWS=n``: keep the first ``n`` training rows (a random subset: every
    split above is a random permutation, MNIST's training images are in no particular order)."""
    cap = os.environ.get("JAXSUB_COMPRESSED_HMC_MAX_ROWS")
    x, y, xt, yt, kind, radii, note = prepared
    if cap and int(cap) < x.shape[0]:
        n = int(cap)
        note = f"{note}; SUBSAMPLED: first {n:,} of {x.shape[0]:,} training rows (JAXSUB_COMPRESSED_HMC_MAX_ROWS)"
        x, y = x[:n], y[:n]
    return x, y, xt, yt, kind, radii, note


def _run_dataset(name, quick, key, bar, trial=0, shared=None):
    """One trial on one dataset: rows of the table, curves, sizes; ``shared`` (the ``shared`` entry
    of trial 0's result) reuses trial 0's exact reference: warm-up, exact-chain draws and VI."""
    x, y, xt, yt, kind, radii, note = _cap_rows(_prepare(name, quick))
    n, d = x.shape
    if trial:  # trials differ in the stream order of the training rows and in every random key
        perm = np.random.default_rng(trial).permutation(n)
        x, y = x[perm], y[perm]
    if kind == "logistic":
        num_classes = int(max(y.max(), yt.max())) + 1
        logprior, loglik, per_draw, error, init = _logistic(d, num_classes)
        data = (jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32))
    else:
        xa = np.column_stack([x, np.ones(n)])
        noise_sd = float(np.sqrt(np.mean((y - xa @ np.linalg.lstsq(xa, y, rcond=None)[0]) ** 2)))
        logprior, loglik, per_draw, error, init = _linear(d, noise_sd, 1.0)
        data = (jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
    xt_np = np.asarray(xt, np.float64)

    def prefix_sums(samples, stops):
        """``{k: sum of the predictions of draws [0, k)}`` for every ``k`` in ``stops`` (50 draws at a time)."""
        num = jax.tree.leaves(samples)[0].shape[0]
        out, total = {0: 0.0}, 0.0
        for lo in range(0, num, 50):
            chunk = per_draw(jax.tree.map(lambda a: a[lo : lo + 50], samples), xt_np)
            for k in stops:
                if lo < k <= lo + 50:
                    out[k] = total + chunk[: k - lo].sum(axis=0)
            total = total + chunk.sum(axis=0)
        return out

    def predict_error(samples):
        """Test error of the posterior average over ``samples`` (NumPy, float64)."""
        num = jax.tree.leaves(samples)[0].shape[0]
        return error(prefix_sums(samples, [num])[num] / num, yt)

    # full mode: MNIST (60,000 x 784, 7,850 parameters; ~40 ms per exact gradient on 2
    # shared cores) gets fewer draws so the whole experiment stays under ~25 minutes
    num_warmup, num_samples = (40, 100) if quick else ((100, 200) if name == "mnist" else (300, 500))
    num_vi = 100 if quick else (300 if name == "mnist" else 1000)

    # ---- exact posterior: tune once (window adaptation), then sample. Every compiled function
    # takes the (pseudo-)data as arguments, so no dataset is compiled in as a constant.
    exact_fn = compress.logdensity(logprior, loglik, data)
    k_warm, k_exact, k_vi, k_comp = jax.random.split(key, 4)
    flat0, unravel = jax.flatten_util.ravel_pytree(init)
    num_params = flat0.size
    # the sampler (module docstring): NUTS preconditioned by the Laplace fit of the exact posterior
    # where its Hessian is affordable, else (MNIST, 7,850 parameters) HMC with 10 leapfrog steps;
    # quick mode: HMC in the whitened coordinates with a fixed step (QUICK_LAPLACE_MAX_PARAMS), no warm-up
    choice = os.environ.get("JAXSUB_COMPRESSED_HMC_SAMPLER", "auto")
    whiten = choice == "nuts" or (
        choice == "auto" and num_params <= (QUICK_LAPLACE_MAX_PARAMS if quick else LAPLACE_MAX_PARAMS)
    )
    use_nuts = choice == "nuts" or (whiten and not quick)
    # quick mode: no warm-up in the whitened coordinates (QUICK_LAPLACE_MAX_PARAMS), also for the
    # ``nuts`` override (its 40-step window adaptation left a chain that never moved on cadata)
    fixed_step = quick and whiten
    if shared is None:
        t0 = time.perf_counter()
        if whiten:  # Laplace fit of the exact posterior (L-BFGS mode, Hessian)
            lap_mean, chol = _laplace(logprior, loglik, init, data)
        else:
            lap_mean, chol = np.asarray(flat0, np.float64), None
        laplace_s = time.perf_counter() - t0
    else:
        lap_mean, chol, laplace_s = shared["laplace"]
    mean32 = jnp.asarray(lap_mean, jnp.float32)
    chol32 = None if chol is None else jnp.asarray(chol, jnp.float32)

    def to_theta(z):  # sampler coordinates -> parameters: theta = Laplace mean + chol z (NUTS) or z (HMC)
        return unravel(z) if chol32 is None else unravel(mean32 + chol32 @ z)

    def target(pseudo, second_order=False):  # log-density in the sampler's coordinates (constant Jacobian)
        fn = compress.logdensity(logprior, loglik, pseudo, second_order=second_order)
        return lambda z: fn(to_theta(z))

    def kernel(fn, params):
        return blackjax.nuts(fn, **params) if use_nuts else blackjax.hmc(fn, **params)

    def warm_run(k, position, data):
        fn = target(data)
        if use_nuts:
            warm = blackjax.window_adaptation(blackjax.nuts, fn)
        else:
            warm = blackjax.window_adaptation(blackjax.hmc, fn, num_integration_steps=10)
        return warm.run(k, position, num_steps=num_warmup)[0]

    if shared is None and fixed_step:  # whitened coordinates: step size from the dimension, identity mass
        eps = QUICK_STEP_SCALE * num_params**-0.25
        params = dict(step_size=eps, inverse_mass_matrix=jnp.ones(num_params))
        if not use_nuts:  # HMC: a fixed trajectory length (NUTS picks its own)
            params["num_integration_steps"] = int(np.ceil(QUICK_TRAJECTORY / eps))
        state, warmup_s = kernel(target(data), params).init(jnp.zeros(num_params)), 0.0
    elif shared is None:
        t0 = time.perf_counter()
        # start: z = 0 (the Laplace mode) for NUTS, the model's init for HMC
        z0 = jnp.zeros(num_params) if whiten else jnp.asarray(flat0)
        state, params = jax.block_until_ready(_compile(warm_run, k_warm, z0, data)(k_warm, z0, data))
        if not use_nuts:
            params = dict(params, num_integration_steps=10)
        warmup_s = time.perf_counter() - t0
    else:  # the exact posterior does not depend on the trial's row order: trial 0's reference
        state, params, warmup_s = shared["state"], shared["params"], shared["warmup_s"]
    bar.update(1)

    compiled = {}

    def sample(pseudo, k, second_order=False):
        """HMC draws on the log-density of ``pseudo`` (a compress.Pseudodata, passed as arguments).

        Returns (positions, mean acceptance, sampling seconds, compile seconds). One compiled
        chain per (order, shapes): clusterings padded to one size share it (compile seconds 0).
        """

        def chain(key, position, pseudo):
            # NUTS (or HMC: 10 leapfrog steps) with the step size and mass matrix adapted on the exact posterior
            mcmc = kernel(target(pseudo, second_order), params)

            def one(carry, kk):
                new, info = mcmc.step(kk, carry)
                return new, (to_theta(new.position), info.acceptance_rate, info.num_integration_steps)

            return jax.lax.scan(one, mcmc.init(position), jax.random.split(key, num_samples))[1]

        pseudo = jax.tree.map(
            lambda a: jnp.asarray(a, jnp.float32 if jnp.issubdtype(a.dtype, jnp.floating) else jnp.int32), pseudo
        )
        args = (k, state.position, pseudo)
        sig = (second_order, tuple((l.shape, str(l.dtype)) for l in jax.tree.leaves(pseudo)))
        t = time.perf_counter()
        if sig not in compiled:
            compiled[sig] = _compile(chain, *args)  # compile apart from the timed run
        compile_s = time.perf_counter() - t
        t = time.perf_counter()
        positions, acc, steps = jax.block_until_ready(compiled[sig](*args))
        elapsed = time.perf_counter() - t
        # NumPy from here on: slicing and predictions compile nothing
        return jax.tree.map(np.asarray, positions), (float(np.mean(acc)), float(np.mean(steps))), elapsed, compile_s

    def curve(samples, t_start, t_total):
        """Test error of the running posterior average vs wall-clock (sample k at t_start + k/S * t_total).

        The average over draws ``[k // 2, k)``; every draw's prediction computed once (NumPy), windows by prefix sums.
        """
        ks = np.unique(np.linspace(5, num_samples, 5 if quick else 10).astype(int))
        csum = prefix_sums(samples, sorted(set(ks.tolist()) | {int(k) // 2 for k in ks}))
        return [(t_start + k / num_samples * t_total, error((csum[k] - csum[k // 2]) / (k - k // 2), yt)) for k in ks]

    burn = num_samples // 5
    if shared is None:
        exact_samples, exact_acc, exact_s, exact_c = sample(compress.Pseudodata(data, np.ones(n, np.float32)), k_exact)
    else:
        exact_samples, exact_acc, exact_s, exact_c = shared["exact"]
    exact_flat = _flat(jax.tree.map(lambda a: a[burn:], exact_samples))
    diag_kl = exact_flat.shape[1] >= exact_flat.shape[0] // 2  # too few draws for a full covariance

    def kl(q):
        try:
            return compress.gaussian_kl(exact_flat, q, diagonal=diag_kl)
        except ValueError:  # singular sample covariance: a chain that never moved (acceptance ~ 0)
            return float("inf")

    exact_err = predict_error(jax.tree.map(lambda a: a[burn:], exact_samples))
    bar.update(1)

    def sd_error(flat, ess=True):
        err = compress.posterior_error(exact_flat, flat)
        out = dict(mean_sd=err.max_mean_sd, sd_ratio_min=err.sd_ratio_min, sd_ratio_max=err.sd_ratio_max)
        if ess:  # the chain's smallest effective sample size over the parameters (one chain, kept draws)
            out["ess_min"] = _ess_min(flat)
        return out

    sampler = "NUTS" if use_nuts else "HMC"
    rows = [
        dict(
            method=f"exact {sampler}",
            N=n,
            c=n,
            delta=0.0,
            rho=1.0,
            approx_kl=0.0,
            test_error=exact_err,
            cluster_s=0.0,
            sample_s=exact_s,
            compile_s=exact_c,
            accept=exact_acc[0],
            grads_per_draw=exact_acc[1],
            mean_sd=0.0,
            sd_ratio_min=1.0,
            sd_ratio_max=1.0,
            ess_min=_ess_min(exact_flat),
        )
    ]
    curves = {"exact": curve(exact_samples, 0.0, exact_s)}
    sizes = {}
    clusterings = []
    for i, delta in enumerate(radii):
        t = time.perf_counter()
        if kind == "logistic":
            cl = compress.cluster_supervised(x, y, delta, key=i)
        else:
            cl = compress.cluster_supervised(x, y, delta, mode="joint", key=i)
        clusterings.append((cl, time.perf_counter() - t))
    # quick mode: the radii share one compiled chain per order: pseudo-data padded with weight-0 rows
    # (the log-density is unchanged) to the largest c, which makes the smaller clusterings' sampling
    # time that of the largest. First order: padded to N instead when the largest c is over N / 2 or
    # the exact chain is cheap (N x parameters <= 4e5: cadata, quick flights), so the exact chain's compiled program
    # serves. Full mode: no padding.
    pad2 = max(cl.c for cl, _ in clusterings) if quick else None
    pad1 = n if quick and (2 * pad2 >= n or n * exact_flat.shape[1] <= 400_000) else pad2
    for i, (delta, (cl, cl_s)) in enumerate(zip(radii, clusterings)):
        orders = (False, True) if cl.covariances is not None else (False,)  # 2nd order needs d <= 64
        for order in orders:
            pad = pad2 if order else pad1
            pseudo = compress.pseudodata(cl, second_order=order, size=pad)
            samples, acc, s_s, c_s = sample(pseudo, jax.random.fold_in(k_comp, 100 * order + i), second_order=order)
            flat = _flat(jax.tree.map(lambda a: a[burn:], samples))
            err = predict_error(jax.tree.map(lambda a: a[burn:], samples))
            rows.append(
                dict(
                    method=f"compressed {sampler}, 2nd order" if order else f"compressed {sampler}",
                    N=n,
                    c=cl.c,
                    delta=delta,
                    achieved_delta=cl.radius,
                    rho=cl.rho,
                    approx_kl=kl(flat),
                    test_error=err,
                    cluster_s=cl_s,
                    sample_s=s_s,
                    compile_s=c_s,
                    accept=acc[0],
                    grads_per_draw=acc[1],
                    padded_to=pad or cl.c,
                    **sd_error(flat),
                )
            )
            if not order:
                curves[f"delta={delta}"] = curve(samples, cl_s, s_s)
        sizes[delta] = cl.counts
        bar.update(1)

    # ---- mean-field VI (BlackJAX), the paper's reference approximation
    vi = blackjax.meanfield_vi(exact_fn, optax.adam(1e-2), num_samples=5)
    vstate = vi.init(to_theta(state.position))

    def vi_run(k, vstate, data):  # the data as an argument, all steps in one compiled scan
        step = blackjax.meanfield_vi(compress.logdensity(logprior, loglik, data), optax.adam(1e-2), num_samples=5).step
        return jax.lax.scan(lambda st, kk: (step(kk, st)[0], None), vstate, jax.random.split(k, num_vi))[0]

    if shared is None:
        t = time.perf_counter()
        vstate = jax.block_until_ready(_compile(vi_run, k_vi, vstate, data)(k_vi, vstate, data))
        vi_s = time.perf_counter() - t
    else:
        vstate, vi_s = shared["vi"]
    # draws of the fitted mean-field Gaussian N(mu, exp(rho)^2) (what vi.sample draws), in NumPy: an
    # eager or jitted vi.sample costs a threefry compile of seconds for 4,000 draws
    vi_rng = np.random.default_rng(int(jax.random.randint(jax.random.fold_in(k_vi, 1), (), 0, 2**31 - 1)))
    vi_draws = jax.tree.map(
        lambda m, r: np.asarray(m) + np.exp(np.asarray(r)) * vi_rng.standard_normal((4000,) + np.shape(m)),
        vstate.mu,
        vstate.rho,
    )
    vi_err = predict_error(jax.tree.map(lambda a: a[:500], vi_draws))
    rows.append(
        dict(
            method="meanfield VI",
            N=n,
            c=n,
            delta=float("nan"),
            rho=1.0,
            approx_kl=kl(_flat(vi_draws)),
            test_error=vi_err,
            cluster_s=0.0,
            sample_s=vi_s,
            accept=float("nan"),
            grads_per_draw=float("nan"),
            ess_min=float("nan"),
            **sd_error(_flat(vi_draws), ess=False),
        )
    )
    bar.update(1)
    return dict(
        rows=rows,
        curves=curves,
        sizes=sizes,
        note=note,
        kind=kind,
        warmup_s=warmup_s,
        fixed_step=fixed_step,
        leapfrog=int(params.get("num_integration_steps", 0)),
        step_size=float(params["step_size"]),
        diagonal_kl=diag_kl,
        num_params=exact_flat.shape[1],
        sampler=sampler,
        laplace_s=laplace_s,
        num_samples=num_samples,
        num_vi=num_vi,
        shared=dict(
            state=state,
            params=params,
            warmup_s=warmup_s,
            exact=(exact_samples, exact_acc, exact_s, exact_c),
            laplace=(lap_mean, chol, laplace_s),
            vi=(vstate, vi_s),
        ),
    )


def run(out_dir: Path, *, quick: bool) -> dict:
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    rep = Report(TITLE, out_dir)
    rep.text(__doc__.split("\n\n", 1)[1])
    names = ["mnist", "cadata", "flights", "covtype"]
    if not quick:  # the extra real tables (full mode, or named in JAXSUB_COMPRESSED_HMC_DATASETS)
        names += ["diamonds", "cpssw8", "mortgages"]
    only = os.environ.get("JAXSUB_COMPRESSED_HMC_DATASETS")
    if only:  # a partial run (e.g. full mode on cadata alone): the report says which ran
        names = [n for n in names + ["diamonds", "cpssw8", "mortgages"] if n in only.split(",")]
        names = list(dict.fromkeys(names))
        rep.text(f"Datasets restricted by JAXSUB_COMPRESSED_HMC_DATASETS={only}.")
    trials = 1 if quick else TRIALS
    if os.environ.get("JAXSUB_COMPRESSED_HMC_TRIALS"):  # fewer trials for a full-size run that must fit a time slot
        trials = int(os.environ["JAXSUB_COMPRESSED_HMC_TRIALS"])
        rep.text(f"Trials per setting set to {trials} by JAXSUB_COMPRESSED_HMC_TRIALS.")
    results, skipped = {}, {}
    key = jax.random.key(20211128)
    if os.environ.get("JAXSUB_COMPRESSED_HMC_SEED"):  # another seed (docs/guides/compress.md: robustness of quick mode)
        key = jax.random.fold_in(key, int(os.environ["JAXSUB_COMPRESSED_HMC_SEED"]))
        rep.text(f"Seed changed by JAXSUB_COMPRESSED_HMC_SEED={os.environ['JAXSUB_COMPRESSED_HMC_SEED']}.")
    with progress(total=6 * len(names) * trials, desc="compressed_hmc") as bar:
        for i, name in enumerate(names):
            try:
                runs = []
                for t in range(trials):  # trials 1, 2, ... reuse trial 0's exact reference (SHARED_EXACT)
                    shared = runs[0]["shared"] if runs and SHARED_EXACT else None
                    runs.append(
                        _run_dataset(
                            name, quick, jax.random.fold_in(jax.random.fold_in(key, i), t), bar, trial=t, shared=shared
                        )
                    )
                results[name] = dict(runs[0], rows=_aggregate([r["rows"] for r in runs]), trials=trials)
                results[name].pop("shared")
            except datasets.DatasetNotFoundError as err:
                skipped[name] = str(err)
                bar.update(6 * trials)

    metrics = {"quick": quick, "skipped": skipped}
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6))
    fig2, axes2 = plt.subplots(1, len(results), figsize=(5 * len(results), 3.2))
    for ax, ax2, (name, res) in zip(np.atleast_1d(axes), np.atleast_1d(axes2), results.items()):
        rep.heading(name)
        rep.text(
            f"{res['note']}. Parameters: {res['num_params']}. "
            + (
                f"{res['sampler']} in the coordinates whitened by the Laplace fit of the exact posterior (fit {res['laplace_s']:.1f} s), "
                if res["sampler"] == "NUTS" or res.get("fixed_step")
                else "HMC: 10 leapfrog steps, "
            )
            + (
                f"no warm-up: step size {res['step_size']:.3g} = {QUICK_STEP_SCALE:g} d^-1/4, "
                + (
                    f"{res['leapfrog']} leapfrog steps (trajectory {QUICK_TRAJECTORY:g}) "
                    if res["sampler"] == "HMC"
                    else ""
                )
                + "and identity mass matrix "
                "(the whitened exact posterior is close to N(0, I)); "
                if res.get("fixed_step")
                else f"step size {res['step_size']:.3g} and diagonal mass matrix from window adaptation on the exact posterior "
                f"({res['warmup_s']:.1f} s, not counted below); "
            )
            + f"{res['num_samples']} draws (first 20% dropped), "
            f"{res['num_vi']} VI steps. approxKL = KL(exact || method) of moment-matched "
            f"{'diagonal ' if res['diagonal_kl'] else ''}Gaussians"
            f"{' (diagonal: fewer draws than 2x parameters)' if res['diagonal_kl'] else ''}."
        )
        err_name = "test MSE" if res["kind"] == "linear" else "test error %"
        table = []
        exact_s = res["rows"][0]["sample_s"]
        for r in res["rows"]:
            comp = r["method"].startswith("compressed")
            time_str = (
                f"{_pm(r, 'cluster_s', '.2f')} + {_pm(r, 'sample_s', '.2f')}" if comp else _pm(r, "sample_s", ".2f")
            )
            e2e = exact_s / (r["cluster_s"] + r["sample_s"]) if comp else float("nan")
            table.append(
                [
                    r["method"],
                    r["N"],
                    _pm(r, "c", ",.0f"),
                    r["delta"],
                    r.get("achieved_delta", float("nan")),
                    _pm({k: 100 * v for k, v in r.items() if k in ("rho", "rho_sd")}, "rho", ".3g"),
                    _pm(r, "approx_kl", ".3g"),
                    _pm(r, "mean_sd", ".2f"),
                    _pm(r, "ess_min", ".0f"),
                    f"{r['sd_ratio_min']:.2f}-{r['sd_ratio_max']:.2f}",
                    _pm(r, "test_error", ".4g"),
                    time_str,
                    f"{e2e:.2f}x" if comp else "",
                    r["accept"],
                    f"{r['grads_per_draw']:.1f}",
                ]
            )
        rep.table(
            table,
            [
                "method",
                "N",
                "c",
                "delta",
                "achieved delta",
                "rho %",
                "approxKL",
                "max |mean err| / sd",
                "min ESS",
                "sd ratio",
                err_name,
                "time s (clust + sample)",
                "end-to-end speed-up vs exact",
                "accept",
                "gradients / draw",
            ],
        )
        if res["trials"] > 1:
            rep.text(
                f"Mean ± sd over {res['trials']} trials (stream order of the training rows and all keys differ)"
                + (
                    "; the exact-chain and VI rows are trial 0's, the reference of every trial (SHARED_EXACT)."
                    if SHARED_EXACT
                    else "."
                )
            )
        rep.text(
            f"Posterior error in posterior-sd units against the exact-{res['sampler']} draws: max over parameters of "
            "|mean - exact mean| / exact sd, and the range of sd / exact sd (compress.posterior_error). Monte Carlo "
            f"error alone gives about sqrt(1 / ESS_exact + 1 / ESS) sd units per parameter "
            f"({np.sqrt(2 / (0.8 * res['num_samples'])):.2f} at ESS = kept draws; min ESS: the chain's smallest effective "
            "sample size over the parameters, kept draws). The maximum over parameters of such errors is larger by "
            "the usual extreme-value factor (about 2.5x for 30 parameters)."
        )
        paper = PAPER.get(name)
        if paper:
            rep.text(
                f"Paper ({name}): exact {paper['exact'][0]}% in {paper['exact'][1]} s; "
                + "; ".join(
                    f"delta={r[1]}: c={r[0]:,}, rho={r[2]}%, approxKL={r[3]:.3g}, error={r[4]}%, time {r[5]}"
                    for r in paper["rows"]
                )
                + f"; VI approxKL={paper['vi'][0]:.3g}, error={paper['vi'][1]}%, {paper['vi'][2]} s."
            )
        elif name == "cadata":
            rep.text(
                "Paper: Table 3 of our copy of the paper has no cadata rows (only its dataset table), so there is no figure to compare."
            )
        elif name == "flights":
            rep.text("Paper: no row for this dataset (stand-in for covtype; compare with the covtype row in spirit).")
        else:
            rep.text("Paper: no row for this dataset (an extra real table in the paper's range of sizes).")
        comp = [r for r in res["rows"] if r["method"] == f"compressed {res['sampler']}"]
        vi_kl = res["rows"][-1]["approx_kl"]
        mid = comp[1]
        gap = mid["test_error"] - res["rows"][0]["test_error"]
        rep.text(
            f"Targets: approxKL below VI's ({vi_kl:.3g}) at every radius: "
            f"{'yes' if all(r['approx_kl'] < vi_kl for r in comp) else 'NO'}; "
            f"middle radius {'error' if res['kind'] == 'logistic' else 'MSE'} - exact = {gap:+.3g}"
            + (
                f" ({'within' if abs(gap) <= 1.0 else 'NOT within'} 1 percentage point)."
                if res["kind"] == "logistic"
                else "."
            )
        )
        for label, pts in res["curves"].items():
            pts = np.asarray(pts)
            ax.plot(pts[:, 0], pts[:, 1], marker="o", ms=3, label=label)
        ax.set(title=name, xlabel="wall-clock s (clustering + sampling)", ylabel=err_name)
        ax.legend(fontsize=7)
        for delta, counts in res["sizes"].items():
            ax2.hist(
                counts, bins=np.logspace(0, np.log10(max(2, counts.max())), 30), histtype="step", label=f"delta={delta}"
            )
        ax2.set(xscale="log", yscale="log", title=name, xlabel="cluster size n_j", ylabel="clusters")
        ax2.legend(fontsize=7)
        metrics[name] = {k: v for k, v in res.items() if k not in ("sizes",)}
    if results:
        rep.figure(
            savefig(fig, out_dir, "error_vs_time.png"),
            "Test error (MSE for cadata) of the running posterior average vs wall-clock (sample k placed at clustering time + k/S x sampling time)",
        )
        rep.figure(savefig(fig2, out_dir, "cluster_sizes.png"), "Distribution of cluster sizes (the paper's Figure 1)")
    for name, why in skipped.items():
        rep.text(f"**{name} skipped**: {why}")
    rep.text(
        f"Notes: {trials} trial(s) per setting (the paper averages 5; quick mode runs 1). End-to-end speed-up = exact "
        "sampling time / (clustering + compressed sampling time) at the same number of draws. Times are wall-clock on a shared 2-core CPU "
        "(other jobs running). Sampling time is one compiled lax.scan of NUTS (MNIST: HMC) steps, compilation timed apart "
        "(metrics.json: compile_s); clustering is host-side NumPy/SciPy (nothing compiled). Second-order rows: "
        "logdensity(..., second_order=True) on compress.pseudodata(cl, second_order=True) passed as arguments. In quick mode the "
        "sd-unit errors are dominated by Monte Carlo error (80 autocorrelated draws, max over all parameters). VI time: meanfield_vi steps (5 Monte Carlo samples each, Adam 1e-2), compiled step. "
        "Per-gradient speed ratios: benchmarks/compress.py."
        + (
            " QUICK MODE: sizes reduced as stated per dataset; 100 HMC draws (after 40 warm-up steps for MNIST; whitened, no warm-up for the others), 100 VI steps; the three radii "
            "share one compiled chain per order (pseudo-data padded with weight-0 rows to the largest c, first order to N "
            "where that c is over N / 2 or the exact chain is cheap), so their sampling "
            "times are those of the smallest radius: read speed from benchmarks/compress.py or full mode."
            if quick
            else ""
        )
    )
    rep.write()
    return metrics
