"""Proposals of the racing MH kernels: the Gaussian random walk and its one-call random draws.

:class:`GaussianRandomWalk` is the default proposal of :func:`jaxsub.racing.mh.as_top_level_api`
(draws equal to ``blackjax.additive_step_random_walk``'s). :func:`fused_draws` makes a step's
proposal normals, ``log u`` and the race's permutation keys from ONE ``jax.random.bits`` call
(``fused_random_bits=True``: one threefry loop per step instead of six; same law, other draws).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from blackjax.mcmc.random_walk import normal as normal_random_step
from blackjax.util import linear_map

from jaxsub.racing.mh_inputs import check_step_size_shape
from jaxsub.subsample import NUM_ROUNDS, bits_to_uniform
from jaxsub.types import Array, PRNGKey

__all__ = ["GaussianRandomWalk", "fused_draws", "gaussian_random_walk"]

#: Float types whose uniforms :func:`fused_draws` makes from one 32-bit word each (as ``jax.random.uniform``).
_FUSED_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)


class GaussianRandomWalk(NamedTuple):
    """The default proposal ``x' = x + step_size * N(0, I)`` (symmetric, log q ratio 0).

    Called as ``proposal(rng_key, position) -> (proposed, 0.0)``, it uses
    :func:`blackjax.mcmc.random_walk.normal`, so draws equal those of
    ``blackjax.additive_step_random_walk(logdensity_fn, normal(step_size))``.
    ``step_size`` is a scalar, a vector of per-coordinate scales or a matrix
    (the Cholesky-like linear map blackjax applies to the noise); it may be traced.
    :meth:`from_normals` makes the same move from given standard normals, which
    lets a kernel draw the noise together with its other randomness
    (``fused_random_bits``).
    """

    step_size: Array

    def __call__(self, rng_key: PRNGKey, position):
        check_step_size_shape(self.step_size, flat_size(position))
        move = normal_random_step(jnp.asarray(self.step_size))(rng_key, position)
        proposed = jax.tree.map(jnp.add, position, move)
        leaf = jax.tree.leaves(position)[0]
        return proposed, jnp.zeros((), jnp.result_type(leaf))

    def from_normals(self, position, normals):
        """``(position + step_size * normals, 0.0)`` with ``normals`` the flattened ``[d]`` standard normals."""
        flat, unravel = jax.flatten_util.ravel_pytree(position)
        check_step_size_shape(self.step_size, flat.shape[0])
        move = unravel(linear_map(jnp.asarray(self.step_size), normals.astype(flat.dtype)))
        proposed = jax.tree.map(jnp.add, position, move)
        return proposed, jnp.zeros((), flat.dtype)


def gaussian_random_walk(step_size) -> GaussianRandomWalk:
    """The default proposal: ``x' = x + step_size * N(0, I)`` (symmetric, log q ratio 0).

    Uses :func:`blackjax.mcmc.random_walk.normal`, so draws equal those of
    ``blackjax.additive_step_random_walk(logdensity_fn, normal(step_size))``.

    Parameters
    ----------
    step_size
        A scalar, a vector of per-coordinate scales or a matrix (the Cholesky-like
        linear map blackjax applies to the noise); may be traced.

    Returns
    -------
    GaussianRandomWalk
        Callable ``(rng_key, position) -> (proposed, log_q_ratio)``.
    """
    return GaussianRandomWalk(step_size)


def can_fuse(proposal, position) -> bool:
    """Whether :func:`fused_draws` serves this step.

    True when the proposal is a :class:`GaussianRandomWalk` and every leaf of the position is
    float32 (or narrower), so one 32-bit word per uniform keeps ``jax.random``'s resolution.

    Parameters
    ----------
    proposal
        The kernel's proposal.
    position
        The current position.

    Returns
    -------
    bool
    """
    leaves = jax.tree.leaves(position)
    return isinstance(proposal, GaussianRandomWalk) and all(
        any(jnp.result_type(leaf) == t for t in _FUSED_FLOATS) for leaf in leaves
    )


def uniform_from_bits(bits, dtype, minval, maxval):
    """``jax.random.uniform``'s map from uint32 words to ``[minval, maxval)`` (float32 mantissa)."""
    floats = bits_to_uniform(bits) * (maxval - minval) + minval
    return jnp.maximum(jnp.asarray(minval, jnp.float32), floats).astype(dtype)


def fused_draws(rng_key: PRNGKey, num_normals: int, dtype):
    """A step's randomness from ONE ``jax.random.bits`` call (one threefry loop per step).

    Parameters
    ----------
    rng_key
        The step's key.
    num_normals
        ``d``, the size of the flattened position.
    dtype
        Dtype of the normals and of ``log u``.

    Returns
    -------
    (normals, log_u, round_keys)
        ``normals [num_normals]`` standard normals (``sqrt(2) erfinv(U(-1, 1))``, as
        ``jax.random.normal``), ``log u`` with ``u ~ U[0, 1)`` (as ``jax.random.uniform``) and the
        ``[NUM_ROUNDS]`` uint32 round keys of the race's permutation
        (:func:`jaxsub.subsample.permutation_round_keys`' output), each from its own words.
    """
    bits = jax.random.bits(rng_key, (num_normals + 1 + NUM_ROUNDS,), jnp.uint32)
    lo = np.nextafter(np.float32(-1.0), np.float32(0.0))
    normals = np.float32(np.sqrt(2.0)) * jax.lax.erf_inv(uniform_from_bits(bits[:num_normals], jnp.float32, lo, 1.0))
    log_u = jnp.log(uniform_from_bits(bits[num_normals], jnp.float32, 0.0, 1.0)).astype(dtype)
    return normals.astype(dtype), log_u, bits[num_normals + 1 :]


def flat_size(position) -> int:
    """Number of scalars in a position pytree (static)."""
    return sum(int(np.prod(jnp.shape(leaf))) for leaf in jax.tree.leaves(position))
