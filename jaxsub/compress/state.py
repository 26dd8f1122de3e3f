"""Growable per-cluster state of the streams (:class:`Clusters`) and grouped sums of rows."""

from __future__ import annotations

import numpy as np

__all__ = ["Clusters", "group_sums", "open_found", "segment_sums"]


class Clusters:
    """Growable per-cluster state: anchor (the member mean after the last join) and its search
    coordinates, member sum, count, and ``far`` (a bound on the members' distance to the anchor)."""

    def __init__(self, dim: int, zdim: int, capacity: int, coords):
        capacity = max(capacity, 16)
        self.coords = coords
        self.anchor = np.empty((capacity, dim))
        self.zanchor = np.empty((capacity, zdim))
        self.sums = np.empty((capacity, dim))
        self.counts = np.empty(capacity, np.int64)
        self.far = np.empty(capacity)
        self.size = 0

    def open(self, sums: np.ndarray, counts: np.ndarray, far: np.ndarray, z: np.ndarray | None = None) -> np.ndarray:
        """Open clusters with the given member sums, counts and radius bounds (``z``: the search
        coordinates of their means, if known); returns their ids."""
        k = counts.size
        if self.size + k > self.counts.size:
            cap = max(2 * self.counts.size, self.size + k)
            for name in ("anchor", "zanchor", "sums", "counts", "far"):
                old = getattr(self, name)
                new = np.empty((cap,) + old.shape[1:], old.dtype)
                new[: self.size] = old[: self.size]
                setattr(self, name, new)
        ids = np.arange(self.size, self.size + k)
        self.sums[ids] = sums
        self.counts[ids] = counts
        self.far[ids] = far
        self.size += k
        self.move(ids, sums / counts[:, None], z)
        return ids

    def move(self, ids: np.ndarray, anchors: np.ndarray, z: np.ndarray | None = None) -> None:
        self.anchor[ids] = anchors
        self.zanchor[ids] = self.coords(anchors) if z is None else z


def group_sums(xs: np.ndarray, lab: np.ndarray, num: int):
    """Per-group sums ``[num, d]`` and counts ``[num]`` of the rows ``xs`` with group ids ``lab``."""
    from scipy.sparse import csr_matrix

    counts = np.bincount(lab, minlength=num)
    # one sparse [num, m] indicator product: a counting sort, no comparison sort of the labels
    indicator = csr_matrix((np.ones(lab.size), (lab, np.arange(lab.size))), shape=(num, lab.size))
    return np.asarray(indicator @ xs), counts


def segment_sums(xs: np.ndarray, starts: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Sums of the (weighted) rows of ``xs`` over the contiguous segments beginning at ``starts``.

    One sparse ``[segments, m]`` product: ``np.add.reduceat`` along axis 0 of a wide array is
    about 10x slower (it does not vectorise across the columns).
    """
    from scipy.sparse import csr_matrix

    m = xs.shape[0]
    w = np.ones(m) if weights is None else weights
    return np.asarray(csr_matrix((w, np.arange(m), np.r_[starts, m]), shape=(starts.size, m)) @ xs)


def open_found(clusters: Clusters, xr_all, members, sums, cnt, cen) -> np.ndarray:
    """Open the clusters a sequential pass found (sums, counts, centroids; ``members[t]`` = the
    cluster of row ``t``), each with its exact farthest-member distance as radius; returns their ids."""
    diff = xr_all - cen[members]
    far = np.zeros(cnt.shape[0])
    np.maximum.at(far, members, np.sqrt(np.einsum("ij,ij->i", diff, diff)))
    return clusters.open(sums, cnt.astype(np.int64), far)
