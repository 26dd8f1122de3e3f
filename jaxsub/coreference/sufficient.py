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
beat it, so it is the recommended sampler whenever the factor decomposes (docs/coreference.md §7).

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
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.coreference.model import Blocks, _similarity_items
from jaxsub.validation import check_hyperparameter, check_int

__all__ = ["SufficientInfo", "SufficientKernel", "SufficientState", "build_kernel", "init"]


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
    """State from cluster labels (``None``: every mention alone), as :func:`jaxsub.coreference.init`."""
    if position is None:
        return SufficientState(jnp.asarray(blocks.position, jnp.int32))
    from jaxsub.coreference.state import (
        init as _coref_init,  # validates the labels against the blocks
    )

    return SufficientState(_coref_init(position, blocks).labels)


def build_kernel(blocks: Blocks, kinds: Mapping[str, str], weights: Mapping[str, float] | None = None, *,
                 thresholds: Mapping[str, float] | None = None, scales: Mapping[str, float] | None = None,
                 bias: float = 0.0, candidate_chunk: int = 32, member_chunk: int = 256):
    """Exact Gibbs sweep with per-cluster sums for the factor of ``packed_similarity(kinds, weights, ...)``.

    Args:
        blocks: :class:`~jaxsub.coreference.Blocks`.
        kinds, weights, thresholds, scales, bias: the settings of
            :func:`~jaxsub.coreference.packed_similarity` (the factor this sweep is exact for).
        candidate_chunk: candidates scored per step of the streamed Gumbel-max (static).
        member_chunk: block members per step of the categorical / numeric pass (static).

    Returns:
        :class:`SufficientKernel` ``(step, log_conditional)``: ``step(rng_key, state, packed, temperature=1.0)
        -> (state, SufficientInfo)`` with ``packed`` the output of ``packed_similarity(...).pack(mentions)``
        and ``temperature`` the inverse temperature β.
    """
    candidate_chunk = check_int("candidate_chunk", candidate_chunk, low=1)
    member_chunk = check_int("member_chunk", member_chunk, low=1)
    items = _similarity_items(kinds, weights, thresholds, scales)
    vec = [it for it in items if it[1] in ("string", "tokens")]
    cat = [it for it in items if it[1] == "categorical"]
    num = [it for it in items if it[1] == "numeric"]
    bias = float(bias)
    w_cat = np.asarray([w for _, _, w, _, _ in cat], np.float32)
    w_num = np.asarray([w for _, _, w, _, _ in num], np.float32)
    s_num = np.asarray([sc for _, _, _, _, sc in num], np.float32)
    m = blocks.num_mentions
    order = jnp.asarray(blocks.order, jnp.int32)
    start = jnp.asarray(blocks.start, jnp.int32)
    bsize = jnp.asarray(blocks.size, jnp.int32)
    ids = jnp.arange(m, dtype=jnp.int32)
    cb, mc = candidate_chunk, member_chunk
    pad = max(cb, mc)

    def omega(dim):
        return np.concatenate([np.repeat(np.float32([w for _, _, w, _, _ in vec]), dim),
                               np.float32([-w * t for _, _, w, t, _ in vec])])

    def member_terms(ci, ni, cj, nj):
        """``g(x_i, x_j)`` for one i against a chunk of j (rows ``cj [B, C]``, ``nj [B, Q]``)."""
        total = 0.0
        if cat:
            s = jnp.where(ci == cj, w_cat, -w_cat)
            total = total + jnp.sum(jnp.where((ci >= 0) & (cj >= 0), s, 0.0), axis=-1)
        if num:
            s = w_num * (2.0 * jnp.exp(-jnp.abs(ni - nj) / s_num) - 1.0)
            total = total + jnp.sum(jnp.where(jnp.isnan(ni) | jnp.isnan(nj), 0.0, s), axis=-1)
        return total

    def scores(state, packed, mention, temperature=1.0):
        """Unnormalised log conditional of ``y_mention`` over cluster ids from the sufficient statistics."""
        dense = jnp.asarray(packed["dense"], jnp.float32)
        lab = jnp.asarray(state.labels, jnp.int32)
        others = jnp.arange(m) != mention
        sums = jnp.zeros((m, dense.shape[1]), jnp.float32).at[lab].add(jnp.where(others[:, None], dense, 0.0))
        sizes = jnp.zeros((m,), jnp.int32).at[lab].add(others.astype(jnp.int32))
        u = dense[mention] * omega((dense.shape[1] - len(vec)) // len(vec)) if vec else dense[mention]
        total = bias * sizes.astype(jnp.float32) + sums @ u
        if cat or num:
            g = member_terms(jnp.asarray(packed["codes"])[mention], jnp.asarray(packed["numbers"])[mention],
                             jnp.asarray(packed["codes"]), jnp.asarray(packed["numbers"]))
            total = total + jnp.zeros((m,), jnp.float32).at[lab].add(jnp.where(others, g, 0.0))
        p = int(blocks.position[mention])
        s_b, n_b = int(blocks.start[p]), int(blocks.size[p])
        in_block = (jnp.arange(m) >= s_b) & (jnp.arange(m) < s_b + n_b)
        first_empty = jnp.argmax(in_block & (sizes == 0))
        keep = in_block & ((sizes > 0) | (jnp.arange(m) == first_empty))
        return jnp.where(keep, temperature * jnp.where(sizes > 0, total, 0.0), -jnp.inf)

    def kernel(rng_key, state: SufficientState, packed, temperature=1.0):
        beta = jnp.asarray(check_hyperparameter("temperature", temperature, low=0.0), jnp.float32)
        dense = jnp.asarray(packed["dense"], jnp.float32)
        if dense.ndim != 2 or dense.shape[0] != m:
            raise ValueError(f"packed['dense'] must have shape ({m}, P); got {dense.shape}")
        p_dim = dense.shape[1]
        # everything in sorted-position space: a block is a contiguous range, cluster ids are positions
        right = dense[order]
        left = right * omega((p_dim - len(vec)) // len(vec)) if vec else right
        codes = jnp.asarray(packed["codes"], jnp.int32)[order]
        numbers = jnp.asarray(packed["numbers"], jnp.float32)[order]
        codes_p = jnp.concatenate([codes, jnp.full((pad, codes.shape[1]), -1, jnp.int32)])
        numbers_p = jnp.concatenate([numbers, jnp.full((pad, numbers.shape[1]), jnp.nan, jnp.float32)])
        lab = state.labels[order]
        sums = jnp.zeros((m, p_dim), jnp.float32).at[lab].add(right)
        sizes = jnp.zeros((m,), jnp.int32).at[lab].add(1)
        empty = (sizes == 0).astype(jnp.int32)
        active = jnp.lexsort((ids, empty, start)).astype(jnp.int32)
        active_p = jnp.concatenate([active, jnp.zeros((pad,), jnp.int32)])
        active_pos = jnp.zeros((m,), jnp.int32).at[active].set(ids)
        nact = jnp.zeros((m,), jnp.int32).at[start].add(1 - empty)
        lab_p = jnp.concatenate([lab, jnp.zeros((pad,), jnp.int32)])
        acc = jnp.zeros((m,), jnp.float32)
        zero = jnp.zeros((), jnp.int32)
        carry0 = (lab_p, sums, sizes, active_p, active_pos, nact, acc, zero, zero, zero)
        has_g = bool(cat or num)

        def update(p, carry):
            lab_p, sums, sizes, active_p, active_pos, nact, acc, n_cand, n_terms, n_nan = carry
            key = jax.random.fold_in(rng_key, p)
            s_b, n_b = start[p], bsize[p]
            c_old = lab_p[p]
            # remove p from its cluster
            v = right[p]
            new_size = sizes[c_old] - 1
            sums = sums.at[c_old].set(jnp.where(new_size == 0, 0.0, sums[c_old] - v))
            sizes = sizes.at[c_old].set(new_size)
            na = nact[s_b]
            slot, last = active_pos[c_old], s_b + na - 1
            other = active_p[last]
            emptied = new_size == 0
            active_p = active_p.at[slot].set(jnp.where(emptied, other, active_p[slot]))
            active_p = active_p.at[last].set(jnp.where(emptied, c_old, active_p[last]))
            active_pos = active_pos.at[other].set(jnp.where(emptied, slot, active_pos[other]))
            active_pos = active_pos.at[c_old].set(jnp.where(emptied, last, active_pos[c_old]))
            na = na - emptied.astype(jnp.int32)
            # categorical / numeric part: per block member, summed into its cluster
            if has_g:
                ci, ni = codes[p], numbers[p]

                def member_step(k, acc):
                    q0 = s_b + k * mc
                    q = q0 + jnp.arange(mc, dtype=jnp.int32)
                    g = member_terms(ci, ni, jax.lax.dynamic_slice_in_dim(codes_p, q0, mc),
                                     jax.lax.dynamic_slice_in_dim(numbers_p, q0, mc))
                    ok = (q < s_b + n_b) & (q != p)
                    return acc.at[jnp.where(ok, jax.lax.dynamic_slice_in_dim(lab_p, q0, mc), m)].add(
                        jnp.where(ok, g, 0.0), mode="drop")

                acc = jax.lax.fori_loop(0, (n_b + mc - 1) // mc, member_step, acc)
            # candidates: the na non-empty clusters of the block + one empty (slot s_b + na)
            u = left[p]

            def cand_step(k, c):
                acc, best, best_c = c
                s0 = s_b + k * cb
                slots = s0 + jnp.arange(cb, dtype=jnp.int32)
                cl = jax.lax.dynamic_slice_in_dim(active_p, s0, cb)
                ok = slots <= s_b + na
                clc = jnp.where(ok, cl, 0)
                score = beta * (bias * sizes[clc].astype(jnp.float32) + sums[clc] @ u + (acc[clc] if has_g else 0.0))
                score = jnp.where(sizes[clc] > 0, score, 0.0)
                z = jnp.where(ok, score + jax.random.gumbel(jax.random.fold_in(key, k), (cb,)), -jnp.inf)
                j = jnp.argmax(z)
                better = z[j] > best
                if has_g:
                    acc = acc.at[jnp.where(ok, cl, m)].set(0.0, mode="drop")
                bad = jnp.any(ok & ~(score < jnp.inf))
                return acc, jnp.where(better, z[j], best), jnp.where(bad, -1, jnp.where(better, cl[j], best_c))

            na_removed = na
            n_chunks = (na + 1 + cb - 1) // cb
            acc, _, c_new = jax.lax.fori_loop(0, n_chunks, cand_step, (acc, jnp.float32(-jnp.inf), c_old))
            nan = c_new < 0
            c_new = jnp.where(nan, c_old, c_new)
            # add p to its new cluster (an empty one becomes the block's last active cluster)
            was_empty = sizes[c_new] == 0
            sums = sums.at[c_new].add(v)
            sizes = sizes.at[c_new].add(1)
            na = na + was_empty.astype(jnp.int32)
            nact = nact.at[s_b].set(na)
            lab_p = lab_p.at[p].set(c_new)
            n_cand = n_cand + na_removed + 1
            n_terms = n_terms + (n_b - 1 if has_g else 0)
            return lab_p, sums, sizes, active_p, active_pos, nact, acc, n_cand, n_terms, n_nan + nan.astype(jnp.int32)

        out = jax.lax.fori_loop(0, m, update, carry0)
        lab_sorted, n_cand, n_terms, n_nan = out[0][:m], out[7], out[8], out[9]
        labels = jnp.zeros((m,), jnp.int32).at[order].set(lab_sorted)
        return SufficientState(labels), SufficientInfo(n_cand, n_terms, n_nan)

    return SufficientKernel(kernel, scores)


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
