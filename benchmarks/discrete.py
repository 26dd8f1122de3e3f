"""Racing-Normal vs the exact Gumbel-max sampler (jaxsub.discrete), ratios in one run.

Target: ``x ~ p(x) ∝ prod_n f_n(x)`` over D candidate parameters, N = 1e6 data.
Four factors, from the cheapest to a realistic per-arm model:

* ``gauss``: ``log f_n(i) = -(y_n - mu_i)^2 / 2``, D candidate means of a
  Gaussian location (a discretised parameter: the Gibbs step of a model with
  a discrete parameter). Three flops per reward: the exact sampler runs at
  SIMD / memory speed (~0.1-0.5 ns per reward), the hardest case for racing,
  whose every datum costs a permutation, a random gather and the moments.
* ``gauss+cv``: the same with the second-order Taylor control variate of eq. 11
  (exact for a Gaussian likelihood, so rewards have ~zero variance);
* ``table``: precomputed factors, ``log_factor_fn`` is a gather from an [N, D] table;
* ``logistic``: ``log f_n(i) = log sigmoid(t_n x_n . w_i)``, D candidate weight
  vectors ``w_i`` in R^32 (candidate models of a logistic regression, each
  reward a 32-dimensional dot product and a log-sigmoid): the regime the paper
  has in mind, where a reward costs far more than the racing bookkeeping.

Racing gets ``log_factor_states_fn`` (the same factors for a subset of states)
so that once at most K = 4 arms survive only those are evaluated (without it the
wall-clock limit is ``data_ratio``: every index drawn costs D factors). With the
control variate every race ends after the first stage, so it is not needed there.

The data are passed to the jitted samplers as arguments (closed-over arrays
would be compile-time constants, which XLA may fold). The exact baseline is
``jaxsub.discrete.gumbel_max`` (blocks of 32768 data, one fused pass per block).

Columns: ``eval_ratio = N D / mean(num_evaluations)`` (the paper's count, the
physical limit of the speedup when eliminated arms cost nothing);
``data_ratio = N / mean(num_data_used)`` (the limit when every index drawn
costs all D factors); ``speedup`` =
median wall-clock of the jitted exact sampler / median of jitted racing
(alternating calls, fresh keys each call, compile time apart).

vmap rows draw 256 samples at once, each with its own per-draw shift of the
candidate means (256 chains in different states), so neither sampler can share
work across draws. The exact baseline of these rows draws them one after another
(``lax.map`` of ``gumbel_max``), its fastest form. With identical targets the exact sums would be computed once
and shared by all draws (XLA hoists them), which is no test of racing.
Two racing rows per setting: ``vmap256`` is ``jax.vmap`` of the single-draw
sampler (every loop runs until the slowest of the 256 draws is done);
``batch256`` is :func:`jaxsub.discrete.racing_batch` with the shift as per-draw
``params`` (work proportional to the unfinished draws). Both are timed against
the same exact baseline.

Two kinds of floor rows (not samplers of the target) bound what the engine can reach:
``minimal race (floor)`` is the smallest race of the same execution model (D = 10), and
``exact pass over 2 arms (floor)`` is ``gumbel_max`` over 2 of the 100 arms on a D = 100 row's
problem: every D = 100 race takes the exact pass (all N rows for its >= 2 survivors), which
costs at least the exact sampler's own pass over those arms, so that row's speedup bounds
every D = 100 racing row of the same factor (docs/guides/discrete.md).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks._common import compare
from jaxsub import discrete

TITLE = "Racing-Normal vs exact Gumbel-max: wall-clock and evaluation ratios (N = 1e6, D in {10, 100})"

DELTA = 0.05


NUM_FEATURES = 32


def _problem(N: int, D: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = jnp.asarray(rng.standard_normal(N) * 1.0 + 0.1234, jnp.float32)
    mus = jnp.asarray(np.linspace(-0.5, 0.5, D), jnp.float32)
    return y, mus


def _logistic_problem(N: int, D: int, seed: int = 0):
    """Labels ``t_n = +-1`` from a logistic model with unit-norm weights ``w*``;
    the D candidates are ``w* + c_i v`` along a random unit direction ``v`` with
    ``c_i`` on a grid over [-2, 2] shifted so that no candidate is ``w*``."""
    rng = np.random.default_rng(seed)
    d = NUM_FEATURES
    x = rng.standard_normal((N, d)).astype(np.float32)
    w_true = rng.standard_normal(d)
    w_true /= np.linalg.norm(w_true)
    t = np.where(rng.uniform(size=N) < 1 / (1 + np.exp(-(x @ w_true))), 1.0, -1.0).astype(np.float32)
    v = rng.standard_normal(d)
    v /= np.linalg.norm(v)
    c = np.linspace(-2.0, 2.0, D) + 0.1234
    w = (w_true[:, None] + v[:, None] * c[None, :]).astype(np.float32)  # [d, D]
    return jnp.asarray(x * t[:, None]), jnp.asarray(w)  # rows t_n x_n


def _loglik(theta, yn):
    return -0.5 * (yn - theta) ** 2


def _gauss_fn(y, mus):
    return lambda idx: _loglik(mus[None, :], y[idx][:, None])


def _gauss_states_fn(y, mus):
    return lambda idx, states: _loglik(mus[states][None, :], y[idx][:, None])


def _build(kind, data, N, D, block_size=1):
    """``(exact, racing)`` samplers of ``kind`` over the arrays ``data`` (traced)."""
    if kind == "logistic":
        tx, w = data
        fn = lambda idx: jax.nn.log_sigmoid(tx[idx] @ w)  # noqa: E731
        states_fn = lambda idx, states: jax.nn.log_sigmoid(tx[idx] @ w[:, states])  # noqa: E731
    elif kind == "table":
        table = data[0]
        fn = lambda idx: table[idx]  # noqa: E731
        states_fn = lambda idx, states: table[idx[:, None], states[None, :]]  # noqa: E731
    else:
        y, mus = data
        fn, states_fn = _gauss_fn(y, mus), _gauss_states_fn(y, mus)
    cv = None
    if kind == "gauss+cv":
        y, mus = data
        cv = discrete.data_taylor_control_variate(_loglik, mus, y)
    exact = discrete.gumbel_max(fn, D, N)
    race = discrete.racing(
        fn,
        D,
        N,
        delta=DELTA,
        control_variate=cv,
        log_factor_states_fn=None if cv is not None else states_fn,
        block_size=block_size,
    )
    return exact, race


def _timing_columns(timing) -> dict:
    """A row's timing columns from :func:`benchmarks._common.compare` (exact = baseline, racing = candidate)."""
    return dict(
        exact_s=timing["baseline_s"],
        racing_s=timing["candidate_s"],
        speedup=timing["speedup"],
        exact_compile_s=timing["baseline_first_call_s"],
        racing_compile_s=timing["candidate_first_call_s"],
        repeats=timing["repeats"],
        racing_times=timing["candidate_times"],
        exact_times=timing["baseline_times"],
    )


