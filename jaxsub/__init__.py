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

# --- racing MH / Gibbs kernels (issue 4) ---
from jaxsub import racing_gibbs as _racing_gibbs_module  # noqa: E402
from jaxsub import racing_mh as _racing_mh_module  # noqa: E402
from jaxsub import sgld_racing_mh as _sgld_racing_mh_module  # noqa: E402
from jaxsub._toplevel import TopLevelAPI as _TopLevelAPI  # noqa: E402

racing_mh = _TopLevelAPI(_racing_mh_module)
racing_gibbs = _TopLevelAPI(_racing_gibbs_module)
sgld_racing_mh = _TopLevelAPI(_sgld_racing_mh_module)
PUBLIC_SAMPLERS += ("racing_mh", "racing_gibbs", "sgld_racing_mh")

__all__ = [
    "ChainTrace",
    "PUBLIC_SAMPLERS",
    "SamplingAlgorithm",
    "discrete",
    "run_chain",
    "run_chains",
    "subsample",
    "validation",
    "racing_mh",
    "racing_gibbs",
    "sgld_racing_mh",
]
