"""Dataset loaders: clear errors when files are missing, correct parsing of the shipped files."""
import gzip

import numpy as np
import pytest

from jaxsub import datasets


def test_missing_file_names_file_and_remedy(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSUB_DATA_DIR", str(tmp_path))
    datasets.load_mnist.cache_clear()
    with pytest.raises(datasets.DatasetNotFoundError, match=r"mnist\.npz.*JAXSUB_DATA_DIR"):
        datasets.load_mnist()
    datasets.load_covtype.cache_clear()
    with pytest.raises(datasets.DatasetNotFoundError, match="covtype"):
        datasets.load_covtype()


def test_loaders_parse_small_files(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSUB_DATA_DIR", str(tmp_path))
    rng = np.random.default_rng(0)
    np.savez_compressed(
        tmp_path / "mnist.npz",
        x_train=rng.integers(0, 256, (5, 28, 28), dtype=np.uint8),
        y_train=np.arange(5, dtype=np.uint8),
        x_test=rng.integers(0, 256, (2, 28, 28), dtype=np.uint8),
        y_test=np.arange(2, dtype=np.uint8),
    )
    rows = np.array([[-122.23, 37.88, 41, 880, 129, 322, 126, 8.3252, 452600.0]])
    with gzip.open(tmp_path / "cal_housing.data.gz", "wt") as f:
        np.savetxt(f, rows, delimiter=",")
    covtype = np.column_stack([rng.integers(0, 5, (4, 54)), np.array([1, 2, 7, 3])])
    np.savetxt(tmp_path / "covtype.data", covtype, delimiter=",", fmt="%d")
    for loader in (datasets.load_mnist, datasets.load_california_housing, datasets.load_covtype):
        loader.cache_clear()
    mnist = datasets.load_mnist()
    assert mnist.x.shape == (5, 784) and mnist.x.max() <= 1.0 and mnist.x_test.shape == (2, 784)
    cal = datasets.load_california_housing()
    np.testing.assert_allclose(cal.x[0], [8.3252, 41, 880 / 126, 129 / 126, 322, 322 / 126, 37.88, -122.23])
    np.testing.assert_allclose(cal.y, [4.526])
    cov = datasets.load_covtype()
    assert cov.x.shape == (4, 54) and cov.y.tolist() == [0, 1, 6, 2]
    for loader in (datasets.load_mnist, datasets.load_california_housing, datasets.load_covtype):
        loader.cache_clear()
