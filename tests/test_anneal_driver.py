"""Tests of jaxsub.anneal's driver: compact labels, per-row held-out scores, convergence diagnostics, no caches."""

from __future__ import annotations

import ast
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_anneal import fast_xla_compile  # noqa: F401  (autouse fixture: faster XLA compiles)

import jaxsub.anneal as an

BIN = an.MixtureModel(an.CRP(1.0), [an.BetaBernoulli(0.5, 0.5)] * 6)


def two_blocks(n, seed=0):
    """Two well separated binary clusters (rows of mostly ones / mostly zeros)."""
    rng = np.random.default_rng(seed)
    truth = np.arange(n) % 2
    p = np.where(truth[:, None] == 1, 0.9, 0.1)
    return (rng.random((n, 6)) < p).astype(int), truth


def test_compact_labels_relabel_by_first_appearance_and_keep_partitions():
    z = np.array([[5, 2, 5, -1, 7, 2], [0, 0, 3, 3, -1, 1]])
    out = an.compact_labels(z)
    np.testing.assert_array_equal(out, [[0, 1, 0, -1, 2, 1], [0, 0, 1, 1, -1, 2]])
    # same partition <=> same compact labels
    np.testing.assert_array_equal(an.compact_labels([3, 3, 9]), an.compact_labels([1, 1, 0]))
    assert not np.array_equal(an.compact_labels([3, 3, 9]), an.compact_labels([3, 9, 9]))


def test_fit_returns_compact_labels_and_per_row_heldout():
    x, _ = two_blocks(120)
    train, test = x[:100], x[100:]
    res = an.fit(
        jax.random.key(0),
        train,
        BIN,
        an.linear_anneal(100, 300),
        num_chains=3,
        test_data=test,
        capacity=16,
        num_checkpoints=2,
        grids=None,
    )
    z = np.asarray(res.state.mixture.assignments)
    for c in range(3):
        k = int(res.trace.num_clusters[-1, c])
        assert sorted(np.unique(res.labels[c]).tolist()) == list(range(k))
        np.testing.assert_array_equal(res.labels[c], an.compact_labels(z[c]))
    assert res.heldout_rows.shape == (3, 20)
    np.testing.assert_allclose(res.heldout_rows.sum(axis=1), res.trace.heldout[-1], rtol=1e-5)
    # the per-row score is the log of the posterior predictive mixture, computed here in NumPy
    from scipy.special import logsumexp

    st = jax.tree.map(lambda a: a[0], res.state.mixture)
    sizes = np.asarray(st.sizes, np.float64)
    occ = sizes > 0
    alpha = float(st.hypers.alpha)
    pc = np.asarray(st.hypers.cat_prior, np.float64).reshape(6, 2)
    counts = np.asarray(st.cat_counts, np.float64).reshape(-1, 6, 2)
    ref = []
    for row in test:
        lp = np.log(
            np.take_along_axis(pc[None] + counts, row[None, :, None], 2)[..., 0] / (pc.sum(1)[None] + sizes[:, None])
        ).sum(1)
        w = np.where(occ, sizes, 0.0)
        w[np.argmax(~occ)] = alpha
        ref.append(logsumexp(lp[w > 0] + np.log(w[w > 0])) - np.log(sizes.sum() + alpha))
    np.testing.assert_allclose(res.heldout_rows[0], ref, rtol=1e-4, atol=1e-4)


def _gibbs_from(z0, n, ticks):
    return an.Schedule(np.full(ticks, an.GIBBS, np.int8), n, initial_size=n, name="gibbs")


def test_diagnose_flags_a_stuck_single_cluster_chain_and_not_healthy_ones():
    x, truth = two_blocks(200, seed=1)
    train, test = x[:160], x[160:]
    model = an.MixtureModel(an.CRP(1e-6), [an.BetaBernoulli(0.5, 0.5)] * 6)  # opening a cluster ~impossible
    z0 = np.stack([truth[:160]] * 3 + [np.zeros(160, int)])  # chain 3 starts (and stays) in one cluster
    res = an.fit(
        jax.random.key(3),
        train,
        model,
        _gibbs_from(z0, 160, 160 * 8),
        num_chains=4,
        grids=None,
        initial_assignments=z0,
        test_data=test,
        capacity=4,
        num_checkpoints=8,
    )
    assert res.trace.num_clusters[-1, 3] == 1 and np.all(res.trace.num_clusters[-1, :3] == 2)
    d = an.diagnose(res.trace, num_test_rows=40)
    assert d.stuck.tolist() == [False, False, False, True], d.message
    assert not d.converged and d.rhat_num_clusters == float("inf")
    assert "stuck chains [3]" in d.message
    # negative control: the three healthy chains alone pass
    healthy = an.FitTrace(*[(f[:, :3] if isinstance(f, np.ndarray) and f.ndim == 2 else f) for f in res.trace])
    d3 = an.diagnose(healthy, num_test_rows=40)
    assert not d3.stuck.any(), d3.message


