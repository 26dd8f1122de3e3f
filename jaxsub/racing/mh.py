"""Racing Metropolis-Hastings: MH whose accept/reject test reads a subsample of the data.

An MH step from ``x`` with proposal ``x' ~ q(.|x)`` and ``u ~ U(0, 1)`` accepts iff

.. math::

    \\log u + \\log p(x) + \\log q(x'|x) + \\sum_{n=1}^N \\log p(y_n|x)
    \\;<\\; \\log p(x') + \\log q(x|x') + \\sum_{n=1}^N \\log p(y_n|x').

Chen & Ghahramani (2016, §4, eq. 12) cast this test as a two-armed bandit with a
finite reward population: states ``{x, x'}``, ``f_0(x) = u p(x) q(x'|x)``,
``f_0(x') = p(x') q(x|x')`` and factors ``f_n = p(y_n|.)``; no Gumbel noise is
needed because ``u`` already supplies the randomness. The racing algorithm of
:mod:`jaxsub.discrete` (their Alg. 1 with the doubling schedule
``T_t = m_1 2^{t-1}``) reads the per-datum log-likelihoods of both states on a
shared subsample drawn without replacement and stops as soon as the sign of the
mean difference is settled with confidence ``1 - delta``. With ``bound="normal"``
this is Racing-Normal MH (the Austerity test of Korattikara et al. 2014 with the
doubling schedule and the sequence-level threshold ``B_Normal``); with
``bound="ebs"`` it is the confidence sampler of Bardenet et al. (2014) with
``delta`` split evenly across stages. Each decision is wrong with probability at
most ``delta`` (Prop. 1/3 of the paper; under the normal approximation for
``"normal"``), so the chain is a uniformly small perturbation of exact MH
(Mitrophanov 2005; Pillai & Smith 2014).

Control variates (§3.4) subtract a cheap proxy ``h_n(x) ~ log p(y_n|x)`` whose
mean over all ``n`` is known; :func:`parameter_taylor_control_variate` builds the
second-order Taylor proxy of Bardenet et al. (2017) around a reference
position, which makes the reward variance, and therefore the number of
evaluations, shrink as the chain approaches the reference.

This module is the canonical home of racing MH: it defines :func:`as_top_level_api` and
re-exports the public names of the modules that implement it, so ``jaxsub.racing.mh.X`` and
``jaxsub.racing_mh.X`` are the same object for every name in ``__all__``:

* :mod:`~jaxsub.racing.mh_kernel` -- :class:`RacingMHState`, :class:`RacingMHInfo`, :func:`init`,
  :func:`build_kernel` (one chain);
* :mod:`~jaxsub.racing.mh_batched` -- :func:`build_batched_kernel` (many chains, one batched race);
* :mod:`~jaxsub.racing.mh_decision` -- :func:`mh_decision` (eq. 12 as a two-armed race);
* :mod:`~jaxsub.racing.proposals` -- :func:`gaussian_random_walk`, :func:`fused_draws`;
* :mod:`~jaxsub.racing.mh_config` -- the static settings' checks;
* :mod:`~jaxsub.racing.mh_summary` -- :func:`info_summary`;
* :mod:`jaxsub.laplace` -- :func:`laplace_fit` (MAP and Laplace scale);
* :mod:`~jaxsub.racing.control_variates` -- :func:`parameter_taylor_control_variate`.

Public alias: ``jaxsub.racing_mh`` (the module ``jaxsub/racing_mh.py`` re-exports this
``__all__``; the package attribute ``jaxsub.racing_mh`` is this module made callable, BlackJAX
style: ``jaxsub.racing_mh(...)`` is :func:`as_top_level_api`).

References
----------
Chen, Y. & Ghahramani, Z. "Scalable discrete sampling as a multi-armed bandit
problem", ICML 2016, §4 eq. 12.
Korattikara, A., Chen, Y. & Welling, M. "Austerity in MCMC land", ICML 2014.
Bardenet, R., Doucet, A. & Holmes, C. "Towards scaling up MCMC: an adaptive
subsampling approach", ICML 2014; "On MCMC methods for tall data", JMLR 2017.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from blackjax.base import SamplingAlgorithm

from jaxsub.laplace import LaplaceFit, laplace_fit
from jaxsub.racing.control_variates import (
    ControlVariate,
    check_center_size,
    check_control_variate_matches,
    parameter_taylor_control_variate,
)
from jaxsub.racing.data import data_fingerprint, num_data_of
from jaxsub.racing.mh_batched import build_batched_kernel
from jaxsub.racing.mh_config import check_control_variate, check_step_size
from jaxsub.racing.mh_decision import mh_decision, pair_cv
from jaxsub.racing.mh_inputs import (
    check_finite_data,
    check_position,
    check_step_size_shape,
    float_position,
)
from jaxsub.racing.mh_kernel import RacingMHInfo, RacingMHState, build_kernel, init
from jaxsub.racing.mh_summary import info_summary
from jaxsub.racing.proposals import (
    GaussianRandomWalk,
    flat_size,
    fused_draws,
    gaussian_random_walk,
)
from jaxsub.types import ArrayLikeTree, PRNGKey
from jaxsub.validation import check_hyperparameter

__all__ = [
    "ControlVariate",
    "GaussianRandomWalk",
    "LaplaceFit",
    "RacingMHInfo",
    "RacingMHState",
    "as_top_level_api",
    "build_batched_kernel",
    "build_kernel",
    "check_control_variate_matches",
    "data_fingerprint",
    "fused_draws",
    "gaussian_random_walk",
    "info_summary",
    "init",
    "laplace_fit",
    "mh_decision",
    "pair_cv",
    "parameter_taylor_control_variate",
]


def as_top_level_api(
    logprior_fn: Callable,
    loglikelihood_fn: Callable,
    data: ArrayLikeTree,
    *,
    delta: float | None,
    first_batch_size: int = 50,
    bound: str = "normal",
    proposal: Callable | None = None,
    step_size=None,
    control_variate: ControlVariate | None = None,
    exact: bool = False,
    reward_range=None,
    block_size: int = 1,
) -> SamplingAlgorithm:
    """Racing MH (Chen & Ghahramani 2016, §4 eq. 12) as a BlackJAX ``SamplingAlgorithm``.

    Parameters
    ----------
    logprior_fn
        ``logprior_fn(position) -> scalar``.
    loglikelihood_fn
        ``loglikelihood_fn(position, datum) -> scalar``, one datum (the BlackJAX
        SG-MCMC convention); the library vmaps it over subsamples.
    data
        Pytree of arrays sharing a leading data axis of size ``N >= 2``.
    delta
        Per-decision error bound in ``(0, 1)``. ``delta -> 0`` recovers exact MH.
    first_batch_size
        First racing mini-batch ``m_1`` in ``[2, N]`` (default 50, as in the paper).
    bound
        ``"normal"`` or ``"ebs"``.
    proposal
        ``proposal(rng_key, position) -> (proposed, log_q_ratio)`` with
        ``log_q_ratio = log q(x|x') - log q(x'|x)``. Default: Gaussian random
        walk with ``step_size`` (:func:`gaussian_random_walk`).
    step_size
        Scale of the default random walk (scalar, per-coordinate vector or
        matrix); required when ``proposal`` is ``None``.
    control_variate
        Optional :class:`ControlVariate` (e.g. :func:`parameter_taylor_control_variate`).
    exact
        Decide every step on all ``N`` data (exact MH), for baselines; then
        ``delta`` may be ``None``.
    reward_range
        Required by ``bound="ebs"``: ``C >= max_n d_n - min_n d_n`` for the
        per-datum differences ``d_n = l_n(x') - l_n(x)`` (after the control
        variate), a scalar or ``reward_range(position, proposed) -> C`` (e.g.
        ``2 L max_n |x_n| |x' - x|`` for a likelihood ``L``-Lipschitz in ``x_n^T θ``).
    block_size
        Sampling unit of the race in rows (see :func:`build_kernel`); default 1.

    Returns
    -------
    SamplingAlgorithm
        ``init(position) -> RacingMHState``, ``step(rng_key, state) -> (RacingMHState, RacingMHInfo)``.

    Raises
    ------
    ValueError
        On a bad setting: ``delta`` outside ``(0, 1)``, ``first_batch_size``
        outside ``[2, N]``, an unknown ``bound``, neither ``proposal`` nor a
        positive ``step_size``, a non-callable ``proposal``, inconsistent or non-finite ``data``.
        ``init`` raises (:mod:`jaxsub.racing.mh_inputs`) on a position the model cannot evaluate
        (e.g. of the wrong size), a log-likelihood that is not a scalar per datum (e.g. ``y`` of
        shape ``[N, 1]``) and a ``step_size`` matrix that is not ``[d, d]``; with the Gaussian random
        walk an integer position is promoted to float.

    Examples
    --------
    Centre a control variate and scale the walk at the MAP, run, then read the summary (it warns
    when the races read most of the data or ran without a control variate):

    >>> fit = jaxsub.racing_mh.laplace_fit(logprior, loglik, (X, y), theta0)
    >>> cv = jaxsub.racing_mh.parameter_taylor_control_variate(loglik, (X, y), fit.position)
    >>> algo = jaxsub.racing_mh(logprior, loglik, (X, y), delta=0.05, step_size=fit.step_size,
    ...                         control_variate=cv)
    >>> trace = jaxsub.run_chain(key, algo, algo.init(fit.position), 1000)
    >>> jaxsub.racing_mh.info_summary(trace.infos)["share_of_data_read"]  # doctest: +SKIP
    0.013
    """
    num_data = num_data_of(data)
    check_finite_data(data)
    if proposal is None:
        if step_size is None:
            raise ValueError(
                "racing_mh needs a proposal or a step_size for the default Gaussian random walk; got neither"
            )
        proposal = gaussian_random_walk(check_step_size(step_size))
    elif not callable(proposal):
        raise ValueError(
            f"proposal must be a callable (rng_key, position) -> (proposed, log_q_ratio); got {proposal!r}"
        )
    kernel = build_kernel(
        num_data, delta=delta, first_batch_size=first_batch_size, bound=bound, exact=exact, block_size=block_size
    )
    control_variate = check_control_variate(control_variate)
    check_control_variate_matches(control_variate, data, num_data)
    if bound == "ebs" and not exact and reward_range is None:
        raise ValueError(
            "bound='ebs' needs reward_range: a bound C on the range of the per-datum log-likelihood "
            "differences l_n(x') - l_n(x) (scalar or callable (position, proposed) -> C)"
        )
    if reward_range is not None and not callable(reward_range):
        check_hyperparameter("reward_range", reward_range, low=0.0, low_closed=True)

    def init_fn(position: ArrayLikeTree, rng_key=None):
        del rng_key
        if isinstance(proposal, GaussianRandomWalk):  # a random walk moves every coordinate: floats
            position = float_position(position)
            check_step_size_shape(proposal.step_size, flat_size(position))
        check_position(position, loglikelihood_fn, data, logprior_fn=logprior_fn, name="initial position")
        check_center_size(control_variate, position)
        return init(position, logprior_fn)

    def step_fn(rng_key: PRNGKey, state: RacingMHState):
        return kernel(rng_key, state, logprior_fn, loglikelihood_fn, data, proposal, control_variate, reward_range)

    return SamplingAlgorithm(init_fn, step_fn)


def taylor_control_variate(*args, **kwargs) -> ControlVariate:
    """Deprecated alias of :func:`parameter_taylor_control_variate` (the name also meant the data-space builder).

    Parameters
    ----------
    *args, **kwargs
        Those of the builder it calls.

    Returns
    -------
    ControlVariate

    Warns
    -----
    DeprecationWarning
        Always: call :func:`parameter_taylor_control_variate` (parameter space, for these kernels)
        or :func:`jaxsub.racing.control_variates.data_taylor_control_variate` (data space, eq. 11).
    """
    warnings.warn(
        "jaxsub.racing_mh.taylor_control_variate is deprecated: it named two builders. Here it is "
        "parameter_taylor_control_variate (parameter-space proxy); the data-space expansion of eq. 11 "
        "is jaxsub.discrete.data_taylor_control_variate",
        DeprecationWarning,
        stacklevel=2,
    )
    return parameter_taylor_control_variate(*args, **kwargs)
