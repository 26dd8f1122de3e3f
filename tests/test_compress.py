"""jaxsub.compress: radius-bounded clustering, compressed log-densities, KL bound, approxKL."""

import blackjax
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_mean_matches, assert_variance_matches, variants
from scipy.special import logsumexp

import jaxsub
from jaxsub import compress
from jaxsub.compress.api import resolve_settings
from jaxsub.compress.join import join_block
from jaxsub.compress.neighbours import make_search
from jaxsub.compress.options import GREEDY, ClusterOptions
from jaxsub.compress.repair import covariances, exact_stats, repair
from jaxsub.compress.rules import stream_labels
from jaxsub.compress.screens import isolated
from jaxsub.compress.sequential import sequential_greedy, sequential_greedy_pairs
from jaxsub.compress.state import Clusters
from jaxsub.compress.trim import trim as trim_members


def _blobs(n=3000, d=4, centres=40, spread=0.02, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.uniform(-1, 1, size=(centres, d))
    return c[rng.integers(centres, size=n)] + spread * rng.standard_normal((n, d))


def _check_clustering(x, cl, delta):
    """Independent recomputation of every invariant from the labels."""
    x = np.asarray(x, np.float64) / cl.scale
    x = x[:, None] if x.ndim == 1 else x
    n = x.shape[0]
    assert cl.labels.shape == (n,) and cl.counts.sum() == n
    np.testing.assert_array_equal(np.bincount(cl.labels, minlength=cl.c), cl.counts)
    assert np.all(cl.counts > 0)
    for j in np.random.default_rng(1).choice(cl.c, size=min(cl.c, 200), replace=False):
        members = x[cl.labels == j]
        np.testing.assert_allclose(cl.centroids[j], members.mean(axis=0), rtol=0, atol=1e-12)
        radius_j = np.sqrt(((members - members.mean(axis=0)) ** 2).sum(axis=1)).max()
        # absolute slack: round-off of the two summation orders of the mean, ~eps * n_j * |x|
        np.testing.assert_allclose(
            cl.radii[j], radius_j, rtol=1e-12, atol=1e-15 * len(members) * (1 + np.abs(members).max())
        )
    # the guarantee, on every cluster, with radii recomputed from the labels
    dist = np.sqrt(((x - cl.centroids[cl.labels]) ** 2).sum(axis=1))
    assert dist.max() <= delta
    assert np.all(cl.radii <= delta) and cl.radius <= delta
    assert cl.rho == cl.c / n


@pytest.mark.parametrize("method", ["projected", "kdtree"])
@pytest.mark.parametrize("standardize", [False, True])
def test_radius_guarantee_counts_and_centroids(method, standardize):
    x = _blobs()
    delta = 0.08
    cl = compress.cluster(x, delta, method=method, standardize=standardize, key=jax.random.key(3))
    _check_clustering(x, cl, delta)
    assert cl.method == method and cl.standardized == standardize
    if standardize:
        np.testing.assert_allclose(cl.scale, np.sqrt((x**2).sum(axis=1).max()))
    else:
        assert cl.scale == 1.0
    # the blobs are well clustered: compression must actually happen
    assert cl.rho < 0.2, cl.rho


def test_clustering_is_deterministic_given_key():
    x = _blobs(n=800)
    a = compress.cluster(x, 0.1, method="projected", key=jax.random.key(7))
    b = compress.cluster(x, 0.1, method="projected", key=jax.random.key(7))
    np.testing.assert_array_equal(a.labels, b.labels)


def test_repair_splits_oversized_clusters_exactly():
    x = _blobs(n=500, spread=0.3)
    delta = 0.2
    labels = np.zeros(500, dtype=np.int64)  # one huge cluster: radius >> delta
    labels[::2] = 1
    _, _, radii0, _ = exact_stats(x, labels, 2)
    assert radii0.max() > delta
    labels, centroids, counts, radii = repair(x, labels, delta)
    assert radii.max() <= delta and counts.sum() == 500
    dist = np.sqrt(((x - centroids[labels]) ** 2).sum(axis=1))
    assert dist.max() <= delta


def test_auto_method_picks_kdtree_in_low_and_projected_in_high_dimension():
    assert compress.cluster(_blobs(n=300, d=3), 0.1).method == "kdtree"
    assert compress.cluster(_blobs(n=300, d=40), 0.1).method == "projected"


def test_supervised_by_label_multiclass():
    x = _blobs(n=2000, d=3)
    y = np.random.default_rng(2).integers(0, 4, size=2000)
    cl = compress.cluster_supervised(x, y, 0.1, standardize=True)
    assert cl.targets.shape == (cl.c,)
    for j in range(cl.c):
        assert np.all(y[cl.labels == j] == cl.targets[j])
    _check_clustering(x, cl, 0.1)
    data, targets = cl.pseudodata()
    assert data.shape == (cl.c, 3) and set(np.unique(targets)) == {0, 1, 2, 3}


def test_supervised_joint_regression():
    x = _blobs(n=1500, d=2)
    y = x @ np.array([1.0, -2.0]) + 0.01 * np.random.default_rng(0).standard_normal(1500)
    cl = compress.cluster_supervised(x, y, 0.1)
    joint = np.column_stack([x, y])
    for j in range(0, cl.c, 7):
        np.testing.assert_allclose(cl.targets[j], y[cl.labels == j].mean(), atol=1e-12)
    dist = np.sqrt(((joint - np.column_stack([cl.centroids, cl.targets])[cl.labels]) ** 2).sum(axis=1))
    assert dist.max() <= 0.1


# ----------------------------------------------------------------------------- log-densities


def _logistic_model(d):
    def logprior(w):
        return -0.5 * jnp.sum(w**2)

    def loglik(w, datum):
        x, y = datum
        logit = jnp.dot(x, w)
        return jnp.where(y == 1, jax.nn.log_sigmoid(logit), jax.nn.log_sigmoid(-logit))

    return logprior, loglik


@pytest.mark.parametrize("jit", ["without_jit", "with_jit"])
def test_tiny_radius_recovers_exact_logdensity(jit):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((400, 3)).astype(np.float32)
    y = rng.integers(0, 2, size=400).astype(np.int32)
    cl = compress.cluster_supervised(x, y, 1e-9)
    assert cl.c == 400  # delta -> 0: every point its own cluster
    logprior, loglik = _logistic_model(3)
    exact = compress.logdensity(logprior, loglik, (jnp.asarray(x), jnp.asarray(y)))
    comp = compress.logdensity(logprior, loglik, cl, second_order=False)
    w = jnp.asarray([0.3, -1.2, 0.7], jnp.float32)
    fe, fc = variants(exact)[jit], variants(comp)[jit]
    # equal up to float32 summation order (the clusters permute the data)
    np.testing.assert_allclose(fc(w), fe(w), rtol=2e-6)
    np.testing.assert_allclose(jax.grad(fc)(w), jax.grad(fe)(w), rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("jit", ["without_jit", "with_jit"])
def test_exact_duplicates_give_exact_logdensity_and_gradient(jit):
    rng = np.random.default_rng(5)
    base = rng.uniform(-1, 1, size=(60, 3))  # well separated (min distance >> delta)
    reps = rng.integers(1, 30, size=60)
    x = np.repeat(base, reps, axis=0).astype(np.float32)
    y = np.repeat(rng.integers(0, 2, size=60), reps).astype(np.int32)
    perm = rng.permutation(x.shape[0])
    x, y = x[perm], y[perm]
    cl = compress.cluster_supervised(x, y, 1e-4)
    n_unique = np.unique(np.column_stack([x, y]), axis=0).shape[0]
    assert cl.c == n_unique and cl.radius == 0.0
    logprior, loglik = _logistic_model(3)
    exact = variants(compress.logdensity(logprior, loglik, (jnp.asarray(x), jnp.asarray(y))))[jit]
    comp = variants(compress.logdensity(logprior, loglik, cl, second_order=False))[jit]
    for w in [jnp.zeros(3, jnp.float32), jnp.asarray([2.0, -1.0, 0.5], jnp.float32)]:
        np.testing.assert_allclose(comp(w), exact(w), rtol=1e-5)
        np.testing.assert_allclose(jax.grad(comp)(w), jax.grad(exact)(w), rtol=1e-4, atol=1e-3)


def test_logdensity_traces_once_and_vmaps():
    x = _blobs(n=500, d=3)
    cl = compress.cluster(x, 0.1)
    fn = compress.logdensity(
        lambda m: -0.5 * jnp.sum(m**2), lambda m, xi: -0.5 * jnp.sum((xi - m) ** 2), cl, second_order=False
    )

    @jax.jit
    @chex.assert_max_traces(n=1)
    def f(m):
        return fn(m)

    for i in range(3):
        f(jnp.full(3, float(i), jnp.float32))
    chex.clear_trace_counter()
    batch = jax.vmap(fn)(jnp.zeros((5, 3), jnp.float32))
    assert batch.shape == (5,)


# ----------------------------------------------------------------------------- HMC / NUTS on compressed data


def _regression_problem():
    rng = np.random.default_rng(11)
    x = _blobs(n=3000, d=2, centres=25, spread=0.1, seed=11)
    beta = np.array([0.8, -0.5])
    y = x @ beta + 0.1 * rng.standard_normal(3000)
    cl = compress.cluster_supervised(x, y, 0.3)
    sigma2, lam = 0.5**2, 1.0
    mu, ybar, n = cl.centroids, cl.targets, cl.counts.astype(np.float64)
    prec = np.eye(2) / lam + (mu * n[:, None]).T @ mu / sigma2
    cov = np.linalg.inv(prec)
    mean = cov @ ((n * ybar) @ mu) / sigma2
    # exact posterior, to check the compression changes something measurable
    prec_exact = np.eye(2) / lam + x.T @ x / sigma2
    mean_exact = np.linalg.solve(prec_exact, x.T @ y / sigma2)

    def logprior(b):
        return -0.5 * jnp.sum(b**2) / lam

    def loglik(b, datum):
        xi, yi = datum
        return -0.5 * (yi - jnp.dot(xi, b)) ** 2 / sigma2

    data = (jnp.asarray(cl.centroids, jnp.float32), jnp.asarray(cl.targets, jnp.float32))
    fn = compress.logdensity(logprior, loglik, compress.Pseudodata(data, cl.counts))
    return cl, fn, mean, cov, mean_exact


def test_hmc_on_compressed_linear_regression_matches_analytic_posterior(rng_key):
    cl, fn, mean, cov, mean_exact = _regression_problem()
    assert cl.rho < 0.5
    sd = np.sqrt(np.diag(cov))
    hmc = blackjax.hmc(
        fn, step_size=0.4, inverse_mass_matrix=jnp.asarray(np.diag(cov), jnp.float32), num_integration_steps=10
    )
    init = jax.vmap(hmc.init)(jnp.asarray(mean + sd * np.random.default_rng(0).standard_normal((4, 2)), jnp.float32))
    trace = jaxsub.run_chains(rng_key, hmc, init, 1500, transform=lambda s, i: s.position)
    draws = np.asarray(trace.states)[:, 200:]
    assert_mean_matches(draws, mean, min_ess=400)
    assert_variance_matches(draws, np.diag(cov), min_ess=300)
    # the same check rejects the exact posterior's mean: the test can tell the
    # compressed posterior from the exact one
    with pytest.raises(AssertionError, match="differs"):
        assert_mean_matches(draws, mean_exact, min_ess=400)


@pytest.mark.slow  # statistical (500 NUTS steps x 4 chains); the fast HMC test above checks the same posterior
def test_nuts_on_compressed_linear_regression_matches_analytic_mean(rng_key):
    cl, fn, mean, cov, _ = _regression_problem()
    nuts = blackjax.nuts(fn, step_size=0.5, inverse_mass_matrix=jnp.asarray(np.diag(cov), jnp.float32))
    init = jax.vmap(nuts.init)(jnp.asarray(np.tile(mean, (4, 1)), jnp.float32))
    trace = jaxsub.run_chains(rng_key, nuts, init, 500, transform=lambda s, i: s.position)
    assert_mean_matches(np.asarray(trace.states)[:, 50:], mean, min_ess=300)


# ----------------------------------------------------------------------------- KL bound and approxKL


def test_kl_bound_formula():
    assert compress.kl_bound(100, 0.1, 2.0, 3.0, 0.5) == pytest.approx((2 * 2 * 3 * 100 + 100 / 0.5) * 0.01)


@pytest.mark.parametrize("delta", [0.05, 0.2, 0.5])
def test_kl_bound_holds_on_a_computable_toy(delta):
    """theta on a finite grid in [-B, B], datum x in [-1, 1], log p(x | theta) = log sigmoid(theta x).

    d/dx log p = theta sigmoid(-theta x): |.| <= B (L1 = B); d2/dx2 = -theta^2 s (1 - s),
    |.| <= B^2 / 4, so log p is (B^2/4)-smooth (gamma = 4 / B^2) and its x-gradient is
    (B^2/4)-Lipschitz (L2 = B^2 / 4). Both posteriors live on the grid, so KL is exact.
    """
    bound_b = 3.0
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=300)
    cl = compress.cluster(x, delta)
    grid = np.linspace(-bound_b, bound_b, 601)

    def log_post(data, weights):
        ll = -np.logaddexp(0.0, -grid[:, None] * np.asarray(data, np.float64)[None, :]) @ weights
        return ll - logsumexp(ll)

    lp = log_post(x, np.ones(300))
    lq = log_post(cl.centroids[:, 0], cl.counts.astype(np.float64))
    kl = float(np.sum(np.exp(lp) * (lp - lq)))
    bound = compress.kl_bound(300, cl.radius, bound_b, bound_b**2 / 4, 4 / bound_b**2)
    assert 0 <= kl <= bound, (kl, bound)


def _exact_moment_samples(mean, cov, n, seed):
    """Samples whose sample mean and covariance (ddof=1) equal ``mean`` and ``cov`` exactly."""
    z = np.random.default_rng(seed).standard_normal((n, mean.size))
    z -= z.mean(axis=0)
    z = z @ np.linalg.inv(np.linalg.cholesky(np.cov(z, rowvar=False))).T
    return mean + z @ np.linalg.cholesky(cov).T


def test_gaussian_kl_is_lemma_1_on_the_sample_moments():
    rng = np.random.default_rng(3)
    d = 4
    a = rng.standard_normal((d, d))
    b = rng.standard_normal((d, d))
    s1, s2 = a @ a.T + np.eye(d), b @ b.T + 0.5 * np.eye(d)
    m1, m2 = rng.standard_normal(d), rng.standard_normal(d)
    p = _exact_moment_samples(m1, s1, 50, 0)
    q = _exact_moment_samples(m2, s2, 70, 1)
    inv2 = np.linalg.inv(s2)
    expected = 0.5 * (
        np.linalg.slogdet(s2)[1] - np.linalg.slogdet(s1)[1] - d + np.trace(inv2 @ s1) + (m1 - m2) @ inv2 @ (m1 - m2)
    )
    assert compress.gaussian_kl(p, q) == pytest.approx(expected, rel=1e-9)
    assert compress.gaussian_kl(p, p) == pytest.approx(0.0, abs=1e-9)
    diag = 0.5 * np.sum(
        np.log(np.diag(s2) / np.diag(s1)) - 1 + np.diag(s1) / np.diag(s2) + (m1 - m2) ** 2 / np.diag(s2)
    )
    assert compress.gaussian_kl(p, q, diagonal=True) == pytest.approx(diag, rel=1e-9)


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: compress.cluster(np.ones((5, 2)), 0.0), "radius"),
        (lambda: compress.cluster(np.ones((5, 2)), -1.0), "radius"),
        (lambda: compress.cluster(np.ones((5, 2)), float("nan")), "radius"),
        (lambda: compress.cluster(np.zeros((0, 2)), 0.1), "non-empty"),
        (lambda: compress.cluster(np.ones((2, 2, 2)), 0.1), "shape"),
        (lambda: compress.cluster(np.array([[0.0, np.nan]]), 0.1), "finite"),
        (lambda: compress.cluster(np.ones((5, 2)), 0.1, method="faiss"), "method"),
        (lambda: compress.cluster(np.ones((5, 2)), 0.1, method="lsh"), "method"),
        (lambda: compress.cluster(np.array([[0.0, 1.0], [np.nan, 0.0]]), 0.1), "NaN"),
        (lambda: compress.cluster(np.ones((5, 2)), 0.1, kdtree_eps=-1.0), "kdtree_eps"),
        (lambda: compress.cluster(np.ones((5, 2)), 0.1, rule="greedy"), "rule"),
        (lambda: compress.cluster_supervised(np.ones((5, 2)), np.ones(5, int), 0.1, rule="greedy"), "rule"),
        (lambda: compress.cluster(np.ones((5, 2)), 0.1, projected_dims=0), "projected_dims"),
        (lambda: compress.cluster_supervised(np.ones((5, 2)), np.ones(4, int), 0.1), "y must have shape"),
        (lambda: compress.cluster_supervised(np.ones((5, 2)), np.full(5, 0.5), 0.1, mode="by_label"), "integer"),
        (
            lambda: compress.logdensity(
                lambda t: 0.0, lambda t, x: 0.0, compress.Pseudodata(jnp.ones((3, 2)), np.ones(4))
            ),
            "leading axis",
        ),
        (
            lambda: compress.logdensity(
                lambda t: 0.0, lambda t, x: 0.0, compress.Pseudodata(jnp.ones((3, 2)), -np.ones(3))
            ),
            "non-negative",
        ),
        (lambda: compress.kl_bound(10, 0.1, 1.0, 1.0, 0.0), "gamma"),
        (lambda: compress.gaussian_kl(np.ones((5, 2)), np.ones((5, 3))), "dimension"),
        (
            lambda: compress.gaussian_kl(
                np.random.default_rng(0).random((3, 5)), np.random.default_rng(1).random((3, 5))
            ),
            "singular",
        ),
    ],
)
def test_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_kdtree_compression_has_no_floor_on_a_shuffled_stream():
    # 20,000 points in 40 tight blobs in random order: Algorithm 1 needs about one cluster
    # per blob. A search over the whole set (candidates = earlier ones among the 8 nearest)
    # opens a new cluster whenever all 8 nearest come later, ~1/9 of the points (rho ~ 0.11)
    x = _blobs(n=20000, d=4, centres=40, spread=0.005, seed=5)
    cl = compress.cluster(x, 0.08, method="kdtree")
    _check_clustering(x, cl, 0.08)
    assert cl.rho < 0.01, cl.rho


