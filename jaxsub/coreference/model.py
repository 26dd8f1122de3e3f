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
from typing import Callable, Mapping, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from jaxsub.validation import check_choice, check_int

__all__ = ["Blocks", "encode_mentions", "make_blocks", "similarity_factor"]

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
        return int(self.order.shape[0])

    def block_sizes(self) -> np.ndarray:
        """Sizes of the blocks (one entry per block)."""
        first = self.start == np.arange(self.num_mentions)
        return self.size[first]


def make_blocks(block_keys: Sequence) -> Blocks:
    """Group mentions by blocking key.

    Args:
        block_keys: one hashable key per mention (strings or integers), length M >= 1.

    Returns:
        :class:`Blocks` (a stable sort by key; mentions keep their order inside a block).
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
    return Blocks(order=order, position=position, start=first_pos[block_of].astype(np.int32),
                  size=sizes[block_of].astype(np.int32))


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
    return [s[k:k + n] for k in range(max(1, len(s) - n + 1))] if s != "##" else []


def _tokens(s: str) -> list[str]:
    return [t for t in s.replace(";", " ").replace(",", " ").split() if t]


def encode_mentions(columns: Mapping[str, Sequence], kinds: Mapping[str, str], *, hash_dim: int = 32) -> dict:
    """Encode mention fields for :func:`similarity_factor` (host-side).

    Args:
        columns: field name -> sequence of M values (``None``/NaN = missing).
        kinds: field name -> ``"string"`` (character trigrams), ``"tokens"`` (bag of
            whitespace/comma/semicolon-separated tokens, e.g. co-authors or title words),
            ``"categorical"`` (equality) or ``"numeric"`` (absolute difference).
        hash_dim: size of the hashed n-gram / token vectors.

    Returns:
        dict of arrays with leading axis M: ``"<name>"`` -> ``[M, hash_dim]`` L2-normalised
        float32 bags (string, tokens; zero rows for missing), ``[M]`` int32 codes (categorical;
        -1 for missing) or ``[M]`` float32 (numeric; NaN for missing).
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


def similarity_factor(kinds: Mapping[str, str], weights: Mapping[str, float] | None = None, *,
                      thresholds: Mapping[str, float] | None = None, scales: Mapping[str, float] | None = None,
                      bias: float = 0.0) -> Callable:
    """Default ``pairwise_log_factor(x_i, x_j)`` built from encoded fields.

    ``f(x_i, x_j) = bias + Σ_k w_k s_k`` with, for field ``k`` (0 if either value is missing):

    * string / tokens: ``s = cos(v_i, v_j) - t_k`` (cosine of hashed n-gram bags, ``t_k`` default 0.5);
    * categorical: ``s = +1`` if equal, ``-1`` otherwise;
    * numeric: ``s = 2 exp(-|a - b| / scale_k) - 1`` (``scale_k`` default 1).

    Positive ``f`` pulls two mentions together, negative pushes them apart.

    Args:
        kinds: as in :func:`encode_mentions`.
        weights: field -> ``w_k`` (default 1 for each field).
        thresholds, scales, bias: see above.

    Returns:
        ``pairwise_log_factor(x_i, x_j) -> scalar`` on single rows of the dict from
        :func:`encode_mentions` (vmap it for many pairs).
    """
    weights = {k: 1.0 for k in kinds} if weights is None else dict(weights)
    thresholds = {} if thresholds is None else dict(thresholds)
    scales = {} if scales is None else dict(scales)
    for name in weights:
        if name not in kinds:
            raise ValueError(f"weights names a field not in kinds: {name!r}")
    for name, kind in kinds.items():
        check_choice(f"kinds[{name!r}]", kind, FIELD_KINDS)
    items = [(name, kinds[name], float(w), float(thresholds.get(name, 0.5)), float(scales.get(name, 1.0)))
             for name, w in weights.items()]
    bias = float(bias)

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
