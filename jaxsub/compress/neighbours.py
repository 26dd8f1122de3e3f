"""Neighbour search of the streams: k-d trees on the anchors, in exact or projected coordinates.

* ``"kdtree"``: SciPy ``cKDTree`` on the cluster anchors (``eps``-approximate nearest, Arya et
  al. 1998).
* ``"projected"``: for high-dimensional rows (MNIST, d = 784), the k-d tree runs on ``dims``
  principal components plus the norm of the residual, a space in which distances are lower
  bounds of the true ones (so no anchor within reach is excluded by the projection); the
  ``candidates`` nearest anchors there are checked with true distances.

References
----------
S. Arya, D. Mount, N. Netanyahu, R. Silverman, A. Wu. An optimal algorithm for approximate
nearest neighbor searching in fixed dimensions. J. ACM 45 (1998).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxsub.compress.options import ClusterOptions
from jaxsub.compress.state import Clusters

__all__ = ["Search", "make_search", "nearest_anchors", "one_blas_thread", "open_isolated", "wide_coords"]


class Search(NamedTuple):
    """Search coordinates ``z = f(x)`` in which distances are lower bounds of true distances."""

    mean: np.ndarray | None
    basis: np.ndarray | None
    candidates: int
    eps: float
    wide: np.ndarray | None = None

    def coords(self, v: np.ndarray) -> np.ndarray:
        if self.basis is None:
            return v
        vc = v - self.mean
        proj = vc @ self.basis
        resid2 = np.einsum("ij,ij->i", vc, vc) - np.einsum("ij,ij->i", proj, proj)
        return np.column_stack([proj, np.sqrt(np.maximum(resid2, 0.0))])


def make_search(
    x: np.ndarray, method: str, rng: np.random.Generator, wide: bool = False, *, opts: ClusterOptions
) -> Search:
    """Search coordinates for ``method`` (``opts`` gives ``kdtree_eps``, ``projected_dims``,
    ``projected_candidates``).

    ``"kdtree"``: ``x`` itself. ``"projected"``: ``z = (P^T (x - m), ||(I - P P^T)(x - m)||)`` with
    ``P`` the top ``dims`` principal directions of (a subsample of ``ClusterOptions.pca_rows`` rows of) ``x``. For any
    two points, ``||x - y||^2 = ||P^T (x - y)||^2 + ||Q (x - y)||^2 >= ||z_x - z_y||^2``
    (orthogonal projection, and the reverse triangle inequality on the residual), so every
    centroid within ``delta`` of a row in ``x`` is within ``delta`` in ``z``; the ``candidates``
    nearest there are checked with true distances. With ``wide``, ``Search.wide`` holds
    ``ClusterOptions.isolation_dims`` directions (the first ``dims`` of them are ``P``) for :func:`isolated`.
    """
    if method == "kdtree":
        return Search(None, None, 1, opts.kdtree_eps)
    n, d = x.shape
    sub = x if n <= opts.pca_rows else x[rng.choice(n, opts.pca_rows, replace=False)]
    mean = sub.mean(axis=0)
    centred = (sub - mean).astype(np.float32)
    k = min(max(opts.projected_dims, opts.isolation_dims) if wide else opts.projected_dims, d)
    # randomised range finder with power iterations (Halko et al. 2011), in float32 (any
    # orthonormal basis gives valid lower bounds; the accuracy of the directions only moves
    # how tight they are): the top-k principal directions at O(n d k) instead of a full SVD
    with one_blas_thread(opts.blas_threads):  # small factorisations: threads only spin (seconds on shared cores)
        q = np.linalg.qr(centred @ rng.standard_normal((d, min(d, k + 8))).astype(np.float32))[0]
        for _ in range(opts.pca_power_iterations):
            q = np.linalg.qr(centred @ (centred.T @ q))[0]
        _, _, vt = np.linalg.svd(q.T @ centred, full_matrices=False)
    # orthonormal to float32 round-off (~1e-6): the screens' thresholds are widened far past that
    # (no second LAPACK factorisation: on a loaded machine each threaded one costs seconds)
    basis = np.ascontiguousarray(vt[:k].T.astype(np.float64))
    return Search(
        mean,
        np.ascontiguousarray(basis[:, : min(opts.projected_dims, d)]),
        opts.projected_candidates,
        opts.kdtree_eps,
        basis if wide else None,
    )


def one_blas_thread(threads: int):
    """Context limiting BLAS/LAPACK to ``threads`` threads (``threadpoolctl``, an optional dependency; without
    it, nothing). For the small factorisations of :func:`make_search` (``[1024, 72]`` QRs, a
    ``[72, 784]`` SVD): 0.016 s on one thread, but 3 s when OpenBLAS's threads spin on cores
    shared with other jobs (measured)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn and most stacks
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=threads, user_api="blas")


