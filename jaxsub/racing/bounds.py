"""Uncertainty bounds of the racing algorithm (Chen & Ghahramani 2016, §3.3).

Everything here is static configuration, computed once in NumPy/SciPy at
construction time (outside ``jit``) and inserted into the traced sampler as
Python floats.

* :func:`doubling_schedule` -- the cumulative sample sizes ``T_t = m1 2^(t-1)``
  clipped to ``N`` (Alg. 1 with the doubling schedule).
* :func:`b_normal` -- the constant ``B_Normal(delta; N, m1)`` of eq. 9, the
  solution of ``P(max_{t < t*} z_t > B) = delta`` for the Gaussian random walk
  of Corollary 4 (NOTES.md §1), by a 1-D quadrature recursion and Brent's method.
* :func:`normal_crossing_probability` -- the left-hand side of that equation;
  :func:`first_crossing_probabilities` -- its split by stage (one- or two-sided), the
  law of the stage at which a race between equal arms first eliminates one.
* :data:`KAPPA_EBS` -- the constant of the empirical Bernstein-Serfling bound (eq. 6).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import optimize, special

from jaxsub.racing.info import check_sizes
from jaxsub.validation import check_choice, check_int, check_real

__all__ = [
    "KAPPA_EBS",
    "SCHEDULES",
    "b_normal",
    "doubling_schedule",
    "ebs_rho",
    "fixed_schedule",
    "race_schedule",
    "first_crossing_probabilities",
    "normal_crossing_probability",
    "racing_coefficients",
    "stage_sd",
]

#: kappa = 7/3 + 3/sqrt(2) of the empirical Bernstein-Serfling bound, eq. 6
#: (Bardenet & Maillard 2013, Thm. 3).
KAPPA_EBS = 7.0 / 3.0 + 3.0 / math.sqrt(2.0)

#: Lower end of the quadrature grid for the standardised walk z_t. Each z_t is
#: marginally N(0, 1) and P(z < -9) = 1.1e-19, far below any delta we solve for.
_Z_LOW = -9.0
#: Grid spacing of the trapezoid rule. The transition kernel of the walk has
#: standard deviation sqrt(1 - rho^2) >= 0.57 for a doubling schedule, so
#: h = 0.04 resolves it with >= 14 points per sd: the crossing probability
#: agrees with a 4x finer grid to a relative 1e-4 for delta in [1e-5, 0.1]
#: (and with direct Monte Carlo in tests/test_discrete_bounds.py).
_Z_STEP = 0.04


def doubling_schedule(num_data: int, first_batch_size: int) -> tuple[int, ...]:
    """Cumulative sample sizes ``(T_1, ..., T_t*)`` of the doubling schedule.

    ``T_t = m1 * 2^(t-1)`` clipped to ``N``, with ``t* = ceil(log2(N / m1)) + 1``
    so that ``T_t* = N`` (Alg. 1 and §3.3 of the paper).

    Parameters
    ----------
    num_data
        ``N >= 1``.
    first_batch_size
        ``m1`` in ``[1, N]``.

    Returns
    -------
    tuple of int
        ``(T_1, ..., T_t*)``, increasing, ending at ``N``.

    Raises
    ------
    ValueError
        If ``num_data`` or ``first_batch_size`` is out of range.
    """
    n = check_int("num_data", num_data, low=1)
    m1 = check_int("first_batch_size", first_batch_size, low=1, high=n)
    sizes = [m1]
    while sizes[-1] < n:
        sizes.append(min(2 * sizes[-1], n))
    return tuple(sizes)


#: Stage schedules of a race: Alg. 1's doubling schedule, or one test then the exact stage.
SCHEDULES = ("doubling", "fixed")


def fixed_schedule(num_data: int, first_batch_size: int) -> tuple[int, ...]:
    """``(m1, N)``: one tested stage of ``m1`` data, then the exact stage (``(N,)`` when ``m1 = N``).

    The small-population schedule (``schedule="fixed"``): a race makes a single elimination
    test after ``m1`` data and finishes the surviving arms on all ``N`` (the exact pass when it
    is cheaper), so it compiles two stage loops instead of one per chunk size of the doubling
    schedule, and its threshold is a single-stage quantile (no random walk over stages).
    """
    n = check_int("num_data", num_data, low=1)
    m1 = check_int("first_batch_size", first_batch_size, low=1, high=n)
    return (m1, n) if m1 < n else (n,)


def race_schedule(num_data: int, first_batch_size: int, schedule: str = "doubling") -> tuple[int, ...]:
    """The cumulative stage sizes ``T_1 < ... < T_t* = N`` of ``schedule`` (one of :data:`SCHEDULES`)."""
    schedule = check_choice("schedule", schedule, SCHEDULES)
    return (doubling_schedule if schedule == "doubling" else fixed_schedule)(num_data, first_batch_size)


def stage_sd(num_data: int, sizes) -> np.ndarray:
    """``sd_t = sqrt((1/T_t)(1 - (T_t - 1)/(N - 1)))``: the standard deviation of
    the mean of ``T_t`` draws without replacement from a unit-variance population
    of size ``N`` (Remark 5). Zero at ``T_t = N``."""
    t = np.asarray(sizes, dtype=np.float64)
    if num_data == 1:
        return np.zeros_like(t)
    return np.sqrt(np.clip((1.0 / t) * (1.0 - (t - 1.0) / (num_data - 1.0)), 0.0, None))


def _walk(num_data: int, first_batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """AR(1) coefficients of the standardised walk over stages t < t*.

    ``z_t = (mu_hat_t - mu) / sd_t`` has ``corr(z_s, z_t) = sd_t / sd_s`` for
    ``s < t`` (nested samples: Cov(mu_hat_s, mu_hat_t) = Var(mu_hat_t)), so
    ``z_t | z_{t-1} ~ N(rho_t z_{t-1}, 1 - rho_t^2)`` with ``rho_t = sd_t / sd_{t-1}``.
    Returns ``(rho, s)`` for the transitions into stages ``2 .. t*-1``.
    """
    sizes = doubling_schedule(num_data, first_batch_size)
    sd = stage_sd(num_data, sizes[:-1])  # stages t < t*: sd > 0
    rho = sd[1:] / sd[:-1]
    return rho, np.sqrt(np.clip(1.0 - rho**2, 1e-300, None))


def normal_crossing_probability(bound: float, num_data: int, first_batch_size: int) -> float:
    """``P(max_{t < t*} z_t > bound)`` for the Gaussian walk of Corollary 4.

    Computed as ``sum_t P(z_1..z_{t-1} <= B, z_t > B)`` by propagating the
    sub-density of the surviving walk on a grid (trapezoid rule), so small
    probabilities are not lost to cancellation in ``1 - P(survive)``.

    Parameters
    ----------
    bound
        The threshold B.
    num_data, first_batch_size
        N and m1, which fix the schedule (and hence the correlations).

    Returns
    -------
    float
        The crossing probability (0 when the schedule has a single stage, T_1 = N).
    """
    sizes = doubling_schedule(num_data, first_batch_size)
    if len(sizes) == 1:
        return 0.0
    rho, s = _walk(num_data, first_batch_size)
    b = float(bound)
    total = float(special.ndtr(-b))  # P(z_1 > B)
    if rho.size == 0:
        return total
    num = max(int(math.ceil((b - _Z_LOW) / _Z_STEP)), 2) + 1
    z = np.linspace(_Z_LOW, b, num)
    h = z[1] - z[0]
    w = np.full(num, h)
    w[0] = w[-1] = h / 2  # trapezoid weights
    dens = np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)  # sub-density of z_1 on (-inf, B]
    for r, sd in zip(rho, s):
        mass = dens * w
        # P(z_t > B | z_{t-1}) integrated against the surviving sub-density.
        total += float(mass @ special.ndtr((r * z - b) / sd))
        kernel = np.exp(-0.5 * ((z[:, None] - r * z[None, :]) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
        dens = kernel @ mass
    return total


def first_crossing_probabilities(
    bound: float, num_data: int, first_batch_size: int, *, two_sided: bool = False
) -> np.ndarray:
    """``P(|z_1|, ..., |z_{t-1}| <= B, |z_t| > B)`` for each tested stage ``t < t*`` (``two_sided``),
    or the one-sided ``P(z_1..z_{t-1} <= B, z_t > B)``: the stage at which the Gaussian walk of
    Corollary 4 first crosses the threshold.

    For two arms with equal means raced with Racing-Normal (pairwise variance, the threshold
    ``B = B_Normal(delta, N, m1)``, no skewness guard), the two-sided form is the law of the stage
    at which the race eliminates an arm (each side is an error of the test), so the per-stage
    elimination counts of the engine can be checked against it (tests/test_discrete_bounds.py).
    The one-sided probabilities sum to :func:`normal_crossing_probability` (same grid).

    Returns a float64 array of length ``t* - 1`` (empty when ``T_1 = N``).
    """
    sizes = doubling_schedule(num_data, first_batch_size)
    if len(sizes) == 1:
        return np.zeros(0)
    rho, s = _walk(num_data, first_batch_size)
    b = float(bound)
    low = -b if two_sided else _Z_LOW
    num = max(int(math.ceil((b - low) / _Z_STEP)), 2) + 1
    z = np.linspace(low, b, num)
    h = z[1] - z[0]
    w = np.full(num, h)
    w[0] = w[-1] = h / 2
    dens = np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)
    out = [float(special.ndtr(-b)) * (2 if two_sided else 1)]
    for r, sd in zip(rho, s):
        mass = dens * w
        cross = special.ndtr((r * z - b) / sd)
        if two_sided:
            cross = cross + special.ndtr((-b - r * z) / sd)
        out.append(float(mass @ cross))
        kernel = np.exp(-0.5 * ((z[:, None] - r * z[None, :]) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
        dens = kernel @ mass
    return np.asarray(out)


@functools.lru_cache(maxsize=1024)
def _b_normal_cached(delta: float, num_data: int, first_batch_size: int) -> float:
    if len(doubling_schedule(num_data, first_batch_size)) == 1:
        return 0.0  # T_1 = N: the first stage is already exact, no test is made.
    fn = lambda b: normal_crossing_probability(b, num_data, first_batch_size) - delta  # noqa: E731
    lo = float(-special.ndtri(delta))  # single-stage quantile: P(z_1 > lo) = delta <= crossing prob
    if fn(lo) <= 0:  # one tested stage (t* = 2): the quantile itself
        return lo
    hi = lo + 1.0
    while fn(hi) > 0:  # the crossing probability falls to 0 as B grows
        hi += 1.0
    return float(optimize.brentq(fn, lo, hi, xtol=1e-5, rtol=1e-8))


def b_normal(delta: float, num_data: int, first_batch_size: int = 50) -> float:
    """The racing-normal threshold ``B_Normal(delta; N, m1)`` (eq. 9, Appx. B).

    Solves ``P(max_{t < t*} z_t > B) = delta`` where ``z_t`` is the standardised
    mean after ``T_t = m1 2^(t-1)`` draws without replacement from a population
    of ``N`` (Corollary 4 / NOTES.md §1). The ``z_t`` form a Gaussian Markov
    chain with ``corr(z_{t-1}, z_t) = sd_t / sd_{t-1}``, so the probability is a
    1-D recursion (:func:`normal_crossing_probability`); ``B`` is found with
    Brent's method. Results are cached per ``(delta, N, m1)``; one call takes a
    few tens of milliseconds.

    Parameters
    ----------
    delta
        Target probability in (0, 1): for racing, ``delta / D`` (marginal) or
        ``delta / (D - 1)`` (pairwise variances).
    num_data
        Population size N >= 1.
    first_batch_size
        m1, with 1 <= m1 <= N.

    Returns
    -------
    float
        ``B_Normal``; 0 when ``m1 = N`` (one exact stage).

    References
    ----------
    Chen & Ghahramani, "Scalable discrete sampling as a multi-armed bandit
    problem", ICML 2016, eqs. 8-9, Corollary 4, Appendix B.
    """
    delta = check_real("delta", delta, low=0.0, high=1.0)
    num_data = check_int("num_data", num_data, low=1)
    first_batch_size = check_int("first_batch_size", first_batch_size, low=1, high=num_data)
    return _b_normal_cached(delta, num_data, first_batch_size)


def ebs_rho(t: int, n: int) -> float:
    """rho_n of eq. 6: 1 - (n-1)/N for n <= N/2, else (1 - n/N)(1 + 1/n)."""
    if t <= n / 2:
        return 1.0 - (t - 1.0) / n
    return (1.0 - t / n) * (1.0 + 1.0 / t)


def racing_coefficients(
    delta: float,
    num_states: int,
    num_data: int,
    first_batch_size: int = 50,
    *,
    bound: str = "normal",
    variance: str = "pairwise",
    schedule: str = "doubling",
) -> tuple[np.ndarray, np.ndarray]:
    """Per-stage coefficients ``(a_t, b_t)`` of ``G(T_t, sigma, C) = a_t sigma + b_t C``, t < t*.

    * normal (eq. 9): ``a_t = sqrt((1/T_t)(1 - (T_t - 1)/(N - 1))) B_Normal(delta')``, ``b_t = 0``;
    * EBS (eqs. 6-7): ``a_t = sqrt(2 rho_T log(5/delta'') / T_t)``,
      ``b_t = kappa log(5/delta'') / T_t`` with ``delta'' = delta' / (t* - 1)``;

    where ``delta' = delta / (D - 1)`` (pairwise) or ``delta / D`` (marginal).
    ``schedule="fixed"`` (:func:`fixed_schedule`): one tested stage at ``T_1 = m1``, so
    ``B_Normal`` is the single-stage quantile ``Phi^-1(1 - delta')`` and EBS's ``delta'' = delta'``.

    Parameters
    ----------
    delta
        Error level in (0, 1).
    num_states, num_data, first_batch_size
        ``D >= 2``, ``N >= 2`` and ``m1`` in ``[2, N]``.
    bound
        ``"normal"`` or ``"ebs"``.
    variance
        ``"pairwise"`` or ``"marginal"`` (sets ``delta'``).
    schedule
        ``"doubling"`` or ``"fixed"``.

    Returns
    -------
    tuple of numpy.ndarray
        ``(a, b)``, float64 arrays of length ``t* - 1`` (the tested stages).

    Raises
    ------
    ValueError
        If a parameter is out of range or not one of its choices.
    """
    delta = check_real("delta", delta, low=0.0, high=1.0)
    num_states, num_data, first_batch_size = check_sizes(num_states, num_data, first_batch_size)
    bound = check_choice("bound", bound, ("normal", "ebs"))
    variance = check_choice("variance", variance, ("pairwise", "marginal"))
    D, N = num_states, num_data
    sizes = race_schedule(N, first_batch_size, schedule)
    num_stages = len(sizes)
    arm_delta = delta / (D - 1 if variance == "pairwise" else D)
    if num_stages == 1:
        return np.zeros(0), np.zeros(0)
    if bound == "normal":
        # Fixed schedule: one test, P(z_1 > B) = delta' (what b_normal returns for t* = 2).
        bn = float(-special.ndtri(arm_delta)) if schedule == "fixed" else b_normal(arm_delta, N, first_batch_size)
        return stage_sd(N, sizes[:-1]) * bn, np.zeros(num_stages - 1)
    log_term = math.log(5.0 * (num_stages - 1) / arm_delta)  # log(5 / (delta' / (t* - 1)))
    a = np.array([math.sqrt(2.0 * ebs_rho(t, N) * log_term / t) for t in sizes[:-1]])
    b = np.array([KAPPA_EBS * log_term / t for t in sizes[:-1]])
    return a, b
