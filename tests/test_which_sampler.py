"""The bookkeeping of ``experiments/which_sampler.py``: running moments, the time-to-target rule, the SG-MCMC step rule."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("numpyro")
ws = pytest.importorskip("experiments.which_sampler")


class _Reference:
    def __init__(self, mean, sd):
        self.ref_mean, self.ref_sd = np.asarray(mean), np.asarray(sd)


def test_moments_equal_the_direct_computation_with_whole_chunk_burn_in():
    rng = np.random.default_rng(0)
    ref = _Reference(rng.normal(size=3), 0.5 + np.abs(rng.normal(size=3)))
    moments, chunks = ws.Moments(ref), []
    for steps in (3, 7, 7, 2, 11, 5, 9, 4, 6, 8, 1, 12, 7):
        chunk = 1.0 + 2.0 * rng.normal(size=(4, steps, 3)).astype(np.float32)
        chunks.append(chunk)
        error, ratio = moments.add(chunk)
        ends = np.cumsum([c.shape[1] for c in chunks])
        dropped = int(np.sum(ends <= ends[-1] // 5))
        dropped = min(dropped, len(chunks) - 1)  # at least the newest chunk is kept
        kept = np.concatenate(chunks[dropped:], axis=1).reshape(-1, 3).astype(np.float64)
        direct_ratio = kept.std(0) / ref.ref_sd
        np.testing.assert_allclose(error, np.max(np.abs(kept.mean(0) - ref.ref_mean) / ref.ref_sd), rtol=1e-9)
        np.testing.assert_allclose(ratio, direct_ratio[np.argmax(np.abs(np.log(direct_ratio)))], rtol=1e-9)


def test_seconds_to_target_is_the_start_of_the_last_stretch_within_target():
    curve = ws.Curve(
        seconds=[1.0, 2.0, 3.0, 4.0, 5.0],
        mean_error=[0.5, 0.05, 0.2, 0.08, 0.07],
        sd_ratio=[1.0, 1.0, 1.0, 1.05, 0.95],
        compile_seconds=0.0,
    )
    assert ws.seconds_to_target(curve) == 4.0
    left = curve._replace(sd_ratio=[1.0, 1.0, 1.0, 1.05, 0.85])  # sd ratio leaves [0.9, 1.1] at the end
    assert ws.seconds_to_target(left) is None
    assert ws._summary([1.0, 2.0, None]) == "2 [1, never]"
    assert ws._summary([None, None, 3.0]).startswith("never (1/3")


def _gaussian_mean_model(y=None):
    import numpyro
    import numpyro.distributions as dist

    theta = numpyro.sample("theta", dist.Normal(0.0, 10.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.Normal(theta, 1.0), obs=y)


@pytest.fixture(scope="module")
def gaussian_problem():
    y = np.asarray(jax.random.normal(jax.random.key(0), (4_000,)) * 1.0 + 0.3, np.float32)
    import jaxsub

    model = jaxsub.models.from_numpyro(_gaussian_mean_model, data={"y": y})
    fit = jaxsub.racing_mh.laplace_fit(model.logprior_fn, model.loglikelihood_fn, model.data, model.initial_position)
    cov = np.asarray(fit.cov_cholesky @ fit.cov_cholesky.T, np.float64)
    problem = ws.Problem("gaussian mean", _gaussian_mean_model, {"y": y}, model, fit, cov, None, None)
    return problem, y


def test_gradient_noise_of_the_gaussian_mean_is_the_data_variance_and_zero_once_centred(gaussian_problem):
    problem, y = gaussian_problem
    # per-datum gradient of -(y - θ)²/2 is y - θ: its covariance is var(y); centred it is constant.
    np.testing.assert_allclose(ws.gradient_noise(problem, centred=False), np.var(y, ddof=1), rtol=1e-4)
    assert ws.gradient_noise(problem, centred=True) < 1e-8


def test_noise_limited_step_adds_one_tenth_to_the_injected_noise(gaussian_problem):
    problem, y = gaussian_problem
    noise, n, num_data = float(np.var(y, ddof=1)), 100, y.shape[0]
    h = ws.noise_limited_step(problem, noise, n)
    # SGLD's Euler step: minibatch gradient noise h² N² λ / n against injected 2h.
    np.testing.assert_allclose(h**2 * num_data**2 * noise / n / (2 * h), 0.1, rtol=1e-6)
    a = 0.01
    h_sghmc = ws.noise_limited_step(problem, noise, n, friction=a)
    np.testing.assert_allclose(h_sghmc**2 * num_data**2 * noise / n / (2 * a * h_sghmc), 0.1, rtol=1e-6)
    # the cap: a tiny gradient noise cannot push the step past 0.1 of the smallest Laplace variance
    assert ws.noise_limited_step(problem, 1e-30, n) == pytest.approx(0.1 * ws._min_variance(problem))
    assert jnp.isfinite(h)


def test_table_and_plot_read_the_metrics_record(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    curve = {"seconds": [1.0, 2.0], "mean_error": [0.3, 0.05], "sd_ratio": [1.3, 1.02], "compile_seconds": 4.0}
    never = {**curve, "mean_error": [0.3, 0.2]}
    metrics = {
        "a": {"nuts": {"seconds_to_target": [2.0, 2.0, 2.0], "curves": [curve] * 3}},
        "b": {"sgld": {"seconds_to_target": [None] * 3, "curves": [never] * 3}},
    }
    rows = ws.table_rows(metrics)
    assert rows == [
        ("a", "nuts", "2 [2, 2]", "4", "0.05", "1.02"),
        ("b", "sgld", "never (0/3 seeds reached)", "4", "0.2", "1.02"),
    ]
    fig = ws.plot_curves(metrics)
    assert len(fig.axes) == 4
    fig.savefig(tmp_path / "plot.png")


def test_verdicts_compare_the_fastest_of_ours_with_the_fastest_peer():
    def record(hits):
        return {"seconds_to_target": hits, "curves": []}

    metrics = {
        "p": {
            "nuts": record([10.0, 12.0, 11.0]),
            "hmcecs": record([4.0, 6.0, None]),
            "racing_mh": record([2.0, 3.0, 2.5]),
            "cg_dsgld": record([None] * 3),
        },
        "q": {"nuts": record([5.0] * 3), "racing_mh": record([None, None, 1.0])},
        "r": {"sgld": record([None] * 3), "compressed_nuts": record([None] * 3)},
    }
    assert ws.verdicts(metrics) == [
        "p: racing_mh 2.5 s against hmcecs 6 s: 2.4x sooner",
        "q: the peer nuts reaches the target in 5 s; no jaxsub sampler does within the budget",
        "r: neither reaches the target within the budget",
    ]


def test_reference_moments_keep_the_spread_of_draws_far_from_zero():
    # 4 chains x 4,000 kept draws of a coefficient near 0.988 with sd 2.7e-4 (the flights linear
    # posterior's slope): float32 row-by-row accumulation biases the mean by about 0.12 sd.
    rng = np.random.default_rng(1)
    draws = (0.987994 + 2.7e-4 * rng.normal(size=(4, 5_000, 2))).astype(np.float32)
    moments = ws.reference_moments(draws, burn_in=1_000)
    kept = draws[:, 1_000:].astype(np.float64).reshape(-1, 2)
    np.testing.assert_allclose(moments["ref_mean"], kept.mean(0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(moments["ref_sd"], kept.std(0), rtol=1e-9)
    naive = draws[:, 1_000:].reshape(-1, 2).mean(0)  # the float32 accumulation this function avoids
    assert np.max(np.abs(naive - kept.mean(0)) / kept.std(0)) > 0.05
