"""Host-side driver: run a schedule on many chains, trace scores, read results back.

* :func:`fit` runs a :class:`~jaxsub.anneal.schedules.Schedule` on ``num_chains``
  vmapped chains in compiled spans (:func:`jaxsub.anneal.sweep.build_sweep`),
  grows cluster capacity outside jit (resuming exactly), and checkpoints cluster
  counts, log joints, summed held-out scores, hyperparameters and wall-clock.
* :func:`compact_labels` turns capacity-slot ids into labels ``0..K-1``;
  :func:`heldout_rows` / :func:`heldout_score` score test rows;
  :func:`diagnose` computes R-hat across chains on the traced cluster counts and
  held-out scores and flags chains stuck far below the others.

Compiled programs are kept only in an explicit :class:`SweepCache` the caller owns
(pass the same one to several ``fit`` calls to reuse compilations); nothing is
cached at module level apart from ``jax.jit``'s own cache of the module-level
jitted functions below.
"""

from __future__ import annotations

import math
import time
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.anneal import mixture as mx
from jaxsub.anneal import resume
from jaxsub.anneal.model import EncodedData, MixtureModel, encode, init_hypers
from jaxsub.anneal.moves import AnnealState, init
from jaxsub.anneal.options import FitOptions, fit_options
from jaxsub.anneal.schedules import Schedule
from jaxsub.anneal.sweep import build_sweep, schedule_windows
from jaxsub.types import PRNGKey
from jaxsub.validation import check_real

__all__ = [
    "Diagnostics",
    "FitOptions",
    "FitResult",
    "FitTrace",
    "SweepCache",
    "compact_labels",
    "diagnose",
    "fit",
    "heldout_rows",
    "heldout_score",
]


class SweepCache:
    """Compiled sweeps, owned by the caller: ``fit(..., cache=SweepCache())``.

    Keys are the sweep's static configuration plus the argument shapes; values are
    AOT-compiled executables. ``fit`` makes a fresh one per call when none is given.
    """

    def __init__(self):
        self.executables: dict = {}

    def __len__(self):
        return len(self.executables)


def _run_sweep(
    states, chain_keys, windows, data, hyper_min_rows, *, model, policy, span, energy_ramp, grids, sweep_growth=0.0
):
    return build_sweep(
        model,
        policy=policy,
        span=span,
        energy_ramp=energy_ramp,
        grids=grids,
        hyper_min_rows=hyper_min_rows,
        sweep_growth=sweep_growth,
    )(states, chain_keys, windows, data)


_sweep_jit = jax.jit(_run_sweep, static_argnames=("model", "policy", "span", "energy_ramp", "grids", "sweep_growth"))


@partial(jax.jit, static_argnames=("model",))
def _chain_stats(states, *, model):
    return (jax.vmap(mx.num_clusters)(states.mixture), jax.vmap(partial(mx.log_joint, model))(states.mixture))


def heldout_rows(model: MixtureModel, state, test: EncodedData, batch_size: int = 8192) -> jnp.ndarray:
    """Per-row held-out log predictive ``log p(x_t | pi, X)``: ``[chains, T]`` (or ``[T]`` unbatched).

    ``state`` is an :class:`~jaxsub.anneal.moves.AnnealState` or a
    :class:`~jaxsub.anneal.mixture.MixtureState`, possibly with a leading chain axis.

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.model.MixtureModel`.
    state
        Possibly batched state.
    test
        Held-out rows as :class:`~jaxsub.anneal.model.EncodedData`.
    batch_size
        Rows per ``lax.map`` step.

    Returns
    -------
    jnp.ndarray
    """
    mixture = state.mixture if hasattr(state, "mixture") else state
    fn = lambda m: mx.heldout_log_predictive(model, m, test, batch_size)  # noqa: E731
    if mixture.sizes.ndim == 2:
        return jax.vmap(fn)(mixture)
    return fn(mixture)


def heldout_score(model: MixtureModel, state, test: EncodedData, batch_size: int = 8192) -> jnp.ndarray:
    """Summed held-out log predictive of ``test`` (:func:`heldout_rows` summed over rows).

    Parameters
    ----------
    model, state, test, batch_size
        As for :func:`heldout_rows`.

    Returns
    -------
    jnp.ndarray
        ``[chains]`` (or a scalar unbatched).
    """
    return jnp.sum(heldout_rows(model, state, test, batch_size), axis=-1)


