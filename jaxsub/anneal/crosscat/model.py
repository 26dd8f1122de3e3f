"""The CrossCat model, its encoded table and the state of one chain.

:class:`CrossCatModel` (priors and one feature model per column), :func:`encode_table` (a
``[N, F]`` table, NaN = missing, validated against the model), :class:`CrossCatHypers`,
:class:`CrossCatState` and the constructors :func:`init_hypers`, :func:`init` and :func:`grow`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.anneal.checks import check_data_finite, check_labels, is_concrete
from jaxsub.anneal.model import CRP, BetaBernoulli, DirichletCategorical, NormalInverseChiSquared, PitmanYor
from jaxsub.types import PRNGKey
from jaxsub.validation import check_int

__all__ = [
    "CrossCatData",
    "CrossCatHypers",
    "CrossCatModel",
    "CrossCatState",
    "encode_table",
    "grow",
    "init",
    "init_hypers",
]


@dataclass(frozen=True)
class CrossCatModel:
    """``view_prior`` partitions the features, ``row_prior`` (per view) the rows; one feature model per column.

    Raises ``ValueError`` for priors other than :class:`CRP`/:class:`PitmanYor` or an unknown feature type.
    """

    view_prior: object
    row_prior: object
    features: tuple

    def __post_init__(self):
        for name in ("view_prior", "row_prior"):
            if not isinstance(getattr(self, name), (CRP, PitmanYor)):
                raise ValueError(f"{name} must be CRP or PitmanYor; got {getattr(self, name)!r}")
        feats = tuple(self.features)
        if not feats:
            raise ValueError("features must list at least one feature model")
        for i, f in enumerate(feats):
            if not isinstance(f, (BetaBernoulli, DirichletCategorical, NormalInverseChiSquared)):
                raise ValueError(
                    f"features[{i}]: unknown column type {f!r}; use BetaBernoulli, "
                    "DirichletCategorical or NormalInverseChiSquared"
                )
        object.__setattr__(self, "features", feats)

    @property
    def num_features(self) -> int:
        return len(self.features)

    @property
    def cat_idx(self) -> tuple:
        return tuple(i for i, f in enumerate(self.features) if not isinstance(f, NormalInverseChiSquared))

    @property
    def real_idx(self) -> tuple:
        return tuple(i for i, f in enumerate(self.features) if isinstance(f, NormalInverseChiSquared))

    @property
    def max_levels(self) -> int:
        return max([self.features[i].num_levels for i in self.cat_idx] + [1])


class CrossCatData(NamedTuple):
    """``cat`` ``[N, Fc]`` int32 levels (-1 missing); ``real`` ``[N, Fr]`` (0 where missing); ``real_obs`` mask.

    Attributes
    ----------
    cat
        ``[N, Fc]`` int32 levels of the categorical features, -1 where missing.
    real
        ``[N, Fr]`` real features, 0 where missing.
    real_obs
        ``[N, Fr]`` bool, observed cells of the real features.
    """

    cat: jnp.ndarray
    real: jnp.ndarray
    real_obs: jnp.ndarray


def encode_table(model: CrossCatModel, data, dtype=jnp.float32) -> CrossCatData:
    """Validate a ``[N, F]`` table (NaN = missing) against ``model``.

    Parameters
    ----------
    model
        The :class:`CrossCatModel` (column ``f`` modelled by ``model.features[f]``).
    data
        ``[N, F]`` numeric table (NaN = missing), or a :class:`CrossCatData` (returned as is).
    dtype
        Float dtype of the real columns.

    Returns
    -------
    CrossCatData

    Raises
    ------
    ValueError
        A wrong shape, a non-numeric table, an all-missing column, non-integer or out-of-range categorical codes,
        or infinite reals.
    """
    if isinstance(data, CrossCatData):
        return data
    arr = np.asarray(data)
    if arr.ndim != 2 or arr.shape[0] < 1:
        raise ValueError(f"data must be a 2-D table [N, num_features] with N >= 1; got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"data must be numeric (NaN for missing); got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    if arr.shape[1] != model.num_features:
        raise ValueError(f"data has {arr.shape[1]} columns but the model has {model.num_features} features")
    miss = np.isnan(arr)
    for f in range(arr.shape[1]):
        if miss[:, f].all():
            raise ValueError(f"column {f} is entirely missing")
    if np.isinf(arr).any():
        f = int(np.argwhere(np.isinf(arr))[0, 1])
        raise ValueError(f"column {f} holds infinite values (use NaN for missing cells)")
    cats = []
    for i in model.cat_idx:
        col, feat = arr[:, i], model.features[i]
        obs = ~miss[:, i]
        v = col[obs]
        if not np.all(np.mod(v, 1) == 0) or v.min() < 0 or v.max() >= feat.num_levels:
            raise ValueError(
                f"column {i} ({type(feat).__name__}, {feat.num_levels} levels) holds values "
                f"outside {{0..{feat.num_levels - 1}}}"
            )
        cats.append(np.where(obs, np.nan_to_num(col), -1).astype(np.int32))
    n = arr.shape[0]
    cat = np.stack(cats, 1) if cats else np.zeros((n, 0), np.int32)
    real = arr[:, list(model.real_idx)] if model.real_idx else np.zeros((n, 0))
    obs = ~np.isnan(real)
    return CrossCatData(jnp.asarray(cat), jnp.asarray(np.nan_to_num(real), dtype), jnp.asarray(obs))


# --------------------------------------------------------------------------- state
class CrossCatHypers(NamedTuple):
    """``view_alpha, view_d``: feature partition; ``row_alpha, row_d`` ``[V]``; ``cat_prior`` ``[Fc, L]``
    (per-level Dirichlet pseudo-counts, 1 on padding levels, masked); ``nix`` ``[Fr, 4]``.

    Attributes
    ----------
    view_alpha, view_d
        The view partition's PY parameters.
    row_alpha, row_d
        ``[V]`` each view's row-partition PY parameters.
    cat_prior
        ``[Fc, L]`` Dirichlet pseudo-counts.
    nix
        ``[Fr, 4]`` ``(mu0, kappa0, nu0, sigma2)``.
    """

    view_alpha: jnp.ndarray
    view_d: jnp.ndarray
    row_alpha: jnp.ndarray
    row_d: jnp.ndarray
    cat_prior: jnp.ndarray
    nix: jnp.ndarray


class CrossCatState(NamedTuple):
    """One chain.

    ``view_of`` ``[F]`` view slot of each feature; ``z`` ``[V, N]`` row cluster in every view
    (-1: unassigned row or unoccupied view); ``sizes`` ``[V, C]``; ``cat_counts`` ``[Fc, C, L]``
    and ``real_stats`` ``[Fr, C, 3]`` (observed count, sum, sum of squares) of each feature in
    the clusters of its own view; ``order``/``num_assigned``/``head`` the subsample: policy ``"random"``
    ``order[:num_assigned]`` assigned (``head`` 0), policy ``"fifo"`` (loom) the window
    ``order[(head + i) % N], i < num_assigned`` of a fixed shuffled cycle; ``cursor``, ``since_hyper``,
    ``halted`` as in :class:`~jaxsub.anneal.moves.AnnealState`; ``swept`` the subsample size at the chain's last
    feature / hyper step (its ``num_assigned`` at :func:`init`; :func:`build_sweep` ``sweep_growth``).

    Attributes
    ----------
    view_of, z, sizes, cat_counts, real_stats, hypers, order, num_assigned, cursor, since_hyper, halted, head, swept
        As above.
    """

    view_of: jnp.ndarray
    z: jnp.ndarray
    sizes: jnp.ndarray
    cat_counts: jnp.ndarray
    real_stats: jnp.ndarray
    hypers: CrossCatHypers
    order: jnp.ndarray
    num_assigned: jnp.ndarray
    cursor: jnp.ndarray
    since_hyper: jnp.ndarray
    halted: jnp.ndarray
    head: jnp.ndarray
    swept: jnp.ndarray


def _window_rows(state: CrossCatState) -> jnp.ndarray:
    """``[N]`` rows in subsample order: the first ``num_assigned`` are the assigned rows (O(N) gather)."""
    n = state.order.shape[0]
    return state.order[(state.head + jnp.arange(n, dtype=jnp.int32)) % n]


def _level_mask(model):
    m = np.zeros((len(model.cat_idx), model.max_levels), bool)
    for j, i in enumerate(model.cat_idx):
        m[j, : model.features[i].num_levels] = True
    return jnp.asarray(m)


def init_hypers(model: CrossCatModel, num_views: int, dtype=jnp.float32) -> CrossCatHypers:
    """The hyperparameters written in ``model``: its priors' ``(alpha, d)`` in every view and its features'.

    Parameters
    ----------
    model
        The :class:`CrossCatModel`.
    num_views
        View slots ``V``.
    dtype
        Float dtype.

    Returns
    -------
    CrossCatHypers
    """
    cp = np.ones((len(model.cat_idx), model.max_levels))
    for j, i in enumerate(model.cat_idx):
        pc = model.features[i].pseudo_counts()
        cp[j, : len(pc)] = pc
    nix = np.asarray(
        [[f.mu0, f.kappa0, f.nu0, f.sigma2] for f in (model.features[i] for i in model.real_idx)], np.float64
    ).reshape(-1, 4)
    rp = model.row_prior
    return CrossCatHypers(
        jnp.asarray(model.view_prior.alpha, dtype),
        jnp.asarray(model.view_prior.discount, dtype),
        jnp.full((num_views,), rp.alpha, dtype),
        jnp.full((num_views,), rp.discount, dtype),
        jnp.asarray(cp, dtype),
        jnp.asarray(nix, dtype),
    )


def _feature_stats(model, data, z_of_feature, on, capacity):
    """Statistics of every feature under the row labels ``z_of_feature`` ``[F, N]`` (rows with ``on``)."""
    ci, ri = jnp.asarray(model.cat_idx, jnp.int32), jnp.asarray(model.real_idx, jnp.int32)
    L = model.max_levels

    def cat_one(zf, x):
        w = (on & (x >= 0) & (zf >= 0)).astype(jnp.int32)
        seg = jnp.where(w > 0, zf, capacity)
        oh = jax.nn.one_hot(jnp.maximum(x, 0), L, dtype=jnp.int32) * w[:, None]
        return jax.ops.segment_sum(oh, seg, capacity + 1)[:capacity]

    def real_one(zf, x, ob):
        w = (on & ob & (zf >= 0)).astype(x.dtype)
        seg = jnp.where(w > 0, zf, capacity)
        st = jnp.stack([w, x * w, x * x * w], -1)
        return jax.ops.segment_sum(st, seg, capacity + 1)[:capacity]

    cc = (
        jax.vmap(cat_one, in_axes=(0, 1))(z_of_feature[ci], data.cat)
        if len(model.cat_idx)
        else jnp.zeros((0, capacity, L), jnp.int32)
    )
    rs = (
        jax.vmap(real_one, in_axes=(0, 1, 1))(z_of_feature[ri], data.real, data.real_obs)
        if len(model.real_idx)
        else jnp.zeros((0, capacity, 3), data.real.dtype)
    )
    return cc, rs


def _check_init(model: CrossCatModel, data: CrossCatData, capacity: int, num_aux: int, view_of, z, policy: str):
    """:func:`init`'s checks of the data, ``view_of`` and ``z`` (values only when concrete)."""
    n, num_views = data.cat.shape[0], model.num_features + num_aux
    if data.cat.shape != (n, len(model.cat_idx)) or data.real.shape != (n, len(model.real_idx)):
        raise ValueError(
            f"data does not match the model's {len(model.cat_idx)} categorical and "
            f"{len(model.real_idx)} real features; got shapes {data.cat.shape} and {data.real.shape}"
        )
    check_data_finite("data.real", data.real)
    check_labels("data.cat", data.cat, data.cat.shape, -1, model.max_levels)
    if view_of is not None:
        check_labels("view_of", view_of, (model.num_features,), 0, num_views)
    if z is not None:
        check_labels("z", z, (num_views, n), -1, capacity)
        if policy == "fifo" and is_concrete(z) and is_concrete(view_of):
            vo = np.zeros(model.num_features, int) if view_of is None else np.asarray(view_of)
            on = np.any(np.asarray(z)[np.unique(vo)] >= 0, axis=0)
            if 0 < on.sum() < n:
                raise ValueError("z for policy 'fifo' must assign no row or every row")


