"""The neighbour graph of the merge rounds: row pairs within ``2 delta`` and their inner products."""

from __future__ import annotations

import numpy as np

from jaxsub.compress.options import ClusterOptions
from jaxsub.compress.screens import chunk_bounds, screened_candidates

__all__ = ["complete_pairs", "distinct_rows", "groups", "in_threads", "kdtree_graph", "neighbour_graph"]


def in_threads(fn, items, *, opts: ClusterOptions):
    """``[fn(item) for item in items]``, the items split over ``ClusterOptions.graph_threads`` host threads (each item
    computed by the same call whichever thread runs it, so the results do not depend on the threads;
    the products, selections and gathers of :func:`neighbour_graph` release the GIL)."""
    items = list(items)
    if opts.graph_threads <= 1 or len(items) < 2:
        return [fn(item) for item in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(opts.graph_threads) as pool:
        return list(pool.map(fn, items))


def neighbour_graph(xc32: np.ndarray, sq32: np.ndarray, z32: np.ndarray, delta: float, *, opts: ClusterOptions):
    """Row pairs within ``2 delta`` among each row's screened nearest rows, both directions:
    ``(i, j, g_ij)`` with ``g_ij = xc_i . xc_j`` (float32 product, float64 array), ``i`` ascending.

    ``xc32`` are the rows less their mean (smaller norms, less round-off; float32, or float64 where
    float32 round-off is not negligible against ``delta^2``), ``sq32`` their squared norms, ``z32``
    search coordinates with ``||z_i - z_j|| <= ||x_i - x_j||`` (the projected
    search's principal components + residual norm, or the rows themselves). Per block of
    ``ClusterOptions.merge_block`` rows, one float32 product of lower bounds against all rows
    (:func:`chunk_bounds`); the ``ClusterOptions.merge_neighbours`` rows of smallest bound within reach
    (:func:`screened_candidates`) are candidates. The candidate pairs are deduplicated (a pair found
    from both rows is computed once) and get their true squared distance
    ``||x_i||^2 + ||x_j||^2 - 2 g_ij``; pairs within ``2 delta`` (widened by far more than float32
    round-off) are the edges. Two members of a cluster of radius ``<= delta`` are within ``2 delta``
    of each other, so :func:`merge_rounds` merges only clusters all of whose cross pairs are edges.
    """
    n = xc32.shape[0]
    zn = np.einsum("ij,ij->i", z32, z32)
    slack = np.float32(1e-5 * (1.0 + float(sq32.max())))
    reach2 = np.float32(4.0 * delta * delta * (1.0 + 1e-3) ** 2) + slack
    m = min(opts.merge_neighbours, n - 1)

    def block_keys(s):  # candidate pairs of the rows [s, s + opts.merge_block)
        e = min(n, s + opts.merge_block)
        lb = chunk_bounds(z32[s:e], z32, zn)
        lb[np.arange(e - s), np.arange(s, e)] = np.inf  # not its own neighbour
        cand, valid = screened_candidates(lb, reach2 + slack - zn[s:e], m)
        r, c = np.nonzero(valid)
        i, j = s + r, cand[r, c]
        return np.minimum(i, j) * n + np.maximum(i, j)

    keys = in_threads(block_keys, range(0, n, opts.merge_block), opts=opts)
    key = np.unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)
    a, b = key // n, key % n
    g = np.empty(key.size, np.float64)

    def products(s):  # gathered products in batches (bounded memory)
        g[s : s + opts.merge_batch] = np.einsum(
            "ij,ij->i", xc32[a[s : s + opts.merge_batch]], xc32[b[s : s + opts.merge_batch]]
        )

    in_threads(products, range(0, key.size, opts.merge_batch), opts=opts)
    near = sq32[a] + sq32[b] - 2.0 * g <= reach2
    a, b, g = a[near], b[near], g[near]
    i, j = np.concatenate([a, b]), np.concatenate([b, a])
    order = np.argsort(i, kind="stable")
    return i[order], j[order], np.concatenate([g, g])[order]


