"""Public alias of :mod:`jaxsub.racing.mh`: racing Metropolis-Hastings (Chen & Ghahramani 2016, eq. 12).

The canonical module is :mod:`jaxsub.racing.mh` (the racing family lives in :mod:`jaxsub.racing`).
This module re-exports its ``__all__`` by name, so ``from jaxsub.racing_mh import build_kernel``
and ``jaxsub.racing.mh.build_kernel`` are the same object. The package attribute
``jaxsub.racing_mh`` is :mod:`jaxsub.racing.mh` made callable (``jaxsub.racing_mh(...)`` is its
``as_top_level_api``, BlackJAX style).
"""

from jaxsub.racing.mh import (
    ControlVariate,
    GaussianRandomWalk,
    LaplaceFit,
    RacingMHInfo,
    RacingMHState,
    as_top_level_api,
    build_batched_kernel,
    build_kernel,
    check_control_variate_matches,
    data_fingerprint,
    fused_draws,
    gaussian_random_walk,
    info_summary,
    init,
    laplace_fit,
    mh_decision,
    pair_cv,
    parameter_taylor_control_variate,
)

__all__ = [
    "ControlVariate",
    "GaussianRandomWalk",
    "LaplaceFit",
    "RacingMHInfo",
    "RacingMHState",
    "as_top_level_api",
    "build_batched_kernel",
    "build_kernel",
    "check_control_variate_matches",
    "data_fingerprint",
    "fused_draws",
    "gaussian_random_walk",
    "info_summary",
    "init",
    "laplace_fit",
    "mh_decision",
    "pair_cv",
    "parameter_taylor_control_variate",
]