def _single_rows(kind, N, D, repeats, block_size=1):
    if kind == "logistic":
        data = _logistic_problem(N, D)
    else:
        y, mus = _problem(N, D)
        data = (_loglik(mus[None, :], y[:, None]),) if kind == "table" else (y, mus)  # table: [N, D] once
    exact_j = jax.jit(lambda k, f0, data: _build(kind, data, N, D)[0](k, f0))
    race_j = jax.jit(lambda k, f0, data: _build(kind, data, N, D, block_size)[1](k, f0))
    log_f0 = jnp.zeros(D, jnp.float32)
    keys = jax.random.split(jax.random.key(1), 1000)
    timing = compare(exact_j, race_j, lambda i: (keys[i], log_f0, data), repeats=repeats)
    # Evaluation counts over COUNT_DRAWS further draws (not timed).
    infos = [race_j(keys[500 + i], log_f0, data)[1] for i in range(COUNT_DRAWS)]
    evals = np.mean([int(i.num_evaluations) for i in infos])
    used = np.mean([int(i.num_data_used) for i in infos])
    return dict(
        factor=kind,
        mode="single",
        B=block_size,
        N=N,
        D=D,
        draws=1,
        eval_ratio=N * D / evals,
        data_ratio=N / used,
        **_timing_columns(timing),
    )


