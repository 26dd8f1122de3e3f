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

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxsub.base import SamplingAlgorithm
from jaxsub.sgmcmc import dsgld
from jaxsub.sgmcmc.dsgld import DSGLDInfo as CGDSGLDInfo
from jaxsub.sgmcmc.dsgld import DSGLDState as CGDSGLDState
from jaxsub.sgmcmc.surrogates import ConduciveArrays, apply_conducive, check_surrogates, conducive_arrays, shard_arrays
from jaxsub.types import Array, ArrayLikeTree, ArrayTree, PRNGKey
from jaxsub.validation import check_hyperparameter

__all__ = [
    "CGDSGLDState",
    "CGDSGLDInfo",
    "init",
    "build_kernel",
    "as_top_level_api",
    "check_surrogate_dim",
    "sample_rounds",
]

init = dsgld.init


def build_kernel(
    *, batch_size: int, local_steps: int, return_local_positions: bool = False, shard_size: int | None = None
) -> Callable:
    """Build the CG-DSGLD round kernel from the algorithm's structure (static settings only).

    Parameters
    ----------
    batch_size : int
        Minibatch size ``n`` of each local SGLD step.
    local_steps : int
        SGLD steps per round on the chosen shard.
    return_local_positions : bool, default False
        Whether ``info.local_positions`` keeps every local step's position.
    shard_size : int or None, default None
        The common shard size when all shards have the same size, else ``None`` (as in
        :func:`jaxsub.sgmcmc.dsgld.build_kernel`).

    Returns
    -------
    callable
        ``kernel(rng_key, state, logprior_fn, loglikelihood_fn, data, shard_sizes, shard_probs, arrays,
        step_size, exploration=1.0) -> (state, info)`` with ``arrays`` a
        :class:`jaxsub.sgmcmc.surrogates.ConduciveArrays` from ``conducive_arrays(surrogates, shard_probs)``
        (which fixes ``f``; the structure, full / diagonal / low rank, is read from the arrays' shapes),
        ``step_size`` ε and ``exploration`` α (both may be traced; out of range they set
        ``info.bad_hyperparameter``). The shard's arrays are gathered
        and scaled by α once per round, not once per local step.
    """

    def kernel(
        rng_key: PRNGKey,
        state: CGDSGLDState,
        logprior_fn: Callable,
        loglikelihood_fn: Callable,
        data: ArrayTree,
        shard_sizes: Array,
        shard_probs: Array,
        arrays: ConduciveArrays,
        step_size,
        exploration=1.0,
    ) -> tuple[CGDSGLDState, CGDSGLDInfo]:
        def conducive(shard):
            local = shard_arrays(arrays, shard, exploration)
            return lambda position: apply_conducive(position, local)

        dsgld.check_layout(data, batch_size, shard_size)
        new_position, info = dsgld.shard_round(
            rng_key,
            state.position,
            logprior_fn,
            loglikelihood_fn,
            data,
            shard_sizes,
            shard_probs,
            step_size,
            conducive,
            batch_size=batch_size,
            local_steps=local_steps,
            return_local_positions=return_local_positions,
            static_shard_size=shard_size,
        )
        return CGDSGLDState(new_position), info._replace(
            bad_hyperparameter=dsgld.bad_hyperparameters(step_size, exploration)
        )

    return kernel


def check_surrogate_dim(surrogates, position) -> None:
    """``ValueError`` unless the surrogates' dimension equals the flattened position's size.

    Parameters
    ----------
    surrogates : GaussianSurrogates
        The per-shard Gaussian surrogates (their ``dim``).
    position : pytree
        The sampler's initial position.

    Raises
    ------
    ValueError
        When ``surrogates.dim`` differs from the number of entries of ``position``.
    """
    size = sum(int(jnp.size(x)) for x in jax.tree.leaves(position))
    if size != surrogates.dim:
        raise ValueError(
            f"surrogates have dimension {surrogates.dim} but the position has {size} entries; "
            "fit the surrogates on the same parameterisation as the sampler"
        )


