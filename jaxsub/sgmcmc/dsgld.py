r"""Distributed SGLD (DSGLD; Ahn, Shahbaba & Welling 2014) over data shards.

Shards ``s = 1..S`` of sizes ``N_s`` are visited with probabilities ``f_s``
(``Σ f_s = 1``, default ``f_s ∝ N_s``). One *round* (one call of ``step``)
draws ``s ∼ Cat(f)`` and takes ``L = local_steps`` SGLD steps on shard ``s``
only (NOTES.md §2; El Mekkaoui et al. 2021, eq. 3):

.. math::

    θ ← θ + \frac{ε}{2}\Big[∇\log p(θ) + \frac{N_s}{n f_s}\sum_{x∈B}∇\log p(x|θ)\Big] + η,
    \qquad η ∼ N(0, εI),

with ``ε = step_size`` (the paper's convention; BlackJAX's ``sgld`` step size
``h`` moves ``θ + h∇ + N(0, 2h)``, so ``h = ε/2``) and ``B`` a minibatch of ``n = batch_size`` points of shard ``s`` drawn
without replacement in O(n) (:func:`jaxsub.sgmcmc.shards.minibatch_indices`).
Averaged over ``s ∼ f`` and ``B`` the bracket is the full-data gradient of the
log-posterior. The bracket is ``blackjax.sgmcmc.gradients.grad_estimator``
with ``data_size = N_s / f_s`` and the update is ``blackjax.sgld``'s kernel.
With many local steps on heterogeneous shards the chain drifts towards a
mixture of local posteriors; :mod:`jaxsub.sgmcmc.cg_dsgld` corrects that.

References
----------
Ahn, Shahbaba & Welling, "Distributed stochastic gradient MCMC", ICML 2014.
El Mekkaoui, Mesquita, Blomstedt & Kaski, "Federated stochastic gradient
Langevin dynamics", UAI 2021.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import blackjax
import jax
import jax.numpy as jnp
import numpy as np
from blackjax.sgmcmc import gradients
from jax.flatten_util import ravel_pytree

from jaxsub.base import SamplingAlgorithm
from jaxsub.sgmcmc.shards import check_batch_size, check_finite_shards, make_shards, minibatch_indices, shard_gather
from jaxsub.subsample import permutation_indices
from jaxsub.types import Array, ArrayLikeTree, ArrayTree, PRNGKey
from jaxsub.validation import check_hyperparameter, check_int, check_probability_vector

__all__ = [
    "DSGLDState",
    "DSGLDInfo",
    "init",
    "build_kernel",
    "as_top_level_api",
    "check_position",
    "promote_position",
    "shard_gradient_estimator",
    "local_round",
    "shard_round",
    "resolve_shard_probs",
]


class DSGLDState(NamedTuple):
    """State of one DSGLD chain: the position only (the shard is re-drawn every round)."""

    position: ArrayTree


class DSGLDInfo(NamedTuple):
    """What one round did.

    Attributes
    ----------
    shard
        ``int32`` index of the shard the round ran on.
    local_positions
        The positions after each of the ``local_steps`` SGLD steps (leading
        axis ``local_steps``) when ``return_local_positions=True``, else ``None``.
    is_finite
        Whether the new position is finite (NaN/inf signals a too-large step size).
    bad_hyperparameter
        Whether a (traced) hyperparameter was out of range: ``step_size`` not ``> 0`` or,
        for CG-DSGLD, ``exploration`` not ``>= 0`` (NaN included). The drivers warn on it.
    """

    shard: Array
    local_positions: ArrayTree | None
    is_finite: Array
    bad_hyperparameter: Array = False


def init(position: ArrayLikeTree) -> DSGLDState:
    """The initial state: the position (the shard is drawn anew every round).

    Parameters
    ----------
    position
        Any pytree of arrays; integer and boolean leaves are promoted to the default float
        dtype (:func:`promote_position`: SGLD adds Gaussian noise to every entry).

    Returns
    -------
    DSGLDState
    """
    return DSGLDState(promote_position(position))


def promote_position(position: ArrayLikeTree) -> ArrayTree:
    """``position`` with integer and boolean leaves cast to the default float dtype.

    Parameters
    ----------
    position
        Pytree of arrays or scalars.

    Returns
    -------
    The pytree, floating leaves unchanged (same dtype), others as ``jnp.result_type(float)``.
    """

    def promote(x):
        x = jnp.asarray(x)
        return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.result_type(float))

    return jax.tree.map(promote, position)


def first_datum(data: ArrayTree) -> ArrayTree:
    """Shape and dtype of one datum of the padded ``[S, N_max, ...]`` data (no gather: the data
    may be sharded over devices)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x)[2:], x.dtype), data)