def _vmap_rows(kind, N, D, draws, repeats, modes=("vmap", "batch"), block_size=1):
    """Two rows: ``jax.vmap`` of the single-draw sampler (mode ``vmap<B>``) and
    :func:`jaxsub.discrete.racing_batch` (mode ``batch<B>``, the per-draw shift as
    ``params``), each against the same vmapped exact sampler, in one run."""
    y, mus0 = _problem(N, D)
    rng = np.random.default_rng(2)
    ym, ycov = discrete.data_moments(y)  # computed once, passed in (as a user would)

    def cv_for(mus, data):
        y, ym, ycov = data
        return discrete.data_taylor_control_variate(_loglik, mus, y, data_mean=ym, data_cov=ycov)

    def build(shift, data):
        y = data[0]
        mus = mus0 + shift
        fn = _gauss_fn(y, mus)
        cv = cv_for(mus, data) if kind == "gauss+cv" else None
        return (
            discrete.gumbel_max(fn, D, N),
            discrete.racing(
                fn,
                D,
                N,
                delta=DELTA,
                control_variate=cv,
                block_size=block_size,
                log_factor_states_fn=None if cv is not None else _gauss_states_fn(y, mus),
            ),
        )

    def build_batch(data):
        """The batched sampler: the same target, the shift passed as per-draw params."""
        y = data[0]
        batch_cv = None
        if kind == "gauss+cv":
            batch_cv = (lambda idx, sh: cv_for(mus0 + sh, data).fn(idx), lambda sh: cv_for(mus0 + sh, data).mean)
        return discrete.racing_batch(
            lambda idx, sh: _loglik((mus0 + sh)[None, :], y[idx][:, None]),
            D,
            N,
            delta=DELTA,
            control_variate=batch_cv,
            block_size=block_size,
            log_factor_states_fn=None
            if batch_cv is not None
            else (lambda idx, states, sh: _loglik((mus0 + sh)[states][None, :], y[idx][:, None])),
        )

    data = (y, ym, ycov)
    # The exact baseline draws one after another (``lax.map``): under ``jax.vmap`` the exact sums
    # of 256 draws measured 8x slower per draw than single draws (7.6 s vs 256 x 3.5 ms),
    # which would flatter the batched ratio.
    exact_v = jax.jit(lambda k, s, f0, data: jax.lax.map(lambda a: build(a[1], data)[0](a[0], a[2]), (k, s, f0)))
    race_v = jax.jit(lambda k, s, f0, data: jax.vmap(lambda k, s, f0: build(s, data)[1](k, f0))(k, s, f0))
    batch_j = jax.jit(lambda k, s, f0, data: build_batch(data)(k, f0, s))

    def args(i):
        keys = jax.random.split(jax.random.key(100 + i), draws)
        shifts = jnp.asarray(rng.uniform(-0.05, 0.05, draws), jnp.float32)
        return keys, shifts, jnp.zeros((draws, D), jnp.float32), data

    rows = []
    count_args = args(10_000)  # the same draws give both rows' evaluation counts
    for mode, candidate in ((f"vmap{draws}", race_v), (f"batch{draws}", batch_j)):
        if mode.rstrip("0123456789") not in modes:
            continue
        timing = compare(exact_v, candidate, args, repeats=repeats)
        _, info = candidate(*count_args)
        evals = float(np.mean(np.asarray(info.num_evaluations)))
        used = float(np.mean(np.asarray(info.num_data_used)))
        slowest = float(np.max(np.asarray(info.num_data_used)))
        rows.append(
            dict(
                factor=kind,
                mode=mode,
                B=block_size,
                N=N,
                D=D,
                draws=draws,
                eval_ratio=N * D / evals,
                data_ratio=N / used,
                slowest_data_ratio=N / slowest,
                **_timing_columns(timing),
            )
        )
    return rows


