"""The sequential Gibbs update of one mention: read its window, decide (exact, raced or hybrid), move it.

One Gibbs update of mention ``i`` (block ``b``, ``K = n_b - 1`` other mentions) draws
``y_i ~ p(y) ∝ exp(β S_y)``, ``S_y = Σ_{j ∈ C_y} f(x_i, x_j)``, over the candidates (non-empty
clusters of the block plus one empty cluster with ``S = 0``) by the Gumbel-max trick. The decision
is :func:`~jaxsub.coreference.update.exact_update`, :func:`~jaxsub.coreference.race.raced_update`
or :func:`~jaxsub.coreference.hybrid.hybrid_update`; the move is masked (no ``lax.cond`` over the
state: a cond copied the whole state per update).
"""

from __future__ import annotations

from jaxsub.coreference.hybrid import hybrid_update
from jaxsub.coreference.moves import move
from jaxsub.coreference.options import ClassConfig
from jaxsub.coreference.race import raced_update
from jaxsub.coreference.rewards import Model
from jaxsub.coreference.update import exact_update, update_context

__all__ = ["sequential_step"]


def sequential_step(cfg: ClassConfig, blocks_dev, model: Model, exact, check, carry, p):
    """One Gibbs update of the mention at sorted position ``p`` of a class (a ``lax.scan`` body).

    Parameters
    ----------
    cfg
        The class's :class:`~jaxsub.coreference.options.ClassConfig`.
    blocks_dev
        ``(order, start, size)`` of the blocks as device arrays.
    model
        :class:`~jaxsub.coreference.rewards.Model`.
    exact, check
        Python bools (specialised at trace time) or traced scalar bools (``lax.switch`` / ``lax.cond``).
    carry
        ``(packed state, class key)``.
    p
        The sorted position.

    Returns
    -------
    tuple
        ``((packed, key), SweepInfo)``.
    """
    packed, key = carry
    u = update_context(cfg, blocks_dev, model, packed, key, p)
    if not cfg.race or (isinstance(exact, bool) and exact):
        new, info = exact_update(cfg, model, u)
    elif cfg.options.hybrid:
        new, info = hybrid_update(cfg, model, u, exact, check)
    else:
        new, info = raced_update(cfg, model, u, exact, check)
    packed, (info, key) = move(packed, u.i, u.a, new, u.s, u.n, cfg.move_chunk, new != u.a, (info, key))
    return (packed, key), info
