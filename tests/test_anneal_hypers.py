"""Hyperparameter inference of jaxsub.anneal against the exact joint posterior over (partition, hypers)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_discrete_matches
from test_anneal import fast_xla_compile  # noqa: F401  (autouse fixture: faster XLA compiles)

import jaxsub.anneal as an
from jaxsub.anneal import exact

DATA = np.array([[0], [0], [2], [1]])
ALPHAS = (0.3, 1.0, 4.0)
DIRS = (0.2, 2.0)


def _joint(prior_kind, discounts):
    """Exact p(partition, alpha, d, beta | X), uniform hyperpriors on the grids, by enumeration."""
    states, logp = [], []
    for z in exact.enumerate_partitions(len(DATA)):
        z = np.asarray(z)
        sizes = np.bincount(z)
        for a, d, b in itertools.product(ALPHAS, discounts, DIRS):
            lp = exact.log_eppf(sizes, a, d)
            lp += sum(
                exact.log_marginal_feature(an.DirichletCategorical(3, b), DATA[z == k, 0]) for k in range(sizes.size)
            )
            states.append((tuple(z), a, d, b))
            logp.append(lp)
    logp = np.asarray(logp)
    p = np.exp(logp - logp.max())
    return states, p / p.sum()


@pytest.mark.parametrize("prior_kind", ["crp", pytest.param("pitman_yor", marks=pytest.mark.slow)])
def test_gibbs_with_hyper_moves_leaves_exact_joint_posterior_invariant(prior_kind):
    discounts = (0.0,) if prior_kind == "crp" else (0.1, 0.5)
    prior = an.CRP(1.0) if prior_kind == "crp" else an.PitmanYor(1.0, 0.1)
    model = an.MixtureModel(prior, [an.DirichletCategorical(3, 1.0)])
    grids = an.HyperGrids(alpha=ALPHAS, discount=None if prior_kind == "crp" else discounts, dirichlet=DIRS)
    states, probs = _joint(prior_kind, discounts)
    index = {s: i for i, s in enumerate(states)}
    num_chains, num_steps = 20000, 9  # hyper moves after steps 4 and 8 (once per N = 4 steps)
    rng = np.random.default_rng(0)
    start = [states[i] for i in rng.choice(len(states), size=num_chains, p=probs)]
    algo = an.collapsed_gibbs(model, DATA, capacity=4, grids=grids)
    z0 = jnp.asarray([s[0] for s in start], jnp.int32)
    st = jax.jit(jax.vmap(algo.init))(z0)
    h = st.mixture.hypers
    a0 = jnp.asarray([s[1] for s in start], jnp.float32)
    d0 = jnp.asarray([s[2] for s in start], jnp.float32)
    b0 = jnp.asarray([s[3] for s in start], jnp.float32)
    h = h._replace(alpha=a0, discount=d0, cat_prior=jnp.repeat(b0[:, None], 3, 1), cat_total=3 * b0[:, None])
    st = st._replace(mixture=st.mixture._replace(hypers=h))

    @jax.jit
    def run(keys, s):
        return jax.lax.scan(lambda c, k: (jax.vmap(algo.step)(k, c)[0], None), s, keys)[0]

    keys = jax.random.split(jax.random.key(7), num_steps * num_chains).reshape(num_steps, num_chains)
    out = run(keys, st)
    z = np.asarray(out.mixture.assignments)
    a = np.asarray(out.mixture.hypers.alpha)
    d = np.asarray(out.mixture.hypers.discount)
    b = np.asarray(out.mixture.hypers.cat_prior[:, 0])
    snap = lambda v, g: float(np.asarray(g)[np.argmin(np.abs(np.asarray(g) - v))])  # noqa: E731
    draws = [
        index[(exact.canonical_labels(z[c]), snap(a[c], ALPHAS), snap(d[c], discounts), snap(b[c], DIRS))]
        for c in range(num_chains)
    ]
    assert_discrete_matches(np.asarray(draws), probs)
    # the hyperparameters actually moved (else the test is vacuous)
    assert np.mean(a != np.asarray(a0)) > 0.3 and np.mean(b != np.asarray(b0)) > 0.2


def test_hyper_moves_wait_for_hyper_min_rows():
    """No hyper step while the subsample is below hyper_min_rows (the quickstart's runaway alpha)."""
    x = np.random.default_rng(0).integers(0, 3, size=(60, 2))
    model = an.MixtureModel(an.CRP(1.0), [an.DirichletCategorical(3), an.DirichletCategorical(3)])
    sched = an.sequential_gibbs(60, 60)  # adds only: no cycle completes, so the one hyper step is the first due one
    cache = an.SweepCache()
    grids = an.HyperGrids(alpha=(0.3, 1.0, 3.0, 30.0))
    frozen = an.fit(
        jax.random.key(0),
        x,
        model,
        sched,
        num_chains=4,
        hyper_min_rows=61,
        capacity=64,
        grids=grids,
        num_checkpoints=1,
        span=60,
        cache=cache,
    )
    np.testing.assert_array_equal(frozen.trace.alpha, 1.0)
    moved = an.fit(
        jax.random.key(0),
        x,
        model,
        sched,
        num_chains=4,
        hyper_min_rows=0,
        capacity=64,
        grids=grids,
        num_checkpoints=1,
        span=60,
        cache=cache,
    )
    assert np.any(moved.trace.alpha != 1.0)  # negative control: without the gate alpha moves
    with pytest.raises(ValueError, match="hyper_min_rows"):
        an.fit(jax.random.key(0), x, model, sched, hyper_min_rows=-1)


def test_sweep_growth_runs_the_hyper_step_as_the_subsample_grows():
    """``fit(sweep_growth=g)`` (mixture): ``linear_anneal(N, N)`` only adds rows and never completes a cycle, so
    without ``g`` the hyper step runs once, at ``hyper_min_rows`` (``state.swept`` 20, 44 adds since); with
    ``g = 2`` also at 40 of 64 rows (24 since), and alpha then differs. With >= 2 assignments per added row (3N)
    a cycle completes first: the same states with and without it. Bad ``sweep_growth`` raises."""
    n = 64
    x = np.random.default_rng(3).integers(0, 3, size=(n, 2))
    model = an.MixtureModel(an.CRP(1.0), [an.DirichletCategorical(3), an.DirichletCategorical(3)])
    grids = an.HyperGrids(alpha=(0.3, 1.0, 3.0, 30.0))
    expect = {0.0: (20, 44), 2.0: (40, 24)}  # (swept, since_hyper) after 64 adds
    caches = {g: an.SweepCache() for g in expect}
    ones = {}
    for g, (swept, since) in expect.items():
        r = an.fit(
            jax.random.key(1),
            x,
            model,
            an.linear_anneal(n, n),
            num_chains=4,
            hyper_min_rows=20,
            capacity=64,
            grids=grids,
            num_checkpoints=1,
            span=n,
            cache=caches[g],
            sweep_growth=g,
        )
        np.testing.assert_array_equal(np.asarray(r.state.swept), swept)
        np.testing.assert_array_equal(np.asarray(r.state.since_hyper), since)
        ones[g] = np.asarray(r.state.mixture.hypers.alpha)
    assert np.any(ones[0.0] != ones[2.0])  # the extra step at 40 rows drew alpha again
    three = [
        an.fit(
            jax.random.key(2),
            x,
            model,
            an.linear_anneal(n, 3 * n),
            num_chains=4,
            hyper_min_rows=20,
            capacity=64,
            grids=grids,
            num_checkpoints=1,
            span=n,
            cache=caches[g],
            sweep_growth=g,
        ).state
        for g in expect
    ]
    jax.tree.map(np.testing.assert_array_equal, three[0], three[1])
    for bad in (1.0, 0.5, -2.0, float("inf"), True, "2"):
        with pytest.raises(ValueError, match="sweep_growth"):
            an.fit(jax.random.key(0), x, model, an.linear_anneal(n, n), sweep_growth=bad)
