"""The annealing driver of the coreference sweep: :func:`fit` (one sweep per inverse temperature).

Annealed Gibbs for MAP with an increasing β (Finkel, Grenager & Manning 2005): the temperatures
are data, one compiled sweep serves them all.
"""
from __future__ import annotations

import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.coreference.kernel import _check_factor, _flag, build_kernel
from jaxsub.coreference.model import Blocks
from jaxsub.coreference.options import CorefOptions
from jaxsub.coreference.state import CorefState, init

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


def fit(rng_key, pairwise_log_factor: Callable, mentions, blocks: Blocks, temperatures, *, position=None,
        callback: Callable | None = None, progress_bar: bool = False, sweep: Callable | None = None,
        exact: bool = False, check_decisions: bool = False, options: CorefOptions | None = None,
        **option_values) -> tuple[CorefState, CorefTrace]:
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

    Returns
    -------
    tuple
        ``(state, CorefTrace)``; wall-clock excludes the first call's compilation (timed apart).

    Raises
    ------
    ValueError
        ``temperatures`` not a non-empty 1-D array of finite values > 0, a non-callable factor, bad initial
        labels, an option out of its range, or both ``sweep`` and kernel settings.
    """
    betas = np.asarray(temperatures, np.float32)
    if betas.ndim != 1 or betas.size < 1 or not np.all(np.isfinite(betas)) or np.any(betas <= 0):
        raise ValueError(f"temperatures must be a 1-D array of finite values > 0; got {temperatures!r}")
    _check_factor(pairwise_log_factor)
    if sweep is None:
        kernel = build_kernel(blocks, options, **option_values)
        exact, check = _flag("exact", exact), _flag("check_decisions", check_decisions)
        sweep = jax.jit(lambda k, s, x, b: kernel(k, s, pairwise_log_factor, x, b, exact, check))
    elif option_values or options is not None or exact or check_decisions:
        raise ValueError("pass either sweep or kernel settings (exact, check_decisions, build_kernel keywords), "
                         f"not both; got {sorted(option_values) + ['options'] * (options is not None) + ['exact'] * bool(exact)}")
    state = init(position, blocks)
    t0 = time.perf_counter()
    compiled = sweep
    if hasattr(sweep, "lower"):
        compiled = sweep.lower(rng_key, state, mentions, jnp.float32(1.0)).compile()
    compile_s = time.perf_counter() - t0
    rows = []
    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=betas.size, unit="sweep", leave=False)
    for s, beta in enumerate(betas):
        t0 = time.perf_counter()
        state, info = compiled(jax.random.fold_in(rng_key, s), state, mentions, jnp.float32(beta))
        jax.block_until_ready(state)
        dt = time.perf_counter() - t0
        rows.append((dt,) + tuple(int(v) for v in info))
        if callback is not None:
            callback(s, np.asarray(state.labels))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    cols = list(zip(*rows))
    return state, CorefTrace(labels=np.asarray(state.labels)[None], seconds=np.asarray(cols[0]),
                           num_evaluations=np.asarray(cols[1], np.int64), num_races=np.asarray(cols[2]),
                           num_exact=np.asarray(cols[3]), num_nan=np.asarray(cols[4]),
                           num_errors=np.asarray(cols[5]), num_checked=np.asarray(cols[6]),
                           compile_seconds=compile_s)
