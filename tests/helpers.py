"""Test helpers: jit/vmap variants, API checks and Monte-Carlo-error-based assertions.

Statistical tolerances are *derived*, never hand-tuned: a mean is compared
with its Monte Carlo standard error ``sd / sqrt(ESS)`` (ESS from BlackJAX's
diagnostics over several chains), a discrete distribution with a
chi-square/total-variation bound computed from the number of draws. The
z-threshold ``Z_CRITICAL`` fixes the false-alarm probability of each check.
Every check is also *ESS-gated*: when the chains carry too little information
for the comparison to mean anything (ESS below ``min_ess``) it fails instead of
passing vacuously.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
from blackjax.diagnostics import effective_sample_size
from scipy import stats

#: Two-sided z threshold: P(|N(0,1)| > 4.0) = 6.3e-5 per coordinate checked, so a
#: suite of ~100 such checks has a false-alarm probability below 1% with fixed seeds
#: making any one outcome reproducible.
Z_CRITICAL = 4.0
#: False-alarm probability for the distribution-level checks (chi-square, TV).
ALPHA = 1e-4


def variants(fn: Callable) -> dict[str, Callable]:
    """``{'without_jit': fn, 'with_jit': jax.jit(fn)}`` for parametrised tests."""
    return {"without_jit": fn, "with_jit": jax.jit(fn)}


def ess_per_coordinate(samples) -> np.ndarray:
    """ESS of each coordinate of ``samples`` shaped ``[chains, draws, ...]``."""
    samples = jnp.asarray(samples)
    if samples.ndim < 2:
        raise ValueError("samples must be shaped [chains, draws, ...]")
    return np.atleast_1d(np.asarray(effective_sample_size(samples, chain_axis=0, sample_axis=1)))


def assert_mean_matches(samples, expected_mean, *, min_ess: float = 200.0, z: float = Z_CRITICAL, extra_sd=None):
    """Assert the per-coordinate sample mean is within ``z`` Monte Carlo standard errors.

    Parameters
    ----------
    samples
        Array ``[chains, draws, ...]``.
    expected_mean
        Known mean, broadcastable to ``samples.shape[2:]``.
    min_ess
        ESS gate: fail if any coordinate has fewer effective samples.
    z
        Number of MCSEs allowed.
    extra_sd
        Optional extra standard error added in quadrature (e.g. the MC error of
        a reference computed by simulation).
    """
    samples = np.asarray(samples, dtype=np.float64)
    ess = ess_per_coordinate(samples)
    assert np.all(ess >= min_ess), f"ESS gate failed: min ESS {ess.min():.1f} < {min_ess}"
    flat = samples.reshape(-1, *samples.shape[2:])
    mean = flat.mean(axis=0)
    sd = flat.std(axis=0, ddof=1)
    mcse = np.atleast_1d(sd).ravel() / np.sqrt(ess)
    mcse = mcse.reshape(np.shape(mean))
    if extra_sd is not None:
        mcse = np.sqrt(mcse**2 + np.asarray(extra_sd) ** 2)
    err = np.abs(mean - np.asarray(expected_mean))
    assert np.all(err <= z * mcse), (
        f"mean {mean} differs from {np.asarray(expected_mean)} by {err}, allowed {z} x MCSE = {z * mcse} (ESS {ess})"
    )


def assert_variance_matches(samples, expected_var, *, min_ess: float = 200.0, z: float = Z_CRITICAL):
    """Assert per-coordinate variance matches, with MCSE of the second moment.

    Uses the delta-method standard error of the sample variance,
    ``sqrt((m4 - s^4) / ESS)``, with ESS of the squared centred draws.
    """
    samples = np.asarray(samples, dtype=np.float64)
    centred = samples - samples.reshape(-1, *samples.shape[2:]).mean(axis=0)
    sq = centred**2
    ess = ess_per_coordinate(sq)
    assert np.all(ess >= min_ess), f"ESS gate failed: min ESS {ess.min():.1f} < {min_ess}"
    flat = sq.reshape(-1, *samples.shape[2:])
    var = flat.mean(axis=0)
    se = np.sqrt(flat.var(axis=0, ddof=1) / ess.reshape(np.shape(var)))
    err = np.abs(var - np.asarray(expected_var))
    assert np.all(err <= z * se), f"variance {var} vs {expected_var}: error {err} > {z} x SE {z * se}"


def tv_distance(p, q) -> float:
    """Total variation distance between two probability vectors."""
    return 0.5 * float(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum())


def tv_tolerance(probs, num_draws: int, alpha: float = ALPHA) -> float:
    """Upper (1 - alpha) bound on TV(empirical, p) for ``num_draws`` iid draws from ``p``.

    ``E[TV] <= 0.5 * sum_i sqrt(p_i (1 - p_i) / n)`` (Jensen) and TV is 1/n-Lipschitz
    in each draw, so by McDiarmid ``P(TV > E[TV] + t) <= exp(-2 n t^2)``, i.e.
    ``t = sqrt(log(1/alpha) / (2n))``.
    """
    p = np.asarray(probs, np.float64)
    mean_bound = 0.5 * np.sum(np.sqrt(p * (1 - p) / num_draws))
    return float(mean_bound + math.sqrt(math.log(1 / alpha) / (2 * num_draws)))


def empirical_distribution(draws, num_states: int) -> np.ndarray:
    draws = np.asarray(draws).ravel()
    return np.bincount(draws, minlength=num_states)[:num_states] / draws.size


def assert_tv_within(draws, probs, slack: float = 0.0, alpha: float = ALPHA):
    """Assert TV(empirical(draws), probs) <= slack + Monte Carlo tolerance (iid draws)."""
    probs = np.asarray(probs, np.float64)
    emp = empirical_distribution(draws, probs.size)
    n = np.asarray(draws).size
    tol = slack + tv_tolerance(probs, n, alpha)
    tv = tv_distance(emp, probs)
    assert tv <= tol, f"TV {tv:.4g} > allowed {tol:.4g} (slack {slack:.3g}, n={n})"


def assert_discrete_matches(draws, probs, alpha: float = ALPHA):
    """Chi-square goodness-of-fit of iid ``draws`` to ``probs`` (states with p=0 must never occur)."""
    probs = np.asarray(probs, np.float64)
    counts = np.bincount(np.asarray(draws).ravel(), minlength=probs.size)
    assert counts.size == probs.size, f"draws contain states >= {probs.size}"
    zero = probs == 0
    assert counts[zero].sum() == 0, f"states with zero probability drawn: {np.flatnonzero(zero & (counts > 0))}"
    n = counts.sum()
    expected = probs[~zero] * n
    stat = float(((counts[~zero] - expected) ** 2 / expected).sum())
    pval = stats.chi2.sf(stat, df=max(1, (~zero).sum() - 1))
    assert pval > alpha, (
        f"chi-square p-value {pval:.3g} <= {alpha} (stat {stat:.3g}, counts {counts}, expected {expected})"
    )


def assert_follows_sampling_api(algorithm, position, rng_key, *, num_steps: int = 3):
    """Check the common jaxsub/BlackJAX sampler contract.

    * ``algorithm.init(position)`` and ``algorithm.step(rng_key, state)`` exist
      with those leading parameters;
    * ``step`` returns ``(state, info)``, both NamedTuples, and the state keeps
      its pytree structure, shapes and dtypes (so it can be carried by ``lax.scan``);
    * the jitted step traces once across repeated calls (no recompilation);
    * the step vmaps over a batch of two chains.
    """
    assert callable(algorithm.init) and callable(algorithm.step)
    step_params = list(inspect.signature(algorithm.step).parameters)
    assert step_params[:2] == ["rng_key", "state"], f"step parameters are {step_params}"
    init_params = list(inspect.signature(algorithm.init).parameters)
    assert init_params[0] == "position", f"init parameters are {init_params}"
    state = algorithm.init(position)
    assert hasattr(state, "_fields"), "state must be a NamedTuple"

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(key, s):
        return algorithm.step(key, s)

    for i in range(num_steps):
        new_state, info = step(jax.random.fold_in(rng_key, i), state)
        assert hasattr(info, "_fields"), "info must be a NamedTuple"
        chex.assert_trees_all_equal_shapes_and_dtypes(new_state, state)
        state = new_state
    chex.clear_trace_counter()

    batched = jax.vmap(algorithm.init)(jax.tree.map(lambda x: jnp.stack([x, x]), position))
    keys = jax.random.split(rng_key, 2)
    new_batched, _ = jax.jit(jax.vmap(algorithm.step))(keys, batched)
    chex.assert_trees_all_equal_shapes_and_dtypes(new_batched, batched)
