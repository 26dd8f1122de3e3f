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
of its past, which is DSGLD's shard choice for uniform ``shard_probs``; chains
in the same slot share their shift (their shard sequences are coupled, each
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

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxsub.base import SamplingAlgorithm
from jaxsub.sgmcmc import dsgld
from jaxsub.sgmcmc.surrogates import ConduciveArrays, apply_conducive, check_surrogates, conducive_arrays
from jaxsub.types import Array, ArrayLikeTree, ArrayTree, PRNGKey
from jaxsub.validation import check_int, check_real

__all__ = ["MultiDeviceState", "MultiDeviceInfo", "MultiDeviceInputs", "multi_device", "multi_device_kernel", "positions_by_chain", "bytes_per_round"]


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
        ``[S, C]``: the chain that ran on shard ``d`` (row ``d``) this round.
    shifts
        ``[C]``: the cyclic shift each slot's chains hopped by after the round.
    local_positions
        Leaves ``[S, C, local_steps, ...]`` when requested, else ``None`` (before the hop).
    is_finite
        ``[S, C]``: whether each chain's new position is finite.
    """

    chain_id: Array
    shifts: Array
    local_positions: ArrayTree | None
    is_finite: Array


def positions_by_chain(position: ArrayTree, chain_id: Array) -> ArrayTree:
    """Reorder ``[..., S, C, ...]`` positions (e.g. a trace ``[T, S, C, ...]``) to ``[..., S·C, ...]`` by chain id."""
    chain_id = jnp.asarray(chain_id)
    lead = chain_id.ndim - 2
    flat_ids = chain_id.reshape(chain_id.shape[:lead] + (-1,))
    order = jnp.argsort(flat_ids, axis=-1)

    def reorder(x):
        x = x.reshape(x.shape[:lead] + (-1,) + x.shape[lead + 2:])
        idx = order.reshape(order.shape + (1,) * (x.ndim - order.ndim))
        return jnp.take_along_axis(x, idx, axis=lead)

    return jax.tree.map(reorder, position)


def bytes_per_round(position: ArrayLikeTree, num_shards: int, chains_per_shard: int) -> dict:
    """Bytes that cross devices in one round (chain states and ids), worst case and expected.

    A slot whose shift is 0 moves nothing; otherwise each of its ``S`` chains
    moves once. Expected = worst × (S-1)/S.
    """
    per_chain = sum(int(np.size(x)) * np.dtype(jnp.asarray(x).dtype).itemsize for x in jax.tree.leaves(position)) + 4
    worst = per_chain * num_shards * chains_per_shard
    return {"bytes_per_chain": per_chain, "worst": worst, "expected": worst * (num_shards - 1) / num_shards}


def _device_round(key, positions, data, size, d, step_size, arrays, *, logprior_fn, loglikelihood_fn,
                  batch_size, local_steps, num_shards, diagonal, return_local_positions):
    """Local steps of the ``C`` chains resident on device ``d`` (data: ``[1, N_max, ...]``, size ``[1]``)."""
    num_chains = jax.tree.leaves(positions)[0].shape[0]
    shard_prob = jnp.asarray(1.0 / num_shards, jnp.float32)
    device_key = jax.random.fold_in(key, d)

    def one_chain(j, position):
        dtype = ravel_pytree(position)[0].dtype
        cfn = None
        if arrays is not None:
            cfn = partial(apply_conducive, matrix=arrays.matrix[0], offset=arrays.offset[0], diagonal=diagonal)
        grad_fn = dsgld.shard_gradient_estimator(logprior_fn, loglikelihood_fn, size[0], shard_prob, dtype, cfn)
        new, local = dsgld.local_round(jax.random.fold_in(device_key, j), position, grad_fn, data, 0, size[0],
                                       step_size, batch_size=batch_size, local_steps=local_steps,
                                       return_local_positions=return_local_positions)
        return new, local, dsgld._is_finite(new)

    return jax.vmap(one_chain)(jnp.arange(num_chains), positions)


class MultiDeviceInputs(NamedTuple):
    """The arrays a multi-device round reads, placed on the mesh (data and per-shard surrogates sharded).

    Pass them as *arguments* of the jitted function (``kernel(rng_key, state,
    inputs)``): a jitted function may not close over an array that spans
    other processes' devices, and closing over large data embeds it in the
    compiled program.
    """

    data: ArrayTree
    shard_sizes: Array
    arrays: ConduciveArrays | None


def multi_device_kernel(logprior_fn: Callable, loglikelihood_fn: Callable, shards: Any, *, step_size: float,
                        batch_size: int, local_steps: int, surrogates=None, exploration: float = 1.0,
                        chains_per_shard: int = 1, mesh: jax.sharding.Mesh | None = None,
                        axis_name: str = "shards", shard_probs: Any = None,
                        return_local_positions: bool = False):
    """Like :func:`multi_device` but returns ``(init_fn, kernel, inputs)`` with the data as an argument.

    ``kernel(rng_key, state, inputs) -> (state, info)``; ``inputs`` is a
    :class:`MultiDeviceInputs` already placed on the mesh. Use this form under
    ``jax.distributed.initialize`` (multi-host) and for large data; see
    ``examples/multihost_dsgld.py``.
    """
    from jaxsub.sgmcmc.shards import make_shards

    shards = make_shards(shards)
    num_shards = shards.num_shards
    if shard_probs is None:  # the only choice here: see the module notes
        shard_probs = np.full(num_shards, 1.0 / num_shards)
    shards, step_size, batch_size, local_steps, probs = dsgld.validate_config(
        shards, step_size, batch_size, local_steps, shard_probs)
    if not np.allclose(probs, 1.0 / num_shards, rtol=1e-6, atol=0):
        raise ValueError(
            "shard_probs must be uniform (or None) for multi_device: chains hop between devices by uniformly "
            f"random cyclic shifts, which realises f_s = 1/{num_shards}; got {probs.tolist()}"
        )
    chains_per_shard = check_int("chains_per_shard", chains_per_shard, low=1)
    exploration = check_real("exploration", exploration, low=0.0, low_closed=True)
    diagonal = False
    arrays = None
    if surrogates is not None:
        surrogates = check_surrogates(surrogates, num_shards)
        diagonal = surrogates.diagonal
        arrays = conducive_arrays(surrogates, probs, exploration)
    if mesh is not None:
        if axis_name not in mesh.shape:
            raise ValueError(f"mesh has axes {tuple(mesh.shape)}; axis_name {axis_name!r} is not one of them")
        if mesh.shape[axis_name] != num_shards:
            raise ValueError(
                f"the mesh axis {axis_name!r} has {mesh.shape[axis_name]} devices but there are {num_shards} "
                "shards: multi_device places exactly one shard per device"
            )
    round_fn = partial(_device_round, logprior_fn=logprior_fn, loglikelihood_fn=loglikelihood_fn,
                       batch_size=batch_size, local_steps=local_steps, num_shards=num_shards, diagonal=diagonal,
                       return_local_positions=bool(return_local_positions))
    sizes = np.asarray(shards.sizes, np.int32)
    C, S = chains_per_shard, num_shards

    if mesh is None:
        inputs = MultiDeviceInputs(jax.tree.map(jnp.asarray, shards.data), jnp.asarray(sizes), arrays)

        def round_all(key, positions, inputs):
            def per_device(d, pos_d, data_d, size_d, arrays_d):
                return round_fn(key, pos_d, data_d, size_d, d, step_size, arrays_d)

            local_arrays, arr_axes = None, None
            if inputs.arrays is not None:
                a = inputs.arrays
                local_arrays = ConduciveArrays(a.matrix[:, None], a.offset[:, None])
                arr_axes = ConduciveArrays(0, 0)
            data_1 = jax.tree.map(lambda x: x[:, None], inputs.data)
            return jax.vmap(per_device, in_axes=(0, 0, 0, 0, arr_axes))(
                jnp.arange(S), positions, data_1, inputs.shard_sizes[:, None], local_arrays)

        def hop(shifts, tree):
            def roll_slot(x):
                return jnp.stack([jnp.roll(x[:, j], shifts[j], axis=0) for j in range(C)], axis=1)

            return jax.tree.map(roll_slot, tree)

        def place(tree):
            return tree
    else:
        spec = P(axis_name)

        def put(x, sp):
            return x if _is_placed(x, mesh, sp) else jax.device_put(x, NamedSharding(mesh, sp))

        placed_arrays, arrays_spec = None, None
        if arrays is not None:
            placed_arrays = ConduciveArrays(put(arrays.matrix, spec), put(arrays.offset, spec))
            arrays_spec = ConduciveArrays(spec, spec)
        inputs = MultiDeviceInputs(jax.tree.map(lambda x: put(x, spec), shards.data), put(sizes, spec), placed_arrays)

        def body(key, positions, chain_id, shifts, data_l, size_l, arrays_l):
            d = jax.lax.axis_index(axis_name)
            pos = jax.tree.map(lambda x: x[0], positions)
            new, local, finite = round_fn(key, pos, data_l, size_l, d, step_size, arrays_l)
            new = jax.tree.map(lambda x: x[None], new)
            local = jax.tree.map(lambda x: x[None], local)
            branches = [lambda t: t] + [
                partial(_ppermute_shift, axis_name=axis_name, num_shards=S, shift=i) for i in range(1, S)]
            moved = []
            for j in range(C):
                slot = jax.tree.map(lambda x: x[:, j], (new, chain_id))
                moved.append(jax.lax.switch(shifts[j], branches, slot))
            new_pos, new_ids = jax.tree.map(lambda *xs: jnp.stack(xs, axis=1), *moved)
            return new_pos, new_ids, local, finite[None]

        sharded_body = jax.shard_map(
            body, mesh=mesh,
            in_specs=(P(), spec, spec, P(), spec, spec, arrays_spec),
            out_specs=(spec, spec, spec, spec),
        )

        def place(tree):
            return jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, spec)), tree)

    def init_fn(position: ArrayLikeTree, rng_key=None):
        del rng_key
        leaves = jax.tree.leaves(position)
        if not leaves or any(np.shape(x)[:1] != (S * C,) for x in leaves):
            raise ValueError(
                f"position must have a leading chain axis of size num_shards * chains_per_shard = {S * C}; "
                f"got leaf shapes {[np.shape(x) for x in leaves]}"
            )
        if surrogates is not None:
            from jaxsub.sgmcmc.cg_dsgld import check_surrogate_dim
            check_surrogate_dim(surrogates, jax.tree.map(lambda x: x[0], position))
        pos = jax.tree.map(lambda x: np.reshape(np.asarray(x), (S, C) + np.shape(x)[1:]), position)
        ids = np.arange(S * C, dtype=np.int32).reshape(S, C)
        if mesh is None:
            pos, ids = jax.tree.map(jnp.asarray, (pos, ids))
        return MultiDeviceState(place(pos), place(ids))

    def kernel(rng_key: PRNGKey, state: MultiDeviceState, inputs: MultiDeviceInputs):
        key_shift, key_local = jax.random.split(rng_key)
        shifts = jax.random.randint(key_shift, (C,), 0, S, dtype=jnp.int32)
        if mesh is None:
            new, local, finite = round_all(key_local, state.position, inputs)
            new_pos, new_ids = hop(shifts, (new, state.chain_id))
        else:
            new_pos, new_ids, local, finite = sharded_body(key_local, state.position, state.chain_id, shifts,
                                                           inputs.data, inputs.shard_sizes, inputs.arrays)
        return MultiDeviceState(new_pos, new_ids), MultiDeviceInfo(state.chain_id, shifts, local, finite)

    return init_fn, kernel, inputs


def multi_device(logprior_fn: Callable, loglikelihood_fn: Callable, shards: Any, *, step_size: float,
                 batch_size: int, local_steps: int, surrogates=None, exploration: float = 1.0,
                 chains_per_shard: int = 1, mesh: jax.sharding.Mesh | None = None, axis_name: str = "shards",
                 shard_probs: Any = None, return_local_positions: bool = False) -> SamplingAlgorithm:
    r"""DSGLD (``surrogates=None``) or CG-DSGLD with one shard per device and chains hopping between devices.

    Parameters
    ----------
    logprior_fn, loglikelihood_fn, shards, step_size, batch_size, local_steps, return_local_positions
        As in :func:`jaxsub.sgmcmc.dsgld.as_top_level_api`.
    surrogates, exploration
        As in :func:`jaxsub.sgmcmc.cg_dsgld.as_top_level_api`; ``None`` gives DSGLD.
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
        Must be uniform (``None`` means uniform here, not ``∝ N_s``): chains hop
        by uniformly random cyclic shifts, which realises ``f_s = 1/S``.

    Returns
    -------
    SamplingAlgorithm
        ``init(position)`` takes leaves with a leading ``S·C`` chain axis and
        returns a :class:`MultiDeviceState`; ``step(rng_key, state) ->
        (MultiDeviceState, MultiDeviceInfo)`` runs one round of all chains.
    """
    init_fn, kernel, inputs = multi_device_kernel(
        logprior_fn, loglikelihood_fn, shards, step_size=step_size, batch_size=batch_size, local_steps=local_steps,
        surrogates=surrogates, exploration=exploration, chains_per_shard=chains_per_shard, mesh=mesh,
        axis_name=axis_name, shard_probs=shard_probs, return_local_positions=return_local_positions)

    def step_fn(rng_key: PRNGKey, state: MultiDeviceState):
        return kernel(rng_key, state, inputs)

    return SamplingAlgorithm(init_fn, step_fn)


def _is_placed(x, mesh, spec) -> bool:
    sharding = getattr(x, "sharding", None)
    return isinstance(sharding, NamedSharding) and sharding.mesh == mesh and sharding.spec == spec


def _ppermute_shift(tree, *, axis_name: str, num_shards: int, shift: int):
    perm = [(src, (src + shift) % num_shards) for src in range(num_shards)]
    return jax.lax.ppermute(tree, axis_name, perm)
