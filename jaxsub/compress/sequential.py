"""Algorithm 1 one row at a time over a small set (exact join by the Gram matrix, or greedy)."""

from __future__ import annotations

import numpy as np

from jaxsub.compress.options import GREEDY, ClusterOptions
from jaxsub.compress.state import Clusters, group_sums, open_found

__all__ = ["sequential", "sequential_greedy", "sequential_greedy_pairs", "set_gram"]


def sequential(x, rows, clusters: Clusters, delta, exact, labels, *, opts: ClusterOptions) -> np.ndarray:
    """Algorithm 1 one row at a time over ``rows`` (a small set): returns the ids of the clusters it opens.

    Each row joins the nearest cluster opened in this call whose centroid is within ``delta``
    and whose exact post-join radius stays ``<= delta`` (``exact``; the three nearest are
    tried), else it opens a new cluster.

    Everything inside the loop is read off the Gram matrix ``G = X X^T`` of the set (one matrix
    product, O(m^2 d)), so a row costs O(k) scalars, not O(k d): with ``S_j`` the member sum of
    cluster ``j`` and ``XS[i, j] = x_i . S_j`` kept up to date (one column added per join),
    ``||x_t - S_j / n_j||^2 = G_tt - 2 XS[t, j] / n_j + ||S_j||^2 / n_j^2``, and the exact
    post-join radius over the members ``i`` of ``j`` follows from ``XS[i, j] + G[i, t]`` and
    ``||S_j + x_t||^2 = ||S_j||^2 + 2 XS[t, j] + G_tt``. The float64 cancellation of these
    expressions (about 1e-16 of the squared norms) is far below ``delta^2`` in the unit ball,
    and the final exact check + :func:`repair` makes the bound exact anyway.
    """
    if exact is not True:
        return sequential_greedy(x, rows, clusters, delta, exact, labels, opts=opts)
    m = rows.size
    xr_all = x[rows]
    # offsets from the set's first row: smaller norms, less cancellation in the Gram expressions
    xc = xr_all - xr_all[0]
    limit = delta * (1.0 - opts.margin)
    lim2 = limit * limit
    scale2 = float(np.einsum("ij,ij->i", xc, xc).max())
    # the Gram matrix in float32 where its round-off (below 1e-6 of the squared norms, with a
    # 10x margin subtracted from the limit) is negligible against delta^2: joins are then refused
    # a hair early, never accepted late; else float64
    slack = 1e-5 * (1.0 + scale2)
    blim = limit  # limit of the O(1) bound below
    use32 = slack <= 1e-3 * lim2 and x.shape[1] > opts.kdtree_max_dim
    gram = set_gram(xc, use32)
    if use32:
        lim2 -= slack
        blim -= 2.0 * np.sqrt(slack)  # distances read off it are within sqrt(slack / 10)
    sq = np.diag(gram).copy()
    # a row can join a cluster only if its centroid is within delta, hence only if some earlier
    # row (a member) is within 2 delta: rows with none open a cluster without the loop's work
    d2 = sq[:, None] + sq[None, :] - 2.0 * gram
    near = np.tril(d2 <= 4.0 * delta * delta * 1.01 + 1e-12 * (1.0 + sq.max()), k=-1).any(axis=1)
    xs = np.zeros((m, m))  # xs[i, j] = x_i . S_j (offset coordinates)
    ss = np.zeros(m)  # ||S_j||^2
    cnt, rad = np.zeros(m), np.zeros(m)
    members = np.empty(m, np.int64)
    lists: list[list[int]] = []
    k = 0
    for t in range(m):
        if k and near[t]:
            c = cnt[:k]
            dist2 = sq[t] - 2.0 * xs[t, :k] / c + ss[:k] / (c * c)
            joined = False
            for j in np.argsort(dist2)[: opts.tries]:
                dj = np.sqrt(max(dist2[j], 0.0))
                if dj > 2.0 * delta:
                    break
                n1 = cnt[j] + 1.0
                # O(1) bound first (members within rad[j] of the centroid, which moves by
                # dist / (n + 1)); the exact radius over the members only if it fails
                bound = max(rad[j], dj) + dj / n1
                ss1 = ss[j] + 2.0 * xs[t, j] + sq[t]
                if bound <= blim:
                    rad[j] = bound
                else:
                    mem = np.asarray(lists[j] + [t])
                    r2 = (sq[mem] - 2.0 * (xs[mem, j] + gram[mem, t]) / n1 + ss1 / (n1 * n1)).max()
                    if r2 > lim2:
                        continue
                    rad[j] = np.sqrt(max(r2, 0.0))
                ss[j] = ss1
                xs[:, j] += gram[:, t]
                cnt[j] = n1
                lists[j].append(t)
                members[t] = j
                joined = True
                break
            if joined:
                continue
        ss[k], cnt[k], rad[k] = sq[t], 1.0, 0.0
        xs[:, k] = gram[:, t]
        lists.append([t])
        members[t] = k
        k += 1
    sums, counts = group_sums(xr_all, members, k)
    ids = open_found(clusters, xr_all, members, sums, counts.astype(np.float64), sums / counts[:, None])
    labels[rows] = ids[members]
    return ids


