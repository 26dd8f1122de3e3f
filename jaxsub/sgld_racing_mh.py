"""Public alias of :mod:`jaxsub.racing.sgld_mh`: an SGLD proposal corrected by racing MH.

The code lives in :mod:`jaxsub.racing.sgld_mh` (issue 16: one home for the racing family). Like
``os.path``, this name *is* that module (``sys.modules`` alias): ``jaxsub.sgld_racing_mh.build_kernel``,
``import jaxsub.sgld_racing_mh`` and ``jaxsub.sgld_racing_mh(...)`` (a ``SamplingAlgorithm``) reach the same
objects, so patching or reading an attribute through either name sees one module.
"""
import sys

from jaxsub.racing import sgld_mh as _module

sys.modules[__name__] = _module
