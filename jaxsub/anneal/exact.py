"""Exact references, in NumPy/SciPy (independent of the JAX kernels): two-urn posterior, tiny mixtures.

* :func:`two_urn_log_posterior`: the two-urn model of the paper's section 3.2 /
  Figure 2, whose posterior over ``(#red in the left urn, #blue in the left urn)``
  is available in closed form;
* :func:`enumerate_partitions` and :func:`exact_partition_posterior`: the exact
  posterior over all set partitions of a tiny data set (N <= ~8), used by the
  tests to check that the Gibbs kernel leaves it invariant.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from scipy.special import gammaln

from jaxsub.anneal.model import (
    BetaBernoulli,
    DirichletCategorical,
    Finite,
    MixtureModel,
    NormalInverseChiSquared,
)

__all__ = [
    "canonical_labels",
    "enumerate_partitions",
    "exact_partition_posterior",
    "log_eppf",
    "log_marginal_feature",
    "two_urn_log_posterior",
]


def two_urn_log_posterior(num_red: int, num_blue: int, alpha: float, p_left: float) -> np.ndarray:
    """Normalised log posterior ``[num_red + 1, num_blue + 1]`` over ``(i, j)`` = (#red, #blue) in the left urn.

    Each ball is in the left urn with probability ``p_left``; each urn's red
    probability has a ``Beta(alpha, alpha)`` prior, integrated out::

        P(i, j) propto C(R, i) C(B, j) p^(i+j) (1-p)^(N-i-j)
                       B(alpha + i, alpha + j) B(alpha + R - i, alpha + B - j)

    ``B(a + i, a + j) = Gamma(a+i) Gamma(a+j) / Gamma(2a + i + j)``, so the log is
    ``u[i] + v[j] + w[i + j]``: O(R B) additions, no 2-D special functions.

    Parameters
    ----------
    num_red, num_blue : int
        ``R`` and ``B``, the numbers of red and blue balls.
    alpha : float
        The symmetric Beta prior's parameter (> 0).
    p_left : float
        The probability ``p`` that a ball is in the left urn, in ``(0, 1)``.

    Returns
    -------
    np.ndarray
        Float64 array of shape ``[R + 1, B + 1]``: ``log P(i, j)``, normalised (its exponentials sum to 1).
    """
    R, B, a = int(num_red), int(num_blue), float(alpha)
    N = R + B
    i = np.arange(R + 1, dtype=np.float64)
    j = np.arange(B + 1, dtype=np.float64)
    s = np.arange(N + 1, dtype=np.float64)
    u = (gammaln(R + 1) - gammaln(i + 1) - gammaln(R - i + 1)) + gammaln(a + i) + gammaln(a + R - i)
    v = (gammaln(B + 1) - gammaln(j + 1) - gammaln(B - j + 1)) + gammaln(a + j) + gammaln(a + B - j)
    w = s * math.log(p_left) + (N - s) * math.log1p(-p_left) - gammaln(2 * a + s) - gammaln(2 * a + N - s)
    logp = u[:, None] + v[None, :]
    idx = np.arange(R + 1)[:, None] + np.arange(B + 1)[None, :]
    logp += w[idx]
    top = logp.max()
    logp -= top + math.log(np.exp(logp - top).sum())
    return logp


def enumerate_partitions(n: int) -> Iterator[tuple]:
    """All set partitions of ``{0..n-1}`` as canonical label tuples (restricted growth strings).

    There are Bell(n) of them (52 for ``n = 5``, 4140 for ``n = 8``).

    Parameters
    ----------
    n : int
        The number of items.

    Yields
    ------
    tuple of int
        A length-``n`` tuple of labels in first-appearance order (``(0, 0, 1)``, ``(0, 1, 0)``, ...).
    """

    def rec(prefix, k):
        if len(prefix) == n:
            yield tuple(prefix)
            return
        for c in range(k + 1):
            yield from rec(prefix + [c], max(k, c + 1))

    yield from rec([], 0)


def canonical_labels(z) -> tuple:
    """Relabel clusters by order of first appearance (the partition, forgetting slot names).

    Parameters
    ----------
    z : array_like
        One-dimensional cluster labels, e.g. ``[3, 3, 0, 3]``.

    Returns
    -------
    tuple of int
        The same partition with labels ``0, 1, ...`` in first-appearance order, e.g. ``(0, 0, 1, 0)``.
    """
    mapping, out = {}, []
    for v in np.asarray(z).tolist():
        if v not in mapping:
            mapping[v] = len(mapping)
        out.append(mapping[v])
    return tuple(out)


def log_eppf(sizes, alpha: float, discount: float) -> float:
    """Pitman-Yor exchangeable partition probability of a partition with block ``sizes``.

    For ``K`` blocks of sizes ``n_k`` summing to ``n``::

        log EPPF = sum_{i=1}^{K-1} log(alpha + i d) - log Gamma(alpha + n) + log Gamma(alpha + 1)
                   + sum_k [log Gamma(n_k - d) - log Gamma(1 - d)]

    (``d = 0`` gives the Chinese restaurant process).

    Parameters
    ----------
    sizes : iterable of int
        The block sizes; zeros are ignored.
    alpha : float
        The concentration (``> -discount``).
    discount : float
        The discount ``d`` in ``[0, 1)``.

    Returns
    -------
    float
        The log probability of the partition.
    """
    sizes = [int(s) for s in sizes if s > 0]
    k, n = len(sizes), sum(sizes)
    out = sum(math.log(alpha + i * discount) for i in range(1, k))
    out -= math.lgamma(alpha + n) - math.lgamma(alpha + 1)
    out += sum(math.lgamma(s - discount) - math.lgamma(1 - discount) for s in sizes)
    return out


def log_marginal_feature(feature, values) -> float:
    """``log p(values)`` of one cluster's column under a conjugate feature model (closed form).

    Dirichlet-categorical (and Beta-Bernoulli) columns use the Dirichlet-multinomial marginal
    ``log Gamma(sum beta) - log Gamma(sum beta + n) + sum_l [log Gamma(beta_l + c_l) - log Gamma(beta_l)]``;
    Normal-inverse-chi-squared columns the Student-type marginal of the conjugate update.

    Parameters
    ----------
    feature : BetaBernoulli, DirichletCategorical or NormalInverseChiSquared
        The column's feature model (fixed hyperparameters).
    values : array_like
        The column's values for the cluster's rows (level indices for categorical features); may be empty.

    Returns
    -------
    float
        The log marginal likelihood (0 for no values).

    Raises
    ------
    ValueError
        For a feature model of another type.
    """
    x = np.asarray(values)
    n = x.size
    if isinstance(feature, (BetaBernoulli, DirichletCategorical)):
        beta = np.asarray(feature.pseudo_counts(), np.float64)
        counts = np.bincount(x.astype(int), minlength=beta.size).astype(np.float64)
        return float(gammaln(beta.sum()) - gammaln(beta.sum() + n) + np.sum(gammaln(beta + counts) - gammaln(beta)))
    if isinstance(feature, NormalInverseChiSquared):
        mu0, k0, nu0, s2 = feature.mu0, feature.kappa0, feature.nu0, feature.sigma2
        if n == 0:
            return 0.0
        xbar = x.mean()
        ss = float(((x - xbar) ** 2).sum())
        kn, nun = k0 + n, nu0 + n
        nus2n = nu0 * s2 + ss + k0 * n / kn * (xbar - mu0) ** 2
        return float(
            gammaln(nun / 2)
            - gammaln(nu0 / 2)
            + 0.5 * math.log(k0 / kn)
            + nu0 / 2 * math.log(nu0 * s2)
            - nun / 2 * math.log(nus2n)
            - n / 2 * math.log(math.pi)
        )
    raise ValueError(f"unknown feature {feature!r}")


def exact_partition_posterior(model: MixtureModel, data) -> tuple[list, np.ndarray]:
    """Exact posterior over all partitions of a tiny data set (fixed hyperparameters).

    The posterior probability of a partition is ``propto EPPF(sizes) prod_k prod_f p(X_kf)``
    (:func:`log_eppf`, :func:`log_marginal_feature`). For a :class:`Finite` prior the states
    are labelled assignments, weighted by the components' ``weights``. The cost is Bell(N)
    partitions (or ``K**N`` assignments), so keep ``N`` at about 8 or less.

    Parameters
    ----------
    model : MixtureModel
        The mixture (partition prior and conjugate features; hyperparameters as given).
    data : array_like
        The ``[N, F]`` data, column ``f`` for ``model.features[f]`` (level indices for categorical features).

    Returns
    -------
    partitions : list of tuple
        The canonical label tuples (or labelled assignments for a ``Finite`` prior).
    probs : np.ndarray
        ``[len(partitions)]`` posterior probabilities, summing to 1.
    """
    x = np.asarray(data)
    n = x.shape[0]
    if isinstance(model.prior, Finite):
        import itertools

        w = np.log(np.asarray(model.prior.weights))
        states = list(itertools.product(range(w.size), repeat=n))
        logp = []
        for z in states:
            z = np.asarray(z)
            lp = float(w[z].sum())
            for k in range(w.size):
                for f, feat in enumerate(model.features):
                    lp += log_marginal_feature(feat, x[z == k, f])
            logp.append(lp)
    else:
        states = list(enumerate_partitions(n))
        alpha, d = model.prior.alpha, model.prior.discount
        logp = []
        for z in states:
            z = np.asarray(z)
            sizes = np.bincount(z)
            lp = log_eppf(sizes, alpha, d)
            for k in range(sizes.size):
                for f, feat in enumerate(model.features):
                    lp += log_marginal_feature(feat, x[z == k, f])
            logp.append(lp)
    logp = np.asarray(logp)
    probs = np.exp(logp - logp.max())
    return states, probs / probs.sum()
