"""The data contracts, declared once: Parquet schemas of every intermediate and the Kuzu schema.

The IO manager conforms every asset output to its schema here, the graph loader derives its
COPY statements from the Kuzu tables here, and the query side reads the same names.
Every row that comes from content carries a ``content_hash`` so later builds can tell what
changed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from urllib.parse import quote, urldefrag

import pyarrow as pa

STR = pa.string()
I32 = pa.int32()
F64 = pa.float64()
EMBEDDING = pa.list_(pa.float32())
# What a URL fragment may hold as it is (RFC 3986): an id like "json.dump" or "sub-commands"
# stays readable, a space or a "#" in one is escaped.
FRAGMENT_SAFE = "!$&'()*+,;=:@/?-._~"

# How a page came into the pack (kpack.ingest.crawl), on its fetched_pages row and its Article.
CRAWL_COLUMNS = (
    ("seed", STR),  # the urls.txt URL (page, seed or sitemap) the page came from
    ("expansion_depth", I32),  # link hops from the seed (0: the seed or a sitemap's page)
    ("expansion_state", STR),  # listed | expanded | discovered | failed | kept
)

PARQUET_SCHEMAS: dict[str, pa.Schema] = {
    "fetched_pages": pa.schema(
        [
            ("url", STR),  # as listed in urls.txt (file: paths made absolute)
            ("line_no", I32),
            ("final_url", STR),
            ("redirects", pa.list_(STR)),
            ("status", I32),  # the HTTP status; 304 when the stored copy was reused
            # new | changed | unchanged | failed, against the previous fetch of this pack
            # (unchanged: a 304, or a 200 with the same content hash)
            ("change", STR),
            ("content_type", STR),
            ("format", STR),  # html | markdown | text
            ("etag", STR),
            ("last_modified", STR),
            ("content_hash", STR),
            ("fetched_at", pa.timestamp("us", tz="UTC")),
            ("elapsed_ms", F64),
            ("title_hint", STR),
            ("body", STR),  # main content: cleaned HTML, or Markdown/plain text
            # The hrefs a crawl follows from the page: its content's, then its navigation's
            # (which the body leaves out), kept so a 304 leads where the page led before.
            ("page_links", pa.list_(STR)),
            ("error", STR),
            *CRAWL_COLUMNS,
        ]
    ),
    "articles": pa.schema(
        [
            ("url", STR),
            ("title", STR),
            ("final_url", STR),
            ("category", STR),
            ("word_count", I32),
            ("section_count", I32),
            ("content_hash", STR),
            *CRAWL_COLUMNS,
        ]
    ),
    "sections": pa.schema(
        [
            ("section_id", STR),
            ("article_url", STR),
            ("article_title", STR),
            ("section_index", I32),
            ("title", STR),
            ("heading_path", STR),
            ("level", I32),
            ("content", STR),
            ("word_count", I32),
            ("content_hash", STR),
            # The API identifiers the section defines (a signature, a heading written as
            # code: kpack.ingest.html's marks), the anchors of the documentation graph.
            ("defines", pa.list_(STR)),
            # The id of the page's HTML (a Markdown heading's slug) where the section starts:
            # its deep link's fragment (section_url); "" for the page's top.
            ("anchor", STR),
        ]
    ),
    "links": pa.schema(
        [("source_url", STR), ("target_url", STR), ("anchor_text", STR), ("link_type", STR)]
    ),
    # A link from the section it is written in to the section holding its anchor (the
    # target page's first section for a link without one): the documentation graph.
    "section_links": pa.schema(
        [("source_section_id", STR), ("target_section_id", STR), ("anchor", STR)]
    ),
    "chunks": pa.schema(
        [
            ("chunk_id", STR),
            ("article_url", STR),
            ("article_title", STR),
            ("section_id", STR),
            ("section_index", I32),
            ("chunk_index", I32),
            ("content", STR),
            ("word_pieces", I32),
            ("content_hash", STR),
        ]
    ),
    "entities": pa.schema(
        [
            ("entity_id", STR),  # the normalised name: the dedup key across the pack
            ("name", STR),
            ("type", STR),
            ("description", STR),
            ("mention_count", I32),
        ]
    ),
    "entity_mentions": pa.schema([("article_url", STR), ("section_id", STR), ("entity_id", STR)]),
    "relations": pa.schema(
        [
            ("source_id", STR),
            ("relation", STR),
            ("target_id", STR),
            ("context", STR),
            ("article_url", STR),
            ("section_id", STR),
        ]
    ),
    "facts": pa.schema(
        [
            ("fact_id", STR),
            ("article_url", STR),
            ("section_id", STR),
            ("entity_id", STR),
            ("content", STR),
        ]
    ),
    "embeddings": pa.schema([("content_hash", STR), ("embedding", EMBEDDING)]),
    # One embedding step's share of the embeddings (kpack.ingest.shards); fresh: encoded by
    # this build, not reused from the cache.
    "embedding_shard": pa.schema(
        [("content_hash", STR), ("embedding", EMBEDDING), ("fresh", pa.bool_())]
    ),
    "pagerank": pa.schema([("url", STR), ("pagerank", F64), ("pagerank_raw", F64)]),
}


# The schema-metadata key under which a stage's facts travel with its table (see with_facts).
FACTS_KEY = b"kpack.facts"


def with_facts(table: pa.Table, facts: dict) -> pa.Table:
    """``table`` carrying its stage's facts (duration, counts, LLM usage, the digest of its
    inputs) as schema metadata, which Parquet keeps: a later stage reads them with the table
    it is handed, not from the event log of some run."""
    metadata = {**(table.schema.metadata or {}), FACTS_KEY: json.dumps(facts).encode()}
    return table.replace_schema_metadata(metadata)


def facts_of(table: pa.Table | None) -> dict:
    """The facts ``with_facts`` put on a table; {} when there is none (or no table)."""
    raw = ((table.schema.metadata or {}) if table is not None else {}).get(FACTS_KEY)
    return json.loads(raw) if raw else {}


@dataclass(frozen=True)
class StagedBuild:
    """What pack_graph hands pack_manifest (as JSON, through the IO manager): the staged
    database's facts, and the facts of the stages it was built from, by stage."""

    previous_version: int | None
    # kpack.changes.sources_fingerprint of the fetch this build started from (None: a fetch
    # stored by a kpack that did not record it), which the manifest records
    sources_fingerprint: str | None
    embedding_dimension: int
    changes: dict
    invalid_lines: list[str]
    stages: dict[str, dict] = field(default_factory=dict)


