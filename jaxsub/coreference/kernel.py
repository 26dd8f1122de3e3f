"""The coreference Gibbs sweep as a BlackJAX-style kernel: :func:`build_kernel`, :func:`init`, :func:`as_top_level_api`.

Updates are grouped by class of block sizes (:func:`mention_classes`; one compiled update per class,
its static :class:`~jaxsub.coreference.options.ClassConfig`), and the sweep visits the classes in
turn, each by a ``lax.scan`` over its sorted positions (a fixed systematic-scan order):
sequential updates (:func:`~jaxsub.coreference.step.sequential_step`) or batched rounds
(:func:`~jaxsub.coreference.rounds.batched_round`). With probability ≥ 1 - δ each race returns the
exact Gumbel-max decision (Prop. 1: the draw is within δ of the conditional in total variation;
Racing-Normal assumes the normal approximation of eq. 9). Mentions whose block is smaller than
``min_race_size`` or that have more than ``max_candidates`` candidates are updated exactly, and so
are those where the cost model (``race_cost``) expects a race to cost more than the exact update.

References
----------
Y. Chen & Z. Ghahramani, "Scalable discrete sampling as a multi-armed bandit problem",
ICML 2016, §5.3, Prop. 1, eq. 9. S. Singh, M. Wick & A. McCallum, "Monte Carlo MCMC:
efficient inference by approximate sampling", EMNLP 2012.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.base import SamplingAlgorithm
from jaxsub.coreference.model import Blocks
from jaxsub.coreference.options import (
    SMALL_CLASS_CAP,
    CorefOptions,
    class_config,
    coref_options,
    validate_options,
)
from jaxsub.coreference.rewards import Model
from jaxsub.coreference.rounds import batched_round, class_lanes
from jaxsub.coreference.state import (
    CorefState,
    SweepInfo,
    add_info,
    init,
    pack,
    unpack,
    zero_info,
)
from jaxsub.coreference.step import sequential_step
from jaxsub.validation import check_hyperparameter, check_int

__all__ = [
    "CorefState",
    "SweepInfo",
    "as_top_level_api",
    "build_kernel",
    "class_steps",
    "conditional_update",
    "init",
    "mention_classes",
]


def mention_classes(blocks: Blocks, small_cap: int = 64):
    """Group sorted positions by block size: ``[(N_cap, positions)]`` with ``K = n_b - 1 ∈ (N_cap/2, N_cap]``.

    Blocks with ``K <= small_cap`` share one class ``N_cap = small_cap``; above it the classes are the
    powers of two. Singleton blocks (``K = 0``, nothing to decide) are left out. One update function is
    compiled per class.

    Parameters
    ----------
    blocks
        :class:`~jaxsub.coreference.Blocks`.
    small_cap
        The smallest class's bound on ``K`` (>= 1).

    Returns
    -------
    list
        ``[(N_cap, positions)]``, ``positions`` an int32 array of sorted positions, classes increasing.

    Raises
    ------
    ValueError
        ``small_cap < 1``.
    """
    small_cap = check_int("small_cap", small_cap, low=1)
    k = blocks.size - 1
    out = []
    small = np.flatnonzero((k >= 1) & (k <= small_cap)).astype(np.int32)
    if small.size:
        out.append((small_cap, small))
    cap = small_cap * 2
    while np.any(k > cap // 2):
        sel = np.flatnonzero((k > cap // 2) & (k <= cap) & (k > small_cap)).astype(np.int32)
        if sel.size:
            out.append((cap, sel))
        cap *= 2
    return out


def _check_mentions(mentions, m):
    """``mentions``: a pytree of arrays with leading axis ``m`` (``ValueError`` otherwise)."""
    leaves = jax.tree.leaves(mentions)
    if not leaves or any(jnp.ndim(a) < 1 or jnp.shape(a)[0] != m for a in leaves):
        raise ValueError(
            f"mentions must be a pytree of arrays with leading axis {m} (one row per mention); "
            f"got shapes {[jnp.shape(a) for a in leaves]}"
        )


def _check_factor(pairwise_log_factor):
    """``pairwise_log_factor`` must be callable (``ValueError`` otherwise)."""
    if not callable(pairwise_log_factor):
        raise ValueError(f"pairwise_log_factor must be callable; got {pairwise_log_factor!r}")


def _flag(name, value):
    """A mode flag: a Python bool (specialised at trace time) or a traced/array bool (``lax.cond``)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, jax.core.Tracer):
        if jnp.shape(value) != () or value.dtype != jnp.bool_:
            raise ValueError(f"{name} must be a bool (or a traced scalar bool); got {value.dtype}{jnp.shape(value)}")
        return value
    arr = np.asarray(value)
    if arr.shape != () or arr.dtype != np.bool_:
        raise ValueError(f"{name} must be a bool (or a traced scalar bool); got {value!r}")
    return bool(arr)


