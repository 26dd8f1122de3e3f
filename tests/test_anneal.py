"""Tests of jaxsub.anneal: conjugate predictives, add/remove, exact invariance, priors, errors, schedules."""

from __future__ import annotations

import math
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_discrete_matches, variants
from scipy import integrate, stats

import jaxsub.anneal as an
from jaxsub.anneal import exact

MIXED = an.MixtureModel(
    an.CRP(0.8),
    [an.DirichletCategorical(3, 0.7), an.BetaBernoulli(1.5, 0.5), an.NormalInverseChiSquared(0.3, 0.5, 2.0, 0.8)],
)


# one compiled program per (model, capacity, shapes) instead of op-by-op dispatch of every primitive
_state_from_assignments = jax.jit(an.state_from_assignments, static_argnums=(0, 3))


def mixed_data(n, seed=0):
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.integers(0, 3, n), rng.integers(0, 2, n), rng.normal(size=n)])


@pytest.fixture(autouse=True, scope="module")
def fast_xla_compile():
    """Compile with XLA's backend (LLVM) optimisations off in these files (``jax_disable_most_optimizations``).

    Compilation dominates these tests (tiny problems, many distinct programs); the flag only lowers
    the LLVM optimisation level, so the programs compute the same values and XLA's HLO passes (copy
    insertion, fusion: what the no-copy tests inspect) still run. Speed is measured in
    ``benchmarks/``, never here. Imported by the other anneal/CrossCat test files.
    """
    old = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", old)


