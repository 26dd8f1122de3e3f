"""Tests for jaxsub.coreference (racing Gibbs for pairwise-factor clustering, paper §5.3)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tv_distance, tv_tolerance

from jaxsub import coreference as co

# One block of 120 mentions (K = 119, the 128 class: raced) with ragged clusters, plus two
# small blocks (updated exactly). The factor depends on the other mention only,
# f(x_i, x_j) = a_j, so S_y = sum of a_j over C_y (fixed by centring the members' spread);
# mention 0 is the variable under test.
NOISE_SD = 0.01  # members of the clusters of 50 and 30 (tight)
LOOSE_SD = 0.3  # members of the small clusters (loose, as FEBRL's duplicates): a few spread values
RAGGED = [1, 50, 30, 15, 8, 4, 2, 1, 1, 8]  # cluster sizes of block 0 (mention 0 alone in the first)


# min_arm_draws=2: candidates with m1 N_y / K < 2 (N_y < 24 here: clusters of 15, 8, 4, 2, 1, 1, 8) are
# summed exactly, the race runs over the 80 members of the clusters of 50 and 30.
# race_cost=38: the cost model at its boundary for mention 0 (its race is expected to save exactly
# 119 - (39 small-arm members + 2 raced arms + 4 m1) = 38 evaluations, so it races: the TV tests check
# that every draw raced); see test_cost_model_updates_exactly_where_a_race_cannot_pay.
RACE = dict(
    delta=0.05,
    first_batch_size=10,
    min_race_size=20,
    max_candidates=16,
    min_arm_draws=2.0,
    race_widths=(),
    race_cost=38.0,
)
SMALL_MEMBERS = 15 + 8 + 4 + 2 + 1 + 1 + 8


@functools.cache
def _sweep():
    """One compiled sweep shared by the tests: a traced ``exact`` flag (the decision check is tested on
    :func:`~jaxsub.coreference.conditional_update`, so it is not compiled here)."""
    blocks = _ragged_problem()[0]
    kernel = co.build_kernel(blocks, **RACE)
    jitted = jax.jit(lambda k, s, x, b, e: kernel(k, s, _factor, x, b, exact=e))
    return lambda k, s, x, b, exact=False: jitted(k, s, x, jnp.float32(b), jnp.bool_(exact))


def _kernel(exact: bool):
    sweep = _sweep()
    return lambda k, s, x, b: sweep(k, s, x, b, exact)


def _factor(xi, xj):
    del xi
    return xj["a"]


def _ragged_problem(seed=0):
    rng = np.random.default_rng(seed)
    labels_local = np.repeat(np.arange(len(RAGGED)), RAGGED)  # 120 mentions of block 0
    totals = np.array([0.0, 1.2, 1.0, 0.6, 0.9, 0.2, -0.3, 0.1, -2.0, 0.8])  # target S_y
    a = np.empty(labels_local.size)
    for c, n in enumerate(RAGGED):
        idx = np.flatnonzero(labels_local == c)
        noise = rng.normal(0.0, NOISE_SD if n >= 30 else LOOSE_SD, n)
        a[idx] = totals[c] / n + noise - noise.mean()
    m0 = labels_local.size
    keys = np.concatenate([np.zeros(m0, int), np.ones(5, int), 2 * np.ones(3, int)])
    a = np.concatenate([a, rng.normal(0, 1, 8)])
    blocks = co.make_blocks(keys)
    # cluster ids of block 0: sorted positions [0, 120); use the first position of each cluster
    first = np.concatenate([[0], np.cumsum(RAGGED)[:-1]])
    labels = np.concatenate([first[labels_local], np.arange(m0, m0 + 8)])
    mentions = {"a": jnp.asarray(a, jnp.float32)}
    return blocks, co.init(jnp.asarray(labels, jnp.int32), blocks), mentions, first


def _exact_conditional(a, labels, i, block_ids, beta):
    """NumPy: p(y_i = y | rest) over (non-empty clusters of i's block without i) + one empty."""
    others = [j for j in block_ids if j != i]
    clusters = sorted(set(int(labels[j]) for j in others))
    sums = np.array([sum(float(a[j]) for j in others if labels[j] == c) for c in clusters] + [0.0])
    logits = beta * sums
    p = np.exp(logits - logits.max())
    return clusters, p / p.sum()


@pytest.mark.parametrize("schedule", ["padded", "ragged", "hybrid"])
def test_racing_conditional_within_delta_of_exact_tv(schedule):
    """``"hybrid"``: the small arms and the empty cluster summed exactly, only the best of them racing
    as one column beside the two large arms, with ``max_candidates=4`` < the 10 candidates (the plain
    padded race would update this mention exactly)."""
    _check_racing_conditional(schedule, widths=(), batch_size=1)


@pytest.mark.slow
def test_hybrid_fixed_schedule_conditional_within_delta_of_exact_tv():
    """The hybrid update with the engine's single-test schedule (``race_schedule="fixed"``: one
    elimination test after m1 = 10 draws with the one-stage quantile, then the surviving arms on all
    N = 128 indices): decisions within δ, TV within δ, negative control (slow: the option is not a
    default; measured not to pay on author mentions, docs/guides/coreference.md)."""
    _check_racing_conditional("hybrid_fixed", widths=(), batch_size=1)


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 64])
def test_racing_conditional_within_delta_two_widths_and_batched(batch_size):
    """Race widths (12, 16): the update (<= 11 candidates) races at width 12 (``lax.switch`` / the batched
    round's width mask); ``batch_size=64``: the batched round's conditional (the mention alone in a round,
    through :func:`jaxsub.discrete.racing_batch`)."""
    _check_racing_conditional("padded", widths=(12,), batch_size=batch_size)


