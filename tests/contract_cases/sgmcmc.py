"""Contract cases for jaxsub.sgmcmc (dsgld, cg_dsgld)."""
import jax.numpy as jnp
import numpy as np

import jaxsub
from contract_cases import Case


def _sgmcmc_case(name):
    shards = [np.ones((n, 2), np.float32) * i for i, n in enumerate((7, 9, 5))]
    args = (lambda p: -0.5 * jnp.sum(p**2), lambda p, x: -0.5 * jnp.sum((x - p) ** 2), shards)
    extra = {}
    if name == "cg_dsgld":
        extra["surrogates"] = jaxsub.sgmcmc.gaussian_surrogates(np.zeros((3, 2)), np.ones((3, 2)))

    def make(step_size):
        return getattr(jaxsub, name)(*args, step_size=step_size, batch_size=3, local_steps=2, **extra)

    return Case(make, jnp.zeros(2), {"step_size": 1e-3})


CASES = {name: (lambda name=name: _sgmcmc_case(name)) for name in ("dsgld", "cg_dsgld")}
