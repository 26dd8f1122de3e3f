"""Distributed SGLD with conducive gradients (El Mekkaoui, Mesquita, Blomstedt & Kaski, UAI 2021).

As in BlackJAX (``blackjax.sgmcmc.sgld`` module, ``blackjax.sgld`` function),
the sampler modules are :mod:`jaxsub.sgmcmc.dsgld` and :mod:`jaxsub.sgmcmc.cg_dsgld`
and the constructors are ``jaxsub.dsgld`` and ``jaxsub.cg_dsgld``.

* ``jaxsub.dsgld`` -- distributed SGLD (Ahn et al. 2014): rounds of ``local_steps``
  SGLD steps on one shard chosen with probability ``f_s``;
* ``jaxsub.cg_dsgld`` -- the same with the conducive gradient of Gaussian
  likelihood surrogates (:func:`laplace_surrogates`, the default, or
  :func:`gaussian_surrogates`: exact or SGLD-moment fits), unbiased for any
  exploration weight and insensitive to ``local_steps``;
* :func:`multi_device` -- both, with one shard per device (``jax.shard_map``),
  chains hopping between devices by collective permutes, any shard
  probabilities and partial participation; also across hosts under
  ``jax.distributed.initialize`` (:func:`multi_device_kernel`);
* :func:`make_shards` -- padded, masked layout for shards of unequal sizes.
"""

from jaxsub.sgmcmc import cg_dsgld, dsgld, shards, surrogates
from jaxsub.sgmcmc import multi_device as multi_device_module
from jaxsub.sgmcmc.cg_dsgld import sample_rounds
from jaxsub.sgmcmc.multi_device import (
    MultiDeviceFunctions,
    MultiDeviceInfo,
    MultiDeviceInputs,
    MultiDeviceState,
    bytes_per_round,
    draws_by_chain,
    multi_device,
    multi_device_kernel,
    positions_by_chain,
)
from jaxsub.sgmcmc.shards import Shards, make_shards, minibatch_indices
from jaxsub.sgmcmc.surrogates import (
    ConduciveArrays,
    GaussianSurrogates,
    LaplaceOptions,
    SurrogateFitInfo,
    conducive_arrays,
    conducive_gradient,
    curvature_excess,
    gaussian_surrogates,
    laplace_program,
    laplace_surrogates,
)

__all__ = [
    "ConduciveArrays",
    "GaussianSurrogates",
    "LaplaceOptions",
    "MultiDeviceFunctions",
    "MultiDeviceInfo",
    "MultiDeviceInputs",
    "MultiDeviceState",
    "Shards",
    "SurrogateFitInfo",
    "bytes_per_round",
    "cg_dsgld",
    "conducive_arrays",
    "conducive_gradient",
    "curvature_excess",
    "draws_by_chain",
    "dsgld",
    "laplace_program",
    "laplace_surrogates",
    "shards",
    "surrogates",
    "gaussian_surrogates",
    "make_shards",
    "minibatch_indices",
    "multi_device",
    "multi_device_kernel",
    "positions_by_chain",
    "sample_rounds",
]
