r"""Conducive-gradient DSGLD (CG-DSGLD; El Mekkaoui, Mesquita, Blomstedt & Kaski, UAI 2021).

DSGLD (:mod:`jaxsub.sgmcmc.dsgld`) with the conducive gradient added inside
the bracket of every local step on shard ``s`` (paper eq. 6; NOTES.md §2):

.. math::

    θ ← θ + \frac{ε}{2}\Big[∇\log p(θ) + \frac{N_s}{n f_s}\sum_{x∈B}∇\log p(x|θ)
        + α\Big(∇\log q(θ) - \frac{1}{f_s}∇\log q_s(θ)\Big)\Big] + η,

where ``q_s`` is a Gaussian surrogate of shard ``s``'s likelihood and
``q = ∏_s q_s`` (:mod:`jaxsub.sgmcmc.surrogates`). The conducive term has
zero mean over ``s ∼ f`` so the estimator stays unbiased for any
``α = exploration`` (Remark 1: larger α explores more); it pulls each local
trajectory towards the *global* posterior, so the chain does not drift
towards the shard's local posterior when ``local_steps`` is large. With exact
Gaussian likelihoods and full minibatches the bracket equals the full-data
gradient on every shard.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from jaxsub.base import SamplingAlgorithm
from jaxsub.sgmcmc import dsgld
from jaxsub.sgmcmc.dsgld import DSGLDInfo as CGDSGLDInfo
from jaxsub.sgmcmc.dsgld import DSGLDState as CGDSGLDState
from jaxsub.sgmcmc.surrogates import ConduciveArrays, apply_conducive, check_surrogates, conducive_arrays, shard_arrays
from jaxsub.types import Array, ArrayLikeTree, ArrayTree, PRNGKey
from jaxsub.validation import check_hyperparameter

__all__ = ["CGDSGLDState", "CGDSGLDInfo", "init", "build_kernel", "as_top_level_api", "check_surrogate_dim"]

init = dsgld.init


def build_kernel(*, batch_size: int, local_steps: int, return_local_positions: bool = False,
                 shard_size: int | None = None) -> Callable:
    """Build the CG-DSGLD round kernel from the algorithm's structure (static settings only).

    ``batch_size``, ``local_steps``, ``return_local_positions`` and ``shard_size`` as in
    :func:`jaxsub.sgmcmc.dsgld.build_kernel`.

    Returns
    -------
    ``kernel(rng_key, state, logprior_fn, loglikelihood_fn, data, shard_sizes, shard_probs, arrays,
    step_size, exploration=1.0) -> (state, info)`` with ``arrays`` a
    :class:`jaxsub.sgmcmc.surrogates.ConduciveArrays` from ``conducive_arrays(surrogates, shard_probs)``
    (which fixes ``f``; the structure, full / diagonal / low rank, is read from the arrays' shapes),
    ``step_size`` ε and ``exploration`` α (both may be traced). The shard's arrays are gathered
    and scaled by α once per round, not once per local step.
    """

    def kernel(rng_key: PRNGKey, state: CGDSGLDState, logprior_fn: Callable, loglikelihood_fn: Callable,
               data: ArrayTree, shard_sizes: Array, shard_probs: Array, arrays: ConduciveArrays, step_size,
               exploration=1.0) -> tuple[CGDSGLDState, CGDSGLDInfo]:
        def conducive(shard):
            local = shard_arrays(arrays, shard, exploration)
            return lambda position: apply_conducive(position, local)

        new_position, info = dsgld.shard_round(rng_key, state.position, logprior_fn, loglikelihood_fn, data,
                                               shard_sizes, shard_probs, step_size, conducive, batch_size=batch_size,
                                               local_steps=local_steps, return_local_positions=return_local_positions,
                                               static_shard_size=shard_size)
        return CGDSGLDState(new_position), info

    return kernel


def check_surrogate_dim(surrogates, position) -> None:
    """``ValueError`` unless the surrogates' dimension equals the flattened position's size."""
    size = sum(int(jnp.size(x)) for x in jax.tree.leaves(position))
    if size != surrogates.dim:
        raise ValueError(
            f"surrogates have dimension {surrogates.dim} but the position has {size} entries; "
            "fit the surrogates on the same parameterisation as the sampler"
        )


def as_top_level_api(logprior_fn: Callable, loglikelihood_fn: Callable, shards: Any, *, step_size: float,
                     batch_size: int, local_steps: int, surrogates, shard_probs: Any = None,
                     exploration: float = 1.0, return_local_positions: bool = False) -> SamplingAlgorithm:
    r"""CG-DSGLD: DSGLD rounds with the conducive gradient of Gaussian likelihood surrogates.

    Parameters
    ----------
    logprior_fn, loglikelihood_fn, shards, step_size, batch_size, local_steps, shard_probs, return_local_positions
        As in :func:`jaxsub.sgmcmc.dsgld.as_top_level_api`.
    surrogates
        :class:`jaxsub.sgmcmc.GaussianSurrogates` with one Gaussian per shard (exact, from
        :func:`jaxsub.sgmcmc.laplace_surrogates` or :func:`jaxsub.sgmcmc.gaussian_surrogates`);
        full, diagonal or low-rank-plus-diagonal precisions.
    exploration
        ``α >= 0`` multiplying the conducive term (``α = 0`` is DSGLD); may be traced.

    Returns
    -------
    SamplingAlgorithm
        ``init(position)``, ``step(rng_key, state) -> (state, info)``; ``info.shard`` is the shard visited.

    References
    ----------
    El Mekkaoui et al., "Federated stochastic gradient Langevin dynamics", UAI 2021, eq. 6 and Remark 1.
    """
    shards, step_size, batch_size, local_steps, probs = dsgld.validate_config(
        shards, step_size, batch_size, local_steps, shard_probs)
    surrogates = check_surrogates(surrogates, shards.num_shards)
    exploration = check_hyperparameter("exploration", exploration, low=0.0, low_closed=True)
    kernel = build_kernel(batch_size=batch_size, local_steps=local_steps,
                          return_local_positions=bool(return_local_positions), shard_size=dsgld.common_size(shards))
    data = jax.tree.map(jnp.asarray, shards.data)
    sizes = jnp.asarray(shards.sizes, jnp.int32)
    probs_arr = jnp.asarray(probs, jnp.float32)
    arrays = conducive_arrays(surrogates, probs)

    def init_fn(position: ArrayLikeTree, rng_key=None):
        del rng_key
        check_surrogate_dim(surrogates, position)
        return init(position)

    def step_fn(rng_key: PRNGKey, state: CGDSGLDState):
        return kernel(rng_key, state, logprior_fn, loglikelihood_fn, data, sizes, probs_arr, arrays, step_size,
                      exploration)

    return SamplingAlgorithm(init_fn, step_fn)
