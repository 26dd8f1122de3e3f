"""Coreference: racing Gibbs for pairwise-factor clustering (Chen & Ghahramani 2016, §5.3).

* :mod:`~jaxsub.coreference.model` -- the model pieces: :func:`make_blocks` (blocking),
  :func:`encode_mentions` and :func:`similarity_factor` (a default ``pairwise_log_factor``),
  :func:`packed_similarity` (the same factor on rows packed once: a few fused array ops per pair batch),
  :func:`crf_similarity` (thresholded compatibility templates on the same rows: no sufficient statistic);
* the Gibbs sweep (racing or ``exact=True``) as a BlackJAX-style kernel, :mod:`~jaxsub.coreference.kernel`
  (:func:`build_kernel`, :func:`init`, ``kernel.as_top_level_api`` exposed as :func:`gibbs`), configured by
  :class:`CorefOptions` (:mod:`~jaxsub.coreference.options`), built from
  :mod:`~jaxsub.coreference.state` (the state and its packed form), :mod:`~jaxsub.coreference.moves`
  (moving a mention in place), :mod:`~jaxsub.coreference.rewards` (the race's rewards, one builder for every
  race), :mod:`~jaxsub.coreference.update` (the exact update), :mod:`~jaxsub.coreference.race` (the raced
  update and :func:`race_conditional`, the one adapter into :func:`jaxsub.discrete.racing`),
  :mod:`~jaxsub.coreference.hybrid`, :mod:`~jaxsub.coreference.step` (one sequential update) and
  :mod:`~jaxsub.coreference.rounds` (batched rounds);
* :mod:`~jaxsub.coreference.fit` -- the annealing driver :func:`fit` (temperatures as data);
* :mod:`~jaxsub.coreference.sufficient` -- exact Gibbs with per-cluster sums for the decomposable
  :func:`packed_similarity` factor (``sufficient.build_kernel``): ``O(P)`` per candidate cluster instead of
  ``|C|`` factor evaluations, the recommended sampler whenever the factor decomposes;
* :mod:`~jaxsub.coreference.scoring` -- :func:`b_cubed` and :func:`pairwise_f1`.

See ``docs/guides/coreference.md``.
"""

from jaxsub._toplevel import TopLevelAPI as _TopLevelAPI
from jaxsub.coreference import kernel, sufficient
from jaxsub.coreference.fit import CorefTrace, FitTrace, fit
from jaxsub.coreference.kernel import build_kernel, conditional_update, mention_classes
from jaxsub.coreference.model import (
    Blocks,
    PackedSimilarity,
    crf_similarity,
    encode_mentions,
    make_blocks,
    packed_similarity,
    similarity_factor,
)
from jaxsub.coreference.options import CorefOptions, race_costs
from jaxsub.coreference.race import race_conditional
from jaxsub.coreference.rounds import class_lanes
from jaxsub.coreference.scoring import Scores, b_cubed, pairwise_f1
from jaxsub.coreference.state import CorefState, SweepInfo, init

#: ``jaxsub.coreference.gibbs(pairwise_log_factor, mentions, blocks, ...)`` -> ``SamplingAlgorithm``; the
#: sampler module is :mod:`jaxsub.coreference.kernel` (``gibbs.build_kernel``, ``gibbs.init``, as in BlackJAX).
gibbs = _TopLevelAPI(kernel)

__all__ = [
    "Blocks",
    "CorefOptions",
    "CorefState",
    "CorefTrace",
    "FitTrace",
    "PackedSimilarity",
    "Scores",
    "SweepInfo",
    "b_cubed",
    "build_kernel",
    "class_lanes",
    "conditional_update",
    "crf_similarity",
    "encode_mentions",
    "fit",
    "gibbs",
    "init",
    "make_blocks",
    "mention_classes",
    "packed_similarity",
    "pairwise_f1",
    "race_conditional",
    "race_costs",
    "similarity_factor",
    "sufficient",
]
