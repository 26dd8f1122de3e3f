"""Settings of the host-side clustering: the rule and search names, and :class:`ClusterOptions`.

Every tuning setting of the clustering is a field of :class:`ClusterOptions` with its default
value; :func:`~jaxsub.compress.cluster` takes one as ``options=``. Most settings change only the
running time (block sizes, thread counts, screens); the clustering's guarantee (every radius
``<= delta``, exact in float64) holds for every valid value, because the final check and
:func:`~jaxsub.compress.repair.repair` enforce it whatever the passes decided.
"""

from __future__ import annotations

from typing import NamedTuple

from jaxsub.validation import check_int, check_real

__all__ = ["GREEDY", "METHODS", "RULES", "ClusterOptions", "validate_options"]

#: Clustering rules accepted by :func:`~jaxsub.compress.cluster`: leader + trim, the exact-join
#: stream, the blocked stream, merge rounds (opt-in), or ``"auto"``: trim for
#: ``d <= kdtree_max_dim``; above, the blocked stream when more than ``trim_min_rows`` rows are left
#: to stream, else the exact-join stream (on MNIST-like d = 784 rows trimming drops so many rows that
#: it opens up to 2.5x more clusters, no faster).
RULES = ("auto", "trim", "stream", "blocked", "merge")

#: Neighbour searches accepted by :func:`~jaxsub.compress.cluster` (``"auto"``: k-d tree when
#: ``d <= kdtree_max_dim``, projected k-d tree above).
METHODS = ("auto", "kdtree", "projected")

#: The ``exact`` value of the greedy pass of leader + trim: rows join the nearest centroid within
#: delta (anchors move to the member mean), no radius check. ``True``: the exact join rule;
#: ``False``: the greedy leader pass whose anchors stay at the leaders (a benchmark reference).
GREEDY = "centroid"


class ClusterOptions(NamedTuple):
    """Tuning settings of :func:`~jaxsub.compress.cluster` (defaults: the measured best).

    Attributes
    ----------
    kdtree_max_dim
        Largest dimension treated as low-dimensional: k-d-tree search, leader + trim, greedy
        pair stream, float64 Gram matrices. k-d trees degrade towards brute force as ``d``
        grows; 16 is the usual rule-of-thumb limit (``N >> 2^d``).
    kdtree_eps
        SciPy ``cKDTree.query`` approximation factor: the returned neighbour is within
        ``(1 + eps)`` times the true nearest distance.
    projected_dims, projected_candidates
        ``"projected"`` search: principal components kept, and anchors checked per row.
    workers, parallel_query_rows
        Threads of SciPy's k-d-tree queries; queries of at least ``parallel_query_rows`` rows use
        every core (the answer does not depend on the threads; small queries pay more in thread
        start-up). With 4,096, flights' wall time is x0.93-0.94 of 32,768's on an idle 2-core
        machine at the same CPU time.
    first_block, base_rows
        First block of the doubling scheme of the exact-join stream, and the size below which a
        set of rows is streamed one row at a time.
    margin
        Relative margin under ``delta`` in the join rules: the bounds are exact in real
        arithmetic; the margin keeps float64 round-off of the running sums from creating
        violators (the final exact check and the repair make the radius exact anyway).
    join_rounds
        Shrink rounds of the vectorised join.
    tries
        Nearest clusters a row tries in turn (the next one when refused by the radius check).
    blas_threads
        BLAS threads around the small factorisations and products of the projected search
        (OpenBLAS threads spinning on shared cores cost seconds there).
    pca_rows, pca_power_iterations
        Rows of the subsample whose principal directions the projected search computes, and the
        power iterations of its randomised range finder.
    isolation_dims, isolation_block, isolation_checks, isolation_min_fraction
        Bulk screen of isolated rows: principal directions, rows per screened block, the most
        candidates per row checked exactly (rows with more are left to the stream), and the
        fraction of the first block that must be screened isolated for the screen to go on
        (above 1: the screen is off).
    greedy_pairs, greedy_pairs_max, greedy_pairs_probe
        The greedy centroid stream decides only the rows with an earlier row within ``2 delta``
        (k-d-tree pairs), unless a set has more than ``greedy_pairs_max`` pairs per row (judged
        first on its ``greedy_pairs_probe`` first rows).
    greedy_bincount
        The greedy joins sum each cluster's rows by one bincount per column (low dimensions)
        instead of sorted segment sums (the same floats).
    isolated_parallel_rows
        Sets of at least this many rows run the isolated-row self-query on every core
        (``None``: one thread; the same answer).
    chunk, block_candidates, block_tries
        Blocked stream: rows per chunk, anchors per row given their true distance, and how many
        of them are proposed in turn.
    merge_block, merge_neighbours, merge_batch
        Merge rounds: rows per screened block of the neighbour graph, candidates per row kept by
        its screen, and exact pairs per gathered batch.
    graph_threads
        Host threads of the neighbour graph's blocks and batches (the same output).
    merge_max_rounds, merge_matchings
        Most merge rounds, and matchings per round (1: only mutual nearest pairs).
    merge_complete, merge_complete_reach
        Incomplete cluster pairs with at least ``merge_complete`` of their cross pairs in the
        graph, every one within ``merge_complete_reach * delta`` (``None``: no such condition),
        get the rest computed (``0``: never; clusters then stay near ``merge_neighbours + 1``
        rows).
    trim_min_rows, trim_min_progress
        Leader + trim: sets of at most ``trim_min_rows`` rows, and sets of which the trim keeps
        less than ``trim_min_progress``, go to the exact-join stream instead. Also the size above
        which the bulk screen of isolated rows runs.
    max_covariance_dim
        Largest dimension for which :func:`~jaxsub.compress.cluster` stores per-cluster
        covariances (``c d^2`` floats).
    cov_threads, cov_thread_min
        Host threads of the covariances when their products cover at least ``cov_thread_min``
        numbers (the same floats).
    """

    kdtree_max_dim: int = 16
    kdtree_eps: float = 1.0
    projected_dims: int = 16
    projected_candidates: int = 4
    workers: int = 1
    parallel_query_rows: int = 4096
    first_block: int = 512
    base_rows: int = 32
    margin: float = 1e-9
    join_rounds: int = 4
    tries: int = 3
    blas_threads: int = 1
    pca_rows: int = 1024
    pca_power_iterations: int = 1
    isolation_dims: int = 64
    isolation_block: int = 1024
    isolation_checks: int = 8
    isolation_min_fraction: float = 0.1
    greedy_pairs: bool = True
    greedy_pairs_max: int = 4
    greedy_pairs_probe: int = 32
    greedy_bincount: bool = True
    isolated_parallel_rows: int | None = 4096
    chunk: int = 512
    block_candidates: int = 8
    block_tries: int = 3
    merge_block: int = 512
    merge_neighbours: int = 32
    merge_batch: int = 1024
    graph_threads: int = 1
    merge_max_rounds: int = 200
    merge_matchings: int = 2
    merge_complete: float = 0.5
    merge_complete_reach: float | None = 1.4
    trim_min_rows: int = 2048
    trim_min_progress: float = 0.5
    max_covariance_dim: int = 64
    cov_threads: int = 2
    cov_thread_min: int = 1 << 20


