"""CrossCat (Pitman-Yor cross-categorization) with subsample annealing over rows.

Model (Mansinghka et al. 2009, with the Pitman-Yor extension of Obermeyer et al. 2014, section 4)::

    features -> views            ~ PY(alpha_v, d_v)             (partition of the F columns)
    rows -> clusters, per view v  ~ PY(alpha_r[v], d_r[v])       (one row partition per view)
    x[r, f] | cluster c of view(f) ~ conjugate feature model f   (collapsed)

Feature models: :class:`~jaxsub.anneal.model.DirichletCategorical` with a *non-uniform*
Dirichlet concentration learned per level and feature, :class:`~jaxsub.anneal.model.BetaBernoulli`
(a 2-level categorical), :class:`~jaxsub.anneal.model.NormalInverseChiSquared` reals.
Missing cells (NaN) contribute no factor: they are skipped in every statistic and score.

Moves (all pure, jit/vmap-able; one chain per call, ``vmap`` for chains):

* :func:`row_tick`: one schedule tick (codes of :mod:`jaxsub.anneal.schedules`) removes and/or
  adds one row *in every view at once*: each occupied view draws the row's cluster from its
  own eq. (star), so a tick is the single-view kernel vmapped over views (cost O(F x C), the
  per-view scores are a segment-sum of per-feature scores over ``view_of``).
* :func:`feature_gibbs`: Neal's (2000) Algorithm 8 over views for one feature: ``num_aux``
  auxiliary empty views whose row partitions (of the current subsample) are drawn from the
  row PY prior; weights ``(n_v - d_v) p(x_f | pi_v)`` and ``(alpha_v + K d_v)/m p(x_f | pi_aux)``.
* :func:`new_view_mh`: the paper's Metropolis-Hastings proposal of a new feature set from the
  PY prior: pick a feature; if it shares its view, propose splitting it off into a new view
  whose row partition is a fresh PY-prior draw; if it is alone, with probability 1/2 propose a
  fresh partition for its view, else merging it into a uniformly chosen other view. Acceptance
  (prior of the proposed partition cancels with its proposal density)::

      split:   (alpha_v + K d_v) / (n - 1 - d_v) * p(x_f | pi*) / p(x_f | pi_v) / (2 K)
      merge:   (n_w - d_v) / (alpha_v + (K - 1) d_v) * p(x_f | pi_w) / p(x_f | pi_v) * 2 (K - 1)
      refresh: p(x_f | pi*) / p(x_f | pi_v)

  (``K`` views before the move, ``n`` features in the feature's view, ``n_w`` in the target).
* :func:`resample_hypers`: grid Gibbs of the view-partition ``(alpha_v, d_v)``, every occupied
  view's row ``(alpha, d)``, every categorical level's Dirichlet pseudo-count and every NIX
  parameter (uniform priors on the grids).

:func:`build_sweep` scans ticks of vmapped chains and, once per full cycle through the current
subsample, runs a feature sweep (Gibbs + MH for every feature) and the hyper step;
:func:`fit` is the host-side driver (schedules with the ``"random"`` or ``"fifo"`` (loom) row policy,
checkpoints, held-out scores, chain groups in host threads).
Queries: :func:`heldout_rows`, :func:`predictive_samples`, :func:`depends_on`.

Assumptions: a newly opened view takes the row ``(alpha, d)`` of its slot (reset to the model's
values whenever a view empties), so with hyper grids the hyperprior of a newborn view's row
partition is a point mass at the model's values; with fixed hyperparameters every move leaves
the exact posterior invariant (tests enumerate it). Capacity ``C`` clusters per view is static:
a chain that needs more halts (nothing dropped) and :func:`fit` grows the capacity on the host
(:func:`grow`) and resumes, up to ``max_capacity`` (then :class:`~jaxsub.anneal.mixture.CapacityError`).

References
----------
Mansinghka et al., "Cross-categorization", NIPS workshop 2009; Obermeyer, Glidden & Jonas,
AISTATS 2014, section 4; Neal, JCGS 2000 (Algorithm 8).
"""
from __future__ import annotations

import math
import time
import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

from jaxsub.anneal import mixture as mx
from jaxsub.anneal.model import (
    CRP,
    BetaBernoulli,
    DirichletCategorical,
    MixtureModel,
    NormalInverseChiSquared,
    PitmanYor,
)
from jaxsub.anneal import driver as _driver
from jaxsub.anneal.driver import SweepCache
from jaxsub.anneal.moves import (
    _first_true, _prefix_sum, _sample_index, _uniform_index_hl, bits_to_uniform, check_sweep_growth, moves_due,
    random_churn_reads, uniform_index,
)
from jaxsub.anneal.schedules import GIBBS, Schedule
from jaxsub.anneal.sweep import schedule_windows
from jaxsub.types import PRNGKey
from jaxsub.validation import check_int

__all__ = [
    "CrossCatData",
    "CrossCatFit",
    "CrossCatGrids",
    "CrossCatModel",
    "CrossCatState",
    "block_tick",
    "build_sweep",
    "data_grids",
    "default_crosscat_grids",
    "depends_on",
    "diagnose",
    "grow",
    "encode_table",
    "feature_gibbs",
    "fit",
    "heldout_rows",
    "init",
    "log_joint",
    "new_view_mh",
    "predictive_samples",
    "prior_view_partition",
    "resample_hypers",
    "row_tick",
    "tick_words",
    "width_ladder",
]

_LOG_PI = math.log(math.pi)
_EPPF_MODEL = MixtureModel(CRP(1.0), (BetaBernoulli(),))  # stand-in: mx.log_partition_prior needs a non-Finite model


def _eppf(sizes, alpha, discount):
    return mx.log_partition_prior(_EPPF_MODEL, sizes, alpha, discount)


# --------------------------------------------------------------------------- model and data
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
                raise ValueError(f"features[{i}]: unknown column type {f!r}; use BetaBernoulli, "
                                 "DirichletCategorical or NormalInverseChiSquared")
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
    """``cat`` ``[N, Fc]`` int32 levels (-1 missing); ``real`` ``[N, Fr]`` (0 where missing); ``real_obs`` mask."""

    cat: jnp.ndarray
    real: jnp.ndarray
    real_obs: jnp.ndarray