@pytest.mark.slow
def test_hybrid_ragged_conditional_within_delta_of_exact_tv():
    """The hybrid update on the per-arm engine: the large arms (N_y >= m1 = 10: the clusters of 50, 30
    and 15) race per arm, the rest summed exactly, ``max_candidates=4`` < the 10 candidates."""
    _check_racing_conditional("hybrid_ragged", widths=(), batch_size=1)


def _check_racing_conditional(schedule, widths, batch_size):
    blocks, state, mentions, first = _ragged_problem()
    beta, delta, n_draws = 2.0, RACE["delta"], 3000
    extra = dict(schedule=schedule)
    if schedule.startswith("hybrid"):
        extra = dict(schedule="ragged" if schedule == "hybrid_ragged" else "padded", hybrid=True, max_candidates=4)
        if schedule == "hybrid_fixed":
            extra["race_schedule"] = "fixed"
    update = co.conditional_update(blocks, 0, batch_size=batch_size, **{**RACE, "race_widths": widths, **extra})
    draw = jax.jit(jax.vmap(lambda k: update(k, state, _factor, mentions, beta, check_decisions=True)))
    new_states, infos = draw(jax.random.split(jax.random.key(1), n_draws))
    assert int(infos.num_races.sum()) == n_draws and int(infos.num_nan.sum()) == 0
    # each race's decision = the exact Gumbel-max decision under the same noise, w.p. >= 1 - delta
    # (with small arms summed exactly; the slow negative control races them all)
    errors, checked = int(infos.num_errors.sum()), int(infos.num_checked.sum())
    assert checked == n_draws and errors / checked <= _binomial_upper(delta, checked)
    labels = np.asarray(state.labels)
    clusters, probs = _exact_conditional(np.asarray(mentions["a"]), labels, 0, range(120), beta)
    new = np.asarray(new_states.labels[:, 0])
    empty = ~np.isin(new, clusters)
    assert np.all(new[empty] == new[empty][0]) if empty.any() else True  # one empty cluster id
    idx = np.where(empty, len(clusters), np.searchsorted(clusters, new))
    emp = np.bincount(idx, minlength=len(probs)) / n_draws
    tol = tv_tolerance(probs, n_draws)
    assert tv_distance(emp, probs) <= delta + tol
    # the races subsampled: many stopped before the exact update's K = 119 evaluations
    evals = np.asarray(infos.num_evaluations)
    assert float(np.mean(evals < 119)) > 0.3
    if schedule in ("padded", "hybrid", "hybrid_fixed"):  # small arms summed exactly: counted, never fewer
        assert evals.min() >= SMALL_MEMBERS + RACE["first_batch_size"]
    if schedule == "hybrid_ragged":  # clusters below m1 = 10 summed exactly, m1 of each of the 3 large arms
        assert evals.min() >= SMALL_MEMBERS - 15 + 3 * RACE["first_batch_size"]
    # negative control: the same draws are far from a wrong conditional (largest cluster halved)
    a_wrong = np.asarray(mentions["a"]).copy()
    a_wrong[first[1] : first[1] + 25] = 0.0
    _, wrong = _exact_conditional(a_wrong, labels, 0, range(120), beta)
    assert tv_distance(emp, wrong) > delta + tol
    # sizes stay consistent with labels (no cluster dropped)
    for r in range(3):
        _assert_state_consistent(jax.tree.map(lambda x, r=r: x[r], new_states), blocks)


def _binomial_upper(p, n, z=3.5):
    """One-sided upper bound for an empirical rate of n Bernoulli(p) trials (z standard errors)."""
    return p + z * np.sqrt(p * (1 - p) / n)


