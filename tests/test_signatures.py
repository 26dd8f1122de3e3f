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