def encode_table(model: CrossCatModel, data, dtype=jnp.float32) -> CrossCatData:
    """Validate a ``[N, F]`` table (NaN = missing) against ``model``.

    Raises ``ValueError`` for a wrong shape, a non-numeric table, an all-missing column,
    non-integer or out-of-range categorical codes, or infinite reals.
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
            raise ValueError(f"column {i} ({type(feat).__name__}, {feat.num_levels} levels) holds values "
                             f"outside {{0..{feat.num_levels - 1}}}")
        cats.append(np.where(obs, np.nan_to_num(col), -1).astype(np.int32))
    n = arr.shape[0]
    cat = np.stack(cats, 1) if cats else np.zeros((n, 0), np.int32)
    real = arr[:, list(model.real_idx)] if model.real_idx else np.zeros((n, 0))
    obs = ~np.isnan(real)
    return CrossCatData(jnp.asarray(cat), jnp.asarray(np.nan_to_num(real), dtype), jnp.asarray(obs))


# --------------------------------------------------------------------------- state
class CrossCatHypers(NamedTuple):
    """``view_alpha, view_d``: feature partition; ``row_alpha, row_d`` ``[V]``; ``cat_prior`` ``[Fc, L]``
    (per-level Dirichlet pseudo-counts, 1 on padding levels, masked); ``nix`` ``[Fr, 4]``."""

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
    cp = np.ones((len(model.cat_idx), model.max_levels))
    for j, i in enumerate(model.cat_idx):
        pc = model.features[i].pseudo_counts()
        cp[j, : len(pc)] = pc
    nix = np.asarray([[f.mu0, f.kappa0, f.nu0, f.sigma2] for f in (model.features[i] for i in model.real_idx)],
                     np.float64).reshape(-1, 4)
    rp = model.row_prior
    return CrossCatHypers(jnp.asarray(model.view_prior.alpha, dtype), jnp.asarray(model.view_prior.discount, dtype),
                          jnp.full((num_views,), rp.alpha, dtype), jnp.full((num_views,), rp.discount, dtype),
                          jnp.asarray(cp, dtype), jnp.asarray(nix, dtype))


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

    cc = (jax.vmap(cat_one, in_axes=(0, 1))(z_of_feature[ci], data.cat) if len(model.cat_idx)
          else jnp.zeros((0, capacity, L), jnp.int32))
    rs = (jax.vmap(real_one, in_axes=(0, 1, 1))(z_of_feature[ri], data.real, data.real_obs) if len(model.real_idx)
          else jnp.zeros((0, capacity, 3), data.real.dtype))
    return cc, rs


def init(model: CrossCatModel, data: CrossCatData, capacity: int, *, view_of=None, z=None,
         hypers: CrossCatHypers | None = None, num_aux: int = 1, dtype=jnp.float32, policy: str = "random",
         rng_key: PRNGKey | None = None) -> CrossCatState:
    """Initial state: all features in view 0 and no row assigned, or given ``view_of`` ``[F]`` and ``z`` ``[V, N]``.

    ``V = F + num_aux`` view slots (enough for Algorithm 8). With ``z`` every row with a
    label ``>= 0`` in an occupied view is assigned (the same rows in every occupied view).
    ``policy="fifo"`` (loom's schedule): ``order`` is a uniform random cycle drawn with ``rng_key``
    (required); only the empty start or a full assignment is accepted (a window must be a prefix).
    """
    if policy not in ("random", "fifo"):
        raise ValueError(f"policy must be 'random' or 'fifo'; got {policy!r}")
    if policy == "fifo" and rng_key is None:
        raise ValueError("rng_key is required for policy 'fifo' (the shuffled cycle)")
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
    return CrossCatState(view_of, z, sizes, cc, rs.astype(dtype), hypers, order, m, zero, zero, jnp.zeros((), bool),
                         zero, m)


def grow(state: CrossCatState, new_capacity: int) -> CrossCatState:
    """Reallocate a (possibly batched) state with ``new_capacity`` cluster slots per view (host side, outside jit).

    Occupied slots keep their index, so every label in ``z`` stays valid; the new slots are
    empty (zero sizes and statistics). Leading batch (chain) axes are kept; ``halted`` is
    left as it is (the caller clears it to resume).
    """
    cap = state.sizes.shape[-1]
    new_capacity = check_int("new_capacity", new_capacity, low=cap)
    extra = new_capacity - cap

    def pad(x, axis):
        widths = [(0, 0)] * x.ndim
        widths[x.ndim + axis] = (0, extra)
        return jnp.pad(x, widths)

    return state._replace(sizes=pad(state.sizes, -1), cat_counts=pad(state.cat_counts, -2),
                          real_stats=pad(state.real_stats, -2))


# --------------------------------------------------------------------------- scores
def _cat_pred(model, hyp, counts, x):
    """``[Fc, C]`` log predictive of levels ``x`` ``[Fc]`` (missing -> 0)."""
    mask = _level_mask(model)
    beta = hyp.cat_prior
    B = jnp.sum(jnp.where(mask, beta, 0.0), -1)
    c = jnp.take_along_axis(counts, jnp.maximum(x, 0)[:, None, None], 2)[..., 0].astype(beta.dtype)
    n = jnp.sum(counts, -1).astype(beta.dtype)
    b = jnp.take_along_axis(beta, jnp.maximum(x, 0)[:, None], 1)
    return jnp.where((x >= 0)[:, None], jnp.log(b + c) - jnp.log(B[:, None] + n), 0.0)


def _nix_pred_params(nix, stats):
    """Student-t predictive of NIX clusters: params ``[..., 4]`` (mu0, kappa0, nu0, sigma2) and stats ``[..., 3]``
    (n, sum, sum of squares) -> ``[..., 4]`` = ``(mu_n, 1 / (nu_n s2), (nu_n + 1) / 2, log normaliser)`` with
    ``s2 = nu_n sigma_n^2 / nu_n (1 + 1 / kappa_n)``, so ``log p(x) = const - (nu_n + 1)/2 log1p((x - mu_n)^2 / (nu_n s2))``.

    These change only when a row joins or leaves the cluster (or the NIX parameters change), so the
    row sweep keeps them per cluster (:class:`_ScoreCache`) instead of two ``lgamma`` per cluster,
    feature and tick."""
    mu0, k0, nu0, s2 = nix[..., 0], nix[..., 1], nix[..., 2], nix[..., 3]
    n, s1, sq = stats[..., 0], stats[..., 1], stats[..., 2]
    kn, nun = k0 + n, nu0 + n
    mun = (k0 * mu0 + s1) / kn
    nus2 = jnp.maximum(nu0 * s2 + sq + k0 * mu0 * mu0 - kn * mun * mun, nu0 * s2 * 1e-6)
    scale2 = nus2 / nun * (1.0 + 1.0 / kn)
    half = 0.5 * (nun + 1.0)
    const = gammaln(half) - gammaln(0.5 * nun) - 0.5 * (jnp.log(nun * scale2) + _LOG_PI)
    return jnp.stack([mun, 1.0 / (nun * scale2), half, const], -1)


def _t_logpdf(params, x, obs):
    """``[Fr, C]`` Student-t log predictive from :func:`_nix_pred_params` ``[Fr, C, 4]`` at ``x`` ``[Fr]``; missing -> 0."""
    t = (x[:, None] - params[..., 0]) ** 2 * params[..., 1]
    return jnp.where(obs[:, None], params[..., 3] - params[..., 2] * jnp.log1p(t), 0.0)


def _real_pred(hyp, stats, x, obs):
    """``[Fr, C]`` Student-t log predictive (NIX), missing -> 0."""
    return _t_logpdf(_nix_pred_params(hyp.nix[:, None, :], stats), x, obs)


def _view_scores(model, state, cat_row, real_row, real_obs):
    """``[V, C]`` sum over each view's features of the row's log predictive in every cluster."""
    V = state.z.shape[0]
    C = state.sizes.shape[1]
    dt = state.hypers.row_alpha.dtype
    out = jnp.zeros((V, C), dt)
    if len(model.cat_idx):
        s = _cat_pred(model, state.hypers, state.cat_counts, cat_row).astype(dt)
        out = out + jax.ops.segment_sum(s, state.view_of[jnp.asarray(model.cat_idx)], V)
    if len(model.real_idx):
        s = _real_pred(state.hypers, state.real_stats, real_row.astype(dt), real_obs).astype(dt)
        out = out + jax.ops.segment_sum(s, state.view_of[jnp.asarray(model.real_idx)], V)
    return out


def _prior_logw(sizes, alpha, d):
    """Eq. (star) prior weights of one view ``[C]``: occupied ``log(n_k - d)``, first empty ``log(alpha + K d)``."""
    occ = sizes > 0
    first = _first_true(~occ)
    k = jnp.sum(occ).astype(alpha.dtype)
    slot = jnp.arange(sizes.shape[0])
    return jnp.where(occ, jnp.log(jnp.where(occ, sizes.astype(alpha.dtype) - d, 1.0)),
                     jnp.where((slot == first) & ~jnp.all(occ), jnp.log(alpha + k * d), -jnp.inf))


def _dm_cluster_marginals(model, beta, counts, mask=None):
    """``log p(X_c)`` per categorical feature and cluster: beta ``[..., Fc, L]``, counts ``[..., Fc, C, L]`` ->
    ``[..., Fc, C]``.

    ``mask`` ``[Fc, L]`` marks real levels (default: the model's); padding levels are ignored."""
    mask = _level_mask(model) if mask is None else mask
    bb = jnp.where(mask, beta, 1.0)
    B = jnp.sum(jnp.where(mask, beta, 0.0), -1)
    c = counts.astype(beta.dtype)
    n = jnp.sum(c, -1)
    return (gammaln(B[..., None]) - gammaln(B[..., None] + n)
            + jnp.sum(jnp.where(mask[:, None, :], gammaln(bb[..., None, :] + c) - gammaln(bb[..., None, :]), 0.0), -1))


def _dm_marginal(model, beta, counts, mask=None):
    """``sum_c log p(X_c)`` per categorical feature: beta ``[..., Fc, L]``, counts ``[..., Fc, C, L]`` -> ``[..., Fc]``."""
    return jnp.sum(_dm_cluster_marginals(model, beta, counts, mask), -1)


def _nix_marginal(params, stats):
    """``sum_c log p(X_c)`` of one real feature: params ``[..., 4]``, stats ``[C, 3]``."""
    return mx.nix_log_marginal(params, stats[:, 0], stats[:, 1:])


def _feature_marginals(model, state):
    """``[F]`` collapsed log marginal of each feature given its view's row partition."""
    h = state.hypers
    out = jnp.zeros((model.num_features,), h.row_alpha.dtype)
    if len(model.cat_idx):
        out = out.at[jnp.asarray(model.cat_idx)].set(_dm_marginal(model, h.cat_prior, state.cat_counts))
    if len(model.real_idx):
        out = out.at[jnp.asarray(model.real_idx)].set(jax.vmap(_nix_marginal)(h.nix, state.real_stats))
    return out


def log_joint(model: CrossCatModel, state: CrossCatState) -> jnp.ndarray:
    """``log p(view partition, row partitions, X_S)`` of the current subsample (hypers fixed)."""
    h = state.hypers
    V = state.z.shape[0]
    nf = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V)
    occ = nf > 0
    lp = _eppf(nf, h.view_alpha, h.view_d)
    rows = jax.vmap(_eppf)(state.sizes, h.row_alpha, h.row_d)
    return lp + jnp.sum(jnp.where(occ, rows, 0.0)) + jnp.sum(_feature_marginals(model, state))


# --------------------------------------------------------------------------- row tick
def _sample(u, logits):
    """The cluster index of :func:`jaxsub.anneal.moves._sample_index` (one inverse-CDF draw)."""
    return _sample_index(u, logits)[0]


def _static_take(a, idx):
    """``a[idx]`` for a static tuple ``idx``: a slice when it is a contiguous range (no gather kernel)."""
    idx = tuple(int(i) for i in idx)
    if idx == tuple(range(idx[0], idx[0] + len(idx))):
        return a[idx[0]: idx[0] + len(idx)]
    return a[jnp.asarray(idx)]


def _update_feature_stats(model, state, data, row, kf, sign):
    """Add ``sign`` (-1, 0 or 1) copies of ``row`` to every feature's cluster ``kf[f]`` (``[F]``, the cluster of
    ``row`` in the view of feature ``f``; -1: none): one gather of the per-view clusters onto the features
    per tick side (``k_view[view_of]``), not one per feature kind and per use."""
    cc, rs = state.cat_counts, state.real_stats
    if len(model.cat_idx):
        x = data.cat[row]
        k = _static_take(kf, model.cat_idx)
        w = sign * ((x >= 0) & (k >= 0)).astype(jnp.int32)
        cc = cc.at[jnp.arange(k.shape[0]), jnp.maximum(k, 0), jnp.maximum(x, 0)].add(w)
    if len(model.real_idx):
        x, ob = data.real[row], data.real_obs[row]
        k = _static_take(kf, model.real_idx)
        w = (sign * (ob & (k >= 0)).astype(jnp.int32)).astype(rs.dtype)
        upd = jnp.stack([w, w * x, w * x * x], -1)
        rs = rs.at[jnp.arange(k.shape[0]), jnp.maximum(k, 0)].add(upd)
    return state._replace(cat_counts=cc, real_stats=rs)


class _ScoreCache(NamedTuple):
    """Per-cluster parts of the row predictive that change only when a row joins or leaves a cluster
    (one chain): ``cat_n`` ``[Fc, C]`` observed cells of each categorical feature per cluster (its
    Dirichlet-multinomial normaliser ``B + n``), ``real`` ``[Fr, C, 4]`` :func:`_nix_pred_params`,
    ``stale`` ``[Fr]`` the one cluster per real feature whose ``real`` entry is out of date (-1: none).

    :func:`build_sweep` carries it beside the state, updates it in every tick at the clusters the tick
    touches per feature, and rebuilds it (:func:`_score_cache`) after feature and hyper moves. The NIX
    parameters of the cluster a row was *added* to are refreshed lazily, together with the next tick's
    removal (one batched Student-t parameter update per tick instead of two: ~13 fewer kernels);
    :func:`_fresh_cache` brings them up to date."""

    cat_n: jnp.ndarray
    real: jnp.ndarray
    stale: jnp.ndarray


def _score_cache(state: CrossCatState) -> _ScoreCache:
    """The :class:`_ScoreCache` of a state (O(F C L)); leading batch axes allowed."""
    return _ScoreCache(jnp.sum(state.cat_counts, -1),
                       _nix_pred_params(state.hypers.nix[..., :, None, :], state.real_stats),
                       jnp.full(state.real_stats.shape[:-2], -1, jnp.int32))


def _refresh_real(state, real, idx):
    """``real`` ``[Fr, C, 4]`` with the NIX parameters of clusters ``idx`` ``[Fr, P]`` (-1: none) recomputed
    from ``state.real_stats`` (one batched update of ``Fr x P`` clusters)."""
    fr, C = real.shape[0], real.shape[1]
    p_new = _nix_pred_params(state.hypers.nix[:, None, :],
                             state.real_stats[jnp.arange(fr)[:, None], jnp.maximum(idx, 0)])  # [Fr, P, 4]
    dest = jnp.where(idx >= 0, idx, C)  # -1 -> out of bounds: dropped (equal indices carry equal values)
    return real.at[jnp.arange(fr)[:, None], dest].set(p_new, mode="drop")


def _fresh_cache(state: CrossCatState, cache: _ScoreCache) -> _ScoreCache:
    """``cache`` with its stale NIX cluster (if any) brought up to date (one chain)."""
    if cache.real.shape[0] == 0:
        return cache
    return _ScoreCache(cache.cat_n, _refresh_real(state, cache.real, cache.stale[:, None]),
                       jnp.full_like(cache.stale, -1))


def _cache_after_update(model, state, cache, data, row, kf, sign, *, lazy_real=False):
    """The :class:`_ScoreCache` after :func:`_update_feature_stats` (``state`` is the updated state): only the
    cluster ``kf[f]`` of each feature changes; O(F C) dense work and one batched update of the
    NIX parameters of ``F_r`` clusters (this change and the stale one). ``lazy_real``: mark the changed NIX
    clusters stale instead (the next call, or :func:`_fresh_cache`, updates them)."""
    C = state.sizes.shape[1]
    slots = jnp.arange(C)
    cat_n, real, stale = cache
    if len(model.cat_idx):
        x = data.cat[row]
        k = _static_take(kf, model.cat_idx)
        w = sign * ((x >= 0) & (k >= 0)).astype(jnp.int32)
        cat_n = cat_n + jnp.where(slots[None, :] == k[:, None], w[:, None], 0).astype(cat_n.dtype)
    if len(model.real_idx):
        k = _static_take(kf, model.real_idx)
        changed = (sign != 0) & data.real_obs[row] & (k >= 0)
        k = jnp.where(changed, k, -1).astype(jnp.int32)
        if lazy_real:  # at most one stale cluster per feature: the caller refreshed the previous one
            stale = jnp.where(changed, k, stale)
        else:
            real = _refresh_real(state, real, jnp.stack([stale, k], 1))
            stale = jnp.full_like(stale, -1)
    return _ScoreCache(cat_n, real, stale)


def _cached_view_scores(model, state, cache, cat_row, real_row, real_obs):
    """:func:`_view_scores` from the counts and the :class:`_ScoreCache` (no sum over levels, no ``lgamma``)."""
    V = state.z.shape[0]
    C = state.sizes.shape[1]
    h = state.hypers
    dt = h.row_alpha.dtype
    out = jnp.zeros((V, C), dt)
    if len(model.cat_idx):
        mask = _level_mask(model)
        B = jnp.sum(jnp.where(mask, h.cat_prior, 0.0), -1)
        x0 = jnp.maximum(cat_row, 0)
        c = jnp.take_along_axis(state.cat_counts, x0[:, None, None], 2)[..., 0].astype(dt)
        b = jnp.take_along_axis(h.cat_prior, x0[:, None], 1)
        s = jnp.where((cat_row >= 0)[:, None], jnp.log(b + c) - jnp.log(B[:, None] + cache.cat_n.astype(dt)), 0.0)
        out = out + jax.ops.segment_sum(s, state.view_of[jnp.asarray(model.cat_idx)], V)
    if len(model.real_idx):
        s = _t_logpdf(cache.real, real_row.astype(dt), real_obs).astype(dt)
        out = out + jax.ops.segment_sum(s, state.view_of[jnp.asarray(model.real_idx)], V)
    return out


class _RowWrites(NamedTuple):
    """Pending writes of one row tick to the ``[V, N]`` labels and the ``[N]`` order (applied in order).

    ``z_pos`` ``[2]`` rows (removed, added), ``z_val`` ``[2, V]`` their new label columns;
    ``order_pos`` / ``order_val`` ``[4]``. An inactive move writes back the value it read.
    """

    z_pos: jnp.ndarray
    z_val: jnp.ndarray
    order_pos: jnp.ndarray
    order_val: jnp.ndarray


def _get(x, i):
    return jax.lax.dynamic_slice(x, (jnp.asarray(i, jnp.int32),), (1,))[0]


def _set(x, i, v):
    return jax.lax.dynamic_update_slice(x, jnp.asarray(v, x.dtype)[None], (jnp.asarray(i, jnp.int32),))


def _get_col(z, i):
    return jax.lax.dynamic_slice(z, (jnp.zeros((), jnp.int32), jnp.asarray(i, jnp.int32)), (z.shape[0], 1))[:, 0]


def _apply_row_writes(state: CrossCatState, w: _RowWrites) -> CrossCatState:
    """Apply a tick's pending ``[V, N]``/``[N]`` writes (dynamic-update-slices, in place inside a scan)."""
    z = state.z
    for i in range(w.z_pos.shape[0]):
        z = jax.lax.dynamic_update_slice(z, w.z_val[i][:, None].astype(z.dtype),
                                         (jnp.zeros((), jnp.int32), w.z_pos[i]))
    order = state.order
    for i in range(w.order_pos.shape[0]):
        order = _set(order, w.order_pos[i], w.order_val[i])
    return state._replace(z=z, order=order)


def _noop_row_writes(state: CrossCatState) -> _RowWrites:
    """Writes that change nothing (element 0 written back), for one chain."""
    zero = jnp.zeros((), jnp.int32)
    col = _get_col(state.z, zero)
    return _RowWrites(jnp.zeros((2,), jnp.int32), jnp.stack([col, col]), jnp.zeros((4,), jnp.int32),
                      jnp.full((4,), _get(state.order, zero), jnp.int32))


def _row_plan(u, state: CrossCatState, code, beta, *, model: CrossCatModel, data: CrossCatData, cache=None,
              policy: str = "random"):
    """:func:`row_tick` without its ``[V, N]``/``[N]`` writes: ``(state, writes, overflow, cache)``.

    Every read of ``z`` and ``order`` happens here, before any write; :func:`build_sweep` applies
    ``writes`` at the start of the next scan step, so XLA updates both arrays in place (a read
    scheduled after an in-place write forces a copy of the whole array, O(V N) per tick).
    ``cache``: the state's :class:`_ScoreCache` (default: built here, O(F C L)); the new state's is
    returned (updated at the clusters the tick touched). ``policy="fifo"``: remove the oldest row of the
    window, add the next one of the cycle (``order`` is not written).
    """
    cache = _score_cache(state) if cache is None else cache
    V, n_rows = state.z.shape
    code = jnp.asarray(code, jnp.int32)
    do_rem, do_add, prior_only = (code & 1) > 0, (code & 2) > 0, (code & 4) > 0
    m = state.num_assigned
    h = state.hypers
    nf = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V)
    occ_v = nf > 0
    active = ~state.halted & (code != 0)
    order = state.order
    if policy == "fifo":
        j_r = state.head
    else:
        # the three exact picks in one vectorised op: remove among m, add among n - m or n - m + 1 free rows
        picks = _uniform_index_hl(u[jnp.asarray([0, 2, 2])], u[jnp.asarray([1, 3, 3])],
                                  jnp.stack([m, n_rows - m, n_rows - m + 1]))
        j_r = jnp.clip(picks[0], 0, jnp.maximum(m - 1, 0))
    r = _get(order, j_r)
    k_r = _get_col(state.z, r)
    # overflow is decided before any change (so a halted tick writes nothing; no O(N) revert):
    # an occupied view can seat the added row iff it has an empty slot or the removal empties one
    would_rem = active & do_rem & (m > 0)
    frees = would_rem & (k_r >= 0) & (state.sizes[jnp.arange(V), jnp.maximum(k_r, 0)] == 1)
    can = jnp.any(state.sizes == 0, axis=1) | frees | ~occ_v
    m_after = m - would_rem.astype(jnp.int32)
    overflow = active & do_add & (m_after < n_rows) & ~jnp.all(can)
    active = active & ~overflow
    g_rem = active & do_rem & (m > 0)
    m1 = m - g_rem.astype(jnp.int32)
    g_add = active & do_add & (m1 < n_rows)
    head = state.head
    if policy == "fifo":  # the window slides: no order writes
        head = jnp.where(g_rem, (head + 1) % n_rows, head)
        a = _get(order, (head + m1) % n_rows)
    else:
        # all reads of order (positions as they will be after the removal swap j_r <-> last)
        a, order_pos, order_val = random_churn_reads(order, picks[1:], m, m1, j_r, r, g_rem, g_add)
    a_old = jnp.where(g_rem & (a == r), -1, _get_col(state.z, a))
    # remove: statistics only
    dr = -(g_rem & (k_r >= 0)).astype(jnp.int32)
    sr = -g_rem.astype(jnp.int32)  # per feature: dr[view_of[f]] == sr * (k_r[view_of[f]] >= 0)
    kf_r = k_r[state.view_of]
    st = _update_feature_stats(model, state, data, r, kf_r, sr)
    cache = _cache_after_update(model, st, cache, data, r, kf_r, sr)
    sizes = st.sizes.at[jnp.arange(V), jnp.maximum(k_r, 0)].add(dr)
    # add: eq. (star) in every view at once
    lik = _cached_view_scores(model, st, cache, data.cat[a], data.real[a], data.real_obs[a])
    lik = jnp.where(prior_only, 0.0, lik * beta)
    logits = jax.vmap(_prior_logw)(sizes, h.row_alpha, h.row_d) + lik
    k = jax.vmap(_sample)(bits_to_uniform(u[4:], logits.dtype), logits)
    k = jnp.where(occ_v, k, -1)
    da = (g_add & (k >= 0)).astype(jnp.int32)
    sa = g_add.astype(jnp.int32)
    kf_a = k[state.view_of]
    st = _update_feature_stats(model, st, data, a, kf_a, sa)
    cache = _cache_after_update(model, st, cache, data, a, kf_a, sa, lazy_real=True)
    sizes = sizes.at[jnp.arange(V), jnp.maximum(k, 0)].add(da)
    i32 = lambda *v: jnp.stack([jnp.asarray(x, jnp.int32) for x in v])  # noqa: E731
    z_val = jnp.stack([jnp.where(g_rem, -1, k_r), jnp.where(g_add, k, a_old)]).astype(jnp.int32)
    if policy == "fifo":  # order[j_r] == r: writing it back changes nothing
        writes = _RowWrites(i32(r, a), z_val, i32(j_r, j_r, j_r, j_r), i32(r, r, r, r))
    else:
        writes = _RowWrites(i32(r, a), z_val, order_pos, order_val)
    new = st._replace(sizes=sizes, num_assigned=m1 + g_add.astype(jnp.int32), head=head,
                      cursor=state.cursor + (~(state.halted | overflow)).astype(jnp.int32),
                      since_hyper=state.since_hyper + g_add.astype(jnp.int32), halted=state.halted | overflow)
    return new, writes, overflow, cache


