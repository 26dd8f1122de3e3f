"""NumPyro models as input to every jaxsub family: :func:`from_numpyro`.

A NumPyro model whose observations sit in a plate over the ``N`` data rows
factorises as

.. math::

    \\log p(\\theta, y) = \\log p(\\theta) + \\sum_{n=1}^N \\log p(y_n \\mid \\theta, x_n),

which is exactly what the subsampling samplers take: ``logprior_fn(position)``
and a per-datum ``loglikelihood_fn(position, datum)``. :func:`from_numpyro`
builds both from the model with NumPyro's own machinery (the handlers
``substitute``, ``trace`` and ``block``; ``potential_energy`` for the prior
and its Jacobians; ``constrain_fn`` for the constrained values), so every
transform and Jacobian is NumPyro's.

**Position.** A flat unconstrained vector ``[d]``: the latent sites'
unconstrained values (NumPyro's ``biject_to`` of each site's support), raveled
in site order (``jax.flatten_util.ravel_pytree`` of the name-sorted dict).
``logprior_fn`` includes ``log |det J|`` of every transform, so
``logprior_fn + Σ loglikelihood_fn`` equals NumPyro's negated
``potential_energy``. ``constrain(position)`` returns the dict of constrained
sample-site values.

**Data.** One float matrix ``[N, k]``: the model's data arguments flattened
row by row and concatenated in the order given. Integer and boolean columns
(counts, group indices) are stored exactly (``|value| < 2^24`` in float32,
``2^53`` in float64, checked) and rounded back before the model sees them.
One matrix serves every family: minibatches and shards are rows, the Taylor
control variates read rows, and :func:`jaxsub.compress.cluster` clusters the
rows themselves. A centroid averages the rows of its cluster, so a cluster
must not mix different values of a discrete observation (an averaged 0/1 label
is outside a Bernoulli's support: NumPyro scores it ``-inf``) or of an index
column (rounded to the nearest integer): cluster such models at a radius below
half the spacing of those values (0.5 for labels, counts and indices).

**Dtype promotion.** NumPyro's distributions mix dtypes internally (a boolean
support mask times a float log-probability), so the adapter's functions trace
the model under ``jax.numpy_dtype_promotion("standard")`` whatever the caller's
setting; the samplers around them keep the caller's.

**Per-datum evaluation.** ``loglikelihood_fn(position, row)`` runs the model
on a data set of one row (every data argument gets a leading axis of one), so
the data plate's size must come from the data (``numpyro.plate("data",
x.shape[0])``), and the latent sites' shapes must not depend on ``N``; both
are checked at construction.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from jaxsub.validation import check_int

__all__ = ["DataField", "NumPyroModel", "from_numpyro"]


class DataField(NamedTuple):
    """Where one data argument of the model sits in the data matrix.

    Attributes
    ----------
    name
        The model's keyword argument.
    shape
        Shape of one row (``()`` for a column vector of scalars).
    dtype
        The argument's dtype, restored before the model sees it.
    start, stop
        Its columns ``[start, stop)`` in the data matrix.
    """

    name: str
    shape: tuple
    dtype: Any
    start: int
    stop: int


class NumPyroModel(NamedTuple):
    """What :func:`from_numpyro` returns: the model as every jaxsub family takes it.

    Attributes
    ----------
    logprior_fn
        ``logprior_fn(position) -> scalar``: log prior of the constrained values
        plus ``log |det J|`` of the unconstrain transforms.
    loglikelihood_fn
        ``loglikelihood_fn(position, datum) -> scalar``: the observed sites'
        log-probability for one row ``datum`` of ``data``.
    logdensity_fn
        ``logdensity_fn(position) -> scalar``: ``logprior_fn`` plus the sum of
        ``loglikelihood_fn`` over all rows (the full-data log density, e.g. for
        ``blackjax.nuts``); equals NumPyro's ``-potential_energy``.
    data
        ``[N, k]`` float matrix of the data rows (module docstring).
    initial_position
        ``[d]`` unconstrained zeros (every site at the image of 0, e.g. the
        median of a log-normal transform).
    constrain
        ``constrain(position) -> dict``: constrained value of every latent
        sample site; vmap it over draws.
    unravel
        ``unravel(position) -> dict`` of unconstrained values by site.
    datum_arguments
        ``datum_arguments(datum) -> dict``: the model's data arguments for one
        row, each with a leading axis of one.
    site_names
        Latent sample sites, in position order.
    site_shapes
        Their constrained shapes.
    data_fields
        One :class:`DataField` per data argument.
    plate_name
        The plate over the data rows.
    """

    logprior_fn: Callable
    loglikelihood_fn: Callable
    logdensity_fn: Callable
    data: jax.Array
    initial_position: jax.Array
    constrain: Callable
    unravel: Callable
    datum_arguments: Callable
    site_names: tuple
    site_shapes: tuple
    data_fields: tuple
    plate_name: str


class ModelSpec(NamedTuple):
    """Static description shared by the adapter's functions (built once by :func:`from_numpyro`)."""

    model: Callable
    model_args: tuple
    model_kwargs: dict
    fields: tuple
    first_row: jax.Array
    unravel: Callable
    plate_name: str


