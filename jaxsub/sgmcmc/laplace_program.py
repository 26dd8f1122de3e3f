r"""The compute of the Laplace surrogates, as a pure function of the data: expansion points and curvature.

:func:`laplace_program` returns ``run(data, mask, sizes, damping_weights, flat_position, keys) ->
LaplaceArrays``; ``jax.jit`` it once and pass it to every :func:`jaxsub.sgmcmc.laplace_surrogates`
call with the same options and data of the same shapes. Every piece is a module-level function of
the static :class:`ProgramConfig` (the options, the model's functions and the flattening).

The expansion points come from :func:`jaxsub.laplace.minimize` (the library's one optax loop) on the
damped shard objective ``F_s(θ) = -(1/N_s)[Σ_{x∈X_s} \log p(x|θ) + δ_s \log p_0(θ)]``: per shard
(``'local'``), on ``Σ_s (N_s/N) F_s`` (``'fedsgd'``: the server optimiser on the averaged shard
gradients) or by FedAvg rounds (``'fedavg'``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jaxsub.laplace import minimize
from jaxsub.types import Array, ArrayLikeTree

__all__ = ["LaplaceArrays", "LaplaceOptions", "ProgramConfig", "laplace_program"]


class LaplaceOptions(NamedTuple):
    """The options of :func:`jaxsub.sgmcmc.laplace_surrogates` and :func:`laplace_program`, declared once.

    Pass them as keyword arguments (``laplace_surrogates(lp, ll, shards, x0, structure="diag")``) or as
    one record (``options=LaplaceOptions(structure="diag")``; keyword arguments then override its
    fields). Validated by :func:`jaxsub.sgmcmc.laplace_surrogates.check_options` (``ValueError`` naming
    the option).

    Attributes
    ----------
    structure
        ``'full'`` | ``'diag'`` | ``'lowrank'``: the precision's structure.
    rank
        Rank of ``'lowrank'`` (``1 <= rank <= d``).
    curvature
        ``'hessian'`` | ``'fisher'`` (empirical Fisher diagonal) | ``'gauss_newton'``.
    damping
        ``>= 0``, the multiple of the fractional prior ``N_s/N`` in the objective.
    optimizer
        An ``optax.GradientTransformation`` (default ``optax.adam(1e-2)``).
    num_steps
        Optimiser steps (full-shard gradients), ``>= 0``.
    num_power_iterations
        Subspace iterations for ``'lowrank'``.
    expansion
        ``'fedsgd'`` (default) | ``'fedavg'`` | ``'local'``.
    fedavg_local_steps
        ``>= 1``, optimiser steps per shard per FedAvg round.
    gauss_newton
        ``(model_fn, output_loglikelihood_fn)``; required by (only by) ``curvature='gauss_newton'``.
    """

    structure: str = "full"
    rank: int = 10
    curvature: str = "hessian"
    damping: float = 1.0
    optimizer: Any = None
    num_steps: int = 500
    num_power_iterations: int = 3
    expansion: str = "fedsgd"
    fedavg_local_steps: int = 20
    gauss_newton: tuple | None = None


class ProgramConfig(NamedTuple):
    """Static configuration of a Laplace program: options (optimizer resolved), model, flattening."""

    options: LaplaceOptions
    logprior_fn: Callable
    loglikelihood_fn: Callable
    unravel: Callable
    dim: int
    dtype: Any


class LaplaceArrays(NamedTuple):
    """Raw output of a :func:`laplace_program` run (flattened positions, ``S`` shards).

    ``expansion_point [S, d]``, likelihood gradient ``gradient [S, d]`` there, ``curvature``
    (``[S, d, d]`` full; ``[S, d]`` diagonal), low-rank ``factor [S, d, r]`` (``r = 0`` unless
    ``'lowrank'``) and the damped objective's ``gradient_norm [S]``.
    """

    expansion_point: Array
    gradient: Array
    curvature: Array
    factor: Array
    gradient_norm: Array


def resolve_optimizer(optimizer):
    """``optimizer``, or the default ``optax.adam(1e-2)`` when ``None``."""
    import optax

    return optax.adam(1e-2) if optimizer is None else optimizer


# ---------------------------------------------------------------- objectives


def shard_loglik_sum(cfg: ProgramConfig, data_s, mask_s, flat) -> Array:
    """``Σ_i mask_i log p(x_i | θ)`` over one padded shard (padding rows weigh 0)."""
    theta = cfg.unravel(flat)
    per = jax.vmap(partial(cfg.loglikelihood_fn, theta))(data_s)
    return jnp.sum(jnp.where(mask_s, per, 0.0))


def prior_flat(cfg: ProgramConfig, flat) -> Array:
    """``log p_0(θ)`` of the flattened position."""
    return cfg.logprior_fn(cfg.unravel(flat))


def shard_objective(cfg: ProgramConfig, data_s, mask_s, n_s, w_s, flat) -> Array:
    """The damped shard objective ``F_s(θ) = -(Σ_{x∈X_s} log p(x|θ) + w_s log p_0(θ)) / N_s``."""
    return -(shard_loglik_sum(cfg, data_s, mask_s, flat) + w_s * prior_flat(cfg, flat)) / n_s


def averaged_objective(cfg: ProgramConfig, data, mask, sizes_j, weights, flat) -> Array:
    """``Σ_s (N_s/N) F_s(θ)``: its gradient is the FedSGD server's averaged shard gradient."""
    values = jax.vmap(partial(shard_objective, cfg), in_axes=(0, 0, 0, 0, None))(data, mask, sizes_j, weights, flat)
    return (sizes_j / jnp.sum(sizes_j)) @ values


