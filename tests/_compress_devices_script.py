"""Scale-out checks run in subprocesses (tests/test_compress_devices.py).

* ``python _compress_devices_script.py`` under ``XLA_FLAGS=--xla_force_host_platform_device_count=8``:
  sharded log-density and per-device clustering on 8 simulated CPU devices.
* ``python _compress_devices_script.py distributed PROCESS_ID PORT``: one of two ``jax.distributed``
  processes on 127.0.0.1 (one CPU device each): each clusters its shard of a global array, the
  union is gathered, and the sharded log-density is summed across the processes.
"""

import json
import sys

import jax
import numpy as np


def distributed_main(pid: int, port: int) -> None:
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxsub import compress

    assert jax.process_count() == 2 and jax.device_count() == 2, jax.devices()
    x = np.random.default_rng(0).standard_normal((3001, 3)).astype(np.float32)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    xs = jax.make_array_from_callback(x[:3000].shape, NamedSharding(mesh, P("data")), lambda idx: x[:3000][idx])
    assert not xs.is_fully_addressable
    union = compress.cluster_shards(xs, 0.4)
    fn = compress.sharded_logdensity(
        lambda m: -0.5 * jnp.sum(m**2), lambda m, xi: -0.5 * jnp.sum((xi - m) ** 2), union, mesh
    )
    value, grad = jax.jit(jax.value_and_grad(fn))(np.asarray([0.3, -0.2, 0.1], np.float32))
    out = dict(
        pid=pid,
        c=union.c,
        labels=union.labels.tolist(),
        counts=union.counts.tolist(),
        centroids=union.centroids.tolist(),
        radius=union.radius,
        value=float(value.addressable_data(0)),
        grad=np.asarray(grad.addressable_data(0)).tolist(),
    )
    print("RESULT " + json.dumps(out), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "distributed":
    try:
        distributed_main(int(sys.argv[2]), int(sys.argv[3]))
    except BaseException:
        # exit at once: a normal exit runs jax.distributed's shutdown barrier, which waits for the
        # peer that is itself waiting for this process in a collective
        import os
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.exit(0)

import blackjax  # noqa: E402
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxsub import compress

assert jax.device_count() == 8, jax.devices()
rng = np.random.default_rng(0)
x = rng.standard_normal((4003, 3))
y = (rng.uniform(size=4003) < jax.nn.sigmoid(x @ np.array([1.0, -2.0, 0.5]))).astype(np.int32)
cl = compress.cluster_supervised(x, y, 0.3)


def logprior(b):
    return -0.5 * jnp.sum(b**2)


def loglik(b, datum):
    xi, yi = datum
    logit = jnp.dot(xi, b)
    return jnp.where(yi == 1, jax.nn.log_sigmoid(logit), jax.nn.log_sigmoid(-logit))


# one compiled value-and-gradient per log-density (the sharded one's HLO is inspected below)
single = (
    jax.jit(jax.value_and_grad(compress.logdensity(logprior, loglik, cl, second_order=False)))
    .lower(jnp.zeros(3))
    .compile()
)
sharded = jax.jit(jax.value_and_grad(compress.sharded_logdensity(logprior, loglik, cl))).lower(jnp.zeros(3)).compile()
out = {"c": cl.c}
diffs = []
for b in [jnp.asarray([1.0, -2.0, 0.5]), jnp.asarray([0.1, 0.2, -0.3])]:
    (vs, gs), (vh, gh) = single(b), sharded(b)
    diffs.append(abs(float(vs) - float(vh)) / abs(float(vs)))
    diffs.append(float(jnp.max(jnp.abs(gs - gh)) / jnp.max(jnp.abs(gs))))
out["rel_diff"] = max(diffs)
hlo = sharded.as_text()
out["all_reduces"] = hlo.count("all-reduce(") + hlo.count("all-reduce-start(")
# blackjax.nuts unchanged on both: same draws up to float reassociation
draws = {}
for name, fn, value_and_grad in (
    ("single", compress.logdensity(logprior, loglik, cl, second_order=False), single),
    ("sharded", compress.sharded_logdensity(logprior, loglik, cl), sharded),
):
    nuts = blackjax.nuts(fn, step_size=0.05, inverse_mass_matrix=jnp.ones(3))
    # nuts.init's state from the compiled value-and-gradient above (an eager init of the
    # sharded log-density dispatches every primitive over 8 devices: ~4 CPU s)
    state = blackjax.mcmc.hmc.HMCState(jnp.zeros(3), *value_and_grad(jnp.zeros(3)))
    step = jax.jit(nuts.step).lower(jax.random.key(0), state).compile()  # one compile (no retrace on the output state)
    key = jax.random.key(1)
    pos = []
    for i in range(20):
        state, _ = step(jax.random.fold_in(key, i), state)
        pos.append(np.asarray(state.position))
    draws[name] = np.asarray(pos)
out["nuts_max_abs_diff"] = float(np.abs(draws["single"] - draws["sharded"]).max())
# clustering per device shard of a sharded array equals clustering each slice
mesh = Mesh(np.array(jax.devices()), ("data",))
xs = jax.device_put(jnp.asarray(x[:4000], jnp.float32), NamedSharding(mesh, P("data")))
union = compress.cluster_shards(xs, 0.3)
xf = np.asarray(xs, np.float64)
slices = [compress.cluster(xf[i * 500 : (i + 1) * 500], 0.3) for i in range(8)]
out["shards_c"] = union.c
out["shards_c_expected"] = sum(s.c for s in slices)
out["shards_radius_ok"] = bool(union.radii.max() <= 0.3)
dist = np.linalg.norm(xf - union.centroids[union.labels], axis=1)
out["shards_dist_ok"] = bool(dist.max() <= 0.3)
out["shards_labels_equal"] = bool(
    all(
        np.array_equal(union.labels[i * 500 : (i + 1) * 500] - union.labels[i * 500 : (i + 1) * 500].min(), s.labels)
        for i, s in enumerate(slices)
    )
)
out["one_device_c"] = compress.cluster(xf, 0.3).c
print("RESULT " + json.dumps(out))
