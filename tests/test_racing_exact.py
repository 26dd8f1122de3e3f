"""The family's exact-sum routine (jaxsub/racing/exact.py) and gumbel_max under jax.vmap.

``exact_sums(..., sub_block=S)`` reads each block S rows at a time into a running sum (so that
``jax.vmap`` over draws does not write a [B, D, block] array of factors to memory: 3.3x less time
per draw at B = 256, docs/guides/discrete.md). It must give the same sums as one pass per
block up to float rounding (the same law for gumbel_max), keep the -inf / NaN flags, and batched
draws must equal one-at-a-time draws.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsub import discrete
from jaxsub.racing.exact import SUB_BLOCK, exact_sums

N, D, BLOCK = 5 * SUB_BLOCK + 300, 4, 2 * SUB_BLOCK  # blocks of 2 sub-blocks, the last one masked


@pytest.fixture(scope="module")
def table():
    rng = np.random.default_rng(0)
    y = rng.standard_normal(N) + 0.3
    mus = np.asarray([0.0, 0.1, 0.2, 0.3])
    t = (-0.5 * (y[:, None] - mus[None, :]) ** 2 - 3.0).astype(np.float32)  # a common level of -3 per factor
    t[17, 2] = -np.inf  # state 2 impossible
    t[4000, 3] = np.nan  # state 3 numerically broken
    return t


@pytest.mark.parametrize("relative", [True, False])
def test_sub_block_sums_equal_one_pass_and_float64(table, relative):
    tab = jnp.asarray(table)

    @jax.jit
    def both():
        fn = lambda idx: tab[idx]  # noqa: E731
        return (
            exact_sums(fn, D, N, BLOCK, jnp.float32, relative=relative, sub_block=SUB_BLOCK),
            exact_sums(fn, D, N, BLOCK, jnp.float32, relative=relative),
        )

    (new, new_inf, new_bad), (old, old_inf, old_bad) = jax.tree.map(np.asarray, both())
    for inf, bad in ((new_inf, new_bad), (old_inf, old_bad)):
        np.testing.assert_array_equal(inf, [False, False, True, False])
        np.testing.assert_array_equal(bad, [False, False, False, True])
    ref = table[:, :1].astype(np.float64) if relative else 0.0
    want = (table[:, :2].astype(np.float64) - ref).sum(0)  # float64, finite columns
    # the gaps are what a draw depends on; absolute levels (relative=False: ~ -3.3 N) to float32 precision
    np.testing.assert_allclose(new[1] - new[0], want[1] - want[0], rtol=1e-5, atol=2e-3)
    np.testing.assert_allclose(new[:2], want, rtol=1e-6, atol=2e-3)
    np.testing.assert_allclose(new[:2], old[:2], rtol=1e-6, atol=2e-3)


def test_vmapped_gumbel_max_equals_single_draws_and_sub_block_keeps_the_draws(table):
    """Draws with per-draw targets (a closure over batched values, as a user writes it): under
    jax.vmap they equal one-at-a-time calls, with and without ``sub_block``, and the two settings
    give the same draws here (same sums up to rounding; a differing draw needs a near-tie)."""
    tab = jnp.asarray(np.nan_to_num(table, nan=-1.0, neginf=-1.0))
    num = 8
    shifts = jnp.linspace(-0.4, 0.4, num)
    keys = jax.random.split(jax.random.key(0), num)

    def draw(key, shift, sub_block):
        fn = lambda idx: 1e-3 * tab[idx] * (1.0 + shift)  # noqa: E731  (gaps of O(1) nats; the target differs per draw)
        x, info = discrete.gumbel_max(fn, D, N, block_size=BLOCK, sub_block=sub_block)(key, jnp.zeros(D))
        return x, info.num_evaluations

    out = {}
    for sub_block in (None, SUB_BLOCK):
        batched = jax.jit(jax.vmap(lambda k, s: draw(k, s, sub_block)))(keys, shifts)
        single = jax.jit(lambda k, s: draw(k, s, sub_block))
        one_by_one = [single(keys[i], shifts[i]) for i in range(num)]
        np.testing.assert_array_equal(np.asarray(batched[0]), [int(x) for x, _ in one_by_one])
        np.testing.assert_array_equal(np.asarray(batched[1]), N * D)
        out[sub_block] = np.asarray(batched[0])
    np.testing.assert_array_equal(out[None], out[SUB_BLOCK])
    assert len(set(out[None].tolist())) > 1  # the per-draw targets differ


def test_bad_sub_block_raises():
    with pytest.raises(ValueError, match="sub_block"):
        discrete.gumbel_max(lambda idx: jnp.zeros((idx.shape[0], 2)), 2, 10, sub_block=0)
