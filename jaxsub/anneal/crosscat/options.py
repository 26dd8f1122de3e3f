"""The tuning options of :func:`~jaxsub.anneal.crosscat.fit`, declared once (:class:`FitOptions`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp

from jaxsub.anneal.crosscat.features import _check_widths
from jaxsub.anneal.crosscat.grids import CrossCatGrids, default_crosscat_grids
from jaxsub.anneal.crosscat.hypers import HYPER_WIDTHS, _check_hyper_widths
from jaxsub.anneal.crosscat.model import CrossCatModel
from jaxsub.anneal.moves import check_sweep_growth
from jaxsub.validation import check_int, check_real

__all__ = ["FitOptions", "fit_options"]


class FitOptions(NamedTuple):
    """The options of :func:`~jaxsub.anneal.crosscat.fit`, declared once (defaults below).

    Pass them as keyword arguments (``fit(key, x, model, sched, num_chains=4)``) or as one record
    (``fit(key, x, model, sched, options=FitOptions(num_chains=4))``; keyword arguments then override its
    fields). Every option is a static Python value, validated by :func:`fit_options` (``ValueError`` naming it).

    Attributes
    ----------
    num_chains
        Independent chains (default 1), vmapped within a thread group.
    capacity, max_capacity
        Cluster slots per view at the start (32) and the most ``fit`` may grow to (1024). A chain that must
        open a cluster in a full view halts before that tick (nothing is dropped); ``fit`` doubles the
        capacity on the host (one new compile per capacity) and resumes exactly.
    grids
        :class:`~jaxsub.anneal.crosscat.CrossCatGrids` of the hyper step, ``"default"``
        (:func:`~jaxsub.anneal.crosscat.default_crosscat_grids`) or ``None`` (fixed hyperparameters).
    num_checkpoints
        The schedule runs in this many compiled spans (default 5); the trace has one entry per span.
    span
        Ticks per compiled span (default ``ceil(len(schedule) / num_checkpoints)``).
    num_aux
        Auxiliary empty views of Algorithm 8 (default 1).
    hyper_min_rows, feature_min_rows
        The hyper step starts once the subsample holds ``hyper_min_rows`` rows (default ``min(N, 20)``), the
        feature moves once it holds ``feature_min_rows`` (default ``hyper_min_rows``): feature moves on small
        subsamples are what subsample annealing makes cheap, and there they find the view partition.
    feature_moves
        Run the feature (view) moves at all (default True).
    initial_views
        ``"prior"`` (default: each chain's view partition drawn from the view prior, as pylace starts) or
        ``"one"`` (every feature in one view; such chains tend to stay in few views).
    feature_widths
        Static increasing ints (default none): the feature moves run on the subsample's rows only
        (:func:`~jaxsub.anneal.crosscat.build_sweep`; e.g. ``width_ladder(N)``), one more compile per width.
    sweep_growth
        0 (off) or a factor > 1 (default 2): the feature and hyper moves also run each time the subsample has
        grown by it since their last run, so a schedule that only adds rows runs them more than once.
    hyper_widths
        Cluster widths of the hyper step's grid loops (default ``(8, 16, 32)``; ``()`` the full capacity).
    threads
        The chains run as ``threads`` equal groups, each group's compiled sweep called from its own host
        thread (default 1); each chain's draws depend only on its key. ``num_chains`` must be a multiple.
    time_budget
        Seconds of sampling after which ``fit`` stops at the next span (default ``None``: no limit).
    progress_bar
        Show a tqdm bar over ticks (default False).
    dtype
        Float dtype of statistics and scores (default float32).
    checkpoint_dir
        Folder for checkpoints (default ``None``: none). ``fit`` resumes from the newest checkpoint there,
        written by the same run (same key, data, model, schedule and options), to the same draws and traces.
    checkpoint_every
        Write a checkpoint after every this many compiled spans (trace entries; default 1).
    """

    num_chains: int = 1
    capacity: int = 32
    max_capacity: int = 1024
    grids: CrossCatGrids | str | None = "default"
    num_checkpoints: int = 5
    span: int | None = None
    num_aux: int = 1
    hyper_min_rows: int | None = None
    feature_min_rows: int | None = None
    feature_moves: bool = True
    initial_views: str = "prior"
    feature_widths: tuple = ()
    sweep_growth: float = 2.0
    hyper_widths: tuple = HYPER_WIDTHS
    threads: int = 1
    time_budget: float | None = None
    progress_bar: bool = False
    dtype: object = jnp.float32
    checkpoint_dir: object = None
    checkpoint_every: int = 1


def _check_bool(name, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool; got {value!r}")
    return value


def fit_options(
    options: FitOptions | None, overrides: dict, model: CrossCatModel, num_rows: int, num_ticks: int
) -> FitOptions:
    """``options`` (default :class:`FitOptions`) with the keyword ``overrides`` applied, validated and resolved.

    Defaults that depend on the data are filled in (``span``, ``hyper_min_rows``, ``feature_min_rows``,
    ``grids="default"``) and sequences become tuples.

    Raises
    ------
    TypeError
        An unknown option (as Python does for an unexpected keyword argument).
    ValueError
        ``options`` that is not a :class:`FitOptions`, or an option outside its range (named).
    """
    if options is None:
        options = FitOptions()
    elif not isinstance(options, FitOptions):
        raise ValueError(f"options must be a crosscat.FitOptions (or None); got {type(options).__name__}")
    unknown = sorted(set(overrides) - set(FitOptions._fields))
    if unknown:
        raise TypeError(f"fit() got unexpected option(s) {unknown}; the options are {list(FitOptions._fields)}")
    o = options._replace(**overrides)
    num_chains = check_int("num_chains", o.num_chains, low=1)
    capacity = check_int("capacity", o.capacity, low=1)
    threads = check_int("threads", o.threads, low=1, high=num_chains)
    if num_chains % threads:
        raise ValueError(f"num_chains={num_chains} must be a multiple of threads={threads}")
    num_checkpoints = check_int("num_checkpoints", o.num_checkpoints, low=1)
    hyper_min_rows = (
        min(num_rows, 20) if o.hyper_min_rows is None else check_int("hyper_min_rows", o.hyper_min_rows, low=0)
    )
    grids = o.grids
    if isinstance(grids, str):
        if grids != "default":
            raise ValueError(f"grids must be a CrossCatGrids, 'default' or None; got {grids!r}")
        grids = default_crosscat_grids(model)
    elif grids is not None and not isinstance(grids, CrossCatGrids):
        raise ValueError(f"grids must be a CrossCatGrids, 'default' or None; got {type(grids).__name__}")
    if o.initial_views not in ("one", "prior"):
        raise ValueError(f"initial_views must be 'one' or 'prior'; got {o.initial_views!r}")
    if o.time_budget is not None:
        check_real("time_budget", o.time_budget, low=0.0)
    return o._replace(
        num_chains=num_chains,
        capacity=capacity,
        max_capacity=check_int("max_capacity", o.max_capacity, low=capacity),
        grids=grids,
        num_checkpoints=num_checkpoints,
        span=math.ceil(num_ticks / num_checkpoints) if o.span is None else check_int("span", o.span, low=1),
        num_aux=check_int("num_aux", o.num_aux, low=1),
        hyper_min_rows=hyper_min_rows,
        feature_min_rows=hyper_min_rows
        if o.feature_min_rows is None
        else check_int("feature_min_rows", o.feature_min_rows, low=0),
        feature_moves=_check_bool("feature_moves", o.feature_moves),
        feature_widths=_check_widths(o.feature_widths),
        sweep_growth=check_sweep_growth(o.sweep_growth),
        hyper_widths=_check_hyper_widths(o.hyper_widths),
        threads=threads,
        progress_bar=_check_bool("progress_bar", o.progress_bar),
        checkpoint_every=check_int("checkpoint_every", o.checkpoint_every, low=1),
    )
