"""Exact statistics of a labelling and the repair that carries the radius guarantee.

After any rule, the exact centroids and radii are recomputed in float64 and every cluster above
``delta`` (possible only through round-off of running sums, or a heuristic pass) is split by
:func:`repair`, which moves its farthest members out. :func:`~jaxsub.compress.cluster` therefore
always returns ``radii <= radius``.
"""

from __future__ import annotations

import numpy as np

from jaxsub.compress.options import ClusterOptions
from jaxsub.compress.state import group_sums

__all__ = ["covariances", "exact_stats", "relabel", "repair"]


def exact_stats(x: np.ndarray, labels: np.ndarray, num: int):
    """Member means, counts and exact radii (float64) of a labelling."""
    counts = np.bincount(labels, minlength=num).astype(np.int64)
    # singletons (most clusters of high-dimensional data at small delta) are their own centroid
    # at radius 0: the arithmetic below runs on the rows of larger clusters only
    is_single = counts[labels] == 1
    centroids = np.empty((num, x.shape[1]))
    dist = np.zeros(x.shape[0])
    radii = np.zeros(num)
    if is_single.any():
        single = np.flatnonzero(is_single)
        centroids[labels[single]] = x[single]
        multi = np.flatnonzero(~is_single)
    else:
        multi = np.arange(x.shape[0])
    if multi.size:
        full = multi.size == x.shape[0]
        lab = labels if full else labels[multi]
        xm = x if full else x[multi]
        # sums of the offsets from each cluster's first member: exact for identical rows, and less
        # round-off than plain sums when the cluster sits far from the origin
        first = np.full(num, multi.size, np.int64)
        np.minimum.at(first, lab, np.arange(multi.size))
        big = np.flatnonzero(counts > 1)
        ref = xm[first[big]]
        pos = np.zeros(num, np.int64)
        pos[big] = np.arange(big.size)
        sums, _ = group_sums(xm - ref[pos[lab]], pos[lab], big.size)
        centroids[big] = ref + sums / counts[big][:, None]
        diff = xm - centroids[lab]
        dm = np.sqrt(np.einsum("ij,ij->i", diff, diff))
        dist[multi] = dm
        np.maximum.at(radii, lab, dm)
    return centroids, counts, radii, dist


def relabel(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """Renumber cluster ids 0..c-1 in order of first appearance."""
    n = labels.shape[0]
    if n == 0 or labels.min() < 0 or labels.max() >= 4 * n + 1024:  # sparse ids: sort them
        uniq, first, inv = np.unique(labels, return_index=True, return_inverse=True)
        rank = np.empty(uniq.size, dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(uniq.size)
        return rank[inv].astype(np.int64), int(uniq.size)
    # dense ids (the usual case): first appearance of each id in O(N), no sort of the N labels
    first = np.full(int(labels.max()) + 1, n, np.int64)
    np.minimum.at(first, labels, np.arange(n))
    used = np.flatnonzero(first < n)
    rank = np.empty(first.size, np.int64)
    rank[used[np.argsort(first[used], kind="stable")]] = np.arange(used.size)
    return rank[labels], int(used.size)


def repair(x: np.ndarray, labels: np.ndarray, delta: float):
    """Split clusters until every exact radius is ``<= delta``.

    Each round recomputes exact centroids and radii; in every cluster that
    violates the bound, the member farthest from its centroid leaves and opens
    a singleton cluster (radius 0). A cluster shrinks by one point per round,
    so the loop ends (in the worst case when every cluster is a singleton).
    Rounds are vectorised over all violating clusters.

    Returns
    -------
    labels, centroids, counts, radii
        A relabelled clustering with ``radii <= delta``.
    """
    labels, num = relabel(labels)
    while True:
        centroids, counts, radii, dist = exact_stats(x, labels, num)
        bad = radii > delta
        if not bad.any():
            return labels, centroids, counts, radii
        bad_clusters = np.flatnonzero(bad)
        # farthest member of each violating cluster (ties: lowest index)
        in_bad = bad[labels]
        idx = np.flatnonzero(in_bad)
        best = np.full(num, -1, dtype=np.int64)
        order = idx[np.lexsort((idx, -dist[idx]))]
        lab_sorted = labels[order]
        _, first = np.unique(lab_sorted, return_index=True)
        best[lab_sorted[first]] = order[first]
        movers = best[bad_clusters]
        labels = labels.copy()
        labels[movers] = num + np.arange(movers.size)
        num += movers.size


def covariances(x: np.ndarray, labels: np.ndarray, centroids: np.ndarray, counts: np.ndarray, *, opts: ClusterOptions):
    """Within-cluster covariances ``[c, d, d]`` (float64), or ``None`` when ``d > opts.max_covariance_dim``."""
    n, d = x.shape
    if d > opts.max_covariance_dim:
        return None
    c = counts.size
    # the deviations feature-major (contiguous rows): the d (d + 1) / 2 products are then contiguous
    # (the same floats; 0.6x the time of strided columns on flights)
    diff = np.ascontiguousarray((x - centroids[labels]).T)
    cov = np.empty((c, d, d))
    pairs = [(i, j) for i in range(d) for j in range(i, d)]

    def fill(part):
        for i, j in part:
            cov[:, i, j] = cov[:, j, i] = np.bincount(labels, weights=diff[i] * diff[j], minlength=c)

    if opts.cov_threads > 1 and n * len(pairs) >= opts.cov_thread_min:
        # every entry by the same call as on one thread (the same floats); NumPy releases the GIL
        # in the products and the bincounts, so a second host thread can take half of them
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(opts.cov_threads - 1) as pool:
            futures = [pool.submit(fill, pairs[t :: opts.cov_threads]) for t in range(1, opts.cov_threads)]
            fill(pairs[0 :: opts.cov_threads])
            for f in futures:
                f.result()
    else:
        fill(pairs)
    return cov / counts[:, None, None]
