"""Tests of jaxsub.subsample: the keyed mixed-radix Feistel bijection of [0, N).

Bijection tests are exact (every output of a permutation is checked). Uniformity
tests compare the first positions of many independent permutations with
sampling without replacement, with tolerances derived from Monte Carlo error:
exact multinomial chi-square tests (false-alarm ``ALPHA`` per test, Bonferroni
over the tests of one function) and mean/variance z-tests of sample sums
(``helpers.assert_mean_matches`` / ``assert_variance_matches``, ``Z_CRITICAL``).
Each uniformity test is also run on a deliberately weak network (too few
rounds) and must fail there, so the tests can fail.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import ALPHA, assert_mean_matches, assert_variance_matches, variants
from scipy import stats

from jaxsub import subsample
from jaxsub.sgmcmc.shards import minibatch_indices
from jaxsub.subsample import MAX_DOMAIN, NUM_ROUNDS, permutation_indices, permutation_round_keys

U32 = jnp.uint32


def _perm(key, positions, num_items, *, rounds=None, slots=None):
    """Positions of the bijection for a PRNG key, through the private constructor (round-count override)."""
    dom = subsample._domain(num_items, rounds)
    return subsample._permute(permutation_round_keys(key), jnp.asarray(positions, U32), dom, slots=slots)


# ------------------------------------------------------------------ construction


def test_radices_minimise_the_excess():
    assert subsample._radices(10**6) == (1000, 1000)
    assert subsample._radices(10**5) == (250, 400)
    assert subsample._radices(10**7) == (3125, 3200)
    for n in [2, 3, 7, 97, 1000, 2**20 + 1, 999_983, 2**31 - 1, MAX_DOMAIN]:
        a, b = subsample._radices(n)
        assert 2 <= a <= 2**16 and 2 <= b <= 2**16 and a * b >= n
        s = math.isqrt(n - 1) + 1
        # no pair in the searched window does better
        best = min(
            max(2, -(-n // x)) * x - n
            for x in range(max(2, (s + 1) // 2), min(2**16, 2 * s) + 1)
            if -(-n // x) <= 2**16
        )
        assert a * b - n == best


def test_round_schedule():
    """R is the least even R >= NUM_ROUNDS with R log2(min(a, b)) >= 36, and the traced schedule agrees."""
    ms = np.arange(2, 2**16 + 1)
    traced = np.asarray(jax.jit(subsample._rounds)(jnp.asarray(ms, U32)))
    for m in [2, 3, 4, 5, 8, 13, 22, 23, 63, 64, 65, 1000, 2**16]:
        r = subsample._rounds(int(m))
        assert r % 2 == 0 and r >= NUM_ROUNDS
        assert r * math.log2(m) >= 36 - 1e-12
        assert r == NUM_ROUNDS or (r - 2) * math.log2(m) < 36
        assert traced[m - 2] == r
    assert np.all(np.diff(traced) <= 0)
    assert subsample._domain(10**6).rounds == NUM_ROUNDS == 6


def test_walk_slots_is_the_binomial_quantile():
    dom = subsample._domain(2**20 + 1)
    p = (dom.a * dom.b - dom.num_items) / (dom.a * dom.b)
    for size in [16384, 2**20]:
        s = subsample._walk_slots(size, dom, subsample._BLOCK)
        assert s >= 1
        assert stats.binom.sf(s, size, p) <= subsample._WALK_TAIL
        assert s == 1 or stats.binom.sf(s - 1, size, p) > subsample._WALK_TAIL
    assert subsample._walk_slots(16384, subsample._domain(10**6), subsample._BLOCK) == 0  # N = a b: no walk
    assert subsample._walk_slots(100, dom, subsample._BLOCK) == 0  # too small for blocks: full walk


def test_reduce_is_exact_floor():
    h = jnp.asarray(np.random.default_rng(0).integers(0, 2**32, 10_000, dtype=np.uint64), U32)
    for m in [1, 2, 3, 1000, 65535, 65536]:
        got = np.asarray(subsample._reduce(h, U32(m)), np.uint64)
        want = (np.asarray(h, np.uint64) * np.uint64(m)) >> np.uint64(32)
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ bijection


def test_bijection_every_population_up_to_300():
    """Every N in 1..300 (static radices and rounds, evaluated through one compiled, vmapped function), 3 keys each."""
    size = 300
    doms = [subsample._domain(n) for n in range(1, size + 1)]
    fields = [jnp.asarray(np.repeat([d[i] for d in doms], 3)) for i in range(4)]
    dom = subsample._Domain(
        fields[0].astype(U32), fields[1].astype(U32), fields[2].astype(U32), fields[3].astype(jnp.int32)
    )
    keys = jax.vmap(permutation_round_keys)(jax.random.split(jax.random.key(0), 3 * size))
    perm = jax.jit(jax.vmap(lambda k, d: subsample._permute(k, jnp.arange(size, dtype=U32), d)))
    out = np.asarray(perm(keys, dom))
    for i in range(3 * size):
        n = i // 3 + 1
        np.testing.assert_array_equal(np.sort(out[i, :n]), np.arange(n), err_msg=f"N={n}")
    # the static path computes the same function (spot checks on every code path)
    # (jitted with N static: one compile per N, instead of every primitive dispatched and compiled eagerly)
    static_perm = jax.jit(permutation_indices, static_argnums=2)
    for n in [1, 2, 3, 7, 12, 64, 100, 101, 257, 300]:
        i = 3 * (n - 1)
        static = static_perm(keys[i], jnp.arange(n), n)
        np.testing.assert_array_equal(np.asarray(static), out[i, :n], err_msg=f"N={n}")


@pytest.mark.slow
def test_bijection_every_population_up_to_300_static():
    """Same as above through the public function (one compilation per N)."""
    for n in range(1, 301):
        for seed in range(2):
            perm = np.asarray(permutation_indices(jax.random.key(seed), jnp.arange(n), n))
            np.testing.assert_array_equal(np.sort(perm), np.arange(n), err_msg=f"N={n}")


@pytest.mark.parametrize("num_items", [2**20 + 1, 999_983, 65_537, 12_347, 4099])
def test_bijection_awkward_populations_with_walking(num_items):
    """Primes and N just above a power of two: a b > N, so cycle walking is exercised; every path agrees."""
    dom = subsample._domain(num_items)
    assert dom.a * dom.b > num_items
    key = jax.random.key(num_items)
    rk = permutation_round_keys(key)
    x = jnp.arange(num_items, dtype=U32)
    raw = np.asarray(jax.jit(subsample._network)(x, rk, dom))
    walked = raw >= num_items
    assert walked.sum() >= 1  # some positions needed walking
    perm = np.asarray(jax.jit(lambda k: permutation_indices(k, jnp.arange(num_items), num_items))(key))
    np.testing.assert_array_equal(np.sort(perm), np.arange(num_items))
    np.testing.assert_array_equal(perm[~walked], raw[~walked])  # walking touches only the out-of-range ones
    for slots in [0, 1]:  # full-chunk walk; one block per sparse iteration (the multi-iteration path)
        other = np.asarray(jax.jit(lambda k: subsample._permute(k, x, dom, slots=slots))(rk))
        np.testing.assert_array_equal(other, perm)


def test_sparse_walk_fallback_with_many_blocks():
    """Force the sparse walk's multi-iteration path: more blocks out of range than slots."""
    num_items = 6151  # a b - N = 5, so several positions land out of range
    dom = subsample._domain(num_items)
    x = jnp.arange(num_items, dtype=U32)
    for seed in range(5):
        rk = permutation_round_keys(jax.random.key(seed))
        raw = np.asarray(subsample._network(x, rk, dom))
        out_blocks = np.unique(np.flatnonzero(raw >= num_items) // subsample._BLOCK)
        full = np.asarray(subsample._permute(rk, x, dom, slots=0))
        np.testing.assert_array_equal(np.sort(full), np.arange(num_items))
        for slots in [1, 2]:
            if out_blocks.size > slots:
                sparse = np.asarray(jax.jit(lambda k: subsample._permute(k, x, dom, slots=slots))(rk))
                np.testing.assert_array_equal(sparse, full)
                break
        else:
            continue
        break
    else:
        pytest.fail("no seed put out-of-range values in more than 2 blocks; the fallback was not exercised")


@pytest.mark.parametrize("num_items", [7, 1000, 1001])
def test_table_path_matches_direct(num_items):
    """A chunk of >= 4N positions gathers from the whole permutation: same values as evaluating each position."""
    key = jax.random.key(3)
    direct = np.asarray(permutation_indices(key, jnp.arange(num_items), num_items))
    positions = jnp.asarray(np.random.default_rng(1).integers(0, num_items, 4 * num_items + 5))
    chunk = np.asarray(permutation_indices(key, positions, num_items))
    np.testing.assert_array_equal(chunk, direct[np.asarray(positions)])


def test_minibatch_indices_dynamic_population_bijection():
    """jaxsub.sgmcmc.shards.minibatch_indices (traced N, the shared construction): a bijection for every N <= 200."""
    size = 200
    ns = jnp.arange(1, size + 1, dtype=jnp.int32)
    keys = jax.random.split(jax.random.key(5), size)
    out = np.asarray(jax.jit(jax.vmap(lambda k, n: minibatch_indices(k, size, n)))(keys, ns))
    for n in range(1, size + 1):
        np.testing.assert_array_equal(np.sort(out[n - 1, :n]), np.arange(n), err_msg=f"N={n}")


# ------------------------------------------------------------------ uniformity


def _first_positions(num_items, num_positions, num_keys, seed, rounds=None):
    keys = jax.random.split(jax.random.key(seed), num_keys)
    fn = jax.jit(jax.vmap(lambda k: _perm(k, jnp.arange(num_positions), num_items, rounds=rounds)))
    return np.asarray(fn(keys)).astype(np.int64)


def _chi2_pvalue(counts, expected):
    stat = float(((counts - expected) ** 2 / expected).sum())
    return stats.chi2.sf(stat, counts.size - 1)


def _check_positions_uniform(draws, num_items):
    """Exact multinomial tests: each position is uniform on [0, N), each ordered pair of positions uniform on
    the N (N - 1) distinct pairs. Bonferroni over all tests so the whole check has false-alarm ALPHA."""
    num_keys, num_positions = draws.shape
    pairs = [(s, t) for s in range(num_positions) for t in range(s + 1, num_positions)]
    alpha = ALPHA / (num_positions + len(pairs))
    for s in range(num_positions):
        p = _chi2_pvalue(np.bincount(draws[:, s], minlength=num_items), num_keys / num_items)
        assert p > alpha, f"position {s} not uniform: p = {p:.3g}"
    off_diagonal = ~np.eye(num_items, dtype=bool)
    for s, t in pairs:
        counts = np.bincount(draws[:, s] * num_items + draws[:, t], minlength=num_items**2).reshape(
            num_items, num_items
        )
        assert counts[~off_diagonal].sum() == 0
        p = _chi2_pvalue(counts[off_diagonal], num_keys / (num_items * (num_items - 1)))
        assert p > alpha, f"positions ({s}, {t}) not a uniform pair: p = {p:.3g}"


@pytest.mark.parametrize("num_items", [5, 13, 20])
def test_first_positions_and_pairs_are_uniform(num_items):
    """Small N (where a Feistel network mixes slowest): single positions and ordered pairs are exactly uniform."""
    draws = _first_positions(num_items, 4, 40_000, seed=num_items)
    _check_positions_uniform(draws, num_items)
    # The same test detects a network with too few rounds.
    weak = _first_positions(num_items, 4, 40_000, seed=num_items, rounds=4)
    with pytest.raises(AssertionError):
        _check_positions_uniform(weak, num_items)


def _check_inclusion_uniform(draws, num_items):
    """First-order inclusion of the first T positions: counts c_i over K keys have mean K pi, pi = T/N, and
    covariance K pi (1 - pi) N/(N-1) (I - 11'/N) (sampling without replacement), so
    sum (c_i - K pi)^2 / (K pi (1 - pi) N/(N-1)) is chi-square with N - 1 degrees of freedom."""
    num_keys, t = draws.shape
    pi = t / num_items
    counts = np.bincount(draws.ravel(), minlength=num_items)
    stat = ((counts - num_keys * pi) ** 2).sum() / (num_keys * pi * (1 - pi) * num_items / (num_items - 1))
    p = stats.chi2.sf(stat, num_items - 1)
    assert p > ALPHA, f"inclusion frequencies not uniform: p = {p:.3g}"


@pytest.mark.parametrize("num_items", [53, 4099])
def test_first_order_inclusion_is_uniform(num_items):
    draws = _first_positions(num_items, 10, 20_000, seed=7)
    assert all(np.unique(row).size == 10 for row in draws[:100])
    _check_inclusion_uniform(draws, num_items)


def _populations(num_items, dom, rng):
    """Populations aligned with the index order and with the Feistel halves L = i // b, R = i mod b, where a
    weak network shows (data sorted by time or class are common)."""
    i = np.arange(num_items)
    left, right = i // dom.b, i % dom.b
    f_left = rng.choice([-1.0, 1.0], dom.a)
    f_right = rng.choice([-1.0, 1.0], dom.b)
    return {
        "first half": (i < num_items // 2).astype(float),
        "index": i / num_items,
        "parity": (i % 2).astype(float),
        "f(L)": f_left[left],
        "f(R)": f_right[right],
        "f(L) f(R)": f_left[left] * f_right[right],
    }


def _check_sample_sums(num_items, num_positions, offset, num_keys, seed, rounds=None):
    """Sum of a population over positions [offset, offset + T) vs sampling without replacement:
    mean T ybar and variance T (1 - T/N) s^2 (s^2 with N - 1), i.e. first- and second-order inclusion."""
    dom = subsample._domain(num_items, rounds)
    pops = _populations(num_items, dom, np.random.default_rng(seed))
    table = jnp.asarray(np.stack(list(pops.values())), jnp.float32)  # [P, N]
    keys = jax.random.split(jax.random.key(seed), num_keys)
    positions = offset + jnp.arange(num_positions)
    sums = jax.jit(jax.vmap(lambda k: jnp.sum(table[:, _perm(k, positions, num_items, rounds=rounds)], axis=1)))(keys)
    sums = np.asarray(sums, np.float64)  # [K, P]
    t = num_positions
    for j, (name, y) in enumerate(pops.items()):
        draws = sums[:, j].reshape(4, -1, 1)  # independent keys: 4 "chains" of iid draws for the ESS gate
        mean, var = t * y.mean(), t * (1 - t / num_items) * y.var(ddof=1)
        try:
            assert_mean_matches(draws, np.array([mean]))
            assert_variance_matches(draws, np.array([var]))
        except AssertionError as err:
            raise AssertionError(f"population {name!r}: {err}") from err


@pytest.mark.parametrize(
    "num_items, num_positions, offset",
    [
        (10_000, 5000, 0),
        (10_007, 300, 123),
        # N >= 10^6 are slow: the fast cases keep T = N/2 at 10^4 (where 4 rounds fail) and a prime with
        # walking; the bijection at 2^20 + 1 stays fast (test_bijection_awkward_populations_with_walking)
        pytest.param(10**6, 2000, 0, marks=pytest.mark.slow),
        pytest.param(2**20 + 1, 2000, 777_777, marks=pytest.mark.slow),
    ],
)
def test_sample_sums_match_sampling_without_replacement(num_items, num_positions, offset):
    _check_sample_sums(num_items, num_positions, offset, 8000, seed=num_items + offset)


def test_sample_sum_test_detects_four_rounds():
    """With 4 rounds (Luby-Rackoff's minimum for a PRF) the sum of 'first half' over T = N/2 positions has a
    variance about 30% too large at N = 10^4: the test must see it."""
    with pytest.raises(AssertionError, match="variance"):
        _check_sample_sums(10_000, 5000, 0, 8000, seed=1, rounds=4)


# ------------------------------------------------------------------ API


@pytest.mark.parametrize("variant", ["without_jit", "with_jit"])
def test_jit_vmap_and_key_forms_agree(variant):
    fn = variants(lambda k, p: permutation_indices(k, p, 2**20 + 1))[variant]
    key = jax.random.key(11)
    positions = jnp.arange(24).reshape(2, 3, 4)  # any shape
    out = fn(key, positions)
    assert out.shape == (2, 3, 4) and out.dtype == jnp.int32
    flat = permutation_indices(key, jnp.arange(24), 2**20 + 1)
    np.testing.assert_array_equal(np.asarray(out).ravel(), np.asarray(flat))
    np.testing.assert_array_equal(np.asarray(fn(permutation_round_keys(key), positions)), np.asarray(out))
    keys = jax.random.split(key, 3)
    batched = jax.vmap(lambda k: fn(k, positions))(keys)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(batched[i]), np.asarray(fn(keys[i], positions)))


def test_no_retracing_across_keys_and_positions():
    @jax.jit
    @chex.assert_max_traces(n=1)
    def draw(key, positions):
        return permutation_indices(key, positions, 999_983)

    for i in range(3):
        draw(jax.random.key(i), jnp.arange(i * 100, i * 100 + 100))
    chex.clear_trace_counter()


def test_round_keys_shape_and_successive_batches_disjoint():
    rk = permutation_round_keys(jax.random.key(0))
    assert rk.shape == (NUM_ROUNDS,) and rk.dtype == jnp.uint32
    n = 10**5
    batches = [np.asarray(permutation_indices(rk, jnp.arange(m, m + 1000), n)) for m in range(0, 5000, 1000)]
    assert np.unique(np.concatenate(batches)).size == 5000


@pytest.mark.parametrize(
    "num_items, dtype", [(1, jnp.int32), (2**31 - 1, jnp.int32), (2**31, jnp.uint32), (MAX_DOMAIN, jnp.uint32)]
)
def test_output_dtype_and_range(num_items, dtype):
    positions = jnp.asarray(np.linspace(0, num_items - 1, 4000).astype(np.int64).astype(np.uint32))
    out = np.asarray(permutation_indices(jax.random.key(2), positions, num_items))
    assert out.dtype == dtype
    assert out.min() >= 0 and int(out.max()) < num_items
    assert np.unique(out).size == np.unique(np.asarray(positions)).size


def test_positions_outside_range_are_clipped():
    key = jax.random.key(4)
    n = 1000
    inside = permutation_indices(key, jnp.array([0, n - 1]), n)
    outside = permutation_indices(key, jnp.array([-5, n + 7]), n)  # -5 wraps to 2^32 - 5 as uint32, clipped to N - 1
    assert int(outside[1]) == int(inside[1]) and int(outside[0]) == int(inside[1])


def test_invalid_population_is_rejected():
    key = jax.random.key(0)
    for bad in [0, -3, MAX_DOMAIN + 1]:
        with pytest.raises(ValueError, match="num_items"):
            permutation_indices(key, jnp.arange(3), bad)
