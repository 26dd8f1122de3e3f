"""The two-urn model of Obermeyer, Glidden & Jonas (2014), section 3.2 / Figure 2, sampled on its counts.

``R`` red and ``B`` blue balls; each ball is in the left urn with probability ``p``; each urn's
red probability has a ``Beta(alpha, alpha)`` prior (collapsed). Balls of one colour are
exchangeable, so a state of the individual assignments is summarised by ``(i, j)`` = (#red,
#blue) in the left urn, and the log posterior of one *individual* assignment with those counts is::

    L(i, j) = (i + j) log p + (N - i - j) log(1 - p) + log B(alpha + i, alpha + j)
              + log B(alpha + R - i, alpha + B - j)

:func:`run_schedule` runs a :class:`~jaxsub.anneal.schedules.Schedule` with ``blocks``
(:func:`~jaxsub.anneal.schedules.anneal_stepsize`, the paper's "Anneal Stepsize") on many chains:
the ADD_PRIOR prefix places every ball from the prior (``i ~ Bin(R, p)``, ``j ~ Bin(B, p)``);
a GIBBS tick with block ``b`` picks a uniformly random ball, takes ``b' = min(b, #balls of its
colour in its urn)`` such balls (the "handful of uniformly-coloured balls") and moves all of them
to the left or right urn with probability ``propto exp L`` of the two resulting states. With
``b = 1`` this is exactly the single-site collapsed Gibbs step of :func:`jaxsub.anneal.fit` on the
same model, so block-1 passes leave the exact posterior
(:func:`~jaxsub.anneal.exact.two_urn_log_posterior`) invariant; blocks ``> 1`` are the paper's
heuristic (no detailed balance claimed), used only while ``beta < 1/2``.
Pure and jit/vmap-able; O(1) per tick.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import betaln

from jaxsub.anneal.moves import bits_to_uniform, uniform_index
from jaxsub.anneal.schedules import ADD_PRIOR, GIBBS, Schedule
from jaxsub.types import PRNGKey
from jaxsub.validation import check_int, check_real

__all__ = ["UrnCounts", "log_weight", "run_schedule", "block_tick"]


class UrnCounts(NamedTuple):
    """``red_left`` / ``blue_left``: numbers of red / blue balls in the left urn (one chain)."""

    red_left: jnp.ndarray
    blue_left: jnp.ndarray


def log_weight(i, j, num_red: int, num_blue: int, alpha, p_left):
    """``L(i, j)``: unnormalised log posterior of one individual assignment with counts ``(i, j)``.

    ``L(i, j) = (i + j) log p + (N - i - j) log(1 - p) + log B(alpha + i, alpha + j)
    + log B(alpha + R - i, alpha + B - j)`` with ``N = R + B`` (no binomial coefficients: one
    labelled assignment, not the count pair).

    Parameters
    ----------
    i, j : int or jnp.ndarray
        Numbers of red and blue balls in the left urn (broadcastable).
    num_red, num_blue : int
        ``R`` and ``B``.
    alpha : float or jnp.ndarray
        The symmetric Beta prior's parameter.
    p_left : float or jnp.ndarray
        The probability that a ball is in the left urn.

    Returns
    -------
    jnp.ndarray
        Float32 ``L(i, j)``, broadcast over ``i`` and ``j``.
    """
    i = jnp.asarray(i, jnp.float32)
    j = jnp.asarray(j, jnp.float32)
    n = num_red + num_blue
    return (
        (i + j) * jnp.log(p_left)
        + (n - i - j) * jnp.log1p(-p_left)
        + betaln(alpha + i, alpha + j)
        + betaln(alpha + num_red - i, alpha + num_blue - j)
    )


TICK_WORDS = 3  # uint32 words per block tick: the picked ball (2, exact integer pick), the urn draw (1)


def block_tick(u, state: UrnCounts, block, *, num_red: int, num_blue: int, alpha, p_left) -> UrnCounts:
    """One full-data block Gibbs tick moving ``min(block, #same-coloured balls in the picked ball's urn)`` balls.

    ``u``: ``TICK_WORDS = 3`` uint32 random words: words 0-1 pick the ball exactly uniformly among the ``R + B``
    (:func:`~jaxsub.anneal.moves.uniform_index`; a float ``floor(u n)`` is off by up to ``~n / 2^23`` relative),
    word 2 is the urn draw's uniform (built as :func:`jax.random.uniform` builds it).

    The held-out handful goes to the left urn with probability ``sigmoid(L_left - L_right)``
    (:func:`log_weight`), an exact Gibbs step on the block.

    Parameters
    ----------
    u : jnp.ndarray
        ``[3]`` uint32 random words.
    state : UrnCounts
        One chain's counts.
    block : int or jnp.ndarray
        The block size (int32 scalar, >= 1).
    num_red, num_blue : int
        ``R`` and ``B`` (static).
    alpha : float or jnp.ndarray
        The symmetric Beta prior's parameter.
    p_left : float or jnp.ndarray
        The probability that a ball is in the left urn.

    Returns
    -------
    UrnCounts
        The counts after the tick (int32).
    """
    n = num_red + num_blue
    u = jnp.asarray(u, jnp.uint32)
    ball = uniform_index(u[0:2], n)
    red = ball < num_red
    # within the colour, balls [0, count_left) sit in the left urn (exchangeable: any labelling works)
    idx = jnp.where(red, ball, ball - num_red)
    left_count = jnp.where(red, state.red_left, state.blue_left)
    total = jnp.where(red, num_red, num_blue)
    in_left = idx < left_count
    avail = jnp.where(in_left, left_count, total - left_count)
    b = jnp.minimum(jnp.asarray(block, jnp.int32), avail)
    base = left_count - jnp.where(in_left, b, 0)  # colour count in the left urn with the handful held out
    to_left = base + b
    i_l = jnp.where(red, to_left, state.red_left)
    j_l = jnp.where(red, state.blue_left, to_left)
    i_r = jnp.where(red, base, state.red_left)
    j_r = jnp.where(red, state.blue_left, base)
    diff = log_weight(i_l, j_l, num_red, num_blue, alpha, p_left) - log_weight(
        i_r, j_r, num_red, num_blue, alpha, p_left
    )
    go_left = bits_to_uniform(u[2]) < jax.nn.sigmoid(diff)  # P(left) = e^L_l / (e^L_l + e^L_r)
    return UrnCounts(jnp.where(go_left, i_l, i_r).astype(jnp.int32), jnp.where(go_left, j_l, j_r).astype(jnp.int32))


def run_schedule(
    rng_key: PRNGKey, schedule: Schedule, num_red: int, num_blue: int, alpha: float, p_left: float, num_chains: int
) -> UrnCounts:
    """Run ``schedule`` (ADD_PRIOR prefix then GIBBS ticks, with ``blocks``) on ``num_chains`` chains: final counts.

    Not jitted here beyond one ``lax.scan``; wrap in ``jax.jit`` for repeated use. The ADD_PRIOR
    prefix is drawn exactly (each colour's left count is ``Binomial(R or B, p_left)``); each GIBBS tick
    is one :func:`block_tick`.

    Parameters
    ----------
    rng_key : PRNGKey
        The key (split into the prior draw and the ticks' words).
    schedule : Schedule
        A schedule for ``R + B`` rows: ``R + B`` ADD_PRIOR ticks then GIBBS ticks (e.g.
        :func:`~jaxsub.anneal.anneal_stepsize`); its ``blocks`` (default 1) give the block sizes.
    num_red, num_blue : int
        ``R`` and ``B`` (>= 0).
    alpha : float
        The symmetric Beta prior's parameter (>= 0).
    p_left : float
        The probability that a ball is in the left urn, in ``[0, 1]``.
    num_chains : int
        The number of independent chains (>= 1).

    Returns
    -------
    UrnCounts
        ``[num_chains]`` final counts.

    Raises
    ------
    ValueError
        An argument outside its range (named), a schedule that is not for ``R + B`` rows, or one whose
        codes are not an ADD_PRIOR prefix followed by GIBBS ticks.
    """
    num_red = check_int("num_red", num_red, low=0)
    num_blue = check_int("num_blue", num_blue, low=0)
    alpha = check_real("alpha", alpha, low=0.0)
    p_left = check_real("p_left", p_left, low=0.0, high=1.0)
    num_chains = check_int("num_chains", num_chains, low=1)
    n = num_red + num_blue
    if schedule.num_rows != n:
        raise ValueError(f"schedule is for {schedule.num_rows} rows but there are {n} balls")
    codes = jnp.asarray(schedule.codes)
    prior_len = int((schedule.codes == ADD_PRIOR).sum())
    if prior_len != n or not (schedule.codes[:n] == ADD_PRIOR).all() or not (schedule.codes[n:] == GIBBS).all():
        raise ValueError("run_schedule needs N ADD_PRIOR ticks followed by GIBBS ticks (e.g. anneal_stepsize)")
    blocks = jnp.asarray(schedule.blocks[n:] if schedule.blocks is not None else [1] * (len(codes) - n), jnp.int32)
    k_init, k_run = jax.random.split(rng_key)
    ki, kj = jax.random.split(k_init)
    init = UrnCounts(
        jax.random.binomial(ki, num_red, p_left, (num_chains,)).astype(jnp.int32),
        jax.random.binomial(kj, num_blue, p_left, (num_chains,)).astype(jnp.int32),
    )
    step = jax.vmap(
        lambda u, s, b: block_tick(u, s, b, num_red=num_red, num_blue=num_blue, alpha=alpha, p_left=p_left),
        in_axes=(0, 0, None),
    )

    def body(st, xs):
        t, b = xs  # one batch of random words per tick for all chains
        return step(jax.random.bits(jax.random.fold_in(k_run, t), (num_chains, TICK_WORDS), jnp.uint32), st, b), None

    out, _ = jax.lax.scan(body, init, (jnp.arange(blocks.shape[0], dtype=jnp.int32), blocks))
    return out
