"""The host-side driver :func:`fit`: compiled sweeps of chain groups, capacity growth, traces."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.anneal import mixture as mx
from jaxsub.anneal import resume
from jaxsub.anneal.crosscat.model import CrossCatModel, encode_table, grow, init
from jaxsub.anneal.crosscat.options import FitOptions, fit_options
from jaxsub.anneal.crosscat.partitions import prior_view_partition
from jaxsub.anneal.crosscat.queries import heldout_rows
from jaxsub.anneal.crosscat.result import CrossCatFit
from jaxsub.anneal.crosscat.scores import log_joint
from jaxsub.anneal.crosscat.sweep import SweepConfig, sweep, sweep_config
from jaxsub.anneal.driver import SweepCache
from jaxsub.anneal.schedules import Schedule
from jaxsub.anneal.sweep import schedule_windows
from jaxsub.types import PRNGKey

__all__ = ["FitOptions", "fit"]


@partial(jax.jit, static_argnames=("model",))
def _stats(states, *, model):
    V = states.z.shape[1]
    nf = jax.vmap(lambda v: jax.ops.segment_sum(jnp.ones_like(v), v, V))(states.view_of)
    occ = nf > 0
    k = jnp.sum(states.sizes > 0, axis=2)
    return jnp.sum(occ, 1), jnp.sum(jnp.where(occ, k, 0), 1) / jnp.maximum(jnp.sum(occ, 1), 1)


@partial(jax.jit, static_argnames=("model",))
def _log_joint_batched(states, *, model):
    return jax.vmap(lambda s: log_joint(model, s))(states)


@partial(jax.jit, static_argnames=("model",))
def _heldout_batched(states, test, *, model):
    return jax.vmap(lambda s: heldout_rows(model, s, test))(states)


@partial(jax.jit, static_argnames=("model", "capacity", "num_aux", "num_chains", "dtype", "policy"))
def _init_chains_jit(
    data, *, model, capacity, num_aux, num_chains, dtype, policy="random", view_keys=None, order_keys=None
):
    """``num_chains`` copies of :func:`init` (empty) as one compiled program instead of op-by-op dispatch;
    with ``view_keys`` ``[chains]`` each chain's view partition is drawn from the view prior; ``order_keys``
    ``[chains]`` draw each chain's FIFO cycle (policy ``"fifo"``)."""

    def one(i):
        vo = None if view_keys is None else prior_view_partition(view_keys[i], model, num_aux)
        ok = None if order_keys is None else order_keys[i]
        return init(model, data, capacity, view_of=vo, num_aux=num_aux, dtype=dtype, policy=policy, rng_key=ok)

    return jax.vmap(one)(jnp.arange(num_chains))


_sweep_jit = jax.jit(sweep, static_argnums=0)


class _Run(NamedTuple):
    """The validated inputs of one :func:`fit` call (host side)."""

    model: CrossCatModel
    schedule: Schedule
    options: FitOptions
    enc: object  # CrossCatData
    test: object  # CrossCatData or None
    config: SweepConfig
    codes: np.ndarray  # the windows' codes (code + 8 * block for a blocked schedule)
    window_dtype: type
    cache: SweepCache


def _prepare(data, model, schedule, test_data, cache, options, overrides) -> _Run:
    """Validate ``fit``'s arguments (``ValueError`` naming the culprit) and build its sweep configuration."""
    if not isinstance(model, CrossCatModel):
        raise ValueError(f"model must be a crosscat.CrossCatModel; got {type(model).__name__}")
    if not isinstance(schedule, Schedule) or schedule.initial_size != 0:
        raise ValueError("schedule must be a jaxsub.anneal.Schedule starting empty (initial_size 0)")
    blocked = schedule.blocks is not None and bool(np.any(schedule.blocks != 1))
    if blocked and schedule.policy != "random":
        raise ValueError("a schedule with blocks > 1 (block Gibbs) needs the 'random' row policy")
    dtype = (options or FitOptions()).dtype if "dtype" not in overrides else overrides["dtype"]
    enc = encode_table(model, data, dtype)
    n = enc.cat.shape[0]
    if schedule.num_rows != n:
        raise ValueError(f"schedule is for {schedule.num_rows} rows but data has {n}")
    o = fit_options(options, overrides, model, n, len(schedule))
    test = encode_table(model, test_data, o.dtype) if test_data is not None else None
    config = sweep_config(
        model,
        span=o.span,
        energy_ramp=schedule.energy_ramp,
        grids=o.grids,
        num_aux=o.num_aux,
        hyper_min_rows=o.hyper_min_rows,
        feature_moves=o.feature_moves,
        feature_min_rows=o.feature_min_rows,
        policy=schedule.policy,
        blocked=blocked,
        feature_widths=o.feature_widths,
        sweep_growth=o.sweep_growth,
        hyper_widths=o.hyper_widths,
    )
    codes = np.asarray(schedule.codes)
    if blocked:  # block sizes ride in the windows: code + 8 * block (int32)
        codes = codes.astype(np.int32) + 8 * np.asarray(schedule.blocks, np.int32)
    return _Run(
        model,
        schedule,
        o,
        enc,
        test,
        config,
        codes,
        np.int32 if blocked else np.int8,
        SweepCache() if cache is None else cache,
    )


