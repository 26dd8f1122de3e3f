"""Coreference: racing Gibbs for pairwise-factor clustering (Chen & Ghahramani 2016, §5.3).

* :mod:`~jaxsub.coreference.model` -- the model pieces: :func:`make_blocks` (blocking),
  :func:`encode_mentions` and :func:`similarity_factor` (a default ``pairwise_log_factor``),
  :func:`packed_similarity` (the same factor on rows packed once: a few fused array ops per pair batch),
  :func:`crf_similarity` (thresholded compatibility templates on the same rows: no sufficient statistic);
* :mod:`~jaxsub.coreference.sampler` -- the Gibbs sweep (racing or ``exact=True``) as a BlackJAX-style
  kernel (:func:`build_kernel`, :func:`init`, ``sampler.as_top_level_api`` exposed as :func:`gibbs`), the
  annealing driver :func:`fit` (temperatures as data), and :func:`race_conditional`, the one
  adapter into :func:`jaxsub.discrete.racing`;
* :mod:`~jaxsub.coreference.sufficient` -- exact Gibbs with per-cluster sums for the decomposable
  :func:`packed_similarity` factor (``sufficient.build_kernel``): ``O(P)`` per candidate cluster instead of
  ``|C|`` factor evaluations, the recommended sampler whenever the factor decomposes;
* :mod:`~jaxsub.coreference.scoring` -- :func:`b_cubed` and :func:`pairwise_f1`.

See ``docs/coreference.md``.
"""
from jaxsub._toplevel import TopLevelAPI as _TopLevelAPI
from jaxsub.coreference import sampler, sufficient
from jaxsub.coreference.sampler import (
    CorefState,
    FitTrace,
    SweepInfo,
    build_kernel,
    class_lanes,
    conditional_update,
    fit,
    init,
    mention_classes,
    race_conditional,
)
from jaxsub.coreference.model import (
    Blocks,
    PackedSimilarity,
    crf_similarity,
    encode_mentions,
    make_blocks,
    packed_similarity,
    similarity_factor,
)
from jaxsub.coreference.scoring import Scores, b_cubed, pairwise_f1

#: ``jaxsub.coreference.gibbs(pairwise_log_factor, mentions, blocks, ...)`` -> ``SamplingAlgorithm``; the
#: sampler module is :mod:`jaxsub.coreference.sampler` (``gibbs.build_kernel``, ``gibbs.init``, as in BlackJAX).
gibbs = _TopLevelAPI(sampler)

__all__ = [
    "Blocks",
    "PackedSimilarity",
    "CorefState",
    "FitTrace",
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
    "similarity_factor",
    "sufficient",
]
