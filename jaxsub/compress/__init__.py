"""Compressed posteriors by radius-bounded clustering (Song 2021, arXiv:2111.14219).

Replace every cluster of radius at most ``delta`` by its centroid with
multiplicity, so each gradient of the log-posterior costs O(c) instead of
O(N), with ``KL(p || p~) <= K0 delta^2`` (Theorem 1); sample the compressed
posterior with any BlackJAX algorithm.

* :func:`cluster` / :func:`cluster_supervised` -- Algorithm 1 (streaming,
  approximate neighbour search, exact radius guarantee) -> :class:`Clustering`;
* :func:`logdensity` -- ``log p(theta) + sum_j n_j log p(mu_j | theta)`` as a
  BlackJAX ``logdensity_fn``, with the within-cluster scatter correction by
  default wherever the clustering carries covariances (exact for
  Gaussian-linear models; ``second_order=False`` is the cheaper, biased first order);
* :func:`posterior` -- the one-call path: the largest radius whose predicted
  error meets a target in posterior-sd units, its clustering and log-density;
* :func:`posterior_error` -- error in posterior-sd units; :func:`choose_radius`
  -- the largest radius meeting a target error (Laplace a-posteriori check),
  saying whether it was met (``RadiusChoice.met``);
* :class:`ClusterOptions` -- every tuning setting of the clustering;
* :func:`cluster_shards`, :func:`cluster_stream`, :func:`sharded_logdensity` --
  clustering per device shard, over streamed chunks, and a log-density whose
  centroids are split across devices (one ``psum``);
* :func:`pseudodata` -- a clustering as (padded) arrays to pass to a jitted
  function, so one compiled program serves many clusterings;
* :func:`kl_bound` -- ``K0 delta^2`` of Theorem 1; :func:`gaussian_kl` -- the
  paper's approxKL (Lemma 1 on moment-matched Gaussians).
"""

from jaxsub.compress.api import cluster, cluster_supervised
from jaxsub.compress.clustering import Clustering
from jaxsub.compress.density import Pseudodata, logdensity, pseudodata
from jaxsub.compress.errors import (
    PosteriorError,
    gaussian_kl,
    kl_bound,
    posterior_error,
)
from jaxsub.compress.options import METHODS, RULES, ClusterOptions
from jaxsub.compress.radius import (
    CompressedPosterior,
    RadiusChoice,
    RadiusWarning,
    choose_radius,
    posterior,
)
from jaxsub.compress.scale import cluster_shards, cluster_stream, sharded_logdensity

__all__ = [
    "METHODS",
    "RULES",
    "ClusterOptions",
    "Clustering",
    "CompressedPosterior",
    "PosteriorError",
    "Pseudodata",
    "RadiusChoice",
    "RadiusWarning",
    "choose_radius",
    "cluster",
    "cluster_shards",
    "cluster_stream",
    "cluster_supervised",
    "gaussian_kl",
    "kl_bound",
    "logdensity",
    "posterior",
    "posterior_error",
    "pseudodata",
    "sharded_logdensity",
]
