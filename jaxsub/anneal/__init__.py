"""Subsample annealing for collapsed Gibbs in Dirichlet-process and Pitman-Yor mixtures.

Obermeyer, Glidden & Jonas, "Scaling nonparametric Bayesian inference via
subsample-annealing", AISTATS 2014. A collapsed Gibbs step is split into its two
halves, *remove* a row and *assign* a row from eq. (star)::

    P[row joins cluster k]  propto (n_k - d) p(x | X_k),   P[new cluster] propto (alpha + K d) p(x)

and a *schedule* of removes and adds lets the subsample churn and grow until it
holds all N rows; the subsample fraction beta(t) acts as an inverse temperature.

Quick start::

    import jax, jaxsub.anneal as an
    model = an.MixtureModel(an.CRP(1.0), [an.DirichletCategorical(3), an.BetaBernoulli()])
    sched = an.linear_anneal(num_rows=len(x), num_assignments=4 * len(x))
    result = an.fit(jax.random.key(0), x, model, sched, test_data=x_test, options=an.FitOptions(num_chains=8))
    result.trace.heldout            # [checkpoints, chains] held-out log predictive
    result.state.mixture.assignments  # [chains, N] final partition

Public API
----------
Model (:mod:`jaxsub.anneal.model`)
    ``CRP(alpha)``, ``PitmanYor(alpha, discount)``, ``Finite(weights)`` partition priors;
    ``BetaBernoulli(a, b)``, ``DirichletCategorical(num_levels, alpha)``,
    ``NormalInverseChiSquared(mu0, kappa0, nu0, sigma2)`` features;
    ``MixtureModel(prior, features)``; ``encode(model, data) -> EncodedData`` (validation:
    one feature per column, integer in-range categorical codes, finite reals);
    ``Hypers``/``init_hypers``; ``HyperGrids``/``default_grids`` (discrete hyper grids).
Mixture state (:mod:`jaxsub.anneal.mixture`)
    ``MixtureState`` (assignments + per-cluster sizes, level counts, real sums);
    ``empty_state``, ``state_from_assignments``; ``add(state, data, row, cluster)``,
    ``remove(state, data, row)`` (pure, O(features)); ``predictive_log_scores``
    (``log p(x | X_k)`` for every slot, empty slot = new cluster), ``assign_logits``
    (eq. star); ``log_partition_prior`` (CRP/PY EPPF), ``log_joint``,
    ``heldout_log_predictive``; ``grow`` (reallocate capacity outside jit), ``CapacityError``.
Schedules (:mod:`jaxsub.anneal.schedules`), data = tick codes + row policy
    ``Schedule(codes, num_rows, policy)``, codes ``REMOVE``, ``ADD``, ``GIBBS``, ``ADD_PRIOR``;
    ``prior_gibbs``, ``sequential_gibbs``, ``linear_anneal`` (section 2.4),
    ``simulated_annealing`` (energy annealing baseline), ``loom`` (FIFO window with
    accelerated extra passes, as posterior/loom), ``anneal_stepsize`` (the paper's full-data
    block Gibbs with blocks ``1/beta``; ``Schedule.blocks``, run by :mod:`jaxsub.anneal.two_urns`).
Pure moves (:mod:`jaxsub.anneal.moves`)
    ``AnnealState``, ``TickInfo``, ``init(position, model, data, capacity)`` (``position``: an
    assignment vector or ``None`` for the empty subsample), ``tick`` (remove + assign, pure,
    jit/vmap-able), ``resample_hypers`` (grid Gibbs).
Kernels (:mod:`jaxsub.anneal.sweep`)
    ``build_sweep`` (``lax.scan`` over ticks of ``vmap``-ed chains);
    ``build_kernel(model, grids) -> kernel(rng_key, state, data)`` and
    ``collapsed_gibbs(model, data, capacity)`` (``sweep.as_top_level_api``) -> BlackJAX
    ``SamplingAlgorithm`` of full-data random-scan collapsed Gibbs; ``init(position, model,
    data, capacity)`` (:mod:`jaxsub.anneal.moves`) is its ``init``: BlackJAX's module
    contract holds for :mod:`jaxsub.anneal.sweep`.
Driver (:mod:`jaxsub.anneal.driver`, host side)
    ``fit(key, data, model, schedule, *, test_data=None, initial_assignments=None, cache=None,
    options=None, **overrides) -> FitResult(state, trace, labels, heldout_rows)``, the tuning knobs
    in ``FitOptions`` (:mod:`jaxsub.anneal.options`; keyword overrides replace its fields)
    (``labels``: compact ``0..K-1``), ``SweepCache`` (compiled sweeps, owned by the caller),
    ``heldout_rows`` / ``heldout_score``, ``compact_labels``, ``diagnose`` (R-hat across
    chains on cluster counts / held-out / log joint; flags stuck chains).
CrossCat (:mod:`jaxsub.anneal.crosscat`)
    ``CrossCatModel(view_prior, row_prior, features)``, ``encode_table`` (NaN = missing),
    ``row_tick``, ``feature_gibbs`` (Algorithm 8 over views), ``new_view_mh`` (new feature
    set from the PY prior), ``resample_hypers``, ``build_sweep``, ``fit`` (``FitOptions``); queries
    ``heldout_rows``, ``predictive_samples``, ``depends_on``.
Two-urn model (:mod:`jaxsub.anneal.two_urns`)
    ``run_schedule`` (block Gibbs on the counts, any ADD_PRIOR+GIBBS schedule with blocks),
    ``block_tick``, ``log_weight``.
Exact references (:mod:`jaxsub.anneal.exact`)
    ``two_urn_log_posterior`` (the paper's Figure 2 model), ``enumerate_partitions``,
    ``exact_partition_posterior`` (tiny mixtures, by enumeration).

Cluster capacity is static (a JAX shape). A chain that must open a cluster while all
slots are full halts (``AnnealState.halted``) instead of dropping one; ``fit`` doubles
the capacity outside jit and resumes exactly, or raises ``CapacityError`` beyond
``max_capacity``.
"""

