"""Per-arm schedules for ragged arms (jaxsub.discrete.racing_ragged) and annealing (beta).

The target p(i) ∝ exp(beta (log f0(i) + sum_{n < N_i} log f_n(i))) is computed
exactly in float64; racing draws must be within delta in TV (+ MC tolerance),
and the exact path must match p (chi-square). Negative control: the same
ragged problem zero-padded to max N_i (``pad_populations``) and raced with
Racing-Normal fails, because the padded small arms have very skewed rewards.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_discrete_matches, assert_tv_within, tv_distance, tv_tolerance

from jaxsub import discrete

SIZES = np.array([1, 30, 3000, 0])
N_MAX = 3000
GAPS = np.array([0.0, 0.5, 1.0, 0.8])


def _problem():
    rng = np.random.default_rng(0)
    table = rng.standard_t(3, size=(N_MAX, SIZES.size)) * 0.01 - 0.5  # heavy-tailed factors
    sums = np.array([table[:n, i].sum() for i, n in enumerate(SIZES)])
    log_f0 = -sums + GAPS  # so that the exact log weights are GAPS
    return jnp.asarray(table, jnp.float32), jnp.asarray(log_f0, jnp.float32)


def _draws(sample, args, num_draws, seed=1):
    # A multiple of lax.map's batch: a remainder would compile the sampler a second time.
    assert num_draws % 256 == 0, num_draws
    keys = jax.random.split(jax.random.key(seed), num_draws)
    x, info = jax.jit(lambda ks: jax.lax.map(lambda k: sample(k, *args), ks, batch_size=256))(keys)
    return np.asarray(x), jax.tree.map(np.asarray, info)


@functools.cache
def _exact_draws_fn():
    """The exact ragged sampler, compiled once for both tests that use it (table, log_f0, sizes and
    beta are arguments; 4096 keys)."""

    def run(keys, table, log_f0, sizes, beta):
        fn = lambda idx: jnp.take_along_axis(table, idx, axis=0)  # noqa: E731
        sample = discrete.racing_ragged(fn, 4, N_MAX, delta=0.05, exact=True)
        return jax.lax.map(lambda k: sample(k, log_f0, sizes, beta), keys, batch_size=256)

    return jax.jit(run)


def _exact_draws(table, log_f0, sizes, beta=1.0, num_draws=4096):
    keys = jax.random.split(jax.random.key(1), num_draws)
    x, info = _exact_draws_fn()(keys, table, log_f0, jnp.asarray(sizes, jnp.int32), jnp.asarray(beta, jnp.float32))
    return np.asarray(x), jax.tree.map(np.asarray, info)


def _softmax(w):
    p = np.exp(w - w.max())
    return p / p.sum()


def test_ragged_exact_path_matches_target():
    table, log_f0 = _problem()
    x, info = _exact_draws(table, log_f0, SIZES)  # beta = 1: p itself
    assert_discrete_matches(x, _softmax(GAPS))
    assert info.is_exact.all() and not info.has_nan.any()
    assert np.all(info.num_evaluations == SIZES.sum())  # exactly every arm's own population


@pytest.mark.slow
def test_ragged_racing_within_delta_and_cheaper_than_padding():
    table, log_f0 = _problem()
    sizes = jnp.asarray(SIZES, jnp.int32)
    fn = lambda idx: jnp.take_along_axis(table, idx, axis=0)  # noqa: E731
    delta, num_draws = 0.05, 6144
    x, info = _draws(discrete.racing_ragged(fn, 4, N_MAX, delta=delta), (log_f0, sizes), num_draws)
    p = _softmax(GAPS)
    assert_tv_within(x, p, slack=delta)
    assert not info.has_nan.any()
    assert np.mean(info.num_evaluations) < 0.9 * SIZES.sum()  # it subsampled the big arm
    # Negative control: zero-padding to max N_i + Racing-Normal breaks the CLT (arm 1 is
    # 30 values among 2970 zeros) and the draws are far outside delta.
    padded = discrete.pad_populations(lambda idx: table[idx], np.maximum(SIZES, 1))
    log_f0_pad = log_f0.at[3].add(-table[0, 3])  # arm 3 padded to one factor: remove it
    xp, info_p = _draws(discrete.racing(padded, 4, N_MAX, delta=delta), (log_f0_pad,), num_draws)
    freq = np.bincount(xp, minlength=4) / num_draws
    assert tv_distance(freq, p) > delta + tv_tolerance(p, num_draws)
    # and the ragged race reads fewer factors than the padded one
    assert np.mean(info.num_evaluations) < np.mean(info_p.num_evaluations)


def test_ragged_traced_sizes_delta_and_beta():
    """N_i, delta and beta are traced: one compiled sampler serves every cluster size."""
    table, log_f0 = _problem()
    fn = lambda idx: jnp.take_along_axis(table, idx, axis=0)  # noqa: E731
    sample = jax.jit(discrete.racing_ragged(fn, 4, N_MAX, delta=0.05))
    for sizes in ([1, 30, 3000, 0], [5, 0, 7, 2999]):
        x, info = sample(jax.random.key(0), log_f0, jnp.asarray(sizes, jnp.int32), beta=2.0)
        assert 0 <= int(x) < 4 and not bool(info.has_nan)
    assert sample._cache_size() == 1


def test_ragged_bad_inputs():
    fn = lambda idx: jnp.zeros(idx.shape)  # noqa: E731
    with pytest.raises(ValueError, match="max_population"):
        discrete.racing_ragged(fn, 3, 10, delta=0.1, first_batch_size=50)
    with pytest.raises(ValueError, match="delta"):
        discrete.racing_ragged(fn, 3, 100, delta=1.5)
    sample = discrete.racing_ragged(fn, 3, 100, delta=0.1)
    with pytest.raises(ValueError, match="population_sizes"):
        sample(jax.random.key(0), jnp.zeros(3), jnp.asarray([1, 2, 101]))
    with pytest.raises(ValueError, match="beta"):
        sample(jax.random.key(0), jnp.zeros(3), jnp.asarray([1, 2, 3]), beta=-1.0)


@pytest.mark.slow
@pytest.mark.parametrize("beta", [0.5, 3.0])
def test_annealed_draws_follow_p_to_the_beta(beta):
    """gumbel_max (exact) and racing with beta follow p^beta; the racing draws within delta."""
    rng = np.random.default_rng(3)
    N, D = 2000, 4
    table = rng.normal(size=(N, D)) * 0.05 + np.array([0.0, 2e-4, 4e-4, 6e-4])
    log_f0 = jnp.zeros(D, jnp.float32)
    w = table.sum(0)
    target = _softmax(beta * w)
    fn = lambda idx: jnp.asarray(table, jnp.float32)[idx]  # noqa: E731
    x, _ = _draws(discrete.gumbel_max(fn, D, N), (log_f0, beta), 6144)
    assert_discrete_matches(x, target)
    x, info = _draws(discrete.racing(fn, D, N, delta=0.05), (log_f0, beta), 6144)
    assert_tv_within(x, target, slack=0.05)
    # not vacuous: p^beta differs from p by more than the tolerance
    assert tv_distance(target, _softmax(w)) > 0.05 + tv_tolerance(target, 6144)


def test_beta_infinity_gives_the_map_state():
    table, log_f0 = _problem()
    fn = lambda idx: jnp.take_along_axis(table, idx, axis=0)  # noqa: E731
    args = (log_f0, jnp.asarray(SIZES, jnp.int32), jnp.inf)
    x, _ = _exact_draws(table, log_f0, SIZES, beta=jnp.inf)
    assert np.all(x == np.argmax(GAPS))
    # the race at beta = inf identifies the argmax with error <= delta
    x, _ = _draws(discrete.racing_ragged(fn, 4, N_MAX, delta=0.05), args, 1024)
    assert np.mean(x != np.argmax(GAPS)) <= 0.05 + 4 * np.sqrt(0.05 * 0.95 / 1024)


def test_ragged_fixed_schedule_single_test_rate_and_negative_controls():
    """``racing_ragged(..., schedule="fixed")``: one elimination test per arm after
    ``min(m1, N_i)`` of its data, at ``z = Phi^-1(1 - delta / D)`` (Bonferroni with one tested stage),
    then the survivors read their whole populations; two stage loops.

    Two arms with equal sums, so every elimination is an error: arm 0 has N_0 = 2048 standardised
    Normal factors, arm 1 a single zero factor (exhausted at once: exact, no band). Arm 0's estimate
    after m1 = 512 is eliminated, or eliminates arm 1, when |N_0 mean_512| > U_0: probability
    2 (delta / 2) = delta under the Normal approximation (m1 = 512), checked within Z_CRITICAL binomial
    standard errors (0.022 at 3000 draws, delta = 0.1). Negative controls, which the same check must
    reject: delta not split over the arms (the same compiled sampler at 2 delta: z = Phi^-1(1 - delta),
    rate ~0.2), and the doubling schedule (k_0 = 2 tested stages: z = Phi^-1(1 - delta / 4), rate ~0.05,
    a Bonferroni correction where none is needed). The exact stage reads all of arm 0's factors."""
    from helpers import Z_CRITICAL

    n0, m1, delta, num = 2048, 512, 0.1, 3000
    z = np.random.default_rng(6).standard_normal(n0)
    table = jnp.asarray(np.stack([(z - z.mean()) / z.std(), np.zeros(n0)], axis=1), jnp.float32)
    fn = lambda idx: jnp.take_along_axis(table, idx, axis=0)  # noqa: E731
    sizes = jnp.asarray([n0, 1], jnp.int32)
    keys = jax.random.split(jax.random.key(3), num)

    def rate(schedule, d):
        @jax.jit
        def run(ks, dd):
            sample = discrete.racing_ragged(
                fn, 2, n0, delta=dd, first_batch_size=m1, gumbel_noise=False, schedule=schedule
            )
            return jax.vmap(lambda k: sample(k, jnp.zeros(2, jnp.float32), sizes))(ks)

        _, info = run(keys, jnp.float32(d))
        info = jax.tree.map(np.asarray, info)
        assert not info.has_nan.any()
        stopped = (info.num_alive == 1) & (info.num_stages == 1)
        if schedule == "fixed":  # the races not stopped at the test read every factor of both arms
            assert np.all(info.num_evaluations[~stopped] == n0 + 1)
            assert np.all(info.num_evaluations[stopped] == m1 + 1)
        return float(np.mean(stopped))

    def within(r):
        return abs(r - delta) <= Z_CRITICAL * np.sqrt(delta * (1 - delta) / num)

    r = rate("fixed", delta)
    assert within(r), r
    assert not within(rate("fixed", 2 * delta))
    assert not within(rate("doubling", delta))
    with pytest.raises(ValueError, match="schedule"):
        discrete.racing_ragged(fn, 2, n0, delta=delta, schedule="halving")
