"""A generator of author-like mentions with Zipf-distributed entity sizes (for experiments).

Entities (real persons) get a size ``~ Zipf(zipf_exponent)`` truncated at ``max_entity_size``;
the largest entity is set to ``max_entity_size`` so the heavy tail is always present.
Each entity has a given name and a surname drawn from an offline name list with
realistic frequencies (:func:`jaxsub.datasets.febrl_name_frequencies`; surname
probabilities ∝ count^``surname_power`` to sharpen the head, so that common names are
shared by many entities), a pool of co-authors, a few venues, a topic (a set of title
words) and an active year. A mention renders the name as ``"<given> <surname>"`` or
``"<initial> <surname>"`` (probability ``initial_prob``), with a character typo with
probability ``typo_prob``; it lists 1-3 co-authors of the entity's pool, one of its
venues, a title of 6 words (4 from the topic, 2 from the whole vocabulary) and a year
``~ N(active year, 3)``. Mentions are blocked by ``<first letter> <surname>`` as written.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxsub.validation import check_int, check_real

__all__ = ["AuthorMentions", "author_mentions"]

_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


class AuthorMentions(NamedTuple):
    """Generated mentions: ``fields`` (column name -> list of M values), ``entity`` [M], ``block_keys`` [M]."""

    fields: dict
    entity: np.ndarray
    block_keys: np.ndarray


def _typo(rng, s: str) -> str:
    if len(s) < 2:
        return s
    k = int(rng.integers(len(s)))
    return s[:k] + str(rng.choice(_LETTERS)) + s[k + 1 :]


def author_mentions(
    num_mentions: int,
    names,
    *,
    seed: int = 0,
    zipf_exponent: float = 2.2,
    max_entity_size: int = 1500,
    surname_power: float = 1.6,
    initial_prob: float = 0.5,
    typo_prob: float = 0.03,
    num_coauthors: int = 50_000,
    vocabulary: int = 5_000,
    num_venues: int = 500,
) -> AuthorMentions:
    """Generate ``num_mentions`` author mentions (see the module docstring).

    Args:
        num_mentions: M >= 2.
        names: ``(given_names, given_counts, surnames, surname_counts)``, e.g.
            :func:`jaxsub.datasets.febrl_name_frequencies`.
        seed: NumPy seed.

    Returns:
        :class:`AuthorMentions` (fields ``name``, ``coauthors``, ``venue``, ``title``, ``year``).
    """
    m = check_int("num_mentions", num_mentions, low=2)
    a = check_real("zipf_exponent", zipf_exponent, low=1.0)
    cap = check_int("max_entity_size", max_entity_size, low=1)
    rng = np.random.default_rng(seed)
    sizes = [cap]
    total = cap if cap < m else m
    sizes = [min(cap, m)]
    while total < m:
        s = int(min(rng.zipf(a), cap, m - total))
        sizes.append(s)
        total += s
    sizes = np.asarray(sizes)
    e = sizes.size
    given, gcount, surname, scount = names
    gp = np.asarray(gcount, float) / np.sum(gcount)
    sp = np.asarray(scount, float) ** surname_power
    sp /= sp.sum()
    ent_given = np.asarray(given)[rng.choice(len(given), e, p=gp)]
    ent_surname = np.asarray(surname)[rng.choice(len(surname), e, p=sp)]
    co_p = 1.0 / np.arange(1, num_coauthors + 1) ** 0.8
    co_p /= co_p.sum()
    ent_co = rng.choice(num_coauthors, (e, 8), p=co_p)
    ven_p = 1.0 / np.arange(1, num_venues + 1)
    ven_p /= ven_p.sum()
    ent_ven = rng.choice(num_venues, (e, 3), p=ven_p)
    ent_topic = rng.integers(0, vocabulary, (e, 20))
    ent_year = rng.integers(1970, 2020, e)
    entity = np.repeat(np.arange(e), sizes)
    rng.shuffle(entity)
    name, co, ven, title, year, keys = [], [], [], [], [], []
    for ent in entity:
        g, s = str(ent_given[ent]), str(ent_surname[ent])
        if rng.random() < typo_prob:
            s = _typo(rng, s)
        if rng.random() < typo_prob:
            g = _typo(rng, g)
        shown = g[0] if rng.random() < initial_prob else g
        name.append(f"{shown} {s}")
        keys.append(f"{g[0]} {s}")
        k = int(rng.integers(1, 4))
        co.append(" ".join(f"c{c}" for c in rng.choice(ent_co[ent], k, replace=False)))
        ven.append(f"v{ent_ven[ent, rng.integers(3)]}")
        words = np.concatenate([rng.choice(ent_topic[ent], 4, replace=False), rng.integers(0, vocabulary, 2)])
        title.append(" ".join(f"w{w}" for w in words))
        year.append(float(ent_year[ent] + rng.normal(0, 3)))
    fields = {"name": name, "coauthors": co, "venue": ven, "title": title, "year": year}
    return AuthorMentions(fields, entity.astype(np.int64), np.asarray(keys))
