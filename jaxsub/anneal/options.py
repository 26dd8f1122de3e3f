"""The tuning options of the mixture driver :func:`~jaxsub.anneal.fit`, declared once (:class:`FitOptions`)."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp

from jaxsub.anneal.model import HyperGrids, MixtureModel, default_grids
from jaxsub.anneal.moves import check_sweep_growth
from jaxsub.validation import check_int

__all__ = ["FitOptions", "fit_options"]


class FitOptions(NamedTuple):
    """The options of :func:`jaxsub.anneal.fit`, declared once (defaults below).

    Pass them as keyword arguments (``fit(key, x, model, sched, num_chains=8)``) or as one record
    (``fit(key, x, model, sched, options=FitOptions(num_chains=8))``; keyword arguments then override its
    fields). Every option is a static Python value, validated by :func:`fit_options` (``ValueError`` naming it).

    Attributes
    ----------
    num_chains
        Independent chains, run together with ``vmap`` (default 1).
    capacity, max_capacity
        Initial number of cluster slots (64) and the most ``fit`` may grow to (4096). A chain that needs a new
        cluster while all slots are full halts; ``fit`` then doubles the capacity (outside jit, one
        recompilation) and resumes it exactly; beyond ``max_capacity`` it raises
        :class:`~jaxsub.anneal.mixture.CapacityError`. A ``Finite`` prior fixes both to its number of components.
    grids
        :class:`~jaxsub.anneal.model.HyperGrids` of the once-per-cycle hyperparameter Gibbs step, ``"default"``
        (:func:`~jaxsub.anneal.model.default_grids`) or ``None`` (fixed hyperparameters).
    num_checkpoints
        The schedule runs in this many compiled spans (default 10); the trace has one entry per span.
    span
        Ticks per compiled span (default ``ceil(len(schedule) / num_checkpoints)``). Compiled sweeps are keyed by
        the sweep's configuration and the array shapes, so runs that share a span and a cache compile once.
    hyper_min_rows
        Hyperparameter steps start once the subsample holds this many rows (default ``min(N, 100)``): on a few
        rows ``p(alpha | partition)`` is almost flat, and a large alpha drawn there seeds clusters that confirm
        it. The full-data phase, and hence the invariant distribution, is unchanged.
    sweep_growth
        0 (default: off) or a factor > 1: the hyper step also runs each time the subsample has grown by it since
        the last step (:func:`~jaxsub.anneal.moves.moves_due`); a schedule that only adds rows completes no cycle.
    dtype
        Float dtype of statistics and scores (default float32).
    progress_bar
        Show a tqdm bar over ticks (default False).
    checkpoint_dir
        Folder for checkpoints (default ``None``: none). ``fit`` resumes from the newest checkpoint there,
        written by the same run (same key, data, model, schedule and options), to the same draws and traces.
    checkpoint_every
        Write a checkpoint after every this many compiled spans (trace entries; default 1).
    """

    num_chains: int = 1
    capacity: int = 64
    max_capacity: int = 4096
    grids: HyperGrids | str | None = "default"
    num_checkpoints: int = 10
    span: int | None = None
    hyper_min_rows: int | None = None
    sweep_growth: float = 0.0
    dtype: object = jnp.float32
    progress_bar: bool = False
    checkpoint_dir: object = None
    checkpoint_every: int = 1


def fit_options(
    options: FitOptions | None, overrides: dict, model: MixtureModel, num_rows: int, num_ticks: int
) -> FitOptions:
    """``options`` (default :class:`FitOptions`) with the keyword ``overrides`` applied, validated and resolved.

    Defaults that depend on the data are filled in (``span``, ``hyper_min_rows``, ``grids="default"``; a
    ``Finite`` prior's capacity).

    Parameters
    ----------
    options : FitOptions or None
        The base options (``None``: the defaults).
    overrides : dict
        Keyword options given to :func:`~jaxsub.anneal.fit`, each a :class:`FitOptions` field.
    model : MixtureModel
        The mixture model (its prior fixes a ``Finite`` capacity; its features the default grids).
    num_rows : int
        ``N``, the number of data rows.
    num_ticks : int
        The length of the schedule (sets the default ``span``).

    Returns
    -------
    FitOptions
        The validated options with every data-dependent default resolved.

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
        raise ValueError(f"options must be a jaxsub.anneal.FitOptions (or None); got {type(options).__name__}")
    unknown = sorted(set(overrides) - set(FitOptions._fields))
    if unknown:
        raise TypeError(f"fit() got unexpected option(s) {unknown}; the options are {list(FitOptions._fields)}")
    o = options._replace(**overrides)
    capacity = check_int("capacity", o.capacity, low=1)
    max_capacity = check_int("max_capacity", o.max_capacity, low=capacity)
    num_checkpoints = check_int("num_checkpoints", o.num_checkpoints, low=1)
    if model.is_finite:
        capacity = max_capacity = len(model.prior.weights)
    grids = o.grids
    if isinstance(grids, str):
        if grids != "default":
            raise ValueError(f"grids must be a HyperGrids, 'default' or None; got {grids!r}")
        grids = default_grids(model)
    elif grids is not None and not isinstance(grids, HyperGrids):
        raise ValueError(f"grids must be a HyperGrids, 'default' or None; got {type(grids).__name__}")
    if not isinstance(o.progress_bar, bool):
        raise ValueError(f"progress_bar must be a bool; got {o.progress_bar!r}")
    return o._replace(
        num_chains=check_int("num_chains", o.num_chains, low=1),
        capacity=capacity,
        max_capacity=max_capacity,
        grids=grids,
        num_checkpoints=num_checkpoints,
        span=math.ceil(num_ticks / num_checkpoints) if o.span is None else check_int("span", o.span, low=1),
        hyper_min_rows=min(num_rows, 100)
        if o.hyper_min_rows is None
        else check_int("hyper_min_rows", o.hyper_min_rows, low=0),
        sweep_growth=check_sweep_growth(o.sweep_growth),
        checkpoint_every=check_int("checkpoint_every", o.checkpoint_every, low=1),
    )
