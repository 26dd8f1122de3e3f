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
from scipy import stats

import jaxsub
from jaxsub.sgmcmc import dsgld as dsgld_module
from jaxsub.sgmcmc.shards import make_shards, minibatch_indices
from jaxsub.sgmcmc.surrogates import conducive_arrays, conducive_gradient

from helpers import assert_mean_matches, assert_variance_matches, variants

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
        cfn = lambda p, s=s: conducive_gradient(p, s, arrays, diagonal=diagonal)
        est = dsgld_module.shard_gradient_estimator(
            logistic_logprior, logistic_loglik, jnp.int32(shards.sizes[s]), jnp.float32(probs[s]), jnp.float32, cfn)
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
    gs = [conducive_gradient(theta, s, arrays, diagonal=diagonal) for s in range(num_shards)]
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
    trace = jaxsub.run_chains(jax.random.key(2026), algorithm, init, num_rounds,
                              transform=lambda s, i: (s.position, i.shard))
    return np.asarray(trace.states)[:, burn:], np.asarray(trace.infos)


def _check_moments(draws, mean, cov):
    assert_mean_matches(draws, mean)
    for u in (np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.array([1.0, 1.0]) / np.sqrt(2)):
        assert_variance_matches(draws @ u, u @ cov @ u)


def test_cg_dsgld_conjugate_matches_exact_moments():
    shards = blob_shards()
    eps, n, L = 4e-5, 10, 10
    algo = jaxsub.cg_dsgld(gaussian_logprior, gaussian_loglik, shards, step_size=eps, batch_size=n,
                           local_steps=L, surrogates=exact_surrogates(shards))
    sizes = np.array([len(x) for x in shards])
    probs = sizes / sizes.sum()
    mean, cov, post_cov = _stationary(shards, probs, eps, n, "cg")
    # the discretised chain is within 3% of the analytic posterior at this step size
    np.testing.assert_allclose(np.diag(cov), np.diag(post_cov), rtol=0.03)
    draws, visited = _run(algo, num_chains=8, num_rounds=2500, burn=100, start=mean)
    _check_moments(draws, mean, cov)
    # shards are visited with the default probabilities f_s ∝ N_s
    freq = np.bincount(visited.ravel(), minlength=4) / visited.size
    se = np.sqrt(probs * (1 - probs) / visited.size)
    assert np.all(np.abs(freq - probs) <= 4 * se), (freq, probs, se)


def test_dsgld_one_local_step_matches_exact_moments():
    shards = blob_shards(seed=2)
    eps, n = 1e-4, 10
    algo = jaxsub.dsgld(gaussian_logprior, gaussian_loglik, shards, step_size=eps, batch_size=n, local_steps=1)
    sizes = np.array([len(x) for x in shards])
    mean, cov, _ = _stationary(shards, sizes / sizes.sum(), eps, n, "dsgld")
    draws, _ = _run(algo, num_chains=16, num_rounds=8000, burn=300, start=mean)
    _check_moments(draws, mean, cov)


def test_cg_dsgld_stays_put_where_dsgld_drifts_with_many_local_steps():
    """With 200 local steps DSGLD drifts to a mixture of local posteriors; CG-DSGLD does not."""
    shards = blob_shards(seed=4, sizes=(50, 50, 50, 50), scale=0.35)
    surrogates = exact_surrogates(shards)
    kw = dict(step_size=1e-4, batch_size=10, local_steps=200, shard_probs=np.full(4, 0.25))
    post_mean = np.concatenate(shards).mean(0) * 200 / (200 + 1 / PRIOR_VAR)
    out = {}
    for name, algo in {
        "dsgld": jaxsub.dsgld(gaussian_logprior, gaussian_loglik, shards, **kw),
        "cg": jaxsub.cg_dsgld(gaussian_logprior, gaussian_loglik, shards, surrogates=surrogates, **kw),
    }.items():
        draws, _ = _run(algo, num_chains=2, num_rounds=80, burn=10, start=post_mean)
        out[name] = float(np.mean(np.sum((draws - post_mean) ** 2, -1)))
    # posterior variance per coordinate is 1/200: CG-DSGLD's spread is of that order,
    # DSGLD's is the spread of the blob centres (~3 per coordinate).
    assert out["cg"] < 5 * 2 / 200
    assert out["dsgld"] > 100 * out["cg"]


# ---------------------------------------------------------------- jit / no-jit, info


@pytest.mark.parametrize("variant", ["without_jit", "with_jit"])
def test_step_variants_agree_and_info(variant):
    shards = logistic_shards()
    surrogates = jaxsub.sgmcmc.gaussian_surrogates(np.zeros((3, 4)), np.ones((3, 4)))
    algo = jaxsub.cg_dsgld(logistic_logprior, logistic_loglik, shards, step_size=1e-3, batch_size=5,
                           local_steps=2, surrogates=surrogates, return_local_positions=True)
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
        algo = jaxsub.cg_dsgld(gaussian_logprior, gaussian_loglik, shards, step_size=1e-4, batch_size=5,
                               local_steps=2, surrogates=exact_surrogates(shards))
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
        shards=shards, loglikelihood_fn=gaussian_loglik, rng_key=jax.random.key(9), position=jnp.zeros(2),
        step_size=5e-4, batch_size=10, num_samples=num_samples, num_burnin=500, covariance=covariance, **kw)
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
        jaxsub.sgmcmc.gaussian_surrogates(shards=shards, loglikelihood_fn=ll, rng_key=jax.random.key(0),
                                          position=jnp.zeros(2), step_size=1e-3, batch_size=5, logprior_fn=lp)
    with pytest.raises(ValueError, match="covariance"):
        jaxsub.sgmcmc.gaussian_surrogates(shards=shards, loglikelihood_fn=ll, rng_key=jax.random.key(0),
                                          position=jnp.zeros(2), step_size=1e-3, batch_size=5, covariance="low")
    with pytest.raises(ValueError, match="uniform"):
        jaxsub.sgmcmc.multi_device(lp, ll, shards, shard_probs=[0.1, 0.2, 0.3, 0.4], **good)
    md = jaxsub.sgmcmc.multi_device(lp, ll, shards, chains_per_shard=2, **good)
    with pytest.raises(ValueError, match="leading chain axis of size num_shards \\* chains_per_shard = 8"):
        md.init(jnp.zeros((5, 2)))