def _is_latent(site) -> bool:
    return site["type"] == "sample" and not site["is_observed"]


def _is_observed(site) -> bool:
    return site["type"] == "sample" and bool(site["is_observed"])


def _not_observed(site) -> bool:
    return not _is_observed(site)


def _observed_row(plate_name: str, site) -> bool:
    """An observation of the data plate (not a Jacobian ``factor``, which NumPyro also marks observed)."""
    return _is_observed(site) and any(frame.name == plate_name for frame in site["cond_indep_stack"])


def datum_arguments(spec: ModelSpec, datum) -> dict:
    """The model's data arguments for one data row, each with a leading axis of one."""
    out = {}
    for field in spec.fields:
        value = datum[field.start : field.stop].reshape(field.shape)
        if not jnp.issubdtype(field.dtype, jnp.floating):
            value = jnp.round(value).astype(field.dtype)
        out[field.name] = value[None]
    return out


def _kwargs(spec: ModelSpec, datum) -> dict:
    return {**spec.model_kwargs, **datum_arguments(spec, datum)}


def constrain(spec: ModelSpec, position) -> dict:
    """Constrained values of the latent sites (NumPyro's ``constrain_fn``)."""
    from numpyro.infer.util import constrain_fn

    with jax.numpy_dtype_promotion("standard"):
        return constrain_fn(spec.model, spec.model_args, _kwargs(spec, spec.first_row), spec.unravel(position))


def logprior(spec: ModelSpec, position):
    """``log p(θ) + log |det J|``: ``-potential_energy`` of the model with its observed sites blocked."""
    from numpyro.handlers import block
    from numpyro.infer.util import potential_energy

    prior_model = block(spec.model, hide_fn=partial(_observed_row, spec.plate_name))
    kwargs = _kwargs(spec, spec.first_row)
    with jax.numpy_dtype_promotion("standard"):
        return -potential_energy(prior_model, spec.model_args, kwargs, spec.unravel(position))


def loglikelihood(spec: ModelSpec, position, datum):
    """Observed sites' log-probability on one row, the latent sites substituted by their constrained values."""
    from numpyro.handlers import block, substitute
    from numpyro.infer.util import log_density

    values = constrain(spec, position)
    row_model = block(substitute(spec.model, data=values), hide_fn=_not_observed)
    with jax.numpy_dtype_promotion("standard"):
        value, _ = log_density(row_model, spec.model_args, _kwargs(spec, datum), {})
    return value


def logdensity(spec: ModelSpec, data, position):
    """Full-data log density: prior (with Jacobians) plus the summed per-row log-likelihoods."""
    lls = jax.vmap(partial(loglikelihood, spec), in_axes=(None, 0))(position, data)
    return logprior(spec, position) + jnp.sum(lls)


