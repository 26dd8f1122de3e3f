"""jaxsub.discrete: exact Gumbel-max, racing (normal / EBS, pairwise / marginal), lil'UCB.

Statistical checks compare the empirical law of many independent draws with
the exact p(x) (float64 sums): a sampler with error level delta must be within
delta in total variation (Prop. 1), plus the Monte Carlo tolerance of
``helpers.tv_tolerance`` (false-alarm probability 1e-4 per check). Every
problem is chosen so that the samplers do eliminate arms (mean evaluations well
below N * D, asserted), otherwise the TV check would be vacuous.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from discrete_problems import (
    SMALL_D,
    SMALL_N,
    SMALL_OPTIONS,
    exact_probs,
    factor_fn,
    reward_table,
    small_racing,
    small_racing_jitted,
)
from helpers import assert_discrete_matches, assert_tv_within, tv_tolerance

import jaxsub
from jaxsub import discrete

NUM_DRAWS = 20_000


def draw(sample, rng_key, log_f0, num_draws=NUM_DRAWS, jit=True):
    keys = jax.random.split(rng_key, num_draws)
    fn = jax.vmap(sample, in_axes=(0, None))
    if jit:
        fn = jax.jit(fn)
    x, info = fn(keys, log_f0)
    return np.asarray(x), jax.tree.map(np.asarray, info)


def check_budget(info, N, D):
    assert np.all(info.num_evaluations <= N * D)
    assert np.all(info.num_evaluations >= 0)
    assert np.all(info.num_data_used <= N)
    assert not info.has_nan.any()


# --------------------------------------------------------------------------- exact sampler


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_gumbel_max_matches_softmax(rng_key, dtype):
    probs = np.array([0.05, 0.4, 0.25, 0.2, 0.1])
    N, D = 3000, probs.size
    table = reward_table(probs, N, sigma=0.05, seed=1)
    log_f0 = np.array([0.3, -0.2, 0.0, 0.1, -1.0])
    p = exact_probs(table, log_f0)
    with jax.enable_x64(dtype == jnp.float64):
        sample = discrete.gumbel_max(factor_fn(table, dtype), D, N, block_size=700)  # last block masked
        weights = discrete.exact_log_weights(factor_fn(table, dtype), D, N, jnp.asarray(log_f0, dtype), block_size=700)
        np.testing.assert_allclose(
            np.asarray(jax.nn.softmax(weights), np.float64), p, rtol=1e-4 if dtype == jnp.float32 else 1e-10
        )
        x, info = draw(sample, rng_key, jnp.asarray(log_f0, dtype))
    assert_discrete_matches(x, p)
    assert np.all(info.num_evaluations == N * D) and info.is_exact.all()


def test_relative_block_sum_layouts_agree():
    """The exact sums run on the transpose for <= TRANSPOSED_SUM_MAX_K columns and on [m, k] above
    it (a measured speed choice): both give sum_n (r[n, i] - r[n, 0]) over the valid rows, with a
    -inf entry making its column -inf and a NaN its column NaN (no compile of a sampler)."""
    from jaxsub.racing.exact import TRANSPOSED_SUM_MAX_K, relative_block_sum

    k_small, k_big = TRANSPOSED_SUM_MAX_K, TRANSPOSED_SUM_MAX_K + 8
    rng = np.random.default_rng(3)
    r = rng.normal(size=(37, k_big)).astype(np.float32)
    r[5, 3], r[9, 7], r[30, 2] = -np.inf, np.nan, np.nan  # row 30 is masked: its NaN must not count
    valid = (np.arange(37) < 30)[:, None]
    expected = (r[:30].astype(np.float64) - r[:30, :1]).sum(axis=0)
    for k in (k_small, k_big):
        got = np.asarray(relative_block_sum(jnp.asarray(r[:, :k]), jnp.asarray(valid)), np.float64)
        np.testing.assert_allclose(got, expected[:k], rtol=1e-5, atol=1e-4)  # -inf / NaN positions equal


def test_exact_sums_stable_in_float32_for_large_n():
    """N = 2^23 float32 rewards of magnitude ~2 whose sums differ by O(1): the
    centred, Kahan-compensated float32 sums match the float64 sums of the same
    float32 values to 0.05, and the exact racing path decides like float64."""
    N, D = 2**23, 2

    def fn(idx):
        t = idx.astype(jnp.float32)
        b = jnp.sin(jnp.float32(0.001) * t) + 1.5  # strongly positive common component
        c = jnp.cos(jnp.float32(0.37) * t)
        return jnp.stack([b, b + c + 2.0 / N], axis=1)

    values = np.asarray(jax.jit(fn)(jnp.arange(N, dtype=jnp.int32)), np.float64)
    gap = float(values[:, 1].sum() - values[:, 0].sum())
    naive = np.cumsum(values.astype(np.float32), axis=0, dtype=np.float32)[-1]
    naive_error = abs(float(naive[1]) - float(naive[0]) - gap)
    w = jax.jit(lambda f0: discrete.exact_log_weights(fn, D, N, f0, block_size=1 << 16))(jnp.zeros(D, jnp.float32))
    error = abs(float(w[1] - w[0]) - gap)
    assert error < 0.05 and error < naive_error / 10, (error, naive_error)
    sample = discrete.racing(fn, D, N, delta=0.1, exact=True, gumbel_noise=False, max_block_size=1 << 16)
    for shift, expected in ((-0.5, 0), (0.5, 1)):
        x, info = jax.jit(sample)(jax.random.key(0), jnp.array([0.0, -gap + shift], jnp.float32))
        assert int(x) == expected and bool(info.is_exact)


# --------------------------------------------------------------------------- racing: TV within delta

RACING_CASES = {
    # name: (dist, probs, sigma, delta, options)
    "normal_pairwise": ("normal", [0.1, 0.35, 0.3, 0.15, 0.1], 4e-3, 0.05, dict(bound="normal", variance="pairwise")),
    "normal_marginal": ("normal", [0.1, 0.35, 0.3, 0.15, 0.1], 4e-3, 0.05, dict(bound="normal", variance="marginal")),
    "heavy_tailed_lognormal": (
        "lognormal",
        [0.1, 0.35, 0.3, 0.15, 0.1],
        4e-3,
        0.05,
        dict(bound="normal", variance="pairwise"),
    ),
    "two_states": ("normal", [0.3, 0.7], 1e-2, 0.05, dict(bound="normal", variance="pairwise")),
    "uniform_ebs": ("uniform", [0.2, 0.5, 0.3], 1e-3, 0.05, dict(bound="ebs", variance="pairwise")),
}


#: Chunk cap for the statistical tests: chunking changes neither the statistics nor the
#: law (only the float summation order), and two chunk sizes (50, 200) compile fewer loops.
TEST_BLOCK = 200
_DRAW_CACHE: dict = {}


def _table_draws(rng_key, table, num_draws=NUM_DRAWS, **opts):
    """Draws of ``racing`` on ``table`` (a jit argument, so tables of one shape and one
    configuration share a compiled sampler); cached per (table, options) within the module."""
    table = np.asarray(table, np.float32)
    cache_key = (table.tobytes(), table.shape, num_draws, repr(sorted(opts.items())), str(jax.random.key_data(rng_key)))
    if cache_key not in _DRAW_CACHE:
        fn_key = (table.shape, num_draws, repr(sorted((k, v) for k, v in opts.items() if k != "reward_range")))
        run = _DRAW_CACHE.setdefault(("fn",) + fn_key, _draw_fn(table.shape, num_draws, opts))
        crange = opts.get("reward_range")
        out = run(rng_key, jnp.asarray(table), jnp.asarray(0.0 if crange is None else crange, jnp.float32))
        _DRAW_CACHE[cache_key] = (np.asarray(out[0]), jax.tree.map(np.asarray, out[1]))
    return _DRAW_CACHE[cache_key]


def _draw_fn(shape, num_draws, opts):
    N, D = shape
    opts = {k: v for k, v in opts.items() if k != "reward_range"}
    ebs = opts.get("bound") == "ebs"

    @jax.jit
    def run(rng_key, table, crange):
        sample = discrete.racing(lambda idx: table[idx], D, N, reward_range=crange if ebs else None, **opts)
        keys = jax.random.split(rng_key, num_draws)
        return jax.vmap(sample, in_axes=(0, None))(keys, jnp.zeros(D, jnp.float32))

    return run


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n == "heavy_tailed_lognormal" else n for n in sorted(RACING_CASES)],
)
def test_racing_within_delta_in_tv(rng_key, name):
    dist, probs, sigma, delta, opts = RACING_CASES[name]
    N, D = 4000, len(probs)
    table = reward_table(probs, N, sigma, dist=dist, seed=2)
    if opts.get("bound") == "ebs":
        opts = dict(opts, reward_range=table.max(axis=0) - table.min(axis=0))
    x, info = _table_draws(rng_key, table, delta=delta, max_block_size=TEST_BLOCK, **opts)
    check_budget(info, N, D)
    frac = info.num_evaluations.mean() / (N * D)
    assert frac < 0.8, f"racing evaluated {frac:.2f} of the rewards: test would be vacuous"
    assert_tv_within(x, exact_probs(table), slack=delta)


def test_exact_pass_taken_exact_in_its_draws_and_within_delta(rng_key):
    """``exact_pass_cost``: a race still running at T >= N/4 reads all N data in
    order for its survivors. Draws that ended earlier are the same draws as
    without the pass; draws that took it are exact and cost at most N * D."""
    probs = [0.1, 0.35, 0.3, 0.15, 0.1]
    N, D, delta = 4000, 5, 0.05
    table = reward_table(probs, N, 4e-3, seed=2)
    # (the same table and sampler as test_racing_within_delta_in_tv[normal_pairwise]: shared draws)
    x, info = _table_draws(rng_key, table, delta=delta, max_block_size=TEST_BLOCK, bound="normal", variance="pairwise")
    x0, info0 = _table_draws(
        rng_key,
        table,
        delta=delta,
        max_block_size=TEST_BLOCK,
        bound="normal",
        variance="pairwise",
        exact_pass_cost=None,
    )
    check_budget(info, N, D)
    # Stages end at T = 50, 100, ..., 1600, 3200, 4000: the stage 1600 -> 3200 is
    # the first adding >= N / 4 random data, so races alive at T = 1600 take the pass.
    # (A race with all 5 arms alive there stays random: the pass would push its
    # count past N * D; it then continues exactly as without the pass.)
    took = info.is_exact & (info.num_stages == 7)
    assert 0.05 < took.mean() < 0.95, took.mean()
    assert np.all(info0.num_data_used[took] > 1600)
    np.testing.assert_array_equal(x[~took], x0[~took])
    np.testing.assert_array_equal(info.num_evaluations[~took], info0.num_evaluations[~took])
    np.testing.assert_array_equal(info.num_data_used[~took], info0.num_data_used[~took])
    assert np.all(info.num_data_used[took] == N)
    # The pass reads N data for every survivor on top of the race's count.
    assert np.all(info.num_evaluations[took] >= N * info.num_alive[took])
    assert_tv_within(x, exact_probs(table), slack=delta)
    # Racing to the end at random instead: the same law within delta.
    assert_tv_within(x0, exact_probs(table), slack=delta)


@pytest.mark.slow  # about a minute
def test_exact_pass_finds_zero_factor_of_a_survivor(rng_key):
    """A single -inf factor of the best arm, at a datum the race rarely reaches,
    makes that arm impossible: the pass must see it (column sum -inf)."""
    probs = [0.2, 0.5, 0.3]
    N, D = 4000, 3
    table = reward_table(probs, N, 4e-3, seed=5)
    table[N - 1, 1] = -np.inf
    target = np.array([0.4, 0.0, 0.6])
    # exact_pass_cost=0.01: races alive after their first stage take the pass.
    sample = discrete.racing(factor_fn(table), D, N, delta=0.05, exact_pass_cost=0.01, max_block_size=TEST_BLOCK)
    x, info = draw(sample, rng_key, jnp.zeros(D, jnp.float32), num_draws=4000)
    assert not info.has_nan.any()
    assert np.sum(target > 0) == 2  # arm 1 is impossible
    took = info.is_exact
    assert took.mean() > 0.1  # (races with all 3 arms alive stay random: count <= N * D)
    assert not np.any(x[took] == 1)
    # Without the pass the race would return the impossible arm 1 in most draws.
    sample0 = discrete.racing(factor_fn(table), D, N, delta=0.05, exact_pass_cost=None, max_block_size=TEST_BLOCK)
    x0, _ = draw(sample0, rng_key, jnp.zeros(D, jnp.float32), num_draws=4000)
    assert np.mean(x0 == 1) > 0.2


@pytest.mark.slow
def test_racing_correlated_arms_pairwise_beats_marginal(rng_key):
    """Strongly correlated arms: pairwise variances need far fewer evaluations."""
    probs = [0.2, 0.5, 0.3]
    N, D = 4000, 3
    table = reward_table(probs, N, sigma=0.05, seed=3, correlated=0.999)
    out = {}
    for variance in ("pairwise", "marginal"):
        sample = discrete.racing(factor_fn(table), D, N, delta=0.05, variance=variance)
        x, info = draw(sample, rng_key, jnp.zeros(D, jnp.float32), num_draws=5000)
        check_budget(info, N, D)
        assert_tv_within(x, exact_probs(table), slack=0.05)
        out[variance] = info.num_evaluations.mean()
    assert out["pairwise"] < 0.5 * out["marginal"], out


def test_lil_ucb_within_delta_in_tv(rng_key):
    probs = [0.2, 0.5, 0.3]
    N, D = 2000, 3
    table = reward_table(probs, N, sigma=2e-4, dist="uniform", seed=4)
    C = float((table.max(axis=0) - table.min(axis=0)).max())
    sample = discrete.lil_ucb(factor_fn(table), D, N, delta=0.05, reward_range=C, batch_size=8)
    x, info = draw(sample, rng_key, jnp.zeros(D, jnp.float32), num_draws=4000)
    check_budget(info, N, D)
    assert info.num_evaluations.mean() < 0.8 * N * D
    assert_tv_within(x, exact_probs(table), slack=0.05)


@pytest.mark.parametrize("variance", ["pairwise", pytest.param("marginal", marks=pytest.mark.slow)])
def test_compact_states_path_matches_full_path(rng_key, variance):
    """With log_factor_states_fn, racing evaluates only the <= K surviving arms; the
    statistics are the same, so every draw and every count must agree with the
    all-D path (same keys)."""
    probs = np.exp(-0.3 * np.arange(8))
    N, D = 2000, 8
    table = reward_table(probs / probs.sum(), N, 3e-3, seed=15)
    t = jnp.asarray(table, jnp.float32)
    calls = []

    def states_fn(idx, states):
        calls.append(states.shape)
        return t[idx[:, None], states[None, :]]

    fast = dict(max_block_size=50, exact_pass_cost=None)  # one loop per level to compile; same on both paths
    full = discrete.racing(factor_fn(table), D, N, delta=0.05, variance=variance, **fast)
    compact = discrete.racing(
        factor_fn(table),
        D,
        N,
        delta=0.05,
        variance=variance,
        log_factor_states_fn=states_fn,
        num_compact_states=3,
        **fast,
    )
    xa, ia = draw(full, rng_key, jnp.zeros(D, jnp.float32), num_draws=2000)
    xb, ib = draw(compact, rng_key, jnp.zeros(D, jnp.float32), num_draws=2000)
    assert calls and all(c == (3,) for c in calls)
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ia.num_evaluations, ib.num_evaluations)
    assert ia.num_evaluations.mean() < 0.5 * N * D
    assert_tv_within(xb, exact_probs(table), slack=0.05)


@pytest.mark.slow  # one to two minutes
def test_column_compaction_matches_states_path(rng_key):
    """Without log_factor_states_fn and D >= 32, once at most K = D // 4 arms survive
    only their columns enter the pairwise co-moments: the statistics equal those of
    the log_factor_states_fn path with K = D // 4, so draws and counts agree exactly."""
    probs = np.exp(-0.15 * np.arange(40))
    N, D = 2000, 40
    table = reward_table(probs / probs.sum(), N, 3e-3, seed=16)
    t = jnp.asarray(table, jnp.float32)
    calls = []

    def states_fn(idx, states):
        calls.append(states.shape)
        return t[idx[:, None], states[None, :]]

    fast = dict(max_block_size=50, exact_pass_cost=None)  # one loop per level to compile; same on every path
    columns = discrete.racing(factor_fn(table), D, N, delta=0.05, **fast)
    states = discrete.racing(
        factor_fn(table), D, N, delta=0.05, log_factor_states_fn=states_fn, num_compact_states=D // 4, **fast
    )
    xa, ia = draw(columns, rng_key, jnp.zeros(D, jnp.float32), num_draws=2000)
    xb, ib = draw(states, rng_key, jnp.zeros(D, jnp.float32), num_draws=2000)
    assert calls and all(c == (D // 4,) for c in calls)
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ia.num_evaluations, ib.num_evaluations)
    assert ia.num_evaluations.mean() < 0.5 * N * D
    assert_tv_within(xa, exact_probs(table), slack=0.05)
    # Two compaction levels (D // 4 = 10, then K = 2): the same draws again.
    from jaxsub.racing.compaction import compaction_levels

    assert compaction_levels(D, 2) == [10, 2]
    calls.clear()
    levels = discrete.racing(
        factor_fn(table), D, N, delta=0.05, log_factor_states_fn=states_fn, num_compact_states=2, **fast
    )
    xc, ic = draw(levels, rng_key, jnp.zeros(D, jnp.float32), num_draws=2000)
    assert set(calls) == {(10,), (2,)}
    np.testing.assert_array_equal(xa, xc)
    np.testing.assert_array_equal(ia.num_evaluations, ic.num_evaluations)
    np.testing.assert_array_equal(ia.num_data_used, ic.num_data_used)


# --------------------------------------------------------------------------- exact path, MH mode


def test_exact_option_uses_all_data_and_tiny_delta_is_exact_in_law(rng_key):
    probs = [0.1, 0.35, 0.3, 0.15, 0.1]
    N, D = 600, 5
    table = reward_table(probs, N, 4e-3, seed=5)
    # max_block_size=50: one chunk-size loop per sampler (fewer loops to compile; chunking changes no statistic)
    x, info = draw(
        discrete.racing(factor_fn(table), D, N, delta=0.5, exact=True, max_block_size=50),
        rng_key,
        jnp.zeros(D, jnp.float32),
        5000,
    )
    assert info.is_exact.all() and np.all(info.num_data_used == N)
    assert_discrete_matches(x, exact_probs(table))
    # delta -> 0: B_Normal grows (about 37 at 1e-300) and only overwhelming gaps eliminate.
    x, info = draw(
        discrete.racing(factor_fn(table), D, N, delta=1e-300, max_block_size=50),
        rng_key,
        jnp.zeros(D, jnp.float32),
        5000,
    )
    assert info.is_exact.mean() > 0.5
    assert_discrete_matches(x, exact_probs(table))


@pytest.mark.parametrize("control_variate", [False, True])
def test_mh_mode_without_gumbel_noise(rng_key, control_variate):
    """Racing MH (eq. 12, D = 2): returned 1 = accept. Decisions agree with the exact
    test except with probability <= delta; with gumbel_noise=False no noise is added."""
    N = 4000
    rng = np.random.default_rng(6)
    y = rng.standard_t(df=5, size=N).astype(np.float32) + 0.3

    def loglik(theta, yn):  # Student-t(5) location model, per datum
        return -3.0 * jnp.log1p((yn - theta) ** 2 / 5.0)

    num_cases = 400
    keys = jax.random.split(rng_key, num_cases)
    thetas = 0.3 + 0.02 * rng.standard_normal((num_cases, 2)).astype(np.float32)
    log_u = np.log(rng.uniform(size=num_cases)).astype(np.float32)
    yj = jnp.asarray(y)

    def one(key, pair, lu):
        fn = lambda idx: loglik(pair[None, :], yj[idx][:, None])  # noqa: E731
        cv = discrete.data_taylor_control_variate(loglik, pair, yj) if control_variate else None
        # max_block_size=TEST_BLOCK: two chunk sizes (50, 200) instead of four, fewer loops to compile
        sample = discrete.racing(
            fn, 2, N, delta=0.05, gumbel_noise=False, control_variate=cv, max_block_size=TEST_BLOCK
        )
        return sample(key, jnp.stack([lu, jnp.zeros((), jnp.float32)]))

    x, info = jax.jit(jax.vmap(one))(keys, jnp.asarray(thetas), jnp.asarray(log_u))
    x, info = np.asarray(x), jax.tree.map(np.asarray, info)
    ll = np.asarray(loglik(thetas[:, None, :].astype(np.float64), y.astype(np.float64)[None, :, None])).sum(axis=1)
    exact_accept = (ll[:, 1] > ll[:, 0] + log_u).astype(int)
    errors = int(np.sum(x != exact_accept))
    # Binomial(400, <= 0.05): P(errors > 45) < 1e-4.
    assert errors <= 45, errors
    assert np.all(info.num_evaluations <= 2 * N) and not info.has_nan.any()
    assert info.num_evaluations.mean() < 0.9 * 2 * N


# --------------------------------------------------------------------------- control variates, ragged arms


def test_taylor_control_variate_mean_and_zero_variance_for_gaussian(rng_key):
    N, D = 2000, 4
    rng = np.random.default_rng(7)
    y = jnp.asarray(rng.normal(1.0, 2.0, size=(N, 2)), jnp.float32)
    thetas = jnp.asarray(rng.normal(1.0, 0.05, size=(D, 2)), jnp.float32)

    def loglik(theta, yn):
        return -0.5 * jnp.sum((yn - theta) ** 2)

    cv = discrete.data_taylor_control_variate(loglik, thetas, y)
    h_all = np.asarray(cv.fn(jnp.arange(N)), np.float64)
    np.testing.assert_allclose(np.asarray(cv.mean), h_all.mean(axis=0), rtol=1e-4, atol=1e-4)
    l_all = np.asarray(jax.vmap(lambda th: jax.vmap(lambda yn: loglik(th, yn))(y), out_axes=1)(thetas))
    # eq. 11 is exact for a quadratic log-likelihood: residual variance ~ 0.
    assert np.abs(l_all - h_all).max() < 1e-3
    fn = lambda idx: jax.vmap(lambda th: jax.vmap(lambda yn: loglik(th, yn))(y[idx]), out_axes=1)(thetas)  # noqa: E731
    # One loop to compile (max_block_size = m1, no exact pass): every race ends in its first stage.
    sample = discrete.racing(fn, D, N, delta=0.05, control_variate=cv, max_block_size=50, exact_pass_cost=None)
    x, info = draw(sample, rng_key, jnp.zeros(D, jnp.float32), num_draws=4000)
    # With zero-variance rewards the race ends after the first stage.
    assert np.all(info.num_data_used == 50)
    w = l_all.astype(np.float64).sum(axis=0)
    p = np.exp(w - w.max()) / np.exp(w - w.max()).sum()
    assert_tv_within(x, p, slack=0.05)


def test_pad_populations_matches_exact_ragged_target(rng_key):
    sizes = [300, 2000, 1200]
    N, D = max(sizes), 3
    rng = np.random.default_rng(8)
    table = np.zeros((N, D))
    for i, (n_i, target) in enumerate(zip(sizes, [-1.0, 0.0, -0.5])):
        z = rng.standard_normal(n_i)
        table[:n_i, i] = target / n_i + 3e-3 * (z - z.mean())
        table[n_i:, i] = rng.standard_normal(N - n_i)  # garbage beyond N_i: must be ignored
    p = exact_probs(np.where(np.arange(N)[:, None] < np.array(sizes)[None, :], table, 0.0))
    fn = discrete.pad_populations(factor_fn(table), sizes)
    # max_block_size=TEST_BLOCK: two chunk sizes (50, 200), fewer loops to compile than the default
    for sample in (discrete.racing(fn, D, N, delta=0.05, max_block_size=TEST_BLOCK), discrete.gumbel_max(fn, D, N)):
        x, info = draw(sample, rng_key, jnp.zeros(D, jnp.float32), num_draws=4000)
        check_budget(info, N, D)
        assert_tv_within(x, p, slack=0.05)


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("which", ["racing", pytest.param("lil_ucb", marks=pytest.mark.slow), "gumbel_max"])
def test_minus_inf_state_never_returned(rng_key, which):
    probs = [0.1, 0.6, 0.2, 0.1]
    N, D = 1000, 4
    table = reward_table(probs, N, 4e-3, seed=9)
    table[:, 2] = -np.inf  # zero factors: state 2 has probability 0
    if which == "gumbel_max":
        table[17, 3] = -np.inf  # the exact sampler also sees a single zero factor
    log_f0 = jnp.array([0.0, -jnp.inf, 0.0, 0.0], jnp.float32)  # the likeliest state excluded by f0
    make = dict(
        racing=lambda: discrete.racing(factor_fn(table), D, N, delta=0.1),
        lil_ucb=lambda: discrete.lil_ucb(factor_fn(table), D, N, delta=0.1, reward_range=1.0, batch_size=16),
        gumbel_max=lambda: discrete.gumbel_max(factor_fn(table), D, N),
    )[which]
    x, info = draw(make(), rng_key, log_f0, num_draws=2000)
    assert not np.isin(x, [1, 2]).any(), np.bincount(x)
    if which == "gumbel_max":
        assert np.all(x == 0)
    assert not info.has_nan.any()


@functools.cache
def _nan_race():
    """One compiled race (N = 1000, D = 3, delta = 0.1) for both NaN tests: the table is an argument."""
    return jax.jit(
        jax.vmap(
            lambda key, table, log_f0: discrete.racing(lambda idx: table[idx], 3, 1000, delta=0.1)(key, log_f0),
            in_axes=(0, None, None),
        )
    )


@pytest.mark.parametrize("which", ["racing", pytest.param("lil_ucb", marks=pytest.mark.slow), "gumbel_max"])
def test_nan_rewards_are_flagged(rng_key, which):
    probs = [0.3, 0.4, 0.3]
    N, D = 1000, 3
    table = reward_table(probs, N, 4e-3, seed=10)
    table[:, 1] = np.nan
    make = dict(
        racing=lambda: discrete.racing(factor_fn(table), D, N, delta=0.1),
        lil_ucb=lambda: discrete.lil_ucb(factor_fn(table), D, N, delta=0.1, reward_range=1.0),
        gumbel_max=lambda: discrete.gumbel_max(factor_fn(table), D, N),
    )[which]
    if which == "racing":
        sample = functools.partial(lambda keys, f0, t: _nan_race()(keys, t, f0), t=jnp.asarray(table, jnp.float32))
    else:
        sample = jax.jit(jax.vmap(make(), in_axes=(0, None)))
    keys = jax.random.split(rng_key, 200)  # (200 keys: the shape of the racing program shared with the next test)
    _, info = sample(keys, jnp.zeros(D, jnp.float32))
    assert np.asarray(info.has_nan).all()
    # A NaN in log_f0 is flagged too.
    _, info = sample(keys, jnp.array([0.0, jnp.nan, 0.0], jnp.float32))
    assert np.asarray(info.has_nan).all()


def test_nan_single_datum_flagged_by_racing_when_reached(rng_key):
    """A corrupt datum (NaN for every state) is flagged exactly in the draws whose
    race reached its position in that draw's permutation."""
    from jaxsub.subsample import permutation_indices, permutation_round_keys

    probs = [0.3, 0.4, 0.3]
    N, D, bad = 1000, 3, 123
    table = reward_table(probs, N, 0.05, seed=11)
    table[bad, :] = np.nan
    keys = jax.random.split(rng_key, 200)
    x, info = _nan_race()(keys, jnp.asarray(table, jnp.float32), jnp.zeros(D, jnp.float32))
    # Position of the bad datum in each draw's permutation (white box: racing uses
    # the first half of split(rng_key) for the permutation).
    perms = jax.vmap(lambda k: permutation_indices(permutation_round_keys(jax.random.split(k)[0]), jnp.arange(N), N))(
        keys
    )
    position = np.argmax(np.asarray(perms) == bad, axis=1)
    reached = np.asarray(info.num_data_used) > position
    assert 0 < reached.sum() < reached.size  # both kinds of draws occur
    np.testing.assert_array_equal(np.asarray(info.has_nan), reached)


# --------------------------------------------------------------------------- jit / vmap / dtypes


@pytest.mark.parametrize("variant", ["without_jit", "with_jit"])
def test_jit_and_vmap_variants_agree(rng_key, variant):
    """The shared small race (tests/discrete_problems.py; one compiled program for every table):
    vmapped draws, with and without jit, equal single jitted draws with the same keys."""
    table = jnp.asarray(reward_table([0.2, 0.5, 0.3], SMALL_N, 4e-3, seed=12), jnp.float32)
    single, vmapped = small_racing_jitted()
    B = 16
    keys = jax.random.split(rng_key, B)
    log_f0s = jnp.zeros((B, SMALL_D), jnp.float32).at[:, 0].set(jnp.linspace(-1, 1, B))
    if variant == "with_jit":
        x, info = vmapped(keys, table, log_f0s)
    else:
        x, info = jax.vmap(small_racing(table))(keys, log_f0s)
    for k in range(B):  # vmapped draws equal single draws with the same key
        xk, ik = single(keys[k], table, log_f0s[k])
        assert int(xk) == int(x[k]) and int(ik.num_evaluations) == int(info.num_evaluations[k])
    assert len(np.unique(np.asarray(info.num_evaluations))) >= 2  # draws stopped at different stages


def test_no_retracing(rng_key):
    """New keys, new log_f0 values and a new table (all arguments) reuse the one compiled program."""
    single, _ = small_racing_jitted()
    for seed in (13, 14):
        table = jnp.asarray(reward_table([0.2, 0.5, 0.3], SMALL_N, 4e-3, seed=seed), jnp.float32)
        for i in range(3):
            single(jax.random.fold_in(rng_key, i), table, jnp.full((SMALL_D,), float(i), jnp.float32))
    assert single._cache_size() == 1


@pytest.mark.parametrize(
    "name",
    [
        "racing_normal",
        pytest.param("racing_ebs_marginal", marks=pytest.mark.slow),
        pytest.param("lil_ucb", marks=pytest.mark.slow),
    ],
)
def test_float64(rng_key, name):
    probs = [0.2, 0.5, 0.3]
    N, D = 2000, 3
    table = reward_table(probs, N, 3e-3, dist="uniform", seed=14)
    with jax.enable_x64(True):
        fn = factor_fn(table, jnp.float64)
        C = table.max(axis=0) - table.min(axis=0)
        sample = dict(
            # max_block_size=50: one chunk-size loop (+ the exact pass, the compensated float64 sums)
            racing_normal=lambda: discrete.racing(fn, D, N, delta=0.05, max_block_size=50),
            racing_ebs_marginal=lambda: discrete.racing(
                fn, D, N, delta=0.05, bound="ebs", variance="marginal", reward_range=C
            ),
            lil_ucb=lambda: discrete.lil_ucb(fn, D, N, delta=0.05, reward_range=float(C.max()), batch_size=8),
        )[name]()
        x, info = draw(sample, rng_key, jnp.zeros(D, jnp.float64), num_draws=3000)
    check_budget(info, N, D)
    assert_tv_within(x, exact_probs(table), slack=0.05)


# --------------------------------------------------------------------------- configuration errors


def _fn(idx):
    return jnp.zeros((idx.shape[0], 3))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(delta=0.0), "delta"),
        (dict(delta=1.0), "delta"),
        (dict(delta=-0.1), "delta"),
        (dict(delta=0.1, first_batch_size=1), "first_batch_size"),
        (dict(delta=0.1, first_batch_size=101), "first_batch_size"),
        (dict(delta=0.1, bound="hoeffding"), "bound"),
        (dict(delta=0.1, variance="joint"), "variance"),
        (dict(delta=0.1, bound="ebs"), "reward_range"),
        (dict(delta=0.1, bound="ebs", reward_range=-1.0), "reward_range"),
        (dict(delta=0.1, max_block_size=0), "max_block_size"),
        (dict(delta=0.1, control_variate=3), "control_variate"),
        (dict(delta=0.1, exact_pass_cost=0.0), "exact_pass_cost"),
        (dict(delta=0.1, exact_pass_cost=1.5), "exact_pass_cost"),
    ],
)
def test_racing_bad_configuration(kwargs, match):
    with pytest.raises(ValueError, match=match):
        discrete.racing(_fn, 3, 100, **kwargs)


