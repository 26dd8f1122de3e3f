"""Every public sampler follows the common init/step API (see ``helpers.assert_follows_sampling_api``).

Cases live in ``tests/contract_cases/<family>.py`` (see that package's docstring).
"""
import jax
import pytest

import jaxsub
from contract_cases import all_cases
from helpers import assert_follows_sampling_api

CASES = all_cases()


def test_every_public_sampler_has_a_case():
    missing = set(jaxsub.PUBLIC_SAMPLERS) - set(CASES)
    assert not missing, f"public samplers without a signature case: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_sampler_follows_common_api(name):
    case = CASES[name]()
    algorithm = case.make(**case.hyperparameters)
    assert_follows_sampling_api(algorithm, case.position, jax.random.key(0))
