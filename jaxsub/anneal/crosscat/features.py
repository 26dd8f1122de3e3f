"""The feature sweep: Algorithm 8 and the new-view MH for every feature, then the hyper step."""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from jaxsub.anneal.crosscat.hypers import resample_hypers
from jaxsub.anneal.crosscat.model import CrossCatData, CrossCatState, _window_rows, init_hypers
from jaxsub.anneal.crosscat.partitions import _draw_crp_partitions, _draw_partitions
from jaxsub.anneal.crosscat.views import feature_gibbs, new_view_mh
from jaxsub.validation import check_int

__all__ = ["feature_sweep", "width_ladder"]


def _level_runs(model, penalty: int = 64):
    """Contiguous runs ``(j0, j1, levels)`` of the categorical features (in ``cat_idx`` order) minimising
    ``sum (j1 - j0) * levels + penalty * runs`` (``levels`` the run's largest level count; ``penalty`` stands for
    the extra compiled loop body a run costs)."""
    L = [model.features[i].num_levels for i in model.cat_idx]
    n = len(L)
    best, arg = [0.0] + [math.inf] * n, [0] * (n + 1)
    for e in range(1, n + 1):
        for b in range(e):
            c = best[b] + (e - b) * max(L[b:e]) + penalty
            if c < best[e]:
                best[e], arg[e] = c, b
    runs, e = [], n
    while e > 0:
        runs.append((arg[e], e, max(L[arg[e] : e])))
        e = arg[e]
    return tuple(reversed(runs))


def _compact(state: CrossCatState, data: CrossCatData, width: int):
    """The state and data restricted to the first ``width`` rows of the subsample window (``width >=
    num_assigned``, static): ``(state_c, data_c, rows)`` with ``z`` ``[V, width]``, ``order = arange(width)``,
    ``head = 0`` and the data rows ``rows``. Every row outside them is unassigned (``z = -1`` in every view), and
    the sufficient statistics are unchanged: the feature moves on ``state_c`` cost O(width), not O(N)."""
    n = state.order.shape[0]
    rows = state.order[(state.head + jnp.arange(width, dtype=jnp.int32)) % n]
    data_c = CrossCatData(data.cat[rows], data.real[rows], data.real_obs[rows])
    return (
        state._replace(z=state.z[:, rows], order=jnp.arange(width, dtype=jnp.int32), head=jnp.zeros_like(state.head)),
        data_c,
        rows,
    )


def _expand(state: CrossCatState, state_c: CrossCatState, rows) -> CrossCatState:
    """:func:`_compact`'s inverse after moves on ``state_c``: its ``z`` written back at ``rows``."""
    return state_c._replace(z=state.z.at[:, rows].set(state_c.z), order=state.order, head=state.head)


def _check_widths(widths) -> tuple:
    """``feature_widths`` as a tuple of strictly increasing positive ints, else ``ValueError``."""
    try:
        out = tuple(int(w) for w in widths)
    except TypeError:
        raise ValueError(f"feature_widths must be a tuple of ints; got {widths!r}") from None
    if any(w < 1 for w in out) or any(b <= a for a, b in zip(out, out[1:])) or any(int(w) != w for w in widths):
        raise ValueError(f"feature_widths must be strictly increasing positive ints; got {widths!r}")
    return out


def width_ladder(num_rows: int, start: int = 32, factor: int = 4) -> tuple:
    """Widths ``start, start * factor, ...`` below ``num_rows`` for ``feature_widths`` (each one compiles a copy of
    the feature sweep; the moves on a subsample of ``m > start`` rows then cost ``O(width)`` with ``width <
    factor * m``, not ``O(num_rows)``).

    Parameters
    ----------
    num_rows
        ``N``.
    start
        The first width.
    factor
        Ratio of successive widths, at least 2.

    Returns
    -------
    tuple
        The widths, increasing.

    Raises
    ------
    ValueError
        ``num_rows < 1``, ``start < 1`` or ``factor < 2``.
    """
    num_rows = check_int("num_rows", num_rows, low=1)
    start = check_int("start", start, low=1)
    factor = check_int("factor", factor, low=2)
    out, w = [], start
    while w < num_rows:
        out.append(w)
        w *= factor
    return tuple(out)