_heldout_rows_jit = jax.jit(heldout_rows, static_argnames=("model", "batch_size"))


def _init_chains(keys, assignments, data, hypers, *, model, capacity, policy, dtype):
    """Batched :func:`~jaxsub.anneal.moves.init` (one compiled program instead of op-by-op dispatch)."""
    if assignments is None:
        return jax.vmap(
            lambda k: init(None, model, data, capacity, rng_key=k, policy=policy, hypers=hypers, dtype=dtype)
        )(keys)
    return jax.vmap(lambda k, z: init(z, model, data, capacity, rng_key=k, policy=policy, hypers=hypers, dtype=dtype))(
        keys, assignments
    )


_init_chains_jit = jax.jit(_init_chains, static_argnames=("model", "capacity", "policy", "dtype"))


def compact_labels(assignments) -> np.ndarray:
    """Relabel capacity-slot ids as ``0..K-1`` in order of first appearance (``-1`` stays ``-1``).

    Works on ``[N]`` or ``[chains, N]`` arrays (host side, NumPy). Two assignment
    vectors describe the same partition iff their compact labels are equal.

    Parameters
    ----------
    assignments
        ``[N]`` or ``[chains, N]`` slot ids (``-1``: unassigned).

    Returns
    -------
    np.ndarray
        int32 compact labels of the same shape.
    """
    z = np.asarray(assignments)
    if z.ndim == 2:
        return np.stack([compact_labels(row) for row in z])
    out = np.full(z.shape, -1, np.int32)
    on = z >= 0
    if not on.any():
        return out
    vals, first = np.unique(z[on], return_index=True)
    rank = np.empty(vals.size, np.int32)
    rank[np.argsort(first)] = np.arange(vals.size, dtype=np.int32)
    out[on] = rank[np.searchsorted(vals, z[on])]
    return out


class FitTrace(NamedTuple):
    """Checkpoints of :func:`fit` (leading axis = checkpoint, then chain).

    Attributes
    ----------
    tick
        ``[K, chains]`` ticks done.
    num_assigned, num_clusters
        ``[K, chains]`` subsample size and number of clusters.
    log_joint
        ``[K, chains]`` ``log p(pi_S, X_S)`` of the current subsample (:func:`mixture.log_joint`).
    heldout
        ``[K, chains]`` summed held-out log predictive of the test rows (NaN without test data).
    alpha, discount
        ``[K, chains]`` partition hyperparameters.
    seconds
        ``[K]`` wall-clock of the sampling so far (compilation and scoring excluded).
    compile_seconds
        Total compilation time (one compile per capacity).
    capacity
        ``[K]`` cluster capacity at each checkpoint.

    The per-row held-out scores of the final state are in :attr:`FitResult.heldout_rows`.
    """

    tick: np.ndarray
    num_assigned: np.ndarray
    num_clusters: np.ndarray
    log_joint: np.ndarray
    heldout: np.ndarray
    alpha: np.ndarray
    discount: np.ndarray
    seconds: np.ndarray
    compile_seconds: float
    capacity: np.ndarray


class FitResult(NamedTuple):
    """What :func:`fit` returns.

    Attributes
    ----------
    state
        Batched final :class:`~jaxsub.anneal.moves.AnnealState` (leading chain axis);
        ``state.mixture.assignments`` holds capacity-slot ids (with gaps).
    trace
        :class:`FitTrace`.
    labels
        ``[chains, N]`` compact cluster labels ``0..K-1`` (:func:`compact_labels`), ``-1`` unassigned.
    heldout_rows
        ``[chains, T]`` per-row held-out log predictive of the final state (``None`` without test data).
    """

    state: AnnealState
    trace: FitTrace
    labels: np.ndarray
    heldout_rows: np.ndarray | None


class _Run(NamedTuple):
    """The validated inputs of one :func:`fit` call (host side)."""

    model: MixtureModel
    schedule: Schedule
    options: FitOptions
    enc: EncodedData
    test: EncodedData | None
    cache: SweepCache


