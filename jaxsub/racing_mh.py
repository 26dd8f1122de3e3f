"""Public alias of :mod:`jaxsub.racing.mh`: racing Metropolis-Hastings (Chen & Ghahramani 2016, eq. 12).

The code lives in :mod:`jaxsub.racing.mh` (issue 16: one home for the racing family). Like
``os.path``, this name *is* that module (``sys.modules`` alias): ``jaxsub.racing_mh.build_kernel``,
``import jaxsub.racing_mh`` and ``jaxsub.racing_mh(...)`` (a ``SamplingAlgorithm``) reach the same
objects, so patching or reading an attribute through either name sees one module.
"""
import sys

from jaxsub.racing import mh as _module

sys.modules[__name__] = _module
