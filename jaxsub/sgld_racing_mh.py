"""Public alias of :mod:`jaxsub.racing.sgld_mh`: an SGLD proposal corrected by racing MH.

The code lives in :mod:`jaxsub.racing.sgld_mh` (issue 16: one home for the racing family);
``jaxsub.sgld_racing_mh(...)`` (a ``SamplingAlgorithm``) and every public name below stay here.
"""
from jaxsub.racing.sgld_mh import (  # noqa: F401
    RacingMHInfo,
    RacingMHState,
    as_top_level_api,
    build_kernel,
    init,
    sgld_proposal,
)
from jaxsub.racing.sgld_mh import __all__  # noqa: F401
