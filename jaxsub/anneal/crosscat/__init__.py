"""CrossCat (Pitman-Yor cross-categorization) with subsample annealing over rows.

Model (Mansinghka et al. 2009, with the Pitman-Yor extension of Obermeyer et al. 2014, section 4)::

    features -> views            ~ PY(alpha_v, d_v)             (partition of the F columns)
    rows -> clusters, per view v  ~ PY(alpha_r[v], d_r[v])       (one row partition per view)
    x[r, f] | cluster c of view(f) ~ conjugate feature model f   (collapsed)

Feature models: :class:`~jaxsub.anneal.model.DirichletCategorical` with a *non-uniform*
Dirichlet concentration learned per level and feature, :class:`~jaxsub.anneal.model.BetaBernoulli`
(a 2-level categorical), :class:`~jaxsub.anneal.model.NormalInverseChiSquared` reals.
Missing cells (NaN) contribute no factor: they are skipped in every statistic and score.

Moves (all pure, jit/vmap-able; one chain per call, ``vmap`` for chains):

* :func:`row_tick`: one schedule tick (codes of :mod:`jaxsub.anneal.schedules`) removes and/or
  adds one row *in every view at once*: each occupied view draws the row's cluster from its
  own eq. (star), so a tick is the single-view kernel vmapped over views (cost O(F x C), the
  per-view scores are a segment-sum of per-feature scores over ``view_of``).
* :func:`feature_gibbs`: Neal's (2000) Algorithm 8 over views for one feature: ``num_aux``
  auxiliary empty views whose row partitions (of the current subsample) are drawn from the
  row PY prior; weights ``(n_v - d_v) p(x_f | pi_v)`` and ``(alpha_v + K d_v)/m p(x_f | pi_aux)``.
* :func:`new_view_mh`: the paper's Metropolis-Hastings proposal of a new feature set from the
  PY prior: pick a feature; if it shares its view, propose splitting it off into a new view
  whose row partition is a fresh PY-prior draw; if it is alone, with probability 1/2 propose a
  fresh partition for its view, else merging it into a uniformly chosen other view. Acceptance
  (prior of the proposed partition cancels with its proposal density)::

      split:   (alpha_v + K d_v) / (n - 1 - d_v) * p(x_f | pi*) / p(x_f | pi_v) / (2 K)
      merge:   (n_w - d_v) / (alpha_v + (K - 1) d_v) * p(x_f | pi_w) / p(x_f | pi_v) * 2 (K - 1)
      refresh: p(x_f | pi*) / p(x_f | pi_v)

  (``K`` views before the move, ``n`` features in the feature's view, ``n_w`` in the target).
* :func:`resample_hypers`: grid Gibbs of the view-partition ``(alpha_v, d_v)``, every occupied
  view's row ``(alpha, d)``, every categorical level's Dirichlet pseudo-count and every NIX
  parameter (uniform priors on the grids).

:func:`build_sweep` scans ticks of vmapped chains and, once per full cycle through the current
subsample, runs a feature sweep (Gibbs + MH for every feature) and the hyper step;
:func:`fit` is the host-side driver (schedules with the ``"random"`` or ``"fifo"`` (loom) row policy,
checkpoints, held-out scores, chain groups in host threads), tuned by :class:`FitOptions`.
Queries: :func:`heldout_rows`, :func:`predictive_samples`, :func:`depends_on`.

Modules: :mod:`~jaxsub.anneal.crosscat.model` (model, table, state), :mod:`~jaxsub.anneal.crosscat.scores`,
:mod:`~jaxsub.anneal.crosscat.score_cache`, :mod:`~jaxsub.anneal.crosscat.rows` (row ticks),
:mod:`~jaxsub.anneal.crosscat.blocks` (block Gibbs ticks), :mod:`~jaxsub.anneal.crosscat.partitions` (PY
prior draws), :mod:`~jaxsub.anneal.crosscat.views` (view moves), :mod:`~jaxsub.anneal.crosscat.grids` and
:mod:`~jaxsub.anneal.crosscat.hypers` (hyperparameters), :mod:`~jaxsub.anneal.crosscat.features` (the
feature sweep), :mod:`~jaxsub.anneal.crosscat.sweep` (schedule sweeps),
:mod:`~jaxsub.anneal.crosscat.copy_avoidance` (XLA:CPU in-place updates of the row sweep),
:mod:`~jaxsub.anneal.crosscat.fit` (driver), :mod:`~jaxsub.anneal.crosscat.result`,
:mod:`~jaxsub.anneal.crosscat.queries`.

Assumptions: a newly opened view takes the row ``(alpha, d)`` of its slot (reset to the model's
values whenever a view empties), so with hyper grids the hyperprior of a newborn view's row
partition is a point mass at the model's values; with fixed hyperparameters every move leaves
the exact posterior invariant (tests enumerate it). Capacity ``C`` clusters per view is static:
a chain that needs more halts (nothing dropped) and :func:`fit` grows the capacity on the host
(:func:`grow`) and resumes, up to ``max_capacity`` (then :class:`~jaxsub.anneal.mixture.CapacityError`).

References
----------
Mansinghka et al., "Cross-categorization", NIPS workshop 2009; Obermeyer, Glidden & Jonas,
AISTATS 2014, section 4; Neal, JCGS 2000 (Algorithm 8).
"""

from __future__ import annotations

from jaxsub.anneal.crosscat.blocks import block_tick
from jaxsub.anneal.crosscat.features import feature_sweep, width_ladder
from jaxsub.anneal.crosscat.fit import FitOptions, fit
from jaxsub.anneal.crosscat.grids import CrossCatGrids, data_grids, default_crosscat_grids
from jaxsub.anneal.crosscat.hypers import resample_hypers
from jaxsub.anneal.crosscat.model import (
    CrossCatData,
    CrossCatHypers,
    CrossCatModel,
    CrossCatState,
    encode_table,
    grow,
    init,
    init_hypers,
)
from jaxsub.anneal.crosscat.partitions import prior_view_partition
from jaxsub.anneal.crosscat.queries import depends_on, heldout_rows, predictive_samples
from jaxsub.anneal.crosscat.result import CrossCatFit, diagnose
from jaxsub.anneal.crosscat.rows import TICK_WORDS, row_tick, tick_words
from jaxsub.anneal.crosscat.scores import log_joint
from jaxsub.anneal.crosscat.sweep import build_sweep
from jaxsub.anneal.crosscat.views import feature_gibbs, new_view_mh

__all__ = [
    "CrossCatData",
    "CrossCatFit",
    "CrossCatGrids",
    "CrossCatHypers",
    "CrossCatModel",
    "CrossCatState",
    "FitOptions",
    "TICK_WORDS",
    "block_tick",
    "build_sweep",
    "data_grids",
    "default_crosscat_grids",
    "depends_on",
    "diagnose",
    "encode_table",
    "feature_gibbs",
    "feature_sweep",
    "fit",
    "grow",
    "heldout_rows",
    "init",
    "init_hypers",
    "log_joint",
    "new_view_mh",
    "predictive_samples",
    "prior_view_partition",
    "resample_hypers",
    "row_tick",
    "tick_words",
    "width_ladder",
]
