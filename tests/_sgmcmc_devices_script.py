"""Run by tests/test_sgmcmc_devices.py in a subprocess with 8 simulated CPU devices.

Prints one JSON line comparing the shard_map (8 devices) run with the
single-device vmapped run for the same keys, for DSGLD and CG-DSGLD, and what
the compiled round communicates.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxsub  # noqa: E402


def main():
    assert jax.device_count() == 8, jax.devices()
    rng = np.random.default_rng(0)
    sizes = (30, 50, 20, 40, 30, 35, 25, 60)  # unequal: padded + masked
    shards = [(rng.normal(size=(n, 2)) + rng.uniform(-3, 3, size=2)).astype(np.float32) for n in sizes]
    lp = lambda th: -0.5 * jnp.sum(th**2) / 5.0  # noqa: E731
    ll = lambda th, x: -0.5 * jnp.sum((x - th) ** 2)  # noqa: E731
    sur = jaxsub.sgmcmc.gaussian_surrogates([x.mean(0) for x in shards], [len(x) * np.ones(2) for x in shards])
    mesh = jax.make_mesh((8,), ("shards",))
    out = {}
    for name, s in (("dsgld", None), ("cg_dsgld", sur)):
        runs = {}
        for label, m in (("single", None), ("mesh", mesh)):
            algo = jaxsub.sgmcmc.multi_device(lp, ll, shards, step_size=1e-3, batch_size=5, local_steps=4,
                                              chains_per_shard=2, mesh=m, surrogates=s)
            state = algo.init(jnp.zeros((16, 2)))
            trace = jaxsub.run_chain(jax.random.key(1), algo, state, 8,
                                     transform=lambda st, i: ((st.position, st.chain_id), i.shifts))
            runs[label] = trace
            if m is not None:
                out[f"{name}_position_devices"] = len(trace.final_state.position.sharding.device_set)
            if m is not None and name == "cg_dsgld":  # DSGLD's round communicates the same way
                hlo = jax.jit(algo.step).lower(jax.random.key(0), state).compile().as_text()
                out[f"{name}_collective_permutes"] = hlo.count("collective-permute-start") or hlo.count("collective-permute(")
                out[f"{name}_other_collectives"] = sum(hlo.count(op) for op in ("all-gather", "all-to-all", "all-reduce", "reduce-scatter"))
        a, b = runs["single"], runs["mesh"]
        out[f"{name}_max_abs_diff"] = float(np.max(np.abs(np.asarray(a.states[0]) - np.asarray(b.states[0]))))
        out[f"{name}_chain_ids_equal"] = bool(np.array_equal(a.states[1], b.states[1]))
        out[f"{name}_shifts"] = np.asarray(a.infos).tolist()
        out[f"{name}_finite"] = bool(np.all(np.isfinite(np.asarray(b.states[0]))))
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