def _minimal_race(yb, mus, num_data: int, compact: int = 4, first_batch_size: int = 50):
    """The floor of the engine's execution model: the *minimal*
    race for the Gaussian factor over blocks ``yb`` [N / B, B] (``log f_n(i) = -(y_n - mu_i)^2 / 2``),
    as straight JAX with as few kernels per stage as we could write: the doubling stages statically
    unrolled (one ``lax.switch`` per stage: all arms / ``compact`` arms / done), block indices from the
    library's keyed permutation, the gather, reward and block sum in one fusion (tree sum), every
    moment from one ``[m, k+1]^T [m, k+1]`` product (co-moments, sums, count), the pairwise
    Racing-Normal threshold of :func:`jaxsub.discrete.racing_coefficients` tested once per stage, no
    skewness guard, and an exact pass over the survivors after the stage that reaches N / 4. It has
    none of the engine's options (control variates, EBS, NaN handling, batching); it exists only to
    measure how fast a race of this execution model can be. Returns ``sample(key, log_f0) -> (x,
    evaluations)`` (evaluations in rows x arms)."""
    from jaxsub.racing.bounds import doubling_schedule
    from jaxsub.racing.populations import _tree_sum_minor
    from jaxsub.subsample import permutation_indices, permutation_round_keys

    nb, b = yb.shape
    D, K = mus.shape[0], compact
    ends = doubling_schedule(nb, first_batch_size)
    coef_a = jnp.asarray(discrete.racing_coefficients(DELTA, D, nb, first_batch_size)[0], jnp.float32)
    switch = next(i for i, e in enumerate(ends) if 4 * e >= nb)  # after this stage: exact pass

    def first_alive(alive):  # the K first alive arms by comparisons (and which are real)
        idx = jnp.arange(D)
        rank = jnp.sum(alive[None, :] & (idx[None, :] < idx[:, None]), axis=1)
        sel = alive[None, :] & (rank[None, :] == jnp.arange(K)[:, None])
        return jnp.sum(jnp.where(sel, idx[None, :], 0), axis=1), jnp.any(sel, axis=1)

    def stage(t, S, alive, rk, off, m_arms):
        lo, hi = (ends[t - 1] if t else 0), ends[t]
        blocks = permutation_indices(rk, lo + jnp.arange(hi - lo, dtype=jnp.int32), nb)
        r = _tree_sum_minor(-0.5 * (yb[blocks][None, :, :] - m_arms[:, None, None]) ** 2).T  # [m, k]
        av = alive.astype(r.dtype)
        z = jnp.where(alive[None, :], r - jnp.sum(r * av, 1, keepdims=True) / jnp.maximum(av.sum(), 1), 0.0)
        za = jnp.concatenate([z, jnp.ones((z.shape[0], 1), z.dtype)], 1)
        S = S + za.T @ za
        T = S[-1, -1]
        mean = S[-1, :-1] / T
        mu = jnp.where(alive, mean + off, -jnp.inf)
        best = jnp.argmax(mu)
        sd = jnp.diagonal(S)[:-1]
        var = (sd[best] + sd - 2 * S[best, :-1]) / T - (mean[best] - mean) ** 2
        if t < len(ends) - 1:
            alive = alive & ~((mu[best] - mu) > coef_a[t] * jnp.sqrt(jnp.maximum(var, 0)))
        return S, alive, (hi - lo) * b * jnp.sum(av > 0)  # rows x arms alive at the stage start

    def sample(key, log_f0):
        kp, kg = jax.random.split(key)
        rk = permutation_round_keys(kp)
        off = (log_f0 + jax.random.gumbel(kg, (D,))) / nb
        carry = (
            jnp.zeros((D + 1, D + 1)),
            jnp.ones(D, bool),
            jnp.zeros((K + 1, K + 1)),
            jnp.zeros(K, bool),
            jnp.zeros(K, jnp.int32),
            jnp.int32(0),
            jnp.int32(0),
        )
        for t in range(switch + 1):

            def full(c, t=t):
                S, alive, Sk, alive_k, arms, phase, ev = c
                S, alive, e = stage(t, S, alive, rk, off, mus)
                arms, valid = first_alive(alive)
                sel = (
                    jnp.zeros((K + 1, D + 1))
                    .at[:K, :D]
                    .set((arms[:, None] == jnp.arange(D)[None, :]) * 1.0)
                    .at[K, D]
                    .set(1.0)
                )
                n = jnp.sum(alive)
                return (S, alive, sel @ S @ sel.T, valid, arms, jnp.where(n <= 1, 2, jnp.where(n <= K, 1, 0)), ev + e)

            def comp(c, t=t):
                S, alive, Sk, alive_k, arms, phase, ev = c
                Sk, alive_k, e = stage(t, Sk, alive_k, rk, off[arms], mus[arms])
                return (S, alive, Sk, alive_k, arms, jnp.where(jnp.sum(alive_k) <= 1, 2, 1), ev + e)

            carry = jax.lax.switch(carry[5], [full, comp, lambda c: c], carry)
        S, alive, Sk, alive_k, arms, phase, ev = carry
        y = yb.reshape(1, -1)

        def exact_full(_):
            mu = jnp.where(alive, jnp.sum(-0.5 * (y - mus[:, None]) ** 2, 1) / nb + off, -jnp.inf)
            return jnp.argmax(mu).astype(jnp.int32), ev + num_data * jnp.sum(alive)

        def exact_k(_):
            mu = jnp.where(alive_k, jnp.sum(-0.5 * (y - mus[arms][:, None]) ** 2, 1) / nb + off[arms], -jnp.inf)
            return arms[jnp.argmax(mu)].astype(jnp.int32), ev + num_data * jnp.sum(alive_k)

        def decided(_):
            mu_k = jnp.where(alive_k, Sk[-1, :-1] / jnp.maximum(Sk[-1, -1], 1) + off[arms], -jnp.inf)
            mu_f = jnp.where(alive, S[-1, :-1] / jnp.maximum(S[-1, -1], 1) + off, -jnp.inf)
            x = jnp.where(jnp.sum(alive) > K, jnp.argmax(mu_f), arms[jnp.argmax(mu_k)])
            return x.astype(jnp.int32), ev

        return jax.lax.switch(phase, [exact_full, exact_k, decided], None)

    return sample


