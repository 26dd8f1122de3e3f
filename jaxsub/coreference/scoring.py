"""Clustering scores against true entity ids: B³ (Bagga & Baldwin 1998) and pairwise F1.

B³: for mention i with predicted cluster C(i) and true entity T(i),
``P_i = |C(i) ∩ T(i)| / |C(i)|``, ``R_i = |C(i) ∩ T(i)| / |T(i)|``; precision and recall are
the means over mentions, F1 their harmonic mean. With ``n_ct`` the number of mentions in
predicted cluster c and entity t: ``P = (1/M) Σ_{c,t} n_ct² / n_c``, ``R = (1/M) Σ n_ct² / n_t``.

Pairwise: precision = (pairs in the same predicted cluster and the same entity) / (pairs in the
same predicted cluster); recall divides by the pairs in the same entity.

References
----------
A. Bagga & B. Baldwin, "Algorithms for scoring coreference chains", LREC workshop on
linguistic coreference, 1998.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Scores", "b_cubed", "pairwise_f1"]


class Scores(NamedTuple):
    """Precision, recall and their harmonic mean F1 (Python floats in [0, 1])."""

    precision: float
    recall: float
    f1: float


def _contingency(predicted, truth):
    pred = np.asarray(predicted).ravel()
    true = np.asarray(truth).ravel()
    if pred.shape != true.shape or pred.size == 0:
        raise ValueError(
            f"predicted and truth must be non-empty and of the same length; got {pred.shape}, {true.shape}"
        )
    _, p = np.unique(pred, return_inverse=True)
    _, t = np.unique(true, return_inverse=True)
    pairs = p.astype(np.int64) * (t.max() + 1) + t
    _, joint_idx, n_ct = np.unique(pairs, return_index=True, return_counts=True)
    n_c = np.bincount(p)
    n_t = np.bincount(t)
    return n_ct.astype(np.float64), p[joint_idx], t[joint_idx], n_c.astype(np.float64), n_t.astype(np.float64)


def _f1(precision, recall):
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def b_cubed(predicted, truth) -> Scores:
    """B³ precision, recall and F1 of a clustering ``predicted`` (any labels) against ``truth``.

    Parameters
    ----------
    predicted, truth
        ``[M]`` labels of the same mentions (any hashable values).

    Returns
    -------
    Scores
        ``(precision, recall, f1)``: per mention, the share of its predicted cluster in its true one
        (precision) and of its true cluster in its predicted one (recall), averaged over mentions.

    Raises
    ------
    ValueError
        Empty inputs or inputs of different lengths.
    """
    n_ct, c, t, n_c, n_t = _contingency(predicted, truth)
    m = n_c.sum()
    precision = float(np.sum(n_ct**2 / n_c[c]) / m)
    recall = float(np.sum(n_ct**2 / n_t[t]) / m)
    return Scores(precision, recall, _f1(precision, recall))


def pairwise_f1(predicted, truth) -> Scores:
    """Pairwise precision, recall and F1 of a clustering ``predicted`` against ``truth``.

    Parameters
    ----------
    predicted, truth
        ``[M]`` labels of the same mentions (any hashable values).

    Returns
    -------
    Scores
        ``(precision, recall, f1)`` over pairs of mentions put together (1.0 by convention when there are
        no pairs to find / predict).

    Raises
    ------
    ValueError
        Empty inputs or inputs of different lengths.
    """
    n_ct, _, _, n_c, n_t = _contingency(predicted, truth)
    both = np.sum(n_ct * (n_ct - 1) / 2)
    pred_pairs = np.sum(n_c * (n_c - 1) / 2)
    true_pairs = np.sum(n_t * (n_t - 1) / 2)
    precision = float(both / pred_pairs) if pred_pairs > 0 else 1.0
    recall = float(both / true_pairs) if true_pairs > 0 else 1.0
    return Scores(precision, recall, _f1(precision, recall))