TICK_WORDS = 4  # uint32 words of a row tick before its per-view cluster draws (remove pick 2, add pick 2)


def tick_words(rng_key: PRNGKey, num_views: int) -> jnp.ndarray:
    """The ``[TICK_WORDS + num_views]`` uint32 random words one :func:`row_tick` / :func:`block_tick` consumes."""
    return jax.random.bits(rng_key, (TICK_WORDS + num_views,), jnp.uint32)


def row_tick(u, state: CrossCatState, code, beta, *, model: CrossCatModel, data: CrossCatData,
             policy: str = "random"):
    """One schedule tick on one chain, in every view at once (random policy).

    ``u``: ``[4 + V]`` uint32 random words (:func:`tick_words`): words 0-1 the remove pick, 2-3 the add pick
    (exact uniform integers, :func:`~jaxsub.anneal.moves.uniform_index`), then one cluster draw per view. Remove
    (bit 0) takes a uniform assigned row out of every view; add (bit 1) puts a uniform
    unassigned row into every *occupied* view, drawing its cluster in view ``v`` from
    ``(n_vc - d_v) p(x_v | X_vc)^beta`` / ``(alpha_v + K_v d_v) p(x_v)^beta`` (bit 2: prior only).
    Returns ``(state, overflow)``; O(F x C + V x C) work, independent of N (inside
    :func:`build_sweep` the label/order writes are deferred so that they happen in place).
    ``policy="fifo"`` (a state from ``init(..., policy="fifo")``): remove the oldest row of the window,
    add the next row of the cycle (words 0-3 unused).
    """
    new, writes, overflow, _ = _row_plan(u, state, code, beta, model=model, data=data, policy=policy)
    return _apply_row_writes(new, writes), overflow


def _handful(state: CrossCatState, r, block):
    """``[V, N]`` mask of the handful moved with row ``r``: in each occupied view the first ``min(block, n)``
    members of ``r``'s cluster (size ``n``) in cyclic row order starting at ``r`` (``r`` itself first)."""
    V, n_rows = state.z.shape
    k_r = _get_col(state.z, r)
    cyc = (r + jnp.arange(n_rows, dtype=jnp.int32)) % n_rows
    member = (state.z[:, cyc] == k_r[:, None]) & (k_r >= 0)[:, None]
    take = member & (jnp.cumsum(member, axis=1) <= block)
    return jnp.zeros((V, n_rows), bool).at[:, cyc].set(take), k_r


def _handful_stats(model, state, data, hand):
    """Sufficient statistics of the handful of each feature's view: ``([Fc, L] counts, [Fr, 3] NIX sums)``."""
    cc, rs = None, None
    if len(model.cat_idx):
        ci = jnp.asarray(model.cat_idx)
        x = data.cat.T  # [Fc, N]
        w = (hand[state.view_of[ci]] & (x >= 0)).astype(state.cat_counts.dtype)
        cc = jnp.zeros(state.cat_counts.shape[::2], state.cat_counts.dtype).at[
            jnp.arange(ci.shape[0])[:, None], jnp.maximum(x, 0)].add(w)
    if len(model.real_idx):
        ri = jnp.asarray(model.real_idx)
        x = data.real.T.astype(state.real_stats.dtype)
        w = (hand[state.view_of[ri]] & data.real_obs.T).astype(x.dtype)
        rs = jnp.stack([jnp.sum(w, 1), jnp.sum(w * x, 1), jnp.sum(w * x * x, 1)], -1)
    return cc, rs


def _add_handful(model, state, k_view, cc, rs, sign):
    """Add ``sign`` times the handful's statistics to every feature's cluster ``k_view[view_of[f]]``."""
    cat_counts, real_stats = state.cat_counts, state.real_stats
    if cc is not None:
        ci = jnp.asarray(model.cat_idx)
        k = jnp.maximum(k_view[state.view_of[ci]], 0)
        cat_counts = cat_counts.at[jnp.arange(ci.shape[0]), k].add(sign * cc)
    if rs is not None:
        ri = jnp.asarray(model.real_idx)
        k = jnp.maximum(k_view[state.view_of[ri]], 0)
        real_stats = real_stats.at[jnp.arange(ri.shape[0]), k].add(sign * rs)
    return state._replace(cat_counts=cat_counts, real_stats=real_stats)


def block_tick(u, state: CrossCatState, block, *, model: CrossCatModel, data: CrossCatData):
    """One full-data block Gibbs tick of the paper's *Anneal Stepsize* strategy, in every view at once.

    ``u``: ``[4 + V]`` uint32 words as for :func:`row_tick` (0-1 the row pick, 2-3 unused, one cluster draw per
    view); ``block`` (traced int)
    the handful size. A uniform row ``r`` is picked; in each occupied view ``v`` its handful ``S_v`` is
    the first ``b_v = min(block, n_{v,k})`` members of ``r``'s cluster ``k`` in cyclic row order from
    ``r``; ``S_v`` leaves its cluster and joins one cluster jointly, drawn from::

        existing c:  Gamma(n_c + b_v - d_v) / Gamma(n_c - d_v)       * p(x_{S_v} | X_{vc})
        new:         (alpha_v + K_v d_v) Gamma(b_v - d_v) / Gamma(1 - d_v) * p(x_{S_v})

    (the PY prior of seating ``b_v`` rows together, times their joint collapsed predictive in the view's
    features; ``p(x_S | X) = exp(log Z(X + S) - log Z(X))`` from the conjugate marginals). With
    ``block = 1`` this is exactly the single-row full-data Gibbs tick (posterior invariant). With
    ``block > 1`` the handful depends on the state, so the move is the paper's heuristic (in the
    continuum limit, moving ``1 / beta`` rows at once takes the steps subsample annealing takes at
    inverse temperature ``beta``), not a reversible kernel: :func:`~jaxsub.anneal.anneal_stepsize`
    shrinks the blocks to 1 and its final single-row passes are what reach the posterior. Needs every row
    assigned (otherwise the state is returned unchanged, ``cursor`` advanced); O(V N + F N) work.
    Returns ``(state, overflow)``: a view with no empty slot for a new cluster halts the chain before any change.
    """
    V, n_rows = state.z.shape
    C = state.sizes.shape[1]
    h = state.hypers
    dt = h.row_alpha.dtype
    active = ~state.halted & (state.num_assigned == n_rows)
    r = jnp.clip(uniform_index(u[0:2], n_rows), 0, n_rows - 1)
    hand, k_r = _handful(state, r, block)
    occ_v = k_r >= 0
    bsz = jnp.sum(hand, 1).astype(state.sizes.dtype)
    cc, rs = _handful_stats(model, state, data, hand)
    st = _add_handful(model, state, k_r, cc, rs, -1)
    sizes = state.sizes.at[jnp.arange(V), jnp.maximum(k_r, 0)].add(jnp.where(occ_v, -bsz, 0))
    overflow = active & jnp.any(occ_v & ~jnp.any(sizes == 0, axis=1))
    go = active & ~overflow
    # joint predictive of each view's handful in every slot: log Z(stats_c + S) - log Z(stats_c), per feature
    lik = jnp.zeros((V, C), dt)
    if cc is not None:
        ci = jnp.asarray(model.cat_idx)
        base = _dm_cluster_marginals(model, h.cat_prior, st.cat_counts)
        plus = _dm_cluster_marginals(model, h.cat_prior, st.cat_counts + cc[:, None, :])
        lik = lik + jax.ops.segment_sum(plus - base, st.view_of[ci], V)
    if rs is not None:
        ri = jnp.asarray(model.real_idx)

        def nix_per_cluster(params, stats):  # [C]
            return jax.vmap(lambda s_: mx.nix_log_marginal(params, s_[None, 0], s_[None, 1:]))(stats)

        base = jax.vmap(nix_per_cluster)(h.nix, st.real_stats)
        plus = jax.vmap(nix_per_cluster)(h.nix, st.real_stats + rs[:, None, :])
        lik = lik + jax.ops.segment_sum(plus - base, st.view_of[ri], V)
    occ = sizes > 0
    b = bsz.astype(dt)[:, None]
    d = h.row_d[:, None]
    first = _first_true(~occ, axis=1)[:, None]
    k_occ = jnp.sum(occ, 1).astype(dt)[:, None]
    nc = jnp.where(occ, sizes.astype(dt), 1.0)
    prior = jnp.where(occ, gammaln(nc + b - d) - gammaln(nc - d),
                      jnp.where(jnp.arange(C)[None, :] == first,
                                jnp.log(h.row_alpha[:, None] + k_occ * d) + gammaln(b - d) - gammaln(1.0 - d), -jnp.inf))
    k_new = jax.vmap(_sample)(bits_to_uniform(u[4:], dt), prior + lik)
    k_new = jnp.where(occ_v, k_new, -1)
    st = _add_handful(model, st, k_new, cc, rs, 1)
    sizes = sizes.at[jnp.arange(V), jnp.maximum(k_new, 0)].add(jnp.where(occ_v, bsz, 0))
    moved = st._replace(sizes=sizes, z=jnp.where(hand, k_new[:, None], state.z))
    new = jax.tree.map(lambda a, b_: jnp.where(go, a, b_), moved, state)
    new = new._replace(cursor=state.cursor + (~(state.halted | overflow)).astype(jnp.int32),
                       since_hyper=state.since_hyper + go.astype(jnp.int32), halted=state.halted | overflow)
    return new, overflow


