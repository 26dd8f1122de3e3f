"""Radius-bounded streaming clustering (Song 2021, Algorithm 1).

Clustering is a one-off preprocessing step. Candidate generation runs on the
host (NumPy; SciPy's k-d tree as one neighbour search), the streaming pass is
one jitted ``lax.scan`` over the rows (a Python loop costs ~40 us per row,
the scan ~7-14 us), and the exact check is float64 NumPy. The output is plain
arrays that the JAX log-densities of :mod:`jaxsub.compress._posterior` consume.

Algorithm 1 (streaming). Points arrive in order. For ``x_i``, look for an
existing cluster whose centroid lies within ``2 delta`` of ``x_i``; if one is
found and adding ``x_i`` keeps that cluster's radius
``delta_j = max_{i in S_j} ||x_i - mu_j||`` at most ``delta``, ``x_i`` joins
it, otherwise ``x_i`` opens a new cluster. The neighbour search is approximate
(LSH in the paper): missing a neighbour only opens an extra cluster, it never
breaks the radius guarantee.

Radius bookkeeping in O(d) per insertion. Recomputing a cluster's radius
after each insertion costs O(n_j d). Instead we keep an *upper bound* ``r_j``:
when an atom (a point, or a group of ``w`` points with centroid ``m`` and
radius ``s``) joins a cluster with centroid ``mu``, the centroid moves to
``mu' = mu + w (m - mu) / (n_j + w)`` and, by the triangle inequality, every
old member is within ``r_j + ||mu' - mu||`` of ``mu'`` and every new one
within ``s + ||m - mu'||``. So ``r_j' = max(r_j + ||mu' - mu||, s + ||m - mu'||)``
bounds the true radius, and accepting only when ``r_j' <= delta`` is
conservative. After the stream, the exact centroids (member means) and radii
are recomputed in float64 and any cluster that still exceeds ``delta``
(possible only through floating-point round-off of the running bound) is
repaired by :func:`_repair`, which splits off its farthest members until every
cluster satisfies the bound exactly. ``cluster`` therefore always returns
``radii <= radius`` (tested).

Neighbour search (``method``):

* ``"lsh"`` (as in the paper): E2LSH of Datar et al. (2004), ``k`` p-stable
  (Gaussian) projections per table, bucket width ``w``, ``L`` tables; bucket
  ``floor((a . x + b) / w)``. Each bucket remembers the last ``S`` distinct
  clusters that a streamed point hashed into it joined (Find-Nearest-Neighbor
  over the already-streamed points, deduplicated by cluster). Candidates of
  ``x_i`` are the clusters in its ``L`` buckets.
* ``"kdtree"``: SciPy ``cKDTree`` queries, vectorised, over block-incremental
  trees (stream cut into blocks of doubling length): each point gets its ``k``
  approximate nearest points within ``2 delta`` among the points of earlier
  blocks, plus the earlier ones among its ``k`` nearest in its own block. Every
  candidate point was streamed before ``x_i``, so the candidates of ``x_i`` are
  the existing clusters of those points, and the result does not depend on the
  stream order more than Algorithm 1 itself does. Far better compression than
  LSH at d = 9, but slow at d = 784: see ``benchmarks/compress.py``.
* ``"auto"`` (default): k-d tree for ``d <= 16``, LSH above.

All candidates are checked at once: the nearest centroid within ``2 delta``
whose radius bound stays ``<= delta`` is joined.

Exact duplicates are merged before the stream (``np.unique``; a group of
identical points has radius 0), which is exact and shortens the stream on
redundant data.

References
----------
Q. Song. Approximate Inference via Clustering. arXiv:2111.14219 (2021), Algorithm 1.
M. Datar, N. Immorlica, P. Indyk, V. Mirrokni. Locality-sensitive hashing scheme
based on p-stable distributions. SoCG 2004.
Z. Allen-Zhu, Y. Yuan, K. Sridharan. Exploiting the structure: stochastic
gradient methods using raw clusters. NeurIPS 2016.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from jaxsub.validation import check_choice, check_int, check_real

__all__ = ["Clustering", "cluster", "cluster_supervised", "METHODS"]

#: Neighbour searches accepted by :func:`cluster` (``"auto"``: k-d tree when
#: ``d <= _AUTO_KDTREE_MAX_DIM``, LSH above; chosen from benchmarks/compress.py).
METHODS = ("auto", "lsh", "kdtree")

#: k-d trees beat LSH on low-dimensional tables (flights, d = 9: ~4x fewer
#: clusters at equal time) but degrade towards brute force as d grows (MNIST,
#: d = 784); 16 is the usual rule-of-thumb limit for k-d trees (N >> 2^d).
_AUTO_KDTREE_MAX_DIM = 16

#: Default E2LSH settings (Datar et al. 2004). ``k`` Gaussian projections per
#: table (capped at ``d``), ``L`` tables, bucket width ``w = width * delta``: two
#: points at distance ``delta`` (a point can join a cluster only if its centroid
#: is about that close) fall in the same bucket of one projection with probability
#: ``p(w/delta) = 1 - 2 Phi(-4) - 2 (1 - exp(-8)) / (sqrt(2 pi) 4) ~= 0.80`` for
#: ``w = 4 delta``, so ~0.17 for k = 8 projections and ~0.43 for L = 3 tables;
#: each bucket remembers the last ``S = 16`` distinct clusters hashed into it.
#: Chosen on MNIST (d = 784) among (k, L, w, S) in {(8,3,4,16), (12,3,4,16),
#: (16,4,3,8)}: fewest clusters at similar time (benchmarks/compress.py).
_LSH_PROJECTIONS = 8
_LSH_TABLES = 3
_LSH_WIDTH = 4.0
_LSH_SLOTS = 16

#: k-d tree settings: ``k`` nearest points queried per point and per tree (the
#: prefix tree and the point's own block; up to 2k candidates), approximation factor ``eps`` of SciPy's
#: cKDTree.query (returned j-th neighbour within (1 + eps) x the true j-th
#: distance); eps = 1 halves the query time on flights with no measurable loss.
_KDTREE_NEIGHBOURS = 8
_KDTREE_EPS = 1.0

#: First block of the block-incremental k-d-tree search (_earlier_neighbours);
#: later blocks double, so there are about log2(N / 256) prefix trees.
_KDTREE_FIRST_BLOCK = 256


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


# ----------------------------------------------------------------------------- streaming core


def _lsh_buckets(points: np.ndarray, delta: float, rng: np.random.Generator, k: int, tables: int, width: float, groups=None) -> np.ndarray:
    """E2LSH bucket ids ``[n, tables]`` (dense ids ``< n``) of ``floor((A x + b) / w)``, ``w = width * delta``.

    With ``groups``, the group is part of the key: points of different groups never share a bucket.
    """
    n, d = points.shape
    k = min(k, d)
    w = width * delta
    a = rng.standard_normal((d, k * tables))
    b = rng.uniform(0.0, w, size=k * tables)
    codes = np.floor((points @ a + b) / w).astype(np.int64)
    out = np.empty((n, tables), dtype=np.int32)
    for t in range(tables):
        table_codes = codes[:, t * k : (t + 1) * k]
        if groups is not None:
            table_codes = np.column_stack([table_codes, groups])
        _, inv = np.unique(table_codes, axis=0, return_inverse=True)
        out[:, t] = inv.ravel()
    return out


def _earlier_neighbours(points: np.ndarray, delta: float, k: int, eps: float) -> np.ndarray:
    """Up to ``2 k`` approximate nearest *earlier* points within ``2 delta``, ``[n, 2 k]`` (``-1``: none).

    Block-incremental k-d trees, so that every point's candidates have already
    been streamed (and so already have a cluster). The stream is cut into blocks
    ``[s, e)`` of doubling length (``e = 2 s``, first block ``_KDTREE_FIRST_BLOCK``
    points). For a block, (a) a tree on the prefix ``points[:s]`` gives each block
    point its ``k`` nearest prefix points, all earlier; (b) a tree on the block
    gives its ``k`` nearest block points, of which the earlier ones are kept
    (points that open clusters in a region the prefix does not cover are found
    by the later points of their block). Doubling keeps the cost at about two
    queries per point plus O(log N) tree builds of total size O(N).

    (A single tree over the whole set, queried once, returns about half later
    points: with a random stream order a point whose k nearest all come later
    opens a new cluster, which puts a floor of ~1/(k+1) under rho.)
    """
    from scipy.spatial import cKDTree

    n = points.shape[0]
    out = np.full((n, 2 * k), -1, dtype=np.int32)
    s = 0
    while s < n:
        e = min(n, max(2 * s, _KDTREE_FIRST_BLOCK))
        block = points[s:e]
        m = e - s
        kk = min(k + 1, m)
        _, idx = cKDTree(block).query(block, k=kk, distance_upper_bound=2.0 * delta, eps=eps, workers=-1)
        idx = np.asarray(idx).reshape(m, kk)
        earlier = idx < np.arange(m)[:, None]  # drops "not found" (m), itself and later points
        # up to k earlier block points per row (the query returns k + 1 including the point
        # itself); move the valid ones to the front (order is irrelevant: all are checked)
        row = np.where(earlier, idx + s, -1)
        row = -np.sort(-row, axis=1)[:, : min(k, kk)]
        out[s:e, : row.shape[1]] = row
        if s > 0:
            kp = min(k, s)
            _, idx = cKDTree(points[:s]).query(block, k=kp, distance_upper_bound=2.0 * delta, eps=eps, workers=-1)
            idx = np.asarray(idx).reshape(m, kp)
            out[s:e, k : k + kp] = np.where(idx < s, idx, -1)
        s = e
    return out


def _kdtree_neighbours(points: np.ndarray, delta: float, k: int, eps: float, groups=None) -> np.ndarray:
    """Candidate earlier points for every point, ``[n, 2 k]`` (``-1``: none); see :func:`_earlier_neighbours`.

    SciPy's ``cKDTree.query`` with ``eps``: the j-th returned neighbour is at most
    ``(1 + eps)`` times farther than the true j-th nearest (Arya et al. 1998).
    With ``groups``, the search runs per group: neighbours never cross groups.
    """
    n = points.shape[0]
    if groups is None:
        return _earlier_neighbours(points, delta, k, eps)
    out = np.full((n, 2 * k), -1, dtype=np.int32)
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)  # ascending: stream order within the group
        local = _earlier_neighbours(points[rows], delta, k, eps)
        out[rows] = np.where(local >= 0, rows[np.maximum(local, 0)], -1)
    return out


@lru_cache(maxsize=None)
def _stream_program(num_tables: int, slots: int):
    """The jitted Algorithm-1 scan for a given number of LSH tables and slots (cached)."""
    import jax
    import jax.numpy as jnp

    tidx = jnp.arange(num_tables)

    def run(points, weights, buckets, neighbours, delta):
        n = points.shape[0]
        dtype = points.dtype
        # Accept with a relative margin of 1e-5 below delta so that float32 round-off
        # of the running bound (relative error ~1e-7 per update) rarely lets a cluster
        # cross delta; the float64 check and _repair afterwards make it exact anyway.
        threshold = delta * (1.0 - 1e-5)
        two_delta = 2.0 * delta

        def body(carry, inp):
            cent, cnt, rad, assign, table, c = carry
            i, x, w, b, nb = inp
            cands, oks = [assign[jnp.where(nb >= 0, nb, 0)]], [nb >= 0]
            if num_tables:
                rows_b = tidx * n + b  # flat row of (table, bucket)
                here = table[rows_b]  # [L, S]
                reg = here.reshape(-1)
                cands.append(reg)
                oks.append(reg >= 0)
            valid = jnp.concatenate(oks)
            cl = jnp.where(valid, jnp.concatenate(cands), 0)
            mu = cent[cl]
            dist = jnp.sqrt(jnp.sum((mu - x) ** 2, axis=-1))
            nj = cnt[cl]
            frac = w / (nj + w)
            # O(d) upper bound on the radius after the join (module docstring)
            bound = jnp.maximum(rad[cl] + frac * dist, (1.0 - frac) * dist)
            feasible = valid & (dist <= two_delta) & (bound <= threshold)
            j = jnp.argmin(jnp.where(feasible, dist, jnp.inf))
            ok = feasible[j]
            target = jnp.where(ok, cl[j], c)
            cent = cent.at[target].set(jnp.where(ok, mu[j] + frac[j] * (x - mu[j]), x))
            cnt = cnt.at[target].set(jnp.where(ok, nj[j] + w, w))
            rad = rad.at[target].set(jnp.where(ok, bound[j], jnp.zeros((), dtype)))
            assign = assign.at[i].set(target)
            if num_tables:
                # register the target cluster in this point's buckets (ring of S slots)
                # (free slot if any, else overwrite slot target % S: a pseudo-random
                # eviction that needs no per-bucket counter; a counter array read and
                # scattered in the same step makes XLA copy it every step)
                used = jnp.sum(here >= 0, axis=-1)
                pos = jnp.where(used < slots, used, target % slots)
                present = jnp.any(here == target, axis=-1)
                table = table.at[rows_b, pos].set(jnp.where(present, here[tidx, pos], target))
            return (cent, cnt, rad, assign, table, c + jnp.where(ok, 0, 1)), None

        rows = n if num_tables else 1
        init = (
            jnp.zeros_like(points),
            jnp.zeros(n, dtype),
            jnp.zeros(n, dtype),
            jnp.zeros(n, jnp.int32),
            jnp.full((num_tables * rows, slots), -1, jnp.int32),
            jnp.zeros((), jnp.int32),
        )
        xs = (jnp.arange(n, dtype=jnp.int32), points, weights, buckets, neighbours)
        final, _ = jax.lax.scan(body, init, xs)
        return final[3]

    return jax.jit(run)


def _stream_jax(points, weights, buckets, neighbours, delta, slots_per_bucket):
    """Algorithm 1 as one ``lax.scan`` over the atoms; returns the atom -> cluster map.

    Candidates for atom ``i`` are the union of (a) the clusters registered in its
    LSH bucket of every table (each bucket keeps the last ``slots_per_bucket``
    distinct clusters that a streamed point hashed there joined: Find-Nearest-
    Neighbor over the already-streamed points, deduplicated by cluster) and
    (b) the clusters of its k-d-tree ``neighbours`` (earlier points). The
    nearest candidate centroid within ``2 delta`` whose O(d) radius bound stays
    ``<= delta`` is joined (all candidates are checked at once); otherwise a
    new cluster opens. Runs in float32 (float64 when ``jax_enable_x64``).
    """
    import jax
    import jax.numpy as jnp

    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    program = _stream_program(int(buckets.shape[1]), int(slots_per_bucket))
    assign = program(
        jnp.asarray(points, dtype),
        jnp.asarray(weights, dtype),
        jnp.asarray(buckets, jnp.int32),
        jnp.asarray(neighbours, jnp.int32),
        jnp.asarray(delta, dtype),
    )
    return np.asarray(assign).astype(np.int64)


# ----------------------------------------------------------------------------- exact statistics and repair


def _exact_stats(x: np.ndarray, labels: np.ndarray, num: int):
    """Member means, counts and exact radii (float64) of a labelling."""
    counts = np.bincount(labels, minlength=num).astype(np.int64)
    order = np.argsort(labels, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sums = np.add.reduceat(x[order], starts, axis=0)
    centroids = sums / counts[:, None]
    diff = x - centroids[labels]
    dist = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    radii = np.zeros(num)
    np.maximum.at(radii, labels, dist)
    return centroids, counts, radii, dist


def _relabel(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """Renumber cluster ids 0..c-1 in order of first appearance."""
    uniq, first, inv = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(uniq.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(uniq.size)
    return rank[inv].astype(np.int64), int(uniq.size)


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
    unknown = set(kwargs) - {"lsh_projections", "lsh_tables", "lsh_width", "lsh_slots", "kdtree_neighbours", "kdtree_eps"}
    if unknown:
        raise ValueError(f"unknown search setting(s) {sorted(unknown)}")
    get = lambda name, default: kwargs.get(name, default)  # noqa: E731
    search = dict(
        lsh_projections=check_int("lsh_projections", get("lsh_projections", _LSH_PROJECTIONS), low=1),
        lsh_tables=check_int("lsh_tables", get("lsh_tables", _LSH_TABLES), low=1),
        lsh_width=check_real("lsh_width", get("lsh_width", _LSH_WIDTH), low=0.0),
        lsh_slots=check_int("lsh_slots", get("lsh_slots", _LSH_SLOTS), low=1),
        kdtree_neighbours=check_int("kdtree_neighbours", get("kdtree_neighbours", _KDTREE_NEIGHBOURS), low=1),
        kdtree_eps=check_real("kdtree_eps", get("kdtree_eps", _KDTREE_EPS), low=0.0, low_closed=True),
    )
    method = check_choice("method", method, METHODS)
    if method == "auto":
        method = "kdtree" if dim <= _AUTO_KDTREE_MAX_DIM else "lsh"
    return search, method


def cluster(
    x,
    radius: float,
    *,
    method: str = "auto",
    key=None,
    standardize: bool = False,
    lsh_projections: int = _LSH_PROJECTIONS,
    lsh_tables: int = _LSH_TABLES,
    lsh_width: float = _LSH_WIDTH,
    lsh_slots: int = _LSH_SLOTS,
    kdtree_neighbours: int = _KDTREE_NEIGHBOURS,
    kdtree_eps: float = _KDTREE_EPS,
) -> Clustering:
    r"""Cluster the rows of ``x`` into balls of radius at most ``radius`` (Algorithm 1).

    Streams the (deduplicated) rows in their given order: each row joins the
    nearest existing cluster found by the approximate neighbour search
    (centroid within :math:`2\delta`) if the cluster's radius stays
    :math:`\le \delta`, else it opens a new cluster. See the module docstring
    for the O(d) radius bound and the final exact check-and-repair, which
    makes :math:`\delta_j = \max_{i\in S_j}\|x_i-\mu_j\| \le \delta` hold for
    every cluster.

    Parameters
    ----------
    x
        ``[N, d]`` (or ``[N]``) finite real features.
    radius
        :math:`\delta > 0`, in the clustering space (after standardisation).
    method
        Neighbour search: ``"lsh"`` (E2LSH, as in the paper), ``"kdtree"``
        (SciPy ``cKDTree`` on block-incremental trees: approximate k nearest
        earlier points within :math:`2\delta`) or ``"auto"`` (k-d tree for ``d <= 16``, else LSH).
    key
        JAX PRNG key or integer seed for the LSH projections (``None``: seed 0).
        The clustering is a deterministic function of ``(x, radius, key)``.
    standardize
        Divide the features by :math:`R = \max_i \|x_i\|_2` first, as in the
        paper (§4), so every row lies in the unit ball; ``R`` is returned as
        ``scale``.
    lsh_projections, lsh_tables, lsh_width, lsh_slots
        E2LSH ``k`` (capped at ``d``), ``L``, bucket width in units of
        :math:`\delta`, clusters remembered per bucket.
    kdtree_neighbours, kdtree_eps
        Neighbours queried per point and SciPy's approximation factor.

    Returns
    -------
    Clustering
        ``centroids [c, d]``, ``counts [c]``, ``labels [N]``, exact ``radii [c]``;
        properties ``c``, ``rho = c / N``, ``radius`` (global), ``scale``.

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
    arr = _as_features(x)
    search, method = _search_settings(
        method,
        arr.shape[1],
        dict(
            lsh_projections=lsh_projections,
            lsh_tables=lsh_tables,
            lsh_width=lsh_width,
            lsh_slots=lsh_slots,
            kdtree_neighbours=kdtree_neighbours,
            kdtree_eps=kdtree_eps,
        ),
    )
    scale = 1.0
    if standardize:
        scale = float(np.sqrt(np.einsum("ij,ij->i", arr, arr).max()))
        if scale > 0:
            arr = arr / scale
        else:
            scale = 1.0
    labels = _cluster_array(arr, delta, method, np.random.default_rng(_seed_from_key(key)), search)
    labels, centroids, counts, radii = _repair(arr, labels, delta)
    return Clustering(
        centroids=centroids,
        counts=counts,
        labels=labels,
        radii=radii,
        targets=None,
        target_radius=delta,
        scale=scale,
        standardized=bool(standardize),
        method=method,
    )


