"""Hyperparameter grids (uniform or weighted priors) of :func:`~jaxsub.anneal.crosscat.resample_hypers`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from jaxsub.anneal.crosscat.model import CrossCatModel, encode_table
from jaxsub.anneal.model import PitmanYor
from jaxsub.validation import check_int

__all__ = ["CrossCatGrids", "data_grids", "default_crosscat_grids"]


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
            lo_ok = (
                (v >= 0) & (v < 1) if name.endswith("_d") else (v > 0 if name != "nix_mu0" else np.ones_like(v, bool))
            )
            if not np.all(lo_ok):
                raise ValueError(f"grid {name} has values outside its range; got {g!r}")
            object.__setattr__(self, name, tuple(float(x) for x in v))


def default_crosscat_grids(model: CrossCatModel, num: int = 12) -> CrossCatGrids:
    """Log-spaced grids: alphas ``[0.1, 30]``, discounts ``0..0.6`` (PY only), Dirichlet ``[0.05, 10]``, NIX.

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.crosscat.CrossCatModel` (which grids apply).
    num
        Points per alpha, Dirichlet and NIX grid.

    Returns
    -------
    CrossCatGrids
    """
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


def data_grids(
    model: CrossCatModel, data, num: int = 12, style: str = "quantiles", *, sigma2_weight: bool = True
) -> CrossCatGrids:
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
    (it changes the target posterior), opt-in: against the default grids on paired keys neither style gains beyond
    2 standard errors of the held-out score (measured), so neither is the default. The grids are shared by every
    real column (a tuple per parameter), so the columns must share their centre and scale: pass standardised reals
    (``mean`` / ``var`` are pooled over the real columns). Other grids are the default's.

    Parameters
    ----------
    model
        The :class:`CrossCatModel` (a model without real features gets the default grids).
    data
        The training rows, ``[N, F]`` (NaN = missing), real columns standardised.
    num
        Points per grid, ``>= 2``.
    style
        ``"quantiles"`` or ``"weights"`` (above).
    sigma2_weight
        ``style="weights"`` only: weight the ``sigma2`` points by lace's ``sigma2`` hyperprior (``True``, the
        default) or leave them unweighted (``False``: ``nix_logprior[3]`` is ``None``).

    Returns
    -------
    CrossCatGrids

    Raises
    ------
    ValueError
        For a table the model rejects, an unknown ``style``, ``num < 2``, a ``sigma2_weight`` that is
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
        raise ValueError(
            f"data_grids shares one NIX grid across the real columns: their means ({means.round(3)}) and "
            f"variances ({vars_.round(3)}) must agree; standardise the real columns first"
        )
    a = max(math.log(n), 1.01)
    pm, pk, pnu, ps2 = (
        stats.norm(m, math.sqrt(v)),
        stats.gamma(1.0),
        stats.invgamma(a, scale=a),
        stats.invgamma(a, scale=v),
    )
    if style == "weights":
        g_m = m + math.sqrt(v) * np.linspace(-2, 2, num)
        g_k, g_nu, g_s2 = np.asarray(base.nix_kappa0), np.asarray(base.nix_nu0), v * np.asarray(base.nix_sigma2)
        lw = (
            pm.logpdf(g_m),
            pk.logpdf(g_k) + np.log(g_k),
            pnu.logpdf(g_nu) + np.log(g_nu),
            ps2.logpdf(g_s2) + np.log(g_s2),
        )
        lw = tuple(tuple(np.maximum(w - w.max(), -200.0)) for w in lw)  # finite: a point far out keeps weight e^-200
        if not sigma2_weight:
            lw = lw[:3] + (None,)  # sigma2: uniform over its (log-spaced) points
        return dataclasses.replace(
            base,
            nix_mu0=tuple(g_m),
            nix_kappa0=tuple(g_k),
            nix_nu0=tuple(g_nu),
            nix_sigma2=tuple(g_s2),
            nix_logprior=lw,
        )
    q = (np.arange(num) + 0.5) / num
    return dataclasses.replace(
        base,
        nix_mu0=tuple(pm.ppf(q)),
        nix_kappa0=tuple(pk.ppf(q)),
        nix_nu0=tuple(pnu.ppf(q)),
        nix_sigma2=tuple(ps2.ppf(q)),
    )