def class_steps(blocks: Blocks, options: CorefOptions) -> list:
    """``[(n_cap, positions, step)]``: one update function per class of block sizes.

    ``step(model, exact, check, carry, p)``: :func:`~jaxsub.coreference.step.sequential_step` (``p`` a sorted
    position) or, with ``batch_size > 1``, :func:`~jaxsub.coreference.rounds.batched_round` (``p`` a row of
    :func:`~jaxsub.coreference.rounds.class_lanes`), with the class's static configuration bound.
    ``options`` must be validated (:func:`~jaxsub.coreference.options.validate_options`).

    Blocks are grouped into classes by size (:func:`~jaxsub.coreference.mention_classes`), so each
    class compiles once for its capacity ``n_cap``; every class below ``min_race_size`` shares one
    class whose updates are exact. With ``options.visit`` only the visited mentions' positions are kept
    (a class left empty is dropped).

    Parameters
    ----------
    blocks : Blocks
        The mentions' blocking (:func:`~jaxsub.coreference.make_blocks`).
    options : CorefOptions
        The validated options (``batch_size``, ``min_race_size``, ``visit`` and the racing settings).

    Returns
    -------
    list of tuple
        ``(n_cap, positions, step)`` per class: the class's block-size capacity, its ``[K]`` sorted
        positions (or ``[K, batch_size]`` lanes) and its update function.
    """
    blocks_dev = (jnp.asarray(blocks.order), jnp.asarray(blocks.start), jnp.asarray(blocks.size))
    keep = None
    if options.visit is not None:
        keep = np.isin(np.arange(blocks.num_mentions), blocks.position[options.visit])
    small_cap = SMALL_CLASS_CAP
    while small_cap * 2 < options.min_race_size:
        small_cap *= 2  # every class below min_race_size is updated exactly: one class (one compile) for them
    out = []
    for n_cap, positions in mention_classes(blocks, small_cap):
        if keep is not None:
            positions = positions[keep[positions]]
            if positions.size == 0:
                continue
        cfg = class_config(n_cap, options)
        if options.batch_size > 1:
            out.append(
                (n_cap, class_lanes(blocks, positions, options.batch_size), partial(batched_round, cfg, blocks_dev))
            )
        else:
            out.append((n_cap, positions, partial(sequential_step, cfg, blocks_dev)))
    return out


def _sweep(
    steps,
    m: int,
    rng_key,
    state: CorefState,
    pairwise_log_factor,
    mentions,
    temperature=1.0,
    exact=False,
    check_decisions=False,
):
    """One sweep: every class's updates in turn (the kernel of :func:`build_kernel`)."""
    _check_factor(pairwise_log_factor)
    temperature = check_hyperparameter("temperature", temperature, low=0.0)
    _check_mentions(mentions, m)
    exact, check = _flag("exact", exact), _flag("check_decisions", check_decisions)
    model = Model(pairwise_log_factor, mentions, jnp.asarray(temperature, jnp.float32))
    info = zero_info()
    packed = pack(state)
    for c, (positions, step) in enumerate(steps):
        (packed, _), infos = jax.lax.scan(
            partial(step, model, exact, check), (packed, jax.random.fold_in(rng_key, c)), positions
        )
        info = add_info(info, jax.tree.map(lambda a: jnp.sum(a, dtype=jnp.int32), infos))
    return unpack(packed), info


def _single_update(
    step,
    where,
    m: int,
    rng_key,
    state: CorefState,
    pairwise_log_factor,
    mentions,
    temperature=1.0,
    exact=False,
    check_decisions=False,
):
    """One update (the function returned by :func:`conditional_update`)."""
    _check_factor(pairwise_log_factor)
    _check_mentions(mentions, m)
    beta = jnp.asarray(check_hyperparameter("temperature", temperature, low=0.0), jnp.float32)
    exact, check = _flag("exact", exact), _flag("check_decisions", check_decisions)
    model = Model(pairwise_log_factor, mentions, beta)
    (packed, _), info = step(model, exact, check, (pack(state), rng_key), where)
    return unpack(packed), info


