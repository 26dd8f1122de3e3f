"""Public alias of :mod:`jaxsub.racing.mh`: racing Metropolis-Hastings (Chen & Ghahramani 2016, eq. 12).

The code lives in :mod:`jaxsub.racing.mh` (issue 16: one home for the racing family);
``jaxsub.racing_mh(...)`` (a ``SamplingAlgorithm``) and every public name below stay here.
"""
from jaxsub.racing.mh import (  # noqa: F401
    BOUNDS,
    ControlVariate,
    LaplaceFit,
    RacingMHInfo,
    RacingMHState,
    as_top_level_api,
    batch_loglikelihood,
    build_batched_kernel,
    build_kernel,
    check_block_size,
    check_control_variate_matches,
    data_fingerprint,
    gaussian_random_walk,
    info_summary,
    init,
    laplace_fit,
    mh_decision,
    pair_cv,
    taylor_control_variate,
    validate_racing_config,
)
from jaxsub.racing.mh import __all__  # noqa: F401