# ----------------------------------------------------------------------------- join rule: adversarial streams, compression


def _adversarial_streams():
    rng = np.random.default_rng(21)
    blobs = _blobs(n=2000, d=3, centres=30, spread=0.03, seed=21)
    outlier = np.vstack([blobs, [[50.0, -40.0, 30.0]]])
    return {
        "sorted": (np.sort(rng.uniform(-1, 1, size=(3000, 2)), axis=0), 0.1),
        "sorted_by_norm": (blobs[np.argsort(np.linalg.norm(blobs, axis=1))], 0.08),
        "duplicated": (np.repeat(blobs[:300], 7, axis=0), 0.05),
        "one_far_outlier_last": (outlier, 0.1),
        "one_far_outlier_first": (outlier[::-1], 0.1),
        "all_equal": (np.full((1500, 4), 0.3), 0.01),
        "d1": (rng.standard_normal(3000), 0.05),
        "d1_sorted": (np.sort(rng.standard_normal(3000)), 0.05),
        "d784": (_blobs(n=600, d=784, centres=10, spread=0.003, seed=22), 0.1),
        "d784_spread": (rng.uniform(0, 1, size=(400, 784)) / 8.0, 0.5),
        # a shell: every row at distance ~ 1 from the origin, radius just under the shell's size
        "shell": ((lambda v: v / np.linalg.norm(v, axis=1, keepdims=True))(rng.standard_normal((2000, 3))), 0.9),
    }


