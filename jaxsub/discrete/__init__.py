"""Discrete sampling as a multi-armed bandit (Chen & Ghahramani, ICML 2016): the public samplers.

The code lives in :mod:`jaxsub.racing` (one home for the racing family);
this namespace keeps its public functions.

Draw ``x ~ p(x) ∝ f0(x) prod_{n=1..N} f_n(x)`` over ``D`` states while
evaluating as few ``log f_n(i)`` as possible, with total-variation error at
most ``delta`` (Prop. 1). Every constructor returns a pure function
``sample(rng_key, log_f0) -> (x, info)`` that jit-compiles and vmaps; ``info``
is a :class:`RacingInfo`.

* :func:`gumbel_max` -- the exact sampler (all N x D factors, in blocks);
* :func:`racing` -- Alg. 1: Racing-Normal (``bound="normal"``) and Racing-EBS
  (``bound="ebs"``), pairwise or marginal variances, control variates; the
  engine of the racing MH / Gibbs kernels;
* :class:`RaceOptions` -- the options of ``racing`` / ``racing_batch``, declared once
  (pass them as keyword arguments or as ``options=RaceOptions(...)``);
* :func:`racing_batch` -- many draws at once (per-draw parameters), work proportional to
  the unfinished draws;
* :func:`lil_ucb` -- adapted lil'UCB (§3.2);
* :func:`b_normal` -- the racing-normal threshold (eq. 9);
* :func:`data_taylor_control_variate` -- the second-order data-space Taylor control variate
  (eq. 11); ``taylor_control_variate`` is its deprecated alias (it warns: the name also meant
  the parameter-space builder of the racing MH kernels, ``parameter_taylor_control_variate``);
* :func:`racing_ragged` -- arms with different population sizes N_i, each with its own
  doubling schedule (§5.3; traced N_i, delta and inverse temperature beta);
* :func:`pad_populations` -- the same target by zero-padding to max N_i (simpler, slower).
"""

from jaxsub.racing import (
    ControlVariate,
    LilUCBSampler,
    RaceOptions,
    RacingBatchSampler,
    RacingInfo,
    RacingSampler,
    b_normal,
    check_beta,
    data_moments,
    doubling_schedule,
    exact_log_weights,
    gumbel_max,
    lil_ucb,
    normal_crossing_probability,
    pad_populations,
    racing,
    racing_batch,
    racing_coefficients,
    racing_ragged,
    taylor_control_variate,
)
from jaxsub.racing.control_variates import data_taylor_control_variate

__all__ = [
    "ControlVariate",
    "LilUCBSampler",
    "RaceOptions",
    "RacingBatchSampler",
    "RacingInfo",
    "RacingSampler",
    "b_normal",
    "check_beta",
    "data_moments",
    "data_taylor_control_variate",
    "doubling_schedule",
    "exact_log_weights",
    "gumbel_max",
    "lil_ucb",
    "normal_crossing_probability",
    "pad_populations",
    "racing",
    "racing_batch",
    "racing_coefficients",
    "racing_ragged",
]