def init(
    model: CrossCatModel,
    data: CrossCatData,
    capacity: int,
    *,
    view_of=None,
    z=None,
    hypers: CrossCatHypers | None = None,
    num_aux: int = 1,
    dtype=jnp.float32,
    policy: str = "random",
    rng_key: PRNGKey | None = None,
) -> CrossCatState:
    """Initial state of one chain: all features in view 0 and no row assigned, or given views and row labels.

    Parameters
    ----------
    model
        The :class:`CrossCatModel`.
    data
        Its :class:`CrossCatData` (:func:`encode_table`).
    capacity
        Cluster slots per view (static).
    view_of
        ``[F]`` view slot of each feature in ``[0, F + num_aux)`` (default: all in view 0).
    z
        ``[V, N]`` row labels in ``[-1, capacity)`` per view slot, ``V = F + num_aux`` (default: no row
        assigned). Every row with a label ``>= 0`` in an occupied view is assigned (the same rows in every
        occupied view); unoccupied views' labels are ignored.
    hypers
        Initial :class:`CrossCatHypers` (default :func:`init_hypers`).
    num_aux
        Auxiliary view slots of Algorithm 8 (``V = F + num_aux``).
    dtype
        Float dtype of the statistics.
    policy
        ``"random"`` or ``"fifo"`` (loom's schedule: ``order`` is a uniform random cycle drawn with
        ``rng_key``; only the empty start or a full assignment is accepted, a window being a prefix).
    rng_key
        Required by ``"fifo"``.

    Returns
    -------
    CrossCatState

    Raises
    ------
    ValueError
        ``capacity < 1``, ``num_aux < 1``, an unknown ``policy``, ``"fifo"`` without ``rng_key`` or with a partial
        assignment, ``view_of`` / ``z`` of the wrong shape or (when concrete) with labels out of range, or data
        (when concrete) with non-finite reals or level codes outside the model's.
    """
    capacity = check_int("capacity", capacity, low=1)
    num_aux = check_int("num_aux", num_aux, low=1)
    if policy not in ("random", "fifo"):
        raise ValueError(f"policy must be 'random' or 'fifo'; got {policy!r}")
    if policy == "fifo" and rng_key is None:
        raise ValueError("rng_key is required for policy 'fifo' (the shuffled cycle)")
    _check_init(model, data, capacity, num_aux, view_of, z, policy)
    F = model.num_features
    V = F + num_aux
    n = data.cat.shape[0]
    if hypers is None:
        hypers = init_hypers(model, V, dtype)
    view_of = jnp.zeros((F,), jnp.int32) if view_of is None else jnp.asarray(view_of, jnp.int32)
    occ = jax.ops.segment_sum(jnp.ones((F,), jnp.int32), view_of, V) > 0
    if z is None:  # empty subsample: zero statistics (no scatter over the table for XLA to constant-fold)
        z = jnp.full((V, n), -1, jnp.int32)
        on = jnp.zeros((n,), bool)
        sizes = jnp.zeros((V, capacity), jnp.int32)
        cc = jnp.zeros((len(model.cat_idx), capacity, model.max_levels), jnp.int32)
        rs = jnp.zeros((len(model.real_idx), capacity, 3), data.real.dtype)
    else:
        z = jnp.where(occ[:, None], jnp.asarray(z, jnp.int32), -1)
        on = jnp.any(z >= 0, axis=0)
        sizes = jax.vmap(lambda zz: jax.ops.segment_sum((zz >= 0).astype(jnp.int32), jnp.maximum(zz, 0), capacity))(z)
        cc, rs = _feature_stats(model, data, z[view_of], on, capacity)
    if policy == "fifo":
        order = jax.random.permutation(rng_key, n).astype(jnp.int32)  # the window is a prefix: empty or all rows
    else:
        order = jnp.argsort(jnp.where(on, 0, 1), stable=True).astype(jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    m = jnp.sum(on).astype(jnp.int32)
    return CrossCatState(
        view_of, z, sizes, cc, rs.astype(dtype), hypers, order, m, zero, zero, jnp.zeros((), bool), zero, m
    )


def grow(state: CrossCatState, new_capacity: int) -> CrossCatState:
    """Reallocate a (possibly batched) state with ``new_capacity`` cluster slots per view (host side, outside jit).

    Occupied slots keep their index, so every label in ``z`` stays valid; the new slots are
    empty (zero sizes and statistics). Leading batch (chain) axes are kept; ``halted`` is
    left as it is (the caller clears it to resume).

    Parameters
    ----------
    state
        A :class:`CrossCatState`, possibly with leading chain axes.
    new_capacity
        The new number of slots per view, at least the current one.

    Returns
    -------
    CrossCatState

    Raises
    ------
    ValueError
        ``new_capacity`` below the current capacity.
    """
    cap = state.sizes.shape[-1]
    new_capacity = check_int("new_capacity", new_capacity, low=cap)
    extra = new_capacity - cap

    def pad(x, axis):
        widths = [(0, 0)] * x.ndim
        widths[x.ndim + axis] = (0, extra)
        return jnp.pad(x, widths)

    return state._replace(
        sizes=pad(state.sizes, -1), cat_counts=pad(state.cat_counts, -2), real_stats=pad(state.real_stats, -2)
    )
