"""CG-DSGLD across processes (hosts) with multi-controller JAX: one shard per device, data never moves.

Every process runs this same script (SPMD, multi-controller). Each process
owns ``--local-devices`` devices and materialises only the shards that live on
them (``jax.make_array_from_callback`` calls back for local devices only); the
mesh axis ``'shards'`` spans all processes, so the chain hops between shards
of different hosts are cross-process collective permutes (gloo on CPU).

Two processes on one machine (loopback only)::

    python examples/multihost_dsgld.py --num-processes 2 --process-id 0 --address 127.0.0.1:12355 --out a.npz &
    python examples/multihost_dsgld.py --num-processes 2 --process-id 1 --address 127.0.0.1:12355 --out b.npz

One process with all 8 devices (the reference; same keys, same draws)::

    python examples/multihost_dsgld.py --num-processes 1 --local-devices 8 --out ref.npz

On real hosts pass process 0's host:port as ``--address`` and
drop ``--local-devices`` (accelerators are discovered).

Long runs survive being killed: with ``--checkpoint-dir DIR`` the rounds run in chunks of
``--checkpoint-every`` rounds and after each chunk every process saves (atomically,
:mod:`jaxsub.checkpoint`) the gathered chain states and draws so far in ``DIR/process-<i>``;
started again with the same arguments, the run resumes from the newest checkpoint and
gives the same draws as an uninterrupted run (the per-round keys are split once). Run from the
repository root (``python -m``-style path: the script adds it to ``sys.path``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)
    p.add_argument("--address", default="127.0.0.1:12355", help="host:port of process 0")
    p.add_argument(
        "--local-devices", type=int, default=None, help="simulated CPU devices per process (default: 8 / num_processes)"
    )
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--local-steps", type=int, default=20)
    p.add_argument("--chains-per-shard", type=int, default=2)
    p.add_argument("--out", default=None, help="process 0 writes the draws here (.npz)")
    p.add_argument(
        "--init-timeout",
        type=int,
        default=300,
        help="seconds to wait for the other processes to join (and for a dead peer to be noticed)",
    )
    p.add_argument("--checkpoint-dir", default=None, help="save and resume here (one folder per process)")
    p.add_argument("--checkpoint-every", type=int, default=10, help="rounds per checkpoint")
    return p.parse_args(argv)


def place(tree, mesh, spec):
    """Host NumPy arrays (the same on every process) as global arrays sharded over ``mesh``."""
    import jax
    from jax.sharding import NamedSharding

    sharding = NamedSharding(mesh, spec)
    return jax.tree.map(lambda x: jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx]), tree)


def gather(tree):
    """Global arrays as host NumPy arrays on every process."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)


def run_rounds(run, state, keys, inputs, mesh, *, checkpoint_dir, every, meta):
    """All rounds in chunks; with ``checkpoint_dir``, save after each chunk and resume from the newest.

    Returns the host arrays ``(positions [rounds, S, C, ...], chain_ids [rounds, S, C])``.
    """
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from jaxsub import checkpoint

    num_rounds = keys.shape[0]
    host_state = gather(state)
    history = jax.tree.map(lambda x: np.zeros((0,) + x.shape, x.dtype), (host_state.position, host_state.chain_id))
    start, folder = 0, None
    if checkpoint_dir is not None:
        folder = Path(checkpoint_dir) / f"process-{jax.process_index()}"
        done = checkpoint.latest_step(folder)
        if done is not None:
            like = {
                "state": host_state,
                "history": jax.tree.map(lambda x: np.zeros((done,) + x.shape[1:], x.dtype), history),
            }
            start, tree = checkpoint.restore(folder, like, meta=meta)
            state, history = place(tree["state"], mesh, P("shards")), tree["history"]
    chunk = num_rounds if folder is None else every
    for lo in range(start, num_rounds, chunk):
        hi = min(num_rounds, lo + chunk)
        state, hist = run(state, keys[lo:hi], inputs)
        history = jax.tree.map(lambda a, b: np.concatenate([a, b]), history, gather(hist))
        if folder is not None:
            checkpoint.save(folder, hi, {"state": gather(state), "history": history}, meta=meta)
    return history