def conform(name: str, data: pa.Table | list[dict]) -> pa.Table:
    """Cast an asset's output to its declared schema; a missing or mistyped column fails here."""
    schema = PARQUET_SCHEMAS[name]
    if isinstance(data, list):
        return pa.Table.from_pylist(data, schema=schema)
    missing = set(schema.names) - set(data.column_names)
    if missing:
        raise ValueError(f"{name}: output lacks columns {sorted(missing)}")
    return data.select(schema.names).cast(schema)


@dataclass(frozen=True)
class NodeTable:
    name: str
    columns: tuple[tuple[str, str], ...]  # (column, Kuzu type); the first is the primary key

    def ddl(self, dim: int) -> str:
        cols = ", ".join(f"{c} {t.format(dim=dim)}" for c, t in self.columns)
        return f"CREATE NODE TABLE {self.name}({cols}, PRIMARY KEY ({self.columns[0][0]}))"


@dataclass(frozen=True)
class RelTable:
    name: str
    source: str
    target: str
    columns: tuple[tuple[str, str], ...] = ()

    def ddl(self, dim: int) -> str:
        props = "".join(f", {c} {t}" for c, t in self.columns)
        return f"CREATE REL TABLE {self.name}(FROM {self.source} TO {self.target}{props})"


VECTOR = "FLOAT[{dim}]"
KUZU_TYPES = {STR: "STRING", I32: "INT32", F64: "DOUBLE"}
Columns = tuple[tuple[str, str], ...]


