"""Racing (Sub) Gibbs and exact Gibbs sweeps for the pairwise-factor clustering model.

One Gibbs update of mention ``i`` (block ``b``, ``K = n_b - 1`` other mentions) draws

    y_i ~ p(y) ∝ exp(β S_y),   S_y = Σ_{j ∈ C_y} f(x_i, x_j),

over the D candidates (non-empty clusters of the block, plus one empty cluster with
``S = 0``) by the Gumbel-max trick: ``y_i = argmax_y β S_y + ε_y``, ``ε_y ~ Gumbel(0, 1)``.

* **Exact** (``exact=True``): all K factors, summed per cluster (``K`` evaluations).
* **Racing** (Sub Gibbs, §5.3): a race over the D candidates whose rewards are the
  factors of a subsample of the block's mentions (:func:`race_conditional`, the one
  adapter into :func:`jaxsub.discrete.racing`). Arm ``y``'s population is ``C_y``;
  since the engine draws one shared index set for all arms, a drawn mention ``j`` is a
  reward for its own cluster's arm and 0 for the others (the zero-padding of
  :func:`jaxsub.discrete.pad_populations`, with one factor evaluation per drawn mention
  instead of D). The race's population is the members of the *large* candidates (small
  ones, ``N_y < m1`` or ``m1 N_y / K < λ``, are summed exactly, ``min_arm_draws``). The
  engine's ``num_data`` is static (``N`` = the class's power of two ``>= K``), so population
  index ``n ∈ [0, N)`` maps to the ``(n mod K_L)``-th large member with reward ``β f / c_k``
  (``c_k = #{n < N : n mod K_L = k}``), so every per-arm sum is exact. A control variate
  ``h_y = β f(x_i, r_y)`` per large candidate (``r_y`` one member of ``C_y``; one extra
  evaluation each, counted) makes a member's reward ``β (f - f(x_i, r_y))``, whose spread is
  small when clusters are tight.
* **Hybrid** (``hybrid=True``): the small arms and the empty cluster of *all* the candidates are
  summed exactly and only the best of them (with its Gumbel noise) enters the race, as one exact
  column beside the large arms: the race is ``#large + 1`` columns wide whatever the number of
  candidates, and the decision is still the Gumbel-max one whenever the race is right.

**Cost of one update.** The state (:class:`CorefState`) keeps, per block, the list of non-empty
clusters (``active``, swap-free: removal shifts the later entries, a new cluster is appended) and
every cluster's members as a contiguous segment of ``members`` (in ``active`` order). A racing
update reads an O(D) window of these indexes (candidates, sizes, segment starts), evaluates
the factors it needs by indexing members inside segments (a drawn index finds its column by
one comparison with the D cumulative sizes), and moves the mention in O(D) (each segment between the old and the new cluster shifts
by one member). Besides one contiguous gather of the block's member ids (outside every loop), the work
is O(D + factor evaluations). The race runs at
the narrowest static width in ``race_widths`` holding the candidates (the engine's fixed cost
grows with the width). Exact updates are O(K) as they must be.

With probability ≥ 1 - δ each race returns the exact Gumbel-max decision (Prop. 1: the
draw is within δ of the conditional in total variation; Racing-Normal assumes the
normal approximation of eq. 9). Mentions whose block is smaller than
``min_race_size`` or that have more than ``max_candidates`` candidates are updated exactly, and so
are those where the cost model (``race_cost``, :func:`race_costs`) expects a race to cost more than
the exact update (a race has a fixed cost of ~1,000 factor evaluations on a CPU).
The sweep visits mentions class by class (a fixed systematic-scan order).

References
----------
Y. Chen & Z. Ghahramani, "Scalable discrete sampling as a multi-armed bandit problem",
ICML 2016, §5.3, Prop. 1, eq. 9. S. Singh, M. Wick & A. McCallum, "Monte Carlo MCMC:
efficient inference by approximate sampling", EMNLP 2012. J. R. Finkel, T. Grenager &
C. Manning, "Incorporating non-local information into information extraction systems by
Gibbs sampling", ACL 2005 (annealed Gibbs for MAP).
"""
from __future__ import annotations

import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.base import SamplingAlgorithm
from jaxsub.coreference.model import Blocks
from jaxsub.discrete import racing
from jaxsub.validation import check_choice, check_hyperparameter, check_int, check_real

__all__ = [
    "CorefState",
    "SweepInfo",
    "as_top_level_api",
    "build_kernel",
    "class_lanes",
    "conditional_update",
    "fit",
    "init",
    "mention_classes",
    "race_conditional",
    "race_costs",
]


class CorefState(NamedTuple):
    """Cluster membership, with the per-block indexes that make one update O(candidates + data read).

    Index spaces: *mention* (``i``), *cluster id* (block ``b`` owns the ids ``[s_b, s_b + n_b)``, its
    sorted positions, see :class:`~jaxsub.coreference.Blocks`) and *slot* (a block's
    ``[s_b, s_b + n_b)`` range of the per-block arrays below).

    Attributes
    ----------
    labels
        ``[M]`` int32 cluster id of every mention.
    sizes
        ``[M]`` int32 number of mentions in each cluster id (0 = empty).
    members
        ``[M]`` int32 by slot: the block's mentions grouped by cluster, one contiguous segment per
        non-empty cluster, segments in the order of ``active``.
    member_pos
        ``[M]`` int32 by mention: its slot in ``members``.
    active
        ``[M]`` int32 by slot: a permutation of the block's cluster ids, the ``num_active`` non-empty
        ones first; ``active[s_b + num_active]`` is the block's next empty id (the "new cluster").
    active_pos
        ``[M]`` int32 by cluster id: its slot in ``active`` (the inverse permutation).
    seg_start
        ``[M]`` int32 by slot of ``active``: the slot in ``members`` where that cluster's segment starts
        (meaningful for the non-empty clusters).
    num_active
        ``[M]`` int32: number of non-empty clusters of the block, stored at the block's first slot.

    A move of one mention costs O(number of non-empty clusters between its old and new cluster's
    slots) (segments shift by one member each, swap-remove style); see :func:`init` for the layout.
    """

    labels: jnp.ndarray
    sizes: jnp.ndarray
    members: jnp.ndarray
    member_pos: jnp.ndarray
    active: jnp.ndarray
    active_pos: jnp.ndarray
    seg_start: jnp.ndarray
    num_active: jnp.ndarray



class SweepInfo(NamedTuple):
    """Counts over one sweep (all int32 scalars).

    Attributes
    ----------
    num_evaluations
        Factor evaluations ``f(x_i, x_j)`` computed for the decisions (exact: ``K`` per
        mention; racing: the drawn indices plus the control variate's D - 1).
    num_races
        Updates decided by racing.
    num_exact
        Updates computed exactly (exact sweep, small blocks, more than ``max_candidates``).
    num_nan
        Updates that met a NaN / +inf factor: the mention kept its cluster (not a valid draw).
    num_errors
        Races whose decision differs from the exact Gumbel-max decision under the same noise
        (only counted with ``check_decisions=True``; otherwise 0).
    num_checked
        Races checked against the exact decision.
    """

    num_evaluations: jnp.ndarray
    num_races: jnp.ndarray
    num_exact: jnp.ndarray
    num_nan: jnp.ndarray
    num_errors: jnp.ndarray
    num_checked: jnp.ndarray


def _zero_info():
    z = jnp.zeros((), jnp.int32)
    return SweepInfo(z, z, z, z, z, z)


def _add_info(a: SweepInfo, b: SweepInfo) -> SweepInfo:
    return SweepInfo(*(x + y for x, y in zip(a, b)))


# The sweep works on the state packed as one [M, 8] int32 array (columns in CorefState's field
# order): one scatter per update, no copies (see _move).
_LABELS, _SIZES, _MEMBERS, _MEMBER_POS, _ACTIVE, _ACTIVE_POS, _SEG_START, _NUM_ACTIVE = range(8)


def _pack(state: CorefState):
    return jnp.stack([jnp.asarray(a, jnp.int32) for a in state], axis=1)


def _unpack(packed) -> CorefState:
    return CorefState(*(packed[:, c] for c in range(8)))


class _Column:
    """Read-only view of one column of the packed state (``col[idx]`` gathers ``packed[idx, c]``)."""

    def __init__(self, packed, c):
        self._packed, self._c = packed, c
        self.shape = packed.shape[:1]

    def __getitem__(self, idx):
        return self._packed[idx, self._c]


def _view(packed) -> CorefState:
    return CorefState(*(_Column(packed, c) for c in range(8)))


#: Default ``min_arm_draws`` (λ): candidates expected to have fewer than λ members in the race's first
#: batch, or fewer than m1 members, are summed exactly (see :func:`build_kernel`). With a few members
#: among the padded zeros an arm's stage means are far from Normal and Racing-Normal's δ fails
#: (measured on FEBRL 3, clusters of 1–6 in blocks of hundreds: decision error 0.129 at δ = 0.05 when
#: every arm is raced; docs/coreference.md).
DEFAULT_MIN_ARM_DRAWS = 1.0

#: Default extra race width (see ``race_widths`` of :func:`build_kernel`): updates with at most 16
#: candidates race over 16 columns instead of ``max_candidates`` (engine cost per race measured on CPU:
#: about 40, 56 and 170 µs at widths 8, 32 and 128, docs/coreference.md).
DEFAULT_RACE_WIDTHS = (16,)

#: Default ``batch_size`` of :func:`build_kernel`: 1, the sequential sweep. Batched rounds
#: (``batch_size > 1``) give the same draws but measured no faster on author mentions (M = 20,000) and
#: compile 2-3x longer (docs/coreference.md §5).
DEFAULT_BATCH_SIZE = 1

#: The padded race's stage schedules (``race_schedule`` of :func:`build_kernel`): the engine's doubling
#: schedule (Alg. 1, default) or its single-test ``"fixed"`` schedule (docs/coreference.md, session 12).
RACE_SCHEDULES = ("doubling", "fixed")

#: Default ``race_cost`` F of :func:`build_kernel` (factor evaluations; see :func:`race_costs`), calibrated
#: once on CPU with :func:`~jaxsub.coreference.packed_similarity` on author mentions (the largest block of
#: M = 20,000, 128 updates: a race's CPU time beyond its own evaluations = 1,000-1,350 evaluations of
#: 0.17 µs; docs/coreference.md §5, session 8; ``benchmarks.coreference.calibrate_race_cost``). A factor
#: that costs more per evaluation has a smaller F (the default then races less than it could).
DEFAULT_RACE_COST = 1000.0

#: Engine cost per race vs width D, measured on CPU (one race over N = 1,024, 3 live arms, load ~10:
#: 39 / 42 / 56 / 168 µs at D = 4 / 8 / 32 / 128, docs/coreference.md): about ``a + D`` µs with a ≈ 38.
_WIDTH_COST_OFFSET = 38.0


