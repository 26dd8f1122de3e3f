"""The exact join rule of the streams: rows join a cluster only if its post-join radius stays ``<= delta``.

Every cluster keeps the sum and count of its members, an *anchor* ``a_j`` (its mean after its
last join) and ``far_j``, an upper bound on its members' distances to ``a_j``. Rows proposed to
cluster ``j`` join when the post-join radius stays ``<= delta``: first the O(d) bound
``||x_i - mu_j'|| <= max(far_j, ||x - a_j||) + ||mu_j' - a_j||`` (triangle inequality, for every
member and new row); where it is not enough, the exact ``max_i ||x_i - mu_j'||`` over the
cluster's members (only those in the outer shell ``||x_i - a_j|| + ||mu_j' - a_j|| > delta`` are
recomputed). Unlike a running bound that adds every centroid move and stops clusters far below
``delta``, the rule lets clusters grow to radius ``delta``: it spends the radius.
"""

from __future__ import annotations

import numpy as np

from jaxsub.compress.options import ClusterOptions
from jaxsub.compress.state import Clusters, segment_sums

__all__ = ["exact_join", "greedy_join", "join_block"]


def join_block(
    x, rows, cid, clusters: Clusters, delta, exact, labels, pool, member_bounds=None, *, opts: ClusterOptions
) -> np.ndarray:
    """Vectorised join of ``rows`` to the clusters ``cid`` of their nearest anchors; returns the accepted mask.

    The anchor ``a_j`` of a cluster is its member mean after its last join; ``far_j`` bounds the members' distances to ``a_j``. Join rule
    (``exact``): the rows proposed to cluster ``j`` join together if the post-join radius stays
    ``<= delta``. First the O(d) bound: every member and joiner satisfies
    ``||x_i - mu_j'|| <= ||x_i - a_j|| + ||a_j - mu_j'|| <= max(far_j, max dist) + ||mu_j' - a_j||``;
    a cluster where the bound exceeds ``delta`` gets the *exact* post-join radius
    ``max_{i in S_j + new} ||x_i - mu_j'||`` (its members taken from ``pool``, the rows streamed
    before in this pass; only members in the outer shell ``||x_i - a_j|| + ||mu_j' - a_j|| > delta``
    need it). If that exceeds ``delta`` too, the rows farther than
    ``min(delta - ||mu_j' - a_j||, 0.8 max dist)`` from the anchor are dropped
    and the check redone (``ClusterOptions.join_rounds`` rounds; then the cluster admits no row). Accepted
    clusters move their anchor to the new mean, with ``far_j`` the exact radius or the bound.
    Without ``exact``: the plain greedy leader pass (every proposed row joins; anchors stay at
    the leaders), the reference of ``benchmarks/compress.py``.

    ``member_bounds = (off, drift_sum)`` (the blocked stream): per-row and per-cluster arrays with
    ``||x_i - a_j|| <= off[i] + drift_sum[j]`` for every member ``i`` of cluster ``j``, kept up to
    date here (``drift_sum[j]`` grows by each move of the anchor; a member whose exact distance to
    the new anchor is computed gets ``off[i] = exact - drift_sum[j]``). The members' distances to
    the anchors are then read off these bounds instead of gathered d-wide rows, so only the
    outer shell's members are gathered (the 784-wide gathers dominated on MNIST).
    """
    if exact is not True and opts.greedy_bincount and x.shape[1] <= opts.kdtree_max_dim:
        return greedy_join(x, rows, cid, clusters, exact, labels)
    order = np.argsort(cid, kind="stable")
    rows, cid = rows[order], cid[order]
    starts = np.flatnonzero(np.r_[True, cid[1:] != cid[:-1]])
    gid = cid[starts]
    xs = x[rows]
    take = np.ones(rows.size, bool)
    block_sums = None
    if exact is True:
        take, block_sums = exact_join(
            x, xs, rows, cid, starts, gid, clusters, delta, labels, pool, member_bounds, opts=opts
        )
    if take.all():
        clusters.sums[gid] += block_sums if exact is True else segment_sums(xs, starts)
    else:
        clusters.sums[gid] += segment_sums(xs, starts, take.astype(np.float64))
    clusters.counts[gid] += np.add.reduceat(take.astype(np.int64), starts)
    if exact:  # the reference greedy leader pass keeps its anchors at the leaders
        moved = gid[np.add.reduceat(take.astype(np.int64), starts) > 0]
        clusters.move(moved, clusters.sums[moved] / clusters.counts[moved][:, None])
    labels[rows[take]] = cid[take]
    accepted = np.empty_like(take)
    accepted[order] = take
    return accepted


def greedy_join(x, rows, cid, clusters: Clusters, exact, labels) -> np.ndarray:
    """The greedy joins of low-dimensional rows (no radius check): every proposed row joins.

    Per-cluster sums by one bincount per column (the rows added in stream order, as the sorted
    segments' sums of :func:`join_block`: the same floats), no sort; wide rows keep the one sparse
    product (a bincount per column would be d passes). With ``exact`` truthy (the greedy centroid
    pass) the anchors move to the member means; without, they stay at the leaders.
    """
    num = clusters.size
    cnt = np.bincount(cid, minlength=num)
    gid = np.flatnonzero(cnt)
    xs = x[rows]
    clusters.sums[gid] += np.column_stack(
        [np.bincount(cid, weights=xs[:, k], minlength=num)[gid] for k in range(xs.shape[1])]
    )
    clusters.counts[gid] += cnt[gid]
    if exact:  # the reference greedy leader pass keeps its anchors at the leaders
        clusters.move(gid, clusters.sums[gid] / clusters.counts[gid][:, None])
    labels[rows] = cid
    return np.ones(rows.size, bool)