def test_other_bad_configurations():
    with pytest.raises(ValueError, match="num_states"):
        discrete.racing(_fn, 1, 100, delta=0.1)
    with pytest.raises(ValueError, match="num_states"):
        discrete.gumbel_max(_fn, 1, 100)
    with pytest.raises(ValueError, match="delta"):
        discrete.lil_ucb(_fn, 3, 100, delta=1.5, reward_range=1.0)
    with pytest.raises(ValueError, match="reward_range"):
        discrete.lil_ucb(_fn, 3, 100, delta=0.1)
    with pytest.raises(ValueError, match="num_states \\* num_data"):
        discrete.racing(_fn, 1000, 10**7, delta=0.1)
    with pytest.raises(ValueError, match="num_compact_states"):
        discrete.racing(_fn, 3, 100, delta=0.1, log_factor_states_fn=lambda i, s: i, num_compact_states=3)
    with pytest.raises(ValueError, match="population_sizes"):
        discrete.pad_populations(_fn, [10])
    sample = discrete.racing(_fn, 3, 100, delta=0.1)
    with pytest.raises(ValueError, match="log_f0"):
        sample(jax.random.key(0), jnp.zeros(4))
    with pytest.raises(ValueError, match="shape"):  # at construction (jax.eval_shape of the factor)
        discrete.racing(lambda idx: jnp.zeros((idx.shape[0], 2)), 3, 100, delta=0.1)


