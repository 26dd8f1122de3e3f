"""Radius-bounded streaming clustering (Song 2021, Algorithm 1), host-side NumPy/SciPy.

Clustering is a one-off preprocessing step; it runs on the host in float64
(NumPy, SciPy's k-d tree) and returns plain arrays that the JAX log-densities of
:mod:`jaxsub.compress._posterior` consume. Nothing here is compiled or cached.

Algorithm 1 (streaming). Rows arrive in order. Row ``x_i`` joins an existing
cluster if doing so keeps that cluster's radius
``delta_j = max_{i in S_j} ||x_i - mu_j||`` (``mu_j`` the member mean) at most
``delta``; otherwise it opens a new cluster. The neighbour search may be
approximate: missing a neighbour only opens an extra cluster, it never breaks
the radius guarantee.

Join rule (exact post-join radius). Every cluster keeps the sum and count of
its members, an *anchor* ``a_j`` (its mean after its last join) and
``far_j``, an upper bound on its members' distances to ``a_j``. Rows proposed
to cluster ``j`` join when the post-join radius stays ``<= delta``: first the
O(d) bound ``||x_i - mu_j'|| <= max(far_j, ||x - a_j||) + ||mu_j' - a_j||``
(triangle inequality, for every member and new row); where it is not enough,
the exact ``max_i ||x_i - mu_j'||`` over the cluster's members (only those in
the outer shell ``||x_i - a_j|| + ||mu_j' - a_j|| > delta`` are recomputed).
Unlike the running bound of the first implementation, which added every
centroid move and stopped clusters far below ``delta``, the rule lets
clusters grow to radius ``delta``: it spends the radius. After the stream,
the exact centroids and radii are recomputed in float64 and any cluster above
``delta`` (possible only through round-off of the running sums) is repaired by
:func:`_repair`, which splits off its farthest members. ``cluster`` therefore
always returns ``radii <= radius`` (tested on adversarial streams).

Leader + trim (``rule="trim"``, the default for ``d <= 16``; :func:`_stream_labels`). Checking the join rule row by
row costs NumPy calls per block and per cluster; most rows of a large set need no check. So
first a greedy pass with no radius check (every row joins the nearest centroid within
``delta``; centroids move to the member mean; same blocked stream as below), then
:func:`_trim`: per cluster, every member farther than ``delta`` from the centroid of the kept
members is dropped, all at once, until no cluster has one (exact float64 radius ``<= delta``
for every kept cluster; a few vectorised rounds). The dropped rows (the outer shells) first
try the trimmed clusters under the exact join rule (:func:`_join_back`), and the rest are
clustered again the same way; sets of at most ``_TRIM_MIN_ROWS`` rows, or sets the trim would
mostly drop, go to the exact-join stream below. ``rule="stream"`` runs the exact-join stream on
the whole data (the previous default, and the default for ``d > 16``: 3-5x slower on flights,
more clusters there at delta >= 0.05, fewer on synthetic blobs and on MNIST).

Vectorised stream (:func:`_leader_pass`). The stream is cut into blocks of
doubling length; a block's rows look up their nearest centroid among the
clusters opened before the block (one k-d-tree query per row) and join under
the rule above, in one vectorised step per cluster; rows not joined try the
three nearest centroids within ``2 delta`` (a row at distance ``t`` from the
centroid of ``n`` rows ends at ``t n / (n + 1)`` from the new one, so no join
is possible farther away); the rows left over (away
from every earlier cluster, or refused by the bound) are streamed recursively
by the same procedure, one row at a time only for sets of at most
``_BASE_ROWS`` rows and the first block. In the greedy pass of leader + trim, a sparse first
block is streamed off its list of pairs within ``2 delta`` (:func:`_sequential_greedy_pairs`):
only rows with an earlier neighbour do per-row work (same partitions on the benchmark's data).

Blocked stream (``rule="blocked"``, the default for ``d > 16`` when more than ``_TRIM_MIN_ROWS``
rows are left to stream; :func:`_blocked_pass`). Chunks of ``_CHUNK`` rows against *all* clusters
opened before the chunk: one float32 matrix product of lower bounds in the principal-component
coordinates, the ``_BLOCK_CANDIDATES`` anchors of smallest bound per row checked with their true
distance, and only anchors that could take the row alone (``t n / (n + 1) <= delta``) proposed,
nearest first, to the exact float64 join of :func:`_join_block` (members' distances to the
anchors read off running bounds, so only the outer shell is gathered); the rows left over are
streamed in order among themselves by :func:`_sequential`. On the first 5,000 MNIST images at
``delta = 0.2 / 0.3`` it opens fewer clusters than the exact-join stream (2,927 / 1,422 vs 2,991 /
1,492) at 0.6-0.85x its CPU time.

Merge rounds (``rule="merge"``, opt-in; :func:`_merge_labels`). Decisions in vectorised rounds
instead of row after row: the graph of row pairs within ``2 delta`` among each row's
``_MERGE_NEIGHBOURS`` screened nearest rows (:func:`_neighbour_graph`: float32 lower bounds by one
matrix product per block of rows, then the true distance of the candidates), then agglomerative
rounds (:func:`_merge_rounds`): every row starts alone; per round, every pair of clusters all of
whose cross pairs are edges gets its *exact* post-merge radius from Gram identities over the
edges (sorts and bincounts over all edges at once), and mutual nearest mergeable pairs merge (a
matching: no conflicts); nearly complete pairs of tight groups get their missing cross pairs
computed (:func:`_complete_pairs`), so clusters grow past the neighbour cap. Duplicate rows are
merged first (weights); isolated rows leave first as for the streams. On the first 5,000 MNIST
images it opens fewer clusters than the blocked stream (4,739 / 2,873 / 1,222 vs 4,753 / 2,927 /
1,422 at ``delta = 0.1 / 0.2 / 0.3``) at 0.91 / 0.92 / 1.17x its CPU time; on low-dimensional data
and tight blobs it is slower than leader + trim and may open more clusters (never more than the
exact-join stream on the test corpora); its screen is O(N^2) for d > 16 (docs/compress.md, session 16).

High-dimensional rows (the projected search, e.g. MNIST, d = 784). Before the stream,
:func:`_isolated` finds in bulk the rows with no other row within ``2 delta`` (a float32 screen
of lower bounds by one matrix product per block of rows against all rows, then the exact
float64 distance of the few screened candidates): they are singletons in any clustering of
radius ``<= delta`` and no row can join them, so they leave the stream (90 % of MNIST's rows at
``delta = 0.1``). The sets streamed one row at a time read every distance and post-join radius
off their Gram matrix (:func:`_sequential`: O(k) scalars per row instead of O(k d)).

Neighbour search (``method``):

* ``"kdtree"``: SciPy ``cKDTree`` on the cluster anchors (``eps``-approximate
  nearest, Arya et al. 1998).
* ``"projected"``: for high-dimensional rows (MNIST, d = 784), the k-d tree
  runs on ``dims`` principal components plus the norm of the residual, a space
  in which distances are lower bounds of the true ones (so no anchor within
  reach is excluded by the projection); the ``candidates`` nearest anchors
  there are checked with true distances.
* ``"auto"`` (default): ``"kdtree"`` for ``d <= 16``, ``"projected"`` above.

References
----------
Q. Song. Approximate Inference via Clustering. arXiv:2111.14219 (2021), Algorithm 1.
J. A. Hartigan. Clustering Algorithms. Wiley (1975), the leader algorithm.
S. Arya, D. Mount, N. Netanyahu, R. Silverman, A. Wu. An optimal algorithm for approximate
nearest neighbor searching in fixed dimensions. J. ACM 45 (1998).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from jaxsub.validation import check_choice, check_int, check_real

__all__ = ["Clustering", "cluster", "cluster_supervised", "METHODS", "RULES"]

#: Clustering rules accepted by :func:`cluster` (module docstring): leader + trim, the exact-join
#: stream, the blocked stream, merge rounds (opt-in), or ``"auto"``: trim for ``d <= 16``; above,
#: the blocked stream when more than ``_TRIM_MIN_ROWS`` rows are left to stream, else the exact-join
#: stream (on MNIST-like d = 784 rows trimming drops so many rows that it opens up to 2.5x more
#: clusters, no faster).
RULES = ("auto", "trim", "stream", "blocked", "merge")

#: Neighbour searches accepted by :func:`cluster` (``"auto"``: k-d tree when
#: ``d <= _AUTO_KDTREE_MAX_DIM``, projected k-d tree above).
METHODS = ("auto", "kdtree", "projected")

#: k-d trees degrade towards brute force as d grows; 16 is the usual
#: rule-of-thumb limit (N >> 2^d).
_AUTO_KDTREE_MAX_DIM = 16

#: SciPy cKDTree.query approximation factor: the returned neighbour is within
#: (1 + eps) x the true nearest distance.
_KDTREE_EPS = 1.0

#: ``"projected"``: principal components kept, and leaders checked per row.
_PROJECTED_DIMS = 16
_PROJECTED_CANDIDATES = 4

#: Threads of SciPy's k-d-tree queries; queries of at least ``_PARALLEL_QUERY_ROWS`` rows use every
#: core (the answer does not depend on the threads; small queries pay more in thread start-up).
#: 4,096 since session 14 (was 32,768): with the two settings below, flights wall x0.93-0.94 on an
#: idle 2-core machine at the same CPU time, x1.07 wall under load (docs/compress.md, session 14).
_WORKERS = 1
_PARALLEL_QUERY_ROWS = 4096

class Clustering(NamedTuple):
    """Result of :func:`cluster` / :func:`cluster_supervised`.

    All arrays are NumPy, in the *clustering space*: the features divided by
    ``scale`` (``scale = R = max_i ||x_i||`` when ``standardize=True``, else 1).
    Fit the model on that space too (``clustering.transform(x_test)`` applies
    the same scaling to new data).

    Attributes
    ----------
    centroids
        ``[c, d]`` float64, ``mu_j = mean of the members of cluster j``.
    counts
        ``[c]`` int64 multiplicities ``n_j`` (sum to ``N``).
    labels
        ``[N]`` int64 cluster index of every input row.
    radii
        ``[c]`` float64 ``delta_j = max_{i in S_j} ||x_i - mu_j||`` (exact, <= ``target_radius``).
    targets
        ``[c]`` per-centroid target for supervised data (class label, or the
        mean response for joint clustering), else ``None``.
    target_radius
        The requested ``delta``.
    scale
        ``R`` used to standardise (1.0 when not standardised).
    standardized
        Whether the features were divided by ``R``.
    method
        The neighbour search used.
    covariances
        ``[c, d, d]`` float64 within-cluster covariances
        ``C_j = (1 / n_j) sum_{i in S_j} (x_i - mu_j)(x_i - mu_j)^T`` (joint, with the
        response last, for ``cluster_supervised(mode="joint")``), used by the
        second-order correction of :func:`~jaxsub.compress.logdensity`; ``None`` when
        ``d > 64`` (the ``c d^2`` floats would dwarf the data).
    """

    centroids: np.ndarray
    counts: np.ndarray
    labels: np.ndarray
    radii: np.ndarray
    targets: np.ndarray | None
    target_radius: float
    scale: float
    standardized: bool
    method: str
    covariances: np.ndarray | None = None

    @property
    def num_clusters(self) -> int:
        """``c``, the number of clusters."""
        return int(self.counts.shape[0])

    @property
    def c(self) -> int:
        """Alias of :attr:`num_clusters` (the paper's notation)."""
        return self.num_clusters

    @property
    def num_data(self) -> int:
        """``N``."""
        return int(self.labels.shape[0])

    @property
    def rho(self) -> float:
        """Compression ratio ``rho = c / N`` (paper eq. 3)."""
        return self.num_clusters / self.num_data

    @property
    def radius(self) -> float:
        """Global radius ``delta = max_j delta_j`` actually achieved."""
        return float(self.radii.max()) if self.radii.size else 0.0

    def transform(self, x) -> np.ndarray:
        """Apply the clustering's standardisation to new features: ``x / scale``."""
        return np.asarray(x, dtype=np.float64) / self.scale

    def pseudodata(self):
        """The centroids as data for a likelihood: ``centroids`` or ``(centroids, targets)``."""
        return self.centroids if self.targets is None else (self.centroids, self.targets)


# ----------------------------------------------------------------------------- validation


def _as_features(x: Any, name: str = "x") -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"{name} must be a numeric array; got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"{name} must have shape [N, d] (or [N]); got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be non-empty; got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    finite = np.isfinite(arr)
    if not finite.all():
        bad = int(arr.size - np.count_nonzero(finite))
        raise ValueError(f"{name} must be finite; found {bad} NaN/inf value(s)")
    return arr


def _seed_from_key(key) -> int:
    if key is None:
        return 0
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return int(key)
    import jax

    data = np.asarray(jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key)
    return int(np.uint64(data.ravel().astype(np.uint64) @ np.arange(1, data.size + 1, dtype=np.uint64)))


# ----------------------------------------------------------------------------- leader stream (host, NumPy/SciPy)

#: First block of the doubling scheme (:func:`_leader_pass`) and the size below
#: which a set of rows is streamed one row at a time (:func:`_sequential`).
_FIRST_BLOCK = 512
_BASE_ROWS = 32

#: Relative margin under delta in the join rule: the bound is exact in real
#: arithmetic; the margin keeps float64 round-off of the running sums from
#: creating violators, and the final exact check + _repair makes it exact anyway.
_MARGIN = 1e-9

#: Shrink rounds of the vectorised join (:func:`_join_block`).
_JOIN_ROUNDS = 4

#: Nearest clusters a row tries in turn (the next one when refused by the radius check).
_TRIES = 3


class _Clusters:
    """Growable per-cluster state: anchor (the member mean after the last join) and its search
    coordinates, member sum, count, and ``far`` (a bound on the members' distance to the anchor)."""

    def __init__(self, dim: int, zdim: int, capacity: int, coords):
        capacity = max(capacity, 16)
        self.coords = coords
        self.anchor = np.empty((capacity, dim))
        self.zanchor = np.empty((capacity, zdim))
        self.sums = np.empty((capacity, dim))
        self.counts = np.empty(capacity, np.int64)
        self.far = np.empty(capacity)
        self.size = 0

    def open(self, sums: np.ndarray, counts: np.ndarray, far: np.ndarray, z: np.ndarray | None = None) -> np.ndarray:
        """Open clusters with the given member sums, counts and radius bounds (``z``: the search
        coordinates of their means, if known); returns their ids."""
        k = counts.size
        if self.size + k > self.counts.size:
            cap = max(2 * self.counts.size, self.size + k)
            for name in ("anchor", "zanchor", "sums", "counts", "far"):
                old = getattr(self, name)
                new = np.empty((cap,) + old.shape[1:], old.dtype)
                new[: self.size] = old[: self.size]
                setattr(self, name, new)
        ids = np.arange(self.size, self.size + k)
        self.sums[ids] = sums
        self.counts[ids] = counts
        self.far[ids] = far
        self.size += k
        self.move(ids, sums / counts[:, None], z)
        return ids

    def move(self, ids: np.ndarray, anchors: np.ndarray, z: np.ndarray | None = None) -> None:
        self.anchor[ids] = anchors
        self.zanchor[ids] = self.coords(anchors) if z is None else z


class _Search(NamedTuple):
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


def _make_search(x: np.ndarray, method: str, search: dict, rng: np.random.Generator, wide: bool = False) -> _Search:
    """Search coordinates for ``method``.

    ``"kdtree"``: ``x`` itself. ``"projected"``: ``z = (P^T (x - m), ||(I - P P^T)(x - m)||)`` with
    ``P`` the top ``dims`` principal directions of (a subsample of ``_PCA_ROWS`` rows of) ``x``. For any
    two points, ``||x - y||^2 = ||P^T (x - y)||^2 + ||Q (x - y)||^2 >= ||z_x - z_y||^2``
    (orthogonal projection, and the reverse triangle inequality on the residual), so every
    centroid within ``delta`` of a row in ``x`` is within ``delta`` in ``z``; the ``candidates``
    nearest there are checked with true distances. With ``wide``, ``_Search.wide`` holds
    ``_ISOLATION_DIMS`` directions (the first ``dims`` of them are ``P``) for :func:`_isolated`.
    """
    if method == "kdtree":
        return _Search(None, None, 1, search["eps"])
    n, d = x.shape
    sub = x if n <= _PCA_ROWS else x[rng.choice(n, _PCA_ROWS, replace=False)]
    mean = sub.mean(axis=0)
    centred = (sub - mean).astype(np.float32)
    k = min(max(search["dims"], _ISOLATION_DIMS) if wide else search["dims"], d)
    # randomised range finder with power iterations (Halko et al. 2011), in float32 (any
    # orthonormal basis gives valid lower bounds; the accuracy of the directions only moves
    # how tight they are): the top-k principal directions at O(n d k) instead of a full SVD
    with _one_blas_thread():  # small factorisations: threads only spin (seconds on shared cores)
        q = np.linalg.qr(centred @ rng.standard_normal((d, min(d, k + 8))).astype(np.float32))[0]
        for _ in range(_PCA_POWER_ITERATIONS):
            q = np.linalg.qr(centred @ (centred.T @ q))[0]
        _, _, vt = np.linalg.svd(q.T @ centred, full_matrices=False)
    # orthonormal to float32 round-off (~1e-6): the screens' thresholds are widened far past that
    # (no second LAPACK factorisation: on a loaded machine each threaded one costs seconds)
    basis = np.ascontiguousarray(vt[:k].T.astype(np.float64))
    return _Search(mean, np.ascontiguousarray(basis[:, : min(search["dims"], d)]), search["candidates"], search["eps"],
                   basis if wide else None)


def _one_blas_thread():
    """Context limiting BLAS/LAPACK to one thread (``threadpoolctl``, an optional dependency; without
    it, nothing). For the small factorisations of :func:`_make_search` (``[1024, 72]`` QRs, a
    ``[72, 784]`` SVD): 0.016 s on one thread, but 3 s when OpenBLAS's threads spin on cores
    shared with other jobs (docs/compress.md, session 9)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn and most stacks
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=_BLAS_THREADS, user_api="blas")


#: BLAS threads inside :func:`_one_blas_thread` (docs/compress.md, session 14 measures 1 vs 2).
_BLAS_THREADS = 1


#: Rows of the subsample whose principal directions :func:`_make_search` computes, and its power
#: iterations.
_PCA_ROWS = 1024
_PCA_POWER_ITERATIONS = 1

#: Principal directions of the isolation screen (:func:`_isolated`), rows per screened block, and
#: the most candidates per row checked exactly (rows with more are left to the stream).
_ISOLATION_DIMS = 64
_ISOLATION_BLOCK = 1024
_ISOLATION_CHECKS = 8
_ISOLATION_MIN_FRACTION = 0.1


def _isolated(x: np.ndarray, zw: np.ndarray, delta: float) -> np.ndarray:
    """Mask of the rows with no other row within ``2 delta`` (exact, float64).

    Such a row is a singleton in every clustering of radius ``<= delta`` (two members of a
    cluster are within ``2 delta`` of each other), and no other row can join it: it leaves
    the stream. Blocked and vectorised: a float32 screen of the lower bounds
    ``||z_x - z_y|| <= ||x - y||`` in the coordinates ``zw`` (``_ISOLATION_DIMS`` principal
    components + residual norm; one matrix product per block of rows against all rows, the
    squared distance read off directly as ``[-2 z, |z|^2, 1] . [z, 1, |z|^2]``), then the exact
    float64 distance of every candidate pair of the rows with at most ``_ISOLATION_CHECKS``
    candidates. Rows with more candidates are reported not isolated (they stay in the stream,
    which decides them exactly), so the mask errs only towards streaming a row. When fewer
    than ``_ISOLATION_MIN_FRACTION`` of the first block's rows are screened isolated (large
    ``delta``), the screen stops there and reports none.
    """
    n = x.shape[0]
    zz = np.einsum("ij,ij->i", zw, zw)
    one = np.ones(n)
    left = np.column_stack([-2.0 * zw, zz, one]).astype(np.float32)
    right = np.column_stack([zw, one, zz]).astype(np.float32)
    # float32 round-off of the screen, about 1e-7 of the squared norms: widen the threshold by
    # far more than that so no pair within 2 delta is screened out
    thr = np.float32(4.0 * delta * delta * (1.0 + 1e-3) + 1e-5 * (1.0 + float(zz.max())))
    # nearest screened distance over the upper block triangle only (the screen is symmetric):
    # the block of rows [s, e) against the rows [s, n); row minima cover the row's own block
    # and the rows after it, column minima give the later rows this block
    low = np.full(n, np.inf, np.float32)
    for s in range(0, n, _ISOLATION_BLOCK):
        e = min(n, s + _ISOLATION_BLOCK)
        lb2 = left[s:e] @ right[s:].T
        lb2[np.arange(e - s), np.arange(e - s)] = np.inf
        np.minimum(low[s:e], lb2.min(axis=1), out=low[s:e])
        if e < n:
            np.minimum(low[e:], lb2[:, e - s :].min(axis=0), out=low[e:])
        if s == 0 and e < n and np.count_nonzero(low[:e] > thr) < _ISOLATION_MIN_FRACTION * e:
            return np.zeros(n, bool)  # few isolated rows in the first block: not worth the screen
    out = low > thr
    rest = np.flatnonzero(~out)
    if rest.size:  # exact float64 check of every screened pair of the rows with few candidates
        cand = (left[rest] @ right.T) <= thr
        cand[np.arange(rest.size), rest] = False
        few = np.flatnonzero(np.count_nonzero(cand, axis=1) <= _ISOLATION_CHECKS)
        r, j = np.nonzero(cand[few])
        diff = x[rest[few[r]]] - x[j]
        close = np.einsum("ij,ij->i", diff, diff) <= 4.0 * delta * delta
        has = np.zeros(few.size, bool)
        has[r[close]] = True
        out[rest[few[~has]]] = True
    return out


def _nearest_anchors(x, zx, anchors, zanchors, rows, reach, search: _Search, tries: int):
    """Up to ``tries`` nearest anchors (indices into ``anchors``, -1: none) within ``reach`` of each row,
    sorted by true distance, ``[m, tries]``, and the distances."""
    from scipy.spatial import cKDTree

    k = min(max(search.candidates, tries), anchors.shape[0])
    workers = -1 if rows.size >= _PARALLEL_QUERY_ROWS else _WORKERS
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


def _group_max(values: np.ndarray, groups: np.ndarray, num: int) -> np.ndarray:
    out = np.zeros(num)
    np.maximum.at(out, groups, values)
    return out


def _segment_sums(xs: np.ndarray, starts: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Sums of the (weighted) rows of ``xs`` over the contiguous segments beginning at ``starts``.

    One sparse ``[segments, m]`` product: ``np.add.reduceat`` along axis 0 of a wide array is
    about 10x slower (it does not vectorise across the columns).
    """
    from scipy.sparse import csr_matrix

    m = xs.shape[0]
    w = np.ones(m) if weights is None else weights
    return np.asarray(csr_matrix((w, np.arange(m), np.r_[starts, m]), shape=(starts.size, m)) @ xs)


