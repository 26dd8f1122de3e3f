"""Sampling data indices without replacement in O(m), not O(N).

A subsampling sampler must not pay O(N) per step to draw a minibatch, so a
full ``jax.random.permutation(key, N)`` per draw is ruled out. Instead we use
a *keyed pseudo-random bijection* of ``[0, N)``: a balanced Feistel network on
``2b`` bits (the smallest even bit width with ``2^(2b) >= N``, so the domain
is at most ``4N``) combined with *cycle walking* (re-apply the network until
the value lands back in ``[0, N)``; it is a bijection of ``[0, N)`` because
the network is a bijection of the larger domain). Position ``t`` of the
permutation is ``permute(key, t)``; the first ``T`` elements of the
permutation form a uniform-looking sample without replacement, and element
``t`` costs O(1) (expected <= 4 network evaluations).

Notes
-----
A Feistel network with ``NUM_ROUNDS = 6`` rounds of a good round function is
a pseudo-random permutation (Luby & Rackoff 1988 need 3-4 rounds with an
ideal round function; we use 6 for margin since our round function is a fast
integer hash, the ``lowbias32`` mixer of C. Wellons' hash-prospector, not a
cryptographic PRF). It is *not* an exactly uniform random permutation: the
family has at most 2^(32*6) members. The statistical tests in
``tests/test_subsample.py`` check that first-order inclusion frequencies and
pairwise co-inclusion are uniform to Monte Carlo accuracy.

References
----------
Black & Rogaway, "Ciphers with arbitrary finite domains", CT-RSA 2002
(cycle walking).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.types import Array, PRNGKey
from jaxsub.validation import check_int

__all__ = ["permutation_indices", "permutation_round_keys", "MAX_DOMAIN"]

#: Rounds of the Feistel network (see module notes).
NUM_ROUNDS = 6
#: Largest supported population: indices are handled as uint32 halves of <= 16 bits each.
MAX_DOMAIN = 2**32 - 1


def _lowbias32(x: Array) -> Array:
    """32-bit integer finaliser (hash-prospector 'lowbias32'); constants are the published ones."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    x = x ^ (x >> 16)
    return x


def _half_bits(num_items: int) -> int:
    bits = max(2, math.ceil(math.log2(max(num_items, 2))))
    return (bits + 1) // 2


def permutation_round_keys(rng_key: PRNGKey) -> Array:
    """Derive the ``NUM_ROUNDS`` uint32 round keys of the bijection from a PRNG key."""
    return jax.random.bits(rng_key, (NUM_ROUNDS,), dtype=jnp.uint32)


def _feistel(x: Array, round_keys: Array, half: int) -> Array:
    mask = jnp.uint32((1 << half) - 1)
    left = (x >> half) & mask
    right = x & mask
    for r in range(NUM_ROUNDS):
        f = _lowbias32(right ^ round_keys[r]) & mask
        left, right = right, left ^ f
    return (left << half) | right


def permutation_indices(rng_key: PRNGKey | Array, positions: Array, num_items: int) -> Array:
    """Elements ``positions`` of a keyed pseudo-random permutation of ``[0, num_items)``.

    Parameters
    ----------
    rng_key
        A PRNG key (or the uint32 round keys from :func:`permutation_round_keys`,
        to reuse them across calls). The same key always gives the same
        permutation, so successive calls with positions ``[0, m)``, ``[m, 2m)``,
        ... draw successive disjoint batches without replacement.
    positions
        Integer array of positions in ``[0, num_items)``; any shape.
    num_items
        Population size N (static Python int, ``1 <= N <= 2^32 - 1``).

    Returns
    -------
    Array
        ``int32`` indices in ``[0, N)`` (``uint32`` when ``N > 2^31 - 1``), same
        shape as ``positions``; distinct positions map to distinct indices.

    Notes
    -----
    Cost is O(size of ``positions``): each element needs one Feistel
    evaluation plus, with probability ``< 3/4`` each, further cycle-walking
    evaluations (a ``lax.while_loop`` that stops when every element is in range).
    """
    num_items = check_int("num_items", num_items, low=1, high=MAX_DOMAIN)
    if jnp.issubdtype(jnp.asarray(rng_key).dtype, jnp.uint32) and jnp.shape(rng_key) == (NUM_ROUNDS,):
        round_keys = jnp.asarray(rng_key, jnp.uint32)
    else:
        round_keys = permutation_round_keys(rng_key)
    half = _half_bits(num_items)
    x = jnp.asarray(positions).astype(jnp.uint32)
    limit = jnp.uint32(num_items)
    x = _feistel(x, round_keys, half)

    def cond(v):
        return jnp.any(v >= limit)

    def body(v):
        return jnp.where(v >= limit, _feistel(v, round_keys, half), v)

    x = jax.lax.while_loop(cond, body, x)
    out_dtype = jnp.int32 if num_items <= np.iinfo(np.int32).max else jnp.uint32
    return x.astype(out_dtype)