def _floor_row(N, D, repeats, block_size):
    """The minimal race (:func:`_minimal_race`) against ``gumbel_max`` on the Gaussian problem."""
    y, mus = _problem(N, D)
    exact_j = jax.jit(lambda k, f0, data: _build("gauss", data, N, D)[0](k, f0))
    # Whole blocks only: quick mode's N = 1e5 is not a multiple of 64 (the last N mod B rows are left out
    # of the minimal race, < 0.1% of the data; the engine rows handle a short last block).
    rows = N - N % block_size
    floor_j = jax.jit(lambda k, f0, data: _minimal_race(data[0][:rows].reshape(-1, block_size), data[1], rows)(k, f0))
    log_f0 = jnp.zeros(D, jnp.float32)
    keys = jax.random.split(jax.random.key(1), 1000)
    data = (y, mus)
    timing = compare(exact_j, floor_j, lambda i: (keys[i], log_f0, data), repeats=repeats)
    evals = np.mean([int(floor_j(keys[500 + i], log_f0, data)[1]) for i in range(COUNT_DRAWS)])
    return dict(
        factor="gauss, minimal race (floor)",
        mode="single",
        B=block_size,
        N=N,
        D=D,
        draws=1,
        eval_ratio=N * D / evals,
        data_ratio=float("nan"),
        **_timing_columns(timing),
    )