def test_options_declared_once_keywords_or_record():
    """``racing`` / ``racing_batch`` take the fields of ``RaceOptions`` as keywords or as one record
    (keywords override it); an unknown option is a ``TypeError`` naming it (no sampler is run)."""
    assert discrete.RaceOptions().block_size == 1 and discrete.RaceOptions()._replace(bound="ebs").bound == "ebs"
    with pytest.raises(TypeError, match="block_sise"):
        discrete.racing(_fn, 3, 100, delta=0.1, block_sise=4)
    with pytest.raises(TypeError, match="block_sise"):
        discrete.racing_batch(lambda idx, p: _fn(idx), 3, 100, delta=0.1, block_sise=4)
    with pytest.raises(ValueError, match="options"):
        discrete.racing(_fn, 3, 100, delta=0.1, options=dict(block_size=4))
    # An option given in the record is validated like the keyword (ValueError naming it) ...
    with pytest.raises(ValueError, match="first_batch_size"):
        discrete.racing(_fn, 3, 100, delta=0.1, options=discrete.RaceOptions(first_batch_size=1))
    # ... and a keyword overrides the record's field.
    discrete.racing(_fn, 3, 100, delta=0.1, options=discrete.RaceOptions(first_batch_size=1), first_batch_size=2)
    with pytest.raises(ValueError, match="reward_range"):
        discrete.racing_batch(lambda idx, p: _fn(idx), 3, 100, delta=0.1, options=discrete.RaceOptions(bound="ebs"))


