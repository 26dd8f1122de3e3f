"""Contract cases for jaxsub.coreference."""
import jax.numpy as jnp
import numpy as np

import jaxsub
from contract_cases import Case


def _gibbs_case():
    co = jaxsub.coreference
    keys = np.zeros(70, int)  # one raced block (K = 69, class 128)
    blocks = co.make_blocks(keys)
    mentions = {"a": jnp.asarray(np.linspace(-1.0, 1.0, keys.size), jnp.float32)}

    def factor(xi, xj):
        return 0.5 - jnp.abs(xi["a"] - xj["a"])

    def make(temperature):
        return co.gibbs(factor, mentions, blocks, temperature=temperature, delta=0.1, first_batch_size=10,
                        min_race_size=20, max_candidates=2, race_cost=0.0)

    return Case(make, jnp.asarray(blocks.position, jnp.int32), {"temperature": 1.0})


CASES = {"coreference.gibbs": _gibbs_case}  # jaxsub.coreference.gibbs wraps the sampler module coreference.sampler
