"""Tests of jaxsub.anneal.crosscat: exact invariance by enumeration, the new-view MH ratio, missing cells, errors."""

from __future__ import annotations

import functools
import itertools
import math
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_discrete_matches
from scipy import integrate
from test_anneal import _while_bodies, fast_xla_compile  # noqa: F401  (autouse fixture)

import jaxsub.anneal as an
from jaxsub.anneal import crosscat as cc
from jaxsub.anneal import exact
from jaxsub.anneal.crosscat import copy_avoidance, score_cache
from jaxsub.anneal.crosscat import hypers as cc_hypers
from jaxsub.anneal.crosscat import partitions as cc_partitions
from jaxsub.anneal.crosscat import rows as cc_rows
from jaxsub.anneal.crosscat import scores as cc_scores
from jaxsub.anneal.crosscat import views as cc_views

FEATS = (an.DirichletCategorical(3, 0.5), an.BetaBernoulli(0.5, 0.5), an.NormalInverseChiSquared(0.0, 1.0, 2.0, 1.0))
DATA = np.array([[0, 1, -1.0], [0, 1, np.nan], [2, 0, 1.2], [2, np.nan, 1.5]])


def _model(kind):
    if kind == "crp":
        return cc.CrossCatModel(an.CRP(0.8), an.CRP(1.2), FEATS)
    return cc.CrossCatModel(an.PitmanYor(0.8, 0.3), an.PitmanYor(1.2, 0.25), FEATS)


def _ref_log_joint(model, view_part, row_parts, data=DATA):
    """NumPy log p(view partition, row partitions, X) with missing cells dropped."""
    vp, rp = model.view_prior, model.row_prior
    vsizes = np.bincount(view_part)
    lp = exact.log_eppf(vsizes, vp.alpha, vp.discount)
    for v in range(vsizes.size):
        z = np.asarray(row_parts[v])
        lp += exact.log_eppf(np.bincount(z), rp.alpha, rp.discount)
        for f in np.flatnonzero(np.asarray(view_part) == v):
            for k in range(z.max() + 1):
                col = data[z == k, f]
                col = col[~np.isnan(col)]
                if col.size:
                    lp += exact.log_marginal_feature(model.features[f], col)
    return lp


@functools.cache
def _enumerate(model):
    n, F = DATA.shape
    parts = list(exact.enumerate_partitions(n))
    states, logp = [], []
    for vp in exact.enumerate_partitions(F):
        K = max(vp) + 1
        for rows in itertools.product(range(len(parts)), repeat=K):
            states.append((vp, rows))
            logp.append(_ref_log_joint(model, vp, [parts[i] for i in rows]))
    logp = np.asarray(logp)
    p = np.exp(logp - logp.max())
    return parts, states, p / p.sum()


def _batch_states(model, parts, states, idx, capacity=4):
    enc = cc.encode_table(model, DATA)
    F = DATA.shape[1]
    V = F + 1
    vo = np.asarray([states[i][0] for i in idx], np.int32)
    z = np.full((len(idx), V, DATA.shape[0]), -1, np.int32)
    for c, i in enumerate(idx):
        for v, r in enumerate(states[i][1]):
            z[c, v] = parts[r]
    return enc, _batched_init(model, capacity)(jnp.asarray(vo), jnp.asarray(z))


@functools.cache
def _batched_init(model, capacity):
    """One compiled batched ``init`` per model (shared by the tests on DATA)."""
    enc = cc.encode_table(model, DATA)
    return jax.jit(jax.vmap(lambda a, b: cc.init(model, enc, capacity, view_of=a, z=b)))


def _observe(parts, st):
    """Marginal observable: (feature partition, row partition of feature 0's view)."""
    vo = np.asarray(st.view_of)
    z = np.asarray(st.z)
    vp_index = {p: i for i, p in enumerate(exact.enumerate_partitions(DATA.shape[1]))}
    rp_index = {p: i for i, p in enumerate(parts)}
    out = []
    for c in range(vo.shape[0]):
        a = vp_index[exact.canonical_labels(vo[c])]
        b = rp_index[exact.canonical_labels(z[c, vo[c, 0]])]
        out.append(a * len(parts) + b)
    return np.asarray(out)


def _exact_observable(parts, states, probs):
    P = len(parts)
    out = np.zeros(5 * P)
    vp_index = {p: i for i, p in enumerate(exact.enumerate_partitions(DATA.shape[1]))}
    for (vp, rows), p in zip(states, probs):
        out[vp_index[tuple(vp)] * P + rows[vp[0]]] += p
    return out