@pytest.mark.slow
def test_racing_every_arm_fails_delta_on_loose_small_clusters():
    """Negative control for the small-arm rule: the paper's rule (every arm raced over the padded
    population, ``min_arm_draws=0``) on the same problem is wrong more often than delta."""
    blocks, state, mentions, _ = _ragged_problem()
    update = co.conditional_update(blocks, 0, **{**RACE, "min_arm_draws": 0.0})
    draw = jax.jit(jax.vmap(lambda k: update(k, state, _factor, mentions, 2.0, check_decisions=True)[1]))
    info = draw(jax.random.split(jax.random.key(1), 3000))
    errors, checked = int(info.num_errors.sum()), int(info.num_checked.sum())
    assert checked == 3000 and errors / checked > _binomial_upper(RACE["delta"], checked)


def _numpy_exact_sweep(key, labels, a, blocks, beta, lists=None, small_cap=64):
    """Reference: the sequential exact sweep (class by class, positions in order, each move applied
    before the next update), its key stream and candidate columns, sums in float64. The kernel's
    batched rounds (mentions of different blocks decided together, then moved) must give the same labels.

    Columns of a block: its non-empty clusters in the order of ``state.active`` (initially increasing
    ids; a new cluster is appended, an emptied one removed), then the first empty id (the new cluster)
    unless the updated mention was alone (its own emptied cluster is then the empty candidate).
    ``lists`` (returned, passed to the next sweep) carries those orders; returns ``(labels, lists)``.
    """
    labels = np.array(labels)
    sizes = np.bincount(labels, minlength=labels.size)
    if lists is None:
        lists = {}
        for s in np.unique(blocks.start):
            ids = range(s, s + blocks.size[s])
            lists[s] = ([c for c in ids if sizes[c] > 0], [c for c in ids if sizes[c] == 0])
    act = {s: v[0] for s, v in lists.items()}
    tail = {s: v[1] for s, v in lists.items()}
    classes = co.mention_classes(blocks, small_cap)
    for c, (n_cap, positions) in enumerate(classes):
        k = jax.random.fold_in(key, c)
        W = n_cap + 1
        for p in positions:
            k_noise = jax.random.split(jax.random.fold_in(k, p))[0]  # per-position keys
            noise = np.asarray(jax.random.gumbel(k_noise, (W,)), np.float64)
            i = blocks.order[p]
            s, n = blocks.start[p], blocks.size[p]
            y = labels[i]
            cols = act[s] + ([tail[s][0]] if sizes[y] > 1 else [])
            sums = np.zeros(len(cols))
            for j in blocks.order[s : s + n]:
                if j != i:
                    sums[cols.index(labels[j])] += beta * float(a[j])
            new = cols[int(np.argmax(sums + noise[: len(cols)]))]
            if new != y:
                if sizes[new] == 0:
                    tail[s].remove(new)
                    act[s].append(new)
                sizes[y] -= 1
                sizes[new] += 1
                if sizes[y] == 0:
                    act[s].remove(y)
                    tail[s].insert(0, y)
                labels[i] = new
    return labels, lists


def _assert_state_consistent(state, blocks):
    """The indexes of CorefState agree with the labels (see CorefState)."""
    lab, sizes, mem, mpos, act, apos, seg, nact = (np.asarray(x) for x in state)
    m = lab.size
    np.testing.assert_array_equal(sizes, np.bincount(lab, minlength=m))
    np.testing.assert_array_equal(mpos[mem], np.arange(m))
    np.testing.assert_array_equal(apos[act], np.arange(m))
    for s in np.unique(blocks.start):
        n = blocks.size[s]
        assert set(act[s : s + n]) == set(range(s, s + n)) and set(mem[s : s + n]) == set(blocks.order[s : s + n])
        k = nact[s]
        assert np.all(sizes[act[s : s + k]] > 0) and np.all(sizes[act[s + k : s + n]] == 0)
        ends = seg[s : s + k] + sizes[act[s : s + k]]
        assert seg[s] == s and ends[-1] == s + n and np.all(seg[s + 1 : s + k] == ends[:-1])  # contiguous tiling
        for q in range(s, s + k):
            assert np.all(lab[mem[seg[q] : seg[q] + sizes[act[q]]]] == act[q])


def test_exact_sweep_matches_numpy_reference():
    blocks, state, mentions, _ = _ragged_problem(seed=3)
    kernel = _kernel(True)
    key = jax.random.key(7)
    labels, lists = np.asarray(state.labels), None
    for s in range(2):
        ks = jax.random.fold_in(key, s)
        state, info = kernel(ks, state, mentions, 1.5)
        labels, lists = _numpy_exact_sweep(ks, labels, np.asarray(mentions["a"], np.float32), blocks, 1.5, lists)
        np.testing.assert_array_equal(np.asarray(state.labels), labels)
        _assert_state_consistent(state, blocks)
        assert int(info.num_exact) == 128 and int(info.num_races) == 0
        assert int(info.num_evaluations) == 120 * 119 + 5 * 4 + 3 * 2