def _initial_states(rng_key, run: _Run):
    """The chains' initial states (no row assigned) and their sweep keys."""
    o = run.options
    view_keys = None
    if o.initial_views == "prior":  # a separate stream: the row draws of "one" and "prior" runs stay comparable
        rng_key, k_views = jax.random.split(rng_key)
        view_keys = jax.random.split(k_views, o.num_chains)
    order_keys = None
    if run.schedule.policy == "fifo":  # each chain's shuffled cycle, again from its own stream
        rng_key, k_order = jax.random.split(rng_key)
        order_keys = jax.random.split(k_order, o.num_chains)
    states = _init_chains_jit(
        run.enc,
        model=run.model,
        capacity=o.capacity,
        num_aux=o.num_aux,
        num_chains=o.num_chains,
        dtype=o.dtype,
        policy=run.schedule.policy,
        view_keys=view_keys,
        order_keys=order_keys,
    )
    return states, jax.random.split(rng_key, o.num_chains)


def _executable(run: _Run, states, keys, windows):
    """The compiled sweep for these shapes from ``run.cache`` (compiled now if missing): ``(exe, seconds)``."""
    sig = (
        "crosscat",
        run.config,
        tuple((a.shape, str(a.dtype)) for a in jax.tree.leaves((states, keys, windows, run.enc))),
    )
    if sig in run.cache.executables:
        return run.cache.executables[sig], 0.0
    t0 = time.perf_counter()
    run.cache.executables[sig] = _sweep_jit.lower(run.config, states, keys, windows, run.enc).compile()
    return run.cache.executables[sig], time.perf_counter() - t0


def _take(tree, sl):
    return jax.tree.map(lambda a: a[sl], tree)


def _join(trees):
    return jax.tree.map(lambda *a: jnp.concatenate(a), *trees)


def _groups(run: _Run) -> list:
    group = run.options.num_chains // run.options.threads
    return [slice(i * group, (i + 1) * group) for i in range(run.options.threads)]


def _windows(run: _Run, states):
    return jnp.asarray(schedule_windows(run.codes, np.asarray(states.cursor), run.config.span, run.window_dtype))


def _run_span(run: _Run, states, keys):
    """One compiled span of every chain group (one host thread per group): ``(states, seconds, compile seconds)``."""
    parts = _groups(run)
    groups = [_take(states, sl) for sl in parts]
    wins = [_windows(run, g) for g in groups]
    exe, compile_seconds = _executable(run, groups[0], keys[parts[0]], wins[0])
    t0 = time.perf_counter()
    if len(parts) == 1:
        out = jax.block_until_ready(exe(groups[0], keys[parts[0]], wins[0], run.enc))
    else:
        with ThreadPoolExecutor(len(parts)) as pool:
            out = _join(
                list(
                    pool.map(
                        lambda a: jax.block_until_ready(exe(a[0], keys[a[1]], a[2], run.enc)), zip(groups, parts, wins)
                    )
                )
            )
    return out, time.perf_counter() - t0, compile_seconds


def _grow_if_halted(run: _Run, states, capacity: int):
    """Double the capacity of halted chains' states (host side) or raise ``CapacityError``: ``(states, capacity)``."""
    if not bool(np.any(np.asarray(states.halted))):
        return states, capacity
    max_capacity = run.options.max_capacity
    if capacity >= max_capacity:
        raise mx.CapacityError(
            f"a chain needs more than max_capacity={max_capacity} clusters in a view "
            f"at tick {int(np.asarray(states.cursor).min())}; raise max_capacity"
        )
    capacity = min(2 * capacity, max_capacity)
    return grow(states, capacity)._replace(halted=jnp.zeros((run.options.num_chains,), bool)), capacity