def test_diagnose_rhat_matches_blackjax_and_validates():
    from blackjax.diagnostics import potential_scale_reduction

    rng = np.random.default_rng(0)
    k, c = 20, 4
    vals = rng.normal(size=(k, c))
    tr = an.FitTrace(
        tick=np.zeros((k, c)),
        num_assigned=np.zeros((k, c)),
        num_clusters=rng.integers(1, 5, (k, c)),
        log_joint=vals,
        heldout=vals * 2,
        alpha=np.ones((k, c)),
        discount=np.zeros((k, c)),
        seconds=np.arange(k, dtype=float),
        compile_seconds=0.0,
        capacity=np.full(k, 8),
    )
    d = an.diagnose(tr, window=1.0)
    np.testing.assert_allclose(d.rhat_log_joint, float(potential_scale_reduction(jnp.asarray(vals.T))), rtol=1e-5)
    with pytest.raises(ValueError, match="window"):
        an.diagnose(tr, window=0.0)
    one = tr._replace(num_clusters=tr.num_clusters[:, :1], log_joint=vals[:, :1], heldout=vals[:, :1])
    with pytest.raises(ValueError, match="2 chains"):
        an.diagnose(one)


def test_no_module_level_caches_and_gibbs_init_needs_no_default_key():
    root = Path(an.__file__).parent
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(
                getattr(node, "value", None), (ast.Dict, ast.DictComp)
            ):
                pytest.fail(f"module-level dict in {path.name}:{node.lineno}")
        assert "random.key(0) if" not in path.read_text(), path.name  # no default key
    x = np.column_stack([np.arange(8) % 3, np.arange(8) % 2])
    model = an.MixtureModel(an.CRP(1.0), [an.DirichletCategorical(3), an.BetaBernoulli()])
    algo = an.collapsed_gibbs(model, x, capacity=8)
    st = jax.jit(algo.init)(jnp.zeros(8, jnp.int32))
    st2, info = jax.jit(algo.step)(jax.random.key(1), st)
    assert int(st2.num_assigned) == 8
    kernel = an.build_kernel(model)
    st3, _ = jax.jit(kernel)(jax.random.key(1), st, an.encode(model, x))
    np.testing.assert_array_equal(st3.mixture.assignments, st2.mixture.assignments)


def test_mixture_init_rejects_bad_labels_shapes_and_data():
    """``init`` (and the ``collapsed_gibbs`` init built on it) checks concrete labels and data as ``fit`` does."""
    x = np.column_stack([np.arange(6) % 3, np.linspace(-1.0, 1.0, 6)])
    model = an.MixtureModel(an.CRP(1.0), [an.DirichletCategorical(3), an.NormalInverseChiSquared()])
    enc = an.encode(model, x)
    ok = an.init(jnp.zeros(6, jnp.int32), model, enc, 4)
    assert int(ok.num_assigned) == 6
    with pytest.raises(ValueError, match=r"position must hold labels in \[-1, 4\); got 4"):
        an.init(jnp.asarray([0, 1, 2, 3, 4, 0]), model, enc, 4)
    with pytest.raises(ValueError, match=r"position must hold labels in \[-1, 4\); got -2"):
        an.init(np.asarray([0, 1, -2, 0, 0, 0]), model, enc, 4)
    with pytest.raises(ValueError, match=r"position must have shape \[6\]"):
        an.init(jnp.zeros(5, jnp.int32), model, enc, 4)
    with pytest.raises(ValueError, match="position must hold integer labels"):
        an.init(np.full(6, 0.5), model, enc, 4)
    with pytest.raises(ValueError, match="data.real must be finite; found 1 NaN"):
        an.init(None, model, enc._replace(real=enc.real.at[2, 0].set(jnp.nan)), 4)
    with pytest.raises(ValueError, match=r"data.cat must hold labels in \[0, 3\)"):
        an.init(None, model, enc._replace(cat=enc.cat.at[0, 0].set(7)), 4)
    with pytest.raises(ValueError, match="capacity must be"):
        an.init(None, model, enc, 0)
    with pytest.raises(ValueError, match="'fifo' must be None"):
        an.init(jnp.asarray([0, 0, -1, -1, -1, -1]), model, enc, 4, policy="fifo", rng_key=jax.random.key(0))
    algo = an.collapsed_gibbs(model, x, capacity=4)
    with pytest.raises(ValueError, match="position must hold labels"):
        algo.init(jnp.full(6, 9, jnp.int32))
    traced = jax.jit(algo.init)(jnp.zeros(6, jnp.int32))  # a traced position passes (checked before tracing)
    assert int(traced.num_assigned) == 6


