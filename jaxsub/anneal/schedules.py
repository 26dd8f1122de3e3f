"""Subsample schedules as data: a sequence of add/remove operations ("ticks").

Every schedule is an ``int8`` array of tick codes plus a row-selection policy:

=========  =====  =============================================================
code       value  meaning
=========  =====  =============================================================
NOOP       0      nothing
REMOVE     1      remove one assigned row (forget it)
ADD        2      add one unassigned row, Gibbs-drawn from eq. (star)
GIBBS      3      REMOVE then ADD in one tick (a full-data Gibbs step when all
                  rows are assigned: the removed row is the only one to add)
ADD_PRIOR  6      add one unassigned row drawn from the partition prior only
=========  =====  =============================================================

(bit 0 = remove, bit 1 = add, bit 2 = ignore the likelihood.) The subsample
size ``beta(t) N`` (the paper's inverse temperature) is the running sum of
adds minus removes. Which row a tick touches is decided by the policy:

* ``"random"`` (the paper, section 2.3 and footnote 2): remove a uniformly random
  assigned row, add a uniformly random unassigned row;
* ``"fifo"`` (posterior/loom): rows sit in a shuffled cyclic order; adds take
  the next unassigned row, removes the oldest assigned one, so the subsample is
  a sliding window and every row is visited once per cycle.

Users build their own schedule with :class:`Schedule` directly (any code
sequence whose subsample size stays in ``[0, N]``), or concatenate pieces with
:meth:`Schedule.then`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from jaxsub.validation import check_choice, check_int, check_real

__all__ = [
    "ADD",
    "anneal_stepsize",
    "ADD_PRIOR",
    "GIBBS",
    "NOOP",
    "REMOVE",
    "Schedule",
    "linear_anneal",
    "loom",
    "prior_gibbs",
    "sequential_gibbs",
    "simulated_annealing",
]

NOOP, REMOVE, ADD, GIBBS, ADD_PRIOR = 0, 1, 2, 3, 6
_VALID = (NOOP, REMOVE, ADD, GIBBS, ADD_PRIOR)


@dataclass(frozen=True, eq=False)
class Schedule:
    """A subsample schedule.

    Parameters
    ----------
    codes
        1-D integer array of tick codes (see module table).
    num_rows
        N, the number of data rows the schedule is for.
    policy
        ``"random"`` or ``"fifo"``.
    energy_ramp
        If ``> 0``, temper the likelihood by ``beta_t = min(1, (t + 1) / energy_ramp)``
        at tick ``t`` (classical simulated annealing on the energy; 0 = off).
    name
        Label used in traces and plots.
    initial_size
        Number of rows assigned when the schedule starts (0 for schedules that
        start empty, N for full-data Gibbs from a given state).
    blocks
        Optional 1-D integer array (same length as ``codes``, values in ``[1, N]``): the
        number of rows a tick moves together (block Gibbs; ``None`` = 1 everywhere). Only
        :func:`anneal_stepsize` sets it; the two-urn block sampler
        (:func:`jaxsub.anneal.two_urns.run_schedule`) and CrossCat's ``fit``
        (:func:`jaxsub.anneal.crosscat.block_tick`) read it; the mixture kernels move one
        row per tick and reject a schedule with blocks.

    Raises
    ------
    ValueError
        If a code is unknown or the subsample size would leave ``[0, N]``.
    """

    codes: np.ndarray
    num_rows: int
    policy: str = "random"
    energy_ramp: int = 0
    name: str = "custom"
    initial_size: int = 0
    blocks: np.ndarray | None = None

    def __post_init__(self):
        n = check_int("num_rows", self.num_rows, low=1)
        check_choice("policy", self.policy, ("random", "fifo"))
        check_int("energy_ramp", self.energy_ramp, low=0)
        check_int("initial_size", self.initial_size, low=0, high=n)
        codes = np.asarray(self.codes)
        if codes.ndim != 1 or codes.size == 0 or not np.issubdtype(codes.dtype, np.integer):
            raise ValueError(f"codes must be a non-empty 1-D integer array; got {codes.dtype} shape {codes.shape}")
        bad = ~np.isin(codes, _VALID)
        if bad.any():
            raise ValueError(f"codes must be in {_VALID}; found {np.unique(codes[bad]).tolist()}")
        codes = codes.astype(np.int8)
        removes = (codes & 1).astype(np.int64)
        adds = ((codes >> 1) & 1).astype(np.int64)
        after = self.initial_size + np.cumsum(adds - removes)
        before_add = after - adds  # size after the tick's removal
        if np.any(before_add < 0):
            t = int(np.argmax(before_add < 0))
            raise ValueError(f"schedule removes from an empty subsample at tick {t}")
        if np.any(after > n):
            t = int(np.argmax(after > n))
            raise ValueError(f"schedule adds beyond all {n} rows at tick {t}")
        object.__setattr__(self, "codes", codes)
        if self.blocks is not None:
            blocks = np.asarray(self.blocks)
            if blocks.shape != codes.shape or not np.issubdtype(blocks.dtype, np.integer):
                raise ValueError(
                    f"blocks must be an integer array shaped like codes {codes.shape}; got "
                    f"{blocks.dtype} shape {blocks.shape}"
                )
            if blocks.min() < 1 or blocks.max() > n:
                raise ValueError(f"blocks must lie in [1, num_rows={n}]; got [{blocks.min()}, {blocks.max()}]")
            object.__setattr__(self, "blocks", blocks.astype(np.int32))

    def __len__(self) -> int:
        return int(self.codes.size)

    @property
    def num_assignments(self) -> int:
        """Number of Gibbs assignments (adds) in the schedule."""
        return int(((self.codes >> 1) & 1).sum())

    def sizes(self) -> np.ndarray:
        """Subsample size after every tick."""
        c = self.codes
        return self.initial_size + np.cumsum(((c >> 1) & 1).astype(np.int64) - (c & 1).astype(np.int64))

    def hyper_ticks(self) -> np.ndarray:
        """Ticks after which the kernels resample hyperparameters: once per full cycle.

        A cycle ends when the number of adds since the last hyperparameter step
        reaches the current subsample size (the paper's "once per full cycle
        through the current subsample", section 2.4). The kernels apply the
        same rule on the fly; this is the offline view, for plots and tests.
        """
        adds = (self.codes >> 1) & 1
        sizes = self.sizes()
        out, since = [], 0
        for t in range(len(self.codes)):
            since += int(adds[t])
            if adds[t] and since >= max(int(sizes[t]), 1):
                out.append(t)
                since = 0
        return np.asarray(out, np.int64)

    def then(self, other: Schedule, name: str | None = None) -> Schedule:
        """Concatenate two schedules on the same rows (policy and ramp of ``self``)."""
        if other.num_rows != self.num_rows:
            raise ValueError(f"cannot concatenate schedules for {self.num_rows} and {other.num_rows} rows")
        blocks = None
        if self.blocks is not None or other.blocks is not None:
            ones = lambda s: np.ones(len(s), np.int32) if s.blocks is None else s.blocks  # noqa: E731
            blocks = np.concatenate([ones(self), ones(other)])
        return Schedule(
            np.concatenate([self.codes, other.codes]),
            self.num_rows,
            self.policy,
            self.energy_ramp,
            name or f"{self.name}+{other.name}",
            self.initial_size,
            blocks,
        )


def prior_gibbs(num_rows: int, num_gibbs: int, *, policy: str = "random") -> Schedule:
    """Prior+Gibbs: ``N`` prior draws (ADD_PRIOR), then ``num_gibbs`` full-data Gibbs ticks.

    Parameters
    ----------
    num_rows
        ``N``.
    num_gibbs
        Full-data Gibbs ticks after the prior draws.
    policy
        Row policy, ``"random"`` or ``"fifo"``.

    Returns
    -------
    Schedule
        Tick codes (and row policy) as data.
    """
    n = check_int("num_rows", num_rows, low=1)
    g = check_int("num_gibbs", num_gibbs, low=0)
    codes = np.concatenate([np.full(n, ADD_PRIOR, np.int8), np.full(g, GIBBS, np.int8)])
    return Schedule(codes, n, policy, 0, "Prior+Gibbs")


def sequential_gibbs(num_rows: int, num_assignments: int, *, policy: str = "random") -> Schedule:
    """Sequential+Gibbs: ``N`` sequential Gibbs adds, then ``num_assignments - N`` Gibbs ticks.

    Parameters
    ----------
    num_rows
        ``N``.
    num_assignments
        Total assignments, at least ``N``.
    policy
        Row policy, ``"random"`` or ``"fifo"``.

    Returns
    -------
    Schedule
        Tick codes (and row policy) as data.
    """
    n = check_int("num_rows", num_rows, low=1)
    t = check_int("num_assignments", num_assignments, low=n)
    codes = np.concatenate([np.full(n, ADD, np.int8), np.full(t - n, GIBBS, np.int8)])
    return Schedule(codes, n, policy, 0, "Sequential+Gibbs")


def linear_anneal(num_rows: int, num_assignments: int, *, policy: str = "random", final_gibbs: int = 0) -> Schedule:
    """The linear subsample-annealing schedule of section 2.4, ``beta(t) ~ t / T``.

    Tick ``t = 1..T`` (``T = num_assignments >= N``) targets the subsample size
    ``s_t = ceil(N t / T)``: it is an ADD when ``s_t > s_{t-1}`` and a GIBBS
    (remove a random assigned row, add a random unassigned one) otherwise. So
    every tick is one Gibbs assignment, the size grows linearly from 0 to N,
    and the last ``~T/N`` ticks run on all data. ``final_gibbs`` appends
    extra full-data Gibbs ticks.

    Parameters
    ----------
    num_rows
        ``N``.
    num_assignments
        ``T >= N``.
    policy
        Row policy, ``"random"`` or ``"fifo"``.
    final_gibbs
        Full-data Gibbs ticks appended.

    Returns
    -------
    Schedule
        Tick codes (and row policy) as data.
    """
    n = check_int("num_rows", num_rows, low=1)
    t_total = check_int("num_assignments", num_assignments, low=n)
    extra = check_int("final_gibbs", final_gibbs, low=0)
    t = np.arange(1, t_total + 1, dtype=np.int64)
    target = -((-n * t) // t_total)  # ceil(N t / T), exact in integers
    prev = np.concatenate([[0], target[:-1]])
    codes = np.where(target > prev, ADD, GIBBS).astype(np.int8)
    if extra:
        codes = np.concatenate([codes, np.full(extra, GIBBS, np.int8)])
    return Schedule(codes, n, policy, 0, "Anneal")


def simulated_annealing(
    num_rows: int, num_gibbs: int, *, policy: str = "random", ramp_fraction: float = 0.9
) -> Schedule:
    """Classical simulated annealing on the energy ("Anneal Energy" of Figure 2).

    Prior initialisation (``N`` ADD_PRIOR ticks, untempered prior), then
    ``num_gibbs`` full-data Gibbs ticks whose likelihood is raised to
    ``beta = min(1, t / (ramp_fraction * num_gibbs))`` (linear in the tick
    counter, which includes the ``N`` prior ticks).

    Parameters
    ----------
    num_rows
        ``N``.
    num_gibbs
        Tempered full-data Gibbs ticks.
    policy
        Row policy, ``"random"`` or ``"fifo"``.
    ramp_fraction
        Fraction of the Gibbs ticks over which ``beta`` rises to 1.

    Returns
    -------
    Schedule
        Tick codes (and row policy) as data.
    """
    n = check_int("num_rows", num_rows, low=1)
    g = check_int("num_gibbs", num_gibbs, low=1)
    f = check_real("ramp_fraction", ramp_fraction, low=0.0, high=1.0, high_closed=True)
    codes = np.concatenate([np.full(n, ADD_PRIOR, np.int8), np.full(g, GIBBS, np.int8)])
    return Schedule(codes, n, policy, max(1, int(round(n + f * g))), "Anneal Energy")


def anneal_stepsize(num_rows: int, num_gibbs: int, *, final_gibbs: int = 0) -> Schedule:
    """The paper's "Anneal Stepsize" strategy (section 3.2, Figure 2): full-data block Gibbs with shrinking blocks.

    Prior initialisation (``N`` ADD_PRIOR ticks), then ``num_gibbs`` full-data GIBBS ticks where tick
    ``t = 1..T`` moves a handful of ``b_t = clip(floor(1 / beta_t), 1, N)`` same-valued rows of one
    cluster together, ``beta_t = t / T`` (the linear subsample-annealing temperature): in the
    continuum limit moving ``1/beta`` balls at once takes the steps subsample annealing takes at
    inverse temperature ``beta``. Blocks reach 1 (plain Gibbs) for ``t > T/2``; ``final_gibbs``
    appends single-row Gibbs ticks. As data: ``codes`` plus ``blocks`` (see :class:`Schedule`).
    The paper calls it "only of theoretical interest"; it runs on the two-urn model
    (:func:`jaxsub.anneal.two_urns.run_schedule`) and in CrossCat's ``fit`` (handfuls of rows
    sharing the picked row's cluster in each view, :func:`jaxsub.anneal.crosscat.block_tick`).

    Parameters
    ----------
    num_rows
        ``N``.
    num_gibbs
        ``T``, the block Gibbs ticks.
    final_gibbs
        Single-row Gibbs ticks appended.

    Returns
    -------
    Schedule
        Tick codes (and row policy) as data.
    """
    n = check_int("num_rows", num_rows, low=1)
    g = check_int("num_gibbs", num_gibbs, low=1)
    extra = check_int("final_gibbs", final_gibbs, low=0)
    t = np.arange(1, g + 1, dtype=np.int64)
    blocks = np.clip(g // t, 1, n)  # floor(1 / beta_t) = floor(T / t)
    codes = np.concatenate([np.full(n, ADD_PRIOR, np.int8), np.full(g + extra, GIBBS, np.int8)])
    blocks = np.concatenate([np.ones(n, np.int64), blocks, np.ones(extra, np.int64)]).astype(np.int32)
    return Schedule(codes, n, "random", 0, "Anneal Stepsize", 0, blocks)


def loom_extra_passes(size: int, extra_passes: float, small: int, big: int) -> int:
    """Loom's accelerating number of extra passes ``P`` at subsample size ``size`` (NOTES.md section 4).

    ``P = P0`` below ``small``, ``0`` above ``big``, in between
    ``passes = (1 + P0) ** (log(big / n) / log(big / small))`` and ``P = passes - 1``
    (``0`` if ``passes <= 2``).
    """
    if size <= small:
        return int(extra_passes)
    if size >= big:
        return 0
    passes = (1.0 + extra_passes) ** (math.log(big / size) / math.log(big / small))
    return 0 if passes <= 2 else int(passes - 1)


def loom(
    num_rows: int,
    *,
    extra_passes: float = 500.0,
    small: int = 4000,
    big: int = int(1e9),
    accelerate: bool = True,
    final_gibbs: int = 0,
) -> Schedule:
    """The posterior/loom production schedule (FIFO window with extra passes, NOTES.md section 4).

    Rows sit in a shuffled cyclic order (policy ``"fifo"``). With ``P`` extra
    passes, a counter starts at ``2 (1 + P)``; each tick is an ADD
    (``counter -= P``) when ``counter >= 0``, else a REMOVE (``counter += 1 + P``);
    the schedule ends when every row is assigned. So each net growth of the
    subsample by one row costs ``1 + P`` adds and ``P`` removes. With
    ``accelerate`` the number of extra passes ``P`` follows
    :func:`loom_extra_passes` of the current size (loom defaults ``P0 = 500``,
    ``S = 4000``, ``B = 1e9``); otherwise ``P = extra_passes`` throughout.
    ``final_gibbs`` appends full-data Gibbs ticks.

    ``P`` is re-evaluated whenever the subsample reaches a new largest size (so it only
    decreases and every stretch of constant ``P`` grows the subsample); evaluating it at the
    current size instead can cycle forever at a size where ``P`` changes.

    Parameters
    ----------
    num_rows
        ``N``.
    extra_passes
        ``P0``.
    small, big
        Loom's ``S`` and ``B`` sizes.
    accelerate
        Follow :func:`loom_extra_passes` (default) or keep ``P = extra_passes``.
    final_gibbs
        Full-data Gibbs ticks appended.

    Returns
    -------
    Schedule
        Tick codes (and row policy) as data.
    """
    n = check_int("num_rows", num_rows, low=1)
    p0 = check_real("extra_passes", extra_passes, low=0.0, low_closed=True)
    small = check_int("small", small, low=1)
    big = check_int("big", big, low=small + 1)
    extra = check_int("final_gibbs", final_gibbs, low=0)
    out = bytearray()
    size = max_size = 0
    p = loom_extra_passes(0, p0, small, big) if accelerate else int(p0)
    counter = 2 * (1 + p)
    while size < n:
        if counter >= 0 or size == 0:
            out.append(ADD)
            size += 1
            counter -= p
        else:
            out.append(REMOVE)
            size -= 1
            counter += 1 + p
        if accelerate and size > max_size:
            # P follows the largest size reached so far (monotone), not the current size:
            # re-reading P at the current size can cycle forever where P changes (e.g. an ADD
            # at P(n) followed by a REMOVE at P(n + 1) returns the counter to where it was).
            max_size = size
            p = loom_extra_passes(size, p0, small, big)
    codes = np.frombuffer(bytes(out), np.int8)
    if extra:
        codes = np.concatenate([codes, np.full(extra, GIBBS, np.int8)])
    return Schedule(codes, n, "fifo", 0, "Loom")