@pytest.mark.parametrize("name", sorted(_adversarial_streams()))
def test_radius_is_at_most_delta_exactly_on_adversarial_streams(name):
    x, delta = _adversarial_streams()[name]
    cl = compress.cluster(x, delta)
    _check_clustering(x, cl, delta)  # every exact radius <= delta, recomputed from the labels
    if name == "all_equal":
        assert cl.c == 1 and cl.radius == 0.0
    if name == "duplicated":
        assert cl.c <= 300


@pytest.mark.parametrize(
    "name, rule",
    [
        (n, r)
        for r in ("trim", "stream")
        for n in ("sorted", "sorted_by_norm", "duplicated", "one_far_outlier_first", "d1_sorted", "shell")
    ]
    + [(n, "blocked") for n in ("d784", "d784_spread", "duplicated", "one_far_outlier_last", "d1")],
)
def test_both_rules_keep_the_radius_on_adversarial_streams(name, rule):
    # rule="auto" picks trim for d <= 16 on sets of more than _TRIM_MIN_ROWS rows only, and the
    # blocked stream for d > 16 on sets of more than _TRIM_MIN_ROWS rows left after the isolation
    # screen; here every rule runs on adversarial streams of its own (the blocked one on d = 784
    # and on low-dimensional ones, where it takes the exact k-d-tree coordinates)
    x, delta = _adversarial_streams()[name]
    cl = compress.cluster(x, delta, rule=rule)
    _check_clustering(x, cl, delta)
    if name == "duplicated":
        assert cl.c <= 300