# --------------------------------------------------------------------------- feature moves
def _draw_partitions(key, order, num_assigned, alpha, d, capacity, trip=None):
    """Independent PY(alpha[i], d[i]) partitions of the assigned rows ``order[:num_assigned]``, one per entry of
    ``alpha`` ``[P]``: ``(z [P, N], sizes [P, C], ok [P])`` (``ok`` False: a partition ran out of slots).

    Sequential seating in ``order`` (the PY prior's predictive rule), all ``P`` partitions in one loop
    over the subsample only: ``trip`` (default ``num_assigned``, any bound ``>= num_assigned``) steps of
    O(P) work each. Under ``vmap`` over chains pass an unbatched ``trip`` (the largest subsample) so
    the loop's condition is not batched (a batched ``while_loop`` selects its whole ``[P, N]`` carry
    on every step).

    Row ``i`` (``K`` tables so far) opens table ``K`` (the first empty slot) with probability
    ``(alpha + K d) / (i + alpha)``, else joins table ``k`` with probability ``(n_k - d) / (i - K d)``,
    drawn in O(1) without scanning the slots: ``n_k - d = (n_k - 1) + (1 - d)``, so with probability
    ``(i - K) / (i - K d)`` it copies the table of a uniform row among the ``i - K`` earlier rows that
    joined an existing table (each table ``k`` holds ``n_k - 1`` of them), else it picks a uniform table.
    """
    n = order.shape[0]
    num = alpha.shape[0]
    trip = num_assigned if trip is None else trip
    dt = alpha.dtype
    pidx = jnp.arange(num)
    block = min(32, n)  # random words drawn per block of rows (one threefry call, not one per row)

    def body(i, ws, carry):
        u, w = bits_to_uniform(ws[:, :2], dt), ws[:, 2:]
        lab, joined, sizes, tables, bad = carry
        fi, ft = i.astype(dt), tables.astype(dt)
        new = u[:, 0] * (fi + alpha) < alpha + ft * d
        n_join = i - tables  # earlier rows that joined an existing table
        from_join = u[:, 1] * (fi - ft * d) < n_join.astype(dt)
        pos = jnp.minimum(uniform_index(w, n_join), jnp.maximum(n_join - 1, 0))  # exact integer draws
        copied = joined[pidx, pos]
        uniform_table = jnp.minimum(uniform_index(w, tables), jnp.maximum(tables - 1, 0))
        k = jnp.where(new, tables, jnp.where(from_join, copied, uniform_table))
        on = i < num_assigned
        full = new & (tables >= capacity)
        g = on & ~full & ~bad
        k = jnp.where(g, k, -1)
        lab = jax.lax.dynamic_update_slice(lab, k[:, None], (jnp.zeros((), jnp.int32), i))  # lab has `block` spare columns
        joined = joined.at[pidx, jnp.where(g & ~new, n_join, n)].set(k, mode="drop")
        sizes = sizes.at[pidx, jnp.where(g, k, capacity)].add(1, mode="drop")
        return lab, joined, sizes, tables + (g & new).astype(jnp.int32), bad | (on & full)

    def chunk(c, carry):
        ws = jax.random.bits(jax.random.fold_in(key, c), (block, num, 4), jnp.uint32)
        return jax.lax.fori_loop(0, block, lambda j, cr: body(c * block + j, ws[j], cr), carry)

    init = (jnp.full((num, n + block), -1, jnp.int32), jnp.zeros((num, n), jnp.int32),
            jnp.zeros((num, capacity), jnp.int32), jnp.zeros((num,), jnp.int32), jnp.zeros((num,), bool))
    lab, _, sizes, _, bad = jax.lax.fori_loop(0, (trip + block - 1) // block, chunk, init)
    lab = lab[:, :n]
    return jnp.full((num, n), -1, jnp.int32).at[:, order].set(lab), sizes, ~bad


def _draw_crp_partitions(key, order, num_assigned, alpha, capacity):
    """:func:`_draw_partitions` for discount 0 (CRP), without a loop over the rows: ``(z [P, N], sizes [P, C], ok [P])``.

    Row ``i`` of the subsample (in ``order``) opens a new table with probability ``alpha / (i + alpha)``
    (independently of the other rows when ``d = 0``), else it joins the table of a uniform earlier row
    (table ``k`` with probability ``n_k / (i + alpha)``: the CRP's predictive rule). The rows and their
    "earlier row" pointers form a forest whose roots are the table openers; each row's root is found by
    pointer doubling (until no pointer moves), its table is the number of openers up to the root.
    The same law as the sequential seating, O(P N log N) work in a few kernels instead of N loop steps.
    """
    n = order.shape[0]
    num = alpha.shape[0]
    dt = alpha.dtype
    ws = jax.random.bits(key, (num, n, 3), jnp.uint32)
    u = bits_to_uniform(ws[..., 0], dt)
    i = jnp.arange(n, dtype=jnp.int32)
    new = (u * (i.astype(dt) + alpha[:, None]) < alpha[:, None]) | (i == 0)
    # exact integer draw: floor(u * i) from a float32 uniform is visibly non-uniform for i ~ 1e5 (2^23 grid points)
    parent = jnp.minimum(uniform_index(ws[..., 1:], i), jnp.maximum(i - 1, 0))
    ptr = jnp.where(new, i, parent)

    def double(c):
        p, _ = c
        q = jnp.take_along_axis(p, p, axis=1)
        return q, jnp.any(q != p)

    # until every pointer is a root (depth of a random recursive tree: O(log N) w.h.p., so ~log2 log N rounds)
    ptr, _ = jax.lax.while_loop(lambda c: c[1], double, (ptr, jnp.asarray(True)))
    opened = jax.lax.associative_scan(jnp.add, new.astype(jnp.int32), axis=1)  # tables opened among rows 0..i
    on = i < num_assigned
    lab = jnp.take_along_axis(opened, ptr, axis=1) - 1
    ok = jnp.max(jnp.where(on, opened, 0), axis=1) <= capacity
    lab = jnp.where(on & (lab < capacity), lab, -1)
    sizes = jnp.zeros((num, capacity), jnp.int32).at[jnp.arange(num)[:, None], jnp.where(lab >= 0, lab, capacity)].add(
        1, mode="drop")
    return jnp.full((num, n), -1, jnp.int32).at[:, order].set(lab), sizes, ok


def _prior_partition(key, state, alpha, d):
    """A PY(alpha, d) partition of the assigned rows (sequential seating in ``order``): ``(z [N], sizes [C], ok)``."""
    z, sizes, ok = _draw_partitions(key, _window_rows(state), state.num_assigned, jnp.reshape(alpha, (1,)),
                                    jnp.reshape(d, (1,)), state.sizes.shape[1])
    return z[0], sizes[0], ok[0]


def _stats_of_feature_under(model, state, data, f_kind, j, zrows, levels=None):
    """Stats of categorical (``f_kind = 0``, index ``j`` among cat features) or real feature under ``zrows`` ``[K, N]``.

    ``levels`` (static): the categorical counts cover levels ``0..levels-1`` only (default ``model.max_levels``;
    any bound on the feature's number of levels)."""
    n = zrows.shape[1]
    pos = (jnp.arange(n, dtype=jnp.int32) - state.head) % n  # window position of order[p]
    on = jnp.zeros(n, bool).at[state.order].set(pos < state.num_assigned)
    C = state.sizes.shape[1]
    if f_kind == 0:
        x = data.cat[:, j]

        L = model.max_levels if levels is None else levels

        def one(zz):  # scatter-add of the observed cells into [C, L] (O(N), not O(N L))
            w = (on & (x >= 0) & (zz >= 0)).astype(jnp.int32)
            flat = jnp.where(w > 0, zz * L + jnp.maximum(x, 0), C * L)
            return jnp.zeros((C * L + 1,), jnp.int32).at[flat].add(w)[: C * L].reshape(C, L)
    else:
        x, ob = data.real[:, j], data.real_obs[:, j]

        def one(zz):
            w = (on & ob & (zz >= 0)).astype(x.dtype)
            st = jnp.stack([w, w * x, w * x * x], -1)
            return jax.ops.segment_sum(st, jnp.where(w > 0, zz, C), C + 1)[:C]
    return jax.vmap(one)(zrows)


def _marg_of(model, state, f_kind, j, stats):
    """Log marginal of feature ``j`` for stacked stats ``[K, C, ...]`` -> ``[K]`` (categorical: the levels of
    ``stats``, see :func:`_stats_of_feature_under`)."""
    h = state.hypers
    if f_kind == 0:
        L = stats.shape[-1]
        mask = _level_mask(model)[j][None, :L]
        return jax.vmap(lambda c: _dm_marginal(model, h.cat_prior[j][None, :L], c[None], mask)[0])(stats)
    return jax.vmap(lambda s: _nix_marginal(h.nix[j], s))(stats)


def _set_feature(state, f, f_kind, j, w, stats_w):
    view_of = state.view_of.at[f].set(w)
    if f_kind == 0:  # stats_w may cover the first levels only (the rest of the feature's counts are zero)
        return state._replace(view_of=view_of, cat_counts=state.cat_counts.at[j, :, : stats_w.shape[-1]].set(stats_w))
    return state._replace(view_of=view_of, real_stats=state.real_stats.at[j].set(stats_w.astype(state.real_stats.dtype)))


def _clear_empty_views(model, state, init_h):
    """Unoccupied views hold no rows; their row hypers return to the model's values."""
    V = state.z.shape[0]
    nf = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V)
    occ = nf > 0
    h = state.hypers._replace(row_alpha=jnp.where(occ, state.hypers.row_alpha, init_h.row_alpha),
                              row_d=jnp.where(occ, state.hypers.row_d, init_h.row_d))
    return state._replace(z=jnp.where(occ[:, None], state.z, -1), sizes=jnp.where(occ[:, None], state.sizes, 0),
                          hypers=h)


def _kind_index(model, f):
    """``f`` as (kind, index within kind, feature id, levels): static ``f``, ``(kind, traced j)`` or
    ``(kind, traced j, levels)`` with a static bound ``levels`` on a categorical feature's number of levels
    (its statistics are computed over those levels only; default ``model.max_levels``)."""
    if isinstance(f, tuple):
        kind, j = f[0], f[1]
        levels = f[2] if len(f) > 2 else None
        ids = model.cat_idx if kind == 0 else model.real_idx
        return kind, j, jnp.asarray(ids, jnp.int32)[j], levels
    kind = 0 if f in model.cat_idx else 1
    levels = model.features[f].num_levels if kind == 0 else None
    return kind, (model.cat_idx.index(f) if kind == 0 else model.real_idx.index(f)), f, levels


def feature_gibbs(rng_key: PRNGKey, state: CrossCatState, f, *, model: CrossCatModel, data: CrossCatData,
                  num_aux: int = 1, fresh=None, noise=None):
    """Neal's Algorithm 8 over views for feature ``f`` (a column index, or ``(kind, j)`` with ``j`` traced:
    the ``j``-th categorical (kind 0) or real (kind 1) feature). Returns ``(state, ok)``.

    ``ok`` is False when an auxiliary partition ran out of cluster slots (then the state is unchanged).
    ``fresh``: optional pre-drawn auxiliary partitions ``(z [num_aux, N], sizes [num_aux, C], ok [num_aux])``
    of the current subsample, independent of ``state`` and drawn from the PY prior of the auxiliary
    slots' row hyperparameters (:func:`feature_sweep` draws them for all features in one loop);
    default: drawn here with ``rng_key``. ``noise``: optional pre-drawn standard Gumbel ``[V]`` for the view
    draw (:func:`feature_sweep` draws all features' noise in one call; default: from ``rng_key``).
    """
    V = state.z.shape[0]
    h = state.hypers
    f_kind, j, f, levels = _kind_index(model, f)
    v0 = state.view_of[f]
    nf = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V) - jax.nn.one_hot(v0, V, dtype=jnp.int32)
    singleton = nf[v0] == 0
    slots = jnp.arange(V)
    empty = nf == 0
    rank = jnp.where(empty, jnp.where((slots == v0) & singleton, -1, slots), V + slots)
    aux = jnp.argsort(rank)[:num_aux]  # first num_aux empty slots, the singleton's own view first
    keys = jax.random.split(rng_key, 2)
    if fresh is None:
        fresh = _draw_partitions(keys[1], _window_rows(state), state.num_assigned, h.row_alpha[aux], h.row_d[aux],
                                 state.sizes.shape[1])
    keep_own = (aux == v0) & singleton
    aux_z = jnp.where(keep_own[:, None], state.z[aux], fresh[0])
    aux_sizes = jnp.where(keep_own[:, None], state.sizes[aux], fresh[1])
    ok = jnp.all(fresh[2] | keep_own)
    z_c = state.z.at[aux].set(aux_z)
    sizes_c = state.sizes.at[aux].set(aux_sizes)
    stats = _stats_of_feature_under(model, state, data, f_kind, j, z_c, levels)
    marg = _marg_of(model, state, f_kind, j, stats)
    K = jnp.sum(nf > 0).astype(h.view_alpha.dtype)
    is_aux = jnp.zeros((V,), bool).at[aux].set(True)
    logw = jnp.where(nf > 0, jnp.log(jnp.maximum(nf.astype(marg.dtype) - h.view_d, 1e-30)),
                     jnp.where(is_aux, jnp.log(h.view_alpha + K * h.view_d) - math.log(num_aux), -jnp.inf))
    if noise is None:
        noise = jax.random.gumbel(keys[0], (V,), marg.dtype)
    w = jnp.argmax(logw + marg + noise).astype(jnp.int32)  # Gumbel-max: a categorical draw
    new = state._replace(z=jnp.where((slots == w)[:, None], z_c, state.z),
                         sizes=jnp.where((slots == w)[:, None], sizes_c, state.sizes))
    new = _set_feature(new, f, f_kind, j, w, stats[w])
    new = _clear_empty_views(model, new, init_hypers(model, V, h.row_alpha.dtype))
    return jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, state), ok


