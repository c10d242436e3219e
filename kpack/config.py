"""kg_config.json: the one schema of a pack's settings, for the build and for queries.

Everything a pack can set is declared here once, as pydantic models: the build settings at the
top level, ``fetch`` for the fetcher and ``query`` for the retrieval side. The same models
validate the file (unknown keys, wrong types, NaN and infinities are errors that name the key
and the closest valid one), give the defaults, document themselves (``settings_reference``
renders docs/configuration.md) and are recorded in the manifest of every published version,
so a reader answers with the settings its version was built with.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kpack.errors import PackError

CONFIG_FILE = "kg_config.json"
DEFAULT_SCHEDULE = "0 3 * * 1"
# How Claude extraction is sent, not what it extracts: changing them changes no pack.
HOW_TO_EXTRACT = ("extraction_batch_threshold", "extraction_batch_wait_s")
DESCRIPTION_CHARS = 300  # a pack's description: a line, not a page
PROFILE_NAMES = ("baseline", "balanced", "max", "latency_optimized", "coverage_optimized")

# The longest wait any setting may ask for: a week. A larger number of seconds (1e308 is a
# finite float) overflows the timers and socket timeouts it reaches, deep in a build.
MAX_SECONDS = 7 * 86_400.0
# The most digits an integer setting may have: 18 fit every counter and size a pack needs, and
# Python refuses to read an integer of more than 4,300 digits at all.
MAX_INT_DIGITS = 18
# How deeply a kg_config.json may nest: its settings are two levels deep.
MAX_NESTING = 32

_CRON_FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*$")
_CRON_ALIASES = ("@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@annually", "@midnight")
# Each cron field's allowed range (minute hour day month weekday).
_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


def valid_cron(cron: str) -> bool:
    """Five cron fields (numbers, ranges, lists, steps, '*') in range, or an @alias."""
    if cron in _CRON_ALIASES:
        return True
    fields = cron.split()
    if len(fields) != 5:
        return False
    for text, (low, high) in zip(fields, _CRON_RANGES, strict=True):
        if not _CRON_FIELD.fullmatch(text):
            return False
        numbers = [int(n) for n in re.findall(r"\d+", re.sub(r"/\d+", "", text))]
        if any(not low <= n <= high for n in numbers):
            return False
    return True


class _Settings(BaseModel):
    # strict: "3" is not 3 and 1 is not true; allow_inf_nan: a NaN threshold would silently
    # gate nothing or everything.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class FetchConfig(_Settings):
    """How pages are fetched."""

    timeout_s: float = Field(
        20.0, ge=0.001, le=MAX_SECONDS, description="seconds to wait for a server"
    )
    max_bytes: int = Field(5_000_000, ge=1, description="largest page accepted, in bytes")
    retries: int = Field(3, ge=0, description="retries of a failed request (5xx, timeouts)")
    max_redirects: int = Field(10, ge=0, description="redirects followed per URL")
    max_workers: int = Field(8, ge=1, description="pages fetched at once")
    allow_private_hosts: bool = Field(
        False,
        description="allow hosts that are not globally routable: private, loopback, "
        "link-local, 100.64.0.0/10, and NAT64/6to4/IPv4-mapped forms of them (refused by "
        "default: a pack must not read the build machine's network)",
    )
    file_roots: tuple[str, ...] = Field(
        ("../..",),
        strict=False,
        description="folders (relative to the pack folder) that file: URLs may read",
    )
    per_host_delay_s: float = Field(
        0.2, ge=0.0, le=MAX_SECONDS, description="seconds between two requests to the same host"
    )
    deadline_s: float | None = Field(
        None,
        ge=0.001,
        le=MAX_SECONDS,
        description="most seconds one URL may take from its first request: redirects, "
        "retries, the body however slowly a server sends it, and reading a PDF "
        "(None: timeout_s × (retries + 1))",
    )
    max_pdf_pages: int = Field(
        500, ge=1, description="most pages of a PDF read into text; a longer PDF is a failed URL"
    )


class CrawlConfig(_Settings):
    """How seed lines (``URL depth=N``) and sitemap URLs of urls.txt expand into pages."""

    max_pages: int = Field(
        1000,
        ge=1,
        description="most pages a pack holds; the crawl adds no page past it (the pages "
        "urls.txt lists one by one are always kept)",
    )
    include: tuple[str, ...] = Field(
        (),
        strict=False,
        description="URL patterns a crawled page must match, shell-style ('*' matches any "
        "text, '/' included); empty: the seed's host and folder",
    )
    exclude: tuple[str, ...] = Field(
        (),
        strict=False,
        description="URL patterns no crawled page may match, e.g. '*/genindex*'",
    )
    respect_robots: bool = Field(
        True, description="obey each host's robots.txt for the pages a crawl discovers"
    )


def _stage_toggle(stages: str) -> Any:
    """A query setting that switches ``stages`` on (true) or off (false) in any profile."""
    return Field(None, description=f"{stages} on/off (None: the profile's)")


class QueryConfig(_Settings):
    """How questions are answered (retrieval). ``None`` means: the profile's value."""

    profile: str = Field("balanced", description=f"one of {', '.join(PROFILE_NAMES)}")
    context_confidence_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="the confidence gate: below this best cosine similarity the pack "
        "declines to answer from its passages (None: calibrated when the pack is built, else "
        "the embedding model's default)",
    )
    # The profile-dependent settings default to None, so a pack that does not set them gets
    # the chosen profile's values (retrieval.profiles), and one that does always wins.
    reranker_alpha: float | None = Field(
        None, ge=0.0, description="GraphReranker: relevance weight (None: the profile's)"
    )
    reranker_beta: float | None = Field(
        None, ge=0.0, description="GraphReranker: PageRank weight (None: the profile's)"
    )
    num_docs: int | None = Field(
        None, ge=1, description="MultiDocSynthesizer: articles in the context (None: the profile's)"
    )
    sections_per_doc: int | None = Field(
        None, ge=1, description="MultiDocSynthesizer: sections each (None: the profile's)"
    )
    few_shot_examples: int | None = Field(
        None, ge=0, description="FewShotManager: examples in a prompt (None: the profile's)"
    )
    # The graph stages (retrieval.entity_graph). Their values are the profile's (retrieval.profiles:
    # chosen on the shared benchmarks) until `kpack eval PACK --write-config` calibrates them
    # on the pack's own questions and writes them here.
    graph_damping: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="graph retrieval: personalized PageRank's damping, the chance a walk from "
        "the question's entities and first-hop hits takes one more step through the graph "
        "(None: the profile's, 0.5)",
    )
    graph_weight: float | None = Field(
        None,
        ge=0.0,
        description="graph retrieval: the weight of its PageRank list in the reciprocal rank "
        "fusion with vector and BM25 search (each 1); 0: no PageRank list (None: the "
        "profile's, 1.0)",
    )
    graph_expand: int | None = Field(
        None,
        ge=0,
        description="graph second hop: how many of the best passages each get a bridge placed "
        "after them (the best passage of another article whose title they name); 0: none "
        "(None: the profile's, 3)",
    )
    graph_bridge_threshold: float | None = Field(
        None,
        ge=0.0,
        description="graph second hop: the score a bridge needs: similarity to the question "
        "+ 0.5 x the share of the question's terms missing from the first passage that it has "
        "(None: the profile's, 0.3)",
    )
    keyword_weight: float | None = Field(
        None,
        ge=0.0,
        description="hybrid search: the weight of the BM25 list in the reciprocal rank fusion, "
        "against vector search's 1 (None: the profile's)",
    )
    api_weight: float | None = Field(
        None,
        ge=0.0,
        description="API search: the weight of the list of passages defining the APIs a "
        "question names, in the reciprocal rank fusion (None: the profile's)",
    )
    definition_weight: float | None = Field(
        None,
        ge=0.0,
        description="definition search: the weight of the list of passages whose API "
        "definitions read closest to the question, in the reciprocal rank fusion (None: the "
        "profile's)",
    )
    problem_api_weight: float | None = Field(
        None,
        ge=0.0,
        description="API search: the weight of its list when the question is a problem "
        "statement (several lines of prose, code and data), whose code names the APIs it "
        "uses (None: the profile's)",
    )
    problem_definition_weight: float | None = Field(
        None,
        ge=0.0,
        description="definition search: the weight of its list when the question is a "
        "problem statement (None: the profile's)",
    )
    sentence_weight: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="vector search: the share of a passage's best sentence in its score, "
        "beside its own similarity, in a pack built with sentence_vectors embedded; 0: its own "
        "similarity only (None: the profile's)",
    )
    passages_per_page: int | None = Field(
        None,
        ge=0,
        description="page crowding: passages of one page ranked before every other page's "
        "best; 0: no limit (None: what the version's own evidence chose, else the profile's)",
    )
    cross_encoder_model: str = Field(
        "cross-encoder/ms-marco-MiniLM-L-12-v2", description="CrossEncoderReranker's model"
    )
    synthesis_model: str = Field("claude-opus-4-6", description="Claude model for answers")
    unsupported_citations: Literal["remove", "mark"] = Field(
        "remove",
        description="citation validation (retrieval.citations): an answer's statement that "
        "the passage it cites does not support is removed, or marked [unsupported]",
    )
    decompose: bool = Field(
        True,
        description="with a key, multi-part questions are split into sub-questions, each "
        "retrieved and cited (retrieval.decompose)",
    )
    expansion_model: str = Field(
        "claude-haiku-4-5", description="Claude model for multi-query phrasings"
    )
    # The stage toggles (retrieval.profiles): each switches its stages off in a profile that
    # has them, or on in one that lacks them.
    use_enhancements: bool | None = Field(
        None,
        description="false keeps only the stages every profile needs, BM25 and API search (None: "
        "the profile's)",
    )
    enable_reranker: bool | None = _stage_toggle("GraphReranker")
    enable_multidoc: bool | None = _stage_toggle("MultiDocSynthesizer")
    enable_fewshot: bool | None = _stage_toggle("few-shot examples")
    enable_cross_encoder: bool | None = _stage_toggle("cross-encoder reranking")
    enable_multi_query: bool | None = _stage_toggle("multi-query expansion")
    enable_hybrid: bool | None = _stage_toggle("BM25 search")
    enable_quality_filter: bool | None = _stage_toggle("content quality filter")
    enable_graph: bool | None = _stage_toggle("graph retrieval and the graph second hop")
    enable_doc_graph: bool | None = _stage_toggle(
        "the documentation graph (section links and API definitions)"
    )
    enable_api_search: bool | None = _stage_toggle(
        "API search: the passages defining the APIs a question names"
    )

    @model_validator(mode="after")
    def _known_profile(self) -> QueryConfig:
        if self.profile not in PROFILE_NAMES:
            raise ValueError(
                f"query.profile must be one of {', '.join(PROFILE_NAMES)}; got {self.profile!r}"
            )
        return self


