"""Many draws at once, paying only for the unfinished ones (``racing_batch``, ``sample.batched``).

``jax.vmap`` of a race runs every ``while_loop`` until its slowest draw is done. Here each
*round* moves the draws still running to the front and advances them one chunk, in
``vmap``-ed groups of a static size plus single draws for the remainder, so a batch costs
the sum of its draws' work. Every draw gets the result of the single-draw loop.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["first_round", "run_batched", "run_sequential"]


def run_batched(cond, body, states, ctxs, group_size: int):
    """Run ``while cond(s): s = body(s, c)`` for every draw of a batch, paying only for unfinished draws.

    Each *round* advances every draw with ``cond`` true by one chunk: the active
    draws are moved to the front (a stable ``argsort`` of the B flags, O(B log B)),
    then a ``while_loop`` over the ``n_active // g`` full groups gathers ``g``
    draws, runs the stage body ``vmap``-ed over them and scatters them back; the
    ``n_active % g`` remaining draws go one at a time, so no work is spent on
    finished draws. Under plain ``vmap`` every draw would pay for the slowest.
    Results are those of the single-draw loop for each draw.
    """
    g = group_size
    body_g = jax.vmap(body)
    cond_b = jax.vmap(cond)

    def gather(tree, sel):
        return jax.tree.map(lambda a: a[sel], tree)

    def scatter(tree, sel, new):
        return jax.tree.map(lambda a, v: a.at[sel].set(v), tree, new)

    def round_(states):
        active = cond_b(states)
        order = jnp.argsort(~active, stable=True).astype(jnp.int32)  # active draws first
        n_active = jnp.sum(active, dtype=jnp.int32)
        n_full = n_active // g

        def full_group(j, st):
            sel = jax.lax.dynamic_slice(order, (j * g,), (g,))
            return scatter(st, sel, body_g(gather(st, sel), gather(ctxs, sel)))

        states = jax.lax.fori_loop(0, n_full, full_group, states)
        if g > 1:

            def one(j, st):
                i = order[j]
                new = body(gather(st, i), gather(ctxs, i))
                return jax.tree.map(lambda a, v: a.at[i].set(v), st, new)

            states = jax.lax.fori_loop(n_full * g, n_active, one, states)
        return states

    return jax.lax.while_loop(lambda st: jnp.any(cond_b(st)), round_, states)


def _select(flags, new, old):
    """Per draw, ``new`` where ``flags`` else ``old`` (pytrees with leading axis B)."""
    return jax.tree.map(lambda n, o: jnp.where(flags.reshape(flags.shape + (1,) * (n.ndim - 1)), n, o), new, old)


def first_round(loop, states, ctxs):
    """The first iteration of ``loop = (cond, body)`` for every draw at once, as straight-line code.

    Every race starts with the same first chunk (``T = 0``), so the first round needs no
    compaction: one ``vmap``-ed stage body over all B draws (no ``while``, no argsort, no
    gather / scatter of race state); draws with ``cond`` false (decided at initialisation)
    keep their state. Each draw gets exactly what the first iteration of its own loop
    computes.
    """
    cond, body = loop
    return _select(jax.vmap(cond)(states), jax.vmap(body)(states, ctxs), states)


def run_sequential(loops, states, ctxs):
    """Finish every unfinished draw one at a time, each through all of ``loops`` (the single-draw path).

    For a batch no larger than one group (e.g. 16 MH chains after a first round that decided
    most of them) rounds would never fill a group: a draw still running is gathered once,
    runs its remaining stages in the single-draw loops (``while cond: body``, in order) and
    is scattered back once, instead of a gather / scatter and an argsort per chunk. Each draw
    gets the result of the single-draw loops, as with :func:`run_batched`.
    """
    active = ~states.done
    order = jnp.argsort(~active, stable=True).astype(jnp.int32)  # unfinished draws first

    def one(j, st):
        i = order[j]
        s = jax.tree.map(lambda a: a[i], st)
        c = jax.tree.map(lambda a: a[i], ctxs)

        def run(s, loops):
            for cond, body in loops:
                s = jax.lax.while_loop(cond, lambda x, body=body: body(x, c), s)
            return s

        s = run(s, loops[:1])
        if len(loops) > 1:  # decided in the first loop: skip the later loops' entry checks
            s = jax.lax.cond(s.done, lambda x: x, lambda x: run(x, loops[1:]), s)
        return jax.tree.map(lambda a, v: a.at[i].set(v), st, s)

    return jax.lax.fori_loop(0, jnp.sum(active, dtype=jnp.int32), one, states)
