"""The entity-passage graph of a pack and personalized PageRank over it, as queries use them
(issue 10; retrieval.graph runs them).

Nodes are the pack's passages (chunks) and its entities (kpack.ingest.extraction: names,
terms, code identifiers and the pack's own article titles, deduplicated by normalised name,
kpack.text.normalize_entity).
Edges join a passage to every entity it mentions (the MENTIONS edge of kpack.contracts), a
passage to the title entity of every article its article links to (LINKS_TO), and two entities
that a relation joins. Personalized PageRank seeded by the entities a question names and by the
passages first-hop search found spreads their weight along those edges, so a passage that
shares a bridge entity with a first-hop hit ranks even when the question's own words do not
reach it (HippoRAG 2, Gutiérrez et al. 2025).

Everything here is numpy/scipy: no Dagster, no Kuzu, deterministic. The build records which
chunk mentions which entity (kpack.ingest.mentions, the MENTIONS edges), builds the
:class:`EntityGraph` and stores it as CSR arrays with the version (kpack.indexes), which a
reader maps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kpack.text import name_words

if TYPE_CHECKING:  # imported where used: `import retrieval` should not pay for it
    from scipy import sparse

MAX_LINKED_WORDS = 8  # longest entity name matched in a question, in words
PAGERANK_TOLERANCE = 0.005  # weight of the walks personalized PageRank leaves out
MAX_PAGERANK_STEPS = 50
# A query's walk: at most this many nodes, nearest the seeds first ...
MAX_WALK_NODES = 50_000
# ... and an entity joined to more nodes than this is reached but not walked through.
MAX_EXPANDED_PASSAGES = 1_000


@dataclass(frozen=True)
class EntityGraph:
    """Passages and entities as one graph, with the transition matrix PageRank walks.

    Node ``i < len(passages)`` is passage ``passages[i]``; node ``len(passages) + j`` is entity
    ``entities[j]`` (its normalised name; ``names[j]`` is how the pack writes it). Every passage
    belongs to an article (``article_of[i]``, an index into ``articles``); an article whose
    title is an entity of the pack has that entity node in ``title_entity`` (else -1).
    """

    passages: Sequence[str]
    entities: Sequence[str]
    names: Sequence[str]
    article_of: np.ndarray  # per passage: index of its article
    title_entity: np.ndarray  # per article: node of its title entity, or -1
    adjacency: sparse.csr_matrix  # symmetric, weighted
    transition: sparse.csr_matrix  # column-stochastic: transition @ r spreads r one step
    passages_of_entity: np.ndarray  # per entity: how many passages name it
    about: Mapping[int, np.ndarray]  # title entity node -> the passages of its articles
    entity_index: Mapping[str, int]
    longest_name: int  # in words

    @property
    def size(self) -> int:
        return len(self.passages) + len(self.entities)

    def entity_node(self, key: str) -> int | None:
        index = self.entity_index.get(key)
        return None if index is None else len(self.passages) + index

    def name_of(self, node: int) -> str:
        """How the pack writes an entity node's name."""
        return self.names[node - len(self.passages)]

    def mentions_of(self, node: int) -> int:
        """How many passages name an entity node (spell it: not those that sit in its article
        or link to it, see build_entity_graph)."""
        return int(self.passages_of_entity[node - len(self.passages)])

    def neighbours(self, node: int) -> np.ndarray:
        row = self.adjacency
        return row.indices[row.indptr[node] : row.indptr[node + 1]]