@pytest.mark.parametrize("kind", ["crp", pytest.param("pitman_yor", marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "move",
    [
        "rows",
        pytest.param("feature_gibbs", marks=pytest.mark.slow),
        pytest.param("new_view_mh", marks=pytest.mark.slow),
        "feature_sweep",
    ],
)
def test_every_move_leaves_exact_crosscat_posterior_invariant(kind, move):
    """3 features x 4 rows (one missing cell in two columns): start at exact draws, apply a move, chi-square.

    ``feature_gibbs`` and ``new_view_mh`` alone are slow-only (``feature_gibbs`` moved there to pay for the
    FIFO tests): the fast suite checks their composition in ``feature_sweep`` (the path ``fit`` runs:
    Algorithm 8 then the MH for every feature) by the same chi-square, and the MH acceptance ratio against
    the direct formula (two tests below)."""
    model = _model(kind)
    parts, states, probs = _enumerate(model)
    assert len(states) == 15 + 3 * 15**2 + 15**3
    num = 20000
    idx = np.random.default_rng(1).choice(len(states), size=num, p=probs)
    enc, st = _batch_states(model, parts, states, idx)

    def step(key, s, trip):
        if move == "feature_sweep":  # all partitions pre-drawn in one loop (unbatched trip, as in build_sweep)
            return cc.feature_sweep(key, s, model=model, data=enc, trip=trip)[0]
        if move == "rows":  # 4 full-data Gibbs ticks in every view (one traced tick in a loop: one small compile)

            def one(t, s):
                u = cc.tick_words(jax.random.fold_in(key, t), s.z.shape[0])
                return cc.row_tick(u, s, an.GIBBS, 1.0, model=model, data=enc)[0]

            return jax.lax.fori_loop(0, 4, one, s)
        mv = cc.feature_gibbs if move == "feature_gibbs" else cc.new_view_mh

        def cat(j, s):  # features 0 and 1 (the categorical ones) through one traced body: (kind 0, j)
            return mv(jax.random.fold_in(key, j), s, (0, j), model=model, data=enc)[0]

        s = jax.lax.fori_loop(0, 2, cat, s)
        return mv(jax.random.fold_in(key, 2), s, (1, jnp.int32(0)), model=model, data=enc)[0]  # feature 2 (real)

    out = jax.jit(jax.vmap(step, in_axes=(0, 0, None)))(
        jax.random.split(jax.random.key(2), num), st, jnp.int32(DATA.shape[0])
    )
    assert not np.any(np.asarray(out.halted))
    draws = _observe(parts, out)
    assert_discrete_matches(draws, _exact_observable(parts, states, probs))
    before = _observe(parts, st)
    assert np.mean(draws != before) > 0.1  # the move actually moved


def test_feature_sweep_on_the_subsample_window_only_leaves_the_exact_posterior_invariant():
    """``feature_sweep(width=w)`` (the moves on the first ``w`` rows of the subsample window, :func:`~jaxsub.anneal.crosscat.features._compact`):
    the 4 rows of DATA are the assigned subsample of a 7-row table (rows 0, 2, 3, 5; rows 1, 4, 6 unassigned,
    with other values and a missing cell), ``w = 5 < N = 7`` (one unassigned row inside the window): starting from
    exact draws, the (feature partition, row partition of feature 0's view) of the assigned rows is still the
    enumerated exact posterior (chi-square; CRP), the unassigned rows stay unassigned, the statistics equal a
    rebuild from the labels, and the move moved. ``w < num_assigned`` is flagged not ok."""
    model = _model("crp")
    parts, states, probs = _enumerate(model)
    num = 20000
    idx = np.random.default_rng(5).choice(len(states), size=num, p=probs)
    inside = np.asarray([0, 2, 3, 5])
    table = np.full((7, 3), np.nan)
    table[inside] = DATA
    table[[1, 4, 6]] = [[1, 0, 3.0], [2, np.nan, -2.0], [0, 1, 0.5]]
    enc = cc.encode_table(model, table)
    V = DATA.shape[1] + 1
    vo = np.asarray([states[i][0] for i in idx], np.int32)
    z = np.full((num, V, 7), -1, np.int32)
    for c, i in enumerate(idx):
        for v, r in enumerate(states[i][1]):
            z[c, v, inside] = parts[r]
    init_b = jax.jit(jax.vmap(lambda a, b: cc.init(model, enc, 4, view_of=a, z=b)))
    st = init_b(jnp.asarray(vo), jnp.asarray(z))
    assert np.all(np.asarray(st.order[0, :4]) == inside) and np.all(np.asarray(st.num_assigned) == 4)
    out, ok = jax.jit(jax.vmap(lambda k, s: cc.feature_sweep(k, s, model=model, data=enc, trip=jnp.int32(4), width=5)))(
        jax.random.split(jax.random.key(6), num), st
    )
    assert np.all(np.asarray(ok)) and not np.any(np.asarray(out.halted))
    zo = np.asarray(out.z)
    assert np.all(zo[:, :, [1, 4, 6]] == -1)
    np.testing.assert_array_equal(np.asarray(out.order), np.asarray(st.order))
    sub = out._replace(z=out.z[:, :, inside])
    draws = _observe(parts, sub)
    assert_discrete_matches(draws, _exact_observable(parts, states, probs))
    assert np.mean(draws != _observe(parts, st._replace(z=st.z[:, :, inside]))) > 0.1
    ref = init_b(out.view_of, out.z)  # statistics of every moved state = a rebuild from its labels
    np.testing.assert_array_equal(np.asarray(out.cat_counts), np.asarray(ref.cat_counts))
    np.testing.assert_allclose(np.asarray(out.real_stats), np.asarray(ref.real_stats), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.sizes), np.asarray(ref.sizes))
    one = jax.tree.map(lambda a: a[0], st)
    assert not bool(jax.jit(lambda s: cc.feature_sweep(jax.random.key(0), s, model=model, data=enc, width=3)[1])(one))
    with pytest.raises(ValueError, match="feature_widths"):
        cc.fit(jax.random.key(0), table, model, an.linear_anneal(7, 14), feature_widths=(4, 2))


def _handful_np(z_v, r, block):
    """Rows moved with ``r`` in one view: the first ``block`` members of its cluster in cyclic order from ``r``."""
    n = z_v.size
    cyc = [(r + i) % n for i in range(n)]
    return [i for i in cyc if z_v[i] == z_v[r]][:block]


def test_block_tick_moves_the_handful_jointly_from_its_exact_conditional():
    """Anneal Stepsize's block move (PY, 3 features x 4 rows): for fixed states, picked rows and blocks 1, 2, 4,
    the handful of every occupied view (the first ``block`` members of the picked row's cluster in cyclic order)
    moves together, the other rows stay, the statistics equal a rebuild, and the joint destination across views
    follows the exact conditional ``p(dest) ∝ p(views, row partitions with the handful at dest, X)`` (reference
    log joint by enumeration; chi-square). Block 1 is the single-row Gibbs conditional."""
    model = _model("pitman_yor")
    parts, states, probs = _enumerate(model)
    n = DATA.shape[0]
    rng = np.random.default_rng(3)
    cases = []  # (state index, picked row, block)
    for i in rng.choice(len(states), size=4, p=probs):
        for r, b in ((int(rng.integers(n)), 1), (int(rng.integers(n)), 2), (int(rng.integers(n)), 4)):
            cases.append((int(i), r, b))
    enc, st = _batch_states(model, parts, states, [c[0] for c in cases])
    num = 3000
    us = jax.random.bits(jax.random.key(4), (len(cases), num, cc.TICK_WORDS + st.z.shape[1]), jnp.uint32)
    # words 0-1 pick row r exactly: floor(W n / 2^64) = r for W = (r + 1/2) 2^64 / n (high word; low word 0)
    hi = np.asarray([((2 * c[1] + 1) << 31) // n for c in cases], np.uint32)
    us = us.at[:, :, 0].set(jnp.asarray(hi)[:, None]).at[:, :, 1].set(jnp.uint32(0))
    step = jax.jit(
        jax.vmap(jax.vmap(lambda u, s, b: cc.block_tick(u, s, b, model=model, data=enc)[0], in_axes=(0, None, None)))
    )
    out = step(us, st, jnp.asarray([c[2] for c in cases], jnp.int32))
    assert not np.any(np.asarray(out.halted))
    z_out = np.asarray(out.z)
    for c, (i, r, b) in enumerate(cases):
        vp, rows = states[i]
        K = max(vp) + 1
        zs = [np.asarray(parts[rows[v]]) for v in range(K)]
        hands = [_handful_np(zs[v], r, b) for v in range(K)]
        dests, logw = [], []  # per view: destinations (existing labels of the rest, then "new") and log weights
        for v in range(K):
            rest = [j for j in range(n) if j not in hands[v]]
            labels = sorted({int(zs[v][j]) for j in rest})
            dv, lv = [], []
            for dst in labels + [max(zs[v]) + 1]:
                zc = zs[v].copy()
                zc[hands[v]] = dst
                cand = [zs[w] if w != v else np.asarray(exact.canonical_labels(zc)) for w in range(K)]
                dv.append(dst)
                lv.append(_ref_log_joint(model, vp, cand))
            dests.append((labels, rest))
            lv = np.asarray(lv)
            logw.append(np.exp(lv - lv.max()) / np.exp(lv - lv.max()).sum())
        exp_p = logw[0]
        for v in range(1, K):
            exp_p = np.outer(exp_p, logw[v]).ravel()
        draws = np.zeros(num, np.int64)
        for v in range(K):
            labels, rest = dests[v]
            zo = z_out[c, :, v]  # [num, N]: view slot v holds view v of the state (as built)
            h0 = hands[v][0]
            # the handful shares one label and the rest keep their partition
            assert np.all(zo[:, hands[v]] == zo[:, [h0]])
            if rest:
                assert all(exact.canonical_labels(row[rest]) == exact.canonical_labels(zs[v][rest]) for row in zo[:8])
            # destination index: the rest row's original label whose new slot the handful joined, else "new"
            idx = np.full(num, len(labels))
            for li, lab in enumerate(labels):
                j = next(j for j in rest if zs[v][j] == lab)
                idx = np.where(zo[:, h0] == zo[:, j], li, idx)
            draws = draws * (len(labels) + 1) + idx
        assert_discrete_matches(draws, exp_p)
    # statistics and sizes equal a rebuild from the labels (a few draws)
    sub = jax.tree.map(lambda a: a[:, 0], out)
    ref = jax.vmap(lambda a, b: cc.init(model, enc, 4, view_of=a, z=b))(sub.view_of, sub.z)
    np.testing.assert_array_equal(np.asarray(ref.sizes), np.asarray(sub.sizes))
    np.testing.assert_array_equal(np.asarray(ref.cat_counts), np.asarray(sub.cat_counts))
    np.testing.assert_allclose(np.asarray(ref.real_stats), np.asarray(sub.real_stats), atol=1e-5)


@pytest.mark.parametrize("kind", ["crp", "pitman_yor"])
def test_log_joint_matches_reference_with_missing_cells_dropped(kind):
    model = _model(kind)
    parts, states, probs = _enumerate(model)
    idx = np.random.default_rng(0).choice(len(states), size=20)
    enc, st = _batch_states(model, parts, states, idx)
    lj = jax.jit(jax.vmap(lambda s: cc.log_joint(model, s)))
    got = np.asarray(lj(st))
    ref = [_ref_log_joint(model, states[i][0], [parts[r] for r in states[i][1]]) for i in idx]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
    # dropping the missing cells = replacing the rows' other features only: a table without the
    # NaN rows in those columns gives the same per-feature marginals (checked via the reference above,
    # which drops NaN cells); and a fully observed copy differs (negative control)
    filled = np.nan_to_num(DATA, nan=0.0)
    enc2 = cc.encode_table(model, filled)
    st2 = jax.jit(jax.vmap(lambda a, b: cc.init(model, enc2, 4, view_of=a, z=b)))(st.view_of, st.z)
    got2 = np.asarray(lj(st2))
    assert np.all(np.abs(got2 - got) > 1e-3)


def test_new_view_mh_acceptance_matches_direct_formula():
    """log A = log p(x') - log p(x) + log q(x'->x) - log q(x->x') with q including the PY-prior partition draw."""
    model = _model("pitman_yor")
    parts, states, probs = _enumerate(model)
    enc, st = _batch_states(model, parts, states, np.arange(0, len(states), 37))
    rp = model.row_prior
    seen = set()
    num = st.view_of.shape[0]
    lp_before = {}  # reference log joint of each starting state (the same for the three features)
    cat_prop = jax.jit(
        jax.vmap(lambda k, s, j: cc_views._new_view_proposal(k, s, (0, j), model=model, data=enc), in_axes=(0, 0, None))
    )  # features 0 and 1 (categorical): one compile, j traced
    for f in range(3):
        keys = jax.random.split(jax.random.key(f), num)
        props, log_accs, valids = (
            cat_prop(keys, st, jnp.int32(f)) if f < 2 else jax.jit(jax.vmap(partial_proposal(model, enc, f)))(keys, st)
        )
        for c in range(num):
            if not bool(valids[c]):
                continue
            vo0, vo1 = np.asarray(st.view_of[c]), np.asarray(props.view_of[c])
            z0, z1 = np.asarray(st.z[c]), np.asarray(props.z[c])
            if c not in lp_before:
                lp_before[c] = _ref_log_joint(model, exact.canonical_labels(vo0), _rows(vo0, z0))
            lp0 = lp_before[c]
            lp1 = _ref_log_joint(model, exact.canonical_labels(vo1), _rows(vo1, z1))
            K0, K1 = len(set(vo0.tolist())), len(set(vo1.tolist()))
            alone0 = (vo0 == vo0[f]).sum() == 1
            new_part = exact.log_eppf(np.bincount(exact.canonical_labels(z1[vo1[f]])), rp.alpha, rp.discount)
            old_part = exact.log_eppf(np.bincount(exact.canonical_labels(z0[vo0[f]])), rp.alpha, rp.discount)
            if not alone0:  # split: q = p(pi*); reverse merge: 1/2 * 1/K0
                case, lq = "split", -math.log(2 * K0) - new_part
            elif K1 < K0:  # merge: q = 1/2 * 1/(K0 - 1); reverse split draws the old partition
                case, lq = "merge", old_part + math.log(2 * (K0 - 1))
            else:  # refresh: q = 1/2 p(pi*), reverse 1/2 p(pi_old)
                case, lq = "refresh", old_part - new_part
            seen.add(case)
            np.testing.assert_allclose(float(log_accs[c]), lp1 - lp0 + lq, rtol=1e-4, atol=1e-3, err_msg=case)
    assert seen == {"split", "merge", "refresh"}


def test_new_view_mh_acceptance_with_a_proposal_drawn_under_other_hyperparameters():
    """A pre-drawn proposal partition from PY(alpha_q, d_q) != the views' PY(alpha, d) (what feature_sweep does
    for a refresh of a view whose row hypers were resampled): log A = log p(x') - log p(x) + log q(x'->x)
    - log q(x->x') with q's partition density at (alpha_q, d_q); checked for split and refresh."""
    model = _model("pitman_yor")  # target: row PY(1.2, 0.25)
    parts, states, probs = _enumerate(model)
    enc, st = _batch_states(model, parts, states, np.arange(0, len(states), 37))
    a_q, d_q = 3.0, 0.1
    num = st.view_of.shape[0]

    def prop(k, s, f):
        k1, k2 = jax.random.split(k)
        z, sz, ok = cc_partitions._draw_partitions(
            k2, s.order, s.num_assigned, jnp.full((1,), a_q), jnp.full((1,), d_q), s.sizes.shape[1]
        )
        return cc_views._new_view_proposal(
            k1, s, f, model=model, data=enc, fresh=(z[0], sz[0], ok[0], jnp.float32(a_q), jnp.float32(d_q))
        )

    seen = set()
    rp = model.row_prior
    for f in (0,):  # one compile: feature 0 alone or sharing its view gives refresh and split proposals
        props, log_accs, valids = jax.jit(jax.vmap(functools.partial(prop, f=f)))(
            jax.random.split(jax.random.key(10 + f), num), st
        )
        for c in range(num):
            vo0, vo1 = np.asarray(st.view_of[c]), np.asarray(props.view_of[c])
            alone0 = (vo0 == vo0[f]).sum() == 1
            K0, K1 = len(set(vo0.tolist())), len(set(vo1.tolist()))
            if not bool(valids[c]) or (alone0 and K1 < K0):  # merges need no partition draw
                continue
            z0, z1 = np.asarray(st.z[c]), np.asarray(props.z[c])
            lp0 = _ref_log_joint(model, exact.canonical_labels(vo0), _rows(vo0, z0))
            lp1 = _ref_log_joint(model, exact.canonical_labels(vo1), _rows(vo1, z1))
            new_q = exact.log_eppf(np.bincount(exact.canonical_labels(z1[vo1[f]])), a_q, d_q)
            old_q = exact.log_eppf(np.bincount(exact.canonical_labels(z0[vo0[f]])), a_q, d_q)
            case, lq = ("split", -math.log(2 * K0) - new_q) if not alone0 else ("refresh", old_q - new_q)
            seen.add(case)
            np.testing.assert_allclose(float(log_accs[c]), lp1 - lp0 + lq, rtol=1e-4, atol=1e-3, err_msg=case)
            # negative control: without the EPPF correction the ratio is off (proposal and prior differ)
            new_t = exact.log_eppf(np.bincount(exact.canonical_labels(z1[vo1[f]])), rp.alpha, rp.discount)
            assert abs(new_t - new_q) > 1e-3
    assert seen == {"split", "refresh"}


def partial_proposal(model, enc, f):
    return lambda k, s: cc_views._new_view_proposal(k, s, f, model=model, data=enc)


def _rows(vo, z):
    labels = exact.canonical_labels(vo)
    out = {}
    for f, v in enumerate(vo):
        out[labels[f]] = exact.canonical_labels(z[v])
    return [out[k] for k in range(len(out))]


def test_non_uniform_dirichlet_predictive_matches_numerical_integration():
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), (an.DirichletCategorical(3),))
    enc = cc.encode_table(model, np.array([[0.0], [2.0], [2.0]]))
    st = jax.jit(lambda: cc.init(model, enc, 2, z=jnp.zeros((2, 3), jnp.int32)))()  # one compile, not op by op
    beta = np.array([0.3, 1.7, 4.0])
    st = st._replace(hypers=st.hypers._replace(cat_prior=jnp.asarray(beta[None], jnp.float32)))
    c = np.array([1, 0, 2])
    from scipy.stats import beta as beta_dist

    pred = jax.jit(lambda lvl: cc_scores._cat_pred(model, st.hypers, st.cat_counts, lvl)[0, 0])
    for lvl in range(3):
        got = float(pred(jnp.asarray([lvl])))
        a = beta + c  # posterior Dirichlet; its theta_l marginal is Beta(a_l, A - a_l): E[theta_l] by quadrature
        num, _ = integrate.quad(lambda t: t * beta_dist.pdf(t, a[lvl], a.sum() - a[lvl]), 0, 1, epsabs=1e-12, limit=200)
        np.testing.assert_allclose(math.exp(got), num, rtol=1e-4)
    # negative control: the symmetric-concentration predictive (mean pseudo-count) differs
    sym = (beta.mean() + c[0]) / (3 * beta.mean() + c.sum())
    assert abs(math.exp(float(pred(jnp.asarray([0])))) - sym) > 1e-2


def test_bad_tables_and_settings_raise():
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), (an.DirichletCategorical(3), an.NormalInverseChiSquared()))
    with pytest.raises(ValueError, match="entirely missing"):
        cc.encode_table(model, np.array([[0, np.nan], [1, np.nan]]))
    with pytest.raises(ValueError, match="infinite"):
        cc.encode_table(model, np.array([[0, np.inf], [1, 0.0]]))
    with pytest.raises(ValueError, match="outside"):
        cc.encode_table(model, np.array([[3, 0.0], [1, 0.0]]))
    with pytest.raises(ValueError, match="columns"):
        cc.encode_table(model, np.zeros((3, 3)))
    with pytest.raises(ValueError, match="unknown column type"):
        cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), ("real",))
    with pytest.raises(ValueError, match="row_prior"):
        cc.CrossCatModel(an.CRP(1.0), an.Finite((0.5, 0.5)), (an.BetaBernoulli(),))
    with pytest.raises(ValueError, match="grid row_d"):
        cc.CrossCatGrids(row_d=(0.5, 1.0))
    with pytest.raises(ValueError, match="schedule"):
        cc.fit(jax.random.key(0), np.zeros((4, 2)), model, an.Schedule(np.full(4, an.GIBBS), 4, initial_size=4))
    with pytest.raises(ValueError, match="threads"):
        cc.fit(jax.random.key(0), np.zeros((4, 2)), model, an.loom(4), num_chains=3, threads=2)
    with pytest.raises(ValueError, match="rng_key"):
        cc.init(model, cc.encode_table(model, np.zeros((4, 2))), 4, policy="fifo")
    with pytest.raises(ValueError, match="initial_views"):
        cc.fit(jax.random.key(0), np.zeros((4, 2)), model, an.linear_anneal(4, 8), initial_views="random")
    with pytest.raises(ValueError, match="blocks > 1"):  # block Gibbs (Anneal Stepsize) needs the random policy
        cc.fit(
            jax.random.key(0),
            np.zeros((4, 2)),
            model,
            an.Schedule(np.full(4, an.ADD, np.int8), 4, policy="fifo", blocks=np.array([1, 2, 1, 1])),
        )


