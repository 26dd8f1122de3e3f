"""Radius-bounded streaming clustering (Song 2021, Algorithm 1): :func:`cluster` and :func:`cluster_supervised`.

Clustering is a one-off preprocessing step; it runs on the host in float64 (NumPy, SciPy's k-d
tree) and returns plain arrays that the JAX log-densities of :mod:`jaxsub.compress.posterior`
consume. Nothing here is compiled or cached.

Algorithm 1 (streaming). Rows arrive in order. Row ``x_i`` joins an existing cluster if doing so
keeps that cluster's radius ``delta_j = max_{i in S_j} ||x_i - mu_j||`` (``mu_j`` the member mean)
at most ``delta``; otherwise it opens a new cluster. The neighbour search may be approximate:
missing a neighbour only opens an extra cluster, it never breaks the radius guarantee. The rules
(``rule=``) are leader + trim (:mod:`jaxsub.compress.trim`), the exact-join stream
(:mod:`jaxsub.compress.stream`), the blocked stream (:mod:`jaxsub.compress.blocked`) and merge
rounds (:mod:`jaxsub.compress.merge`); every one ends with the exact check and
:func:`~jaxsub.compress.repair.repair`. Tuning settings are fields of
:class:`~jaxsub.compress.options.ClusterOptions`.

References
----------
Q. Song. Approximate Inference via Clustering. arXiv:2111.14219 (2021), Algorithm 1.
"""

from __future__ import annotations

import numpy as np

from jaxsub.compress.clustering import Clustering, as_features, max_norm, seed_from_key
from jaxsub.compress.options import METHODS, RULES, ClusterOptions, validate_options
from jaxsub.compress.repair import covariances, repair
from jaxsub.compress.rules import stream_labels
from jaxsub.validation import check_choice, check_real

__all__ = ["cluster", "cluster_supervised"]


def resolve_settings(method: str, dim: int, options: ClusterOptions | None, **search) -> tuple[ClusterOptions, str]:
    """Validated options (the search settings given by keyword override ``options``) and the resolved method.

    Parameters
    ----------
    method
        One of :data:`~jaxsub.compress.options.METHODS`.
    dim
        The number of columns clustered.
    options
        A :class:`~jaxsub.compress.options.ClusterOptions` or ``None`` (defaults).
    search
        ``kdtree_eps``, ``projected_dims``, ``projected_candidates`` (``None``: from ``options``).

    Returns
    -------
    tuple
        ``(options, method)`` with ``method`` ``"kdtree"`` or ``"projected"``.

    Raises
    ------
    ValueError
        An unknown search setting, an unknown ``method``, or an option out of range.
    """
    unknown = set(search) - {"kdtree_eps", "projected_dims", "projected_candidates"}
    if unknown:
        raise ValueError(f"unknown search setting(s) {sorted(unknown)}")
    opts = validate_options(options)
    given = {k: v for k, v in search.items() if v is not None}
    opts = validate_options(opts._replace(**given)) if given else opts
    method = check_choice("method", method, METHODS)
    if method == "auto":
        method = "kdtree" if dim <= opts.kdtree_max_dim else "projected"
    return opts, method


