"""Tests of jaxsub.sgmcmc: DSGLD, CG-DSGLD, surrogates, padded shards.

Statistical tests compare with *exact* answers: for the Gaussian-mean model
``x | θ ~ N(θ, I)``, ``θ ~ N(0, 5 I)`` one local step of CG-DSGLD with exact
surrogates is the linear recursion

    θ' = a θ + (ε/2)(N x̄) + (ε/2) w + η,   a = 1 - ε P / 2,  P = N + 1/5,

where ``w = (N_s/f_s)(x̄_B - x̄_s)`` is zero-mean minibatch noise, uncorrelated
across steps (given the shards visited the minibatches are independent and
zero-mean), and ``η ~ N(0, εI)``. Its stationary law has mean exactly the
posterior mean ``N x̄ / P`` and covariance ``(ε I + (ε²/4) V)/(1 - a²)`` with
``V = E[w wᵀ]`` computable from the shards (without-replacement minibatch
variance). DSGLD with one local step and ``f_s ∝ N_s`` is the same recursion
with ``w = N(x̄_B - x̄)``. Tolerances are Monte Carlo errors (ESS-gated) from
``tests/helpers.py``.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_mean_matches, assert_variance_matches, variants
from scipy import stats

import jaxsub
from jaxsub.sgmcmc import dsgld as dsgld_module
from jaxsub.sgmcmc.shards import make_shards, minibatch_indices
from jaxsub.sgmcmc.surrogates import conducive_arrays, conducive_gradient

PRIOR_VAR = 5.0


def gaussian_logprior(theta):
    return -0.5 * jnp.sum(theta**2) / PRIOR_VAR


def gaussian_loglik(theta, x):
    return -0.5 * jnp.sum((x - theta) ** 2)


def blob_shards(seed=0, sizes=(30, 60, 45, 25), scale=0.35):
    """Heterogeneous 2-D blobs (NOTES.md §2 toy, smaller), unequal shard sizes."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-3, 3, size=(len(sizes), 2))
    return [(c + scale * rng.normal(size=(n, 2))).astype(np.float32) for c, n in zip(centres, sizes)]


def exact_surrogates(shards):
    return jaxsub.sgmcmc.gaussian_surrogates([x.mean(0) for x in shards], [len(x) * np.eye(2) for x in shards])


def logistic_loglik(theta, datum):
    x, y = datum
    logit = x @ theta["w"] + theta["b"]
    return y * logit - jnp.logaddexp(0.0, logit)


def logistic_logprior(theta):
    return -0.5 * (jnp.sum(theta["w"] ** 2) + theta["b"] ** 2)


def logistic_shards(seed=1, sizes=(13, 40, 27)):
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        x = rng.normal(size=(n, 3)).astype(np.float32)
        y = (rng.uniform(size=n) < 0.3 + 0.4 * rng.uniform()).astype(np.float32)
        out.append((x, y))
    return out


# ---------------------------------------------------------------- shards and minibatches


def test_make_shards_pads_and_masks():
    shards = make_shards(blob_shards())
    assert shards.sizes.tolist() == [30, 60, 45, 25]
    assert shards.data.shape == (4, 60, 2)
    np.testing.assert_array_equal(shards.mask.sum(1), shards.sizes)
    stacked = make_shards(np.zeros((3, 10, 2)), sizes=[10, 4, 7])
    assert stacked.sizes.tolist() == [10, 4, 7]


@pytest.mark.parametrize("variant", ["without_jit", "with_jit"])
def test_minibatch_indices_distinct_in_range_and_uniform(variant):
    fn = variants(lambda k, n: minibatch_indices(k, 6, n))[variant]
    num_items, draws = 23, 3000
    keys = jax.random.split(jax.random.key(3), draws)
    idx = np.asarray(jax.jit(jax.vmap(lambda k: minibatch_indices(k, 6, jnp.int32(num_items))))(keys))
    assert idx.min() >= 0 and idx.max() < num_items
    assert all(len(set(row)) == 6 for row in idx)
    one = np.asarray(fn(keys[0], jnp.int32(num_items)))
    np.testing.assert_array_equal(one, idx[0])
    # first-order inclusion is uniform: each index appears with probability 6/23
    counts = np.bincount(idx.ravel(), minlength=num_items)
    expected = draws * 6 / num_items
    stat = ((counts - expected) ** 2 / expected).sum()
    assert stats.chi2.sf(stat, num_items - 1) > 1e-4


# ---------------------------------------------------------------- unbiasedness


def _full_minibatch_gradient(grad_fn, data, shard, size):
    """The estimator on a 'minibatch' of all N_s rows, drawn by the sampler's own index draw."""

    @jax.jit
    def run(key):
        idx = minibatch_indices(key, int(size), jnp.int32(size))
        return grad_fn(jax.tree.map(lambda x: jnp.asarray(x)[shard, idx], data))

    return run(jax.random.key(int(shard)))


@pytest.mark.parametrize("diagonal", [False, True])
def test_cg_estimator_is_unbiased_over_shards_exactly(diagonal):
    """Σ_s f_s ĝ_s(θ) with full minibatches equals the full-data gradient, for any surrogates and α."""
    shards = make_shards(logistic_shards())
    probs = np.array([0.5, 0.2, 0.3])
    rng = np.random.default_rng(7)
    dim = 4
    means = rng.normal(size=(3, dim))
    if diagonal:
        precs = rng.uniform(1.0, 30.0, size=(3, dim))
    else:
        a = rng.normal(size=(3, dim, dim))
        precs = np.einsum("sij,skj->sik", a, a) + np.eye(dim)
    surrogates = jaxsub.sgmcmc.gaussian_surrogates(means, precs)
    alpha = 2.5
    arrays = conducive_arrays(surrogates, probs, alpha)
    theta = {"w": jnp.asarray(rng.normal(size=3), jnp.float32), "b": jnp.asarray(0.3, jnp.float32)}
    total = None
    for s in range(3):
        cfn = lambda p, s=s: conducive_gradient(p, s, arrays)
        est = dsgld_module.shard_gradient_estimator(
            logistic_logprior, logistic_loglik, jnp.int32(shards.sizes[s]), jnp.float32(probs[s]), jnp.float32, cfn
        )
        g = _full_minibatch_gradient(lambda b: est(theta, b), shards.data, s, shards.sizes[s])
        g = jax.tree.map(lambda x: probs[s] * np.asarray(x, np.float64), g)
        total = g if total is None else jax.tree.map(np.add, total, g)
    all_x = np.concatenate([x for x, _ in logistic_shards()])
    all_y = np.concatenate([y for _, y in logistic_shards()])

    def full_logpost(p):
        return logistic_logprior(p) + jnp.sum(jax.vmap(logistic_loglik, in_axes=(None, 0))(p, (all_x, all_y)))

    exact = jax.grad(full_logpost)(theta)
    for k in exact:
        np.testing.assert_allclose(total[k], exact[k], rtol=1e-4, atol=1e-3)
    # and the conducive term alone would visibly change a single shard's estimate
    assert not np.allclose(total["w"], 0)


