r"""DSGLD / CG-DSGLD with shards placed one per device (``jax.shard_map``); the data never moves.

Layout: a 1-D mesh axis (``axis_name``, default ``'shards'``) of ``S``
devices, shard ``s`` resident on device ``s`` (leading axis of the padded
``[S, N_max, ...]`` data sharded over the axis), and ``C = chains_per_shard``
chain states per device, ``S·C`` chains in all. One ``step`` is one round:

1. every device runs ``local_steps`` SGLD (or CG-SGLD) steps on each of its
   ``C`` resident chains, on its own shard, with exactly the per-chain kernel
   of :mod:`jaxsub.sgmcmc.dsgld` / :mod:`jaxsub.sgmcmc.cg_dsgld`
   (``f_s = 1/S``);
2. the chains hop: for every slot ``j < C`` a shift ``k_j ∼ U{0..S-1}`` is drawn
   from the (replicated) round key and the chain in slot ``j`` of device ``d``
   moves to device ``(d + k_j) mod S`` with one ``lax.ppermute``
   (collective permute; ``lax.switch`` picks among the ``S`` static
   permutations, so only one permute runs).

Every chain's next shard is therefore uniform on ``{0..S-1}`` and independent
of its past, which is DSGLD's shard choice for uniform ``shard_probs``.

**Non-uniform shard probabilities and partial participation.** Each round a
random subset of ``participating = m`` devices (uniform among subsets of size
``m``, drawn from the replicated round key) is active, and on an active device
``d`` each resident chain *acts* (runs its local steps) with probability
``r_d = f_d / max_k f_k``; otherwise it keeps its position (an idle round). A
chain sits on device ``d`` with probability ``1/S`` independently of its past,
so ``P(acts on d) = (1/S)(m/S) f_d / max f ∝ f_d``: conditioned on acting, the
shard is ``∼ f`` and independent of the past, and the gradient is scaled by
``N_d/(n f_d)``. The acting rounds of every chain therefore form a DSGLD (or
CG-DSGLD) chain with shard probabilities ``f`` (thinning by idle rounds changes
nothing but the wall-clock): the estimator is unbiased for every ``f`` and ``m``
(checked in tests/test_sgmcmc.py). The price is idle rounds: a chain acts in a
fraction ``Σ_d (1/S)(m/S) f_d / max f = m / (S² max_k f_k)`` of rounds
(``m/S`` for uniform ``f``).

Chains in the same slot share their shift (their shard sequences are coupled, each
one is still a DSGLD chain). What crosses devices per round is only the chain
states: ``C·S·(bytes per position + 4)`` at most (the 4 bytes are the chain id).

``mesh=None`` runs the same computation on one device with ``vmap`` over
``(shard, slot)`` and ``jnp.roll`` for the hop: for the same keys it gives the
same draws (tests/test_sgmcmc_devices.py), which is how multi-device results
are checked and what benchmarks/cgdsgld.py times against. Under
``jax.distributed.initialize`` the mesh may span processes (hosts) unchanged:
see ``examples/multihost_dsgld.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxsub.base import SamplingAlgorithm
from jaxsub.sgmcmc import dsgld
from jaxsub.sgmcmc.shards import check_batch_size, check_finite_shards, make_shards
from jaxsub.sgmcmc.surrogates import ConduciveArrays, apply_conducive, check_surrogates, conducive_arrays, shard_arrays
from jaxsub.types import Array, ArrayLikeTree, ArrayTree, PRNGKey
from jaxsub.validation import check_hyperparameter, check_int

__all__ = [
    "MultiDeviceState",
    "MultiDeviceInfo",
    "MultiDeviceInputs",
    "MultiDeviceFunctions",
    "multi_device",
    "multi_device_kernel",
    "positions_by_chain",
    "draws_by_chain",
    "bytes_per_round",
]


class MultiDeviceState(NamedTuple):
    """Chains laid out by device.

    Attributes
    ----------
    position
        Pytree with leaves ``[S, C, ...]``: row ``d`` holds the chains resident on
        device (shard) ``d``, sharded over the mesh axis when a mesh is used.
    chain_id
        ``int32 [S, C]``: which chain (``0..S·C-1``) sits in each slot; it moves with the chain.
    """

    position: ArrayTree
    chain_id: Array


class MultiDeviceInfo(NamedTuple):
    """What one round did.

    Attributes
    ----------
    chain_id
        ``[S, C]``: the chain that sat on shard ``d`` (row ``d``) this round.
    shifts
        ``[C]``: the cyclic shift each slot's chains hopped by after the round.
    local_positions
        Leaves ``[S, C, local_steps, ...]`` when requested, else ``None`` (before the hop).
    is_finite
        ``[S, C]``: whether each chain's new position is finite.
    acted
        ``[S, C]``: whether the chain ran its local steps (its device participated and
        the ``f_d / max f`` coin came up); idle chains keep their position.
    participating
        ``[S]``: the devices that were active this round.
    bad_hyperparameter
        Whether a (traced) ``step_size`` was not ``> 0`` or ``exploration`` not ``>= 0``.
    """

    chain_id: Array
    shifts: Array
    local_positions: ArrayTree | None
    is_finite: Array
    acted: Array
    participating: Array
    bad_hyperparameter: Array = False


class MultiDeviceInputs(NamedTuple):
    """The arrays a multi-device round reads, placed on the mesh (everything per shard sharded).

    Pass them as *arguments* of the jitted function (``kernel(rng_key, state,
    logprior_fn, loglikelihood_fn, inputs, step_size)``): a jitted function may not close over
    an array that spans other processes' devices, and closing over large data embeds it in
    the compiled program.

    Attributes
    ----------
    data, shard_sizes
        Padded ``[S, N_max, ...]`` data and ``int32 [S]`` sizes.
    shard_probs
        ``[S]``: ``f`` (scales the gradient).
    act_probs
        ``[S]``: ``f_d / max_k f_k``, the probability that a chain on device ``d`` acts.
    arrays
        :class:`ConduciveArrays` (CG-DSGLD) or ``None`` (DSGLD).
    """

    data: ArrayTree
    shard_sizes: Array
    shard_probs: Array
    act_probs: Array
    arrays: ConduciveArrays | None


class MultiDeviceFunctions(NamedTuple):
    """What :func:`multi_device_kernel` returns (a NamedTuple of pure functions, Optax style).

    Attributes
    ----------
    init
        ``init(position) -> MultiDeviceState`` (leaves with a leading ``S·C`` chain axis).
    kernel
        ``kernel(rng_key, state, logprior_fn, loglikelihood_fn, inputs, step_size, exploration=1.0)
        -> (MultiDeviceState, MultiDeviceInfo)``; ``step_size`` and ``exploration`` may be traced.
    make_inputs
        ``make_inputs(shards, shard_probs=None, surrogates=None) -> MultiDeviceInputs``: validates
        and places the data (and surrogate arrays) on the mesh.
    """

    init: Callable
    kernel: Callable
    make_inputs: Callable


def positions_by_chain(position: ArrayTree, chain_id: Array) -> ArrayTree:
    """Reorder ``[..., S, C, ...]`` positions (e.g. a trace ``[T, S, C, ...]``) to ``[..., S·C, ...]`` by chain id.

    Parameters
    ----------
    position
        Pytree with leaves ``[..., S, C, ...]`` (the device layout).
    chain_id
        ``int32 [..., S, C]``: the chain in each slot (``MultiDeviceState.chain_id``).

    Returns
    -------
    The pytree with leaves ``[..., S·C, ...]``, chain ``i`` at index ``i``.
    """
    chain_id = jnp.asarray(chain_id)
    lead = chain_id.ndim - 2
    flat_ids = chain_id.reshape(chain_id.shape[:lead] + (-1,))
    order = jnp.argsort(flat_ids, axis=-1)

    def reorder(x):
        x = x.reshape(x.shape[:lead] + (-1,) + x.shape[lead + 2 :])
        idx = order.reshape(order.shape + (1,) * (x.ndim - order.ndim))
        return jnp.take_along_axis(x, idx, axis=lead)

    return jax.tree.map(reorder, position)


def draws_by_chain(states: MultiDeviceState) -> ArrayTree:
    """``[chains, steps, ...]`` draws from a driver's trace of states (leaves ``[T, S, C, ...]``).

    ``trace = jaxsub.run_chain(key, algo, algo.init(x0), T)`` then
    ``draws_by_chain(trace.states)`` has leaves ``[S·C, T, ...]``, chain ``i`` in row ``i``,
    the layout of ``jaxsub.run_chains`` and ``blackjax.diagnostics``. Post-processing on the
    host: device-sharded traces are gathered first (a sort may not run over a sharded axis).

    Parameters
    ----------
    states
        The stacked :class:`MultiDeviceState` of a trace (leaves ``[T, S, C, ...]``).

    Returns
    -------
    The positions by chain, leaves ``[S·C, T, ...]``.
    """
    if not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(states)):
        states = jax.device_get(states)
    by_chain = positions_by_chain(states.position, states.chain_id)
    return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), by_chain)


def bytes_per_round(position: ArrayLikeTree, num_shards: int, chains_per_shard: int) -> dict:
    """Bytes that cross devices in one round (chain states and ids), worst case and expected.

    A slot whose shift is 0 moves nothing; otherwise each of its ``S`` chains
    moves once. Expected = worst × (S-1)/S.

    Parameters
    ----------
    position
        One chain's position.
    num_shards, chains_per_shard
        ``S`` and ``C``.

    Returns
    -------
    dict
        ``bytes_per_chain`` (position and 4-byte chain id), ``worst`` and ``expected`` bytes.
    """
    per_chain = sum(int(np.size(x)) * np.dtype(jnp.asarray(x).dtype).itemsize for x in jax.tree.leaves(position)) + 4
    worst = per_chain * num_shards * chains_per_shard
    return {"bytes_per_chain": per_chain, "worst": worst, "expected": worst * (num_shards - 1) / num_shards}


def _device_round(
    key,
    positions,
    logprior_fn,
    loglikelihood_fn,
    data,
    size,
    prob,
    act_prob,
    arrays,
    active,
    d,
    step_size,
    exploration,
    *,
    batch_size,
    local_steps,
    return_local_positions,
):
    """Local rounds of the ``C`` chains resident on device ``d`` (data ``[1, N_max, ...]``, per-shard arrays ``[1]``)."""
    num_chains = jax.tree.leaves(positions)[0].shape[0]
    device_key = jax.random.fold_in(key, d)
    conducive = None
    if arrays is not None:
        local_arrays = shard_arrays(arrays, 0, exploration)
        conducive = lambda position: apply_conducive(position, local_arrays)  # noqa: E731

    def one_chain(j, position):
        dtype = ravel_pytree(position)[0].dtype
        key_act, key_local = jax.random.split(jax.random.fold_in(device_key, j))
        acts = active & (jax.random.uniform(key_act) < act_prob[0])
        grad_fn = dsgld.shard_gradient_estimator(logprior_fn, loglikelihood_fn, size[0], prob[0], dtype, conducive)
        new, local = dsgld.local_round(
            key_local,
            position,
            grad_fn,
            data,
            0,
            size[0],
            step_size,
            batch_size=batch_size,
            local_steps=local_steps,
            return_local_positions=return_local_positions,
        )
        new = jax.tree.map(lambda a, b: jnp.where(acts, a, b), new, position)
        if return_local_positions:  # an idle chain stayed where it was at every local step
            local = jax.tree.map(lambda a, b: jnp.where(acts, a, b[None]), local, position)
        return new, local, dsgld._is_finite(new), acts

    return jax.vmap(one_chain)(jnp.arange(num_chains), positions)


def _participation(key, num_shards: int, participating: int) -> Array:
    if participating == num_shards:
        return jnp.ones((num_shards,), bool)
    chosen = jax.random.permutation(key, num_shards)[:participating]
    return jnp.zeros((num_shards,), bool).at[chosen].set(True)


def multi_device_kernel(
    *,
    num_shards: int,
    chains_per_shard: int,
    batch_size: int,
    local_steps: int,
    mesh: jax.sharding.Mesh | None = None,
    axis_name: str = "shards",
    participating: int | None = None,
    return_local_positions: bool = False,
) -> MultiDeviceFunctions:
    """Build the multi-device round from its structure: ``(init, kernel, make_inputs)`` as a NamedTuple.

    Parameters
    ----------
    num_shards, chains_per_shard
        ``S`` devices (one shard each) and ``C`` chains per device.
    batch_size, local_steps, return_local_positions
        As in :func:`jaxsub.sgmcmc.dsgld.as_top_level_api` (``batch_size`` is checked
        against the shard sizes in ``make_inputs``).
    mesh, axis_name
        A mesh whose axis ``axis_name`` has ``S`` devices, or ``None`` (the same program
        vmapped on the default device).
    participating
        ``m`` in ``[1, S]`` devices active per round (default ``S``: full participation).

    Returns
    -------
    MultiDeviceFunctions
        Use this form under ``jax.distributed.initialize`` (multi-host) and for large data
        (``examples/multihost_dsgld.py``): the data are a jit argument. ``kernel`` refuses
        (``ValueError`` when traced) inputs or a state made for another ``S``, ``C`` or fewer
        rows per shard than ``batch_size``; a traced ``step_size`` / ``exploration`` out of
        range sets ``info.bad_hyperparameter``.

    Raises
    ------
    ValueError
        ``num_shards``, ``chains_per_shard``, ``batch_size``, ``local_steps`` < 1,
        ``participating`` not in ``[1, S]``, a mesh without ``axis_name`` or whose axis has
        another size than ``S``.
    """
    S = check_int("num_shards", num_shards, low=1)
    C = check_int("chains_per_shard", chains_per_shard, low=1)
    batch_size = check_int("batch_size", batch_size, low=1)
    local_steps = check_int("local_steps", local_steps, low=1)
    m = S if participating is None else check_int("participating", participating, low=1, high=S)
    if mesh is not None:
        if axis_name not in mesh.shape:
            raise ValueError(f"mesh has axes {tuple(mesh.shape)}; axis_name {axis_name!r} is not one of them")
        if mesh.shape[axis_name] != S:
            raise ValueError(
                f"the mesh axis {axis_name!r} has {mesh.shape[axis_name]} devices but there are {S} "
                "shards: multi_device places exactly one shard per device"
            )
    round_fn = partial(
        _device_round,
        batch_size=batch_size,
        local_steps=local_steps,
        return_local_positions=bool(return_local_positions),
    )
    spec = P(axis_name)

    def make_inputs(shards: Any, shard_probs: Any = None, surrogates=None) -> MultiDeviceInputs:
        shards = make_shards(shards)
        check_finite_shards(shards)
        if shards.num_shards != S:
            raise ValueError(
                f"multi_device was built for num_shards = {S} but the data have {shards.num_shards} shards"
            )
        check_batch_size(batch_size, shards.sizes)
        probs = np.full(S, 1.0 / S) if shard_probs is None else dsgld.resolve_shard_probs(shard_probs, shards.sizes)
        act = probs / probs.max()
        arrays = None
        if surrogates is not None:
            arrays = conducive_arrays(check_surrogates(surrogates, S), probs)
        sizes = np.asarray(shards.sizes, np.int32)
        if mesh is None:
            return MultiDeviceInputs(
                jax.tree.map(jnp.asarray, shards.data),
                jnp.asarray(sizes),
                jnp.asarray(probs, jnp.float32),
                jnp.asarray(act, jnp.float32),
                arrays,
            )

        def put(x, sp=spec):
            return x if _is_placed(x, mesh, sp) else jax.device_put(x, NamedSharding(mesh, sp))

        if arrays is not None:
            arrays = ConduciveArrays(
                put(arrays.matrix),
                put(arrays.offset),
                None if arrays.factor is None else put(arrays.factor),
                None if arrays.global_factor is None else put(arrays.global_factor, P()),
            )
        return MultiDeviceInputs(
            jax.tree.map(put, shards.data),
            put(sizes),
            put(np.asarray(probs, np.float32)),
            put(np.asarray(act, np.float32)),
            arrays,
        )

    def init(position: ArrayLikeTree) -> MultiDeviceState:
        leaves = jax.tree.leaves(position)
        if not leaves or any(np.shape(x)[:1] != (S * C,) for x in leaves):
            raise ValueError(
                f"position must have a leading chain axis of size num_shards * chains_per_shard = {S * C}; "
                f"got leaf shapes {[np.shape(x) for x in leaves]}"
            )
        position = dsgld.promote_position(position)
        ids = jnp.arange(S * C, dtype=jnp.int32).reshape(S, C)
        if mesh is None:  # traceable: jax.vmap(init) over batches of chains works
            pos = jax.tree.map(lambda x: jnp.reshape(jnp.asarray(x), (S, C) + jnp.shape(x)[1:]), position)
            return MultiDeviceState(pos, ids)
        pos = jax.tree.map(lambda x: np.reshape(np.asarray(x), (S, C) + np.shape(x)[1:]), position)
        place = lambda x: jax.device_put(x, NamedSharding(mesh, spec))  # noqa: E731
        return MultiDeviceState(jax.tree.map(place, pos), place(np.asarray(ids)))

    def hop_single(shifts, tree):
        # slot j of device d receives the chain from device (d - k_j) mod S: one gather for all slots
        rows = (jnp.arange(S, dtype=jnp.int32)[:, None] - shifts[None, :]) % S
        cols = jnp.arange(C, dtype=jnp.int32)[None, :]
        return jax.tree.map(lambda x: x[rows, cols], tree)

    def kernel(
        rng_key: PRNGKey,
        state: MultiDeviceState,
        logprior_fn: Callable,
        loglikelihood_fn: Callable,
        inputs: MultiDeviceInputs,
        step_size,
        exploration=1.0,
    ) -> tuple[MultiDeviceState, MultiDeviceInfo]:
        _check_inputs(inputs, state, S, C, batch_size)
        key_shift, key_local, key_part = jax.random.split(rng_key, 3)
        shifts = jax.random.randint(key_shift, (C,), 0, S, dtype=jnp.int32)
        active = _participation(key_part, S, m)
        one = partial(
            round_fn,
            logprior_fn=logprior_fn,
            loglikelihood_fn=loglikelihood_fn,
            step_size=step_size,
            exploration=exploration,
        )
        arrays = inputs.arrays
        if mesh is None:
            local_arrays, arr_axes = None, None
            if arrays is not None:
                local_arrays = ConduciveArrays(
                    arrays.matrix[:, None],
                    arrays.offset[:, None],
                    None if arrays.factor is None else arrays.factor[:, None],
                    arrays.global_factor,
                )
                arr_axes = ConduciveArrays(0, 0, None if arrays.factor is None else 0, None)

            def per_device(d, pos_d, data_d, size_d, prob_d, act_d, arrays_d, active_d):
                return one(
                    key_local,
                    pos_d,
                    data=data_d,
                    size=size_d,
                    prob=prob_d,
                    act_prob=act_d,
                    arrays=arrays_d,
                    active=active_d,
                    d=d,
                )

            new, local, finite, acted = jax.vmap(per_device, in_axes=(0, 0, 0, 0, 0, 0, arr_axes, 0))(
                jnp.arange(S),
                state.position,
                jax.tree.map(lambda x: x[:, None], inputs.data),
                inputs.shard_sizes[:, None],
                inputs.shard_probs[:, None],
                inputs.act_probs[:, None],
                local_arrays,
                active,
            )
            new_pos, new_ids = hop_single(shifts, (new, state.chain_id))
        else:
            arrays_spec = None
            if arrays is not None:
                arrays_spec = ConduciveArrays(
                    spec, spec, None if arrays.factor is None else spec, None if arrays.global_factor is None else P()
                )

            def body(key, positions, chain_id, shifts, active, data_l, size_l, prob_l, act_l, arrays_l, step, alpha):
                d = jax.lax.axis_index(axis_name)
                pos = jax.tree.map(lambda x: x[0], positions)
                new, local, finite, acted = round_fn(
                    key,
                    pos,
                    logprior_fn,
                    loglikelihood_fn,
                    data_l,
                    size_l,
                    prob_l,
                    act_l,
                    arrays_l,
                    active[d],
                    d,
                    step,
                    alpha,
                )
                new = jax.tree.map(lambda x: x[None], new)
                local = jax.tree.map(lambda x: x[None], local)
                branches = [lambda t: t] + [
                    partial(_ppermute_shift, axis_name=axis_name, num_shards=S, shift=i) for i in range(1, S)
                ]
                moved = []
                for j in range(C):
                    slot = jax.tree.map(lambda x: x[:, j], (new, chain_id))
                    moved.append(jax.lax.switch(shifts[j], branches, slot))
                new_pos, new_ids = jax.tree.map(lambda *xs: jnp.stack(xs, axis=1), *moved)
                return new_pos, new_ids, local, finite[None], acted[None]

            sharded_body = jax.shard_map(
                body,
                mesh=mesh,
                in_specs=(P(), spec, spec, P(), P(), spec, spec, spec, spec, arrays_spec, P(), P()),
                out_specs=(spec, spec, spec, spec, spec),
            )
            new_pos, new_ids, local, finite, acted = sharded_body(
                key_local,
                state.position,
                state.chain_id,
                shifts,
                active,
                inputs.data,
                inputs.shard_sizes,
                inputs.shard_probs,
                inputs.act_probs,
                arrays,
                jnp.asarray(step_size),
                jnp.asarray(exploration),
            )
        info = MultiDeviceInfo(
            state.chain_id,
            shifts,
            local,
            finite,
            acted,
            active,
            dsgld.bad_hyperparameters(step_size, None if arrays is None else exploration),
        )
        return MultiDeviceState(new_pos, new_ids), info

    return MultiDeviceFunctions(init, kernel, make_inputs)


def multi_device(
    logprior_fn: Callable,
    loglikelihood_fn: Callable,
    shards: Any,
    *,
    step_size: float,
    batch_size: int,
    local_steps: int,
    surrogates=None,
    exploration: float = 1.0,
    chains_per_shard: int = 1,
    mesh: jax.sharding.Mesh | None = None,
    axis_name: str = "shards",
    shard_probs: Any = None,
    participating: int | None = None,
    return_local_positions: bool = False,
) -> SamplingAlgorithm:
    r"""DSGLD (``surrogates=None``) or CG-DSGLD with one shard per device and chains hopping between devices.

    Parameters
    ----------
    logprior_fn, loglikelihood_fn, shards, step_size, batch_size, local_steps, return_local_positions
        As in :func:`jaxsub.sgmcmc.dsgld.as_top_level_api`; ``step_size`` may be traced.
    surrogates, exploration
        As in :func:`jaxsub.sgmcmc.cg_dsgld.as_top_level_api`; ``None`` gives DSGLD; ``exploration`` may be traced.
    chains_per_shard
        ``C``: chains resident on each device (``S·C`` chains in all).
    mesh
        A mesh with an axis ``axis_name`` of size ``S`` (number of shards), e.g.
        ``jax.make_mesh((S,), ('shards',))``. ``None``: the same computation
        vmapped on the default device. For a mesh spanning several processes use
        :func:`multi_device_kernel` (data must be a jit argument there).
    axis_name
        The mesh axis the shards are placed along.
    shard_probs
        ``f`` (strictly positive; ``None`` means *uniform* here, not ``∝ N_s``). Non-uniform
        ``f`` is realised by idle rounds (see the module notes): a chain on device ``d``
        acts with probability ``f_d / max f``.
    participating
        ``m`` devices active per round, a uniformly random subset (default: all ``S``).

    Returns
    -------
    SamplingAlgorithm
        ``init(position)`` takes leaves with a leading ``S·C`` chain axis and returns a
        :class:`MultiDeviceState`; ``step(rng_key, state) -> (MultiDeviceState, MultiDeviceInfo)``
        runs one round of all chains. ``jaxsub.run_chain`` over it and :func:`draws_by_chain`
        on the trace's states give ``[chains, steps, ...]`` draws. ``init`` promotes integer
        positions to floats and checks one chain's position against the model.

    Raises
    ------
    ValueError
        Bad static settings (as :func:`multi_device_kernel` and ``make_inputs``), ``step_size``
        not > 0 or ``exploration`` < 0 when concrete; from ``init``: positions without the
        ``S·C`` chain axis, or that the model (or the surrogates) do not accept.
    """
    shards = make_shards(shards)
    step_size = check_hyperparameter("step_size", step_size, low=0.0)
    exploration = check_hyperparameter("exploration", exploration, low=0.0, low_closed=True)
    functions = multi_device_kernel(
        num_shards=shards.num_shards,
        chains_per_shard=chains_per_shard,
        batch_size=batch_size,
        local_steps=local_steps,
        mesh=mesh,
        axis_name=axis_name,
        participating=participating,
        return_local_positions=return_local_positions,
    )
    inputs = functions.make_inputs(shards, shard_probs, surrogates)

    def init_fn(position: ArrayLikeTree, rng_key=None):
        del rng_key
        one = dsgld.promote_position(jax.tree.map(lambda x: x[0], position))
        if surrogates is not None:
            from jaxsub.sgmcmc.cg_dsgld import check_surrogate_dim

            check_surrogate_dim(surrogates, one)
        state = functions.init(position)
        dsgld.check_position(logprior_fn, loglikelihood_fn, dsgld.first_datum(inputs.data), one)
        return state

    def step_fn(rng_key: PRNGKey, state: MultiDeviceState):
        return functions.kernel(rng_key, state, logprior_fn, loglikelihood_fn, inputs, step_size, exploration)

    return SamplingAlgorithm(init_fn, step_fn)


def _check_inputs(inputs: MultiDeviceInputs, state: MultiDeviceState, S: int, C: int, batch_size: int) -> None:
    """``ValueError`` when the inputs or the state were made for another layout than the kernel's."""
    leaves = jax.tree.leaves(inputs.data)
    if not leaves or any(jnp.ndim(x) < 2 or jnp.shape(x)[0] != S for x in leaves):
        raise ValueError(
            f"inputs.data must have a leading num_shards = {S} axis (make_inputs of this kernel); "
            f"got leaf shapes {[jnp.shape(x) for x in leaves]}"
        )
    if batch_size > jnp.shape(leaves[0])[1]:
        raise ValueError(f"batch_size = {batch_size} exceeds the data's rows per shard ({jnp.shape(leaves[0])[1]})")
    if jnp.shape(state.chain_id) != (S, C):
        raise ValueError(
            f"state was made for chain_id shape {jnp.shape(state.chain_id)}; this kernel has "
            f"(num_shards, chains_per_shard) = {(S, C)}"
        )


def _is_placed(x, mesh, spec) -> bool:
    sharding = getattr(x, "sharding", None)
    return isinstance(sharding, NamedSharding) and sharding.mesh == mesh and sharding.spec == spec


def _ppermute_shift(tree, *, axis_name: str, num_shards: int, shift: int):
    perm = [(src, (src + shift) % num_shards) for src in range(num_shards)]
    return jax.lax.ppermute(tree, axis_name, perm)
