"""Page crowding: at most a few passages of one page ahead of every other page's best.

Passages are cut to what the embedding model reads (kpack.ingest.chunking), so a long page
has many, and several of them can match a question together: a question about one function
of a long reference page would fill the top of the ranking with that page's neighbouring
passages and push every other page out of it. As web search limits results per host, this
stage moves a page's passages after its first :data:`passages_per_page` below the best
passage of every other page still ranked, keeping the order within each group.
"""

from __future__ import annotations

from retrieval.query import Query, stage


@stage("page_crowding", "rank")
def page_crowding(query: Query) -> None:
    limit = query.settings.passages_per_page
    if not limit:
        return
    seen: dict[str, int] = {}
    first, later = [], []
    for candidate in query.candidates:
        count = seen.get(candidate.article_url, 0)
        seen[candidate.article_url] = count + 1
        if count < limit:
            first.append(candidate)
        else:
            later.append(candidate)
            candidate.reasons.append(
                f"page crowding: passage {count + 1} of its page, after other pages' best"
            )
    query.candidates = first + later