def test_exported():
    assert jaxsub.discrete is discrete
    for name in ("gumbel_max", "racing", "lil_ucb", "b_normal", "data_taylor_control_variate", "pad_populations"):
        assert callable(getattr(discrete, name))


# --------------------------------------------------------------------------- block sampling units

#: Today's per-row race (block_size=1), pinned: draws and counts of 16 keys on a small problem,
#: recorded before block sampling existed. B = 1 must reproduce them bit for bit.
_PINNED_X = [1, 1, 1, 2, 0, 1, 1, 0, 1, 1, 1, 1, 1, 2, 2, 2]
_PINNED_EVALS = [850, 150, 150, 150, 300, 150, 150, 150, 150, 150, 450, 150, 150, 150, 450, 150]


def _pinned_problem():
    table = reward_table([0.2, 0.5, 0.3], 400, 4e-3, seed=12)
    return table, jax.random.split(jax.random.key(123), 16)


def test_block_size_one_reproduces_todays_draws():
    table, keys = _pinned_problem()
    assert (
        SMALL_OPTIONS["block_size"] == 1 and (SMALL_N, SMALL_D) == table.shape
    )  # the shared small race, B = 1 explicitly
    _, vmapped = small_racing_jitted()
    x, info = vmapped(keys, jnp.asarray(table, jnp.float32), jnp.zeros((16, 3), jnp.float32))
    np.testing.assert_array_equal(np.asarray(x), _PINNED_X)
    np.testing.assert_array_equal(np.asarray(info.num_evaluations), _PINNED_EVALS)


