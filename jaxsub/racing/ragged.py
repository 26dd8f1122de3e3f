"""Racing over ragged arms: each state has its own population and schedule (§5.3, App. C.3).

Target::

    p(x = i) ∝ exp(beta * S_i),   S_i = log f0(i) + sum_{n < N_i} log f_n(i),

where arm ``i`` has its own population of ``N_i`` factors (e.g. the members of
candidate cluster ``i`` in a coreference Gibbs sweep; ``N_i`` from 0 to 1e5 in
one conditional). Zero-padding every arm to ``max_i N_i``
(:func:`jaxsub.discrete.pad_populations`) is correct but makes a small arm's
reward population a mixture of its factors and zeros, so the race reads about
``max_i N_i`` data for it. Here every arm follows its own doubling schedule
``T_{i,t} = min(m1 2^(t-1), N_i)`` and its own finite-population correction,
and an arm whose population is exhausted is exact from then on.

Decision rule
-------------
With Gumbel noise ``eps_i`` (divided by ``beta``), the estimate of arm ``i``'s
sum after ``T_i`` of its factors, drawn without replacement, is
``Ŝ_i = log f0(i) + eps_i / beta + N_i mû_i`` with uncertainty::

    U_i = N_i * z_i * sigmâ_i * sqrt((1/T_i) (1 - (T_i - 1)/(N_i - 1))),   U_i = 0 once T_i = N_i,
    z_i = Phi^{-1}(1 - delta / (D k_i)),

``k_i`` being the number of stages at which arm ``i`` is tested (``T_{i,t} < N_i``).
Arm ``i`` is eliminated when ``max_j Ŝ_j - Ŝ_i > U_leader + U_i``. The best arm
is lost only if some arm's estimate leaves its one-sided band at some tested
stage; each arm's band fails with probability at most ``delta / D`` (a union
over its ``k_i`` stages, Bonferroni, under the normal approximation of each
stage mean), so the returned state is within total variation ``delta`` of
``p^beta`` (Prop. 1 and 3 of the paper). Bonferroni over stages replaces
``B_Normal(delta', N_i, m1)``: it is valid for every correlation between stages
and needs no table, so ``N_i``, ``delta`` and ``beta`` can all be traced (a
Gibbs sweep changes the cluster sizes every step). It costs little: for 10
tested stages at ``delta' = 1e-3``, ``z = 4.26`` against ``B_Normal ~ 4.1``.

Variances are per arm (marginal): arms do not share data indices, so the
pairwise variance of the paper is not available. ``num_evaluations`` counts
the factors read for surviving arms (``sum_i T_i``); ``log_factor_fn`` is still
called on a ``[m, D]`` block per chunk, with masked entries for arms that are
eliminated or exhausted.

References
----------
Chen & Ghahramani (2016), Alg. 1, §5.3 and App. C.3.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtri

from jaxsub.racing.bounds import SCHEDULES, race_schedule
from jaxsub.racing.info import RacingInfo, beta_is_bad, check_beta, check_factor_fn, flag_invalid
from jaxsub.subsample import dynamic_permutation_indices, permutation_round_keys
from jaxsub.types import Array, PRNGKey
from jaxsub.validation import check_choice, check_hyperparameter, check_int

__all__ = ["racing_ragged"]


def _chunk_plan(sizes, first_batch_size: int, max_block_size: int) -> list[tuple[int, int]]:
    """``[(chunk, last_stage)]``: stage t reads ``m_t = T_t - T_{t-1}`` positions in chunks of
    the largest ``m1 * 8^k <= min(m_t, max_block_size)`` (tiles every stage but the last; few
    distinct chunk sizes, so few loop bodies to compile)."""
    plan: list[tuple[int, int]] = []
    prev = 0
    for t, stop in enumerate(sizes):
        m_t = stop - prev
        prev = stop
        c = first_batch_size
        while 8 * c <= min(m_t, max_block_size):
            c *= 8
        if plan and plan[-1][0] == c:
            plan[-1] = (c, t)
        else:
            plan.append((c, t))
    return plan


def racing_ragged(
    log_factor_fn: Callable[[Array], Array],
    num_states: int,
    max_population: int,
    *,
    delta,
    first_batch_size: int = 50,
    gumbel_noise: bool = True,
    exact: bool = False,
    max_block_size: int = 16384,
    schedule: str = "doubling",
) -> Callable:
    """Racing sampler for arms with populations of different sizes ``N_i`` (per-arm schedules).

    Parameters
    ----------
    log_factor_fn
        ``log_factor_fn(indices [m, D] int32) -> [m, D]``: entry ``[r, i]`` is
        ``log f_n(i)`` for ``n = indices[r, i]``, a datum of arm ``i``'s own
        population ``[0, N_i)``. Entries whose row is beyond ``N_i`` (their
        index is clipped into range, or 0 when ``N_i = 0``) are ignored, but
        must not raise.
    num_states
        ``D >= 2`` (static).
    max_population
        Static upper bound on every ``N_i`` (fixes the number of stages and the
        compiled loops); at least ``first_batch_size``.
    delta
        Total-variation error allowed per draw, in ``(0, 1)``; may be traced.
    first_batch_size
        ``m1`` of every arm's doubling schedule (static, >= 2).
    gumbel_noise
        ``True``: a draw from ``p^beta``. ``False``: the argmax of ``S_i``.
    exact
        Read every arm's whole population (no elimination): the exact draw
        through the same code, for baselines and tests. The rows are read in
        index order (no permutation: the sums do not depend on the order;
        measured 25x faster than permuted reads on the ragged test problem).
    max_block_size
        Largest chunk of positions read per loop iteration (memory ``chunk x D``).
    schedule
        ``"doubling"`` (default: each arm's ``T_{i,t} = min(m1 2^(t-1), N_i)``) or ``"fixed"``
        (as :func:`jaxsub.discrete.racing`'s): one elimination test after
        ``min(m1, N_i)`` data of each arm, then the surviving arms read their whole
        populations. Two stage loops to compile instead of one per chunk size, and one
        test per arm, so ``z_i = Phi^{-1}(1 - delta / D)`` (the Bonferroni rule above with
        ``k_i = 1``): the same guarantee under the same normal approximation of the
        ``m1``-sample means. For small populations and inside jitted sweeps.

    Returns
    -------
    sample
        ``sample(rng_key, log_f0 [D], population_sizes [D] int, beta=None) -> (x, info)``:
        ``population_sizes`` (the ``N_i``, ``0 <= N_i <= max_population``) and
        ``beta`` (inverse temperature, ``None`` for 1; ``inf`` gives the MAP)
        may be traced; ``info`` is a :class:`~jaxsub.discrete.RacingInfo`
        (``num_data_used`` is the largest ``T_i``). Pure: jit and vmap it.

    Raises
    ------
    ValueError
        Bad static settings, or concrete ``delta`` / ``beta`` / sizes out of range.
    """
    D = check_int("num_states", num_states, low=2)
    first_batch_size = check_int("first_batch_size", first_batch_size, low=2)
    n_max = check_int("max_population", max_population, low=first_batch_size)
    max_block_size = check_int("max_block_size", max_block_size, low=first_batch_size)
    if not callable(log_factor_fn):
        raise ValueError(f"log_factor_fn must be callable; got {log_factor_fn!r}")
    check_hyperparameter("delta", delta, low=0.0, high=1.0)
    gumbel_noise, exact = bool(gumbel_noise), bool(exact)
    schedule = check_choice("schedule", schedule, SCHEDULES)
    check_factor_fn(log_factor_fn, D, (2, D))
    sizes = np.asarray(race_schedule(n_max, first_batch_size, schedule), np.int32)
    plan = _chunk_plan(sizes.tolist(), first_batch_size, max_block_size)
    num_stages = len(sizes)

    def sample(rng_key: PRNGKey, log_f0: Array, population_sizes, beta=None):
        log_f0 = jnp.asarray(log_f0)
        if log_f0.shape != (D,) or not jnp.issubdtype(log_f0.dtype, jnp.floating):
            raise ValueError(f"log_f0 must be a float array of shape ({D},); got {log_f0.shape} {log_f0.dtype}")
        dtype = log_f0.dtype
        pop = jnp.asarray(population_sizes)
        if pop.shape != (D,) or not jnp.issubdtype(pop.dtype, jnp.integer):
            raise ValueError(f"population_sizes must be an integer array of shape ({D},); got {pop.shape} {pop.dtype}")
        if not isinstance(pop, jax.core.Tracer):
            p = np.asarray(pop)
            if np.any(p < 0) or np.any(p > n_max):
                raise ValueError(f"population_sizes must be in [0, max_population={n_max}]; got {p.tolist()}")
        check_beta(beta, gumbel_noise)
        pop = pop.astype(jnp.int32)
        key_perm, key_gumbel = jax.random.split(rng_key)
        round_keys = jax.vmap(permutation_round_keys)(jax.random.split(key_perm, D))  # [D, R]
        offset = log_f0
        if gumbel_noise:
            noise = jax.random.gumbel(key_gumbel, (D,), dtype)
            offset = offset + (noise if beta is None else noise / jnp.asarray(beta, dtype))
        popf = pop.astype(dtype)
        # Stages at which arm i is tested (T_t < N_i), and its per-stage z (Bonferroni).
        tested = jnp.sum(jnp.asarray(sizes[:-1])[None, :] < pop[:, None], axis=1)
        arm_delta = jnp.asarray(delta, dtype) / D
        z = ndtri(1.0 - arm_delta / jnp.maximum(tested, 1).astype(dtype))
        alive0 = (offset > -jnp.inf) & ~jnp.isnan(offset)
        bad0 = (
            jnp.any(jnp.isnan(offset) | (offset == jnp.inf))
            | beta_is_bad(beta)
            | ~((jnp.asarray(delta) > 0) & (jnp.asarray(delta) < 1))
        )
        zeros = jnp.zeros((D,), dtype)
        # state: (count, mean, m2, alive, done, has_nan, evals, stage)
        s0 = (
            jnp.zeros((), jnp.int32),
            zeros,
            zeros,
            alive0,
            bad0 | (jnp.sum(alive0) <= 1),
            bad0,
            jnp.zeros((), jnp.int32),
            jnp.zeros((), jnp.int32),
        )

        def estimates(count, mean, alive):
            t_i = jnp.minimum(count, pop).astype(dtype)
            return jnp.where(alive, offset + popf * jnp.where(t_i > 0, mean, 0), -jnp.inf), t_i

        def make_body(csize):
            def body(s):
                count, mean, m2, alive, done, has_nan, evals, stage = s
                stop = jnp.asarray(sizes)[stage]
                pos = count + jnp.arange(csize, dtype=jnp.int32)
                valid = (pos[None, :] < jnp.minimum(stop, pop)[:, None]) & alive[:, None]  # [D, c]
                if exact:
                    # Every arm reads its whole population: the order does not matter, so read it in
                    # index order (no permutation: contiguous reads, no cycle walking).
                    idx = jnp.minimum(pos[None, :], jnp.maximum(pop, 1)[:, None] - 1)
                else:
                    idx = jax.vmap(dynamic_permutation_indices, in_axes=(0, None, 0))(
                        round_keys, pos, jnp.maximum(pop, 1)
                    )
                r = jnp.asarray(log_factor_fn(idx.T))
                if r.shape != (csize, D):
                    raise ValueError(f"log_factor_fn must return shape [m, {D}]; got {r.shape} for m={csize}")
                rt = r.T.astype(dtype)
                dead = jnp.any(valid & (rt == -jnp.inf), axis=1)
                nb = jnp.sum(valid, axis=1).astype(dtype)
                na = jnp.minimum(count, pop).astype(dtype)
                shift = jnp.where(na > 0, mean, jnp.where(valid, rt, 0)[:, 0])
                dz = jnp.where(valid & (rt > -jnp.inf), rt - shift[:, None], 0)
                a = jnp.sum(dz, axis=1) / jnp.maximum(nb, 1)
                n = jnp.maximum(na + nb, 1)
                dd = shift + a - mean
                mean = jnp.where(nb > 0, mean + dd * (nb / n), mean)
                m2 = m2 + jnp.where(nb > 0, (jnp.sum(dz * dz, axis=1) - nb * a * a) + dd * dd * (na * nb / n), 0)
                evals = evals + jnp.sum(valid, dtype=jnp.int32)
                alive = alive & ~dead
                count = count + csize
                at_end = count >= stop
                bad = at_end & jnp.any(alive & ~(jnp.isfinite(mean) & jnp.isfinite(m2)))
                mu, t_i = estimates(count, mean, alive)
                exhausted = t_i >= popf
                if not exact:
                    sd2 = (1.0 / jnp.maximum(t_i, 1)) * (1.0 - (t_i - 1) / jnp.maximum(popf - 1, 1))
                    sig = jnp.sqrt(jnp.maximum(m2 / jnp.maximum(t_i, 1), 0))
                    u = jnp.where(exhausted, 0, popf * z * sig * jnp.sqrt(jnp.maximum(sd2, 0)))
                    best = jnp.argmax(mu)
                    kept = alive & ~(mu[best] - mu > u[best] + u)
                    alive = jnp.where(at_end & ~bad, kept, alive)
                    exhausted = exhausted | ~alive
                done = (
                    done
                    | bad
                    | (jnp.sum(alive) <= 1)
                    | (at_end & jnp.all(exhausted | ~alive))
                    | (at_end & (stage == num_stages - 1))
                )
                return count, mean, m2, alive, done, has_nan | bad, evals, stage + (at_end & ~done).astype(jnp.int32)

            return body

        s = s0
        for csize, last in plan:
            s = jax.lax.while_loop(lambda s, last=last: ~s[4] & (s[7] <= last), make_body(csize), s)
        count, mean, m2, alive, done, has_nan, evals, stage = s
        mu, t_i = estimates(count, mean, alive)
        x = flag_invalid(jnp.argmax(mu), has_nan | ~jnp.any(alive))
        info = RacingInfo(
            num_evaluations=evals,
            num_data_used=jnp.max(jnp.where(alive, t_i, 0)).astype(jnp.int32),
            num_stages=jnp.where(count > 0, stage + 1, 0).astype(jnp.int32),
            is_exact=jnp.all(~alive | (t_i >= popf)),
            has_nan=has_nan | ~jnp.any(alive),
            num_alive=jnp.sum(alive, dtype=jnp.int32),
        )
        return x, info

    return sample
