"""Exact sums of the log factors: blocked, relative to a per-datum reference, Kahan-compensated.

One routine for every exact path of the racing family: ``gumbel_max``, the
kernels' ``exact=True`` decisions and the racing engine's exact pass all add
``sum_n (log f_n(i) - ref_n)`` in blocks, with :func:`relative_block_sum` for a block and
:func:`kahan_add` between blocks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxsub.types import Array

__all__ = ["SUB_BLOCK", "TRANSPOSED_SUM_MAX_K", "exact_sums", "kahan_add", "relative_block_sum"]


#: Largest number of columns summed on the transpose by ``_relative_block_sum`` (measured).
TRANSPOSED_SUM_MAX_K = 32

#: Rows per step of :func:`exact_sums`' inner accumulation loop: the recommended ``sub_block`` of
#: :func:`jaxsub.racing.gumbel_max` under ``jax.vmap`` over many draws (measured; figures in its ``sub_block``):
#: a block whose size is a multiple of it, and larger, is read ``SUB_BLOCK`` rows at a
#: time into a ``[D, SUB_BLOCK]`` running sum (one elementwise kernel per step), so that the
#: factors of a block are never materialised. Under ``jax.vmap`` over B draws a whole block's
#: factors would be a ``[B, D, block]`` array written to memory and read back by the reduction
#: (XLA:CPU's reduction kernel does not fuse its producer): per draw 1.7-3.3x slower than one draw
#: at B = 32-256, N = 2^20. The running sum brings the per-draw cost of a batch below one draw's
#: (one draw alone pays ~1 ms more at D = 10 for the inner loop's steps, hence opt-in).
SUB_BLOCK = 1024


def relative_block_sum(r: Array, valid: Array, relative: bool = True) -> Array:
    """``sum_n (r[n, i] - ref_n)`` over the valid rows of a block ``r`` [m, k].

    ``relative=False``: ``ref_n = 0`` (plain sums, for callers that need the absolute level).

    ``ref_n`` is the row's first entry when finite (else 0): a per-datum constant,
    so differences between columns are unchanged while the common level of the
    factors is removed (float32 keeps its precision in the sums). A ``-inf``
    entry makes its column's sum ``-inf``; NaN / ``+inf`` make it NaN / ``+inf``.
    Shared by :func:`exact_sums` (hence :func:`jaxsub.racing.gumbel_max`) and racing's exact pass.
    """
    zero = jnp.zeros((), r.dtype)
    if not relative:
        if r.shape[1] <= TRANSPOSED_SUM_MAX_K:
            return jnp.sum(jnp.where(valid.T, r.T, zero), axis=1)
        return jnp.sum(jnp.where(valid, r, zero), axis=0)
    if r.shape[1] <= TRANSPOSED_SUM_MAX_K:
        # Few columns: sum on the transpose [k, m] (the long data axis minor, which XLA's CPU
        # loops vectorise): gumbel_max at N = 1e6 measured 2.5x (D = 10), 1.9x (D = 32) and
        # 3.2x (D = 4) faster in CPU time than the [m, k] column reduction; at D = 100 the
        # [m, k] form is faster (1.35x), so it is kept there.
        rt = r.T
        ref = rt[:1, :]
        ref = jnp.where(jnp.isfinite(ref), ref, zero)
        return jnp.sum(jnp.where(valid.T, rt - ref, zero), axis=1)
    ref = r[:, :1]
    ref = jnp.where(jnp.isfinite(ref), ref, zero)
    return jnp.sum(jnp.where(valid, r - ref, zero), axis=0)


def kahan_add(total: Array, comp: Array, y: Array) -> tuple[Array, Array]:
    """Kahan-compensated ``total + y``; the compensation is reset where the total
    is not finite (a -inf / NaN column would otherwise turn it into NaN)."""
    y = y - comp
    t = total + y
    return t, jnp.where(jnp.isfinite(t), (t - total) - y, jnp.zeros((), t.dtype))


def exact_sums(
    log_factor_fn,
    num_states: int,
    num_data: int,
    block_size: int,
    dtype,
    *,
    relative: bool = True,
    sub_block: int | None = None,
):
    """``sum_n (log f_n(i) - ref_n)`` for every i, and flags for -inf / NaN columns.

    ``ref_n`` is the row's first entry when it is finite (else 0; ``relative=False``: 0), so
    ``total_i - total_j`` is the exact gap whatever ``relative``. Subtracting a
    per-datum constant leaves every difference between states unchanged and
    removes the common level of the factors, so the sums stay on the scale of
    the differences (float32 keeps its precision); block sums are added with
    Kahan compensation. ``sub_block`` (e.g. :data:`SUB_BLOCK`, :func:`jaxsub.racing.gumbel_max`'s
    option for batched draws): a block larger than, and a multiple of, ``sub_block`` rows is read ``sub_block`` rows at
    a time into a running sum, so that ``jax.vmap`` over draws does not materialise a block of
    factors per draw (same sums up to float rounding: the order of the additions changes).
    ``None`` (default; the kernels' exact decisions): one fused pass per block. A ``-inf`` factor is not tested element by element: it
    makes its column's sum ``-inf`` (a zero factor, probability 0), and NaN or
    ``+inf`` make it NaN / ``+inf`` (flagged). This keeps the pass to one fused
    subtract-and-sum per block, within ~1.5x of an unblocked ``jnp.sum`` over
    all ``N x D`` factors (measured at N = 1e6, D in {10, 100}).

    Returns ``(total [D], neg_inf [D], bad [D])``. The one exact-sum routine of the
    family: :func:`jaxsub.racing.gumbel_max`, the kernels' ``exact=True`` paths and
    (chunk by chunk, through :func:`relative_block_sum` and :func:`kahan_add`) the
    engine's exact pass.
    """
    D, N = num_states, num_data
    num_blocks = -(-N // block_size)
    zero = jnp.zeros((), dtype)

    def factors(pos):
        r = jnp.asarray(log_factor_fn(jnp.minimum(pos, N - 1)))
        if r.shape != (pos.shape[0], D):
            raise ValueError(f"log_factor_fn must return shape [m, {D}]; got {r.shape} for m={pos.shape[0]}")
        return r.astype(dtype)

    if sub_block is not None and block_size > sub_block and block_size % sub_block == 0:
        S = sub_block

        # Running sum over sub-blocks (see SUB_BLOCK): acc[i, j] adds rows j, j + S, j + 2S, ...
        # of the block, relative to each row's first entry; one reduction per block.
        def block_sum(b):
            def step(j, acc):
                pos = b * block_size + j * S + jnp.arange(S, dtype=jnp.int32)
                rt = factors(pos).T  # [D, S]: the long axis minor
                ref = jnp.where(jnp.isfinite(rt[:1]), rt[:1], zero) if relative else zero
                return acc + jnp.where((pos < N)[None, :], rt - ref, zero)

            acc = jax.lax.fori_loop(0, block_size // S, step, jnp.zeros((D, S), dtype))
            return jnp.sum(acc, axis=1)
    else:

        def block_sum(b):
            pos = b * block_size + jnp.arange(block_size, dtype=jnp.int32)
            return relative_block_sum(factors(pos), (pos < N)[:, None], relative)

    def body(carry, b):
        total, comp = carry
        return kahan_add(total, comp, block_sum(b)), None

    zeros = jnp.zeros((D,), dtype)
    (total, _), _ = jax.lax.scan(body, (zeros, zeros), jnp.arange(num_blocks, dtype=jnp.int32))
    neg_inf = total == -jnp.inf
    bad = jnp.isnan(total) | (total == jnp.inf)  # a NaN / +inf factor (or +inf and -inf mixed)
    return total, neg_inf, bad