def cluster(
    x,
    radius: float,
    *,
    method: str = "auto",
    key=None,
    standardize: bool = False,
    rule: str = "auto",
    options: ClusterOptions | None = None,
    kdtree_eps: float | None = None,
    projected_dims: int | None = None,
    projected_candidates: int | None = None,
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
    options
        :class:`~jaxsub.compress.options.ClusterOptions`: every tuning setting of the passes
        (``None``: the defaults). Settings move the running time and, for heuristic screens,
        which clusters form; every valid value keeps ``radii <= radius``.
    kdtree_eps, projected_dims, projected_candidates
        SciPy's approximation factor; principal components and candidate leaders per row of
        ``"projected"`` (``None``: the values in ``options``).

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
        features; unknown ``method`` or ``rule``; bad search settings or options.

    References
    ----------
    Q. Song, Approximate Inference via Clustering (2021), Algorithm 1 and §4.
    """
    delta = check_real("radius", radius, low=0.0)
    method = check_choice("method", method, METHODS)
    rule = check_choice("rule", rule, RULES)
    arr = as_features(x)
    opts, method = resolve_settings(
        method,
        arr.shape[1],
        options,
        kdtree_eps=kdtree_eps,
        projected_dims=projected_dims,
        projected_candidates=projected_candidates,
    )
    scale = max_norm(arr) if standardize else 1.0
    if scale != 1.0:
        arr = arr / scale
    labels = stream_labels(arr, delta, method, np.random.default_rng(seed_from_key(key)), rule=rule, opts=opts)
    return finish(arr, labels, delta, None, scale, standardize, method, opts=opts)


def finish(arr, labels, delta, targets_from, scale, standardize, method, *, opts: ClusterOptions) -> Clustering:
    """Exact check + repair, second moments, and the :class:`Clustering`."""
    labels, centroids, counts, radii = repair(arr, labels, delta)
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
        covariances=covariances(arr, labels, centroids, counts, opts=opts),
    )


def _integer_valued(y: np.ndarray) -> bool:
    """Whether ``y`` holds class labels: integer or bool dtype, or finite floats that are all integers."""
    if np.issubdtype(y.dtype, np.integer) or y.dtype == bool:
        return True
    if not np.issubdtype(y.dtype, np.floating) or y.size == 0:
        return False
    return bool(np.all(np.isfinite(y)) and np.all(y == np.round(y)))


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
    options: ClusterOptions | None = None,
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
    * ``"auto"``: ``"by_label"`` for integer/bool ``y`` *and* for float ``y`` whose values are
      all integers (e.g. 0.0/1.0 class labels stored as floats), ``"joint"`` otherwise.

    Labels are labels: a classification likelihood must never see an averaged label (joint
    clustering of float 0/1 labels gives fractional targets such as 0.33, in 9 % of the clusters
    on breast cancer), so ``"auto"`` keeps every integer-valued ``y`` discrete. Clustering by
    label is valid for any likelihood (each cluster's members share their ``y`` exactly), so an
    integer-valued regression response (counts) is also kept exact; pass ``mode="joint"`` to
    average it anyway. ``by_label`` targets keep ``y``'s dtype and values.

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
    radius, method, key, standardize, rule, options, search_kwargs
        As in :func:`cluster`.

    Returns
    -------
    Clustering
        With ``targets [c]``; ``labels`` index the global cluster list.

    Raises
    ------
    ValueError
        As :func:`cluster`; ``y`` not of shape ``[N]``; an unknown ``mode``; NaN/inf in ``y``
        (joint mode); ``mode="by_label"`` with fractional or non-finite ``y``.
    """
    delta = check_real("radius", radius, low=0.0)
    mode = check_choice("mode", mode, ("auto", "by_label", "joint"))
    rule = check_choice("rule", rule, RULES)
    arr = as_features(x)
    yarr = np.asarray(y)
    if yarr.ndim != 1 or yarr.shape[0] != arr.shape[0]:
        raise ValueError(f"y must have shape [N] = [{arr.shape[0]}] matching x; got shape {yarr.shape}")
    if mode == "auto":
        mode = "by_label" if _integer_valued(yarr) else "joint"
    if mode == "joint":
        yf = as_features(yarr, "y")
        joint = cluster(
            np.column_stack([arr, yf]),
            delta,
            method=method,
            key=key,
            standardize=standardize,
            rule=rule,
            options=options,
            **search_kwargs,
        )
        return joint._replace(centroids=joint.centroids[:, :-1], targets=joint.centroids[:, -1])
    if not _integer_valued(yarr):
        raise ValueError(
            f"y must hold integer-valued class labels for mode='by_label' (finite, no fractions); got dtype {yarr.dtype}"
        )
    scale = max_norm(arr) if standardize else 1.0
    if scale != 1.0:
        arr = arr / scale
    opts, method = resolve_settings(method, arr.shape[1], options, **search_kwargs)
    rng = np.random.default_rng(seed_from_key(key))
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
        local = stream_labels(arr[rows], delta, method, rng, rule=rule, opts=opts)
        labels[rows] = local + offset
        offset += int(local.max()) + 1
    return finish(arr, labels, delta, yarr, scale, standardize, method, opts=opts)
