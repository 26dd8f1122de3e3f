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
mean over all ``n`` is known; :func:`taylor_control_variate` builds the
second-order Taylor proxy of Bardenet et al. (2017) around a reference
position, which makes the reward variance, and therefore the number of
evaluations, shrink as the chain approaches the reference.

References
----------
Chen, Y. & Ghahramani, Z. "Scalable discrete sampling as a multi-armed bandit
problem", ICML 2016, §4 eq. 12.
Korattikara, A., Chen, Y. & Welling, M. "Austerity in MCMC land", ICML 2014.
Bardenet, R., Doucet, A. & Holmes, C. "Towards scaling up MCMC: an adaptive
subsampling approach", ICML 2014; "On MCMC methods for tall data", JMLR 2017.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from blackjax.base import SamplingAlgorithm
from blackjax.mcmc.random_walk import normal as normal_random_step
from blackjax.util import linear_map

from jaxsub.racing.control_variates import ControlVariate, check_center_size, check_control_variate_matches
from jaxsub.racing.control_variates import parameter_taylor_control_variate as taylor_control_variate
from jaxsub.racing.data import batch_loglikelihood, data_fingerprint, gather, num_data_of
from jaxsub.racing.engine import DEFAULT_EXACT_PASS_COST, racing, racing_batch
from jaxsub.racing.exact import exact_sums
from jaxsub.subsample import NUM_ROUNDS, bits_to_uniform
from jaxsub.types import Array, ArrayLikeTree, ArrayTree, PRNGKey
from jaxsub.validation import check_choice, check_hyperparameter, check_int, check_real

__all__ = [
    "ControlVariate",
    "RacingMHInfo",
    "RacingMHState",
    "as_top_level_api",
    "build_batched_kernel",
    "build_kernel",
    "check_control_variate_matches",
    "data_fingerprint",
    "GaussianRandomWalk",
    "fused_draws",
    "gaussian_random_walk",
    "info_summary",
    "init",
    "LaplaceFit",
    "laplace_fit",
    "taylor_control_variate",
]

#: Bounds understood by the racing engine (:func:`jaxsub.discrete.racing`).
BOUNDS = ("normal", "ebs")

#: Data per block of the exact decision (``exact=True``): memory ``2 x EXACT_BLOCK`` log-likelihoods.
EXACT_BLOCK = 32768


class RacingMHState(NamedTuple):
    """State of a racing MH chain.

    Attributes
    ----------
    position
        Current position (any pytree of arrays).
    logprior
        ``logprior_fn(position)``, cached so that each step evaluates the prior
        only at the proposal. No likelihood is cached: the racing test never
        sees all of it.
    """

    position: ArrayTree
    logprior: Array


class RacingMHInfo(NamedTuple):
    """What one racing MH transition did.

    Attributes
    ----------
    is_accepted
        Whether the proposal was accepted.
    num_evaluations
        Per-datum log-likelihood evaluations spent on the decision (both
        states count: a race that reads ``T`` data costs ``2T``; the exact
        test costs ``2N``).
    num_stages
        Stages of the doubling schedule used (``0`` for the exact test).
    is_exact
        Whether the decision read all ``N`` data (then it is the exact MH decision).
    has_nan
        A per-datum log-likelihood or the prior was NaN: the decision is not
        trustworthy (the proposal is rejected).
    proposal
        The proposed position ``x'``.
    log_uniform
        ``log u`` of the MH test.
    log_prior_proposal_ratio
        ``log p(x') + log q(x|x') - log p(x) - log q(x'|x)``. With ``log_uniform``
        it lets the exact decision be re-made offline, ``log_uniform <
        log_prior_proposal_ratio + sum_n [l_n(x') - l_n(x)]``, to measure the
        empirical decision error rate.
    """

    is_accepted: Array
    num_evaluations: Array
    num_stages: Array
    is_exact: Array
    has_nan: Array
    proposal: ArrayTree
    log_uniform: Array
    log_prior_proposal_ratio: Array


def init(position: ArrayLikeTree, logprior_fn: Callable) -> RacingMHState:
    """Initial state: the position and its log prior."""
    return RacingMHState(position, jnp.asarray(logprior_fn(position)))


