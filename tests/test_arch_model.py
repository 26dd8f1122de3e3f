"""The ARCH(q) model's second-order control variate (experiments/_arch_model.py).

The racing sweep of the ARCH benchmark reads six coefficients per datum and model instead of a
[P] gradient and a [P, P] Hessian; these tests check that the structured form *is* the
second-order Taylor expansion of the log-likelihood in the padded log-parameters (against
autodiff), and that its data mean, computed from the stored sums only, equals the mean of the
per-datum values (the control variate must have a known mean, or the race is biased).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from helpers import Z_CRITICAL

from experiments._arch_model import (
    MAX_LAG,
    NUM_CV,
    ORDERS,
    ArchData,
    P,
    all_models_loglik,
    control_variate_coefficients,
    control_variate_means,
    cv_mean_values,
    cv_terms,
    cv_values,
    loglik_theta,
    masks,
)

NUM = 48


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    r = rng.standard_t(5, NUM + MAX_LAG).astype(np.float32)
    lagged = np.stack([r[MAX_LAG - i : MAX_LAG - i + NUM] ** 2 for i in range(1, MAX_LAG + 1)], axis=1)
    data = ArchData(jnp.asarray(r[MAX_LAG:]), jnp.asarray(lagged), "synthetic")
    mk = masks()
    mu = np.zeros((len(ORDERS), P), np.float32)
    for k, q in enumerate(ORDERS):
        mu[k, 0] = np.log(0.4)
        mu[k, 1 : q + 1] = np.log(0.3 / q) + 0.2 * rng.standard_normal(q)
        mu[k, -1] = np.log(5.0)
    mu = jnp.asarray(mu) * mk
    alpha_hat = jnp.exp(mu[:, : MAX_LAG + 1]) * mk[:, : MAX_LAG + 1]
    coef = control_variate_coefficients(data, mu, alpha_hat)
    return data, mk, mu, alpha_hat, coef


def _model_values(data, mk, mu, alpha_hat, coef, k, theta, order):
    terms = jax.vmap(lambda lg: cv_terms(alpha_hat[k], mu[k], theta, lg))(data.lagged_sq)
    return cv_values(coef[:, k], *terms, order=order)


def test_cv_is_the_taylor_expansion_of_the_loglikelihood(problem):
    data, mk, mu, alpha_hat, coef = problem
    assert coef.shape == (NUM, len(ORDERS), NUM_CV)

    @jax.jit
    def check(k, key):  # one compile for every model k (traced)
        delta = 0.05 * jax.random.normal(key, (P,)) * mk[k]
        theta = mu[k] + delta

        def along(n):  # l_n(mu + t delta) and its first two t-derivatives at t = 0 (forward mode)
            f = lambda t: loglik_theta(mu[k] + t * delta, mk[k], (data.returns[n], data.lagged_sq[n]))  # noqa: E731
            df = lambda t: jax.jvp(f, (t,), (jnp.ones_like(t),))[1]  # noqa: E731
            t0 = jnp.zeros(())
            return f(t0), df(t0), jax.jvp(df, (t0,), (jnp.ones_like(t0),))[1], f(jnp.ones(()))

        value, first_d, second_d, exact = jax.vmap(along)(jnp.arange(NUM))
        first = _model_values(data, mk, mu, alpha_hat, coef, k, theta, order=1)
        second = _model_values(data, mk, mu, alpha_hat, coef, k, theta, order=2)
        return value + first_d, value + first_d + 0.5 * second_d, first, second, exact, 0.5 * second_d

    for k in (0, 3, 5):
        taylor1, taylor2, first, second, exact, half_second = check(k, jax.random.key(k))
        np.testing.assert_allclose(first, taylor1, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(second, taylor2, rtol=1e-5, atol=1e-5)
        # power: the second-order term is not negligible at this offset, and the
        # second-order proxy is closer to the true log-likelihood than the first-order one
        assert float(jnp.max(jnp.abs(half_second))) > 1e-3
        assert float(jnp.max(jnp.abs(second - exact))) < 0.2 * float(jnp.max(jnp.abs(first - exact)))


def test_cv_mean_from_stored_sums_equals_the_data_mean(problem):
    data, mk, mu, alpha_hat, coef = problem
    means = control_variate_means(data, coef)
    thetas = (mu + 0.1 * jax.random.normal(jax.random.key(7), mu.shape)) * mk

    @jax.jit
    def check(ks):
        out = {}
        for order in (1, 2):
            per_datum = jax.vmap(
                lambda k: _model_values(data, mk, mu, alpha_hat, coef, k, thetas[k], order), out_axes=1
            )(ks)
            one = jax.vmap(
                lambda k: cv_mean_values(
                    jax.tree.map(lambda a: a[k], means), alpha_hat[k], mu[k], thetas[k], order=order
                )
            )(ks)
            out[order] = (per_datum.mean(0), cv_mean_values(means, alpha_hat, mu, thetas, order=order), one)
        return out

    for order, (data_mean, all_models, one_model) in check(jnp.arange(len(ORDERS))).items():
        np.testing.assert_allclose(all_models, data_mean, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(one_model, all_models, rtol=1e-6, atol=1e-6)  # one model: everything sliced at k


@pytest.fixture(scope="module")
def sweep_run(problem):
    """The benchmark's batched 16-chain racing sweep run for 8 sweeps on N = 400 synthetic returns
    (blocks of 2 rows, ``exact_pass_cost=None``): ``(data, pilot, keys, recs)`` with the records of
    every chain-sweep flattened to 128 decisions. Pilot: the fixture's perturbed centres with a
    Laplace scale of 0.1 (any centre keeps the control variate's mean exact)."""
    from experiments._arch_model import Pilot
    from experiments._arch_model import control_variate_means as cv_means
    from experiments.arch_model_selection import make_batched_sweep

    rng = np.random.default_rng(1)
    n = 400
    r = rng.standard_t(5, n + MAX_LAG).astype(np.float32)
    lagged = np.stack([r[MAX_LAG - i : MAX_LAG - i + n] ** 2 for i in range(1, MAX_LAG + 1)], axis=1)
    data = ArchData(jnp.asarray(r[MAX_LAG:]), jnp.asarray(lagged), "synthetic")
    _, mk, mu, alpha_hat, _ = problem
    coef = control_variate_coefficients(data, mu, alpha_hat)
    chol = jnp.where(mk[:, :, None] * jnp.eye(P) > 0, 0.1, 0.0) + (1 - mk)[:, :, None] * jnp.eye(P)
    pilot = Pilot(
        mu=mu,
        chol=chol,
        log_det_chol=jnp.sum(mk, axis=1) * np.log(0.1),
        laplace_log_evidence=jnp.zeros(len(ORDERS)),
        alpha_hat=alpha_hat,
        cv_coef=coef,
        cv_mean=cv_means(data, coef),
        grad_w_at_map=jnp.zeros((len(ORDERS), P)),
    )
    sweep = make_batched_sweep(data, pilot, SWEEP_CHAINS, block_size=2, exact_pass_cost=None)
    keys = jax.random.split(jax.random.key(0), SWEEPS)

    @jax.jit
    def run(keys):
        def body(state, k):
            return sweep(k, state, jnp.zeros(len(ORDERS)))

        init = (
            jnp.asarray(rng.integers(0, len(ORDERS), SWEEP_CHAINS), jnp.int32),
            jnp.zeros((SWEEP_CHAINS, len(ORDERS), P)),
        )
        return jax.lax.scan(body, init, keys)[1]

    recs = jax.tree.map(lambda a: np.asarray(a).reshape((-1,) + a.shape[2:]), run(keys))
    return data, pilot, keys, recs


SWEEP_CHAINS, SWEEPS = 16, 8


@pytest.fixture(scope="module")
def exact_terms(sweep_run):
    """Every recorded decision re-made on all N data (one compiled function for both tests).

    Sums from the model's own functions on the unpacked data (``all_models_loglik``, ``loglik_theta``
    on ``data.data``: independent of the sweep's packed rows), per-datum residuals ``l - h`` from the
    sweep's functions (``sweep_parts``: packed rows and control variates) for the races' standard
    errors, the MH prior ratio, the engine's Gumbel noise and the MH proposal re-made from the recorded
    chain key. Per-datum terms in float32, sums in float64."""
    from experiments.arch_model_selection import sweep_parts

    data, pilot, _, recs = sweep_run
    n, mk = data.num_data, masks()
    parts = sweep_parts(data, pilot)
    every = jnp.arange(n)

    def batch_ll(pos, idx):
        return jax.vmap(lambda row: parts.loglik_fn(pos, row))(parts.rows[idx])

    @jax.jit
    def one(w_old, w_new, k, thetas, key_data, mh_key_data):
        x, xp = (w_old, k), (w_new, k)
        # the MH proposal re-made outside the kernel (build_batched_kernel's key layout: split(chain key)[0])
        (proposed, _), log_q = parts.proposal(jax.random.split(jax.random.wrap_key_data(mh_key_data))[0], x)
        theta, theta_new = (pilot.mu[k] + pilot.chol[k] @ w for w in (w_old, w_new))
        ll = lambda th: jax.vmap(lambda rr, lg: loglik_theta(th, mk[k], (rr, lg)))(*data.data)  # noqa: E731
        d_packed = batch_ll(xp, every) - batch_ll(x, every)
        h = parts.control_variate.value_fn(xp, every) - parts.control_variate.value_fn(x, every)
        key = jax.random.split(jax.random.wrap_key_data(key_data))[1]  # the racing engine's noise key
        return dict(
            mh_terms=ll(theta_new) - ll(theta),
            mh_packed=d_packed,
            mh_resid=d_packed - h,
            dprior=parts.logprior_fn(xp) - parts.logprior_fn(x),
            gibbs_terms=all_models_loglik(thetas, data.data, every),
            gibbs_packed=parts.all_loglik(every, thetas),
            gibbs_resid=parts.all_loglik(every, thetas) - parts.all_cv(every, thetas),
            noise=jax.random.gumbel(key, (len(ORDERS),), jnp.float32),
            proposed=proposed,
            log_q=log_q,
        )

    out = jax.vmap(one)(*(jnp.asarray(recs[f]) for f in ("w_old", "w_prop", "k", "thetas", "gibbs_key", "mh_key")))
    out = {k: np.asarray(v, np.float64) for k, v in out.items()}
    out["mh_sum"] = out.pop("mh_terms").sum(1)  # exact sum of l_n(x') - l_n(x)
    g = out.pop("gibbs_terms")
    out["gibbs_sum"] = (g - g[:, :, :1]).sum(1)  # relative to model 0: the same argmax
    return out


#: Smallest |placed margin| (nats) of the hard-decision test: above the float32 resolution of an
#: all-data sum of the sweep's races (measured at N = 400: full-data float32 decisions disagreed
#: with float64 in 62% of margins < 1e-5, 22% in [1e-5, 3e-5), 6% in [3e-5, 1e-4), none of 234 above).
MIN_MARGIN = 1e-4


def test_batched_sweep_decisions_match_exact_decisions(sweep_run, exact_terms):
    """The benchmark's batched 16-chain racing sweep (arch_model_selection.make_batched_sweep: one
    racing-Gibbs batch for the model indicators, one racing-MH batch for the SGLD proposals, packed
    shuffled rows) makes each chain's decisions as the exact sweep would with the same noise:
    every Gibbs draw (argmax of log f0 + Gumbel noise + all N factors) and MH decision is re-made
    on all N data, and the error rates must be <= delta + MC error (decisions at delta = 0.05).
    Power: a plumbing error (a chain's model, coefficients or CV mean taken from the wrong model or
    row) makes races decide on a wrong estimate, far more often than delta. These decisions are
    mostly easy (0 errors of 128 measured, also at delta = 0.5): the threshold's power is in
    ``test_hard_decisions_within_delta_with_negative_controls``. The batched kernels'
    options are exercised too: blocks of 2 rows (block_size, both kernels) and exact_pass_cost = None
    (no early exact pass: hard races read blocks at random to the end, Alg. 1 as in the paper; one loop
    less to compile than the default 0.25). Sizes: N = 400 returns (200 blocks), 16 chains, 8 sweeps.
    The MH ratio the kernel used is checked independently: the SGLD proposal re-made from the
    sweep's key layout gives the same proposal, and the recorded ratio equals the prior ratio plus
    the proposal ratio (a kernel that dropped the prior from the ratio fails it: negative control)."""
    from experiments.arch_model_selection import DELTA

    data, pilot, keys, recs = sweep_run
    n, ex, m = data.num_data, exact_terms, SWEEP_CHAINS * SWEEPS
    gibbs_exact = np.argmax(recs["log_f0"] + ex["noise"] + ex["gibbs_sum"], axis=1)
    mh_exact = recs["log_u"] < recs["log_ratio"] + ex["mh_sum"]
    gibbs_errors, mh_errors = int(np.sum(gibbs_exact != recs["k"])), int(np.sum(mh_exact != recs["accepted"]))
    # the packed, shuffled rows carry the same data: per-model sums agree with the unpacked data
    np.testing.assert_allclose(ex["mh_packed"].sum(1), ex["mh_sum"], rtol=1e-4, atol=1e-3)
    g = ex["gibbs_packed"]
    np.testing.assert_allclose((g - g[:, :, :1]).sum(1), ex["gibbs_sum"], rtol=1e-4, atol=1e-2)
    allowed = DELTA * m + Z_CRITICAL * np.sqrt(m * DELTA * (1 - DELTA))
    assert gibbs_errors <= allowed and mh_errors <= allowed, (gibbs_errors, mh_errors, allowed)
    assert not recs["has_nan"].any()
    assert len(set(recs["k"].tolist())) > 1 and 0 < recs["accepted"].mean() < 1  # models and decisions vary
    assert recs["gibbs_evals"].mean() < n * len(ORDERS)  # races stopped early
    assert np.all(recs["mh_evals"] % 2 == 0)  # blocks of 2 rows

    # The MH ratio, re-made outside the kernel (exact_terms): same proposal, ratio = prior + proposal ratios.
    w_new, d_prior, log_q = ex["proposed"], ex["dprior"], ex["log_q"]
    np.testing.assert_allclose(w_new, recs["w_prop"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(recs["log_ratio"], d_prior + log_q, rtol=1e-4, atol=1e-4)
    # negative control: the ratio without the prior is told apart by this check
    assert np.max(np.abs(recs["log_ratio"] - log_q)) > 1e-2


NEAR, HARD_DELTA = 1024, 0.1


def _placements(se, rng):
    """Decisions (with replacement) among those whose margins stay >= MIN_MARGIN nats, and their
    placements u (first-stage standard errors): NEAR with |u| in [0.02, 0.1] then NEAR with |u| in
    [0.02, 3], random sign."""
    ok = np.flatnonzero(0.02 * se >= MIN_MARGIN)
    assert len(ok) >= len(se) // 4, len(ok)  # the placements cover many of the sweep's decisions
    which = rng.choice(ok, 2 * NEAR)
    size = np.concatenate([rng.uniform(0.02, 0.1, NEAR), rng.uniform(0.02, 3.0, NEAR)])
    return which, rng.choice([-1.0, 1.0], 2 * NEAR) * size


def _allowed(k, delta=HARD_DELTA):
    return delta + Z_CRITICAL * np.sqrt(delta * (1 - delta) / k)


def test_hard_mh_decisions_within_delta_with_negative_controls(sweep_run, exact_terms):
    """The sweep's own MH races (its likelihoods, second-order control variates, prior and SGLD pairs:
    ``arch_model_selection.sweep_parts``) decide within delta where decisions are hardest, and broken
    variants are rejected.

    The 128 recorded MH decisions of ``sweep_run`` are re-raced with the exact answer placed on purpose
    (the analogue of ``test_racing_mh::test_decision_error_at_most_delta_with_negative_control``):
    log u at the exact log ratio (recorded prior + proposal ratio, checked independently in the test
    above, + the all-N log-likelihood sum in float64) minus ``u`` first-stage standard errors of the
    race's CV-corrected estimate, |u| uniform in [0.02, 0.1] (hardest; 1,024 races) and in [0.02, 3]
    (1,024), random sign, on decisions drawn from those whose placed margins stay >= MIN_MARGIN nats
    (above the float32 resolution of an all-data sum; a margin below it is decided by round-off, by
    racing and by the exact float32 sampler alike). Races: ``mh_decision`` with the thresholds as
    traced coefficients (one compile for every variant), m1 = 50 rows, delta = 0.1 (the sweep runs
    0.05; 0.1 gives more power per decision), no early exact pass (it only removes error events).
    Each group's wrong-decision share must be <= delta + 4 MC sd. Negative controls that must fail the
    same check near the threshold: the threshold without the union split over stages (z_{1-delta} at
    every stage, the naive Austerity rule) and the ratio with the prior dropped. Measured:
    error 0.089 near the threshold, 0.008 in the wide group (allowed 0.1375); without the union split
    0.192, prior dropped 0.476. What it cannot detect: errors that only appear in the exact pass, at
    other N or block sizes, or below the float32 resolution; plumbing of the sweep itself is the test
    above; the Gibbs half is ``test_hard_gibbs_draws_within_delta_and_loosened_threshold_rejected``."""
    import jaxsub
    from experiments.arch_model_selection import FIRST_BATCH, sweep_parts
    from jaxsub.racing_mh import mh_decision, pair_cv

    data, pilot, _, recs = sweep_run
    n, m1, delta, ex, near = data.num_data, FIRST_BATCH, HARD_DELTA, exact_terms, NEAR
    parts = sweep_parts(data, pilot)
    rng = np.random.default_rng(3)
    allowed = _allowed

    def batch_ll(pos, idx):
        return jax.vmap(lambda row: parts.loglik_fn(pos, row))(parts.rows[idx])

    # ---- MH --------------------------------------------------------------------------------
    total = ex["mh_sum"] + recs["log_ratio"].astype(np.float64)  # exact log acceptance ratio
    se = n * ex["mh_resid"].std(1) / np.sqrt(m1)
    pair, units = _placements(se, rng)
    log_u = total[pair] - units * se[pair]
    exact_accept = units > 0

    @jax.jit
    def mh_race(keys, w_old, w_new, k, gaps, lus, a, b):
        def one(key, w, wp, kk, gap, lu):
            x, xp = (w, kk), (wp, kk)
            accept, evals, *_ = mh_decision(
                key,
                gap,
                lu,
                lambda idx: jnp.stack([batch_ll(x, idx), batch_ll(xp, idx)], -1),
                n,
                delta=delta,
                first_batch_size=m1,
                bound="normal",
                exact=False,
                pair_control_variate=pair_cv(parts.control_variate, x, xp),
                coefficients=(a, b),
                exact_pass_cost=None,
                max_block_size=m1,
            )
            return accept, evals

        return jax.vmap(one)(keys, w_old, w_new, k, gaps, lus)

    mh_keys = jax.random.split(jax.random.key(11), 2 * near)
    args = [jnp.asarray(recs[f][pair]) for f in ("w_old", "w_prop", "k")]
    gaps = jnp.asarray(recs["log_ratio"][pair], jnp.float32)
    a2, b2 = (jnp.asarray(v, jnp.float32) for v in jaxsub.discrete.racing_coefficients(delta, 2, n, m1))
    naive2 = a2 * float(scipy.stats.norm.ppf(1 - delta) / jaxsub.discrete.b_normal(delta, n, m1))

    def mh_errors(gap_values, a):
        accept, evals = mh_race(mh_keys, *args, gap_values, jnp.asarray(log_u, jnp.float32), a, b2)
        return np.asarray(accept) != exact_accept, np.asarray(evals)

    errors, evals = mh_errors(gaps, a2)
    assert errors[:near].mean() <= allowed(near), f"MH near the threshold: {errors[:near].mean():.4f}"
    assert errors[near:].mean() <= allowed(near), f"MH +-3 se: {errors[near:].mean():.4f}"
    assert errors[:near].sum() > 0 and np.mean(evals[near:]) < 2 * n  # hard near, early stops far
    loose = mh_errors(gaps, naive2)[0][:near].mean()
    no_prior = mh_errors(gaps - jnp.asarray(ex["dprior"][pair], jnp.float32), a2)[0][:near].mean()
    assert loose > allowed(near), f"MH: the threshold without the union split passed ({loose:.4f})"
    assert no_prior > allowed(near), f"MH: the ratio without the prior passed ({no_prior:.4f})"


@pytest.mark.slow
def test_hard_gibbs_draws_within_delta_and_loosened_threshold_rejected(sweep_run, exact_terms):
    """The Gibbs half of the test above (slow: one more compile, ~6 CPU-s; the racing Gibbs kernel's
    threshold power is the fast ``test_racing_gibbs::test_hard_decisions_within_delta_and_loosened_threshold_rejected``).

    The 128 recorded model-indicator draws are re-raced over the 6 models with the sweep's likelihoods
    and control variates (``racing(...).with_coefficients``, the batched kernel's engine, same key
    layout): the runner-up's log f0 is moved so that its noisy exact score (log f0 + the engine's
    Gumbel noise + all-N sum, float64) is ``u`` standard errors of the pair's first-stage estimate from
    the best's, placements as in the MH test. Wrong draws <= delta + 4 MC sd in each group; the
    threshold without the union split (over stages and arm pairs) must fail near the threshold.
    Measured: 0.032 near, 0.002 wide (allowed 0.1375); without the union split 0.192."""
    import jaxsub
    from experiments.arch_model_selection import FIRST_BATCH, sweep_parts

    data, pilot, _, recs = sweep_run
    n, m1, delta, ex, near = data.num_data, FIRST_BATCH, HARD_DELTA, exact_terms, NEAR
    parts = sweep_parts(data, pilot)
    rng = np.random.default_rng(4)
    allowed = _allowed
    num = len(recs["k"])

    # ---- Gibbs -----------------------------------------------------------------------------
    gkeys = jax.vmap(jax.random.wrap_key_data)(jnp.asarray(recs["gibbs_key"]))
    log_f0 = recs["log_f0"].astype(np.float64)
    score = log_f0 + ex["noise"] + ex["gibbs_sum"]
    order = np.argsort(-score, axis=1)
    best, second = order[:, 0], order[:, 1]
    rows_ = np.arange(num)
    resid_g = ex["gibbs_resid"]
    se_g = n * np.std(resid_g[rows_, :, second] - resid_g[rows_, :, best], axis=1) / np.sqrt(m1)
    pair, units = _placements(se_g, rng)
    new_f0 = log_f0[pair].copy()
    new_f0[np.arange(2 * near), second[pair]] += (score[pair, best[pair]] - score[pair, second[pair]]) + units * se_g[
        pair
    ]
    exact_draw = np.where(units > 0, second[pair], best[pair])

    @jax.jit
    def gibbs_race(keys, thetas, f0s, a, b):
        def one(key, th, f0):
            sample = jaxsub.discrete.racing(
                lambda idx: parts.all_loglik(idx, th),
                len(ORDERS),
                n,
                delta=delta,
                first_batch_size=m1,
                bound="normal",
                variance="pairwise",
                exact_pass_cost=None,
                max_block_size=m1,
                control_variate=(lambda idx: parts.all_cv(idx, th), parts.all_cv_mean(th)),
            )
            x, info = sample.with_coefficients(key, f0, a, b)
            return x, info.num_evaluations

        return jax.vmap(one)(keys, thetas, f0s)

    a6, b6 = (jnp.asarray(v, jnp.float32) for v in jaxsub.discrete.racing_coefficients(delta, len(ORDERS), n, m1))
    naive6 = a6 * float(scipy.stats.norm.ppf(1 - delta) / jaxsub.discrete.b_normal(delta / (len(ORDERS) - 1), n, m1))
    g_args = (gkeys[pair], jnp.asarray(recs["thetas"][pair]), jnp.asarray(new_f0, jnp.float32))
    draws, g_evals = (np.asarray(v) for v in gibbs_race(*g_args, a6, b6))
    g_errors = draws != exact_draw
    assert g_errors[:near].mean() <= allowed(near), f"Gibbs near the threshold: {g_errors[:near].mean():.4f}"
    assert g_errors[near:].mean() <= allowed(near), f"Gibbs +-3 se: {g_errors[near:].mean():.4f}"
    assert g_errors[:near].sum() > 0 and np.mean(g_evals[near:]) < n * len(ORDERS)
    g_loose = (np.asarray(gibbs_race(*g_args, naive6, b6)[0]) != exact_draw)[:near].mean()
    assert g_loose > allowed(near), f"Gibbs: the threshold without the union split passed ({g_loose:.4f})"