def test_block_sums_are_exact_with_a_short_last_block():
    """N = 1000 rows in blocks of 7 (the last block has 6 rows): the exact path over blocks
    returns the argmax of the full sums, and a -inf row kills its arm."""
    N, D = 1000, 3
    table = reward_table([0.2, 0.5, 0.3], N, 4e-3, seed=3)
    sums = table.astype(np.float32).astype(np.float64).sum(axis=0)
    sample = discrete.racing(
        factor_fn(table), D, N, delta=0.1, exact=True, gumbel_noise=False, block_size=7, max_block_size=64
    )
    run = jax.jit(sample)
    for f0 in ([0.0, 0.0, 0.0], [0.6, 0.0, 0.0], [0.0, -0.6, 0.2]):
        x, info = run(jax.random.key(0), jnp.asarray(f0, jnp.float32))
        assert int(x) == int(np.argmax(sums + np.asarray(f0))) and bool(info.is_exact)
        assert int(info.num_data_used) == N and int(info.num_evaluations) == N * D
    table[N - 1, 1] = -np.inf  # the last row sits in the short last block
    sample = discrete.racing(
        factor_fn(table), D, N, delta=0.1, exact=True, gumbel_noise=False, block_size=7, max_block_size=64
    )
    assert int(jax.jit(sample)(jax.random.key(0), jnp.zeros(D, jnp.float32))[0]) != 1