def race_costs(race_cost: float, widths) -> tuple:
    """Fixed cost of a race at each static width, in factor evaluations: ``race_cost (a + max(D, 16)) / (a + 16)``.

    ``race_cost`` is the fixed cost of a race of width 16 beyond its evaluations, in units of one factor
    evaluation inside an exact update (calibrated once per factor and machine: the time of a race minus
    its evaluations, divided by the exact update's time per evaluation); wider races cost more in
    proportion to the engine's measured ``a + D``. Narrower races are *not* cheaper (session 12: the
    hybrid's width-2–4 races cost 630–660 evaluations beyond their own at M = 20,000, the width-16
    race 570–600; most of a race's fixed cost is the update around the engine, docs/coreference.md).
    """
    return tuple(float(race_cost) * (_WIDTH_COST_OFFSET + max(w, 16)) / (_WIDTH_COST_OFFSET + 16) for w in widths)


def _race_pays(K, k_small, num_large, costs, width, first_batch_size: int):
    """The cost model: race iff the evaluations it is expected to save exceed its fixed cost.

    An exact update costs ``K`` evaluations; a race ``k_small`` (small arms summed exactly) + one control
    variate evaluation per raced arm + its draws (estimated as ``4 m1``: measured 3.6 m1 in a block of
    2,000 with 20 clusters of 100 and 6 m1 in the largest author block, 1,024 mentions) + its fixed cost
    ``costs[width]`` (:func:`race_costs`).
    """
    expected = k_small + num_large + 4 * first_batch_size
    return (K - expected).astype(jnp.float32) >= jnp.asarray(costs, jnp.float32)[width]


# --------------------------------------------------------------------------- state
def init(position, blocks: Blocks) -> CorefState:
    """State from cluster labels (``None``: every mention alone, as in the paper).

    Traceable (``jax.vmap(lambda p: init(p, blocks))`` works); the indexes of :class:`CorefState` are
    built by two sorts: ``active`` lists each block's non-empty ids (increasing) then its empty ids
    (increasing), ``members`` groups the mentions by the ``active`` slot of their cluster (then by sorted
    position), and ``seg_start`` is the exclusive cumulative sum of the sizes in ``active`` order (it
    equals ``s_b`` at a block's first slot since every block's mentions sit in its own clusters).

    Args:
        position: ``None`` or ``[M]`` integer cluster ids, each inside its mention's block range
            (e.g. ``state.labels`` of an earlier run).
        blocks: :class:`Blocks`.
    """
    m = blocks.num_mentions
    if position is None:
        labels = jnp.asarray(blocks.position, jnp.int32)
    else:
        labels = jnp.asarray(position)
        if labels.shape != (m,) or not jnp.issubdtype(labels.dtype, jnp.integer):
            raise ValueError(f"position must be an integer array of shape ({m},); got {labels.shape} {labels.dtype}")
        labels = labels.astype(jnp.int32)
        if not isinstance(labels, jax.core.Tracer):
            lab = np.asarray(labels)
            lo = blocks.start[blocks.position]
            if np.any((lab < lo) | (lab >= lo + blocks.size[blocks.position])):
                raise ValueError("position: every label must be a cluster id of its mention's block "
                                 "(a sorted position in [start, start + size) of that block)")
    ids = jnp.arange(m, dtype=jnp.int32)
    start = jnp.asarray(blocks.start, jnp.int32)
    sizes = jnp.zeros((m,), jnp.int32).at[labels].add(1)
    empty = (sizes == 0).astype(jnp.int32)
    active = jnp.lexsort((ids, empty, start)).astype(jnp.int32)
    active_pos = jnp.zeros((m,), jnp.int32).at[active].set(ids)
    members = jnp.lexsort((jnp.asarray(blocks.position, jnp.int32), active_pos[labels])).astype(jnp.int32)
    member_pos = jnp.zeros((m,), jnp.int32).at[members].set(ids)
    size_act = sizes[active]
    seg_start = (jnp.cumsum(size_act) - size_act).astype(jnp.int32)
    num_active = jnp.zeros((m,), jnp.int32).at[start].add(1 - empty)
    return CorefState(labels, sizes, members, member_pos, active, active_pos, seg_start, num_active)



def mention_classes(blocks: Blocks, small_cap: int = 64):
    """Group sorted positions by block size: ``[(N_cap, positions)]`` with ``K = n_b - 1 ∈ (N_cap/2, N_cap]``.

    Blocks with ``K <= small_cap`` share one class ``N_cap = small_cap`` (always updated exactly);
    above it the classes are the powers of two. Singleton blocks (``K = 0``, nothing to decide)
    are left out. One update function is compiled per class.
    """
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


# --------------------------------------------------------------------------- the adapter
def race_conditional(rng_key, log_f0, log_factor_fn, *, schedule: str, num_states: int, num_data: int, delta: float,
                     first_batch_size: int, log_factor_states_fn=None, control_variate=None, population_sizes=None,
                     race_schedule: str = "doubling"):
    """The one call into the racing engine of :mod:`jaxsub.discrete`.

    Draws ``argmax_y log_f0[y] + S_y`` by Racing-Normal; ``log_f0`` already carries the Gumbel noise
    (``gumbel_noise=False``), so the exact decision under the same noise can be re-made by the caller.

    * ``schedule="padded"``: :func:`jaxsub.discrete.racing` over one shared population of
      ``num_data`` indices (``log_factor_fn(indices [m]) -> [m, D]``), marginal variances,
      optional control variate, exact pass off (``info.num_data_used`` = drawn indices).
      The sweep passes no ``log_factor_states_fn``: its ``log_factor_fn`` evaluates one factor per
      drawn index whatever D (the other columns are zeros), so the engine's compaction levels would
      save no evaluation; without them the race compiles to half the code (1,104 -> 570 fusions in
      a 1,024-mention block's sweep, compile 18.7 -> 11.4 CPU-s) at the same decisions and run time
      (docs/coreference.md §5, session 8).
    * ``schedule="ragged"``: :func:`jaxsub.discrete.racing_ragged`, one doubling schedule per arm
      over its own ``population_sizes[y]`` members (``log_factor_fn(indices [m, D]) -> [m, D]``),
      ``num_data`` = the static bound on every population.
    * ``race_schedule`` (padded only): the engine's stage schedule, ``"doubling"`` (Alg. 1) or
      ``"fixed"`` (one elimination test after ``first_batch_size`` draws with the one-stage quantile,
      then the surviving arms on the rest of the ``num_data`` indices; no doubling loops).

    Returns:
        ``(x, RacingInfo)``.
    """
    if schedule == "ragged":
        from jaxsub.discrete import racing_ragged

        sample = racing_ragged(log_factor_fn, num_states, num_data, delta=delta, first_batch_size=first_batch_size,
                               gumbel_noise=False)
        return sample(rng_key, log_f0, population_sizes)
    sample = racing(
        log_factor_fn, num_states, num_data, delta=delta, first_batch_size=first_batch_size, bound="normal",
        variance="marginal", control_variate=control_variate, gumbel_noise=False,
        log_factor_states_fn=log_factor_states_fn, exact_pass_cost=None, schedule=race_schedule,
        # The padded population (a cluster's few rewards among zeros) is skewed by design, so the
        # engine's default skew guard stops no race early here (every race reads all N); the
        # figures in docs/coreference.md were measured with the paper's rule (guard off), which
        # is what this keeps. Its measured decision error is in docs/coreference.md.
        skew_guard=None,
    )
    return sample(rng_key, log_f0)


# --------------------------------------------------------------------------- one update
def _row(tree, i):
    return jax.tree.map(lambda a: a[i], tree)


def _move(packed, i, a, b, s, n, chunk: int, do=True, carry=None):
    """Move mention ``i`` (block slots ``[s, s + n)``) from cluster ``a`` to cluster ``b != a``.

    ``i`` leaves ``a``'s segment of ``members`` (swapped to its edge), the segments strictly between
    ``a``'s and ``b``'s ``active`` slots shift by one member toward ``a`` (each moves one member from one
    end to the other), ``i`` joins ``b``'s segment; a new cluster takes the slot after the last
    non-empty one, and an emptied ``a`` leaves the non-empty prefix of ``active`` (later slots shift
    down by one, ``a`` goes to the first empty slot). Work O(number of slots between, in chunks of
    ``chunk``): two ``while_loop`` s over chunks (one iteration each when the block has at most
    ``chunk`` non-empty clusters), each chunk one scatter.

    ``packed`` is the state as one ``[M, 8]`` array (:func:`_pack`), written in place. Two rules keep
    XLA from copying it (it did, at every update, O(M) per update: measured 18 / 65 / 420 µs per
    exact update at M = 2,000 / 20,000 / 200,000, docs/coreference.md): one array instead of eight,
    and every read of the array feeds the next write (XLA orders an in-place write after other reads
    only through data dependences), so the values read before a loop travel in its carry. ``do``
    (traced bool): when false nothing is written (the sweep masks the move instead of a ``lax.cond``
    on it, which copied the state too). ``carry``: any pytree that must be computed before the writes
    (the update's decision and info), returned unchanged.

    Returns:
        ``(packed, carry)``.
    """
    plan = _move_plan(packed, i, a, b, s, n, chunk, do, carry)

    def body(c):
        j, packed, carry = c
        return j + 1, _scatter(packed, _move_puts(j, packed, plan, chunk)), carry

    _, packed, carry = jax.lax.while_loop(lambda c: c[0] < plan["n_total"], body,
                                          (jnp.zeros((), jnp.int32), packed, carry))
    return packed, carry


def _move_batched(packed, i, a, b, s, n, chunk: int, do, carry=None):
    """The moves of ``B`` mentions of ``B`` different blocks (arrays ``[B]``), as :func:`_move` each.

    Their writes touch disjoint rows (each block owns its slots, cluster ids and mentions), so chunk
    ``j`` of every move is written by one scatter: one ``while_loop`` over ``max_b n_total_b`` chunks.
    """
    plan = jax.vmap(lambda i_, a_, b_, s_, n_, do_: _move_plan(packed, i_, a_, b_, s_, n_, chunk, do_))(
        i, a, b, s, n, do)
    h = jnp.sum(plan.pop("h"), dtype=jnp.int32) + sum(
        jnp.sum(x.astype(jnp.int32)) for x in jax.tree.leaves(carry)
        if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_)

    def body(c):
        j, packed, carry = c
        puts = jax.vmap(lambda pl: [(r, v) for _, r, v in _move_puts(j, packed, {**pl, "h": h}, chunk)])(plan)
        puts = [(c_, r.reshape(-1), v.reshape(-1)) for c_, (r, v) in zip(_PUT_COLUMNS, puts)]
        return j + 1, _scatter(packed, puts), carry

    n_total = jnp.max(plan["n_total"])
    _, packed, carry = jax.lax.while_loop(lambda c: c[0] < n_total, body, (jnp.zeros((), jnp.int32), packed, carry))
    return packed, carry