def exact_join(
    x, xs, rows, cid, starts, gid, clusters: Clusters, delta, labels, pool, member_bounds, *, opts: ClusterOptions
):
    """The exact rule of :func:`join_block` for rows sorted by cluster; returns ``(take, block_sums)``.

    ``xs = x[rows]``, ``cid`` the proposed clusters (sorted), ``starts`` the first row of each
    cluster's segment and ``gid`` its id. ``take`` marks the rows accepted; ``block_sums`` are the
    segments' sums with every row taken. Updates ``clusters.far`` of the clusters that take rows
    and ``member_bounds`` (module docstring of :func:`join_block`).
    """
    ng = gid.size
    take = np.ones(rows.size, bool)
    exact_mem = exact_val = None  # set with the members' exact distances (blocked stream)
    grp = np.repeat(np.arange(ng), np.diff(np.r_[starts, rows.size]))
    da = xs - clusters.anchor[cid]  # distances to the anchors as they are now
    dist = np.sqrt(np.einsum("ij,ij->i", da, da))
    limit = delta * (1.0 - opts.margin)
    lead, far0 = clusters.anchor[gid], clusters.far[gid]
    thr = np.full(ng, np.inf)
    pos = np.full(clusters.size, -1, np.int64)
    mem = None
    block_sums = segment_sums(xs, starts)  # every proposed row taken (the usual case)
    for _ in range(opts.join_rounds):
        if mem is not None and member_bounds is not None:
            exact_mem[:] = False  # exact distances are to this round's mean only
        w = take.astype(np.float64)
        cnt = clusters.counts[gid] + np.add.reduceat(w, starts)
        added = block_sums if take.all() else segment_sums(xs, starts, w)
        mean = (clusters.sums[gid] + added) / cnt[:, None]
        dm = mean - lead
        drift = np.sqrt(np.einsum("ij,ij->i", dm, dm))
        far = np.maximum(far0, np.maximum.reduceat(np.where(take, dist, 0.0), starts)) + drift
        ok = far <= limit
        need = ~ok
        if need.any():  # exact post-join radius where the bound is not enough
            if mem is None:
                # members of the clusters that need it (from pool) and their distances to the
                # anchors, computed once: ||x_i - mu'|| <= ||x_i - a|| + drift, so only the
                # members in the outer shell ever need their exact distance to mu'
                pos[gid[need]] = np.flatnonzero(need)
                mem = pool[pos[labels[pool]] >= 0]
                mg = pos[labels[mem]]
                pos[gid] = -1
                if member_bounds is None:
                    dmem = x[mem] - lead[mg]
                    dmem = np.sqrt(np.einsum("ij,ij->i", dmem, dmem))
                else:
                    dmem = member_bounds[0][mem] + member_bounds[1][gid[mg]]
                exact_mem = np.zeros(mem.size, bool)
            sel = np.flatnonzero(need[mg])
            val = dmem[sel] + drift[mg[sel]]  # bound on ||x_i - mu'||, exact in the outer shell
            shell = np.flatnonzero(val > limit)
            if shell.size:
                dsh = x[mem[sel[shell]]] - mean[mg[sel[shell]]]
                val[shell] = np.sqrt(np.einsum("ij,ij->i", dsh, dsh))
                if member_bounds is not None:  # exact distances to this round's mean
                    exact_mem[sel[shell]] = True
                    exact_val = np.zeros(mem.size)
                    exact_val[sel[shell]] = val[shell]
            rad = np.zeros(ng)
            np.maximum.at(rad, mg[sel], val)
            jsel = np.flatnonzero(take & need[grp])
            djo = xs[jsel] - mean[grp[jsel]]
            np.maximum.at(rad, grp[jsel], np.sqrt(np.einsum("ij,ij->i", djo, djo)))
            far = np.where(need, rad, far)
            ok = far <= limit
        if ok.all():
            break
        maxd = np.maximum.reduceat(np.where(take, dist, 0.0), starts)
        thr = np.where(ok, thr, np.minimum(limit - drift, 0.8 * maxd))
        take = dist <= thr[grp]
    take &= ok[grp]
    moved = np.flatnonzero(np.add.reduceat(take.astype(np.int64), starts) > 0)
    clusters.far[gid[moved]] = far[moved]
    if member_bounds is not None:
        off, dsum = member_bounds
        # the anchors of the moved clusters move by drift: every member's bound grows by it
        dsum[gid[moved]] += drift[moved]
        if mem is not None and exact_mem.any():  # members whose exact distance was computed
            mv = np.zeros(ng, bool)
            mv[moved] = True
            e = np.flatnonzero(exact_mem & mv[mg])
            off[mem[e]] = exact_val[e] - dsum[gid[mg[e]]]
        # joiners: distance to the old anchor + drift bounds the distance to the new one
        jt = np.flatnonzero(take)
        off[rows[jt]] = dist[jt] + drift[grp[jt]] - dsum[gid[grp[jt]]]
    return take, block_sums