def _shapes(tree) -> str:
    def describe(x):
        shape = tuple(x.shape) if hasattr(x, "shape") else np.shape(x)
        dtype = x.dtype if hasattr(x, "dtype") else jnp.result_type(x)
        return f"{shape} {dtype}"

    return str(jax.tree.map(describe, tree))


def check_position(
    logprior_fn: Callable, loglikelihood_fn: Callable, datum: ArrayTree, position: ArrayLikeTree
) -> None:
    """Check once, by tracing shapes only (``jax.eval_shape``), that ``position`` fits the model.

    Parameters
    ----------
    logprior_fn, loglikelihood_fn
        The model: both must return a scalar for ``position`` (and one ``datum``).
    datum
        One datum (a row of the data), or its ``jax.ShapeDtypeStruct`` s.
    position
        One chain's position.

    Raises
    ------
    ValueError
        Naming ``position``, its shapes and the datum's, when a model function fails on them
        or returns something other than a scalar.
    """
    try:
        outs = {
            "logprior_fn(position)": jax.eval_shape(logprior_fn, position),
            "loglikelihood_fn(position, datum)": jax.eval_shape(loglikelihood_fn, position, datum),
        }
    except Exception as err:  # any failure of the user's model on these shapes
        raise ValueError(
            f"position does not fit the model: position {_shapes(position)}, datum {_shapes(datum)}; "
            f"{type(err).__name__}: {err}"
        ) from err
    for call, out in outs.items():
        if getattr(out, "shape", None) != ():
            raise ValueError(f"{call} must return a scalar; got {out} for position {_shapes(position)}")


def bad_hyperparameters(step_size, exploration=None) -> Array:
    """True when a (traced) ``step_size`` is not ``> 0`` or ``exploration`` is not ``>= 0``."""
    bad = ~(jnp.asarray(step_size) > 0)
    if exploration is not None:
        bad = bad | ~(jnp.asarray(exploration) >= 0)
    return bad


def check_layout(data: ArrayTree, batch_size: int, shard_size: int | None) -> None:
    """``ValueError`` when the padded ``[S, N_max, ...]`` data do not match the kernel's static structure."""
    leaves = jax.tree.leaves(data)
    if not leaves or any(jnp.ndim(x) < 2 for x in leaves):
        raise ValueError(f"data must be the padded [S, N_max, ...] pytree (Shards.data); got {_shapes(data)}")
    n_max = jnp.shape(leaves[0])[1]
    if batch_size > n_max:
        raise ValueError(f"batch_size = {batch_size} exceeds the data's rows per shard ({n_max})")
    if shard_size is not None and n_max != shard_size:
        raise ValueError(
            f"the kernel was built for shards of {shard_size} rows (shard_size) but the data have {n_max} rows "
            "per shard: build it for this layout"
        )


def resolve_shard_probs(shard_probs: Any, sizes: np.ndarray) -> np.ndarray:
    """Validate ``shard_probs`` (default ``∝ N_s``); every entry must be > 0 (the estimator divides by ``f_s``).

    Parameters
    ----------
    shard_probs
        ``None`` or a probability vector of length ``S``.
    sizes
        The shard sizes ``N_s``.

    Returns
    -------
    numpy.ndarray
        ``f``, float64, strictly positive, summing to 1.

    Raises
    ------
    ValueError
        If ``shard_probs`` is not a probability vector of length ``S`` or has a zero entry.
    """
    if shard_probs is None:
        return sizes / sizes.sum()
    probs = check_probability_vector("shard_probs", shard_probs, size=sizes.shape[0])
    if np.any(probs <= 0):
        raise ValueError(
            f"shard_probs must be strictly positive (the gradient is scaled by N_s / f_s); got {probs.tolist()}"
        )
    return probs


