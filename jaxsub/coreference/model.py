"""Pairwise-factor clustering model for coreference (Chen & Ghahramani 2016, §5.3).

Model (Singh et al. 2012; the conditional random field of the paper's §5.3)::

    p(y | x) ∝ exp( β Σ_{i<j, y_i = y_j} f(x_i, x_j) ),
    p(y_i = y | y_{-i}, x) ∝ exp( β Σ_{j ∈ C_y} f(x_i, x_j) ),   C_y = {j ≠ i : y_j = y},

where ``y`` ranges over the non-empty clusters and one empty cluster (whose sum is 0),
``f`` is a user-supplied ``pairwise_log_factor(x_i, x_j)`` and ``β`` an inverse
temperature (``β = 1`` is the model; ``β → ∞`` along a schedule gives annealed MAP).

Blocking. As coreference systems do, mention ``i`` may only join clusters of mentions
sharing its blocking key. Every cluster then lies inside one block, so the candidates
for ``y_i`` are the non-empty clusters of ``i``'s block plus one empty cluster.
Block ``b`` (sorted positions ``[s_b, s_b + n_b)``) owns the cluster ids ``[s_b, s_b + n_b)``:
it can never hold more clusters than mentions, so the membership arrays
(``labels [M]``, ``sizes [M]``) never overflow and no cluster is ever dropped.

This module holds host-side preprocessing (NumPy): feature encoding for the default
similarity factor and the block structure.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxsub.validation import check_choice, check_int, check_real

__all__ = [
    "Blocks",
    "PackedSimilarity",
    "crf_similarity",
    "encode_mentions",
    "make_blocks",
    "packed_similarity",
    "similarity_factor",
]

FIELD_KINDS = ("string", "tokens", "categorical", "numeric")


class Blocks(NamedTuple):
    """Block structure of M mentions (host arrays; build with :func:`make_blocks`).

    Attributes
    ----------
    order
        ``[M]`` int32: sorted position -> mention index (mentions grouped by block).
    position
        ``[M]`` int32: mention index -> sorted position (inverse of ``order``).
    start
        ``[M]`` int32: for each *sorted position*, the first sorted position of its block.
    size
        ``[M]`` int32: for each sorted position, the size ``n_b`` of its block.
    """

    order: np.ndarray
    position: np.ndarray
    start: np.ndarray
    size: np.ndarray

    @property
    def num_mentions(self) -> int:
        """M, the number of mentions."""
        return int(self.order.shape[0])

    def block_sizes(self) -> np.ndarray:
        """Sizes of the blocks (one entry per block)."""
        first = self.start == np.arange(self.num_mentions)
        return self.size[first]


def make_blocks(block_keys: Sequence) -> Blocks:
    """Group mentions by blocking key.

    Parameters
    ----------
    block_keys
        One hashable key per mention (strings or integers), length M >= 1.

    Returns
    -------
    Blocks
        A stable sort by key; mentions keep their order inside a block.

    Raises
    ------
    ValueError
        ``block_keys`` is not a 1-D sequence of at least one key.
    """
    keys = np.asarray(block_keys)
    if keys.ndim != 1 or keys.size < 1:
        raise ValueError(f"block_keys must be a 1-D sequence of at least 1 key; got shape {keys.shape}")
    _, codes = np.unique(keys, return_inverse=True)
    order = np.argsort(codes, kind="stable").astype(np.int32)
    sorted_codes = codes[order]
    m = keys.size
    is_first = np.ones(m, bool)
    is_first[1:] = sorted_codes[1:] != sorted_codes[:-1]
    first_pos = np.flatnonzero(is_first)
    block_of = np.cumsum(is_first) - 1
    sizes = np.diff(np.append(first_pos, m))
    position = np.empty(m, np.int32)
    position[order] = np.arange(m, dtype=np.int32)
    return Blocks(
        order=order,
        position=position,
        start=first_pos[block_of].astype(np.int32),
        size=sizes[block_of].astype(np.int32),
    )


# --------------------------------------------------------------------------- features
def _hash(token: str, dim: int) -> int:
    return zlib.crc32(token.encode("utf-8")) % dim


def _bag(values, dim: int, grams: Callable[[str], list[str]]) -> np.ndarray:
    out = np.zeros((len(values), dim), np.float32)
    for r, v in enumerate(values):
        if v is None or (isinstance(v, float) and np.isnan(v)):
            continue
        for g in grams(str(v).lower()):
            out[r, _hash(g, dim)] += 1.0
    norm = np.linalg.norm(out, axis=1, keepdims=True)
    return np.where(norm > 0, out / np.maximum(norm, 1e-30), 0.0).astype(np.float32)


def _char_ngrams(s: str, n: int = 3) -> list[str]:
    s = f"#{s.strip()}#"
    return [s[k : k + n] for k in range(max(1, len(s) - n + 1))] if s != "##" else []


def _tokens(s: str) -> list[str]:
    return [t for t in s.replace(";", " ").replace(",", " ").split() if t]


def encode_mentions(columns: Mapping[str, Sequence], kinds: Mapping[str, str], *, hash_dim: int = 32) -> dict:
    """Encode mention fields for :func:`similarity_factor` (host-side).

    Parameters
    ----------
    columns
        Field name -> sequence of M values (``None``/NaN = missing).
    kinds
        Field name -> ``"string"`` (character trigrams), ``"tokens"`` (bag of
        whitespace/comma/semicolon-separated tokens, e.g. co-authors or title words),
        ``"categorical"`` (equality) or ``"numeric"`` (absolute difference).
    hash_dim
        Size of the hashed n-gram / token vectors (>= 2).

    Returns
    -------
    dict
        Arrays with leading axis M: ``"<name>"`` -> ``[M, hash_dim]`` L2-normalised float32 bags
        (string, tokens; zero rows for missing), ``[M]`` int32 codes (categorical; -1 for missing) or
        ``[M]`` float32 (numeric; NaN for missing).

    Raises
    ------
    ValueError
        Empty or unknown ``kinds``, columns of different lengths, ``hash_dim < 2``.
    """
    hash_dim = check_int("hash_dim", hash_dim, low=2)
    if not kinds:
        raise ValueError("kinds must name at least one field")
    sizes = {name: len(columns[name]) for name in kinds if name in columns}
    missing = [name for name in kinds if name not in columns]
    if missing:
        raise ValueError(f"kinds names fields not in columns: {missing}")
    if len(set(sizes.values())) != 1:
        raise ValueError(f"every field must have the same number of mentions; got {sizes}")
    out = {}
    for name, kind in kinds.items():
        check_choice(f"kinds[{name!r}]", kind, FIELD_KINDS)
        values = list(columns[name])
        if kind == "string":
            out[name] = jnp.asarray(_bag(values, hash_dim, _char_ngrams))
        elif kind == "tokens":
            out[name] = jnp.asarray(_bag(values, hash_dim, _tokens))
        elif kind == "categorical":
            codes = np.full(len(values), -1, np.int32)
            present = [k for k, v in enumerate(values) if not (v is None or (isinstance(v, float) and np.isnan(v)))]
            _, inv = np.unique(np.asarray([str(values[k]) for k in present], dtype=object), return_inverse=True)
            codes[present] = inv
            out[name] = jnp.asarray(codes)
        else:
            out[name] = jnp.asarray(np.asarray(values, np.float64).astype(np.float32))
    return out


def similarity_factor(
    kinds: Mapping[str, str],
    weights: Mapping[str, float] | None = None,
    *,
    thresholds: Mapping[str, float] | None = None,
    scales: Mapping[str, float] | None = None,
    bias: float = 0.0,
) -> Callable:
    """Default ``pairwise_log_factor(x_i, x_j)`` built from encoded fields.

    ``f(x_i, x_j) = bias + Σ_k w_k s_k`` with, for field ``k`` (0 if either value is missing):

    * string / tokens: ``s = cos(v_i, v_j) - t_k`` (cosine of hashed n-gram bags, ``t_k`` default 0.5);
    * categorical: ``s = +1`` if equal, ``-1`` otherwise;
    * numeric: ``s = 2 exp(-|a - b| / scale_k) - 1`` (``scale_k`` default 1).

    Positive ``f`` pulls two mentions together, negative pushes them apart.

    Parameters
    ----------
    kinds
        As in :func:`encode_mentions`.
    weights
        Field -> ``w_k``, a finite real (default 1 for each field).
    thresholds
        Field -> ``t_k`` in ``[-1, 1]`` (string / tokens; default 0.5).
    scales
        Field -> ``scale_k > 0`` (numeric; default 1).
    bias
        A finite real added to every pair.

    Returns
    -------
    Callable
        ``pairwise_log_factor(x_i, x_j) -> scalar`` on single rows of the dict from
        :func:`encode_mentions` (vmap it for many pairs).

    Raises
    ------
    ValueError
        An unknown kind, a mapping naming a field not in ``kinds``, or a value out of its range (the message
        names the entry, e.g. ``scales['year']``).
    """
    items = _similarity_items(kinds, weights, thresholds, scales)
    bias = check_real("bias", bias)

    def pairwise_log_factor(xi, xj):
        total = jnp.asarray(bias, jnp.float32)
        for name, kind, w, t, sc in items:
            a, b = xi[name], xj[name]
            if kind in ("string", "tokens"):
                present = (jnp.sum(a * a) > 0) & (jnp.sum(b * b) > 0)
                s = jnp.dot(a, b) - t
            elif kind == "categorical":
                present = (a >= 0) & (b >= 0)
                s = jnp.where(a == b, 1.0, -1.0)
            else:
                present = ~(jnp.isnan(a) | jnp.isnan(b))
                s = 2.0 * jnp.exp(-jnp.abs(a - b) / sc) - 1.0
            total = total + jnp.where(present, w * s, 0.0)
        return total

    return pairwise_log_factor


def _similarity_items(kinds, weights, thresholds, scales):
    """Validated ``[(name, kind, w, t, scale)]`` of :func:`similarity_factor`'s sum.

    Weights are finite reals, thresholds finite cosines in ``[-1, 1]``, scales finite and > 0; each mapping
    may name only fields of ``kinds`` (``ValueError`` naming the entry otherwise).
    """
    weights = {k: 1.0 for k in kinds} if weights is None else dict(weights)
    thresholds = {} if thresholds is None else dict(thresholds)
    scales = {} if scales is None else dict(scales)
    for label, mapping in (("weights", weights), ("thresholds", thresholds), ("scales", scales)):
        for name in mapping:
            if name not in kinds:
                raise ValueError(f"{label} names a field not in kinds: {name!r}")
    for name, kind in kinds.items():
        check_choice(f"kinds[{name!r}]", kind, FIELD_KINDS)
    return [
        (
            name,
            kinds[name],
            check_real(f"weights[{name!r}]", w),
            check_real(
                f"thresholds[{name!r}]",
                thresholds.get(name, 0.5),
                low=-1.0,
                high=1.0,
                low_closed=True,
                high_closed=True,
            ),
            check_real(f"scales[{name!r}]", scales.get(name, 1.0), low=0.0),
        )
        for name, w in weights.items()
    ]


class PackedSimilarity(NamedTuple):
    """The default similarity on packed rows (:func:`packed_similarity`): two pure functions.

    Attributes
    ----------
    pack
        ``pack(mentions) -> packed``: the dict of :func:`encode_mentions` -> ``{"dense": [M, P] float32,
        "codes": [M, C] int32, "numbers": [M, Q] float32}`` (traceable; run it once, outside the sweep).
    factor
        ``factor(x_i, x_j) -> scalar`` on single rows of ``packed``: the same value as
        :func:`similarity_factor` with the same settings (up to float rounding).
    """

    pack: Callable
    factor: Callable


def _categorical_term(a, b, w_cat):
    """Σ_k ±w_k over categorical fields present in both mentions (+ if the codes agree)."""
    s = jnp.where(a == b, w_cat, -w_cat)
    return jnp.sum(jnp.where((a >= 0) & (b >= 0), s, 0.0))


def packed_similarity(
    kinds: Mapping[str, str],
    weights: Mapping[str, float] | None = None,
    *,
    thresholds: Mapping[str, float] | None = None,
    scales: Mapping[str, float] | None = None,
    bias: float = 0.0,
) -> PackedSimilarity:
    """:func:`similarity_factor` with the per-mention work done once: a factor of a few fused array ops.

    The string / token terms are rewritten as one dot product. With ``v_k`` the L2-normalised bag
    (zero when missing) and ``p_k = [v_k ≠ 0]``, a string / token field contributes
    ``w_k p_ik p_jk (v_ik · v_jk - t_k) = w_k v_ik · v_jk - w_k t_k p_ik p_jk`` (the dot product of a
    zero row is 0). So each mention is packed once into ``d = [v_1, ..., v_S, p_1, ..., p_S]`` and the
    string / token part of ``f`` is ``(ω ∘ d_i) · d_j`` with ``ω = [w_1 1, ..., w_S 1, -w_1 t_1, ...,
    -w_S t_S]`` — one gather of ``P`` columns and one matrix-vector product for a batch of ``j``.
    Categorical (``w (2[a = b] - 1)`` when both present) and numeric fields (``w (2 e^{-|a-b|/s} - 1)``
    when both present) keep their formulas on ``[M, C]`` codes and ``[M, Q]`` numbers. Presence of a
    string field (a non-zero bag) is computed once per mention instead of once per pair.

    Parameters
    ----------
    kinds, weights, thresholds, scales, bias
        As in :func:`similarity_factor`.

    Returns
    -------
    PackedSimilarity
        ``(pack, factor)``; use ``factor`` with ``pack(mentions)`` wherever :func:`similarity_factor` takes
        ``mentions`` (e.g. the kernel of :func:`~jaxsub.coreference.build_kernel`).

    Raises
    ------
    ValueError
        As :func:`similarity_factor`; ``pack`` raises when the bags do not share one ``hash_dim``.
    """
    items = _similarity_items(kinds, weights, thresholds, scales)
    vec = [it for it in items if it[1] in ("string", "tokens")]
    cat = [it for it in items if it[1] == "categorical"]
    num = [it for it in items if it[1] == "numeric"]
    bias = check_real("bias", bias)

    def pack(mentions):
        bags = [jnp.asarray(mentions[name], jnp.float32) for name, *_ in vec]
        if any(b.ndim != 2 for b in bags) or len({b.shape[1] for b in bags}) > 1:
            raise ValueError(
                "string / tokens fields must be [M, hash_dim] bags of one hash_dim (from "
                f"encode_mentions); got shapes {[b.shape for b in bags]}"
            )
        present = [(jnp.sum(b * b, axis=1) > 0).astype(jnp.float32)[:, None] for b in bags]
        m = jnp.shape(mentions[items[0][0]])[0]
        dense = jnp.concatenate(bags + present, axis=1) if vec else jnp.zeros((m, 0), jnp.float32)
        codes = (
            jnp.stack([jnp.asarray(mentions[name], jnp.int32) for name, *_ in cat], axis=1)
            if cat
            else jnp.zeros((m, 0), jnp.int32)
        )
        numbers = (
            jnp.stack([jnp.asarray(mentions[name], jnp.float32) for name, *_ in num], axis=1)
            if num
            else jnp.zeros((m, 0), jnp.float32)
        )
        return {"dense": dense, "codes": codes, "numbers": numbers}

    def omega(dim):
        """ω for bags of ``dim`` columns (one hash_dim for every bag, checked by ``pack``)."""
        return np.concatenate(
            [np.repeat(np.float32([w for _, _, w, _, _ in vec]), dim), np.float32([-w * t for _, _, w, t, _ in vec])]
        )

    w_cat = np.asarray([w for _, _, w, _, _ in cat], np.float32)
    w_num = np.asarray([w for _, _, w, _, _ in num], np.float32)
    s_num = np.asarray([sc for _, _, _, _, sc in num], np.float32)

    def factor(xi, xj):
        di, dj = xi["dense"], xj["dense"]
        total = jnp.asarray(bias, jnp.float32)
        if vec:
            total = total + jnp.dot(di * omega((di.shape[-1] - len(vec)) // len(vec)), dj)
        if cat:
            total = total + _categorical_term(xi["codes"], xj["codes"], w_cat)
        if num:
            a, b = xi["numbers"], xj["numbers"]
            s = w_num * (2.0 * jnp.exp(-jnp.abs(a - b) / s_num) - 1.0)
            total = total + jnp.sum(jnp.where(jnp.isnan(a) | jnp.isnan(b), 0.0, s))
        return total

    return PackedSimilarity(pack, factor)


def crf_similarity(
    kinds: Mapping[str, str],
    weights: Mapping[str, float] | None = None,
    *,
    thresholds: Mapping[str, float] | None = None,
    high: Mapping[str, float] | None = None,
    scales: Mapping[str, float] | None = None,
    bias: float = 0.0,
) -> PackedSimilarity:
    """A CRF-style factor of thresholded compatibility templates (Singh et al. 2012), on packed rows.

    ``f(x_i, x_j) = bias + Σ_k w_k s_k`` with, for field ``k`` (0 if either value is missing):

    * string / tokens, ``c = cos(v_i, v_j)``: ``s = +1`` if ``c ≥ h_k`` (compatible), ``-1`` if
      ``c < t_k`` (incompatible), ``0`` in between (``t_k`` = ``thresholds`` default 0.5, ``h_k`` = ``high``
      default ``(1 + t_k) / 2``);
    * categorical: ``+1`` if equal, ``-1`` otherwise;
    * numeric, ``δ = |a - b|``: ``+1`` if ``δ ≤ scale_k``, ``-1`` if ``δ > 3 scale_k``, ``0`` in between.

    Unlike :func:`packed_similarity`, the string / token / numeric terms are step functions of the pair,
    so ``Σ_{j ∈ C} f(x_i, x_j)`` has no per-cluster sufficient statistic: an exact Gibbs update must
    evaluate every member (the setting where racing can pay). Same packed rows as :func:`packed_similarity`.

    Parameters
    ----------
    kinds, weights, thresholds, scales, bias
        As in :func:`similarity_factor`.
    high
        Field -> ``h_k`` in ``[-1, 1]`` (string / tokens fields; must exceed ``t_k``).

    Returns
    -------
    PackedSimilarity
        ``(pack, factor)``.

    Raises
    ------
    ValueError
        As :func:`similarity_factor`; ``high`` naming a field that is not a string / tokens field, out of
        ``[-1, 1]`` or not above its threshold.
    """
    items = _similarity_items(kinds, weights, thresholds, scales)
    high = {} if high is None else dict(high)
    vec = [it for it in items if it[1] in ("string", "tokens")]
    cat = [it for it in items if it[1] == "categorical"]
    num = [it for it in items if it[1] == "numeric"]
    for name, v in high.items():
        if name not in dict((it[0], 1) for it in vec):
            raise ValueError(f"high names a field that is not a string / tokens field: {name!r}")
    lo = np.float32([t for _, _, _, t, _ in vec])
    hi = np.float32(
        [
            check_real(
                f"high[{name!r}]", high.get(name, (1.0 + t) / 2), low=-1.0, high=1.0, low_closed=True, high_closed=True
            )
            for name, _, _, t, _ in vec
        ]
    )
    if np.any(hi <= lo):
        raise ValueError(f"high must exceed thresholds for every string / tokens field; got {hi} vs {lo}")
    w_vec = np.float32([w for _, _, w, _, _ in vec])
    w_cat = np.asarray([w for _, _, w, _, _ in cat], np.float32)
    w_num = np.asarray([w for _, _, w, _, _ in num], np.float32)
    s_num = np.asarray([sc for _, _, _, _, sc in num], np.float32)
    pack = packed_similarity(kinds, weights, thresholds=thresholds, scales=scales, bias=bias).pack
    bias = check_real("bias", bias)

    def factor(xi, xj):
        total = jnp.asarray(bias, jnp.float32)
        if vec:
            di, dj = xi["dense"], xj["dense"]
            s_ = len(vec)
            h = (di.shape[-1] - s_) // s_
            c = jnp.sum((di[: s_ * h] * dj[: s_ * h]).reshape(s_, h), axis=-1)
            present = (di[s_ * h :] * dj[s_ * h :]) > 0
            s = jnp.where(c >= hi, w_vec, jnp.where(c < lo, -w_vec, 0.0))
            total = total + jnp.sum(jnp.where(present, s, 0.0))
        if cat:
            total = total + _categorical_term(xi["codes"], xj["codes"], w_cat)
        if num:
            a, b = xi["numbers"], xj["numbers"]
            d = jnp.abs(a - b)
            s = jnp.where(d <= s_num, w_num, jnp.where(d > 3.0 * s_num, -w_num, 0.0))
            total = total + jnp.sum(jnp.where(jnp.isnan(a) | jnp.isnan(b), 0.0, s))
        return total

    return PackedSimilarity(pack, factor)