#: Lower bounds of the integer settings (``low`` of :func:`jaxsub.validation.check_int`).
_INT_LOW = (
    ("kdtree_max_dim", 0),
    ("projected_dims", 1),
    ("projected_candidates", 1),
    ("workers", -1),
    ("parallel_query_rows", 0),
    ("first_block", 1),
    ("base_rows", 1),
    ("join_rounds", 1),
    ("tries", 1),
    ("blas_threads", 1),
    ("pca_rows", 2),
    ("pca_power_iterations", 0),
    ("isolation_dims", 1),
    ("isolation_block", 1),
    ("isolation_checks", 0),
    ("greedy_pairs_max", 1),
    ("greedy_pairs_probe", 1),
    ("isolated_parallel_rows", 0),
    ("chunk", 1),
    ("block_candidates", 1),
    ("block_tries", 1),
    ("merge_block", 1),
    ("merge_neighbours", 1),
    ("merge_batch", 1),
    ("graph_threads", 1),
    ("merge_max_rounds", 0),
    ("merge_matchings", 1),
    ("trim_min_rows", 0),
    ("max_covariance_dim", 0),
    ("cov_threads", 1),
    ("cov_thread_min", 0),
)


def validate_options(options: ClusterOptions | None) -> ClusterOptions:
    """Check every field of ``options`` (``None``: the defaults) and return it.

    Parameters
    ----------
    options
        A :class:`ClusterOptions`, or ``None``.

    Returns
    -------
    ClusterOptions
        The validated options (integers as ``int``, reals as ``float``).

    Raises
    ------
    ValueError
        ``options`` is not a :class:`ClusterOptions`, or a field is out of its range: integer
        sizes and counts below their minimum (``workers`` may be ``-1``: every core), ``margin``
        outside ``(-1, 1)``, ``kdtree_eps``, ``isolation_min_fraction``, ``merge_complete``,
        ``merge_complete_reach`` negative, ``trim_min_progress`` outside ``[0, 1]``, a flag not a
        bool.
    """
    if options is None:
        return ClusterOptions()
    if not isinstance(options, ClusterOptions):
        raise ValueError(f"options must be a ClusterOptions; got {type(options).__name__}")
    fixed = {}
    for name, low in _INT_LOW:
        value = getattr(options, name)
        if value is None and name == "isolated_parallel_rows":
            continue
        fixed[name] = check_int(f"options.{name}", value, low=low)
    for name in ("kdtree_eps", "isolation_min_fraction", "merge_complete"):
        fixed[name] = check_real(f"options.{name}", getattr(options, name), low=0.0, low_closed=True)
    if options.merge_complete_reach is not None:
        fixed["merge_complete_reach"] = check_real(
            "options.merge_complete_reach", options.merge_complete_reach, low=0.0, low_closed=True
        )
    fixed["margin"] = check_real("options.margin", options.margin, low=-1.0, high=1.0)
    fixed["trim_min_progress"] = check_real(
        "options.trim_min_progress", options.trim_min_progress, low=0.0, high=1.0, low_closed=True, high_closed=True
    )
    for name in ("greedy_pairs", "greedy_bincount"):
        if not isinstance(getattr(options, name), bool):
            raise ValueError(f"options.{name} must be a bool; got {getattr(options, name)!r}")
    return options._replace(**fixed)
