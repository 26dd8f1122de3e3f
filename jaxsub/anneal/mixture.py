"""Collapsed mixture state in JAX: assignments + per-cluster sufficient statistics.

The state holds, for a static ``capacity`` of cluster slots, the size of each
cluster, its categorical level counts and its real-feature sums. An empty slot
(size 0) has the statistics of the prior, so the collapsed predictive of a row
in an empty slot *is* the prior predictive ``p(x)``; the first empty slot plays
the role of "a new cluster" in the paper's equation (star)::

    P[row joins cluster k]   propto (n_k - d) p(x | X_k)          (existing k)
    P[row starts a cluster]  propto (alpha + K d) p(x)            (new)

with ``d = 0`` for the CRP (Obermeyer et al. 2014, eq. star; Pitman & Yor
1997 for the discount ``d``). Collapsed predictives (all conjugate):

* categorical level ``l`` of feature ``f``: ``(beta_l + c_kl) / (B_f + n_k)``,
  ``B_f = sum_l beta_l`` (Dirichlet-multinomial; Beta-Bernoulli is the 2-level case);
* real feature, NIX(mu0, kappa0, nu0, s0^2): Student-t with ``nu_n = nu0 + n``
  degrees of freedom, location ``mu_n = (kappa0 mu0 + S1) / kappa_n``, squared
  scale ``sigma_n^2 (1 + 1 / kappa_n)``, where ``kappa_n = kappa0 + n`` and
  ``nu_n sigma_n^2 = nu0 s0^2 + S2 + kappa0 mu0^2 - kappa_n mu_n^2``
  (``S1 = sum x``, ``S2 = sum x^2``; Gelman et al. BDA3 eq. 3.7-3.9).

A cluster is never dropped: when an add finds no empty slot the kernels stop
(see :mod:`jaxsub.anneal.moves`) and :func:`grow` reallocates outside jit.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln

from jaxsub.anneal.model import EncodedData, Hypers, MixtureModel, init_hypers
from jaxsub.validation import check_int

__all__ = [
    "CapacityError",
    "MixtureState",
    "add",
    "assign_logits",
    "update_stats",
    "cluster_log_marginals",
    "empty_state",
    "grow",
    "heldout_log_predictive",
    "log_joint",
    "log_partition_prior",
    "num_clusters",
    "predictive_log_scores",
    "remove",
    "state_from_assignments",
]

_LOG_PI = math.log(math.pi)


class CapacityError(RuntimeError):
    """Raised when a mixture needs more cluster slots than ``max_capacity`` allows."""


class MixtureState(NamedTuple):
    """Collapsed mixture state.

    Attributes
    ----------
    assignments
        ``[N]`` int32 cluster slot of every row, ``-1`` for rows not in the subsample.
    sizes
        ``[capacity]`` int32 number of rows in each slot (0 = empty slot).
    cat_counts
        ``[capacity, total_levels]`` int32 level counts of the categorical features.
    real_sums
        ``[capacity, num_real_features, 2]`` float ``(sum x, sum x^2)`` per real feature.
    hypers
        :class:`~jaxsub.anneal.model.Hypers`.
    """

    assignments: jnp.ndarray
    sizes: jnp.ndarray
    cat_counts: jnp.ndarray
    real_sums: jnp.ndarray
    hypers: Hypers

    @property
    def capacity(self) -> int:
        return int(self.sizes.shape[-1])


def empty_state(
    model: MixtureModel, num_rows: int, capacity: int, hypers: Hypers | None = None, dtype=jnp.float32
) -> MixtureState:
    """A state with no row assigned (the start of Sequential and Anneal schedules).

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.model.MixtureModel`.
    num_rows, capacity
        ``N`` and the number of cluster slots (static).
    hypers
        Initial hyperparameters (default :func:`~jaxsub.anneal.model.init_hypers`).
    dtype
        Float dtype of the real sums.

    Returns
    -------
    MixtureState
        All ``assignments`` ``-1``, all counts and sums zero.

    Raises
    ------
    ValueError
        ``num_rows`` or ``capacity`` below 1, or, for a ``Finite`` prior, ``capacity`` other than its
        number of components.
    """
    num_rows = check_int("num_rows", num_rows, low=1)
    capacity = check_int("capacity", capacity, low=1)
    if model.is_finite and capacity != len(model.prior.weights):
        raise ValueError(
            f"capacity must equal the number of Finite components ({len(model.prior.weights)}); got {capacity}"
        )
    if hypers is None:
        hypers = init_hypers(model, dtype)
    return MixtureState(
        assignments=jnp.full((num_rows,), -1, jnp.int32),
        sizes=jnp.zeros((capacity,), jnp.int32),
        cat_counts=jnp.zeros((capacity, model.total_levels), jnp.int32),
        real_sums=jnp.zeros((capacity, len(model.real_columns), 2), hypers.nix.dtype),
        hypers=hypers,
    )


def state_from_assignments(
    model: MixtureModel, data: EncodedData, assignments, capacity: int, hypers: Hypers | None = None, dtype=jnp.float32
) -> MixtureState:
    """Build the sufficient statistics of a given assignment vector (``-1`` = unassigned).

    Works under ``jit``/``vmap`` (``capacity`` is static); labels must lie in
    ``[-1, capacity)``.

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.model.MixtureModel`.
    data
        The :class:`~jaxsub.anneal.model.EncodedData`.
    assignments
        ``[N]`` labels in ``[-1, capacity)``.
    capacity
        Number of cluster slots (static).
    hypers
        Hyperparameters (default :func:`~jaxsub.anneal.model.init_hypers`).
    dtype
        Float dtype of the real sums.

    Returns
    -------
    MixtureState
    """
    if hypers is None:
        hypers = init_hypers(model, dtype)
    z = jnp.asarray(assignments, jnp.int32)
    on = z >= 0
    seg = jnp.where(on, z, capacity)  # unassigned rows go to a discarded extra segment
    ones = on.astype(jnp.int32)
    sizes = jax.ops.segment_sum(ones, seg, capacity + 1)[:capacity]
    counts = jnp.zeros((capacity + 1, model.total_levels), jnp.int32)
    if model.total_levels:
        counts = counts.at[seg[:, None], data.cat].add(ones[:, None])
    counts = counts[:capacity]
    x = data.real.astype(hypers.nix.dtype)
    mask = on[:, None].astype(x.dtype)
    sums = jnp.stack([x * mask, x * x * mask], axis=-1)
    real_sums = jax.ops.segment_sum(sums, seg, capacity + 1)[:capacity]
    return MixtureState(z, sizes, counts, real_sums, hypers)


def num_clusters(state: MixtureState) -> jnp.ndarray:
    """Number of non-empty clusters.

    Parameters
    ----------
    state
        One chain's :class:`MixtureState`.

    Returns
    -------
    jnp.ndarray
        Int scalar.
    """
    return jnp.sum(state.sizes > 0, axis=-1)


# --------------------------------------------------------------------------- add / remove
def _row(data: EncodedData, row):
    return data.cat[row], data.real[row]


def update_stats(state: MixtureState, data: EncodedData, row, cluster, delta) -> MixtureState:
    """Add ``delta`` (an int32 scalar: +1, -1 or 0) copies of ``row`` to slot ``cluster``'s statistics.

    Leaves ``assignments`` untouched (the kernels write them separately, see
    ``moves._tick_plan``, which lets XLA update the ``[N]`` arrays in place inside a scan).
    O(num_features) scatter updates: ``sizes``, the categorical level counts and the real
    columns' ``(sum x, sum x**2)``.

    Parameters
    ----------
    state : MixtureState
        One chain's state.
    data : EncodedData
        The encoded data set (:func:`~jaxsub.anneal.encode`).
    row : int or jnp.ndarray
        The row index (int32 scalar, may be traced).
    cluster : int or jnp.ndarray
        The slot index in ``[0, capacity)``.
    delta : int or jnp.ndarray
        The number of copies to add (negative to remove).

    Returns
    -------
    MixtureState
        ``state`` with updated ``sizes``, ``cat_counts`` and ``real_sums``.
    """
    cat, real = _row(data, row)
    delta = jnp.asarray(delta, jnp.int32)
    sizes = state.sizes.at[cluster].add(delta)
    counts = state.cat_counts.at[cluster, cat].add(delta) if cat.shape[0] else state.cat_counts
    real_sums = state.real_sums
    if real.shape[0]:
        x = real.astype(real_sums.dtype)
        real_sums = real_sums.at[cluster].add(jnp.stack([x, x * x], axis=-1) * delta.astype(real_sums.dtype))
    return state._replace(sizes=sizes, cat_counts=counts, real_sums=real_sums)


def add(state: MixtureState, data: EncodedData, row, cluster, gate=True) -> MixtureState:
    """Add ``row`` (currently unassigned) to slot ``cluster``. ``gate=False`` makes it a no-op.

    O(num_features): a few scatter updates, no O(N) or O(capacity) work.

    Parameters
    ----------
    state
        One chain's :class:`MixtureState`.
    data
        The :class:`~jaxsub.anneal.model.EncodedData`.
    row, cluster
        Row index and capacity slot (int scalars, may be traced).
    gate
        Bool scalar; ``False`` makes the call a no-op.

    Returns
    -------
    MixtureState
    """
    cat, real = _row(data, row)
    g = jnp.asarray(gate)
    gi = g.astype(jnp.int32)
    sizes = state.sizes.at[cluster].add(gi)
    counts = state.cat_counts.at[cluster, cat].add(gi) if cat.shape[0] else state.cat_counts
    real_sums = state.real_sums
    if real.shape[0]:
        x = real.astype(real_sums.dtype)
        gf = g.astype(real_sums.dtype)
        real_sums = real_sums.at[cluster].add(jnp.stack([x, x * x], axis=-1) * gf)
    old = state.assignments[row]
    assignments = state.assignments.at[row].set(jnp.where(g, jnp.asarray(cluster, jnp.int32), old))
    return state._replace(assignments=assignments, sizes=sizes, cat_counts=counts, real_sums=real_sums)


def remove(state: MixtureState, data: EncodedData, row, gate=True) -> MixtureState:
    """Remove ``row`` from its cluster (no-op if it is unassigned or ``gate`` is False).

    The exact inverse of :func:`add` on the integer statistics; real sums are
    restored up to floating-point round-off.

    Parameters
    ----------
    state
        One chain's :class:`MixtureState`.
    data
        The :class:`~jaxsub.anneal.model.EncodedData`.
    row
        Row index (int scalar, may be traced).
    gate
        Bool scalar; ``False`` makes the call a no-op.

    Returns
    -------
    MixtureState
    """
    cat, real = _row(data, row)
    k_raw = state.assignments[row]
    g = jnp.asarray(gate) & (k_raw >= 0)
    k = jnp.maximum(k_raw, 0)
    gi = g.astype(jnp.int32)
    sizes = state.sizes.at[k].add(-gi)
    counts = state.cat_counts.at[k, cat].add(-gi) if cat.shape[0] else state.cat_counts
    real_sums = state.real_sums
    if real.shape[0]:
        x = real.astype(real_sums.dtype)
        gf = g.astype(real_sums.dtype)
        real_sums = real_sums.at[k].add(-jnp.stack([x, x * x], axis=-1) * gf)
    assignments = state.assignments.at[row].set(jnp.where(g, -1, k_raw))
    return state._replace(assignments=assignments, sizes=sizes, cat_counts=counts, real_sums=real_sums)


# --------------------------------------------------------------------------- scores
def _student_t_logpdf(x, sizes_f, sums, nix):
    """log Student-t collapsed predictive; x ``[..., R]``, sizes ``[C, 1]``, sums ``[C, R, 2]``, nix ``[R, 4]``."""
    mu0, kappa0, nu0, s2 = nix[:, 0], nix[:, 1], nix[:, 2], nix[:, 3]
    s1, sq = sums[..., 0], sums[..., 1]
    kappa_n = kappa0 + sizes_f
    nu_n = nu0 + sizes_f
    mu_n = (kappa0 * mu0 + s1) / kappa_n
    nus2 = nu0 * s2 + sq + kappa0 * mu0 * mu0 - kappa_n * mu_n * mu_n
    nus2 = jnp.maximum(nus2, nu0 * s2 * 1e-6)  # guards float round-off only (the exact value is >= nu0 s2)
    scale2 = nus2 / nu_n * (1.0 + 1.0 / kappa_n)
    z = (x - mu_n) ** 2 / (nu_n * scale2)
    return (
        gammaln(0.5 * (nu_n + 1.0))
        - gammaln(0.5 * nu_n)
        - 0.5 * (jnp.log(nu_n * scale2) + _LOG_PI)
        - 0.5 * (nu_n + 1.0) * jnp.log1p(z)
    )


def predictive_log_scores(model: MixtureModel, state: MixtureState, cat_row, real_row) -> jnp.ndarray:
    """``log p(x | X_k)`` for every slot ``k`` (``[capacity]``); empty slots give ``log p(x)``.

    Parameters
    ----------
    cat_row
        ``[num_cat_features]`` global level indices of the row (``EncodedData.cat[i]``).
    real_row
        ``[num_real_features]`` real values of the row.
    model
        The :class:`~jaxsub.anneal.model.MixtureModel`.
    state
        One chain's :class:`MixtureState`.

    Returns
    -------
    jnp.ndarray
        ``[capacity]`` log predictives.
    """
    h = state.hypers
    dt = h.nix.dtype if h.nix.size else h.cat_prior.dtype
    n = state.sizes.astype(dt)
    out = jnp.zeros(state.sizes.shape, dt)
    if cat_row.shape[-1]:
        c = state.cat_counts[:, cat_row].astype(dt)  # [C, Fc]
        b = h.cat_prior[cat_row]  # [Fc]
        out = out + jnp.sum(jnp.log(b + c) - jnp.log(h.cat_total + n[:, None]), axis=-1)
    if real_row.shape[-1]:
        out = out + jnp.sum(_student_t_logpdf(real_row.astype(dt), n[:, None], state.real_sums, h.nix), axis=-1)
    return out


def _new_slot(sizes):
    """Index of the first empty slot, and whether one exists."""
    empty = sizes == 0
    return jnp.argmax(empty), jnp.any(empty)


def assign_logits(
    model: MixtureModel, state: MixtureState, cat_row, real_row, beta=1.0, prior_only=False
) -> jnp.ndarray:
    """Unnormalised log-probabilities of eq. (star) over the ``capacity`` slots.

    Existing cluster ``k``: ``log(n_k - d) + beta log p(x | X_k)``; the first empty
    slot: ``log(alpha + K d) + beta log p(x)``; other empty slots: ``-inf``.
    For a :class:`Finite` prior every slot ``k`` gets ``log w_k + beta log p(x | X_k)``.
    ``beta`` tempers the likelihood (1 = exact Gibbs; < 1 = energy annealing),
    ``prior_only`` drops it (a draw from the partition prior).

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.model.MixtureModel`.
    state
        One chain's :class:`MixtureState`.
    cat_row, real_row
        The row's global level indices and real values (a row of ``EncodedData``).
    beta
        Likelihood temperature (default 1).
    prior_only
        Bool; drop the likelihood.

    Returns
    -------
    jnp.ndarray
        ``[capacity]`` log weights.
    """
    h = state.hypers
    dt = h.alpha.dtype
    lik = predictive_log_scores(model, state, cat_row, real_row).astype(dt)
    lik = jnp.where(prior_only, jnp.zeros_like(lik), lik * beta)
    sizes = state.sizes
    if model.is_finite:
        logw = jnp.log(jnp.asarray(model.prior.weights, dt))
        return logw + lik
    k_new, _ = _new_slot(sizes)
    num_k = jnp.sum(sizes > 0).astype(dt)
    occupied = sizes > 0
    n = sizes.astype(dt)
    w_old = jnp.log(jnp.where(occupied, n - h.discount, 1.0))
    w_new = jnp.log(h.alpha + num_k * h.discount)
    slot = jnp.arange(sizes.shape[0])
    prior_logw = jnp.where(occupied, w_old, jnp.where(slot == k_new, w_new, -jnp.inf))
    return prior_logw + lik


# --------------------------------------------------------------------------- marginals
def log_partition_prior(model: MixtureModel, sizes, alpha, discount) -> jnp.ndarray:
    """Log probability of a partition with cluster ``sizes`` (exchangeable partition probability).

    Pitman-Yor (CRP when ``d = 0``; Pitman 2006, eq. 3.6)::

        log p(pi) = sum_{i=1}^{K-1} log(alpha + i d) - [lgamma(alpha + n) - lgamma(alpha + 1)]
                    + sum_k [lgamma(n_k - d) - lgamma(1 - d)]

    ``alpha``/``discount`` may carry a leading grid axis ``[G]`` (then ``[G]`` is returned).
    For :class:`Finite`: ``sum_k n_k log w_k`` (assignments, i.e. labelled partitions).

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.model.MixtureModel` (its prior's kind).
    sizes
        ``[capacity]`` cluster sizes (0 for empty slots).
    alpha, discount
        Scalars or ``[G]`` grids.

    Returns
    -------
    jnp.ndarray
        Scalar (or ``[G]``) log probability.
    """
    dt = jnp.asarray(alpha).dtype
    n_k = sizes.astype(dt)
    if model.is_finite:
        return jnp.sum(n_k * jnp.log(jnp.asarray(model.prior.weights, dt)))
    alpha = jnp.asarray(alpha)[..., None]
    d = jnp.asarray(discount)[..., None]
    occ = sizes > 0
    k = jnp.sum(occ).astype(dt)
    n = jnp.sum(n_k)
    i = jnp.arange(1, sizes.shape[0] + 1, dtype=dt)
    seat_new = jnp.sum(jnp.where(i <= k - 1.0, jnp.log(alpha + i * d), 0.0), axis=-1)
    norm = gammaln(alpha[..., 0] + n) - gammaln(alpha[..., 0] + 1.0)
    tables = jnp.sum(jnp.where(occ, gammaln(jnp.where(occ, n_k, 1.0) - d) - gammaln(1.0 - d), 0.0), axis=-1)
    return seat_new - norm + tables


def dirichlet_multinomial_log_marginal(pseudo, counts) -> jnp.ndarray:
    """``sum_k log p(X_k)`` of one categorical feature: pseudo ``[..., L]``, counts ``[C, L]`` -> ``[...]``.

    ``log p(X_k) = lgamma(B) - lgamma(B + n_k) + sum_l [lgamma(beta_l + c_kl) - lgamma(beta_l)]``
    (empty clusters contribute 0).
    """
    c = counts.astype(pseudo.dtype)
    nk = jnp.sum(c, axis=-1)
    total = jnp.sum(pseudo, axis=-1)
    pseudo_b = pseudo[..., None, :]
    per = (
        gammaln(total[..., None])
        - gammaln(total[..., None] + nk)
        + jnp.sum(gammaln(pseudo_b + c) - gammaln(pseudo_b), axis=-1)
    )
    return jnp.sum(per, axis=-1)


def nix_log_marginal(params, sizes, sums) -> jnp.ndarray:
    """``sum_k log p(X_k)`` of one real feature under NIX: params ``[..., 4]``, sizes ``[C]``, sums ``[C, 2]``.

    ``log p(X) = lgamma(nu_n/2) - lgamma(nu0/2) + 1/2 log(kappa0/kappa_n)
    + nu0/2 log(nu0 s0^2) - nu_n/2 log(nu_n s_n^2) - n/2 log(pi)`` (Murphy 2007, eq. 171).
    """
    p = params[..., None, :]
    mu0, kappa0, nu0, s2 = p[..., 0], p[..., 1], p[..., 2], p[..., 3]
    n = sizes.astype(params.dtype)
    s1, sq = sums[:, 0], sums[:, 1]
    kappa_n = kappa0 + n
    nu_n = nu0 + n
    mu_n = (kappa0 * mu0 + s1) / kappa_n
    nus2 = nu0 * s2 + sq + kappa0 * mu0 * mu0 - kappa_n * mu_n * mu_n
    nus2 = jnp.maximum(nus2, nu0 * s2 * 1e-6)
    per = (
        gammaln(0.5 * nu_n)
        - gammaln(0.5 * nu0)
        + 0.5 * (jnp.log(kappa0) - jnp.log(kappa_n))
        + 0.5 * nu0 * jnp.log(nu0 * s2)
        - 0.5 * nu_n * jnp.log(nus2)
        - 0.5 * n * _LOG_PI
    )
    return jnp.sum(per, axis=-1)


def cluster_log_marginals(model: MixtureModel, state: MixtureState) -> jnp.ndarray:
    """``sum_k log p(X_k)``: the collapsed log-likelihood of the assigned rows given the partition.

    Sums, over the slots and the features, the Dirichlet-multinomial marginals of the categorical
    counts and the Normal-inverse-chi-squared marginals of the real sums, at the state's
    hyperparameters (empty slots contribute 0).

    Parameters
    ----------
    model : MixtureModel
        The :class:`~jaxsub.anneal.model.MixtureModel`.
    state : MixtureState
        One chain's state.

    Returns
    -------
    jnp.ndarray
        Scalar log marginal likelihood, in the hyperparameters' float dtype.
    """
    h = state.hypers
    total = jnp.zeros((), h.alpha.dtype)
    for j, i in enumerate(model.cat_columns):
        off, L = model.level_offsets[j], model.features[i].num_levels
        total = total + dirichlet_multinomial_log_marginal(
            h.cat_prior[off : off + L], state.cat_counts[:, off : off + L]
        ).astype(total.dtype)
    for j in range(len(model.real_columns)):
        total = total + nix_log_marginal(h.nix[j], state.sizes, state.real_sums[:, j]).astype(total.dtype)
    return total


def log_joint(model: MixtureModel, state: MixtureState) -> jnp.ndarray:
    """``log p(pi_S, X_S)``: partition prior plus collapsed likelihood of the current subsample.

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.model.MixtureModel`.
    state
        One chain's :class:`MixtureState`.

    Returns
    -------
    jnp.ndarray
        Scalar log joint.
    """
    h = state.hypers
    return log_partition_prior(model, state.sizes, h.alpha, h.discount) + cluster_log_marginals(model, state)


def heldout_log_predictive(
    model: MixtureModel, state: MixtureState, test: EncodedData, batch_size: int = 8192
) -> jnp.ndarray:
    """Per-row held-out log predictive ``log p(x_t | pi, X)`` (the paper's cross-validation score).

    ``p(x_t | ...) = sum_k (n_k - d)/(n + alpha) p(x_t | X_k) + (alpha + K d)/(n + alpha) p(x_t)``
    (for :class:`Finite`: ``sum_k w_k p(x_t | X_k)``). Sum the result over test rows for the
    paper's score. Rows are processed ``batch_size`` at a time (``lax.map``) to bound memory.

    Parameters
    ----------
    model
        The :class:`~jaxsub.anneal.model.MixtureModel`.
    state
        One chain's :class:`MixtureState`.
    test
        Held-out rows as :class:`~jaxsub.anneal.model.EncodedData`.
    batch_size
        Rows per ``lax.map`` step (static).

    Returns
    -------
    jnp.ndarray
        ``[T]`` log predictive of each test row.
    """
    h = state.hypers
    dt = h.alpha.dtype
    sizes = state.sizes
    if model.is_finite:
        logw = jnp.log(jnp.asarray(model.prior.weights, dt))
    else:
        n = jnp.sum(sizes).astype(dt)
        occ = sizes > 0
        k_new, _ = _new_slot(sizes)
        num_k = jnp.sum(occ).astype(dt)
        slot = jnp.arange(sizes.shape[0])
        w = jnp.where(occ, sizes.astype(dt) - h.discount, jnp.where(slot == k_new, h.alpha + num_k * h.discount, 0.0))
        logw = jnp.log(w) - jnp.log(n + h.alpha)
    num = test.cat.shape[0]
    pad = (-num) % batch_size
    cat = jnp.pad(test.cat, ((0, pad), (0, 0)))
    real = jnp.pad(test.real, ((0, pad), (0, 0)))
    nb = cat.shape[0] // batch_size

    def one(row_cat, row_real):
        return jax.nn.logsumexp(logw + predictive_log_scores(model, state, row_cat, row_real).astype(dt))

    def batch(args):
        return jax.vmap(one)(*args)

    out = jax.lax.map(batch, (cat.reshape(nb, batch_size, -1), real.reshape(nb, batch_size, -1)))
    return out.reshape(-1)[:num]


# --------------------------------------------------------------------------- capacity
def grow(state, new_capacity: int):
    """Reallocate a (possibly batched) state with ``new_capacity`` cluster slots (outside jit).

    Works on a :class:`MixtureState` or any NamedTuple with a ``mixture`` field;
    leading batch (chain) axes are kept. Occupied slots keep their index, so
    ``assignments`` stay valid; new slots are empty.

    Parameters
    ----------
    state
        :class:`MixtureState` or a state with a ``mixture`` field, possibly batched.
    new_capacity
        The new number of slots, at least the current one.

    Returns
    -------
    The state with ``new_capacity`` slots.

    Raises
    ------
    ValueError
        ``new_capacity`` below the current capacity.
    """
    if hasattr(state, "mixture"):
        return state._replace(mixture=grow(state.mixture, new_capacity))
    cap = state.sizes.shape[-1]
    new_capacity = check_int("new_capacity", new_capacity, low=cap)
    extra = new_capacity - cap
    batch = state.sizes.ndim - 1

    def pad(x, axis_from_batch):
        widths = [(0, 0)] * x.ndim
        widths[batch + axis_from_batch] = (0, extra)
        return jnp.pad(x, widths)

    return state._replace(
        sizes=pad(state.sizes, 0), cat_counts=pad(state.cat_counts, 0), real_sums=pad(state.real_sums, 0)
    )