def test_block_racing_within_delta_and_negative_control(rng_key):
    """Blocks of B = 24 rows (167 blocks, the last one short): the law of the draws is
    within delta of p in TV (Prop. 1 for the block population) and within delta + MC
    error of the per-row race (B = 1) on the same problem. Negative control: the same
    block race without its bound (a_t = 0: the first stage's point estimates decide)
    must fail the TV check on a noisier problem. (On the first problem even a_t = 0 stays
    within delta + MC error: its first-stage estimates are already close, so the TV
    check alone has no power there; the noisier table gives it power.)"""
    probs = [0.1, 0.35, 0.3, 0.15, 0.1]
    N, D, delta, B = 4000, 5, 0.05, 24
    table = reward_table(probs, N, 4e-3, seed=2)  # the normal_pairwise problem above
    p = exact_probs(table)
    a, b = (jnp.asarray(v, jnp.float32) for v in discrete.racing_coefficients(delta, D, -(-N // B), 20))
    keys = jax.random.split(rng_key, NUM_DRAWS)

    @jax.jit
    def run(table, a):  # one compiled sampler for both tables and both thresholds
        sample = discrete.racing(
            lambda idx: table[idx], D, N, delta=delta, block_size=B, first_batch_size=20, max_block_size=80
        )
        return jax.vmap(sample.with_coefficients, in_axes=(0, None, None, None))(keys, jnp.zeros(D, jnp.float32), a, b)

    x, info = jax.tree.map(np.asarray, run(jnp.asarray(table, jnp.float32), a))
    check_budget(info, N, D)
    assert info.num_evaluations.mean() < 0.8 * N * D  # it eliminates: the check is not vacuous
    assert np.all(info.num_data_used[~info.is_exact] % B == 0)
    assert_tv_within(x, p, slack=delta)
    # Against the per-row race: TV(block, row) <= TV(block, p) + TV(row, p) <= 2 delta + MC,
    # and both are within delta of p: compare the two empirical laws with their MC errors.
    x1, _ = _table_draws(rng_key, table, delta=delta, max_block_size=TEST_BLOCK, bound="normal", variance="pairwise")
    emp_block, emp_row = (np.bincount(v, minlength=D) / v.size for v in (x, x1))
    tv = 0.5 * np.abs(emp_block - emp_row).sum()
    assert tv <= delta + 2 * tv_tolerance(p, NUM_DRAWS), tv
    # Negative control: no bound (a_t = 0) on a noisier problem (sigma 10x: the first
    # stage's estimates of the totals have sd ~7 nats) -> far outside delta.
    noisy = reward_table(probs, N, 4e-2, seed=2)
    x_bad, _ = run(jnp.asarray(noisy, jnp.float32), 0.0 * a)
    with pytest.raises(AssertionError):
        assert_tv_within(np.asarray(x_bad), exact_probs(noisy), slack=delta)


def test_block_size_bad_configuration():
    with pytest.raises(ValueError, match="block_size"):
        discrete.racing(_fn, 3, 100, delta=0.1, block_size=0)
    with pytest.raises(ValueError, match="block_size"):
        discrete.racing(_fn, 3, 100, delta=0.1, block_size=100)
    with pytest.raises(ValueError, match="block_size"):
        discrete.racing(_fn, 3, 100, delta=0.1, block_size=7, first_batch_size=5, bound="ebs", reward_range=1.0)
    with pytest.raises(ValueError, match="first_batch_size"):
        discrete.racing(_fn, 3, 100, delta=0.1, block_size=10, first_batch_size=50)


@pytest.mark.slow  # about 40 s; the exact pass's law is checked by test_exact_pass_taken_exact_in_its_draws_and_within_delta
def test_row_exact_pass_of_block_races_matches_the_block_pass(rng_key, monkeypatch):
    """With ``block_size > 1`` the exact pass reads rows in order through the per-row
    functions instead of block sums, and with ``log_factor_states_fn`` evaluates
    the survivors at its own finer ladder (here levels 4 and 2): the decision of a race that
    takes the pass is the same exact argmax, so draws and counts equal the old pass's draw for draw, with
    a short last block (N = 1000, B = 7), compacted arms (``log_factor_states_fn``) and a
    control variate (whose per-row mean the pass must rescale: a wrong scale shifts each
    arm's total by a different constant and changes decisions)."""
    from jaxsub.racing import exact_pass

    probs = [0.1, 0.35, 0.3, 0.15, 0.1]
    N, D, B = 1000, 5, 7
    table = jnp.asarray(reward_table(probs, N, 4e-3, seed=2), jnp.float32)
    weights = jnp.linspace(-0.5, 0.5, D)
    h_fn = lambda idx: table[idx] * 0.5 + weights[None, :]  # noqa: E731
    cv = (h_fn, jnp.mean(h_fn(jnp.arange(N)), axis=0))
    keys = jax.random.split(rng_key, 400)

    def run():
        out = []
        for opts in (
            {},
            {"log_factor_states_fn": lambda idx, s: table[idx[:, None], s[None, :]]},
            {"control_variate": cv},
        ):
            sample = discrete.racing(
                lambda idx: table[idx],
                D,
                N,
                delta=0.05,
                block_size=B,
                first_batch_size=20,
                max_block_size=40,
                exact_pass_cost=0.01,
                **opts,
            )
            out.append(jax.tree.map(np.asarray, jax.jit(jax.vmap(sample, in_axes=(0, None)))(keys, jnp.zeros(D))))
        return out

    rows = run()
    # The reference: the A/B variant of the pass (block sums, the race's compaction levels only).
    monkeypatch.setattr(exact_pass, "ROW_PASS", False)
    monkeypatch.setattr(exact_pass, "PASS_LADDER", False)
    blocks = run()
    for (x, info), (x0, info0) in zip(rows, blocks):
        assert 0.1 < info.is_exact.mean() < 1.0  # many races take the pass (the check has power)
        np.testing.assert_array_equal(x, x0)
        np.testing.assert_array_equal(info.num_evaluations, info0.num_evaluations)
        np.testing.assert_array_equal(info.num_data_used, info0.num_data_used)


def test_exact_pass_cost_auto_by_number_of_states():
    """``exact_pass_cost="auto"`` (default): 0.25 below 64 states, 1/16 from 64;
    an explicit value or None is kept, and a bad string is a ValueError naming the option."""
    from jaxsub.racing.config import RaceOptions, build_config, resolve_exact_pass_cost

    assert resolve_exact_pass_cost("auto", 10) == 0.25 and resolve_exact_pass_cost("auto", 63) == 0.25
    assert resolve_exact_pass_cost("auto", 64) == 0.0625 and resolve_exact_pass_cost("auto", 100) == 0.0625
    assert resolve_exact_pass_cost(0.5, 100) == 0.5 and resolve_exact_pass_cost(None, 100) is None

    def switch(D, **kw):
        fn = lambda idx: jnp.zeros((idx.shape[0], D))  # noqa: E731
        return build_config(fn, D, 10**6, delta=0.05, options=RaceOptions(block_size=64, **kw), with_params=False)[
            0
        ].switch_stage

    # 15 625 blocks, stages of 50, 50, 100, ..., 3200, 6400 new blocks: N / 4 -> the 6400 stage
    # (index 8), N / 16 -> the 1600 stage (index 6).
    assert switch(10) == switch(10, exact_pass_cost=0.25) == 8
    assert switch(100) == switch(100, exact_pass_cost=0.0625) == 6 and switch(100, exact_pass_cost=0.25) == 8
    with pytest.raises(ValueError, match="exact_pass_cost"):
        discrete.racing(lambda idx: jnp.zeros((idx.shape[0], 3)), 3, 100, delta=0.1, exact_pass_cost="fast")


# --------------------------------------------------------------------------- data vs num_data


@pytest.mark.parametrize("which", ["racing", "racing_batch", "gumbel_max", "lil_ucb"])
def test_num_data_is_checked_against_the_data(rng_key, which):
    """``num_data=2000`` on 1,000 rows used to run (the gather clamps: row 999 counted ~1,000 times)."""
    table = reward_table([0.3, 0.4, 0.3], 1000, 0.01, seed=3).astype(np.float32)
    fn = factor_fn(table)
    make = dict(
        racing=lambda **kw: discrete.racing(fn, 3, delta=0.1, **kw),
        racing_batch=lambda **kw: discrete.racing_batch(lambda idx, p: fn(idx), 3, delta=0.1, **kw),
        gumbel_max=lambda **kw: discrete.gumbel_max(fn, 3, **kw),
        lil_ucb=lambda **kw: discrete.lil_ucb(fn, 3, delta=0.1, reward_range=1.0, **kw),
    )[which]
    with pytest.raises(ValueError, match=r"num_data must equal the rows of data.*num_data=2000 and 1000 rows"):
        make(num_data=2000, data=table)
    with pytest.raises(ValueError, match="num_data is required when data is not given"):
        make()
    bad = table.copy()
    bad[5, 1] = np.inf
    with pytest.raises(ValueError, match="data must be finite; leaf 0 has 1 NaN/inf"):
        make(data=bad)
    sampler = make(data=table)  # N derived from the data
    if which == "gumbel_max":
        _, info = sampler(rng_key, jnp.zeros(3, jnp.float32))
        assert int(info.num_data_used) == 1000
    same = make(num_data=1000, data={"rows": table})
    assert callable(same)


def test_factor_shape_is_checked_at_construction():
    """A factor built for 4 states, handed to a 3-state sampler, used to fail only inside the first race."""
    table = jnp.zeros((100, 4), jnp.float32)
    fn = lambda idx: table[idx]  # noqa: E731
    for make in (
        lambda: discrete.racing(fn, 3, 100, delta=0.1),
        lambda: discrete.gumbel_max(fn, 3, 100),
        lambda: discrete.lil_ucb(fn, 3, 100, delta=0.1, reward_range=1.0),
    ):
        with pytest.raises(
            ValueError, match=r"log_factor_fn\(indices of shape \(2,\)\) must return shape \[m, D\] = \(2, 3\)"
        ):
            make()
    with pytest.raises(ValueError, match=r"must return shape \[m, D\] = \(2, 3\)"):
        discrete.racing_ragged(lambda idx: table[idx[:, 0]], 3, 100, delta=0.1)
    with pytest.raises(ValueError, match="log_factor_fn failed on int32 indices of shape"):
        discrete.racing(lambda idx: table[idx] @ jnp.ones(5), 3, 100, delta=0.1)
