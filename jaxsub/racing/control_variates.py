"""Second-order Taylor control variates for racing rewards (§3.4, eq. 11).

For factors ``f_n(i) = p(y_n | theta_i)`` the reward ``l_{i,n} = log p(y_n | theta_i)``
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

from typing import Callable

import jax
import jax.numpy as jnp

from jaxsub.racing.engine import ControlVariate
from jaxsub.types import Array, ArrayLikeTree

__all__ = ["data_moments", "taylor_control_variate"]


def data_moments(data: Array, *, block_size: int = 65536) -> tuple[Array, Array]:
    """Mean ``m`` and population covariance ``S`` (divided by N) of ``data`` ``[N]`` or ``[N, k]``.

    Computed once (O(N k^2)) with shifted block sums (shift = first datum) for
    float32 stability; pass the result to :func:`taylor_control_variate`.
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


def taylor_control_variate(
    loglik_fn: Callable[[ArrayLikeTree, Array], Array],
    states: ArrayLikeTree,
    data: Array,
    *,
    data_mean: Array | None = None,
    data_cov: Array | None = None,
    center: Array | None = None,
) -> ControlVariate:
    """Build the control variate of eq. 11 for racing.

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
        return ll_vec(theta, y_hat), jax.grad(ll_vec, argnums=1)(theta, y_hat), jax.hessian(ll_vec, argnums=1)(theta, y_hat)

    l0, g, H = jax.vmap(expansion)(states)  # [D], [D, k], [D, k, k]
    dm = m - y_hat
    second = S + jnp.outer(dm, dm)
    mean = l0 + g @ dm + 0.5 * jnp.einsum("dij,ij->d", H, second)

    def fn(indices):
        y = data[indices].reshape(indices.shape[0], -1) - y_hat  # [m, k]
        quad = jnp.einsum("mi,dij,mj->md", y, H, y)
        return l0[None, :] + y @ g.T + 0.5 * quad

    return ControlVariate(fn, mean)
