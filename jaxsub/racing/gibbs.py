"""Racing Gibbs: resample one discrete variable whose conditional has N factors.

In a Gibbs sweep, a discrete variable ``x ∈ {0..D-1}`` often has the full conditional

.. math::

    p(x = i \\mid \\text{rest}) \\propto f_0(i) \\prod_{n=1}^N f_n(i),

e.g. the model indicator of Carlin & Chib (1995) (``f_0`` = adjusted model prior
times priors and pseudo-priors of the parameters, ``f_n`` = likelihood of datum
``n`` under model ``i``), or a binary/categorical latent with N dependent
factors. Exact Gibbs reads all ``N D`` factors; racing Gibbs draws Gumbel noise
``ε_i`` and identifies ``argmax_i log f_0(i) + ε_i + Σ_n log f_n(i)`` with the racing
algorithm of :mod:`jaxsub.discrete` (Chen & Ghahramani 2016, Alg. 1 and eq. 3), so
the draw is within total variation ``delta`` of the exact conditional (their
Prop. 1) while reading only a subsample of the factors when the states are
well separated. This is the building block of the paper's §5.2 (ARCH model
selection) and §5.3 (author coreference).

The kernel is built for one conditional: ``log_f0`` and ``log_factor_fn`` close
over the rest of the model's state, exactly like BlackJAX Gibbs sweeps rebuild
``blackjax.hmc(partial(logdensity, z=z), ...)`` for each block. Building a
kernel inside a jitted sweep costs nothing at run time (the ``B_Normal``
threshold is cached per ``(delta, N, m_1)``).

References
----------
Chen, Y. & Ghahramani, Z. "Scalable discrete sampling as a multi-armed bandit
problem", ICML 2016, §2-§3, §5.2.
Carlin, B. P. & Chib, S. "Bayesian model choice via Markov chain Monte Carlo
methods", JRSS B 57(3), 1995.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from blackjax.base import SamplingAlgorithm

from jaxsub.racing.data import num_data_of
from jaxsub.racing.engine import DEFAULT_EXACT_PASS_COST, racing, racing_batch
from jaxsub.racing.exact import exact_sums
from jaxsub.racing.info import check_beta
from jaxsub.racing.mh_config import (
    check_block_size,
    check_exact_pass_cost,
    validate_racing_config,
)
from jaxsub.racing.mh_inputs import check_finite_data
from jaxsub.types import Array, ArrayLike, PRNGKey
from jaxsub.validation import check_choice, check_int

__all__ = [
    "RacingGibbsInfo",
    "RacingGibbsState",
    "as_top_level_api",
    "build_batched_kernel",
    "build_kernel",
    "init",
    "exact_conditional_sums",
]

VARIANCES = ("pairwise", "marginal")


class RacingGibbsState(NamedTuple):
    """State: the current value of the discrete variable (``int32`` scalar)."""

    position: Array


class RacingGibbsInfo(NamedTuple):
    """What one racing Gibbs update did.

    Attributes
    ----------
    num_evaluations
        Factor evaluations ``log f_n(i)`` read (``N D`` for the exact update).
    num_stages
        Racing stages used (``0`` for the exact update).
    is_exact
        Whether all ``N`` factors were read (the draw is then exact).
    has_nan
        A NaN factor was met; the draw is not trustworthy (the old value is kept).
    """

    num_evaluations: Array
    num_stages: Array
    is_exact: Array
    has_nan: Array


def init(position: ArrayLike) -> RacingGibbsState:
    """Initial state from the current value of the discrete variable.

    Parameters
    ----------
    position
        The variable's current value in ``{0..D-1}``.

    Returns
    -------
    RacingGibbsState
        With an int32 position.
    """
    return RacingGibbsState(jnp.asarray(position, jnp.int32))


def exact_conditional_sums(log_factor_fn: Callable, num_data: int, *, block_size: int = 4096) -> Array:
    """``Σ_n log f_n(i)`` for every state ``i``, in blocks of ``block_size`` data (bounded memory).

    The family's one exact-sum routine (:func:`jaxsub.racing.exact.exact_sums`, Kahan-compensated
    block sums) with ``relative=False``, so the sums keep their absolute level.

    Parameters
    ----------
    log_factor_fn
        ``indices [m] -> [m, D]``.
    num_data
        ``N``.
    block_size
        Factors per block.

    Returns
    -------
    Array
        ``[D]``.
    """
    block_size = min(block_size, num_data)
    out = jax.eval_shape(log_factor_fn, jax.ShapeDtypeStruct((block_size,), jnp.int32))
    total, _, _ = exact_sums(log_factor_fn, out.shape[1], num_data, block_size, out.dtype, relative=False)
    return total


def exact_draw(rng_key: PRNGKey, log_f0: Array, log_factor_fn: Callable, num_data: int, exact_block_size: int, beta):
    """Exact Gibbs: a draw from the conditional (``p^beta``) with every factor read.

    Returns
    -------
    (draw, has_nan, num_evaluations, num_stages, is_exact)
    """
    num_states = log_f0.shape[0]
    # Sums relative to a per-datum reference (one constant for all states: the
    # conditional is unchanged, float32 keeps its precision).
    sums, _, _ = exact_sums(log_factor_fn, num_states, num_data, min(exact_block_size, num_data), log_f0.dtype)
    logits = log_f0 + sums
    has_nan = jnp.any(jnp.isnan(logits))
    logits = jnp.where(jnp.isnan(logits), -jnp.inf, logits)
    if beta is None:
        draw = jax.random.categorical(rng_key, logits)
    else:  # p^beta by Gumbel-max: argmax_i logits_i + eps_i / beta
        noise = jax.random.gumbel(rng_key, logits.shape, logits.dtype)
        draw = jnp.argmax(logits + noise / jnp.asarray(beta, logits.dtype))
    evals = jnp.asarray(num_data * num_states, jnp.int32)
    return draw, has_nan, evals, jnp.asarray(0, jnp.int32), jnp.asarray(True)


def check_conditional(log_f0, log_factor_fn: Callable, num_data: int, data=None) -> None:
    """Construction checks of racing Gibbs' model: ``log_f0``, the factors' shape, optional ``data``.

    Parameters
    ----------
    log_f0
        ``[D]``, ``D >= 2``; when concrete, no NaN and no ``+inf``.
    log_factor_fn
        ``indices [m] -> [m, D]`` (checked with :func:`jax.eval_shape`, no compute).
    num_data
        ``N``.
    data
        Optional pytree of the arrays ``log_factor_fn`` reads: leading size ``N``, every value finite.

    Raises
    ------
    ValueError
        Naming the argument that is malformed or not finite.
    """
    if jnp.ndim(log_f0) != 1 or jnp.shape(log_f0)[0] < 2:
        raise ValueError(f"log_f0 must be a 1-D array over D >= 2 states; got shape {jnp.shape(log_f0)}")
    if not callable(log_factor_fn):
        raise ValueError(f"log_factor_fn must be callable indices -> [m, D]; got {log_factor_fn!r}")
    if not isinstance(log_f0, jax.core.Tracer):
        arr = np.asarray(log_f0, np.float64)
        if np.any(np.isnan(arr)) or np.any(arr == np.inf):
            raise ValueError(f"log_f0 must not hold NaN or +inf (-inf marks a state of zero mass); got {arr}")
    num_states = jnp.shape(log_f0)[0]
    probe = min(2, num_data)
    try:
        out = jax.eval_shape(log_factor_fn, jax.ShapeDtypeStruct((probe,), jnp.int32))
    except Exception as err:  # noqa: BLE001 - reported with the argument's name
        raise ValueError(f"log_factor_fn(indices) failed on {probe} indices with {type(err).__name__}: {err}") from None
    if tuple(out.shape) != (probe, num_states):
        raise ValueError(
            f"log_factor_fn(indices [m]) must return shape [m, D] = [{probe}, {num_states}] (D from log_f0); got "
            f"{tuple(out.shape)} for m = {probe}"
        )
    if data is not None:
        if num_data_of(data) != num_data:
            raise ValueError(f"data has {num_data_of(data)} rows but num_data={num_data}")
        check_finite_data(data)


def build_kernel(
    num_data: int,
    *,
    delta: float | None,
    first_batch_size: int = 50,
    bound: str = "normal",
    variance: str = "pairwise",
    reward_range=None,
    exact: bool = False,
    block_size: int = 1,
    exact_block_size: int = 4096,
) -> Callable:
    """Build ``kernel(rng_key, state, log_f0, log_factor_fn, control_variate=None, beta=None) -> (state, info)``.

    ``beta`` is the inverse temperature (traceable; see :func:`as_top_level_api`).

    Parameters
    ----------
    num_data
        ``N``, number of factors.
    delta
        Total-variation bound of each draw, in ``(0, 1)`` (ignored when ``exact``).
    first_batch_size, bound, variance, reward_range
        Settings of :func:`jaxsub.discrete.racing`.
    exact
        Read all factors and draw from the exact conditional (exact Gibbs), for
        baselines and tests.
    block_size
        ``B >= 1``: the race samples blocks of ``B`` consecutive factors (reward = block
        sum; :func:`jaxsub.discrete.racing`'s ``block_size``): contiguous reads, one
        permutation index per block; ``first_batch_size`` then counts blocks. The
        guarantee is unchanged (a finite population of ``ceil(N / B)`` blocks); order
        the factors at random once if they are sorted. ``B = 1`` (default): single factors.
    exact_block_size
        Data per block of the exact sums (``exact=True``; bounded memory).

    Returns
    -------
    kernel
        ``kernel(rng_key, state, log_f0, log_factor_fn, control_variate=None, beta=None)
        -> (RacingGibbsState, RacingGibbsInfo)``.

    Raises
    ------
    ValueError
        On a setting outside its range.
    """
    delta, first_batch_size, bound = validate_racing_config(num_data, delta, first_batch_size, bound, exact)
    variance = check_choice("variance", variance, VARIANCES)
    block_size = check_block_size(block_size, num_data, None if exact else first_batch_size)
    exact_block_size = check_int("exact_block_size", exact_block_size, low=1)
    engine_block = {"block_size": block_size} if block_size > 1 else {}

    def kernel(
        rng_key: PRNGKey,
        state: RacingGibbsState,
        log_f0: Array,
        log_factor_fn: Callable,
        control_variate=None,
        beta=None,
    ):
        log_f0 = jnp.asarray(log_f0)
        check_beta(beta)
        num_states = log_f0.shape[0]
        if exact:
            draw, has_nan, evals, stages, is_exact = exact_draw(
                rng_key, log_f0, log_factor_fn, num_data, exact_block_size, beta
            )
        else:
            kwargs = {}
            if control_variate is not None:
                kwargs["control_variate"] = control_variate
            if reward_range is not None:
                kwargs["reward_range"] = reward_range
            sample = racing(
                log_factor_fn,
                num_states,
                num_data,
                delta=delta,
                first_batch_size=first_batch_size,
                bound=bound,
                variance=variance,
                **engine_block,
                **kwargs,
            )
            draw, info = sample(rng_key, log_f0, beta)
            has_nan = jnp.asarray(info.has_nan)
            evals = jnp.asarray(info.num_evaluations, jnp.int32)
            stages = jnp.asarray(info.num_stages, jnp.int32)
            is_exact = jnp.asarray(info.is_exact)
        new_position = jnp.where(has_nan, state.position, jnp.asarray(draw, jnp.int32))
        return RacingGibbsState(new_position), RacingGibbsInfo(evals, stages, is_exact, has_nan)

    return kernel


def as_top_level_api(
    log_f0: ArrayLike,
    log_factor_fn: Callable,
    num_data: int,
    *,
    delta: float | None,
    first_batch_size: int = 50,
    bound: str = "normal",
    variance: str = "pairwise",
    reward_range=None,
    control_variate=None,
    exact: bool = False,
    beta=None,
    block_size: int = 1,
    data=None,
) -> SamplingAlgorithm:
    """Racing Gibbs update of one discrete variable as a BlackJAX ``SamplingAlgorithm``.

    Parameters
    ----------
    log_f0
        ``[D]`` log of the data-free factor ``f_0(i)`` of the conditional
        (prior, pseudo-priors, everything that does not grow with ``N``), given
        the rest of the model's state. May be a traced array (shape static).
    log_factor_fn
        ``log_factor_fn(indices) -> [m, D]``: ``log f_n(i)`` for data ``indices``
        and every state, given the rest of the model's state.
    num_data
        ``N`` (static).
    delta
        Total-variation error allowed per draw, in ``(0, 1)``.
    first_batch_size, bound, variance, reward_range
        Racing settings (see :func:`jaxsub.discrete.racing`; the paper uses
        ``m_1 = 50``, ``bound="normal"``, pairwise variances).
    control_variate
        Passed to :func:`jaxsub.discrete.racing` unchanged (a known-mean proxy
        of the factors, paper §3.4).
    exact
        Exact Gibbs (all ``N D`` factors) instead of racing.
    beta
        Inverse temperature ``beta > 0`` (traceable; ``None`` for 1): the draw
        follows ``p^beta``, i.e. ``beta`` multiplies ``log_f0`` and every log
        factor; ``inf`` returns the MAP state (annealing, paper §5.3).
    block_size
        Sampling unit of the race in factors (see :func:`build_kernel`); default 1.
    data
        Optional: the arrays ``log_factor_fn`` reads (pytree with leading size ``N``), checked
        finite here once (a NaN factor makes every race it enters reject the draw).

    Returns
    -------
    SamplingAlgorithm
        ``init(position)`` with the current integer value, and
        ``step(rng_key, state) -> (RacingGibbsState, RacingGibbsInfo)``. The new
        value does not depend on the old one (a Gibbs draw from the conditional).

    Raises
    ------
    ValueError
        Bad ``delta``, ``first_batch_size``, ``bound``, ``variance``, fewer than
        two states, a ``log_f0`` with NaN or ``+inf``, a non-callable ``log_factor_fn`` or one
        that does not return ``[m, D]``, ``data`` with NaN/inf or another number of rows.

    Examples
    --------
    Inside a jitted Gibbs sweep (``theta`` is the rest of the state)::

        gibbs = jaxsub.racing_gibbs(log_f0(theta), partial(log_factors, theta), N, delta=0.05)
        z_state, info = gibbs.step(key, gibbs.init(z))
    """
    check_conditional(log_f0, log_factor_fn, num_data, data)
    check_beta(beta)
    kernel = build_kernel(
        num_data,
        delta=delta,
        first_batch_size=first_batch_size,
        bound=bound,
        variance=variance,
        reward_range=reward_range,
        exact=exact,
        block_size=block_size,
    )

    def init_fn(position, rng_key=None):
        del rng_key
        return init(position)

    def step_fn(rng_key: PRNGKey, state: RacingGibbsState):
        return kernel(rng_key, state, log_f0, log_factor_fn, control_variate, beta)

    return SamplingAlgorithm(init_fn, step_fn)


def build_batched_kernel(
    num_data: int,
    *,
    delta: float,
    first_batch_size: int = 50,
    variance: str = "pairwise",
    group_size: int = 16,
    block_size: int = 1,
    exact_pass_cost: float | None = DEFAULT_EXACT_PASS_COST,
) -> Callable:
    """Racing Gibbs for many chains at once, work proportional to the unfinished races.

    ``jax.vmap`` of :func:`build_kernel`'s kernel runs every race's loops until the
    slowest chain's race is done. This kernel decides the C conditionals with
    :func:`jaxsub.discrete.racing_batch`, whose rounds advance only the unfinished
    races; chain ``c`` gets the same draw as the single-chain kernel with key
    ``rng_keys[c]``, ``log_f0s[c]`` and ``log_factor_fn(., params[c])``.
    Racing-Normal only.

    Parameters
    ----------
    num_data, delta, first_batch_size, variance
        As for :func:`build_kernel`.
    group_size
        Races advanced together (a ``vmap``-ed group) in each round.
    block_size
        Sampling unit of the races in factors (see :func:`build_kernel`); default 1.
    exact_pass_cost
        :func:`jaxsub.discrete.racing_batch`'s option (``c`` in ``(0, 1]`` or ``None``
        to disable): a race still running at the first stage whose new random data
        would reach ``c N`` finishes with one contiguous exact pass over its surviving
        arms (this only removes error events). Default: the engine's.

    Returns
    -------
    kernel
        ``kernel(rng_keys [C], states [C], log_f0s [C, D], log_factor_fn, params,
        control_variate=None, beta=None) -> (states [C], infos [C])`` where
        ``log_factor_fn(indices, params_c) -> [m, D]`` takes one chain's slice of
        ``params`` (a pytree with leading axis C: the rest of each chain's state;
        closures over batched values cannot be split per group, so they go here),
        and ``control_variate`` is ``None`` or ``(fn(indices, params_c) -> [m, D],
        mean(params_c) -> [D])``.

    Raises
    ------
    ValueError
        On a setting outside its range.
    """
    delta, first_batch_size, _ = validate_racing_config(num_data, delta, first_batch_size, "normal", False)
    variance = check_choice("variance", variance, VARIANCES)
    group_size = check_int("group_size", group_size, low=1)
    block_size = check_block_size(block_size, num_data, first_batch_size)
    exact_pass_cost = check_exact_pass_cost(exact_pass_cost)
    engine_options = {"exact_pass_cost": exact_pass_cost, **({"block_size": block_size} if block_size > 1 else {})}

    def kernel(rng_keys, states, log_f0s, log_factor_fn, params, control_variate=None, beta=None):
        log_f0s = jnp.asarray(log_f0s)
        if log_f0s.ndim != 2 or log_f0s.shape[1] < 2:
            raise ValueError(f"log_f0s must have shape [C, D] with D >= 2; got {log_f0s.shape}")
        check_beta(beta)
        kwargs = {} if control_variate is None else {"control_variate": control_variate}
        sample = racing_batch(
            log_factor_fn,
            log_f0s.shape[1],
            num_data,
            delta=delta,
            first_batch_size=first_batch_size,
            bound="normal",
            variance=variance,
            group_size=group_size,
            **engine_options,
            **kwargs,
        )
        draws, info = sample(rng_keys, log_f0s, params, beta)
        has_nan = info.has_nan
        new = jnp.where(has_nan, states.position, draws.astype(jnp.int32))
        infos = RacingGibbsInfo(
            jnp.asarray(info.num_evaluations, jnp.int32),
            jnp.asarray(info.num_stages, jnp.int32),
            info.is_exact,
            has_nan,
        )
        return RacingGibbsState(new), infos

    return kernel