# ----------------------------------------------------------------- predictive = marginal-likelihood ratio
def _brute_log_marginal(feature, x):
    """Marginal likelihood by numerical integration over the parameters (no conjugacy used)."""
    x = np.asarray(x, np.float64)
    if isinstance(feature, an.BetaBernoulli):
        k, n = x.sum(), x.size
        val, _ = integrate.quad(
            lambda t: stats.beta.pdf(t, feature.a, feature.b) * t**k * (1 - t) ** (n - k),
            0,
            1,
            epsabs=1e-14,
            epsrel=1e-10,
        )
        return math.log(val)
    if isinstance(feature, an.DirichletCategorical):
        # 3 levels, stick-breaking coordinates: Dirichlet(a, a, a) = (v1, (1 - v1) v2, (1 - v1)(1 - v2))
        # with v1 ~ Beta(a, 2a), v2 ~ Beta(a, a) independent; integrate each stick numerically.
        assert feature.num_levels == 3
        c = np.bincount(x.astype(int), minlength=3)
        a = feature.alpha
        i1, _ = integrate.quad(
            lambda v: stats.beta.pdf(v, a, 2 * a) * v ** c[0] * (1 - v) ** (c[1] + c[2]),
            0,
            1,
            epsabs=1e-14,
            epsrel=1e-10,
            limit=200,
        )
        i2, _ = integrate.quad(
            lambda v: stats.beta.pdf(v, a, a) * v ** c[1] * (1 - v) ** c[2], 0, 1, epsabs=1e-14, epsrel=1e-10, limit=200
        )
        return math.log(i1 * i2)
    # NIX: given sigma^2, mu is Gaussian, so x ~ N(mu0 1, sigma^2 (I + 1 1^T / kappa0)) (multivariate normal,
    # no NIX formulas); integrate sigma^2 against its scaled-inverse-chi^2 prior numerically.
    f = feature
    n = x.size
    cov1 = np.eye(n) + np.ones((n, n)) / f.kappa0

    def dens(s2):
        prior = stats.invgamma.pdf(s2, f.nu0 / 2, scale=f.nu0 * f.sigma2 / 2)
        return prior * stats.multivariate_normal.pdf(x, np.full(n, f.mu0), s2 * cov1)

    val, _ = integrate.quad(dens, 0, np.inf, epsabs=1e-14, epsrel=1e-10, limit=400)
    return math.log(val)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_predictive_matches_brute_force_marginal_ratio(which):
    """log p(x | X_k) from the state = log p(X_k + x) - log p(X_k), marginals by numerical integration."""
    feature = MIXED.features[which]
    model = an.MixtureModel(an.CRP(1.0), [feature])
    data = mixed_data(7, seed=3)[:, [which]]
    enc = an.encode(model, data, jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
    state = _state_from_assignments(model, enc, jnp.asarray([0, 0, 0, 0, 1, 1, -1]), 3)
    scores = np.asarray(an.predictive_log_scores(model, state, enc.cat[6], enc.real[6]), np.float64)
    col = data[:, 0]
    for k, members in ((0, [0, 1, 2, 3]), (1, [4, 5]), (2, [])):
        want = _brute_log_marginal(feature, col[members + [6]]) - (
            _brute_log_marginal(feature, col[members]) if members else 0.0
        )
        np.testing.assert_allclose(scores[k], want, rtol=0, atol=2e-5)
        # the closed form used by the exact references agrees with the state's score to float32 accuracy
        closed = exact.log_marginal_feature(feature, col[members + [6]]) - exact.log_marginal_feature(
            feature, col[members]
        )
        np.testing.assert_allclose(closed, want, atol=1e-8)
        np.testing.assert_allclose(scores[k], closed, atol=2e-5)


def test_cluster_log_marginals_match_closed_form():
    data = mixed_data(9, seed=5)
    enc = an.encode(MIXED, data)
    z = np.array([0, 1, 0, 2, 2, 1, 0, -1, 3])
    state = _state_from_assignments(MIXED, enc, jnp.asarray(z), 5)
    want = 0.0
    for k in range(4):
        for f, feat in enumerate(MIXED.features):
            want += exact.log_marginal_feature(feat, data[z == k, f])
    np.testing.assert_allclose(float(an.mixture.cluster_log_marginals(MIXED, state)), want, rtol=1e-5)


# ----------------------------------------------------------------- add / remove
def test_add_remove_are_inverses():
    data = mixed_data(30, seed=1)
    enc = an.encode(MIXED, data)
    rng = np.random.default_rng(0)
    z = rng.integers(-1, 4, 30)
    state = _state_from_assignments(MIXED, enc, jnp.asarray(z), 6)
    add, remove = jax.jit(an.add), jax.jit(an.remove)
    for row in range(30):
        if z[row] >= 0:
            back = add(remove(state, enc, row), enc, row, int(z[row]))
        else:
            back = remove(add(state, enc, row, 5), enc, row)
        chex.assert_trees_all_equal(back.assignments, state.assignments)
        chex.assert_trees_all_equal(back.sizes, state.sizes)
        chex.assert_trees_all_equal(back.cat_counts, state.cat_counts)
        chex.assert_trees_all_close(back.real_sums, state.real_sums, atol=1e-5)
    # a removal updates the statistics exactly like rebuilding from the assignments
    r = int(np.flatnonzero(z >= 0)[0])
    z2 = z.copy()
    z2[r] = -1
    ref = _state_from_assignments(MIXED, enc, jnp.asarray(z2), 6)
    got = remove(state, enc, r)
    chex.assert_trees_all_equal(got.sizes, ref.sizes)
    chex.assert_trees_all_equal(got.cat_counts, ref.cat_counts)
    # gate=False is a no-op, and removing an unassigned row is a no-op
    chex.assert_trees_all_equal(an.remove(state, enc, r, False).sizes, state.sizes)
    u = int(np.flatnonzero(z < 0)[0])
    chex.assert_trees_all_equal(an.remove(state, enc, u).sizes, state.sizes)


# ----------------------------------------------------------------- exact invariance
def _partition_index(states):
    return {s: i for i, s in enumerate(states)}


@pytest.mark.parametrize("prior", [an.CRP(0.7), an.PitmanYor(0.5, 0.4)], ids=["crp", "pitman_yor"])
def test_gibbs_leaves_exact_posterior_invariant(prior):
    """Start chains from exact posterior draws; after Gibbs steps the law is unchanged (chi-square)."""
    model = an.MixtureModel(prior, MIXED.features)
    data = np.array([[0, 1, -1.2], [0, 1, -0.9], [2, 0, 1.1], [2, 0, 1.4], [1, 1, 0.1]])
    states, probs = exact.exact_partition_posterior(model, data)
    assert len(states) == 52  # Bell(5)
    index = _partition_index(states)
    num_chains, num_steps = 6000, 12
    rng = np.random.default_rng(11)
    start = np.asarray(states)[rng.choice(len(states), size=num_chains, p=probs)]
    algo = an.collapsed_gibbs(model, data, capacity=5)
    init_states = jax.jit(jax.vmap(algo.init))(jnp.asarray(start, jnp.int32))

    @jax.jit
    def run(keys, st):
        def body(s, k):
            s, info = jax.vmap(algo.step)(k, s)
            return s, info.overflow

        return jax.lax.scan(body, st, keys)

    keys = jax.random.split(jax.random.key(3), num_steps * num_chains).reshape(num_steps, num_chains)
    final, overflow = run(keys, init_states)
    assert not bool(np.any(overflow))
    z = np.asarray(final.mixture.assignments)
    draws = np.asarray([index[exact.canonical_labels(row)] for row in z])
    assert_discrete_matches(draws, probs)
    # the chains actually moved (otherwise the test would be vacuous)
    assert np.mean(np.any(z != start, axis=1)) > 0.5


def test_final_full_data_passes_of_every_schedule_reach_the_exact_posterior():
    """Anneal, loom (FIFO, through ``fit``), energy annealing and Sequential+Gibbs, each ending with ~15 full-data
    Gibbs passes over 4 rows, leave 4000 independent chains distributed as the enumerated posterior (chi-square)."""
    model = an.MixtureModel(an.CRP(1.0), [an.DirichletCategorical(3, 0.5), an.BetaBernoulli(0.5, 0.5)])
    data = np.array([[0, 1], [0, 1], [2, 0], [2, 0]])
    states, probs = exact.exact_partition_posterior(model, data)
    index = _partition_index(states)
    cache = an.SweepCache()  # one compiled sweep per (policy, energy ramp)
    schedules = [
        an.linear_anneal(4, 8, final_gibbs=60),
        an.loom(4, extra_passes=2, small=2, big=100, final_gibbs=60),
        an.simulated_annealing(4, 120, ramp_fraction=0.5),
        an.sequential_gibbs(4, 64),
    ]
    # ergodicity: plain full-data Gibbs from one all-in-one-cluster state also reaches it (same compiled sweep)
    from_one = an.Schedule(np.full(60, an.GIBBS, np.int8), 4, initial_size=4, name="Gibbs from one cluster")
    for k, sched in enumerate(schedules + [from_one]):
        init = np.zeros(4, np.int32) if sched is from_one else None
        res = an.fit(
            jax.random.key(20 + k),
            data,
            model,
            sched,
            num_chains=4000,
            capacity=4,
            grids=None,
            span=128,
            num_checkpoints=1,
            cache=cache,
            initial_assignments=init,
        )
        z = np.asarray(res.state.mixture.assignments)
        assert np.all(z >= 0), sched.name
        draws = np.asarray([index[exact.canonical_labels(row)] for row in z])
        assert_discrete_matches(draws, probs)


# ----------------------------------------------------------------- priors
def _all_partition_logps(n, alpha, d):
    model = an.MixtureModel(an.PitmanYor(alpha, d) if d > 0 else an.CRP(alpha), [an.BetaBernoulli()])
    parts = list(exact.enumerate_partitions(n))
    logp = []
    for z in parts:
        sizes = np.bincount(z, minlength=n).astype(np.int32)
        logp.append(float(an.log_partition_prior(model, jnp.asarray(sizes), jnp.float32(alpha), jnp.float32(d))))
    return parts, np.asarray(logp)


@pytest.mark.parametrize("alpha,d", [(1.3, 0.0), (0.6, 0.35)])
def test_partition_prior_matches_known_probabilities(alpha, d):
    n = 5
    parts, logp = _all_partition_logps(n, alpha, d)
    np.testing.assert_allclose(np.exp(logp).sum(), 1.0, rtol=1e-5)
    # all in one block: prod_{i=1}^{n-1} (i - d) / (alpha + i)
    one = np.prod([(i - d) / (alpha + i) for i in range(1, n)])
    np.testing.assert_allclose(np.exp(logp[parts.index((0,) * n)]), one, rtol=1e-5)
    # all singletons: prod_{i=1}^{n-1} (alpha + i d) / (alpha + i)
    single = np.prod([(alpha + i * d) / (alpha + i) for i in range(1, n)])
    np.testing.assert_allclose(np.exp(logp[parts.index(tuple(range(n)))]), single, rtol=1e-5)
    # number of blocks for the CRP: P(K = k) = |s(n, k)| alpha^k / rising(alpha, n)
    if d == 0.0:
        stirling1 = {1: 24, 2: 50, 3: 35, 4: 10, 5: 1}  # unsigned Stirling numbers of the first kind, n = 5
        rising = np.prod([alpha + i for i in range(n)])
        for k, s in stirling1.items():
            pk = sum(np.exp(lp) for z, lp in zip(parts, logp) if max(z) + 1 == k)
            np.testing.assert_allclose(pk, s * alpha**k / rising, rtol=1e-5)
    # the independent NumPy EPPF agrees
    ref = [exact.log_eppf(np.bincount(z), alpha, d) for z in parts]
    np.testing.assert_allclose(logp, ref, atol=2e-5)


@pytest.mark.parametrize("prior", [an.CRP(1.3), an.PitmanYor(0.6, 0.35)], ids=["crp", "pitman_yor"])
def test_prior_seating_draws_follow_partition_prior(prior):
    """ADD_PRIOR ticks (sequential seating from eq. star without likelihood) sample the EPPF."""
    n = 4
    model = an.MixtureModel(prior, [an.BetaBernoulli()])
    data = np.array([[0], [1], [1], [0]])
    parts = list(exact.enumerate_partitions(n))
    probs = np.exp([exact.log_eppf(np.bincount(z), prior.alpha, prior.discount) for z in parts])
    res = an.fit(
        jax.random.key(2),
        data,
        model,
        an.Schedule(np.full(n, an.ADD_PRIOR, np.int8), n),
        num_chains=5000,
        capacity=n,
        grids=None,
        num_checkpoints=1,
    )
    z = np.asarray(res.state.mixture.assignments)
    index = _partition_index(parts)
    assert_discrete_matches(np.asarray([index[exact.canonical_labels(r)] for r in z]), probs)


# ----------------------------------------------------------------- two urns
def test_two_urn_exact_posterior_sums_to_one_and_matches_direct_sum():
    logp = exact.two_urn_log_posterior(8, 12, 0.5, 0.45)
    np.testing.assert_allclose(np.exp(logp).sum(), 1.0, rtol=1e-12)
    # brute force: sum over all 2^20 ... too many; compare with the direct formula term by term
    a, p = 0.5, 0.45

    def direct(i, j, R=8, B=12):
        from scipy.special import betaln, comb

        return (
            math.log(comb(R, i))
            + math.log(comb(B, j))
            + (i + j) * math.log(p)
            + (20 - i - j) * math.log(1 - p)
            + betaln(a + i, a + j)
            + betaln(a + R - i, a + B - j)
        )

    grid = np.array([[direct(i, j) for j in range(13)] for i in range(9)])
    grid = np.exp(grid - grid.max())
    np.testing.assert_allclose(np.exp(logp), grid / grid.sum(), rtol=1e-10)
    mid = exact.two_urn_log_posterior(800, 1200, 0.5, 0.45)  # 1e6 cells: normalised at scale
    np.testing.assert_allclose(np.exp(mid).sum(), 1.0, rtol=1e-9)


@pytest.mark.slow
def test_two_urn_exact_posterior_is_normalised_at_the_papers_size():
    big = exact.two_urn_log_posterior(8000, 12000, 0.5, 0.45)  # 1e8 cells (Figure 2's N = 20,000)
    np.testing.assert_allclose(np.exp(big).sum(), 1.0, rtol=1e-9)


def test_two_urn_gibbs_matches_exact_posterior_small():
    """The Finite two-urn model run through the generic kernel matches the closed-form posterior."""
    R, B = 3, 4
    model = an.MixtureModel(an.Finite((0.45, 0.55)), [an.BetaBernoulli(0.5, 0.5)])
    data = np.r_[np.ones(R), np.zeros(B)][:, None]
    logp = exact.two_urn_log_posterior(R, B, 0.5, 0.45)
    res = an.fit(
        jax.random.key(9),
        data,
        model,
        an.sequential_gibbs(R + B, 40 * (R + B)),
        num_chains=4000,
        grids=None,
        num_checkpoints=1,
    )
    z = np.asarray(res.state.mixture.assignments)
    i = ((z == 0) & (data[:, 0] == 1)).sum(axis=1)
    j = ((z == 0) & (data[:, 0] == 0)).sum(axis=1)
    assert_discrete_matches(i * (B + 1) + j, np.exp(logp).ravel())


# ----------------------------------------------------------------- hyperparameters
def test_hyper_gibbs_draws_alpha_from_its_grid_conditional():
    model = an.MixtureModel(an.CRP(1.0), [an.DirichletCategorical(3, 1.0)])
    data = np.array([[0], [0], [1], [2], [2], [2], [1]])
    enc = an.encode(model, data)
    state = _state_from_assignments(model, enc, jnp.asarray([0, 0, 1, 2, 2, 2, 3]), 6)
    grid = (0.2, 0.5, 1.0, 2.0, 5.0)
    grids = an.HyperGrids(alpha=grid, dirichlet=(0.3, 1.0, 3.0))
    keys = jax.random.split(jax.random.key(0), 20000)
    out = jax.jit(jax.vmap(lambda k: an.resample_hypers(k, state, model=model, grids=grids).hypers))(keys)
    sizes = [2, 1, 3, 1]
    pa = np.exp([exact.log_eppf(sizes, a, 0.0) for a in grid])
    draws = np.searchsorted(np.asarray(grid, np.float32), np.asarray(out.alpha))
    assert_discrete_matches(draws, pa / pa.sum())
    counts = [[2, 0, 0], [0, 1, 0], [0, 0, 3], [0, 1, 0]]
    pd = np.exp(
        [
            sum(exact.log_marginal_feature(an.DirichletCategorical(3, a), np.repeat([0, 1, 2], c)) for c in counts)
            for a in (0.3, 1.0, 3.0)
        ]
    )
    draws = np.searchsorted(np.asarray([0.3, 1.0, 3.0], np.float32), np.asarray(out.cat_prior[:, 0]))
    assert_discrete_matches(draws, pd / pd.sum())
    np.testing.assert_allclose(np.asarray(out.cat_total), 3 * np.asarray(out.cat_prior[:, :1]), rtol=1e-6)


# ----------------------------------------------------------------- errors
def test_bad_hyperparameters_raise():
    with pytest.raises(ValueError, match="alpha"):
        an.CRP(0.0)
    with pytest.raises(ValueError, match="alpha"):
        an.PitmanYor(-1.0, 0.1)
    with pytest.raises(ValueError, match="discount"):
        an.PitmanYor(1.0, 1.0)
    with pytest.raises(ValueError, match="discount"):
        an.PitmanYor(1.0, -0.1)
    with pytest.raises(ValueError, match="kappa0"):
        an.NormalInverseChiSquared(kappa0=0.0)
    with pytest.raises(ValueError, match="grid discount"):
        an.HyperGrids(discount=(0.0, 1.0))


def test_mismatched_feature_types_raise():
    with pytest.raises(ValueError, match="non-integer"):
        an.encode(MIXED, mixed_data(5)[:, [2, 1, 0]])
    with pytest.raises(ValueError, match="column"):
        an.encode(MIXED, mixed_data(5)[:, :2])
    bad = mixed_data(5)
    bad[0, 1] = 2  # Bernoulli column with a third level
    with pytest.raises(ValueError, match="BetaBernoulli"):
        an.encode(MIXED, bad)
    with pytest.raises(ValueError, match="features"):
        an.MixtureModel(an.CRP(1.0), ["categorical"])
    with pytest.raises(ValueError, match="rows"):
        an.fit(jax.random.key(0), mixed_data(5), MIXED, an.linear_anneal(6, 12))


def test_capacity_overflow_raises_or_grows_without_dropping_clusters():
    model = an.MixtureModel(an.CRP(50.0), [an.DirichletCategorical(3, 0.1)])
    data = np.arange(16)[:, None] % 3
    sched = an.sequential_gibbs(16, 32)
    cache = an.SweepCache()  # one compile per capacity, shared by the three runs
    with pytest.raises(an.CapacityError, match="max_capacity"):
        an.fit(
            jax.random.key(0),
            data,
            model,
            sched,
            capacity=8,
            max_capacity=8,
            grids=None,
            num_checkpoints=2,
            cache=cache,
        )
    grown = an.fit(
        jax.random.key(0), data, model, sched, capacity=8, max_capacity=64, grids=None, num_checkpoints=2, cache=cache
    )
    roomy = an.fit(
        jax.random.key(0),
        data,
        model,
        sched,
        capacity=int(grown.trace.capacity[-1]),
        grids=None,
        num_checkpoints=2,
        cache=cache,
    )
    assert grown.trace.capacity[-1] > 8 and roomy.trace.capacity[-1] == grown.trace.capacity[-1]
    # growing and resuming reproduces the run that had enough slots from the start
    chex.assert_trees_all_equal(grown.state.mixture.assignments, roomy.state.mixture.assignments)
    # the SamplingAlgorithm reports overflow and halts instead of dropping a cluster
    algo = an.collapsed_gibbs(model, data, capacity=2)
    st = jax.jit(algo.init)(jnp.asarray(np.arange(16) % 2, jnp.int32))
    step = jax.jit(algo.step)
    flagged = False
    for i in range(200):
        new, info = step(jax.random.key(i), st)
        if bool(info.overflow):
            flagged = True
            assert bool(new.halted)
            chex.assert_trees_all_equal(new.mixture.assignments, st.mixture.assignments)
            break
        st = new
    assert flagged
    assert int(an.num_clusters(st.mixture)) == 2


# ----------------------------------------------------------------- kernels: jit / vmap
# eager execution compiles every primitive separately (~14 CPU-s): slow; the jitted variant checks the same tick
@pytest.mark.parametrize("variant", [pytest.param("without_jit", marks=pytest.mark.slow), "with_jit"])
def test_tick_jit_and_vmap(variant):
    data = mixed_data(12)
    enc = an.encode(MIXED, data)
    tick = variants(lambda k, s, c: an.tick(k, s, c, 1.0, model=MIXED, data=enc))[variant]
    st = jax.jit(lambda z: an.init(z, MIXED, enc, 8))(jnp.asarray([0, -1] + [-1] * 10))
    # eager (no-jit) execution compiles every primitive once, so it runs one tick only
    codes = [an.GIBBS] if variant == "without_jit" else [an.ADD, an.GIBBS, an.ADD_PRIOR, an.REMOVE]
    for i, code in enumerate(codes):
        st, info = tick(jax.random.key(i), st, code)
    assert int(st.num_assigned) == (1 if variant == "without_jit" else 2) and int(st.cursor) == len(codes)
    z = np.asarray(st.mixture.assignments)
    ref = _state_from_assignments(MIXED, enc, jnp.asarray(z), 8)
    chex.assert_trees_all_equal(ref.sizes, st.mixture.sizes)
    m = int(st.num_assigned)
    assert set(np.asarray(st.order[:m]).tolist()) == set(np.flatnonzero(z >= 0).tolist())
    batched = jax.jit(jax.vmap(lambda k: an.init(None, MIXED, enc, 8, rng_key=k)))(
        jax.random.split(jax.random.key(1), 3)
    )
    out, info = jax.jit(jax.vmap(lambda k, s: an.tick(k, s, an.ADD, 1.0, model=MIXED, data=enc)))(
        jax.random.split(jax.random.key(2), 3), batched
    )  # jitted: eager vmap compiles every primitive
    assert np.asarray(out.num_assigned).tolist() == [1, 1, 1]


def test_sweep_traces_once_and_fit_chains_are_consistent():
    data = mixed_data(200, seed=2)
    sched = an.linear_anneal(200, 600)
    grids = an.HyperGrids(
        alpha=(0.3, 1.0, 3.0),
        dirichlet=(0.3, 1.0, 3.0),
        beta=(0.5, 2.0),
        nix_kappa0=(0.5, 2.0),
        nix_sigma2=(0.5, 1.0, 2.0),
    )
    res = an.fit(
        jax.random.key(1),
        data,
        MIXED,
        sched,
        num_chains=3,
        capacity=64,
        num_checkpoints=3,
        test_data=mixed_data(50, seed=9),
        grids=grids,
    )
    tr = res.trace
    # one checkpoint per span, plus one per capacity growth
    assert tr.tick.shape[0] >= 3 and np.all(tr.tick[-1] == len(sched))
    cap = int(tr.capacity[-1])
    assert np.all(tr.num_assigned[-1] == 200)
    assert np.all(np.isfinite(tr.heldout)) and np.all(np.isfinite(tr.log_joint))
    enc = an.encode(MIXED, data)
    build = jax.jit(an.state_from_assignments, static_argnums=(0, 3))
    for c in range(3):
        ref = build(MIXED, enc, res.state.mixture.assignments[c], cap)
        chex.assert_trees_all_equal(ref.sizes, res.state.mixture.sizes[c])
        chex.assert_trees_all_equal(ref.cat_counts, res.state.mixture.cat_counts[c])
        chex.assert_trees_all_close(ref.real_sums, res.state.mixture.real_sums[c], atol=1e-3)
    # held-out score: the per-row predictive is a proper density over the categorical levels
    model = an.MixtureModel(an.CRP(1.0), [an.DirichletCategorical(3), an.BetaBernoulli()])
    st = _state_from_assignments(model, an.encode(model, data[:, :2]), res.state.mixture.assignments[0], cap)
    allrows = np.array([[a, b] for a in range(3) for b in range(2)])
    lp = jax.jit(an.heldout_log_predictive, static_argnums=0)(model, st, an.encode(model, allrows))
    np.testing.assert_allclose(np.exp(np.asarray(lp)).sum(), 1.0, rtol=1e-5)


# ----------------------------------------------------------------- schedules
def test_schedules_as_data():
    n = 50
    pg = an.prior_gibbs(n, 3 * n)
    assert len(pg) == 4 * n and pg.sizes()[-1] == n and pg.num_assignments == 4 * n
    sg = an.sequential_gibbs(n, 10 * n)
    assert sg.num_assignments == 10 * n and np.all(sg.sizes()[n - 1 :] == n)
    la = an.linear_anneal(n, 10 * n)
    sizes = la.sizes()
    assert la.num_assignments == 10 * n and sizes[-1] == n
    t = np.arange(1, 10 * n + 1)
    assert np.all(sizes == np.ceil(n * t / (10 * n)))
    lm = an.loom(n, extra_passes=3, small=10, big=1000, accelerate=False)
    assert lm.policy == "fifo" and lm.sizes()[-1] == n and lm.sizes().max() == n
    assert abs(lm.num_assignments / len(lm) - 4 / 7) < 0.05  # (1 + P) adds per P removes
    acc = an.loom(n, extra_passes=3, small=10, big=1000)
    assert len(acc) < len(lm)
    assert len(la.hyper_ticks()) > len(sg.hyper_ticks())
    with pytest.raises(ValueError, match="empty subsample"):
        an.Schedule(np.array([an.REMOVE]), 3)
    with pytest.raises(ValueError, match="beyond"):
        an.Schedule(np.array([an.ADD] * 4), 3)
    with pytest.raises(ValueError, match="codes"):
        an.Schedule(np.array([5]), 3)


def test_anneal_stepsize_schedule_and_its_final_passes_reach_the_exact_two_urn_posterior():
    n, g = 7, 70
    st = an.anneal_stepsize(n, g, final_gibbs=40)
    assert st.name == "Anneal Stepsize" and len(st) == n + g + 40 and st.sizes()[-1] == n
    b = st.blocks[n : n + g]
    t = np.arange(1, g + 1)
    np.testing.assert_array_equal(b, np.clip(g // t, 1, n))  # floor(1 / beta_t), beta_t = t / T, capped at N
    assert np.all(np.diff(b) <= 0) and b[0] == n and np.all(st.blocks[n + g // 2 + 1 :] == 1)
    assert np.all(st.blocks[:n] == 1)
    with pytest.raises(ValueError, match="blocks"):
        an.Schedule(np.full(3, an.ADD, np.int8), 3, blocks=np.array([1, 4, 1]))
    with pytest.raises(ValueError, match="blocks"):
        an.fit(jax.random.key(0), np.zeros((n, 1), int), an.MixtureModel(an.CRP(1.0), [an.BetaBernoulli()]), st)
    # 4000 chains of the block sampler on R = 3, B = 4: after the block-1 passes, the exact posterior
    R, B = 3, 4
    out = jax.jit(lambda k: an.two_urns.run_schedule(k, st, R, B, 0.5, 0.45, 4000))(jax.random.key(7))
    i, j = np.asarray(out.red_left), np.asarray(out.blue_left)
    assert_discrete_matches(i * (B + 1) + j, np.exp(exact.two_urn_log_posterior(R, B, 0.5, 0.45)).ravel())
    # negative control: the same sampler with the wrong urn probability is rejected
    bad = jax.jit(lambda k: an.two_urns.run_schedule(k, st, R, B, 0.5, 0.2, 4000))(jax.random.key(7))
    with pytest.raises(AssertionError, match="chi-square"):
        assert_discrete_matches(
            np.asarray(bad.red_left) * (B + 1) + np.asarray(bad.blue_left),
            np.exp(exact.two_urn_log_posterior(R, B, 0.5, 0.45)).ravel(),
        )


def test_two_urn_block_tick_picks_the_ball_with_exact_integer_arithmetic():
    """``two_urns.block_tick`` picks its ball with ``moves.uniform_index`` (words 0-1), not a float floor: at the
    paper's N = 20,000 balls (R = 12,000, B = 8,000; 5,000 red balls on the left, none blue) with the urn word 0
    (always left), the moved colour / urn tells the ball's region [0, 5000) / [5000, 12000) / [12000, 20000); on
    random words and on the two words either side of each region boundary (``W_b - 1`` and ``W_b``, ``W_b`` =
    ``ceil(b 2^64 / N)``) the region is the one of Python's exact ``(W N) >> 64``. Negative control: the old
    ``floor(u N)`` of word 0 cannot tell ``W_b - 1`` from ``W_b`` and misplaces some of them."""
    R, B, n, k = 12_000, 8_000, 20_000, 5_000
    rng = np.random.default_rng(1)
    words = [tuple(int(x) for x in rng.integers(0, 2**32, 2, dtype=np.uint64)) for _ in range(200)]
    for b in (k, R):
        for wb in (-(-(b << 64) // n) - 1, -(-(b << 64) // n)):
            words.append((wb >> 32, wb & 0xFFFFFFFF))
    w = np.asarray([[w0, w1, 0] for w0, w1 in words], np.uint32)
    exact_ball = np.asarray([((w0 << 32 | w1) * n) >> 64 for w0, w1 in words])
    assert set(exact_ball[-4:]) == {k - 1, k, R - 1, R}
    want = np.where(exact_ball < k, 0, np.where(exact_ball < R, 1, 2))
    st = an.two_urns.UrnCounts(jnp.int32(k), jnp.int32(0))
    out = jax.jit(jax.vmap(lambda u: an.two_urns.block_tick(u, st, 1, num_red=R, num_blue=B, alpha=0.5, p_left=0.5)))(
        jnp.asarray(w)
    )
    red, blue = np.asarray(out.red_left), np.asarray(out.blue_left)
    got = np.where(red == k + 1, 1, np.where(blue == 1, 2, 0))
    assert np.all((red == k) | (red == k + 1)) and np.all(blue <= 1) and np.all((red == k + 1) + (blue == 1) <= 1)
    np.testing.assert_array_equal(got, want)
    old_ball = np.minimum(
        np.floor(np.asarray(an.moves.bits_to_uniform(jnp.asarray(w[:, 0]))) * np.float32(n)), n - 1
    ).astype(int)
    old = np.where(old_ball < k, 0, np.where(old_ball < R, 1, 2))
    assert np.any(old[-4:] != want[-4:])  # negative control: the float floor misplaces a boundary word


def test_fifo_policy_visits_rows_in_order():
    """loom's FIFO churn: the k-th add takes row order[k mod N], the k-th remove the oldest, order[k mod N]."""
    n = 12
    enc = an.encode(MIXED, mixed_data(n))
    lm = an.loom(n, extra_passes=2, small=4, big=100)
    sched = lm.then(an.Schedule(np.full(2 * n, an.GIBBS, np.int8), n, initial_size=n))  # two full FIFO Gibbs passes
    st0 = jax.jit(lambda k: an.init(None, MIXED, enc, 16, rng_key=k, policy="fifo"))(jax.random.key(3))

    @jax.jit
    def run(st, codes, keys):
        def body(s, xs):
            s, info = an.tick(xs[1], s, xs[0], 1.0, model=MIXED, data=enc, policy="fifo")
            window = (s.head + jnp.arange(n)) % n  # positions of the subsample in the cycle
            inside = jnp.arange(n) < s.num_assigned
            ok = jnp.all(
                jnp.where(
                    inside, s.mixture.assignments[s.order[window]] >= 0, s.mixture.assignments[s.order[window]] < 0
                )
            )
            return s, (info.removed_row, info.added_row, ok)

        return jax.lax.scan(body, st, xs=(codes, keys))

    out, (removed, added, window_ok) = run(
        st0, jnp.asarray(sched.codes, jnp.int32), jax.random.split(jax.random.key(4), len(sched))
    )
    order = np.asarray(st0.order)
    assert sorted(order.tolist()) == list(range(n)) and not np.array_equal(order, np.arange(n))  # a shuffled cycle
    rem, add = np.asarray(removed), np.asarray(added)
    rem, add = rem[rem >= 0], add[add >= 0]
    assert len(add) == sched.num_assignments and len(rem) == len(add) - n
    np.testing.assert_array_equal(add, order[np.arange(len(add)) % n])
    np.testing.assert_array_equal(rem, order[np.arange(len(rem)) % n])
    assert np.all(np.asarray(window_ok))  # the subsample is always the window of the cycle after the head
    assert np.all(np.asarray(out.mixture.assignments) >= 0) and int(out.num_assigned) == n


def _while_bodies(hlo: str) -> list[str]:
    """Text of every while-loop body computation in compiled HLO text."""
    comps, name, lines = {}, None, []
    for line in hlo.splitlines():
        m = re.match(r"^(?:ENTRY )?%(\S+) ", line)
        if m and line.rstrip().endswith("{"):
            name, lines = m.group(1), []
        elif line.startswith("}") and name is not None:
            comps[name], name = "\n".join(lines), None
        elif name is not None:
            lines.append(line)
    bodies = set(re.findall(r"\bwhile\(.*?body=%([\w.\-]+)", hlo))
    return [comps[b] for b in bodies if b in comps]


@pytest.mark.parametrize("policy", ["random", "fifo"])
def test_sweep_equals_ticks_and_does_no_per_tick_copy_of_row_arrays(policy):
    n = 30
    data = mixed_data(n, seed=5)
    enc = an.encode(MIXED, data)
    sched = (
        an.linear_anneal(n, 3 * n)
        if policy == "random"
        else an.loom(n, extra_passes=2, small=5, big=100, accelerate=False)
    )
    span = 40
    sweep = jax.jit(chex.assert_max_traces(an.build_sweep(MIXED, policy=policy, span=span), n=1))
    states = jax.jit(jax.vmap(lambda k: an.init(None, MIXED, enc, 32, rng_key=k, policy=policy)))(
        jax.random.split(jax.random.key(0), 2)
    )
    keys = jax.random.split(jax.random.key(1), 2)
    windows = jnp.asarray(an.sweep.schedule_windows(sched.codes, np.asarray(states.cursor), span))
    out = sweep(states, keys, windows, enc)
    # the compiled sweep traces once for repeated spans (new windows, new cursors)
    later = out
    for _ in range(2):
        w = jnp.asarray(an.sweep.schedule_windows(sched.codes, np.asarray(later.cursor), span))
        later = sweep(later, keys, w, enc)
    assert np.all(np.asarray(later.cursor) == min(len(sched), 3 * span))
    chex.clear_trace_counter()
    # reference: the same ticks one by one (writes applied immediately), same uniforms
    tick = jax.jit(lambda u, s, c: an.moves._tick_uniforms(u, s, c, 1.0, model=MIXED, data=enc, policy=policy)[0])
    for c in range(2):
        st = jax.tree.map(lambda x: x[c], states)
        for t in range(span):
            u = jax.random.bits(jax.random.fold_in(keys[c], t), (an.moves.TICK_WORDS,), jnp.uint32)
            st = tick(u, st, jnp.int32(sched.codes[t]))
        chex.assert_trees_all_equal(st, jax.tree.map(lambda x: x[c], out))
    # O(1) per tick: no whole-array copy of the [chains, N] order/assignments inside the scan
    hlo = sweep.lower(states, keys, windows, enc).compile().as_text()
    bodies = _while_bodies(hlo)
    assert bodies
    for body in bodies:
        assert not re.search(rf"s32\[2,{n}\]\{{[^}}]*\}} copy\(", body), "per-tick O(N) copy in the sweep loop"


def test_uniform_index_is_exact_integer_arithmetic_and_fixes_the_float_floor_bias():
    """The ticks' and prior draws' integer picks (``moves.uniform_index``): ``floor(W m / 2^64)`` of two uint32
    words equals Python's exact integer result (random and extreme words, ``m`` up to ``2^31 - 1``), and is
    uniform where ``floor(u m)`` with a float32 uniform is not: at ``m = 5,592,405 ~ 2^23 / 1.5`` the float floor
    puts ~1/3 of the picks on even indices (its grid and rounding), the exact pick 1/2 (z-test, 50,000 picks;
    negative control: the old float floor is rejected by the same test)."""
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**32, (400, 2), dtype=np.uint64).astype(np.uint32)
    words[:4] = [[0, 0], [0xFFFFFFFF, 0xFFFFFFFF], [0xFFFFFFFF, 0], [0, 0xFFFFFFFF]]
    ms = np.asarray([1, 2, 3, 6, 875, 300_007, 5_592_405, 2**24 - 3, 2**31 - 1], np.int32)
    got = np.asarray(
        jax.jit(jax.vmap(jax.vmap(an.moves.uniform_index, (None, 0)), (0, None)))(jnp.asarray(words), jnp.asarray(ms))
    )
    want = np.asarray([[((int(w0) << 32 | int(w1)) * int(m)) >> 64 for m in ms] for w0, w1 in words])
    np.testing.assert_array_equal(got, want)
    assert np.all(got < ms[None, :]) and int(an.moves.uniform_index(jnp.asarray(words[1]), 0)) == 0
    m, n = 5_592_405, 50_000
    w = jax.random.bits(jax.random.key(7), (n, 2), jnp.uint32)
    exact_pick = np.asarray(an.moves.uniform_index(w, m))
    float_pick = np.asarray(jnp.floor(an.moves.bits_to_uniform(w[:, 0]) * jnp.float32(m)).astype(jnp.int32))

    def z_even(x):  # (even picks - n / 2) / sd under a uniform pick (m odd: P(even) = 1/2 + 1/(2m))
        return (np.sum(x % 2 == 0) - n / 2) / math.sqrt(n / 4)

    assert abs(z_even(exact_pick)) < 4.5
    assert abs(z_even(float_pick)) > 4.5  # negative control: the old mapping is caught
