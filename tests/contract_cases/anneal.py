"""Contract cases for jaxsub.anneal."""

import jax.numpy as jnp
import numpy as np

import jaxsub
from contract_cases import Case


def _collapsed_gibbs_case():
    model = jaxsub.anneal.MixtureModel(
        jaxsub.anneal.CRP(1.0), [jaxsub.anneal.DirichletCategorical(3), jaxsub.anneal.BetaBernoulli()]
    )
    data = np.column_stack([np.arange(8) % 3, np.arange(8) % 2])
    make = lambda: jaxsub.anneal.collapsed_gibbs(model, data, capacity=8)  # noqa: E731
    return Case(make, jnp.asarray(np.arange(8) % 2, jnp.int32), {})


# jaxsub.anneal.sweep is the BlackJAX-style sampler module (init(position, ...), build_kernel(model, grids),
# as_top_level_api); jaxsub.anneal.collapsed_gibbs is that as_top_level_api, re-exported by the package
CASES = {"anneal.sweep": _collapsed_gibbs_case, "anneal.collapsed_gibbs": _collapsed_gibbs_case}
