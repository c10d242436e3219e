"""The entity-passage graph of a pack and personalized PageRank over it, as queries use them
(issue 10; retrieval.entity_graph runs them).

Nodes are the pack's passages (chunks) and its entities (kpack.ingest.extraction: names,
terms, code identifiers and the pack's own article titles, deduplicated by normalised name,
kpack.text.normalize_entity).
Edges join a passage to every entity it mentions (the MENTIONS edge of kpack.contracts), a
passage to the title entity of every article its article links to (LINKS_TO), and two entities
that a relation joins. Personalized PageRank seeded by the entities a question names and by the
passages first-hop search found spreads their weight along those edges, so a passage that
shares a bridge entity with a first-hop hit ranks even when the question's own words do not
reach it (HippoRAG 2, Gutiérrez et al. 2025).

Everything here is numpy (and Arrow to build): no Dagster, no Kuzu, deterministic. The build records which
chunk mentions which entity (kpack.ingest.mentions, the MENTIONS edges), builds the
:class:`EntityGraph` and stores it as CSR arrays with the version (kpack.entity_graph_files), which a
reader maps.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

import numpy as np

from kpack.text import folded_words

if TYPE_CHECKING:  # imported where used: `import retrieval` should not pay for it
    import pyarrow as pa

MAX_LINKED_WORDS = 8  # longest entity name matched in a question, in words
# Personalized PageRank's local push (see personalized_pagerank): a node passes its residual
# on once it reaches this times its number of neighbours ...
PUSH_EPSILON = 1e-5
# ... and a query pushes along at most this many edges (the push's bound is 1 / (epsilon *
# (1 - damping)) = 200,000 at damping 0.5; this only guards a damping near 1).
MAX_PUSHED_EDGES = 1_000_000
GRAPH_BLOCK_VALUES = 8_000_000  # graph values decoded at a time when the graph is built


@dataclass(frozen=True)
class Csr:
    """A sparse square matrix in compressed sparse rows: row ``i`` holds ``data[indptr[i] :
    indptr[i + 1]]`` at columns ``indices[...]`` (ascending). Plain arrays, memory-mapped as
    a version stores them: scipy would check and copy a mapped matrix, and importing it costs a
    fresh process 0.4 s for the few rows a query reads."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray

    @property
    def size(self) -> int:
        return len(self.indptr) - 1

    def row(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        """(columns, values) of one row."""
        start, end = self.indptr[node], self.indptr[node + 1]
        return self.indices[start:end], self.data[start:end]

    @cached_property
    def rows(self) -> np.ndarray:
        """The row of every stored value."""
        return np.repeat(np.arange(self.size, dtype=np.int32), np.diff(self.indptr))


def spans(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The positions ``start, start + 1, ..., start + count - 1`` of every span, in order."""
    total = int(counts.sum())
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(np.asarray(starts, dtype=np.int64), counts) + (np.arange(total) - offsets)


@dataclass(frozen=True)
class EntityGraph:
    """Passages and entities as one graph, with the transition matrix PageRank walks.

    Node ``i < len(passages)`` is passage ``passages[i]``; node ``len(passages) + j`` is entity
    ``entities[j]`` (its normalised name; ``names[j]`` is how the pack writes it). Every passage
    belongs to an article (``article_of[i]``, an index into the passages' articles in order of
    first appearance); an article whose title is an entity of the pack has that entity node in
    ``title_entity`` (else -1).
    """

    passages: Sequence[str]
    entities: Sequence[str]
    names: Sequence[str]
    article_of: np.ndarray  # per passage: index of its article
    title_entity: np.ndarray  # per article: node of its title entity, or -1
    adjacency: Csr  # symmetric, weighted
    transition: Csr  # column-stochastic: transition @ r spreads r one step
    passages_of_entity: np.ndarray  # per entity: how many passages name it
    about: SortedGroups  # title entity node -> the passages of its articles
    entity_index: EntityIndex
    longest_name: int  # in words

    @property
    def size(self) -> int:
        return len(self.passages) + len(self.entities)

    def entity_node(self, key: str) -> int | None:
        return self.entity_nodes([key]).get(key)

    def entity_nodes(self, keys: Collection[str]) -> dict[str, int]:
        """The entity node of each key the graph has (the others are left out)."""
        offset = len(self.passages)
        return {key: offset + row for key, row in self.entity_index.found_many(keys).items()}

    def name_of(self, node: int) -> str:
        """How the pack writes an entity node's name."""
        return self.names[node - len(self.passages)]

    def mentions_of(self, node: int) -> int:
        """How many passages name an entity node (spell it: not those that sit in its article
        or link to it, see build_entity_graph)."""
        return int(self.passages_of_entity[node - len(self.passages)])

    def neighbours(self, node: int) -> np.ndarray:
        return self.adjacency.row(node)[0]


Pairs = Iterable[tuple[str, str]]
Mentions = Iterable[tuple[str, str, bool]]  # (passage id, entity key, whether it spells it)
MENTION_TYPES = ("string", "string", "bool")


def build_entity_graph(
    passages: Pairs | pa.Table,
    entities: Pairs | pa.Table,
    mentions: Mentions | pa.Table,
    titles: dict[str, str] | None = None,
    links: Pairs | pa.Table = (),
    relations: Pairs | pa.Table = (),
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
    pair given twice counts once, at its highest weight.

    Each argument is tuples, or an Arrow table of their columns (how the build passes a large
    pack's millions of mentions): the work is array work over node numbers, with no Python
    object per edge, so a million-passage pack builds in seconds and a few GB.
    """
    import pyarrow.compute as pc

    from kpack.mapped_tables import Column

    passage_ids, passage_articles = _columns(passages)
    entity_keys, entity_names = _columns(entities)
    passage_ids, entity_keys = passage_ids.combine_chunks(), entity_keys.combine_chunks()
    title_of = _TitleEntities(titles or {}, entity_keys, len(passage_ids))
    size = len(passage_ids) + len(entity_keys)
    articles = pc.unique(passage_articles)
    article_of = rows_of(passage_articles, articles)
    title_entity = title_of.nodes(articles)
    mention_passages, mention_keys, mention_named = _columns(mentions, MENTION_TYPES)
    mention_from = rows_of(mention_passages, passage_ids)
    mention_to = title_of.entity_nodes(mention_keys)
    # A page calls its subject by part of its title ("Leland" on "Leland, North Carolina"):
    # that names the page itself, and must not join it to every other Leland.
    mention_article = np.where(mention_from >= 0, article_of[mention_from], -1)
    own = np.isin(mention_article.astype(np.int64) * size + mention_to, title_of.parts(articles))
    titled = np.flatnonzero(title_entity[article_of] >= 0)
    link_sources, link_targets = _columns(links)
    relation_left, relation_right = _columns(relations)
    adjacency = _symmetric(
        [
            (mention_from[~own], mention_to[~own], 1.0),
            (titled, title_entity[article_of[titled]], 1.0),
            (
                *_link_edges(
                    article_of, rows_of(link_sources, articles), title_of.nodes(link_targets)
                ),
                1.0,
            ),
            (
                title_of.entity_nodes(relation_left),
                title_of.entity_nodes(relation_right),
                relation_weight,
            ),
        ],
        size,
    )
    rows = adjacency.rows
    # float64 whatever the input: with no edge at all (a pack of one page with a title and no
    # text) bincount's empty sum is int64, which divide cannot write its floats into.
    degree = np.bincount(rows, weights=adjacency.data, minlength=size).astype(np.float64)
    inverse = np.divide(1.0, degree, out=np.zeros_like(degree), where=degree > 0)
    # Column j of the transition holds where node j's weight goes: A D^-1 (A is symmetric).
    # float32: PageRank needs no more, and the walk's matrix-vector product runs twice as fast.
    transition = Csr(
        adjacency.indptr,
        adjacency.indices,
        (adjacency.data * inverse[adjacency.indices]).astype(np.float32),
    )
    offset = len(passage_ids)
    about_keys = title_entity[article_of[titled]]
    order = np.argsort(about_keys, kind="stable")
    keys, counts = np.unique(about_keys, return_counts=True)
    key_words = pc.list_value_length(pc.utf8_split_whitespace(entity_keys))
    return EntityGraph(
        passages=Column(passage_ids),
        entities=Column(entity_keys),
        names=Column(entity_names),
        article_of=article_of,
        title_entity=title_entity,
        adjacency=adjacency,
        transition=transition,
        passages_of_entity=_naming_counts(
            mention_from, mention_to - offset, _flags(mention_named), len(entity_keys)
        ),
        about=SortedGroups(keys, np.concatenate([[0], np.cumsum(counts)]), titled[order]),
        entity_index=KeyIndex(entity_keys),
        longest_name=min(MAX_LINKED_WORDS, int(pc.max(key_words).as_py() or 0)),
    )


def _columns(
    tuples: Iterable[tuple] | pa.Table, types: Sequence[str] = ("string", "string")
) -> tuple[pa.ChunkedArray, ...]:
    """The columns of tuples (one per type, an Arrow type alias), as Arrow columns (a table's
    are not copied)."""
    import pyarrow as pa

    if isinstance(tuples, pa.Table):
        return tuple(tuples.column(at) for at in range(len(types)))
    listed = list(tuples)
    return tuple(
        pa.chunked_array([[row[at] for row in listed]], pa.type_for_alias(alias))
        for at, alias in enumerate(types)
    )


def _flags(column: pa.ChunkedArray) -> np.ndarray:
    """A boolean column as a numpy array (a missing flag is false)."""
    import pyarrow.compute as pc

    return pc.fill_null(column, False).to_numpy(zero_copy_only=False).astype(bool)


def _naming_counts(
    passages: np.ndarray, entities: np.ndarray, named: np.ndarray, count: int
) -> np.ndarray:
    """Per entity: the distinct passages that name it (``named`` mentions of known nodes)."""
    kept = named & (passages >= 0) & (entities >= 0)
    stride = int(passages.max(initial=0)) + 1
    pairs = np.unique(entities[kept].astype(np.int64) * stride + passages[kept])
    return np.bincount(pairs // stride, minlength=count)


def rows_of(values: pa.Array | pa.ChunkedArray, among: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The row of each value in ``among`` (its first), -1 for a value not there (int32)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(among, pa.ChunkedArray):
        among = among.combine_chunks()
    found = pc.fill_null(pc.index_in(values, value_set=among), -1)
    return found.to_numpy(zero_copy_only=False).astype(np.int32)


class _TitleEntities:
    """Entity nodes of keys, and of the titles of articles (``titles``: article -> key)."""

    def __init__(self, titles: dict[str, str], entity_keys: pa.Array, offset: int) -> None:
        import pyarrow as pa

        self.titles = titles
        self.articles = pa.array(list(titles), pa.string())
        self.keys = pa.array(list(titles.values()), pa.string())
        self.entity_keys = entity_keys
        self.offset = offset

    def entity_nodes(self, keys: pa.Array) -> np.ndarray:
        """The node of each entity key, -1 for a key that is no entity."""
        rows = rows_of(keys, self.entity_keys)
        return np.where(rows >= 0, rows + self.offset, -1)

    def nodes(self, articles: pa.Array) -> np.ndarray:
        """The node of each article's title entity, -1 without one."""
        import pyarrow.compute as pc

        return self.entity_nodes(pc.take(self.keys, pc.index_in(articles, self.articles)))

    def parts(self, articles: pa.Array) -> list[int]:
        """``article row * size + entity node`` of every entity that is a proper part of an
        article's title (its words, whole, as ``f" {key} " in f" {title} "`` finds them)."""
        import pyarrow as pa

        size = self.offset + len(self.entity_keys)
        rows, phrases = [], []
        for row, article in enumerate(articles.to_pylist()):
            words = self.titles.get(article, "").split(" ")
            for start in range(len(words)):
                for end in range(start + 1, len(words) + 1):
                    if end - start < len(words):
                        rows.append(row)
                        phrases.append(" ".join(words[start:end]))
        nodes = self.entity_nodes(pa.array(phrases, pa.string()))
        found = nodes >= 0
        return (np.asarray(rows, dtype=np.int64)[found] * size + nodes[found]).tolist()


def _link_edges(
    article_of: np.ndarray, sources: np.ndarray, target_titles: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(passage, title entity): every passage of a linking article to the linked article's
    title entity."""
    known = (sources >= 0) & (target_titles >= 0)
    sources, target_titles = sources[known], target_titles[known]
    members = np.argsort(article_of, kind="stable")  # passages grouped by article
    counts = np.bincount(article_of)
    starts = np.concatenate([[0], np.cumsum(counts)])[sources]
    return members[spans(starts, counts[sources])], np.repeat(target_titles, counts[sources])


def _symmetric(edges: list[tuple[np.ndarray, np.ndarray, float]], size: int) -> Csr:
    """The symmetric adjacency of undirected weighted ``edges`` (node arrays, weight), without
    self-loops or unknown (-1) nodes, each pair once at its highest weight.

    Built by sorting one int64 key per stored value (row, column and weight class packed
    together) in place: a million-passage pack has some 80 million values, and an index
    array per sort would double what it holds."""
    weights = sorted({weight for _, _, weight in edges}, reverse=True)
    taken = np.zeros(0, dtype=np.int64)  # the pairs placed so far, as low * size + high
    keys = []
    for number, weight in enumerate(weights):  # the highest weight first: a pair keeps it
        pairs = np.unique(np.concatenate([_pairs(a, b, size) for a, b, w in edges if w == weight]))
        pairs = pairs[~sorted_lookup(taken, pairs)[1]]
        taken = np.union1d(taken, pairs)
        low, high = pairs // size, pairs % size
        keys += [(low * size + high) * len(weights) + number]
        keys += [(high * size + low) * len(weights) + number]
        del pairs, low, high
    del taken
    key = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
    del keys
    key.sort()
    indptr = np.searchsorted(key, np.arange(size + 1, dtype=np.int64) * size * len(weights))
    indices = np.empty(len(key), dtype=np.int32)
    data = np.empty(len(key), dtype=np.float32)
    values = np.asarray(weights, dtype=np.float32)
    for start in range(0, len(key), GRAPH_BLOCK_VALUES):
        block = key[start : start + GRAPH_BLOCK_VALUES]
        indices[start : start + len(block)] = (block // len(weights)) % size
        data[start : start + len(block)] = values[block % len(weights)]
    return Csr(indptr.astype(np.int64), indices, data)


def _pairs(left: np.ndarray, right: np.ndarray, size: int) -> np.ndarray:
    """Undirected pairs as ``low * size + high``, without self-loops or unknown nodes."""
    left, right = np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64)
    kept = (left >= 0) & (right >= 0) & (left != right)
    left, right = left[kept], right[kept]
    return np.minimum(left, right) * size + np.maximum(left, right)


def sorted_lookup(sorted_values: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``values`` stands in ``sorted_values`` (a position, meaningful where
    found) and whether it is there: one binary search per value, the lookup of every sorted
    array of the graph and its stages."""
    values = np.asarray(values)
    if not len(sorted_values):
        return np.zeros(len(values), dtype=np.int64), np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_values, values), len(sorted_values) - 1)
    return at, sorted_values[at] == values


class EntityIndex(Protocol):
    """Entity key -> its row: KeyIndex in a build, kpack.mapped_tables.RowOf in a reader."""

    def found_many(self, keys: Collection[str]) -> dict[str, int]: ...


class KeyIndex(Mapping[str, int]):
    """Key -> its row in an Arrow string array (a hash lookup per key, no Python dict)."""

    def __init__(self, keys: pa.Array) -> None:
        self.keys = keys

    def found_many(self, keys: Collection[str]) -> dict[str, int]:
        """The row of each key the array holds (the others are left out): one lookup for all."""
        import pyarrow as pa

        wanted = list(keys)
        rows = rows_of(pa.array(wanted, pa.string()), self.keys).tolist()
        return {key: row for key, row in zip(wanted, rows, strict=True) if row >= 0}

    def __getitem__(self, key: str) -> int:
        row = self.found_many([key]).get(key)
        if row is None:
            raise KeyError(key)
        return row

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys.to_pylist())

    def __len__(self) -> int:
        return len(self.keys)


class SortedGroups(Mapping[int, np.ndarray]):
    """Node -> an array of nodes, as CSR over sorted keys (how a version stores ``about``)."""

    def __init__(self, keys: np.ndarray, offsets: np.ndarray, values: np.ndarray) -> None:
        self.keys, self.offsets, self.values = keys, offsets, values

    def _at(self, key: object) -> int:
        if not isinstance(key, int | np.integer):
            return -1
        at, found = sorted_lookup(self.keys, np.array([key]))
        return int(at[0]) if found[0] else -1

    def __contains__(self, key: object) -> bool:
        return self._at(key) >= 0

    def of_each(self, keys: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """The ``keys`` that have a group, in their order, and each one's group: one search
        for all of them."""
        at, found = sorted_lookup(self.keys, keys)
        return keys[found], [self.values[self.offsets[i] : self.offsets[i + 1]] for i in at[found]]

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
    titles, groups = graph.about.of_each(
        named[(named >= len(graph.passages)) & (named != graph.title_entity[own])]
    )
    if not len(titles):
        return Bridges(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    passages = np.concatenate(groups)
    entities = np.repeat(titles.astype(np.int64), [len(group) for group in groups])
    elsewhere = graph.article_of[passages] != own
    passages, entities = passages[elsewhere], entities[elsewhere]
    first = np.sort(np.unique(passages, return_index=True)[1])
    return Bridges(passages[first], entities[first])


@dataclass(frozen=True)
class Visits:
    """Personalized PageRank's visit probabilities: ``scores[i]`` of node ``nodes[i]`` (nodes
    ascending), every other node 0. Sparse, since a query reaches a few thousand nodes of a
    graph of millions."""

    nodes: np.ndarray
    scores: np.ndarray

    def of(self, nodes: np.ndarray | int) -> np.ndarray:
        """The scores of ``nodes`` (0 for a node the walk did not reach)."""
        wanted = np.atleast_1d(np.asarray(nodes, dtype=np.int64))
        if not len(self.nodes):
            return np.zeros(len(wanted), dtype=np.float32)
        at, found = sorted_lookup(self.nodes, wanted)
        return np.where(found, self.scores[at], 0.0).astype(np.float32)

    def __getitem__(self, node: int) -> float:
        return float(self.of(node)[0])

    def sum(self) -> float:
        return float(self.scores.sum())


def personalized_pagerank(
    graph: EntityGraph,
    seeds: dict[int, float],
    damping: float = 0.5,
    epsilon: float = PUSH_EPSILON,
) -> Visits:
    """Visit probabilities of a walk that follows an edge with probability ``damping`` and
    jumps back to the seeds (weighted) otherwise; nothing without seeds.

    Computed by local push (Andersen, Chung and Lang 2006), all eligible nodes at once: every
    node holds an estimate and a residual (at first, the seeds' weights); a node whose
    residual is at least ``epsilon`` times its number of neighbours keeps ``1 - damping`` of
    it and hands ``damping`` of it to its neighbours by edge weight. What stays below that
    threshold is counted where it is at the end. The work is at most about
    ``1 / (epsilon * (1 - damping))`` edges whatever the size of the graph, and it stays
    near the seeds: an entity that thousands of passages mention (a generic one, such as
    "Python") passes its share on only when it holds a large part of the walk.
    """
    weights = {int(n): w for n, w in seeds.items() if w > 0}
    total = sum(weights.values())
    if total <= 0:
        return Visits(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
    adjacency = graph.adjacency
    seed_nodes = np.array(sorted(weights), dtype=np.int64)
    restart = np.array([weights[n] / total for n in seed_nodes.tolist()])
    # Dense over the graph, but calloc'd: only the pages of nodes the push touches are real.
    estimate = np.zeros(graph.size)
    residual = np.zeros(graph.size)
    residual[seed_nodes] = restart
    touched = [seed_nodes]
    active = seed_nodes
    work = 0
    while len(active) and work < MAX_PUSHED_EDGES:
        neighbours = adjacency.indptr[active + 1] - adjacency.indptr[active]
        pushed = residual[active] >= epsilon * np.maximum(neighbours, 1)
        active, neighbours = active[pushed], neighbours[pushed]
        if not len(active):
            break
        mass = residual[active]
        residual[active] = 0.0
        estimate[active] += (1.0 - damping) * mass
        # A node without edges (only a seed can be one) hands its share back to the seeds.
        stranded = float(mass[neighbours == 0].sum())
        if stranded:
            residual[seed_nodes] += damping * stranded * restart
        at = spans(adjacency.indptr[active], neighbours)
        targets = np.asarray(adjacency.indices[at], dtype=np.int64)
        edge = np.asarray(adjacency.data[at], dtype=np.float64)
        source = np.repeat(np.arange(len(active)), neighbours)
        degree = np.bincount(source, weights=edge, minlength=len(active))
        np.add.at(residual, targets, damping * mass[source] * edge / degree[source])
        work += len(targets)
        touched.append(targets)
        # Only a node whose residual now reaches its threshold is pushed next: filtered before
        # the sort that makes them unique, which was most of a push's time.
        receivers = np.concatenate([targets, seed_nodes if stranded else targets[:0]])
        edges = adjacency.indptr[receivers + 1] - adjacency.indptr[receivers]
        active = np.unique(receivers[residual[receivers] >= epsilon * np.maximum(edges, 1)])
    nodes = np.unique(np.concatenate(touched))
    scores = estimate[nodes] + residual[nodes]  # what was not pushed counts where it is
    reached = scores > 0
    return Visits(nodes[reached], scores[reached].astype(np.float32))


def linked_entities(graph: EntityGraph, text: str) -> list[tuple[int, str]]:
    """The entities a text names: (entity node, the words that named it), longest name first
    at each position, each entity once. Names are compared normalised (see
    kpack.text.normalize_entity), so case, accents and plurals don't matter."""
    words = folded_words(text)
    phrases = [  # per position, (length, phrase) longest first
        [
            (length, " ".join(words[at : at + length]))
            for length in range(min(graph.longest_name, len(words) - at), 0, -1)
        ]
        for at in range(len(words))
    ]
    named = graph.entity_nodes({phrase for here in phrases for _, phrase in here})
    found: dict[int, str] = {}
    at = 0
    while at < len(words):
        step = 1
        for length, phrase in phrases[at]:
            node = named.get(phrase)
            if node is not None:
                found.setdefault(node, phrase)
                step = length
                break
        at += step
    return list(found.items())


def _inflow(graph: EntityGraph, scores: Visits, node: int) -> tuple[np.ndarray, np.ndarray]:
    """(neighbour nodes, the PageRank each sends to ``node`` in one step)."""
    sources, shares = graph.transition.row(node)
    return sources, scores.of(sources) * shares


def strongest_path(
    graph: EntityGraph, scores: Visits, node: int, seeds: dict[int, float]
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