def test_prior_view_partition_draws_the_view_prior():
    """``fit``'s default start (``initial_views="prior"``): every chain's partition of the features into views is a
    draw from the view prior (CRP and PY, one compiled program). Chi-square of 4,000 draws over the 5 partitions
    of 3 features against the EPPF; labels are in order of first appearance (canonical), so label vectors
    identify partitions."""
    models = (_model("crp"), _model("py"))
    parts = list(exact.enumerate_partitions(3))
    index = {tuple(p): i for i, p in enumerate(parts)}
    keys = jax.random.split(jax.random.key(7), 4000)
    draws = jax.jit(lambda ks: [jax.vmap(lambda k, m=m: cc.prior_view_partition(k, m))(ks) for m in models])(keys)
    for model, d in zip(models, draws):
        vp = model.view_prior
        probs = np.exp([exact.log_eppf(np.bincount(p), vp.alpha, vp.discount) for p in parts])
        assert_discrete_matches([index[tuple(x)] for x in np.asarray(d)], probs / probs.sum())


def test_parallel_crp_partition_draw_matches_the_eppf_and_the_capacity_flag():
    """The feature sweep's loop-free CRP draw (``_draw_crp_partitions``: new-table coins, "join the table of a uniform
    earlier row" pointers resolved by pointer doubling): the partition of the 4 assigned rows of a 6-row table (a
    shuffled ``order``, 2 rows unassigned) follows the CRP EPPF (chi-square over the 15 partitions, 3 x 4,000 draws);
    labels are in order of first appearance along ``order``, unassigned rows -1, ``sizes`` the label counts;
    capacity 2: ``ok`` is exactly "at most 2 tables". Negative control: the sequential rule's "uniform *table*"
    (not row) for joiners gives a different law, rejected by the same check."""
    alpha, m = 1.3, 4  # 6 rows, 4 of them assigned
    order = jnp.asarray([3, 0, 5, 1, 4, 2], jnp.int32)
    parts = list(exact.enumerate_partitions(m))
    index = {tuple(p): i for i, p in enumerate(parts)}
    probs = np.exp([exact.log_eppf(np.bincount(p), alpha, 0.0) for p in parts])
    probs /= probs.sum()
    draw = jax.jit(
        lambda k, cap: cc_partitions._draw_crp_partitions(
            k, order, jnp.asarray(m, jnp.int32), jnp.full((3,), alpha, jnp.float32), cap
        ),
        static_argnums=1,
    )
    z, sizes, ok = jax.vmap(lambda k: draw(k, 8))(jax.random.split(jax.random.key(3), 4000))
    z, sizes, ok = np.asarray(z), np.asarray(sizes), np.asarray(ok)
    assert ok.all()
    lab = z[:, :, np.asarray(order)]  # [draws, P, N] in window order
    assert (lab[:, :, m:] == -1).all() and (lab[:, :, :m] >= 0).all()
    np.testing.assert_array_equal(sizes[..., :m], np.stack([(lab[..., :m] == c).sum(-1) for c in range(m)], -1))
    assert_discrete_matches([index[tuple(x)] for x in lab[:, :, :m].reshape(-1, m)], probs)
    _, _, ok2 = jax.vmap(lambda k: draw(k, 2))(jax.random.split(jax.random.key(3), 4000))
    np.testing.assert_array_equal(np.asarray(ok2), lab[:, :, :m].max(-1) <= 1)  # same keys: same draws
    # negative control: joiners pick a uniform table instead of a uniform earlier row
    rng = np.random.default_rng(0)
    wrong = []
    for _ in range(4000):
        x = [0]
        for i in range(1, m):
            k = max(x) + 1
            x.append(k if rng.random() * (i + alpha) < alpha else int(rng.integers(k)))
        wrong.append(index[tuple(x)])
    with pytest.raises(AssertionError):
        assert_discrete_matches(wrong, probs)


