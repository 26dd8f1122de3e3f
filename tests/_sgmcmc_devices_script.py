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
    # the new paths: pytree positions, low-rank-plus-diagonal surrogates, non-uniform f, partial participation
    lp_tree = lambda th: -0.5 * (jnp.sum(th["a"] ** 2) + th["b"] ** 2) / 5.0  # noqa: E731
    ll_tree = lambda th, x: -0.5 * ((x[0] - th["a"][0]) ** 2 + (x[1] - th["b"]) ** 2)  # noqa: E731
    lowrank = jaxsub.sgmcmc.laplace_surrogates(
        lp_tree,
        ll_tree,
        shards,
        {"a": jnp.zeros(1), "b": jnp.zeros(())},
        structure="lowrank",
        rank=1,
        num_steps=20,
        rng_key=jax.random.key(0),
    )
    probs = np.asarray(sizes) / np.sum(sizes)
    cases = {
        "dsgld": dict(model=(lp, ll), surrogates=None, position=jnp.zeros((16, 2))),
        "cg_dsgld": dict(model=(lp, ll), surrogates=sur, position=jnp.zeros((16, 2))),
        "cg_pytree_lowrank_nonuniform_partial": dict(
            model=(lp_tree, ll_tree),
            surrogates=lowrank,
            shard_probs=probs,
            participating=5,
            position={"a": jnp.zeros((16, 1)), "b": jnp.zeros(16)},
        ),
    }
    mesh = jax.make_mesh((8,), ("shards",))
    out = {"names": list(cases)}
    for name, case in cases.items():
        runs = {}
        for label, m in (("single", None), ("mesh", mesh)):
            algo = jaxsub.sgmcmc.multi_device(
                *case["model"],
                shards,
                step_size=1e-3,
                batch_size=5,
                local_steps=4,
                chains_per_shard=2,
                mesh=m,
                surrogates=case["surrogates"],
                shard_probs=case.get("shard_probs"),
                participating=case.get("participating"),
            )
            state = algo.init(case["position"])
            record = lambda st, i: {"state": st, "shifts": i.shifts, "acted": i.acted}  # noqa: E731
            if m is not None and name == "cg_dsgld":  # DSGLD's round communicates the same way
                # one compiled round: its HLO is inspected and it runs the rounds with run_chain's keys
                # (split(key, num_steps)), so the draws are compared with run_chain on one device
                step = jax.jit(algo.step).lower(jax.random.key(0), state).compile()
                hlo = step.as_text()
                out[f"{name}_collective_permutes"] = hlo.count("collective-permute-start") or hlo.count(
                    "collective-permute("
                )
                out[f"{name}_other_collectives"] = sum(
                    hlo.count(op) for op in ("all-gather", "all-to-all", "all-reduce", "reduce-scatter")
                )
                st, hist = state, []
                for k in jax.random.split(jax.random.key(1), 8):
                    st, info = step(k, st)
                    hist.append(record(st, info))
                trace = jaxsub.ChainTrace(st, jax.tree.map(lambda *xs: jnp.stack(xs), *hist), None)
            else:
                trace = jaxsub.run_chain(jax.random.key(1), algo, state, 8, transform=record)
            runs[label] = trace.states
            if m is not None:
                leaf = jax.tree.leaves(trace.final_state.position)[0]
                out[f"{name}_position_devices"] = len(leaf.sharding.device_set)
        a, b = runs["single"], runs["mesh"]
        da, db = (jaxsub.sgmcmc.draws_by_chain(r["state"]) for r in (a, b))
        out[f"{name}_draws_shape"] = [list(np.shape(x)) for x in jax.tree.leaves(da)]
        out[f"{name}_max_abs_diff"] = max(
            float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
            for x, y in zip(jax.tree.leaves(da), jax.tree.leaves(db))
        )
        out[f"{name}_chain_ids_equal"] = bool(np.array_equal(a["state"].chain_id, b["state"].chain_id))
        out[f"{name}_acted_equal"] = bool(np.array_equal(a["acted"], b["acted"]))
        out[f"{name}_acted_fraction"] = float(np.mean(np.asarray(b["acted"])))
        out[f"{name}_shifts"] = np.asarray(a["shifts"]).tolist()
        out[f"{name}_finite"] = bool(all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(db)))
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
