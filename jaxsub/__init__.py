"""jaxsub: scalable MCMC samplers in JAX that compose with BlackJAX.

Five families, one subpackage each (see ``docs/architecture.md``):

* :mod:`jaxsub.racing` -- discrete sampling as a bandit (Chen & Ghahramani 2016) and the
  racing MH, racing Gibbs and SGLD + racing MH kernels built on it (public samplers also
  under :mod:`jaxsub.discrete`; kernels as ``jaxsub.racing_mh``, ``jaxsub.racing_gibbs``,
  ``jaxsub.sgld_racing_mh``);
* :mod:`jaxsub.sgmcmc` -- distributed SGLD with conducive gradients (El Mekkaoui et al. 2021);
* :mod:`jaxsub.compress` -- compressed posteriors by radius-bounded clustering (Song 2021);
* :mod:`jaxsub.anneal` -- subsample annealing for collapsed Gibbs in DP/PY mixtures and
  CrossCat (Obermeyer, Glidden & Jonas 2014);
* :mod:`jaxsub.coreference` -- racing Gibbs over pairwise-factor clusterings (Chen &
  Ghahramani 2016, §5.3).
"""

from jaxsub import anneal, checkpoint, compress, coreference, datasets, discrete, models, sgmcmc, subsample, validation

# Load the alias modules before the package attributes below replace them: a submodule's first
# import sets the package attribute, later imports find it in ``sys.modules`` and set nothing.
from jaxsub import racing_gibbs as _racing_gibbs_alias  # noqa: F401
from jaxsub import racing_mh as _racing_mh_alias
from jaxsub import sgld_racing_mh as _sgld_racing_mh_alias  # noqa: F401
from jaxsub._toplevel import TopLevelAPI as _TopLevelAPI
from jaxsub.arviz import to_arviz
from jaxsub.base import ChainTrace, InvalidStateError, SamplingAlgorithm, checked, run_chain, run_chains
from jaxsub.racing import gibbs as _racing_gibbs_module
from jaxsub.racing import mh as _racing_mh_module
from jaxsub.racing import sgld_mh as _sgld_racing_mh_module

__version__ = "0.2.0"

# Top-level constructors, BlackJAX style: ``jaxsub.racing_mh(...)`` returns a
# ``SamplingAlgorithm`` while ``jaxsub.racing_mh.build_kernel`` / ``.init`` stay reachable.
# Each wraps the canonical module (``jaxsub.racing.mh``...); the modules ``jaxsub/racing_mh.py``...
# re-export the same names for ``from jaxsub.racing_mh import ...``.
racing_mh = _TopLevelAPI(_racing_mh_module)
racing_gibbs = _TopLevelAPI(_racing_gibbs_module)
sgld_racing_mh = _TopLevelAPI(_sgld_racing_mh_module)
dsgld = _TopLevelAPI(sgmcmc.dsgld)
cg_dsgld = _TopLevelAPI(sgmcmc.cg_dsgld)

__all__ = [
    "ChainTrace",
    "InvalidStateError",
    "SamplingAlgorithm",
    "anneal",
    "cg_dsgld",
    "checked",
    "checkpoint",
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
    "to_arviz",
    "validation",
]