@pytest.mark.slow
def test_batched_exact_sweep_matches_numpy_reference():
    """Batched rounds (mentions of different blocks decided together, then moved) with ``exact=True``
    give the sequential exact sweep's labels (same per-position keys): the updates of different blocks
    commute. Several blocks per class so that rounds have several lanes."""
    rng = np.random.default_rng(5)
    sizes = [100, 120, 90, 129, 70, 5, 3, 2, 30, 66]  # classes 64 (6 blocks) and 128 (4 blocks)
    keys = rng.permutation(np.concatenate([np.full(n, b) for b, n in enumerate(sizes)]))
    blocks = co.make_blocks(keys)
    a = np.asarray(rng.normal(0, 1, keys.size), np.float32)
    kernel = co.build_kernel(blocks, batch_size=4, **RACE)
    sweep = jax.jit(lambda k, s, x, b: kernel(k, s, _factor, x, b, exact=True))
    assert max(co.class_lanes(blocks, p, 4).shape[1] for _, p in co.mention_classes(blocks)) == 4
    state, labels, lists = co.init(None, blocks), np.asarray(blocks.position), None
    for s in range(2):
        ks = jax.random.fold_in(jax.random.key(11), s)
        state, info = sweep(ks, state, {"a": jnp.asarray(a)}, 1.5)
        labels, lists = _numpy_exact_sweep(ks, labels, a, blocks, 1.5, lists)
        np.testing.assert_array_equal(np.asarray(state.labels), labels)
        _assert_state_consistent(state, blocks)
    assert int(info.num_exact) == keys.size and int(info.num_evaluations) == sum(n * (n - 1) for n in sizes)


def test_cost_model_updates_exactly_where_a_race_cannot_pay():
    """``race_cost`` (the cost model): an update races only if K - (k_small + raced arms + 4 m1) >= its cost."""
    blocks, state, mentions, _ = _ragged_problem(seed=1)
    # the rule at its boundary: mention 0 of block 0 (K = 119, small arms of 39 members, 2 raced arms,
    # m1 = 10) is expected to save 119 - (39 + 2 + 40) = 38 evaluations; at width 16 the cost is F itself
    assert co.options.race_costs(38.0, (16, 70)) == (38.0, 38.0 * (38 + 70) / (38 + 16))
    assert co.options.race_costs(38.0, (2, 4)) == (38.0, 38.0)  # narrower races are not cheaper
    pays = functools.partial(
        co.options.race_pays, jnp.int32(119), jnp.int32(39), jnp.int32(2), width=0, first_batch_size=10
    )
    assert bool(pays(co.options.race_costs(38.0, (16,)))) and not bool(pays(co.options.race_costs(38.5, (16,))))
    # the race side of the boundary is compiled into every racing test here (RACE: F = 38, mention 0 races).
    # Static part: no update of the class K <= 128 can save more than 128 - (1 + 40) = 87 evaluations, so
    # with F = 88 the class is compiled without racing code: the exact sweep's labels and counts (same keys)
    kernel = co.build_kernel(blocks, **{**RACE, "race_cost": 88.0})
    key = jax.random.key(4)
    new, info = jax.jit(lambda k, s, x: kernel(k, s, _factor, x, 1.0))(key, state, mentions)
    ref, ref_info = _kernel(True)(key, state, mentions, 1.0)
    _, raced = _kernel(False)(key, state, mentions, 1.0)  # F = 38: the same problem races (negative control)
    assert int(info.num_races) == 0 and int(raced.num_races) > 0
    np.testing.assert_array_equal(np.asarray(new.labels), np.asarray(ref.labels))
    assert int(info.num_evaluations) == int(ref_info.num_evaluations) == 120 * 119 + 5 * 4 + 3 * 2


def test_b_cubed_and_pairwise_hand_computed():
    # Bagga & Baldwin (1998), their Fig.: truth {1-5}, {6,7}, {8-12}; response merges the last two
    truth = [0] * 5 + [1] * 2 + [2] * 5
    pred = [0] * 5 + [1] * 7
    s = co.b_cubed(pred, truth)
    assert s.recall == pytest.approx(1.0)
    assert s.precision == pytest.approx((5 + 2 * 2 / 7 + 5 * 5 / 7) / 12)
    assert s.f1 == pytest.approx(2 * s.precision / (s.precision + 1))
    pw = co.pairwise_f1(pred, truth)
    assert pw.precision == pytest.approx(21 / 31) and pw.recall == pytest.approx(1.0)
    # all singletons: B3 precision 1, recall = mean 1/|T(i)|
    s = co.b_cubed(np.arange(12), truth)
    assert s.precision == 1.0 and s.recall == pytest.approx((5 * 1 / 5 + 2 * 1 / 2 + 5 * 1 / 5) / 12)
    assert co.b_cubed(truth, truth).f1 == 1.0 and co.pairwise_f1(pred[::-1], pred[::-1]).f1 == 1.0


