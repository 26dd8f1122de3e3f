"""Contract cases for the racing kernels (racing_mh, racing_gibbs, sgld_racing_mh).

Traceable hyperparameters: ``step_size`` (racing_mh, sgld_racing_mh) and the inverse
temperature ``beta`` (racing_gibbs). ``delta`` is static: it fixes the B_Normal
thresholds computed with SciPy at construction (jaxsub.discrete.racing_ragged's
Bonferroni threshold is the traceable alternative).
"""

import jax
import jax.numpy as jnp

import jaxsub
from contract_cases import Case

#: Racing-Normal's threshold B_Normal(delta', N, m1) is solved on the host (SciPy root finding,
#: per concrete delta) when the sampler is built; jaxsub.discrete.racing_ragged takes a traced delta.
_DELTA_STATIC = "Racing-Normal's b_normal threshold is solved on the host (SciPy) per concrete delta"


def _racing_case(name):
    y = jax.random.normal(jax.random.key(0), (200, 2))
    logprior = lambda th: -0.5 * jnp.sum(th**2)  # noqa: E731
    loglik = lambda th, yn: -0.5 * jnp.sum((yn - th) ** 2)  # noqa: E731
    if name == "racing_mh":
        make = lambda step_size: jaxsub.racing_mh(logprior, loglik, y, delta=0.05, step_size=step_size)  # noqa: E731
        return Case(make, jnp.zeros(2), {"step_size": 0.1}, static={"delta": _DELTA_STATIC})
    if name == "sgld_racing_mh":
        make = lambda step_size: jaxsub.sgld_racing_mh(  # noqa: E731
            logprior, loglik, y, step_size=step_size, batch_size=20, delta=0.05
        )
        return Case(make, jnp.zeros(2), {"step_size": 1e-3}, static={"delta": _DELTA_STATIC})
    centres = jnp.asarray([-0.1, 0.0, 0.1])
    make = (
        lambda beta: jaxsub.racing_gibbs(  # noqa: E731
            jnp.zeros(3), lambda idx: -0.5 * (y[idx, :1] - centres[None, :]) ** 2, 200, delta=0.05, beta=beta
        )
    )
    return Case(make, jnp.asarray(0, jnp.int32), {"beta": 1.0}, static={"delta": _DELTA_STATIC})


CASES = {name: (lambda name=name: _racing_case(name)) for name in ("racing_mh", "racing_gibbs", "sgld_racing_mh")}
