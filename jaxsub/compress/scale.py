r"""Scale-out of compressed posteriors: clustering per shard, streamed chunks, sharded log-densities.

* :func:`cluster_shards` -- Algorithm 1 on each shard of the data separately
  (the rows held by each device of a sharded ``jax.Array``, or a list of
  arrays), results concatenated. Every cluster lies inside one shard and keeps
  its exact radius, so the union keeps the guarantee ``delta_j <= delta``
  exactly; ``rho`` grows with the number of shards because clusters cannot
  span shards (measured in ``benchmarks/compress.py``).
* :func:`cluster_stream` -- rows arriving as an iterator of chunks (data read
  from disk, e.g. slices of a memory-mapped ``.npy``); the chunks are validated
  one by one and written to a float64 buffer (in memory, or a memory-mapped
  file in ``spill_dir`` for data larger than memory), then clustered by the
  same stream as :func:`~jaxsub.compress.cluster`: the result equals
  in-memory clustering of the concatenated rows. The exact post-join radius
  check reads cluster members back, so the rows must stay addressable.
* :func:`sharded_logdensity` -- the compressed log-density with its centroids
  split across the devices of a mesh (``jax.shard_map``): each device sums
  ``n_j log p(mu_j | theta)`` over its centroids and one ``psum`` adds the
  partial sums; the gradient of the replicated position is summed the same
  way by the transpose of ``psum``. A plain ``logdensity_fn(position)`` that
  ``blackjax.nuts`` takes unchanged.

References
----------
Q. Song. Approximate Inference via Clustering. arXiv:2111.14219 (2021).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jaxsub.compress.api import cluster
from jaxsub.compress.clustering import Clustering, as_features
from jaxsub.types import LogDensityFn, LogLikelihoodFn, LogPriorFn
from jaxsub.validation import check_int, check_real

__all__ = ["cluster_shards", "cluster_stream", "sharded_logdensity"]


def _concat(parts: list[Clustering], radius: float, scale: float, standardize: bool) -> Clustering:
    offsets = np.cumsum([0] + [p.c for p in parts[:-1]])
    covs = [p.covariances for p in parts]
    return Clustering(
        centroids=np.concatenate([p.centroids for p in parts]),
        counts=np.concatenate([p.counts for p in parts]),
        labels=np.concatenate([p.labels + o for p, o in zip(parts, offsets)]),
        radii=np.concatenate([p.radii for p in parts]),
        targets=None,
        target_radius=radius,
        scale=scale,
        standardized=standardize,
        method=parts[0].method,
        covariances=None if any(c is None for c in covs) else np.concatenate(covs),
    )


def cluster_shards(shards, radius: float, *, standardize: bool = False, workers: int = 1, **kwargs) -> Clustering:
    r"""Cluster each shard separately and concatenate (labels follow the shards' row order).

    Parameters
    ----------
    shards
        A list of ``[N_s, d]`` arrays, or a ``jax.Array`` sharded over its first axis (its
        shards, in row order, are clustered). For an array sharded across processes
        (``jax.distributed``) every process clusters the shards it holds and the results are
        exchanged (``process_allgather``), so every process returns the same global clustering.
    radius
        :math:`\delta > 0`.
    standardize
        Divide every shard by the *global* :math:`R = \max_i \|x_i\|`.
    workers
        Host threads clustering shards at once (NumPy/SciPy release the GIL in their loops);
        the result does not depend on it.
    **kwargs
        Passed to :func:`~jaxsub.compress.cluster` (``method``, ``key``, ``options``, ...).

    Returns
    -------
    Clustering
        One :class:`~jaxsub.compress.Clustering`; every radius is :math:`\le \delta` exactly
        (each cluster lies in one shard).

    Raises
    ------
    ValueError
        No shard, an empty shard, different widths, NaN rows, ``radius <= 0``, ``workers < 1``.
    """
    check_real("radius", radius, low=0.0)
    workers = check_int("workers", workers, low=1)
    if isinstance(shards, jax.Array) and not shards.is_fully_addressable:
        return _cluster_process_shards(shards, radius, standardize, workers, kwargs)
    if isinstance(shards, jax.Array):
        pieces = sorted(shards.addressable_shards, key=lambda s: s.index[0].start or 0)
        shards = [np.asarray(s.data) for s in pieces]
    shards = [as_features(s, f"shards[{i}]") for i, s in enumerate(shards)]
    if not shards:
        raise ValueError("shards must hold at least one shard")
    if len({s.shape[1] for s in shards}) != 1:
        raise ValueError(f"every shard must have the same number of columns; got {[s.shape[1] for s in shards]}")
    scale = 1.0
    if standardize:
        scale = max(float(np.sqrt(np.einsum("ij,ij->i", s, s).max())) for s in shards) or 1.0
    parts = _cluster_each(shards, scale, radius, workers, kwargs)
    return _concat(parts, parts[0].target_radius, scale, standardize)


def _cluster_each(shards, scale, radius, workers, kwargs) -> list[Clustering]:
    if workers == 1:
        return [cluster(s / scale, radius, **kwargs) for s in shards]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda s: cluster(s / scale, radius, **kwargs), shards))


def _allgather_exact(arr: np.ndarray) -> np.ndarray:
    """``process_allgather`` of a float64/int64 host array, bit for bit (as uint32 pairs: JAX may run in float32)."""
    from jax.experimental import multihost_utils

    arr = np.ascontiguousarray(arr)
    words = arr.view(np.uint32)
    out = np.asarray(multihost_utils.process_allgather(words))
    return np.ascontiguousarray(out).view(arr.dtype)


def _cluster_process_shards(x: jax.Array, radius, standardize, workers, kwargs) -> Clustering:
    """``cluster_shards`` of an array sharded across processes (``jax.distributed``).

    Every process clusters the shards it holds; the per-shard results are exchanged with
    ``process_allgather`` (bit-exact, padded to the largest shard) and concatenated in the
    global shard order, so every process returns the same :class:`Clustering`, equal to
    single-process ``cluster_shards`` of the same shards.
    """
    pieces = sorted(x.addressable_shards, key=lambda s: s.index[0].start or 0)
    starts = [int(p.index[0].start or 0) for p in pieces]
    local = [as_features(np.asarray(p.data), f"shard at row {st}") for p, st in zip(pieces, starts)]
    k, d = len(local), local[0].shape[1]
    scale = 1.0
    if standardize:
        sq = max(float(np.einsum("ij,ij->i", s, s).max()) for s in local)
        scale = float(np.sqrt(_allgather_exact(np.array([sq])).max())) or 1.0
    parts = _cluster_each(local, scale, radius, workers, kwargs)
    sizes = _allgather_exact(np.array([[st, p.c, p.num_data] for st, p in zip(starts, parts)], np.int64))
    if sizes.ndim != 3:
        raise ValueError("every process must hold the same number of shards")
    cmax, nmax = int(sizes[..., 1].max()), int(sizes[..., 2].max())
    with_cov = all(p.covariances is not None for p in parts)

    def padded(get, length, tail, dtype):
        out = np.zeros((k, length) + tail, dtype)
        for i, p in enumerate(parts):
            v = get(p)
            out[i, : v.shape[0]] = v
        return _allgather_exact(out)

    cen = padded(lambda p: p.centroids, cmax, (d,), np.float64)
    cnt = padded(lambda p: p.counts, cmax, (), np.int64)
    lab = padded(lambda p: p.labels, nmax, (), np.int64)
    rad = padded(lambda p: p.radii, cmax, (), np.float64)
    cov = padded(lambda p: p.covariances, cmax, (d, d), np.float64) if with_cov else None
    flat = sizes.reshape(-1, 3)
    order = np.argsort(flat[:, 0], kind="stable")
    rebuilt = []
    for j in order:
        pr, i = divmod(int(j), k)
        c, n = int(flat[j, 1]), int(flat[j, 2])
        rebuilt.append(
            parts[0]._replace(
                centroids=cen[pr, i, :c],
                counts=cnt[pr, i, :c],
                labels=lab[pr, i, :n],
                radii=rad[pr, i, :c],
                covariances=None if cov is None else cov[pr, i, :c],
            )
        )
    return _concat(rebuilt, parts[0].target_radius, scale, standardize)


def cluster_stream(
    chunks: Iterable, radius: float, *, standardize: bool = False, spill_dir: str | None = None, **kwargs
) -> Clustering:
    r"""Cluster rows that arrive as an iterator of ``[n_k, d]`` chunks; equals in-memory :func:`cluster`.

    Parameters
    ----------
    chunks
        An iterable of arrays (e.g. ``(mm[i:i + 65536] for i in range(0, len(mm), 65536))`` over
        ``mm = np.load(path, mmap_mode="r")``).
    radius
        :math:`\delta > 0`.
    standardize
        Divide by the global :math:`R = \max_i \|x_i\|` (computed on the fly).
    spill_dir
        If given, the float64 rows are written to a memory-mapped file in this folder (removed
        afterwards) instead of memory.
    **kwargs
        Passed to :func:`~jaxsub.compress.cluster`.

    Returns
    -------
    Clustering
        The clustering of the concatenated rows, identical to
        ``cluster(np.concatenate(chunks), radius, ...)``.

    Raises
    ------
    ValueError
        An empty chunk, a chunk with NaN/inf, chunks of different widths, no chunk at all,
        ``radius <= 0``.
    """
    check_real("radius", radius, low=0.0)
    parts, width, total, scale2 = [], None, 0, 0.0
    for k, chunk in enumerate(chunks):
        arr = as_features(chunk, f"chunk {k}")
        if width is not None and arr.shape[1] != width:
            raise ValueError(f"chunk {k} has {arr.shape[1]} columns; earlier chunks have {width}")
        width = arr.shape[1]
        scale2 = max(scale2, float(np.einsum("ij,ij->i", arr, arr).max()))
        total += arr.shape[0]
        parts.append(arr if spill_dir is None else _spill(arr, spill_dir, k))
    if not parts:
        raise ValueError("chunks must hold at least one chunk")
    if spill_dir is None:
        x = np.concatenate(parts)
        return cluster(x, radius, standardize=standardize, **kwargs)
    fd, path = tempfile.mkstemp(suffix=".npy", dir=spill_dir)
    os.close(fd)
    try:
        x = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(total, width))
        start = 0
        for p in parts:
            x[start : start + p.shape[0]] = p
            start += p.shape[0]
            del p
        scale = float(np.sqrt(scale2)) if standardize and scale2 > 0 else 1.0
        if scale != 1.0:
            for s in range(0, total, 1 << 16):
                x[s : s + (1 << 16)] /= scale
        result = cluster(x, radius, **kwargs)
        return result._replace(scale=scale, standardized=bool(standardize))
    finally:
        for p in parts:
            _cleanup(p)
        os.remove(path)


def _spill(arr: np.ndarray, folder: str, k: int) -> np.ndarray:
    fd, path = tempfile.mkstemp(suffix=f"_chunk{k}.npy", dir=folder)
    os.close(fd)
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=arr.shape)
    mm[:] = arr
    mm.flush()
    return mm


def _cleanup(p) -> None:
    if isinstance(p, np.memmap) and p.filename and os.path.exists(p.filename):
        name = p.filename
        del p
        os.remove(name)


def sharded_logdensity(
    logprior_fn: LogPriorFn,
    loglikelihood_fn: LogLikelihoodFn,
    clustering: Clustering,
    mesh: Mesh | None = None,
    axis_name: str = "data",
) -> LogDensityFn:
    r"""The compressed log-density with its centroids sharded across the devices of ``mesh``.

    :math:`\log p(\theta) + \sum_{\text{devices}} \sum_{j \in \text{device}} n_j \log p(\mu_j \mid \theta)`:
    each device evaluates the weighted log-likelihood of its block of centroids
    (``jax.shard_map``), and one ``psum`` over ``axis_name`` adds the blocks; the
    gradient with respect to the replicated position is reduced by the transpose of
    that ``psum``. The centroids are padded to a multiple of the device count with
    weight-0 copies of the first centroid; every device slices its block (by its axis
    index) from the host copy, so the function works unchanged when the mesh spans
    ``jax.distributed`` processes (each process builds it from the same clustering, e.g.
    the one :func:`cluster_shards` returns on every process). Use it as ``blackjax.nuts(logdensity_fn, ...)``.

    This is the *first-order* compressed log-density (no within-cluster scatter correction):
    compare it with ``logdensity(..., second_order=False)``.

    Parameters
    ----------
    logprior_fn, loglikelihood_fn
        As in :func:`~jaxsub.compress.logdensity`.
    clustering
        A :class:`~jaxsub.compress.Clustering`.
    mesh
        A 1-D mesh (default: all devices, axis ``axis_name``).
    axis_name
        The mesh axis the centroids are split over.

    Returns
    -------
    logdensity_fn
        ``logdensity_fn(position) -> scalar`` (pure; jit/grad-able).

    Raises
    ------
    ValueError
        ``clustering`` not a Clustering, or ``axis_name`` not an axis of ``mesh``.
    """
    if not isinstance(clustering, Clustering):
        raise ValueError("clustering must be a Clustering")
    if mesh is None:
        mesh = Mesh(np.array(jax.devices()), (axis_name,))
    if axis_name not in mesh.axis_names:
        raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh {mesh.axis_names}")
    ndev = mesh.shape[axis_name]
    c = clustering.c
    pad = (-c) % ndev
    idx = np.concatenate([np.arange(c), np.zeros(pad, np.int64)])
    weights = np.concatenate([clustering.counts.astype(np.float64), np.zeros(pad)])
    data = clustering.pseudodata()
    data = jax.tree.map(lambda a: np.asarray(a)[idx], data)
    per = (c + pad) // ndev
    # host blocks (JAX's dtype, float32 unless x64): every device slices its own block by its
    # axis index, so no array spanning devices (or processes) is closed over and the function
    # works unchanged across jax.distributed processes
    data = jax.tree.map(lambda a: np.asarray(jnp.asarray(a)), data)
    weights = np.asarray(jnp.asarray(weights, jnp.result_type(float)))

    def local(position):
        start = jax.lax.axis_index(axis_name) * per
        block = jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(jnp.asarray(a), start, per), data)
        w = jax.lax.dynamic_slice_in_dim(jnp.asarray(weights), start, per)
        ll = jax.vmap(loglikelihood_fn, in_axes=(None, 0))(position, block)
        return jax.lax.psum(jnp.sum(w.astype(ll.dtype) * ll), axis_name)

    def logdensity_fn(position):
        pos_spec = jax.tree.map(lambda _: P(), position)
        total = jax.shard_map(local, mesh=mesh, in_specs=(pos_spec,), out_specs=P())(position)
        return logprior_fn(position) + total

    return logdensity_fn
