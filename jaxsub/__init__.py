"""jaxsub: scalable MCMC samplers in JAX that compose with BlackJAX.

Four families, one module each (see ``docs/architecture.md``):

* :mod:`jaxsub.discrete` -- discrete sampling as a bandit (Chen & Ghahramani 2016),
  and the racing MH / Gibbs kernels built on it;
* :mod:`jaxsub.sgmcmc` -- distributed SGLD with conducive gradients (El Mekkaoui et al. 2021);
* :mod:`jaxsub.compress` -- compressed posteriors by radius-bounded clustering (Song 2021);
* :mod:`jaxsub.anneal` -- subsample annealing for collapsed Gibbs in DP/PY mixtures and
  CrossCat (Obermeyer, Glidden & Jonas 2014);
* :mod:`jaxsub.coreference` -- racing Gibbs over pairwise-factor clusterings (Chen &
  Ghahramani 2016, §5.3).
"""
from jaxsub import anneal, compress, coreference, datasets, discrete, sgmcmc, subsample, validation
from jaxsub import models
from jaxsub import racing_gibbs as _racing_gibbs_module
from jaxsub import racing_mh as _racing_mh_module
from jaxsub import sgld_racing_mh as _sgld_racing_mh_module
from jaxsub._toplevel import TopLevelAPI as _TopLevelAPI
from jaxsub.base import ChainTrace, SamplingAlgorithm, run_chain, run_chains

__version__ = "0.1.0"

# Top-level constructors, BlackJAX style: ``jaxsub.racing_mh(...)`` returns a
# ``SamplingAlgorithm`` while ``jaxsub.racing_mh.build_kernel`` / ``.init`` stay reachable.
racing_mh = _TopLevelAPI(_racing_mh_module)
racing_gibbs = _TopLevelAPI(_racing_gibbs_module)
sgld_racing_mh = _TopLevelAPI(_sgld_racing_mh_module)
dsgld = _TopLevelAPI(sgmcmc.dsgld)
cg_dsgld = _TopLevelAPI(sgmcmc.cg_dsgld)

__all__ = [
    "ChainTrace",
    "SamplingAlgorithm",
    "anneal",
    "cg_dsgld",
    "compress",
    "coreference",
    "datasets",
    "discrete",
    "dsgld",
    "models",
    "racing_gibbs",
    "racing_mh",
    "run_chain",
    "run_chains",
    "sgld_racing_mh",
    "sgmcmc",
    "subsample",
    "validation",
]
