"""Moving one mention between clusters in the packed state, in place (O(slots between), no copies).

:func:`move` moves one mention, :func:`move_batched` the moves of mentions of different blocks
(disjoint rows) together. Both write the packed ``[M, 8]`` state
(:func:`~jaxsub.coreference.state.pack`) with one scatter per chunk of slots inside one
``while_loop``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxsub.coreference.state import (
    ACTIVE,
    ACTIVE_POS,
    LABELS,
    MEMBER_POS,
    MEMBERS,
    NUM_ACTIVE,
    SEG_START,
    SIZES,
    view,
)

__all__ = ["move", "move_batched"]


def move(packed, i, a, b, s, n, chunk: int, do=True, carry=None):
    """Move mention ``i`` (block slots ``[s, s + n)``) from cluster ``a`` to cluster ``b != a``.

    ``i`` leaves ``a``'s segment of ``members`` (swapped to its edge), the segments strictly between
    ``a``'s and ``b``'s ``active`` slots shift by one member toward ``a`` (each moves one member from one
    end to the other), ``i`` joins ``b``'s segment; a new cluster takes the slot after the last
    non-empty one, and an emptied ``a`` leaves the non-empty prefix of ``active`` (later slots shift
    down by one, ``a`` goes to the first empty slot). Work O(number of slots between, in chunks of
    ``chunk``): two ``while_loop`` s over chunks (one iteration each when the block has at most
    ``chunk`` non-empty clusters), each chunk one scatter.

    ``packed`` is the state as one ``[M, 8]`` array (:func:`~jaxsub.coreference.state.pack`), written in place. Two rules keep
    XLA from copying it (it did, at every update, O(M) per update: measured 18 / 65 / 420 µs per
    exact update at M = 2,000 / 20,000 / 200,000, docs/guides/coreference.md): one array instead of eight,
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

    _, packed, carry = jax.lax.while_loop(
        lambda c: c[0] < plan["n_total"], body, (jnp.zeros((), jnp.int32), packed, carry)
    )
    return packed, carry


def move_batched(packed, i, a, b, s, n, chunk: int, do, carry=None):
    """The moves of ``B`` mentions of ``B`` different blocks (arrays ``[B]``), as :func:`move` each.

    Their writes touch disjoint rows (each block owns its slots, cluster ids and mentions), so chunk
    ``j`` of every move is written by one scatter: one ``while_loop`` over ``max_b n_total_b`` chunks.
    """
    plan = jax.vmap(lambda i_, a_, b_, s_, n_, do_: _move_plan(packed, i_, a_, b_, s_, n_, chunk, do_))(
        i, a, b, s, n, do
    )
    h = jnp.sum(plan.pop("h"), dtype=jnp.int32) + sum(
        jnp.sum(x.astype(jnp.int32))
        for x in jax.tree.leaves(carry)
        if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_
    )

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
    rows, cols, vals = (
        jnp.concatenate(x)
        for x in zip(
            *(
                (
                    jnp.atleast_1d(r),
                    jnp.full(jnp.shape(jnp.atleast_1d(r)), c, jnp.int32),
                    jnp.broadcast_to(jnp.asarray(v, jnp.int32), jnp.shape(jnp.atleast_1d(r))),
                )
                for c, r, v in puts
            )
        )
    )
    return packed.at[rows, cols].set(vals, mode="drop")


def _move_plan(packed, i, a, b, s, n, chunk, do=True, carry=None):
    """The values :func:`move` reads from the state before writing (a dict of scalars)."""
    col = view(packed)
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
    # (one masked chunk of ``chunk`` slots cost ~20 µs per update in blocks of 1,024)
    n_total = jnp.where(do, jnp.maximum(n1 + (n_shift + chunk - 1) // chunk, 1), 0)
    start_b = jnp.where(fwd, seg_b - 1, seg_b)
    swap = do & (mp != edge)
    b_shifted = emptied & (qb > qa)
    # every value read from the old state must feed the loop's writes (a value used only after the
    # loop is hoisted out of its carry by XLA, and the read then forces a copy): they are summed into
    # ``h``, written at row max(M, h) (out of range: dropped) in every chunk
    consts = (carry, j_edge, dest, mp, edge, size_a, size_b, seg_a, seg_b, nact1, tail, emptied, qa, qb, fwd, a, b)
    h = sum(
        jnp.sum(x.astype(jnp.int32))
        for x in jax.tree.leaves(consts)
        if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_
    )
    del drop
    return dict(
        i=i,
        a=a,
        b=b,
        s=s,
        do=do,
        j_edge=j_edge,
        dest=dest,
        mp=mp,
        size_a=size_a,
        size_b=size_b,
        seg_a=seg_a,
        nact1=nact1,
        tail=tail,
        emptied=emptied,
        qa=qa,
        qb=qb,
        fwd=fwd,
        count=count,
        n1=n1,
        n_total=n_total,
        start_b=start_b,
        swap=swap,
        b_shifted=b_shifted,
        h=h,
    )


_PUT_COLUMNS = (
    MEMBERS,
    MEMBER_POS,
    SEG_START,
    ACTIVE,
    SEG_START,
    ACTIVE_POS,
    MEMBERS,
    MEMBER_POS,
    LABELS,
    SIZES,
    SEG_START,
    NUM_ACTIVE,
    LABELS,
)  # the columns of _move_puts's writes, in order


def _move_puts(j, packed, pl, chunk):
    """Chunk ``j`` of one move's writes: ``[(column, rows, values)]`` (see :func:`move`)."""
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
    fwd, qa, qb, n1, count, tail, emptied = (
        pl["fwd"],
        pl["qa"],
        pl["qb"],
        pl["n1"],
        pl["count"],
        pl["tail"],
        pl["emptied"],
    )
    a, b, i, s, do = pl["a"], pl["b"], pl["i"], pl["s"], pl["do"]
    v = view(packed)
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
        (MEMBERS, jnp.where(ok, dst, drop), moved),
        (MEMBER_POS, jnp.where(ok, moved, drop), dst),
        (SEG_START, jnp.where(ok, jnp.where(fwd, qn, qc), drop), jnp.where(fwd, start_n - 1, start_q + 1)),
        (ACTIVE, jnp.where(ok2, q2, drop), ids),
        (SEG_START, jnp.where(ok2 & ~last, q2, drop), seg_next),
        (ACTIVE_POS, jnp.where(ok2, ids, drop), q2),
        (MEMBERS, jnp.stack([jnp.where(one & swap, mp, drop), jnp.where(one, dest, drop)]), jnp.stack([j_edge, i])),
        (MEMBER_POS, jnp.stack([jnp.where(one & swap, j_edge, drop), jnp.where(one, i, drop)]), jnp.stack([mp, dest])),
        (LABELS, jnp.atleast_1d(jnp.where(one, i, drop)), jnp.atleast_1d(b)),
        (SIZES, jnp.where(one, jnp.stack([a, b]), drop), jnp.stack([pl["size_a"] - 1, pl["size_b"] + 1])),
        (
            SEG_START,
            jnp.stack([jnp.where(one & ~pl["b_shifted"], qb, drop), jnp.where(one & ~fwd & ~emptied, qa, drop)]),
            jnp.stack([pl["start_b"], pl["seg_a"] + 1]),
        ),
        (NUM_ACTIVE, jnp.atleast_1d(jnp.where(one, s, drop)), jnp.atleast_1d(pl["nact1"] - emptied.astype(jnp.int32))),
        (LABELS, jnp.atleast_1d(jnp.maximum(drop, h)), jnp.atleast_1d(h)),
    ]
