"""Public alias of :mod:`jaxsub.racing.gibbs`: racing Gibbs for one discrete variable.

The canonical module is :mod:`jaxsub.racing.gibbs` (the racing family lives in :mod:`jaxsub.racing`).
This module re-exports its ``__all__`` by name, so ``from jaxsub.racing_gibbs import build_kernel``
and ``jaxsub.racing.gibbs.build_kernel`` are the same object. The package attribute
``jaxsub.racing_gibbs`` is :mod:`jaxsub.racing.gibbs` made callable (``jaxsub.racing_gibbs(...)`` is
its ``as_top_level_api``, BlackJAX style).
"""

from jaxsub.racing.gibbs import (
    RacingGibbsInfo,
    RacingGibbsState,
    as_top_level_api,
    build_batched_kernel,
    build_kernel,
    exact_conditional_sums,
    init,
)

__all__ = [
    "RacingGibbsInfo",
    "RacingGibbsState",
    "as_top_level_api",
    "build_batched_kernel",
    "build_kernel",
    "exact_conditional_sums",
    "init",
]