@pytest.mark.parametrize("feature_moves", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_row_tick_jit_vmap_sweep_equals_ticks_without_copies_and_queries(feature_moves):
    """jit == vmap; the sweep traces once, equals tick-by-tick ``row_tick`` (same uniforms) and, inside its
    loop, never copies the [chains, V, N] labels or the [chains, N] order (O(1) per tick in N)."""
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), FEATS)
    data6 = np.vstack([DATA, [[1, 0, 0.3], [0, 1, np.nan]]])  # N = 6: no other int array has that shape
    enc = cc.encode_table(model, data6)
    n, V = data6.shape[0], 4
    tick = jax.jit(lambda u, s, c: cc.row_tick(u, s, c, 1.0, model=model, data=enc)[0])
    st = jax.jit(lambda: cc.init(model, enc, 7))()  # capacity 7 > N, as the sweep's states below (one tick compile)
    u = cc.tick_words(jax.random.key(0), V)
    a = tick(u, st, an.ADD)
    b = jax.jit(jax.vmap(tick, in_axes=(0, 0, None)))(u[None], jax.tree.map(lambda x: x[None], st), an.ADD)
    chex.assert_trees_all_equal(a, jax.tree.map(lambda x: x[0], b))
    assert int(a.num_assigned) == 1 and int((np.asarray(a.z)[0] >= 0).sum()) == 1
    traces = []
    span = 5
    sweep = cc.build_sweep(model, span=span, feature_moves=feature_moves)

    def counted(*args):
        traces.append(1)
        return sweep(*args)

    # capacity 7 > N: no prior-partition draw of the feature moves can run out of slots (such a draw halts the chain)
    states0 = jax.jit(jax.vmap(lambda _: cc.init(model, enc, 7)))(jnp.arange(3))
    keys = jax.random.split(jax.random.key(1), 3)
    codes = an.linear_anneal(n, 2 * n).codes
    w = jnp.asarray(an.sweep.schedule_windows(codes, np.asarray(states0.cursor), span))
    # one executable serves every window (same shapes whatever the cursor) and gives the compiled HLO below
    jitted = jax.jit(counted).lower(states0, keys, w, enc).compile()
    states = states0
    for _ in range(3):
        w = jnp.asarray(an.sweep.schedule_windows(codes, np.asarray(states.cursor), span))
        states = jitted(states, keys, w, enc)
    assert len(traces) == 1 and np.all(np.asarray(states.num_assigned) == n)
    if not feature_moves:  # the scan with deferred writes == the ticks one by one with writes applied at once
        for c in range(3):
            ref = jax.tree.map(lambda x: x[c], states0)
            for t in range(len(codes)):
                ref = tick(cc.tick_words(jax.random.fold_in(keys[c], t), V), ref, jnp.int32(codes[t]))
            got = jax.tree.map(lambda x: x[c], states)
            chex.assert_trees_all_close(ref.real_stats, got.real_stats, rtol=1e-6, atol=1e-6)  # float sums
            chex.assert_trees_all_equal(ref._replace(real_stats=got.real_stats), got)
        hlo = jitted.as_text()
        bodies = _while_bodies(hlo)
        assert bodies
        for body in bodies:
            assert not re.search(rf"s32\[3,{V},{n}\]\{{[^}}]*\}} copy\(", body), "per-tick copy of the labels"
            assert not re.search(rf"s32\[3,{n}\]\{{[^}}]*\}} copy\(", body), "per-tick copy of the order"
    s0 = jax.tree.map(lambda x: x[0], states)

    @jax.jit
    def queries(s):
        return cc.heldout_rows(model, s, enc), cc.predictive_samples(jax.random.key(2), model, s, 50)

    rows, draws = queries(s0)
    assert rows.shape == (n,) and np.all(np.isfinite(np.asarray(rows)))
    assert draws.shape == (50, 3) and set(np.unique(np.asarray(draws[:, 1]))) <= {0.0, 1.0}
    dep = cc.depends_on(states.view_of)
    assert dep.shape == (3, 3) and np.all(np.diag(dep) == 1)


def test_row_score_cache_carried_through_ticks_equals_the_one_rebuilt_from_the_statistics():
    """The sweep carries per-cluster predictive terms (categorical cell counts, NIX Student-t parameters) and
    updates them at the clusters each tick touches: after many anneal ticks (adds, removes, missing cells,
    4 views) they equal the ones rebuilt from the state's statistics."""
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), FEATS)
    enc = cc.encode_table(model, DATA)
    codes = jnp.asarray(an.linear_anneal(DATA.shape[0], 40).codes, jnp.int32)

    @jax.jit
    def run(view_of):
        s = cc.init(model, enc, 4, view_of=view_of)

        def body(t, carry):
            s, cache = carry
            u = cc.tick_words(jax.random.fold_in(jax.random.key(5), t), s.z.shape[0])
            s, w, _, cache = cc_rows._row_plan(u, s, codes[t], 1.0, model=model, data=enc, cache=cache)
            return copy_avoidance._apply_row_writes(s, w), cache

        return jax.lax.fori_loop(0, codes.shape[0], body, (s, score_cache._score_cache(s)))

    for view_of in ([0, 0, 0], [0, 1, 2], [1, 0, 1]):
        s, cache = run(jnp.asarray(view_of, jnp.int32))
        assert int(s.num_assigned) == DATA.shape[0] and not bool(s.halted)
        cache = score_cache._fresh_cache(
            s, cache
        )  # the last add's NIX cluster is refreshed lazily (with the next removal)
        ref = score_cache._score_cache(s)
        chex.assert_trees_all_equal(cache.cat_n, ref.cat_n)
        chex.assert_trees_all_close(cache.real, ref.real, rtol=1e-5, atol=1e-5)
    # the cached Student-t predictive parameters give the NIX marginal ratio p(X + x) / p(X) (Murphy 2007, eq. 171)
    from jaxsub.anneal import mixture as mx

    nix = jnp.asarray([0.3, 0.7, 1.5, 2.0])
    for vals in ([], [1.2], [0.1, -2.0, 3.5, 0.4]):
        v = np.asarray(vals, np.float32)
        stats = jnp.asarray([len(v), v.sum(), (v * v).sum()], jnp.float32)
        lm = lambda w: mx.nix_log_marginal(nix, jnp.asarray([len(w)]), jnp.asarray([[w.sum(), (w * w).sum()]]))  # noqa: E731
        for x in (-1.0, 0.5, 4.0):
            got = cc_scores._t_logpdf(
                cc_scores._nix_pred_params(nix, stats)[None, None], jnp.asarray([x]), jnp.asarray([True])
            )
            want = lm(np.append(v, np.float32(x))) - lm(v)
            np.testing.assert_allclose(float(got[0, 0]), float(want), rtol=0, atol=2e-4)


@pytest.mark.parametrize("capacity, labels", [(4, [0, 0, 0, 1, 2, 1]), (12, [0, 0, 0, 10, 5, 10])])
def test_hyper_grid_gibbs_matches_exact_conditionals(capacity, labels):
    """Per-level Dirichlet pseudo-count and the row alpha: draws follow the enumerated grid conditionals.
    Capacity 12 with clusters in slots 0, 5, 10: the Dirichlet loop runs on the 8 largest slots only
    (``HYPER_WIDTHS``), which must hold the occupied ones wherever they sit."""
    assert (capacity > min(cc_hypers.HYPER_WIDTHS)) == (capacity == 12)
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), (an.DirichletCategorical(3, 1.0),))
    x = np.array([[0.0], [0.0], [0.0], [2.0], [1.0], [2.0]])
    enc = cc.encode_table(model, x)
    z = np.full((2, 6), -1)
    z[0] = labels
    st = jax.jit(lambda zz: cc.init(model, enc, capacity, z=zz))(jnp.asarray(z))
    g = (0.3, 1.0, 3.0)
    grids = cc.CrossCatGrids(row_alpha=(0.5, 2.0, 8.0), dirichlet=g)
    out = jax.jit(jax.vmap(lambda k: cc.resample_hypers(k, st, model=model, grids=grids).hypers))(
        jax.random.split(jax.random.key(0), 20000)
    )
    counts = [[3, 0, 0], [0, 0, 2], [0, 1, 0]]

    def lm(beta):  # Dirichlet-multinomial marginal, written out
        from scipy.special import gammaln

        b = np.asarray(beta)
        return sum(gammaln(b.sum()) - gammaln(b.sum() + sum(c)) + np.sum(gammaln(b + c) - gammaln(b)) for c in counts)

    p0 = np.exp([lm([b, 1.0, 1.0]) for b in g])  # level 0 is drawn first, the others still at 1
    draws = np.searchsorted(np.asarray(g, np.float32), np.asarray(out.cat_prior[:, 0, 0]))
    assert_discrete_matches(draws, p0 / p0.sum())
    pa = np.exp([exact.log_eppf([3, 2, 1], a, 0.0) for a in (0.5, 2.0, 8.0)])
    draws = np.searchsorted(np.asarray((0.5, 2.0, 8.0), np.float32), np.asarray(out.row_alpha[:, 0]))
    assert_discrete_matches(draws, pa / pa.sum())
    # the draws give a non-uniform concentration (levels differ in some draws)
    assert np.mean(np.asarray(out.cat_prior[:, 0, 0]) != np.asarray(out.cat_prior[:, 0, 2])) > 0.3


