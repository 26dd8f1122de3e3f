r"""Gaussian likelihood surrogates and the conducive gradient (El Mekkaoui et al. 2021, Sec. 4).

For every shard ``s`` a Gaussian ``q_s(θ) = N(θ; μ_s, Λ_s^{-1})`` approximates
the *shard likelihood* ``∏_{x∈X_s} p(x|θ)`` (not the local posterior). With
``q = ∏_s q_s`` the conducive gradient on shard ``s`` chosen with probability
``f_s`` is (paper eq. 5; NOTES.md §2)

.. math::

    g_s(θ) = ∇\log q(θ) - \frac{1}{f_s} ∇\log q_s(θ)
           = -\sum_k Λ_k(θ - μ_k) + \frac{1}{f_s} Λ_s(θ - μ_s),

and ``E_{s∼f}[g_s(θ)] = 0`` for every θ: adding ``α g_s`` to the DSGLD
gradient keeps it unbiased for any α (the paper's Remark 1). We store the
natural parameters ``Λ_s`` and ``h_s = Λ_s μ_s`` and precompute, per shard,
``M_s = Λ_s/f_s - Λ`` and ``c_s = h - h_s/f_s`` (``Λ = Σ_k Λ_k``,
``h = Σ_k h_k``), so ``g_s(θ) = M_s θ + c_s`` costs one matrix-vector
product, ``O(d^2)`` (``O(d)`` for diagonal surrogates), independent of the
data size.

Positions may be pytrees: surrogates live on the flattened position
(``jax.flatten_util.ravel_pytree`` order).

Modules
-------
This module gathers the public names of the surrogate modules:

* :mod:`~jaxsub.sgmcmc.surrogate_types` -- :class:`GaussianSurrogates`, :class:`SurrogateFitInfo`,
  :func:`check_surrogates`;
* :mod:`~jaxsub.sgmcmc.conducive` -- :class:`ConduciveArrays`, :func:`conducive_arrays`,
  :func:`conducive_gradient`, :func:`curvature_excess` (the affine conducive gradient);
* :mod:`~jaxsub.sgmcmc.sgld_surrogates` -- :func:`gaussian_surrogates` (exact, or SGLD moment fits);
* :mod:`~jaxsub.sgmcmc.laplace_surrogates` -- :func:`laplace_surrogates` (options record
  :class:`LaplaceOptions`);
* :mod:`~jaxsub.sgmcmc.laplace_program` -- :func:`laplace_program` (the jittable compute).
"""

from jaxsub.sgmcmc.conducive import (
    ConduciveArrays,
    apply_conducive,
    conducive_arrays,
    conducive_gradient,
    curvature_excess,
    shard_arrays,
)
from jaxsub.sgmcmc.laplace_program import LaplaceArrays, LaplaceOptions, laplace_program
from jaxsub.sgmcmc.laplace_surrogates import laplace_surrogates
from jaxsub.sgmcmc.sgld_surrogates import gaussian_surrogates
from jaxsub.sgmcmc.surrogate_types import (
    GaussianSurrogates,
    SurrogateFitInfo,
    check_surrogates,
)

__all__ = [
    "ConduciveArrays",
    "GaussianSurrogates",
    "LaplaceArrays",
    "LaplaceOptions",
    "SurrogateFitInfo",
    "apply_conducive",
    "check_surrogates",
    "conducive_arrays",
    "conducive_gradient",
    "curvature_excess",
    "gaussian_surrogates",
    "laplace_program",
    "laplace_surrogates",
    "shard_arrays",
]
