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
from jaxsub.anneal.model import EncodedData, HyperGrids, MixtureModel, default_grids, encode, init_hypers
from jaxsub.anneal.moves import AnnealState, check_sweep_growth, init
from jaxsub.anneal.schedules import Schedule
from jaxsub.anneal.sweep import build_sweep, schedule_windows
from jaxsub.types import PRNGKey
from jaxsub.validation import check_int, check_real

__all__ = [
    "Diagnostics",
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


def _run_sweep(states, chain_keys, windows, data, hyper_min_rows, *, model, policy, span, energy_ramp, grids,
               sweep_growth=0.0):
    return build_sweep(model, policy=policy, span=span, energy_ramp=energy_ramp, grids=grids,
                       hyper_min_rows=hyper_min_rows, sweep_growth=sweep_growth)(states, chain_keys, windows, data)


_sweep_jit = jax.jit(_run_sweep, static_argnames=("model", "policy", "span", "energy_ramp", "grids", "sweep_growth"))


@partial(jax.jit, static_argnames=("model",))
def _chain_stats(states, *, model):
    return (jax.vmap(mx.num_clusters)(states.mixture), jax.vmap(partial(mx.log_joint, model))(states.mixture))


def heldout_rows(model: MixtureModel, state, test: EncodedData, batch_size: int = 8192) -> jnp.ndarray:
    """Per-row held-out log predictive ``log p(x_t | pi, X)``: ``[chains, T]`` (or ``[T]`` unbatched).

    ``state`` is an :class:`~jaxsub.anneal.moves.AnnealState` or a
    :class:`~jaxsub.anneal.mixture.MixtureState`, possibly with a leading chain axis.
    """
    mixture = state.mixture if hasattr(state, "mixture") else state
    fn = lambda m: mx.heldout_log_predictive(model, m, test, batch_size)  # noqa: E731
    if mixture.sizes.ndim == 2:
        return jax.vmap(fn)(mixture)
    return fn(mixture)


def heldout_score(model: MixtureModel, state, test: EncodedData, batch_size: int = 8192) -> jnp.ndarray:
    """Summed held-out log predictive of ``test`` (:func:`heldout_rows` summed over rows)."""
    return jnp.sum(heldout_rows(model, state, test, batch_size), axis=-1)


_heldout_rows_jit = jax.jit(heldout_rows, static_argnames=("model", "batch_size"))


def _init_chains(keys, assignments, data, hypers, *, model, capacity, policy, dtype):
    """Batched :func:`~jaxsub.anneal.moves.init` (one compiled program instead of op-by-op dispatch)."""
    if assignments is None:
        return jax.vmap(lambda k: init(None, model, data, capacity, rng_key=k, policy=policy, hypers=hypers,
                                       dtype=dtype))(keys)
    return jax.vmap(lambda k, z: init(z, model, data, capacity, rng_key=k, policy=policy, hypers=hypers,
                                      dtype=dtype))(keys, assignments)


_init_chains_jit = jax.jit(_init_chains, static_argnames=("model", "capacity", "policy", "dtype"))


def compact_labels(assignments) -> np.ndarray:
    """Relabel capacity-slot ids as ``0..K-1`` in order of first appearance (``-1`` stays ``-1``).

    Works on ``[N]`` or ``[chains, N]`` arrays (host side, NumPy). Two assignment
    vectors describe the same partition iff their compact labels are equal.
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




def fit(rng_key: PRNGKey, data, model: MixtureModel, schedule: Schedule, *, num_chains: int = 1,
        capacity: int = 64, max_capacity: int = 4096, grids: HyperGrids | str | None = "default",
        test_data=None, num_checkpoints: int = 10, span: int | None = None, initial_assignments=None,
        dtype=jnp.float32, progress_bar: bool = False, cache: SweepCache | None = None,
        hyper_min_rows: int | None = None, sweep_growth: float = 0.0) -> FitResult:
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
        :class:`Schedule` with ``schedule.num_rows == N``.
    num_chains
        Independent chains, run together with ``vmap``.
    capacity, max_capacity
        Initial number of cluster slots and the most ``fit`` may grow to. A chain that
        needs a new cluster while all slots are full halts; ``fit`` then doubles the
        capacity (outside jit, one recompilation) and resumes it exactly; beyond
        ``max_capacity`` it raises :class:`~jaxsub.anneal.mixture.CapacityError`.
    grids
        :class:`HyperGrids` for the once-per-cycle hyperparameter Gibbs step,
        ``"default"`` (:func:`default_grids`) or ``None`` (fixed hyperparameters).
    test_data
        Optional held-out rows (same layout as ``data``): scored at every checkpoint.
    num_checkpoints
        The schedule is run in this many compiled spans; the trace has one entry per span.
    span
        Ticks per compiled span (overrides ``num_checkpoints``). Compiled sweeps are keyed
        by ``(model, policy, span, energy_ramp, grids)`` and array shapes in ``cache``, so
        runs that share a span and a cache (e.g. schedules of different lengths on the same
        data) compile once.
    initial_assignments
        ``[N]`` or ``[num_chains, N]`` starting labels (required when ``schedule.initial_size > 0``).
    dtype
        Float dtype of statistics and scores.
    progress_bar
        Show a tqdm bar over spans.
    cache
        A :class:`SweepCache` to reuse compiled sweeps across calls (default: a new one).
    hyper_min_rows
        Hyperparameter steps start only once the subsample holds this many rows
        (default ``min(N, 100)``). On a subsample of a few rows ``p(alpha | partition)``
        is almost flat (for ``n = 1`` it *is* the hyperprior), so hyper steps there draw
        alpha from its wide log-uniform grid prior; a large alpha then seeds
        ``~alpha log(1 + n/alpha)`` clusters that confirm it (measured on the
        ``docs/anneal.md`` quickstart: 1 to 219 clusters and alpha = 74 across 8 chains
        with 0, 3 to 17 with 100). The full-data phase, and hence the invariant
        distribution, is unchanged.
    sweep_growth
        0 (default: off) or a factor > 1: the hyper step runs after a tick that completes a cycle
        through the subsample and, with a factor, also each time the subsample has grown by it
        since the last step (:func:`~jaxsub.anneal.moves.moves_due`). A schedule that only adds
        rows (``linear_anneal(N, N)``, the adding phase of Sequential+Gibbs) completes no cycle,
        so by default its hyperparameters stay where ``hyper_min_rows`` rows put them. Off by
        default for the mixture: on 100,000 military rows (DP and PY, 1N and 2N, 3 keys x 4
        chains) ``sweep_growth=2`` moved the held-out score per row by -0.018 ... +0.014 nats,
        inside the chains' spread (docs/anneal.md, session 16). CrossCat's ``fit`` defaults to 2,
        where the feature moves it also triggers decide the 1N score.

    Returns
    -------
    FitResult
        ``(state, trace, labels, heldout_rows)``; check convergence with :func:`diagnose`.
    """
    num_chains = check_int("num_chains", num_chains, low=1)
    capacity = check_int("capacity", capacity, low=1)
    max_capacity = check_int("max_capacity", max_capacity, low=capacity)
    num_checkpoints = check_int("num_checkpoints", num_checkpoints, low=1)
    if not isinstance(schedule, Schedule):
        raise ValueError(f"schedule must be a jaxsub.anneal.Schedule; got {type(schedule).__name__}")
    if schedule.blocks is not None and np.any(schedule.blocks != 1):
        raise ValueError("schedule has blocks > 1 (block Gibbs, e.g. anneal_stepsize): fit moves one row per tick; "
                         "use jaxsub.anneal.two_urns.run_schedule")
    enc = encode(model, data, dtype)
    n = enc.cat.shape[0]
    hyper_min_rows = min(n, 100) if hyper_min_rows is None else check_int("hyper_min_rows", hyper_min_rows, low=0)
    if schedule.num_rows != n:
        raise ValueError(f"schedule is for {schedule.num_rows} rows but data has {n}")
    if model.is_finite:
        capacity = max_capacity = len(model.prior.weights)
    if isinstance(grids, str):
        if grids != "default":
            raise ValueError(f"grids must be a HyperGrids, 'default' or None; got {grids!r}")
        grids = default_grids(model)
    test = encode(model, test_data, dtype) if test_data is not None else None
    hypers = init_hypers(model, dtype)
    k_init, k_run = jax.random.split(rng_key)
    init_keys = jax.random.split(k_init, num_chains)
    chain_keys = jax.random.split(k_run, num_chains)
    if schedule.initial_size > 0 and initial_assignments is None:
        raise ValueError("initial_assignments are required for a schedule with initial_size > 0")
    if initial_assignments is not None:
        z = np.asarray(initial_assignments)
        z = np.broadcast_to(z, (num_chains, n)) if z.ndim == 1 else z
        if z.shape != (num_chains, n):
            raise ValueError(f"initial_assignments must have shape [{n}] or [{num_chains}, {n}]; got {z.shape}")
        if int(z.max()) >= capacity:
            raise ValueError(f"initial_assignments use label {int(z.max())} >= capacity {capacity}")
        sizes = (z >= 0).sum(axis=1)
        if np.any(sizes != schedule.initial_size):
            raise ValueError(f"initial_assignments assign {sizes.tolist()} rows; the schedule expects {schedule.initial_size}")
        if schedule.policy == "fifo" and schedule.initial_size not in (0, n):
            raise ValueError("a 'fifo' schedule can only start empty or from a full assignment")
        states = _init_chains_jit(init_keys, jnp.asarray(z, jnp.int32), enc, hypers, model=model, capacity=capacity,
                                  policy=schedule.policy, dtype=dtype)
    else:
        states = _init_chains_jit(init_keys, None, enc, hypers, model=model, capacity=capacity,
                                  policy=schedule.policy, dtype=dtype)
    num_ticks = len(schedule)
    span = math.ceil(num_ticks / num_checkpoints) if span is None else check_int("span", span, low=1)
    codes = np.asarray(schedule.codes)
    cache = SweepCache() if cache is None else cache
    static = dict(model=model, policy=schedule.policy, span=span, energy_ramp=schedule.energy_ramp, grids=grids)
    sweep_growth = check_sweep_growth(sweep_growth)
    if sweep_growth:
        static["sweep_growth"] = sweep_growth
    min_rows = jnp.asarray(hyper_min_rows, jnp.int32)  # traced: one compiled sweep for every hyper_min_rows
    compile_seconds = 0.0

    def get_sweep(windows):
        nonlocal compile_seconds
        sig = (model, schedule.policy, span, schedule.energy_ramp, grids, sweep_growth,
               tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves((states, chain_keys, windows, enc))))
        if sig not in cache.executables:
            t0 = time.perf_counter()
            cache.executables[sig] = _sweep_jit.lower(states, chain_keys, windows, enc, min_rows, **static).compile()
            compile_seconds += time.perf_counter() - t0
        return cache.executables[sig]

    rows = []
    elapsed = 0.0
    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_ticks, unit="tick", leave=False, desc=schedule.name)
    done = 0
    while True:
        windows = jnp.asarray(schedule_windows(codes, np.asarray(states.cursor), span))
        sweep = get_sweep(windows)
        t0 = time.perf_counter()
        states = sweep(states, chain_keys, windows, enc, min_rows)
        jax.block_until_ready(states)
        elapsed += time.perf_counter() - t0
        cursor = np.asarray(states.cursor)
        if bool(np.any(np.asarray(states.halted))):
            if capacity >= max_capacity:
                raise mx.CapacityError(
                    f"a chain needs more than max_capacity={max_capacity} clusters at tick {int(cursor.min())}; "
                    "raise max_capacity (or capacity)"
                )
            capacity = min(2 * capacity, max_capacity)
            states = mx.grow(states, capacity)._replace(halted=jnp.zeros((num_chains,), bool))
        ncl, lj = _chain_stats(states, model=model)
        rows_t = _heldout_rows_jit(model, states, test) if test is not None else None
        held = np.asarray(jnp.sum(rows_t, axis=-1)) if test is not None else np.full(num_chains, np.nan)
        h = states.mixture.hypers
        rows.append((cursor.copy(), np.asarray(states.num_assigned), np.asarray(ncl), np.asarray(lj), held,
                     np.asarray(h.alpha), np.asarray(h.discount), elapsed, capacity))
        if bar is not None:
            bar.update(int(cursor.min()) - done)
            done = int(cursor.min())
        if int(cursor.min()) >= num_ticks:
            break
    if bar is not None:
        bar.close()
    cols = list(zip(*rows))
    trace = FitTrace(
        tick=np.stack(cols[0]), num_assigned=np.stack(cols[1]), num_clusters=np.stack(cols[2]),
        log_joint=np.stack(cols[3]), heldout=np.stack(cols[4]), alpha=np.stack(cols[5]),
        discount=np.stack(cols[6]), seconds=np.asarray(cols[7]), compile_seconds=compile_seconds,
        capacity=np.asarray(cols[8]),
    )
    labels = compact_labels(np.asarray(states.mixture.assignments))
    return FitResult(states, trace, labels, None if rows_t is None else np.asarray(rows_t))




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


def diagnose(trace: FitTrace, *, window: float = 0.5, rhat_threshold: float = 1.1,
             num_test_rows: int | None = None, gap: float = 3.0) -> Diagnostics:
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

    Args:
        trace: :class:`FitTrace` with at least 2 chains.
        window: fraction of the last checkpoints to use, in ``(0, 1]``.
        rhat_threshold: R-hat above this fails ``converged``.
        num_test_rows: divide held-out sums by this to report per-row scores (optional).
        gap: the outlier multiplier above.

    Returns:
        :class:`Diagnostics`.
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
