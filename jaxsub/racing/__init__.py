"""The racing family (Chen & Ghahramani, ICML 2016): one home for the engine and its kernels.

Discrete sampling as a multi-armed bandit: draw ``x ~ p(x) ∝ f0(x) prod_{n=1..N} f_n(x)``
over ``D`` states while evaluating as few ``log f_n(i)`` as possible, with total-variation
error at most ``delta`` (Prop. 1), and the MCMC kernels built on that race.

Modules
-------
* :mod:`~jaxsub.racing.bounds` -- the thresholds: ``b_normal`` (eq. 9), the doubling
  schedule, the per-stage coefficients of Racing-Normal / Racing-EBS;
* :mod:`~jaxsub.racing.engine` -- Alg. 1: :func:`racing`, :func:`racing_batch`, wiring the
  pure functions of :mod:`~jaxsub.racing.config` (the static ``RaceConfig``),
  :mod:`~jaxsub.racing.stage` (stage body), :mod:`~jaxsub.racing.elimination`,
  :mod:`~jaxsub.racing.compaction`, :mod:`~jaxsub.racing.exact_pass` and
  :mod:`~jaxsub.racing.batching`;
* :mod:`~jaxsub.racing.info` -- :class:`RacingInfo` and the shared checks;
* :mod:`~jaxsub.racing.populations` -- block sampling units, padded ragged arms;
* :mod:`~jaxsub.racing.exact` -- the one exact-sum routine (blocked, compensated);
* :mod:`~jaxsub.racing.control_variates` -- control variates (§3.4);
* :mod:`~jaxsub.racing.gumbel` -- the exact sampler :func:`gumbel_max`;
* :mod:`~jaxsub.racing.lil_ucb` -- adapted lil'UCB (§3.2);
* :mod:`~jaxsub.racing.ragged` -- arms with their own populations N_i (§5.3);
* :mod:`~jaxsub.racing.mh`, :mod:`~jaxsub.racing.gibbs`, :mod:`~jaxsub.racing.sgld_mh` --
  the racing MH (eq. 12), racing Gibbs and SGLD + racing MH kernels.

Public aliases, unchanged: :mod:`jaxsub.discrete` (the samplers), ``jaxsub.racing_mh``,
``jaxsub.racing_gibbs``, ``jaxsub.sgld_racing_mh`` (the kernel modules, callable BlackJAX style).
Without-replacement index sampling lives in :mod:`jaxsub.subsample` (shared with other families).
"""

from jaxsub.racing import gibbs, mh, sgld_mh  # noqa: E402  (the kernels import the engine above)
from jaxsub.racing.bounds import b_normal, doubling_schedule, normal_crossing_probability, racing_coefficients
from jaxsub.racing.config import RaceOptions
from jaxsub.racing.control_variates import (
    ControlVariate,
    data_moments,
    data_taylor_control_variate,
    parameter_taylor_control_variate,
    taylor_control_variate,
)
from jaxsub.racing.engine import RacingBatchSampler, RacingSampler, racing, racing_batch
from jaxsub.racing.gumbel import exact_log_weights, gumbel_max
from jaxsub.racing.info import RacingInfo, check_beta
from jaxsub.racing.lil_ucb import LilUCBSampler, lil_ucb
from jaxsub.racing.populations import pad_populations
from jaxsub.racing.ragged import racing_ragged

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
    "gibbs",
    "gumbel_max",
    "lil_ucb",
    "mh",
    "normal_crossing_probability",
    "parameter_taylor_control_variate",
    "pad_populations",
    "racing",
    "racing_batch",
    "racing_coefficients",
    "racing_ragged",
    "sgld_mh",
]
