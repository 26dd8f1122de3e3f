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


def test_data_dir_fallback_order(tmp_path, monkeypatch):
    """$JAXSUB_DATA_DIR, then a source checkout's ../shared/data (if it exists), then the user cache dir."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    checkout = tmp_path / "shared" / "data"
    monkeypatch.setattr(datasets, "_source_checkout_dir", lambda: checkout)
    monkeypatch.delenv("JAXSUB_DATA_DIR", raising=False)
    assert datasets.data_dir() == tmp_path / "cache" / "jaxsub" / "data"  # checkout folder absent
    checkout.mkdir(parents=True)
    assert datasets.data_dir() == checkout
    monkeypatch.setenv("JAXSUB_DATA_DIR", str(tmp_path / "mine"))
    assert datasets.data_dir() == tmp_path / "mine"  # wins even when missing: typos are reported
    monkeypatch.delenv("JAXSUB_DATA_DIR")
    monkeypatch.setattr(datasets, "_source_checkout_dir", lambda: None)  # installed package
    assert datasets.data_dir() == tmp_path / "cache" / "jaxsub" / "data"


def test_installed_package_error_names_every_place(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("JAXSUB_DATA_DIR", raising=False)
    monkeypatch.setattr(datasets, "_source_checkout_dir", lambda: None)
    datasets.load_california_housing.cache_clear()
    with pytest.raises(datasets.DatasetNotFoundError) as err:
        datasets.load_california_housing()
    message = str(err.value)
    assert "cal_housing.data.gz" in message and "JAXSUB_DATA_DIR is not set" in message
    assert "not a source checkout" in message and str(tmp_path / "cache" / "jaxsub" / "data") in message
    datasets.load_california_housing.cache_clear()


def test_source_checkout_is_detected():
    here = datasets._source_checkout_dir()
    assert here is not None and here.parts[-2:] == ("shared", "data")