class PackConfig(_Settings):
    """A pack's settings: kg_config.json, with every key optional."""

    description: str = Field(
        "",
        max_length=DESCRIPTION_CHARS,
        description="a line on what the pack holds and when to use it, shown by skill.md, "
        "`kpack list` and the MCP server's list_packs (without it, skill.md describes the "
        "pack by its headings)",
    )

    embedding_model: str = Field(
        "default",
        description="sentence-transformers model; 'default' is the packaged all-MiniLM-L6-v2",
    )
    # auto by default (issue 34, the owner's decision): int8 embeds about 2.7 times as many
    # texts per second on a CPU, at a measured cost of 0.0053 of SQuAD's vector-only hit@5
    # (bench/RESULTS.md), which is accepted; a GPU keeps fp32.
    embedding_precision: Literal["auto", "fp32", "int8"] = Field(
        "auto",
        description="auto: int8 when the build embeds on the CPU, fp32 on a GPU; fp32: "
        "sentence-transformers, on a GPU when there is one; int8: the model's int8 export "
        "through onnxruntime on the CPU (vectors at cosine ~0.997 of fp32; exported once per "
        "machine; about 2.7 times as fast on a CPU, see docs/building-packs.md)",
    )
    section_vectors: Literal["derived", "embedded"] = Field(
        "derived",
        description="derived: a section longer than one chunk takes its first chunk's vector "
        "(the model reads only a text's first 256 tokens, which that chunk holds), so the "
        "model embeds chunk texts only; embedded: the model embeds section texts too, as "
        "builds did before (16% more texts on the Python docs, the same retrieval figures)",
    )
    sentence_vectors: Literal["embedded", "none"] = Field(
        "embedded",
        description="embedded: every passage's sentences are embedded too (under its heading "
        "path), and vector search ranks a passage by its best sentence as well as by its whole "
        "text (kpack.sentence_index; about five sentences a passage, so about twice the "
        "embedding time); none: passages only, ranked by their own vectors",
    )
    extraction: Literal["auto", "claude", "offline"] = Field(
        "auto",
        description="auto: Claude when ANTHROPIC_API_KEY is set, else the offline extractor",
    )
    extraction_model: str = Field("claude-haiku-4-5", description="Claude model for extraction")
    extraction_batch_threshold: int = Field(
        100,
        ge=1,
        description="Claude extraction of this many sections or more goes through the Message "
        "Batches API, at half price (results within 24 hours, mostly within one); fewer are "
        "sent as parallel requests",
    )
    extraction_batch_wait_s: float = Field(
        86_400.0,
        gt=0.0,
        le=MAX_SECONDS,
        description="most seconds a build waits for its message batches; past it the build "
        "fails, and the next build collects the batches without paying again",
    )
    chunk_tokens: int = Field(
        256,
        ge=8,
        description="most word pieces of the embedding model per chunk, heading path "
        "included; never more than the model reads",
    )
    chunk_overlap_tokens: int = Field(
        48, ge=1, description="word pieces shared by adjacent chunks of a section"
    )
    max_failed_fraction: float = Field(
        0.2, ge=0.0, le=1.0, description="share of URLs that may fail before the build fails"
    )
    schedule: str = Field(
        DEFAULT_SCHEDULE,
        description="cron (UTC) on which pack_refresh_schedule rebuilds the pack; '' never",
    )
    fetch: FetchConfig = Field(default_factory=FetchConfig)
    crawl: CrawlConfig = Field(default_factory=CrawlConfig)
    query: QueryConfig = Field(default_factory=QueryConfig)

    @model_validator(mode="after")
    def _consistent(self) -> PackConfig:
        if not self.chunk_overlap_tokens < self.chunk_tokens:
            raise ValueError("need chunk_overlap_tokens < chunk_tokens")
        if self.schedule and not valid_cron(self.schedule):
            raise ValueError(
                f"schedule must be a cron string such as {DEFAULT_SCHEDULE!r} "
                f'(minute hour day month weekday), or "" for never; got {self.schedule!r}'
            )
        return self

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def extraction_method(self, claude_available: bool) -> str:
        """``claude:<model>`` or ``offline``: how a build extracts, given whether a key is set."""
        use_claude = self.extraction == "claude" or (self.extraction == "auto" and claude_available)
        return f"claude:{self.extraction_model}" if use_claude else "offline"

    def build_settings(self) -> dict[str, Any]:
        """The settings that change what a pack holds (not when it is rebuilt or queried)."""
        return self.model_dump(mode="json", exclude={"schedule", "query", *HOW_TO_EXTRACT})