def shard_gradient_estimator(
    logprior_fn: Callable,
    loglikelihood_fn: Callable,
    shard_size: Array,
    shard_prob: Array,
    dtype,
    conducive_fn: Callable | None = None,
) -> Callable:
    r"""The DSGLD (or, with ``conducive_fn``, CG-DSGLD) gradient estimator on one shard.

    ``grad(θ, B) = ∇\log p(θ) + (N_s/(n f_s)) Σ_{x∈B} ∇\log p(x|θ) [+ conducive_fn(θ)]``,
    built with ``blackjax.sgmcmc.gradients.grad_estimator`` (``data_size = N_s/f_s``).
    It is unbiased for the full-data gradient when the shard is drawn with probability ``f_s``.

    Parameters
    ----------
    logprior_fn : callable
        ``logprior_fn(position) -> scalar``.
    loglikelihood_fn : callable
        ``loglikelihood_fn(position, x) -> scalar`` for one data row ``x``.
    shard_size : jnp.ndarray
        ``N_s``, the shard's number of rows (int scalar, may be traced).
    shard_prob : jnp.ndarray
        ``f_s``, the probability of choosing the shard (scalar, > 0).
    dtype : dtype
        The float dtype of the position (the scale ``N_s / f_s`` is computed in it).
    conducive_fn : callable or None, default None
        ``conducive_fn(position) -> pytree`` added to the gradient (CG-DSGLD), or ``None`` (DSGLD).

    Returns
    -------
    callable
        ``grad_fn(position, minibatch) -> pytree`` shaped like ``position``.
    """
    data_size = shard_size.astype(dtype) / shard_prob.astype(dtype)
    base = gradients.grad_estimator(logprior_fn, loglikelihood_fn, data_size)
    if conducive_fn is None:
        return base

    def grad_fn(position, minibatch):
        return jax.tree.map(jnp.add, base(position, minibatch), conducive_fn(position))

    return grad_fn


def local_round(
    rng_key: PRNGKey,
    position: ArrayLikeTree,
    grad_fn: Callable,
    data: ArrayTree,
    shard: Array,
    shard_size: Array,
    step_size,
    *,
    batch_size: int,
    local_steps: int,
    return_local_positions: bool,
    static_shard_size: int | None = None,
):
    """``local_steps`` SGLD steps (``blackjax.sgld`` kernel) on rows ``[0, shard_size)`` of ``data[shard]``.

    ``static_shard_size``: when every shard has this size (structure known at build time) the
    minibatch indices come from the static-domain permutation (``jaxsub.subsample.permutation_indices``),
    cheaper than the traced-size draw of :func:`jaxsub.sgmcmc.shards.minibatch_indices`.

    Parameters
    ----------
    rng_key : PRNGKey
        The round's local key (split once per step into minibatch and noise keys).
    position : pytree
        The starting position.
    grad_fn : callable
        ``grad_fn(position, minibatch) -> pytree``, e.g. from :func:`shard_gradient_estimator`.
    data : pytree
        The padded ``[S, N_max, ...]`` shard data.
    shard : jnp.ndarray
        The shard's index (int32 scalar).
    shard_size : jnp.ndarray
        Its number of valid rows (int scalar, ``>= batch_size``).
    step_size : float or jnp.ndarray
        The paper's ε (the ``blackjax.sgld`` step is ``ε / 2``).
    batch_size : int
        Minibatch size (static).
    local_steps : int
        Number of SGLD steps (static).
    return_local_positions : bool
        Whether to stack every step's position.
    static_shard_size : int or None, default None
        The common shard size, when known at build time.

    Returns
    -------
    new_position : pytree
        The position after ``local_steps`` steps.
    local_positions : pytree or None
        The positions after each step, stacked along a leading ``[local_steps]`` axis, or ``None``.
    """
    sgld_kernel = blackjax.sgmcmc.sgld.build_kernel()
    half_step = 0.5 * step_size  # blackjax's overdamped Langevin step is θ + h ∇ + N(0, 2h): h = ε/2
    positions = jnp.arange(batch_size)

    def indices(key):
        if static_shard_size is not None:
            return permutation_indices(key, positions, static_shard_size)
        return minibatch_indices(key, batch_size, shard_size)

    def one_step(pos, key):
        key_batch, key_noise = jax.random.split(key)
        batch = shard_gather(data, shard, indices(key_batch))
        new = sgld_kernel(key_noise, pos, grad_fn, batch, half_step)
        return new, (new if return_local_positions else None)

    return jax.lax.scan(one_step, position, jax.random.split(rng_key, local_steps))


def _is_finite(position) -> Array:
    return jnp.all(jnp.isfinite(ravel_pytree(position)[0]))