def _prepare(data, model, schedule, test_data, cache, options, overrides) -> _Run:
    """Validate ``fit``'s arguments (``ValueError`` naming the culprit) and encode the data."""
    if not isinstance(schedule, Schedule):
        raise ValueError(f"schedule must be a jaxsub.anneal.Schedule; got {type(schedule).__name__}")
    if schedule.blocks is not None and np.any(schedule.blocks != 1):
        raise ValueError(
            "schedule has blocks > 1 (block Gibbs, e.g. anneal_stepsize): fit moves one row per tick; "
            "use jaxsub.anneal.two_urns.run_schedule"
        )
    dtype = overrides["dtype"] if "dtype" in overrides else (options or FitOptions()).dtype
    enc = encode(model, data, dtype)
    n = enc.cat.shape[0]
    o = fit_options(options, overrides, model, n, len(schedule))
    if schedule.num_rows != n:
        raise ValueError(f"schedule is for {schedule.num_rows} rows but data has {n}")
    test = encode(model, test_data, o.dtype) if test_data is not None else None
    return _Run(model, schedule, o, enc, test, SweepCache() if cache is None else cache)


def _check_initial_assignments(run: _Run, initial_assignments):
    """``initial_assignments`` as ``[chains, N]`` int32 labels (or ``None``), validated against the schedule."""
    o, schedule, n = run.options, run.schedule, run.enc.cat.shape[0]
    if schedule.initial_size > 0 and initial_assignments is None:
        raise ValueError("initial_assignments are required for a schedule with initial_size > 0")
    if initial_assignments is None:
        return None
    z = np.asarray(initial_assignments)
    z = np.broadcast_to(z, (o.num_chains, n)) if z.ndim == 1 else z
    if z.shape != (o.num_chains, n):
        raise ValueError(f"initial_assignments must have shape [{n}] or [{o.num_chains}, {n}]; got {z.shape}")
    if int(z.max()) >= o.capacity:
        raise ValueError(f"initial_assignments use label {int(z.max())} >= capacity {o.capacity}")
    sizes = (z >= 0).sum(axis=1)
    if np.any(sizes != schedule.initial_size):
        raise ValueError(
            f"initial_assignments assign {sizes.tolist()} rows; the schedule expects {schedule.initial_size}"
        )
    if schedule.policy == "fifo" and schedule.initial_size not in (0, n):
        raise ValueError("a 'fifo' schedule can only start empty or from a full assignment")
    return jnp.asarray(z, jnp.int32)


def _initial_states(rng_key, run: _Run, assignments):
    """The chains' initial states and their sweep keys."""
    o = run.options
    k_init, k_run = jax.random.split(rng_key)
    init_keys = jax.random.split(k_init, o.num_chains)
    chain_keys = jax.random.split(k_run, o.num_chains)
    states = _init_chains_jit(
        init_keys,
        assignments,
        run.enc,
        init_hypers(run.model, o.dtype),
        model=run.model,
        capacity=o.capacity,
        policy=run.schedule.policy,
        dtype=o.dtype,
    )
    return states, chain_keys


def _compiled_sweep(run: _Run, states, chain_keys, windows, min_rows):
    """The compiled sweep for these shapes from ``run.cache`` (compiled now if missing): ``(exe, seconds)``."""
    o, schedule = run.options, run.schedule
    sig = (
        run.model,
        schedule.policy,
        o.span,
        schedule.energy_ramp,
        o.grids,
        o.sweep_growth,
        tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves((states, chain_keys, windows, run.enc))),
    )
    if sig in run.cache.executables:
        return run.cache.executables[sig], 0.0
    static = dict(model=run.model, policy=schedule.policy, span=o.span, energy_ramp=schedule.energy_ramp, grids=o.grids)
    if o.sweep_growth:
        static["sweep_growth"] = o.sweep_growth
    t0 = time.perf_counter()
    run.cache.executables[sig] = _sweep_jit.lower(states, chain_keys, windows, run.enc, min_rows, **static).compile()
    return run.cache.executables[sig], time.perf_counter() - t0


def _grow_if_halted(run: _Run, states, capacity: int):
    """Double the capacity of halted chains' states (host side) or raise ``CapacityError``: ``(states, capacity)``."""
    if not bool(np.any(np.asarray(states.halted))):
        return states, capacity
    if capacity >= run.options.max_capacity:
        raise mx.CapacityError(
            f"a chain needs more than max_capacity={run.options.max_capacity} clusters at tick "
            f"{int(np.asarray(states.cursor).min())}; raise max_capacity (or capacity)"
        )
    capacity = min(2 * capacity, run.options.max_capacity)
    return mx.grow(states, capacity)._replace(halted=jnp.zeros((run.options.num_chains,), bool)), capacity


