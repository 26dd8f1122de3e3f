"""What :func:`~jaxsub.anneal.crosscat.fit` returns, and its convergence diagnostic."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxsub.anneal import driver as _driver
from jaxsub.anneal.crosscat.model import CrossCatState

__all__ = ["CrossCatFit", "diagnose"]


class CrossCatFit(NamedTuple):
    """``state`` (batched), ``heldout`` ``[K, chains]`` summed test scores, ``heldout_rows`` ``[chains, T]`` at the end,
    ``num_views`` / ``num_clusters`` (mean over occupied views) ``[K, chains]``, ``seconds`` ``[K]``,
    ``compile_seconds``, ``trace_capacity`` ``[K]`` cluster slots per view at each checkpoint (grown on overflow),
    ``log_joint`` ``[K, chains]`` (:func:`log_joint` of the subsample at each checkpoint).

    ``view_labels`` ``[chains, F]`` and ``row_labels`` ``[chains, F, N]`` (each feature's row partition, that
    of its view) are compact: ``0..K-1`` in order of first appearance (:func:`jaxsub.anneal.compact_labels`),
    ``-1`` for rows not in the subsample.

    Attributes
    ----------
    state, heldout, heldout_rows, num_views, num_clusters, seconds, compile_seconds, trace_capacity, log_joint
        As above.
    """

    state: CrossCatState
    heldout: np.ndarray
    heldout_rows: np.ndarray | None
    num_views: np.ndarray
    num_clusters: np.ndarray
    seconds: np.ndarray
    compile_seconds: float
    trace_capacity: np.ndarray | None = None
    log_joint: np.ndarray | None = None

    @property
    def view_labels(self) -> np.ndarray:
        return _driver.compact_labels(np.asarray(self.state.view_of))

    @property
    def row_labels(self) -> np.ndarray:
        vo, z = np.asarray(self.state.view_of), np.asarray(self.state.z)
        return np.stack([_driver.compact_labels(z[c][vo[c]]) for c in range(vo.shape[0])])


def diagnose(fit_result: CrossCatFit, *, num_test_rows: int | None = None, **kwargs) -> _driver.Diagnostics:
    """R-hat across chains (mean clusters per view, held-out score, log joint) and stuck chains, as
    :func:`jaxsub.anneal.diagnose` for the mixture ``fit`` (same rule and keyword arguments, which it validates).

    Parameters
    ----------
    fit_result
        A :class:`CrossCatFit` with at least 2 chains.
    num_test_rows
        Divide held-out sums by this to report per-row scores (optional).
    **kwargs
        ``window``, ``rhat_threshold``, ``gap`` of :func:`jaxsub.anneal.diagnose`.

    Returns
    -------
    jaxsub.anneal.Diagnostics

    Raises
    ------
    ValueError
        A result without a ``log_joint`` trace, or the settings :func:`jaxsub.anneal.diagnose` rejects.
    """
    r = fit_result
    if r.log_joint is None:
        raise ValueError("fit_result has no log_joint trace (build it with crosscat.fit)")
    k, chains = r.heldout.shape
    zeros = np.zeros((k, chains))
    trace = _driver.FitTrace(
        tick=zeros,
        num_assigned=zeros,
        num_clusters=np.asarray(r.num_clusters),
        log_joint=np.asarray(r.log_joint),
        heldout=np.asarray(r.heldout),
        alpha=zeros,
        discount=zeros,
        seconds=np.asarray(r.seconds),
        compile_seconds=r.compile_seconds,
        capacity=np.asarray(r.trace_capacity) if r.trace_capacity is not None else zeros[:, 0],
    )
    return _driver.diagnose(trace, num_test_rows=num_test_rows, **kwargs)
