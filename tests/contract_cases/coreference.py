"""Contract cases for jaxsub.coreference."""

import jax
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
        return co.gibbs(
            factor,
            mentions,
            blocks,
            temperature=temperature,
            delta=0.1,
            first_batch_size=10,
            min_race_size=20,
            max_candidates=2,
            race_cost=0.0,
        )

    return Case(make, jnp.asarray(blocks.position, jnp.int32), {"temperature": 1.0})


def _similarity_case(constructor, **settings):
    co = jaxsub.coreference
    kinds = {"name": "string", "venue": "categorical", "year": "numeric"}
    enc = co.encode_mentions(
        {
            "name": ["j smith", "john smith", "m jones"],
            "venue": ["a", None, "a"],
            "year": [2001.0, 2003.0, float("nan")],
        },
        kinds,
        hash_dim=8,
    )

    def call(sim, key):
        del key
        packed = sim.pack(enc)
        return jax.vmap(sim.factor, (None, 0))(jax.tree.map(lambda v: v[0], packed), packed)

    return Case(lambda: constructor(kinds, scales={"year": 2.0}, **settings), None, {}, call=call)


def _packed_similarity_case():
    return _similarity_case(jaxsub.coreference.packed_similarity)


def _crf_similarity_case():
    return _similarity_case(jaxsub.coreference.crf_similarity, bias=1.0)


CASES = {
    "coreference.gibbs": _gibbs_case,
    "coreference.packed_similarity": _packed_similarity_case,
    "coreference.crf_similarity": _crf_similarity_case,
}  # jaxsub.coreference.gibbs wraps the sampler module coreference.kernel
