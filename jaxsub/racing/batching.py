"""Many draws at once, paying only for the unfinished ones (``racing_batch``, ``sample.batched``).

``jax.vmap`` of a race runs every ``while_loop`` until its slowest draw is done. Here each
*round* moves the draws still running to the front and advances them one chunk, in
``vmap``-ed groups of a static size plus single draws for the remainder, so a batch costs
the sum of its draws' work. Every draw gets the result of the single-draw loop.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["run_batched"]


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
    B = jax.tree.leaves(states)[0].shape[0]
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