def _pass_floor_row(kind, N, D, repeats, k: int = 2):
    """``gumbel_max`` over ``k`` of the D arms against ``gumbel_max`` over all D, on a D = 100 row's problem.

    A race whose decision needs every datum for at least ``k`` arms (the exact pass, taken by every
    D = 100 race) evaluates the user's factor function on all N rows for ``k`` arms, which costs at
    least the exact sampler's own blocked, contiguous pass over those ``k`` arms; so this row's
    speedup bounds the speedup of any such race (``k = 2``: of any race that reads all the data). It
    is not a sampler of the target (a floor, like the minimal-race row)."""
    if kind == "logistic":
        tx, w = _logistic_problem(N, D)
        data = (tx, w)
        sub = lambda data: (data[0], data[1][:, :k])  # noqa: E731
    else:
        data = _problem(N, D)
        sub = lambda data: (data[0], data[1][:k])  # noqa: E731
    exact_j = jax.jit(lambda key, f0, data: _build(kind, data, N, D)[0](key, f0))
    floor_j = jax.jit(lambda key, f0, data: _build(kind, sub(data), N, k)[0](key, f0[:k]))
    log_f0 = jnp.zeros(D, jnp.float32)
    keys = jax.random.split(jax.random.key(1), 1000)
    timing = compare(exact_j, floor_j, lambda i: (keys[i], log_f0, data), repeats=repeats)
    return dict(
        factor=f"{kind}, exact pass over {k} arms (floor)",
        mode="single",
        B=1,
        N=N,
        D=D,
        draws=1,
        eval_ratio=D / k,
        data_ratio=1.0,
        **_timing_columns(timing),
    )


#: Default block size used by the block rows (the measured choice, see docs/guides/discrete.md).
BLOCK = 64

#: Untimed draws per single-draw row whose counts give the evaluation and data ratios.
COUNT_DRAWS = 40


def markdown(rows) -> str:
    """The rows as a markdown table (ratios, medians over the repeats, compile apart)."""
    head = "| factor | mode | B | N | D | eval limit ND/evals | data ratio N/T | exact (median) | racing (median, range) | speedup | speedup / eval limit | compile exact / racing |"
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        times = r.get("racing_times") or [r["racing_s"]]
        lines.append(
            f"| {r['factor']} | {r['mode']} | {r.get('B', 1)} | {r['N']:.0e} | {r['D']} | {r['eval_ratio']:.1f} | {r['data_ratio']:.1f} | "
            f"{1e3 * r['exact_s']:.2f} ms | {1e3 * r['racing_s']:.2f} ms ({1e3 * min(times):.2f}-{1e3 * max(times):.2f}) | "
            f"**{r['speedup']:.2f}x** | {r['speedup'] / r['eval_ratio']:.2f} | {r['exact_compile_s']:.1f} / {r['racing_compile_s']:.1f} s |"
        )
    return "\n".join(lines)