def from_numpyro(model: Callable, *model_args, data: dict, **model_kwargs) -> NumPyroModel:
    """Turn a NumPyro model with a plate over its data rows into the functions every family takes.

    Parameters
    ----------
    model
        A NumPyro model. Its observed sample sites must all sit in one plate
        over the ``N`` data rows whose size comes from the data (e.g.
        ``numpyro.plate("data", x.shape[0])``); its latent sites must be
        continuous and outside that plate (global parameters).
    *model_args
        Positional arguments of the model that are not data (e.g. a number of
        groups); passed unchanged.
    data
        ``{name: array}`` of the model's data arguments (covariates, offsets,
        group indices, observations), each with leading axis ``N``; passed to
        the model as keyword arguments. Stored as one ``[N, k]`` matrix
        (module docstring).
    **model_kwargs
        Other keyword arguments of the model; passed unchanged.

    Returns
    -------
    NumPyroModel
        ``logprior_fn``, ``loglikelihood_fn``, ``logdensity_fn``, ``data``,
        ``initial_position``, ``constrain``, ... (see :class:`NumPyroModel`).
        For example ``jaxsub.racing_mh(m.logprior_fn, m.loglikelihood_fn,
        m.data, ...)``, ``blackjax.nuts(m.logdensity_fn, ...)``.

    Raises
    ------
    ValueError
        If ``data`` is empty, its arrays disagree on ``N``, or an integer value
        is too large to store exactly; naming the site when the model has no
        plate over the data rows, an observed site outside that plate, a
        discrete latent site, a latent site inside the data plate, a latent
        site whose shape depends on the number of rows, or a plate whose size
        does not follow the data; when, on the first two rows, NumPyro's log
        density is not the prior plus the two per-row log-likelihoods (a term
        outside the plate that depends on the rows).

    Examples
    --------
    >>> def model(x, y=None):
    ...     beta = numpyro.sample("beta", dist.Normal(0, 1).expand([x.shape[1]]).to_event(1))
    ...     with numpyro.plate("data", x.shape[0]):
    ...         numpyro.sample("y", dist.Bernoulli(logits=x @ beta), obs=y)
    >>> m = jaxsub.models.from_numpyro(model, data={"x": x, "y": y})
    >>> fit = jaxsub.racing_mh.laplace_fit(m.logprior_fn, m.loglikelihood_fn, m.data, m.initial_position)
    >>> cv = jaxsub.racing_mh.parameter_taylor_control_variate(m.loglikelihood_fn, m.data, fit.position)
    >>> algo = jaxsub.racing_mh(m.logprior_fn, m.loglikelihood_fn, m.data, delta=0.05,
    ...                         step_size=fit.step_size, control_variate=cv)
    >>> trace = jaxsub.run_chains(key, algo, jax.vmap(algo.init)(starts), 2000)
    >>> idata = jaxsub.to_arviz(trace, m)          # posterior["beta"]: [chains, draws, d]
    """
    dtype = jnp.result_type(float)
    fields, matrix = _data_matrix(data, dtype)
    num_data = matrix.shape[0]
    first_row = matrix[0]
    full_trace = _latent_trace(model, model_args, {**model_kwargs, **data})
    plate_name = _check_model(full_trace, num_data)
    spec0 = ModelSpec(model, model_args, dict(model_kwargs), fields, first_row, None, plate_name)
    row_trace = _latent_trace(model, model_args, _kwargs(spec0, first_row))
    _check_row_trace(full_trace, row_trace, plate_name, num_data)
    zeros = {name: _unconstrained_zeros(site) for name, site in full_trace.items() if _is_latent(site)}
    initial_position, unravel = ravel_pytree(zeros)
    spec = spec0._replace(unravel=unravel)
    _check_factorisation(spec, matrix[:2], initial_position.astype(dtype))
    names = tuple(sorted(zeros))
    return NumPyroModel(
        logprior_fn=partial(logprior, spec),
        loglikelihood_fn=partial(loglikelihood, spec),
        logdensity_fn=partial(logdensity, spec, matrix),
        data=matrix,
        initial_position=initial_position.astype(dtype),
        constrain=partial(constrain, spec),
        unravel=unravel,
        datum_arguments=partial(datum_arguments, spec),
        site_names=names,
        site_shapes=tuple(tuple(jnp.shape(full_trace[n]["value"])) for n in names),
        data_fields=fields,
        plate_name=plate_name,
    )


def _data_matrix(data, dtype) -> tuple[tuple, jax.Array]:
    """Flatten ``{name: [N, ...]}`` into ``[N, k]`` columns and the fields that undo it."""
    if not isinstance(data, dict) or not data:
        raise ValueError(f"data must be a non-empty dict {{name: array [N, ...]}}; got {type(data).__name__}")
    exact = 2.0 ** (jnp.finfo(dtype).nmant + 1)
    num_data, fields, columns, start = None, [], [], 0
    for name, value in data.items():
        value = np.asarray(value)
        if value.ndim == 0:
            raise ValueError(f"data[{name!r}] must have a leading data axis; got a scalar")
        if num_data is None:
            num_data = check_int(f"len(data[{name!r}])", value.shape[0], low=2)
        elif value.shape[0] != num_data:
            raise ValueError(
                f"data[{name!r}] must have leading axis N = {num_data} like the others; got {value.shape[0]}"
            )
        if not (np.issubdtype(value.dtype, np.number) or value.dtype == bool):
            raise ValueError(f"data[{name!r}] must be numeric; got dtype {value.dtype}")
        if (
            not np.issubdtype(value.dtype, np.floating)
            and value.size
            and np.abs(value.astype(np.float64)).max() >= exact
        ):
            raise ValueError(
                f"data[{name!r}] must be below {exact:g} in absolute value to be stored exactly in {np.dtype(dtype).name}"
            )
        width = math.prod(value.shape[1:])
        fields.append(DataField(name, tuple(value.shape[1:]), jnp.asarray(value[:1]).dtype, start, start + width))
        columns.append(value.reshape(num_data, width).astype(np.float64))
        start += width
    return tuple(fields), jnp.asarray(np.concatenate(columns, axis=1), dtype)


