"""Leader + trim (``rule="trim"``, the default for low dimensions): trim greedy clusters to radius ``delta``.

Checking the join rule row by row costs NumPy calls per block and per cluster; most rows of a
large set need no check. So first a greedy pass with no radius check (every row joins the nearest
centroid within ``delta``; centroids move to the member mean), then :func:`trim`: per cluster,
every member farther than ``delta`` from the centroid of the kept members is dropped, all at once,
until no cluster has one (exact float64 radius ``<= delta`` for every kept cluster; a few
vectorised rounds). The dropped rows (the outer shells) first try the trimmed clusters under the
exact join rule (:func:`join_back`), and the rest are clustered again the same way; sets of at
most ``trim_min_rows`` rows, or sets the trim would mostly drop, go to the exact-join stream.
"""

from __future__ import annotations

import numpy as np

from jaxsub.compress.join import join_block
from jaxsub.compress.neighbours import Search, nearest_anchors
from jaxsub.compress.options import ClusterOptions
from jaxsub.compress.state import Clusters, group_sums

__all__ = ["join_back", "trim"]


def trim(x: np.ndarray, rows: np.ndarray, lab: np.ndarray, delta: float, *, opts: ClusterOptions) -> np.ndarray:
    """Members kept (mask over ``rows``) so that every group of ``lab`` has exact radius ``<= delta``.

    Each round recomputes the centroids of the kept members of the groups still under check
    and drops, all at once, every member farther than ``delta`` from its centroid; groups
    that dropped nothing are done (their kept members are all within ``delta`` of their
    centroid, which no longer changes). A group shrinks every round it stays under check, so
    the loop ends.
    """
    limit = delta * (1.0 - opts.margin)
    num = int(lab.max()) + 1 if lab.size else 0
    keep = np.ones(rows.size, bool)
    sub = np.arange(rows.size)
    while sub.size:
        lg = lab[sub]
        xs = x[rows[sub]]
        sums, counts = group_sums(xs, lg, num)
        diff = xs - sums[lg] / counts[lg][:, None]
        bad = np.einsum("ij,ij->i", diff, diff) > limit * limit
        if not bad.any():
            break
        keep[sub[bad]] = False
        again = np.zeros(num, bool)
        again[lg[bad]] = True
        sub = sub[~bad & again[lg]]
    return keep


def join_back(
    x, zx, kept, dropped, ids, clusters: Clusters, delta, labels, search: Search, *, opts: ClusterOptions
) -> np.ndarray:
    """Rows the trim dropped try the nearest trimmed clusters under the exact join rule; returns the others.

    The state of the clusters ``ids`` is reset to their kept members (sum, count, anchor = mean,
    ``far`` = exact radius); every dropped row is proposed to its ``ClusterOptions.tries`` nearest clusters
    within ``2 delta`` in turn (:func:`join_block`, exact post-join radius).
    """
    lab = labels[kept]
    pos = np.full(clusters.size, -1, np.int64)
    pos[ids] = np.arange(ids.size)
    xk = x[kept]
    sums, counts = group_sums(xk, pos[lab], ids.size)
    alive = counts > 0
    if not alive.any() or dropped.size == 0:
        return dropped
    mean = sums[alive] / counts[alive][:, None]
    live = ids[alive]
    clusters.sums[live], clusters.counts[live] = sums[alive], counts[alive]
    clusters.move(live, mean)
    diff = xk - clusters.anchor[lab]
    far = np.zeros(clusters.size)
    np.maximum.at(far, lab, np.sqrt(np.einsum("ij,ij->i", diff, diff)))
    clusters.far[live] = far[live]
    near, _ = nearest_anchors(
        x, zx, clusters.anchor[live], clusters.zanchor[live], dropped, 2.0 * delta, search, opts.tries, opts=opts
    )
    joined = np.zeros(dropped.size, bool)
    pool = kept
    for t in range(near.shape[1]):
        todo = ~joined & (near[:, t] >= 0)
        if not todo.any():
            break
        sel = np.flatnonzero(todo)
        joined[sel] = join_block(x, dropped[sel], live[near[sel, t]], clusters, delta, True, labels, pool, opts=opts)
        pool = np.concatenate([kept, dropped[joined]])
    return dropped[~joined]
