"""Distributed SGLD with conducive gradients (El Mekkaoui, Mesquita, Blomstedt & Kaski, UAI 2021).

As in BlackJAX (``blackjax.sgmcmc.sgld`` module, ``blackjax.sgld`` function),
the sampler modules are :mod:`jaxsub.sgmcmc.dsgld` and :mod:`jaxsub.sgmcmc.cg_dsgld`
and the constructors are ``jaxsub.dsgld`` and ``jaxsub.cg_dsgld``.

* ``jaxsub.dsgld`` -- distributed SGLD (Ahn et al. 2014): rounds of ``local_steps``
  SGLD steps on one shard chosen with probability ``f_s``;
* ``jaxsub.cg_dsgld`` -- the same with the conducive gradient of Gaussian
  likelihood surrogates (:func:`gaussian_surrogates`), unbiased for any
  exploration weight and insensitive to ``local_steps``;
* :func:`multi_device` -- both, with one shard per device (``jax.shard_map``),
  chains hopping between devices by collective permutes; also across hosts
  under ``jax.distributed.initialize``;
* :func:`make_shards` -- padded, masked layout for shards of unequal sizes.
"""
from jaxsub.sgmcmc import cg_dsgld, dsgld, multi_device as multi_device_module, shards, surrogates
from jaxsub.sgmcmc.multi_device import (
    MultiDeviceInfo,
    MultiDeviceInputs,
    MultiDeviceState,
    bytes_per_round,
    multi_device,
    multi_device_kernel,
    positions_by_chain,
)
from jaxsub.sgmcmc.shards import Shards, make_shards, minibatch_indices
from jaxsub.sgmcmc.surrogates import GaussianSurrogates, SurrogateFitInfo, conducive_gradient, gaussian_surrogates


__all__ = [
    "GaussianSurrogates",
    "MultiDeviceInfo",
    "MultiDeviceInputs",
    "MultiDeviceState",
    "Shards",
    "SurrogateFitInfo",
    "bytes_per_round",
    "cg_dsgld",
    "conducive_gradient",
    "dsgld",
    "shards",
    "surrogates",
    "gaussian_surrogates",
    "make_shards",
    "minibatch_indices",
    "multi_device",
    "multi_device_kernel",
    "positions_by_chain",
]