def _new_view_proposal(rng_key, state, f, *, model, data, fresh=None, noise=None):
    """The MH proposal of :func:`new_view_mh` for feature ``f``: ``(proposed_state, log_accept, ok)``.

    ``fresh``: optional pre-drawn ``(z [N], sizes [C], ok, alpha_q, d_q)``, a PY(alpha_q, d_q) partition of the
    subsample independent of ``state``; where ``(alpha_q, d_q)`` differ from the target slot's row
    hyperparameters the acceptance carries the ratio of the two EPPFs (exact for split and refresh).
    ``noise``: optional pre-drawn ``(u_move, gumbel [V])`` (refresh-or-merge coin, merge-target draw).
    """
    V = state.z.shape[0]
    h = state.hypers
    f_kind, j, f, levels = _kind_index(model, f)
    k_move, k_part, k_tgt = jax.random.split(rng_key, 3)
    if noise is None:
        noise = (jax.random.uniform(k_move), jax.random.gumbel(k_tgt, (V,)))
    u_move, gumbel = noise
    v0 = state.view_of[f]
    nf_all = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V)
    K = jnp.sum(nf_all > 0)
    n0 = nf_all[v0]
    singleton = n0 == 1
    slots = jnp.arange(V)
    # target slot for split / refresh: a free slot (split) or the feature's own view (refresh)
    free_slot = jnp.argmax(nf_all == 0)
    refresh = singleton & (u_move < 0.5)
    merge = singleton & ~refresh & (K > 1)
    split = ~singleton
    s = jnp.where(split, free_slot, v0)
    if fresh is None:
        zp, sp, ok = _prior_partition(k_part, state, h.row_alpha[s], h.row_d[s])
        a_q, d_q = h.row_alpha[s], h.row_d[s]
    else:
        zp, sp, ok, a_q, d_q = fresh
    # merge target: uniform among the other occupied views
    others = (nf_all > 0) & (slots != v0)
    wt = jnp.argmax(jnp.where(others, gumbel, -jnp.inf)).astype(jnp.int32)  # uniform among the others
    tgt = jnp.where(merge, wt, s)
    z_t = jnp.where(merge, state.z[wt], zp)
    stats = _stats_of_feature_under(model, state, data, f_kind, j, jnp.stack([state.z[v0], z_t]), levels)
    marg = _marg_of(model, state, f_kind, j, stats)
    dt = marg.dtype
    a, d = h.view_alpha, h.view_d
    Kf = K.astype(dt)
    lr_split = jnp.log(a + Kf * d) - jnp.log(n0.astype(dt) - 1.0 - d) - jnp.log(2.0 * Kf)
    n_w = nf_all[wt].astype(dt)
    lr_merge = jnp.log(n_w - d) - jnp.log(a + (Kf - 1.0) * d) + jnp.log(2.0 * jnp.maximum(Kf - 1.0, 1.0))
    # proposal density vs prior of the proposed partition (and, for refresh, of the one it replaces): both
    # PY EPPFs of the subsample; they cancel (zero here) when the draw used the slot's own (alpha, d)
    a_s, d_s = h.row_alpha[s], h.row_d[s]
    corr_new = _eppf(sp, a_s, d_s) - _eppf(sp, a_q, d_q)
    corr_old = _eppf(state.sizes[v0], a_q, d_q) - _eppf(state.sizes[v0], a_s, d_s)
    corr = jnp.where(split, corr_new, jnp.where(refresh, corr_new + corr_old, 0.0))
    log_acc = marg[1] - marg[0] + jnp.where(split, lr_split, jnp.where(merge, lr_merge, 0.0)) + corr
    new = state._replace(z=jnp.where(((slots == tgt) & ~merge)[:, None], z_t, state.z),
                         sizes=jnp.where(((slots == tgt) & ~merge)[:, None], sp, state.sizes))
    new = _set_feature(new, f, f_kind, j, tgt, stats[1])
    new = _clear_empty_views(model, new, init_hypers(model, V, h.row_alpha.dtype))
    valid = ok & (split | refresh | merge)
    return new, log_acc, valid


def new_view_mh(rng_key: PRNGKey, state: CrossCatState, f, *, model: CrossCatModel, data: CrossCatData,
                fresh=None, noise=None):
    """One Metropolis-Hastings step proposing a new feature set (view) for feature ``f``; ``(state, accepted)``.

    ``fresh``: optional pre-drawn proposal partition ``(z [N], sizes [C], ok, alpha_q, d_q)`` (see
    :func:`_new_view_proposal`); default: drawn here from the target slot's PY prior. ``noise``: optional
    pre-drawn ``(u_move, u_accept, gumbel [V])`` (default: from ``rng_key``).
    """
    k_prop, k_acc = jax.random.split(rng_key)
    if noise is None:
        prop_noise, u_acc = None, jax.random.uniform(k_acc)
    else:
        prop_noise, u_acc = (noise[0], noise[2]), noise[1]
    prop, log_acc, valid = _new_view_proposal(k_prop, state, f, model=model, data=data, fresh=fresh, noise=prop_noise)
    acc = valid & (jnp.log(u_acc) < log_acc)
    return jax.tree.map(lambda a, b: jnp.where(acc, a, b), prop, state), acc


# --------------------------------------------------------------------------- hyperparameters
@dataclass(frozen=True)
class CrossCatGrids:
    """Grids (uniform priors) for :func:`resample_hypers`; ``None`` keeps a hyperparameter fixed."""

    view_alpha: tuple | None = None
    view_d: tuple | None = None
    row_alpha: tuple | None = None
    row_d: tuple | None = None
    dirichlet: tuple | None = None
    nix_mu0: tuple | None = None
    nix_kappa0: tuple | None = None
    nix_nu0: tuple | None = None
    nix_sigma2: tuple | None = None
    # optional log prior weights of the NIX grid points (mu0, kappa0, nu0, sigma2): four tuples, each as long as its
    # grid or None (uniform over the points); see :func:`data_grids`
    nix_logprior: tuple | None = None

    def __post_init__(self):
        lw = self.nix_logprior
        if lw is not None:
            grids = (self.nix_mu0, self.nix_kappa0, self.nix_nu0, self.nix_sigma2)
            if not isinstance(lw, (tuple, list)) or len(lw) != 4:
                raise ValueError(f"nix_logprior must be four tuples (or None) for mu0, kappa0, nu0, sigma2; got {lw!r}")
            out = []
            for w, g, nm in zip(lw, grids, ("mu0", "kappa0", "nu0", "sigma2")):
                if w is None:
                    out.append(None)
                    continue
                v = np.atleast_1d(np.asarray(w, np.float64))
                if g is None or v.shape != (len(g),) or not np.all(np.isfinite(v)):
                    raise ValueError(f"nix_logprior for {nm} must hold one finite weight per point of grid nix_{nm}")
                out.append(tuple(float(x) for x in v))
            object.__setattr__(self, "nix_logprior", tuple(out))
        for name in self.__dataclass_fields__:
            g = getattr(self, name)
            if g is None or name == "nix_logprior":
                continue
            v = np.atleast_1d(np.asarray(g, np.float64))
            if v.ndim != 1 or v.size == 0 or not np.all(np.isfinite(v)):
                raise ValueError(f"grid {name} must be a non-empty 1-D sequence of finite numbers; got {g!r}")
            lo_ok = (v >= 0) & (v < 1) if name.endswith("_d") else (v > 0 if name != "nix_mu0" else np.ones_like(v, bool))
            if not np.all(lo_ok):
                raise ValueError(f"grid {name} has values outside its range; got {g!r}")
            object.__setattr__(self, name, tuple(float(x) for x in v))


def default_crosscat_grids(model: CrossCatModel, num: int = 12) -> CrossCatGrids:
    """Log-spaced grids: alphas ``[0.1, 30]``, discounts ``0..0.6`` (PY only), Dirichlet ``[0.05, 10]``, NIX."""
    has_real = bool(model.real_idx)
    return CrossCatGrids(
        view_alpha=tuple(np.logspace(-1, 1.5, num)),
        view_d=tuple(np.linspace(0, 0.6, 7)) if isinstance(model.view_prior, PitmanYor) else None,
        row_alpha=tuple(np.logspace(-1, 1.5, num)),
        row_d=tuple(np.linspace(0, 0.6, 7)) if isinstance(model.row_prior, PitmanYor) else None,
        dirichlet=tuple(np.logspace(np.log10(0.05), 1, num)) if model.cat_idx else None,
        nix_mu0=tuple(np.linspace(-2, 2, num)) if has_real else None,
        nix_kappa0=tuple(np.logspace(-2, 1, num)) if has_real else None,
        nix_nu0=tuple(np.logspace(-0.5, 1.5, num)) if has_real else None,
        nix_sigma2=tuple(np.logspace(-2, 1, num)) if has_real else None,
    )