def wide_coords(x: np.ndarray, srch: Search):
    """``x`` in float32 and both search coordinates of the projected search from one projection on
    the wide basis: ``zx`` (``dims`` principal components + residual norm) and ``zw``
    (``ClusterOptions.isolation_dims`` of them + residual norm).

    A float32 projection (the coordinates only screen candidates; the decisions are float64):
    ``x W`` and ``x . m`` in one product, then ``(x - m) W = x W - m W`` and
    ``||x - m||^2 = ||x||^2 - 2 x . m + ||m||^2``.
    """
    x32 = x.astype(np.float32)
    prod = (x32 @ np.column_stack([srch.wide, srch.mean]).astype(np.float32)).astype(np.float64)
    pw = prod[:, :-1] - srch.mean @ srch.wide
    norm2 = np.einsum("ij,ij->i", x32, x32, dtype=np.float64) - 2.0 * prod[:, -1] + srch.mean @ srch.mean
    k = srch.basis.shape[1]
    pk = pw[:, :k]
    zx = np.column_stack([pk, np.sqrt(np.maximum(norm2 - np.einsum("ij,ij->i", pk, pk), 0.0))])
    zw = np.column_stack([pw, np.sqrt(np.maximum(norm2 - np.einsum("ij,ij->i", pw, pw), 0.0))])
    return x32, zx, zw


def nearest_anchors(x, zx, anchors, zanchors, rows, reach, search: Search, tries: int, *, opts: ClusterOptions):
    """Up to ``tries`` nearest anchors (indices into ``anchors``, -1: none) within ``reach`` of each row,
    sorted by true distance, ``[m, tries]``, and the distances."""
    from scipy.spatial import cKDTree

    k = min(max(search.candidates, tries), anchors.shape[0])
    workers = -1 if rows.size >= opts.parallel_query_rows else opts.workers
    tdist, idx = cKDTree(zanchors).query(zx[rows], k=k, eps=search.eps, distance_upper_bound=reach, workers=workers)
    idx = np.asarray(idx).reshape(rows.size, k)
    valid = idx < anchors.shape[0]
    cand = np.where(valid, idx, 0)
    if search.basis is None:  # the tree searched x itself: its distances are the true ones
        dist = np.asarray(tdist).reshape(rows.size, k)
    else:  # lower bounds: the candidates' true distances
        dist = np.full(idx.shape, np.inf)
        r, c = np.nonzero(valid)
        step = max(1, (1 << 22) // x.shape[1])
        for s in range(0, r.size, step):
            rr, cc = r[s : s + step], c[s : s + step]
            diff = x[rows[rr]] - anchors[cand[rr, cc]]
            dist[rr, cc] = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    if k > 1:
        order = np.argsort(dist, axis=1, kind="stable")[:, :tries]
        dist = np.take_along_axis(dist, order, axis=1)
        cand = np.take_along_axis(cand, order, axis=1)
    return np.where(dist <= reach, cand, -1), dist


def open_isolated(
    x, zx, rows, clusters: Clusters, delta, labels, search: Search, out: list, *, opts: ClusterOptions
) -> np.ndarray:
    """Open a singleton cluster for every row of ``rows`` with no other row of ``rows`` within ``2 delta``.

    Such a row can never share a cluster with another row of the set (a centroid within
    ``delta`` of it would need a member within ``2 delta``), so streaming it is needless.
    The search runs in the lower-bound coordinates (no false "isolated"). Appends the new ids
    to ``out`` and returns the other rows, in order.
    """
    from scipy.spatial import cKDTree

    z = zx[rows]
    workers = (
        -1 if opts.isolated_parallel_rows is not None and rows.size >= opts.isolated_parallel_rows else opts.workers
    )
    dist, _ = cKDTree(z).query(z, k=2, eps=0.0, distance_upper_bound=2.0 * delta * (1.0 + 1e-9), workers=workers)
    isolated = np.isinf(np.asarray(dist)[:, 1])
    if isolated.any():
        iso = rows[isolated]
        ids = clusters.open(x[iso], np.ones(iso.size, np.int64), np.zeros(iso.size))
        labels[iso] = ids
        out.append(ids)
    return rows[~isolated]