def pack_description(folder: Path, manifest: dict | None = None) -> str:
    """A pack's own description: its kg_config.json's now (an edit shows before the next
    build), else the one its published ``manifest`` was built with; "" when it has none or
    its kg_config.json cannot be read (the build names that problem)."""
    try:
        own = load_config(folder).description
    except PackError:
        own = ""
    if not own and manifest:
        own = (manifest.get("config") or {}).get("description") or ""
    return " ".join(own.split())


def setting_json(key_path: str, value: object) -> str:
    """How kg_config.json writes one setting, for a message that tells a user to set it:
    ``setting_json("fetch.allow_private_hosts", True)`` is
    ``{"fetch": {"allow_private_hosts": true}}``."""
    shape = value
    for key in reversed(key_path.split(".")):
        shape = {key: shape}
    return json.dumps(shape)


def parse_config(raw: object, where: str = CONFIG_FILE) -> PackConfig:
    """Validate a decoded kg_config.json; every problem is named with its key path."""
    if not isinstance(raw, dict):
        raise PackError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    try:
        return PackConfig.model_validate(raw)
    except ValidationError as exc:
        problems = [_describe(error) for error in exc.errors()]
        raise PackError(f"{where}: " + "; ".join(problems)) from None


def load_config(folder: Path) -> PackConfig:
    """The pack's kg_config.json (defaults when there is none).

    Parsed once per version of the file: every stage of a build asks for the settings, and
    they are read and validated once (the cache key is the file's identity, size and mtime,
    so an edit is seen at once).
    """
    path = folder / CONFIG_FILE
    try:
        stat = path.stat()
    except FileNotFoundError:
        return PackConfig()
    return _parsed(str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _parsed(path: str, _inode: int, _size: int, _mtime_ns: int) -> PackConfig:
    return parse_config(read_config_json(Path(path)), path)


def read_config_json(path: Path) -> object:
    """A kg_config.json decoded; PackError (one line) for text that is not UTF-8, not JSON, or
    nested deeper than MAX_NESTING. An integer of more than MAX_INT_DIGITS digits is read as
    a TooLongNumber, which validation refuses naming its key."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PackError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_int=_integer)
    except json.JSONDecodeError as exc:
        raise PackError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:  # deeper than the interpreter's recursion limit
        data = _TOO_DEEP
    if data is _TOO_DEEP or _depth(data) > MAX_NESTING:
        raise PackError(f"{path}: nested more than {MAX_NESTING} levels deep (settings are two)")
    return data


_TOO_DEEP = object()


class TooLongNumber(str):
    """An integer of kg_config.json with more than MAX_INT_DIGITS digits: no setting's value,
    and named by its digit count wherever an error shows it."""

    def __repr__(self) -> str:
        return f"an integer of {len(self.lstrip('-'))} digits"


def _integer(text: str) -> int | TooLongNumber:
    return TooLongNumber(text) if len(text.lstrip("-")) > MAX_INT_DIGITS else int(text)


def _depth(data: object) -> int:
    """How deeply ``data`` nests, counted without recursion (it may be very deep)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            break
        if isinstance(item, dict):
            stack.extend((value, depth + 1) for value in item.values())
        elif isinstance(item, list):
            stack.extend((value, depth + 1) for value in item)
    return deepest


def _reject_constant(name: str) -> float:
    raise json.JSONDecodeError(f"{name} is not a number JSON allows", name, 0)


def _describe(error: dict) -> str:
    path = [str(part) for part in error["loc"]]
    key = ".".join(path) or "(top level)"
    if error["type"] == "extra_forbidden":
        model = _model_at(path[:-1])
        close = difflib.get_close_matches(path[-1], list(model.model_fields), n=1, cutoff=0.5)
        hint = f" (did you mean {'.'.join([*path[:-1], close[0]])!r}?)" if close else ""
        valid = ", ".join(model.model_fields)
        return f"unknown key {key!r}{hint}; valid keys here: {valid}"
    if error["type"] in ("finite_number",):
        return f"{key} must be a finite number, got {error['input']!r}"
    message = error["msg"].removeprefix("Value error, ")
    if not path:
        return message
    return f"{key}: {message} (got {error['input']!r})"


def _model_at(path: list[str]) -> type[BaseModel]:
    model: type[BaseModel] = PackConfig
    for part in path:
        annotation = model.model_fields[part].annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
    return model


def settings_reference() -> str:
    """Markdown tables of every setting with its default and meaning (docs/configuration.md)."""
    lines = [
        "# Configuration reference",
        "",
        f"Every key of `{CONFIG_FILE}` is optional. This page is generated from `kpack/config.py`",
        "(`python -m kpack.config > docs/configuration.md`); a test keeps it in step.",
        "",
    ]
    for title, model, prefix in (
        ("Build", PackConfig, ""),
        ("fetch", FetchConfig, "fetch."),
        ("crawl", CrawlConfig, "crawl."),
        ("query", QueryConfig, "query."),
    ):
        lines += [f"## {title}", "", "| key | default | meaning |", "| --- | --- | --- |"]
        for name, field in model.model_fields.items():
            if name in ("fetch", "crawl", "query"):
                continue
            default = field.get_default(call_default_factory=True)
            lines.append(f"| `{prefix}{name}` | `{json.dumps(default)}` | {field.description} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(settings_reference(), end="")