def validate_racing_config(num_data: int, delta, first_batch_size, bound, exact: bool):
    """Validate the racing settings shared by the MH and Gibbs kernels (raises ``ValueError``)."""
    check_int("num_data", num_data, low=2)
    if not isinstance(exact, bool):
        raise ValueError(f"exact must be True or False; got {exact!r}")
    if exact and delta is None:
        return None, first_batch_size, bound
    delta = check_real("delta", delta, low=0.0, high=1.0)
    first_batch_size = check_int("first_batch_size", first_batch_size, low=2, high=num_data)
    bound = check_choice("bound", bound, BOUNDS)
    return delta, first_batch_size, bound


def check_block_size(block_size, num_data: int, first_batch_size) -> int:
    """Validate the racing sampling unit ``block_size`` (``1 <= B``, at least ``first_batch_size`` blocks)."""
    block_size = check_int("block_size", block_size, low=1)
    if first_batch_size is not None and block_size > 1 and -(-num_data // block_size) < first_batch_size:
        raise ValueError(
            f"block_size must leave at least first_batch_size={first_batch_size} blocks of num_data={num_data} rows; "
            f"got block_size={block_size}"
        )
    return block_size


def check_exact_pass_cost(exact_pass_cost):
    """Validate the engine option ``exact_pass_cost``: ``None`` (no early exact pass) or ``c`` in ``(0, 1]``."""
    if exact_pass_cost is None:
        return None
    return check_real("exact_pass_cost", exact_pass_cost, low=0.0, high=1.0, high_closed=True)


def _check_control_variate(control_variate):
    if control_variate is not None and not isinstance(control_variate, ControlVariate):
        raise ValueError(
            "control_variate must be a jaxsub.racing_mh.ControlVariate(value_fn, mean_fn) "
            f"(see taylor_control_variate) or None; got {type(control_variate).__name__}"
        )
    return control_variate


def mh_decision(
    rng_key: PRNGKey,
    log_f0_gap: Array,
    log_uniform: Array,
    pair_loglik_fn: Callable[[Array], Array],
    num_data: int,
    *,
    delta: float | None,
    first_batch_size: int,
    bound: str,
    exact: bool,
    pair_control_variate: tuple[Callable, Array] | None = None,
    reward_range=None,
    coefficients: tuple[Array, Array] | None = None,
    **engine_options,
):
    """Decide ``log u < log_f0_gap + sum_n [l_n(x') - l_n(x)]`` by racing (or exactly).

    Parameters
    ----------
    rng_key
        Key for the racing subsample order.
    log_f0_gap
        ``log p(x') + log q(x|x') - log p(x) - log q(x'|x)``.
    log_uniform
        ``log u``.
    pair_loglik_fn
        ``indices -> [m, 2]`` per-datum log-likelihoods at ``(x, x')``.
    num_data
        ``N``.
    delta, first_batch_size, bound
        Racing settings (eq. 12 of Chen & Ghahramani 2016 with D = 2).
    exact
        Read all ``N`` data: the exact MH decision.
    pair_control_variate
        ``(h, h_mean)`` with ``h(indices) -> [m, 2]`` and ``h_mean`` its ``[2]`` mean.
    reward_range
        Per-arm reward range ``C_i`` (scalar or ``[2]``) for ``bound="ebs"``.
    coefficients
        ``None`` (the thresholds of ``delta``), or per-stage threshold coefficients
        ``(a_t, b_t)`` of :func:`jaxsub.discrete.racing_coefficients` as (traceable)
        arrays: the same race with another threshold, e.g. a deliberately loosened
        one in a negative control, without a new compile.
    engine_options
        Further options of :func:`jaxsub.discrete.racing` (e.g. ``skew_guard``).

    Returns
    -------
    (accept, num_evaluations, num_stages, is_exact, has_nan)
    """
    dtype = jnp.result_type(log_f0_gap)
    # Only the difference of the two log f0 entries matters to the race, so put
    # log u on arm 0 and the prior/proposal gap on arm 1 (eq. 12 divided by p(x) q(x'|x)).
    log_f0 = jnp.stack([log_uniform.astype(dtype), log_f0_gap])
    if exact:
        # The family's exact-sum routine: blocked, Kahan-compensated sums of l_n(x') - l_n(x).
        sums, _, _ = exact_sums(pair_loglik_fn, 2, num_data, min(EXACT_BLOCK, num_data), dtype)
        gap = log_f0[1] - log_f0[0] + (sums[1] - sums[0])
        has_nan = jnp.isnan(gap)
        accept = jnp.logical_and(gap > 0, ~has_nan)
        evals = jnp.asarray(2 * num_data, jnp.int32)
        return accept, evals, jnp.asarray(0, jnp.int32), jnp.asarray(True), has_nan
    kwargs = {}
    if pair_control_variate is not None:
        kwargs["control_variate"] = pair_control_variate
    if reward_range is not None:
        kwargs["reward_range"] = reward_range
    kwargs.update(engine_options)
    sample = racing(
        pair_loglik_fn,
        2,
        num_data,
        delta=delta,
        first_batch_size=first_batch_size,
        bound=bound,
        variance="pairwise",
        gumbel_noise=False,
        **kwargs,
    )
    if coefficients is None:
        choice, info = sample(rng_key, log_f0)
    else:
        choice, info = sample.with_coefficients(rng_key, log_f0, *coefficients)
    has_nan = jnp.asarray(info.has_nan)
    accept = jnp.logical_and(choice == 1, ~has_nan)
    return (
        accept,
        jnp.asarray(info.num_evaluations, jnp.int32),
        jnp.asarray(info.num_stages, jnp.int32),
        jnp.asarray(info.is_exact),
        has_nan,
    )


def pair_cv(control_variate: ControlVariate | None, position, proposal):
    """Stack a per-position control variate into the ``[m, 2]`` pair form the race expects."""
    if control_variate is None:
        return None

    def h(indices):
        return jnp.stack(
            [control_variate.value_fn(position, indices), control_variate.value_fn(proposal, indices)], axis=-1
        )

    means = jnp.stack([control_variate.mean_fn(position), control_variate.mean_fn(proposal)])
    return h, means


# --------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------


def build_kernel(
    num_data: int,
    *,
    delta: float | None,
    first_batch_size: int = 50,
    bound: str = "normal",
    exact: bool = False,
    block_size: int = 1,
    fused_random_bits: bool = False,
) -> Callable:
    """Build the racing MH kernel (BlackJAX contract: structure here, model and hyperparameters at call time).

    Parameters
    ----------
    num_data
        ``N``, the leading size of ``data`` (static).
    delta
        Allowed probability of a wrong accept/reject decision, in ``(0, 1)``
        (static: it fixes the ``B_Normal`` thresholds; ignored with ``exact=True``).
    first_batch_size
        ``m_1`` of the doubling schedule; the paper's robust default is 50.
    bound
        ``"normal"`` (Racing-Normal, ``B_Normal`` threshold) or ``"ebs"``
        (empirical Bernstein-Serfling; needs ``reward_range`` at call time).
    exact
        Use all ``N`` data in every decision (exact MH; for baselines and tests).
    block_size
        ``B >= 1``: the race samples blocks of ``B`` consecutive rows of ``data``
        (reward = block sum; :func:`jaxsub.discrete.racing`'s ``block_size``):
        contiguous reads, one permutation index per block. ``first_batch_size``
        then counts blocks. The guarantee is unchanged (a finite population of
        ``ceil(N / B)`` blocks); shuffle sorted data once. ``B = 1``: rows.
    fused_random_bits
        With a :class:`GaussianRandomWalk` proposal and a float32 position, draw the
        step's proposal normals, ``u`` and the race's permutation keys from one
        ``jax.random.bits`` call (:func:`fused_draws`: one threefry loop per step
        instead of six). Same law, other draws. Default ``False``: the key layout
        of ``blackjax.additive_step_random_walk`` (draws equal to it as ``delta -> 0``).
        Other proposals and dtypes take the default layout.

    Returns
    -------
    kernel
        ``kernel(rng_key, state, logprior_fn, loglikelihood_fn, data, proposal,
        control_variate=None, reward_range=None) -> (RacingMHState, RacingMHInfo)``
        where ``proposal(rng_key, position) -> (proposed, log_q_ratio)`` (e.g.
        :func:`gaussian_random_walk` of a possibly traced step size, like
        ``blackjax.additive_step_random_walk``'s ``random_step``) and
        ``reward_range`` is ``C``, a bound on ``max_n d_n - min_n d_n`` for the
        per-datum differences ``d_n = l_n(x') - l_n(x)`` (after the control
        variate): a scalar, or ``reward_range(position, proposed) -> C``.
    """
    delta, first_batch_size, bound = validate_racing_config(num_data, delta, first_batch_size, bound, exact)
    block_size = check_block_size(block_size, num_data, first_batch_size)
    fused_random_bits = _check_bool("fused_random_bits", fused_random_bits)

    def kernel(
        rng_key: PRNGKey,
        state: RacingMHState,
        logprior_fn: Callable,
        loglikelihood_fn: Callable,
        data: ArrayLikeTree,
        proposal: Callable,
        control_variate: ControlVariate | None = None,
        reward_range=None,
    ):
        control_variate = _check_control_variate(control_variate)
        check_control_variate_matches(control_variate, data, None)
        if num_data_of(data) != num_data:
            raise ValueError(f"data has {num_data_of(data)} rows but the kernel was built for num_data={num_data}")
        check_center_size(control_variate, state.position)
        if bound == "ebs" and not exact and reward_range is None:
            raise ValueError(
                "bound='ebs' needs reward_range: a bound C on max_n d_n - min_n d_n of the per-datum "
                "log-likelihood differences d_n = l_n(x') - l_n(x) (scalar or callable (position, proposed) -> C)"
            )
        # Same key layout as blackjax's RMH (split into proposal / accept keys, u
        # drawn from the accept key) so that with delta -> 0 the chain is
        # step-for-step identical to blackjax.additive_step_random_walk.
        position = state.position
        if fused_random_bits and can_fuse(proposal, position):
            normals, log_u, key_race = fused_draws(rng_key, _flat_size(position), jnp.float32)
            proposed, log_q_ratio = proposal.from_normals(position, normals)
            logprior_new = jnp.asarray(logprior_fn(proposed))
            dtype = jnp.result_type(logprior_new)
            log_u = log_u.astype(dtype)
        else:
            key_proposal, key_accept = jax.random.split(rng_key)
            key_race = jax.random.fold_in(key_accept, 1)
            proposed, log_q_ratio = proposal(key_proposal, position)
            logprior_new = jnp.asarray(logprior_fn(proposed))
            dtype = jnp.result_type(logprior_new)
            log_u = jnp.log(jax.random.uniform(key_accept, dtype=dtype))
        log_f0_gap = (logprior_new - state.logprior + jnp.asarray(log_q_ratio, dtype)).astype(dtype)

        def pair_loglik(indices):
            return jnp.stack(
                [
                    batch_loglikelihood(loglikelihood_fn, position, data, indices),
                    batch_loglikelihood(loglikelihood_fn, proposed, data, indices),
                ],
                axis=-1,
            )

        c_range = None
        if reward_range is not None and not exact:
            c_range = reward_range(position, proposed) if callable(reward_range) else reward_range
            # The race centres each datum's pair (l(x), l(x')) by its mean: each arm's
            # reward is then +-d_n / 2, whose range is C / 2.
            c_range = jnp.asarray(c_range, dtype) / 2

        accept, evals, stages, is_exact, has_nan = mh_decision(
            key_race,
            log_f0_gap,
            log_u,
            pair_loglik,
            num_data,
            delta=delta,
            first_batch_size=first_batch_size,
            bound=bound,
            exact=exact,
            pair_control_variate=pair_cv(control_variate, position, proposed),
            reward_range=c_range,
            **({"block_size": block_size} if block_size > 1 else {}),
        )
        new_state = jax.lax.cond(
            accept,
            lambda: RacingMHState(proposed, logprior_new.astype(state.logprior.dtype)),
            lambda: state,
        )
        info = RacingMHInfo(accept, evals, stages, is_exact, has_nan, proposed, log_u, log_f0_gap)
        return new_state, info

    return kernel


class GaussianRandomWalk(NamedTuple):
    """The default proposal ``x' = x + step_size * N(0, I)`` (symmetric, log q ratio 0).

    Called as ``proposal(rng_key, position) -> (proposed, 0.0)``, it uses
    :func:`blackjax.mcmc.random_walk.normal`, so draws equal those of
    ``blackjax.additive_step_random_walk(logdensity_fn, normal(step_size))``.
    ``step_size`` is a scalar, a vector of per-coordinate scales or a matrix
    (the Cholesky-like linear map blackjax applies to the noise); it may be traced.
    :meth:`from_normals` makes the same move from given standard normals, which
    lets a kernel draw the noise together with its other randomness
    (``fused_random_bits``).
    """

    step_size: Array

    def __call__(self, rng_key, position):
        move = normal_random_step(jnp.asarray(self.step_size))(rng_key, position)
        proposed = jax.tree.map(jnp.add, position, move)
        leaf = jax.tree.leaves(position)[0]
        return proposed, jnp.zeros((), jnp.result_type(leaf))

    def from_normals(self, position, normals):
        """``(position + step_size * normals, 0.0)`` with ``normals`` the flattened ``[d]`` standard normals."""
        flat, unravel = jax.flatten_util.ravel_pytree(position)
        move = unravel(linear_map(jnp.asarray(self.step_size), normals.astype(flat.dtype)))
        proposed = jax.tree.map(jnp.add, position, move)
        return proposed, jnp.zeros((), flat.dtype)


def gaussian_random_walk(step_size) -> GaussianRandomWalk:
    """The default proposal: ``x' = x + step_size * N(0, I)`` (symmetric, log q ratio 0).

    Uses :func:`blackjax.mcmc.random_walk.normal`, so draws equal those of
    ``blackjax.additive_step_random_walk(logdensity_fn, normal(step_size))``.
    ``step_size`` is a scalar, a vector of per-coordinate scales or a matrix
    (the Cholesky-like linear map blackjax applies to the noise). Returns a
    :class:`GaussianRandomWalk` (callable ``(rng_key, position) -> (proposed, log_q_ratio)``).
    """
    return GaussianRandomWalk(step_size)


#: Float types whose uniforms :func:`fused_draws` makes from one 32-bit word each (as ``jax.random.uniform``).
_FUSED_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)


