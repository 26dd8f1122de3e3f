"""Public alias of :mod:`jaxsub.racing.gibbs`: racing Gibbs for one discrete variable.

The code lives in :mod:`jaxsub.racing.gibbs` (issue 16: one home for the racing family). Like
``os.path``, this name *is* that module (``sys.modules`` alias): ``jaxsub.racing_gibbs.build_kernel``,
``import jaxsub.racing_gibbs`` and ``jaxsub.racing_gibbs(...)`` (a ``SamplingAlgorithm``) reach the same
objects, so patching or reading an attribute through either name sees one module.
"""
import sys

from jaxsub.racing import gibbs as _module

sys.modules[__name__] = _module