def build_entity_graph(
    passages: Sequence[tuple[str, str]],
    entities: Sequence[tuple[str, str]],
    mentions: Iterable[tuple[str, str, bool]],
    titles: dict[str, str] | None = None,
    links: Iterable[tuple[str, str]] = (),
    relations: Iterable[tuple[str, str]] = (),
    relation_weight: float = 0.5,
) -> EntityGraph:
    """The graph of ``passages`` ((passage id, article id)) and ``entities`` ((key, name)).

    An entity's mention count (``passages_of_entity``) is the passages that name it: the
    ``mentions`` marked as spelled (kpack.ingest.mentions), not its structural edges (a page
    title has one to every passage of its page and of every page linking to it, which made
    every title of a documentation pack look generic).

    Edges: ``mentions`` ((passage id, entity key, spelled); a part of the passage's own article title,
    such as "Leland" on "Leland, North Carolina", is the article itself and makes no edge);
    every passage to its article's title entity (``titles``: article id -> entity key); every
    passage of an article to the title entity of each article it links to (``links``: (article
    id, article id) pairs, LINKS_TO); and ``relations`` ((entity key, entity key)) at
    ``relation_weight``. Pairs naming an unknown passage, article or entity are skipped; a
    pair given twice counts once.
    """
    from scipy import sparse

    titles = titles or {}
    passage_index = {p: i for i, (p, _) in enumerate(passages)}
    entity_index = {key: j for j, (key, _) in enumerate(entities)}
    articles = tuple(dict.fromkeys(article for _, article in passages))
    article_index = {a: i for i, a in enumerate(articles)}
    article_of = np.array([article_index[a] for _, a in passages], dtype=np.int64)
    offset = len(passages)

    def entity(key: str | None) -> int | None:
        j = entity_index.get(key) if key is not None else None
        return None if j is None else offset + j

    title_nodes = [entity(titles.get(article)) for article in articles]
    title_entity = np.array([-1 if n is None else n for n in title_nodes], dtype=np.int64)
    weights: dict[tuple[int, int], float] = {}

    def join(a: int | None, b: int | None, weight: float) -> None:
        if a is None or b is None or a == b:
            return
        pair = (min(a, b), max(a, b))
        weights[pair] = max(weights.get(pair, 0.0), weight)

    own_title = {p: f" {titles.get(article, '')} " for p, article in passages}
    naming: set[tuple[int, int]] = set()
    for passage, key, spelled in mentions:
        node, named = passage_index.get(passage), entity(key)
        if spelled and node is not None and named is not None:
            naming.add((named - offset, node))
        # A page calls its subject by part of its title ("Leland" on "Leland, North
        # Carolina"): that names the page itself, and must not join it to every other Leland.
        if key != own_title.get(passage, "").strip() and f" {key} " in own_title.get(passage, ""):
            continue
        join(node, named, 1.0)
    members: dict[int, list[int]] = {}
    about: dict[int, list[int]] = {}
    for i, a in enumerate(article_of):
        members.setdefault(int(a), []).append(i)
        if title_entity[a] >= 0:
            join(i, int(title_entity[a]), 1.0)
            about.setdefault(int(title_entity[a]), []).append(i)
    for source, target in links:
        target_entity = entity(titles.get(target))
        for i in members.get(article_index.get(source, -1), []):
            join(i, target_entity, 1.0)
    for left, right in relations:
        join(entity(left), entity(right), relation_weight)
    size = offset + len(entities)
    pairs = sorted(weights)
    rows = np.array([a for a, _ in pairs] + [b for _, b in pairs], dtype=np.int64)
    cols = np.array([b for _, b in pairs] + [a for a, _ in pairs], dtype=np.int64)
    values = np.array([weights[p] for p in pairs] * 2, dtype=np.float64)
    adjacency = sparse.csr_matrix((values, (rows, cols)), shape=(size, size))
    degree = np.asarray(adjacency.sum(axis=1)).ravel()
    inverse = np.divide(1.0, degree, out=np.zeros_like(degree), where=degree > 0)
    # Column j of the transition holds where node j's weight goes: A D^-1 (A is symmetric).
    # float32: PageRank needs no more, and the walk's matrix-vector product runs twice as fast.
    transition = (adjacency @ sparse.diags(inverse)).tocsr().astype(np.float32)
    passages_of_entity = np.bincount(
        np.array([e for e, _ in naming], dtype=np.int64), minlength=len(entities)
    )
    return EntityGraph(
        passages=tuple(p for p, _ in passages),
        entities=tuple(key for key, _ in entities),
        names=tuple(name for _, name in entities),
        article_of=article_of,
        title_entity=title_entity,
        adjacency=adjacency,
        transition=transition,
        passages_of_entity=passages_of_entity,
        about={node: np.array(members, dtype=np.int64) for node, members in about.items()},
        entity_index=entity_index,
        longest_name=min(
            MAX_LINKED_WORDS, max((len(key.split()) for key, _ in entities), default=0)
        ),
    )


