"""Summaries of racing MH traces: how much data the decisions read, and warnings where the answer is poor."""

from __future__ import annotations

import warnings

import numpy as np

from jaxsub.racing.mh_kernel import RacingMHInfo
from jaxsub.validation import check_int, check_real

__all__ = ["info_summary"]

#: Racing without a control variate: at delta = 0.05 the wrong decisions are frequent where the
#: decision margin is small (a well-tuned random walk), so the chain's spread and centre move
#: (docs/guides/discrete.md, "Racing MH without a control variate does not pay";
#: tests/test_racing_mh.py::test_plain_racing_mh_variance_inflation_at_delta_005_is_detected).
_NO_CONTROL_VARIATE = (
    "racing MH decided {share:.0%} of the steps without a control variate: plain racing MH's wrong decisions "
    "widen and shift the posterior measurably at delta = 0.05 (docs/guides/discrete.md). Centre a control "
    "variate at the MAP: fit = jaxsub.racing_mh.laplace_fit(...); "
    "cv = jaxsub.racing_mh.parameter_taylor_control_variate(loglikelihood_fn, data, fit.position); "
    "pass control_variate=cv and step_size=fit.step_size"
)
_READS_MOST = (
    "racing MH read {share:.0%} of the data per step on average (warning above {limit:.0%}): racing saves "
    "little over exact MH here. A control variate centred at the MAP (parameter_taylor_control_variate) "
    "and the Laplace step size (laplace_fit(...).step_size) make most races stop after the first batch"
)


def _num_data(info, num_data):
    if num_data is not None:
        return check_int("num_data", num_data, low=1)
    if getattr(info, "num_data", None) is None:
        raise ValueError("info_summary needs num_data: this info does not record it (pass num_data=N)")
    return check_int("num_data", int(np.max(np.asarray(info.num_data))), low=1)


def _warn(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def info_summary(
    info: RacingMHInfo,
    num_data: int | None = None,
    *,
    delta: float | None = None,
    nan_warning: float = 0.01,
    read_warning: float = 0.5,
) -> dict:
    """Summarise a trace of :class:`~jaxsub.racing.mh_kernel.RacingMHInfo` (any leading axes: steps, chains).

    Parameters
    ----------
    info
        The infos of a run (``N`` and whether a control variate was used are read from them).
    num_data
        ``N``; default: ``info.num_data``.
    delta
        The per-decision error bound the kernel was built with (reported).
    nan_warning
        Share of steps with a NaN above which a ``RuntimeWarning`` is issued.
    read_warning
        Share of the data read per step (``num_evaluations / 2N``) above which a ``RuntimeWarning``
        is issued, in ``(0, 1]``.

    Returns
    -------
    dict
        ``share_of_data_read`` (mean evaluations / 2N), ``has_nan_rate``, ``acceptance_rate``,
        ``exact_rate`` (decisions that read all N), ``control_variate_rate`` (steps whose race
        read a control variate; ``None`` if the info does not record it) and
        ``decision_error_bound`` (``delta`` per decision, under the assumptions of
        docs/guides/discrete.md, "What the guarantee assumes").

    Raises
    ------
    ValueError
        If ``num_data`` is neither given nor recorded in ``info``, or a threshold is out of range.

    Warns
    -----
    RuntimeWarning
        When more than ``nan_warning`` of the steps met a NaN (those decisions were rejections
        forced by bad numerics, not samples of the posterior); when the decisions read more than
        ``read_warning`` of the data on average (racing gains little: use a control variate); when
        raced decisions used no control variate (plain racing MH is measurably biased; the message
        shows the fix).

    Examples
    --------
    >>> algo = jaxsub.racing_mh(logprior, loglik, (X, y), delta=0.05, step_size=fit.step_size,
    ...                         control_variate=cv)
    >>> trace = jaxsub.run_chain(key, algo, algo.init(fit.position), 1000)
    >>> jaxsub.racing_mh.info_summary(trace.infos)  # doctest: +SKIP
    {'share_of_data_read': 0.013, 'has_nan_rate': 0.0, 'acceptance_rate': 0.27, 'exact_rate': 0.0,
     'control_variate_rate': 1.0, 'decision_error_bound': None}
    """
    num_data = _num_data(info, num_data)
    read_warning = check_real("read_warning", read_warning, low=0.0, high=1.0, high_closed=True)
    evals = np.asarray(info.num_evaluations, np.float64)
    is_exact = np.asarray(info.is_exact)
    has_cv = getattr(info, "has_control_variate", None)
    out = {
        "share_of_data_read": float(evals.mean() / (2 * num_data)),
        "has_nan_rate": float(np.asarray(info.has_nan).mean()),
        "acceptance_rate": float(np.asarray(info.is_accepted).mean()),
        "exact_rate": float(is_exact.mean()),
        "control_variate_rate": None if has_cv is None else float(np.asarray(has_cv).mean()),
        "decision_error_bound": delta,
    }
    if out["has_nan_rate"] > nan_warning:
        _warn(
            f"{out['has_nan_rate']:.1%} of racing MH steps met a NaN log-likelihood or prior (rejected): "
            "check the model's numerics (e.g. log of non-positive values) before trusting the draws"
        )
    if out["share_of_data_read"] > read_warning:
        _warn(_READS_MOST.format(share=out["share_of_data_read"], limit=read_warning))
    if has_cv is not None:
        raced_plain = float(np.mean(~np.asarray(has_cv, bool) & ~is_exact.astype(bool)))
        if raced_plain > 0.0:
            _warn(_NO_CONTROL_VARIATE.format(share=raced_plain))
    return out