def local_mode(cfg: ProgramConfig, num_steps: int, start, data_s, mask_s, n_s, w_s) -> Array:
    """``num_steps`` optimiser steps on one shard's ``F_s`` from ``start`` (fresh optimiser state)."""
    objective = partial(shard_objective, cfg, data_s, mask_s, n_s, w_s)
    return minimize(objective, start, optimizer=cfg.options.optimizer, num_steps=num_steps)


def fedavg_round(cfg: ProgramConfig, data, mask, sizes_j, weights, centre, _):
    """One FedAvg round: local steps on every shard from ``centre``, then the ``N_s/N``-weighted average."""
    local_fn = partial(local_mode, cfg, cfg.options.fedavg_local_steps, centre)
    local = jax.vmap(local_fn)(data, mask, sizes_j, weights)
    return (sizes_j / jnp.sum(sizes_j)) @ local, None


def expansion_points(cfg: ProgramConfig, data, mask, sizes_j, weights, flat0) -> Array:
    """``[S, d]`` expansion points: per-shard modes (``'local'``) or one common point (``'fedsgd'``, ``'fedavg'``)."""
    opts = cfg.options
    if opts.expansion == "local":
        return jax.vmap(partial(local_mode, cfg, opts.num_steps, flat0))(data, mask, sizes_j, weights)
    if opts.expansion == "fedsgd":
        objective = partial(averaged_objective, cfg, data, mask, sizes_j, weights)
        centre = minimize(objective, flat0, optimizer=opts.optimizer, num_steps=opts.num_steps)
    else:
        num_rounds = -(-opts.num_steps // opts.fedavg_local_steps)
        body = partial(fedavg_round, cfg, data, mask, sizes_j, weights)
        centre = jax.lax.scan(body, flat0, None, length=num_rounds)[0]
    return jnp.broadcast_to(centre, (sizes_j.shape[0], cfg.dim))


# ---------------------------------------------------------------- curvature


def hvp(fn: Callable, flat: Array, v: Array) -> Array:
    """``∇²fn(flat) v`` (forward over reverse)."""
    return jax.jvp(jax.grad(fn), (flat,), (v,))[1]


def chunked_masked_sum(fn: Callable, data_s, mask_s, chunk: int, dim: int, dtype) -> Array:
    """``Σ_i mask_i fn(x_i)`` (``fn(x) -> [dim]``) over one padded shard, ``chunk`` rows at a time in a ``lax.scan``.

    The per-datum vectors of a chunk are reduced as they are made: the ``[N_s, d]`` matrix of per-datum
    gradients (or ``[N_s, k, d]`` Gauss-Newton columns) is never materialised, which at ``d = 4·10⁴``
    made the curvature pass memory-bound. Rows are padded to a multiple of ``chunk`` with copies of the
    first row, masked out.
    """
    n = int(np.shape(mask_s)[0])
    chunk = max(1, min(chunk, n))
    pad = (-n) % chunk
    grow = lambda a: jnp.concatenate([a, jnp.repeat(a[:1], pad, axis=0)]) if pad else a  # noqa: E731
    data_c = jax.tree.map(lambda a: grow(a).reshape((-1, chunk) + a.shape[1:]), data_s)
    mask_c = grow(mask_s).reshape(-1, chunk)
    if pad:
        mask_c = mask_c.at[-1, chunk - pad :].set(False)

    def body(total, xs):
        rows, m = xs
        per = jax.vmap(fn)(rows)
        return total + jnp.sum(jnp.where(m[:, None], per, 0.0), axis=0), None

    return jax.lax.scan(body, jnp.zeros(dim, dtype), (data_c, mask_c))[0]


def model_output(cfg: ProgramConfig, x, flat) -> Array:
    """The flattened Gauss-Newton model output ``z = model_fn(θ, x)``."""
    return ravel_pytree(cfg.options.gauss_newton[0](cfg.unravel(flat), x))[0]


def gn_factor(cfg: ProgramConfig, flat, x):
    """Per datum: a square root ``A`` of the output curvature, ``A Aᵀ = -∇²_z log p(x|z)``."""
    model_fn, output_loglik_fn = cfg.options.gauss_newton
    _, unravel_z = ravel_pytree(model_fn(cfg.unravel(flat), x))
    zf = model_output(cfg, x, flat)
    hz = -jax.hessian(lambda v: output_loglik_fn(unravel_z(v), x))(zf)
    w, v = jnp.linalg.eigh(0.5 * (hz + hz.T))
    return v * jnp.sqrt(jnp.maximum(w, 0.0))[None, :]


def gn_diag_one(cfg: ProgramConfig, flat, x) -> Array:
    """One datum's Gauss-Newton diagonal ``diag(J_xᵀ A Aᵀ J_x)``."""
    a = gn_factor(cfg, flat, x)
    _, vjp = jax.vjp(partial(model_output, cfg, x), flat)
    cols = jax.vmap(lambda c: vjp(c)[0], in_axes=1)(a)  # [k, d]: Jᵀ A
    return jnp.sum(cols**2, axis=0)


def gn_vp_one(cfg: ProgramConfig, flat, x, m, v) -> Array:
    """One datum's ``m J_xᵀ A Aᵀ J_x v``."""
    a = gn_factor(cfg, flat, x)
    fn = partial(model_output, cfg, x)
    jv = jax.jvp(fn, (flat,), (v,))[1]
    return m * jax.vjp(fn, flat)[1](a @ (a.T @ jv))[0]


def gn_vp(cfg: ProgramConfig, flat, data_s, mask_s, v) -> Array:
    """``Σ_x mask_x J_xᵀ (-∇²_z log p) J_x v``: the Gauss-Newton matrix times ``v``."""
    per = jax.vmap(partial(gn_vp_one, cfg, flat), in_axes=(0, 0, None))(data_s, mask_s.astype(cfg.dtype), v)
    return jnp.sum(per, axis=0)


def fisher_one(cfg: ProgramConfig, flat, x) -> Array:
    """One datum's squared likelihood gradient (the empirical Fisher diagonal's term)."""
    return jax.grad(lambda f: cfg.loglikelihood_fn(cfg.unravel(f), x))(flat) ** 2


def diag_curvature(cfg: ProgramConfig, flat, data_s, mask_s) -> Array:
    """``[d]`` curvature diagonal: Gauss-Newton, empirical Fisher or the exact Hessian's (``d`` HVPs)."""
    if cfg.options.curvature == "gauss_newton":
        return chunked_masked_sum(partial(gn_diag_one, cfg, flat), data_s, mask_s, 16, cfg.dim, cfg.dtype)
    if cfg.options.curvature == "fisher":
        return chunked_masked_sum(partial(fisher_one, cfg, flat), data_s, mask_s, 128, cfg.dim, cfg.dtype)
    loglik = partial(shard_loglik_sum, cfg, data_s, mask_s)
    eye = jnp.eye(cfg.dim, dtype=cfg.dtype)
    return -jax.lax.map(lambda e: jnp.vdot(e, hvp(loglik, flat, e)), eye, batch_size=min(cfg.dim, 256))


def negative_curvature_product(cfg: ProgramConfig, flat, data_s, mask_s, v) -> Array:
    """``C v`` for the curvature matrix ``C`` (Gauss-Newton, or the negative Hessian)."""
    if cfg.options.curvature == "gauss_newton":
        return gn_vp(cfg, flat, data_s, mask_s, v)
    return -hvp(partial(shard_loglik_sum, cfg, data_s, mask_s), flat, v)


def lowrank_factor(cfg: ProgramConfig, flat, data_s, mask_s, key) -> Array:
    """``U [d, rank]``: the top eigenpairs of the curvature by randomised subspace iteration."""
    rank = cfg.options.rank
    product = jax.vmap(partial(negative_curvature_product, cfg, flat, data_s, mask_s), in_axes=1, out_axes=1)
    q, _ = jnp.linalg.qr(jax.random.normal(key, (cfg.dim, rank + 5), cfg.dtype))
    for _ in range(cfg.options.num_power_iterations):
        q, _ = jnp.linalg.qr(product(q))
    small = q.T @ product(q)
    evals, evecs = jnp.linalg.eigh(0.5 * (small + small.T))
    evals, evecs = evals[::-1][:rank], (q @ evecs[:, ::-1])[:, :rank]
    return evecs * jnp.sqrt(jnp.maximum(evals, 0.0))[None, :]


def curvature_one(cfg: ProgramConfig, args):
    """One shard: likelihood gradient, curvature (full or diagonal), low-rank factor, damped gradient norm."""
    data_s, mask_s, flat, key, n_s, w_s = args
    dim, dtype = cfg.dim, cfg.dtype
    loglik = partial(shard_loglik_sum, cfg, data_s, mask_s)
    grad = jax.grad(loglik)(flat)
    # convergence of the expansion: the damped objective's gradient norm (computed here, inside one
    # compiled lax.map, rather than eagerly under vmap: one compile instead of dozens)
    grad_norm = jnp.linalg.norm((grad + w_s * jax.grad(partial(prior_flat, cfg))(flat)) / n_s)
    no_factor = jnp.zeros((dim, 0), dtype)
    if cfg.options.structure == "full":
        if cfg.options.curvature == "gauss_newton":
            full = jax.lax.map(partial(gn_vp, cfg, flat, data_s, mask_s), jnp.eye(dim, dtype=dtype))
            return grad, full, no_factor, grad_norm
        return grad, -jax.hessian(loglik)(flat), no_factor, grad_norm
    diag = diag_curvature(cfg, flat, data_s, mask_s)
    if cfg.options.structure == "diag":
        return grad, diag, no_factor, grad_norm
    return grad, diag, lowrank_factor(cfg, flat, data_s, mask_s, key), grad_norm


def run_program(cfg: ProgramConfig, data, mask, sizes, damping_weights, flat0, keys) -> LaplaceArrays:
    """Expansion points, then every shard's curvature (see :func:`laplace_program`)."""
    sizes_j = jnp.asarray(sizes, cfg.dtype)
    with jax.numpy_dtype_promotion("standard"):  # optax mixes its int32 step count with floats
        modes = expansion_points(cfg, data, mask, sizes_j, damping_weights, flat0)
    # sequential over shards (lax.map): per-datum gradients / Hessians of all shards at once may not fit in memory
    grads, curv, factors, grad_norms = jax.lax.map(
        partial(curvature_one, cfg), (data, mask, modes, keys, sizes_j, damping_weights)
    )
    return LaplaceArrays(modes, grads, curv, factors, grad_norms)


def laplace_program(
    logprior_fn: Callable,
    loglikelihood_fn: Callable,
    position: ArrayLikeTree,
    options: LaplaceOptions | None = None,
    **option_values,
) -> Callable:
    """The compute of :func:`jaxsub.sgmcmc.laplace_surrogates` as a pure function of the data: jit it once, reuse it.

    ``laplace_surrogates`` builds this function on every call, so every call compiles it again
    (2-5 CPU-s for small networks). Build it once, ``jax.jit`` it, and pass it to every
    ``laplace_surrogates(..., program=...)`` call with the *same* options and data of the same shapes
    (e.g. several splits of one data set): one compile for all of them.

    Parameters
    ----------
    logprior_fn
        ``logprior_fn(position)``.
    loglikelihood_fn
        ``loglikelihood_fn(position, datum)``.
    position
        A position (pytree; fixes the flattening order, size and dtype).
    options, **option_values
        A :class:`LaplaceOptions` record and/or its fields as keyword arguments (keywords win);
        ``damping`` is not read here (it enters through ``damping_weights``).

    Returns
    -------
    run
        ``run(data, mask, sizes, damping_weights, flat_position, keys) -> LaplaceArrays`` with the padded
        ``Shards.data``, its ``mask`` and ``sizes``, ``damping_weights = damping · N_s / N``, the flattened
        starting point and per-shard keys (read by ``'lowrank'`` only).

    Raises
    ------
    ValueError
        On an option outside its range (see :func:`jaxsub.sgmcmc.laplace_surrogates.check_options`).
    """
    from jaxsub.sgmcmc.laplace_surrogates import check_options

    flat_start, unravel = ravel_pytree(position)
    dim = int(flat_start.shape[0])
    opts = check_options(options, option_values, dim)
    opts = opts._replace(optimizer=resolve_optimizer(opts.optimizer))
    cfg = ProgramConfig(opts, logprior_fn, loglikelihood_fn, unravel, dim, flat_start.dtype)
    return partial(run_program, cfg)