def data_grids(model: CrossCatModel, data, num: int = 12, style: str = "quantiles", *,
               sigma2_weight: bool = True) -> CrossCatGrids:
    """:func:`default_crosscat_grids` with the NIX grids set from the data, as pylace (lace) sets its NIX
    hyperprior from each column (``NixHyper::from_data``: ``mu0 ~ N(mean, sd)``, ``kappa0 ~ Gamma(1, 1)``,
    ``nu0 ~ InvGamma(log n, log n)``, ``sigma2 ~ InvGamma(log n, var)``, ``n`` the column's observed cells).

    ``style="quantiles"``: each NIX grid holds the ``(i + 1/2) / num`` quantiles of that hyperprior, so the grid
    Gibbs of :func:`resample_hypers` (uniform over the points) samples a discretisation of lace's hyperprior instead of the
    default's log-uniform ranges (``kappa0`` down to 0.01, ``sigma2`` up to 10, which make a new cluster's prior
    predictive wide and favour few clusters on a small subsample); its support is the hyperprior's central
    ``1 - 1/num`` mass, so it also truncates it. ``style="weights"``: the default grids' ranges, centred (``mu0``:
    ``mean + sd * [-2, 2]``) and scaled (``sigma2``: ``var * [0.01, 10]``) on the data, each point weighted by the
    hyperprior's log density (times the point for the log-spaced grids: a density in the log scale) in
    ``nix_logprior`` (no truncation beyond the ranges). ``sigma2_weight=False`` (``style="weights"`` only) keeps
    the ``mu0``, ``kappa0`` and ``nu0`` weights and leaves the ``sigma2`` points unweighted (log-uniform over
    ``var * [0.01, 10]``, as the default's): lace's ``sigma2`` prior (mode ``var / (log n + 1)``) gives the tight
    clusters of nearly discrete reals (``sigma2`` ~0.01-0.03 var) weights of -10 to -75 nats. A modelling choice
    (it changes the target posterior), opt-in. Measured against the default grids (paired keys, docs/anneal.md,
    sessions 14-15): ``style="weights"`` +0.19 nats per held-out row at 1N and -2.33 at 30N on the flights subset;
    with ``sigma2_weight=False`` +0.16 / -0.44 there and +0.16 / +0.97 / +2.78 / +1.14 at 1 / 3 / 10 / 30N on the
    hfi subset (session 14's keys); on keys 100-109 (session 15) +0.22 / +0.42 / +0.36 / +0.66 on hfi and +0.07 /
    -0.01 / +0.33 / +0.23 on flights (each within 2 se): not the default. The grids are shared by every real column (a tuple per parameter), so the columns must share their
    centre and scale: pass standardised reals (``mean`` / ``var`` are pooled over the real columns). Other grids
    are the default's.

    Args:
        model: the :class:`CrossCatModel` (a model without real features gets the default grids).
        data: the training rows, ``[N, F]`` (NaN = missing), real columns standardised.
        num: points per grid, ``>= 2``.
        style: ``"quantiles"`` or ``"weights"`` (above).
        sigma2_weight: ``style="weights"`` only: weight the ``sigma2`` points by lace's ``sigma2`` hyperprior
            (``True``, the default) or leave them unweighted (``False``: ``nix_logprior[3]`` is ``None``).

    Returns:
        :class:`CrossCatGrids`.

    Raises:
        ValueError: for a table the model rejects, an unknown ``style``, ``num < 2``, a ``sigma2_weight`` that is
            not a bool, ``sigma2_weight=False`` with ``style="quantiles"`` (its ``sigma2`` grid *is* the
            hyperprior's quantiles: there is no weight to drop), a real column with fewer than 2 observed cells
            or a constant one, or real columns whose means differ by more than 0.5 pooled sd or whose variances
            differ by more than a factor of 4 (standardise them first).
    """
    from scipy import stats

    num = check_int("num", num, low=2)
    if style not in ("quantiles", "weights"):
        raise ValueError(f"style must be 'quantiles' or 'weights'; got {style!r}")
    if not isinstance(sigma2_weight, (bool, np.bool_)):
        raise ValueError(f"sigma2_weight must be a bool; got {sigma2_weight!r}")
    if not sigma2_weight and style != "weights":
        raise ValueError("sigma2_weight=False needs style='weights' (the 'quantiles' grids carry no weights)")
    base = default_crosscat_grids(model, num)
    if not model.real_idx:
        return base
    enc = encode_table(model, data, jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
    real, obs = np.asarray(enc.real, np.float64), np.asarray(enc.real_obs)
    means = np.array([real[obs[:, j], j].mean() for j in range(real.shape[1])])
    vars_ = np.array([real[obs[:, j], j].var() for j in range(real.shape[1])])
    n = int(obs.sum(0).min())
    if n < 2 or np.any(vars_ <= 0):
        raise ValueError("data_grids needs at least 2 observed, not all equal, cells in every real column")
    m, v = float(np.sum(real[obs]) / obs.sum()), float(np.mean(vars_))
    if np.ptp(means) > 0.5 * math.sqrt(v) or vars_.max() > 4 * vars_.min():
        raise ValueError(f"data_grids shares one NIX grid across the real columns: their means ({means.round(3)}) and "
                         f"variances ({vars_.round(3)}) must agree; standardise the real columns first")
    a = max(math.log(n), 1.01)
    pm, pk, pnu, ps2 = (stats.norm(m, math.sqrt(v)), stats.gamma(1.0), stats.invgamma(a, scale=a),
                        stats.invgamma(a, scale=v))
    if style == "weights":
        g_m = m + math.sqrt(v) * np.linspace(-2, 2, num)
        g_k, g_nu, g_s2 = np.asarray(base.nix_kappa0), np.asarray(base.nix_nu0), v * np.asarray(base.nix_sigma2)
        lw = (pm.logpdf(g_m), pk.logpdf(g_k) + np.log(g_k), pnu.logpdf(g_nu) + np.log(g_nu),
              ps2.logpdf(g_s2) + np.log(g_s2))
        lw = tuple(tuple(np.maximum(w - w.max(), -200.0)) for w in lw)  # finite: a point far out keeps weight e^-200
        if not sigma2_weight:
            lw = lw[:3] + (None,)  # sigma2: uniform over its (log-spaced) points
        return dataclasses.replace(base, nix_mu0=tuple(g_m), nix_kappa0=tuple(g_k), nix_nu0=tuple(g_nu),
                                   nix_sigma2=tuple(g_s2), nix_logprior=lw)
    q = (np.arange(num) + 0.5) / num
    return dataclasses.replace(
        base, nix_mu0=tuple(pm.ppf(q)), nix_kappa0=tuple(pk.ppf(q)), nix_nu0=tuple(pnu.ppf(q)),
        nix_sigma2=tuple(ps2.ppf(q)))


_HYPER_WIDTHS = (8, 16, 32)  # cluster widths of resample_hypers' Dirichlet loop below the capacity (static config)


def _occupied_bound(model: CrossCatModel, state: CrossCatState) -> jnp.ndarray:
    """``[2]`` int32: the most clusters holding cells of any categorical (0) / real (1) feature, over every
    feature and every leading batch axis (chain) of ``state``: :func:`resample_hypers`' ``occupied``."""
    out = []
    for idx, occ in ((model.cat_idx, lambda: jnp.sum(state.cat_counts, -1) > 0),
                     (model.real_idx, lambda: state.real_stats[..., 0] > 0)):
        out.append(jnp.max(jnp.sum(occ(), -1)).astype(jnp.int32) if len(idx) else jnp.zeros((), jnp.int32))
    return jnp.stack(out)


def resample_hypers(rng_key: PRNGKey, state: CrossCatState, *, model: CrossCatModel, grids: CrossCatGrids,
                    occupied=None):
    """Grid Gibbs of all hyperparameters given the partitions (cost independent of N).

    The Dirichlet and NIX grid conditionals run on the largest ``width`` cluster slots of each feature, the
    smallest of ``_HYPER_WIDTHS`` (or the capacity) that holds every feature's occupied clusters (a
    ``lax.switch``). ``occupied`` (optional ``[2]`` int, :func:`_occupied_bound`): an upper bound on the
    occupied clusters of any categorical / real feature used to pick that width instead of this state's own
    count (same conditionals and draws at any width that holds them). Under ``vmap`` pass one bound for all
    chains (``in_axes=None``): a batched switch index runs *every* width's branch for every chain
    (measured: 4 vmapped chains' hyper steps cost ~20x one chain's, session 13 in docs/anneal.md).
    """
    h = state.hypers
    dt = h.row_alpha.dtype
    V = state.z.shape[0]
    keys = iter(jax.random.split(rng_key, 8))
    nf = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V)
    occ = nf > 0
    va, vd = h.view_alpha, h.view_d
    draw = lambda k, g, lp: g[jax.random.categorical(k, lp, axis=-1)]  # noqa: E731
    if grids.view_alpha is not None:
        g = jnp.asarray(grids.view_alpha, dt)
        va = draw(next(keys), g, _eppf(nf, g, vd))
    if grids.view_d is not None:
        g = jnp.asarray(grids.view_d, dt)
        vd = draw(next(keys), g, _eppf(nf, va, g))
    ra, rd = h.row_alpha, h.row_d
    if grids.row_alpha is not None:
        g = jnp.asarray(grids.row_alpha, dt)
        lp = jax.vmap(lambda s, d: _eppf(s, g, d))(state.sizes, rd)
        ra = jnp.where(occ, draw(next(keys), g, lp), ra)
    if grids.row_d is not None:
        g = jnp.asarray(grids.row_d, dt)
        lp = jax.vmap(lambda s, a: _eppf(s, a, g))(state.sizes, ra)
        rd = jnp.where(occ, draw(next(keys), g, lp), rd)
    cp = h.cat_prior
    if grids.dirichlet is not None and len(model.cat_idx):
        g = jnp.asarray(grids.dirichlet, dt)
        mask = _level_mask(model)
        k_dir = next(keys)

        counts = state.cat_counts.astype(dt)  # [Fc, C, L]
        n_c = jnp.sum(counts, -1)  # [Fc, C] observed cells per cluster

        # the real (feature, level) pairs only (padding levels of short features are skipped): each draws its
        # pseudo-count from its grid conditional given the others (Gibbs, in a fixed order)
        pf = np.asarray([j for j, i in enumerate(model.cat_idx) for _ in range(model.features[i].num_levels)], np.int32)
        pl = np.asarray([lv for i in model.cat_idx for lv in range(model.features[i].num_levels)], np.int32)
        pf_j, pl_j = jnp.asarray(pf), jnp.asarray(pl)
        gumbels = jax.random.gumbel(k_dir, (pf.size, g.shape[0]), dt)  # one call for every pair
        lg_g = gammaln(g)
        # only the clusters holding cells of a feature enter its conditionals (an empty slot's terms are 0): the
        # slots are sorted by size per feature and the loop runs on the first `width` of them, the smallest of
        # _HYPER_WIDTHS (or all C) that holds every feature's occupied clusters (same conditionals, and a
        # fraction of the O(C G) lgammas per pair when few clusters are occupied, e.g. early in an anneal)
        by_size = jnp.argsort(-n_c, axis=1)  # [Fc, C]
        counts_s = jnp.take_along_axis(counts, by_size[:, :, None], axis=1)
        n_s = jnp.take_along_axis(n_c, by_size, axis=1)
        C = counts.shape[1]
        widths = [w for w in _HYPER_WIDTHS if w < C] + [C]

        def at_width(width):
            cw, nw = counts_s[:, :width], n_s[:, :width]

            def level(i, cp):
                # log p(X | beta_fl = g) up to terms free of beta_fl: with B_rest the sum of the feature's other
                # levels, sum_c [lgamma(B_rest + g) - lgamma(B_rest + g + n_c) + lgamma(g + c_cl) - lgamma(g)]
                # (the Dirichlet-multinomial marginal of _dm_marginal; O(width G) per pair)
                f, lvl = pf_j[i], pl_j[i]
                row = cp[f]  # [L]
                col = row[lvl]
                b_rest = jnp.sum(jnp.where(mask[f], row, 0.0)) - col
                n_f = nw[f]  # [width]
                c_l = cw[f, :, lvl]  # [width]
                bg = b_rest + g  # [G]
                lp = (jnp.sum(gammaln(bg[:, None]) - gammaln(bg[:, None] + n_f[None, :]), -1)
                      + jnp.sum(gammaln(g[:, None] + c_l[None, :]) - lg_g[:, None], -1))  # [G]
                return cp.at[f, lvl].set(g[jnp.argmax(lp + gumbels[i])])  # Gumbel-max draw from the grid conditional

            return lambda cp: jax.lax.fori_loop(0, pf.size, level, cp)

        if len(widths) == 1:
            cp = at_width(C)(cp)
        else:
            occ = jnp.max(jnp.sum(n_c > 0, 1)) if occupied is None else jnp.asarray(occupied)[0]
            cp = jax.lax.switch(jnp.sum(jnp.asarray(widths[:-1]) < occ), [at_width(w) for w in widths], cp)
    nix = h.nix
    nix_grids = (grids.nix_mu0, grids.nix_kappa0, grids.nix_nu0, grids.nix_sigma2)
    if len(model.real_idx) and any(gr is not None for gr in nix_grids):
        # as for the Dirichlet levels: only the clusters holding a feature's cells enter (an empty slot's NIX term
        # is 0), so the grid marginals run on the largest `width` slots of each feature
        rs = state.real_stats
        by_size = jnp.argsort(-rs[..., 0], axis=1)  # [Fr, C]
        rs_s = jnp.take_along_axis(rs, by_size[:, :, None], axis=1)
        C = rs.shape[1]
        widths = [w for w in _HYPER_WIDTHS if w < C] + [C]
        nix_keys = [next(keys) if gr is not None else None for gr in nix_grids]

        def nix_at_width(width):
            def run(nix):
                stats = rs_s[:, :width]
                for p, grid in enumerate(nix_grids):
                    if grid is None:
                        continue
                    g = jnp.asarray(grid, dt)
                    cand = jnp.broadcast_to(nix[:, None, :], (nix.shape[0], g.shape[0], 4)).at[:, :, p].set(g[None])
                    lp = jax.vmap(lambda c, s: _nix_marginal(c, s))(cand, stats)  # [Fr, G]
                    if grids.nix_logprior is not None and grids.nix_logprior[p] is not None:
                        lp = lp + jnp.asarray(grids.nix_logprior[p], dt)[None]  # the grid points' prior weights
                    nix = nix.at[:, p].set(draw(nix_keys[p], g, lp))
                return nix

            return run

        if len(widths) == 1:
            nix = nix_at_width(C)(nix)
        else:
            occ = jnp.max(jnp.sum(rs[..., 0] > 0, 1)) if occupied is None else jnp.asarray(occupied)[1]
            nix = jax.lax.switch(jnp.sum(jnp.asarray(widths[:-1]) < occ), [nix_at_width(w) for w in widths], nix)
    return state._replace(hypers=CrossCatHypers(va, vd, ra, rd, cp, nix))


# --------------------------------------------------------------------------- sweeps and driver
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
        runs.append((arg[e], e, max(L[arg[e]:e])))
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
    return state._replace(z=state.z[:, rows], order=jnp.arange(width, dtype=jnp.int32),
                          head=jnp.zeros_like(state.head)), data_c, rows


def _expand(state: CrossCatState, state_c: CrossCatState, rows) -> CrossCatState:
    """:func:`_compact`'s inverse after moves on ``state_c``: its ``z`` written back at ``rows``."""
    return state_c._replace(z=state.z.at[:, rows].set(state_c.z), order=state.order, head=state.head)


def _check_widths(widths) -> tuple:
    """``feature_widths`` as a tuple of strictly increasing positive ints, else ``ValueError``."""
    try:
        out = tuple(int(w) for w in widths)
    except TypeError:
        raise ValueError(f"feature_widths must be a tuple of ints; got {widths!r}") from None
    if any(w < 1 for w in out) or any(b <= a for a, b in zip(out, out[1:])) or \
            any(int(w) != w for w in widths):
        raise ValueError(f"feature_widths must be strictly increasing positive ints; got {widths!r}")
    return out


def width_ladder(num_rows: int, start: int = 32, factor: int = 4) -> tuple:
    """Widths ``start, start * factor, ...`` below ``num_rows`` for ``feature_widths`` (each one compiles a copy of
    the feature sweep; the moves on a subsample of ``m > start`` rows then cost ``O(width)`` with ``width <
    factor * m``, not ``O(num_rows)``)."""
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
    state = state._replace(hypers=h._replace(row_alpha=jnp.where(occ, h.row_alpha, init_h.row_alpha),
                                             row_d=jnp.where(occ, h.row_d, init_h.row_d)))
    per = num_aux + 1
    num = model.num_features * per
    a0, d0 = jnp.asarray(model.row_prior.alpha, dt), jnp.asarray(model.row_prior.discount, dt)
    if model.row_prior.discount == 0:  # CRP: all partitions at once, no loop over the subsample
        draws = _draw_crp_partitions(k_draw, _window_rows(state), state.num_assigned, jnp.full((num,), a0),
                                     state.sizes.shape[1])
    else:
        draws = _draw_partitions(k_draw, _window_rows(state), state.num_assigned, jnp.full((num,), a0),
                                 jnp.full((num,), d0), state.sizes.shape[1], trip)
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
            st, _ = new_view_mh(key, st, fj, model=model, data=data, fresh=prop + (a0, d0),
                                noise=(u[0], u[1], g[1]))
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


