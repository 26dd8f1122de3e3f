"""Compiled one-row-at-a-time streams of :mod:`jaxsub.compress._cluster` (host-side driver kernels).

The leader streams decide one row at a time (a row sees the clusters opened and moved by the
rows before it), which in NumPy costs a few Python-level array calls per row: 20-40 us, the
largest share of :func:`~jaxsub.compress.cluster`'s time on MNIST at ``delta >= 0.2`` and on
flights at ``delta = 0.02`` (docs/compress.md, session 9). Here the same loops run as one
compiled ``lax.fori_loop`` each (a few microseconds per row), in float64 (the caller enters
``jax.enable_x64`` around the call, so the decisions are the NumPy loops' decisions up to
round-off; the final exact float64 check and repair of ``cluster`` stand behind them anyway).

Shapes are padded to a few sizes (:func:`padded_size`) so a process compiles each kernel a few
times at most; the compiled programs live in ``jax.jit``'s own cache, keyed by the shapes and
static arguments (the pattern of ``jaxsub/anneal/driver.py``); nothing here holds state.

References
----------
Q. Song. Approximate Inference via Clustering. arXiv:2111.14219 (2021), Algorithm 1.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["padded_size", "exact_gram_stream", "greedy_stream"]

#: Padded set length: every set of at most ``_SIZE`` rows is padded to it (the streams are called
#: on sets of at most 512 rows: a block of the leader pass or the leftovers of a chunk), so a
#: process compiles each kernel once (about 0.4-0.7 CPU s); larger sets: the next power of two.
_SIZE = 512
_TRIES = 3


def padded_size(m: int) -> int:
    """Padded length of a set of ``m`` rows: ``_SIZE``, else the next power of two."""
    return _SIZE if m <= _SIZE else 1 << int(np.ceil(np.log2(m)))


def _nearest(dist2, tries, inf):
    """The ``tries`` smallest entries (ties: lowest index), nearest first, by repeated argmin (a
    sort of the whole vector costs ~20 us per row on the CPU, ``tries`` reductions ~1 us)."""
    picks, vals = [], []
    for _ in range(tries):
        jj = jnp.argmin(dist2).astype(jnp.int32)
        picks.append(jj)
        vals.append(dist2[jj])
        dist2 = jax.lax.dynamic_update_slice(dist2, inf[None], (jj,))
    return jnp.stack(picks), jnp.stack(vals)


@partial(jax.jit, static_argnames=("tries",))
def _exact_gram_stream(gram, near, m, lim2, blim, reach, tries=_TRIES):
    """Exact-join stream on a Gram matrix (the loop of ``_cluster._sequential``).

    Args:
      gram: ``[M, M]`` Gram matrix of the (offset) rows, zero-padded past ``m``.
      near: ``[M]`` bool, whether an earlier row lies within ``2 delta`` (rows without one open a
        cluster).
      m: number of real rows (the loop runs over ``t < m``).
      lim2: squared radius limit of the exact post-join radius.
      blim: limit of the O(1) bound ``max(rad_j, d_tj) + d_tj / (n_j + 1)``.
      reach: ``2 delta``: centroids farther than this cannot take the row.
      tries: nearest clusters tried, nearest first.

    Returns:
      ``(members [M], k)``: the cluster (0..k-1, in order of opening) of every row.

    With ``S_j`` the member sum of cluster ``j``, row ``t``'s products ``x_t . S_j`` for every
    cluster are one segment sum of its Gram row over the labels of the earlier rows, so the
    squared distance to the centroid is ``G_tt - 2 x_t . S_j / n_j + ||S_j||^2 / n_j^2``; with
    ``own_i = x_i . S_(cluster of i)`` kept up to date (``+ G_it`` for the members of the cluster
    row ``t`` joins), the exact post-join radius over the members ``i`` (and ``t``) is the largest
    ``G_ii - 2 (own_i + G_it) / (n_j + 1) + ||S_j + x_t||^2 / (n_j + 1)^2``. A row joins the
    first of its ``tries`` nearest clusters (within ``reach``) whose O(1) bound or exact post-join
    radius stays under the limit, else it opens a cluster. Every step is O(M) contiguous work
    (no ``[M, M]`` state: strided column reads of one cost ~40 us per row at M = 512).
    """
    size = gram.shape[0]
    sq = jnp.diagonal(gram)
    idx = jnp.arange(size, dtype=jnp.int32)
    inf = jnp.asarray(jnp.inf, gram.dtype)
    zero = jnp.int32(0)

    def body(t, carry):
        # per-cluster [||S_j||^2, n_j, rad_j] packed in one [3, M] array, per-row own_i, labels
        clus, own, members, k = carry
        t = t.astype(jnp.int32)
        g = gram[t]
        ss, cnt, rad = clus[0], clus[1], clus[2]
        xst = jax.ops.segment_sum(jnp.where(members >= 0, g, 0.0), jnp.maximum(members, 0), num_segments=size)
        live = idx < k
        c = jnp.where(live, cnt, 1.0)
        dist2 = jnp.where(live, sq[t] - 2.0 * xst / c + ss / (c * c), inf)
        cand, d2 = _nearest(dist2, tries, inf)
        dj = jnp.sqrt(jnp.maximum(d2, 0.0))
        n1 = cnt[cand] + 1.0
        bound = jnp.maximum(rad[cand], dj) + dj / n1
        ss1 = ss[cand] + 2.0 * xst[cand] + sq[t]
        # exact post-join radius of each tried cluster over its members and the row
        val = sq[None, :] - 2.0 * (own[None, :] + g[None, :]) / n1[:, None] + (ss1 / (n1 * n1))[:, None]
        val_t = sq[t] - 2.0 * (xst[cand] + sq[t]) / n1 + ss1 / (n1 * n1)
        r2 = jnp.maximum(jnp.max(jnp.where(members[None, :] == cand[:, None], val, -inf), axis=1), val_t)
        by_bound = bound <= blim
        # the tries stop at the first cluster beyond reach (they are sorted by distance)
        ok = (d2 < inf) & (jnp.cumsum(dj > reach) == 0) & (by_bound | (r2 <= lim2)) & near[t]
        first = jnp.argmax(ok)
        acc = ok[first]
        cj = cand[first]
        j = jnp.where(acc, cj, k)
        newrad = jnp.where(by_bound[first], bound[first], jnp.sqrt(jnp.maximum(r2[first], 0.0)))
        vals = jnp.stack([jnp.where(acc, ss1[first], sq[t]), jnp.where(acc, n1[first], 1.0), jnp.where(acc, newrad, 0.0)])
        own = jnp.where(acc & (members == cj), own + g, own)
        own = jax.lax.dynamic_update_slice(own, jnp.where(acc, xst[cj] + sq[t], sq[t])[None], (t,))
        # lax.dynamic_update_slice, not .at[].set: the scatter's bounds check becomes a select
        # over the whole array (a full copy per row)
        clus = jax.lax.dynamic_update_slice(clus, vals[:, None], (zero, j))
        members = jax.lax.dynamic_update_slice(members, j[None], (t,))
        return clus, own, members, k + jnp.where(acc, 0, 1).astype(jnp.int32)

    init = (jnp.zeros((3, size), gram.dtype), jnp.zeros(size, gram.dtype), jnp.full(size, -1, jnp.int32), jnp.int32(0))
    out = jax.lax.fori_loop(jnp.int32(0), m, body, init)
    return out[2], out[3]


def exact_gram_stream(gram: np.ndarray, near: np.ndarray, lim2: float, blim: float, reach: float):
    """Members ``[m]`` (int64) and the number of clusters of :func:`_exact_gram_stream` (float64)."""
    m = gram.shape[0]
    size = padded_size(m)
    g = np.zeros((size, size))
    g[:m, :m] = gram
    nr = np.zeros(size, bool)
    nr[:m] = near
    with jax.enable_x64(True):
        members, k = _exact_gram_stream(g, nr, np.int32(m), np.float64(lim2), np.float64(blim), np.float64(reach))
        members, k = np.asarray(members)[:m].astype(np.int64), int(k)
    return members, k


@jax.jit
def _greedy_stream(gram, m, d2max, moving):
    """Greedy leader stream on a Gram matrix (the loop of ``_cluster._sequential_greedy``): each row
    joins the nearest centroid (``moving``: centroids move to the member mean) or leader (the
    cluster's first row) within ``sqrt(d2max)``, else it opens a cluster. Distances are read off
    the Gram matrix as in :func:`_exact_gram_stream` (O(M) per row). Returns ``(members [M], k)``."""
    size = gram.shape[0]
    sq = jnp.diagonal(gram)
    idx = jnp.arange(size, dtype=jnp.int32)
    inf = jnp.asarray(jnp.inf, gram.dtype)
    zero = jnp.int32(0)

    def body(t, carry):
        clus, members, k = carry  # [||S_j||^2, n_j, leader row of j]
        t = t.astype(jnp.int32)
        g = gram[t]
        live = idx < k
        # both rules in one program (``moving`` is traced: one compile serves both)
        xst = jax.ops.segment_sum(jnp.where(members >= 0, g, 0.0), jnp.maximum(members, 0), num_segments=size)
        c = jnp.where(live, clus[1], 1.0)
        lead = clus[2].astype(jnp.int32)
        dist2 = jnp.where(moving, sq[t] - 2.0 * xst / c + clus[0] / (c * c), sq[t] - 2.0 * g[lead] + sq[lead])
        dist2 = jnp.where(live, dist2, inf)
        j = jnp.argmin(dist2).astype(jnp.int32)
        acc = dist2[j] <= d2max
        j = jnp.where(acc, j, k)
        vals = jnp.stack([jnp.where(acc, clus[0, j] + 2.0 * xst[j] + sq[t], sq[t]), jnp.where(acc, clus[1, j] + 1.0, 1.0),
                          jnp.where(acc, clus[2, j], t.astype(gram.dtype))])
        clus = jax.lax.dynamic_update_slice(clus, vals[:, None], (zero, j))
        members = jax.lax.dynamic_update_slice(members, j[None], (t,))
        return clus, members, k + jnp.where(acc, 0, 1).astype(jnp.int32)

    init = (jnp.zeros((3, size), gram.dtype), jnp.full(size, -1, jnp.int32), jnp.int32(0))
    _, members, k = jax.lax.fori_loop(jnp.int32(0), m, body, init)
    return members, k


def greedy_stream(xr: np.ndarray, d2max: float, moving: bool):
    """Members ``[m]`` (int64) and the number of clusters of :func:`_greedy_stream` (float64; the
    Gram matrix of the rows offset by the first row)."""
    m = xr.shape[0]
    size = padded_size(m)
    xc = xr - xr[0]
    g = np.zeros((size, size))
    g[:m, :m] = xc @ xc.T
    with jax.enable_x64(True):
        members, k = _greedy_stream(g, np.int32(m), np.float64(d2max), np.bool_(moving))
        members, k = np.asarray(members)[:m].astype(np.int64), int(k)
    return members, k
