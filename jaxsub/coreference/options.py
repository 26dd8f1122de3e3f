"""The static configuration of the coreference sweep: options declared once, validated at construction.

:class:`CorefOptions` declares the options of :func:`~jaxsub.coreference.build_kernel` and
:func:`~jaxsub.coreference.fit` (names, defaults, documentation); both take them as keyword
arguments or as one ``options=CorefOptions(...)`` record (keyword arguments then override its
fields). :func:`validate_options` checks every value (``ValueError`` naming the option and its
allowed range) and :func:`class_config` derives the static :class:`ClassConfig` of one class of
block sizes, of which every update function is a pure function. The cost model deciding race
vs exact per update (:func:`race_costs`, :func:`race_pays`) lives here too.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxsub.coreference.model import Blocks
from jaxsub.validation import check_choice, check_int, check_real

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MIN_ARM_DRAWS",
    "DEFAULT_RACE_COST",
    "DEFAULT_RACE_WIDTHS",
    "RACE_SCHEDULES",
    "SCHEDULES",
    "ClassConfig",
    "CorefOptions",
    "class_config",
    "coref_options",
    "race_can_pay",
    "race_costs",
    "race_pays",
    "validate_options",
]

#: Default ``min_arm_draws`` (λ): candidates expected to have fewer than λ members in the race's first
#: batch, or fewer than m1 members, are summed exactly. With a few members among the padded zeros an
#: arm's stage means are far from Normal and Racing-Normal's δ fails (measured on FEBRL 3, clusters of
#: 1–6 in blocks of hundreds: decision error 0.129 at δ = 0.05 when every arm is raced; docs/guides/coreference.md).
DEFAULT_MIN_ARM_DRAWS = 1.0

#: Default extra race width (``race_widths``): updates with at most 16 candidates race over 16 columns
#: instead of ``max_candidates`` (engine cost per race measured on CPU: about 40, 56 and 170 µs at widths
#: 8, 32 and 128, docs/guides/coreference.md).
DEFAULT_RACE_WIDTHS = (16,)

#: Default ``batch_size``: 1, the sequential sweep. Batched rounds (``batch_size > 1``) give the same draws
#: but measured no faster on author mentions (M = 20,000) and compile 2-3x longer (docs/guides/coreference.md).
DEFAULT_BATCH_SIZE = 1

#: Default ``race_cost`` F (factor evaluations; see :func:`race_costs`), calibrated on CPU with
#: :func:`~jaxsub.coreference.packed_similarity` on author mentions (the largest block of M = 20,000, 128
#: updates: a race's CPU time beyond its own evaluations = 1,000-1,350 evaluations of 0.17 µs;
#: docs/guides/coreference.md; ``benchmarks.coreference.calibrate_race_cost``). A factor that costs more per
#: evaluation has a smaller F (the default then races less than it could).
DEFAULT_RACE_COST = 1000.0

#: The race's population layouts (``schedule``).
SCHEDULES = ("padded", "ragged")

#: The padded race's stage schedules (``race_schedule``): the engine's doubling schedule (Alg. 1,
#: default) or its single-test ``"fixed"`` schedule (docs/guides/coreference.md).
RACE_SCHEDULES = ("doubling", "fixed")

#: Engine cost per race vs width D, measured on CPU (one race over N = 1,024, 3 live arms, load ~10:
#: 39 / 42 / 56 / 168 µs at D = 4 / 8 / 32 / 128, docs/guides/coreference.md): about ``a + D`` µs with a ≈ 38.
WIDTH_COST_OFFSET = 38.0

#: Blocks with ``K = n_b - 1`` up to this share the smallest class of block sizes (one compiled update).
SMALL_CLASS_CAP = 64


class CorefOptions(NamedTuple):
    """The options of the coreference sweep (:func:`~jaxsub.coreference.build_kernel`, :func:`~jaxsub.coreference.fit`).

    Every option is static (a Python value fixed at construction) and validated by
    :func:`validate_options`. ``None`` for ``min_arm_draws``, ``race_widths``, ``batch_size`` or
    ``race_cost`` means the module default.

    Attributes
    ----------
    delta
        Racing error level in (0, 1). Racing-Normal's threshold ``B_Normal(δ, N, m1)`` is solved on the
        host per class (``schedule="padded"``).
    first_batch_size
        m1 >= 2, the first mini-batch (paper: 50).
    max_candidates
        The widest race D >= 2; mentions with more candidates are updated exactly (unless ``hybrid``).
    min_race_size
        Blocks whose class (``K = n_b - 1`` rounded up to ``64 * 2^k``) is below this are updated exactly,
        all in one class (one compiled update); at least ``max(2 m1, 4)``.
    control_variate
        Use the per-candidate control variate ``h_y = β f(x_i, r_y)`` (padded schedule).
    chunk_size
        Chunk of mentions summed at once by the exact sums (>= 1).
    visit
        Optional 1-D array of mention indices in ``[0, M)``: the sweep updates only these (e.g. to time
        updates inside one large block); default all.
    schedule
        ``"padded"`` (one shared population per block, zero rewards for other clusters, with the control
        variate) or ``"ragged"`` (the engine's per-arm doubling schedules over each candidate's own members,
        :func:`jaxsub.discrete.racing_ragged`; no control variate).
    min_arm_draws
        λ in ``[0, m1]`` (padded schedule; default :data:`DEFAULT_MIN_ARM_DRAWS`). A candidate with fewer
        members than the first batch (``N_y < m1``) or whose expected number of members in the race's first
        batch, ``m1 N_y / K``, is below λ is summed exactly (``N_y`` evaluations, counted) instead of raced;
        when fewer than ``2 m1`` mentions remain for the race the update is exact. λ = 0 races every
        candidate (the paper's rule, whose decision error exceeds δ when clusters are small; see docs).
    race_widths
        Extra static race widths (integers >= 2) below ``max_candidates`` (default
        :data:`DEFAULT_RACE_WIDTHS`): each update races at the narrowest width holding its candidates
        (``lax.switch``). Each width is one more compiled race per class; ``()`` races at ``max_candidates``.
    batch_size
        ``B >= 1`` (default :data:`DEFAULT_BATCH_SIZE`). ``B > 1`` (``schedule="padded"``, not ``hybrid``):
        batched rounds, up to ``B`` mentions of ``B`` different blocks of a class decided together from the
        same state (:mod:`jaxsub.coreference.rounds`); the same sweep, draw for draw (per-position keys).
    race_cost
        ``F >= 0`` (default :data:`DEFAULT_RACE_COST`), the cost model deciding race vs exact per update: an
        update that could race races only when the evaluations it is expected to save,
        ``K - (k_small + raced arms + 4 m1)``, are at least the race's fixed cost at its width
        (:func:`race_costs`). ``0`` races wherever the rules above allow.
    hybrid
        ``True``: every small arm and the empty cluster are summed exactly over **all** the block's
        candidates, and only the best of them (Gumbel-perturbed) enters the race as one column beside the
        large arms (race width ``#large + 1 <= K / m1 + 1``, whatever the number of candidates). Sequential
        sweep only; both schedules.
    cv_members
        ``q`` in ``[1, m1]`` (``hybrid=True`` only for ``q > 1``): a raced arm's control variate is the mean
        factor over the first ``q`` members of its segment (``q`` evaluations per arm, counted).
    race_schedule
        The padded race's stage schedule: ``"doubling"`` (Alg. 1: tests after ``m1, 2 m1, 4 m1, ...``
        draws) or ``"fixed"`` (one elimination test after ``m1`` draws with the one-stage quantile
        ``Φ⁻¹(1 - δ / D)``, then the surviving arms on all ``N`` indices). Both keep δ under the Normal
        assumption.
    """

    delta: float = 0.05
    first_batch_size: int = 50
    max_candidates: int = 128
    min_race_size: int = 128
    control_variate: bool = True
    chunk_size: int = 256
    visit: object = None
    schedule: str = "padded"
    min_arm_draws: float | None = None
    race_widths: tuple | None = None
    batch_size: int | None = None
    race_cost: float | None = None
    hybrid: bool = False
    cv_members: int = 1
    race_schedule: str = "doubling"


def coref_options(options: CorefOptions | None, overrides: dict, caller: str) -> CorefOptions:
    """``options`` (default :class:`CorefOptions`) with the keyword ``overrides`` applied.

    Parameters
    ----------
    options
        ``None`` or a :class:`CorefOptions`.
    overrides
        Option names and values (keyword arguments of ``caller``).
    caller
        The public function's name, for the error messages.

    Returns
    -------
    CorefOptions

    Raises
    ------
    TypeError
        An unknown option name (as Python does for an unexpected keyword argument).
    ValueError
        ``options`` is not a :class:`CorefOptions`.
    """
    if options is None:
        options = CorefOptions()
    elif not isinstance(options, CorefOptions):
        raise ValueError(f"options must be a CorefOptions (or None); got {type(options).__name__}")
    unknown = sorted(set(overrides) - set(CorefOptions._fields))
    if unknown:
        raise TypeError(f"{caller}() got unexpected option(s) {unknown}; the options are {list(CorefOptions._fields)}")
    return options._replace(**overrides)


def _check_visit(visit, m: int):
    if visit is None:
        return None
    visit = np.asarray(visit)
    if visit.ndim != 1 or not np.issubdtype(visit.dtype, np.integer) or np.any((visit < 0) | (visit >= m)):
        raise ValueError(f"visit must be a 1-D array of mention indices in [0, {m}); got {visit!r}")
    return visit


def _check_widths(race_widths):
    try:
        return tuple(check_int("race_widths", w, low=2) for w in race_widths)
    except TypeError:
        raise ValueError(f"race_widths must be a sequence of integers >= 2; got {race_widths!r}") from None


def _check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a Python bool; got {value!r}")
    return bool(value)


def _check_combinations(o: CorefOptions) -> None:
    if o.batch_size > 1 and o.schedule != "padded":
        raise ValueError(
            f"batch_size > 1 (batched rounds) needs schedule='padded'; got batch_size={o.batch_size}, "
            f"schedule={o.schedule!r}"
        )
    if o.hybrid and o.batch_size > 1:
        raise ValueError(f"hybrid=True needs the sequential sweep (batch_size=1); got batch_size={o.batch_size}")
    if o.race_schedule != "doubling" and o.schedule != "padded":
        raise ValueError(
            f"race_schedule={o.race_schedule!r} needs schedule='padded' (racing_ragged has per-arm "
            f"doubling schedules only); got schedule={o.schedule!r}"
        )
    if o.cv_members > 1 and not o.hybrid:
        raise ValueError(f"cv_members > 1 needs hybrid=True; got cv_members={o.cv_members}")


def validate_options(options: CorefOptions, blocks: Blocks) -> CorefOptions:
    """Every option checked and normalised (defaults filled in, Python scalars, ``visit`` a NumPy array).

    Parameters
    ----------
    options
        :class:`CorefOptions`.
    blocks
        :class:`~jaxsub.coreference.Blocks` (``visit`` is checked against its number of mentions).

    Returns
    -------
    CorefOptions
        With no ``None`` left but ``visit``.

    Raises
    ------
    ValueError
        ``blocks`` is not a :class:`~jaxsub.coreference.Blocks`, or an option is out of its range (the message
        names it): ``delta`` in (0, 1), ``first_batch_size >= 2``, ``max_candidates >= 2``,
        ``min_race_size >= max(2 m1, 4)``, ``chunk_size >= 1``, ``min_arm_draws`` in ``[0, m1]``,
        ``race_widths`` integers >= 2, ``batch_size >= 1``, ``race_cost >= 0`` (finite), ``cv_members`` in
        ``[1, m1]``, the choices ``schedule`` / ``race_schedule``, Python bools ``hybrid`` /
        ``control_variate``, and the combinations documented on :class:`CorefOptions`.
    """
    if not isinstance(blocks, Blocks):
        raise ValueError(f"blocks must be a Blocks (from make_blocks); got {type(blocks).__name__}")
    o = options
    m1 = check_int("first_batch_size", o.first_batch_size, low=2)
    o = CorefOptions(
        delta=check_real("delta", o.delta, low=0.0, high=1.0),
        first_batch_size=m1,
        max_candidates=check_int("max_candidates", o.max_candidates, low=2),
        min_race_size=check_int("min_race_size", o.min_race_size, low=max(2 * m1, 4)),
        control_variate=_check_bool("control_variate", o.control_variate),
        chunk_size=check_int("chunk_size", o.chunk_size, low=1),
        visit=_check_visit(o.visit, blocks.num_mentions),
        schedule=check_choice("schedule", o.schedule, SCHEDULES),
        min_arm_draws=check_real(
            "min_arm_draws",
            DEFAULT_MIN_ARM_DRAWS if o.min_arm_draws is None else o.min_arm_draws,
            low=0.0,
            high=float(m1),
            low_closed=True,
            high_closed=True,
        ),
        race_widths=_check_widths(DEFAULT_RACE_WIDTHS if o.race_widths is None else o.race_widths),
        batch_size=check_int("batch_size", DEFAULT_BATCH_SIZE if o.batch_size is None else o.batch_size, low=1),
        race_cost=check_real(
            "race_cost", DEFAULT_RACE_COST if o.race_cost is None else o.race_cost, low=0.0, low_closed=True
        ),
        hybrid=_check_bool("hybrid", o.hybrid),
        cv_members=check_int("cv_members", o.cv_members, low=1, high=m1),
        race_schedule=check_choice("race_schedule", o.race_schedule, RACE_SCHEDULES),
    )
    _check_combinations(o)
    return o


def race_costs(race_cost: float, widths) -> tuple:
    """Fixed cost of a race at each static width, in factor evaluations.

    ``race_cost (a + max(D, 16)) / (a + 16)`` with ``a`` = :data:`WIDTH_COST_OFFSET`: ``race_cost`` is the
    fixed cost of a race of width 16 beyond its evaluations, in units of one factor evaluation inside an
    exact update (calibrated once per factor and machine: the time of a race minus its evaluations, divided
    by the exact update's time per evaluation); wider races cost more in proportion to the engine's
    measured ``a + D``. Narrower races are *not* cheaper (the hybrid's width-2–4 races cost 630–660
    evaluations beyond their own at M = 20,000, the width-16 race 570–600; most of a race's fixed cost is
    the update around the engine, docs/guides/coreference.md).

    Parameters
    ----------
    race_cost
        F >= 0.
    widths
        Static race widths.

    Returns
    -------
    tuple of float
        One cost per width.
    """
    return tuple(float(race_cost) * (WIDTH_COST_OFFSET + max(w, 16)) / (WIDTH_COST_OFFSET + 16) for w in widths)


def race_pays(K, k_small, num_large, costs, width, first_batch_size: int):
    """The cost model: race iff the evaluations it is expected to save exceed its fixed cost.

    An exact update costs ``K`` evaluations; a race ``k_small`` (small arms summed exactly) + one control
    variate evaluation per raced arm + its draws (estimated as ``4 m1``: measured 3.6 m1 in a block of
    2,000 with 20 clusters of 100 and 6 m1 in the largest author block, 1,024 mentions) + its fixed cost
    ``costs[width]`` (:func:`race_costs`).

    Parameters
    ----------
    K, k_small, num_large
        Traced int32: other mentions of the block, members of the exactly summed arms, raced arms.
    costs
        :func:`race_costs` of the static widths.
    width
        Traced index into ``costs``.
    first_batch_size
        m1.

    Returns
    -------
    jax.Array
        Traced bool.
    """
    expected = k_small + num_large + 4 * first_batch_size
    return (K - expected).astype(jnp.float32) >= jnp.asarray(costs, jnp.float32)[width]


def race_can_pay(n_cap: int, options: CorefOptions) -> bool:
    """Static part of the cost model: can any update of a class with ``K <= n_cap`` pass :func:`race_pays`?

    The largest saving is ``n_cap - 1 - 4 m1`` (no small arm, one raced arm); the cheapest race is at the
    narrowest width. A class where no race can pay is compiled without racing code (exact updates only).
    """
    if options.race_cost <= 0:
        return True
    d = min(options.max_candidates, n_cap + 1)
    narrowest = min([min(w, d) for w in options.race_widths] + [d])
    return n_cap - 1 - 4 * options.first_batch_size >= race_costs(options.race_cost, (narrowest,))[0]


class ClassConfig(NamedTuple):
    """The static configuration of the updates of one class of block sizes (``K <= n_cap``).

    Attributes
    ----------
    options
        The validated :class:`CorefOptions`.
    n_cap
        The class's bound on ``K``; also the race's static population size ``N``.
    race
        Whether the class is compiled with racing code.
    width
        W = ``n_cap + 1``, the candidate columns of an exact update (and the block window's length).
    d_cap
        D = ``min(max_candidates, n_cap + 1)``, the widest race.
    chunk
        The exact sums' chunk, ``min(chunk_size, n_cap)``.
    small_chunk
        The small arms' chunk, ``min(chunk, 64)``.
    max_large
        Static bound on the large (raced) arms of a padded race.
    widths
        The padded / ragged race widths, increasing, the last ``d_cap``.
    hybrid_widths
        The hybrid race widths (``#large + 1`` columns), increasing.
    move_chunk
        The chunk of the move's loops.
    """

    options: CorefOptions
    n_cap: int
    race: bool
    width: int
    d_cap: int
    chunk: int
    small_chunk: int
    max_large: int
    widths: tuple
    hybrid_widths: tuple
    move_chunk: int


def class_config(n_cap: int, options: CorefOptions) -> ClassConfig:
    """The :class:`ClassConfig` of the class ``K <= n_cap`` under validated ``options``."""
    o = options
    m1 = o.first_batch_size
    race = n_cap >= o.min_race_size and race_can_pay(n_cap, o)
    w = n_cap + 1
    d = min(o.max_candidates, n_cap + 1)
    chunk = min(o.chunk_size, n_cap)
    # large (raced) arms have >= m1 members each when min_arm_draws > 0: at most n_cap // m1 of them
    max_large = d if o.min_arm_draws <= 0 else min(d, n_cap // m1 + 1)
    dh = max(2, min(d, n_cap // m1 + 1))
    return ClassConfig(
        options=o,
        n_cap=n_cap,
        race=race,
        width=w,
        d_cap=d,
        chunk=chunk,
        small_chunk=min(chunk, 64),
        max_large=max_large,
        widths=tuple(sorted({min(x, d) for x in o.race_widths} | {d})),
        hybrid_widths=tuple(sorted({max(2, min(x, dh)) for x in o.race_widths} | {dh})),
        # a race's move (at most D + 1 non-empty clusters) is one iteration of each of the move's loops
        move_chunk=min(w, d + 1 if race else 64),
    )