def test_resume_is_exact_and_no_cluster_dropped():
    blocks, state0, mentions, _ = _ragged_problem(seed=1)
    kernel = _kernel(False)
    keys = [jax.random.fold_in(jax.random.key(2), s) for s in range(4)]
    state = state0
    for k in keys:
        state, info = kernel(k, state, mentions, 1.0)
    half = state0
    for k in keys[:2]:
        half, _ = kernel(k, half, mentions, 1.0)
    rebuilt = co.init(np.asarray(half.labels), blocks)  # labels alone give the same sizes
    np.testing.assert_array_equal(np.asarray(rebuilt.sizes), np.asarray(half.sizes))
    resumed = co.CorefState(*(jnp.asarray(np.asarray(x)) for x in half))  # host round trip, then resume
    for k in keys[2:]:
        resumed, _ = kernel(k, resumed, mentions, 1.0)
    np.testing.assert_array_equal(np.asarray(resumed.labels), np.asarray(state.labels))
    lab = np.asarray(state.labels)
    np.testing.assert_array_equal(np.asarray(state.sizes), np.bincount(lab, minlength=lab.size))
    lo = blocks.start[blocks.position]
    assert np.all((lab >= lo) & (lab < lo + blocks.size[blocks.position]))
    _assert_state_consistent(state, blocks)
    # from every mention alone (120 clusters in block 0): moves shift up to ~120 segments, several
    # chunks of the move's loop (chunk = race width + 1 = 17), exact and racing updates
    single = co.init(None, blocks)
    for k in keys[:2]:
        single, info = kernel(k, single, mentions, 1.0)
        _assert_state_consistent(single, blocks)
    assert int(np.sum(np.bincount(np.asarray(single.labels)) > 0)) < blocks.num_mentions  # clusters merged


def test_nan_factors_surfaced_in_info_and_label_kept():
    blocks, state, mentions, _ = _ragged_problem()
    a = np.asarray(mentions["a"]).copy()
    a[5] = np.nan
    bad = {"a": jnp.asarray(a)}
    for exact in (True, False):
        kernel = _kernel(exact)
        new, info = kernel(jax.random.key(0), state, bad, 1.0)
        assert int(info.num_nan) > 0
        # every mention of block 0 but mention 5 meets the NaN (exact) and keeps its label then
        if exact:
            keep = np.asarray(new.labels[:120]) == np.asarray(state.labels[:120])
            assert int(info.num_nan) == 119 and keep[np.arange(120) != 5].all()


def test_bad_inputs_raise_value_error():
    blocks, state, mentions, _ = _ragged_problem()
    kernel = co.build_kernel(blocks)
    with pytest.raises(ValueError, match="leading axis 128"):
        kernel(jax.random.key(0), state, _factor, {"a": jnp.zeros(127)}, 1.0, exact=True)
    with pytest.raises(ValueError, match="temperature"):
        kernel(jax.random.key(0), state, _factor, mentions, -1.0, exact=True)
    with pytest.raises(ValueError, match="exact"):
        kernel(jax.random.key(0), state, _factor, mentions, 1.0, exact=1.0)
    with pytest.raises(ValueError, match="delta"):
        co.build_kernel(blocks, delta=1.5)
    with pytest.raises(ValueError, match="first_batch_size"):
        co.build_kernel(blocks, first_batch_size=1)
    with pytest.raises(ValueError, match="race_cost"):
        co.build_kernel(blocks, race_cost=-1.0)
    with pytest.raises(ValueError, match="hybrid"):
        co.build_kernel(blocks, hybrid=True, batch_size=4)
    with pytest.raises(ValueError, match="hybrid"):
        co.build_kernel(blocks, hybrid="yes")
    with pytest.raises(ValueError, match="cv_members"):
        co.build_kernel(blocks, hybrid=True, cv_members=0)
    with pytest.raises(ValueError, match="cv_members"):
        co.build_kernel(blocks, cv_members=4)
    with pytest.raises(ValueError, match="race_schedule"):
        co.build_kernel(blocks, race_schedule="halving")
    with pytest.raises(ValueError, match="race_schedule"):
        co.build_kernel(blocks, race_schedule="fixed", schedule="ragged")
    with pytest.raises(ValueError, match="hash_dim"):  # packed bags must share one hash_dim
        co.packed_similarity({"x": "string", "y": "tokens"}).pack({"x": jnp.ones((3, 4)), "y": jnp.ones((3, 5))})
    with pytest.raises(ValueError, match="blocks"):
        co.build_kernel(None)
    with pytest.raises(ValueError, match="pairwise_log_factor"):
        kernel(jax.random.key(0), state, None, mentions, 1.0)
    with pytest.raises(ValueError, match="position"):
        co.init(jnp.zeros(128, jnp.int32) + 127, blocks)
    with pytest.raises(ValueError, match="position"):
        co.init(jnp.zeros(5, jnp.int32), blocks)
    with pytest.raises(ValueError, match="block_keys"):
        co.make_blocks([])
    with pytest.raises(ValueError, match="temperatures"):
        co.fit(jax.random.key(0), _factor, mentions, blocks, [1.0, -2.0])
    with pytest.raises(ValueError, match="kinds"):
        co.encode_mentions({"name": ["a", "b"]}, {"name": "text"})
    with pytest.raises(ValueError, match="same number"):
        co.encode_mentions({"x": ["a", "b"], "y": ["a"]}, {"x": "string", "y": "string"})
    with pytest.raises(ValueError, match="alone"):
        co.conditional_update(co.make_blocks([0, 0, 1]), 2)


