"""The result of the clustering (:class:`Clustering`) and the checks of its input features."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["Clustering", "as_features", "max_norm", "seed_from_key"]


class Clustering(NamedTuple):
    """Result of :func:`cluster` / :func:`cluster_supervised`.

    All arrays are NumPy, in the *clustering space*: the features divided by
    ``scale`` (``scale = R = max_i ||x_i||`` when ``standardize=True``, else 1).
    Fit the model on that space too (``clustering.transform(x_test)`` applies
    the same scaling to new data).

    Attributes
    ----------
    centroids
        ``[c, d]`` float64, ``mu_j = mean of the members of cluster j``.
    counts
        ``[c]`` int64 multiplicities ``n_j`` (sum to ``N``).
    labels
        ``[N]`` int64 cluster index of every input row.
    radii
        ``[c]`` float64 ``delta_j = max_{i in S_j} ||x_i - mu_j||`` (exact, <= ``target_radius``).
    targets
        ``[c]`` per-centroid target for supervised data (class label, or the
        mean response for joint clustering), else ``None``.
    target_radius
        The requested ``delta``.
    scale
        ``R`` used to standardise (1.0 when not standardised).
    standardized
        Whether the features were divided by ``R``.
    method
        The neighbour search used.
    covariances
        ``[c, d, d]`` float64 within-cluster covariances
        ``C_j = (1 / n_j) sum_{i in S_j} (x_i - mu_j)(x_i - mu_j)^T`` (joint, with the
        response last, for ``cluster_supervised(mode="joint")``), used by the
        second-order correction of :func:`~jaxsub.compress.logdensity`; ``None`` when
        ``d > 64`` (the ``c d^2`` floats would dwarf the data).
    """

    centroids: np.ndarray
    counts: np.ndarray
    labels: np.ndarray
    radii: np.ndarray
    targets: np.ndarray | None
    target_radius: float
    scale: float
    standardized: bool
    method: str
    covariances: np.ndarray | None = None

    @property
    def num_clusters(self) -> int:
        """``c``, the number of clusters."""
        return int(self.counts.shape[0])

    @property
    def c(self) -> int:
        """Alias of :attr:`num_clusters` (the paper's notation)."""
        return self.num_clusters

    @property
    def num_data(self) -> int:
        """``N``."""
        return int(self.labels.shape[0])

    @property
    def rho(self) -> float:
        """Compression ratio ``rho = c / N`` (paper eq. 3)."""
        return self.num_clusters / self.num_data

    @property
    def radius(self) -> float:
        """Global radius ``delta = max_j delta_j`` actually achieved."""
        return float(self.radii.max()) if self.radii.size else 0.0

    def transform(self, x) -> np.ndarray:
        """Apply the clustering's standardisation to new features: ``x / scale``.

        Parameters
        ----------
        x
            Features in the original units.

        Returns
        -------
        numpy.ndarray
            ``x / scale`` in float64 (the clustering space).
        """
        return np.asarray(x, dtype=np.float64) / self.scale

    def pseudodata(self):
        """The centroids as data for a likelihood.

        Returns
        -------
        numpy.ndarray or tuple
            ``centroids``, or ``(centroids, targets)`` for supervised clusterings.
        """
        return self.centroids if self.targets is None else (self.centroids, self.targets)


def as_features(x: Any, name: str = "x") -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"{name} must be a numeric array; got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"{name} must have shape [N, d] (or [N]); got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be non-empty; got shape {arr.shape}")
    arr = arr.astype(np.float64, copy=False)
    finite = np.isfinite(arr)
    if not finite.all():
        bad = int(arr.size - np.count_nonzero(finite))
        raise ValueError(f"{name} must be finite; found {bad} NaN/inf value(s)")
    return arr


def seed_from_key(key) -> int:
    if key is None:
        return 0
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return int(key)
    import jax

    data = np.asarray(jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key)
    return int(np.uint64(data.ravel().astype(np.uint64) @ np.arange(1, data.size + 1, dtype=np.uint64)))


def max_norm(arr: np.ndarray) -> float:
    scale = float(np.sqrt(np.einsum("ij,ij->i", arr, arr).max()))
    return scale if scale > 0 else 1.0