def _trace_row(run: _Run, states, elapsed: float, capacity: int):
    """``(row, heldout rows [chains, T] or None)``: one trace entry (the fields of :class:`FitTrace` in order)."""
    ncl, lj = _chain_stats(states, model=run.model)
    rows_t = _heldout_rows_jit(run.model, states, run.test) if run.test is not None else None
    held = np.asarray(jnp.sum(rows_t, axis=-1)) if rows_t is not None else np.full(run.options.num_chains, np.nan)
    h = states.mixture.hypers
    row = (
        np.asarray(states.cursor).copy(),
        np.asarray(states.num_assigned),
        np.asarray(ncl),
        np.asarray(lj),
        held,
        np.asarray(h.alpha),
        np.asarray(h.discount),
        elapsed,
        capacity,
    )
    return row, rows_t


def _result(states, rows: list, rows_t, compile_seconds: float) -> FitResult:
    cols = list(zip(*rows))
    trace = FitTrace(
        tick=np.stack(cols[0]),
        num_assigned=np.stack(cols[1]),
        num_clusters=np.stack(cols[2]),
        log_joint=np.stack(cols[3]),
        heldout=np.stack(cols[4]),
        alpha=np.stack(cols[5]),
        discount=np.stack(cols[6]),
        seconds=np.asarray(cols[7]),
        compile_seconds=compile_seconds,
        capacity=np.asarray(cols[8]),
    )
    labels = compact_labels(np.asarray(states.mixture.assignments))
    return FitResult(states, trace, labels, None if rows_t is None else np.asarray(rows_t))


def fit(
    rng_key: PRNGKey,
    data,
    model: MixtureModel,
    schedule: Schedule,
    *,
    test_data=None,
    initial_assignments=None,
    cache: SweepCache | None = None,
    options: FitOptions | None = None,
    **overrides,
) -> FitResult:
    """Run a subsample schedule on ``num_chains`` independent chains (vmap) and trace scores.

    Parameters
    ----------
    rng_key
        PRNG key (split per chain).
    data
        ``[N, num_features]`` array (column ``j`` modelled by ``model.features[j]``) or
        :class:`EncodedData`.
    model
        :class:`MixtureModel`.
    schedule
        :class:`Schedule` with ``schedule.num_rows == N`` (one row per tick: no blocks).
    test_data
        Optional held-out rows (same layout as ``data``): scored at every trace entry.
    initial_assignments
        ``[N]`` or ``[num_chains, N]`` starting labels in ``[0, capacity)`` (``-1``: unassigned), required when
        ``schedule.initial_size > 0``.
    cache
        A :class:`SweepCache` to reuse compiled sweeps across calls (default: a new one).
    options
        :class:`~jaxsub.anneal.options.FitOptions` (default: its defaults); keyword ``overrides`` replace its
        fields (``num_chains``, ``capacity``, ``grids``, ``num_checkpoints``, ``hyper_min_rows``, ...).

    Returns
    -------
    FitResult
        ``(state, trace, labels, heldout_rows)``; check convergence with :func:`diagnose`.

    Raises
    ------
    CapacityError
        (:class:`~jaxsub.anneal.mixture.CapacityError`) a chain needs more than ``max_capacity`` clusters.
    ValueError
        A table the model rejects, a schedule for another ``N`` or with blocks, initial assignments of the wrong
        shape, size or labels, an option out of range (:func:`~jaxsub.anneal.options.fit_options`), or a
        checkpoint in ``checkpoint_dir`` written by a different run.
    TypeError
        An unknown option.
    """
    run = _prepare(data, model, schedule, test_data, cache, options, overrides)
    assignments = _check_initial_assignments(run, initial_assignments)
    states, chain_keys = _initial_states(rng_key, run, assignments)
    meta = _meta(rng_key, run, assignments)
    progress = _Progress(states, run.options.capacity, [], None, 0.0, 0.0)
    restored = resume.restore(run.options.checkpoint_dir, partial(_checkpoint_like, run, states), meta=meta)
    if restored is not None:
        progress = _from_checkpoint(restored[1])
    bar = _progress_bar(run.options, schedule)
    while not (progress.rows and _finished(run, progress)):
        progress = _step(run, progress, chain_keys)
        if run.options.checkpoint_dir is not None and (
            len(progress.rows) % run.options.checkpoint_every == 0 or _finished(run, progress)
        ):
            resume.save(
                run.options.checkpoint_dir,
                len(progress.rows),
                _checkpoint_tree(progress),
                capacity=progress.capacity,
                num_entries=len(progress.rows),
                meta=meta,
            )
        if bar is not None:
            bar.update(int(progress.rows[-1][0].min()) - bar.n)
    if bar is not None:
        bar.close()
    return _result(progress.states, progress.rows, progress.rows_t, progress.compile_seconds)