def _join_block(x, rows, cid, clusters: _Clusters, delta, exact, labels, pool, member_bounds=None) -> np.ndarray:
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
    and the check redone (``_JOIN_ROUNDS`` rounds; then the cluster admits no row). Accepted
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
    if exact is not True and _GREEDY_BINCOUNT and x.shape[1] <= _AUTO_KDTREE_MAX_DIM:
        # the greedy passes: every proposed row joins. Per-cluster sums by one bincount per column
        # (the rows added in stream order, as the sorted segments' sums: the same floats), no sort;
        # wide rows keep the one sparse product (a bincount per column would be d passes)
        num = clusters.size
        cnt = np.bincount(cid, minlength=num)
        gid = np.flatnonzero(cnt)
        xs = x[rows]
        clusters.sums[gid] += np.column_stack([np.bincount(cid, weights=xs[:, k], minlength=num)[gid]
                                               for k in range(xs.shape[1])])
        clusters.counts[gid] += cnt[gid]
        if exact:  # the reference greedy leader pass keeps its anchors at the leaders
            clusters.move(gid, clusters.sums[gid] / clusters.counts[gid][:, None])
        labels[rows] = cid
        return np.ones(rows.size, bool)
    order = np.argsort(cid, kind="stable")
    rows, cid = rows[order], cid[order]
    starts = np.flatnonzero(np.r_[True, cid[1:] != cid[:-1]])
    gid = cid[starts]
    ng = gid.size
    xs = x[rows]
    take = np.ones(rows.size, bool)
    if exact is True:
        grp = np.repeat(np.arange(ng), np.diff(np.r_[starts, rows.size]))
        da = xs - clusters.anchor[cid]  # distances to the anchors as they are now
        dist = np.sqrt(np.einsum("ij,ij->i", da, da))
        limit = delta * (1.0 - _MARGIN)
        lead, far0 = clusters.anchor[gid], clusters.far[gid]
        thr = np.full(ng, np.inf)
        pos = np.full(clusters.size, -1, np.int64)
        mem = None
        block_sums = _segment_sums(xs, starts)  # every proposed row taken (the usual case)
        for _ in range(_JOIN_ROUNDS):
            if mem is not None and member_bounds is not None:
                exact_mem[:] = False  # exact distances are to this round's mean only
            w = take.astype(np.float64)
            cnt = clusters.counts[gid] + np.add.reduceat(w, starts)
            added = block_sums if take.all() else _segment_sums(xs, starts, w)
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
    if take.all():
        clusters.sums[gid] += block_sums if exact is True else _segment_sums(xs, starts)
    else:
        clusters.sums[gid] += _segment_sums(xs, starts, take.astype(np.float64))
    clusters.counts[gid] += np.add.reduceat(take.astype(np.int64), starts)
    if exact:  # the reference greedy leader pass keeps its anchors at the leaders
        moved = gid[np.add.reduceat(take.astype(np.int64), starts) > 0]
        clusters.move(moved, clusters.sums[moved] / clusters.counts[moved][:, None])
    labels[rows[take]] = cid[take]
    accepted = np.empty_like(take)
    accepted[order] = take
    return accepted