def as_top_level_api(
    logprior_fn: Callable,
    loglikelihood_fn: Callable,
    shards: Any,
    *,
    step_size: float,
    batch_size: int,
    local_steps: int,
    surrogates,
    shard_probs: Any = None,
    exploration: float = 1.0,
    return_local_positions: bool = False,
) -> SamplingAlgorithm:
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
        ``init`` promotes integer positions and checks them against the model and the surrogates.

    Raises
    ------
    ValueError
        As :func:`jaxsub.sgmcmc.dsgld.as_top_level_api`, and surrogates that do not match the
        shards, ``exploration`` < 0 (when concrete); from ``init``: a position of another
        dimension than the surrogates', or one the model does not accept.

    References
    ----------
    El Mekkaoui et al., "Federated stochastic gradient Langevin dynamics", UAI 2021, eq. 6 and Remark 1.
    """
    shards, step_size, batch_size, local_steps, probs = dsgld.validate_config(
        shards, step_size, batch_size, local_steps, shard_probs
    )
    surrogates = check_surrogates(surrogates, shards.num_shards)
    exploration = check_hyperparameter("exploration", exploration, low=0.0, low_closed=True)
    kernel = build_kernel(
        batch_size=batch_size,
        local_steps=local_steps,
        return_local_positions=bool(return_local_positions),
        shard_size=dsgld.common_size(shards),
    )
    data = jax.tree.map(jnp.asarray, shards.data)
    sizes = jnp.asarray(shards.sizes, jnp.int32)
    probs_arr = jnp.asarray(probs, jnp.float32)
    arrays = conducive_arrays(surrogates, probs)

    def init_fn(position: ArrayLikeTree, rng_key=None):
        del rng_key
        state = init(position)
        check_surrogate_dim(surrogates, state.position)
        dsgld.check_position(logprior_fn, loglikelihood_fn, dsgld.first_datum(data), state.position)
        return state

    def step_fn(rng_key: PRNGKey, state: CGDSGLDState):
        return kernel(
            rng_key, state, logprior_fn, loglikelihood_fn, data, sizes, probs_arr, arrays, step_size, exploration
        )

    return SamplingAlgorithm(init_fn, step_fn)


def sample_rounds(
    logprior_fn: Callable,
    loglikelihood_fn: Callable,
    *,
    batch_size: int,
    local_steps: int,
    num_rounds: int,
    shard_size: int | None = None,
    return_local_positions: bool = False,
    transform: Callable | None = None,
) -> Callable:
    r"""A pure function running CG-DSGLD chains with the data, surrogates and hyperparameters as *arguments*.

    ``jaxsub.cg_dsgld(...).step`` closes over the shards and surrogates, so every new data set,
    surrogate fit or exploration weight is a new program to compile. The function returned here
    takes them as arguments: jit it once and reuse it for every data set of the same shapes, every
    surrogate of the same structure and every ``α`` -- ``exploration = 0`` is DSGLD exactly (the
    conducive term is multiplied by 0), so DSGLD and CG-DSGLD share one compiled program.

    Parameters
    ----------
    logprior_fn, loglikelihood_fn
        As in :func:`as_top_level_api`.
    batch_size, local_steps, shard_size, return_local_positions
        Static structure, as in :func:`build_kernel`.
    num_rounds
        Rounds per chain (static: the scan length).
    transform
        ``transform(state, info) -> pytree`` recorded every round (default: the position).

    Returns
    -------
    ``run(rng_key, positions, data, shard_sizes, shard_probs, arrays, step_size, exploration)
    -> (final_states, trace)``: ``positions`` have a leading chains axis; ``data``,
    ``shard_sizes`` are ``Shards.data`` and ``Shards.sizes`` (:func:`jaxsub.sgmcmc.make_shards`);
    ``arrays`` from :func:`jaxsub.sgmcmc.conducive_arrays`; leaves of ``trace`` are
    ``[chains, num_rounds, ...]``. Chain ``c`` uses key ``split(rng_key, chains)[c]`` split
    into one key per round. Nothing is validated here (the arguments may be traced): use
    :func:`as_top_level_api` for checked construction.
    """
    kernel = build_kernel(
        batch_size=batch_size,
        local_steps=local_steps,
        shard_size=shard_size,
        return_local_positions=bool(return_local_positions),
    )
    record = transform if transform is not None else (lambda state, info: state.position)

    def run(rng_key, positions, data, shard_sizes, shard_probs, arrays, step_size, exploration):
        def one_chain(key, position):
            def body(state, k):
                state, info = kernel(
                    k,
                    state,
                    logprior_fn,
                    loglikelihood_fn,
                    data,
                    shard_sizes,
                    shard_probs,
                    arrays,
                    step_size,
                    exploration,
                )
                return state, record(state, info)

            return jax.lax.scan(body, init(position), jax.random.split(key, num_rounds))

        num_chains = jax.tree.leaves(positions)[0].shape[0]
        return jax.vmap(one_chain)(jax.random.split(rng_key, num_chains), positions)

    return run
