"""Model specification: partition priors, conjugate feature models, data encoding, hyper grids.

A mixture model here is a partition prior (:class:`CRP`, :class:`PitmanYor` or
:class:`Finite`) times a product of conjugate feature models, one per data column:

* :class:`BetaBernoulli` ``(a, b)``: ``x in {0, 1}``, ``theta ~ Beta(a, b)``,
  ``x | theta ~ Bernoulli(theta)``;
* :class:`DirichletCategorical` ``(num_levels, alpha)``: ``x in {0..L-1}``,
  ``theta ~ Dirichlet(alpha, ..., alpha)``, ``x | theta ~ Categorical(theta)``;
* :class:`NormalInverseChiSquared` ``(mu0, kappa0, nu0, sigma2)``: real ``x``,
  ``sigma^2 ~ Scale-Inv-chi^2(nu0, sigma2)``, ``mu | sigma^2 ~ N(mu0, sigma^2 / kappa0)``,
  ``x ~ N(mu, sigma^2)`` (Gelman et al., BDA3 section 3.3; Murphy 2007 section 5).

Bernoulli features are stored as 2-level categoricals whose pseudo-counts are
``(b, a)`` for levels ``(0, 1)``, so the two discrete families share one count
table ``[capacity, total_levels]`` and one scoring path.

References
----------
Obermeyer, Glidden & Jonas, "Scaling nonparametric Bayesian inference via
subsample-annealing", AISTATS 2014.
Pitman & Yor, "The two-parameter Poisson-Dirichlet distribution", Ann. Prob. 1997.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Union

import jax.numpy as jnp
import numpy as np

from jaxsub.validation import check_int, check_real

__all__ = [
    "BetaBernoulli",
    "CRP",
    "DirichletCategorical",
    "EncodedData",
    "Finite",
    "HyperGrids",
    "Hypers",
    "MixtureModel",
    "NormalInverseChiSquared",
    "PitmanYor",
    "default_grids",
    "encode",
    "init_hypers",
]


# --------------------------------------------------------------------------- priors
@dataclass(frozen=True)
class CRP:
    """Chinese restaurant process ``CRP(alpha)``, ``alpha > 0`` (Pitman-Yor with ``d = 0``)."""

    alpha: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "alpha", check_real("alpha", self.alpha, low=0.0))

    @property
    def discount(self) -> float:
        return 0.0


@dataclass(frozen=True)
class PitmanYor:
    """Pitman-Yor process ``PY(alpha, d)`` with ``d in [0, 1)`` and ``alpha > 0``.

    (The PY process also allows ``-d < alpha <= 0``; jaxsub requires ``alpha > 0``,
    which keeps every grid value valid for every ``d``.)
    """

    alpha: float = 1.0
    discount: float = 0.1

    def __post_init__(self):
        object.__setattr__(self, "alpha", check_real("alpha", self.alpha, low=0.0))
        object.__setattr__(self, "discount", check_real("discount", self.discount, low=0.0, high=1.0, low_closed=True))


@dataclass(frozen=True)
class Finite:
    """A fixed number of components with known weights (no new clusters).

    Row ``i`` joins component ``k`` a priori with probability ``weights[k]``,
    independently of the other rows: the two-urn model of the paper's section
    3.2 is ``Finite((p, 1 - p))``.
    """

    weights: tuple = (0.5, 0.5)

    def __post_init__(self):
        w = np.asarray(self.weights, np.float64)
        if w.ndim != 1 or w.size < 1 or not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise ValueError(f"weights must be a non-empty vector of positive numbers; got {self.weights!r}")
        object.__setattr__(self, "weights", tuple(float(v) for v in w / w.sum()))


PartitionPrior = Union[CRP, PitmanYor, Finite]  # noqa: UP007  (a runtime alias read by isinstance and docs)


# --------------------------------------------------------------------------- features
@dataclass(frozen=True)
class BetaBernoulli:
    """Beta-Bernoulli feature: values in {0, 1}; ``P(x = 1) ~ Beta(a, b)``."""

    a: float = 1.0
    b: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "a", check_real("a", self.a, low=0.0))
        object.__setattr__(self, "b", check_real("b", self.b, low=0.0))

    @property
    def num_levels(self) -> int:
        return 2

    def pseudo_counts(self) -> tuple:
        return (self.b, self.a)  # level 0 (x = 0) gets b, level 1 gets a


@dataclass(frozen=True)
class DirichletCategorical:
    """Dirichlet-Categorical feature: values in ``{0, ..., num_levels - 1}``, symmetric Dirichlet(alpha)."""

    num_levels: int = 2
    alpha: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "num_levels", check_int("num_levels", self.num_levels, low=2))
        object.__setattr__(self, "alpha", check_real("alpha", self.alpha, low=0.0))

    def pseudo_counts(self) -> tuple:
        return (self.alpha,) * self.num_levels


@dataclass(frozen=True)
class NormalInverseChiSquared:
    """Normal-Inverse-chi^2 feature for real values: ``NIX(mu0, kappa0, nu0, sigma2)``."""

    mu0: float = 0.0
    kappa0: float = 1.0
    nu0: float = 1.0
    sigma2: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "mu0", check_real("mu0", self.mu0))
        object.__setattr__(self, "kappa0", check_real("kappa0", self.kappa0, low=0.0))
        object.__setattr__(self, "nu0", check_real("nu0", self.nu0, low=0.0))
        object.__setattr__(self, "sigma2", check_real("sigma2", self.sigma2, low=0.0))


Feature = Union[BetaBernoulli, DirichletCategorical, NormalInverseChiSquared]  # noqa: UP007


@dataclass(frozen=True)
class MixtureModel:
    """A partition prior times a product of conjugate feature models (one per data column).

    Parameters
    ----------
    prior
        :class:`CRP`, :class:`PitmanYor` or :class:`Finite`.
    features
        One feature model per column of the data, in column order.
    """

    prior: PartitionPrior
    features: tuple
    # derived (static) layout
    cat_columns: tuple = field(init=False)
    real_columns: tuple = field(init=False)
    level_offsets: tuple = field(init=False)
    total_levels: int = field(init=False)

    def __post_init__(self):
        if not isinstance(self.prior, (CRP, PitmanYor, Finite)):
            raise ValueError(f"prior must be CRP, PitmanYor or Finite; got {self.prior!r}")
        feats = tuple(self.features)
        if not feats:
            raise ValueError("features must list at least one feature model")
        for i, f in enumerate(feats):
            if not isinstance(f, (BetaBernoulli, DirichletCategorical, NormalInverseChiSquared)):
                raise ValueError(
                    f"features[{i}] must be BetaBernoulli, DirichletCategorical or NormalInverseChiSquared; got {f!r}"
                )
        object.__setattr__(self, "features", feats)
        cat = tuple(i for i, f in enumerate(feats) if not isinstance(f, NormalInverseChiSquared))
        real = tuple(i for i, f in enumerate(feats) if isinstance(f, NormalInverseChiSquared))
        offsets, total = [], 0
        for i in cat:
            offsets.append(total)
            total += feats[i].num_levels
        object.__setattr__(self, "cat_columns", cat)
        object.__setattr__(self, "real_columns", real)
        object.__setattr__(self, "level_offsets", tuple(offsets))
        object.__setattr__(self, "total_levels", total)

    @property
    def num_features(self) -> int:
        return len(self.features)

    @property
    def is_finite(self) -> bool:
        return isinstance(self.prior, Finite)

    def level_feature(self) -> np.ndarray:
        """``[total_levels]``: index (among categorical features) of the feature owning each level."""
        out = np.zeros(max(self.total_levels, 1), np.int32)
        for j, i in enumerate(self.cat_columns):
            off = self.level_offsets[j]
            out[off : off + self.features[i].num_levels] = j
        return out[: self.total_levels]


# --------------------------------------------------------------------------- hyperparameters
class Hypers(NamedTuple):
    """Current hyperparameter values (arrays, resampled by Gibbs on grids).

    Attributes
    ----------
    alpha, discount
        Partition-prior concentration and discount (scalars; unused by :class:`Finite`).
    cat_prior
        ``[total_levels]`` Dirichlet/Beta pseudo-counts of every categorical level.
    cat_total
        ``[num_cat_features]`` their per-feature sums (kept in sync by :func:`init_hypers`
        and the hyperparameter step).
    nix
        ``[num_real_features, 4]`` rows ``(mu0, kappa0, nu0, sigma2)``.
    """

    alpha: jnp.ndarray
    discount: jnp.ndarray
    cat_prior: jnp.ndarray
    cat_total: jnp.ndarray
    nix: jnp.ndarray


def init_hypers(model: MixtureModel, dtype=jnp.float32) -> Hypers:
    """The hyperparameters written in ``model`` as a :class:`Hypers` pytree.

    Parameters
    ----------
    model
        The :class:`MixtureModel`.
    dtype
        Float dtype.

    Returns
    -------
    Hypers
    """
    prior = model.prior
    alpha = prior.alpha if not isinstance(prior, Finite) else 1.0
    discount = prior.discount if not isinstance(prior, Finite) else 0.0
    pc = []
    for i in model.cat_columns:
        pc.extend(model.features[i].pseudo_counts())
    cat_prior = np.asarray(pc, np.float64)
    cat_total = np.asarray([sum(model.features[i].pseudo_counts()) for i in model.cat_columns], np.float64)
    nix = np.asarray(
        [[f.mu0, f.kappa0, f.nu0, f.sigma2] for f in (model.features[i] for i in model.real_columns)],
        np.float64,
    ).reshape(len(model.real_columns), 4)
    return Hypers(
        alpha=jnp.asarray(alpha, dtype),
        discount=jnp.asarray(discount, dtype),
        cat_prior=jnp.asarray(cat_prior, dtype),
        cat_total=jnp.asarray(cat_total, dtype),
        nix=jnp.asarray(nix, dtype),
    )


@dataclass(frozen=True)
class HyperGrids:
    """Discrete grids (uniform hyper-priors over the grid points) for the hyperparameter Gibbs step.

    ``None`` keeps that hyperparameter fixed. The Dirichlet grid is for the
    symmetric concentration of every :class:`DirichletCategorical`; the Beta
    grid is used for ``a`` and ``b`` of every :class:`BetaBernoulli` in turn;
    the NIX grids for ``mu0, kappa0, nu0, sigma2`` of every real feature in turn.
    """

    alpha: tuple | None = None
    discount: tuple | None = None
    dirichlet: tuple | None = None
    beta: tuple | None = None
    nix_mu0: tuple | None = None
    nix_kappa0: tuple | None = None
    nix_nu0: tuple | None = None
    nix_sigma2: tuple | None = None

    def __post_init__(self):
        bounds = {
            "alpha": (0.0, None, False),
            "discount": (0.0, 1.0, True),
            "dirichlet": (0.0, None, False),
            "beta": (0.0, None, False),
            "nix_mu0": (None, None, False),
            "nix_kappa0": (0.0, None, False),
            "nix_nu0": (0.0, None, False),
            "nix_sigma2": (0.0, None, False),
        }
        for name, (lo, hi, lo_closed) in bounds.items():
            grid = getattr(self, name)
            if grid is None:
                continue
            vals = np.atleast_1d(np.asarray(grid, np.float64))
            if vals.ndim != 1 or vals.size == 0:
                raise ValueError(f"grid {name} must be a non-empty 1-D sequence; got {grid!r}")
            for v in vals:
                check_real(f"grid {name} value", v, low=lo, high=hi, low_closed=lo_closed)
            object.__setattr__(self, name, tuple(float(v) for v in vals))

    @property
    def empty(self) -> bool:
        return all(getattr(self, n) is None for n in self.__dataclass_fields__)


def default_grids(model: MixtureModel, *, num: int = 24) -> HyperGrids:
    """Wide log-spaced grids as in the paper's section 4 ("discrete grids spanning a wide range").

    alpha: ``logspace(-1, 2)`` (0.1 ... 100: a CRP has about ``alpha log N`` clusters, so
    this covers 1 to ~1400 clusters at N = 10^6; a higher cap lets a tiny early subsample
    drift into an "all singletons, huge alpha" feedback loop, since ``p(alpha | K = n)``
    increases in alpha);
    discount: ``0, 0.05, ..., 0.9`` for Pitman-Yor only; Dirichlet/Beta pseudo-counts:
    ``logspace(-1, 1.5)``; NIX (for standardised data): ``mu0`` in ``[-3, 3]``,
    ``kappa0, sigma2`` in ``logspace(-2, 2)``, ``nu0`` in ``logspace(-1, 2)``.

    Parameters
    ----------
    model
        The :class:`MixtureModel` (which grids apply).
    num
        Points per grid.

    Returns
    -------
    HyperGrids
    """
    is_py = isinstance(model.prior, PitmanYor)
    has = lambda t: any(isinstance(f, t) for f in model.features)  # noqa: E731
    if model.is_finite:
        a = d = None
    else:
        a = tuple(np.logspace(-1, 2, num))
        d = tuple(np.round(np.arange(0.0, 0.91, 0.05), 2)) if is_py else None
    return HyperGrids(
        alpha=a,
        discount=d,
        dirichlet=tuple(np.logspace(-1, 1.5, num)) if has(DirichletCategorical) else None,
        beta=tuple(np.logspace(-1, 1.5, num)) if has(BetaBernoulli) else None,
        nix_mu0=tuple(np.linspace(-3, 3, num)) if has(NormalInverseChiSquared) else None,
        nix_kappa0=tuple(np.logspace(-2, 2, num)) if has(NormalInverseChiSquared) else None,
        nix_nu0=tuple(np.logspace(-1, 2, num)) if has(NormalInverseChiSquared) else None,
        nix_sigma2=tuple(np.logspace(-2, 2, num)) if has(NormalInverseChiSquared) else None,
    )


# --------------------------------------------------------------------------- data
class EncodedData(NamedTuple):
    """Data in the layout the kernels use.

    Attributes
    ----------
    cat
        ``[N, num_cat_features]`` int32 *global* level indices (level + feature offset)
        into the count table.
    real
        ``[N, num_real_features]`` floats.
    """

    cat: jnp.ndarray
    real: jnp.ndarray

    @property
    def num_rows(self) -> int:
        return int(self.cat.shape[0])


def encode(model: MixtureModel, data, dtype=jnp.float32) -> EncodedData:
    """Validate a data table against ``model`` and convert it to :class:`EncodedData`.

    Parameters
    ----------
    model
        The mixture model; column ``j`` of ``data`` is modelled by ``model.features[j]``.
    data
        Array ``[N, num_features]`` (any numeric dtype), or an :class:`EncodedData` (returned as is).
    dtype
        Float dtype of the real columns.

    Raises
    ------
    ValueError
        If the number of columns differs from the number of features, a categorical
        or Bernoulli column holds non-integer or out-of-range values, or a value is NaN/inf.

    Returns
    -------
    EncodedData
    """
    if isinstance(data, EncodedData):
        return data
    arr = np.asarray(data)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] < 1:
        raise ValueError(f"data must be a 2-D array [N, num_features] with N >= 1; got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"data must be numeric; got dtype {arr.dtype}")
    if arr.shape[1] != model.num_features:
        raise ValueError(
            f"data has {arr.shape[1]} column(s) but the model has {model.num_features} feature(s); "
            "give one feature model per column"
        )
    cats = []
    for j, i in enumerate(model.cat_columns):
        col = arr[:, i]
        feat = model.features[i]
        kind = type(feat).__name__
        if not np.all(np.isfinite(col)) or not np.all(np.equal(np.mod(col, 1), 0)):
            raise ValueError(f"column {i} is modelled by {kind} but holds non-integer values (mismatched feature type)")
        if col.min() < 0 or col.max() >= feat.num_levels:
            raise ValueError(
                f"column {i} is modelled by {kind} with {feat.num_levels} levels but holds values in "
                f"[{col.min():g}, {col.max():g}] (mismatched feature type or num_levels)"
            )
        cats.append(col.astype(np.int32) + model.level_offsets[j])
    reals = []
    for i in model.real_columns:
        col = arr[:, i].astype(np.float64)
        if not np.all(np.isfinite(col)):
            raise ValueError(f"column {i} (NormalInverseChiSquared) holds NaN/inf values")
        reals.append(col)
    n = arr.shape[0]
    cat = np.stack(cats, axis=1) if cats else np.zeros((n, 0), np.int32)
    real = np.stack(reals, axis=1) if reals else np.zeros((n, 0), np.float64)
    return EncodedData(cat=jnp.asarray(cat, jnp.int32), real=jnp.asarray(real, dtype))


def make_model(prior: PartitionPrior, features: Sequence) -> MixtureModel:
    """Shorthand for :class:`MixtureModel`."""
    return MixtureModel(prior=prior, features=tuple(features))
