"""The annealing driver of the coreference sweep: :func:`fit` (one sweep per inverse temperature).

Annealed Gibbs for MAP with an increasing β (Finkel, Grenager & Manning 2005): the temperatures
are data, one compiled sweep serves them all. With ``checkpoint_dir`` the run saves its state and
records every ``checkpoint_every`` sweeps (:mod:`jaxsub.checkpoint`) and resumes from the newest
checkpoint, to the same draws.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub import checkpoint
from jaxsub.coreference.kernel import _check_factor, _flag, build_kernel
from jaxsub.coreference.model import Blocks
from jaxsub.coreference.options import CorefOptions, coref_options, validate_options
from jaxsub.coreference.state import CorefState, SweepInfo, init
from jaxsub.validation import check_int

__all__ = ["CorefTrace", "FitTrace", "fit"]


class CorefTrace(NamedTuple):
    """Per-sweep record of :func:`fit` (NumPy arrays, one entry per sweep).

    Attributes
    ----------
    labels
        ``[1, M]`` the final labels.
    num_evaluations, num_races, num_exact, num_nan, num_errors, num_checked
        The :class:`~jaxsub.coreference.SweepInfo` counts of each sweep.
    seconds
        Wall-clock of each sweep (the first call's compilation excluded).
    compile_seconds
        Compilation time (0 when a compiled sweep is passed).
    """

    labels: np.ndarray
    num_evaluations: np.ndarray
    seconds: np.ndarray
    num_races: np.ndarray
    num_exact: np.ndarray
    num_nan: np.ndarray
    num_errors: np.ndarray
    num_checked: np.ndarray
    compile_seconds: float


#: The former name of :class:`CorefTrace` (``jaxsub.anneal.FitTrace`` is a different class).
FitTrace = CorefTrace


def fit(
    rng_key,
    pairwise_log_factor: Callable,
    mentions,
    blocks: Blocks,
    temperatures,
    *,
    position=None,
    callback: Callable | None = None,
    progress_bar: bool = False,
    sweep: Callable | None = None,
    exact: bool = False,
    check_decisions: bool = False,
    options: CorefOptions | None = None,
    checkpoint_dir=None,
    checkpoint_every: int = 1,
    **option_values,
) -> tuple[CorefState, CorefTrace]:
    """Run one sweep per entry of ``temperatures`` (annealed Gibbs for MAP with an increasing β).

    Parameters
    ----------
    rng_key
        Sweep ``s`` uses ``jax.random.fold_in(rng_key, s)``.
    pairwise_log_factor
        ``f(x_i, x_j) -> scalar`` on single rows of ``mentions``.
    mentions
        Pytree of arrays with leading axis M.
    blocks
        :class:`~jaxsub.coreference.Blocks`.
    temperatures
        1-D array of inverse temperatures β_s > 0, one per sweep (data, not code).
    position
        Initial labels (:func:`~jaxsub.coreference.init`); ``None``: every mention alone.
    callback
        Optional ``callback(sweep, labels_numpy)`` after each sweep (e.g. scoring).
    progress_bar
        Show a ``tqdm`` bar.
    sweep
        Optional ``sweep(rng_key, state, mentions, temperature) -> (state, SweepInfo)`` to share one
        compilation across runs: a ``jax.jit``-ed function (compiled here, timed apart) or its compiled
        form ``.lower(...).compile()`` (reused as is, ``compile_seconds`` ≈ 0), e.g.
        ``jax.jit(lambda k, s, x, b: kernel(k, s, factor, x, b, exact=True))``. Then ``exact``,
        ``check_decisions`` and the options must be left out.
    exact, check_decisions
        As in the kernel of :func:`~jaxsub.coreference.build_kernel`.
    options, **option_values
        The sweep's options (:class:`~jaxsub.coreference.CorefOptions`), as in
        :func:`~jaxsub.coreference.build_kernel` (when ``sweep`` is not given).
    checkpoint_dir
        Optional folder of this run's checkpoints (:mod:`jaxsub.checkpoint`: atomic writes, the newest two
        kept). When it holds a checkpoint, the run resumes from it — the state and the records of the
        sweeps done — and gives the same draws and trace counts as an uninterrupted run (sweep ``s`` always
        uses ``fold_in(rng_key, s)``); the stored ``seconds`` of the sweeps done are kept, ``callback`` is
        called for the remaining sweeps only. A checkpoint of another run (other key, temperatures, initial
        labels, number of mentions or settings) raises ``ValueError``.
    checkpoint_every
        Save every this many sweeps (>= 1), and after the last.

    Returns
    -------
    tuple
        ``(state, CorefTrace)``; wall-clock excludes the first call's compilation (timed apart).

    Raises
    ------
    ValueError
        ``temperatures`` not a non-empty 1-D array of finite values > 0, a non-callable factor, bad initial
        labels, an option out of its range, ``checkpoint_every < 1``, both ``sweep`` and kernel settings, or a
        checkpoint in ``checkpoint_dir`` written by another run.
    """
    betas = np.asarray(temperatures, np.float32)
    if betas.ndim != 1 or betas.size < 1 or not np.all(np.isfinite(betas)) or np.any(betas <= 0):
        raise ValueError(f"temperatures must be a 1-D array of finite values > 0; got {temperatures!r}")
    _check_factor(pairwise_log_factor)
    checkpoint_every = check_int("checkpoint_every", checkpoint_every, low=1)
    run = None
    if sweep is None:
        opts = validate_options(coref_options(options, option_values, "fit"), blocks)
        kernel = build_kernel(blocks, opts)
        exact, check = _flag("exact", exact), _flag("check_decisions", check_decisions)
        sweep = jax.jit(lambda k, s, x, b: kernel(k, s, pairwise_log_factor, x, b, exact, check))
        run = f"{opts!r} exact={exact!r} check_decisions={check!r}"
    elif option_values or options is not None or exact or check_decisions:
        raise ValueError(
            "pass either sweep or kernel settings (exact, check_decisions, build_kernel keywords), "
            f"not both; got {sorted(option_values) + ['options'] * (options is not None) + ['exact'] * bool(exact)}"
        )
    state = init(position, blocks)
    progress = _Progress(state, np.zeros((betas.size, len(SweepInfo._fields)), np.int64), np.zeros(betas.size))
    start, meta = 0, None
    if checkpoint_dir is not None:
        meta = _run_meta(rng_key, betas, state, run)
        if checkpoint.latest_step(checkpoint_dir) is not None:
            start, progress = checkpoint.restore(checkpoint_dir, progress, meta=meta)
    t0 = time.perf_counter()
    compiled = sweep
    if hasattr(sweep, "lower"):
        compiled = sweep.lower(rng_key, state, mentions, jnp.float32(1.0)).compile()
    compile_s = time.perf_counter() - t0
    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=betas.size, initial=start, unit="sweep", leave=False)
    state, counts, seconds = progress
    counts, seconds = np.array(counts), np.array(seconds)
    for s in range(start, betas.size):
        t0 = time.perf_counter()
        state, info = compiled(jax.random.fold_in(rng_key, s), state, mentions, jnp.float32(betas[s]))
        jax.block_until_ready(state)
        seconds[s] = time.perf_counter() - t0
        counts[s] = [int(v) for v in info]
        if callback is not None:
            callback(s, np.asarray(state.labels))
        if bar is not None:
            bar.update(1)
        if checkpoint_dir is not None and ((s + 1) % checkpoint_every == 0 or s + 1 == betas.size):
            checkpoint.save(checkpoint_dir, s + 1, _Progress(state, counts, seconds), meta=meta)
    if bar is not None:
        bar.close()
    return state, _trace(state, counts, seconds, compile_s)


class _Progress(NamedTuple):
    """What a checkpoint of :func:`fit` holds: the state after the saved sweeps and their records."""

    state: CorefState
    counts: np.ndarray  # [num_sweeps, 6] int64, the SweepInfo counts (rows after the saved sweeps: 0)
    seconds: np.ndarray  # [num_sweeps] float64


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:24]


def _run_meta(rng_key, betas, state: CorefState, run: str | None) -> dict:
    """The run's description stored with each checkpoint (a resumed run must match it)."""
    key = jax.random.key_data(rng_key) if jax.dtypes.issubdtype(rng_key.dtype, jax.dtypes.prng_key) else rng_key
    meta = {
        "driver": "jaxsub.coreference.fit",
        "num_mentions": int(state.labels.shape[0]),
        "num_sweeps": int(betas.size),
        "temperatures": _digest(betas),
        "rng_key": _digest(np.asarray(key)),
        "position": _digest(np.asarray(state.labels)),
    }
    if run is not None:
        meta["settings"] = hashlib.sha256(run.encode()).hexdigest()[:24]
    return meta


def _trace(state: CorefState, counts, seconds, compile_s: float) -> CorefTrace:
    c = counts.T
    return CorefTrace(
        labels=np.asarray(state.labels)[None],
        num_evaluations=c[0],
        seconds=seconds,
        num_races=c[1],
        num_exact=c[2],
        num_nan=c[3],
        num_errors=c[4],
        num_checked=c[5],
        compile_seconds=compile_s,
    )