def test_fit_grows_capacity_on_the_host_and_resumes_exactly():
    """A view that runs out of cluster slots halts (nothing dropped); ``fit`` doubles the capacity and resumes.

    Row ticks resume exactly: the grown run equals a run that had the final capacity from the start
    (same labels, counts), its statistics equal those rebuilt from its labels, and with
    ``max_capacity`` = ``capacity`` the same run raises ``CapacityError`` instead. All three runs have their two
    chains in two host threads (``threads=2``, one chain each; growing happens across the groups); that the
    grouping does not change the draws is checked in the slow loom test below (``threads=2`` vs one vmapped call)."""
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(10.0), (an.DirichletCategorical(3, 0.1), an.NormalInverseChiSquared()))
    x = np.column_stack([np.arange(24) % 3, np.random.default_rng(0).normal(size=24) * 5.0])
    x[5, 1] = np.nan
    sched = an.sequential_gibbs(24, 48)
    kw = dict(
        num_chains=2,
        grids=None,
        feature_moves=False,
        num_checkpoints=2,
        cache=an.SweepCache(),
        initial_views="one",
        threads=2,
    )
    with pytest.raises(an.CapacityError, match="max_capacity=8"):
        cc.fit(jax.random.key(0), x, model, sched, capacity=8, max_capacity=8, **kw)
    grown = cc.fit(jax.random.key(0), x, model, sched, capacity=8, **kw)
    cap = int(grown.trace_capacity[-1])
    assert cap == 16 and np.all(np.diff(grown.trace_capacity) >= 0)
    assert int(np.max(np.asarray(grown.state.sizes > 0).sum(-1))) > 8  # it needed the extra slots
    roomy = cc.fit(jax.random.key(0), x, model, sched, capacity=cap, **kw)
    assert np.all(roomy.trace_capacity == cap)
    chex.assert_trees_all_equal(grown.state.z, roomy.state.z)
    chex.assert_trees_all_equal(grown.state.sizes, roomy.state.sizes)
    assert np.all(np.asarray(grown.state.num_assigned) == 24) and not np.any(np.asarray(grown.state.halted))
    enc = cc.encode_table(model, x)
    ref = jax.jit(jax.vmap(lambda vo, z: cc.init(model, enc, cap, view_of=vo, z=z)))(grown.state.view_of, grown.state.z)
    chex.assert_trees_all_equal(ref.sizes, grown.state.sizes)
    chex.assert_trees_all_equal(ref.cat_counts, grown.state.cat_counts)
    chex.assert_trees_all_close(ref.real_stats, grown.state.real_stats, atol=1e-3)
    with pytest.raises(ValueError, match="new_capacity"):
        cc.grow(grown.state, cap - 1)
    # what a user reads back: compact labels with the same partitions, and a log-joint trace per checkpoint
    vo, z = np.asarray(grown.state.view_of), np.asarray(grown.state.z)
    assert grown.log_joint.shape == grown.heldout.shape and np.all(np.isfinite(grown.log_joint))
    for c in range(2):
        assert grown.view_labels[c][0] == 0 and set(grown.view_labels[c]) == set(range(len(set(vo[c]))))
        np.testing.assert_array_equal(
            grown.view_labels[c][:, None] == grown.view_labels[c][None], vo[c][:, None] == vo[c][None]
        )
        for f in range(2):
            lab, ref_z = grown.row_labels[c, f], z[c, vo[c, f]]
            assert lab.max() + 1 == len(set(ref_z[ref_z >= 0])) and lab[np.argmax(lab >= 0)] == 0
            np.testing.assert_array_equal(lab[:, None] == lab[None], ref_z[:, None] == ref_z[None])


def test_crosscat_diagnose_flags_a_stuck_chain():
    """``cc.diagnose`` applies the mixture ``diagnose`` rule to a CrossCat trace: a chain far below the others
    (held-out per row) is flagged stuck; four healthy chains are not. (Traces built by hand: no sampling.)"""
    rng = np.random.default_rng(0)
    k, chains, t = 40, 4, 50
    held = -10.0 * t + rng.normal(0, 0.5, (k, chains))
    lj = -5000.0 + rng.normal(0, 5.0, (k, chains))
    ncl = 12.0 + rng.normal(0, 0.5, (k, chains))

    def fit_of(held):
        return cc.CrossCatFit(
            None, held, None, np.full((k, chains), 2.0), ncl, np.arange(k, dtype=float), 0.0, np.full(k, 32), lj
        )

    ok = cc.diagnose(fit_of(held), num_test_rows=t)
    assert not ok.stuck.any() and ok.converged, ok.message
    bad = held.copy()
    bad[:, 2] -= 3.0 * t  # 3 nats per row below the others (e.g. one view where the others found two)
    d = cc.diagnose(fit_of(bad), num_test_rows=t)
    assert d.stuck.tolist() == [False, False, True, False] and not d.converged and "stuck chains [2]" in d.message
    with pytest.raises(ValueError, match="log_joint"):
        cc.diagnose(fit_of(held)._replace(log_joint=None))


def test_fifo_policy_visits_rows_in_order():
    """loom's schedule (policy ``"fifo"``) on CrossCat: after every tick the assigned rows are exactly the window
    ``order[(head + i) % N], i < m`` of the chain's cycle that the schedule's codes imply (adds take the next row
    of the cycle, removes the oldest), in every occupied view; the cycle is a permutation and stays fixed."""
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), FEATS)
    enc = cc.encode_table(model, DATA)
    n = DATA.shape[0]
    sched = an.loom(n, extra_passes=2.0, small=2, big=8, final_gibbs=2 * n)
    assert sched.policy == "fifo"
    sweep = jax.jit(cc.build_sweep(model, span=1, feature_moves=False, policy="fifo"))
    st = jax.vmap(lambda k: cc.init(model, enc, 4, view_of=jnp.asarray([0, 0, 1]), policy="fifo", rng_key=k))(
        jax.random.split(jax.random.key(3), 2)
    )
    order0 = np.asarray(st.order)
    assert all(sorted(o) == list(range(n)) for o in order0.tolist())
    keys = jax.random.split(jax.random.key(4), 2)
    head = m = 0
    for t, code in enumerate(sched.codes.tolist()):
        win = jnp.full((2, 1), code, jnp.int8)
        st = sweep(st, keys, win, enc)
        if code & 1:
            head, m = (head + 1) % n, m - 1
        if code & 2:
            m += 1
        np.testing.assert_array_equal(np.asarray(st.order), order0)
        assert np.all(np.asarray(st.head) == head) and np.all(np.asarray(st.num_assigned) == m), t
        z = np.asarray(st.z)
        for c in range(2):
            window = {int(order0[c, (head + i) % n]) for i in range(m)}
            for v in (0, 1):
                assert set(np.flatnonzero(z[c, v] >= 0).tolist()) == window, (t, c, v)
            assert np.all(z[c, 2:] < 0)  # unoccupied views hold no rows
    assert m == n


@pytest.mark.slow
def test_fit_with_loom_schedule_final_passes_reach_the_exact_crosscat_posterior():
    """``fit`` with loom's FIFO schedule then full-data passes (row Gibbs in every view, feature moves once per
    cycle, fixed hyperparameters) on the 3 features x 4 rows table: the final (view partition, row partition of
    feature 0's view) matches the enumerated exact posterior (chi-square over 4,000 chains). The same run with its
    chains in two host-thread groups (``threads=2``) gives the same states; with ``feature_widths=(2, 3)`` (feature
    moves on the window's rows only) the final passes reach the same exact posterior."""
    model = _model("crp")
    parts, states, probs = _enumerate(model)
    n = DATA.shape[0]
    sched = an.loom(n, extra_passes=3.0, small=2, big=8, final_gibbs=12 * n)
    res = cc.fit(jax.random.key(5), DATA, model, sched, num_chains=4000, capacity=4, grids=None, num_checkpoints=1)
    assert not np.any(np.asarray(res.state.halted)) and np.all(np.asarray(res.state.num_assigned) == n)
    assert_discrete_matches(_observe(parts, res.state), _exact_observable(parts, states, probs))
    two = cc.fit(
        jax.random.key(5), DATA, model, sched, num_chains=4000, capacity=4, grids=None, num_checkpoints=1, threads=2
    )
    chex.assert_trees_all_equal(two.state.view_of, res.state.view_of)
    chex.assert_trees_all_equal(two.state.z, res.state.z)
    chex.assert_trees_all_equal(two.state.order, res.state.order)
    # feature moves on the FIFO window's rows only (widths 2 and 3: windows that wrap around the cycle), same law
    win = cc.fit(
        jax.random.key(7),
        DATA,
        model,
        sched,
        num_chains=4000,
        capacity=4,
        grids=None,
        num_checkpoints=1,
        feature_widths=(2, 3),
        feature_min_rows=1,
    )  # moves from 1 row on (default: 4 = all rows here)
    assert not np.any(np.asarray(win.state.halted)) and np.all(np.asarray(win.state.num_assigned) == n)
    assert_discrete_matches(_observe(parts, win.state), _exact_observable(parts, states, probs))