def _isolation_stream():
    """d = 784: tight blobs, rows spread far apart, and pairs of rows at 1.9 delta (not isolated,
    never joinable by a third row), shuffled; 1,040 rows (the tests lower _TRIM_MIN_ROWS so that
    cluster() screens isolated rows in bulk)."""
    rng = np.random.default_rng(31)
    blobs = _blobs(400, 784, 15, 0.002, 32)
    far = rng.uniform(0, 1, size=(500, 784)) / 4.0
    base = rng.uniform(0, 1, size=(70, 784)) / 4.0
    step = rng.standard_normal((70, 784))
    pair = base + 1.9 * 0.1 * step / np.linalg.norm(step, axis=1, keepdims=True)
    x = np.vstack([blobs, far, base, pair])
    return x[rng.permutation(x.shape[0])], 0.1


def test_isolation_screen_flags_only_rows_with_no_neighbour_within_two_delta():
    x, delta = _isolation_stream()
    sq = np.einsum("ij,ij->i", x, x)
    d2 = sq[:, None] + sq[None, :] - 2.0 * x @ x.T
    np.fill_diagonal(d2, np.inf)
    truly = d2.min(axis=1) > 4.0 * delta * delta * (1 + 1e-9)
    opts, method = resolve_settings(
        "projected", 784, ClusterOptions(isolation_block=256)
    )  # several blocks: the symmetric sweep
    srch = make_search(x, method, np.random.default_rng(0), wide=True, opts=opts)
    xc = x - srch.mean
    pw = xc @ srch.wide
    zw = np.column_stack([pw, np.sqrt(np.maximum(np.einsum("ij,ij->i", xc, xc) - np.einsum("ij,ij->i", pw, pw), 0.0))])
    flagged = isolated(x, zw, delta, opts=opts)
    assert not np.any(flagged & ~truly)  # never a row with a neighbour within 2 delta
    assert truly.sum() >= 450 and flagged.sum() >= 0.95 * truly.sum()  # the screen is tight here
    # negative control: the rows of the pairs (a neighbour at 1.9 delta) are never flagged
    pairs = np.flatnonzero(~truly)
    assert pairs.size >= 140 and not flagged[pairs].any()


def test_high_dimensional_stream_with_bulk_singletons_keeps_the_radius_and_compression():
    x, delta = _isolation_stream()
    opts = ClusterOptions(trim_min_rows=512, isolation_block=256)  # the bulk screen runs on sets above 512 rows
    cl = compress.cluster(x, delta, options=opts)  # d = 784: the exact-join stream after the isolation screen
    _check_clustering(x, cl, delta)
    off = opts._replace(isolation_min_fraction=2.0)  # screen off: every row streamed
    plain = compress.cluster(x, delta, options=off)  # the reference (its radius is covered by the other d = 784 tests)
    # isolated rows are singletons either way; the streamed rest is clustered alike
    assert abs(cl.c - plain.c) <= 0.01 * plain.c, (cl.c, plain.c)
    assert cl.c <= 15 + 500 + 140


def test_trim_makes_every_kept_cluster_fit_the_radius():
    # trim on a labelling that breaks the radius (the greedy leader pass, see the negative
    # control below): it drops members, and every kept cluster's exact radius is <= delta
    x, delta = _blobs(3000, 4, 40, 0.05, 3), 0.08
    opts, method = resolve_settings("kdtree", 4, None)
    labels, num = _relabel_count(stream_labels(x, delta, method, np.random.default_rng(0), opts=opts, exact=False))
    assert exact_stats(x, labels, num)[2].max() > delta
    keep = trim_members(x, np.arange(x.shape[0]), labels, delta, opts=ClusterOptions())
    assert 0 < np.count_nonzero(~keep) < x.shape[0] // 2
    for j in np.unique(labels[keep]):
        members = x[keep & (labels == j)]
        assert np.sqrt(((members - members.mean(axis=0)) ** 2).sum(axis=1)).max() <= delta
    # and the full trim rule (greedy pass, trim, join-back, recursion) differs from the stream
    trim, stream = compress.cluster(x, delta, rule="trim"), compress.cluster(x, delta, rule="stream")
    _check_clustering(x, trim, delta)
    assert not np.array_equal(trim.labels, stream.labels)