def complete_pairs(rows, sq, lab, ent, pa, pb, delta, ei, ej, eg, *, opts: ClusterOptions):
    """The edges with every cross pair of the cluster pairs ``(pa, pb)`` whose cross pairs are all within
    ``2 delta`` (their existing cross edges replaced by the full set, both directions); pairs with a
    cross pair beyond ``2 delta`` lose their cross edges (no cluster will hold both).

    ``rows`` are the coordinates the edges' products were computed on (``sq`` their squared norms),
    ``ent`` the clusters' numbers of distinct rows. Lets a cluster grow past the screen's
    ``ClusterOptions.merge_neighbours`` cap (tight blobs): the cross pairs missing from the screened graph are
    computed directly, ``sum ent_A ent_B`` gathered products."""
    n = lab.size
    order = np.argsort(lab, kind="stable")
    start = np.r_[0, np.cumsum(np.bincount(lab, minlength=n))]
    a, b = ent[pa].astype(np.int64), ent[pb].astype(np.int64)
    size = a * b
    rep = np.repeat(np.arange(pa.size), size)
    local = np.arange(rep.size) - np.repeat(np.cumsum(size) - size, size)
    i = order[start[pa[rep]] + local // b[rep]]
    j = order[start[pb[rep]] + local % b[rep]]
    g = np.empty(i.size)
    for s in range(0, i.size, opts.merge_batch):
        g[s : s + opts.merge_batch] = np.einsum(
            "ij,ij->i", rows[i[s : s + opts.merge_batch]], rows[j[s : s + opts.merge_batch]]
        )
    slack = 1e-5 * (1.0 + float(sq.max()))
    far = sq[i] + sq[j] - 2.0 * g > 4.0 * delta * delta * (1.0 + 1e-3) ** 2 + slack
    ok = np.bincount(rep, weights=far, minlength=pa.size) == 0
    # the pairs' existing cross edges leave (all of them: replaced below where ok, gone where not)
    key = np.sort(pa * n + pb)
    la, lb = np.minimum(lab[ei], lab[ej]), np.maximum(lab[ei], lab[ej])
    ek = la * n + lb
    hit = np.minimum(np.searchsorted(key, ek), key.size - 1)
    stay = key[hit] != ek
    keep = ok[rep]
    i, j, g = i[keep], j[keep], g[keep]
    ei = np.concatenate([ei[stay], i, j])
    ej = np.concatenate([ej[stay], j, i])
    eg = np.concatenate([eg[stay], g, g])
    return ei, ej, eg


def kdtree_graph(xc: np.ndarray, delta: float, *, opts: ClusterOptions):
    """:func:`neighbour_graph` for low-dimensional rows (``d <= opts.kdtree_max_dim``): the
    ``ClusterOptions.merge_neighbours`` nearest rows within ``2 delta`` by one exact k-d-tree query (float64,
    O(N log N) instead of the O(N^2) screen), ``g_ij = (||x_i||^2 + ||x_j||^2 - d_ij^2) / 2``."""
    from scipy.spatial import cKDTree

    n = xc.shape[0]
    k = min(opts.merge_neighbours + 1, n)
    workers = -1 if n >= opts.parallel_query_rows else opts.workers
    dist, idx = cKDTree(xc).query(xc, k=k, distance_upper_bound=2.0 * delta * (1.0 + 1e-9), workers=workers)
    dist, idx = np.asarray(dist).reshape(n, k), np.asarray(idx).reshape(n, k)
    r, c = np.nonzero((idx < n) & (idx != np.arange(n)[:, None]))
    i, j = r, idx[r, c]
    key = np.unique(np.minimum(i, j) * n + np.maximum(i, j))
    a, b = key // n, key % n
    sq = np.einsum("ij,ij->i", xc, xc)
    diff = xc[a] - xc[b]
    g = 0.5 * (sq[a] + sq[b] - np.einsum("ij,ij->i", diff, diff))
    i, j = np.concatenate([a, b]), np.concatenate([b, a])
    order = np.argsort(i, kind="stable")
    return i[order], j[order], np.concatenate([g, g])[order]


def distinct_rows(x: np.ndarray):
    """Indices of the distinct rows of ``x`` (first occurrences) and every row's index among them.

    Keyed by one fixed random projection (equal rows give equal keys); rows sharing a key are
    compared with their representative, and on any mismatch (a collision) the exact
    ``np.unique(axis=0)`` decides."""
    key = x @ np.random.default_rng(0).standard_normal(x.shape[1])
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    shared = np.flatnonzero(np.bincount(inv)[inv] > 1)
    if shared.size and not np.array_equal(x[first[inv[shared]]], x[shared]):
        _, first, inv = np.unique(x, axis=0, return_index=True, return_inverse=True)
    return first, inv.ravel()


def groups(key: np.ndarray):
    """Group ids of ``key`` in ascending key order (``inverse``, one per element) and the index of
    each group's first element in the input (``head``): one stable sort, no hashing."""
    order = np.argsort(key, kind="stable")
    ks = key[order]
    first = np.r_[True, ks[1:] != ks[:-1]]
    inverse = np.empty(key.size, np.int64)
    inverse[order] = np.cumsum(first) - 1
    return inverse, order[first]
