"""jaxsub: scalable MCMC samplers in JAX that compose with BlackJAX.

Four families, one module each (see ``docs/architecture.md``):

* :mod:`jaxsub.discrete` -- discrete sampling as a bandit (Chen & Ghahramani 2016),
  and the racing MH / Gibbs kernels built on it;
* :mod:`jaxsub.sgmcmc` -- distributed SGLD with conducive gradients (El Mekkaoui et al. 2021);
* :mod:`jaxsub.compress` -- compressed posteriors by radius-bounded clustering (Song 2021);
* :mod:`jaxsub.anneal` -- subsample annealing for collapsed Gibbs in DP/PY mixtures
  (Obermeyer, Glidden & Jonas 2014).
"""
from jaxsub import subsample, validation
from jaxsub import discrete
from jaxsub.base import ChainTrace, SamplingAlgorithm, run_chain, run_chains

__version__ = "0.1.0"

#: Names of the public constructors that return a ``SamplingAlgorithm``-like
#: ``(init, step)`` pair; ``tests/test_signatures.py`` checks that each one follows
#: the common API. Every family adds its constructors here.
PUBLIC_SAMPLERS: tuple[str, ...] = ()

__all__ = [
    "ChainTrace",
    "PUBLIC_SAMPLERS",
    "SamplingAlgorithm",
    "discrete",
    "run_chain",
    "run_chains",
    "subsample",
    "validation",
]
