"""Float32 screens of lower bounds: isolated rows, per-chunk bounds, screened candidates.

High-dimensional rows (the projected search, e.g. MNIST, d = 784): before the stream,
:func:`isolated` finds in bulk the rows with no other row within ``2 delta`` (a float32 screen
of lower bounds by one matrix product per block of rows against all rows, then the exact
float64 distance of the few screened candidates): they are singletons in any clustering of
radius ``<= delta`` and no row can join them, so they leave the stream (90 % of MNIST's rows at
``delta = 0.1``).
"""

from __future__ import annotations

import numpy as np

from jaxsub.compress.options import ClusterOptions

__all__ = ["chunk_bounds", "isolated", "screened_candidates"]


def isolated(x: np.ndarray, zw: np.ndarray, delta: float, *, opts: ClusterOptions) -> np.ndarray:
    """Mask of the rows with no other row within ``2 delta`` (exact, float64).

    Such a row is a singleton in every clustering of radius ``<= delta`` (two members of a
    cluster are within ``2 delta`` of each other), and no other row can join it: it leaves
    the stream. Blocked and vectorised: a float32 screen of the lower bounds
    ``||z_x - z_y|| <= ||x - y||`` in the coordinates ``zw`` (``ClusterOptions.isolation_dims`` principal
    components + residual norm; one matrix product per block of rows against all rows, the
    squared distance read off directly as ``[-2 z, |z|^2, 1] . [z, 1, |z|^2]``), then the exact
    float64 distance of every candidate pair of the rows with at most ``ClusterOptions.isolation_checks``
    candidates. Rows with more candidates are reported not isolated (they stay in the stream,
    which decides them exactly), so the mask errs only towards streaming a row. When fewer
    than ``ClusterOptions.isolation_min_fraction`` of the first block's rows are screened isolated (large
    ``delta``), the screen stops there and reports none.
    """
    n = x.shape[0]
    zz = np.einsum("ij,ij->i", zw, zw)
    one = np.ones(n)
    left = np.column_stack([-2.0 * zw, zz, one]).astype(np.float32)
    right = np.column_stack([zw, one, zz]).astype(np.float32)
    # float32 round-off of the screen, about 1e-7 of the squared norms: widen the threshold by
    # far more than that so no pair within 2 delta is screened out
    thr = np.float32(4.0 * delta * delta * (1.0 + 1e-3) + 1e-5 * (1.0 + float(zz.max())))
    # nearest screened distance over the upper block triangle only (the screen is symmetric):
    # the block of rows [s, e) against the rows [s, n); row minima cover the row's own block
    # and the rows after it, column minima give the later rows this block
    low = np.full(n, np.inf, np.float32)
    for s in range(0, n, opts.isolation_block):
        e = min(n, s + opts.isolation_block)
        lb2 = left[s:e] @ right[s:].T
        lb2[np.arange(e - s), np.arange(e - s)] = np.inf
        np.minimum(low[s:e], lb2.min(axis=1), out=low[s:e])
        if e < n:
            np.minimum(low[e:], lb2[:, e - s :].min(axis=0), out=low[e:])
        if s == 0 and e < n and np.count_nonzero(low[:e] > thr) < opts.isolation_min_fraction * e:
            return np.zeros(n, bool)  # few isolated rows in the first block: not worth the screen
    out = low > thr
    rest = np.flatnonzero(~out)
    if rest.size:  # exact float64 check of every screened pair of the rows with few candidates
        cand = (left[rest] @ right.T) <= thr
        cand[np.arange(rest.size), rest] = False
        few = np.flatnonzero(np.count_nonzero(cand, axis=1) <= opts.isolation_checks)
        r, j = np.nonzero(cand[few])
        diff = x[rest[few[r]]] - x[j]
        close = np.einsum("ij,ij->i", diff, diff) <= 4.0 * delta * delta
        has = np.zeros(few.size, bool)
        has[r[close]] = True
        out[rest[few[~has]]] = True
    return out


def chunk_bounds(zc: np.ndarray, za: np.ndarray, zan: np.ndarray) -> np.ndarray:
    """Lower bounds of the squared distances of the rows ``zc`` to the anchors ``za`` up to each row's
    own squared norm (constant along a row): ``zan - 2 zc . za``, ``[rows, anchors]`` float32."""
    lb = zc @ za.T
    lb *= -2.0
    lb += zan
    return lb


def screened_candidates(lb: np.ndarray, thr: np.ndarray, m: int):
    """The ``m`` anchors of smallest lower bound ``lb [rows, k]`` per row, among those with
    ``lb <= thr`` (the others cannot be within reach), and a validity mask ``[rows, m]``.

    Rows with at most ``m`` anchors under their threshold take all of them (padded, invalid);
    only rows with more pay for a selection (``argpartition``). The candidates that can be
    proposed are those of a plain ``argpartition`` over every anchor (anchors over the threshold
    are refused by their true distance anyway), at a fraction of its cost: most rows have few
    anchors in reach.
    """
    q = lb <= thr[:, None]
    cnt = np.count_nonzero(q, axis=1)
    cand = np.zeros((lb.shape[0], m), np.int64)
    valid = np.zeros((lb.shape[0], m), bool)
    few = np.flatnonzero(cnt <= m)
    r, c = np.nonzero(q[few])
    rank = np.arange(r.size) - (np.cumsum(cnt[few]) - cnt[few])[r]
    cand[few[r], rank] = c
    valid[few[r], rank] = True
    many = np.flatnonzero(cnt > m)
    if many.size:
        cand[many] = np.argpartition(lb[many], m - 1, axis=1)[:, :m]
        valid[many] = True
    return cand, valid