class _Progress(NamedTuple):
    """Where a :func:`fit` run stands after some spans (what a checkpoint holds)."""

    states: AnnealState  # batched
    capacity: int
    rows: list  # trace entries, the fields of FitTrace in order
    rows_t: object  # [chains, T] held-out rows of the last entry, or None
    elapsed: float
    compile_seconds: float


def _finished(run: _Run, p: _Progress) -> bool:
    return int(np.asarray(p.states.cursor).min()) >= len(run.schedule)


def _step(run: _Run, p: _Progress, chain_keys) -> _Progress:
    """One compiled span of every chain, capacity growth, and its trace entry."""
    windows = jnp.asarray(
        schedule_windows(np.asarray(run.schedule.codes), np.asarray(p.states.cursor), run.options.span)
    )
    min_rows = jnp.asarray(run.options.hyper_min_rows, jnp.int32)  # traced: one compiled sweep for every value
    sweep, comp = _compiled_sweep(run, p.states, chain_keys, windows, min_rows)
    t0 = time.perf_counter()
    states = jax.block_until_ready(sweep(p.states, chain_keys, windows, run.enc, min_rows))
    elapsed = p.elapsed + time.perf_counter() - t0
    states, capacity = _grow_if_halted(run, states, p.capacity)
    row, rows_t = _trace_row(run, states, elapsed, capacity)
    return _Progress(states, capacity, p.rows + [row], rows_t, elapsed, p.compile_seconds + comp)