def main(argv=None):
    args = parse(argv)
    local = args.local_devices or max(1, 8 // args.num_processes)
    # Must be set before JAX initialises its CPU backend.
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={local}"
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import jax

    if args.num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(
            args.address,
            num_processes=args.num_processes,
            process_id=args.process_id,
            initialization_timeout=args.init_timeout,
            heartbeat_timeout_seconds=max(10, args.init_timeout // 3),
            shutdown_timeout_seconds=args.init_timeout,
        )
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxsub
    from jaxsub.sgmcmc import Shards

    num_shards = jax.device_count()
    # The toy of NOTES.md §2 (heterogeneous 2-D blobs, x|μ ~ N(μ, I), μ ~ N(0, 5I)), with unequal shard
    # sizes. Every process can regenerate the metadata (sizes, surrogate moments); the rows themselves are
    # only materialised for local devices below -- in a real deployment each host reads its own files.
    rng = np.random.default_rng(0)
    sizes = rng.integers(150, 250, size=num_shards)
    centres = rng.uniform(-6, 6, size=(num_shards, 2))
    n_max = int(sizes.max())
    full = np.zeros((num_shards, n_max, 2), np.float32)
    for s in range(num_shards):
        rows = centres[s] + np.sqrt(0.125) * rng.normal(size=(sizes[s], 2))
        full[s, : sizes[s]] = rows
        full[s, sizes[s] :] = rows[0]
    mesh = jax.make_mesh((num_shards,), ("shards",))
    sharding = NamedSharding(mesh, P("shards"))
    data = jax.make_array_from_callback(full.shape, sharding, lambda idx: full[idx])  # local shards only
    shards = Shards(data, sizes.astype(np.int64))
    means = np.stack([full[s, : sizes[s]].mean(0) for s in range(num_shards)])
    surrogates = jaxsub.sgmcmc.gaussian_surrogates(means, sizes[:, None] * np.ones((num_shards, 2)))

    functions = jaxsub.sgmcmc.multi_device_kernel(
        num_shards=num_shards,
        batch_size=10,
        local_steps=args.local_steps,
        chains_per_shard=args.chains_per_shard,
        mesh=mesh,
    )
    inputs = functions.make_inputs(shards, surrogates=surrogates)
    state = functions.init(np.zeros((num_shards * args.chains_per_shard, 2), np.float32))
    logprior = lambda mu: -0.5 * jnp.sum(mu**2) / 5.0  # noqa: E731
    loglik = lambda mu, x: -0.5 * jnp.sum((x - mu) ** 2)  # noqa: E731

    @jax.jit
    def run(state, keys, inputs):  # the data are an argument: no process may close over global arrays
        def one(s, k):
            s, _ = functions.kernel(k, s, logprior, loglik, inputs, 1e-4)
            return s, (s.position, s.chain_id)

        return jax.lax.scan(one, state, keys)

    # the same per-round keys as jaxsub.run_chain(jax.random.key(42), ...) would use
    meta = {
        "rounds": args.rounds,
        "local_steps": args.local_steps,
        "chains_per_shard": args.chains_per_shard,
        "devices": jax.device_count(),
        "checkpoint_every": args.checkpoint_every,
    }
    positions, chain_ids = run_rounds(
        run,
        state,
        jax.random.split(jax.random.key(42), args.rounds),
        inputs,
        mesh,
        checkpoint_dir=args.checkpoint_dir,
        every=args.checkpoint_every,
        meta=meta,
    )
    draws = np.asarray(jaxsub.sgmcmc.positions_by_chain(jnp.asarray(positions), jnp.asarray(chain_ids)))
    total = sizes.sum()
    exact_mean = (sizes[:, None] * means).sum(0) / (total + 0.2)
    if jax.process_index() == 0:
        print(
            f"processes={jax.process_count()} devices={jax.device_count()} local={jax.local_device_count()} "
            f"draws={draws.shape} mean(last half)={draws[draws.shape[0] // 2 :].mean((0, 1))} exact={exact_mean}"
        )
        if args.out:
            np.savez(
                args.out,
                draws=draws,
                chain_ids=np.asarray(chain_ids),
                exact_mean=exact_mean,
                process_count=jax.process_count(),
                device_count=jax.device_count(),
            )
    if args.num_processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
