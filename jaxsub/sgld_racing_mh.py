"""Public alias of :mod:`jaxsub.racing.sgld_mh`: an SGLD proposal corrected by racing MH.

The canonical module is :mod:`jaxsub.racing.sgld_mh` (the racing family lives in :mod:`jaxsub.racing`).
This module re-exports its ``__all__`` by name, so ``from jaxsub.sgld_racing_mh import sgld_proposal``
and ``jaxsub.racing.sgld_mh.sgld_proposal`` are the same object. The package attribute
``jaxsub.sgld_racing_mh`` is :mod:`jaxsub.racing.sgld_mh` made callable (``jaxsub.sgld_racing_mh(...)``
is its ``as_top_level_api``, BlackJAX style).
"""

from jaxsub.racing.sgld_mh import (
    RacingMHInfo,
    RacingMHState,
    as_top_level_api,
    build_kernel,
    init,
    sgld_proposal,
)

__all__ = ["RacingMHInfo", "RacingMHState", "as_top_level_api", "build_kernel", "init", "sgld_proposal"]
