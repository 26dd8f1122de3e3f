"""Type aliases shared by every jaxsub sampler.

jaxsub follows BlackJAX's conventions: a sampler state and its transition
information are ``NamedTuple`` pytrees, positions are arbitrary pytrees of
arrays, and PRNG keys are passed in explicitly (and split), never stored.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

Array = jax.Array
ArrayLike = jax.typing.ArrayLike
PRNGKey = jax.Array
ArrayTree = Any
ArrayLikeTree = Any

#: ``logdensity_fn(position) -> scalar``.
LogDensityFn = Callable[[ArrayLikeTree], Array]
#: ``loglikelihood_fn(position, datum) -> scalar`` for ONE datum (BlackJAX SG-MCMC convention).
LogLikelihoodFn = Callable[[ArrayLikeTree, ArrayLikeTree], Array]
#: ``logprior_fn(position) -> scalar``.
LogPriorFn = Callable[[ArrayLikeTree], Array]

State = NamedTuple
Info = NamedTuple

__all__ = [
    "Array",
    "ArrayLike",
    "ArrayLikeTree",
    "ArrayTree",
    "Info",
    "LogDensityFn",
    "LogLikelihoodFn",
    "LogPriorFn",
    "PRNGKey",
    "State",
]