from jaxsub.anneal import crosscat, driver, exact, mixture, model, moves, options, schedules, sweep, two_urns
from jaxsub.anneal.driver import (
    Diagnostics,
    FitResult,
    FitTrace,
    SweepCache,
    compact_labels,
    diagnose,
    fit,
    heldout_rows,
    heldout_score,
)
from jaxsub.anneal.mixture import (
    CapacityError,
    MixtureState,
    add,
    assign_logits,
    empty_state,
    grow,
    heldout_log_predictive,
    log_joint,
    log_partition_prior,
    num_clusters,
    predictive_log_scores,
    remove,
    state_from_assignments,
)
from jaxsub.anneal.model import (
    CRP,
    BetaBernoulli,
    DirichletCategorical,
    EncodedData,
    Finite,
    HyperGrids,
    Hypers,
    MixtureModel,
    NormalInverseChiSquared,
    PitmanYor,
    default_grids,
    encode,
    init_hypers,
)
from jaxsub.anneal.moves import AnnealState, TickInfo, init, resample_hypers, tick
from jaxsub.anneal.options import FitOptions
from jaxsub.anneal.schedules import (
    ADD,
    ADD_PRIOR,
    GIBBS,
    NOOP,
    REMOVE,
    Schedule,
    anneal_stepsize,
    linear_anneal,
    loom,
    prior_gibbs,
    sequential_gibbs,
    simulated_annealing,
)

# the package re-exports the kernel and the SamplingAlgorithm constructor; BlackJAX's sampler module (init,
# build_kernel, as_top_level_api) is jaxsub.anneal.sweep, so its as_top_level_api is not re-exported here
from jaxsub.anneal.sweep import build_kernel, build_sweep, collapsed_gibbs

__all__ = [name for name in dir() if not name.startswith("_")]
