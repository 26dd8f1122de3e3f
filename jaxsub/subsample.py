"""Sampling data indices without replacement in O(m), not O(N).

A subsampling sampler must not pay O(N) per step to draw a minibatch, so a
full ``jax.random.permutation(key, N)`` per draw is ruled out. Instead we use
a *keyed pseudo-random bijection* ``pi`` of ``[0, N)``: position ``t`` of the
permutation is ``pi(t)``, computed in O(1) from ``t`` alone, so the first
``T`` elements ``pi(0), ..., pi(T-1)`` form a sample of size ``T`` drawn
without replacement, at cost O(T) whatever ``N``.

Construction
------------
``pi`` is the FE1 cipher of Black & Rogaway (2002, sec. 5): a *mixed-radix*
Feistel network on ``Z_a x Z_b`` followed by cycle walking.

* **Radices.** Static integers ``2 <= a, b <= 2^16`` with ``a b >= N`` and the
  *excess* ``a b - N`` as small as possible, found at trace time by a search
  over ``a`` in ``[ceil(sqrt N)/2, 2 ceil(sqrt N)]`` (ties: least
  ``|a^2 - N|``, i.e. ``a`` close to ``sqrt N``). Typical ``N`` factor exactly (``10^6 = 1000 x 1000``,
  ``10^5 = 250 x 400``, ``10^7 = 3125 x 3200``); otherwise the excess is a
  handful of elements (``2^20 + 1 = 919 x 1141 - 2``, the prime
  ``999983 = 996 x 1004 - 1``).
* **Rounds.** Write ``x = L b + R`` (``L in Z_a``, ``R in Z_b``). Round ``r``
  maps ``(L, R) -> (R, (L + F_r(R)) mod a)``: the pair now lives in
  ``Z_b x Z_a``, so the next round reduces mod ``b``, and the moduli alternate;
  after an even number of rounds the layout is ``Z_a x Z_b`` again and the
  output is ``L b + R``. Each round is a bijection whatever ``F_r`` is (it is
  inverted by ``L = (R' - F_r(R)) mod a``), so the network is a bijection of
  ``[0, a b)``. The round function is ``F_r(R) = lowbias32(R xor k_r)``
  reduced to ``[0, m)`` by Lemire's multiply-shift ``floor(h m / 2^32)``
  (exact, computed in 32-bit halves; each residue gets ``floor`` or ``ceil``
  of ``2^32 / m`` hash values, a relative bias below ``m / 2^32 <= 2^-16``).
  It needs no division: as cheap for the traced radices of
  ``jaxsub.sgmcmc.shards`` as for static ones, and measured faster than
  ``h % m`` with a static ``m`` (which XLA strength-reduces to a multiply-high).
* **Cycle walking.** An output ``y >= N`` is mapped again (``y <- net(y)``)
  until it lands in ``[0, N)``; since ``net`` is a permutation of the finite set
  ``[0, a b)``, the orbit of ``x < N`` returns to ``[0, N)`` (at worst at ``x``
  itself), and the first return defines a bijection of ``[0, N)`` (Black &
  Rogaway 2002, sec. 4). A chunk of ``n`` positions has about
  ``n (a b - N) / (a b)`` values to walk (none when ``N = a b``), so only they
  are walked: the chunk is viewed as blocks of :data:`_BLOCK` positions, and
  each iteration gathers the ``S`` blocks holding the most out-of-range values
  (``lax.top_k`` on per-block counts), walks them one step and scatters them
  back; ``S`` is the ``1 - 10^-6`` Binomial quantile of the count
  (:func:`_walk_slots`), so one iteration almost always suffices, and the loop
  simply continues with the next blocks otherwise, so the result is always the
  bijection. When the expected count is too large for that to pay
  (``S * 128 > n / 4``) the whole chunk is walked instead (masked; each
  iteration re-maps every value still out of range), and a chunk of
  ``n >= 4 N`` positions gathers from ``pi(0..N-1)``, built once. Walking is
  elementwise, so every path gives the same values.

Number of rounds
----------------
Luby & Rackoff (1988) show that 4 rounds of independent pseudo-random
*functions* give a strong pseudo-random permutation, but only against
``q << sqrt(min(a, b))`` queries, while a sampler reads up to ``N`` positions,
and our round function is a fast keyed hash, not a PRF; small domains need
more rounds because each round function then carries few bits
(``log2 m`` per element). We therefore measured, with ``K`` independent keys,
a battery of exact chi-square tests on the first positions (each position
uniform on ``[0, N)``; pairs of positions, exactly for ``N <= 60`` and binned
otherwise; the difference ``pi(t) - pi(s) mod N``; how often two positions share
a Feistel half ``L`` or ``R``; 153 tests per ``N`` at level ``1e-4``) and
z-tests of the mean and variance of sample sums of structured populations
(index order, halves ``L``/``R``) against sampling without replacement:

* 4 rounds fail for ``N`` up to ``10^5`` (``K = 2*10^5``: ``p = 6e-196`` at
  ``N = 1000``, ``4e-14`` at ``N = 100003``); at ``N = 10^4`` the variance of
  the number of first-half indices among ``T = N/2`` positions is 32% too
  large (data stored in time or class order would get a wrong spread).
* 6 rounds are indistinguishable from ``jax.random.permutation`` once the
  smaller radix is ``m >= 32`` (``N = 1024``, ``K = 4*10^6``; ``N = 2025, 4096``
  with ``K = 8*10^6``; ``N >= 10^4`` with ``K = 2*10^6``), where they cost
  about 1.5 ns per index on this CPU (4 rounds: about a quarter less), but fail for
  smaller radices (``m = 16..30``: ``p = 3e-77..1e-5`` at ``K = 4*10^6``;
  ``N <= 100`` already at ``K = 2*10^5``).
* Small radices need ``R`` with ``R log2(m)`` about 24 to 30 (at ``K = 10^6``:
  24 rounds for ``m = 2``, 16 for ``m = 3``, 12 for ``m = 4, 5``, 8 for
  ``m = 10, 15``).

So the network uses :data:`NUM_ROUNDS` ``= 6`` rounds, and a domain with
smaller radix ``m < 64`` (``N`` below about 4096, where the extra rounds cost
nothing that matters) the least even ``R`` with ``R log2(m) >= 36``
(:data:`_ROUND_BITS`; 8 rounds for ``m >= 23``, ..., 36 for ``m = 2``), with
margin over the measured needs; with it every test above passes at
``K = 10^6`` for every ``N`` tried from 2 to 10007. Rounds past
``NUM_ROUNDS`` use the keys ``lowbias32(k_(r mod 6) xor r)``.
``tests/test_subsample.py`` repeats the exact small-``N`` tests and the
sample-sum tests (and checks that 4 rounds fail them).

References
----------
Black & Rogaway, "Ciphers with arbitrary finite domains", CT-RSA 2002.
Luby & Rackoff, "How to construct pseudorandom permutations from
pseudorandom functions", SIAM J. Comput. 17(2), 1988.
Lemire, "Fast random integer generation in an interval", ACM TOMACS 29(1), 2019.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.types import Array, PRNGKey
from jaxsub.validation import check_int

__all__ = [
    "bits_to_uniform",
    "dynamic_permutation_indices",
    "permutation_indices",
    "permutation_round_keys",
    "MAX_DOMAIN",
]

#: Rounds of the Feistel network for domains whose smaller radix is >= 64 (N >= ~4096), and the
#: number of uint32 round keys; smaller domains get more rounds (see module notes). Even, so the
#: radix layout returns to ``Z_a x Z_b``.
NUM_ROUNDS = 6
#: Round budget in bits: a domain with smaller radix ``m = min(a, b)`` gets the least even
#: number of rounds ``R >= NUM_ROUNDS`` with ``R log2(m) >= 36`` (6 rounds from m = 64, i.e.
#: N >= ~4096; 8 from m = 23; ...; 36 for m = 2), chosen from measurement (module notes).
_ROUND_BITS = 36
#: Largest supported population: indices are handled as uint32.
MAX_DOMAIN = 2**32 - 1
#: Largest radix: Lemire's reduction is computed exactly in 32 bits for ``m <= 2^16``
#: (``(h >> 16) * m < 2^32``), and ``a b <= 2^32`` keeps every value in uint32.
_MAX_RADIX = 2**16
#: Positions per block in the sparse cycle walk: the walk gathers whole blocks of
#: this many positions. 128 keeps both the per-block count vector (``n / 128``
#: entries, ranked by ``top_k``) and the walked rows (``S * 128`` values) far
#: smaller than a 16384-position chunk.
_BLOCK = 128
#: Tail probability for the number of blocks walked sparsely: the full-chunk
#: fallback runs in at most one chunk in 10^6 (it is still correct, only slower).
_WALK_TAIL = 1e-6

_U = jnp.uint32


def _lowbias32(x: Array) -> Array:
    """32-bit integer finaliser (hash-prospector 'lowbias32'); constants are the published ones."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    x = x ^ (x >> 16)
    return x