def kuzu_columns(table: str, *names: str, drop: tuple[str, ...] = ()) -> Columns:
    """(column, Kuzu type) of a Parquet table's columns, typed from its Arrow schema: all of
    them in schema order (less ``drop``), or the ``names`` given."""
    schema = PARQUET_SCHEMAS[table]
    chosen = names or [n for n in schema.names if n not in drop]
    return tuple((name, KUZU_TYPES[schema.field(name).type]) for name in chosen)


# The seed's data model (Article keyed by url, which is unique where titles are not). Node and
# edge properties are the Parquet columns of the same name; only the embedding vector (its
# dimension is the model's) and Category (counted at load time) are declared here.
KUZU_NODES = (
    NodeTable(
        "Article",
        # pagerank is normalised to [0, 1]; pagerank_raw is Kuzu's score.
        kuzu_columns("articles") + kuzu_columns("pagerank", drop=("url",)),
    ),
    NodeTable("Section", (*kuzu_columns("sections", drop=("defines",)), ("embedding", VECTOR))),
    NodeTable("Chunk", (*kuzu_columns("chunks", drop=("word_pieces",)), ("embedding", VECTOR))),
    NodeTable("Entity", kuzu_columns("entities")),
    NodeTable("Fact", kuzu_columns("facts", "fact_id", "content", "section_id")),
    NodeTable("Category", (("name", "STRING"), ("article_count", "INT32"))),
)

KUZU_RELS = (
    RelTable("HAS_SECTION", "Article", "Section", kuzu_columns("sections", "section_index")),
    RelTable(
        "HAS_CHUNK", "Article", "Chunk", kuzu_columns("chunks", "section_index", "chunk_index")
    ),
    RelTable("LINKS_TO", "Article", "Article", kuzu_columns("links", "link_type")),
    RelTable("IN_CATEGORY", "Article", "Category"),
    RelTable("HAS_ENTITY", "Article", "Entity"),
    RelTable("HAS_FACT", "Article", "Fact"),
    RelTable(
        "ENTITY_RELATION", "Entity", "Entity", kuzu_columns("relations", "relation", "context")
    ),
    # The entity-passage graph: which passage names which entity (kpack.ingest.mentions
    # works it out, kpack.graph walks it).
    RelTable("MENTIONS", "Chunk", "Entity"),
    # The documentation graph: section links with their anchors, and the section where an
    # API identifier (an ``api`` entity) is defined.
    RelTable("LINKS_TO_SECTION", "Section", "Section", kuzu_columns("section_links", "anchor")),
    RelTable("DEFINES", "Section", "Entity"),
)


def passage_text(heading_path: str, content: str) -> str:
    """The text a section or chunk is embedded and hashed as: its heading path, then its body."""
    return f"{heading_path}\n{content}"


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def stable_id(*parts: str) -> str:
    return hashlib.sha1("\x1f".join(parts).encode("utf-8")).hexdigest()[:16]


# Passage ids. A section id is ``<stable_id(article url)>-<section index:04d>``; a chunk id is
# ``<section id>-<chunk index:03d>``, so a chunk names its section and ids sort in reading order.


def section_id(article_url: str, section_index: int) -> str:
    return f"{stable_id(article_url)}-{section_index:04d}"


def chunk_id(section: str, chunk_index: int) -> str:
    return f"{section}-{chunk_index:03d}"


def section_url(article_url: str, anchor: str | None) -> str:
    """The deep link of a section: its page's URL with the section's anchor as the fragment
    (the page's URL for a section without one)."""
    page = urldefrag(article_url).url
    return f"{page}#{quote(anchor, safe=FRAGMENT_SAFE)}" if anchor else page


def section_of_chunk(chunk: str) -> str:
    """The section id a chunk id was built from."""
    return chunk.rsplit("-", 1)[0]
