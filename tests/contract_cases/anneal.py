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


CASES = {"anneal": _collapsed_gibbs_case}  # jaxsub.anneal.as_top_level_api is collapsed_gibbs
