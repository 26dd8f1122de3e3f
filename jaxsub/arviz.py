"""Traces to ArviZ: :func:`to_arviz` turns a :class:`jaxsub.ChainTrace` into ``arviz.InferenceData``.

The draws go to the ``posterior`` group: the constrained sample sites by name
when the trace's positions are the flat unconstrained vectors of a
:func:`jaxsub.models.from_numpyro` model (given as ``model``); the keys of a
dict position; else one variable ``x`` whose last axis holds the ``d``
coordinates (ArviZ labels them ``x[0]`` .. ``x[d-1]``). What the ``Info``
carries goes to ``sample_stats``, known jaxsub and BlackJAX fields under
ArviZ's conventional names (:data:`STAT_NAMES`: ``is_accepted`` ->
``acceptance_rate``, ``is_divergent`` -> ``diverging``, ...), every other
array field under its own name (``has_nan``, ``num_evaluations``,
``is_exact``, ...), plus ``share_of_data_read`` for the racing MH kernels
(``num_evaluations / 2N``: both states are read) when ``N`` is known. Fields
that are pytrees of several arrays (NUTS's trajectory states) are left out.

The groups are built as plain ``{group: {name: ndarray}}`` dicts
(:func:`inference_groups`); only :func:`to_arviz` calls ArviZ (``from_dict``
of ArviZ 0.x), so the ArviZ 1.x ``DataTree`` path is a change to that one call.
ArviZ is an optional dependency (``pip install jaxsub[arviz]``), imported on use.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from jaxsub.validation import check_int

__all__ = ["STAT_NAMES", "InferenceGroups", "inference_groups", "to_arviz"]

#: jaxsub / BlackJAX ``Info`` fields -> ArviZ's conventional ``sample_stats`` names.
STAT_NAMES = {
    "is_accepted": "acceptance_rate",
    "acceptance_rate": "acceptance_rate",
    "is_divergent": "diverging",
    "num_integration_steps": "n_steps",
    "num_trajectory_expansions": "tree_depth",
    "energy": "energy",
    "step_size": "step_size",
}


class InferenceGroups(NamedTuple):
    """The ArviZ groups as NumPy dicts, each array ``[chains, draws, ...]``.

    Attributes
    ----------
    posterior
        ``{variable: array}``.
    sample_stats
        ``{statistic: array}``.
    warmup_posterior, warmup_sample_stats
        The first ``num_warmup`` draws of each (empty dicts when ``num_warmup = 0``).
    """

    posterior: dict
    sample_stats: dict
    warmup_posterior: dict
    warmup_sample_stats: dict


def to_arviz(
    trace,
    model=None,
    *,
    num_warmup: int = 0,
    num_data: int | None = None,
    chain_axis: bool = True,
    attrs: dict | None = None,
):
    """An ``arviz.InferenceData`` of a :class:`jaxsub.ChainTrace`.

    Parameters
    ----------
    trace
        A :class:`jaxsub.ChainTrace` from :func:`jaxsub.run_chains` (leading axes
        ``[chains, draws]``) or :func:`jaxsub.run_chain` with ``chain_axis=False``.
        ``trace.states`` is either the ``State`` (its ``position`` is used) or the
        kept positions (``transform=lambda s, i: s.position``).
    model
        The :class:`jaxsub.models.NumPyroModel` the chains sampled: positions
        ``[..., d]`` are mapped through ``model.constrain`` to the named sites.
    num_warmup
        The first ``num_warmup`` draws go to the ``warmup_*`` groups.
    num_data
        ``N``, for ``share_of_data_read``; default ``model.data.shape[0]`` when
        a model is given.
    chain_axis
        Whether the leaves carry a leading chain axis (``False`` for a
        :func:`jaxsub.run_chain` trace: a chain axis of one is added).
    attrs
        Extra attributes of the ``posterior`` and ``sample_stats`` groups (e.g.
        the sampler's settings), beside ``inference_library = "jaxsub"``.

    Returns
    -------
    arviz.InferenceData
        Groups ``posterior`` and ``sample_stats`` (and ``warmup_*`` when
        ``num_warmup > 0``).

    Raises
    ------
    ValueError
        When a leaf does not have the ``[chains, draws]`` leading axes of the
        first one, naming it; when there are more chains than draws (a
        :func:`jaxsub.run_chain` trace without ``chain_axis=False``); when the
        positions do not have the model's ``d`` coordinates; when
        ``num_warmup`` leaves no draw.
    """
    import arviz as az

    groups = inference_groups(trace, model, num_warmup=num_warmup, num_data=num_data, chain_axis=chain_axis)
    attrs = {"inference_library": "jaxsub", **(attrs or {})}
    return az.from_dict(
        posterior=groups.posterior,
        sample_stats=groups.sample_stats or None,
        warmup_posterior=groups.warmup_posterior or None,
        warmup_sample_stats=groups.warmup_sample_stats or None,
        save_warmup=num_warmup > 0,
        posterior_attrs=attrs,
        sample_stats_attrs=attrs,
    )


def inference_groups(
    trace, model=None, *, num_warmup: int = 0, num_data: int | None = None, chain_axis: bool = True
) -> InferenceGroups:
    """The groups of :func:`to_arviz` as NumPy dicts (no ArviZ needed); same parameters and checks."""
    if not (hasattr(trace, "states") and hasattr(trace, "infos")):
        raise ValueError(f"trace must be a jaxsub.ChainTrace (states, infos); got {type(trace).__name__}")
    states = getattr(trace.states, "position", trace.states)
    if not chain_axis:
        states, infos = jax.tree.map(lambda a: np.asarray(a)[None], (states, trace.infos))
    else:
        infos = trace.infos
    posterior = _posterior(states, model)
    axes = _leading_axes(posterior)
    if num_data is None and model is not None:
        num_data = model.data.shape[0]
    stats = _sample_stats(infos, axes, num_data)
    num_warmup = check_int("num_warmup", num_warmup, low=0, high=axes[1] - 1)
    warmup_posterior, posterior = _split(posterior, num_warmup)
    warmup_stats, stats = _split(stats, num_warmup)
    return InferenceGroups(posterior, stats, warmup_posterior, warmup_stats)


def _split(group: dict, num_warmup: int) -> tuple[dict, dict]:
    """``(first num_warmup draws, the rest)`` of every array of a group."""
    if not num_warmup:
        return {}, group
    return {k: v[:, :num_warmup] for k, v in group.items()}, {k: v[:, num_warmup:] for k, v in group.items()}


def _posterior(positions, model) -> dict:
    """``{name: [chains, draws, ...]}`` of the positions (constrained by ``model`` when given)."""
    if model is not None:
        flat = np.asarray(positions) if not isinstance(positions, dict) else None
        d = model.initial_position.shape[0]
        if flat is None or flat.ndim != 3 or flat.shape[-1] != d:
            shape = None if flat is None else flat.shape
            raise ValueError(f"positions must be [chains, draws, d = {d}] flat vectors of the model; got {shape}")
        constrained = jax.vmap(jax.vmap(model.constrain))(flat)
        return {name: np.asarray(constrained[name]) for name in model.site_names}
    if isinstance(positions, dict):
        out = {str(k): np.asarray(v) for k, v in positions.items()}
    elif isinstance(positions, (np.ndarray, jax.Array)):
        out = {"x": np.asarray(positions)}
    else:
        leaves = jax.tree_util.tree_flatten_with_path(positions)[0]
        out = {f"x{jax.tree_util.keystr(path)}": np.asarray(leaf) for path, leaf in leaves}
    _leading_axes(out)
    return out


def _leading_axes(group: dict, expected: tuple | None = None, what: str = "posterior") -> tuple:
    """The common ``(chains, draws)`` of a group; ``ValueError`` naming the first leaf that differs."""
    for name, value in group.items():
        shape = np.shape(value)
        if len(shape) < 2 or (expected is not None and shape[:2] != expected):
            want = "[chains, draws, ...]" if expected is None else f"[chains, draws] = {expected}"
            raise ValueError(f"{what} {name!r} must have leading axes {want}; got shape {shape}")
        if expected is None:
            expected = shape[:2]
            if expected[0] > expected[1]:
                raise ValueError(
                    f"{what} {name!r} has more chains ({expected[0]}) than draws ({expected[1]}): a run_chain trace "
                    "(leading axis draws) needs chain_axis=False"
                )
    if expected is None:
        raise ValueError(f"{what} has no variable")
    return expected


def _sample_stats(infos, axes: tuple, num_data: int | None) -> dict:
    """``{name: [chains, draws, ...]}`` of the ``Info`` fields (known ones renamed, see :data:`STAT_NAMES`)."""
    if infos is None:
        return {}
    fields = _info_fields(infos)
    stats = {}
    for name, value in fields.items():
        if isinstance(value, (np.ndarray, jax.Array, np.generic)):
            value = np.asarray(value)
            stats[STAT_NAMES.get(name, name)] = value.astype(np.float64) if name == "is_accepted" else value
    if stats:
        _leading_axes(stats, axes, what="sample_stats")
    if num_data is not None and {"is_accepted", "num_evaluations"} <= set(fields):
        num_data = check_int("num_data", num_data, low=1)
        stats["share_of_data_read"] = np.asarray(fields["num_evaluations"], np.float64) / (2 * num_data)
    return stats


def _info_fields(infos) -> dict[str, Any]:
    if hasattr(infos, "_asdict"):
        return dict(infos._asdict())
    if isinstance(infos, dict):
        return dict(infos)
    if isinstance(infos, (np.ndarray, jax.Array)):
        return {"info": infos}
    raise ValueError(
        f"trace.infos must be an Info NamedTuple, a dict of arrays or an array; got {type(infos).__name__}"
    )