@pytest.mark.parametrize("diagonal", [False, True])
def test_conducive_gradient_has_zero_mean(diagonal):
    rng = np.random.default_rng(11)
    num_shards, dim = 5, 3
    probs = rng.dirichlet(np.ones(num_shards))
    means = rng.normal(size=(num_shards, dim))
    precs = rng.uniform(0.5, 20.0, size=(num_shards, dim))
    if not diagonal:
        precs = np.stack([np.diag(p) + 0.1 for p in precs])
    sur = jaxsub.sgmcmc.gaussian_surrogates(means, precs)
    arrays = conducive_arrays(sur, probs)
    theta = {"a": jnp.asarray(rng.normal(size=2), jnp.float32), "b": jnp.asarray(rng.normal(), jnp.float32)}
    gs = [conducive_gradient(theta, s, arrays) for s in range(num_shards)]
    # the precomputed affine form equals the definition -Σ_k Λ_k(θ - μ_k) + (1/f_s) Λ_s(θ - μ_s)
    flat = np.concatenate([np.asarray(theta["a"]), np.asarray(theta["b"])[None]]).astype(np.float64)
    full = precs if not diagonal else np.stack([np.diag(p) for p in precs])
    for s in range(num_shards):
        direct = -sum(full[k] @ (flat - means[k]) for k in range(num_shards)) + full[s] @ (flat - means[s]) / probs[s]
        got = np.concatenate([np.asarray(gs[s]["a"]), np.asarray(gs[s]["b"])[None]])
        np.testing.assert_allclose(got, direct, rtol=1e-4, atol=1e-4 * np.abs(direct).max())
    mean = jax.tree.map(lambda *g: sum(p * np.asarray(x, np.float64) for p, x in zip(probs, g)), *gs)
    scale = max(float(np.abs(np.asarray(g["a"])).max()) for g in gs)
    assert scale > 1.0  # the individual terms are far from zero
    for leaf in jax.tree.leaves(mean):
        np.testing.assert_allclose(leaf, 0.0, atol=1e-5 * scale)


# ---------------------------------------------------------------- conjugate toy: exact stationary moments


def _minibatch_mean_cov(x, n):
    """Covariance of the mean of n rows drawn without replacement from x (population covariance)."""
    N = x.shape[0]
    pop = np.cov(x.T, ddof=0)
    return pop / n * (N - n) / (N - 1)


def _stationary(shards, probs, eps, n, kind):
    sizes = np.array([len(x) for x in shards])
    N = sizes.sum()
    xbar = np.concatenate(shards).mean(0)
    P = N + 1.0 / PRIOR_VAR
    a = 1.0 - eps * P / 2.0
    V = np.zeros((2, 2))
    for f, x, n_s in zip(probs, shards, sizes):
        within = _minibatch_mean_cov(x.astype(np.float64), n)
        if kind == "cg":  # w = (N_s/f_s)(x̄_B - x̄_s)
            V += f * (n_s / f) ** 2 * within
        else:  # dsgld, f ∝ N_s: w = N(x̄_B - x̄)
            d = x.mean(0) - xbar
            V += f * N**2 * (within + np.outer(d, d))
    cov = (eps * np.eye(2) + eps**2 / 4.0 * V) / (1.0 - a**2)
    return N * xbar / P, cov, np.eye(2) / P


def _run(algorithm, num_chains, num_rounds, burn, start):
    init = jax.vmap(algorithm.init)(jnp.tile(jnp.asarray(start, jnp.float32), (num_chains, 1)))
    trace = jaxsub.run_chains(
        jax.random.key(2026),
        algorithm,
        init,
        num_rounds,
        transform=lambda s, i: {"position": s.position, "shard": i.shard},
    )
    return np.asarray(trace.states["position"])[:, burn:], np.asarray(trace.states["shard"])


_DIRECTIONS = np.array([[1.0, 0.0], [0.0, 1.0], [1.0 / np.sqrt(2), 1.0 / np.sqrt(2)]]).T  # [2, 3]


def _check_moments(draws, mean, cov):
    """Means and variances of the projections on both axes and the diagonal (per coordinate: MC error each).

    Both moment tests pass arrays of one shape ``[16, 2400, 3]``: the ESS computation (eager
    ``blackjax.diagnostics``) then compiles once for the file instead of once per shape.
    """
    proj = draws @ _DIRECTIONS
    assert_mean_matches(proj, mean @ _DIRECTIONS)
    assert_variance_matches(proj, np.einsum("ik,ij,jk->k", _DIRECTIONS, cov, _DIRECTIONS))


def test_cg_dsgld_conjugate_matches_exact_moments():
    shards = blob_shards()
    eps, n, L = 4e-5, 10, 10
    algo = jaxsub.cg_dsgld(
        gaussian_logprior,
        gaussian_loglik,
        shards,
        step_size=eps,
        batch_size=n,
        local_steps=L,
        surrogates=exact_surrogates(shards),
    )
    sizes = np.array([len(x) for x in shards])
    probs = sizes / sizes.sum()
    mean, cov, post_cov = _stationary(shards, probs, eps, n, "cg")
    # the discretised chain is within 3% of the analytic posterior at this step size
    np.testing.assert_allclose(np.diag(cov), np.diag(post_cov), rtol=0.03)
    draws, visited = _run(algo, num_chains=16, num_rounds=2500, burn=100, start=mean)
    _check_moments(draws, mean, cov)
    # shards are visited with the default probabilities f_s ∝ N_s
    freq = np.bincount(visited.ravel(), minlength=4) / visited.size
    se = np.sqrt(probs * (1 - probs) / visited.size)
    assert np.all(np.abs(freq - probs) <= 4 * se), (freq, probs, se)


def test_dsgld_one_local_step_matches_exact_moments():
    shards = blob_shards(seed=2)
    # ε P / 2 = 0.032: lag-1 autocorrelation 0.968, ESS of the mean ≈ 16 x 2400 x 0.032 / 1.968 ≈ 620 for an
    # AR(1) (about 340 measured, gate 200); the stationary moments are those of the discretised chain at
    # this ε (exact, _stationary), so a larger ε changes the reference, not the tolerance
    eps, n = 4e-4, 10
    algo = jaxsub.dsgld(gaussian_logprior, gaussian_loglik, shards, step_size=eps, batch_size=n, local_steps=1)
    sizes = np.array([len(x) for x in shards])
    mean, cov, _ = _stationary(shards, sizes / sizes.sum(), eps, n, "dsgld")
    draws, _ = _run(algo, num_chains=16, num_rounds=2500, burn=100, start=mean)
    _check_moments(draws, mean, cov)


