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
from jaxsub.sgmcmc.surrogates import ConduciveArrays, check_surrogates, conducive_arrays, conducive_gradient
from jaxsub.types import Array, ArrayLikeTree, ArrayTree, PRNGKey
from jaxsub.validation import check_int, check_real

__all__ = ["MultiDeviceState", "MultiDeviceInfo", "multi_device", "positions_by_chain", "bytes_per_round"]


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
                  batch_size, local_steps, num_shards, diagonal, exploration, return_local_positions):
    """Local steps of the ``C`` chains resident on device ``d`` (data: ``[1, N_max, ...]``, size ``[1]``)."""
    num_chains = jax.tree.leaves(positions)[0].shape[0]
    shard_prob = jnp.asarray(1.0 / num_shards, jnp.float32)
    device_key = jax.random.fold_in(key, d)

    def one_chain(j, position):
        dtype = ravel_pytree(position)[0].dtype
        cfn = None
        if arrays is not None:
            def cfn(p):
                g = conducive_gradient(p, 0, shard_prob, arrays, diagonal=diagonal)
                return jax.tree.map(lambda x: exploration * x, g)
        grad_fn = dsgld.shard_gradient_estimator(logprior_fn, loglikelihood_fn, size[0], shard_prob, dtype, cfn)
        new, local = dsgld.local_round(jax.random.fold_in(device_key, j), position, grad_fn, data, 0, size[0],
                                       step_size, batch_size=batch_size, local_steps=local_steps,
                                       return_local_positions=return_local_positions)
        return new, local, dsgld._is_finite(new)

    return jax.vmap(one_chain)(jnp.arange(num_chains), positions)


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
        ``jax.make_mesh((S,), ('shards',))``; it may span processes. ``None``:
        the same computation vmapped on the default device.
    axis_name
        The mesh axis the shards are placed along.
    shard_probs
        Must be uniform (``None`` means uniform here, not ``∝ N_s``): chains hop by uniformly random cyclic
        shifts, which realises ``f_s = 1/S``.

    Returns
    -------
    SamplingAlgorithm
        ``init(position)`` takes leaves with a leading ``S·C`` chain axis and
        returns a :class:`MultiDeviceState`; ``step(rng_key, state) ->
        (MultiDeviceState, MultiDeviceInfo)`` runs one round of all chains.
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
        arrays = conducive_arrays(surrogates)
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
                       exploration=exploration, return_local_positions=bool(return_local_positions))
    sizes = np.asarray(shards.sizes, np.int32)
    C, S = chains_per_shard, num_shards

    if mesh is None:
        data = jax.tree.map(jnp.asarray, shards.data)
        sizes_arr = jnp.asarray(sizes)

        def round_all(key, positions, chain_id):
            def per_device(d, pos_d, data_d, size_d, arrays_d):
                return round_fn(key, pos_d, data_d, size_d, d, step_size, arrays_d)

            local_arrays = None
            arr_axes = None
            if arrays is not None:
                local_arrays = ConduciveArrays(arrays.precision[:, None], arrays.shift[:, None],
                                               arrays.total_precision, arrays.total_shift)
                arr_axes = ConduciveArrays(0, 0, None, None)
            data_1 = jax.tree.map(lambda x: x[:, None], data)
            new, local, finite = jax.vmap(per_device, in_axes=(0, 0, 0, 0, arr_axes))(
                jnp.arange(S), positions, data_1, sizes_arr[:, None], local_arrays)
            return new, local, finite

        def hop(shifts, tree):
            def roll_slot(x):
                cols = [jnp.roll(x[:, j], shifts[j], axis=0) for j in range(C)]
                return jnp.stack(cols, axis=1)

            return jax.tree.map(roll_slot, tree)

        def place(tree):
            return tree
    else:
        spec = P(axis_name)
        data = jax.tree.map(lambda x: x if _is_placed(x, mesh, spec) else jax.device_put(x, NamedSharding(mesh, spec)),
                            shards.data)
        sizes_arr = jax.device_put(sizes, NamedSharding(mesh, spec))
        arrays_placed, arrays_spec = None, None
        if arrays is not None:
            arrays_placed = ConduciveArrays(
                jax.device_put(arrays.precision, NamedSharding(mesh, spec)),
                jax.device_put(arrays.shift, NamedSharding(mesh, spec)),
                jax.device_put(arrays.total_precision, NamedSharding(mesh, P())),
                jax.device_put(arrays.total_shift, NamedSharding(mesh, P())))
            arrays_spec = ConduciveArrays(spec, spec, P(), P())

        def body(key, positions, chain_id, shifts, data_l, size_l, arrays_l):
            d = jax.lax.axis_index(axis_name)
            pos = jax.tree.map(lambda x: x[0], positions)
            new, local, finite = round_fn(key, pos, data_l, size_l, d, step_size, arrays_l)
            new = jax.tree.map(lambda x: x[None], new)
            local = jax.tree.map(lambda x: x[None], local)
            moved = []
            for j in range(C):
                slot = jax.tree.map(lambda x: x[:, j], (new, chain_id))
                branches = [lambda t: t] + [
                    partial(_ppermute_shift, axis_name=axis_name, num_shards=S, shift=i) for i in range(1, S)]
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
        pos = jax.tree.map(lambda x: jnp.reshape(jnp.asarray(x), (S, C) + np.shape(x)[1:]), position)
        ids = jnp.arange(S * C, dtype=jnp.int32).reshape(S, C)
        return MultiDeviceState(place(pos), place(ids))

    def step_fn(rng_key: PRNGKey, state: MultiDeviceState):
        key_shift, key_local = jax.random.split(rng_key)
        shifts = jax.random.randint(key_shift, (C,), 0, S, dtype=jnp.int32)
        if mesh is None:
            new, local, finite = round_all(key_local, state.position, state.chain_id)
            new_pos, new_ids = hop(shifts, (new, state.chain_id))
        else:
            new_pos, new_ids, local, finite = sharded_body(key_local, state.position, state.chain_id, shifts,
                                                           data, sizes_arr, arrays_placed)
        return MultiDeviceState(new_pos, new_ids), MultiDeviceInfo(state.chain_id, shifts, local, finite)

    return SamplingAlgorithm(init_fn, step_fn)


def _is_placed(x, mesh, spec) -> bool:
    sharding = getattr(x, "sharding", None)
    return isinstance(sharding, NamedSharding) and sharding.mesh == mesh and sharding.spec == spec


def _ppermute_shift(tree, *, axis_name: str, num_shards: int, shift: int):
    perm = [(src, (src + shift) % num_shards) for src in range(num_shards)]
    return jax.lax.ppermute(tree, axis_name, perm)
