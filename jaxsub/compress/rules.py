"""Labels of a clustering rule (before the final exact check): the dispatch over rules and searches."""

from __future__ import annotations

import numpy as np

from jaxsub.compress.blocked import blocked_pass
from jaxsub.compress.merge import merge_labels
from jaxsub.compress.neighbours import make_search, one_blas_thread, wide_coords
from jaxsub.compress.options import GREEDY, ClusterOptions
from jaxsub.compress.screens import isolated
from jaxsub.compress.state import Clusters
from jaxsub.compress.stream import leader_pass
from jaxsub.compress.trim import join_back, trim

__all__ = ["stream_labels"]


def stream_labels(
    x: np.ndarray, delta: float, method: str, rng, *, opts: ClusterOptions, exact=True, rule: str = "auto"
) -> np.ndarray:
    """Cluster labels of the rows of ``x`` under ``rule`` (before the final exact check and repair).

    Parameters
    ----------
    x
        ``[N, d]`` float64 rows (in the clustering space).
    delta
        The radius.
    method
        The resolved neighbour search, ``"kdtree"`` or ``"projected"``.
    rng
        NumPy generator of the projected search's subsample.
    opts
        Validated :class:`~jaxsub.compress.options.ClusterOptions`.
    exact
        ``True``: the rule's exact join; ``False``: the greedy leader pass alone (the reference
        of the benchmark, anchors at the leaders); :data:`~jaxsub.compress.options.GREEDY`: the
        greedy centroid pass.
    rule
        One of :data:`~jaxsub.compress.options.RULES`.

    Returns
    -------
    numpy.ndarray
        ``[N]`` int64 cluster ids (not necessarily contiguous).
    """
    auto = rule == "auto"
    if auto:
        rule = "trim" if x.shape[1] <= opts.kdtree_max_dim else "blocked"
    if rule in ("blocked", "merge") and exact is not True:
        rule = "stream"  # the greedy references stream as before
    if rule == "merge":
        return merge_rule_labels(x, delta, method, rng, opts=opts)
    # the bulk screen of isolated rows (exact-join stream of a large high-dimensional set) needs
    # the wide basis; small sets and the other paths only the search directions
    screen = (
        exact is True and rule in ("stream", "blocked") and method == "projected" and x.shape[0] > opts.trim_min_rows
    )
    srch = make_search(x, method, rng, wide=screen, opts=opts)
    labels = np.full(x.shape[0], -1, np.int64)
    if srch.wide is None:
        x32, zx = None, srch.coords(x)
        zw = zx
    else:  # both search coordinates from one projection on the wide basis
        x32, zx, zw = wide_coords(x, srch)
    clusters = Clusters(x.shape[1], zx.shape[1], max(1024, x.shape[0] // 64), srch.coords)
    rows = np.arange(x.shape[0])
    if exact and rule == "trim":
        rows = trim_rounds(x, zx, rows, clusters, delta, labels, srch, opts=opts)
    iso = None
    if screen:
        # rows with no other row within 2 delta are singletons whatever the order, and no row
        # can join them: label them apart, stream the others (MNIST at delta = 0.1: 90 %)
        iso = np.flatnonzero(isolated(x, zw, delta, opts=opts))
        rows = rows[~np.isin(rows, iso)]
    if rule == "blocked" and auto and rows.size <= opts.trim_min_rows:
        rule = "stream"  # few rows left to stream (e.g. MNIST at delta = 0.1 after the screen): faster
    if rule == "blocked":
        clusters_size = blocked_rule(x, x32, zx, zw, rows, delta, labels, srch, opts=opts)
    else:
        leader_pass(x, zx, rows, clusters, delta, exact, labels, srch, opts=opts)
        clusters_size = clusters.size
    if iso is not None and iso.size:
        labels[iso] = clusters_size + np.arange(iso.size)
    return labels


def merge_rule_labels(x: np.ndarray, delta: float, method: str, rng, *, opts: ClusterOptions) -> np.ndarray:
    """Labels of ``rule="merge"``: one graph of all rows in the wide coordinates (or the rows themselves).

    Rows with no other row within ``2 delta`` are singletons (as for the streams): the graph and
    the rounds run on the others (MNIST at delta = 0.1: 90 % of the rows leave).
    """
    srch = make_search(x, method, rng, wide=method == "projected", opts=opts)
    if srch.wide is None:  # the k-d-tree search: exact neighbours of the rows themselves
        return merge_labels(x, None if srch.basis is None else srch.coords(x), delta, opts=opts)
    zw = wide_coords(x, srch)[2]
    iso = isolated(x, zw, delta, opts=opts) if x.shape[0] > opts.trim_min_rows else np.zeros(x.shape[0], bool)
    if not iso.any():
        return merge_labels(x, zw, delta, opts=opts)
    labels = np.arange(x.shape[0])
    rest = np.flatnonzero(~iso)
    if rest.size:
        labels[rest] = rest[merge_labels(x[rest], zw[rest], delta, opts=opts)]
    return labels


def trim_rounds(x, zx, rows, clusters: Clusters, delta, labels, srch, *, opts: ClusterOptions) -> np.ndarray:
    """Leader + trim rounds over ``rows``; returns the rows left to the exact-join stream (unlabelled).

    Each round: the greedy centroid pass, :func:`~jaxsub.compress.trim.trim` of every cluster to
    radius ``delta``, and :func:`~jaxsub.compress.trim.join_back` of the dropped rows; the rows
    still left go round again while more than ``trim_min_rows`` are left and the trim keeps at
    least ``trim_min_progress`` of a set.
    """
    while rows.size > opts.trim_min_rows:
        ids = leader_pass(x, zx, rows, clusters, delta, GREEDY, labels, srch, opts=opts)
        local = np.full(clusters.size, -1, np.int64)
        local[ids] = np.arange(ids.size)
        keep = trim(x, rows, local[labels[rows]], delta, opts=opts)
        if keep.mean() < opts.trim_min_progress:
            break  # most rows dropped: leave this set to the exact-join stream
        labels[rows[~keep]] = -1
        rows = join_back(x, zx, rows[keep], rows[~keep], ids, clusters, delta, labels, srch, opts=opts)
    labels[rows] = -1
    return rows


def blocked_rule(x, x32, zx, zw, rows, delta, labels, srch, *, opts: ClusterOptions) -> int:
    """The blocked stream over ``rows``; returns the number of clusters it opened. Fresh clusters whose anchors carry the wide search
    coordinates (when the projected search has them), under one BLAS thread: the chunks' products
    are small, and OpenBLAS threads spinning on shared cores cost 3-4x the CPU time of the pass."""
    x32 = x.astype(np.float32) if srch.wide is None else x32
    if srch.wide is not None:  # the search coordinates of the anchors: the wide ones
        clusters = Clusters(x.shape[1], zw.shape[1], max(1024, x.shape[0] // 64), srch._replace(basis=srch.wide).coords)
    else:
        clusters = Clusters(x.shape[1], zx.shape[1], max(1024, x.shape[0] // 64), srch.coords)
    zb = zx if srch.wide is None else zw
    with one_blas_thread(opts.blas_threads):
        blocked_pass(
            x, x32, np.einsum("ij,ij->i", x32, x32), zb.astype(np.float32), rows, clusters, delta, labels, opts=opts
        )
    return clusters.size