def set_gram(xc: np.ndarray, use32: bool) -> np.ndarray:
    """Gram matrix ``xc xc^T`` of a set streamed by :func:`sequential` (float32 product when ``use32``), float64."""
    if use32:
        x32 = xc.astype(np.float32)
        return (x32 @ x32.T).astype(np.float64)
    return xc @ xc.T


def sequential_greedy(x, rows, clusters: Clusters, delta, mode, labels, *, opts: ClusterOptions) -> np.ndarray:
    """The greedy passes of :func:`sequential` (no radius check): each row joins the nearest
    centroid (``mode == GREEDY``; centroids move) or leader (``mode`` false; leaders stay) within
    ``delta`` among the clusters opened in this call, else it opens a new cluster."""
    if mode == GREEDY and opts.greedy_pairs and rows.size > 1 and x.shape[1] <= opts.kdtree_max_dim:  # k-d-tree pairs
        ids = sequential_greedy_pairs(x, rows, clusters, delta, labels, opts=opts)
        if ids is not None:
            return ids
    m, d = rows.size, x.shape[1]
    xr_all = x[rows]
    sums, cnt, cen = np.empty((m, d)), np.zeros(m), np.empty((m, d))
    members = np.empty(m, np.int64)
    moving = bool(mode)
    d2max = delta * delta
    k = 0
    for t in range(m):
        xr = xr_all[t]
        if k:
            diff = cen[:k] - xr
            dist2 = np.einsum("ij,ij->i", diff, diff)
            j = int(np.argmin(dist2))
            if dist2[j] <= d2max:
                sums[j] += xr
                cnt[j] += 1.0
                if moving:
                    cen[j] = sums[j] / cnt[j]
                members[t] = j
                continue
        sums[k], cnt[k], cen[k] = xr, 1.0, xr
        members[t] = k
        k += 1
    ids = open_found(clusters, xr_all, members, sums[:k], cnt[:k], cen[:k])
    clusters.move(ids, cen[:k])
    labels[rows] = ids[members]
    return ids


