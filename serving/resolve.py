"""Which packs hold a library or a topic: what an agent asks before it searches, as Context7's
resolve-library-id does.

Each published pack is described by its name, its description (``description`` in
kg_config.json, when it has one), the documentation's own title and release (read from its
pages, kpack.ingest.doc_version) and what its skill.md names: the most central articles, the
most distinctive headings and terms (kpack.skill). A pack matches in two ways:

- by words: the share of the request's words found in the pack's description, weighted by how
  few packs hold each word (a word every pack holds tells them apart no more than none); a
  request that is a pack's name ranks that pack first, then one that is the name its
  documentation gives itself (the first word of its title);
- by meaning: the cosine similarity of the request with the pack's best passage (a search of
  the pack), which finds a topic in words the description does not use.

Packs rank by name match (the pack's name, then its documentation's), then by word share plus
similarity.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import retrieval
from kpack.config import pack_description
from kpack.errors import PackError
from kpack.packs import list_packs
from serving import catalog

# skill.md's sections that describe what the pack holds (not how to query it).
SKILL_SECTIONS = ("## Most central articles", "## Topics", "## Distinctive terms")
WORD = re.compile(r"[a-z0-9]+(?:[-_.][a-z0-9]+)*")
SEARCHED_PASSAGES = 3  # the passages a pack's best similarity is read from


def words(text: str) -> set[str]:
    """The words of a text, lower case, with their parts ("scikit-learn": also scikit, learn)."""
    found = set(WORD.findall(text.casefold()))
    return found | {part for word in found for part in re.split(r"[-_.]", word) if part}


def described_by(name: str, root: Path) -> dict[str, Any] | None:
    """A published pack's description: its name, title, release, description and the text of
    skill.md's sections on what it holds; None for a pack never built."""
    row = catalog.info(name, root)
    manifest = row.get("manifest")
    if not manifest:
        return None
    skill = row.get("skill_md") or ""
    held = [part for part in skill.split("\n## ") if f"## {part}".startswith(SKILL_SECTIONS)]
    return {
        "pack": name,
        "title": manifest.get("documentation_title"),
        "documentation_version": manifest.get("documentation_version"),
        "description": pack_description(root / name, manifest) or None,
        "text": " ".join(filter(None, [name, manifest.get("documentation_title"), *held])),
    }


def name_match(request: str, pack: dict[str, Any]) -> int:
    """2 when the request is the pack's name; 1 when it is the first word of its
    documentation's title ("flask" for "Flask Documentation (2.2.x)", which a pack of several
    sites may also carry); else 0."""
    asked = request.strip().casefold()
    title_words = WORD.findall((pack["title"] or "").casefold())
    if asked == pack["pack"].casefold():
        return 2
    return int(bool(title_words) and asked == title_words[0])


def resolve(request: str, root: Path, limit: int = 5) -> list[dict[str, Any]]:
    """The published packs that best match a library name or a topic, best first."""
    asked = words(request)
    if not asked:
        raise PackError("name a library or a topic to find packs for")
    packs = [
        described
        for name in list_packs(root)
        if (described := described_by(name, root)) is not None
    ]
    held = {pack["pack"]: words(f"{pack['text']} {pack['description'] or ''}") for pack in packs}
    # A word held by fewer packs tells them apart more (idf); smoothed, so a word of every
    # pack still counts a little and a request of one such word still ranks.
    weight = {
        word: math.log((len(packs) + 1) / (1 + sum(word in h for h in held.values()))) + 1
        for word in asked
    }
    total = sum(weight.values())
    rows = []
    for pack in packs:
        matched = sorted(word for word in asked if word in held[pack["pack"]])
        similarity = _best_similarity(root / pack["pack"], request)
        rows.append(
            {
                "pack": pack["pack"],
                "title": pack["title"],
                "documentation_version": pack["documentation_version"],
                "description": pack["description"],
                "name_match": name_match(request, pack),
                "matched_words": matched,
                "similarity": round(similarity, 4),
                "score": round(sum(weight[w] for w in matched) / total + similarity, 4),
            }
        )
    rows.sort(key=lambda row: (-row["name_match"], -row["score"], row["pack"]))
    return rows[:limit]


def _best_similarity(folder: Path, request: str) -> float:
    """The request's cosine similarity with the pack's best passage; 0 when it cannot answer."""
    try:
        hits = retrieval.search(folder, request, k=SEARCHED_PASSAGES)
    except PackError:  # damaged, or its settings unreadable: it matches by words only
        return 0.0
    return max((hit["similarity"] or 0.0 for hit in hits), default=0.0)
