"""Context pack (seed 003): a small, deterministic, explained set of related articles.

The seed's signals mapped onto a pack:

| seed signal                              | pack signal                                          | score |
|------------------------------------------|------------------------------------------------------|-------|
| shared tag                               | shared entity (named in the seed / the seed article) | +3 each (at most 3) |
| shared domain                            | same category as the seed article / top hit          | +2    |
| wikilink to/from a seed-named entity     | LINKS_TO to or from the seed article or an article   | +1 each |
|                                          | titled like an entity the seed names                 |       |
| qmd top-3 hit                            | vector search top-3 article for the seed text        | +5    |
| title token Jaccard >= 0.5               | the same, on article titles                          | +4    |

Articles scoring under 3 are dropped; ties go to the higher PageRank (packs have no
modification dates), then the title. A seed that is an article of the pack is not in its own
context pack.
"""

from __future__ import annotations

from kpack.text import words
from retrieval.candidates import nearest_passages
from retrieval.reader import PackReader

MIN_SCORE = 3


def _tokens(text: str) -> set[str]:
    return set(words(text))


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a and b else 0.0


def _seed_article(pack: PackReader, seed: str) -> str | None:
    if seed in pack.articles:
        return seed
    by_title = {a.title.lower(): url for url, a in pack.articles.items()}
    return by_title.get(seed.strip().lower())


def context_pack(pack: PackReader, seed: str, limit: int = 5) -> list[dict]:
    """Rows of {url, title, score, why}, best first, for a question, URL or article title."""
    seed_url = _seed_article(pack, seed)
    seed_text = pack.articles[seed_url].title if seed_url else seed
    scores: dict[str, int] = {}
    why: dict[str, list[str]] = {}

    def add(url: str, points: int, reason: str) -> None:
        if url == seed_url:
            return
        scores[url] = scores.get(url, 0) + points
        why.setdefault(url, []).append(reason)

    hits = nearest_passages(pack, seed_text, pack.embed([seed_text])[0], 10, labels=("Section",))
    top_articles = list(dict.fromkeys(h.article_url for h in hits if h.article_url != seed_url))[:3]
    for rank, url in enumerate(top_articles, start=1):
        add(url, 5, f"vector top-{rank}")

    if seed_url:
        seed_entities = {
            r[0]
            for r in pack.query(
                "MATCH (a:Article {url: $u})-[:HAS_ENTITY]->(e:Entity) WHERE e.type <> 'topic' RETURN e.entity_id",
                {"u": seed_url},
            )
        }
        categories = {pack.articles[seed_url].category}
        linked = pack.query(
            "MATCH (a:Article {url: $u})-[:LINKS_TO]-(b:Article) RETURN DISTINCT b.url",
            {"u": seed_url},
        )
        for (url,) in linked:
            add(url, 1, "links to/from the seed article")
    else:
        seed_words = _tokens(seed)
        seed_entities = {
            r[0]
            for r in pack.query(
                "MATCH (e:Entity) WHERE e.type <> 'topic' AND size(e.entity_id) > 3 AND e.entity_id IN $names "
                "RETURN e.entity_id",
                {"names": sorted(_phrases(seed))},
            )
        }
        categories = {pack.articles[top_articles[0]].category} if top_articles else set()
        named_articles = [
            url
            for url, a in pack.articles.items()
            if _tokens(a.title) and _tokens(a.title) <= seed_words
        ]
        for named in named_articles:
            add(named, 1, f"named in the seed: {pack.articles[named].title}")
            for (url,) in pack.query(
                "MATCH (a:Article {url: $u})-[:LINKS_TO]-(b:Article) RETURN DISTINCT b.url",
                {"u": named},
            ):
                add(url, 1, f"links to/from {pack.articles[named].title}")

    if seed_entities:
        shared = pack.query(
            "MATCH (a:Article)-[:HAS_ENTITY]->(e:Entity) WHERE e.entity_id IN $ids "
            "RETURN a.url, collect(e.name)",
            {"ids": sorted(seed_entities)},
        )
        for url, names in shared:
            names = sorted(names)[:3]
            add(url, 3 * len(names), "shared entities: " + ", ".join(names))
    seed_tokens = _tokens(seed_text)
    for url, article in pack.articles.items():
        if article.category in categories:
            add(url, 2, f"shared category: {article.category}")
        if _jaccard(seed_tokens, _tokens(article.title)) >= 0.5:
            add(url, 4, "title overlap (Jaccard >= 0.5)")

    ranked = sorted(
        (u for u, s in scores.items() if s >= MIN_SCORE),
        key=lambda u: (-scores[u], -pack.articles[u].pagerank, pack.articles[u].title),
    )
    return [
        {"url": u, "title": pack.articles[u].title, "score": scores[u], "why": "; ".join(why[u])}
        for u in ranked[:limit]
    ]


def _phrases(text: str, longest: int = 4) -> set[str]:
    """Every run of 1-4 words of the text, lower-cased: candidate entity names."""
    found = words(text)
    return {
        " ".join(found[i : i + n]) for n in range(1, longest + 1) for i in range(len(found) - n + 1)
    }
