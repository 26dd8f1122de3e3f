"""Contract cases for jaxsub.sgmcmc (dsgld, cg_dsgld, multi_device, multi_device_kernel)."""

import jax.numpy as jnp
import numpy as np

import jaxsub
from contract_cases import Case

_SHARDS = [np.ones((n, 2), np.float32) * i for i, n in enumerate((7, 9, 5))]
_MODEL = (lambda p: -0.5 * jnp.sum(p**2), lambda p, x: -0.5 * jnp.sum((x - p) ** 2))


def _surrogates():
    return jaxsub.sgmcmc.gaussian_surrogates(np.zeros((3, 2)), np.ones((3, 2)))


def _sgmcmc_case(name):
    extra = {"surrogates": _surrogates()} if name == "cg_dsgld" else {}
    hyper = {"step_size": 1e-3, **({"exploration": 1.0} if name == "cg_dsgld" else {})}

    def make(**h):
        return getattr(jaxsub, name)(*_MODEL, _SHARDS, batch_size=3, local_steps=2, **extra, **h)

    return Case(make, jnp.zeros(2), hyper)


def _multi_device_case():
    """Non-uniform f and partial participation: the paths that idle chains."""

    def make(step_size, exploration):
        return jaxsub.sgmcmc.multi_device(
            *_MODEL,
            _SHARDS,
            step_size=step_size,
            exploration=exploration,
            batch_size=3,
            local_steps=1,
            chains_per_shard=1,
            surrogates=_surrogates(),
            shard_probs=[0.2, 0.3, 0.5],
            participating=2,
        )

    return Case(make, jnp.zeros((3, 2)), {"step_size": 1e-3, "exploration": 1.0})


def _multi_device_kernel_case():
    def make():
        return jaxsub.sgmcmc.multi_device_kernel(num_shards=3, chains_per_shard=2, batch_size=3, local_steps=2)

    def call(functions, rng_key):
        """One round through the NamedTuple's init -> make_inputs -> kernel."""
        inputs = functions.make_inputs(_SHARDS)
        state = functions.init(jnp.zeros((6, 2)))
        return functions.kernel(rng_key, state, *_MODEL, inputs, 1e-3)

    return Case(make, jnp.zeros((6, 2)), {}, call=call)


CASES = {name: (lambda name=name: _sgmcmc_case(name)) for name in ("dsgld", "cg_dsgld")}
CASES["sgmcmc.multi_device"] = _multi_device_case
try:  # the discovering contract test checks NamedTuple-of-functions constructors by type
    from contract_cases import discover_constructors  # noqa: F401
except ImportError:  # the older test calls .step on every case: a NamedTuple of functions has none
    pass
else:
    CASES["sgmcmc.multi_device_kernel"] = _multi_device_kernel_case