def can_fuse(proposal, position) -> bool:
    """Whether :func:`fused_draws` serves this step: the proposal is a :class:`GaussianRandomWalk`
    and the position is float32 (or narrower), so one 32-bit word per uniform keeps
    ``jax.random``'s resolution."""
    leaves = jax.tree.leaves(position)
    return isinstance(proposal, GaussianRandomWalk) and all(
        any(jnp.result_type(leaf) == t for t in _FUSED_FLOATS) for leaf in leaves)


def _uniform_from_bits(bits, dtype, minval, maxval):
    """``jax.random.uniform``'s map from uint32 words to ``[minval, maxval)`` (float32 mantissa)."""
    floats = bits_to_uniform(bits) * (maxval - minval) + minval
    return jnp.maximum(jnp.asarray(minval, jnp.float32), floats).astype(dtype)


def fused_draws(rng_key, num_normals: int, dtype):
    """A step's randomness from ONE ``jax.random.bits`` call (one threefry loop per step).

    Returns ``(normals [num_normals], log_u, round_keys [NUM_ROUNDS])``: standard normals
    (``sqrt(2) erfinv(U(-1, 1))``, as ``jax.random.normal``), ``log u`` with ``u ~ U[0, 1)`` (as
    ``jax.random.uniform``) and the uint32 round keys of the race's permutation
    (:func:`jaxsub.subsample.permutation_round_keys`' output), each from its own words.
    """
    bits = jax.random.bits(rng_key, (num_normals + 1 + NUM_ROUNDS,), jnp.uint32)
    lo = np.nextafter(np.float32(-1.0), np.float32(0.0))
    normals = np.float32(np.sqrt(2.0)) * jax.lax.erf_inv(_uniform_from_bits(bits[:num_normals], jnp.float32, lo, 1.0))
    log_u = jnp.log(_uniform_from_bits(bits[num_normals], jnp.float32, 0.0, 1.0)).astype(dtype)
    return normals.astype(dtype), log_u, bits[num_normals + 1:]


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return value