@pytest.mark.slow
def test_fit_with_anneal_stepsize_final_passes_reach_the_exact_crosscat_posterior():
    """``fit`` with the paper's Anneal Stepsize schedule (prior initialisation, full-data block Gibbs ticks with
    blocks shrinking from 4 rows to 1, then single-row passes; feature moves once per cycle, fixed
    hyperparameters) on the 3 features x 4 rows table: the final (view partition, row partition of feature 0's
    view) matches the enumerated exact posterior (chi-square over 4,000 chains)."""
    model = _model("crp")
    parts, states, probs = _enumerate(model)
    n = DATA.shape[0]
    sched = an.anneal_stepsize(n, 8 * n, final_gibbs=12 * n)
    assert sched.blocks.max() == n  # blocks > 1 do occur
    res = cc.fit(jax.random.key(6), DATA, model, sched, num_chains=4000, capacity=4, grids=None, num_checkpoints=1)
    assert not np.any(np.asarray(res.state.halted)) and np.all(np.asarray(res.state.num_assigned) == n)
    assert_discrete_matches(_observe(parts, res.state), _exact_observable(parts, states, probs))


def _hyper_step_table(seed: int, n: int):
    """A categorical (4 levels) and a real column (every 7th cell missing) under CRP views and rows: the model,
    its encoded table, the generator (for the caller's labels) and n."""
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), (an.DirichletCategorical(4, 1.0), an.NormalInverseChiSquared()))
    rng = np.random.default_rng(seed)
    x = np.stack([rng.integers(0, 4, n).astype(float), rng.normal(0, 2, n)], 1)
    x[::7, 1] = np.nan
    return model, cc.encode_table(model, x), rng, n


def test_hyper_step_on_the_occupied_clusters_only_equals_the_full_capacity_step(monkeypatch):
    """``resample_hypers`` evaluates the Dirichlet-level and NIX grid conditionals on the largest ``width`` cluster
    slots of each feature (``HYPER_WIDTHS``): with 4 occupied clusters scattered over slots 3..19 of a capacity-20
    view, 100 hyper steps draw the same Dirichlet pseudo-counts and NIX parameters as the full-capacity
    evaluation (``widths=()``) from the same keys (negative control: the first 8 slots without the sort
    lose clusters 11, 15 and 19, and the draws differ)."""
    model, enc, rng, n = _hyper_step_table(seed=0, n=40)
    z = np.full((3, n), -1)
    z[0] = np.asarray([3, 11, 15, 19])[rng.integers(0, 4, n)]
    st = jax.jit(lambda zz: cc.init(model, enc, 20, view_of=jnp.zeros(2, jnp.int32), z=zz))(jnp.asarray(z))
    grids = cc.default_crosscat_grids(model)
    keys = jax.random.split(jax.random.key(3), 100)

    def draws(widths=cc_hypers.HYPER_WIDTHS):
        out = jax.jit(jax.vmap(lambda k: cc.resample_hypers(k, st, model=model, grids=grids, widths=widths).hypers))(
            keys
        )
        return np.asarray(out.cat_prior), np.asarray(out.nix)

    short = draws()
    full = draws(())
    np.testing.assert_array_equal(short[0], full[0])
    np.testing.assert_array_equal(short[1], full[1])
    assert len(np.unique(short[0])) > 3 and len(np.unique(short[1][:, 0, 0])) > 3  # the draws do vary
    # negative control: truncating to the first 8 slots without sorting drops occupied clusters
    monkeypatch.setattr(jnp, "argsort", lambda a, axis=-1: jnp.broadcast_to(jnp.arange(a.shape[axis]), a.shape))
    wrong = draws((8,))
    assert np.mean(wrong[0] != full[0]) > 0.05 and np.mean(wrong[1] != full[1]) > 0.05


