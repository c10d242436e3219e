"""The file layout of a version's retrieval indexes (issue 20): every file ``indexes/`` may
hold, by name. The build writes them (kpack.index_writer) into the staged version folder;
kpack.store.seal_version stamps the size and SHA-256 of every file into the manifest and
kpack.store.verify_version checks them as it checks pack.db; an archive carries them
(kpack.archive.format). A reader (retrieval.reader.PackReader) maps them without reading any
table row by row:

- ``chunk_vectors.npy`` / ``section_vectors.npy``: float32 unit vectors, one row per chunk
  (section) in id order, mapped by kpack.mapped_tables.load_array;
- ``chunk_vectors.faiss`` / ``section_vectors.faiss``: the approximate-nearest-neighbour
  index over the vectors of a large table (kpack.vector_index);
- ``chunks.arrow``, ``sections.arrow``, ``articles.arrow``, ``article_entities.arrow``,
  ``facts.arrow``, ``entities.arrow``: Arrow IPC files sorted by their key, opened with
  kpack.mapped_tables.load_table (zero copy) and looked up by binary search on the key column
  (kpack.mapped_tables), so a query reads the rows of its top k only; ``*_key_hashes.npy``
  make that search one over integers; ``sections_by_article.npy`` orders the sections by
  article for the same search, and ``links_offsets.npy`` / ``links_targets.npy`` hold the
  article links (both directions) as CSR over article rows;
- ``keyword_*.npy``: the BM25 keyword index (kpack.keyword_index);
- ``graph_*.npy``: the entity-passage graph as CSR arrays (kpack.entity_graph_files);
- ``doc_links.arrow``, ``doc_link_offsets.npy``, ``definitions.arrow``,
  ``definition_vectors.npy`` (and its ``.faiss`` index in a large pack): the documentation
  graph (kpack.docgraph);
- ``identifiers.npy``: the identifiers the passages write (kpack.identifier_index);
- ``sentence_vectors.npy`` / ``sentence_offsets.npy``: every passage's sentences embedded
  apart, as CSR over chunk rows (kpack.sentence_index).

Several processes opening the same version share these pages (read-only maps of one file).
"""

CHUNK_VECTORS = "chunk_vectors.npy"
SECTION_VECTORS = "section_vectors.npy"
CHUNK_ANN = "chunk_vectors.faiss"
SECTION_ANN = "section_vectors.faiss"
CHUNKS = "chunks.arrow"
SECTIONS = "sections.arrow"
SECTIONS_BY_ARTICLE = "sections_by_article.npy"
ARTICLES = "articles.arrow"
ARTICLE_ENTITIES = "article_entities.arrow"
FACTS = "facts.arrow"
LINK_OFFSETS = "links_offsets.npy"
LINK_TARGETS = "links_targets.npy"
KEYWORD_VOCABULARY = "keyword_vocabulary.npy"
KEYWORD_TERM_OFFSETS = "keyword_term_offsets.npy"
KEYWORD_OFFSETS = "keyword_offsets.npy"
KEYWORD_ROWS = "keyword_rows.npy"
KEYWORD_WEIGHTS = "keyword_weights.npy"
KEYWORD_LENGTHS = "keyword_lengths.npy"
ENTITIES = "entities.arrow"
# Keyed tables (sorted by their first column, one row per key) -> their key hashes' file.
KEY_HASHES = {
    CHUNKS: "chunks_key_hashes.npy",
    SECTIONS: "sections_key_hashes.npy",
    ARTICLES: "articles_key_hashes.npy",
    ENTITIES: "entities_key_hashes.npy",
}
LONGEST_NAME_KEY = "longest_name"  # entities.arrow metadata: the longest name, in words
GRAPH_INDPTR = "graph_indptr.npy"
GRAPH_INDICES = "graph_indices.npy"
GRAPH_WEIGHTS = "graph_weights.npy"
GRAPH_TRANSITION = "graph_transition.npy"
GRAPH_ARTICLE_OF = "graph_article_of.npy"
GRAPH_TITLE_ENTITY = "graph_title_entity.npy"
GRAPH_PASSAGES_OF_ENTITY = "graph_passages_of_entity.npy"
GRAPH_ABOUT_KEYS = "graph_about_keys.npy"
GRAPH_ABOUT_OFFSETS = "graph_about_offsets.npy"
GRAPH_ABOUT_PASSAGES = "graph_about_passages.npy"
GRAPH_FILES = (
    GRAPH_INDPTR,
    GRAPH_INDICES,
    GRAPH_WEIGHTS,
    GRAPH_TRANSITION,
    GRAPH_ARTICLE_OF,
    GRAPH_TITLE_ENTITY,
    GRAPH_PASSAGES_OF_ENTITY,
    GRAPH_ABOUT_KEYS,
    GRAPH_ABOUT_OFFSETS,
    GRAPH_ABOUT_PASSAGES,
)
KEYWORD_FILES = (
    KEYWORD_VOCABULARY,
    KEYWORD_TERM_OFFSETS,
    KEYWORD_OFFSETS,
    KEYWORD_ROWS,
    KEYWORD_WEIGHTS,
    KEYWORD_LENGTHS,
)
DOC_LINKS = "doc_links.arrow"
DOC_LINK_OFFSETS = "doc_link_offsets.npy"
DEFINITIONS = "definitions.arrow"
DOC_GRAPH_FILES = (DOC_LINKS, DOC_LINK_OFFSETS, DEFINITIONS)
# Per definitions.arrow row, the unit vector of its entry text (kpack.ingest.definitions);
# optional: a version built before it has none, and its definitions are found by name only.
DEFINITION_VECTORS = "definition_vectors.npy"
DEFINITION_ANN = "definition_vectors.faiss"  # their IVF index, above the ANN crossover
# Vectors -> their ANN index, written only above the crossover (kpack.vector_index): the chunk
# and section indexes by kpack.index_writer, the definitions' by kpack.docgraph.
ANN_FILES = {
    CHUNK_VECTORS: CHUNK_ANN,
    SECTION_VECTORS: SECTION_ANN,
    DEFINITION_VECTORS: DEFINITION_ANN,
}
# The sorted key hashes of the identifiers the passages write (kpack.identifier_index);
# optional: a version built before it has none, and a reader reads the passages instead.
IDENTIFIERS = "identifiers.npy"
# float16 unit vectors of the passages' sentences, grouped by chunk row, and per chunk row
# where its sentences start (one more entry than chunks: CSR, kpack.sentence_index); optional:
# a version built before them, or with ``sentence_vectors: none``, has neither.
SENTENCE_VECTORS = "sentence_vectors.npy"
SENTENCE_OFFSETS = "sentence_offsets.npy"
# Every file a version's index folder may hold (the ANN index only in larger packs).
INDEX_FILES = (
    CHUNK_VECTORS,
    SECTION_VECTORS,
    *ANN_FILES.values(),
    CHUNKS,
    SECTIONS,
    SECTIONS_BY_ARTICLE,
    ARTICLES,
    ARTICLE_ENTITIES,
    FACTS,
    LINK_OFFSETS,
    LINK_TARGETS,
    ENTITIES,
    *KEY_HASHES.values(),
    *GRAPH_FILES,
    *KEYWORD_FILES,
    *DOC_GRAPH_FILES,
    DEFINITION_VECTORS,
    IDENTIFIERS,
    SENTENCE_VECTORS,
    SENTENCE_OFFSETS,
)