def _flat_size(position) -> int:
    return sum(int(np.prod(jnp.shape(leaf))) for leaf in jax.tree.leaves(position))


def _check_step_size(step_size):
    """Concrete step sizes are checked; a traced one (e.g. ``jax.vmap`` over step sizes) passes through."""
    if isinstance(step_size, jax.core.Tracer):
        return step_size
    arr = np.asarray(step_size, dtype=np.float64)
    if arr.ndim > 2 or arr.size == 0:
        raise ValueError(f"step_size must be a positive scalar, vector or matrix; got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"step_size must be finite; got {step_size!r}")
    if arr.ndim <= 1 and np.any(arr <= 0):
        raise ValueError(f"step_size must be > 0; got {step_size!r}")
    return step_size


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
        Optional :class:`ControlVariate` (e.g. :func:`taylor_control_variate`).
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
        positive ``step_size``, a non-callable ``proposal``, inconsistent ``data``.

    Examples
    --------
    >>> algo = jaxsub.racing_mh(logprior, loglik, (X, y), delta=0.05, step_size=0.01)
    >>> state = algo.init(theta0)
    >>> state, info = jax.jit(algo.step)(key, state)
    """
    num_data = num_data_of(data)
    if proposal is None:
        if step_size is None:
            raise ValueError("racing_mh needs a proposal or a step_size for the default Gaussian random walk; got neither")
        proposal = gaussian_random_walk(_check_step_size(step_size))
    elif not callable(proposal):
        raise ValueError(f"proposal must be a callable (rng_key, position) -> (proposed, log_q_ratio); got {proposal!r}")
    kernel = build_kernel(
        num_data, delta=delta, first_batch_size=first_batch_size, bound=bound, exact=exact, block_size=block_size
    )
    control_variate = _check_control_variate(control_variate)
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
        check_center_size(control_variate, position)
        return init(position, logprior_fn)

    def step_fn(rng_key: PRNGKey, state: RacingMHState):
        return kernel(rng_key, state, logprior_fn, loglikelihood_fn, data, proposal, control_variate, reward_range)

    return SamplingAlgorithm(init_fn, step_fn)


# --------------------------------------------------------------------------
# Centring and scaling: MAP / Laplace fit and the random-walk step-size rule
# --------------------------------------------------------------------------


class LaplaceFit(NamedTuple):
    """Gaussian (Laplace) approximation of the posterior at its mode.

    Attributes
    ----------
    position
        The MAP ``θ̂`` (same pytree as the initial position): centre the
        Taylor control variate there.
    cov_cholesky
        ``L`` with ``L L^T = (-∇² log p(θ̂ | y))^{-1}`` on the flattened position, ``[d, d]``.
    step_size
        ``2.38 / sqrt(d) * L``: the random-walk scale of Roberts, Gelman & Gilks
        (1997) (optimal for a Gaussian target, acceptance ~0.23 for large d);
        pass it as ``step_size`` to :func:`as_top_level_api`.
    """

    position: ArrayTree
    cov_cholesky: Array
    step_size: Array


def laplace_fit(
    logprior_fn: Callable,
    loglikelihood_fn: Callable,
    data: ArrayLikeTree,
    initial_position: ArrayLikeTree,
    *,
    num_steps: int = 100,
) -> LaplaceFit:
    """MAP by L-BFGS (optax) on the full data, then the Laplace covariance and the step-size rule.

    A one-off O(N) cost per iteration, before sampling: the MAP is where
    :func:`taylor_control_variate` should be centred (its residuals then
    shrink like ``|θ - θ̂|^3`` over the posterior), and ``2.38/√d`` times the
    Laplace scale is the random-walk step that makes racing MH pay off
    (docs/racing_kernels.md).

    Parameters
    ----------
    logprior_fn, loglikelihood_fn, data
        As for :func:`as_top_level_api`.
    initial_position
        Starting point of the optimiser.
    num_steps
        L-BFGS iterations (static).

    Returns
    -------
    LaplaceFit

    Raises
    ------
    ValueError
        If the Hessian at the optimum is not negative definite (no mode found;
        ``cov_cholesky`` would be NaN).
    """
    import optax

    num_steps = check_int("num_steps", num_steps, low=1)
    num_data_of(data)
    flat0, unravel = jax.flatten_util.ravel_pytree(initial_position)

    def negative_log_posterior(flat):
        position = unravel(flat)
        lls = jax.vmap(loglikelihood_fn, in_axes=(None, 0))(position, data)
        return -(logprior_fn(position) + jnp.sum(lls))

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(negative_log_posterior)

    def body(carry, _):
        x, st = carry
        value, grad = value_and_grad(x, state=st)
        updates, st = opt.update(grad, st, x, value=value, grad=grad, value_fn=negative_log_posterior)
        return (optax.apply_updates(x, updates), st), None

    (flat, _), _ = jax.lax.scan(body, (flat0, opt.init(flat0)), None, length=num_steps)
    hess = jax.hessian(negative_log_posterior)(flat)
    chol = jnp.linalg.cholesky(jnp.linalg.inv(hess))
    if not bool(jnp.all(jnp.isfinite(chol))):
        raise ValueError("laplace_fit: the Hessian at the optimum is not negative definite (no mode found)")
    d = flat.shape[0]
    return LaplaceFit(unravel(flat), chol, (2.38 / np.sqrt(d)) * chol)


def info_summary(info: RacingMHInfo, num_data: int, *, delta: float | None = None, nan_warning: float = 0.01) -> dict:
    """Summarise a trace of :class:`RacingMHInfo` (any leading axes: steps, chains).

    Returns a dict with ``share_of_data_read`` (mean evaluations / 2N), ``has_nan_rate``,
    ``acceptance_rate``, ``exact_rate`` (decisions that read all N) and
    ``decision_error_bound`` (``delta`` per decision, under the assumptions of
    docs/racing_kernels.md). Warns (``RuntimeWarning``) when more than
    ``nan_warning`` of the steps met a NaN: those decisions were rejections
    forced by bad numerics, not samples of the posterior.
    """
    import warnings

    num_data = check_int("num_data", num_data, low=1)
    evals = np.asarray(info.num_evaluations, np.float64)
    has_nan = np.asarray(info.has_nan)
    out = {
        "share_of_data_read": float(evals.mean() / (2 * num_data)),
        "has_nan_rate": float(has_nan.mean()),
        "acceptance_rate": float(np.asarray(info.is_accepted).mean()),
        "exact_rate": float(np.asarray(info.is_exact).mean()),
        "decision_error_bound": delta,
    }
    if out["has_nan_rate"] > nan_warning:
        warnings.warn(
            f"{out['has_nan_rate']:.1%} of racing MH steps met a NaN log-likelihood or prior (rejected): "
            "check the model's numerics (e.g. log of non-positive values) before trusting the draws",
            RuntimeWarning,
            stacklevel=2,
        )
    return out


def build_batched_kernel(
    num_data: int,
    *,
    delta: float,
    first_batch_size: int = 50,
    bound: str = "normal",
    group_size: int = 16,
    block_size: int = 1,
    exact_pass_cost: float | None = DEFAULT_EXACT_PASS_COST,
    max_block_size: int | None = None,
    fused_random_bits: bool = True,
) -> Callable:
    """Racing MH for many chains at once, work proportional to the unfinished races (item 4).

    ``jax.vmap`` of :func:`build_kernel`'s kernel runs every race's loops until the
    slowest chain's race is done. This kernel makes the C proposals, then decides
    all C tests with :func:`jaxsub.discrete.racing_batch`, whose rounds advance only
    the unfinished races. Chain ``c`` gets the same decision as the single-chain
    kernel built with the same ``fused_random_bits`` and called with key ``rng_keys[c]``.
    ``fused_random_bits`` (default ``True`` here since session 12): :func:`build_kernel`'s
    option, one threefry loop per step for a :class:`GaussianRandomWalk` on float32 positions.

    Returns
    -------
    kernel
        ``kernel(rng_keys [C], states [C], logprior_fn, loglikelihood_fn, data, proposal,
        control_variate=None) -> (states [C], infos [C])``; ``proposal`` as for
        :func:`build_kernel` (one chain; it is vmapped). Racing-Normal only.
        ``block_size`` as for :func:`build_kernel`. ``exact_pass_cost``:
        :func:`jaxsub.discrete.racing_batch`'s option (``c`` in ``(0, 1]``, or ``None``
        to disable): a race still running at the first stage whose new random data
        would reach ``c N`` finishes with one contiguous exact pass (this only removes
        error events). Default: the engine's. ``max_block_size``: the engine's largest
        chunk of a stage (:func:`jaxsub.discrete.racing`; ``None``: its default). Stages
        with one chunk size share one loop, so a small value (e.g. ``first_batch_size``)
        leaves fewer loops per step, at more rounds for a rare long race.
    """
    delta, first_batch_size, bound = validate_racing_config(num_data, delta, first_batch_size, bound, False)
    if bound != "normal":
        raise ValueError(f"build_batched_kernel supports bound='normal' only; got {bound!r}")
    group_size = check_int("group_size", group_size, low=1)
    block_size = check_block_size(block_size, num_data, first_batch_size)
    exact_pass_cost = check_exact_pass_cost(exact_pass_cost)
    if max_block_size is not None:
        max_block_size = check_int("max_block_size", max_block_size, low=first_batch_size)
    fused_random_bits = _check_bool("fused_random_bits", fused_random_bits)

    def kernel(rng_keys, states, logprior_fn, loglikelihood_fn, data, proposal, control_variate=None):
        control_variate = _check_control_variate(control_variate)
        check_control_variate_matches(control_variate, data, None)
        if num_data_of(data) != num_data:
            raise ValueError(f"data has {num_data_of(data)} rows but the kernel was built for num_data={num_data}")

        def propose(rng_key, state):
            if fused_random_bits and can_fuse(proposal, state.position):
                normals, log_u, race_key = fused_draws(rng_key, _flat_size(state.position), jnp.float32)
                proposed, log_q_ratio = proposal.from_normals(state.position, normals)
                logprior_new = jnp.asarray(logprior_fn(proposed))
                dtype = jnp.result_type(logprior_new)
                gap = (logprior_new - state.logprior + jnp.asarray(log_q_ratio, dtype)).astype(dtype)
                return proposed, logprior_new, log_u.astype(dtype), gap, race_key
            key_proposal, key_accept = jax.random.split(rng_key)
            proposed, log_q_ratio = proposal(key_proposal, state.position)
            logprior_new = jnp.asarray(logprior_fn(proposed))
            dtype = jnp.result_type(logprior_new)
            log_u = jnp.log(jax.random.uniform(key_accept, dtype=dtype))
            gap = (logprior_new - state.logprior + jnp.asarray(log_q_ratio, dtype)).astype(dtype)
            return proposed, logprior_new, log_u, gap, jax.random.fold_in(key_accept, 1)

        proposed, logprior_new, log_u, gap, race_keys = jax.vmap(propose)(rng_keys, states)
        params = (states.position, proposed)

        def pair_loglik(indices, p):
            x, xp = p
            return jnp.stack(
                [batch_loglikelihood(loglikelihood_fn, x, data, indices),
                 batch_loglikelihood(loglikelihood_fn, xp, data, indices)], axis=-1)

        kwargs = {}
        if control_variate is not None:
            def h(indices, p):
                return jnp.stack([control_variate.value_fn(p[0], indices), control_variate.value_fn(p[1], indices)], -1)

            def h_mean(p):
                return jnp.stack([control_variate.mean_fn(p[0]), control_variate.mean_fn(p[1])])

            kwargs["control_variate"] = (h, h_mean)
        sample = racing_batch(
            pair_loglik, 2, num_data, delta=delta, first_batch_size=first_batch_size, bound=bound,
            variance="pairwise", gumbel_noise=False, group_size=group_size, exact_pass_cost=exact_pass_cost,
            max_block_size=max_block_size,
            **({"block_size": block_size} if block_size > 1 else {}), **kwargs,
        )
        log_f0s = jnp.stack([log_u, gap], axis=-1)
        choice, info = sample(race_keys, log_f0s, params)
        has_nan = info.has_nan
        accept = (choice == 1) & ~has_nan
        pick = lambda new, old: jnp.where(accept.reshape(accept.shape + (1,) * (jnp.ndim(old) - 1)), new, old)  # noqa: E731
        new_states = RacingMHState(
            jax.tree.map(pick, proposed, states.position), pick(logprior_new.astype(states.logprior.dtype), states.logprior)
        )
        infos = RacingMHInfo(accept, info.num_evaluations, info.num_stages, info.is_exact, has_nan, proposed, log_u, gap)
        return new_states, infos

    return kernel