def _corpus():
    """(x, delta, c of the previous rule at commit b8c6f30, measured with cluster(x, delta) there)."""
    rng = np.random.default_rng
    return {
        "blobs4": (_blobs(3000, 4, 40, 0.02, 0), 0.08, 352),
        "blobs10": (_blobs(5000, 10, 50, 0.01, 1), 0.05, 965),
        "uniform3": (rng(2).uniform(-1, 1, (3000, 3)), 0.15, 1074),
        "gauss2": (rng(3).standard_normal((5000, 2)), 0.1, 1429),
        "line1": (rng(4).uniform(-1, 1, (2000, 1)), 0.05, 100),
        "blobs784": (_blobs(1000, 784, 20, 0.002, 6), 0.1, 215),
    }


@pytest.mark.parametrize(
    "name, rule",
    [(n, "auto") for n in sorted(_corpus())] + [(n, "stream") for n in sorted(_corpus()) if n != "blobs784"],
)
def test_join_rule_spends_the_radius(name, rule):
    # never more clusters than the previous O(d)-running-bound rule (its counts were measured
    # on the same data at commit b8c6f30), and within 1.5x of greedy leader + exact repair
    # (auto: leader + trim for the d <= 16 corpora, the exact-join stream for blobs784, so
    # "stream" is added for the others)
    x, delta, previous = _corpus()[name]
    cl = compress.cluster(x, delta, rule=rule)
    _check_clustering(x, cl, delta)
    assert cl.c <= previous, (cl.c, previous)
    opts, method = resolve_settings("auto", x.shape[1], None)
    leader = stream_labels(x, delta, method, np.random.default_rng(0), opts=opts, exact=False)
    reference = repair(x, leader, delta)[2].size
    assert cl.c <= 1.5 * reference, (cl.c, reference)
    # the clusters use the radius: the largest one is close to delta
    assert cl.radius > 0.5 * delta
    if name == "blobs784":
        # the blocked stream (rule="auto" for d > 16 when more than _TRIM_MIN_ROWS rows are left
        # to stream; here auto is the exact-join stream, 1,000 rows) keeps the radius and opens no
        # more clusters than the exact-join stream or the previous rule
        blocked = compress.cluster(x, delta, rule="blocked")
        _check_clustering(x, blocked, delta)
        assert blocked.c <= min(cl.c, previous), (blocked.c, cl.c, previous)
        assert blocked.radius > 0.5 * delta


@pytest.mark.parametrize("name", sorted(_adversarial_streams()))
def test_merge_rule_keeps_the_radius_on_adversarial_streams(name):
    # rule="merge" (vectorised merge rounds, opt-in): every exact radius <= delta on every stream,
    # low-dimensional ones through the k-d-tree graph, d = 784 through the screened graph
    x, delta = _adversarial_streams()[name]
    cl = compress.cluster(x, delta, rule="merge")
    _check_clustering(x, cl, delta)
    if name == "all_equal":  # distinct rows with weights: one cluster of radius 0
        assert cl.c == 1 and cl.radius == 0.0
    if name == "duplicated":
        assert cl.c <= 300
    again = compress.cluster(x, delta, rule="merge")
    np.testing.assert_array_equal(cl.labels, again.labels)  # deterministic


def test_merge_rounds_decide_with_the_exact_post_merge_radius():
    # the merge rounds' Gram identities give the exact post-merge radius: before the final check and
    # repair, every cluster of the rounds already has exact float64 radius <= delta (up to the float32
    # round-off the margin covers), and the radius is spent (largest radius close to delta)
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (1500, 3))
    delta = 0.15
    opts, method = resolve_settings("auto", 3, None)
    labels, num = _relabel_count(stream_labels(x, delta, method, np.random.default_rng(0), opts=opts, rule="merge"))
    radii = exact_stats(x, labels, num)[2]
    assert radii.max() <= delta and radii.max() > 0.95 * delta
    # negative control: a rounds' limit above delta is caught by the exact recomputation
    labels, num = _relabel_count(
        stream_labels(x, delta, method, np.random.default_rng(0), rule="merge", opts=opts._replace(margin=-0.2))
    )
    assert exact_stats(x, labels, num)[2].max() > delta
    # d = 784 (screened graph, float32 products)
    x = _blobs(800, 784, 200, 0.004, 8) / 30.0
    opts, method = resolve_settings("auto", 784, None)
    labels, num = _relabel_count(stream_labels(x, 0.01, method, np.random.default_rng(0), opts=opts, rule="merge"))
    assert exact_stats(x, labels, num)[2].max() <= 0.01 * (1 + 1e-6)


def test_merge_rule_counts_on_high_dimensional_data():
    # where the merge rule is meant to be used (d > 16, small clusters): never more clusters than the
    # exact-join stream or the blocked stream, within 1.5x of greedy leader + repair. (On tight blobs
    # of more rows than _MERGE_NEIGHBOURS + 1 it opens more, see docs/guides/compress.md.)
    # rows near a 4-dimensional subspace of R^784, about 1.5 rows per cluster (MNIST at delta = 0.2 has 1.7)
    rng = np.random.default_rng(9)
    basis = np.linalg.qr(rng.standard_normal((784, 4)))[0]
    x = rng.uniform(-1, 1, (1500, 4)) @ basis.T + 0.002 * rng.standard_normal((1500, 784))
    delta = 0.12
    merge = compress.cluster(x, delta, rule="merge")
    _check_clustering(x, merge, delta)
    stream, blocked = compress.cluster(x, delta, rule="stream"), compress.cluster(x, delta, rule="blocked")
    assert merge.c <= min(stream.c, blocked.c), (merge.c, stream.c, blocked.c)
    opts, method = resolve_settings("auto", 784, None)
    reference = repair(x, stream_labels(x, delta, method, np.random.default_rng(0), opts=opts, exact=False), delta)[
        2
    ].size
    assert merge.c <= 1.5 * reference, (merge.c, reference)


@pytest.mark.parametrize("name", sorted(_corpus()))
def test_merge_rule_counts_on_the_corpora(name):
    # the opt-in merge rounds (with the cross pairs of nearly complete pairs computed, so tight blobs
    # grow past the screen's 32-neighbour cap): never more clusters than the previous rule on any corpus,
    # within 1.5x of greedy leader + repair except on line1 (1-d, clusters of ~100 rows: 61 vs 32)
    x, delta, previous = _corpus()[name]
    cl = compress.cluster(x, delta, rule="merge")
    _check_clustering(x, cl, delta)
    assert cl.c <= previous, (cl.c, previous)
    if name != "line1":
        opts, method = resolve_settings("auto", x.shape[1], None)
        reference = repair(x, stream_labels(x, delta, method, np.random.default_rng(0), opts=opts, exact=False), delta)[
            2
        ].size
        assert cl.c <= 1.5 * reference, (cl.c, reference)