def run(*, quick: bool) -> list[dict]:
    """The issue-16 table in one run (<= 3 minutes on 2 idle cores), one row per target:
    single draws at N = 1e6, D = 10 (Gaussian and precomputed table), D = 100 (Gaussian at
    N = 1e6, logistic at N = 2.5e5), the small-N row (N = 2e4, D = 10) and 256 batched draws
    (Gaussian, D = 10), all with ``block_size=BLOCK``. The eval limit column ``ND / evals`` is
    the speedup racing would reach if every reward cost what it costs the exact sampler; the
    next-to-last column is the share of it reached. Quick mode: N / 10, 64 batched draws."""
    N = 10**5 if quick else 10**6
    # 9 timed calls of each sampler (3 in quick mode): with 3, the exact sampler's first calls after
    # compilation (measured 10.7, 9.1, 6.7 ms, then ~7 ms steady, Gaussian D = 100 at load 1.3;
    # docs/guides/discrete.md) set the median and flattered the D = 100 ratios.
    repeats = 3 if quick else 9
    # Compilation dominates the run time (5-7 CPU-s per racing sampler idle), so the plan keeps
    # one row per performance target; the B = 1 and control-variate rows
    # are measured in docs/guides/discrete.md.
    plan = [
        ("gauss", N, 10, BLOCK),
        ("table", N, 10, BLOCK),
        ("gauss", N, 100, BLOCK),
        ("logistic", N // 10 if quick else N // 4, 100, BLOCK),
        ("gauss", 20_000, 10, BLOCK),
    ]
    rows = []
    for kind, n, D, B in plan:
        rows.append(_single_rows(kind, n, D, repeats, block_size=B))
        print({k: v for k, v in rows[-1].items() if not isinstance(v, list)}, flush=True)
    # The floor of the execution model: the minimal race on the first row's problem (not the engine).
    rows.append(_floor_row(N, 10, repeats, BLOCK))
    print({k: v for k, v in rows[-1].items() if not isinstance(v, list)}, flush=True)
    # The floor of the D = 100 rows: every race there takes the exact pass (all N rows, >= 2 arms).
    for kind, n in (("gauss", N), ("logistic", N // 10 if quick else N // 4)):
        rows.append(_pass_floor_row(kind, n, 100, repeats))
        print({k: v for k, v in rows[-1].items() if not isinstance(v, list)}, flush=True)
    for row in _vmap_rows("gauss", N, 10, 64 if quick else 256, repeats, modes=("batch",), block_size=BLOCK):
        rows.append(row)
        print({k: v for k, v in row.items() if not isinstance(v, list)}, flush=True)
    print()
    print(markdown(rows))
    return rows


def small_population_rows(sizes=(100, 1000, 2000), states=(2, 20), draws: int = 256, repeats: int = 5) -> list[dict]:
    """What one race costs at small N inside a jitted loop (``lax.map`` over ``draws`` draws, as in a
    Gibbs sweep), ``schedule="doubling"`` vs ``schedule="fixed"`` vs ``gumbel_max``, Gaussian factors
    with sd 0.3 per datum and totals 30 nats ("far") or 1 nat ("close") apart end to end.

    Not part of :func:`run` (time budget): ``python -c "from benchmarks.discrete import
    small_population_rows as f; f()"``. Prints a markdown table; the cost in exact-evaluation units
    is the race's time divided by the exact sampler's time per reward (``exact / (N D)``)."""
    rows = []
    print(
        "| N | D | arms | race doubling / fixed (us per draw) | gumbel_max (us) | race in exact-evaluation units "
        "doubling / fixed (N D) | rewards read doubling / fixed |"
    )
    print("|---|---|---|---|---|---|---|")
    for N in sizes:
        for D in states:
            rng = np.random.default_rng(N + D)
            for kind, gap in (("far", 30.0), ("close", 1.0)):
                mu = np.linspace(0.0, gap, D) / N
                table = jnp.asarray(mu[None, :] + rng.normal(size=(N, D)) * 0.3, jnp.float32)
                fns = {}
                for name in ("doubling", "fixed", "exact"):
                    if name == "exact":
                        s = discrete.gumbel_max(lambda idx, t=table: t[idx], D, N)
                    else:
                        s = discrete.racing(lambda idx, t=table: t[idx], D, N, delta=DELTA, schedule=name)
                    f = jax.jit(lambda ks, s=s, D=D: jax.lax.map(lambda k: s(k, jnp.zeros(D)), ks))
                    fns[name] = (f, jax.block_until_ready(f(jax.random.split(jax.random.key(0), draws))))
                times = {k: [] for k in fns}
                for i in range(repeats):
                    ks = jax.random.split(jax.random.key(i + 1), draws)
                    for k, (f, _) in fns.items():
                        t0 = time.perf_counter()
                        jax.block_until_ready(f(ks))
                        times[k].append((time.perf_counter() - t0) / draws)
                med = {k: float(np.median(v)) for k, v in times.items()}
                evals = {k: float(np.mean(np.asarray(fns[k][1][1].num_evaluations))) for k in ("doubling", "fixed")}
                unit = med["exact"] / (N * D)
                row = dict(
                    N=N,
                    D=D,
                    arms=kind,
                    doubling_us=1e6 * med["doubling"],
                    fixed_us=1e6 * med["fixed"],
                    exact_us=1e6 * med["exact"],
                    doubling_units=med["doubling"] / unit,
                    fixed_units=med["fixed"] / unit,
                    doubling_evals=evals["doubling"],
                    fixed_evals=evals["fixed"],
                )
                rows.append(row)
                print(
                    f"| {N} | {D} | {kind} | {row['doubling_us']:.1f} / {row['fixed_us']:.1f} | {row['exact_us']:.1f} | "
                    f"{row['doubling_units']:.0f} / {row['fixed_units']:.0f} ({N * D}) | "
                    f"{row['doubling_evals']:.0f} / {row['fixed_evals']:.0f} |",
                    flush=True,
                )
    return rows
