"""Golden outputs of ``jaxsub.compress``: clusterings and log-densities on fixed-seed data.

Every clustering rule (and the supervised, per-shard and streamed variants) and the compressed
log-density (first and second order) are compared with arrays stored in
``tests/golden/compress_*.npz``. Labels and counts must match exactly; centroids, radii,
covariances and log-densities to float64 round-off (``rtol=1e-10``). A refactoring that changes
a single decision of the clustering changes the labels, so these tests pin the behaviour of the
host-side algorithm while its code moves.

Regenerate (only when a change of the outputs is intended, and say why in the commit)::

    PYTHONPATH=. python tests/test_golden_compress.py

which rewrites ``tests/golden/compress_clusterings.npz`` and ``tests/golden/compress_logdensity.npz``.
"""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsub import compress

GOLDEN = pathlib.Path(__file__).parent / "golden"
CLUSTERINGS = GOLDEN / "compress_clusterings.npz"
LOGDENSITY = GOLDEN / "compress_logdensity.npz"
RTOL = 1e-10


def _low_dim() -> np.ndarray:
    """3,000 rows in d = 3: blobs plus uniform noise (the trim, join-back and exact stream paths)."""
    rng = np.random.default_rng(7)
    centres = rng.uniform(-1.0, 1.0, (12, 3))
    blobs = centres[rng.integers(0, 12, 2400)] + 0.08 * rng.standard_normal((2400, 3))
    return np.concatenate([blobs, rng.uniform(-1.0, 1.0, (600, 3))])[rng.permutation(3000)]


def _high_dim() -> np.ndarray:
    """2,600 rows in d = 40: tight groups plus spread rows (projected search, isolation screen)."""
    rng = np.random.default_rng(11)
    centres = rng.standard_normal((40, 40)) * 0.3
    groups = centres[rng.integers(0, 40, 1800)] + 0.08 * rng.standard_normal((1800, 40))
    spread = 0.3 * rng.standard_normal((800, 40))
    return np.concatenate([groups, spread])[rng.permutation(2600)]


def _supervised():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((800, 2))
    beta = np.array([1.5, -1.0])
    y = (rng.uniform(size=800) < 1.0 / (1.0 + np.exp(-x @ beta))).astype(np.int64)
    yreg = x @ beta + 0.3 * rng.standard_normal(800)
    return x, y, yreg


def _cases() -> dict:
    """name -> zero-argument function returning a Clustering."""
    lo, hi = _low_dim(), _high_dim()
    x, y, yreg = _supervised()
    cases = {}
    for rule in compress.RULES:
        cases[f"low_{rule}"] = lambda rule=rule: compress.cluster(lo, 0.15, rule=rule)
    for rule in ("auto", "stream", "blocked", "merge"):
        cases[f"high_{rule}"] = lambda rule=rule: compress.cluster(hi, 0.5, rule=rule, key=5)
    cases["low_projected"] = lambda: compress.cluster(lo, 0.15, method="projected", projected_dims=2, key=1)
    cases["low_standardized"] = lambda: compress.cluster(lo, 0.1, standardize=True)
    cases["by_label"] = lambda: compress.cluster_supervised(x, y, 0.4)
    cases["joint"] = lambda: compress.cluster_supervised(x, yreg, 0.4, standardize=True)
    cases["shards"] = lambda: compress.cluster_shards([lo[:1700], lo[1700:]], 0.15)
    cases["stream_chunks"] = lambda: compress.cluster_stream((lo[s : s + 700] for s in range(0, 3000, 700)), 0.15)
    return cases


FIELDS_EXACT = ("labels", "counts")
FIELDS_CLOSE = ("centroids", "radii", "covariances", "targets")


def _arrays(name: str, cl) -> dict:
    """The clustering's arrays; wide centroids and covariances (``d > 3``) as per-cluster digests
    (row sums, squared norms, traces): the exact labels already fix the partition, and the digests
    keep the stored files small."""
    out = {}
    for field in FIELDS_EXACT + FIELDS_CLOSE:
        value = getattr(cl, field)
        if value is None:
            continue
        value = np.asarray(value)
        if field == "centroids" and value.shape[-1] > 3:
            out[f"{name}/centroid_sum"] = value.sum(axis=1)
            out[f"{name}/centroid_sq"] = np.einsum("ij,ij->i", value, value)
        elif field == "covariances" and value.shape[-1] > 3:
            out[f"{name}/cov_trace"] = np.trace(value, axis1=1, axis2=2)
            out[f"{name}/cov_sum"] = value.sum(axis=(1, 2))
        else:
            out[f"{name}/{field}"] = value
    return out


def _logistic(theta, datum):
    xj, yj = datum
    z = jnp.dot(xj, theta)
    return yj.astype(z.dtype) * z - jnp.logaddexp(0.0, z)


def _gaussian_prior(theta):
    return -0.5 * jnp.sum(theta**2)


def _positions() -> np.ndarray:
    return np.array([[0.0, 0.0], [1.5, -1.0], [-0.7, 2.2]])


def _logdensity_values() -> dict:
    x, y, _ = _supervised()
    cl = compress.cluster_supervised(x, y, 0.4)
    data = (x, y.astype(np.float64))
    out = {}
    with jax.enable_x64(True):
        for order, fn in (
            ("first", compress.logdensity(_gaussian_prior, _logistic, cl, second_order=False)),
            ("second", compress.logdensity(_gaussian_prior, _logistic, cl, second_order=True)),
            ("exact", compress.logdensity(_gaussian_prior, _logistic, data)),
        ):
            pos = jnp.asarray(_positions())
            out[f"{order}/value"] = np.asarray(jax.vmap(fn)(pos))
            out[f"{order}/grad"] = np.asarray(jax.vmap(jax.grad(fn))(pos))
    return out


def regenerate() -> None:
    GOLDEN.mkdir(exist_ok=True)
    arrays = {}
    for name, make in _cases().items():
        arrays.update(_arrays(name, make()))
    np.savez_compressed(CLUSTERINGS, **arrays)
    np.savez_compressed(LOGDENSITY, **_logdensity_values())


@pytest.fixture(scope="module")
def golden():
    with np.load(CLUSTERINGS) as f:
        return dict(f)


@pytest.mark.parametrize("name", sorted(_cases()))
def test_clustering_matches_golden(name, golden):
    cl = _cases()[name]()
    got = _arrays(name, cl)
    want = {k: v for k, v in golden.items() if k.split("/")[0] == name}
    assert want, f"no golden arrays for {name}"
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        if key.split("/")[1] in FIELDS_EXACT:
            np.testing.assert_array_equal(got[key], value, err_msg=key)
        else:
            np.testing.assert_allclose(got[key], value, rtol=RTOL, atol=1e-14, err_msg=key)
    assert cl.radius <= cl.target_radius


def test_logdensity_matches_golden():
    with np.load(LOGDENSITY) as f:
        want = dict(f)
    got = _logdensity_values()
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=RTOL, atol=1e-12, err_msg=key)


def test_golden_first_and_second_order_differ():
    """Negative control: the stored first- and second-order values are distinguishable at RTOL."""
    with np.load(LOGDENSITY) as f:
        assert not np.allclose(f["first/value"], f["second/value"], rtol=RTOL)


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    regenerate()
    print(f"wrote {CLUSTERINGS} and {LOGDENSITY}")
