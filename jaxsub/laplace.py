"""MAP and Laplace approximation: the one optax optimisation loop of the library.

:func:`minimize` runs ``num_steps`` steps of any optax optimiser on a function of a flat
vector inside one ``lax.scan``; optimisers that keep the objective's value and gradient
in their state (``optax.lbfgs``, with its line search) reuse them
(``optax.value_and_grad_from_state``). It serves

* :func:`laplace_fit` -- the full-data MAP and Laplace covariance that centre and scale
  racing MH (default ``optax.lbfgs()``; public as ``jaxsub.racing_mh.laplace_fit``);
* :func:`jaxsub.sgmcmc.laplace_surrogates` -- the expansion points of the per-shard Laplace
  surrogates (default ``optax.adam(1e-2)``, local, FedSGD or FedAvg).

The Laplace approximation at a mode ``θ̂`` is ``N(θ̂, (-∇² log p(θ̂ | y))^{-1})``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np

from jaxsub.racing.data import num_data_of
from jaxsub.types import Array, ArrayLikeTree, ArrayTree
from jaxsub.validation import check_int

__all__ = ["LaplaceFit", "laplace_fit", "minimize"]


def stores_value_and_grad(optimizer, start: Array) -> bool:
    """Whether ``optimizer``'s state holds the objective's value and gradient (e.g. ``optax.lbfgs``)."""
    import optax

    state = jax.eval_shape(optimizer.init, start)
    try:
        return optax.tree.get(state, "value") is not None and optax.tree.get(state, "grad") is not None
    except (KeyError, ValueError):
        return False


def _step(objective: Callable, optimizer, value_and_grad: Callable, carry, _):
    import optax

    x, state = carry
    value, grad = value_and_grad(x, state=state)
    updates, state = optimizer.update(grad, state, x, value=value, grad=grad, value_fn=objective)
    return (optax.apply_updates(x, updates), state), None


def _fresh_value_and_grad(objective: Callable, x, state):
    del state
    return jax.value_and_grad(objective)(x)


def minimize(
    objective: Callable[[Array], Array], start: Array, *, optimizer: Any = None, num_steps: int = 100
) -> Array:
    """``num_steps`` steps of an optax optimiser on ``objective`` from ``start`` (one ``lax.scan``).

    Parameters
    ----------
    objective
        ``objective(x) -> scalar`` of a flat vector ``x`` (traceable, differentiable).
    start
        Starting point ``[d]``.
    optimizer
        An ``optax.GradientTransformation``; default ``optax.lbfgs()``. Optimisers whose state
        stores the value and gradient (L-BFGS's line search) reuse them; others get
        ``jax.value_and_grad(objective)`` at each step.
    num_steps
        Number of steps (static, ``>= 0``).

    Returns
    -------
    Array
        The final iterate ``[d]``.

    Raises
    ------
    ValueError
        If ``num_steps < 0``.
    """
    import functools

    import optax

    num_steps = check_int("num_steps", num_steps, low=0)
    optimizer = optax.lbfgs() if optimizer is None else optax.with_extra_args_support(optimizer)
    if stores_value_and_grad(optimizer, start):
        value_and_grad = optax.value_and_grad_from_state(objective)
    else:
        value_and_grad = functools.partial(_fresh_value_and_grad, objective)
    body = functools.partial(_step, objective, optimizer, value_and_grad)
    (x, _), _ = jax.lax.scan(body, (start, optimizer.init(start)), None, length=num_steps)
    return x


class LaplaceFit(NamedTuple):
    """Gaussian (Laplace) approximation of the posterior at its mode.

    Attributes
    ----------
    position
        The MAP ``θ̂`` (same pytree as the initial position): centre the
        Taylor control variate there.
    cov_cholesky
        ``L`` with ``L L^T = (-∇² log p(θ̂ | y))^{-1}`` on the flattened position, ``[d, d]``.
    step_size
        ``2.38 / sqrt(d) * L``: the random-walk scale of Roberts, Gelman & Gilks
        (1997) (optimal for a Gaussian target, acceptance ~0.23 for large d);
        pass it as ``step_size`` to :func:`jaxsub.racing_mh`.
    """

    position: ArrayTree
    cov_cholesky: Array
    step_size: Array


def _negative_log_posterior(logprior_fn, loglikelihood_fn, data, unravel, flat):
    position = unravel(flat)
    lls = jax.vmap(loglikelihood_fn, in_axes=(None, 0))(position, data)
    return -(logprior_fn(position) + jnp.sum(lls))


def laplace_fit(
    logprior_fn: Callable,
    loglikelihood_fn: Callable,
    data: ArrayLikeTree,
    initial_position: ArrayLikeTree,
    *,
    num_steps: int = 100,
    optimizer: Any = None,
) -> LaplaceFit:
    """MAP by optax (L-BFGS by default) on the full data, then the Laplace covariance and the step-size rule.

    A one-off O(N) cost per iteration, before sampling: the MAP is where
    :func:`jaxsub.racing.control_variates.parameter_taylor_control_variate` should be centred
    (its residuals then shrink like ``|θ - θ̂|^3`` over the posterior), and ``2.38/√d`` times the
    Laplace scale is the random-walk step that makes racing MH pay off (docs/guides/discrete.md).

    Parameters
    ----------
    logprior_fn
        ``logprior_fn(position) -> scalar``.
    loglikelihood_fn
        ``loglikelihood_fn(position, datum) -> scalar`` for one datum.
    data
        Pytree of arrays with a leading data axis ``N``; every value finite.
    initial_position
        Starting point of the optimiser (a float position; fixes the pytree).
    num_steps
        Optimiser steps (static, ``>= 1``).
    optimizer
        An ``optax.GradientTransformation``; default ``optax.lbfgs()``.

    Returns
    -------
    LaplaceFit

    Raises
    ------
    ValueError
        If ``data`` has a NaN or infinite value, the initial position does not fit the model
        (:func:`jaxsub.racing.mh_inputs.check_position`), the log posterior is not finite at the
        optimum, or its Hessian there is not negative definite (no mode found).
    """
    import functools

    from jaxsub.racing.mh_inputs import (
        check_finite_data,
        check_position,
        float_position,
    )

    num_steps = check_int("num_steps", num_steps, low=1)
    num_data_of(data)
    check_finite_data(data)
    initial_position = float_position(initial_position)
    check_position(initial_position, loglikelihood_fn, data, logprior_fn=logprior_fn, name="initial_position")
    flat0, unravel = jax.flatten_util.ravel_pytree(initial_position)
    objective = functools.partial(_negative_log_posterior, logprior_fn, loglikelihood_fn, data, unravel)
    flat = minimize(objective, flat0, optimizer=optimizer, num_steps=num_steps)
    value = objective(flat)
    if not bool(jnp.isfinite(value)):
        raise ValueError(
            f"laplace_fit: the log posterior at the optimiser's end point is {float(-value)} "
            "(a diverged optimiser, or a model that is not finite there)"
        )
    hess = jax.hessian(objective)(flat)
    chol = jnp.linalg.cholesky(jnp.linalg.inv(hess))
    if not bool(jnp.all(jnp.isfinite(chol))):
        raise ValueError("laplace_fit: the Hessian at the optimum is not negative definite (no mode found)")
    d = flat.shape[0]
    return LaplaceFit(unravel(flat), chol, (2.38 / np.sqrt(d)) * chol)
