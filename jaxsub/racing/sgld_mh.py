"""SGLD proposals corrected by Racing-Normal MH (Chen & Ghahramani 2016, §5.2).

Stochastic gradient Langevin dynamics (Welling & Teh 2011) moves
``x' = x + ε ĝ_B(x) + sqrt(2ε) ξ``, ``ξ ~ N(0, I)``, with ``ĝ_B`` a minibatch
estimate of ``∇ log p(x | y)`` (here BlackJAX's
:func:`blackjax.sgmcmc.gradients.grad_estimator`, or any estimator with its
signature such as :func:`blackjax.sgmcmc.gradients.control_variates`). On its own
SGLD is biased for any ``ε > 0``; the paper instead uses the SGLD move as an MH
*proposal* and corrects it with the racing MH test of :mod:`jaxsub.racing_mh`.

The proposal ratio. The minibatch ``B`` is drawn independently of the state,
so it is an auxiliary variable: for each fixed ``B`` the Langevin proposal
``q_B(x'|x) = N(x'; x + ε ĝ_B(x), 2ε I)`` is a valid MH proposal, and a mixture
over ``B`` of kernels that each leave ``p`` invariant leaves ``p`` invariant.
The reverse density must therefore use the *same* minibatch:

.. math::

    \\log\\frac{q_B(x|x')}{q_B(x'|x)} = \\frac{\\lVert x' - x - ε ĝ_B(x)\\rVert^2
    - \\lVert x - x' - ε ĝ_B(x')\\rVert^2}{4ε}.

Using a fresh minibatch for the reverse gradient (or omitting the ratio, as for
a symmetric walk) would make the chain target the wrong distribution. Each
step costs ``2 × batch_size`` per-datum gradients (at ``x`` and ``x'``) plus the
racing test's likelihood evaluations (``info.num_evaluations``).

References
----------
Welling, M. & Teh, Y. W. "Bayesian learning via stochastic gradient Langevin
dynamics", ICML 2011.
Chen, Y. & Ghahramani, Z. "Scalable discrete sampling as a multi-armed bandit
problem", ICML 2016, §5.2 (SGLD corrected with Racing-Normal MH).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from blackjax.base import SamplingAlgorithm
from blackjax.sgmcmc.gradients import grad_estimator as blackjax_grad_estimator
from blackjax.util import generate_gaussian_noise
from jax.flatten_util import ravel_pytree

from jaxsub.racing import mh_kernel as racing_mh
from jaxsub.racing.control_variates import ControlVariate, check_control_variate_matches
from jaxsub.racing.data import gather, num_data_of
from jaxsub.racing.mh_inputs import check_finite_data, check_position, float_position
from jaxsub.racing.mh_kernel import RacingMHInfo, RacingMHState
from jaxsub.subsample import permutation_indices
from jaxsub.types import ArrayLikeTree, PRNGKey
from jaxsub.validation import check_hyperparameter, check_int

__all__ = ["RacingMHInfo", "RacingMHState", "as_top_level_api", "build_kernel", "init", "sgld_proposal"]

init = racing_mh.init


def sgld_proposal(grad_estimator: Callable, data: ArrayLikeTree, num_data: int, batch_size: int, step_size) -> Callable:
    """The Langevin proposal with a minibatch gradient and its exact log proposal ratio.

    Parameters
    ----------
    grad_estimator
        ``grad_estimator(position, minibatch) -> gradient`` of the log posterior
        (BlackJAX's :func:`~blackjax.sgmcmc.gradients.grad_estimator` signature).
    data
        Pytree of arrays with leading axis ``num_data``.
    num_data
        ``N``.
    batch_size
        Minibatch size ``n``; drawn without replacement in O(n) with
        :func:`jaxsub.subsample.permutation_indices`.
    step_size
        ``ε``: drift ``ε ĝ``, noise variance ``2ε`` (BlackJAX's overdamped Langevin
        convention, temperature 1).

    Returns
    -------
    proposal
        ``proposal(rng_key, position) -> (proposed, log_q_ratio)`` with
        ``log_q_ratio = log q_B(x|x') - log q_B(x'|x)`` for the minibatch ``B`` used.
    """

    def proposal(rng_key: PRNGKey, position):
        key_batch, key_noise = jax.random.split(rng_key)
        indices = permutation_indices(key_batch, jnp.arange(batch_size), num_data)
        minibatch = gather(data, indices)
        flat, unravel = ravel_pytree(position)
        eps = jnp.asarray(step_size, flat.dtype)
        grad_x, _ = ravel_pytree(grad_estimator(position, minibatch))
        noise, _ = ravel_pytree(generate_gaussian_noise(key_noise, position))
        flat_new = flat + eps * grad_x + jnp.sqrt(2 * eps) * noise
        proposed = unravel(flat_new)
        grad_new, _ = ravel_pytree(grad_estimator(proposed, minibatch))
        forward = flat_new - flat - eps * grad_x  # = sqrt(2 eps) * noise
        backward = flat - flat_new - eps * grad_new
        log_q_ratio = (jnp.sum(forward**2) - jnp.sum(backward**2)) / (4 * eps)
        return proposed, log_q_ratio

    return proposal


def build_kernel(
    num_data: int,
    *,
    batch_size: int,
    delta: float | None,
    first_batch_size: int = 50,
    bound: str = "normal",
    exact: bool = False,
) -> Callable:
    """Build ``kernel(rng_key, state, logprior_fn, loglikelihood_fn, data, step_size, grad_estimator=None,
    control_variate=None, reward_range=None) -> (RacingMHState, RacingMHInfo)``.

    BlackJAX contract: the structure (sizes, ``delta``, bound) here; the model,
    the data and the hyperparameter ``step_size`` (traceable: ``jax.vmap`` over
    step sizes, optax schedules) at call time. ``grad_estimator`` defaults to
    ``blackjax.sgmcmc.gradients.grad_estimator(logprior_fn, loglikelihood_fn, N)``.

    Parameters
    ----------
    num_data
        ``N`` (static).
    batch_size
        Minibatch size of the gradient, in ``[1, N]``.
    delta, first_batch_size, bound, exact
        The racing MH test's settings (:func:`jaxsub.racing.mh_kernel.build_kernel`).

    Returns
    -------
    kernel
        The kernel above.

    Raises
    ------
    ValueError
        On a setting outside its range.
    """
    batch_size = check_int("batch_size", batch_size, low=1, high=num_data)
    mh_kernel = racing_mh.build_kernel(
        num_data, delta=delta, first_batch_size=first_batch_size, bound=bound, exact=exact
    )

    def kernel(
        rng_key: PRNGKey,
        state: RacingMHState,
        logprior_fn: Callable,
        loglikelihood_fn: Callable,
        data: ArrayLikeTree,
        step_size,
        grad_estimator: Callable | None = None,
        control_variate: ControlVariate | None = None,
        reward_range=None,
    ):
        check_hyperparameter("step_size", step_size, low=0.0)
        if grad_estimator is None:
            grad_estimator = blackjax_grad_estimator(logprior_fn, loglikelihood_fn, num_data)
        proposal = sgld_proposal(grad_estimator, data, num_data, batch_size, step_size)
        return mh_kernel(rng_key, state, logprior_fn, loglikelihood_fn, data, proposal, control_variate, reward_range)

    return kernel


def as_top_level_api(
    logprior_fn: Callable,
    loglikelihood_fn: Callable,
    data: ArrayLikeTree,
    *,
    step_size: float,
    batch_size: int,
    delta: float | None,
    first_batch_size: int = 50,
    bound: str = "normal",
    control_variate: ControlVariate | None = None,
    grad_estimator: Callable | None = None,
    exact: bool = False,
    reward_range=None,
) -> SamplingAlgorithm:
    """SGLD proposal + Racing MH correction as a BlackJAX ``SamplingAlgorithm``.

    Parameters
    ----------
    logprior_fn
        ``logprior_fn(position) -> scalar``.
    loglikelihood_fn
        ``loglikelihood_fn(position, datum) -> scalar`` for one datum.
    data
        Pytree of arrays sharing the leading data axis ``N``.
    step_size
        Langevin step ``ε > 0``.
    batch_size
        Minibatch size for the gradient, in ``[1, N]``.
    delta
        Per-decision error bound of the racing MH test, in ``(0, 1)``.
    first_batch_size, bound
        Racing settings (paper: ``m_1 = 50``, ``"normal"``).
    control_variate
        Optional :class:`jaxsub.racing_mh.ControlVariate` for the MH test.
    grad_estimator
        ``(position, minibatch) -> grad log posterior``; default
        ``blackjax.sgmcmc.gradients.grad_estimator(logprior_fn, loglikelihood_fn, N)``.
    exact
        Exact MH correction (all ``N`` data), e.g. for baselines (MALA with a
        stochastic drift).
    reward_range
        For ``bound="ebs"``: see :func:`jaxsub.racing_mh.as_top_level_api`.

    Returns
    -------
    SamplingAlgorithm
        ``init(position)``, ``step(rng_key, state) -> (RacingMHState, RacingMHInfo)``.

    Raises
    ------
    ValueError
        On a setting outside its range, a non-callable ``grad_estimator``, non-finite ``data``,
        ``bound="ebs"`` without ``reward_range``; ``init`` raises on a position the model cannot
        evaluate (an integer position is promoted to float).
    """
    num_data = num_data_of(data)
    check_finite_data(data)
    step_size = check_hyperparameter("step_size", step_size, low=0.0)
    if grad_estimator is not None and not callable(grad_estimator):
        raise ValueError(f"grad_estimator must be callable (position, minibatch) -> gradient; got {grad_estimator!r}")
    kernel = build_kernel(
        num_data, batch_size=batch_size, delta=delta, first_batch_size=first_batch_size, bound=bound, exact=exact
    )
    check_control_variate_matches(control_variate, data, num_data)
    if bound == "ebs" and not exact and reward_range is None:
        raise ValueError("bound='ebs' needs reward_range (see jaxsub.racing_mh.as_top_level_api)")

    def init_fn(position: ArrayLikeTree, rng_key=None):
        del rng_key
        position = float_position(position)
        check_position(position, loglikelihood_fn, data, logprior_fn=logprior_fn, name="initial position")
        return init(position, logprior_fn)

    def step_fn(rng_key: PRNGKey, state: RacingMHState):
        return kernel(
            rng_key,
            state,
            logprior_fn,
            loglikelihood_fn,
            data,
            step_size,
            grad_estimator,
            control_variate,
            reward_range,
        )

    return SamplingAlgorithm(init_fn, step_fn)