def build_kernel(blocks: Blocks, options: CorefOptions | None = None, **option_values):
    """Build one Gibbs sweep over all mentions (or over the mentions in ``visit``).

    Only the structure is fixed here (the blocks, hence the classes of block sizes and the compiled
    update per class, and the racing settings); the model (``pairwise_log_factor``, ``mentions``) and
    the inverse temperature go to the kernel.

    Parameters
    ----------
    blocks
        :class:`~jaxsub.coreference.Blocks` from :func:`~jaxsub.coreference.make_blocks`.
    options, **option_values
        The sweep's options: the fields of :class:`~jaxsub.coreference.CorefOptions` (documented there:
        ``delta``, ``first_batch_size``, ``max_candidates``, ``min_race_size``, ``control_variate``,
        ``chunk_size``, ``visit``, ``schedule``, ``min_arm_draws``, ``race_widths``, ``batch_size``,
        ``race_cost``, ``hybrid``, ``cv_members``, ``race_schedule``), as keyword arguments or as one
        ``options=CorefOptions(...)`` record (keyword arguments override its fields).

    Returns
    -------
    Callable
        ``kernel(rng_key, state, pairwise_log_factor, mentions, temperature=1.0, exact=False,
        check_decisions=False) -> (state, SweepInfo)``:

        * ``pairwise_log_factor``: ``f(x_i, x_j) -> scalar`` on single rows of ``mentions``
          (e.g. :func:`~jaxsub.coreference.similarity_factor`);
        * ``mentions``: a pytree of arrays with leading axis M (indexed by mention);
        * ``temperature``: the inverse temperature β > 0 (traceable);
        * ``exact``: exact Gibbs (every factor of every candidate) through the same sweep;
        * ``check_decisions``: also recompute every race exactly under the same Gumbel noise and
          count disagreements in ``info.num_errors`` (diagnostic; costs an exact update per race).

        ``exact`` and ``check_decisions`` are Python bools (the unused branch is not compiled) or
        traced scalar bools (one compiled sweep serves the exact sampler, Sub Gibbs and the check).

    Raises
    ------
    ValueError
        ``blocks`` is not a :class:`~jaxsub.coreference.Blocks` or an option is out of its range
        (:func:`~jaxsub.coreference.options.validate_options`).
    TypeError
        An unknown option.
    """
    o = validate_options(coref_options(options, option_values, "build_kernel"), blocks)
    steps = [(jnp.asarray(positions), step) for _, positions, step in class_steps(blocks, o)]
    return partial(_sweep, steps, blocks.num_mentions)


def conditional_update(blocks: Blocks, mention: int, options: CorefOptions | None = None, **option_values):
    """One Gibbs update of a single mention, exactly as the sweep of :func:`build_kernel` does it.

    Parameters
    ----------
    blocks
        :class:`~jaxsub.coreference.Blocks`.
    mention
        The mention index (concrete int); its block must have at least 2 mentions.
    options, **option_values
        As in :func:`build_kernel`.

    Returns
    -------
    Callable
        ``update(rng_key, state, pairwise_log_factor, mentions, temperature=1.0, exact=False,
        check_decisions=False) -> (state, SweepInfo)`` (for tests and diagnostics: the law of
        ``state.labels[mention]`` is the racing (or exact) conditional).

    Raises
    ------
    ValueError
        ``mention`` out of ``[0, M)`` or alone in its block; an option out of its range.
    """
    m = blocks.num_mentions
    mention = check_int("mention", mention, low=0, high=m - 1)
    p = int(blocks.position[mention])
    o = validate_options(coref_options(options, option_values, "conditional_update"), blocks)
    for _, positions, step in class_steps(blocks, o):
        if p in set(np.ravel(positions).tolist()):
            break
    else:
        raise ValueError(f"mention {mention} is alone in its block: there is nothing to update")
    # batched rounds: the mention alone in a round of one lane
    where = jnp.asarray([p], jnp.int32) if o.batch_size > 1 else jnp.int32(p)
    return partial(_single_update, step, where, m)


def as_top_level_api(
    pairwise_log_factor: Callable,
    mentions,
    blocks: Blocks,
    *,
    temperature=1.0,
    exact: bool = False,
    options: CorefOptions | None = None,
    **option_values,
) -> SamplingAlgorithm:
    """``SamplingAlgorithm``: ``init(position=labels or None)``, ``step(rng_key, state)`` = one sweep.

    Parameters
    ----------
    pairwise_log_factor
        ``f(x_i, x_j) -> scalar`` on single rows of ``mentions``.
    mentions
        Pytree of arrays with leading axis M.
    blocks
        :class:`~jaxsub.coreference.Blocks`.
    temperature
        The inverse temperature β > 0 (traceable).
    exact
        Exact Gibbs instead of racing.
    options, **option_values
        As in :func:`build_kernel`.

    Returns
    -------
    SamplingAlgorithm

    Raises
    ------
    ValueError
        A non-callable factor, ``temperature <= 0`` or an option out of its range.
    """
    _check_factor(pairwise_log_factor)
    check_hyperparameter("temperature", temperature, low=0.0)
    kernel = build_kernel(blocks, options, **option_values)

    def init_fn(position=None, rng_key=None):
        del rng_key
        return init(position, blocks)

    def step_fn(rng_key, state):
        return kernel(rng_key, state, pairwise_log_factor, mentions, temperature, exact)

    return SamplingAlgorithm(init_fn, step_fn)