def _sequential(x, rows, clusters: _Clusters, delta, exact, labels) -> np.ndarray:
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
    and the final exact check + :func:`_repair` makes the bound exact anyway.
    """
    if exact is not True:
        return _sequential_greedy(x, rows, clusters, delta, exact, labels)
    m = rows.size
    xr_all = x[rows]
    # offsets from the set's first row: smaller norms, less cancellation in the Gram expressions
    xc = xr_all - xr_all[0]
    limit = delta * (1.0 - _MARGIN)
    lim2 = limit * limit
    scale2 = float(np.einsum("ij,ij->i", xc, xc).max())
    # the Gram matrix in float32 where its round-off (below 1e-6 of the squared norms, with a
    # 10x margin subtracted from the limit) is negligible against delta^2: joins are then refused
    # a hair early, never accepted late; else float64
    slack = 1e-5 * (1.0 + scale2)
    blim = limit  # limit of the O(1) bound below
    use32 = slack <= 1e-3 * lim2 and x.shape[1] > _AUTO_KDTREE_MAX_DIM
    gram = _set_gram(xc, use32)
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
            for j in np.argsort(dist2)[:_TRIES]:
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
    sums, counts = _group_sums(xr_all, members, k)
    ids = _open_found(clusters, xr_all, members, sums, counts.astype(np.float64), sums / counts[:, None])
    labels[rows] = ids[members]
    return ids


def _set_gram(xc: np.ndarray, use32: bool) -> np.ndarray:
    """Gram matrix ``xc xc^T`` of a set streamed by :func:`_sequential` (float32 product when ``use32``), float64."""
    if use32:
        x32 = xc.astype(np.float32)
        return (x32 @ x32.T).astype(np.float64)
    return xc @ xc.T


def _open_found(clusters: _Clusters, xr_all, members, sums, cnt, cen) -> np.ndarray:
    """Open the clusters a sequential pass found (sums, counts, centroids; ``members[t]`` = the
    cluster of row ``t``), each with its exact farthest-member distance as radius; returns their ids."""
    diff = xr_all - cen[members]
    far = np.zeros(cnt.shape[0])
    np.maximum.at(far, members, np.sqrt(np.einsum("ij,ij->i", diff, diff)))
    return clusters.open(sums, cnt.astype(np.int64), far)


def _sequential_greedy(x, rows, clusters: _Clusters, delta, mode, labels) -> np.ndarray:
    """The greedy passes of :func:`_sequential` (no radius check): each row joins the nearest
    centroid (``mode == _GREEDY``; centroids move) or leader (``mode`` false; leaders stay) within
    ``delta`` among the clusters opened in this call, else it opens a new cluster."""
    if mode == _GREEDY and _GREEDY_PAIRS and rows.size > 1 and x.shape[1] <= _AUTO_KDTREE_MAX_DIM:  # k-d-tree pairs
        ids = _sequential_greedy_pairs(x, rows, clusters, delta, labels)
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
    ids = _open_found(clusters, xr_all, members, sums[:k], cnt[:k], cen[:k])
    clusters.move(ids, cen[:k])
    labels[rows] = ids[members]
    return ids


#: The greedy centroid stream (:func:`_sequential_greedy` with ``mode == _GREEDY``) decides only the
#: rows with an earlier row of the set within ``2 delta``, among those rows' clusters
#: (:func:`_sequential_greedy_pairs`; docs/compress.md, session 13).
_GREEDY_PAIRS = True
_GREEDY_PAIRS_MAX = 4
_GREEDY_PAIRS_PROBE = 32
_GREEDY_BINCOUNT = True


def _sequential_greedy_pairs(x, rows, clusters: _Clusters, delta, labels) -> np.ndarray | None:
    """The greedy centroid stream of :func:`_sequential_greedy`, deciding only rows with a neighbour.

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
    ``cluster`` returns the same partition as with the plain stream (docs/compress.md, session 13).
    Returns None (nothing done) for a dense set, more than ``_GREEDY_PAIRS_MAX`` pairs per row
    (judged first on the ``_GREEDY_PAIRS_PROBE`` first rows): the caller streams every row instead.
    """
    from scipy.spatial import cKDTree

    m = rows.size
    xr_all = x[rows]
    tree = cKDTree(xr_all)
    reach = 2.0 * delta * (1.0 + 1e-9)
    # a dense set (most rows join; e.g. the first block at large delta): the plain stream of every
    # row is cheaper than listing its pairs. Judged on the first rows' neighbour counts, then on all.
    probe = tree.query(xr_all[:_GREEDY_PAIRS_PROBE], k=_GREEDY_PAIRS_MAX + 2, distance_upper_bound=reach)[0]
    if np.isfinite(probe).sum() > (_GREEDY_PAIRS_MAX + 1) * probe.shape[0]:
        return None
    pairs = tree.query_pairs(reach, output_type="ndarray")
    if pairs.shape[0] > _GREEDY_PAIRS_MAX * m:
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
    ids = _open_found(clusters, xr_all, local, sums[lead], cnt[lead], cen[lead])
    clusters.move(ids, cen[lead])
    labels[rows] = ids[local]
    return ids


#: Sets of at least this many rows run the isolated-row self-query of :func:`_open_isolated` on every
#: core (``None``: one thread; the same answer; docs/compress.md, session 14).
_ISOLATED_PARALLEL_ROWS = 4096


def _open_isolated(x, zx, rows, clusters: _Clusters, delta, labels, search: _Search, out: list) -> np.ndarray:
    """Open a singleton cluster for every row of ``rows`` with no other row of ``rows`` within ``2 delta``.

    Such a row can never share a cluster with another row of the set (a centroid within
    ``delta`` of it would need a member within ``2 delta``), so streaming it is needless.
    The search runs in the lower-bound coordinates (no false "isolated"). Appends the new ids
    to ``out`` and returns the other rows, in order.
    """
    from scipy.spatial import cKDTree

    z = zx[rows]
    workers = -1 if _ISOLATED_PARALLEL_ROWS is not None and rows.size >= _ISOLATED_PARALLEL_ROWS else _WORKERS
    dist, _ = cKDTree(z).query(z, k=2, eps=0.0, distance_upper_bound=2.0 * delta * (1.0 + 1e-9), workers=workers)
    isolated = np.isinf(np.asarray(dist)[:, 1])
    if isolated.any():
        iso = rows[isolated]
        ids = clusters.open(x[iso], np.ones(iso.size, np.int64), np.zeros(iso.size))
        labels[iso] = ids
        out.append(ids)
    return rows[~isolated]


def _leader_pass(x, zx, rows, clusters: _Clusters, delta, exact, labels, search: _Search) -> np.ndarray:
    """Algorithm 1 over ``rows`` (stream order), vectorised by blocks; returns the ids of the clusters opened.

    The stream is cut into blocks ``[s, 2 s)`` (first block ``_FIRST_BLOCK`` rows). A block's
    rows first look up the nearest centroid among the clusters already opened by this pass (a
    k-d tree on the centroids, rebuilt per block, so O(log N) builds) and join it under the rule
    of :func:`_join_block`. The rows left over lie away from every earlier cluster (or were
    refused by the radius check); they are streamed by the same procedure recursively (one row
    at a time for at most ``_BASE_ROWS`` rows and in the first block), so the clusters they open
    are found by the later rows of the block. Every row is compared only with clusters opened
    by rows before it, as in Algorithm 1; only the order of joins inside a block changes.
    """
    local = np.empty(0, np.int64)
    n, s = rows.size, 0
    while s < n:
        e = min(n, max(2 * s, _FIRST_BLOCK))
        block = rows[s:e]
        rest = block
        if local.size:
            near, _ = _nearest_anchors(x, zx, clusters.anchor[local], clusters.zanchor[local], block, delta, search, 1)
            todo = near[:, 0] >= 0
            joined = np.zeros(block.size, bool)
            if todo.any():
                joined[todo] = _join_block(x, block[todo], local[near[todo, 0]], clusters, delta, exact, labels, rows[:s])
            left = np.flatnonzero(~joined)
            if exact is True and left.size:
                # rows refused by their nearest cluster, or with no centroid within delta, try the
                # next nearest centroids within 2 delta: a row at distance t from the centroid of
                # n rows ends at t n / (n + 1) from the new centroid, so a join is possible up to
                # t = 2 delta (a singleton cluster)
                near, _ = _nearest_anchors(
                    x, zx, clusters.anchor[local], clusters.zanchor[local], block[left], 2.0 * delta, search, _TRIES
                )
                for t in range(near.shape[1]):
                    todo = ~joined[left] & (near[:, t] >= 0)
                    if not todo.any():
                        break
                    sel = left[todo]
                    pool = np.concatenate([rows[:s], block[joined]])  # members so far, this block's included
                    joined[sel] = _join_block(x, block[sel], local[near[todo, t]], clusters, delta, exact, labels, pool)
            rest = block[~joined]
        if rest.size > _BASE_ROWS and s > 0:
            rest = _open_isolated(x, zx, rest, clusters, delta, labels, search, local_out := [])
            local = np.concatenate([local] + local_out)
        if rest.size:
            if s == 0 or rest.size <= _BASE_ROWS:
                new = _sequential(x, rest, clusters, delta, exact, labels)
            else:
                new = _leader_pass(x, zx, rest, clusters, delta, exact, labels, search)
            local = np.concatenate([local, new])
        s = e
    return local


#: Rows per chunk of the blocked stream (:func:`_blocked_pass`, ``rule="blocked"``).
_CHUNK = 512


def _blocked_pass(x, x32, xn32, z32, rows, clusters: _Clusters, delta, labels) -> np.ndarray:
    """Algorithm 1 over ``rows`` by chunks against all leaders at once; returns the ids of the clusters opened.

    For high-dimensional rows (MNIST, d = 784) the k-d-tree search of :func:`_leader_pass` is
    loose and its recursion costs Python work per row. Here the stream is cut into chunks of
    ``_CHUNK`` rows, and each chunk is compared with *every* cluster opened before it:

    1. lower bounds of the distances to all anchors by one float32 matrix product in the search
       coordinates ``z32`` (principal components + residual norm, where
       ``||z_x - z_a|| <= ||x - a||``; the anchors' ``clusters.zanchor``), read off as
       ``||z_x||^2 - 2 z_x . z_a + ||z_a||^2``;
    2. the ``_BLOCK_CANDIDATES`` anchors of smallest lower bound per row get their true distance
       (float32, ``x32``/``xn32`` the rows and their squared norms), and the ``_TRIES`` nearest
       of them within ``2 delta`` (widened by far more than float32 round-off) are proposed in
       turn to :func:`_join_block`, which decides every join in float64 with the exact post-join
       radius (several rows of a chunk joining one cluster are decided together);
    3. the rows no earlier cluster takes (they would open a cluster, or were refused) are
       streamed in order among themselves by :func:`_sequential` (Gram matrix, O(k) scalars per
       row), so the clusters they open are seen by the later rows of the chunk and by every
       later chunk.

    As in :func:`_leader_pass`, a row is compared only with clusters opened by rows before it;
    only the order of joins inside a chunk changes. The float32 screens can only miss a join (an
    extra cluster), never break the radius: the final exact check and :func:`_repair` make
    ``radii <= delta`` exact.
    """
    base = clusters.size
    cap = max(1024, rows.size // 4)
    q = z32.shape[1]
    za32 = np.empty((cap, q), np.float32)
    zan32 = np.empty(cap, np.float32)
    a32 = np.empty((cap, x.shape[1]), np.float32)  # float32 copies of the anchors and their squared norms
    an32 = np.empty(cap, np.float32)
    zn32 = np.einsum("ij,ij->i", z32, z32)
    scale2 = float(xn32[rows].max()) if rows.size else 0.0
    slack = 1e-5 * (1.0 + scale2)  # far above the float32 round-off of the squared distances
    reach1 = delta * (1.0 + 1e-3)
    reach2 = np.float32(4.0 * reach1 * reach1 + slack)
    # bounds on the members' distances to their anchors (_join_block's member_bounds)
    bounds = (np.zeros(x.shape[0]), np.zeros(base + cap))

    def refresh(ids):  # float32 copies of the anchors and search coordinates that moved or opened
        nonlocal za32, zan32, a32, an32
        if clusters.size - base > za32.shape[0]:
            grow = max(2 * za32.shape[0], clusters.size - base)
            za32 = np.resize(za32, (grow, q))
            zan32 = np.resize(zan32, grow)
            a32 = np.resize(a32, (grow, x.shape[1]))
            an32 = np.resize(an32, grow)
        a = clusters.zanchor[ids].astype(np.float32)
        za32[ids - base] = a
        zan32[ids - base] = np.einsum("ij,ij->i", a, a)
        a = clusters.anchor[ids].astype(np.float32)
        a32[ids - base] = a
        an32[ids - base] = np.einsum("ij,ij->i", a, a)

    for s in range(0, rows.size, _CHUNK):
        chunk = rows[s : s + _CHUNK]
        k = clusters.size - base
        joined = np.zeros(chunk.size, bool)
        if k:
            b = chunk.size
            lb = _chunk_bounds(z32[chunk], za32[:k], zan32[:k])
            m = min(_BLOCK_CANDIDATES, k)
            # rows with some anchor possibly within 2 delta, and their m anchors of smallest bound,
            # in no order (one selection pass; the candidates are ordered by their true distance below)
            live = np.flatnonzero(zn32[chunk] + lb.min(axis=1) <= reach2)
            if live.size:
                if m < k:
                    cl, valid = _screened_candidates(lb[live], reach2 + slack - zn32[chunk[live]], m)
                else:
                    cl, valid = np.broadcast_to(np.arange(k), (live.size, k)), None
                # ||x||^2 - 2 x . a + ||a||^2 in float32 (round-off ~1e-7 of the squared norms, far
                # under the slack): one gather of the float32 anchors, no d-wide difference
                xl = x32[chunk[live]]
                d2 = np.einsum("ik,ijk->ij", xl, a32[cl])
                d2 *= -2.0
                d2 += an32[cl]
                d2 += xn32[chunk[live]][:, None]
                # a row at distance t from the mean of n members ends at t n / (n + 1) from the
                # joined mean: a cluster further than delta (n + 1) / n cannot take it alone
                n = clusters.counts[base + cl].astype(np.float64)
                d2[d2 > (reach1 * (n + 1.0) / n) ** 2 + slack] = np.inf
                if valid is not None:
                    d2[~valid] = np.inf  # padding of rows with fewer than m anchors in reach
                order = np.argsort(d2, axis=1, kind="stable")[:, :_BLOCK_TRIES]
                near = np.take_along_axis(cl, order, axis=1)
                nd2 = np.take_along_axis(d2, order, axis=1)
                for t in range(near.shape[1]):
                    todo = ~joined[live] & (nd2[:, t] <= reach2)
                    if not todo.any():
                        break
                    sel = live[todo]
                    pool = np.concatenate([rows[:s], chunk[joined]])
                    cid = base + near[todo, t]
                    acc = _join_block(x, chunk[sel], cid, clusters, delta, True, labels, pool, bounds)
                    joined[sel] = acc
                    if acc.any():
                        refresh(np.unique(cid[acc]))
        left = chunk[~joined]
        if left.size:
            new = _sequential(x, left, clusters, delta, True, labels)
            refresh(new)
            if bounds[1].size < clusters.size:
                bounds = (bounds[0], np.concatenate([bounds[1], np.zeros(max(clusters.size, 2 * bounds[1].size) - bounds[1].size)]))
            bounds[1][new] = 0.0
            dl = x[left] - clusters.anchor[labels[left]]
            bounds[0][left] = np.sqrt(np.einsum("ij,ij->i", dl, dl))
    return np.arange(base, clusters.size)


def _chunk_bounds(zc: np.ndarray, za: np.ndarray, zan: np.ndarray) -> np.ndarray:
    """Lower bounds of the squared distances of the rows ``zc`` to the anchors ``za`` up to each row's
    own squared norm (constant along a row): ``zan - 2 zc . za``, ``[rows, anchors]`` float32."""
    lb = zc @ za.T
    lb *= -2.0
    lb += zan
    return lb


def _screened_candidates(lb: np.ndarray, thr: np.ndarray, m: int):
    """The ``m`` anchors of smallest lower bound ``lb [rows, k]`` per row, among those with
    ``lb <= thr`` (the others cannot be within reach), and a validity mask ``[rows, m]``.

    Rows with at most ``m`` anchors under their threshold take all of them (padded, invalid);
    only rows with more pay for a selection (``argpartition``). The candidates that can be
    proposed are those of a plain ``argpartition`` over every anchor (anchors over the threshold
    are refused by their true distance anyway), at a fraction of its cost: most rows have few
    anchors in reach.
    """
    q = lb <= thr[:, None]
    cnt = np.count_nonzero(q, axis=1)
    cand = np.zeros((lb.shape[0], m), np.int64)
    valid = np.zeros((lb.shape[0], m), bool)
    few = np.flatnonzero(cnt <= m)
    r, c = np.nonzero(q[few])
    rank = np.arange(r.size) - (np.cumsum(cnt[few]) - cnt[few])[r]
    cand[few[r], rank] = c
    valid[few[r], rank] = True
    many = np.flatnonzero(cnt > m)
    if many.size:
        cand[many] = np.argpartition(lb[many], m - 1, axis=1)[:, :m]
        valid[many] = True
    return cand, valid


#: Anchors per row of the blocked stream given their true distance (those of smallest lower bound),
#: and how many of them (the nearest that could take the row) are proposed in turn.
_BLOCK_CANDIDATES = 8
_BLOCK_TRIES = 3


# ----------------------------------------------------------------------------- merge rounds (rule="merge")

#: Rows per screened block of :func:`_neighbour_graph`, the candidates per row kept by its screen
#: (``_screened_candidates``), and the exact pairs per gathered batch (small batches: 0.45x the time of
#: 16,384-pair ones, whose 50 MB temporaries are paged in every batch).
_MERGE_BLOCK = 512
_MERGE_NEIGHBOURS = 32
_MERGE_BATCH = 1024

#: Host threads of :func:`_neighbour_graph`'s blocks and batches (:func:`_in_threads`; 1: the calling thread).
_GRAPH_THREADS = 1

#: Most merge rounds of :func:`_merge_rounds` (it stops earlier when no pair can merge), and the
#: matchings per round (1: only mutual nearest pairs; more: further mutual pairs among the clusters
#: left unmatched, from the same candidate list: fewer rounds, a few more clusters).
_MERGE_MAX_ROUNDS = 200
_MERGE_MATCHINGS = 2

#: Incomplete cluster pairs with at least ``_MERGE_COMPLETE`` of their cross pairs in the graph, every one
#: of them within ``_MERGE_COMPLETE_REACH delta``, get the rest computed (:func:`_complete_pairs`). ``0``:
#: never — MNIST at delta = 0.2 / 0.3 in 0.84 / 0.89x the default's CPU time instead of 0.92 / 1.17x, but
#: clusters capped near ``_MERGE_NEIGHBOURS + 1`` rows: many more clusters on tight blobs (session 16).
_MERGE_COMPLETE = 0.5
_MERGE_COMPLETE_REACH = 1.4


def _in_threads(fn, items):
    """``[fn(item) for item in items]``, the items split over ``_GRAPH_THREADS`` host threads (each item
    computed by the same call whichever thread runs it, so the results do not depend on the threads;
    the products, selections and gathers of :func:`_neighbour_graph` release the GIL)."""
    items = list(items)
    if _GRAPH_THREADS <= 1 or len(items) < 2:
        return [fn(item) for item in items]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(_GRAPH_THREADS) as pool:
        return list(pool.map(fn, items))


def _neighbour_graph(xc32: np.ndarray, sq32: np.ndarray, z32: np.ndarray, delta: float):
    """Row pairs within ``2 delta`` among each row's screened nearest rows, both directions:
    ``(i, j, g_ij)`` with ``g_ij = xc_i . xc_j`` (float32 product, float64 array), ``i`` ascending.

    ``xc32`` are the rows less their mean (smaller norms, less round-off; float32, or float64 where
    float32 round-off is not negligible against ``delta^2``), ``sq32`` their squared norms, ``z32``
    search coordinates with ``||z_i - z_j|| <= ||x_i - x_j||`` (the projected
    search's principal components + residual norm, or the rows themselves). Per block of
    ``_MERGE_BLOCK`` rows, one float32 product of lower bounds against all rows
    (:func:`_chunk_bounds`); the ``_MERGE_NEIGHBOURS`` rows of smallest bound within reach
    (:func:`_screened_candidates`) are candidates. The candidate pairs are deduplicated (a pair found
    from both rows is computed once) and get their true squared distance
    ``||x_i||^2 + ||x_j||^2 - 2 g_ij``; pairs within ``2 delta`` (widened by far more than float32
    round-off) are the edges. Two members of a cluster of radius ``<= delta`` are within ``2 delta``
    of each other, so :func:`_merge_rounds` merges only clusters all of whose cross pairs are edges.
    """
    n = xc32.shape[0]
    zn = np.einsum("ij,ij->i", z32, z32)
    slack = np.float32(1e-5 * (1.0 + float(sq32.max())))
    reach2 = np.float32(4.0 * delta * delta * (1.0 + 1e-3) ** 2) + slack
    m = min(_MERGE_NEIGHBOURS, n - 1)

    def block_keys(s):  # candidate pairs of the rows [s, s + _MERGE_BLOCK)
        e = min(n, s + _MERGE_BLOCK)
        lb = _chunk_bounds(z32[s:e], z32, zn)
        lb[np.arange(e - s), np.arange(s, e)] = np.inf  # not its own neighbour
        cand, valid = _screened_candidates(lb, reach2 + slack - zn[s:e], m)
        r, c = np.nonzero(valid)
        i, j = s + r, cand[r, c]
        return np.minimum(i, j) * n + np.maximum(i, j)

    keys = _in_threads(block_keys, range(0, n, _MERGE_BLOCK))
    key = np.unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)
    a, b = key // n, key % n
    g = np.empty(key.size, np.float64)

    def products(s):  # gathered products in batches (bounded memory)
        g[s : s + _MERGE_BATCH] = np.einsum("ij,ij->i", xc32[a[s : s + _MERGE_BATCH]], xc32[b[s : s + _MERGE_BATCH]])

    _in_threads(products, range(0, key.size, _MERGE_BATCH))
    near = sq32[a] + sq32[b] - 2.0 * g <= reach2
    a, b, g = a[near], b[near], g[near]
    i, j = np.concatenate([a, b]), np.concatenate([b, a])
    order = np.argsort(i, kind="stable")
    return i[order], j[order], np.concatenate([g, g])[order]


def _merge_rounds(sq, ei, ej, eg, delta, weights=None, eps=1e-5, rows=None):
    """Agglomerative clustering of the rows by vectorised rounds of exact merges; returns labels (ids in ``[0, n)``).

    Every row (a distinct row of weight ``w_i``, its multiplicity) starts as its own cluster. A
    cluster ``A`` keeps its weight ``n_A``, its number of distinct rows ``m_A``, ``ss_A = ||S_A||^2``
    (``S_A = sum_{i in A} w_i x_i``) and, for each member ``i``, ``own_i = x_i . S_A``; the edges
    ``(i, j, g_ij = x_i . x_j)`` are those of :func:`_neighbour_graph` (``sq_i = g_ii``). A round, with
    sorts and bincounts over all edges at once only (no per-row Python):

    1. per row ``i`` and neighbouring cluster ``B``: ``XS_iB = sum_{j in B} w_j g_ij`` and the number
       of edges from ``i`` into ``B`` (the edges grouped by ``(i, label_j)``: one sort, bincounts);
    2. per cluster pair: ``C_AB = S_A . S_B = sum_{i in A} w_i XS_iB`` and the cross edges' count; the
       pair is *complete* when every cross pair is an edge (count ``= m_A m_B``) — else some cross
       pair is farther than ``2 delta`` or was not screened: nearly complete pairs of tight groups get
       their missing cross pairs computed (:func:`_complete_pairs`), the others' edges leave the graph
       (no cluster will hold both);
    3. the exact post-merge radius of a complete pair from the Gram identities (``n = n_A + n_B``,
       ``mu`` the merged mean): ``||x_i - mu||^2 = sq_i - 2 (own_i + XS_iB) / n +
       (ss_A + 2 C_AB + ss_B) / n^2`` for ``i in A`` (symmetrically for ``B``), maximised over the
       members, each term plus ``eps`` times the magnitudes it cancels (``eps = 1e-5`` for float32
       products, far above their round-off); pairs with radius ``<= delta`` can merge;
    4. mutual nearest pairs merge: each cluster's mergeable partner of smallest centroid distance
       ``||mu_A - mu_B||^2 = ss_A / n_A^2 + ss_B / n_B^2 - 2 C_AB / (n_A n_B)`` (ties: lower pair
       index); the pairs that are each other's choice form a matching, so the merges of one round
       never conflict (``_MERGE_MATCHINGS > 1``: further matchings among the clusters left over).
       ``own``, ``ss``, ``n`` and ``m`` are updated from ``XS`` and ``C``.

    Rounds repeat until no pair can merge. The final exact float64 check and :func:`_repair` of
    :func:`cluster` make the radius exact whatever the round-off.
    """
    n = sq.size
    w = np.ones(n) if weights is None else np.asarray(weights, np.float64)
    lab = np.arange(n)
    cnt, ent = w.copy(), np.ones(n)
    ss = w * w * sq
    own = w * sq
    lim2 = (delta * (1.0 - _MARGIN)) ** 2
    for _ in range(_MERGE_MAX_ROUNDS):
        la, lb = lab[ei], lab[ej]
        cross = la != lb
        ei, ej, eg, la, lb = ei[cross], ej[cross], eg[cross], la[cross], lb[cross]
        if not ei.size:
            break
        # 1. entries (i, B): XS_iB and the number of edges from i into B
        e2x, head = _groups(ei * n + lb)
        xs = np.bincount(e2x, weights=eg * w[ej], minlength=head.size)
        xcount = np.bincount(e2x, minlength=head.size).astype(np.float64)
        xi, xb = ei[head], lb[head]
        xa = lab[xi]
        # 2. per unordered cluster pair {A, B}: C_AB (each side's entries sum to it: half the total)
        #    and the cross edges' count; pairs that are not complete lose their edges for good
        x2p, phead = _groups(np.minimum(xa, xb) * n + np.maximum(xa, xb))
        pa, pb = np.minimum(xa, xb)[phead], np.maximum(xa, xb)[phead]
        cg = 0.5 * np.bincount(x2p, weights=w[xi] * xs, minlength=phead.size)
        cover = 0.5 * np.bincount(x2p, weights=xcount, minlength=phead.size)
        complete = cover >= ent[pa] * ent[pb] - 0.5
        if not complete.all():
            fill = np.zeros(pa.size, bool)
            if rows is not None and _MERGE_COMPLETE:  # nearly complete pairs: their cross pairs, computed
                fill = ~complete & (cover >= _MERGE_COMPLETE * ent[pa] * ent[pb])
                if _MERGE_COMPLETE_REACH is not None and fill.any():
                    # ... only where every known cross pair is within _MERGE_COMPLETE_REACH delta (tight
                    # groups, e.g. blobs; not the loose pairs of MNIST at large delta, costly and rarely mergeable)
                    far2 = np.full(pa.size, -np.inf)
                    np.maximum.at(far2, x2p[e2x], sq[ei] + sq[ej] - 2.0 * eg)
                    fill &= far2 <= (_MERGE_COMPLETE_REACH * delta) ** 2
            stay = (complete | fill)[x2p[e2x]]
            ei, ej, eg = ei[stay], ej[stay], eg[stay]
            if fill.any():
                ei, ej, eg = _complete_pairs(rows, sq, lab, ent, pa[fill], pb[fill], delta, ei, ej, eg)
        # 3. exact post-merge radius of every pair, maximised over the members of both sides
        nm = cnt[pa] + cnt[pb]
        ssm = ss[pa] + ss[pb] + 2.0 * cg
        cross_term = 2.0 * (own[xi] + xs) / nm[x2p]
        mean_term = ssm[x2p] / (nm[x2p] * nm[x2p])
        term = sq[xi] - cross_term + mean_term + eps * (sq[xi] + np.abs(cross_term) + mean_term)
        rad2 = np.full(pa.size, -np.inf)
        np.maximum.at(rad2, x2p, term)
        ok = np.flatnonzero(complete & (rad2 <= lim2))
        if not ok.size:
            break
        # 4. mutual nearest mergeable partners (one or more matchings)
        dist2 = ss[pa[ok]] / cnt[pa[ok]] ** 2 + ss[pb[ok]] / cnt[pb[ok]] ** 2 - 2.0 * cg[ok] / (cnt[pa[ok]] * cnt[pb[ok]])
        ok = ok[np.argsort(dist2, kind="stable")]
        takes = []
        for _ in range(_MERGE_MATCHINGS):
            rank = np.arange(ok.size)
            first = np.full(n, ok.size)
            np.minimum.at(first, pa[ok], rank)
            np.minimum.at(first, pb[ok], rank)
            mutual = (first[pa[ok]] == rank) & (first[pb[ok]] == rank)
            takes.append(ok[mutual])
            matched = np.zeros(n, bool)
            matched[pa[ok[mutual]]] = matched[pb[ok[mutual]]] = True
            ok = ok[~matched[pa[ok]] & ~matched[pb[ok]]]
            if not ok.size:
                break
        take = np.concatenate(takes)
        a, b = pa[take], pb[take]
        partner = np.full(n, -1)
        partner[a], partner[b] = b, a
        hit = np.flatnonzero(partner[xa] == xb)
        own[xi[hit]] += xs[hit]
        ss[a], cnt[a], ent[a] = ssm[take], nm[take], ent[a] + ent[b]
        newid = np.arange(n)
        newid[b] = a
        lab = newid[lab]
    return lab


def _complete_pairs(rows, sq, lab, ent, pa, pb, delta, ei, ej, eg):
    """The edges with every cross pair of the cluster pairs ``(pa, pb)`` whose cross pairs are all within
    ``2 delta`` (their existing cross edges replaced by the full set, both directions); pairs with a
    cross pair beyond ``2 delta`` lose their cross edges (no cluster will hold both).

    ``rows`` are the coordinates the edges' products were computed on (``sq`` their squared norms),
    ``ent`` the clusters' numbers of distinct rows. Lets a cluster grow past the screen's
    ``_MERGE_NEIGHBOURS`` cap (tight blobs): the cross pairs missing from the screened graph are
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
    for s in range(0, i.size, _MERGE_BATCH):
        g[s : s + _MERGE_BATCH] = np.einsum("ij,ij->i", rows[i[s : s + _MERGE_BATCH]], rows[j[s : s + _MERGE_BATCH]])
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


def _groups(key: np.ndarray):
    """Group ids of ``key`` in ascending key order (``inverse``, one per element) and the index of
    each group's first element in the input (``head``): one stable sort, no hashing."""
    order = np.argsort(key, kind="stable")
    ks = key[order]
    first = np.r_[True, ks[1:] != ks[:-1]]
    inverse = np.empty(key.size, np.int64)
    inverse[order] = np.cumsum(first) - 1
    return inverse, order[first]


def _distinct_rows(x: np.ndarray):
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


def _kdtree_graph(xc: np.ndarray, delta: float):
    """:func:`_neighbour_graph` for low-dimensional rows (``d <= _AUTO_KDTREE_MAX_DIM``): the
    ``_MERGE_NEIGHBOURS`` nearest rows within ``2 delta`` by one exact k-d-tree query (float64,
    O(N log N) instead of the O(N^2) screen), ``g_ij = (||x_i||^2 + ||x_j||^2 - d_ij^2) / 2``."""
    from scipy.spatial import cKDTree

    n = xc.shape[0]
    k = min(_MERGE_NEIGHBOURS + 1, n)
    workers = -1 if n >= _PARALLEL_QUERY_ROWS else _WORKERS
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


def _merge_labels(x: np.ndarray, z: np.ndarray | None, delta: float) -> np.ndarray:
    """Labels of ``rule="merge"``: the distinct rows (:func:`_distinct_rows`, multiplicities as weights),
    the graph of rows within ``2 delta`` among them (:func:`_neighbour_graph` on the search
    coordinates ``z``, float32 products on the rows less their mean; ``z = None``: low-dimensional
    rows, :func:`_kdtree_graph` in float64), then :func:`_merge_rounds`."""
    first, inv = _distinct_rows(x)
    if first.size == x.shape[0]:  # no duplicates: the rows in their order, no copy
        first = inv = np.arange(x.shape[0])
        u = x
    else:
        u = x[first]
    weights = np.bincount(inv).astype(np.float64)
    if z is None:
        xc = u - u.mean(axis=0)
        lab = _merge_rounds(np.einsum("ij,ij->i", xc, xc), *_kdtree_graph(xc, delta), delta, weights, eps=1e-12, rows=xc)
    else:
        xc = u - u.mean(axis=0)
        # float32 products where their round-off (eps = 1e-5 of the squared norms, a 10x margin) is
        # negligible against delta^2 (as in _sequential), else float64 (e.g. rows far from the origin)
        use32 = 1e-5 * (1.0 + float(np.einsum("ij,ij->i", xc, xc).max())) <= 1e-3 * delta * delta
        xc = xc.astype(np.float32) if use32 else xc
        sqc = np.einsum("ij,ij->i", xc, xc)
        with _one_blas_thread():
            ei, ej, eg = _neighbour_graph(xc, sqc, np.ascontiguousarray(z if u is x else z[first], np.float32), delta)
        lab = _merge_rounds(sqc.astype(np.float64), ei, ej, eg, delta, weights, eps=1e-5 if use32 else 1e-12, rows=xc)
    return lab[inv]

#: Leader + trim: sets of at most this many rows, and sets the trim leaves mostly unclustered, go
#: to the exact-join stream (:func:`_leader_pass` with ``exact``) instead.
_TRIM_MIN_ROWS = 2048
_TRIM_MIN_PROGRESS = 0.5

#: ``exact`` value of the greedy pass of leader + trim: rows join the nearest centroid within delta
#: (anchors move to the member mean), no radius check.
_GREEDY = "centroid"


def _group_sums(xs: np.ndarray, lab: np.ndarray, num: int):
    """Per-group sums ``[num, d]`` and counts ``[num]`` of the rows ``xs`` with group ids ``lab``."""
    from scipy.sparse import csr_matrix

    counts = np.bincount(lab, minlength=num)
    # one sparse [num, m] indicator product: a counting sort, no comparison sort of the labels
    indicator = csr_matrix((np.ones(lab.size), (lab, np.arange(lab.size))), shape=(num, lab.size))
    return np.asarray(indicator @ xs), counts


def _trim(x: np.ndarray, rows: np.ndarray, lab: np.ndarray, delta: float) -> np.ndarray:
    """Members kept (mask over ``rows``) so that every group of ``lab`` has exact radius ``<= delta``.

    Each round recomputes the centroids of the kept members of the groups still under check
    and drops, all at once, every member farther than ``delta`` from its centroid; groups
    that dropped nothing are done (their kept members are all within ``delta`` of their
    centroid, which no longer changes). A group shrinks every round it stays under check, so
    the loop ends.
    """
    limit = delta * (1.0 - _MARGIN)
    num = int(lab.max()) + 1 if lab.size else 0
    keep = np.ones(rows.size, bool)
    sub = np.arange(rows.size)
    while sub.size:
        lg = lab[sub]
        xs = x[rows[sub]]
        sums, counts = _group_sums(xs, lg, num)
        diff = xs - sums[lg] / counts[lg][:, None]
        bad = np.einsum("ij,ij->i", diff, diff) > limit * limit
        if not bad.any():
            break
        keep[sub[bad]] = False
        again = np.zeros(num, bool)
        again[lg[bad]] = True
        sub = sub[~bad & again[lg]]
    return keep


def _join_back(x, zx, kept, dropped, ids, clusters: _Clusters, delta, labels, search: _Search) -> np.ndarray:
    """Rows the trim dropped try the nearest trimmed clusters under the exact join rule; returns the others.

    The state of the clusters ``ids`` is reset to their kept members (sum, count, anchor = mean,
    ``far`` = exact radius); every dropped row is proposed to its ``_TRIES`` nearest clusters
    within ``2 delta`` in turn (:func:`_join_block`, exact post-join radius).
    """
    lab = labels[kept]
    pos = np.full(clusters.size, -1, np.int64)
    pos[ids] = np.arange(ids.size)
    xk = x[kept]
    sums, counts = _group_sums(xk, pos[lab], ids.size)
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
    near, _ = _nearest_anchors(x, zx, clusters.anchor[live], clusters.zanchor[live], dropped, 2.0 * delta, search, _TRIES)
    joined = np.zeros(dropped.size, bool)
    pool = kept
    for t in range(near.shape[1]):
        todo = ~joined & (near[:, t] >= 0)
        if not todo.any():
            break
        sel = np.flatnonzero(todo)
        joined[sel] = _join_block(x, dropped[sel], live[near[sel, t]], clusters, delta, True, labels, pool)
        pool = np.concatenate([kept, dropped[joined]])
    return dropped[~joined]


def _wide_coords(x: np.ndarray, srch: _Search):
    """``x`` in float32 and both search coordinates of the projected search from one projection on
    the wide basis: ``zx`` (``dims`` principal components + residual norm) and ``zw``
    (``_ISOLATION_DIMS`` of them + residual norm).

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


def _stream_labels(x: np.ndarray, delta: float, method: str, search: dict, rng, exact: bool = True, rule: str = "auto") -> np.ndarray:
    """Cluster labels of the rows of ``x`` (before the final exact check).

    ``exact=False``: the greedy leader pass alone (the reference of the benchmark). ``exact``:
    leader + trim (module docstring): the greedy leader pass, then :func:`_trim` drops the
    members beyond ``delta`` of every cluster's centroid, and the dropped rows are clustered
    again the same way; small sets, and sets the trim mostly drops, go to the exact-join stream.
    """
    auto = rule == "auto"
    if auto:
        rule = "trim" if x.shape[1] <= _AUTO_KDTREE_MAX_DIM else "blocked"
    if rule in ("blocked", "merge") and exact is not True:
        rule = "stream"  # the greedy references stream as before
    # the bulk screen of isolated rows (exact-join stream of a large high-dimensional set) needs
    # the wide basis; small sets and the other paths only the search directions
    screen = exact is True and rule in ("stream", "blocked") and method == "projected" and x.shape[0] > _TRIM_MIN_ROWS
    if rule == "merge":  # one graph of all rows in the wide coordinates (or the rows themselves)
        srch = _make_search(x, method, search, rng, wide=method == "projected")
        if srch.wide is None:  # the k-d-tree search: exact neighbours of the rows themselves
            return _merge_labels(x, None if srch.basis is None else srch.coords(x), delta)
        zw = _wide_coords(x, srch)[2]
        iso = _isolated(x, zw, delta) if x.shape[0] > _TRIM_MIN_ROWS else np.zeros(x.shape[0], bool)
        if not iso.any():
            return _merge_labels(x, zw, delta)
        # rows with no other row within 2 delta are singletons (as for the streams): the graph and
        # the rounds run on the others (MNIST at delta = 0.1: 90 % of the rows leave)
        labels = np.arange(x.shape[0])
        rest = np.flatnonzero(~iso)
        if rest.size:
            labels[rest] = rest[_merge_labels(x[rest], zw[rest], delta)]
        return labels
    srch = _make_search(x, method, search, rng, wide=screen)
    labels = np.full(x.shape[0], -1, np.int64)
    if srch.wide is None:
        zx = zw = srch.coords(x)
    else:  # both search coordinates from one projection on the wide basis
        x32, zx, zw = _wide_coords(x, srch)
    clusters = _Clusters(x.shape[1], zx.shape[1], max(1024, x.shape[0] // 64), srch.coords)
    rows = np.arange(x.shape[0])
    if exact and rule == "trim":
        while rows.size > _TRIM_MIN_ROWS:
            ids = _leader_pass(x, zx, rows, clusters, delta, _GREEDY, labels, srch)
            local = np.full(clusters.size, -1, np.int64)
            local[ids] = np.arange(ids.size)
            keep = _trim(x, rows, local[labels[rows]], delta)
            if keep.mean() < _TRIM_MIN_PROGRESS:
                break  # most rows dropped: leave this set to the exact-join stream
            labels[rows[~keep]] = -1
            rows = _join_back(x, zx, rows[keep], rows[~keep], ids, clusters, delta, labels, srch)
        labels[rows] = -1
    iso = None
    if screen:
        # rows with no other row within 2 delta are singletons whatever the order, and no row
        # can join them: label them apart, stream the others (MNIST at delta = 0.1: 90 %)
        iso = np.flatnonzero(_isolated(x, zw, delta))
        rows = rows[~np.isin(rows, iso)]
    if rule == "blocked" and auto and rows.size <= _TRIM_MIN_ROWS:
        rule = "stream"  # few rows left to stream (e.g. MNIST at delta = 0.1 after the screen): faster
    if rule == "blocked":
        x32 = x.astype(np.float32) if srch.wide is None else x32
        if srch.wide is not None:  # the search coordinates of the anchors: the wide ones
            clusters = _Clusters(x.shape[1], zw.shape[1], max(1024, x.shape[0] // 64), srch._replace(basis=srch.wide).coords)
        zb = zx if srch.wide is None else zw
        # one BLAS thread: the chunks' products are small, and OpenBLAS threads spinning on shared
        # cores cost 3-4x the CPU time of the whole pass (docs/compress.md, session 10)
        with _one_blas_thread():
            _blocked_pass(x, x32, np.einsum("ij,ij->i", x32, x32), zb.astype(np.float32), rows, clusters, delta, labels)
    else:
        _leader_pass(x, zx, rows, clusters, delta, exact, labels, srch)
    if iso is not None and iso.size:
        labels[iso] = clusters.size + np.arange(iso.size)
    return labels


# ----------------------------------------------------------------------------- exact statistics and repair


def _exact_stats(x: np.ndarray, labels: np.ndarray, num: int):
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
        sums, _ = _group_sums(xm - ref[pos[lab]], pos[lab], big.size)
        centroids[big] = ref + sums / counts[big][:, None]
        diff = xm - centroids[lab]
        dm = np.sqrt(np.einsum("ij,ij->i", diff, diff))
        dist[multi] = dm
        np.maximum.at(radii, lab, dm)
    return centroids, counts, radii, dist


#: Largest dimension for which :func:`cluster` stores per-cluster covariances.
_MAX_COVARIANCE_DIM = 64


def _covariances(x: np.ndarray, labels: np.ndarray, centroids: np.ndarray, counts: np.ndarray):
    """Within-cluster covariances ``[c, d, d]`` (float64), or ``None`` when ``d > _MAX_COVARIANCE_DIM``."""
    n, d = x.shape
    if d > _MAX_COVARIANCE_DIM:
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

    if _COV_THREADS > 1 and n * len(pairs) >= _COV_THREAD_MIN:
        # every entry by the same call as on one thread (the same floats); NumPy releases the GIL
        # in the products and the bincounts, so a second host thread can take half of them
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(_COV_THREADS - 1) as pool:
            futures = [pool.submit(fill, pairs[t::_COV_THREADS]) for t in range(1, _COV_THREADS)]
            fill(pairs[0::_COV_THREADS])
            for f in futures:
                f.result()
    else:
        fill(pairs)
    return cov / counts[:, None, None]


#: Host threads of :func:`_covariances` (entries split over threads, the same floats; ``np.bincount``
#: releases the GIL) when the products cover at least ``_COV_THREAD_MIN`` numbers (docs/compress.md,
#: session 14).
_COV_THREADS = 2
_COV_THREAD_MIN = 1 << 20


def _relabel(labels: np.ndarray) -> tuple[np.ndarray, int]:
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


def _repair(x: np.ndarray, labels: np.ndarray, delta: float):
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
    labels, num = _relabel(labels)
    while True:
        centroids, counts, radii, dist = _exact_stats(x, labels, num)
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


# ----------------------------------------------------------------------------- public API


def _search_settings(method: str, dim: int, kwargs: dict):
    """Validated neighbour-search settings (defaults filled in) and the resolved method."""
    unknown = set(kwargs) - {"kdtree_eps", "projected_dims", "projected_candidates"}
    if unknown:
        raise ValueError(f"unknown search setting(s) {sorted(unknown)}")
    search = dict(
        eps=check_real("kdtree_eps", kwargs.get("kdtree_eps", _KDTREE_EPS), low=0.0, low_closed=True),
        dims=check_int("projected_dims", kwargs.get("projected_dims", _PROJECTED_DIMS), low=1),
        candidates=check_int("projected_candidates", kwargs.get("projected_candidates", _PROJECTED_CANDIDATES), low=1),
    )
    method = check_choice("method", method, METHODS)
    if method == "auto":
        method = "kdtree" if dim <= _AUTO_KDTREE_MAX_DIM else "projected"
    return search, method


def _max_norm(arr: np.ndarray) -> float:
    scale = float(np.sqrt(np.einsum("ij,ij->i", arr, arr).max()))
    return scale if scale > 0 else 1.0


def cluster(
    x,
    radius: float,
    *,
    method: str = "auto",
    key=None,
    standardize: bool = False,
    rule: str = "auto",
    kdtree_eps: float = _KDTREE_EPS,
    projected_dims: int = _PROJECTED_DIMS,
    projected_candidates: int = _PROJECTED_CANDIDATES,
) -> Clustering:
    r"""Cluster the rows of ``x`` into balls of radius at most ``radius`` (Algorithm 1).

    Streams the rows in their given order: each row joins the cluster of a
    nearby earlier centroid if the cluster's post-join radius stays
    :math:`\le \delta` (checked by an O(d) bound, then exactly), else it opens a
    new cluster (module docstring). A final float64 check and
    repair make :math:`\delta_j = \max_{i\in S_j}\|x_i-\mu_j\| \le \delta` hold
    exactly for every cluster.

    Parameters
    ----------
    x
        ``[N, d]`` (or ``[N]``) finite real features.
    radius
        :math:`\delta > 0`, in the clustering space (after standardisation).
    method
        ``"kdtree"``, ``"projected"`` (principal components + residual norm, for
        large ``d``) or ``"auto"`` (k-d tree for ``d <= 16``, else projected).
    key
        JAX PRNG key or integer seed (``None``: 0) for the subsample of the
        principal components of ``"projected"``. The clustering is a
        deterministic function of ``(x, radius, key)``.
    standardize
        Divide the features by :math:`R = \max_i \|x_i\|_2` first, as in the
        paper (§4), so every row lies in the unit ball; ``R`` is returned as ``scale``.
    rule
        ``"trim"``: leader + trim, a greedy pass whose clusters are trimmed to radius
        ``delta`` and whose dropped rows are clustered again (module docstring);
        ``"stream"``: the exact-join stream on all rows (slower; fewer clusters on some
        data, e.g. MNIST); ``"blocked"``: the same join rule with chunks of rows compared
        with all clusters at once (for large ``d``); ``"merge"``: vectorised rounds of exact
        merges on the graph of rows within ``2 delta`` (opt-in: fewer clusters than the
        streams on MNIST-like data, slower than ``"trim"`` for ``d <= 16``; O(N^2) screen for
        ``d > 16``); ``"auto"`` (default): ``"trim"`` for
        ``d <= 16``, else ``"blocked"`` (``"stream"`` when at most 2,048 rows are left after
        the bulk screen of isolated rows). All return every radius ``<= delta``.
    kdtree_eps, projected_dims, projected_candidates
        SciPy's approximation factor; principal components and candidate
        leaders per row of ``"projected"``.

    Returns
    -------
    Clustering
        ``centroids [c, d]``, ``counts [c]``, ``labels [N]``, exact ``radii [c]``,
        per-cluster ``covariances [c, d, d]`` (``d <= 64``); properties ``c``,
        ``rho = c / N``, ``radius`` (global), ``scale``.

    Raises
    ------
    ValueError
        ``radius <= 0`` or not finite; empty ``x``; ``x`` not 1-D/2-D; NaN/inf
        features; unknown ``method``; bad search settings.

    References
    ----------
    Q. Song, Approximate Inference via Clustering (2021), Algorithm 1 and §4.
    """
    delta = check_real("radius", radius, low=0.0)
    method = check_choice("method", method, METHODS)
    rule = check_choice("rule", rule, RULES)
    arr = _as_features(x)
    search, method = _search_settings(
        method, arr.shape[1], dict(kdtree_eps=kdtree_eps, projected_dims=projected_dims, projected_candidates=projected_candidates)
    )
    scale = _max_norm(arr) if standardize else 1.0
    if scale != 1.0:
        arr = arr / scale
    labels = _stream_labels(arr, delta, method, search, np.random.default_rng(_seed_from_key(key)), rule=rule)
    return _finish(arr, labels, delta, None, scale, standardize, method)


def _finish(arr, labels, delta, targets_from, scale, standardize, method) -> Clustering:
    """Exact check + repair, second moments, and the :class:`Clustering`."""
    labels, centroids, counts, radii = _repair(arr, labels, delta)
    targets = None
    if targets_from is not None:
        first_row = np.full(counts.size, arr.shape[0], dtype=np.int64)
        np.minimum.at(first_row, labels, np.arange(arr.shape[0]))
        targets = targets_from[first_row]
    return Clustering(
        centroids=centroids,
        counts=counts,
        labels=labels,
        radii=radii,
        targets=targets,
        target_radius=delta,
        scale=scale,
        standardized=bool(standardize),
        method=method,
        covariances=_covariances(arr, labels, centroids, counts),
    )


def cluster_supervised(
    x,
    y,
    radius: float,
    *,
    mode: str = "auto",
    method: str = "auto",
    key=None,
    standardize: bool = False,
    rule: str = "auto",
    **search_kwargs,
) -> Clustering:
    r"""Cluster supervised data so the centroids are valid pseudo-data for :math:`p(y \mid x, \theta)`.

    Two modes (NOTES.md §3):

    * ``"by_label"``: cluster the features separately within each class, so
      every member of a cluster shares its label; ``targets[j]`` is that label.
      Any number of classes (multiclass). :math:`\sum_{i\in S_j}\log p(y_j\mid x_i,\theta)` is replaced
      by :math:`n_j \log p(y_j\mid\mu_j,\theta)`; Theorem 1 applies to each class's features.
    * ``"joint"``: cluster the vectors :math:`(x_i, y_i)` (continuous response,
      e.g. linear regression); ``centroids`` holds the feature part of the joint
      centroid and ``targets`` the mean response; ``radii`` are joint radii
      (so :math:`\|(x_i,y_i)-(\mu_j,\bar y_j)\|\le\delta`) and ``covariances``
      are joint ``[c, d + 1, d + 1]`` (response last).
    * ``"auto"``: ``"by_label"`` for integer/bool ``y``, ``"joint"`` otherwise.

    With ``standardize=True`` the feature part (by_label) or the joint vector
    (joint) is divided by its maximal norm ``R`` (recorded as ``scale``); in
    joint mode the response is divided by the same ``R``, which leaves the
    coefficients of a linear model unchanged.

    Parameters
    ----------
    x
        ``[N, d]`` features.
    y
        ``[N]`` targets.
    radius, method, key, standardize, rule, search_kwargs
        As in :func:`cluster`.

    Returns
    -------
    Clustering
        With ``targets [c]``; ``labels`` index the global cluster list.
    """
    delta = check_real("radius", radius, low=0.0)
    mode = check_choice("mode", mode, ("auto", "by_label", "joint"))
    rule = check_choice("rule", rule, RULES)
    arr = _as_features(x)
    yarr = np.asarray(y)
    if yarr.ndim != 1 or yarr.shape[0] != arr.shape[0]:
        raise ValueError(f"y must have shape [N] = [{arr.shape[0]}] matching x; got shape {yarr.shape}")
    if mode == "auto":
        mode = "by_label" if (np.issubdtype(yarr.dtype, np.integer) or yarr.dtype == bool) else "joint"
    if mode == "joint":
        yf = _as_features(yarr, "y")
        joint = cluster(np.column_stack([arr, yf]), delta, method=method, key=key, standardize=standardize, rule=rule,
                        **search_kwargs)
        return joint._replace(centroids=joint.centroids[:, :-1], targets=joint.centroids[:, -1])
    if not (np.issubdtype(yarr.dtype, np.integer) or yarr.dtype == bool):
        raise ValueError(f"y must hold integer class labels for mode='by_label'; got dtype {yarr.dtype}")
    scale = _max_norm(arr) if standardize else 1.0
    if scale != 1.0:
        arr = arr / scale
    search, method = _search_settings(method, arr.shape[1], search_kwargs)
    rng = np.random.default_rng(_seed_from_key(key))
    _, groups = np.unique(yarr, return_inverse=True)
    groups = groups.ravel()
    # each class streamed on its own (rows in their order within the class), so every
    # cluster is pure in its label
    labels = np.empty(arr.shape[0], np.int64)
    offset = 0
    for g in range(int(groups.max()) + 1):
        rows = np.flatnonzero(groups == g)
        if rows.size == 0:
            continue
        local = _stream_labels(arr[rows], delta, method, search, rng, rule=rule)
        labels[rows] = local + offset
        offset += int(local.max()) + 1
    return _finish(arr, labels, delta, yarr, scale, standardize, method)