def test_default_similarity_factor_and_encoding():
    cols = {
        "name": ["john smith", "jon smith", "mary jones", None, "m jones"],
        "city": ["a", "a", "b", "a", None],
        "year": [1990.0, 1991.0, 2010.0, np.nan, 2009.0],
        "coauthors": ["x;y", "y;z", "q", "x", ""],
    }
    kinds = {"name": "string", "city": "categorical", "year": "numeric", "coauthors": "tokens"}
    enc = co.encode_mentions(cols, kinds, hash_dim=64)
    f = jax.jit(co.similarity_factor(kinds, scales={"year": 2.0}))  # one compile for the three calls
    row = lambda i: jax.tree.map(lambda v: v[i], enc)  # noqa: E731
    close, far = float(f(row(0), row(1))), float(f(row(0), row(2)))
    assert close > 0 > far
    # missing fields contribute 0: mention 3 has no name and no year
    only = float(f(row(3), row(0)))
    cat = 1.0
    tok = float(jnp.dot(enc["coauthors"][3], enc["coauthors"][0])) - 0.5
    assert only == pytest.approx(cat + tok, abs=1e-6)
    # the packed form (one dot product over [bags, presence flags], codes, numbers) gives the same values
    # on every pair, missing fields included, with non-default weights, thresholds, scales and bias
    settings = dict(
        weights={"name": 2.0, "city": 0.5, "year": 1.5, "coauthors": 3.0},
        thresholds={"name": 0.6},
        scales={"year": 2.0},
        bias=0.25,
    )
    ref_f = co.similarity_factor(kinds, **settings)
    sim = co.packed_similarity(kinds, **settings)
    packed = sim.pack(enc)
    assert packed["dense"].shape == (5, 2 * 64 + 2) and packed["codes"].shape == (5, 1)

    def all_pairs(g, x):  # eager (op by op on [5, 5] batches): no compile
        return jax.vmap(jax.vmap(g, (None, 0)), (0, None))(x, x)

    np.testing.assert_allclose(
        np.asarray(all_pairs(sim.factor, packed)), np.asarray(all_pairs(ref_f, enc)), rtol=1e-6, atol=1e-6
    )


# --------------------------------------------------------------------------- sufficient statistics
SUFF_KINDS = {"name": "string", "venue": "categorical", "year": "numeric"}
SUFF_SETTINGS = dict(
    weights={"name": 2.0, "venue": 0.5, "year": 1.0}, thresholds={"name": 0.5}, scales={"year": 2.0}, bias=-0.3
)


def _suff_problem():
    """7 mentions, missing fields of every kind, two blocks (5 + 2: ragged), the pairwise matrix F."""
    from jaxsub.coreference import sufficient as su

    cols = {
        "name": ["ann lee", "ann li", None, "bob ray", "bob rae", "ann lee", "x"],
        "venue": ["a", "b", "a", None, "b", "a", "c"],
        "year": [1.0, 2.0, np.nan, 5.0, 4.0, 1.5, 3.0],
    }
    sim = co.packed_similarity(SUFF_KINDS, **SUFF_SETTINGS)
    x = sim.pack(co.encode_mentions(cols, SUFF_KINDS, hash_dim=8))
    blocks = co.make_blocks([0, 1, 0, 0, 1, 0, 0])
    f = np.asarray(jax.vmap(jax.vmap(sim.factor, (None, 0)), (0, None))(x, x))  # eager, [7, 7]
    return su, x, blocks, f, su.build_kernel(blocks, SUFF_KINDS, **SUFF_SETTINGS, candidate_chunk=2, member_chunk=3)


def _pairwise_log_conditional(blocks, labels, f, i, beta):
    """NumPy reference: β Σ_{j ∈ C} f(x_i, x_j) per non-empty cluster id of i's block, 0 for its first empty id."""
    p = blocks.position[i]
    lo, hi = blocks.start[p], blocks.start[p] + blocks.size[p]
    out = np.full(labels.size, -np.inf)
    others = np.arange(labels.size) != i
    sizes = np.bincount(labels[others], minlength=labels.size)
    for c in range(lo, hi):
        if sizes[c]:
            out[c] = beta * f[i, others & (labels == c)].sum()
    out[lo + np.flatnonzero(sizes[lo:hi] == 0)[0]] = 0.0
    return out


