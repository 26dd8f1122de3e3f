"""The exact-join stream (``rule="stream"``): Algorithm 1 vectorised by blocks of doubling length.

The stream is cut into blocks of doubling length; a block's rows look up their nearest centroid
among the clusters opened before the block (one k-d-tree query per row) and join under the exact
rule of :mod:`jaxsub.compress.join`, in one vectorised step per cluster; rows not joined try the
three nearest centroids within ``2 delta`` (a row at distance ``t`` from the centroid of ``n``
rows ends at ``t n / (n + 1)`` from the new one, so no join is possible farther away); the rows
left over (away from every earlier cluster, or refused by the bound) are streamed recursively by
the same procedure, one row at a time only for sets of at most ``base_rows`` rows and the first
block. In the greedy pass of leader + trim, a sparse first block is streamed off its list of pairs
within ``2 delta`` (:func:`~jaxsub.compress.sequential.sequential_greedy_pairs`).

References
----------
Q. Song. Approximate Inference via Clustering. arXiv:2111.14219 (2021), Algorithm 1.
J. A. Hartigan. Clustering Algorithms. Wiley (1975), the leader algorithm.
"""

from __future__ import annotations

import numpy as np

from jaxsub.compress.join import join_block
from jaxsub.compress.neighbours import Search, nearest_anchors, open_isolated
from jaxsub.compress.options import ClusterOptions
from jaxsub.compress.sequential import sequential
from jaxsub.compress.state import Clusters

__all__ = ["leader_pass"]


def leader_pass(
    x, zx, rows, clusters: Clusters, delta, exact, labels, search: Search, *, opts: ClusterOptions
) -> np.ndarray:
    """Algorithm 1 over ``rows`` (stream order), vectorised by blocks; returns the ids of the clusters opened.

    The stream is cut into blocks ``[s, 2 s)`` (first block ``ClusterOptions.first_block`` rows). A block's
    rows first look up the nearest centroid among the clusters already opened by this pass (a
    k-d tree on the centroids, rebuilt per block, so O(log N) builds) and join it under the rule
    of :func:`join_block`. The rows left over lie away from every earlier cluster (or were
    refused by the radius check); they are streamed by the same procedure recursively (one row
    at a time for at most ``ClusterOptions.base_rows`` rows and in the first block), so the clusters they open
    are found by the later rows of the block. Every row is compared only with clusters opened
    by rows before it, as in Algorithm 1; only the order of joins inside a block changes.
    """
    local = np.empty(0, np.int64)
    n, s = rows.size, 0
    while s < n:
        e = min(n, max(2 * s, opts.first_block))
        block = rows[s:e]
        rest = block
        if local.size:
            near, _ = nearest_anchors(
                x, zx, clusters.anchor[local], clusters.zanchor[local], block, delta, search, 1, opts=opts
            )
            todo = near[:, 0] >= 0
            joined = np.zeros(block.size, bool)
            if todo.any():
                joined[todo] = join_block(
                    x, block[todo], local[near[todo, 0]], clusters, delta, exact, labels, rows[:s], opts=opts
                )
            left = np.flatnonzero(~joined)
            if exact is True and left.size:
                # rows refused by their nearest cluster, or with no centroid within delta, try the
                # next nearest centroids within 2 delta: a row at distance t from the centroid of
                # n rows ends at t n / (n + 1) from the new centroid, so a join is possible up to
                # t = 2 delta (a singleton cluster)
                near, _ = nearest_anchors(
                    x,
                    zx,
                    clusters.anchor[local],
                    clusters.zanchor[local],
                    block[left],
                    2.0 * delta,
                    search,
                    opts.tries,
                    opts=opts,
                )
                for t in range(near.shape[1]):
                    todo = ~joined[left] & (near[:, t] >= 0)
                    if not todo.any():
                        break
                    sel = left[todo]
                    pool = np.concatenate([rows[:s], block[joined]])  # members so far, this block's included
                    joined[sel] = join_block(
                        x, block[sel], local[near[todo, t]], clusters, delta, exact, labels, pool, opts=opts
                    )
            rest = block[~joined]
        if rest.size > opts.base_rows and s > 0:
            rest = open_isolated(x, zx, rest, clusters, delta, labels, search, local_out := [], opts=opts)
            local = np.concatenate([local] + local_out)
        if rest.size:
            if s == 0 or rest.size <= opts.base_rows:
                new = sequential(x, rest, clusters, delta, exact, labels, opts=opts)
            else:
                new = leader_pass(x, zx, rest, clusters, delta, exact, labels, search, opts=opts)
            local = np.concatenate([local, new])
        s = e
    return local
