"""Public alias of :mod:`jaxsub.racing.gibbs`: racing Gibbs for one discrete variable.

The code lives in :mod:`jaxsub.racing.gibbs` (issue 16: one home for the racing family);
``jaxsub.racing_gibbs(...)`` (a ``SamplingAlgorithm``) and every public name below stay here.
"""
from jaxsub.racing.gibbs import (  # noqa: F401
    VARIANCES,
    RacingGibbsInfo,
    RacingGibbsState,
    as_top_level_api,
    build_batched_kernel,
    build_kernel,
    exact_conditional_sums,
    init,
)
from jaxsub.racing.gibbs import __all__  # noqa: F401