def test_sufficient_statistics_conditional_equals_pairwise_and_sweep_counts():
    su, x, blocks, f, k = _suff_problem()
    labels = blocks.start[blocks.position] + np.array([0, 0, 0, 1, 1, 0, 1])  # ... written per block
    state = su.init(jnp.asarray(labels, jnp.int32), blocks)
    for i in range(7):
        np.testing.assert_allclose(
            np.asarray(k.log_conditional(state, x, i, 1.7)),
            _pairwise_log_conditional(blocks, labels, f, i, 1.7),
            rtol=1e-5,
            atol=1e-5,
        )
    # one jitted sweep: valid labels, candidates and member terms counted (NumPy replay of the draws' counts)
    new, info = jax.jit(k.step)(jax.random.key(0), state, x, 1.0)
    new = np.asarray(new.labels)
    p = blocks.position
    assert np.all((new >= blocks.start[p]) & (new < blocks.start[p] + blocks.size[p]))
    assert int(info.num_member_terms) == 5 * 4 + 2 * 1 and int(info.num_nan) == 0
    assert 7 <= int(info.num_candidates) <= 5 * 5 + 2 * 2


def _partitions(items):
    if not items:
        yield []
        return
    for rest in _partitions(items[1:]):
        for k in range(len(rest)):
            yield rest[:k] + [[items[0]] + rest[k]] + rest[k + 1 :]
        yield [[items[0]]] + rest


@pytest.mark.slow
def test_sufficient_statistics_sweep_equal_in_law_to_exact_posterior():
    """4,000 independent chains x 30 sweeps (β = 1) of the sufficient-statistics sweep: the final partitions'
    distribution within the MC tolerance (TV) of the exact posterior over all 52 x 2 partitions, enumerated;
    negative control: the sweep run at β = 1.5 is rejected against the β = 1 posterior."""
    su, x, blocks, f, k = _suff_problem()
    groups = [[i for i in range(7) if blocks.start[blocks.position[i]] == s] for s in np.unique(blocks.start)]
    states, logp = {}, []
    for pa in _partitions(groups[0]):
        for pb in _partitions(groups[1]):
            parts = pa + pb
            key = tuple(sorted(tuple(sorted(c)) for c in parts))
            states[key] = len(states)
            logp.append(sum(f[i, j] for c in parts for a, i in enumerate(c) for j in c[a + 1 :]))
    probs = np.exp(np.asarray(logp) - max(logp))
    probs /= probs.sum()

    def chains(beta):
        def chain(key):
            return jax.lax.fori_loop(
                0, 30, lambda t, s: k.step(jax.random.fold_in(key, t), s, x, beta)[0], su.init(None, blocks)
            ).labels

        return np.asarray(jax.jit(jax.vmap(chain))(jax.random.split(jax.random.key(3), 4000)))

    def codes(labels):
        return np.array(
            [states[tuple(sorted(tuple(np.flatnonzero(lab == c)) for c in np.unique(lab)))] for lab in labels]
        )

    tol = tv_tolerance(probs, 4000)
    assert tv_distance(np.bincount(codes(chains(1.0)), minlength=probs.size) / 4000, probs) < tol
    assert tv_distance(np.bincount(codes(chains(1.5)), minlength=probs.size) / 4000, probs) > tol


def test_crf_similarity_templates_values_and_missing_fields():
    """Thresholded templates by hand: name cos = 1 (≥ high: +w), cos = 0 (< t: -w), missing (0); venue ±w;
    year |Δ| ≤ s (+w), s < |Δ| ≤ 3 s (0), > 3 s (-w), NaN (0); bias added once."""
    kinds = {"name": "string", "venue": "categorical", "year": "numeric"}
    cols = {
        "name": ["ann lee", "ann lee", "zzz", None],
        "venue": ["a", "a", "b", None],
        "year": [2000.0, 2003.0, 2009.0, np.nan],
    }
    sim = co.crf_similarity(
        kinds,
        {"name": 2.0, "venue": 0.5, "year": 1.5},
        thresholds={"name": 0.4},
        high={"name": 0.9},
        scales={"year": 2.0},
        bias=0.25,
    )
    x = sim.pack(co.encode_mentions(cols, kinds, hash_dim=64))
    f = np.asarray(jax.vmap(jax.vmap(sim.factor, (None, 0)), (0, None))(x, x))  # eager
    cos02 = float(np.dot(np.asarray(x["dense"][0, :64]), np.asarray(x["dense"][2, :64])))
    assert cos02 < 0.4
    assert f[0, 0] == pytest.approx(0.25 + 2.0 + 0.5 + 1.5)  # same name, venue, |Δyear| = 0 ≤ 2
    assert f[0, 1] == pytest.approx(0.25 + 2.0 + 0.5 + 0.0)  # 2 < |Δyear| = 3 ≤ 6: 0
    assert f[0, 2] == pytest.approx(0.25 - 2.0 - 0.5 - 1.5)  # cos < t, venues differ, |Δyear| = 9 > 6
    assert np.allclose(f[3, :3], 0.25) and np.allclose(f[:3, 3], 0.25)  # every field missing: bias only
    # between the thresholds (t ≤ cos < high) the name template is 0
    mid = co.crf_similarity({"name": "string"}, thresholds={"name": 0.0}, high={"name": 0.999})
    xm = mid.pack(co.encode_mentions({"name": ["ann lee", "ann leigh"]}, {"name": "string"}, hash_dim=64))
    assert float(mid.factor(jax.tree.map(lambda a: a[0], xm), jax.tree.map(lambda a: a[1], xm))) == 0.0
    with pytest.raises(ValueError, match="high"):
        co.crf_similarity(kinds, thresholds={"name": 0.5}, high={"name": 0.4})
    # no per-cluster sufficient statistic: the sum over a cluster is not bias |C| + u_i . (sum of rows)
    d = np.asarray(x["dense"])
    assert not np.isclose(f[0, 1] + f[0, 2], 0.5 + d[0] @ (d[1] + d[2]))


