"""Make a sampler module callable, BlackJAX style (``blackjax.hmc(...)`` is both a factory and a namespace).

``jaxsub.racing_mh(...)`` must return a ``SamplingAlgorithm`` while
``jaxsub.racing_mh.build_kernel``, ``.init``, ``.RacingMHState``... stay reachable,
as with BlackJAX's ``GenerateSamplingAPI``. :class:`TopLevelAPI` wraps the
module: calling it calls the module's ``as_top_level_api``; any other attribute
is read from the module.
"""

from __future__ import annotations

import types


class TopLevelAPI:
    """Callable stand-in for a sampler module (see module docstring)."""

    def __init__(self, module: types.ModuleType):
        self.__dict__["_module"] = module
        self.__dict__["__doc__"] = module.as_top_level_api.__doc__
        self.__dict__["__wrapped__"] = module.as_top_level_api

    def __call__(self, *args, **kwargs):
        return self._module.as_top_level_api(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)

    def __dir__(self):
        return sorted(set(dir(self._module)))

    def __repr__(self) -> str:
        return f"<jaxsub sampler {self._module.__name__}>"