class _TraceRow(NamedTuple):
    """One entry of the trace (one compiled span)."""

    heldout: np.ndarray  # [chains]
    num_views: np.ndarray  # [chains]
    num_clusters: np.ndarray  # [chains]
    seconds: float
    capacity: int
    log_joint: np.ndarray  # [chains]


def _trace_row(run: _Run, states, elapsed: float, capacity: int):
    """``(_TraceRow, heldout rows [chains, T] or None)`` of the chains after a span."""
    nv, nk = _stats(states, model=run.model)
    rows_t = _heldout_batched(states, run.test, model=run.model) if run.test is not None else None
    held = np.asarray(jnp.sum(rows_t, -1)) if rows_t is not None else np.full(run.options.num_chains, np.nan)
    row = _TraceRow(
        held, np.asarray(nv), np.asarray(nk), elapsed, capacity, np.asarray(_log_joint_batched(states, model=run.model))
    )
    return row, rows_t


def _result(states, rows: list, rows_t, compile_seconds: float) -> CrossCatFit:
    cols = _TraceRow(*zip(*rows))
    return CrossCatFit(
        states,
        np.stack(cols.heldout),
        None if rows_t is None else np.asarray(rows_t),
        np.stack(cols.num_views),
        np.stack(cols.num_clusters),
        np.asarray(cols.seconds),
        compile_seconds,
        np.asarray(cols.capacity),
        np.stack(cols.log_joint),
    )


def fit(
    rng_key: PRNGKey,
    data,
    model: CrossCatModel,
    schedule: Schedule,
    *,
    test_data=None,
    cache: SweepCache | None = None,
    options: FitOptions | None = None,
    **overrides,
) -> CrossCatFit:
    """Run a row schedule for CrossCat on ``num_chains`` vmapped chains.

    Row policy ``"random"`` (Anneal, Prior+Gibbs, Sequential+Gibbs, energy annealing, block schedules such as
    :func:`~jaxsub.anneal.anneal_stepsize`) or ``"fifo"`` (:func:`~jaxsub.anneal.loom`: the subsample is a
    sliding window of each chain's shuffled cycle of the rows). Every chain starts from no rows, its features in
    a view partition drawn from the view prior (``initial_views="prior"``) or in one view. After a tick that
    completes a cycle through the subsample (or, with ``sweep_growth``, after the subsample has grown by that
    factor) a chain runs the feature moves and the hyper step (:func:`~jaxsub.anneal.crosscat.build_sweep`).

    Parameters
    ----------
    rng_key
        PRNG key (split into the view-prior, FIFO-cycle and per-chain sweep streams).
    data
        ``[N, F]`` table (NaN = missing; column ``f`` modelled by ``model.features[f]``) or
        :class:`~jaxsub.anneal.crosscat.CrossCatData`.
    model
        :class:`~jaxsub.anneal.crosscat.CrossCatModel`.
    schedule
        :class:`~jaxsub.anneal.schedules.Schedule` of ``N`` rows starting empty (``initial_size == 0``).
    test_data
        Optional held-out rows (same layout as ``data``), scored at every trace entry.
    cache
        A :class:`~jaxsub.anneal.driver.SweepCache` to share compilations across calls (default: a new one).
    options
        :class:`FitOptions` (default: its defaults); keyword ``overrides`` replace its fields.

    Returns
    -------
    CrossCatFit
        Final batched state and the trace (one entry per compiled span); check it with
        :func:`~jaxsub.anneal.crosscat.diagnose`.

    Raises
    ------
    CapacityError
        (:class:`~jaxsub.anneal.mixture.CapacityError`) a chain needs more than ``max_capacity`` clusters in a view.
    ValueError
        A table the model rejects, a schedule that does not start empty or is for another ``N``, a blocked schedule
        with the ``"fifo"`` policy, an option out of range (:func:`~jaxsub.anneal.crosscat.options.fit_options`), or
        a checkpoint in ``checkpoint_dir`` written by a different run.
    TypeError
        An unknown option.
    """
    run = _prepare(data, model, schedule, test_data, cache, options, overrides)
    states, keys = _initial_states(rng_key, run)
    meta = _meta(rng_key, run)
    progress = _Progress(states, run.options.capacity, [], None, 0.0, 0.0)
    restored = resume.restore(run.options.checkpoint_dir, partial(_checkpoint_like, run, states), meta=meta)
    if restored is not None:
        progress = _from_checkpoint(restored[1])
    part = _groups(run)[0]
    progress = progress._replace(
        compile_seconds=progress.compile_seconds
        + _executable(run, _take(progress.states, part), keys[part], _windows(run, _take(progress.states, part)))[1]
    )
    bar = _progress_bar(run.options, schedule)
    while not (progress.rows and _finished(run, progress)):
        progress = _step(run, progress, keys)
        if run.options.checkpoint_dir is not None and (
            len(progress.rows) % run.options.checkpoint_every == 0 or _finished(run, progress)
        ):
            _save(run, progress, meta)
        if bar is not None:
            bar.n = int(np.asarray(progress.states.cursor).min())
            bar.refresh()
    if bar is not None:
        bar.close()
    return _result(progress.states, progress.rows, progress.rows_t, progress.compile_seconds)