def build_sweep(model: CrossCatModel, *, span: int, energy_ramp: int = 0, grids: CrossCatGrids | None = None,
                num_aux: int = 1, hyper_min_rows: int = 0, feature_moves: bool = True, feature_min_rows: int = 0,
                policy: str = "random", blocked: bool = False, feature_widths: tuple = (), sweep_growth: float = 0.0):
    """``sweep(states, chain_keys, windows, data) -> states``: ``span`` ticks of vmapped chains (``lax.scan``).

    ``policy``: the schedule's row policy, ``"random"`` or ``"fifo"`` (states from ``init(..., policy="fifo")``).
    ``blocked``: the windows hold ``code + 8 * block`` (int32; a schedule with ``blocks``, e.g.
    :func:`~jaxsub.anneal.anneal_stepsize`): a GIBBS tick with ``block > 1`` is a :func:`block_tick`
    (every tick then also computes the block move: use it only for such schedules).

    After a tick that completes a cycle through the current subsample a chain runs the feature moves
    of :func:`feature_sweep` (once the subsample holds ``feature_min_rows`` rows) and then the hyper
    step :func:`resample_hypers` (once it holds ``hyper_min_rows`` rows), each behind a ``lax.cond``
    on "any chain needs it". Tick ``t`` of a chain uses ``fold_in(chain_key, t)``. With moves compiled in, the ticks
    run in an inner ``while`` loop that exits after a tick whose moves fire and the moves run outside it, so the
    tick loop's body holds no ``cond`` (one there made XLA:CPU copy the carry arrays its branches write every tick).

    The scan carries each chain's :class:`_ScoreCache` (per-cluster categorical cell counts and NIX
    Student-t parameters) beside its state: a tick updates it at the clusters it touches, so scoring a
    row costs no sum over levels and no ``lgamma``; it is rebuilt after feature and hyper moves.

    ``feature_widths`` (static increasing ints, default none): the feature moves run on the first ``w`` rows of
    each chain's subsample window (:func:`feature_sweep` ``width``), ``w`` the smallest of them that holds the
    largest subsample of the chains that need the moves (a ``lax.switch``, all ``N`` rows past the last), so
    their cost follows the subsample: each width compiles one more copy of the feature sweep (~2.5-4 CPU-s more
    for ``fit`` on the 11-feature flights table), so it is opt-in (:func:`width_ladder`).

    ``sweep_growth`` (static float, 0: off): the feature and hyper moves also run after a tick once the subsample
    holds ``sweep_growth`` times the rows it held at the chain's last feature / hyper step (``state.swept``), cycle
    or not. A schedule that only adds rows (the linear anneal at ``N`` assignments, a sequential phase) never
    completes a cycle, so without it its moves run once (at ``hyper_min_rows``); with ``sweep_growth=2`` they run
    at ~20, 40, 80, ... rows. It changes when the moves run (a function of the tick counters, not of the state's
    values), not what they do: each move still leaves the current subsample's posterior invariant.
    """
    widths = _check_widths(feature_widths)
    growth = check_sweep_growth(sweep_growth)

    def one(state, cache, u, window, base, data):
        cur = state.cursor
        raw = window[jnp.clip(cur - base, 0, span - 1)].astype(jnp.int32)
        past = (cur - base >= span) | (raw < 0)
        block = jnp.where(past, 1, raw >> 3) if blocked else 1
        code = jnp.where(past, 0, raw & 7)
        beta = jnp.minimum(1.0, (cur.astype(jnp.float32) + 1.0) / energy_ramp) if energy_ramp > 0 else 1.0
        new, writes, _, cache = _row_plan(u, state, code, beta, model=model, data=data, cache=cache, policy=policy)
        if blocked:
            use = (block > 1) & (code == GIBBS)
            new_b, _ = block_tick(u, state, block, model=model, data=data)
            sel = lambda a, b: jax.tree.map(lambda x, y: jnp.where(use, x, y), a, b)  # noqa: E731
            new, writes = sel(new_b, new), sel(_noop_row_writes(new_b), writes)
            cache = sel(_score_cache(new_b), cache)
        new = new._replace(cursor=jnp.where(past, cur, new.cursor))
        cycle = moves_due(new.since_hyper, new.num_assigned, new.swept, growth) & ~new.halted
        need_f = cycle & (new.num_assigned >= feature_min_rows) if feature_moves else jnp.zeros_like(cycle)
        need_h = cycle & (new.num_assigned >= hyper_min_rows) if grids is not None else jnp.zeros_like(cycle)
        return new, writes, jnp.stack([need_f, need_h]), cache

    def sweep(states, chain_keys, windows, data):
        base = states.cursor
        fkeys = jax.vmap(lambda k: jax.random.split(k)[1])(chain_keys)
        num_u = TICK_WORDS + states.z.shape[1]

        def span_uniforms(chain_key, cursor):  # random words of ticks cursor .. cursor + span - 1, one batch
            ticks = cursor + jnp.arange(span, dtype=jnp.int32)
            return jax.vmap(lambda t: jax.random.bits(jax.random.fold_in(chain_key, t), (num_u,), jnp.uint32))(ticks)

        uniforms = jax.vmap(span_uniforms, out_axes=1)(chain_keys, base)  # [span, chains, 4 + V] uint32
        # One chain (fit(threads=...) runs groups of one): the loop carries the chain without a batch axis, so
        # no batch-index arithmetic is built around each gather, scatter and dynamic-update-slice of a tick
        # (same operations, same draws; 94 -> 78 fusions per tick on the flights subset).
        single = states.cursor.shape[0] == 1
        if single:
            vm = lambda f, in_axes=0: f  # noqa: E731
            states, fkeys, windows, base, uniforms = jax.tree.map(lambda a: a[0], (states, fkeys, windows, base))\
                + (uniforms[:, 0],)
        else:
            vm = jax.vmap

        def tick(carry, u):
            states, pending, caches = carry
            # the previous tick's [V, N] / [N] writes first, then this tick's reads (no copies)
            states = vm(_apply_row_writes)(states, pending)
            states, pending, needs, caches = vm(one, in_axes=(0, 0, 0, 0, 0, None))(
                states, caches, u, windows, base, data)
            return (states, pending, caches), needs

        def moves_after(carry, needs):  # the feature and hyper moves after a tick whose `needs` fired
            states, pending, caches = carry
            need_f, need_h = needs[..., 0], needs[..., 1]

            def pick(mask, a, b):
                return jax.tree.map(lambda x, y: jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim)),
                                                           x, y), a, b)

            def run(carry):
                st, pend, _ = carry
                st = vm(_apply_row_writes)(st, pend)
                ks = vm(jax.random.fold_in)(fkeys, st.cursor)
                ok = jnp.ones_like(need_f)
                if feature_moves:  # prior-partition loops bounded by the largest subsample (unbatched)
                    def moves(st):
                        trip = jnp.max(jnp.where(need_f, st.num_assigned, 0))

                        def at(w):
                            return lambda st: vm(lambda k, s_, t: feature_sweep(
                                k, s_, model=model, data=data, num_aux=num_aux, trip=t, width=w),
                                in_axes=(0, 0, None))(ks, st, trip)

                        ws = [w for w in widths if w < data.cat.shape[0]]
                        if ws:  # the smallest width holding every chain's subsample (unbatched index)
                            new, ok_f = jax.lax.switch(jnp.sum(trip > jnp.asarray(ws)).astype(jnp.int32),
                                                       [at(w) for w in ws] + [at(None)], st)
                        else:
                            new, ok_f = at(None)(st)
                        return pick(need_f & ok_f, new, st), ok_f | ~need_f

                    st, ok = jax.lax.cond(jnp.any(need_f), moves, lambda st: (st, ok), st)
                if grids is not None:
                    def hypers(st):
                        kh = vm(lambda k: jax.random.fold_in(k, 1))(ks)
                        # one width for every chain (unbatched switch index: a batched one runs every branch)
                        occ = _occupied_bound(model, st)
                        step = vm(lambda k, s_, o: resample_hypers(k, s_, model=model, grids=grids, occupied=o),
                                  in_axes=(0, 0, None))
                        return pick(need_h & ok, step(kh, st, occ), st)

                    st = jax.lax.cond(jnp.any(need_h & ok), hypers, lambda st: st, st)
                done = (need_f | need_h) & ok
                st = st._replace(since_hyper=jnp.where(done, 0, st.since_hyper), halted=st.halted | ~ok,
                                 swept=jnp.where(done, st.num_assigned, st.swept))
                return st, vm(_noop_row_writes)(st), _score_cache(st)

            states, pending, caches = jax.lax.cond(jnp.any(need_f | need_h), run, lambda c: c,
                                                   (states, pending, caches))
            return states, pending, caches

        pending = vm(_noop_row_writes)(states)
        carry = (states, pending, _score_cache(states))
        if feature_moves or grids is not None:
            # Ticks in an inner while loop that stops after a tick whose moves fire (a function of the tick
            # counters), the moves behind their lax.cond outside it: a cond in the tick loop's body makes XLA:CPU
            # copy the carry arrays its branch writes (view_of, sizes, counts, hypers) every tick (gss full:
            # 40.5 -> 51.4 us per tick with the feature branch). Same ticks, same moves, same order: same draws.
            def inner(c):
                carry, t, _ = c
                carry, needs = tick(carry, jax.lax.dynamic_index_in_dim(uniforms, t, keepdims=False))
                return carry, t + 1, needs

            def outer(c):
                carry, t, needs = jax.lax.while_loop(lambda c: (c[1] < span) & ~jnp.any(c[2]), inner, c)
                return moves_after(carry, needs), t, jnp.zeros_like(needs)

            needs0 = jnp.zeros(states.cursor.shape + (2,), bool)
            carry, _, _ = jax.lax.while_loop(lambda c: c[1] < span, outer, (carry, jnp.int32(0), needs0))
        else:
            carry, _ = jax.lax.scan(tick, carry, uniforms)
        states, pending, _ = carry
        states = vm(_apply_row_writes)(states, pending)
        return jax.tree.map(lambda a: a[None], states) if single else states

    return sweep


def heldout_rows(model: CrossCatModel, state: CrossCatState, test: CrossCatData) -> jnp.ndarray:
    """``[T]`` held-out log predictive per test row: ``sum_v log sum_c w_vc p(x_v | X_vc)`` (missing cells skipped)."""
    V = state.z.shape[0]
    nf = jax.ops.segment_sum(jnp.ones_like(state.view_of), state.view_of, V)
    h = state.hypers
    logw = jax.vmap(_prior_logw)(state.sizes, h.row_alpha, h.row_d)
    logw = logw - jax.nn.logsumexp(logw, axis=1, keepdims=True)

    def one(c, r, o):
        s = _view_scores(model, state, c, r, o)
        return jnp.sum(jnp.where(nf > 0, jax.nn.logsumexp(logw + s, axis=1), 0.0))

    return jax.lax.map(lambda a: one(*a), (test.cat, test.real, test.real_obs), batch_size=1024)


def predictive_samples(rng_key: PRNGKey, model: CrossCatModel, state: CrossCatState, num_samples: int) -> jnp.ndarray:
    """``[num_samples, F]`` draws from the posterior predictive of a new row (one chain's state).

    Per view: a cluster from eq. (star) prior weights; per feature: a level from
    ``(beta_l + c_l)/(B + n)`` or a real from the NIX posterior Student-t.
    """
    h = state.hypers
    V = state.z.shape[0]
    logw = jax.vmap(_prior_logw)(state.sizes, h.row_alpha, h.row_d)

    def one(key):
        k1, k2, k3 = jax.random.split(key, 3)
        kv = jax.random.categorical(k1, logw, axis=-1)  # [V]
        out = jnp.zeros((model.num_features,), h.row_alpha.dtype)
        if len(model.cat_idx):
            ci = jnp.asarray(model.cat_idx)
            k = kv[state.view_of[ci]]
            c = state.cat_counts[jnp.arange(ci.shape[0]), k].astype(h.cat_prior.dtype)
            p = jnp.where(_level_mask(model), h.cat_prior + c, 0.0)
            lv = jax.random.categorical(k2, jnp.log(p), axis=-1)
            out = out.at[ci].set(lv.astype(out.dtype))
        if len(model.real_idx):
            ri = jnp.asarray(model.real_idx)
            k = kv[state.view_of[ri]]
            s = state.real_stats[jnp.arange(ri.shape[0]), k]
            mu0, k0, nu0, s2 = h.nix[:, 0], h.nix[:, 1], h.nix[:, 2], h.nix[:, 3]
            n, s1, sq = s[:, 0], s[:, 1], s[:, 2]
            kn, nun = k0 + n, nu0 + n
            mun = (k0 * mu0 + s1) / kn
            nus2 = jnp.maximum(nu0 * s2 + sq + k0 * mu0 * mu0 - kn * mun * mun, nu0 * s2 * 1e-6)
            scale = jnp.sqrt(nus2 / nun * (1.0 + 1.0 / kn))
            out = out.at[ri].set(mun + scale * jax.random.t(k3, nun))
        return out

    del V
    return jax.vmap(one)(jax.random.split(rng_key, num_samples))


def depends_on(view_of) -> np.ndarray:
    """``[F, F]`` fraction of samples (rows of ``view_of`` ``[S, F]``) in which two features share a view."""
    v = np.asarray(view_of)
    v = v.reshape(-1, v.shape[-1])
    return (v[:, :, None] == v[:, None, :]).mean(axis=0)


class CrossCatFit(NamedTuple):
    """``state`` (batched), ``heldout`` ``[K, chains]`` summed test scores, ``heldout_rows`` ``[chains, T]`` at the end,
    ``num_views`` / ``num_clusters`` (mean over occupied views) ``[K, chains]``, ``seconds`` ``[K]``,
    ``compile_seconds``, ``trace_capacity`` ``[K]`` cluster slots per view at each checkpoint (grown on overflow),
    ``log_joint`` ``[K, chains]`` (:func:`log_joint` of the subsample at each checkpoint).

    ``view_labels`` ``[chains, F]`` and ``row_labels`` ``[chains, F, N]`` (each feature's row partition, that
    of its view) are compact: ``0..K-1`` in order of first appearance (:func:`jaxsub.anneal.compact_labels`),
    ``-1`` for rows not in the subsample."""

    state: CrossCatState
    heldout: np.ndarray
    heldout_rows: np.ndarray | None
    num_views: np.ndarray
    num_clusters: np.ndarray
    seconds: np.ndarray
    compile_seconds: float
    trace_capacity: np.ndarray | None = None
    log_joint: np.ndarray | None = None

    @property
    def view_labels(self) -> np.ndarray:
        return _driver.compact_labels(np.asarray(self.state.view_of))

    @property
    def row_labels(self) -> np.ndarray:
        vo, z = np.asarray(self.state.view_of), np.asarray(self.state.z)
        return np.stack([_driver.compact_labels(z[c][vo[c]]) for c in range(vo.shape[0])])


def diagnose(fit_result: CrossCatFit, *, num_test_rows: int | None = None, **kwargs) -> _driver.Diagnostics:
    """R-hat across chains (mean clusters per view, held-out score, log joint) and stuck chains, as
    :func:`jaxsub.anneal.diagnose` for the mixture ``fit`` (same rule and keyword arguments, which it validates)."""
    r = fit_result
    if r.log_joint is None:
        raise ValueError("fit_result has no log_joint trace (build it with crosscat.fit)")
    k, chains = r.heldout.shape
    zeros = np.zeros((k, chains))
    trace = _driver.FitTrace(tick=zeros, num_assigned=zeros, num_clusters=np.asarray(r.num_clusters),
                             log_joint=np.asarray(r.log_joint), heldout=np.asarray(r.heldout), alpha=zeros,
                             discount=zeros, seconds=np.asarray(r.seconds), compile_seconds=r.compile_seconds,
                             capacity=np.asarray(r.trace_capacity) if r.trace_capacity is not None else zeros[:, 0])
    return _driver.diagnose(trace, num_test_rows=num_test_rows, **kwargs)


@partial(jax.jit, static_argnames=("model",))
def _stats(states, *, model):
    V = states.z.shape[1]
    nf = jax.vmap(lambda v: jax.ops.segment_sum(jnp.ones_like(v), v, V))(states.view_of)
    occ = nf > 0
    k = jnp.sum(states.sizes > 0, axis=2)
    return jnp.sum(occ, 1), jnp.sum(jnp.where(occ, k, 0), 1) / jnp.maximum(jnp.sum(occ, 1), 1)