def shard_round(
    rng_key: PRNGKey,
    position: ArrayLikeTree,
    logprior_fn: Callable,
    loglikelihood_fn: Callable,
    data: ArrayTree,
    shard_sizes: Array,
    shard_probs: Array,
    step_size,
    conducive: Callable | None,
    *,
    batch_size: int,
    local_steps: int,
    return_local_positions: bool,
    static_shard_size: int | None = None,
):
    """One DSGLD round from ``position``: draw ``s ~ Cat(f)``, run ``local_steps`` steps on shard ``s``.

    ``conducive(shard) -> (position -> pytree)`` (or ``None``) is called once per round; the
    function it returns is added to the gradient at every local step (CG-DSGLD).

    Parameters
    ----------
    rng_key : PRNGKey
        The round's key (split into the shard draw and the local steps).
    position : pytree
        The current position.
    logprior_fn, loglikelihood_fn : callable
        The log prior and per-row log likelihood (see :func:`shard_gradient_estimator`).
    data : pytree
        The padded ``[S, N_max, ...]`` shard data.
    shard_sizes : jnp.ndarray
        ``int32 [S]`` valid rows per shard.
    shard_probs : jnp.ndarray
        ``[S]`` shard probabilities ``f`` (strictly positive, summing to 1).
    step_size : float or jnp.ndarray
        The paper's ε.
    conducive : callable or None
        ``conducive(shard) -> (position -> pytree)``, or ``None`` for plain DSGLD.
    batch_size, local_steps, return_local_positions, static_shard_size
        As in :func:`local_round`.

    Returns
    -------
    new_position : pytree
        The position after the round.
    info : DSGLDInfo
        The chosen shard, the local positions (or ``None``) and whether the new position is finite;
        ``bad_hyperparameter`` is left for the kernel to set.
    """
    dtype = ravel_pytree(position)[0].dtype
    key_shard, key_local = jax.random.split(rng_key)
    shard = jax.random.categorical(key_shard, jnp.log(shard_probs)).astype(jnp.int32)
    shard_size, shard_prob = shard_sizes[shard], shard_probs[shard]
    cfn = None if conducive is None else conducive(shard)
    grad_fn = shard_gradient_estimator(logprior_fn, loglikelihood_fn, shard_size, shard_prob, dtype, cfn)
    new_position, local = local_round(
        key_local,
        position,
        grad_fn,
        data,
        shard,
        shard_size,
        step_size,
        batch_size=batch_size,
        local_steps=local_steps,
        return_local_positions=return_local_positions,
        static_shard_size=static_shard_size,
    )
    return new_position, DSGLDInfo(shard, local, _is_finite(new_position))


def build_kernel(
    *, batch_size: int, local_steps: int, return_local_positions: bool = False, shard_size: int | None = None
) -> Callable:
    """Build the DSGLD round kernel from the algorithm's structure (static settings only).

    Parameters
    ----------
    batch_size, local_steps, return_local_positions
        Static settings (see :func:`as_top_level_api`).
    shard_size
        The common shard size when all shards have the same size (then minibatch indices use
        the static-domain permutation, cheaper per step), else ``None``; ``as_top_level_api``
        sets it. The kernel's ``shard_sizes`` must then all equal it.

    Returns
    -------
    ``kernel(rng_key, state, logprior_fn, loglikelihood_fn, data, shard_sizes, shard_probs, step_size)
    -> (DSGLDState, DSGLDInfo)`` where ``data`` is the padded ``[S, N_max, ...]`` pytree
    (``Shards.data``), ``shard_sizes`` ``int32 [S]``, ``shard_probs`` ``[S]`` (strictly
    positive, sums to 1) and ``step_size`` the paper's ε (may be traced; out of range it sets
    ``info.bad_hyperparameter``). ``data`` with another number of rows per shard than
    ``shard_size``, or fewer than ``batch_size``, raises ``ValueError`` when traced.
    """

    def kernel(
        rng_key: PRNGKey,
        state: DSGLDState,
        logprior_fn: Callable,
        loglikelihood_fn: Callable,
        data: ArrayTree,
        shard_sizes: Array,
        shard_probs: Array,
        step_size,
    ) -> tuple[DSGLDState, DSGLDInfo]:
        check_layout(data, batch_size, shard_size)
        new_position, info = shard_round(
            rng_key,
            state.position,
            logprior_fn,
            loglikelihood_fn,
            data,
            shard_sizes,
            shard_probs,
            step_size,
            None,
            batch_size=batch_size,
            local_steps=local_steps,
            return_local_positions=return_local_positions,
            static_shard_size=shard_size,
        )
        return DSGLDState(new_position), info._replace(bad_hyperparameter=bad_hyperparameters(step_size))

    return kernel