def sequential_greedy_pairs(x, rows, clusters: Clusters, delta, labels, *, opts: ClusterOptions) -> np.ndarray | None:
    """The greedy centroid stream of :func:`sequential_greedy`, deciding only rows with a neighbour.

    In the leftover sets this stream sees, almost every row opens a cluster (flights at
    ``delta = 0.02``: 19,559 clusters for 20,415 rows). A row is compared only with the clusters
    of the earlier rows of the set within ``2 delta`` of it (one ``query_pairs`` of a k-d tree on
    the set); a row with none opens a cluster with no per-row work, and each cluster is indexed by
    the row that opened it, so an unjoined cluster's centroid is that row (no write). A centroid
    within ``delta`` of a row with no member within ``2 delta`` (a cluster spread wider than
    ``delta``, possible with no radius check) is missed, as the k-d tree's ``eps`` misses
    neighbours: the pass is a heuristic whose clusters the trim and the exact checks make
    radius ``<= delta``. Otherwise the decisions are the plain stream's (nearest centroid within
    ``delta``, centroids moving to the member mean); the per-row work is plain Python over the
    row's few candidates. On the benchmark's flights (every radius) and California housing rows
    ``cluster`` returns the same partition as with the plain stream (measured).
    Returns None (nothing done) for a dense set, more than ``ClusterOptions.greedy_pairs_max`` pairs per row
    (judged first on the ``ClusterOptions.greedy_pairs_probe`` first rows): the caller streams every row instead.
    """
    from scipy.spatial import cKDTree

    m = rows.size
    xr_all = x[rows]
    tree = cKDTree(xr_all)
    reach = 2.0 * delta * (1.0 + 1e-9)
    # a dense set (most rows join; e.g. the first block at large delta): the plain stream of every
    # row is cheaper than listing its pairs. Judged on the first rows' neighbour counts, then on all.
    probe = tree.query(xr_all[: opts.greedy_pairs_probe], k=opts.greedy_pairs_max + 2, distance_upper_bound=reach)[0]
    if np.isfinite(probe).sum() > (opts.greedy_pairs_max + 1) * probe.shape[0]:
        return None
    pairs = tree.query_pairs(reach, output_type="ndarray")
    if pairs.shape[0] > opts.greedy_pairs_max * m:
        return None
    later, earlier = pairs.max(axis=1), pairs.min(axis=1)
    order = np.argsort(later * m + earlier)
    later, earlier = later[order], earlier[order]
    diff = xr_all[later] - xr_all[earlier]
    pd2 = np.einsum("ij,ij->i", diff, diff)  # a row's distance to a cluster its earlier neighbour still is alone in
    ptr = np.searchsorted(later, np.arange(m + 1))
    sums, cen, cnt = xr_all.copy(), xr_all.copy(), np.ones(m)
    d2max = delta * delta
    # plain Python over the few candidates of each row (one to a few): NumPy's per-call cost
    # (~1 us a call, 7 calls a row) dominated the loop. Clusters still alone at their first row
    # are read off the pair distances; the others' centroids are Python lists of d floats.
    xl = xr_all.tolist()
    mem = list(range(m))
    ear, dl, bounds = earlier.tolist(), pd2.tolist(), ptr.tolist()
    gsum: list = [None] * m  # per cluster that has grown: member sum, count, centroid (lists)
    gcnt = [1] * m
    gcen: list = [None] * m
    for t in np.flatnonzero(ptr[1:] > ptr[:-1]).tolist():
        xt = xl[t]
        best, bj = d2max, -1
        lo, hi = bounds[t], bounds[t + 1]
        for s, d2 in zip(ear[lo:hi], dl[lo:hi]):
            j = mem[s]
            c = gcen[j]
            if c is not None:  # a grown cluster (s joined it, or opened it and was joined)
                d2 = sum([(a - b) * (a - b) for a, b in zip(c, xt)])
            if d2 < best or (d2 == best and bj < 0):
                best, bj = d2, j
        if bj >= 0:
            sm = gsum[bj]
            sm = [a + b for a, b in zip(xl[bj] if sm is None else sm, xt)]
            gsum[bj] = sm
            n1 = gcnt[bj] + 1
            gcnt[bj] = n1
            gcen[bj] = [a / n1 for a in sm]
            mem[t] = bj
    members = np.asarray(mem, np.int64)
    gid = np.array([j for j in range(m) if gcnt[j] > 1], np.int64)
    if gid.size:
        sums[gid] = [gsum[j] for j in gid.tolist()]
        cnt[gid] = [gcnt[j] for j in gid.tolist()]
        cen[gid] = [gcen[j] for j in gid.tolist()]
    lead = np.flatnonzero(members == np.arange(m))
    num = np.full(m, -1, np.int64)
    num[lead] = np.arange(lead.size)
    local = num[members]
    ids = open_found(clusters, xr_all, local, sums[lead], cnt[lead], cen[lead])
    clusters.move(ids, cen[lead])
    labels[rows] = ids[local]
    return ids