@partial(jax.jit, static_argnames=("model",))
def _log_joint_batched(states, *, model):
    return jax.vmap(lambda s: log_joint(model, s))(states)


@partial(jax.jit, static_argnames=("model",))
def _heldout_batched(states, test, *, model):
    return jax.vmap(lambda s: heldout_rows(model, s, test))(states)


def prior_view_partition(rng_key: PRNGKey, model: CrossCatModel, num_aux: int = 1) -> jnp.ndarray:
    """``[F]`` view labels of the features drawn from the view prior ``PY(alpha_v, d_v)`` (sequential seating
    in column order; labels ``0..K-1`` in order of first appearance, ``K <= F < F + num_aux`` view slots)."""
    F = model.num_features
    dt = jnp.float32
    z, _, _ = _draw_partitions(rng_key, jnp.arange(F, dtype=jnp.int32), jnp.asarray(F, jnp.int32),
                               jnp.full((1,), model.view_prior.alpha, dt), jnp.full((1,), model.view_prior.discount, dt),
                               F + num_aux)
    return z[0]


@partial(jax.jit, static_argnames=("model", "capacity", "num_aux", "num_chains", "dtype", "policy"))
def _init_chains_jit(data, *, model, capacity, num_aux, num_chains, dtype, policy="random", view_keys=None,
                     order_keys=None):
    """``num_chains`` copies of :func:`init` (empty) as one compiled program instead of op-by-op dispatch;
    with ``view_keys`` ``[chains]`` each chain's view partition is drawn from the view prior; ``order_keys``
    ``[chains]`` draw each chain's FIFO cycle (policy ``"fifo"``)."""

    def one(i):
        vo = None if view_keys is None else prior_view_partition(view_keys[i], model, num_aux)
        ok = None if order_keys is None else order_keys[i]
        return init(model, data, capacity, view_of=vo, num_aux=num_aux, dtype=dtype, policy=policy, rng_key=ok)

    return jax.vmap(one)(jnp.arange(num_chains))


def _sweep_fn(states, keys, windows, data, *, model, span, energy_ramp, grids, num_aux, hyper_min_rows,
              feature_moves, feature_min_rows, policy, blocked=False, feature_widths=(), sweep_growth=0.0):
    return build_sweep(model, span=span, energy_ramp=energy_ramp, grids=grids, num_aux=num_aux,
                       hyper_min_rows=hyper_min_rows, feature_moves=feature_moves,
                       feature_min_rows=feature_min_rows, policy=policy, blocked=blocked,
                       feature_widths=feature_widths, sweep_growth=sweep_growth)(states, keys, windows, data)


_sweep_jit = jax.jit(_sweep_fn, static_argnames=("model", "span", "energy_ramp", "grids", "num_aux",
                                                 "hyper_min_rows", "feature_moves", "feature_min_rows", "policy",
                                                 "blocked", "feature_widths", "sweep_growth"))


def fit(rng_key: PRNGKey, data, model: CrossCatModel, schedule: Schedule, *, num_chains: int = 1,
        capacity: int = 32, max_capacity: int = 1024, grids: CrossCatGrids | str | None = "default", test_data=None,
        num_checkpoints: int = 5,
        num_aux: int = 1, hyper_min_rows: int | None = None, feature_moves: bool = True, time_budget: float | None = None,
        progress_bar: bool = False, dtype=jnp.float32, span: int | None = None, cache=None,
        initial_views: str = "prior", feature_min_rows: int | None = None, threads: int = 1,
        feature_widths: tuple = (), sweep_growth: float = 2.0) -> CrossCatFit:
    """Run a row schedule for CrossCat on ``num_chains`` vmapped chains: policy ``"random"`` (Anneal,
    Prior+Gibbs, Sequential+Gibbs, energy annealing) or ``"fifo"`` (:func:`~jaxsub.anneal.loom`: the
    subsample is a sliding window of each chain's shuffled cycle of the rows, every row visited in turn).

    Starts from no rows (``schedule.initial_size`` must be 0) with each chain's features in a view
    partition drawn from the view prior (``initial_views="prior"``, :func:`prior_view_partition`, as
    pylace's states start) or all in one view (``"one"``). The view partition mixes slowly once the
    subsample is large (a feature leaves its view only for an empty view with a prior-drawn row
    partition), so chains started in one view tend to stay in few views: on a 1,000-row flights
    subset, 4 chains at 30N scored -13.80 per held-out row from one view and -12.11 from prior
    draws (docs/anneal.md, session 8). Feature moves start once the subsample holds
    ``feature_min_rows`` rows (default: ``hyper_min_rows``), the hyper step once it holds
    ``hyper_min_rows`` (default ``min(N, 20)``): feature moves on small subsamples are what subsample
    annealing makes cheap, and there they find the view partition (measured: 30N from 20 rows
    −10.76 per held-out row in 34.9 s, from 100 rows −12.11 in 9.9 s and −11.49 at 100N in 31.4 s).
    ``time_budget`` (seconds of sampling) stops early at a checkpoint. ``span`` ticks per compiled
    call (default ``len(schedule) / num_checkpoints``); ``cache`` a
    :class:`~jaxsub.anneal.driver.SweepCache` to share compilations across calls. ``threads``: the chains
    run as ``threads`` equal groups (vmapped within a group), each group's compiled sweep called from its
    own host thread, so on a multi-core CPU the groups run in parallel (XLA releases the GIL; one chain's
    tick is a chain of small kernels that one core runs, so vmapped chains share one core). Each chain's
    draws depend only on its key, so the result equals the ``threads=1`` run (up to floating-point
    differences of the batch size); ``num_chains`` must be a multiple of ``threads``. ``feature_widths``: see
    :func:`build_sweep` (feature moves on the subsample's rows only; e.g. ``width_ladder(N)``; more compilation).
    ``sweep_growth`` (default 2; 0: off): see :func:`build_sweep`; the feature and hyper moves also run each time
    the subsample has doubled since their last run. A schedule that only adds rows (``linear_anneal(N, N)``, the
    adding phase of Sequential+Gibbs or Prior+Gibbs) completes no cycle, so without it they run once, at
    ``hyper_min_rows`` rows: on the full hfi table at 1N that left Anneal at -96.7 per held-out row, with it -63.3
    (docs/anneal.md, session 16). Schedules with well over 2 assignments per added row (the linear anneal at 3N
    and more) complete a cycle first: their draws are unchanged.

    Capacity: every view has ``capacity`` cluster slots (a JAX shape). A chain that must open a
    cluster in a full view halts before that tick (nothing is dropped); ``fit`` then doubles the
    capacity on the host (:func:`grow`, one new compile per capacity) and resumes. Row ticks
    resume exactly (the run equals one started with the larger capacity); a feature sweep that
    halted is retried after the next row tick. ``trace_capacity`` records the capacity at every
    checkpoint.

    Raises
    ------
    CapacityError
        (:class:`~jaxsub.anneal.mixture.CapacityError`) a chain needs more than ``max_capacity``
        clusters in a view.
    ValueError
        Bad settings or tables.
    """
    num_chains = check_int("num_chains", num_chains, low=1)
    capacity = check_int("capacity", capacity, low=1)
    max_capacity = check_int("max_capacity", max_capacity, low=capacity)
    num_aux = check_int("num_aux", num_aux, low=1)
    num_checkpoints = check_int("num_checkpoints", num_checkpoints, low=1)
    threads = check_int("threads", threads, low=1, high=num_chains)
    if num_chains % threads:
        raise ValueError(f"num_chains={num_chains} must be a multiple of threads={threads}")
    if not isinstance(schedule, Schedule) or schedule.initial_size != 0:
        raise ValueError("schedule must be a jaxsub.anneal.Schedule starting empty (initial_size 0)")
    blocked = schedule.blocks is not None and bool(np.any(schedule.blocks != 1))
    if blocked and schedule.policy != "random":
        raise ValueError("a schedule with blocks > 1 (block Gibbs) needs the 'random' row policy")
    enc = encode_table(model, data, dtype)
    n = enc.cat.shape[0]
    if schedule.num_rows != n:
        raise ValueError(f"schedule is for {schedule.num_rows} rows but data has {n}")
    hyper_min_rows = min(n, 20) if hyper_min_rows is None else check_int("hyper_min_rows", hyper_min_rows, low=0)
    feature_min_rows = hyper_min_rows if feature_min_rows is None else check_int("feature_min_rows", feature_min_rows,
                                                                                  low=0)
    if isinstance(grids, str):
        if grids != "default":
            raise ValueError(f"grids must be a CrossCatGrids, 'default' or None; got {grids!r}")
        grids = default_crosscat_grids(model)
    test = encode_table(model, test_data, dtype) if test_data is not None else None
    if initial_views not in ("one", "prior"):
        raise ValueError(f"initial_views must be 'one' or 'prior'; got {initial_views!r}")
    view_keys = None
    if initial_views == "prior":  # a separate stream: the row draws of "one" and "prior" runs stay comparable
        rng_key, k_views = jax.random.split(rng_key)
        view_keys = jax.random.split(k_views, num_chains)
    order_keys = None
    if schedule.policy == "fifo":  # each chain's shuffled cycle, again from its own stream
        rng_key, k_order = jax.random.split(rng_key)
        order_keys = jax.random.split(k_order, num_chains)
    states = _init_chains_jit(enc, model=model, capacity=capacity, num_aux=num_aux, num_chains=num_chains, dtype=dtype,
                              policy=schedule.policy, view_keys=view_keys, order_keys=order_keys)
    keys = jax.random.split(rng_key, num_chains)
    span = math.ceil(len(schedule) / num_checkpoints) if span is None else check_int("span", span, low=1)
    static = dict(model=model, span=span, energy_ramp=schedule.energy_ramp, grids=grids, num_aux=num_aux,
                  hyper_min_rows=hyper_min_rows, feature_moves=feature_moves, feature_min_rows=feature_min_rows,
                  policy=schedule.policy)
    feature_widths = _check_widths(feature_widths)
    if feature_widths:
        static["feature_widths"] = feature_widths
    sweep_growth = check_sweep_growth(sweep_growth)
    if sweep_growth:
        static["sweep_growth"] = sweep_growth
    codes = np.asarray(schedule.codes)
    if blocked:  # block sizes ride in the windows: code + 8 * block (int32)
        static["blocked"] = True
        codes = codes.astype(np.int32) + 8 * np.asarray(schedule.blocks, np.int32)
    wdt = np.int32 if blocked else np.int8
    cache = SweepCache() if cache is None else cache
    compile_seconds = 0.0

    def executable(states, windows):
        nonlocal compile_seconds
        ks = keys[: states.cursor.shape[0]]
        sig = ("crosscat", tuple(sorted(static.items(), key=lambda kv: kv[0])),
               tuple((a.shape, str(a.dtype)) for a in jax.tree.leaves((states, ks, windows, enc))))
        if sig not in cache.executables:
            t0 = time.perf_counter()
            cache.executables[sig] = _sweep_jit.lower(states, ks, windows, enc, **static).compile()
            compile_seconds += time.perf_counter() - t0
        return cache.executables[sig]

    group = num_chains // threads
    parts = [slice(i * group, (i + 1) * group) for i in range(threads)]
    take = lambda tree, sl: jax.tree.map(lambda a: a[sl], tree)  # noqa: E731
    join = lambda trees: jax.tree.map(lambda *a: jnp.concatenate(a), *trees)  # noqa: E731
    key_parts = [keys[sl] for sl in parts]
    def run_groups(states):
        groups = [take(states, sl) for sl in parts]
        wins = [jnp.asarray(schedule_windows(codes, np.asarray(g.cursor), span, wdt)) for g in groups]
        exe = executable(groups[0], wins[0])
        t0 = time.perf_counter()
        if threads == 1:
            out = [jax.block_until_ready(exe(groups[0], key_parts[0], wins[0], enc))]
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(threads) as pool:
                out = list(pool.map(lambda a: jax.block_until_ready(exe(a[0], a[1], a[2], enc)),
                                    zip(groups, key_parts, wins)))
        return (out[0] if threads == 1 else join(out)), time.perf_counter() - t0

    executable(take(states, parts[0]), jnp.asarray(schedule_windows(codes, np.asarray(states.cursor[parts[0]]), span,
                                                                    wdt)))
    rows, elapsed = [], 0.0
    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(schedule), unit="tick", leave=False, desc=f"crosscat {schedule.name}")
    rows_t = None
    while True:
        states, secs = run_groups(states)
        elapsed += secs
        if bool(np.any(np.asarray(states.halted))):
            if capacity >= max_capacity:
                raise mx.CapacityError(f"a chain needs more than max_capacity={max_capacity} clusters in a view "
                                       f"at tick {int(np.asarray(states.cursor).min())}; raise max_capacity")
            capacity = min(2 * capacity, max_capacity)
            states = grow(states, capacity)._replace(halted=jnp.zeros((num_chains,), bool))
        nv, nk = _stats(states, model=model)
        rows_t = _heldout_batched(states, test, model=model) if test is not None else None
        held = np.asarray(jnp.sum(rows_t, -1)) if test is not None else np.full(num_chains, np.nan)
        rows.append((held, np.asarray(nv), np.asarray(nk), elapsed, capacity,
                     np.asarray(_log_joint_batched(states, model=model))))
        cur = int(np.asarray(states.cursor).min())
        if bar is not None:
            bar.n = cur
            bar.refresh()
        if cur >= len(schedule) or (time_budget is not None and elapsed >= time_budget):
            break
    if bar is not None:
        bar.close()
    cols = list(zip(*rows))
    return CrossCatFit(states, np.stack(cols[0]), None if rows_t is None else np.asarray(rows_t), np.stack(cols[1]),
                       np.stack(cols[2]), np.asarray(cols[3]), compile_seconds, np.asarray(cols[4]),
                       np.stack(cols[5]))
