"""Opening a published pack for reading: resolved once, cached per process.

A pack is opened by name (under the packs folder; KPACK_PACKS_DIR overrides) or by the path
of its folder. The ``current`` version is resolved once, so the database, manifest and model
all belong to one version even while a build publishes the next; a newer version is picked
up by the next ``open_pack`` call. What every query needs about sections and articles (titles,
headings, PageRank, section vectors) is read once here, so a query touches Kuzu only for
index lookups.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import kuzu
import numpy as np

from kpack import settings
from kpack.embedding import encode, load_model
from kpack.graphdb import connect
from kpack.packs import PackError, current_version, pack_dir


class PackNotReady(PackError):
    """The pack exists but cannot be read: never built, or its files are damaged."""


@dataclass
class Article:
    url: str
    title: str
    category: str
    pagerank: float


@dataclass
class SectionInfo:
    section_id: str
    article_url: str
    heading: str
    title: str
    content: str
    word_count: int


@dataclass
class OpenPack:
    name: str
    folder: Path
    version_dir: Path
    manifest: dict
    db: kuzu.Database
    conn: kuzu.Connection
    articles: dict[str, Article] = field(default_factory=dict)
    sections: dict[str, SectionInfo] = field(default_factory=dict)
    section_ids: list[str] = field(default_factory=list)
    section_vectors: np.ndarray | None = None
    sections_of: dict[str, list[int]] = field(default_factory=dict)
    chunk_text: dict[str, str] = field(default_factory=dict)
    chunk_row: dict[str, int] = field(default_factory=dict)  # chunk_id -> row of chunk_vectors
    chunk_vectors: np.ndarray | None = None
    neighbors: dict[str, list[str]] = field(default_factory=dict)  # LINKS_TO, both directions
    article_entities: dict[str, list[dict]] = field(default_factory=dict)  # most mentioned first
    section_facts: dict[str, list[str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def model_name(self) -> str:
        return self.manifest["embedding"]["model"]

    def embed(self, texts: list[str]) -> np.ndarray:
        return encode(load_model(self.model_name), texts)

    def query(self, cypher: str, params: dict | None = None) -> list[list]:
        # A Kuzu connection runs one statement at a time; threads of one process share it.
        with self.lock:
            return self.conn.execute(cypher, params or {}).get_all()


_open: dict[Path, OpenPack] = {}
_lock = threading.Lock()


def pack_folder_of(db_path: str | Path) -> str | Path:
    """Accept a pack name, a pack folder, or the path of its pack.db (as the seed's examples do)."""
    path = Path(db_path)
    if path.name == "pack.db":
        path = path.parent
        while path.name != ".versions" and path.parent != path and not (path / "urls.txt").exists():
            path = path.parent
        return path.parent if path.name == ".versions" else path
    return db_path


def resolve_folder(pack: str | Path) -> Path:
    pack = pack_folder_of(pack)
    text = str(pack)
    if isinstance(pack, Path) or "/" in text:
        folder = Path(pack)
        if not (folder / "urls.txt").is_file():
            raise PackError(f"{folder} is not a pack folder (it has no urls.txt)")
        return folder.resolve()
    return pack_dir(text, settings.packs_dir())


def open_pack(pack: str | Path) -> OpenPack:
    folder = resolve_folder(pack)
    version = current_version(folder)
    if version is None:
        raise PackNotReady(
            f"pack {folder.name!r} has not been built yet: run `kpack build {folder.name}`"
        )
    with _lock:
        if version not in _open:
            _open[version] = _load(folder, version)
        return _open[version]


def _load(folder: Path, version: Path) -> OpenPack:
    try:
        manifest = json.loads((version / "manifest.json").read_text())
        db, conn = connect(version / "pack.db", read_only=True)
        opened = OpenPack(folder.name, folder, version, manifest, db, conn)
        _read_tables(opened)
    except (OSError, json.JSONDecodeError, RuntimeError, KeyError) as exc:
        raise PackNotReady(
            f"pack {folder.name!r} version {version.name} cannot be opened ({exc}); "
            f"rebuild it with `kpack build {folder.name}`"
        ) from exc
    return opened


def _read_tables(pack: OpenPack) -> None:
    for url, title, category, rank in pack.query(
        "MATCH (a:Article) RETURN a.url, a.title, a.category, a.pagerank"
    ):
        pack.articles[url] = Article(url, title, category, rank or 0.0)
    rows = pack.query(
        "MATCH (s:Section) RETURN s.section_id, s.article_url, s.heading_path, s.title, "
        "s.content, s.word_count, s.embedding ORDER BY s.section_id"
    )
    vectors = []
    for index, (sid, url, heading, title, content, words, vector) in enumerate(rows):
        pack.sections[sid] = SectionInfo(sid, url, heading, title, content, words)
        pack.section_ids.append(sid)
        pack.sections_of.setdefault(url, []).append(index)
        vectors.append(vector)
    dim = pack.manifest["embedding"]["dimension"] or 0
    pack.section_vectors = np.asarray(vectors, dtype=np.float32).reshape(len(vectors), dim)
    chunk_vectors = []
    for row, (chunk_id, content, vector) in enumerate(
        pack.query("MATCH (c:Chunk) RETURN c.chunk_id, c.content, c.embedding ORDER BY c.chunk_id")
    ):
        pack.chunk_text[chunk_id] = content
        pack.chunk_row[chunk_id] = row
        chunk_vectors.append(vector)
    pack.chunk_vectors = np.asarray(chunk_vectors, dtype=np.float32).reshape(
        len(chunk_vectors), dim
    )
    for source, target in pack.query(
        "MATCH (a:Article)-[:LINKS_TO]->(b:Article) RETURN a.url, b.url"
    ):
        pack.neighbors.setdefault(source, []).append(target)
        pack.neighbors.setdefault(target, []).append(source)
    for url, name, kind, description in pack.query(
        "MATCH (a:Article)-[:HAS_ENTITY]->(e:Entity) WHERE e.type <> 'topic' "
        "RETURN a.url, e.name, e.type, e.description ORDER BY e.mention_count DESC, e.name"
    ):
        pack.article_entities.setdefault(url, []).append(
            {"name": name, "type": kind, "description": description}
        )
    for section_id, content in pack.query(
        "MATCH (f:Fact) RETURN f.section_id, f.content ORDER BY f.fact_id"
    ):
        pack.section_facts.setdefault(section_id, []).append(content)