def _meta(rng_key, run: _Run, assignments) -> dict:
    """What a checkpoint must match: the run's key, data, model, schedule, test data and draw-changing options."""
    o = run.options._replace(checkpoint_dir=None, checkpoint_every=1, progress_bar=False)
    s = run.schedule
    return {
        "driver": "jaxsub.anneal.fit",
        "run": resume.fingerprint(
            rng_key,
            run.enc,
            run.test,
            assignments,
            repr(run.model),
            s.codes,
            s.policy,
            s.energy_ramp,
            s.num_rows,
            s.initial_size,
            repr(o),
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
    return _checkpoint_tree(_Progress(mx.grow(states, capacity), capacity, [row] * num_entries, rows_t, 0.0, 0.0))


def _from_checkpoint(tree: dict) -> _Progress:
    rows = resume.unstack_rows(tree["trace"])
    return _Progress(
        tree["states"], int(rows[-1][8]), rows, tree.get("rows_t"), float(tree["clock"][0]), float(tree["clock"][1])
    )


def _progress_bar(options: FitOptions, schedule: Schedule):
    if not options.progress_bar:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=len(schedule), unit="tick", leave=False, desc=schedule.name)


# --------------------------------------------------------------------------- diagnostics
class Diagnostics(NamedTuple):
    """Convergence diagnostic across chains (:func:`diagnose`).

    Attributes
    ----------
    rhat_num_clusters, rhat_heldout, rhat_log_joint
        Gelman-Rubin potential scale reduction (``blackjax.diagnostics``) of each
        traced quantity over the diagnosed checkpoints (``nan`` without test data for
        ``rhat_heldout``; ``1`` when every chain is constant at the same value;
        ``inf`` when every chain is constant but chains disagree).
    stuck
        ``[chains]`` bool: chains whose mean score (held-out per test row if traced,
        else log joint) lies below the median chain by more than ``tolerance``.
    chain_score
        ``[chains]`` the per-chain mean score used for ``stuck``.
    tolerance
        The gap that flags a chain (see :func:`diagnose`).
    converged
        Every R-hat below the threshold and no stuck chain.
    message
        A human-readable summary.
    """

    rhat_num_clusters: float
    rhat_heldout: float
    rhat_log_joint: float
    stuck: np.ndarray
    chain_score: np.ndarray
    tolerance: float
    converged: bool
    message: str


def _rhat(x: np.ndarray) -> float:
    """R-hat of ``x`` ``[chains, samples]`` with the degenerate constant cases made explicit."""
    from blackjax.diagnostics import potential_scale_reduction

    x = np.asarray(x, np.float64)
    if not np.all(np.isfinite(x)):
        return float("nan")
    within = x.var(axis=1, ddof=1).mean() if x.shape[1] > 1 else 0.0
    if within == 0.0:
        return 1.0 if np.ptp(x) == 0.0 else float("inf")
    return float(potential_scale_reduction(jnp.asarray(x), chain_axis=0, sample_axis=1))


def diagnose(
    trace: FitTrace,
    *,
    window: float = 0.5,
    rhat_threshold: float = 1.1,
    num_test_rows: int | None = None,
    gap: float = 3.0,
) -> Diagnostics:
    """R-hat across chains and a stuck-chain flag from a :func:`fit` trace.

    The last ``window`` fraction of the checkpoints (at least 2) is diagnosed. R-hat
    (Gelman & Rubin 1992) is computed on the number of clusters, the summed held-out
    score and the log joint. A chain is *stuck* when its mean score ``s_c`` (held-out
    log predictive per test row when the trace has it, else log joint per checkpoint)
    satisfies ``median_c(s) - s_c > tolerance`` with
    ``tolerance = gap * max(1.4826 MAD_c(s), sd_within, 1e-3 |median_c(s)|)``
    (MAD: median absolute deviation across chains; sd_within: the pooled within-chain
    standard deviation), i.e. a robust outlier below the bulk of the chains.

    Assumes the chains ran the same schedule on the same data and that at least half
    of them found the good mode: a majority of stuck chains cannot be detected this way
    (their R-hat still flags disagreement).

    Parameters
    ----------
    trace
        :class:`FitTrace` with at least 2 chains.
    window
        Fraction of the last checkpoints to use, in ``(0, 1]``.
    rhat_threshold
        R-hat above this fails ``converged``.
    num_test_rows
        Divide held-out sums by this to report per-row scores (optional).
    gap
        The outlier multiplier above.

    Returns
    -------
    Diagnostics

    Raises
    ------
    ValueError
        ``window`` outside ``(0, 1]``, ``rhat_threshold <= 1``, ``gap <= 0`` or fewer than 2 chains.
    """
    window = check_real("window", window, low=0.0, high=1.0, high_closed=True)
    rhat_threshold = check_real("rhat_threshold", rhat_threshold, low=1.0)
    gap = check_real("gap", gap, low=0.0)
    chains = trace.num_clusters.shape[1]
    if chains < 2:
        raise ValueError(f"diagnose needs at least 2 chains; the trace has {chains}")
    k = trace.num_clusters.shape[0]
    start = max(0, min(k - 2, int(math.floor(k * (1.0 - window))))) if k >= 2 else 0
    sl = slice(start, None)
    ncl = trace.num_clusters[sl].T.astype(np.float64)
    lj = trace.log_joint[sl].T.astype(np.float64)
    held = trace.heldout[sl].T.astype(np.float64)
    have_test = bool(np.all(np.isfinite(held)))
    r_k, r_lj = _rhat(ncl), _rhat(lj)
    r_h = _rhat(held) if have_test else float("nan")
    score = held / (num_test_rows or 1) if have_test else lj
    means = score.mean(axis=1)
    med = float(np.median(means))
    mad = 1.4826 * float(np.median(np.abs(means - med)))
    sd_within = float(np.sqrt(score.var(axis=1, ddof=1).mean())) if score.shape[1] > 1 else 0.0
    tol = gap * max(mad, sd_within, 1e-3 * abs(med))
    stuck = (med - means) > tol
    rh = [r for r in (r_k, r_h, r_lj) if not np.isnan(r)]
    converged = bool(all(r < rhat_threshold for r in rh) and not stuck.any())
    what = "held-out per row" if have_test and num_test_rows else ("held-out" if have_test else "log joint")
    parts = [f"R-hat: clusters {r_k:.3g}, held-out {r_h:.3g}, log joint {r_lj:.3g}"]
    if stuck.any():
        parts.append(
            f"stuck chains {np.flatnonzero(stuck).tolist()} (mean {what} "
            f"{', '.join(f'{v:.4g}' for v in means[stuck])} vs median {med:.4g}, tolerance {tol:.3g}; "
            f"clusters {trace.num_clusters[-1][stuck].tolist()} vs median {float(np.median(trace.num_clusters[-1])):g})"
        )
    parts.append("converged" if converged else "NOT converged: run longer or use an annealed schedule")
    return Diagnostics(r_k, r_h, r_lj, stuck, means, tol, converged, "; ".join(parts))