def _scatter(packed, puts):
    """Write ``puts = [(column, rows, values)]`` into the packed state (rows >= M are dropped)."""
    rows, cols, vals = (jnp.concatenate(x) for x in zip(*(
        (jnp.atleast_1d(r), jnp.full(jnp.shape(jnp.atleast_1d(r)), c, jnp.int32),
         jnp.broadcast_to(jnp.asarray(v, jnp.int32), jnp.shape(jnp.atleast_1d(r)))) for c, r, v in puts)))
    return packed.at[rows, cols].set(vals, mode="drop")


def _move_plan(packed, i, a, b, s, n, chunk, do=True, carry=None):
    """The values :func:`_move` reads from the state before writing (a dict of scalars)."""
    col = _view(packed)
    drop = packed.shape[0]
    nact = col.num_active[s]
    fresh = col.sizes[b] == 0
    qa = col.active_pos[a]
    qb = jnp.where(fresh, s + nact, col.active_pos[b])
    size_a, size_b = col.sizes[a], col.sizes[b]
    fwd = qa < qb
    seg_a = col.seg_start[qa]
    seg_b = jnp.where(fresh, s + n, col.seg_start[qb])
    mp = col.member_pos[i]
    edge = jnp.where(fwd, seg_a + size_a - 1, seg_a)  # i's slot once swapped to the edge of a's segment
    j_edge = col.members[edge]
    dest = jnp.where(fwd, seg_b - 1, seg_b + size_b)  # i's final slot
    nact1 = nact + fresh.astype(jnp.int32)
    tail = s + nact1 - 1  # an emptied a goes here
    do = jnp.asarray(do, bool)
    emptied = do & (size_a == 1)
    count = jnp.where(do, jnp.abs(qb - qa) - 1, 0)
    n_shift = jnp.where(emptied, tail - qa + 1, 0)
    n1 = (count + chunk - 1) // chunk
    # a mention that stays (``do`` false: most updates near convergence) writes nothing: no chunk at all
    # (one masked chunk of ``chunk`` slots cost ~20 µs per update in blocks of 1,024, session 12)
    n_total = jnp.where(do, jnp.maximum(n1 + (n_shift + chunk - 1) // chunk, 1), 0)
    start_b = jnp.where(fwd, seg_b - 1, seg_b)
    swap = do & (mp != edge)
    b_shifted = emptied & (qb > qa)
    # every value read from the old state must feed the loop's writes (a value used only after the
    # loop is hoisted out of its carry by XLA, and the read then forces a copy): they are summed into
    # ``h``, written at row max(M, h) (out of range: dropped) in every chunk
    consts = (carry, j_edge, dest, mp, edge, size_a, size_b, seg_a, seg_b, nact1, tail, emptied, qa, qb, fwd, a, b)
    h = sum(jnp.sum(x.astype(jnp.int32)) for x in jax.tree.leaves(consts)
            if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_)
    del drop
    return dict(i=i, a=a, b=b, s=s, do=do, j_edge=j_edge, dest=dest, mp=mp, size_a=size_a, size_b=size_b,
                seg_a=seg_a, nact1=nact1, tail=tail, emptied=emptied, qa=qa, qb=qb, fwd=fwd, count=count,
                n1=n1, n_total=n_total, start_b=start_b, swap=swap, b_shifted=b_shifted, h=h)


_PUT_COLUMNS = (_MEMBERS, _MEMBER_POS, _SEG_START, _ACTIVE, _SEG_START, _ACTIVE_POS, _MEMBERS, _MEMBER_POS, _LABELS,
                _SIZES, _SEG_START, _NUM_ACTIVE, _LABELS)  # the columns of _move_puts's writes, in order


def _move_puts(j, packed, pl, chunk):
    """Chunk ``j`` of one move's writes: ``[(column, rows, values)]`` (see :func:`_move`)."""
    # One while_loop over chunks does all the writes (a scatter or a second loop after a loop made XLA
    # copy the state). Chunks j < n1, phase 1, the segments between a and b. Forward (qa < qb): for
    # slots q in [qa, qb - 1), the last member of slot q + 1's segment moves to the last slot of q's
    # (the first of these is ``edge``); slot q + 1's segment starts one earlier. Backward: for q in
    # (qb, qa), downward, the first member of q's segment moves to the slot after its end; q's segment
    # starts one later. Chunks n1 <= j < n1 + n2, phase 2, an emptied a: slots q in [qa, tail) take
    # slot q + 1's cluster and segment start (b's start as it is after the move), a goes to tail. The
    # last chunk also makes the single writes: the swap, i's slot, label, sizes, b's segment start
    # (unless phase 2 wrote it) and a's (backward, a not emptied), num_active.
    drop = packed.shape[0]
    t = jnp.arange(chunk, dtype=jnp.int32)
    fwd, qa, qb, n1, count, tail, emptied = pl["fwd"], pl["qa"], pl["qb"], pl["n1"], pl["count"], pl["tail"], pl["emptied"]
    a, b, i, s, do = pl["a"], pl["b"], pl["i"], pl["s"], pl["do"]
    v = _view(packed)
    # phase 1 (slot q's own start may already have moved in the previous chunk, slot q + 1's has not)
    q = jnp.where(fwd, qa + j * chunk + t, qa - 1 - j * chunk - t)
    ok = (j < n1) & (j * chunk + t < count)
    qc = jnp.clip(q, 0, drop - 1)
    qn = jnp.clip(q + 1, 0, drop - 1)
    start_q, size_q, start_n = v.seg_start[qc], v.sizes[v.active[qc]], v.seg_start[qn]
    src = jnp.where(fwd, start_n + v.sizes[v.active[qn]] - 1, start_q)
    dst = jnp.where(fwd, start_n - 1, start_q + size_q)
    moved = v.members[jnp.clip(src, 0, drop - 1)]
    # phase 2
    q2 = qa + (j - n1) * chunk + t
    ok2 = (j >= n1) & (q2 <= tail) & emptied
    last = q2 == tail
    qn2 = jnp.clip(q2 + 1, 0, drop - 1)
    ids = jnp.where(last, a, v.active[qn2])
    seg_next = jnp.where(q2 + 1 == qb, pl["start_b"], v.seg_start[qn2])
    one = do & (j == pl["n_total"] - 1)
    swap, mp, j_edge, dest = pl["swap"], pl["mp"], pl["j_edge"], pl["dest"]
    h = pl["h"]
    return [
        (_MEMBERS, jnp.where(ok, dst, drop), moved),
        (_MEMBER_POS, jnp.where(ok, moved, drop), dst),
        (_SEG_START, jnp.where(ok, jnp.where(fwd, qn, qc), drop), jnp.where(fwd, start_n - 1, start_q + 1)),
        (_ACTIVE, jnp.where(ok2, q2, drop), ids),
        (_SEG_START, jnp.where(ok2 & ~last, q2, drop), seg_next),
        (_ACTIVE_POS, jnp.where(ok2, ids, drop), q2),
        (_MEMBERS, jnp.stack([jnp.where(one & swap, mp, drop), jnp.where(one, dest, drop)]), jnp.stack([j_edge, i])),
        (_MEMBER_POS, jnp.stack([jnp.where(one & swap, j_edge, drop), jnp.where(one, i, drop)]), jnp.stack([mp, dest])),
        (_LABELS, jnp.atleast_1d(jnp.where(one, i, drop)), jnp.atleast_1d(b)),
        (_SIZES, jnp.where(one, jnp.stack([a, b]), drop), jnp.stack([pl["size_a"] - 1, pl["size_b"] + 1])),
        (_SEG_START, jnp.stack([jnp.where(one & ~pl["b_shifted"], qb, drop), jnp.where(one & ~fwd & ~emptied, qa, drop)]),
         jnp.stack([pl["start_b"], pl["seg_a"] + 1])),
        (_NUM_ACTIVE, jnp.atleast_1d(jnp.where(one, s, drop)), jnp.atleast_1d(pl["nact1"] - emptied.astype(jnp.int32))),
        (_LABELS, jnp.atleast_1d(jnp.maximum(drop, h)), jnp.atleast_1d(h)),
    ]


def _class_step(blocks_dev, n_cap: int, *, race: bool, d_cap: int, delta: float, first_batch_size: int,
                control_variate: bool, chunk_size: int, schedule: str = "padded", min_arm_draws: float = 0.0,
                race_widths=(), race_cost: float = 0.0, hybrid: bool = False, cv_members: int = 1,
                race_schedule: str = "doubling"):
    """One Gibbs update of the mention at a sorted position of a class with ``K <= n_cap``.

    Returns ``step(pairwise_log_factor, mentions, beta, exact, check, (state, key), p)``; ``exact`` and
    ``check`` are Python bools (specialised at trace time) or traced bools (``lax.cond``), so one
    compiled sweep can serve the exact sampler, Sub Gibbs and the decision check.

    Candidates are *columns*: column ``c < num_active`` is the non-empty cluster ``active[s + c]``
    (``i``'s own cluster ``a`` included, with ``i`` removed); if ``i`` was alone, ``a``'s column is the
    empty candidate, else column ``num_active`` (the id ``active[s + num_active]``). A racing update
    reads the O(D) column window of the state's indexes and the members it evaluates (through the
    segments of ``members``, gathered once per update), and moves ``i`` in O(D).
    """
    order, start_arr, size_arr = blocks_dev
    W = n_cap + 1  # exact update: up to n_b <= n_cap + 1 candidate columns
    ar_w = jnp.arange(W, dtype=jnp.int32)
    C = min(chunk_size, n_cap)
    D = d_cap
    # Large (raced) arms have >= m1 members each when min_arm_draws > 0: at most n_cap // m1 of them.
    L_MAX = D if min_arm_draws <= 0 else min(D, n_cap // first_batch_size + 1)
    C_SMALL = min(C, 64)  # chunk for the small arms' exact sums (often a few dozen members)
    widths = sorted({min(w, D) for w in race_widths} | {D})
    # chunk of the move's loops: a race's move (at most D + 1 non-empty clusters) is one iteration each
    MOVE_CHUNK = min(W, D + 1 if race else 64)
    # Hybrid update (``hybrid=True``): the race holds the large arms only (at most K / m1 of them) plus
    # one column for the best exactly summed candidate, whatever the number of candidates.
    DH = max(2, min(D, n_cap // first_batch_size + 1))
    widths_h = sorted({max(2, min(w, DH)) for w in race_widths} | {DH})

    def chunk_sums(factors_at, count, member_col, num_cols, C=C):
        """Σ β f(x_i, x_j) per column over ``count`` members; ``member_col(k) -> (mentions, columns)``."""
        nchunks = (count + C - 1) // C

        def body(carry):
            c, sums, bad = carry
            k = c * C + jnp.arange(C, dtype=jnp.int32)
            valid = k < count
            js, cols = member_col(k)
            f = jnp.where(valid, factors_at(js), 0.0)
            bad = bad | jnp.any(valid & ~jnp.isfinite(f) & ~(f == -jnp.inf))
            sums = sums.at[jnp.where(valid, cols, num_cols)].add(f, mode="drop")
            return c + 1, sums, bad

        init_c = (jnp.zeros((), jnp.int32), jnp.zeros((num_cols,), jnp.float32), jnp.zeros((), bool))
        _, sums, bad = jax.lax.while_loop(lambda c: c[0] < nchunks, body, init_c)
        return sums, bad

    def checked_info(check, bad, used, x_col, num_cols, ncols, noise, factors_at, K, block_members):
        """``SweepInfo`` of a raced update; with ``check`` (static or traced) the exact Gumbel-max
        decision under the same noise (all ``K`` members summed) is compared with ``x_col``."""

        def do_check(_):
            sums, bad_x = chunk_sums(factors_at, K, block_members(), num_cols)
            x_exact = jnp.argmax(jnp.where(jnp.arange(num_cols) < ncols, sums, -jnp.inf) + noise)
            ok = ~bad & ~bad_x
            return (ok & (x_exact != x_col)).astype(jnp.int32), ok.astype(jnp.int32)

        def no_check(_):
            return jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)

        if isinstance(check, bool):
            errors, checked = (do_check if check else no_check)(None)
        else:
            errors, checked = jax.lax.cond(check, do_check, no_check, None)
        return SweepInfo(used.astype(jnp.int32), jnp.ones((), jnp.int32), jnp.zeros((), jnp.int32),
                         bad.astype(jnp.int32), errors, checked)

    def hybrid_update(v):
        """Sum the small arms exactly, race the large ones (one column holds the best exact candidate).

        Over all the block's candidate columns (``W``): an arm is *large* when ``N_y >= m1`` and
        ``m1 N_y >= λ K``; every other candidate (small clusters and the empty one) is summed exactly
        and perturbed by its Gumbel noise, and only the best of them enters the race, as one column with
        no uncertainty. ``argmax`` over {best exact, large arms} is the Gumbel-max decision over all
        candidates, so the exact part is exact and the race (over the large arms only, width
        ``#large + 1``) keeps its δ. The noise is the exact update's (``gumbel(k_noise, (W,))``).
        """
        state, s, K, a, nact, ncols, col_a, skip, mem_w = (v[k] for k in (
            "state", "s", "K", "a", "nact", "ncols", "col_a", "skip", "mem_w"))
        factors_at, column_id, block_members, exact_branch = (v[k] for k in (
            "factors_at", "column_id", "block_members", "exact_branch"))
        exact, check, k_noise, k_race = v["exact"], v["check"], v["k_noise"], v["k_race"]
        last_slot = state.labels.shape[0] - 1
        m1 = first_batch_size
        slots = jnp.clip(s + ar_w, 0, last_slot)
        n_w = jnp.where(ar_w < nact, state.sizes[state.active[slots]], 0) - (ar_w == col_a).astype(jnp.int32)
        # λ (the expected members of an arm in the first batch of the *shared* population) concerns the
        # padded race only; a per-arm (ragged) race draws m1 members of each large arm whatever K.
        lam = min_arm_draws if schedule == "padded" else 0.0
        large_w = (n_w >= m1) & (n_w.astype(jnp.float32) * m1 >= lam * K.astype(jnp.float32))
        num_large = jnp.sum(large_w, dtype=jnp.int32)
        n_small_w = jnp.where(large_w, 0, jnp.maximum(n_w, 0))
        k_small = jnp.sum(n_small_w, dtype=jnp.int32)
        k_large = K - k_small

        def make_race(R):
            """The hybrid race at static width ``R`` (``num_large + 1 <= R``)."""

            def race_branch(_):
                # everything below is computed only when the update races (inside the switch branch):
                # the exact updates of the class pay only the masks above
                g_w = state.seg_start[slots] - s
                cum_small_w = jnp.cumsum(n_small_w)
                noise_w = jax.random.gumbel(k_noise, (W,))
                ar_r = jnp.arange(R, dtype=jnp.int32)
                lc_r = jnp.zeros((R,), jnp.int32).at[jnp.where(large_w, jnp.cumsum(large_w) - 1, R)].set(ar_w, mode="drop")
                live_r = ar_r < num_large
                n_r = jnp.where(live_r, n_w[lc_r], 0)
                g_r = g_w[lc_r]
                cum_r = jnp.cumsum(n_r)

                def small_member(k):
                    c = jnp.minimum(jnp.searchsorted(cum_small_w, k, side="right", method="scan_unrolled").astype(jnp.int32), W - 1)
                    off = k - (cum_small_w[c] - n_small_w[c])
                    off = off + ((c == col_a) & (off >= skip)).astype(jnp.int32)
                    return mem_w[jnp.clip(g_w[c] + off, 0, W - 1)], c

                def large_member(k):
                    c = jnp.minimum(jnp.sum(cum_r[None, :] <= k[:, None], axis=1, dtype=jnp.int32), R - 1)
                    off = k - (cum_r[c] - n_r[c])
                    off = off + ((lc_r[c] == col_a) & (off >= skip)).astype(jnp.int32)
                    return mem_w[jnp.clip(g_r[c] + off, 0, W - 1)], c

                small_sums, bad_small = chunk_sums(factors_at, k_small, small_member, W, min(C, 64))
                exact_logits = jnp.where((ar_w < ncols) & ~large_w, small_sums, -jnp.inf) + noise_w
                best_col = jnp.argmax(exact_logits).astype(jnp.int32)
                best_val = exact_logits[best_col]
                # columns: the large arms (compacted), then the best exact candidate, then nothing
                log_f0 = jnp.where(live_r, noise_w[lc_r], jnp.where(ar_r == num_large, best_val, -jnp.inf))
                num_cv = jnp.zeros((), jnp.int32)
                if schedule == "ragged":
                    def ragged_fn(idx):  # idx [m, R]: the idx-th member of each large arm
                        off = idx.astype(jnp.int32)
                        off = off + ((lc_r[None, :] == col_a) & (off >= skip)).astype(jnp.int32)
                        js = mem_w[jnp.clip(g_r[None, :] + off, 0, W - 1)]
                        return factors_at(js.reshape(-1)).reshape(js.shape)

                    x, rinfo = race_conditional(k_race, log_f0, ragged_fn, schedule="ragged", num_states=R,
                                                num_data=n_cap, delta=delta, first_batch_size=m1,
                                                population_sizes=n_r)
                    used = rinfo.num_evaluations + k_small
                else:
                    N = n_cap
                    KL = jnp.maximum(k_large, 1)
                    q_n, r_n = N // KL, N % KL

                    def values(idx):
                        k = idx.astype(jnp.int32) % KL
                        c_k = (q_n + (k < r_n).astype(jnp.int32)).astype(jnp.float32)
                        js, cols = large_member(k)
                        return js, cols, c_k

                    def log_factor_fn(idx):
                        js, cols, c_k = values(idx)
                        f = factors_at(js) / c_k
                        return jnp.where(cols[:, None] == ar_r[None, :], f[:, None], 0.0)

                    cv = None
                    if control_variate:
                        # h_y = mean of f over the first ``cv_members`` members of C_y other than i (< m1 <= N_y)
                        q = jnp.arange(cv_members, dtype=jnp.int32)
                        off = q[None, :] + ((lc_r[:, None] == col_a) & (q[None, :] >= skip)).astype(jnp.int32)
                        reps = mem_w[jnp.clip(g_r[:, None] + off, 0, W - 1)]
                        h = jnp.mean(factors_at(reps.reshape(-1)).reshape(reps.shape), axis=1)
                        h = jnp.where(live_r & jnp.isfinite(h), h, 0.0)
                        num_cv = num_large * cv_members
                        h_mean = h * n_r.astype(jnp.float32) / N

                        def h_fn(idx):
                            _, cols, c_k = values(idx)
                            return jnp.where(cols[:, None] == ar_r[None, :], (h[cols] / c_k)[:, None], 0.0)

                        cv = (h_fn, h_mean)
                    x, rinfo = race_conditional(k_race, log_f0, log_factor_fn, schedule="padded", num_states=R,
                                                num_data=N, delta=delta, first_batch_size=m1, control_variate=cv,
                                                race_schedule=race_schedule)
                    used = rinfo.num_data_used + k_small
                bad = rinfo.has_nan | bad_small
                x_col = jnp.where(x < num_large, lc_r[jnp.minimum(x, R - 1)], best_col)
                new = jnp.where(bad, a, column_id(x_col))

                info = checked_info(check, bad, used + num_cv, x_col, W, ncols, noise_w, factors_at, K, block_members)
                return new, info

            return race_branch

        use_race = (k_large >= 2 * m1) & (num_large >= 1)
        if not isinstance(exact, bool):
            use_race = use_race & ~exact
        width = jnp.sum(num_large + 1 > jnp.asarray(widths_h[:-1], jnp.int32), dtype=jnp.int32)
        if race_cost > 0:
            use_race = use_race & _race_pays(K, k_small, num_large, race_costs(race_cost, widths_h), width,
                                             first_batch_size)
        branches = [exact_branch] + [make_race(w) for w in widths_h]
        return jax.lax.switch(jnp.where(use_race, 1 + width, 0), branches, None)

    def step(pairwise_log_factor, mentions, beta, exact, check, carry, p):
        packed, key = carry
        state = _view(packed)
        # per-position keys (the class key folded with p): the batched sweep draws the same noise
        k_noise, k_race = jax.random.split(jax.random.fold_in(key, p))
        last_slot = state.labels.shape[0] - 1
        i = order[p]
        s = start_arr[p]
        n = size_arr[p]
        K = n - 1
        a = state.labels[i]
        nact = state.num_active[s]
        a_empty = state.sizes[a] == 1  # i alone: a is the empty candidate
        ncols = nact + (~a_empty).astype(jnp.int32)
        col_a = state.active_pos[a] - s
        mp_i = state.member_pos[i]
        skip = mp_i - state.seg_start[s + col_a]  # i's offset in a's segment
        xi = _row(mentions, i)
        # The block's slots of ``members``, gathered once (O(W)): the loops below (exact chunks, the
        # engine's stages) read this window, never the [M] state arrays. A while_loop reading an [M]
        # array that the update then writes made XLA copy it at every update (O(M) per update).
        mem_w = state.members[jnp.clip(s + ar_w, 0, last_slot)]

        def factors_at(js):
            xj = jax.tree.map(lambda v: v[js], mentions)
            return beta * jax.vmap(pairwise_log_factor, in_axes=(None, 0))(xi, xj)

        def column_id(c):
            return state.active[jnp.clip(s + c, 0, last_slot)]

        def block_members():
            """``block_member(k)``: the k-th other mention of the block (segment order) and its column."""
            col_w = state.active_pos[state.labels[mem_w]] - s  # O(W), outside the loop
            skip_i = mp_i - s

            def block_member(k):
                r = jnp.clip(k + (k >= skip_i).astype(jnp.int32), 0, W - 1)
                return mem_w[r], col_w[r]

            return block_member

        def exact_branch(_):
            sums, bad = chunk_sums(factors_at, K, block_members(), W)
            logits = jnp.where(ar_w < ncols, sums, -jnp.inf) + jax.random.gumbel(k_noise, (W,))
            x = jnp.argmax(logits)
            bad = bad | ~jnp.isfinite(logits[x])
            new = jnp.where(bad, a, column_id(x))
            info = SweepInfo(K.astype(jnp.int32), jnp.zeros((), jnp.int32), jnp.ones((), jnp.int32),
                             bad.astype(jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
            return new, info

        if not race or (isinstance(exact, bool) and exact):
            new, info = exact_branch(None)
        elif hybrid:
            new, info = hybrid_update(locals())
        else:
            ar_d = jnp.arange(D, dtype=jnp.int32)
            N = n_cap
            padded = schedule == "padded"
            slots = jnp.clip(s + ar_d, 0, last_slot)
            n_c = jnp.where(ar_d < nact, state.sizes[state.active[slots]], 0) - (ar_d == col_a).astype(jnp.int32)
            g_c = state.seg_start[slots] - s  # segment starts, relative to the block's first slot
            # Small arms (padded schedule): a candidate with fewer members than the first batch
            # (N_y < m1) or whose expected number of members in the first batch, m1 N_y / K, is below
            # ``min_arm_draws`` is summed exactly (N_y evaluations) and left out of the race, whose
            # shared population is the members of the large arms.
            large = n_c > 0
            if min_arm_draws > 0 and padded:  # λ = 0: every arm raced (the paper's rule)
                large = (large & (n_c >= first_batch_size)
                         & (n_c.astype(jnp.float32) * first_batch_size >= min_arm_draws * K.astype(jnp.float32)))
            n_large = jnp.where(large, n_c, 0)
            n_small = jnp.where(large, 0, n_c)
            cum_large = jnp.cumsum(n_large)
            cum_small = jnp.cumsum(n_small)
            k_large = cum_large[-1]
            k_small = cum_small[-1]

            def make_race(D, ar_d=ar_d, n_c=n_c, g_c=g_c, large=large, n_large=n_large, n_small=n_small,
                          cum_large=cum_large, cum_small=cum_small):
                """The racing update with race width ``D`` (columns ``>= D`` are empty: ``ncols <= D``)."""
                ar_d, n_c, g_c, large = ar_d[:D], n_c[:D], g_c[:D], large[:D]
                n_large, n_small, cum_large, cum_small = n_large[:D], n_small[:D], cum_large[:D], cum_small[:D]
                L = min(L_MAX, D)

                def member_in(k, cum, counts):
                    """The k-th member among the columns counted in ``counts`` (cumulative ``cum``)."""
                    c = jnp.minimum(jnp.sum(cum[None, :] <= k[:, None], axis=1, dtype=jnp.int32), D - 1)
                    off = k - (cum[c] - counts[c])
                    off = off + ((c == col_a) & (off >= skip)).astype(jnp.int32)
                    return mem_w[jnp.clip(g_c[c] + off, 0, W - 1)], c

                def race_branch(_):
                    # Population index n in [0, N) -> the (n mod K_L)-th member of the large arms, reward / c_k
                    # with c_k = #{n < N : n mod K_L = k} (every arm's sum stays exact).
                    KL = k_large if padded else K
                    q_n, r_n = N // jnp.maximum(KL, 1), N % jnp.maximum(KL, 1)

                    def values(idx):
                        k = idx.astype(jnp.int32) % jnp.maximum(KL, 1)
                        c_k = (q_n + (k < r_n).astype(jnp.int32)).astype(jnp.float32)
                        js, cols = member_in(k, cum_large, n_large)
                        return factors_at(js) / c_k, cols, c_k

                    def log_factor_fn(idx):
                        v, cols, _ = values(idx)
                        return jnp.where(cols[:, None] == ar_d[None, :], v[:, None], 0.0)

                    num_cv = jnp.zeros((), jnp.int32)
                    cv = None
                    if control_variate and padded:
                        # r_y = the first member of the segment other than i
                        # (evaluated for the large columns only, compacted to the static bound L)
                        has_rep = large & (ar_d < ncols)
                        lc = jnp.zeros((L,), jnp.int32).at[jnp.where(has_rep, jnp.cumsum(has_rep) - 1, L)].set(
                            ar_d, mode="drop")
                        num_cv = jnp.sum(has_rep, dtype=jnp.int32)
                        reps = mem_w[jnp.clip(g_c[lc] + ((lc == col_a) & (skip == 0)).astype(jnp.int32), 0, W - 1)]
                        h_l = factors_at(reps)
                        h_l = jnp.where((jnp.arange(L) < num_cv) & jnp.isfinite(h_l), h_l, 0.0)
                        h = jnp.zeros((D,), jnp.float32).at[jnp.where(jnp.arange(L) < num_cv, lc, D)].set(h_l, mode="drop")
                        h_mean = h * n_c.astype(jnp.float32) / N

                        def h_fn(idx):
                            k = idx.astype(jnp.int32) % jnp.maximum(KL, 1)
                            c_k = (q_n + (k < r_n).astype(jnp.int32)).astype(jnp.float32)
                            _, cols = member_in(k, cum_large, n_large)
                            hv = h[cols] / c_k
                            return jnp.where(cols[:, None] == ar_d[None, :], hv[:, None], 0.0)

                        cv = (h_fn, h_mean)
                    noise = jax.random.gumbel(k_noise, (D,))
                    small_sums, bad_small = jnp.zeros((D,), jnp.float32), jnp.zeros((), bool)
                    if padded:
                        small_sums, bad_small = chunk_sums(factors_at, k_small,
                                                           lambda k: member_in(k, cum_small, n_small), D, C_SMALL)
                    log_f0 = jnp.where(ar_d < ncols, small_sums, -jnp.inf) + noise
                    if schedule == "ragged":
                        def ragged_fn(idx):  # idx [m, D]: the idx-th member of each candidate
                            off = idx.astype(jnp.int32)
                            off = off + ((ar_d[None, :] == col_a) & (off >= skip)).astype(jnp.int32)
                            js = mem_w[jnp.clip(g_c[None, :] + off, 0, W - 1)]
                            return factors_at(js.reshape(-1)).reshape(js.shape)

                        x, rinfo = race_conditional(k_race, log_f0, ragged_fn, schedule="ragged", num_states=D, num_data=N,
                                                    delta=delta, first_batch_size=first_batch_size, population_sizes=n_c)
                        used = rinfo.num_evaluations
                    else:
                        x, rinfo = race_conditional(k_race, log_f0, log_factor_fn, schedule="padded", num_states=D,
                                                    num_data=N, delta=delta, first_batch_size=first_batch_size,
                                                    control_variate=cv, race_schedule=race_schedule)
                        used = rinfo.num_data_used + k_small
                    bad = rinfo.has_nan | bad_small
                    new = jnp.where(bad, a, column_id(x))

                    info = checked_info(check, bad, used + num_cv, x, D, ncols, noise, factors_at, K, block_members)
                    return new, info

                return race_branch

            use_race = ncols <= D
            if padded:
                use_race = use_race & (k_large >= 2 * first_batch_size)
            if not isinstance(exact, bool):
                use_race = use_race & ~exact
            # the narrowest race width that holds the candidates (the engine's cost grows with it)
            width = jnp.sum(ncols > jnp.asarray(widths[:-1], jnp.int32), dtype=jnp.int32)
            if race_cost > 0:
                use_race = use_race & _race_pays(K, k_small, jnp.sum(large, dtype=jnp.int32),
                                                 race_costs(race_cost, widths), width, first_batch_size)
            branches = [exact_branch] + [make_race(w) for w in widths]
            new, info = jax.lax.switch(jnp.where(use_race, 1 + width, 0), branches, None)

        # masked writes, no lax.cond over the state (a cond copied the whole state per update)
        packed, (info, key) = _move(packed, i, a, new, s, n, MOVE_CHUNK, new != a, (info, key))
        return (packed, key), info

    return step


# --------------------------------------------------------------------------- batched rounds
def class_lanes(blocks: Blocks, positions, batch_size: int) -> np.ndarray:
    """``[R, B]`` sorted positions (``-1`` = no update): round ``r`` updates ``lanes[r]`` together.

    Each lane (column) is a concatenation of whole blocks of the class, each block's positions in
    increasing order; blocks are dealt to ``B = min(batch_size, number of blocks)`` lanes largest
    first, each to the currently shortest lane (so ``R`` ≈ class size / B). A round therefore never
    holds two mentions of one block, and within a block the visiting order is the sequential sweep's.
    """
    positions = np.asarray(positions)
    if positions.size == 0:
        return np.zeros((0, 1), np.int32)
    starts = blocks.start[positions]
    groups = [positions[starts == s0] for s0 in np.unique(starts)]
    groups.sort(key=lambda g: -g.size)
    b = max(1, min(int(batch_size), len(groups)))
    lanes = [[] for _ in range(b)]
    for g in groups:
        min(lanes, key=len).extend(g.tolist())
    out = np.full((max(len(lane) for lane in lanes), b), -1, np.int32)
    for c, lane in enumerate(lanes):
        out[: len(lane), c] = lane
    return out


def _class_round(blocks_dev, n_cap: int, *, race: bool, d_cap: int, delta: float, first_batch_size: int,
                 control_variate: bool, chunk_size: int, min_arm_draws: float = 0.0, race_widths=(),
                 race_cost: float = 0.0, race_schedule: str = "doubling"):
    """One *round*: the updates of ``B`` mentions of ``B`` different blocks of a class, decided together.

    Mentions of different blocks have disjoint candidate clusters and factors, so their Gibbs updates
    commute: deciding them from the same state and then applying the moves is the systematic-scan
    sweep in another (equally valid) order, and each decision is exactly the sequential update's
    (:func:`_class_step`, same per-position keys). Per round: the candidates of every lane (one
    vectorised gather); all exact sums (exact lanes: their ``K`` members; racing lanes: their small
    arms) in one loop over a flat list of (lane, member) pairs, in chunks of ``chunk_size`` (work =
    the evaluations, not ``B`` times the largest); the races through
    :func:`jaxsub.discrete.racing_batch` (one call per race width, lanes of other widths given one
    live arm so they are done at once; the engine advances only unfinished races); then the ``B``
    moves one after another (O(D) each). The engine's fixed cost is paid once per round instead of
    once per race.

    Returns ``round_fn(pairwise_log_factor, mentions, beta, exact, check, (packed, key), ps [B])``.
    """
    from jaxsub.discrete import racing_batch

    order, start_arr, size_arr = blocks_dev
    W = n_cap + 1
    ar_w = jnp.arange(W, dtype=jnp.int32)
    C = chunk_size
    D = d_cap
    m1 = first_batch_size
    L_MAX = D if min_arm_draws <= 0 else min(D, n_cap // m1 + 1)
    widths = sorted({min(w, D) for w in race_widths} | {D})
    MOVE_CHUNK = min(W, D + 1 if race else 64)
    N = n_cap

    def member_in(k, cum, counts, g_c, col_a, skip, mem_w, Dw):
        """The k-th member among the columns counted in ``counts`` (one lane's arrays)."""
        c = jnp.minimum(jnp.sum(cum[None, :] <= k[:, None], axis=1, dtype=jnp.int32), Dw - 1)
        off = k - (cum[c] - counts[c])
        off = off + ((c == col_a) & (off >= skip)).astype(jnp.int32)
        return mem_w[jnp.clip(g_c[c] + off, 0, W - 1)], c

    def round_fn(pairwise_log_factor, mentions, beta, exact, check, carry, ps):
        packed, key = carry
        state = _view(packed)
        B = ps.shape[0]
        last_slot = state.labels.shape[0] - 1
        valid = ps >= 0
        p = jnp.maximum(ps, 0)
        keys = jax.vmap(lambda q: jax.random.split(jax.random.fold_in(key, q)))(p)
        k_noise, k_race = keys[:, 0], keys[:, 1]
        i, s, n = order[p], start_arr[p], size_arr[p]
        K = jnp.where(valid, n - 1, 0)
        a = state.labels[i]
        nact = state.num_active[s]
        a_empty = state.sizes[a] == 1
        ncols = nact + (~a_empty).astype(jnp.int32)
        col_a = state.active_pos[a] - s
        mp_i = state.member_pos[i]
        skip = mp_i - state.seg_start[s + col_a]
        mem_w = state.members[jnp.clip(s[:, None] + ar_w[None, :], 0, last_slot)]  # [B, W]
        col_w = state.active_pos[state.labels[mem_w]] - s[:, None]
        skip_i = mp_i - s

        def pair_factors(lane, js):
            xi = jax.tree.map(lambda v: v[i[lane]], mentions)
            xj = jax.tree.map(lambda v: v[js], mentions)
            return beta * jax.vmap(pairwise_log_factor)(xi, xj)

        def flat_sums(counts, member_fn, num_cols):
            """Σ β f(x_i, x_j) per (lane, column) over ``counts[b]`` members of each lane, flat chunks."""
            cum = jnp.cumsum(counts)
            total = cum[-1]
            nchunks = (total + C - 1) // C

            def body(c_):
                c, sums, bad = c_
                f = c * C + jnp.arange(C, dtype=jnp.int32)
                ok = f < total
                lane = jnp.minimum(jnp.searchsorted(cum, f, side="right"), B - 1).astype(jnp.int32)
                k = f - (cum[lane] - counts[lane])
                js, cols = member_fn(lane, k)
                val = jnp.where(ok, pair_factors(lane, js), 0.0)
                nonfinite = ok & ~jnp.isfinite(val) & ~(val == -jnp.inf)
                bad = bad.at[lane].max(nonfinite)
                sums = sums.at[jnp.where(ok, lane, B), cols].add(val, mode="drop")
                return c + 1, sums, bad

            init_c = (jnp.zeros((), jnp.int32), jnp.zeros((B, num_cols), jnp.float32), jnp.zeros((B,), bool))
            _, sums, bad = jax.lax.while_loop(lambda c_: c_[0] < nchunks, body, init_c)
            return sums, bad

        def block_member(lane, k):
            r = jnp.clip(k + (k >= skip_i[lane]).astype(jnp.int32), 0, W - 1)
            return mem_w[lane, r], col_w[lane, r]

        noise_w = jax.vmap(lambda k: jax.random.gumbel(k, (W,)))(k_noise)
        use_race = jnp.zeros((B,), bool)
        if race and not (isinstance(exact, bool) and exact):
            ar_d = jnp.arange(D, dtype=jnp.int32)
            slots = jnp.clip(s[:, None] + ar_d[None, :], 0, last_slot)
            n_c = (jnp.where(ar_d[None, :] < nact[:, None], state.sizes[state.active[slots]], 0)
                   - (ar_d[None, :] == col_a[:, None]).astype(jnp.int32))
            g_c = state.seg_start[slots] - s[:, None]
            large = n_c > 0
            if min_arm_draws > 0:
                large = (large & (n_c >= m1)
                         & (n_c.astype(jnp.float32) * m1 >= min_arm_draws * K[:, None].astype(jnp.float32)))
            n_large = jnp.where(large, n_c, 0)
            n_small = jnp.where(large, 0, n_c)
            cum_large = jnp.cumsum(n_large, axis=1)
            cum_small = jnp.cumsum(n_small, axis=1)
            k_large, k_small = cum_large[:, -1], cum_small[:, -1]
            use_race = valid & (ncols <= D) & (k_large >= 2 * m1)
            if not isinstance(exact, bool):
                use_race = use_race & ~exact
            width = jnp.sum(ncols[:, None] > jnp.asarray(widths[:-1], jnp.int32)[None, :], axis=1, dtype=jnp.int32)
            if race_cost > 0:
                use_race = use_race & _race_pays(K, k_small, jnp.sum(large, axis=1, dtype=jnp.int32),
                                                 race_costs(race_cost, widths), width, m1)

            def small_member(lane, k):
                js, c = jax.vmap(lambda kk, cs, ns, g, ca, sk, mw: member_in(kk[None], cs, ns, g, ca, sk, mw, D))(
                    k, cum_small[lane], n_small[lane], g_c[lane], col_a[lane], skip[lane], mem_w[lane])
                return js[:, 0], c[:, 0]

            # exact lanes: all K members; racing lanes: the members of their small arms (one flat loop)
            counts = jnp.where(use_race, k_small, K)

            def member_fn(lane, k):
                je, ce = block_member(lane, k)
                js, cs = small_member(lane, k)
                r = use_race[lane]
                return jnp.where(r, js, je), jnp.where(r, cs, ce)

            sums, bad_sum = flat_sums(counts, member_fn, W)
        else:
            sums, bad_sum = flat_sums(K, block_member, W)

        # exact decisions (every lane; racing lanes overwrite theirs below)
        logits = jnp.where(ar_w[None, :] < ncols[:, None], sums, -jnp.inf) + noise_w
        x = jnp.argmax(logits, axis=1).astype(jnp.int32)
        bad = bad_sum | ~jnp.isfinite(jnp.take_along_axis(logits, x[:, None], axis=1)[:, 0])
        evals = K
        num_races = jnp.zeros((B,), jnp.int32)
        errors = checked = jnp.zeros((B,), jnp.int32)

        if race and not (isinstance(exact, bool) and exact):
            L = L_MAX
            num_cv = jnp.zeros((B,), jnp.int32)
            h = jnp.zeros((B, D), jnp.float32)
            if control_variate:
                has_rep = large & (ar_d[None, :] < ncols[:, None]) & use_race[:, None]
                lc = jax.vmap(lambda hr: jnp.zeros((L,), jnp.int32).at[jnp.where(hr, jnp.cumsum(hr) - 1, L)].set(
                    ar_d, mode="drop"))(has_rep)
                num_cv = jnp.sum(has_rep, axis=1, dtype=jnp.int32)
                rep_slot = jnp.take_along_axis(g_c, lc, axis=1) + ((lc == col_a[:, None]) & (skip[:, None] == 0)).astype(jnp.int32)
                reps = jnp.take_along_axis(mem_w, jnp.clip(rep_slot, 0, W - 1), axis=1)  # [B, L]
                lane_l = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32)[:, None], (B, L))
                h_l = pair_factors(lane_l.reshape(-1), reps.reshape(-1)).reshape(B, L)
                ok_l = jnp.arange(L)[None, :] < num_cv[:, None]
                h_l = jnp.where(ok_l & jnp.isfinite(h_l), h_l, 0.0)
                h = jax.vmap(lambda hl, l_, ok: jnp.zeros((D,), jnp.float32).at[jnp.where(ok, l_, D)].set(
                    hl, mode="drop"))(h_l, lc, ok_l)
            KL = jnp.maximum(k_large, 1)
            params = dict(i=i, mem_w=mem_w, g_c=g_c, col_a=col_a, skip=skip, cum=cum_large, cnt=n_large, KL=KL, h=h,
                          h_mean=h * n_c.astype(jnp.float32) / N)

            def values(idx, P, Dw):
                k = idx.astype(jnp.int32) % P["KL"]
                c_k = (N // P["KL"] + (k < N % P["KL"]).astype(jnp.int32)).astype(jnp.float32)
                js, cols = member_in(k, P["cum"], P["cnt"], P["g_c"], P["col_a"], P["skip"], P["mem_w"], Dw)
                xi = jax.tree.map(lambda v: v[P["i"]], mentions)
                xj = jax.tree.map(lambda v: v[js], mentions)
                return beta * jax.vmap(pairwise_log_factor, in_axes=(None, 0))(xi, xj) / c_k, cols, c_k

            x_race = jnp.zeros((B,), jnp.int32)
            used = jnp.zeros((B,), jnp.int32)
            bad_race = jnp.zeros((B,), bool)
            for wi, Dw in enumerate(widths):
                ar = jnp.arange(Dw, dtype=jnp.int32)

                def log_factor_fn(idx, P, Dw=Dw, ar=ar):
                    v, cols, _ = values(idx, P, Dw)
                    return jnp.where(cols[:, None] == ar[None, :], v[:, None], 0.0)

                cv = None
                if control_variate:
                    def h_fn(idx, P, Dw=Dw, ar=ar):
                        k = idx.astype(jnp.int32) % P["KL"]
                        c_k = (N // P["KL"] + (k < N % P["KL"]).astype(jnp.int32)).astype(jnp.float32)
                        _, cols = member_in(k, P["cum"], P["cnt"], P["g_c"], P["col_a"], P["skip"], P["mem_w"], Dw)
                        hv = P["h"][cols] / c_k
                        return jnp.where(cols[:, None] == ar[None, :], hv[:, None], 0.0)

                    cv = (h_fn, lambda P: P["h_mean"])
                sampler = racing_batch(
                    log_factor_fn, Dw, N, delta=delta, first_batch_size=m1, bound="normal", variance="marginal",
                    control_variate=cv, gumbel_noise=False, exact_pass_cost=None,
                    skew_guard=None, schedule=race_schedule)
                mine = use_race & (width == wi)
                noise = jax.vmap(lambda k, Dw=Dw: jax.random.gumbel(k, (Dw,)))(k_noise)
                live = jnp.where(ar[None, :] < ncols[:, None], sums[:, :Dw], -jnp.inf) + noise
                trivial = jnp.where(ar == 0, 0.0, -jnp.inf)[None, :]
                log_f0s = jnp.where(mine[:, None], live, trivial)
                P = dict(params)
                for name in ("g_c", "cum", "cnt", "h", "h_mean"):
                    P[name] = params[name][:, :Dw]
                xw, rinfo = sampler(k_race, log_f0s, P)
                bad_w = rinfo.has_nan
                x_race = jnp.where(mine, xw, x_race)
                used = jnp.where(mine, rinfo.num_data_used, used)
                bad_race = jnp.where(mine, bad_w, bad_race)
            if check is not False:
                cnt_chk = jnp.where(use_race & jnp.asarray(check), K, 0)
                chk_sums, bad_chk = flat_sums(cnt_chk, block_member, D)
                errs = jnp.zeros((B,), jnp.int32)
                for wi, Dw in enumerate(widths):
                    ar = jnp.arange(Dw, dtype=jnp.int32)
                    noise = jax.vmap(lambda k, Dw=Dw: jax.random.gumbel(k, (Dw,)))(k_noise)
                    xe = jnp.argmax(jnp.where(ar[None, :] < ncols[:, None], chk_sums[:, :Dw], -jnp.inf) + noise,
                                    axis=1).astype(jnp.int32)
                    errs = jnp.where(width == wi, (xe != x_race).astype(jnp.int32), errs)
                ok = use_race & jnp.asarray(check) & ~(bad_race | bad_sum) & ~bad_chk
                errors = jnp.where(ok, errs, 0)
                checked = ok.astype(jnp.int32)
            x = jnp.where(use_race, x_race, x)
            bad = jnp.where(use_race, bad_race | bad_sum, bad)
            evals = jnp.where(use_race, used + k_small + num_cv, K)
            num_races = use_race.astype(jnp.int32)

        new = jnp.where(bad, a, state.active[jnp.clip(s + x, 0, last_slot)])
        v32 = valid.astype(jnp.int32)
        infos = SweepInfo(evals * v32, num_races * v32, (1 - num_races) * v32, bad.astype(jnp.int32) * v32,
                          errors * v32, checked * v32)
        info = jax.tree.map(lambda t: jnp.sum(t, dtype=jnp.int32), infos)

        # the B moves (disjoint rows) written together, chunk by chunk
        packed, info = _move_batched(packed, i, a, new, s, n, MOVE_CHUNK, valid & (new != a), info)
        return (packed, key), info

    return round_fn


# --------------------------------------------------------------------------- kernel
def _check_mentions(mentions, m):
    leaves = jax.tree.leaves(mentions)
    if not leaves or any(jnp.ndim(a) < 1 or jnp.shape(a)[0] != m for a in leaves):
        raise ValueError(f"mentions must be a pytree of arrays with leading axis {m} (one row per mention); "
                         f"got shapes {[jnp.shape(a) for a in leaves]}")


def _check_factor(pairwise_log_factor):
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


def _config(blocks, *, delta=0.05, first_batch_size=50, max_candidates=128, min_race_size=128,
            control_variate=True, chunk_size=256, visit=None, schedule="padded",
            min_arm_draws=DEFAULT_MIN_ARM_DRAWS, race_widths=DEFAULT_RACE_WIDTHS, batch_size=None,
            race_cost=None, hybrid=False, cv_members=1, race_schedule="doubling") -> dict:
    """Validate the static configuration of a sweep (see :func:`build_kernel`)."""
    if not isinstance(blocks, Blocks):
        raise ValueError(f"blocks must be a Blocks (from make_blocks); got {type(blocks).__name__}")
    delta = check_real("delta", delta, low=0.0, high=1.0)
    first_batch_size = check_int("first_batch_size", first_batch_size, low=2)
    if visit is not None:
        visit = np.asarray(visit)
        m = blocks.num_mentions
        if visit.ndim != 1 or not np.issubdtype(visit.dtype, np.integer) or np.any((visit < 0) | (visit >= m)):
            raise ValueError(f"visit must be a 1-D array of mention indices in [0, {m}); got {visit!r}")
    schedule = check_choice("schedule", schedule, ("padded", "ragged"))
    try:
        race_widths = tuple(check_int("race_widths", w, low=2) for w in race_widths)
    except TypeError:
        raise ValueError(f"race_widths must be a sequence of integers >= 2; got {race_widths!r}") from None
    if batch_size is None:
        batch_size = DEFAULT_BATCH_SIZE
    batch_size = check_int("batch_size", batch_size, low=1)
    if batch_size > 1 and schedule != "padded":
        raise ValueError(f"batch_size > 1 (batched rounds) needs schedule='padded'; got batch_size={batch_size}, "
                         f"schedule={schedule!r}")
    if not isinstance(hybrid, (bool, np.bool_)):
        raise ValueError(f"hybrid must be a Python bool; got {hybrid!r}")
    if hybrid and batch_size > 1:
        raise ValueError(f"hybrid=True needs the sequential sweep (batch_size=1); got batch_size={batch_size}")
    cv_members = check_int("cv_members", cv_members, low=1, high=first_batch_size)
    race_schedule = check_choice("race_schedule", race_schedule, RACE_SCHEDULES)
    if race_schedule != "doubling" and schedule != "padded":
        raise ValueError(f"race_schedule={race_schedule!r} needs schedule='padded' (racing_ragged has per-arm "
                         f"doubling schedules only); got schedule={schedule!r}")
    if cv_members > 1 and not hybrid:
        raise ValueError(f"cv_members > 1 needs hybrid=True; got cv_members={cv_members}")
    return dict(visit=visit, schedule=schedule, race_schedule=race_schedule, delta=delta, batch_size=batch_size,
                hybrid=bool(hybrid),
                cv_members=cv_members, first_batch_size=first_batch_size, race_widths=race_widths,
                max_candidates=check_int("max_candidates", max_candidates, low=2),
                min_race_size=check_int("min_race_size", min_race_size, low=max(2 * first_batch_size, 4)),
                control_variate=bool(control_variate), chunk_size=check_int("chunk_size", chunk_size, low=1),
                race_cost=check_real("race_cost", DEFAULT_RACE_COST if race_cost is None else race_cost, low=0.0,
                                     low_closed=True),
                min_arm_draws=check_real("min_arm_draws", min_arm_draws, low=0.0, high=float(first_batch_size),
                                         low_closed=True, high_closed=True))


def _race_can_pay(n_cap: int, config) -> bool:
    """Static part of the cost model: can any update of a class with ``K <= n_cap`` pass :func:`_race_pays`?

    The largest saving is ``n_cap - 1 - 4 m1`` (no small arm, one raced arm); the cheapest race is at the
    narrowest width. A class where no race can pay is compiled without racing code (exact updates only).
    """
    if config["race_cost"] <= 0:
        return True
    d = min(config["max_candidates"], n_cap + 1)
    narrowest = min([min(w, d) for w in config["race_widths"]] + [d])
    return n_cap - 1 - 4 * config["first_batch_size"] >= race_costs(config["race_cost"], (narrowest,))[0]


def _class_steps(blocks, config):
    """``[(n_cap, positions, step)]``: one update function per class of block sizes."""
    blocks_dev = (jnp.asarray(blocks.order), jnp.asarray(blocks.start), jnp.asarray(blocks.size))
    out = []
    keep = None
    if config["visit"] is not None:
        keep = np.isin(np.arange(blocks.num_mentions), blocks.position[config["visit"]])
    small_cap = 64
    while small_cap * 2 < config["min_race_size"]:
        small_cap *= 2  # every class below min_race_size is updated exactly: one class (one compile) for them
    for n_cap, positions in mention_classes(blocks, small_cap):
        if keep is not None:
            positions = positions[keep[positions]]
            if positions.size == 0:
                continue
        race = n_cap >= config["min_race_size"] and _race_can_pay(n_cap, config)
        if config["batch_size"] > 1:
            out.append((n_cap, class_lanes(blocks, positions, config["batch_size"]), _class_round(
                blocks_dev, n_cap, race=race, d_cap=min(config["max_candidates"], n_cap + 1), delta=config["delta"],
                first_batch_size=config["first_batch_size"], control_variate=config["control_variate"],
                chunk_size=config["chunk_size"], min_arm_draws=config["min_arm_draws"],
                race_widths=config["race_widths"], race_cost=config["race_cost"],
                race_schedule=config["race_schedule"])))
            continue
        out.append((n_cap, positions, _class_step(
            blocks_dev, n_cap, race=race, d_cap=min(config["max_candidates"], n_cap + 1), delta=config["delta"],
            first_batch_size=config["first_batch_size"], control_variate=config["control_variate"],
            chunk_size=config["chunk_size"], schedule=config["schedule"], min_arm_draws=config["min_arm_draws"],
            race_widths=config["race_widths"], race_cost=config["race_cost"], hybrid=config["hybrid"],
            cv_members=config["cv_members"], race_schedule=config["race_schedule"])))
    return out


def build_kernel(blocks: Blocks, *, delta: float = 0.05, first_batch_size: int = 50, max_candidates: int = 128,
                 min_race_size: int = 128, control_variate: bool = True, chunk_size: int = 256, visit=None,
                 schedule: str = "padded", min_arm_draws: float = None, race_widths=None, batch_size: int = None,
                 race_cost: float = None, hybrid: bool = False, cv_members: int = 1,
                 race_schedule: str = "doubling"):
    """Build one Gibbs sweep over all mentions (or over the mentions in ``visit``).

    Only the structure is fixed here (the blocks, hence the classes of block sizes and the
    compiled update per class, and the racing settings); the model (``pairwise_log_factor``,
    ``mentions``) and the inverse temperature go to the kernel.

    Args:
        blocks: :class:`Blocks` from :func:`~jaxsub.coreference.make_blocks`.
        delta: racing error level in (0, 1). Static: Racing-Normal's threshold ``B_Normal(δ, N, m1)``
            is solved on the host per class (``schedule="padded"``).
        first_batch_size: m1 >= 2, the first mini-batch (paper: 50).
        max_candidates: the widest race D (static); mentions with more candidates are updated exactly.
        min_race_size: blocks whose class (``K = n_b - 1`` rounded up to ``64 * 2^k``) is below this are
            updated exactly, all in one class (one compiled update).
        control_variate: use the per-candidate control variate (see module docstring).
        chunk_size: chunk of mentions summed at once by the exact update.
        schedule: ``"padded"`` (one shared population per block, zero rewards for other clusters,
            with the control variate) or ``"ragged"`` (the engine's per-arm doubling schedules over
            each candidate's own members, :func:`jaxsub.discrete.racing_ragged`; no control variate).
        visit: optional 1-D array of mention indices: the sweep updates only these (e.g. to time
            updates inside one large block); default all.
        min_arm_draws: λ in [0, m1] (padded schedule; default :data:`DEFAULT_MIN_ARM_DRAWS`). A candidate
            cluster with fewer members than the first batch (``N_y < m1``, as the per-arm schedules of
            ``schedule="ragged"`` do) or whose expected number of members in the race's first batch,
            ``m1 N_y / K``, is below λ is summed exactly (``N_y`` evaluations, counted) instead of raced,
            and the race's shared population is the members of the other candidates; when fewer than
            ``2 m1`` mentions remain for the race the update is exact. λ = 0 races every candidate
            (the paper's rule, whose decision error exceeds δ when clusters are small; see docs).
        race_widths: extra static race widths below ``max_candidates`` (default
            :data:`DEFAULT_RACE_WIDTHS`): each update races at the narrowest width holding its candidates
            (``lax.switch``; the engine's per-race cost grows with the width). Each width is one more
            compiled race per class of block sizes; ``()`` races at ``max_candidates`` only.
        batch_size: ``B >= 1`` (default :data:`DEFAULT_BATCH_SIZE` = 1, the sequential sweep). ``B > 1``
            (``schedule="padded"`` only): batched rounds, up to ``B`` mentions of ``B`` different blocks of a
            class decided together from the same state (exact sums in one flat loop, races through
            :func:`jaxsub.discrete.racing_batch`), then moved (:func:`class_lanes`, ``_class_round``).
            Updates of different blocks commute, so this is the same sweep, draw for draw (per-position
            keys). Measured no faster at M = 20,000 author mentions and 2-3x the compile time
            (docs/coreference.md §5).
        race_cost: ``F >= 0`` (default :data:`DEFAULT_RACE_COST`), the cost model deciding race vs exact per
            update: an update that could race races only when the evaluations it is expected to save,
            ``K - (k_small + raced arms + 4 m1)``, are at least the race's fixed cost
            ``F (a + max(D, 16)) / (a + 16)`` at its width D (:func:`race_costs`; ``F`` in factor evaluations of an exact update, calibrated
            once per factor and machine, docs/coreference.md). ``0`` races wherever the rules above allow.
        hybrid: ``False`` (default): the race's columns are all the candidates (at most ``max_candidates``;
            small arms enter it exactly). ``True`` (session 11): every small arm (``N_y < m1`` or
            ``m1 N_y < λ K``) and the empty cluster are summed exactly over **all** the block's
            candidates, and only the best of them (Gumbel-perturbed, the exact update's noise) enters the
            race as one column beside the large arms: the race width is ``#large + 1 <= K / m1 + 1``
            whatever the number of candidates (so updates with more than ``max_candidates`` candidates
            race too), the exact part is exact and the race keeps δ. Works with both schedules
            (``"ragged"`` then races the large arms per arm). Sequential sweep only.
        cv_members: ``q`` in ``[1, m1]`` (``hybrid=True`` only; default 1): the control variate of a raced
            arm is the mean factor over the first ``q`` members of its segment (``q`` evaluations per
            arm, counted) instead of one representative's.
        race_schedule: the padded race's stage schedule (static; ``schedule="padded"`` only):
            ``"doubling"`` (default, Alg. 1: tests after ``m1, 2 m1, 4 m1, ...`` draws) or ``"fixed"``
            (session 12: the engine's small-population schedule, one elimination test after ``m1`` draws
            with the one-stage quantile ``Φ⁻¹(1 - δ / D)`` (marginal variances; union bound over the
            arms), then the surviving arms on all ``N`` indices; compiled without the doubling loops).
            Both keep the race's δ under the Normal assumption (docs/coreference.md, session 12).

    Returns:
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
    """
    config = _config(blocks, delta=delta, first_batch_size=first_batch_size, max_candidates=max_candidates,
                     min_race_size=min_race_size, control_variate=control_variate, chunk_size=chunk_size,
                     visit=visit, schedule=schedule,
                     min_arm_draws=DEFAULT_MIN_ARM_DRAWS if min_arm_draws is None else min_arm_draws,
                     race_widths=DEFAULT_RACE_WIDTHS if race_widths is None else race_widths, batch_size=batch_size,
                     race_cost=race_cost, hybrid=hybrid, cv_members=cv_members, race_schedule=race_schedule)
    steps = [(jnp.asarray(positions), step) for _, positions, step in _class_steps(blocks, config)]
    m = blocks.num_mentions

    def kernel(rng_key, state: CorefState, pairwise_log_factor, mentions, temperature=1.0, exact=False,
               check_decisions=False):
        _check_factor(pairwise_log_factor)
        temperature = check_hyperparameter("temperature", temperature, low=0.0)
        _check_mentions(mentions, m)
        exact, check = _flag("exact", exact), _flag("check_decisions", check_decisions)
        beta = jnp.asarray(temperature, jnp.float32)
        info = _zero_info()
        packed = _pack(state)
        for c, (positions, step) in enumerate(steps):
            ck = jax.random.fold_in(rng_key, c)

            def body(carry, p, step=step):
                return step(pairwise_log_factor, mentions, beta, exact, check, carry, p)

            (packed, _), infos = jax.lax.scan(body, (packed, ck), positions)
            info = _add_info(info, jax.tree.map(lambda a: jnp.sum(a, dtype=jnp.int32), infos))
        return _unpack(packed), info

    return kernel


def conditional_update(blocks: Blocks, mention: int, **kernel_kwargs):
    """One Gibbs update of a single mention, exactly as the sweep of :func:`build_kernel` does it.

    Args:
        blocks: :class:`Blocks`.
        mention: the mention index (concrete int); its block must have at least 2 mentions.
        kernel_kwargs: as in :func:`build_kernel`.

    Returns:
        ``update(rng_key, state, pairwise_log_factor, mentions, temperature=1.0, exact=False,
        check_decisions=False) -> (state, SweepInfo)`` (for tests and diagnostics: the law of
        ``state.labels[mention]`` is the racing (or exact) conditional).
    """
    m = blocks.num_mentions
    mention = check_int("mention", mention, low=0, high=m - 1)
    p = int(blocks.position[mention])
    config = _config(blocks, **kernel_kwargs)
    for n_cap, positions, step in _class_steps(blocks, config):
        if p in set(np.ravel(positions).tolist()):
            break
    else:
        raise ValueError(f"mention {mention} is alone in its block: there is nothing to update")
    # batched rounds: the mention alone in a round of one lane
    where = jnp.asarray([p], jnp.int32) if config["batch_size"] > 1 else jnp.int32(p)

    def update(rng_key, state, pairwise_log_factor, mentions, temperature=1.0, exact=False, check_decisions=False):
        _check_factor(pairwise_log_factor)
        _check_mentions(mentions, m)
        beta = jnp.asarray(check_hyperparameter("temperature", temperature, low=0.0), jnp.float32)
        exact, check = _flag("exact", exact), _flag("check_decisions", check_decisions)
        (packed, _), info = step(pairwise_log_factor, mentions, beta, exact, check, (_pack(state), rng_key), where)
        return _unpack(packed), info

    return update


def as_top_level_api(pairwise_log_factor: Callable, mentions, blocks: Blocks, *, temperature=1.0,
                     exact: bool = False, **kernel_kwargs) -> SamplingAlgorithm:
    """``SamplingAlgorithm``: ``init(position=labels or None)``, ``step(rng_key, state)`` = one sweep.

    ``temperature`` is the inverse temperature β (traceable), ``exact`` selects exact Gibbs; other
    keyword arguments go to :func:`build_kernel`.
    """
    _check_factor(pairwise_log_factor)
    check_hyperparameter("temperature", temperature, low=0.0)
    kernel = build_kernel(blocks, **kernel_kwargs)

    def init_fn(position=None, rng_key=None):
        del rng_key
        return init(position, blocks)

    def step_fn(rng_key, state):
        return kernel(rng_key, state, pairwise_log_factor, mentions, temperature, exact)

    return SamplingAlgorithm(init_fn, step_fn)


# --------------------------------------------------------------------------- driver
class FitTrace(NamedTuple):
    """Per-sweep record of :func:`fit` (NumPy arrays, one entry per sweep)."""

    labels: np.ndarray  # [1, M] final labels
    num_evaluations: np.ndarray
    seconds: np.ndarray
    num_races: np.ndarray
    num_exact: np.ndarray
    num_nan: np.ndarray
    num_errors: np.ndarray
    num_checked: np.ndarray
    compile_seconds: float


def fit(rng_key, pairwise_log_factor: Callable, mentions, blocks: Blocks, temperatures, *, position=None,
        callback: Callable | None = None, progress_bar: bool = False, sweep: Callable | None = None,
        exact: bool = False, check_decisions: bool = False, **kernel_kwargs) -> tuple[CorefState, FitTrace]:
    """Run one sweep per entry of ``temperatures`` (annealed Gibbs for MAP with an increasing β).

    Args:
        temperatures: 1-D array of inverse temperatures β_s > 0, one per sweep (data, not code).
        callback: optional ``callback(sweep, labels_numpy)`` after each sweep (e.g. scoring).
        exact, check_decisions: as in the kernel of :func:`build_kernel`.
        sweep: optional ``sweep(rng_key, state, mentions, temperature) -> (state, SweepInfo)``
            to share one compilation across runs: a ``jax.jit``-ed function (compiled here, timed
            apart) or its compiled form ``.lower(...).compile()`` (reused as is, ``compile_seconds``
            ≈ 0), e.g. ``jax.jit(lambda k, s, x, b: kernel(k, s, factor, x, b, exact=True))``. Then
            ``exact``, ``check_decisions`` and ``kernel_kwargs`` must be left out.
        kernel_kwargs: structure for :func:`build_kernel` (when ``sweep`` is not given).

    Returns:
        ``(state, FitTrace)``; wall-clock excludes the first call's compilation (timed apart).
    """
    betas = np.asarray(temperatures, np.float32)
    if betas.ndim != 1 or betas.size < 1 or not np.all(np.isfinite(betas)) or np.any(betas <= 0):
        raise ValueError(f"temperatures must be a 1-D array of finite values > 0; got {temperatures!r}")
    _check_factor(pairwise_log_factor)
    if sweep is None:
        kernel = build_kernel(blocks, **kernel_kwargs)
        exact, check = _flag("exact", exact), _flag("check_decisions", check_decisions)
        sweep = jax.jit(lambda k, s, x, b: kernel(k, s, pairwise_log_factor, x, b, exact, check))
    elif kernel_kwargs or exact or check_decisions:
        raise ValueError("pass either sweep or kernel settings (exact, check_decisions, build_kernel keywords), "
                         f"not both; got {sorted(kernel_kwargs) + ['exact'] * bool(exact)}")
    state = init(position, blocks)
    t0 = time.perf_counter()
    compiled = sweep
    if hasattr(sweep, "lower"):
        compiled = sweep.lower(rng_key, state, mentions, jnp.float32(1.0)).compile()
    compile_s = time.perf_counter() - t0
    rows = []
    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=betas.size, unit="sweep", leave=False)
    for s, beta in enumerate(betas):
        t0 = time.perf_counter()
        state, info = compiled(jax.random.fold_in(rng_key, s), state, mentions, jnp.float32(beta))
        jax.block_until_ready(state)
        dt = time.perf_counter() - t0
        rows.append((dt,) + tuple(int(v) for v in info))
        if callback is not None:
            callback(s, np.asarray(state.labels))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    cols = list(zip(*rows))
    return state, FitTrace(labels=np.asarray(state.labels)[None], seconds=np.asarray(cols[0]),
                           num_evaluations=np.asarray(cols[1], np.int64), num_races=np.asarray(cols[2]),
                           num_exact=np.asarray(cols[3]), num_nan=np.asarray(cols[4]),
                           num_errors=np.asarray(cols[5]), num_checked=np.asarray(cols[6]),
                           compile_seconds=compile_s)