def common_size(shards) -> int | None:
    """The shards' common size if they are all equal (structure for :func:`build_kernel`), else ``None``."""
    sizes = np.asarray(shards.sizes)
    if np.all(sizes == sizes[0]) and int(sizes[0]) >= 1:
        if jax.tree.leaves(shards.data)[0].shape[1] == int(sizes[0]):
            return int(sizes[0])
    return None


def validate_config(shards, step_size, batch_size, local_steps, shard_probs):
    """Shared checks of DSGLD / CG-DSGLD; returns ``(Shards, step_size, batch_size, local_steps, probs)``.

    ``step_size`` may be traced (``jaxsub.validation.check_hyperparameter``); the shards'
    concrete data must be finite (NaN/inf rows would silently turn positions into NaN).
    """
    shards = make_shards(shards)
    check_finite_shards(shards)
    step_size = check_hyperparameter("step_size", step_size, low=0.0)
    batch_size = check_batch_size(batch_size, shards.sizes)
    local_steps = check_int("local_steps", local_steps, low=1)
    probs = resolve_shard_probs(shard_probs, shards.sizes)
    return shards, step_size, batch_size, local_steps, probs


def as_top_level_api(
    logprior_fn: Callable,
    loglikelihood_fn: Callable,
    shards: Any,
    *,
    step_size: float,
    batch_size: int,
    local_steps: int,
    shard_probs: Any = None,
    return_local_positions: bool = False,
) -> SamplingAlgorithm:
    r"""Distributed SGLD: each ``step`` is one round of ``local_steps`` SGLD steps on one shard.

    Parameters
    ----------
    logprior_fn
        ``logprior_fn(position) -> scalar``.
    loglikelihood_fn
        ``loglikelihood_fn(position, datum) -> scalar`` for one datum (BlackJAX SG-MCMC convention).
    shards
        List of per-shard data pytrees (sizes may differ), a stacked pytree
        ``[S, N, ...]`` or a :class:`jaxsub.sgmcmc.Shards`.
    step_size
        ``ε > 0`` as in the update above (drift ``ε/2``, noise variance ``ε``;
        BlackJAX's ``sgld`` step size is ``ε/2``).
    batch_size
        ``n``, in ``[1, min_s N_s]``; minibatches are drawn without replacement.
    local_steps
        ``L >= 1`` SGLD steps per round.
    shard_probs
        ``f``: strictly positive, sums to 1; default ``f_s = N_s / N``.
    return_local_positions
        Put the ``L`` local positions in ``info.local_positions``.

    Returns
    -------
    SamplingAlgorithm
        ``init(position) -> DSGLDState``, ``step(rng_key, state) -> (DSGLDState, DSGLDInfo)``.
        ``init`` promotes integer positions to floats and checks the position against the
        model once (:func:`check_position`).

    Raises
    ------
    ValueError
        Non-finite or inconsistent shards, ``step_size`` not > 0 (when concrete),
        ``batch_size`` not in ``[1, min_s N_s]``, ``local_steps`` < 1, bad ``shard_probs``;
        from ``init``: a position the model does not accept.
    """
    shards, step_size, batch_size, local_steps, probs = validate_config(
        shards, step_size, batch_size, local_steps, shard_probs
    )
    kernel = build_kernel(
        batch_size=batch_size,
        local_steps=local_steps,
        return_local_positions=bool(return_local_positions),
        shard_size=common_size(shards),
    )
    data = jax.tree.map(jnp.asarray, shards.data)
    sizes = jnp.asarray(shards.sizes, jnp.int32)
    probs_arr = jnp.asarray(probs, jnp.float32)

    def init_fn(position: ArrayLikeTree, rng_key=None):
        del rng_key
        state = init(position)
        check_position(logprior_fn, loglikelihood_fn, first_datum(data), state.position)
        return state

    def step_fn(rng_key: PRNGKey, state: DSGLDState):
        return kernel(rng_key, state, logprior_fn, loglikelihood_fn, data, sizes, probs_arr, step_size)

    return SamplingAlgorithm(init_fn, step_fn)