def test_merge_graph_threads_change_no_output():
    # The neighbour graph's blocks and product batches on two host threads give the same
    # clustering bit for bit (each block and batch is computed by the same call whichever thread runs it)
    x, delta = _adversarial_streams()["d784"]
    opts = ClusterOptions(merge_block=64, merge_batch=256)  # several blocks and batches
    base = compress.cluster(x, delta, rule="merge", options=opts)
    threaded = compress.cluster(x, delta, rule="merge", options=opts._replace(graph_threads=2))
    for name in ("labels", "centroids", "radii", "counts"):
        np.testing.assert_array_equal(getattr(threaded, name), getattr(base, name))


def _sparse_stream(n=600, d=5, delta=0.02, seed=41):
    """Rows far apart, about half with one or two companions within 1.5 delta, shuffled: the kind
    of set the greedy pass's recursion streams (most rows open a cluster, a few pairs per row)."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(-1, 1, size=(n, d))
    parts = [base]
    for k in (1, 2):
        who = rng.choice(n, size=n // (2 * k), replace=False)
        step = rng.standard_normal((who.size, d))
        parts.append(
            base[who] + rng.uniform(0, 1.5 * delta, (who.size, 1)) * step / np.linalg.norm(step, axis=1, keepdims=True)
        )
    x = np.vstack(parts)
    return x[rng.permutation(x.shape[0])]


def _greedy_stream(x, delta, pairs):
    clusters = Clusters(x.shape[1], x.shape[1], 16, lambda v: v)
    labels = np.full(x.shape[0], -1, np.int64)
    ids = sequential_greedy(
        x, np.arange(x.shape[0]), clusters, delta, GREEDY, labels, opts=ClusterOptions(greedy_pairs=pairs)
    )
    return labels, ids, clusters


def test_greedy_pair_stream_decides_as_the_plain_stream():
    # the recursion's greedy stream decides only rows with an earlier row within 2 delta, among
    # those rows' clusters (sequential_greedy_pairs): on a sparse set it must give the plain
    # one-row-at-a-time stream's clusters, sums and anchors
    delta = 0.02
    x = _sparse_stream(delta=delta)
    rows = np.arange(x.shape[0])
    taken = sequential_greedy_pairs(
        x, rows, Clusters(5, 5, 16, lambda v: v), delta, np.full(x.shape[0], -1, np.int64), opts=ClusterOptions()
    )
    assert taken is not None  # the pair path runs on this set
    lab_pairs, ids_pairs, cl_pairs = _greedy_stream(x, delta, True)
    lab_plain, ids_plain, cl_plain = _greedy_stream(x, delta, False)
    np.testing.assert_array_equal(lab_pairs, lab_plain)
    np.testing.assert_array_equal(ids_pairs, ids_plain)
    joined = cl_plain.counts[ids_plain] > 1
    assert 50 < joined.sum() < ids_plain.size - 400  # both joins and opens happen
    np.testing.assert_allclose(cl_pairs.anchor[ids_pairs], cl_plain.anchor[ids_plain], rtol=0, atol=1e-15)
    np.testing.assert_allclose(cl_pairs.sums[ids_pairs], cl_plain.sums[ids_plain], rtol=0, atol=1e-15)
    np.testing.assert_array_equal(cl_pairs.counts[ids_pairs], cl_plain.counts[ids_plain])
    # negative control: a dense set (every row near many others) is left to the plain stream
    dense = _blobs(600, 5, 3, 0.005, 7)
    assert (
        sequential_greedy_pairs(
            dense,
            np.arange(600),
            Clusters(5, 5, 16, lambda v: v),
            delta,
            np.full(600, -1, np.int64),
            opts=ClusterOptions(),
        )
        is None
    )


def test_greedy_pair_stream_keeps_the_radius_and_the_count():
    # end to end (leader + trim on 6,000 rows: tight blobs and scattered rows, whose recursion
    # streams sparse first blocks through the pair path): exact radius <= delta, and no more
    # clusters than with the plain stream
    rng = np.random.default_rng(43)
    x = np.vstack([_blobs(3000, 4, 40, 0.01, 44), rng.uniform(-1, 1, size=(3000, 4))])
    x = x[rng.permutation(x.shape[0])]
    delta = 0.05
    opts = ClusterOptions()
    # the greedy pass streams its first block (first_block rows) one row at a time: the pair path
    # takes that set (it returns None for the sets it leaves to the plain stream)
    first = np.arange(opts.first_block)
    assert (
        sequential_greedy_pairs(
            x, first, Clusters(4, 4, 16, lambda v: v), delta, np.full(x.shape[0], -1, np.int64), opts=opts
        )
        is not None
    )
    cl = compress.cluster(x, delta, rule="trim", options=opts)
    _check_clustering(x, cl, delta)
    plain = compress.cluster(x, delta, rule="trim", options=opts._replace(greedy_pairs=False))
    assert cl.c <= plain.c, (cl.c, plain.c)


@pytest.mark.parametrize("mode", [GREEDY, False])
def test_greedy_join_by_bincount_equals_the_sorted_segment_sums(mode):
    # the greedy joins (no radius check) sum each cluster's rows by one bincount per column, in
    # stream order, instead of sorting the rows into segments: the same floats, labels and anchors
    rng = np.random.default_rng(45)
    x = rng.standard_normal((3000, 6))
    rows = rng.permutation(3000)[:2000]
    cid = rng.integers(0, 150, size=rows.size)
    out = []
    for flag in (False, True):
        clusters = Clusters(6, 6, 16, lambda v: v)
        clusters.open(x[:200], np.ones(200, np.int64), np.zeros(200))
        labels = np.full(3000, -1, np.int64)
        taken = join_block(
            x, rows, cid, clusters, 0.1, mode, labels, np.arange(0), opts=ClusterOptions(greedy_bincount=flag)
        )
        assert taken.all()
        out.append((labels, clusters.sums[:200].copy(), clusters.counts[:200].copy(), clusters.anchor[:200].copy()))
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)
    assert out[1][2].sum() == 200 + rows.size  # every proposed row joined
    if mode:  # centroid mode: the anchors moved to the member means
        moved = out[1][2] > 1
        np.testing.assert_allclose(out[1][3][moved], out[1][1][moved] / out[1][2][moved, None], rtol=0, atol=0)


def test_greedy_leader_reference_is_a_leader_clustering():
    # negative control for the comparison above: the reference (exact=False) really is the
    # greedy leader pass, every row within delta of its cluster's first row, radii up to 2 delta
    x = _blobs(3000, 4, 40, 0.05, 3)
    opts, method = resolve_settings("kdtree", 4, None)
    labels = stream_labels(x, 0.08, method, np.random.default_rng(0), opts=opts, exact=False)
    first = {}
    for i, lab in enumerate(labels):
        first.setdefault(lab, i)
    leaders = np.array([first[lab] for lab in labels])
    assert np.all(np.linalg.norm(x - x[leaders], axis=1) <= 0.08)
    _, _, radii, _ = exact_stats(x, *_relabel_count(labels))
    assert radii.max() > 0.08  # greedy leader alone breaks the radius: the repair is needed


def _relabel_count(labels):
    uniq, inv = np.unique(labels, return_inverse=True)
    return inv.ravel(), uniq.size


def test_covariances_are_the_within_cluster_scatter():
    x = _blobs(2000, 3, 20, 0.05, 4)
    cl = compress.cluster(x, 0.1)
    for j in range(0, cl.c, 5):
        members = x[cl.labels == j]
        np.testing.assert_allclose(cl.covariances[j], np.cov(members.T, bias=True).reshape(3, 3), atol=1e-12)
    assert compress.cluster(_blobs(200, 80, 5, 0.01, 0), 0.2).covariances is None


def test_host_thread_settings_change_no_output(monkeypatch):
    # The covariances split over two host threads and the k-d-tree queries and isolated-row
    # self-queries on every core give the same labels, centroids, radii and covariances, bit for bit
    x = _blobs(12000, 5, 300, 0.02, 7)
    # the one-thread reference
    base = compress.cluster(
        x, 0.05, options=ClusterOptions(cov_threads=1, isolated_parallel_rows=None, parallel_query_rows=1 << 62)
    )
    threads = ClusterOptions(parallel_query_rows=0, cov_threads=2, cov_thread_min=0, isolated_parallel_rows=0)
    import concurrent.futures as cf

    calls, pool = [], cf.ThreadPoolExecutor
    monkeypatch.setattr(cf, "ThreadPoolExecutor", lambda *a, **k: calls.append(a) or pool(*a, **k))
    threaded = compress.cluster(x, 0.05, options=threads)
    assert calls  # the threaded covariances ran
    for name in ("labels", "centroids", "radii", "counts", "covariances"):
        np.testing.assert_array_equal(getattr(threaded, name), getattr(base, name))
    # negative control: a covariance entry dropped by one thread is seen by the comparison above
    cov = covariances(x, base.labels, base.centroids, base.counts, opts=ClusterOptions(cov_threads=1))
    cov[:, 0, 1] = 0.0
    assert not np.array_equal(cov, base.covariances)


# ----------------------------------------------------------------------------- second-order correction, posterior error, radius chooser


def _gaussian_linear(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.3 * rng.standard_normal(n)

    def loglik(b, datum):
        xi, yi = datum
        return -0.5 * (yi - jnp.dot(xi, b)) ** 2 / 0.09

    def logprior(b):
        return -0.5 * jnp.sum(b**2)

    return x, y, logprior, loglik


@pytest.mark.parametrize("jit", ["without_jit", "with_jit"])
def test_second_order_correction_is_exact_for_gaussian_linear_regression(jit):
    x, y, logprior, loglik = _gaussian_linear()
    cl = compress.cluster_supervised(x, y, 0.5)
    assert cl.rho < 0.5
    exact = variants(compress.logdensity(logprior, loglik, (jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))))[
        jit
    ]
    first = variants(compress.logdensity(logprior, loglik, cl, second_order=False))[jit]
    second = variants(compress.logdensity(logprior, loglik, cl, second_order=True))[jit]
    points = [jnp.asarray([0.9, -1.8, 0.4]), jnp.asarray([2.0, 1.0, -1.0])]
    for b in points if jit == "with_jit" else points[:1]:
        scale = abs(float(exact(b)))
        # float32 sums of ~3000 terms: relative round-off ~1e-6
        np.testing.assert_allclose(second(b), exact(b), rtol=2e-5)
        np.testing.assert_allclose(jax.grad(second)(b), jax.grad(exact)(b), rtol=2e-4, atol=2e-5 * scale)
        # negative control: the plain compressed log-density misses the scatter term
        assert abs(float(first(b)) - float(exact(b))) > 100 * max(abs(float(second(b)) - float(exact(b))), 2e-5 * scale)


def test_second_order_correction_removes_the_leading_error_for_logistic_regression():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3000, 3))
    y = (rng.uniform(size=3000) < jax.nn.sigmoid(x @ np.array([1.0, -2.0, 0.5]))).astype(np.int32)
    logprior, loglik = _logistic_model(3)
    exact = jax.jit(jax.grad(compress.logdensity(logprior, loglik, (jnp.asarray(x, jnp.float32), jnp.asarray(y)))))
    for delta in (0.2, 0.4):
        cl = compress.cluster_supervised(x, y, delta)
        first = jax.jit(jax.grad(compress.logdensity(logprior, loglik, cl, second_order=False)))
        second = jax.jit(jax.grad(compress.logdensity(logprior, loglik, cl, second_order=True)))
        for b in [jnp.asarray([1.0, -2.0, 0.5]), jnp.asarray([0.3, 0.3, -1.0])]:
            e1 = np.abs(np.asarray(first(b)) - np.asarray(exact(b))).max()
            e2 = np.abs(np.asarray(second(b)) - np.asarray(exact(b))).max()
            assert e2 < 0.2 * e1, (delta, e1, e2)


def test_padded_pseudodata_as_jit_arguments_equal_the_closed_over_logdensity():
    """compress.pseudodata(..., size=) padded with weight-0 rows, passed as arguments of ONE compiled
    function, gives the closed-over first/second-order value and gradient (joint and by-label)."""
    x, y, logprior, loglik = _gaussian_linear(n=600)
    lab = (y > 0).astype(np.int32)
    logprior_l, loglik_l = _logistic_model(3)
    exact = jax.value_and_grad(
        compress.logdensity(logprior, loglik, (jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)))
    )
    b = jnp.asarray([0.9, -1.8, 0.4])
    for model, clusterings, orders in (
        ((logprior, loglik), [compress.cluster_supervised(x, y, r) for r in (0.5, 0.8)], (False, True)),
        ((logprior_l, loglik_l), [compress.cluster_supervised(x, lab, r) for r in (0.5, 0.8)], (True,)),
    ):
        size = max(cl.c for cl in clusterings) + 3
        for order in orders:
            traces = []

            @jax.jit
            def value_and_grad(b, pseudo, order=order, model=model):
                traces.append(1)
                return jax.value_and_grad(compress.logdensity(*model, pseudo, second_order=order))(b)

            for cl in clusterings:
                pseudo = compress.pseudodata(cl, second_order=order, size=size)
                assert pseudo.weights.shape == (size,) and pseudo.weights[cl.c :].sum() == 0
                v, g = value_and_grad(b, jax.tree.map(jnp.asarray, pseudo))
                if model[1] is loglik and order:  # second order is exact here: compare with the full data
                    v0, g0 = exact(b)
                else:
                    v0, g0 = jax.jit(jax.value_and_grad(compress.logdensity(*model, cl, second_order=order)))(b)
                # float32 sums of <= 600 terms
                np.testing.assert_allclose(v, v0, rtol=2e-5)
                np.testing.assert_allclose(g, g0, rtol=2e-4, atol=2e-5 * abs(float(v0)))
            assert len(traces) == 1  # one compiled program serves every clustering padded to `size`
    with pytest.raises(ValueError, match="size"):
        compress.pseudodata(clusterings[0], size=1)


def test_second_order_needs_covariances():
    cl = compress.cluster(_blobs(200, 80, 5, 0.01, 0), 0.2)
    with pytest.raises(ValueError, match="covariances"):
        compress.logdensity(lambda t: 0.0, lambda t, x: 0.0, cl, second_order=True)
    with pytest.raises(ValueError, match="Clustering"):
        compress.logdensity(
            lambda t: 0.0, lambda t, x: 0.0, compress.Pseudodata(jnp.ones((3, 2)), np.ones(3)), second_order=True
        )


def test_posterior_error_in_sd_units():
    rng = np.random.default_rng(2)
    ref = _exact_moment_samples(np.array([0.0, 1.0]), np.diag([1.0, 4.0]), 400, 0)
    approx = _exact_moment_samples(np.array([0.5, 1.0 - 3.0]), np.diag([0.25, 4.0]), 300, 1)
    err = compress.posterior_error(ref, approx)
    np.testing.assert_allclose(err.mean_sd_per_dim, [0.5, 1.5], rtol=1e-12)
    np.testing.assert_allclose(err.sd_ratio_per_dim, [0.5, 1.0], rtol=1e-12)
    assert err.max_mean_sd == pytest.approx(1.5) and err.sd_ratio_min == pytest.approx(0.5)
    assert err.mean_sd == err.max_mean_sd  # the former name: the same maximum over coordinates
    with pytest.raises(ValueError, match="trailing shape"):
        compress.posterior_error(ref, rng.standard_normal((10, 3)))


def test_choose_radius_predicts_the_exact_mean_shift_for_gaussian_linear_regression():
    # with the plain compressed posterior (Gaussian, so the Laplace step is exact) the predicted
    # error is the true shift of the posterior mean in posterior sd units, computed analytically
    x, y, logprior, loglik = _gaussian_linear(n=1000, seed=3)
    data = (jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
    radii = [0.2, 0.6]
    choice = compress.choose_radius(
        logprior,
        loglik,
        data,
        lambda r: compress.cluster_supervised(x, y, r),
        radii,
        jnp.zeros(3),
        target=1e-9,
        second_order=False,
        newton_steps=3,
        on_miss="ignore",
    )
    assert choice.radii == (0.6, 0.2) and choice.radius == 0.2 and not choice.met  # nothing meets 1e-9
    for r, err in zip(choice.radii, choice.errors):
        cl = compress.cluster_supervised(x, y, r)
        n = cl.counts.astype(np.float64)
        prec = np.eye(3) + (cl.centroids * n[:, None]).T @ cl.centroids / 0.09
        mean_c = np.linalg.solve(prec, (n * cl.targets) @ cl.centroids / 0.09)
        mean_e = np.linalg.solve(np.eye(3) + x.T @ x / 0.09, x.T @ y / 0.09)
        truth = np.max(np.abs(mean_e - mean_c) / np.sqrt(np.diag(np.linalg.inv(prec))))
        assert err == pytest.approx(truth, rel=0.05, abs=1e-3), (r, err, truth)
    assert choice.errors[0] > 1.0  # the largest radius is far off without the correction
    # with the correction the compressed posterior is exact: the largest radius is chosen
    corrected = compress.choose_radius(
        logprior,
        loglik,
        data,
        lambda r: compress.cluster_supervised(x, y, r),
        radii,
        jnp.zeros(3),
        target=0.05,
        newton_steps=3,
    )
    assert corrected.radius == 0.6 and corrected.errors[0] < 0.05 and corrected.met


# ----------------------------------------------------------------------------- streaming and shards (single device)


@pytest.mark.parametrize("spill", [False, True])
def test_streaming_chunks_equal_in_memory_clustering(spill, tmp_path):
    x = _blobs(5000, 3, 30, 0.03, 8)
    path = tmp_path / "x.npy"
    np.save(path, x)
    mm = np.load(path, mmap_mode="r")
    chunks = (mm[i : i + 777] for i in range(0, len(mm), 777))
    streamed = compress.cluster_stream(chunks, 0.1, standardize=True, spill_dir=str(tmp_path) if spill else None)
    ref = compress.cluster(x, 0.1, standardize=True)
    np.testing.assert_array_equal(streamed.labels, ref.labels)
    np.testing.assert_array_equal(streamed.centroids, ref.centroids)
    assert streamed.scale == ref.scale and streamed.standardized
    _check_clustering(x, streamed, 0.1)
    if spill:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]  # spill files removed


def test_union_of_shards_keeps_the_guarantee():
    x = _blobs(4000, 3, 30, 0.03, 9)
    union = compress.cluster_shards(np.array_split(x, 5), 0.1)
    _check_clustering(x, union, 0.1)
    assert union.c >= compress.cluster(x, 0.1).c


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: compress.cluster_stream([np.ones((3, 2)), np.zeros((0, 2))], 0.1), "chunk 1 must be non-empty"),
        (lambda: compress.cluster_stream([np.ones((3, 2)), np.array([[np.nan, 1.0]])], 0.1), "chunk 1 must be finite"),
        (lambda: compress.cluster_stream([np.ones((3, 2)), np.ones((3, 3))], 0.1), "columns"),
        (lambda: compress.cluster_stream([], 0.1), "at least one chunk"),
        (lambda: compress.cluster_stream([np.ones((3, 2))], 0.0), "radius"),
        (
            lambda: compress.cluster_shards([np.ones((3, 2)), np.full((2, 2), np.inf)], 0.1),
            "shards\\[1\\] must be finite",
        ),
        (lambda: compress.cluster_shards([], 0.1), "at least one shard"),
    ],
)
def test_scale_out_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