def _has_cond(jaxpr) -> bool:
    """Whether a (closed) jaxpr holds a ``cond`` (a ``lax.switch`` that stayed a branch) at any depth."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "cond":
            return True
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                sub = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                if hasattr(sub, "eqns") and _has_cond(sub):
                    return True
    return False


def test_vmapped_hyper_step_takes_one_width_for_all_chains_with_the_same_draws():
    """Vmapped chains (``build_sweep`` with more than one chain per group) pass ``resample_hypers`` one unbatched
    ``occupied`` bound (``_occupied_bound`` over the chains): two chains with 4 and 12 occupied clusters (widths
    8 and 16 alone) draw exactly what each draws alone from the same keys, and the vmapped width choice stays a
    ``cond`` (negative control: a per-chain, batched bound turns the switch into a select that runs every width's
    branch for every chain: no ``cond`` left)."""
    model, enc, rng, n = _hyper_step_table(seed=1, n=60)
    zs = np.full((2, 3, n), -1)
    zs[0, 0] = np.asarray([3, 11, 15, 19])[rng.integers(0, 4, n)]
    zs[1, 0] = rng.permutation(np.arange(n) % 12)  # 12 clusters: width 16 = the capacity
    init = jax.jit(jax.vmap(lambda zz: cc.init(model, enc, 16, view_of=jnp.zeros(2, jnp.int32), z=zz)))
    st = init(jnp.asarray(zs))
    occ = cc_hypers._occupied_bound(model, st)
    np.testing.assert_array_equal(np.asarray(occ), [12, 12])
    grids = cc.default_crosscat_grids(model)
    keys = jax.random.split(jax.random.key(5), 20 * 2).reshape(20, 2)

    def step(ks, s_, o):
        return cc.resample_hypers(ks, s_, model=model, grids=grids, occupied=o).hypers

    together = jax.jit(jax.vmap(jax.vmap(step, in_axes=(0, 0, None)), in_axes=(0, None, None)))(keys, st, occ)
    # each chain's own width (occupied=None: the batched switch selects each chain's own branch)
    alone = jax.jit(
        jax.vmap(jax.vmap(lambda k, s_: cc.resample_hypers(k, s_, model=model, grids=grids).hypers), in_axes=(0, None))
    )(keys, st)
    np.testing.assert_array_equal(np.asarray(together.cat_prior), np.asarray(alone.cat_prior))
    np.testing.assert_array_equal(np.asarray(together.nix), np.asarray(alone.nix))
    assert len(np.unique(np.asarray(together.cat_prior))) > 3  # the draws do vary
    one = jax.make_jaxpr(jax.vmap(step, in_axes=(0, 0, None)))(keys[0], st, occ)
    assert _has_cond(one.jaxpr)
    per_chain = jnp.stack([cc_hypers._occupied_bound(model, jax.tree.map(lambda a: a[c], st)) for c in range(2)])
    batched = jax.make_jaxpr(jax.vmap(step))(keys[0], st, per_chain)
    assert not _has_cond(batched.jaxpr)


def test_prefix_sum_is_xla_cpu_cumsum_bit_for_bit():
    """``_prefix_sum`` (the row tick's O(n) running sum) computes exactly the floats of ``jnp.cumsum`` on XLA:CPU
    (blocks of 16: running sums inside each block plus the running sum of the block totals), alone and under
    ``vmap``, for lengths below, at and above the block and its powers; so swapping it in changed no draw.
    Negative control: the same construction with blocks of 8 differs from ``jnp.cumsum`` (the test sees the order)."""
    if jax.default_backend() != "cpu":
        pytest.skip("the bit-for-bit claim is about XLA:CPU's cumsum")
    rng = np.random.default_rng(0)
    cumsum = jax.jit(lambda x: jnp.cumsum(x, -1))
    ours = jax.jit(an.moves._prefix_sum)
    differs = 0
    for n in (1, 5, 16, 20, 64, 100, 300):
        x = jnp.asarray((np.exp(rng.normal(0, 5, (3, 4, n))) * (rng.random((3, 4, n)) > 0.3)).astype(np.float32))
        want = np.asarray(cumsum(x))
        np.testing.assert_array_equal(np.asarray(ours(x)), want)
        np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(an.moves._prefix_sum))(x)), want)
        differs += int(np.any(np.asarray(jax.jit(lambda v: an.moves._prefix_sum(v, block=8))(x)) != want))
    assert differs >= 3  # n = 20, 64, 100, 300 have more than one block of 8 and float sums that depend on the order


def test_first_true_is_argmax_of_a_boolean_array():
    """``_first_true`` (the tick's and ``_sample``'s first-``True`` index) equals ``jnp.argmax`` on boolean arrays,
    along either axis, with rows that are all ``False`` (0) or all ``True``."""
    rng = np.random.default_rng(1)
    for p in (0.0, 0.05, 0.5, 1.0):
        b = rng.random((3, 5, 17)) < p
        b[0, 0] = False
        b[0, 1] = True
        for axis in (-1, 1, 0):
            np.testing.assert_array_equal(
                np.asarray(an.moves._first_true(jnp.asarray(b), axis=axis)),
                np.asarray(jnp.argmax(jnp.asarray(b), axis=axis)),
            )


def test_vmapped_row_ticks_draw_what_each_chain_draws_alone():
    """``build_sweep`` over 3 vmapped chains (the batched tick) ends in the states each chain reaches alone (a group
    of one: the unbatched tick) from the same key and windows, bit for bit, at capacity 20 (the blocked running sum
    of ``_sample``: more than 16 slots)."""
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), FEATS)
    data6 = np.vstack([DATA, [[1, 0, 0.3], [0, 1, np.nan]]])
    enc = cc.encode_table(model, data6)
    n, span = data6.shape[0], 12
    states0 = jax.jit(jax.vmap(lambda _: cc.init(model, enc, 20)))(jnp.arange(3))
    keys = jax.random.split(jax.random.key(4), 3)
    codes = an.linear_anneal(n, 3 * n).codes
    w = jnp.asarray(an.sweep.schedule_windows(codes, np.asarray(states0.cursor), span))
    sweep = jax.jit(cc.build_sweep(model, span=span, feature_moves=False))
    together = sweep(states0, keys, w, enc)
    for c in range(3):
        alone = sweep(jax.tree.map(lambda a: a[c : c + 1], states0), keys[c : c + 1], w[c : c + 1], enc)
        chex.assert_trees_all_equal(jax.tree.map(lambda a: a[c], together), jax.tree.map(lambda a: a[0], alone))
    assert len(np.unique(np.asarray(together.z)[:, 0], axis=0)) > 1  # the chains differ


def test_data_grids_discretise_lace_nix_hyperprior_and_reject_unstandardised_reals():
    """``data_grids``' NIX grids are equal-mass points of lace's data-derived hyperprior (``NixHyper::from_data``:
    mu0 ~ N(mean, sd), kappa0 ~ Gamma(1, 1), nu0 ~ InvGamma(log n, log n), sigma2 ~ InvGamma(log n, var)), checked
    against a Monte Carlo draw of that hyperprior written with NumPy's gamma sampler (InvGamma(a, b) = b / Gamma(a, 1)):
    each grid point at quantile q sits where the Monte Carlo CDF is q, within 4 Monte Carlo sd. Negative control: the
    default grids (log-uniform ranges) fail that check. Real columns on different scales raise (one shared grid)."""
    rng = np.random.default_rng(0)
    n = 400
    x = np.column_stack([rng.integers(0, 3, n), rng.normal(0.3, 1.2, n), rng.normal(0.5, 1.1, n)]).astype(float)
    x[::7, 1] = np.nan  # missing cells: the column's n is its observed cells
    feats = (
        an.DirichletCategorical(3, 1.0),
        an.NormalInverseChiSquared(0.0, 1.0, 1.0, 1.0),
        an.NormalInverseChiSquared(0.0, 1.0, 1.0, 1.0),
    )
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), feats)
    g, base = cc.data_grids(model, x), cc.default_crosscat_grids(model)
    assert g.dirichlet == base.dirichlet and g.row_alpha == base.row_alpha
    real = x[:, 1:]
    obs = ~np.isnan(real)
    m = real[obs].mean()
    v = np.mean([real[obs[:, j], j].var() for j in range(2)])
    a = math.log(obs.sum(0).min())
    draws = 400_000
    mc = {
        "nix_mu0": rng.normal(m, math.sqrt(v), draws),
        "nix_kappa0": rng.gamma(1.0, 1.0, draws),
        "nix_nu0": a / rng.gamma(a, 1.0, draws),
        "nix_sigma2": v / rng.gamma(a, 1.0, draws),
    }
    q = (np.arange(12) + 0.5) / 12
    tol = 4 * np.sqrt(q * (1 - q) / draws)
    for name, sample in mc.items():
        cdf = np.mean(sample[None, :] <= np.asarray(getattr(g, name))[:, None], axis=1)
        np.testing.assert_array_less(np.abs(cdf - q), tol, err_msg=name)
        cdf0 = np.mean(sample[None, :] <= np.asarray(getattr(base, name))[:, None], axis=1)
        assert np.max(np.abs(cdf0 - q)) > 0.1, (
            name
        )  # negative control (tol is < 0.004): the default grids are not this hyperprior
    with pytest.raises(ValueError, match="standardise"):
        cc.data_grids(model, x * np.array([1.0, 1.0, 5.0]))
    with pytest.raises(ValueError, match="num"):
        cc.data_grids(model, x, num=1)
    # style="weights": the default grids' ranges centred / scaled on the data, each point weighted by the hyperprior's
    # log density (times the point on the log-spaced grids), written here in closed form (up to constants)
    w = cc.data_grids(model, x, style="weights")
    sd = math.sqrt(v)
    np.testing.assert_allclose(w.nix_mu0, m + sd * np.linspace(-2, 2, 12), rtol=1e-6)
    np.testing.assert_allclose(w.nix_sigma2, v * np.asarray(base.nix_sigma2), rtol=1e-6)
    assert w.nix_kappa0 == base.nix_kappa0 and w.nix_nu0 == base.nix_nu0
    gm, gk, gnu, gs2 = (np.asarray(t) for t in (w.nix_mu0, w.nix_kappa0, w.nix_nu0, w.nix_sigma2))
    expect = (-((gm - m) ** 2) / (2 * v), -gk + np.log(gk), -a * np.log(gnu) - a / gnu, -a * np.log(gs2) - v / gs2)
    for got, e, name in zip(w.nix_logprior, expect, ("mu0", "kappa0", "nu0", "sigma2")):
        np.testing.assert_allclose(got, np.maximum(e - e.max(), -200.0), rtol=1e-6, atol=1e-6, err_msg=name)
    assert np.ptp(w.nix_logprior[3]) > 10  # not uniform: sigma2 far below var / log n is down-weighted
    with pytest.raises(ValueError, match="style"):
        cc.data_grids(model, x, style="lace")


def _two_cluster_nix_problem():
    """One NIX column of six rows (one missing) in two clusters of one view: ``(model, x, state, log_ev)`` with
    ``log_ev(mu0, kappa0, nu0, sigma2)`` the clusters' NIX evidence written out in NumPy (Murphy's
    normal-inverse-chi-squared marginal), for the grid-Gibbs conditional tests of the NIX hyperparameters."""
    from scipy.special import gammaln as lg

    feats = (an.NormalInverseChiSquared(0.2, 0.7, 1.5, 0.8),)
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), feats)
    x = np.array([[-1.0], [-0.4], [np.nan], [1.1], [1.6], [2.4]])
    enc = cc.encode_table(model, x)
    z = np.full((2, 6), -1)
    z[0] = [0, 0, 0, 1, 1, 1]
    st = jax.jit(lambda zz: cc.init(model, enc, 8, z=zz))(jnp.asarray(z))
    clusters = [np.array([-1.0, -0.4]), np.array([1.1, 1.6, 2.4])]

    def log_ev(m0, k0, v0, s2):
        out = 0.0
        for xs in clusters:
            n, xb = xs.size, xs.mean()
            kn, vn = k0 + n, v0 + n
            vs = v0 * s2 + np.sum((xs - xb) ** 2) + n * k0 / kn * (m0 - xb) ** 2
            out += (
                lg(vn / 2)
                - lg(v0 / 2)
                + 0.5 * np.log(k0 / kn)
                + 0.5 * v0 * np.log(v0 * s2)
                - 0.5 * vn * np.log(vs)
                - 0.5 * n * np.log(np.pi)
            )
        return out

    return model, x, st, log_ev


def test_weighted_nix_grid_gibbs_matches_exact_conditionals():
    """``CrossCatGrids.nix_logprior``: each NIX parameter's grid draw follows ``exp(weight) * prod_c p(X_c | params)``,
    the NIX marginal written out here in NumPy (Murphy's normal-inverse-chi-squared evidence), for mu0 and sigma2 on
    two clusters with a missing cell. Negative control: the draws reject the unweighted conditional. Bad weights raise."""
    model, _, st, log_ev = _two_cluster_nix_problem()

    keys = jax.random.split(jax.random.key(3), 20000)
    for name, grid, lw, idx in (
        ("nix_mu0", (-1.0, 0.0, 1.5), (0.0, -1.0, -2.5), 0),
        ("nix_sigma2", (0.1, 0.5, 2.0, 6.0), (-3.0, 0.0, 0.5, -1.0), 3),
    ):
        weights = [None] * 4
        weights[idx] = lw
        grids = cc.CrossCatGrids(**{name: grid}, nix_logprior=tuple(weights))
        out = jax.jit(jax.vmap(lambda k: cc.resample_hypers(k, st, model=model, grids=grids).hypers.nix[0, idx]))(keys)
        draws = np.searchsorted(np.asarray(grid, np.float32), np.asarray(out))
        base = [0.2, 0.7, 1.5, 0.8]
        ll = np.array([log_ev(*(base[:idx] + [g] + base[idx + 1 :])) for g in grid])
        p = np.exp(ll + np.asarray(lw) - np.max(ll + np.asarray(lw)))
        assert_discrete_matches(draws, p / p.sum())
        q = np.exp(ll - ll.max())  # negative control: the unweighted conditional
        freq = np.bincount(draws, minlength=len(grid)) / draws.size
        assert np.max(np.abs(freq - q / q.sum())) > 0.05, name
    with pytest.raises(ValueError, match="nix_logprior"):
        cc.CrossCatGrids(nix_mu0=(0.0, 1.0), nix_logprior=((0.0,), None, None, None))
    with pytest.raises(ValueError, match="nix_logprior"):
        cc.CrossCatGrids(nix_mu0=(0.0, 1.0), nix_logprior=((0.0, 1.0),))


def test_data_grids_without_the_sigma2_weight_drops_only_that_weight_and_draws_sigma2_unweighted():
    """``data_grids(style="weights", sigma2_weight=False)``: the same grid points and the same mu0 / kappa0 / nu0
    weights as ``style="weights"``, no sigma2 weight (``nix_logprior[3] is None``); the grid Gibbs draw of sigma2
    with those grids follows the unweighted exact conditional ``prod_c p(X_c | sigma2)`` (NIX evidence in NumPy,
    chi-square on 20,000 draws). Negative control: the draws reject the conditional weighted by lace's sigma2 prior
    (what the default ``sigma2_weight=True`` gives). ``sigma2_weight=False`` with ``style="quantiles"`` and a
    non-bool raise."""
    model, x, st, log_ev = _two_cluster_nix_problem()
    w, nos2 = cc.data_grids(model, x, style="weights"), cc.data_grids(model, x, style="weights", sigma2_weight=False)
    for name in ("nix_mu0", "nix_kappa0", "nix_nu0", "nix_sigma2", "row_alpha", "dirichlet"):
        assert getattr(nos2, name) == getattr(w, name), name
    assert nos2.nix_logprior[:3] == w.nix_logprior[:3] and all(t is not None for t in nos2.nix_logprior[:3])
    assert nos2.nix_logprior[3] is None and np.ptp(w.nix_logprior[3]) > 10
    with pytest.raises(ValueError, match="sigma2_weight"):
        cc.data_grids(model, x, sigma2_weight=False)  # style="quantiles"
    with pytest.raises(ValueError, match="sigma2_weight"):
        cc.data_grids(model, x, style="weights", sigma2_weight="no")

    # sigma2 alone (the other parameters fixed at the model's), with data_grids' sigma2 points and sigma2 weight
    grids = cc.CrossCatGrids(nix_sigma2=nos2.nix_sigma2, nix_logprior=(None, None, None, nos2.nix_logprior[3]))
    keys = jax.random.split(jax.random.key(5), 20000)
    out = jax.jit(jax.vmap(lambda k: cc.resample_hypers(k, st, model=model, grids=grids).hypers.nix[0, 3]))(keys)
    draws = np.searchsorted(np.asarray(nos2.nix_sigma2, np.float32), np.asarray(out))
    ll = np.array([log_ev(0.2, 0.7, 1.5, s2) for s2 in nos2.nix_sigma2])
    p = np.exp(ll - ll.max())
    assert_discrete_matches(draws, p / p.sum())
    q = np.exp(ll + np.asarray(w.nix_logprior[3]) - np.max(ll + np.asarray(w.nix_logprior[3])))
    freq = np.bincount(draws, minlength=len(ll)) / draws.size
    assert np.max(np.abs(freq - q / q.sum())) > 0.05  # negative control: lace's sigma2 weight is not applied


@pytest.mark.slow  # about a minute: run with `python -m pytest -m slow tests/test_crosscat.py`
def test_sweep_growth_runs_the_moves_as_the_subsample_grows():
    """``fit(sweep_growth=g)``: a schedule that only adds rows (``linear_anneal(N, N)``) never completes a cycle,
    so without it the feature / hyper moves run once, at ``hyper_min_rows``; with ``g`` they also run each time
    the subsample holds ``g`` times the rows of their last run (``state.swept``: 20 then 40 of 64 rows at
    ``g = 2``), and the statistics stay equal to a rebuild from the labels. A schedule
    with >= 2 assignments per added row (3N) completes a cycle first: the same states as without it. Bad
    ``sweep_growth`` raises. (Exact posterior: the slow test below.)"""
    model, enc, _, n = _hyper_step_table(seed=2, n=64)
    rng = np.random.default_rng(2)  # the table of _hyper_step_table(seed=2, n=64), as fit's input
    x = np.stack([rng.integers(0, 4, n).astype(float), rng.normal(0, 2, n)], 1)
    x[::7, 1] = np.nan
    expect = {0.0: (20, 44), 2.0: (40, 24)}  # (swept, since_hyper) after 64 adds
    caches = {g: an.SweepCache() for g in expect}  # one compiled sweep per growth (span n: 1N and 3N share it)
    for g, (swept, since) in expect.items():
        r = cc.fit(
            jax.random.key(1),
            x,
            model,
            an.linear_anneal(n, n),
            num_chains=2,
            capacity=16,
            sweep_growth=g,
            span=n,
            cache=caches[g],
        )
        assert np.all(np.asarray(r.state.swept) == swept) and np.all(np.asarray(r.state.since_hyper) == since), g
        assert np.all(np.asarray(r.state.num_assigned) == n) and not np.any(np.asarray(r.state.halted))
        ref = jax.vmap(lambda vo, z: cc.init(model, enc, 16, view_of=vo, z=z))(r.state.view_of, r.state.z)
        np.testing.assert_array_equal(np.asarray(r.state.cat_counts), np.asarray(ref.cat_counts))
        np.testing.assert_allclose(np.asarray(r.state.real_stats), np.asarray(ref.real_stats), rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(np.asarray(r.state.sizes), np.asarray(ref.sizes))
    three = [
        cc.fit(
            jax.random.key(2),
            x,
            model,
            an.linear_anneal(n, 3 * n),
            num_chains=2,
            capacity=16,
            sweep_growth=g,
            span=n,
            cache=caches[g],
        ).state
        for g in expect
    ]
    chex.assert_trees_all_equal(three[0], three[1])
    for bad in (1.0, 0.5, -2.0, float("inf"), True, "2"):
        with pytest.raises(ValueError, match="sweep_growth"):
            cc.fit(jax.random.key(0), x, model, an.linear_anneal(n, n), sweep_growth=bad)


@pytest.mark.slow
def test_fit_with_sweep_growth_final_passes_reach_the_exact_crosscat_posterior():
    """On the 3 features x 4 rows table, ``fit(sweep_growth=2)`` runs the feature moves at 1, 2 and 4 rows of the
    adding phase of ``linear_anneal(4, 4)`` (moves from 1 row on; fixed hyperparameters); that phase then full-data
    passes reach the enumerated exact posterior (chi-square over 4,000 chains). Negative control: the adding phase
    without any feature move (its view partition a view-prior draw) is rejected."""
    model = _model("crp")
    parts, states, probs = _enumerate(model)
    m = DATA.shape[0]
    exact_obs = _exact_observable(parts, states, probs)
    kw = dict(num_chains=4000, capacity=4, grids=None, num_checkpoints=1, feature_min_rows=1)
    res = cc.fit(jax.random.key(5), DATA, model, an.linear_anneal(m, m, final_gibbs=12 * m), sweep_growth=2.0, **kw)
    assert not np.any(np.asarray(res.state.halted)) and np.all(np.asarray(res.state.num_assigned) == m)
    assert_discrete_matches(_observe(parts, res.state), exact_obs)
    adding = cc.fit(jax.random.key(5), DATA, model, an.linear_anneal(m, m), sweep_growth=2.0, **kw)
    assert np.all(np.asarray(adding.state.swept) == m)  # the last moves ran at all 4 rows
    none = cc.fit(jax.random.key(5), DATA, model, an.linear_anneal(m, m), **{**kw, "feature_moves": False})
    with pytest.raises(AssertionError):
        assert_discrete_matches(_observe(parts, none.state), exact_obs)


@pytest.mark.slow  # one to four minutes (compiles both tick-loop layouts); the golden fits cover the default layout
def test_sweep_moves_between_tick_loops_draw_what_one_tick_per_call_draws():
    """``build_sweep`` with moves runs its ticks in an inner ``while`` loop that exits after a tick whose moves fire,
    the moves outside it (no ``cond`` in the tick loop). Its states equal, bit for bit, those of one-tick calls
    (``span=1``: each call one tick, then its moves) over a 3N anneal whose feature and hyper moves fire at many
    ticks (``sweep_growth=2``, from 1 row), for one chain and 3 vmapped chains; and with moves that never fire
    (thresholds above the table) they equal the plain tick scan (``feature_moves=False``, ``grids=None``)."""
    model = cc.CrossCatModel(an.CRP(1.0), an.CRP(1.0), FEATS)
    data6 = np.vstack([DATA, [[1, 0, 0.3], [0, 1, np.nan]]])
    enc = cc.encode_table(model, data6)
    n = data6.shape[0]
    codes = an.linear_anneal(n, 3 * n).codes
    span = len(codes)
    grids = cc.default_crosscat_grids(model)
    kw = dict(grids=grids, hyper_min_rows=1, feature_min_rows=1, sweep_growth=2.0)
    whole = jax.jit(cc.build_sweep(model, span=span, **kw))
    step = jax.jit(cc.build_sweep(model, span=1, **kw))
    never = jax.jit(cc.build_sweep(model, span=span, grids=grids, hyper_min_rows=n + 1, feature_min_rows=n + 1))
    plain = jax.jit(cc.build_sweep(model, span=span, feature_moves=False))
    for chains in (1, 3):
        states0 = jax.jit(jax.vmap(lambda _: cc.init(model, enc, 8)))(jnp.arange(chains))
        keys = jax.random.split(jax.random.key(5), chains)
        w = jnp.asarray(an.sweep.schedule_windows(codes, np.asarray(states0.cursor), span))
        got = whole(states0, keys, w, enc)
        st = states0
        for _ in range(span):
            st = step(st, keys, jnp.asarray(an.sweep.schedule_windows(codes, np.asarray(st.cursor), 1)), enc)
        chex.assert_trees_all_equal(got, st)
        assert int(np.min(np.asarray(got.swept))) >= 4  # the moves ran as the subsample grew
        chex.assert_trees_all_equal(never(states0, keys, w, enc), plain(states0, keys, w, enc))