def test_crosscat_init_rejects_bad_labels_shapes_and_data():
    """``crosscat.init`` checks ``view_of``, ``z`` and the encoded data (named ``ValueError``s)."""
    from jaxsub.anneal import crosscat as cc

    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), (an.BetaBernoulli(), an.NormalInverseChiSquared()))
    enc = cc.encode_table(model, np.asarray([[0, 0.5], [1, np.nan], [1, -0.3]]))
    z = np.full((3, 3), -1)
    z[0] = [0, 1, 0]
    st = cc.init(model, enc, 4, view_of=np.zeros(2, np.int32), z=z)
    assert int(st.num_assigned) == 3
    with pytest.raises(ValueError, match=r"z must hold labels in \[-1, 4\); got 4"):
        cc.init(model, enc, 4, z=np.where(z == 1, 4, z))
    with pytest.raises(ValueError, match=r"z must have shape \[3, 3\]"):
        cc.init(model, enc, 4, z=z[:2])
    with pytest.raises(ValueError, match=r"view_of must hold labels in \[0, 3\); got 3"):
        cc.init(model, enc, 4, view_of=np.asarray([0, 3]))
    with pytest.raises(ValueError, match=r"view_of must have shape \[2\]"):
        cc.init(model, enc, 4, view_of=np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="data.real must be finite"):
        cc.init(model, enc._replace(real=enc.real.at[0, 0].set(jnp.inf)), 4)
    with pytest.raises(ValueError, match=r"data.cat must hold labels in \[-1, 2\)"):
        cc.init(model, enc._replace(cat=enc.cat.at[0, 0].set(2)), 4)
    with pytest.raises(ValueError, match="num_aux must be"):
        cc.init(model, enc, 4, num_aux=0)
    with pytest.raises(ValueError, match="'fifo' must assign no row or every row"):
        cc.init(model, enc, 4, z=np.where(np.arange(3) == 2, -1, z), policy="fifo", rng_key=jax.random.key(0))


def test_fit_options_are_validated_before_any_compile():
    """``FitOptions`` (record or keyword overrides) of both drivers: unknown names, bad records, bad values."""
    from jaxsub.anneal import crosscat as cc

    x = np.column_stack([np.arange(6) % 3, np.arange(6) % 2])
    model = an.MixtureModel(an.CRP(1.0), [an.DirichletCategorical(3), an.BetaBernoulli()])
    sched = an.linear_anneal(6, 12)
    key = jax.random.key(0)
    with pytest.raises(TypeError, match="unexpected option"):
        an.fit(key, x, model, sched, bogus=1)
    with pytest.raises(ValueError, match="options must be a jaxsub.anneal.FitOptions"):
        an.fit(key, x, model, sched, options=cc.FitOptions())
    with pytest.raises(ValueError, match="checkpoint_every must be"):
        an.fit(key, x, model, sched, options=an.FitOptions(checkpoint_every=0))
    with pytest.raises(ValueError, match="num_chains must be"):
        an.fit(key, x, model, sched, options=an.FitOptions(num_chains=2), num_chains=0)  # the override wins
    with pytest.raises(ValueError, match="sweep_growth must be"):
        an.fit(key, x, model, sched, sweep_growth=0.5)
    cmodel = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), (an.DirichletCategorical(3), an.BetaBernoulli()))
    with pytest.raises(TypeError, match="unexpected option"):
        cc.fit(key, x, cmodel, sched, initial_assignments=None)
    with pytest.raises(ValueError, match="hyper_widths must be strictly increasing"):
        cc.fit(key, x, cmodel, sched, options=cc.FitOptions(hyper_widths=(8, 4)))
    with pytest.raises(ValueError, match="time_budget must be"):
        cc.fit(key, x, cmodel, sched, time_budget=-1.0)
    with pytest.raises(ValueError, match="feature_moves must be a bool"):
        cc.fit(key, x, cmodel, sched, feature_moves=1)
    assert an.FitOptions().num_checkpoints == 10 and cc.FitOptions().sweep_growth == 2.0
