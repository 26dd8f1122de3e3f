"""Control variates for racing rewards (§3.4): one type, :class:`ControlVariate`, two builders.

* :func:`data_taylor_control_variate` -- the data-space expansion of eq. 11 (data form, for
  :func:`jaxsub.racing.racing`; also ``jaxsub.discrete.data_taylor_control_variate``);
* :func:`parameter_taylor_control_variate` -- the parameter-space Taylor proxy of each
  datum's log-likelihood around a centre (position form, for the racing MH kernels; also
  ``jaxsub.racing_mh.parameter_taylor_control_variate``).

``taylor_control_variate`` named both builders (the data one here and in :mod:`jaxsub.discrete`,
the parameter one in ``jaxsub.racing_mh``); it remains as a deprecated alias of each in its old
namespace (:func:`taylor_control_variate` here; ``jaxsub.racing.mh.taylor_control_variate``) that
warns with a ``DeprecationWarning`` naming the explicit builder.

Data space (eq. 11). For factors ``f_n(i) = p(y_n | theta_i)`` the reward ``l_{i,n} = log p(y_n | theta_i)``
is expanded around a reference point ``y_hat`` in *data space*::

    h_{i,n} = l_i(y_hat) + g_i^T (y_n - y_hat) + 1/2 (y_n - y_hat)^T H_i (y_n - y_hat)     (eq. 11)

with ``g_i``, ``H_i`` the gradient and Hessian of ``y -> log p(y | theta_i)`` at
``y_hat``. Its mean over the data needs only the first two moments::

    E_n[h_{i,n}] = l_i(y_hat) + g_i^T (m - y_hat) + 1/2 tr(H_i (S + (m - y_hat)(m - y_hat)^T))

where ``m = (1/N) sum_n y_n`` and ``S = (1/N) sum_n (y_n - m)(y_n - m)^T``.
Racing then uses ``l - h + E[h]``: same means, variance reduced when the
log-likelihood is close to quadratic in ``y`` (exactly zero for a Gaussian
location-scale likelihood).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np

from jaxsub.racing.data import data_fingerprint, gather, num_data_of
from jaxsub.racing.mh_inputs import check_finite_data
from jaxsub.types import Array, ArrayLikeTree
from jaxsub.validation import check_int

__all__ = [
    "ControlVariate",
    "as_control_variate",
    "check_center_size",
    "check_control_variate_matches",
    "data_moments",
    "data_taylor_control_variate",
    "parameter_taylor_control_variate",
]


class _ControlVariateFields(NamedTuple):
    fn: Callable
    mean: object
    num_data: int | None = None
    fingerprint: tuple | None = None
    center_size: int | None = None


class ControlVariate(_ControlVariateFields):
    """A control variate ``h`` for the rewards (§3.4): the one type of the racing family.

    The racing rewards become ``l_{i,n} - h_{i,n} + mean_i``: same means, smaller
    variance when ``h ≈ l``. Two forms, built by two builders:

    * *data form*, read by the engine (:func:`jaxsub.racing.racing`): ``fn(indices) ->
      [m, D]`` (``fn(indices, params)`` in :func:`~jaxsub.racing.racing_batch`) and ``mean``
      the ``[D]`` array ``(1/N) sum_n h_{i,n}`` (or ``mean(params) -> [D]``). Built by
      :func:`data_taylor_control_variate` (the data-space expansion of eq. 11), or by hand;
    * *position form*, read by the MH kernels (:mod:`jaxsub.racing.mh`): ``fn(position,
      indices) -> [m]``, a proxy ``h_n(position)`` of each datum's log-likelihood, and
      ``mean(position) -> scalar``, its mean over the data computed without touching it.
      Built by :func:`parameter_taylor_control_variate` (the parameter-space Taylor
      expansion); the kernel stacks it at ``(x, x')`` into the data form of a 2-armed race.

    Attributes
    ----------
    fn, mean
        As above. ``value_fn`` / ``mean_fn`` are aliases (the position form's names; the
        constructor accepts them as keywords).
    num_data, fingerprint, center_size
        What it was built on: ``N``, a cheap fingerprint of the data
        (:func:`jaxsub.racing.data.data_fingerprint`) and the size of the flattened
        position. A kernel given other data, or positions of another size, refuses it
        with a ``ValueError`` (:func:`check_control_variate_matches`; a proxy built on half
        of the data silently biases the chain otherwise). ``None`` skips a check.
    """

    __slots__ = ()

    def __new__(
        cls, fn=None, mean=None, num_data=None, fingerprint=None, center_size=None, *, value_fn=None, mean_fn=None
    ):
        if value_fn is not None:
            if fn is not None:
                raise ValueError("ControlVariate: give fn or value_fn, not both")
            fn = value_fn
        if mean_fn is not None:
            if mean is not None:
                raise ValueError("ControlVariate: give mean or mean_fn, not both")
            mean = mean_fn
        if fn is None or mean is None:
            raise ValueError("ControlVariate needs fn (or value_fn) and mean (or mean_fn)")
        return super().__new__(cls, fn, mean, num_data, fingerprint, center_size)

    @property
    def value_fn(self) -> Callable:
        """The position form's name of ``fn``: ``value_fn(position, indices) -> [m]``."""
        return self.fn

    @property
    def mean_fn(self) -> Callable:
        """The position form's name of ``mean``: ``mean_fn(position) -> scalar``."""
        return self.mean


def as_control_variate(control_variate) -> ControlVariate | None:
    """Accept ``None``, a :class:`ControlVariate` or a ``(fn, mean)`` pair.

    Parameters
    ----------
    control_variate
        ``None``, a :class:`ControlVariate`, or ``(fn, mean)`` with ``fn(indices) -> [m, D]``.

    Returns
    -------
    ControlVariate or None

    Raises
    ------
    ValueError
        For anything else, or a non-callable ``fn``.
    """
    if control_variate is None:
        return None
    if isinstance(control_variate, ControlVariate):
        return control_variate
    try:
        fn, mean = control_variate
    except (TypeError, ValueError):
        raise ValueError(
            "control_variate must be None, a ControlVariate or a (fn, mean) pair with "
            f"fn(indices) -> [m, D] and mean of shape [D]; got {control_variate!r}"
        ) from None
    if not callable(fn):
        raise ValueError(f"control_variate's first element must be callable; got {fn!r}")
    return ControlVariate(fn, mean)


def data_moments(data: Array, *, block_size: int = 65536) -> tuple[Array, Array]:
    """Mean ``m`` and population covariance ``S`` (divided by N) of ``data`` ``[N]`` or ``[N, k]``.

    Computed once (O(N k^2)) with shifted block sums (shift = first datum) for
    float32 stability; pass the result to :func:`data_taylor_control_variate`.

    Parameters
    ----------
    data
        ``[N]`` or ``[N, k]``.
    block_size
        Rows per block of the sums.

    Returns
    -------
    (mean, cov)
        ``[k]`` and ``[k, k]``.
    """
    y = jnp.asarray(data)
    y = y.reshape(y.shape[0], -1)
    shift = y[0]
    n = y.shape[0]
    s1 = jnp.zeros(y.shape[1], y.dtype)
    s2 = jnp.zeros((y.shape[1], y.shape[1]), y.dtype)
    for start in range(0, n, block_size):
        z = y[start : start + block_size] - shift
        s1 = s1 + jnp.sum(z, axis=0)
        s2 = s2 + z.T @ z
    mean_shifted = s1 / n
    cov = s2 / n - jnp.outer(mean_shifted, mean_shifted)
    return mean_shifted + shift, cov


def data_taylor_control_variate(
    loglik_fn: Callable[[ArrayLikeTree, Array], Array],
    states: ArrayLikeTree,
    data: Array,
    *,
    data_mean: Array | None = None,
    data_cov: Array | None = None,
    center: Array | None = None,
) -> ControlVariate:
    """Build the data-space control variate of eq. 11 for racing (data form, for :func:`jaxsub.racing.racing`).

    Parameters
    ----------
    loglik_fn
        ``loglik_fn(theta, y) -> scalar``: ``log p(y | theta)`` for ONE datum ``y``
        (shape ``[k]``, or scalar data) and ONE state ``theta``; twice
        differentiable in ``y``.
    states
        The D candidate states: a pytree whose leaves have a leading axis of
        size D (e.g. ``jnp.stack([x, x_prop])`` for racing MH).
    data
        ``[N]`` or ``[N, k]``; ``h(indices)`` gathers ``data[indices]``.
    data_mean, data_cov
        ``m`` and ``S`` (population covariance, divided by N); computed from
        ``data`` (O(N), once) when omitted, see :func:`data_moments`.
    center
        The expansion point ``y_hat``; default ``m``.

    Returns
    -------
    ControlVariate
        ``(fn, mean)`` to pass as ``control_variate=`` to
        :func:`jaxsub.discrete.racing` (rewards ``l - h + mean``).

    References
    ----------
    Chen & Ghahramani (2016), §3.4, eq. 11; Wang, Chen, Smola & Xing (2013).
    """
    check_finite_data(data)
    data = jnp.asarray(data)
    scalar_data = data.ndim == 1
    if data_mean is None or data_cov is None:
        m, S = data_moments(data)
    else:
        m = jnp.asarray(data_mean).reshape(-1)
        S = jnp.asarray(data_cov).reshape(m.shape[0], m.shape[0])
    y_hat = m if center is None else jnp.asarray(center).reshape(-1)

    def ll_vec(theta, y_vec):
        return loglik_fn(theta, y_vec[0] if scalar_data else y_vec)

    def expansion(theta):
        return (
            ll_vec(theta, y_hat),
            jax.grad(ll_vec, argnums=1)(theta, y_hat),
            jax.hessian(ll_vec, argnums=1)(theta, y_hat),
        )

    l0, g, H = jax.vmap(expansion)(states)  # [D], [D, k], [D, k, k]
    dm = m - y_hat
    second = S + jnp.outer(dm, dm)
    mean = l0 + g @ dm + 0.5 * jnp.einsum("dij,ij->d", H, second)

    def fn(indices):
        y = data[indices].reshape(indices.shape[0], -1) - y_hat  # [m, k]
        quad = jnp.einsum("mi,dij,mj->md", y, H, y)
        return l0[None, :] + y @ g.T + 0.5 * quad

    return ControlVariate(fn, mean)


def taylor_control_variate(*args, **kwargs) -> ControlVariate:
    """Deprecated alias of :func:`data_taylor_control_variate` (the name also meant the parameter-space builder).

    Parameters
    ----------
    *args, **kwargs
        Those of the builder it calls.

    Returns
    -------
    ControlVariate

    Warns
    -----
    DeprecationWarning
        Always: call :func:`data_taylor_control_variate` (data space, eq. 11) or
        :func:`parameter_taylor_control_variate` (parameter space) instead.
    """
    warnings.warn(
        "taylor_control_variate is deprecated: it named two builders. Here it is "
        "data_taylor_control_variate (data-space expansion, eq. 11); for the parameter-space proxy "
        "of the racing MH kernels use parameter_taylor_control_variate",
        DeprecationWarning,
        stacklevel=2,
    )
    return data_taylor_control_variate(*args, **kwargs)


# --------------------------------------------------------------------------
# Position form: the parameter-space Taylor proxy of the MH kernels, and its provenance checks
# --------------------------------------------------------------------------


class TaylorTable(NamedTuple):
    """The per-datum Taylor rows of :func:`parameter_taylor_control_variate` and what reads them."""

    table: Array
    mean_row: Array
    flat_center: Array
    upper: tuple
    weights: Array
    order: int


def _check_center(loglikelihood_fn: Callable, data: ArrayLikeTree, center: ArrayLikeTree):
    flat_center, unravel = jax.flatten_util.ravel_pytree(center)
    if not bool(jnp.all(jnp.isfinite(flat_center))):
        raise ValueError("center must be finite (the expansion point, e.g. laplace_fit(...).position)")
    if flat_center.size == 0:
        raise ValueError("center must be a non-empty pytree of arrays (the expansion point, shaped like a position)")
    datum0 = jax.tree.map(lambda a: a[0], data)
    try:
        out = jax.eval_shape(loglikelihood_fn, center, datum0)
    except Exception as err:  # noqa: BLE001 - reported with the parameter's name
        shapes = jax.tree.map(np.shape, center)
        raise ValueError(
            f"center (shapes {shapes}) is not a valid position for loglikelihood_fn: evaluating it on one datum "
            f"failed with {type(err).__name__}: {err}"
        ) from None
    if out.shape != ():
        raise ValueError(
            f"loglikelihood_fn(center, datum) must return a scalar; got shape {out.shape} (is center shaped like a position?)"
        )
    return flat_center, unravel


def _flat_loglik(loglikelihood_fn: Callable, unravel: Callable, flat, datum):
    return loglikelihood_fn(unravel(flat), datum)


def _taylor_rows(loglikelihood_fn: Callable, unravel: Callable, flat_center, upper, order: int, block):
    """``[m, P]`` rows ``[l_n, g_n, (H_n)_{i<=j}]`` at the centre for one block of data."""
    flat_ll = partial(_flat_loglik, loglikelihood_fn, unravel)
    values = jax.vmap(flat_ll, in_axes=(None, 0))(flat_center, block)
    grads = jax.vmap(jax.grad(flat_ll), in_axes=(None, 0))(flat_center, block)
    parts = [values[:, None], grads]
    if order == 2:
        hess = jax.vmap(jax.hessian(flat_ll), in_axes=(None, 0))(flat_center, block)
        parts.append(hess[:, upper[0], upper[1]])
    return jnp.concatenate(parts, axis=1)


def _features(tt: TaylorTable, position):
    flat, _ = jax.flatten_util.ravel_pytree(position)
    d = (flat - tt.flat_center).astype(tt.flat_center.dtype)
    parts = [jnp.ones((1,), d.dtype), d]
    if tt.order == 2:
        parts.append(d[tt.upper[0]] * d[tt.upper[1]] * tt.weights)
    return jnp.concatenate(parts)


def _table_value(tt: TaylorTable, position, indices):
    return jnp.take(tt.table, indices, axis=0) @ _features(tt, position)


def _table_mean(tt: TaylorTable, position):
    return tt.mean_row @ _features(tt, position)


def parameter_taylor_control_variate(
    loglikelihood_fn: Callable,
    data: ArrayLikeTree,
    center: ArrayLikeTree,
    *,
    order: int = 2,
    block_size: int = 4096,
) -> ControlVariate:
    """Second- (or first-) order Taylor proxy of each datum's log-likelihood around ``center``.

    .. math::

        h_n(\\theta) = l_n(\\hat\\theta) + g_n^\\top(\\theta - \\hat\\theta)
        + \\tfrac12 (\\theta - \\hat\\theta)^\\top H_n (\\theta - \\hat\\theta),

    with ``g_n``, ``H_n`` the gradient and Hessian of ``l_n = log p(y_n|.)`` at
    ``center`` (e.g. the MAP). Its mean over the data,
    ``l̄ + ḡ^T Δ + ½ Δ^T H̄ Δ``, needs only the precomputed averages, so the race
    reads ``l_n - h_n + mean(h)`` (Chen & Ghahramani 2016 §3.4; the proxies of
    Bardenet, Doucet & Holmes 2017, §7, expanded in parameter space rather
    than data space because the per-datum Hessians are cheap to store for small
    parameter dimension ``d``). The per-datum residual of a pair shrinks like
    ``|θ - θ̂|^3``, so the race settles after the first mini-batch for most
    proposals near the posterior mode.

    Parameters
    ----------
    loglikelihood_fn
        ``loglikelihood_fn(position, datum) -> scalar``.
    data
        Pytree of arrays with a leading data axis ``N``.
    center
        Expansion point ``θ̂`` (same pytree as positions).
    order
        1 (gradients only: ``N d`` floats stored) or 2 (also Hessians: ``N d^2``).
    block_size
        Data processed per block when precomputing (bounds memory).

    Returns
    -------
    ControlVariate

    Raises
    ------
    ValueError
        If ``order`` or ``block_size`` is out of range, ``data`` holds a NaN or infinity, ``center`` is
        empty, not finite or not a position the model can evaluate.
    """
    order = check_int("order", order, low=1, high=2)
    block_size = check_int("block_size", block_size, low=1)
    num_data = num_data_of(data)
    check_finite_data(data)
    flat_center, unravel = _check_center(loglikelihood_fn, data, center)
    dim = int(flat_center.size)
    # h_n(θ) is linear in the features φ(Δ) = [1, Δ, (Δ_i Δ_j w_ij)_{i<=j}] of Δ = θ - θ̂
    # (w_ii = 1/2, w_ij = 1 for i < j, as H_n is symmetric): store one row
    # [l_n, g_n, (H_n)_{i<=j}] per datum, so a subsample costs one contiguous row
    # gather and one [m, P] x [P] product (P = 1 + d + d(d+1)/2), not a gather of
    # [m, d, d] Hessians and an einsum (measured ~2x cheaper per racing MH step).
    upper = np.triu_indices(dim) if order == 2 else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    weights = jnp.asarray(np.where(upper[0] == upper[1], 0.5, 1.0), flat_center.dtype)
    per_block = jax.jit(partial(_taylor_rows, loglikelihood_fn, unravel, flat_center, upper, order))
    table = jnp.concatenate(
        [per_block(gather(data, jnp.arange(s, min(s + block_size, num_data)))) for s in range(0, num_data, block_size)]
    )
    tt = TaylorTable(table, jnp.mean(table, axis=0), flat_center, upper, weights, order)
    return ControlVariate(partial(_table_value, tt), partial(_table_mean, tt), num_data, data_fingerprint(data), dim)


def check_control_variate_matches(control_variate, data: ArrayLikeTree, num_data: int | None = None) -> None:
    """Raise ``ValueError`` if ``control_variate`` was built on other data than ``data``.

    Parameters
    ----------
    control_variate
        ``None`` or a :class:`ControlVariate` (its ``num_data`` / ``fingerprint``, when set, are compared).
    data
        The data the kernel reads.
    num_data
        ``N`` if known (default: read from ``data``).

    Returns
    -------
    None

    Raises
    ------
    ValueError
        If ``N`` or the data fingerprint differ.
    """
    if control_variate is None:
        return
    n = num_data_of(data) if num_data is None else num_data
    if control_variate.num_data is not None and control_variate.num_data != n:
        raise ValueError(
            f"control_variate was built on num_data={control_variate.num_data} data but the kernel is given "
            f"num_data={n}: build it on the same data the kernel reads"
        )
    if control_variate.fingerprint is not None:
        fp = data_fingerprint(data)
        if fp is not None and fp != control_variate.fingerprint:
            raise ValueError(
                "control_variate was built on different data (fingerprint mismatch): build it on the same data "
                "the kernel reads"
            )


def check_center_size(control_variate, position) -> None:
    """Raise ``ValueError`` if ``position`` has another size than the control variate's centre.

    Parameters
    ----------
    control_variate
        ``None`` or a :class:`ControlVariate` (its ``center_size``, when set, is compared).
    position
        A position.

    Returns
    -------
    None

    Raises
    ------
    ValueError
        If the flattened sizes differ.
    """
    if control_variate is None or control_variate.center_size is None:
        return
    size = sum(int(np.prod(np.shape(leaf))) for leaf in jax.tree.leaves(position))
    if size != control_variate.center_size:
        raise ValueError(
            f"control_variate center has {control_variate.center_size} parameters but the position has {size}"
        )