def _cluster_array(arr, delta, method, rng, search, groups=None) -> np.ndarray:
    """Labels (not yet exact-checked) for the rows of ``arr``; clusters never mix ``groups``."""
    keyed = arr if groups is None else np.column_stack([arr, groups])
    uniq, inverse, mult = np.unique(keyed, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.ravel()
    # keep the stream order of the data: atoms in order of first appearance
    first = np.full(uniq.shape[0], arr.shape[0], dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(arr.shape[0]))
    order = np.argsort(first, kind="stable")
    atoms = uniq[order, : arr.shape[1]]
    atom_groups = None if groups is None else uniq[order, -1]
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    n = atoms.shape[0]
    if method == "lsh":
        buckets = _lsh_buckets(
            atoms, delta, rng, search["lsh_projections"], search["lsh_tables"], search["lsh_width"], atom_groups
        )
        neighbours = np.full((n, 0), -1, dtype=np.int32)
    else:
        buckets = np.zeros((n, 0), dtype=np.int32)
        neighbours = _kdtree_neighbours(atoms, delta, search["kdtree_neighbours"], search["kdtree_eps"], atom_groups)
    assign = _stream_jax(atoms, mult[order], buckets, neighbours, delta, search["lsh_slots"])
    return assign[rank[inverse]]


def cluster_supervised(
    x,
    y,
    radius: float,
    *,
    mode: str = "auto",
    method: str = "auto",
    key=None,
    standardize: bool = False,
    **lsh_kwargs,
) -> Clustering:
    r"""Cluster supervised data so the centroids are valid pseudo-data for :math:`p(y \mid x, \theta)`.

    Two modes (NOTES.md §3):

    * ``"by_label"``: cluster the features separately within each class, so
      every member of a cluster shares its label; ``targets[j]`` is that label.
      Any number of classes (multiclass). The datum of the likelihood is
      ``(x, y)`` and :math:`\sum_{i\in S_j}\log p(y_j\mid x_i,\theta)` is replaced
      by :math:`n_j \log p(y_j\mid\mu_j,\theta)`; Theorem 1 applies to each
      class's features.
    * ``"joint"``: cluster the vectors :math:`(x_i, y_i)` (continuous response,
      e.g. linear regression); ``centroids`` holds the feature part of the joint
      centroid and ``targets`` the mean response; ``radii`` are joint radii
      (so :math:`\|(x_i,y_i)-(\mu_j,\bar y_j)\|\le\delta`).
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
    radius, method, key, standardize, lsh_kwargs
        As in :func:`cluster`.

    Returns
    -------
    Clustering
        With ``targets [c]``; ``labels`` index the global cluster list.
    """
    delta = check_real("radius", radius, low=0.0)
    mode = check_choice("mode", mode, ("auto", "by_label", "joint"))
    arr = _as_features(x)
    yarr = np.asarray(y)
    if yarr.ndim != 1 or yarr.shape[0] != arr.shape[0]:
        raise ValueError(f"y must have shape [N] = [{arr.shape[0]}] matching x; got shape {yarr.shape}")
    if mode == "auto":
        mode = "by_label" if (np.issubdtype(yarr.dtype, np.integer) or yarr.dtype == bool) else "joint"
    if mode == "joint":
        yf = _as_features(yarr, "y")
        joint = cluster(np.column_stack([arr, yf]), delta, method=method, key=key, standardize=standardize, **lsh_kwargs)
        return joint._replace(centroids=joint.centroids[:, :-1], targets=joint.centroids[:, -1])
    if not (np.issubdtype(yarr.dtype, np.integer) or yarr.dtype == bool):
        raise ValueError(f"y must hold integer class labels for mode='by_label'; got dtype {yarr.dtype}")
    scale = 1.0
    if standardize:
        scale = float(np.sqrt(np.einsum("ij,ij->i", arr, arr).max())) or 1.0
        arr = arr / scale
    search, method = _search_settings(method, arr.shape[1], lsh_kwargs)
    _, groups = np.unique(yarr, return_inverse=True)
    # one stream over all rows; candidates never cross classes (class-keyed LSH
    # buckets, one k-d tree per class), so every cluster is pure in its label
    labels = _cluster_array(arr, delta, method, np.random.default_rng(_seed_from_key(key)), search, groups.ravel())
    labels, centroids, counts, radii = _repair(arr, labels, delta)
    first_row = np.full(counts.size, arr.shape[0], dtype=np.int64)
    np.minimum.at(first_row, labels, np.arange(arr.shape[0]))
    return Clustering(
        centroids=centroids,
        counts=counts,
        labels=labels,
        radii=radii,
        targets=yarr[first_row],
        target_radius=delta,
        scale=scale,
        standardized=bool(standardize),
        method=method,
    )
