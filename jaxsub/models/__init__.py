"""Models from probabilistic programming languages as input to every jaxsub family.

* :func:`from_numpyro` -- a NumPyro model with a plate over its data rows ->
  :class:`NumPyroModel` (``logprior_fn``, per-datum ``loglikelihood_fn``, the
  ``data`` matrix, ``initial_position``, ``constrain``, and the full-data
  ``logdensity_fn`` for BlackJAX NUTS). NumPyro is an optional dependency
  (``pip install jaxsub[numpyro]``), imported when a model is converted.
"""

from jaxsub.models.numpyro import DataField, NumPyroModel, from_numpyro

__all__ = ["DataField", "NumPyroModel", "from_numpyro"]