def test_init_options_and_factor_settings_refuse_bad_values():
    """Every static value is checked at construction with a ValueError naming it (no compilation here)."""
    blocks, state, mentions, _ = _ragged_problem()
    m = blocks.num_mentions
    good = np.asarray(state.labels)
    bad_labels = {
        "integer array of shape": [
            good.astype(np.float32),
            np.where(np.arange(m) == 3, np.nan, good),
            good[:-1],
            good[None],
        ],
        "mention 0 has label -1": [np.where(np.arange(m) == 0, -1, good)],
        "mention 120 has label 0": [np.where(np.arange(m) == 120, 0, good)],  # another block's cluster id
    }
    for message, cases in bad_labels.items():
        for labels in cases:
            with pytest.raises(ValueError, match=message):
                co.init(labels, blocks)
    np.testing.assert_array_equal(np.asarray(co.init(good, blocks).labels), good)  # the control passes
    with pytest.raises(ValueError, match="blocks"):
        co.init(None, np.zeros(3))
    with pytest.raises(ValueError, match="temperatures"):
        co.fit(jax.random.key(0), _factor, mentions, blocks, [1.0, np.nan])
    bad_options = {
        "chunk_size": {"chunk_size": 0},
        "max_candidates": {"max_candidates": 1},
        "min_race_size": {"min_race_size": 19, "first_batch_size": 10},
        "min_arm_draws": [{"min_arm_draws": -0.5}, {"min_arm_draws": 11.0, "first_batch_size": 10}],
        "race_widths": [{"race_widths": (1,)}, {"race_widths": 3}],
        "batch_size": {"batch_size": 0},
        "control_variate": {"control_variate": "yes"},
        "visit": [{"visit": [m]}, {"visit": [[0]]}],
        "schedule": {"schedule": "shared"},
        "delta": [{"delta": 0.0}, {"delta": float("nan")}],
        "cv_members": {"cv_members": 51, "hybrid": True},
    }
    for name, cases in bad_options.items():
        for kw in cases if isinstance(cases, list) else [cases]:
            with pytest.raises(ValueError, match=name):
                co.build_kernel(blocks, **kw)
            with pytest.raises(ValueError, match=name):
                co.build_kernel(blocks, co.CorefOptions(**kw))
    with pytest.raises(TypeError, match="unexpected option"):
        co.build_kernel(blocks, deltaa=0.1)
    with pytest.raises(ValueError, match="options must be a CorefOptions"):
        co.build_kernel(blocks, {"delta": 0.1})
    with pytest.raises(ValueError, match="mention"):
        co.conditional_update(blocks, m)
    kinds = {"name": "string", "year": "numeric"}
    bad_settings = {
        "weights": {"weights": {"name": float("nan")}},
        "thresholds": {"thresholds": {"name": 1.5}},
        "scales": {"scales": {"year": 0.0}},
        "bias": {"bias": float("inf")},
    }
    for name, kw in bad_settings.items():
        for constructor in (co.similarity_factor, co.packed_similarity, co.crf_similarity):
            with pytest.raises(ValueError, match=name):
                constructor(kinds, **kw)
    with pytest.raises(ValueError, match="scales names a field not in kinds"):
        co.packed_similarity(kinds, scales={"yaer": 2.0})
    with pytest.raises(ValueError, match="high"):
        co.crf_similarity(kinds, high={"name": 1.5})
    co.crf_similarity(
        kinds,
        weights={"name": -1.0, "year": 2.0},
        thresholds={"name": -0.2},
        scales={"year": 3.0},
        high={"name": 0.9},
        bias=-1.0,
    )  # in range: accepted