class SortedGroups(Mapping[int, np.ndarray]):
    """Node -> an array of nodes, as CSR over sorted keys (how a version stores ``about``)."""

    def __init__(self, keys: np.ndarray, offsets: np.ndarray, values: np.ndarray) -> None:
        self.keys, self.offsets, self.values = keys, offsets, values

    def _at(self, key: object) -> int:
        at = int(np.searchsorted(self.keys, key)) if isinstance(key, int | np.integer) else -1
        return at if 0 <= at < len(self.keys) and self.keys[at] == key else -1

    def __contains__(self, key: object) -> bool:
        return self._at(key) >= 0

    def __getitem__(self, key: int) -> np.ndarray:
        at = self._at(key)
        if at < 0:
            raise KeyError(key)
        return self.values[self.offsets[at] : self.offsets[at + 1]]

    def __iter__(self) -> Iterator[int]:
        return (int(key) for key in self.keys)

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class Bridges:
    """Passages one entity away from another: ``passages[i]`` belongs to the article titled by
    ``entities[i]``, an entity the other passage names. Arrays, since a title that many pages
    name (a module's page in a library's docs) bridges to hundreds of passages."""

    passages: np.ndarray
    entities: np.ndarray

    def __len__(self) -> int:
        return len(self.passages)


def second_hop(graph: EntityGraph, passage: int) -> Bridges:
    """The passages of the other articles whose title ``passage`` names (as text or as a
    link), each once, in the order the names come: where a reader would go next. Sharing any
    other entity does not make a bridge: measured on SQuAD, such hops between unrelated
    articles displace the right passage, and on HotpotQA they add nothing the titles do not."""
    own = graph.article_of[passage]
    named = graph.neighbours(passage)
    titles = [
        int(entity)
        for entity in named[(named >= len(graph.passages)) & (named != graph.title_entity[own])]
        if int(entity) in graph.about
    ]
    if not titles:
        return Bridges(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    passages = np.concatenate([graph.about[entity] for entity in titles])
    entities = np.repeat(titles, [len(graph.about[entity]) for entity in titles])
    elsewhere = graph.article_of[passages] != own
    passages, entities = passages[elsewhere], entities[elsewhere]
    first = np.sort(np.unique(passages, return_index=True)[1])
    return Bridges(passages[first], entities[first])


def personalized_pagerank(
    graph: EntityGraph,
    seeds: dict[int, float],
    damping: float = 0.5,
    tolerance: float = PAGERANK_TOLERANCE,
) -> np.ndarray:
    """Visit probabilities of a walk that follows an edge with probability ``damping`` and
    jumps back to the seeds (weighted) otherwise; all zeros without seeds.

    Power iteration from the seeds: after k steps, what is still missing is the weight of walks
    longer than k, at most damping**k, so the iteration stops once that is below
    ``tolerance`` (8 steps at damping 0.5) instead of converging to 1e-8 (20 steps): on the
    Python docs pack the 20 passages it ranks first were the same for every question tried.

    The walk runs on the seeds' neighbourhood only (:func:`walk_nodes`): every node k steps
    can reach, so on a pack whose neighbourhoods fit in ``MAX_WALK_NODES`` the result is the
    whole graph's, and on any pack a query costs what that neighbourhood holds, not the graph.
    """
    scores = np.zeros(graph.size, dtype=np.float32)
    total = sum(w for w in seeds.values() if w > 0)
    if total <= 0:
        return scores
    steps = math.ceil(math.log(tolerance) / math.log(damping)) if 0 < damping < 1 else 1
    steps = min(steps, MAX_PAGERANK_STEPS)
    nodes = walk_nodes(graph, [n for n, w in seeds.items() if w > 0], steps)
    position = {int(node): at for at, node in enumerate(nodes)}
    transition = graph.transition[nodes][:, nodes]
    restart = np.zeros(len(nodes), dtype=np.float32)
    for node, weight in seeds.items():
        if weight > 0:
            restart[position[node]] += weight / total
    jump = np.float32(1.0 - damping) * restart
    # Only a seed can be a node without edges (nothing reaches one); what the walk puts there
    # has nowhere to go, so it returns to the seeds. Without such a seed no mass is lost.
    stranded = any(graph.adjacency.indptr[n + 1] == graph.adjacency.indptr[n] for n in seeds)
    local = restart.copy()
    for _ in range(steps):
        spread = transition @ local
        spread *= np.float32(damping)
        spread += jump
        if stranded:
            spread += np.float32(1.0 - spread.sum()) * restart
        local = spread
    scores[nodes] = local
    return scores


def walk_nodes(graph: EntityGraph, seeds: list[int], steps: int) -> np.ndarray:
    """The nodes a walk of ``steps`` edges from ``seeds`` can reach, ascending, nearest first
    when there are more than ``MAX_WALK_NODES``; an entity joined to more than
    ``MAX_EXPANDED_PASSAGES`` passages is reached but not walked through (a generic
    entity such as "United States" or "Python" would bring in most of the pack and says
    nothing about the question)."""
    indptr, indices = graph.adjacency.indptr, graph.adjacency.indices
    offset = len(graph.passages)
    visited = np.zeros(graph.size, dtype=bool)  # calloc'd: untouched pages cost nothing
    taken = 0
    frontier = np.unique(np.asarray(seeds, dtype=np.int64))
    for _ in range(steps + 1):
        visited[frontier] = True
        taken += len(frontier)
        if taken >= MAX_WALK_NODES:
            break
        # An entity joined to this many passages (by name or by structure) is generic.
        generic = (frontier >= offset) & (
            indptr[frontier + 1] - indptr[frontier] > MAX_EXPANDED_PASSAGES
        )
        walked = frontier[~generic]
        if not len(walked):
            break
        starts, ends = indptr[walked], indptr[walked + 1]
        counts = ends - starts
        steps_in = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        reached = np.asarray(indices[np.repeat(starts, counts) + steps_in], dtype=np.int64)
        frontier = np.unique(reached[~visited[reached]])[: MAX_WALK_NODES - taken]
        if not len(frontier):
            break
    return np.flatnonzero(visited)


def linked_entities(graph: EntityGraph, text: str) -> list[tuple[int, str]]:
    """The entities a text names: (entity node, the words that named it), longest name first
    at each position, each entity once. Names are compared normalised (see
    kpack.text.normalize_entity), so case, accents and plurals don't matter."""
    words = name_words(text)
    found: dict[int, str] = {}
    at = 0
    while at < len(words):
        step = 1
        for length in range(min(graph.longest_name, len(words) - at), 0, -1):
            phrase = " ".join(words[at : at + length])
            node = graph.entity_node(phrase)
            if node is not None:
                found.setdefault(node, phrase)
                step = length
                break
        at += step
    return list(found.items())


def _inflow(graph: EntityGraph, scores: np.ndarray, node: int) -> tuple[np.ndarray, np.ndarray]:
    """(neighbour nodes, the PageRank each sends to ``node`` in one step)."""
    start, end = graph.transition.indptr[node], graph.transition.indptr[node + 1]
    sources = graph.transition.indices[start:end]
    return sources, scores[sources] * graph.transition.data[start:end]


def strongest_path(
    graph: EntityGraph, scores: np.ndarray, node: int, seeds: dict[int, float]
) -> tuple[int | None, int | None]:
    """How most of a passage's PageRank reached it: (the entity it came through, the seed
    passage that entity got most of its own from), the second None when the entity is itself
    a seed (the question named it); (None, None) when no entity sent it anything."""
    sources, flows = _inflow(graph, scores, node)
    entities = sources >= len(graph.passages)
    if not entities.any() or flows[entities].max() <= 0:
        return None, None
    entity = int(sources[entities][np.argmax(flows[entities])])
    if entity in seeds:
        return entity, None
    sources, flows = _inflow(graph, scores, entity)
    passages = (sources < len(graph.passages)) & (sources != node)
    seeded = passages & np.isin(sources, list(seeds))
    pool = seeded if seeded.any() else passages
    if not pool.any():
        return entity, None
    return entity, int(sources[pool][np.argmax(flows[pool])])
