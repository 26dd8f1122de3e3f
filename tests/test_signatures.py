"""Every public sampler follows the common init/step API (see ``helpers.assert_follows_sampling_api``).

Each family registers, in ``CASES``, a builder returning ``(algorithm, position)``
for a tiny problem, keyed by the public constructor's name in
``jaxsub.PUBLIC_SAMPLERS``.
"""
import jax
import pytest

import jaxsub
from helpers import assert_follows_sampling_api

CASES: dict = {
    # "racing_mh": lambda: (jaxsub.racing_mh(...), position),
}


def _sgmcmc_case(name):  # issue 5: jaxsub.sgmcmc
    import jax.numpy as jnp
    import numpy as np

    shards = [np.ones((n, 2), np.float32) * i for i, n in enumerate((7, 9, 5))]
    kw = dict(step_size=1e-3, batch_size=3, local_steps=2)
    args = (lambda p: -0.5 * jnp.sum(p**2), lambda p, x: -0.5 * jnp.sum((x - p) ** 2), shards)
    if name == "cg_dsgld":
        kw["surrogates"] = jaxsub.sgmcmc.gaussian_surrogates(np.zeros((3, 2)), np.ones((3, 2)))
    return getattr(jaxsub, name)(*args, **kw), jnp.zeros(2)


CASES.update({name: (lambda name=name: _sgmcmc_case(name)) for name in ("dsgld", "cg_dsgld")})

def _anneal_collapsed_gibbs_case():
    import jax.numpy as jnp
    import numpy as np

    model = jaxsub.anneal.MixtureModel(
        jaxsub.anneal.CRP(1.0), [jaxsub.anneal.DirichletCategorical(3), jaxsub.anneal.BetaBernoulli()]
    )
    data = np.column_stack([np.arange(8) % 3, np.arange(8) % 2])
    return jaxsub.anneal.collapsed_gibbs(model, data, capacity=8), jnp.asarray(np.arange(8) % 2, jnp.int32)


CASES["anneal.collapsed_gibbs"] = _anneal_collapsed_gibbs_case

# --- racing MH / Gibbs kernels (issue 4) ---
def _racing_case(name):
    import jax.numpy as jnp

    y = jax.random.normal(jax.random.key(0), (200, 2))
    logprior = lambda th: -0.5 * jnp.sum(th**2)  # noqa: E731
    loglik = lambda th, yn: -0.5 * jnp.sum((yn - th) ** 2)  # noqa: E731
    if name == "racing_mh":
        return jaxsub.racing_mh(logprior, loglik, y, delta=0.05, step_size=0.1), jnp.zeros(2)
    if name == "sgld_racing_mh":
        return jaxsub.sgld_racing_mh(logprior, loglik, y, step_size=1e-3, batch_size=20, delta=0.05), jnp.zeros(2)
    centres = jnp.asarray([-0.1, 0.0, 0.1])
    gibbs = jaxsub.racing_gibbs(jnp.zeros(3), lambda idx: -0.5 * (y[idx, :1] - centres[None, :]) ** 2, 200, delta=0.05)
    return gibbs, jnp.asarray(0, jnp.int32)


CASES.update({name: (lambda name=name: _racing_case(name)) for name in ("racing_mh", "racing_gibbs", "sgld_racing_mh")})


def test_every_public_sampler_has_a_case():
    missing = set(jaxsub.PUBLIC_SAMPLERS) - set(CASES)
    assert not missing, f"public samplers without a signature case: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_sampler_follows_common_api(name):
    algorithm, position = CASES[name]()
    assert_follows_sampling_api(algorithm, position, jax.random.key(0))
