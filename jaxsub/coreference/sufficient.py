"""Exact Gibbs with sufficient statistics for the decomposable default factor (:func:`packed_similarity`).

For the packed similarity (:func:`~jaxsub.coreference.packed_similarity`) the string / token part of
``f`` is bilinear in the packed rows: ``f(x_i, x_j) = bias + (ω ∘ d_i) · d_j + g(x_i, x_j)`` with ``g``
the categorical and numeric terms. So the sum that Gibbs needs for a candidate cluster ``C`` is

    Σ_{j ∈ C} f(x_i, x_j) = bias |C| + (ω ∘ d_i) · S_C + Σ_{j ∈ C} g(x_i, x_j),   S_C = Σ_{j ∈ C} d_j,

and an exact update can keep ``S_C`` per cluster (``O(P)`` to move a mention) and pay ``O(P)`` per
candidate cluster instead of ``|C|`` factor evaluations of ``O(P)`` each. The categorical / numeric
part ``g`` (a few numbers per mention; ``2 exp(-|a-b|/s) - 1`` has no finite-rank decomposition for
continuous values) is computed per member of the block: ``n_b - 1`` scalar terms, one fused
elementwise pass, summed into the clusters by one scatter-add. This is the honest exact baseline for
this factor: racing (which estimates the same sums from subsamples of ``|C|`` full evaluations) cannot
beat it, so it is the recommended sampler whenever the factor decomposes (docs/guides/coreference.md).

The sweep visits every mention in sorted-position order (systematic scan, the same order as
:func:`~jaxsub.coreference.build_kernel`), draws ``y_i`` from the exact conditional
``p(y_i = y | y_{-i}) ∝ exp(β Σ_{j ∈ C_y} f(x_i, x_j))`` over the block's non-empty clusters plus one
empty cluster by Gumbel-max (streamed over chunks of candidates), and moves it. Cluster ids, blocks and
labels are those of :class:`~jaxsub.coreference.CorefState` (block ``b`` owns ids ``[s_b, s_b + n_b)``: no
cluster is ever dropped, no capacity growth is needed). The per-cluster sums are rebuilt from the labels
at the start of every sweep (one scatter-add), so float drift never accumulates across sweeps.

References:
    Chen & Ghahramani (2016), §5.3; Singh et al. (2012) (the pairwise-factor CRF).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.coreference.model import Blocks, _similarity_items
from jaxsub.coreference.state import init as _coref_init
from jaxsub.validation import check_hyperparameter, check_int, check_real

__all__ = [
    "SufficientConfig",
    "SufficientInfo",
    "SufficientKernel",
    "SufficientState",
    "build_kernel",
    "init",
    "log_conditional",
    "sweep",
]


class SufficientState(NamedTuple):
    """State of the sufficient-statistics sweep.

    Attributes
    ----------
    labels
        ``[M]`` int32 cluster id of every mention (the ids of :class:`~jaxsub.coreference.CorefState`).
    """

    labels: jnp.ndarray


class SufficientInfo(NamedTuple):
    """Counts over one sweep (int32 scalars).

    Attributes
    ----------
    num_candidates
        Candidate clusters scored (one ``P``-dot product with ``S_C`` each): ``Σ_i (K_i + 1)``.
    num_member_terms
        Per-member categorical / numeric terms ``g(x_i, x_j)`` computed (0 without such fields).
    num_nan
        Updates that met a NaN / +inf score: the mention kept its cluster.
    """

    num_candidates: jnp.ndarray
    num_member_terms: jnp.ndarray
    num_nan: jnp.ndarray


def init(position, blocks: Blocks) -> SufficientState:
    """State from cluster labels (``None``: every mention alone), as :func:`jaxsub.coreference.init`.

    Parameters
    ----------
    position
        ``None`` or ``[M]`` integer cluster ids, each inside its mention's block range.
    blocks
        :class:`~jaxsub.coreference.Blocks`.

    Returns
    -------
    SufficientState

    Raises
    ------
    ValueError
        As :func:`jaxsub.coreference.init` (the labels are checked against the blocks).
    """
    if position is None:
        return SufficientState(jnp.asarray(blocks.position, jnp.int32))
    return SufficientState(_coref_init(position, blocks).labels)


class SufficientConfig(NamedTuple):
    """The static configuration of the sweep (:func:`build_kernel`): the blocks and the factor's settings.

    Attributes
    ----------
    blocks
        :class:`~jaxsub.coreference.Blocks` (host arrays).
    order, start, size
        The blocks' arrays on the device (int32).
    vec_weights, vec_thresholds
        ``w_k`` and ``t_k`` of the string / tokens fields (the bilinear part).
    w_cat, w_num, s_num
        Weights of the categorical fields, weights and scales of the numeric ones.
    bias
        The factor's constant.
    candidate_chunk, member_chunk
        Candidates scored per step of the streamed Gumbel-max, block members per step of the
        categorical / numeric pass.
    """

    blocks: Blocks
    order: jax.Array
    start: jax.Array
    size: jax.Array
    vec_weights: tuple
    vec_thresholds: tuple
    w_cat: np.ndarray
    w_num: np.ndarray
    s_num: np.ndarray
    bias: float
    candidate_chunk: int
    member_chunk: int

    @property
    def has_member_terms(self) -> bool:
        """Whether the factor has categorical / numeric terms (computed per block member)."""
        return bool(self.w_cat.size or self.w_num.size)


def _omega(cfg: SufficientConfig, dim: int):
    """ω for bags of ``dim`` columns: ``[w_1 1, ..., w_S 1, -w_1 t_1, ..., -w_S t_S]``."""
    return np.concatenate(
        [
            np.repeat(np.float32(cfg.vec_weights), dim),
            np.float32([-w * t for w, t in zip(cfg.vec_weights, cfg.vec_thresholds)]),
        ]
    )


def _left(cfg: SufficientConfig, dense):
    """``ω ∘ d`` (rows of ``dense``)."""
    nv = len(cfg.vec_weights)
    return dense * _omega(cfg, (dense.shape[-1] - nv) // nv) if nv else dense


def _member_terms(cfg: SufficientConfig, ci, ni, cj, nj):
    """``g(x_i, x_j)`` for one i against a chunk of j (rows ``cj [B, C]``, ``nj [B, Q]``)."""
    total = 0.0
    if cfg.w_cat.size:
        s = jnp.where(ci == cj, cfg.w_cat, -cfg.w_cat)
        total = total + jnp.sum(jnp.where((ci >= 0) & (cj >= 0), s, 0.0), axis=-1)
    if cfg.w_num.size:
        s = cfg.w_num * (2.0 * jnp.exp(-jnp.abs(ni - nj) / cfg.s_num) - 1.0)
        total = total + jnp.sum(jnp.where(jnp.isnan(ni) | jnp.isnan(nj), 0.0, s), axis=-1)
    return total


def log_conditional(cfg: SufficientConfig, state: SufficientState, packed, mention: int, temperature=1.0):
    """Unnormalised log conditional of ``y_mention`` over cluster ids from the sufficient statistics.

    ``-inf`` outside the candidates (the block's non-empty clusters and its first empty id); ``mention`` a
    Python int. A reference for tests (O(M P)).

    For a candidate cluster ``c`` with members ``j != mention``, the value is
    ``temperature * (bias |c| + sum_{j in c} log phi(mention, j))``; the empty candidate scores 0.

    Parameters
    ----------
    cfg : SufficientConfig
        The sweep's static configuration (blocks and factor settings).
    state : SufficientState
        The current labels.
    packed : dict
        The packed mentions (``"dense"`` ``[M, P]``, ``"codes"``, ``"numbers"``), as from
        ``packed_similarity(...).pack(mentions)``.
    mention : int
        The mention whose label is updated (a Python int).
    temperature : float, default 1.0
        The inverse temperature multiplying the log factors.

    Returns
    -------
    jnp.ndarray
        ``[M]`` float32 unnormalised log conditional over cluster ids.
    """
    m = cfg.blocks.num_mentions
    dense = jnp.asarray(packed["dense"], jnp.float32)
    lab = jnp.asarray(state.labels, jnp.int32)
    others = jnp.arange(m) != mention
    sums = jnp.zeros((m, dense.shape[1]), jnp.float32).at[lab].add(jnp.where(others[:, None], dense, 0.0))
    sizes = jnp.zeros((m,), jnp.int32).at[lab].add(others.astype(jnp.int32))
    total = cfg.bias * sizes.astype(jnp.float32) + sums @ _left(cfg, dense[mention])
    if cfg.has_member_terms:
        g = _member_terms(
            cfg,
            jnp.asarray(packed["codes"])[mention],
            jnp.asarray(packed["numbers"])[mention],
            jnp.asarray(packed["codes"]),
            jnp.asarray(packed["numbers"]),
        )
        total = total + jnp.zeros((m,), jnp.float32).at[lab].add(jnp.where(others, g, 0.0))
    p = int(cfg.blocks.position[mention])
    s_b, n_b = int(cfg.blocks.start[p]), int(cfg.blocks.size[p])
    in_block = (jnp.arange(m) >= s_b) & (jnp.arange(m) < s_b + n_b)
    first_empty = jnp.argmax(in_block & (sizes == 0))
    keep = in_block & ((sizes > 0) | (jnp.arange(m) == first_empty))
    return jnp.where(keep, temperature * jnp.where(sizes > 0, total, 0.0), -jnp.inf)


class _Rows(NamedTuple):
    """One sweep's constants, in sorted-position space (padded by ``pad`` rows for the chunked reads)."""

    right: jax.Array  # [M, P] packed dense rows d_j
    left: jax.Array  # [M, P] ω ∘ d_i
    codes: jax.Array
    numbers: jax.Array
    codes_p: jax.Array
    numbers_p: jax.Array
    beta: jax.Array
    rng_key: jax.Array


class _Carry(NamedTuple):
    """The sweep's loop state: labels by sorted position (padded), per-cluster sums and sizes, the blocks'
    non-empty clusters (``active``, its inverse, their number), the categorical / numeric accumulator and
    the counts."""

    lab_p: jax.Array
    sums: jax.Array
    sizes: jax.Array
    active_p: jax.Array
    active_pos: jax.Array
    nact: jax.Array
    acc: jax.Array
    n_cand: jax.Array
    n_terms: jax.Array
    n_nan: jax.Array


def _remove(c: _Carry, p, s_b, v):
    """Take position ``p`` (row ``v``) out of its cluster; an emptied cluster leaves the active prefix."""
    c_old = c.lab_p[p]
    new_size = c.sizes[c_old] - 1
    sums = c.sums.at[c_old].set(jnp.where(new_size == 0, 0.0, c.sums[c_old] - v))
    sizes = c.sizes.at[c_old].set(new_size)
    na = c.nact[s_b]
    slot, last = c.active_pos[c_old], s_b + na - 1
    other = c.active_p[last]
    emptied = new_size == 0
    active_p = c.active_p.at[slot].set(jnp.where(emptied, other, c.active_p[slot]))
    active_p = active_p.at[last].set(jnp.where(emptied, c_old, active_p[last]))
    active_pos = c.active_pos.at[other].set(jnp.where(emptied, slot, c.active_pos[other]))
    active_pos = active_pos.at[c_old].set(jnp.where(emptied, last, active_pos[c_old]))
    return c._replace(sums=sums, sizes=sizes, active_p=active_p, active_pos=active_pos), na - emptied.astype(jnp.int32)


def _member_step(cfg: SufficientConfig, rows: _Rows, lab_p, p, s_b, n_b, k, acc):
    """Chunk ``k`` of the block's members: ``g(x_p, x_q)`` summed into each member's cluster."""
    mc = cfg.member_chunk
    q0 = s_b + k * mc
    q = q0 + jnp.arange(mc, dtype=jnp.int32)
    g = _member_terms(
        cfg,
        rows.codes[p],
        rows.numbers[p],
        jax.lax.dynamic_slice_in_dim(rows.codes_p, q0, mc),
        jax.lax.dynamic_slice_in_dim(rows.numbers_p, q0, mc),
    )
    ok = (q < s_b + n_b) & (q != p)
    return acc.at[jnp.where(ok, jax.lax.dynamic_slice_in_dim(lab_p, q0, mc), cfg.blocks.num_mentions)].add(
        jnp.where(ok, g, 0.0), mode="drop"
    )


def _candidate_step(cfg: SufficientConfig, rows: _Rows, c: _Carry, key, p, s_b, na, k, loop):
    """Chunk ``k`` of the candidates (slots ``s_b .. s_b + na``): scores, Gumbel-max so far, ``acc`` reset."""
    acc, best, best_c = loop
    cb, has_g = cfg.candidate_chunk, cfg.has_member_terms
    s0 = s_b + k * cb
    slots = s0 + jnp.arange(cb, dtype=jnp.int32)
    cl = jax.lax.dynamic_slice_in_dim(c.active_p, s0, cb)
    ok = slots <= s_b + na
    clc = jnp.where(ok, cl, 0)
    score = rows.beta * (
        cfg.bias * c.sizes[clc].astype(jnp.float32) + c.sums[clc] @ rows.left[p] + (acc[clc] if has_g else 0.0)
    )
    score = jnp.where(c.sizes[clc] > 0, score, 0.0)
    z = jnp.where(ok, score + jax.random.gumbel(jax.random.fold_in(key, k), (cb,)), -jnp.inf)
    j = jnp.argmax(z)
    better = z[j] > best
    if has_g:
        acc = acc.at[jnp.where(ok, cl, cfg.blocks.num_mentions)].set(0.0, mode="drop")
    bad = jnp.any(ok & ~(score < jnp.inf))
    return acc, jnp.where(better, z[j], best), jnp.where(bad, -1, jnp.where(better, cl[j], best_c))


def _update(cfg: SufficientConfig, rows: _Rows, p, c: _Carry) -> _Carry:
    """The exact Gibbs update of sorted position ``p``: remove, score the candidates, add to the drawn one."""
    key = jax.random.fold_in(rows.rng_key, p)
    s_b, n_b = cfg.start[p], cfg.size[p]
    c_old = c.lab_p[p]
    v = rows.right[p]
    c, na = _remove(c, p, s_b, v)
    acc = c.acc
    if cfg.has_member_terms:  # categorical / numeric part: per block member, summed into its cluster
        acc = jax.lax.fori_loop(
            0,
            (n_b + cfg.member_chunk - 1) // cfg.member_chunk,
            partial(_member_step, cfg, rows, c.lab_p, p, s_b, n_b),
            acc,
        )
    # candidates: the na non-empty clusters of the block + one empty (slot s_b + na)
    n_chunks = (na + 1 + cfg.candidate_chunk - 1) // cfg.candidate_chunk
    acc, _, c_new = jax.lax.fori_loop(
        0, n_chunks, partial(_candidate_step, cfg, rows, c, key, p, s_b, na), (acc, jnp.float32(-jnp.inf), c_old)
    )
    nan = c_new < 0
    c_new = jnp.where(nan, c_old, c_new)
    # add p to its new cluster (an empty one becomes the block's last active cluster)
    was_empty = c.sizes[c_new] == 0
    return _Carry(
        c.lab_p.at[p].set(c_new),
        c.sums.at[c_new].add(v),
        c.sizes.at[c_new].add(1),
        c.active_p,
        c.active_pos,
        c.nact.at[s_b].set(na + was_empty.astype(jnp.int32)),
        acc,
        c.n_cand + na + 1,
        c.n_terms + (n_b - 1 if cfg.has_member_terms else 0),
        c.n_nan + nan.astype(jnp.int32),
    )


def _initial_carry(cfg: SufficientConfig, labels, right, pad: int) -> _Carry:
    m = cfg.blocks.num_mentions
    ids = jnp.arange(m, dtype=jnp.int32)
    lab = labels[cfg.order]
    sizes = jnp.zeros((m,), jnp.int32).at[lab].add(1)
    empty = (sizes == 0).astype(jnp.int32)
    active = jnp.lexsort((ids, empty, cfg.start)).astype(jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    return _Carry(
        jnp.concatenate([lab, jnp.zeros((pad,), jnp.int32)]),
        jnp.zeros((m, right.shape[1]), jnp.float32).at[lab].add(right),
        sizes,
        jnp.concatenate([active, jnp.zeros((pad,), jnp.int32)]),
        jnp.zeros((m,), jnp.int32).at[active].set(ids),
        jnp.zeros((m,), jnp.int32).at[cfg.start].add(1 - empty),
        jnp.zeros((m,), jnp.float32),
        zero,
        zero,
        zero,
    )


def sweep(cfg: SufficientConfig, rng_key, state: SufficientState, packed, temperature=1.0):
    """One exact Gibbs sweep in sorted-position order (a block is a contiguous range, cluster ids are positions).

    Each mention's label is drawn from its exact conditional (:func:`log_conditional`) with a streamed
    Gumbel-max over the candidates, using the per-cluster sums of the packed rows instead of a pass over
    the members.

    Parameters
    ----------
    cfg : SufficientConfig
        The sweep's static configuration.
    rng_key : PRNGKey
        The sweep's key.
    state : SufficientState
        The current labels.
    packed : dict
        The packed mentions (``"dense"`` ``[M, P]``, ``"codes"``, ``"numbers"``).
    temperature : float, default 1.0
        The inverse temperature (> 0; may be traced).

    Returns
    -------
    state : SufficientState
        The labels after the sweep.
    info : SufficientInfo
        Candidates scored, member terms evaluated and NaN scores seen.

    Raises
    ------
    ValueError
        When ``packed["dense"]`` is not ``[M, P]`` or ``temperature`` is not > 0.
    """
    m = cfg.blocks.num_mentions
    beta = jnp.asarray(check_hyperparameter("temperature", temperature, low=0.0), jnp.float32)
    dense = jnp.asarray(packed["dense"], jnp.float32)
    if dense.ndim != 2 or dense.shape[0] != m:
        raise ValueError(f"packed['dense'] must have shape ({m}, P); got {dense.shape}")
    pad = max(cfg.candidate_chunk, cfg.member_chunk)
    right = dense[cfg.order]
    codes = jnp.asarray(packed["codes"], jnp.int32)[cfg.order]
    numbers = jnp.asarray(packed["numbers"], jnp.float32)[cfg.order]
    rows = _Rows(
        right,
        _left(cfg, right),
        codes,
        numbers,
        jnp.concatenate([codes, jnp.full((pad, codes.shape[1]), -1, jnp.int32)]),
        jnp.concatenate([numbers, jnp.full((pad, numbers.shape[1]), jnp.nan, jnp.float32)]),
        beta,
        rng_key,
    )
    out = jax.lax.fori_loop(0, m, partial(_update, cfg, rows), _initial_carry(cfg, state.labels, right, pad))
    labels = jnp.zeros((m,), jnp.int32).at[cfg.order].set(out.lab_p[:m])
    return SufficientState(labels), SufficientInfo(out.n_cand, out.n_terms, out.n_nan)


def build_kernel(
    blocks: Blocks,
    kinds: Mapping[str, str],
    weights: Mapping[str, float] | None = None,
    *,
    thresholds: Mapping[str, float] | None = None,
    scales: Mapping[str, float] | None = None,
    bias: float = 0.0,
    candidate_chunk: int = 32,
    member_chunk: int = 256,
):
    """Exact Gibbs sweep with per-cluster sums for the factor of ``packed_similarity(kinds, weights, ...)``.

    Parameters
    ----------
    blocks
        :class:`~jaxsub.coreference.Blocks`.
    kinds, weights, thresholds, scales, bias
        The settings of :func:`~jaxsub.coreference.packed_similarity` (the factor this sweep is exact for).
    candidate_chunk
        Candidates scored per step of the streamed Gumbel-max (static, >= 1).
    member_chunk
        Block members per step of the categorical / numeric pass (static, >= 1).

    Returns
    -------
    SufficientKernel
        ``(step, log_conditional)``: ``step(rng_key, state, packed, temperature=1.0) -> (state,
        SufficientInfo)`` with ``packed`` the output of ``packed_similarity(...).pack(mentions)`` and
        ``temperature`` the inverse temperature β.

    Raises
    ------
    ValueError
        ``blocks`` not a :class:`~jaxsub.coreference.Blocks`, a chunk < 1, or a factor setting out of its
        range (as :func:`~jaxsub.coreference.similarity_factor`).
    """
    if not isinstance(blocks, Blocks):
        raise ValueError(f"blocks must be a Blocks (from make_blocks); got {type(blocks).__name__}")
    candidate_chunk = check_int("candidate_chunk", candidate_chunk, low=1)
    member_chunk = check_int("member_chunk", member_chunk, low=1)
    items = _similarity_items(kinds, weights, thresholds, scales)
    vec = [it for it in items if it[1] in ("string", "tokens")]
    cat = [it for it in items if it[1] == "categorical"]
    num = [it for it in items if it[1] == "numeric"]
    cfg = SufficientConfig(
        blocks=blocks,
        order=jnp.asarray(blocks.order, jnp.int32),
        start=jnp.asarray(blocks.start, jnp.int32),
        size=jnp.asarray(blocks.size, jnp.int32),
        vec_weights=tuple(w for _, _, w, _, _ in vec),
        vec_thresholds=tuple(t for _, _, _, t, _ in vec),
        w_cat=np.asarray([w for _, _, w, _, _ in cat], np.float32),
        w_num=np.asarray([w for _, _, w, _, _ in num], np.float32),
        s_num=np.asarray([sc for _, _, _, _, sc in num], np.float32),
        bias=check_real("bias", bias),
        candidate_chunk=candidate_chunk,
        member_chunk=member_chunk,
    )
    return SufficientKernel(partial(sweep, cfg), partial(log_conditional, cfg))


class SufficientKernel(NamedTuple):
    """:func:`build_kernel`'s two pure functions.

    Attributes
    ----------
    step
        ``step(rng_key, state, packed, temperature=1.0) -> (SufficientState, SufficientInfo)``: one sweep.
    log_conditional
        ``log_conditional(state, packed, mention, temperature=1.0) -> [M]``: the unnormalised log
        conditional of ``y_mention`` given the other labels over cluster ids (``-inf`` outside the
        candidates: the block's non-empty clusters and its first empty id), computed from the
        sufficient statistics (a reference for tests; ``mention`` a Python int).
    """

    step: Callable
    log_conditional: Callable