def _zero_substitute(site):
    """``substitute_fn``: every latent site at the image of unconstrained zeros (no key needed)."""
    if not _is_latent(site):
        return None
    if site["fn"].support.is_discrete:
        raise ValueError(
            f"latent site {site['name']!r} is discrete ({type(site['fn']).__name__}); from_numpyro takes "
            "continuous latent sites only (marginalise it out, or observe it)"
        )
    from numpyro.distributions.transforms import biject_to

    transform = biject_to(site["fn"].support)
    return transform(_unconstrained_zeros(site))


def _unconstrained_zeros(site):
    from numpyro.distributions.transforms import biject_to

    transform = biject_to(site["fn"].support)
    return jnp.zeros(transform.inverse_shape(site["fn"].shape()), jnp.result_type(float))


def _latent_trace(model, model_args, kwargs):
    from numpyro.handlers import substitute, trace

    with jax.numpy_dtype_promotion("standard"):
        return trace(substitute(model, substitute_fn=_zero_substitute)).get_trace(*model_args, **kwargs)


def _data_plates(site, num_data) -> list:
    return [frame.name for frame in site["cond_indep_stack"] if frame.size == num_data]


def _check_model(model_trace, num_data: int) -> str:
    """The data plate's name; ``ValueError`` naming the offending site otherwise."""
    observed = [site for site in model_trace.values() if _is_observed(site)]
    if not observed:
        raise ValueError("the model has no observed sample site: pass the observations in data")
    plates = [site["name"] for site in model_trace.values() if site["type"] == "plate" and site["args"][0] == num_data]
    if not plates:
        raise ValueError(
            f"observed site {observed[0]['name']!r} is not in a plate over the N = {num_data} data rows: the model "
            f"has no plate of size {num_data}; wrap the observations in numpyro.plate('data', x.shape[0])"
        )
    plate_name = None
    for site in observed:
        inside = [name for name in _data_plates(site, num_data) if name in plates]
        if not inside:
            raise ValueError(
                f"observed site {site['name']!r} is outside the plate {plates[0]!r} over the N = {num_data} data "
                "rows: every observation must be one per row"
            )
        if plate_name is not None and inside[0] != plate_name:
            raise ValueError(f"observed site {site['name']!r} is in plate {inside[0]!r}, the others in {plate_name!r}")
        plate_name = inside[0]
    for site in model_trace.values():
        if _is_latent(site) and plate_name in [frame.name for frame in site["cond_indep_stack"]]:
            raise ValueError(
                f"latent site {site['name']!r} is inside the data plate {plate_name!r}: per-row latent "
                "variables are not supported (only global parameters)"
            )
    return plate_name


def _check_factorisation(spec: ModelSpec, rows, position) -> None:
    """On two rows, NumPyro's log density must equal the prior plus the two per-row terms."""
    from numpyro.infer.util import potential_energy

    kwargs = {
        **spec.model_kwargs,
        **{f.name: jnp.concatenate([datum_arguments(spec, r)[f.name] for r in rows]) for f in spec.fields},
    }
    with jax.numpy_dtype_promotion("standard"):
        whole = -potential_energy(spec.model, spec.model_args, kwargs, spec.unravel(position))
    parts = logprior(spec, position) + sum(loglikelihood(spec, position, r) for r in rows)
    if not jnp.allclose(whole, parts, rtol=1e-4, atol=1e-4):
        raise ValueError(
            f"the model's log density on two rows ({float(whole):.6g}) is not its prior plus the two rows' "
            f"log-likelihoods ({float(parts):.6g}): a term outside the data plate depends on the rows "
            "(e.g. a prior scaled by x.shape[0])"
        )


def _check_row_trace(full_trace, row_trace, plate_name: str, num_data: int) -> None:
    """The model run on one row: the data plate has size one and the latent shapes do not change."""
    size = row_trace[plate_name]["args"][0] if plate_name in row_trace else None
    if size != 1:
        raise ValueError(
            f"plate {plate_name!r} has size {size} when the model is given one data row (N = {num_data} on all "
            "rows): take its size from the data, e.g. numpyro.plate('data', x.shape[0])"
        )
    for name, site in full_trace.items():
        if not _is_latent(site):
            continue
        row_shape = jnp.shape(row_trace[name]["value"]) if name in row_trace else None
        if row_shape != jnp.shape(site["value"]):
            raise ValueError(
                f"latent site {name!r} has shape {jnp.shape(site['value'])} on all rows but {row_shape} on one "
                "row: its shape must not depend on the data (pass sizes such as a number of groups as arguments)"
            )