def feature_sweep(rng_key, state, *, model, data, num_aux=1, grids=None, trip=None, width=None):
    """Algorithm-8 Gibbs then the new-view MH for every feature (``fori_loop`` over categorical, then real
    features), then the hyper step. Returns ``(state, ok)``.

    The rows do not move during the sweep, so every PY-prior partition the moves need (``num_aux``
    auxiliary views and one MH proposal per feature) is independent of the state: all ``F (num_aux + 1)``
    are drawn first, from the model's row ``(alpha, d)``: for a CRP row prior (``d = 0``) without a loop over
    the rows (:func:`_draw_crp_partitions`), else in one loop over the subsample (:func:`_draw_partitions`;
    ``trip`` its length, see there). Categorical features run in contiguous runs of similar level counts
    (:func:`_level_runs`), each over its own number of levels. Unoccupied view slots take the model's row
    ``(alpha, d)`` first (they hold no rows; a newborn view's hyperprior is that point mass), so the
    auxiliary views are exact Algorithm-8 draws, and the MH acceptance corrects for a refresh
    proposal drawn under other hyperparameters than its view's.

    ``width`` (static, optional, ``>= num_assigned``): the moves run on the first ``width`` rows of the
    subsample window only (:func:`_compact`; every other row is unassigned), so their cost follows the
    subsample rather than the ``N`` rows of the table; same law (the prior-partition draws take other random
    words than at full width). ``ok`` is False (and the returned state is not to be used) when ``width <
    num_assigned``.

    Parameters
    ----------
    rng_key
        PRNG key.
    state
        One chain's :class:`~jaxsub.anneal.crosscat.CrossCatState`.
    model
        The :class:`~jaxsub.anneal.crosscat.CrossCatModel`.
    data
        Its :class:`~jaxsub.anneal.crosscat.CrossCatData`.
    num_aux
        Auxiliary empty views of Algorithm 8 (static).
    grids
        :class:`~jaxsub.anneal.crosscat.CrossCatGrids` of the hyper step after the moves, or ``None`` (none).
    trip
        Bound on the subsample size for the prior-partition loop (above).
    width
        Rows of the subsample window the moves run on (static, above).

    Returns
    -------
    tuple
        ``(CrossCatState, ok)``.
    """
    if width is not None and width < state.order.shape[0]:
        state_c, data_c, rows = _compact(state, data, width)
        out, ok = feature_sweep(rng_key, state_c, model=model, data=data_c, num_aux=num_aux, grids=None, trip=trip)
        state = _expand(state, out, rows)
        ok = ok & (state_c.num_assigned <= width)  # a narrower window would drop assigned rows: not ok
        if grids is not None:
            state = resample_hypers(jax.random.split(rng_key, 4)[2], state, model=model, grids=grids)
        return state, ok
    return _feature_sweep(rng_key, state, model=model, data=data, num_aux=num_aux, grids=grids, trip=trip)


def _feature_sweep(rng_key, state, *, model, data, num_aux=1, grids=None, trip=None):
    """:func:`feature_sweep` on the whole state (no compaction)."""
    k_cat, k_real, k_hyp, k_draw = jax.random.split(rng_key, 4)
    V = state.z.shape[0]
    h = state.hypers
    dt = h.row_alpha.dtype
    init_h = init_hypers(model, V, dt)
    occ = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V) > 0
    state = state._replace(
        hypers=h._replace(
            row_alpha=jnp.where(occ, h.row_alpha, init_h.row_alpha), row_d=jnp.where(occ, h.row_d, init_h.row_d)
        )
    )
    per = num_aux + 1
    num = model.num_features * per
    a0, d0 = jnp.asarray(model.row_prior.alpha, dt), jnp.asarray(model.row_prior.discount, dt)
    if model.row_prior.discount == 0:  # CRP: all partitions at once, no loop over the subsample
        draws = _draw_crp_partitions(
            k_draw, _window_rows(state), state.num_assigned, jnp.full((num,), a0), state.sizes.shape[1]
        )
    else:
        draws = _draw_partitions(
            k_draw,
            _window_rows(state),
            state.num_assigned,
            jnp.full((num,), a0),
            jnp.full((num,), d0),
            state.sizes.shape[1],
            trip,
        )
    ok_all = jnp.asarray(True)
    for kind, count, key in ((0, len(model.cat_idx), k_cat), (1, len(model.real_idx), k_real)):
        if count == 0:
            continue
        ids = jnp.asarray(model.cat_idx if kind == 0 else model.real_idx, jnp.int32)
        # all of this kind's random numbers in two calls (a threefry call per move costs ~80 small kernels on CPU)
        k_gum, k_uni = jax.random.split(key)
        gumbels = jax.random.gumbel(k_gum, (count, 2, V), dt)
        uniforms = jax.random.uniform(k_uni, (count, 2), dt)

        def body(j, carry, kind=kind, key=key, ids=ids, gumbels=gumbels, uniforms=uniforms, levels=None):
            st, ok_acc = carry
            row0 = ids[j] * per
            aux = tuple(jax.lax.dynamic_slice_in_dim(a, row0, num_aux, 0) for a in draws)
            prop = tuple(jax.lax.dynamic_index_in_dim(a, row0 + num_aux, 0, keepdims=False) for a in draws)
            g, u = gumbels[j], uniforms[j]
            fj = (kind, j) if levels is None else (kind, j, levels)
            st, ok = feature_gibbs(key, st, fj, model=model, data=data, num_aux=num_aux, fresh=aux, noise=g[0])
            st, _ = new_view_mh(key, st, fj, model=model, data=data, fresh=prop + (a0, d0), noise=(u[0], u[1], g[1]))
            return st, ok_acc & ok

        # categorical features in runs of similar level counts, each run's loop over its own max levels (the
        # Dirichlet-multinomial marginals are O(views x C x levels) lgammas: padding every feature to the
        # largest level count cost flights' 5 features 525 level columns, the runs 185); same feature order
        segs = _level_runs(model) if kind == 0 else ((0, count, None),)
        for j0, j1, lv in segs:
            state, ok_all = jax.lax.fori_loop(j0, j1, partial(body, levels=lv), (state, ok_all))
    if grids is not None:
        state = resample_hypers(k_hyp, state, model=model, grids=grids)
    return state, ok_all