def test_cg_dsgld_stays_put_where_dsgld_drifts_with_many_local_steps():
    """With 200 local steps DSGLD drifts to a mixture of local posteriors; CG-DSGLD does not.

    Both run through one compiled ``jaxsub.sgmcmc.sample_rounds`` program (data, surrogates, α as
    arguments; α = 0 is DSGLD, checked against the DSGLD kernel in
    ``test_kernel_takes_model_data_and_traced_hyperparameters``); its α = 1 trace equals
    ``run_chains`` of ``jaxsub.cg_dsgld`` with the same key.
    """
    shards = blob_shards(seed=4, sizes=(50, 50, 50, 50), scale=0.35)
    surrogates = exact_surrogates(shards)
    probs = np.full(4, 0.25)
    kw = dict(step_size=1e-4, batch_size=10, local_steps=200, shard_probs=probs)
    post_mean = np.concatenate(shards).mean(0) * 200 / (200 + 1 / PRIOR_VAR)
    packed = make_shards(shards)
    run = jax.jit(
        jaxsub.sgmcmc.sample_rounds(
            gaussian_logprior, gaussian_loglik, batch_size=10, local_steps=200, num_rounds=80, shard_size=50
        )
    )
    start = jnp.tile(jnp.asarray(post_mean, jnp.float32), (2, 1))
    out, traces = {}, {}
    for name, alpha in (("dsgld", 0.0), ("cg", 1.0)):
        _, traces[name] = run(
            jax.random.key(2026),
            start,
            packed.data,
            jnp.asarray(packed.sizes, jnp.int32),
            jnp.asarray(probs, jnp.float32),
            conducive_arrays(surrogates, probs),
            1e-4,
            alpha,
        )
        draws = np.asarray(traces[name])[:, 10:]
        out[name] = float(np.mean(np.sum((draws - post_mean) ** 2, -1)))
    # posterior variance per coordinate is 1/200: CG-DSGLD's spread is of that order,
    # DSGLD's is the spread of the blob centres (~3 per coordinate).
    assert out["cg"] < 5 * 2 / 200
    assert out["dsgld"] > 100 * out["cg"]
    algo = jaxsub.cg_dsgld(gaussian_logprior, gaussian_loglik, shards, surrogates=surrogates, **kw)
    draws, _ = _run(algo, num_chains=2, num_rounds=80, burn=0, start=post_mean)
    np.testing.assert_allclose(np.asarray(traces["cg"]), draws, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- jit / no-jit, info


@pytest.mark.parametrize("variant", ["without_jit", "with_jit"])
def test_step_variants_agree_and_info(variant):
    shards = logistic_shards()
    surrogates = jaxsub.sgmcmc.gaussian_surrogates(np.zeros((3, 4)), np.ones((3, 4)))
    algo = jaxsub.cg_dsgld(
        logistic_logprior,
        logistic_loglik,
        shards,
        step_size=1e-3,
        batch_size=5,
        local_steps=2,
        surrogates=surrogates,
        return_local_positions=True,
    )
    state = algo.init({"w": jnp.zeros(3), "b": jnp.zeros(())})
    step = variants(algo.step)[variant]
    ref_state, ref_info = jax.jit(algo.step)(jax.random.key(5), state)
    new_state, info = step(jax.random.key(5), state)
    chex.assert_trees_all_close(new_state, ref_state, rtol=1e-5, atol=1e-6)
    assert info.local_positions["w"].shape == (2, 3) and info.local_positions["b"].shape == (2,)
    chex.assert_trees_all_close(jax.tree.map(lambda x: x[-1], info.local_positions), new_state.position)
    assert info.shard.dtype == jnp.int32 and 0 <= int(info.shard) < 3
    assert bool(info.is_finite)


def test_float64_works():
    with jax.enable_x64(True):
        shards = [x.astype(np.float64) for x in blob_shards()]
        algo = jaxsub.cg_dsgld(
            gaussian_logprior,
            gaussian_loglik,
            shards,
            step_size=1e-4,
            batch_size=5,
            local_steps=2,
            surrogates=exact_surrogates(shards),
        )
        state = algo.init(jnp.zeros(2, jnp.float64))
        new, info = jax.jit(algo.step)(jax.random.key(0), state)
        assert new.position.dtype == jnp.float64


def test_nan_reported_in_info():
    shards = blob_shards()
    algo = jaxsub.dsgld(gaussian_logprior, gaussian_loglik, shards, step_size=1.0, batch_size=5, local_steps=50)
    state = algo.init(jnp.zeros(2))
    for i in range(3):
        state, info = jax.jit(algo.step)(jax.random.key(i), state)
    assert not bool(info.is_finite)


# ---------------------------------------------------------------- surrogate fitting


@pytest.mark.parametrize("covariance,with_prior", [("full", False), ("diag", True)])
def test_fitted_surrogates_recover_gaussian_likelihoods(covariance, with_prior):
    """For x|θ ~ N(θ, I) the shard likelihood is exactly N(x̄_s, I/N_s)."""
    shards = blob_shards(sizes=(30, 50, 40))
    kw = dict(logprior_fn=gaussian_logprior, prior=(0.0, 1.0 / PRIOR_VAR)) if with_prior else {}
    num_samples = 20000
    sur = jaxsub.sgmcmc.gaussian_surrogates(
        shards=shards,
        loglikelihood_fn=gaussian_loglik,
        rng_key=jax.random.key(9),
        position=jnp.zeros(2),
        step_size=5e-4,
        batch_size=10,
        num_samples=num_samples,
        num_burnin=500,
        covariance=covariance,
        **kw,
    )
    info = sur.fit_info
    assert info.num_sgld_steps == 20500 and info.likelihood_gradient_evaluations == 3 * 20500 * 10
    assert info.seconds > 0
    for s, x in enumerate(shards):
        n_s = len(x)
        # AR(1) with a = 1 - ε N_s / 2 has integrated autocorrelation (1 + a) / (1 - a)
        a = 1 - 5e-4 * n_s / 2
        ess = num_samples * (1 - a) / (1 + a)
        np.testing.assert_allclose(np.asarray(sur.mean[s]), x.mean(0), atol=4 / np.sqrt(n_s * ess))
        prec = np.asarray(sur.precision[s])
        diag = prec if covariance == "diag" else np.diag(prec)
        # relative SE of a variance estimate is sqrt(2 / ESS); allow 4 SE + the 2% SGLD bias
        np.testing.assert_allclose(diag, n_s, rtol=4 * np.sqrt(2 / ess) + 0.02)


# ---------------------------------------------------------------- clear errors


def test_errors_are_clear():
    shards = blob_shards()
    lp, ll = gaussian_logprior, gaussian_loglik
    good = dict(step_size=1e-3, batch_size=5, local_steps=2)
    with pytest.raises(ValueError, match="per-datum shape"):
        jaxsub.dsgld(lp, ll, [np.zeros((5, 2)), np.zeros((5, 3))], **good)
    with pytest.raises(ValueError, match="same leading size"):
        jaxsub.dsgld(lp, ll, [(np.zeros((5, 2)), np.zeros(5)), (np.zeros((5, 2)), np.zeros(4))], **good)
    with pytest.raises(ValueError, match="structure"):
        jaxsub.dsgld(lp, ll, [np.zeros((5, 2)), (np.zeros((5, 2)), np.zeros(5))], **good)
    with pytest.raises(ValueError, match="non-negative"):
        jaxsub.dsgld(lp, ll, shards, shard_probs=[0.5, 0.6, 0.2, -0.3], **good)
    with pytest.raises(ValueError, match="sum to 1"):
        jaxsub.dsgld(lp, ll, shards, shard_probs=[0.3, 0.3, 0.3, 0.3], **good)
    with pytest.raises(ValueError, match="length 4"):
        jaxsub.dsgld(lp, ll, shards, shard_probs=[0.5, 0.5], **good)
    with pytest.raises(ValueError, match="strictly positive"):
        jaxsub.dsgld(lp, ll, shards, shard_probs=[0.5, 0.5, 0.0, 0.0], **good)
    with pytest.raises(ValueError, match="batch_size"):
        jaxsub.dsgld(lp, ll, shards, step_size=1e-3, batch_size=26, local_steps=2)
    with pytest.raises(ValueError, match="local_steps"):
        jaxsub.dsgld(lp, ll, shards, step_size=1e-3, batch_size=5, local_steps=0)
    with pytest.raises(ValueError, match="step_size"):
        jaxsub.dsgld(lp, ll, shards, step_size=-1.0, batch_size=5, local_steps=2)
    sur3 = exact_surrogates(shards[:3])
    with pytest.raises(ValueError, match="3 surrogates for 4 shards"):
        jaxsub.cg_dsgld(lp, ll, shards, surrogates=sur3, **good)
    with pytest.raises(ValueError, match="GaussianSurrogates"):
        jaxsub.cg_dsgld(lp, ll, shards, surrogates=(np.zeros((4, 2)), np.ones((4, 2))), **good)
    algo = jaxsub.cg_dsgld(lp, ll, shards, surrogates=exact_surrogates(shards), **good)
    with pytest.raises(ValueError, match="dimension 2 but the position has 3"):
        algo.init(jnp.zeros(3))
    with pytest.raises(ValueError, match="exploration"):
        jaxsub.cg_dsgld(lp, ll, shards, surrogates=exact_surrogates(shards), exploration=-1.0, **good)
    with pytest.raises(ValueError, match="precisions must be"):
        jaxsub.sgmcmc.gaussian_surrogates(np.zeros((4, 2)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="prior"):
        jaxsub.sgmcmc.gaussian_surrogates(
            shards=shards,
            loglikelihood_fn=ll,
            rng_key=jax.random.key(0),
            position=jnp.zeros(2),
            step_size=1e-3,
            batch_size=5,
            logprior_fn=lp,
        )
    with pytest.raises(ValueError, match="covariance"):
        jaxsub.sgmcmc.gaussian_surrogates(
            shards=shards,
            loglikelihood_fn=ll,
            rng_key=jax.random.key(0),
            position=jnp.zeros(2),
            step_size=1e-3,
            batch_size=5,
            covariance="low",
        )
    with pytest.raises(ValueError, match="participating"):
        jaxsub.sgmcmc.multi_device(lp, ll, shards, participating=5, **good)
    with pytest.raises(ValueError, match="strictly positive"):
        jaxsub.sgmcmc.multi_device(lp, ll, shards, shard_probs=[0.5, 0.5, 0.0, 0.0], **good)
    with pytest.raises(ValueError, match="3 surrogates for 4 shards"):
        jaxsub.sgmcmc.multi_device(lp, ll, shards, surrogates=sur3, **good)
    functions = jaxsub.sgmcmc.multi_device_kernel(num_shards=3, chains_per_shard=1, batch_size=5, local_steps=2)
    with pytest.raises(ValueError, match="num_shards = 3 but the data have 4 shards"):
        functions.make_inputs(shards)
    bad = exact_surrogates(shards)
    bad = bad._replace(precision=np.where(np.arange(4)[:, None, None] == 2, np.nan, np.asarray(bad.precision)))
    with pytest.raises(ValueError, match=r"shard\(s\) \[2\]"):
        jaxsub.cg_dsgld(lp, ll, shards, surrogates=bad, **good)
    with pytest.raises(ValueError, match="must be finite"):
        jaxsub.sgmcmc.gaussian_surrogates(np.zeros((4, 2)), np.full((4, 2), np.inf))
    md = jaxsub.sgmcmc.multi_device(lp, ll, shards, chains_per_shard=2, **good)
    with pytest.raises(ValueError, match="leading chain axis of size num_shards \\* chains_per_shard = 8"):
        md.init(jnp.zeros((5, 2)))


# ---------------------------------------------------------------- kernel contract, bad data


def test_nan_in_data_is_rejected_at_construction():
    shards = blob_shards()
    shards[2] = shards[2].copy()
    shards[2][3, 1] = np.nan
    lp, ll = gaussian_logprior, gaussian_loglik
    good = dict(step_size=1e-3, batch_size=5, local_steps=2)
    for make in (
        lambda: jaxsub.dsgld(lp, ll, shards, **good),
        lambda: jaxsub.cg_dsgld(lp, ll, shards, surrogates=exact_surrogates(blob_shards()), **good),
        lambda: jaxsub.sgmcmc.multi_device(lp, ll, shards, **good),
        lambda: jaxsub.sgmcmc.laplace_surrogates(lp, ll, shards, jnp.zeros(2)),
    ):
        with pytest.raises(ValueError, match="NaN/inf .*first in shard 2"):
            make()
    # padding rows (copies of row 0) are not data: a short finite shard passes
    jaxsub.dsgld(lp, ll, blob_shards(), **good)


def test_kernel_takes_model_data_and_traced_hyperparameters():
    """build_kernel(structure) -> kernel(rng_key, state, model, data, hyperparameters); α and ε traced."""
    shards = make_shards(blob_shards())
    probs = jnp.asarray(shards.sizes / shards.sizes.sum(), jnp.float32)
    sizes = jnp.asarray(shards.sizes, jnp.int32)
    arrays = conducive_arrays(exact_surrogates(blob_shards()), np.asarray(probs, np.float64))
    kernel = jaxsub.cg_dsgld.build_kernel(batch_size=5, local_steps=3)
    state = jaxsub.cg_dsgld.init(jnp.ones(2))

    def step(eps, alpha):
        return kernel(
            jax.random.key(0), state, gaussian_logprior, gaussian_loglik, shards.data, sizes, probs, arrays, eps, alpha
        )[0].position

    batched = jax.jit(jax.vmap(step))(jnp.array([1e-4, 2e-4]), jnp.array([1.0, 0.0]))
    one = jax.jit(step)  # traced scalars: one compile for the three unbatched calls
    np.testing.assert_allclose(batched[0], one(1e-4, 1.0), rtol=1e-5)
    np.testing.assert_allclose(batched[1], one(2e-4, 0.0), rtol=1e-5)
    # α = 0 is DSGLD with the same keys
    ds = jaxsub.dsgld.build_kernel(batch_size=5, local_steps=3)(
        jax.random.key(0), state, gaussian_logprior, gaussian_loglik, shards.data, sizes, probs, 2e-4
    )[0].position
    np.testing.assert_allclose(batched[1], ds, rtol=1e-5)
    assert not np.allclose(batched[0], one(1e-4, 0.0))


# ---------------------------------------------------------------- Laplace surrogates


def linear_shards(seed=3, sizes=(40, 25, 60), dim=3, sigma=0.5):
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(dim, dim))  # correlated features: a non-diagonal Hessian
    out = []
    for s, n in enumerate(sizes):
        x = (rng.normal(size=(n, dim)) @ mix + s).astype(np.float32)
        y = (x @ np.array([1.0, -2.0, 0.5]) + sigma * rng.normal(size=n)).astype(np.float32)
        out.append((x, y))
    return out, sigma


@pytest.mark.parametrize("structure", ["full", "diag", "lowrank"])
def test_laplace_surrogates_equal_exact_ones_on_a_conjugate_model(structure):
    """Gaussian likelihood y | x, θ ~ N(xᵀθ, σ²): the shard likelihood is exactly N with Λ_s = X_sᵀX_s/σ²,
    h_s = X_sᵀy_s/σ². The Taylor expansion is exact at any point, so the (unconverged) optimiser does not matter."""
    shards, sigma = linear_shards()
    ll = lambda th, d: -0.5 * (d[1] - d[0] @ th) ** 2 / sigma**2  # noqa: E731
    lp = lambda th: -0.5 * jnp.sum(th**2)  # noqa: E731
    with jax.enable_x64(True):
        sur = jaxsub.sgmcmc.laplace_surrogates(
            lp,
            ll,
            [(x.astype(np.float64), y.astype(np.float64)) for x, y in shards],
            jnp.zeros(3, jnp.float64),
            structure=structure,
            rank=3,
            num_steps=50,
            rng_key=jax.random.key(0),
        )
    assert sur.fit_info.method == "laplace" and sur.fit_info.num_sgld_steps == 0
    for s, (x, y) in enumerate(shards):
        x, y = x.astype(np.float64), y.astype(np.float64)
        prec, shift = x.T @ x / sigma**2, x.T @ y / sigma**2
        if structure == "full":
            got = np.asarray(sur.precision[s])
        elif structure == "diag":
            got, prec = np.asarray(sur.precision[s]), np.diag(prec)
            shift = np.diag(np.diag(x.T @ x)) / sigma**2 @ np.asarray(sur.mean[s])  # h = D μ for a diagonal q_s
        else:
            u = np.asarray(sur.factor[s])
            got = np.diag(np.asarray(sur.precision[s])) + u @ u.T
        np.testing.assert_allclose(got, prec, rtol=1e-6, atol=1e-6 * np.abs(prec).max())
        np.testing.assert_allclose(np.asarray(sur.shift[s]), shift, rtol=1e-6, atol=1e-6 * np.abs(shift).max())
    if structure == "full":  # the means are the least-squares solutions of each shard
        for s, (x, y) in enumerate(shards):
            np.testing.assert_allclose(np.asarray(sur.mean[s]), np.linalg.lstsq(x, y, rcond=None)[0], rtol=1e-4)


def test_laplace_damping_keeps_separable_shards_finite():
    """A one-label logistic shard has no likelihood maximum: the fractional prior gives a finite expansion point
    (each shard's own damped mode, expansion='local'; the common FedSGD / FedAvg centres optimise the sum of
    these damped objectives, which is proper whenever the prior is, so they inherit the finiteness)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 200, 2)).astype(np.float32)
    x[0, :, 0] = np.abs(x[0, :, 0]) + 0.1  # shard 0: all y = 1 and x_0 > 0, separable along +e_0
    x[1, :, 1] = np.abs(x[1, :, 1]) + 0.1  # shard 1: all y = 0 and x_1 > 0, separable along -e_1
    y = np.stack([np.ones(200), np.zeros(200), (rng.uniform(size=200) < 0.5)]).astype(np.float32)
    ll = lambda th, d: d["y"] * (d["x"] @ th) - jnp.logaddexp(0.0, d["x"] @ th)  # noqa: E731
    lp = lambda th: -0.5 * jnp.sum(th**2)  # noqa: E731
    data = {"x": x, "y": y}  # stacked [S, N, ...] shards
    sur = jaxsub.sgmcmc.laplace_surrogates(
        lp,
        ll,
        data,
        jnp.zeros(2),
        structure="full",
        num_steps=2000,
        optimizer=__import__("optax").adam(0.05),
        expansion="local",
    )
    assert np.all(np.isfinite(sur.mean)) and np.all(np.isfinite(sur.precision))
    assert np.all(sur.fit_info.gradient_norm < 1e-5)  # converged to the damped mode
    assert np.all(np.abs(sur.mean) < 15)
    undamped = jaxsub.sgmcmc.laplace_surrogates(
        lp,
        ll,
        data,
        jnp.zeros(2),
        structure="full",
        num_steps=2000,
        damping=0.0,
        optimizer=__import__("optax").adam(0.05),
        expansion="local",
    )
    # negative control: without damping the separable shards' optimiser runs away (no mode to converge to)
    assert np.all(undamped.fit_info.gradient_norm[:2] > 100 * sur.fit_info.gradient_norm[:2])
    for s in (0, 1):
        assert np.linalg.norm(undamped.mean[s]) > 1.5 * np.linalg.norm(sur.mean[s])


def test_laplace_fedavg_expansion_is_a_common_point_at_the_global_mode():
    """expansion='fedavg': one shared expansion point. With one local step of plain gradient
    descent per round, FedAvg's average of the shards' steps on F_s = -(ℓ_s + (N_s/N) log p_0)/N_s, weighted
    by N_s/N, is a gradient step on -(1/N) log posterior, so the point converges to the global MAP (computed
    here by Newton's method on the pooled data). Negative control: the local expansion points (each shard's
    own damped mode, expansion='local') differ from each other and from the MAP on these label-skewed shards."""
    import optax

    rng = np.random.default_rng(5)
    sizes, fracs = (80, 120, 100), (0.9, 0.1, 0.5)  # label-skewed shards of unequal sizes
    shards = []
    for n, f in zip(sizes, fracs):
        y = (rng.uniform(size=n) < f).astype(np.float32)
        x = np.column_stack([np.ones(n), rng.normal(size=n) + y]).astype(np.float32)
        shards.append((x, y))
    ll = lambda th, d: d[1] * (d[0] @ th) - jnp.logaddexp(0.0, d[0] @ th)  # noqa: E731
    lp = lambda th: -0.5 * jnp.sum(th**2)  # noqa: E731
    x = np.concatenate([s[0] for s in shards]).astype(np.float64)
    y = np.concatenate([s[1] for s in shards]).astype(np.float64)
    theta = np.zeros(2)
    for _ in range(50):  # Newton on the pooled log posterior
        p = 1 / (1 + np.exp(-x @ theta))
        theta += np.linalg.solve(x.T @ (x * (p * (1 - p))[:, None]) + np.eye(2), x.T @ (y - p) - theta)
    opt = optax.sgd(2.0)
    fed = jaxsub.sgmcmc.laplace_surrogates(
        lp,
        ll,
        shards,
        jnp.zeros(2),
        structure="full",
        num_steps=3000,
        fedavg_local_steps=1,
        optimizer=opt,
        expansion="fedavg",
    )
    # the same compute as a reusable jitted program gives the same surrogates; a program built for
    # another structure is refused
    program = jax.jit(
        jaxsub.sgmcmc.laplace_program(
            lp,
            ll,
            jnp.zeros(2),
            structure="full",
            num_steps=3000,
            fedavg_local_steps=1,
            optimizer=opt,
            expansion="fedavg",
        )
    )
    again = jaxsub.sgmcmc.laplace_surrogates(
        lp,
        ll,
        shards,
        jnp.zeros(2),
        structure="full",
        num_steps=3000,
        fedavg_local_steps=1,
        optimizer=opt,
        program=program,
        expansion="fedavg",
    )
    np.testing.assert_allclose(again.precision, fed.precision, rtol=1e-4)
    np.testing.assert_allclose(again.shift, fed.shift, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="program was built for another structure"):
        jaxsub.sgmcmc.laplace_surrogates(lp, ll, shards, jnp.zeros(2), structure="diag", program=program)
    points = fed.fit_info.expansion_point
    np.testing.assert_array_equal(points, np.broadcast_to(points[0], points.shape))  # one common point
    np.testing.assert_allclose(points[0], theta, atol=2e-3)
    local = jaxsub.sgmcmc.laplace_surrogates(
        lp, ll, shards, jnp.zeros(2), structure="full", num_steps=3000, expansion="local", optimizer=optax.sgd(2.0)
    )
    lpts = local.fit_info.expansion_point
    assert np.all(local.fit_info.gradient_norm < 1e-4)  # each at its own damped mode
    assert np.linalg.norm(lpts[0] - lpts[1]) > 1.0 and np.min(np.linalg.norm(lpts - theta, axis=1)) > 0.05
    # both are Taylor expansions of the same likelihoods: at the shared point, Σ_s ∇log q_s = ∇ℓ(θ̄)
    grad_q = np.einsum("sij,j->si", -fed.precision, points[0]) + fed.shift
    p = 1 / (1 + np.exp(-x @ points[0]))
    np.testing.assert_allclose(grad_q.sum(0), x.T @ (y - p), rtol=1e-3, atol=1e-3)
    # expansion='fedsgd' (the default: server optimiser on the size-weighted average of the shards' damped
    # gradients; no expansion= given here) is gradient descent on the global objective: it reaches the MAP; with curvature='gauss_newton' (a linear
    # model with the canonical link: GGN = Hessian exactly) the precisions are the shard Hessians there
    gn = (lambda th, d: d[0] @ th, lambda z, d: d[1] * z - jnp.logaddexp(0.0, z))
    # (one compile for both Gauss-Newton paths: low rank with rank = d is the GGN-vector-product eigenpairs
    # plus the remaining GGN diagonal, so D_s + U_s U_sᵀ must be the whole Hessian)
    sgd = jaxsub.sgmcmc.laplace_surrogates(
        lp,
        ll,
        shards,
        jnp.zeros(2),
        structure="lowrank",
        rank=2,
        curvature="gauss_newton",
        gauss_newton=gn,
        num_steps=3000,
        optimizer=opt,
        rng_key=jax.random.key(0),
    )
    np.testing.assert_allclose(sgd.fit_info.expansion_point, np.broadcast_to(theta, (3, 2)), atol=2e-3)
    hess = []
    for xs, ys in shards:
        p_s = 1 / (1 + np.exp(-xs.astype(np.float64) @ theta))
        hess.append(xs.T.astype(np.float64) @ (xs * (p_s * (1 - p_s))[:, None]))
    u = np.asarray(sgd.factor, np.float64)
    rebuilt = np.stack([np.diag(d) + f @ f.T for d, f in zip(np.asarray(sgd.precision, np.float64), u)])
    np.testing.assert_allclose(rebuilt, np.stack(hess), rtol=2e-3, atol=1e-3)
    with pytest.raises(ValueError, match="gauss_newton"):
        jaxsub.sgmcmc.laplace_surrogates(lp, ll, shards, jnp.zeros(2), curvature="gauss_newton")
    with pytest.raises(ValueError, match="gauss_newton"):
        jaxsub.sgmcmc.laplace_surrogates(lp, ll, shards, jnp.zeros(2), gauss_newton=gn)
    with pytest.raises(ValueError, match="expansion"):
        jaxsub.sgmcmc.laplace_surrogates(lp, ll, shards, jnp.zeros(2), expansion="global")
    with pytest.raises(ValueError, match="fedavg_local_steps"):
        jaxsub.sgmcmc.laplace_surrogates(lp, ll, shards, jnp.zeros(2), fedavg_local_steps=0)


def test_laplace_options_record_equals_keywords():
    """One options record (LaplaceOptions) or its fields as keywords give the same fit; keywords
    override the record; an unknown option is named."""
    from jaxsub.sgmcmc.surrogates import LaplaceOptions

    shards, sigma = linear_shards()
    ll = lambda th, d: -0.5 * (d[1] - d[0] @ th) ** 2 / sigma**2  # noqa: E731
    lp = lambda th: -0.5 * jnp.sum(th**2)  # noqa: E731
    by_keywords = jaxsub.sgmcmc.laplace_surrogates(
        lp, ll, shards, jnp.zeros(3), structure="diag", num_steps=20, expansion="local"
    )
    record = LaplaceOptions(structure="full", num_steps=20, expansion="local")
    by_record = jaxsub.sgmcmc.laplace_surrogates(lp, ll, shards, jnp.zeros(3), record, structure="diag")
    np.testing.assert_array_equal(np.asarray(by_keywords.precision), np.asarray(by_record.precision))
    np.testing.assert_array_equal(np.asarray(by_keywords.shift), np.asarray(by_record.shift))
    assert by_record.diagonal
    with pytest.raises(ValueError, match="unknown Laplace option"):
        jaxsub.sgmcmc.laplace_surrogates(lp, ll, shards, jnp.zeros(3), num_step=20)


# ---------------------------------------------------------------- pytree positions, many clients, participation


def mlp_loglik(params, datum):
    x, y = datum
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return logits[y] - jax.nn.logsumexp(logits)


def mlp_logprior(params):
    return -0.5 * sum(jnp.sum(p**2) for p in jax.tree.leaves(params))


def mlp_problem(num_shards=4, n=30, seed=0):
    rng = np.random.default_rng(seed)
    shards = []
    for s in range(num_shards):
        x = rng.normal(size=(n, 3)).astype(np.float32)
        y = ((x[:, 0] + s % 3 > 0.5).astype(np.int32) + (s % 2)) % 3
        shards.append((x, y.astype(np.int32)))
    params = {
        "w1": jnp.asarray(0.1 * rng.normal(size=(3, 4)), jnp.float32),
        "b1": jnp.zeros(4),
        "w2": jnp.asarray(0.1 * rng.normal(size=(4, 3)), jnp.float32),
        "b2": jnp.zeros(3),
    }
    return shards, params


@pytest.mark.parametrize("structure", ["diag", "lowrank", "full"])
def test_pytree_network_positions_through_every_path(structure):
    shards, params = mlp_problem()
    sur = jaxsub.sgmcmc.laplace_surrogates(
        mlp_logprior,
        mlp_loglik,
        shards,
        params,
        structure=structure,
        rank=4,
        curvature="fisher",
        num_steps=30,
        rng_key=jax.random.key(1),
    )
    dim = sum(int(np.size(p)) for p in jax.tree.leaves(params))
    assert sur.dim == dim and (sur.factor is None) == (structure != "lowrank")
    chains = jax.tree.map(lambda p: jnp.stack([p, 0.5 * p, -p]), params)
    kw = dict(step_size=1e-4, batch_size=5, local_steps=3)
    algos = [jaxsub.cg_dsgld(mlp_logprior, mlp_loglik, shards, surrogates=sur, **kw)]
    if structure == "diag":
        algos.append(jaxsub.dsgld(mlp_logprior, mlp_loglik, shards, **kw))
    for algo in algos:
        trace = jaxsub.run_chains(
            jax.random.key(0), algo, jax.vmap(algo.init)(chains), 4, transform=lambda s, i: s.position
        )
        chex.assert_trees_all_equal_structs(trace.states, params)
        assert trace.states["w1"].shape == (3, 4, 3, 4)
        assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(trace.states))
    assert np.isfinite(jaxsub.sgmcmc.curvature_excess(sur, np.full(4, 0.25)).max())
    # pytree positions through jaxsub.sgmcmc.multi_device (one device and 8 devices, non-uniform f, partial
    # participation, low-rank surrogates, draws_by_chain) are run by tests/test_sgmcmc_devices.py


def test_multi_device_unbiased_with_nonuniform_probs_and_partial_participation():
    """Unbiasedness of one round with non-uniform f and partial participation, in two exact checks:

    1. a chain on device d acts with probability (m/S)(f_d / max f), so the acting shard is ∼ f: the
       per-device acting counts over R independent rounds match their exact mean and variance
       (participation is shared by a device's C chains: Var = E[P]Var(B) + Var(P)E[B]² per round);
    2. given the shard, E[θ' - θ0] = (ε/2)[∇log p_0 + (N_d/f_d)∇log p_d(θ0) + g_d(θ0)] (one local step,
       every chain at θ0), so Σ_d f_d E[θ' - θ0 | d] = (ε/2)∇log π(θ0), the full-data gradient.

    Negative control: an estimator scaling by the visit frequency 1/S instead of 1/f_d is far off.
    """
    num_shards, chains, rounds, m = 6, 16, 300, 4
    probs = np.array([0.05, 0.1, 0.15, 0.2, 0.2, 0.3])
    sizes = (30, 50, 20, 60, 40, 45)
    rng = np.random.default_rng(5)
    centres = rng.uniform(-3, 3, size=(num_shards, 2))
    shards = [(c + 0.5 * rng.normal(size=(n, 2))).astype(np.float32) for c, n in zip(centres, sizes)]
    lam = [0.7 * len(x) for x in shards]
    mu = [x.mean(0) + 0.3 for x in shards]
    sur = jaxsub.sgmcmc.gaussian_surrogates(mu, [l * np.ones(2) for l in lam])
    eps = 1.0 / sum(sizes)
    algo = jaxsub.sgmcmc.multi_device(
        gaussian_logprior,
        gaussian_loglik,
        shards,
        step_size=eps,
        batch_size=4,
        local_steps=1,
        surrogates=sur,
        chains_per_shard=chains,
        shard_probs=probs,
        participating=m,
        return_local_positions=True,
    )
    theta0 = np.array([0.5, -0.5], np.float32)
    state = algo.init(jnp.tile(jnp.asarray(theta0), (num_shards * chains, 1)))
    _, info = jax.jit(jax.vmap(algo.step, in_axes=(0, None)))(jax.random.split(jax.random.key(3), rounds), state)
    acted = np.asarray(info.acted)  # [R, S, C]: the chain in slot (d, j) acted on shard d
    local = np.asarray(info.local_positions)[:, :, :, 0]  # [R, S, C, 2], before the hop
    participating = np.asarray(info.participating)
    assert np.all(participating.sum(1) == m)
    assert not np.any(acted & ~participating[:, :, None])
    assert np.all(local[~acted] == theta0)  # idle chains keep their position
    # 1. acting counts per device
    p_part, r = m / num_shards, probs / probs.max()
    mean_count = rounds * p_part * chains * r
    var_count = rounds * (p_part * chains * r * (1 - r) + p_part * (1 - p_part) * (chains * r) ** 2)
    z = (acted.sum((0, 2)) - mean_count) / np.sqrt(var_count)
    assert np.all(np.abs(z) < 4), z
    # 2. per-shard conditional means, combined with f
    all_x = np.concatenate(shards).astype(np.float64)
    exact = -theta0 / PRIOR_VAR + (all_x - theta0).sum(0)
    inc = (local - theta0).astype(np.float64)
    per_mean = np.stack([inc[:, d][acted[:, d]].mean(0) for d in range(num_shards)])
    per_se = np.stack([inc[:, d][acted[:, d]].std(0, ddof=1) / np.sqrt(acted[:, d].sum()) for d in range(num_shards)])
    combined, se = probs @ per_mean, np.sqrt((probs**2) @ per_se**2)
    np.testing.assert_array_less(np.abs(combined - 0.5 * eps * exact), 4 * se)
    # negative control: scaling by 1/S instead of 1/f_d (likelihood and conducive term)
    ignore_f = (
        -theta0 / PRIOR_VAR
        + sum(p * num_shards * (x - theta0).sum(0) for p, x in zip(probs, shards))
        - sum(l * (theta0 - u) for l, u in zip(lam, mu))
        + sum(p * num_shards * l * (theta0 - u) for p, l, u in zip(probs, lam, mu))
    )
    assert np.max(np.abs(combined - 0.5 * eps * ignore_f) / se) > 8


@pytest.mark.slow
def test_many_clients_partial_participation_targets_the_posterior():
    """120 shards (federated clients), 30 participating per round, non-uniform f: CG-DSGLD's long-run mean
    equals the exact posterior mean of the conjugate model (Monte Carlo error from the ESS)."""
    rng = np.random.default_rng(8)
    num_shards = 120
    sizes = rng.integers(10, 30, size=num_shards)
    shards = [(rng.uniform(-2, 2, size=2) + 0.5 * rng.normal(size=(n, 2))).astype(np.float32) for n in sizes]
    sur = exact_surrogates(shards)
    probs = sizes / sizes.sum()
    algo = jaxsub.sgmcmc.multi_device(
        gaussian_logprior,
        gaussian_loglik,
        shards,
        step_size=2e-4,
        batch_size=5,
        local_steps=5,
        surrogates=sur,
        chains_per_shard=1,
        shard_probs=probs,
        participating=30,
    )
    post_mean = np.concatenate(shards).sum(0) / (sizes.sum() + 1 / PRIOR_VAR)
    state = algo.init(jnp.tile(jnp.asarray(post_mean, jnp.float32), (num_shards, 1)))
    trace = jaxsub.run_chain(jax.random.key(4), algo, state, 400)
    draws = np.asarray(jaxsub.sgmcmc.draws_by_chain(trace.states))[:, 50:]  # [chains, steps, 2]
    assert draws.shape == (num_shards, 350, 2)
    assert_mean_matches(draws, post_mean)


# ---------------------------------------------------------------- positions, layouts, traced hyperparameters


def test_integer_position_is_promoted_and_wrong_shape_named():
    """An integer start used to fail inside the step ("dtype argument to normal must be a float")."""
    shards = blob_shards()
    algo = jaxsub.dsgld(gaussian_logprior, gaussian_loglik, shards, step_size=1e-3, batch_size=5, local_steps=2)
    state = algo.init(jnp.zeros(2, jnp.int32))
    assert state.position.dtype == jnp.result_type(float)
    new, info = jax.jit(algo.step)(jax.random.key(0), state)
    assert bool(info.is_finite) and new.position.shape == (2,)
    with pytest.raises(
        ValueError, match=r"position does not fit the model: position \(3,\) float32, datum \(2,\) float32; TypeError"
    ):
        algo.init(jnp.zeros(3))
    bad_prior = jaxsub.dsgld(lambda t: t, gaussian_loglik, shards, step_size=1e-3, batch_size=5, local_steps=2)
    with pytest.raises(ValueError, match=r"logprior_fn\(position\) must return a scalar"):
        bad_prior.init(jnp.zeros(2))
    cg = jaxsub.cg_dsgld(
        gaussian_logprior,
        gaussian_loglik,
        shards,
        step_size=1e-3,
        batch_size=5,
        local_steps=2,
        surrogates=exact_surrogates(shards),
    )
    assert cg.init(jnp.zeros(2, jnp.int32)).position.dtype == jnp.result_type(float)
    md = jaxsub.sgmcmc.multi_device(
        gaussian_logprior, gaussian_loglik, shards, step_size=1e-3, batch_size=5, local_steps=2
    )
    assert md.init(jnp.zeros((4, 2), jnp.int32)).position.dtype == jnp.result_type(float)
    with pytest.raises(ValueError, match="position does not fit the model"):
        md.init(jnp.zeros((4, 3)))


def test_traced_bad_hyperparameters_are_flagged_and_warned():
    shards = make_shards(blob_shards())
    kernel = dsgld_module.build_kernel(batch_size=5, local_steps=2)
    probs = jnp.asarray(shards.sizes / shards.sizes.sum(), jnp.float32)
    state = dsgld_module.init(jnp.zeros(2))

    def step(eps):
        return lambda key, s: kernel(
            key, s, gaussian_logprior, gaussian_loglik, jnp.asarray(shards.data), jnp.asarray(shards.sizes), probs, eps
        )

    _, info = jax.jit(lambda eps: step(eps)(jax.random.key(0), state))(-1e-3)
    assert bool(info.bad_hyperparameter)
    _, info = jax.jit(lambda eps: step(eps)(jax.random.key(0), state))(1e-3)
    assert not bool(info.bad_hyperparameter)
    with pytest.warns(RuntimeWarning, match="info.bad_hyperparameter was True at 4 of 4 steps"):
        jaxsub.run_chain(jax.random.key(1), step(jnp.asarray(-1e-3)), state, 4)
    cg_kernel = jaxsub.sgmcmc.cg_dsgld.build_kernel(batch_size=5, local_steps=2)
    arrays = conducive_arrays(exact_surrogates(blob_shards()), np.asarray(probs))
    _, info = cg_kernel(
        jax.random.key(0),
        state,
        gaussian_logprior,
        gaussian_loglik,
        jnp.asarray(shards.data),
        jnp.asarray(shards.sizes),
        probs,
        arrays,
        1e-3,
        jnp.asarray(-0.5),
    )
    assert bool(info.bad_hyperparameter)
    functions = jaxsub.sgmcmc.multi_device_kernel(num_shards=4, chains_per_shard=1, batch_size=5, local_steps=2)
    inputs = functions.make_inputs(blob_shards())
    _, info = functions.kernel(
        jax.random.key(0),
        functions.init(jnp.zeros((4, 2))),
        gaussian_logprior,
        gaussian_loglik,
        inputs,
        jnp.asarray(jnp.nan),
    )
    assert bool(info.bad_hyperparameter)


def test_kernel_refuses_another_data_layout():
    equal = make_shards([x[:20] for x in blob_shards()])
    kernel = dsgld_module.build_kernel(batch_size=5, local_steps=2, shard_size=20)
    other = make_shards([x[:24] for x in blob_shards()])
    probs = jnp.full((4,), 0.25, jnp.float32)
    state = dsgld_module.init(jnp.zeros(2))
    kernel(
        jax.random.key(0),
        state,
        gaussian_logprior,
        gaussian_loglik,
        jnp.asarray(equal.data),
        jnp.asarray(equal.sizes),
        probs,
        1e-3,
    )
    with pytest.raises(ValueError, match="built for shards of 20 rows"):
        kernel(
            jax.random.key(0),
            state,
            gaussian_logprior,
            gaussian_loglik,
            jnp.asarray(other.data),
            jnp.asarray(other.sizes),
            probs,
            1e-3,
        )
    small = dsgld_module.build_kernel(batch_size=30, local_steps=2)
    with pytest.raises(ValueError, match="batch_size = 30 exceeds the data's rows per shard"):
        small(
            jax.random.key(0),
            state,
            gaussian_logprior,
            gaussian_loglik,
            jnp.asarray(equal.data),
            jnp.asarray(equal.sizes),
            probs,
            1e-3,
        )
    four = jaxsub.sgmcmc.multi_device_kernel(num_shards=4, chains_per_shard=1, batch_size=5, local_steps=2)
    three = jaxsub.sgmcmc.multi_device_kernel(num_shards=3, chains_per_shard=1, batch_size=5, local_steps=2)
    with pytest.raises(ValueError, match="leading num_shards = 4 axis"):
        four.kernel(
            jax.random.key(0),
            four.init(jnp.zeros((4, 2))),
            gaussian_logprior,
            gaussian_loglik,
            three.make_inputs(blob_shards()[:3]),
            1e-3,
        )