class _Progress(NamedTuple):
    """Where a :func:`fit` run stands after some spans (what a checkpoint holds)."""

    states: object  # batched CrossCatState
    capacity: int
    rows: list  # of _TraceRow
    rows_t: object  # [chains, T] held-out rows of the last entry, or None
    elapsed: float
    compile_seconds: float


def _finished(run: _Run, p: _Progress) -> bool:
    budget = run.options.time_budget
    return int(np.asarray(p.states.cursor).min()) >= len(run.schedule) or (budget is not None and p.elapsed >= budget)


def _step(run: _Run, p: _Progress, keys) -> _Progress:
    """One compiled span of every chain, capacity growth, and its trace entry."""
    states, secs, comp = _run_span(run, p.states, keys)
    states, capacity = _grow_if_halted(run, states, p.capacity)
    row, rows_t = _trace_row(run, states, p.elapsed + secs, capacity)
    return _Progress(states, capacity, p.rows + [row], rows_t, p.elapsed + secs, p.compile_seconds + comp)


def _meta(rng_key, run: _Run) -> dict:
    """What a checkpoint must match: the run's key, data, model, schedule, test data and draw-changing options."""
    o = run.options._replace(checkpoint_dir=None, checkpoint_every=1, progress_bar=False, time_budget=None)
    s = run.schedule
    return {
        "driver": "jaxsub.anneal.crosscat.fit",
        "run": resume.fingerprint(
            rng_key, run.enc, run.test, repr(run.model), s.codes, s.blocks, s.policy, s.energy_ramp, s.num_rows, repr(o)
        ),
    }


def _checkpoint_tree(p: _Progress) -> dict:
    tree = {"states": p.states, "trace": resume.stack_rows(p.rows), "clock": np.asarray([p.elapsed, p.compile_seconds])}
    if p.rows_t is not None:
        tree["rows_t"] = p.rows_t
    return tree


def _checkpoint_like(run: _Run, states, capacity: int, num_entries: int) -> dict:
    """The structure, shapes and dtypes of a checkpoint of ``num_entries`` trace entries at ``capacity``."""
    row, rows_t = _trace_row(run, states, 0.0, run.options.capacity)
    return _checkpoint_tree(_Progress(grow(states, capacity), capacity, [row] * num_entries, rows_t, 0.0, 0.0))


def _from_checkpoint(tree: dict) -> _Progress:
    rows = resume.unstack_rows(tree["trace"], _TraceRow)
    return _Progress(
        tree["states"],
        int(rows[-1].capacity),
        rows,
        tree.get("rows_t"),
        float(tree["clock"][0]),
        float(tree["clock"][1]),
    )


def _save(run: _Run, p: _Progress, meta: dict) -> None:
    resume.save(
        run.options.checkpoint_dir,
        len(p.rows),
        _checkpoint_tree(p),
        capacity=p.capacity,
        num_entries=len(p.rows),
        meta=meta,
    )


def _progress_bar(options: FitOptions, schedule: Schedule):
    if not options.progress_bar:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=len(schedule), unit="tick", leave=False, desc=f"crosscat {schedule.name}")