class _Domain(NamedTuple):
    """Static (Python ints) or traced (uint32/int32 scalars) description of the bijection of ``[0, N)``."""

    num_items: Any  # N
    a: Any  # radix of the left half (the high digit of x = L b + R)
    b: Any  # radix of the right half
    rounds: Any  # even number of Feistel rounds, see _rounds


@functools.lru_cache(maxsize=256)
def _radices(num_items: int) -> tuple[int, int]:
    """Static ``(a, b)``, ``2 <= a, b <= 2^16``, ``a b >= N``, minimal ``a b - N``; ties: least ``|a^2 - N|``.

    The search covers ``a`` in ``[ceil(sqrt N)/2, 2 ceil(sqrt N)]`` (both halves
    within a factor 4 of each other, so neither gets too small a radix),
    intersected with ``[ceil(N / 2^16), 2^16]`` so that ``b <= 2^16`` as well.
    """
    s = max(2, math.isqrt(num_items - 1) + 1)  # ceil(sqrt(N)) for N >= 2
    lo = max(2, (s + 1) // 2, -(-num_items // _MAX_RADIX))
    hi = min(_MAX_RADIX, 2 * s)
    best = None
    for a in range(lo, hi + 1):
        b = max(2, -(-num_items // a))
        if b > _MAX_RADIX:
            continue
        rank = (a * b - num_items, abs(a * a - num_items), a)  # tie-break: a near sqrt(N), in integers
        if best is None or rank < best[0]:
            best = (rank, a, b)
    return best[1], best[2]


def _rounds_table() -> tuple[tuple[int, int], ...]:
    """``(R, m_R)`` for even ``R >= NUM_ROUNDS``: ``m_R`` is the least radix with ``m_R^R >= 2^_ROUND_BITS``."""
    table = []
    rounds = NUM_ROUNDS
    while True:
        m = 2
        while m**rounds < 2**_ROUND_BITS:
            m += 1
        table.append((rounds, m))
        if m == 2:
            return tuple(table)
        rounds += 2


#: ((6, 64), (8, 23), (10, 13), (12, 8), (14, 6), (16, 5), (18, 4), (20, 4), (22, 4), (24, 3), ..., (36, 2)).
_ROUNDS_TABLE = _rounds_table()


def _rounds(m):
    """Rounds for smaller radix ``m``: the least even ``R >= NUM_ROUNDS`` with ``R log2(m) >= _ROUND_BITS``.

    A static int for a static ``m``; an int32 scalar for a traced one (same table, so the same value).
    """
    if isinstance(m, int):
        return min(r for r, m_r in _ROUNDS_TABLE if m >= m_r)
    rounds = jnp.int32(_ROUNDS_TABLE[-1][0])
    for r, m_r in reversed(_ROUNDS_TABLE):  # R decreasing, m_R increasing: the last match is the least R
        rounds = jnp.where(m >= m_r, jnp.int32(r), rounds)
    return rounds


@functools.lru_cache(maxsize=256)
def _domain(num_items: int, rounds: int | None = None) -> _Domain:
    """Static domain for a static ``N`` (``rounds`` overrides the schedule; a private knob for experiments)."""
    a, b = _radices(num_items)
    rounds = _rounds(min(a, b)) if rounds is None else rounds
    if rounds < 2 or rounds % 2:
        raise ValueError(f"rounds must be an even integer >= 2; got {rounds}")
    return _Domain(num_items, a, b, rounds)


def _domain_dynamic(num_items: Array) -> _Domain:
    """Domain for a traced ``N``: ``a ~ sqrt(N)``, ``b = ceil(N / a)``, rounds from the same schedule.

    No search (``N`` is not known at trace time), so the excess ``a b - N < a``
    is up to about ``sqrt(N)``: a fraction ``<= 1/b`` of the domain, walked by
    :func:`_walk_full`. ``a`` is clipped to ``[ceil(N / 2^16), 2^16]`` so that
    ``b <= 2^16`` too, and both are at least 2.
    """
    n = jnp.maximum(jnp.asarray(num_items).astype(_U), _U(1))
    a = jnp.round(jnp.sqrt(n.astype(jnp.float32))).astype(_U)
    a = jnp.clip(a, jnp.maximum((n - _U(1)) // _U(_MAX_RADIX) + _U(1), _U(2)), _U(_MAX_RADIX))
    b = jnp.maximum((n - _U(1)) // a + _U(1), _U(2))
    return _Domain(n, a, b, _rounds(jnp.minimum(a, b)))


def _reduce(h: Array, m) -> Array:
    """``floor(h m / 2^32)`` for uint32 ``h`` and ``1 <= m <= 2^16`` (Lemire's multiply-shift), exactly.

    With ``h = 2^16 h1 + h0``: ``h m / 2^32 = (h1 m + h0 m / 2^16) / 2^16``, and
    replacing ``h0 m / 2^16`` by its floor does not change the outer floor; every
    intermediate is below ``2^16 m <= 2^32``.
    """
    return ((h >> 16) * m + (((h & _U(0xFFFF)) * m) >> 16)) >> 16


def _round_key(round_keys: Array, r) -> Array:
    """Key of round ``r``: ``k_r`` for ``r < NUM_ROUNDS``, then ``lowbias32(k_(r mod NUM_ROUNDS) xor r)``."""
    if isinstance(r, int):
        key = round_keys[r % NUM_ROUNDS]
        return key if r < NUM_ROUNDS else _lowbias32(key ^ _U(r))
    key = round_keys[r % NUM_ROUNDS]
    return jnp.where(r < NUM_ROUNDS, key, _lowbias32(key ^ r.astype(_U)))


def _round(left: Array, right: Array, key: Array, mod) -> tuple[Array, Array]:
    """``(L, R) -> (R, (L + F(R)) mod m)`` with ``F(R) = lowbias32(R xor key)`` reduced to ``[0, m)``."""
    s = left + _reduce(_lowbias32(right ^ key), mod)  # < 2 m
    s = jnp.minimum(s, s - mod)  # s mod m: s - m wraps around to above s when s < m
    return right, s


def _network(x: Array, round_keys: Array, dom: _Domain) -> Array:
    """The mixed-radix Feistel permutation of ``[0, a b)`` (uint32 in, uint32 out; ``x < a b``)."""
    a = _U(dom.a) if isinstance(dom.a, int) else dom.a
    b = _U(dom.b) if isinstance(dom.b, int) else dom.b
    left, right = x // b, x % b
    if isinstance(dom.rounds, int):  # unrolled: one fused elementwise kernel
        mod, other = a, b
        for r in range(dom.rounds):
            left, right = _round(left, right, _round_key(round_keys, r), mod)
            mod, other = other, mod
    else:

        def body(r, carry):
            left, right, mod, other = carry
            left, right = _round(left, right, _round_key(round_keys, r), mod)
            return left, right, other, mod

        left, right, _, _ = jax.lax.fori_loop(0, dom.rounds, body, (left, right, a, b))
    return left * b + right  # an even number of rounds is back in the Z_a x Z_b layout


def _walk_full(y: Array, round_keys: Array, dom: _Domain) -> Array:
    """Cycle-walk every element of ``y`` that is ``>= N``; each iteration re-maps the whole array (masked)."""
    limit = _U(dom.num_items) if isinstance(dom.num_items, int) else dom.num_items

    def cond(v):
        return jnp.any(v >= limit)

    def body(v):
        return jnp.where(v >= limit, _network(v, round_keys, dom), v)

    return jax.lax.while_loop(cond, body, y)


def _walk_sparse(y: Array, round_keys: Array, dom: _Domain, slots: int, block: int) -> Array:
    """Cycle-walk the elements of ``y`` (length a multiple of ``block``) that are ``>= N``, touching few blocks.

    Each iteration counts the out-of-range values per block of ``block``
    positions, gathers the ``slots`` blocks with the most (``lax.top_k``),
    applies one walking step to them (``v <- net(v)`` where ``v >= N``) and
    scatters them back. When at most ``slots`` blocks hold an out-of-range
    value, one iteration per walking step suffices (almost always exactly one,
    since a re-mapped value lands out of range again with probability
    ``(a b - N) / (a b)``); otherwise further iterations take the next blocks,
    so the loop always finishes with every value in ``[0, N)``, and with the
    same values as :func:`_walk_full` (walking is elementwise).
    """
    limit = _U(dom.num_items)
    num_blocks = y.shape[0] // block

    def cond(carry):
        return carry[1]

    def body(carry):
        v, _ = carry
        blocks = v.reshape(num_blocks, block)
        counts = jnp.sum(blocks >= limit, axis=1, dtype=jnp.int32)
        # Blocks with no out-of-range value may be among the chosen: walking them is a no-op.
        _, chosen = jax.lax.top_k(counts.astype(jnp.float32), slots)
        rows = blocks[chosen]
        rows = jnp.where(rows >= limit, _network(rows, round_keys, dom), rows)
        v = blocks.at[chosen].set(rows, unique_indices=True).reshape(-1)
        pending = jnp.any(rows >= limit) | (jnp.sum(counts > 0) > slots)
        return v, pending

    # `y` goes to the loop and to one reduction only, so XLA materialises it once
    # (with more consumers it would re-evaluate the network inside each).
    return jax.lax.while_loop(cond, body, (y, jnp.any(y >= limit)))[0]


def _walk_slots(size: int, dom: _Domain, block: int) -> int:
    """Blocks ``S`` per sparse walking step: the ``1 - _WALK_TAIL`` quantile of the out-of-range count.

    Each of ``size`` positions lands in ``[N, a b)`` with probability
    ``p = (a b - N) / (a b)``, so their number is about Binomial(``size``, ``p``)
    and at most that many blocks need walking; ``S`` is its ``1 - _WALK_TAIL``
    quantile, so a second sparse iteration (still correct) is needed in at most
    one call in ``1 / _WALK_TAIL``. Returns 0 (walk the whole array instead)
    when ``S * block > size / 4``: the sparse step would then not be much
    cheaper than a full one.
    """
    ab = dom.a * dom.b
    excess = ab - dom.num_items
    max_slots = size // (4 * block)
    if excess == 0 or max_slots < 1:
        return 0
    p = excess / ab
    # Binomial pmf by the ratio recursion, in log space (no underflow when size * p is large).
    log_pmf = size * math.log1p(-p)
    log_ratio = math.log(p) - math.log1p(-p)
    cdf = 0.0
    for k in range(max_slots + 1):
        if k > 0:
            log_pmf += math.log(size - k + 1) - math.log(k) + log_ratio
        cdf += math.exp(log_pmf)
        if 1.0 - cdf <= _WALK_TAIL:
            return max(k, 1)
    return 0


def _permute(round_keys: Array, x: Array, dom: _Domain, *, slots: int | None = None) -> Array:
    """``pi(x)`` for uint32 ``x`` of any shape: the single construction behind every public entry point.

    ``dom`` is static (:func:`_domain`) or traced (:func:`_domain_dynamic`, used
    by ``jaxsub.sgmcmc.shards.minibatch_indices``, where the shard size is only
    known at run time; every out-of-range value is then walked by
    :func:`_walk_full`). With a static domain the cheapest exact path is chosen
    at trace time:

    * ``4 N <= x.size`` (a chunk far larger than the population): the whole
      permutation ``pi(0..N-1)`` is built once (O(N), cheaper than the chunk)
      and gathered;
    * ``N = a b``: the network alone;
    * otherwise the network, then :func:`_walk_sparse` with ``slots`` blocks
      (default :func:`_walk_slots`; a private knob so tests can force the
      multi-iteration path) or, when it is 0, :func:`_walk_full`.

    All paths give the same values.
    """
    shape = x.shape
    x = x.reshape(-1)
    n = x.shape[0]
    num_items = dom.num_items
    if not isinstance(num_items, int):
        x = jnp.minimum(x, jnp.maximum(num_items, _U(1)) - _U(1))
        return _walk_full(_network(x, round_keys, dom), round_keys, dom).reshape(shape)
    # Positions outside [0, N) are clipped (like an out-of-bounds gather), so the
    # network always starts inside [0, a b) and every walk terminates.
    x = jnp.minimum(x, _U(num_items - 1))
    if 4 * num_items <= n:
        table = _network(jnp.arange(num_items, dtype=_U), round_keys, dom)
        # Always through the walking loop (a no-op when N = a b): as a loop output
        # the table is materialised, where XLA would otherwise fuse the network
        # into the gather and evaluate it once per position instead of once per item.
        table = _walk_full(table, round_keys, dom)
        return table[x].reshape(shape)
    if dom.a * dom.b == num_items:
        # Nothing to walk, but the (no-op) walking loop materialises the indices: a
        # fused consumer such as a row gather ``table[idx]`` [m, D] would otherwise
        # re-evaluate the network once per gathered element (measured 1.4-3x slower
        # racing at N = 1e6 = 1000 x 1000 with D = 10 columns).
        return _walk_full(_network(x, round_keys, dom), round_keys, dom).reshape(shape)
    if slots is None:
        slots = _walk_slots(n, dom, _BLOCK)
    if slots == 0:
        return _walk_full(_network(x, round_keys, dom), round_keys, dom).reshape(shape)
    num_blocks = -(-n // _BLOCK)
    slots = min(slots, num_blocks)
    x = jnp.pad(x, (0, num_blocks * _BLOCK - n))  # padded with position 0: a valid position, result dropped
    y = _walk_sparse(_network(x, round_keys, dom), round_keys, dom, slots, _BLOCK)
    return y[:n].reshape(shape)


def permutation_round_keys(rng_key: PRNGKey) -> Array:
    """Derive the ``NUM_ROUNDS`` uint32 round keys of the bijection from a PRNG key.

    Parameters
    ----------
    rng_key
        A PRNG key.

    Returns
    -------
    Array
        ``uint32 [NUM_ROUNDS]``, reusable in :func:`permutation_indices` and
        :func:`dynamic_permutation_indices` for the same permutation.
    """
    return jax.random.bits(rng_key, (NUM_ROUNDS,), dtype=jnp.uint32)


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
        Integer array of positions in ``[0, num_items)``; any shape. Positions
        outside that range are clipped to it.
    num_items
        Population size N (static Python int, ``1 <= N <= 2^32 - 1``).

    Returns
    -------
    Array
        ``int32`` indices in ``[0, N)`` (``uint32`` when ``N > 2^31 - 1``), same
        shape as ``positions``; distinct positions map to distinct indices.

    Notes
    -----
    Cost is O(size of ``positions``): one evaluation of the mixed-radix Feistel
    network per element (``NUM_ROUNDS`` rounds; more for ``N`` below about 4096),
    plus cycle walking of the expected ``size * (a b - N) / (a b)`` elements that
    land in ``[N, a b)`` (none when ``N = a b``), done on a few gathered blocks
    only; a call with ``size >= 4 N`` positions gathers from the whole
    permutation instead (see the module notes). On one CPU core, a chunk of
    16384 positions costs about 1.5 ns per index inside a compiled loop, for
    every ``N`` from 10^3 to 10^7.
    """
    num_items = check_int("num_items", num_items, low=1, high=MAX_DOMAIN)
    if jnp.issubdtype(jnp.asarray(rng_key).dtype, jnp.uint32) and jnp.shape(rng_key) == (NUM_ROUNDS,):
        round_keys = jnp.asarray(rng_key, jnp.uint32)
    else:
        round_keys = permutation_round_keys(rng_key)
    x = jnp.asarray(positions).astype(jnp.uint32)
    y = _permute(round_keys, x, _domain(num_items))
    out_dtype = jnp.int32 if num_items <= np.iinfo(np.int32).max else jnp.uint32
    return y.astype(out_dtype)


def dynamic_permutation_indices(rng_key: PRNGKey | Array, positions: Array, num_items: Array) -> Array:
    """:func:`permutation_indices` for a population size ``num_items`` known only at run time (traced).

    Same bijection family (mixed-radix Feistel network with cycle walking) on a
    domain chosen from the traced ``N`` (``a ~ sqrt(N)``, no radix search), so
    the values differ from :func:`permutation_indices` with the same key. Used
    where ``N`` changes inside a jitted loop (shard sizes, cluster sizes in a
    Gibbs sweep).

    Parameters
    ----------
    rng_key
        A PRNG key or the round keys of :func:`permutation_round_keys`.
    positions
        Integer array of positions, any shape; those outside ``[0, N)`` are clipped.
    num_items
        ``N`` in ``[1, 2^32 - 1]``, a (traced) integer scalar.

    Returns
    -------
    Array
        ``int32`` indices in ``[0, N)``, the shape of ``positions``; distinct positions map
        to distinct indices.
    """
    if jnp.issubdtype(jnp.asarray(rng_key).dtype, jnp.uint32) and jnp.shape(rng_key) == (NUM_ROUNDS,):
        round_keys = jnp.asarray(rng_key, jnp.uint32)
    else:
        round_keys = permutation_round_keys(rng_key)
    x = jnp.asarray(positions).astype(jnp.uint32)
    return _permute(round_keys, x, _domain_dynamic(num_items)).astype(jnp.int32)


def bits_to_uniform(words, dtype=jnp.float32):
    """Uniforms in ``[0, 1)`` from uint32 words, as :func:`jax.random.uniform` builds them.

    Float32: the top 23 bits as the mantissa of a number in ``[1, 2)``, minus 1. The one home
    of this map (racing MH's fused draws and the annealing ticks use it).

    Parameters
    ----------
    words
        ``uint32`` array, any shape.
    dtype
        Output float dtype (the value is computed in float32 and cast).

    Returns
    -------
    Array
        Uniforms in ``[0, 1)``, the shape of ``words``.
    """
    words = jnp.asarray(words, jnp.uint32)
    f = jax.lax.bitcast_convert_type((words >> 9) | jnp.uint32(0x3F800000), jnp.float32) - 1.0
    return f.astype(dtype)
