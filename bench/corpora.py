"""Real corpora for the benchmarks: rendered, served on loopback, and turned into pack folders.

The build, query and eval benchmarks all need the same thing: a few hundred real pages behind
real HTTP, so the pipeline is measured through its fetcher exactly as in production, but with
no network and no variance from a remote site. This module prepares two corpora:

* SQuAD (``squad_wiki6.json``): six Wikipedia articles, one HTML page per article, one ``<p>``
  per SQuAD paragraph, so the eval benchmark can check retrieved passages against the gold
  answers of the questions.
* The Python 3.11 documentation from Debian's ``python3.11-doc`` package: a Sphinx site with
  cross-links between pages, i.e. the kind of site the project is built for.
* HotpotQA (``hotpotqa_100_corpus.json``): 994 Wikipedia passages, one HTML page per title,
  linked to each other where a passage names another page's title (see
  :func:`hotpotqa_link_targets`), for the multi-hop benchmark.

Both are served by :func:`serve` from a ``ThreadingHTTPServer`` bound to 127.0.0.1 on an
ephemeral port; :func:`make_pack` writes the pack folder (``urls.txt`` and a ``kg_config.json``
that allows loopback hosts, which the fetcher refuses by default).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO.parent / "shared/benchmarks"  # the shared question sets and corpora
DEFAULT_SQUAD = BENCHMARKS / "squad/squad_wiki6.json"
DEFAULT_HOTPOTQA = BENCHMARKS / "hotpotqa"
PYTHON_DOC_ROOT = Path("/usr/share/doc/python3.11/html")
PYTHON_DOC_PACKAGE = "python3.11-doc"
# The prose of the docs; the C API, distributing/installing and what's-new pages are left out
# because they are either reference tables or changelogs, not what users ask about.
PYTHON_DOC_SECTIONS = ("library", "tutorial", "reference", "howto", "faq")
# Loopback is a private address: the fetcher refuses it unless the pack allows it.
LOOPBACK_FETCH = {"allow_private_hosts": True, "per_host_delay_s": 0}


# --- SQuAD ---------------------------------------------------------------------------------


def load_squad(json_path: Path) -> list[dict[str, Any]]:
    """The ``data`` list of a SQuAD JSON file (one dict per article)."""
    return json.loads(Path(json_path).read_text(encoding="utf-8"))["data"]


def squad_page_name(title: str) -> str:
    """The file name of an article's page; the eval benchmark maps URLs back to titles with it."""
    safe = "".join(ch if ch.isalnum() or ch in "-_.()" else "_" for ch in title)
    return f"{safe}.html"


def render_squad_article(article: dict[str, Any]) -> str:
    """One article as a minimal HTML page: the title as <h1>, one <p> per paragraph.

    No headings inside the body: a SQuAD article is one flat text, so the pack's sections and
    chunks come from the chunker alone, which is what the retrieval eval should measure.
    """
    title = article["title"]
    heading = html.escape(title.replace("_", " "))
    paragraphs = "".join(f"<p>{html.escape(p['context'])}</p>\n" for p in article["paragraphs"])
    return (
        f'<html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>'
        f"<body><h1>{heading}</h1>\n{paragraphs}</body></html>\n"
    )


def render_squad(json_path: Path, out_dir: Path) -> list[Path]:
    """Write one page per SQuAD article into ``out_dir``; return them in the file's order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pages = []
    for article in load_squad(json_path):
        page = out_dir / squad_page_name(article["title"])
        page.write_text(render_squad_article(article), encoding="utf-8")
        pages.append(page)
    return pages


# --- HotpotQA ------------------------------------------------------------------------------

# Link rule (see hotpotqa_link_targets): a title names another page only if it is at least this
# long, and a title that occurs in more than this share of the passages would link everywhere
# (a common word rather than a name), so it links nowhere.
HOTPOTQA_MIN_LINK_TITLE_CHARS = 4
HOTPOTQA_MAX_LINK_SHARE = 0.02


def load_hotpotqa_corpus(json_path: Path) -> dict[str, str]:
    """{title: passage} of ``hotpotqa_100_corpus.json``, in the file's order.

    The titles are kept exactly as in the file (a few carry HTML entities such as ``&amp;``,
    and the questions' supporting_facts use the same spelling); the passage is its sentences
    joined with single spaces.
    """
    corpus = json.loads(Path(json_path).read_text(encoding="utf-8"))
    return {
        title: " ".join(s.strip() for s in sentences if s.strip())
        for title, sentences in corpus.items()
    }


def hotpotqa_display_title(title: str) -> str:
    """The title as a reader sees it: HTML entities of the data set decoded."""
    return html.unescape(title)


def hotpotqa_page_names(titles: Iterable[str]) -> dict[str, str]:
    """{title: page file name}, unique: squad_page_name of the display title, numbered on a clash."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for title in titles:
        name = squad_page_name(hotpotqa_display_title(title))
        stem, n = name.removesuffix(".html"), 2
        while name.lower() in taken:
            name, n = f"{stem}_{n}.html", n + 1
        taken.add(name.lower())
        names[title] = name
    return names


def _title_pattern(names: Iterable[str]) -> re.Pattern[str]:
    """Case-sensitive, on word boundaries, longest alternative first (leftmost-longest match)."""
    alternatives = "|".join(re.escape(n) for n in sorted(set(names), key=len, reverse=True))
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)")


def hotpotqa_link_targets(passages: dict[str, str]) -> dict[str, list[tuple[int, int, str]]]:
    """Where each passage names another page: {title: [(start, end, target title), ...]}.

    The rule, the way a Wikipedia editor links (and nothing a question could influence):

    * a passage links to another page where it contains that page's display title verbatim:
      case-sensitive, on word boundaries (no letter, digit or underscore on either side);
    * at one position the longest title wins ("University of Lisbon" over "Lisbon"), and
      matches do not overlap;
    * only the first mention of each target links, and a page never links to itself;
    * a title links nowhere if it is shorter than HOTPOTQA_MIN_LINK_TITLE_CHARS characters, or
      if it occurs in more than HOTPOTQA_MAX_LINK_SHARE of the passages (it would link
      everywhere: a common word, not a name);
    * disambiguated titles ("Lilu (mythology)") link only where the passage writes them in
      full: stripping the parenthesis would turn e.g. "United (Marian Gold album)" into a link
      from every "United States".
    """
    display = {hotpotqa_display_title(t): t for t in passages}
    texts = list(passages.values())
    limit = HOTPOTQA_MAX_LINK_SHARE * len(texts)
    eligible = []
    for name in display:
        if len(name) < HOTPOTQA_MIN_LINK_TITLE_CHARS:
            continue
        pattern = _title_pattern([name])
        if sum(1 for text in texts if pattern.search(text)) <= limit:
            eligible.append(name)
    if not eligible:
        return {title: [] for title in passages}
    pattern = _title_pattern(eligible)
    links: dict[str, list[tuple[int, int, str]]] = {}
    for title, text in passages.items():
        seen: set[str] = {title}
        spans = []
        for match in pattern.finditer(text):
            target = display[match.group()]
            if target not in seen:
                seen.add(target)
                spans.append((match.start(), match.end(), target))
        links[title] = spans
    return links


def render_hotpotqa_page(
    title: str, passage: str, links: list[tuple[int, int, str]], page_names: dict[str, str]
) -> str:
    """One passage as a page: the display title as <title> and <h1>, the passage as one <p>
    with an <a href> (relative, to the target's page) on each linked mention."""
    name = html.escape(hotpotqa_display_title(title))
    parts, at = [], 0
    for start, end, target in links:
        parts.append(html.escape(passage[at:start]))
        href = html.escape(quote(page_names[target]), quote=True)
        parts.append(f'<a href="{href}">{html.escape(passage[start:end])}</a>')
        at = end
    parts.append(html.escape(passage[at:]))
    return (
        f'<html><head><meta charset="utf-8"><title>{name}</title></head>'
        f"<body><h1>{name}</h1>\n<p>{''.join(parts)}</p>\n</body></html>\n"
    )


def render_hotpotqa(json_path: Path, out_dir: Path) -> dict[str, Any]:
    """Write one linked page per passage of ``hotpotqa_100_corpus.json`` into ``out_dir``.

    Returns ``pages`` (the written files in the corpus's order), ``page_titles`` ({file name:
    title as in the data set}, to map a retrieved URL back to a title) and ``links`` (the
    spans of hotpotqa_link_targets). Files of an earlier rendering that are not pages of this
    one are removed, so the folder holds exactly the corpus.
    """
    passages = load_hotpotqa_corpus(json_path)
    names = hotpotqa_page_names(passages)
    links = hotpotqa_link_targets(passages)
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = set(names.values())
    for stale in out_dir.glob("*.html"):
        if stale.name not in wanted:
            stale.unlink()
    pages = []
    for title, passage in passages.items():
        page = out_dir / names[title]
        text = render_hotpotqa_page(title, passage, links[title], names)
        if not page.is_file() or page.read_text(encoding="utf-8") != text:
            page.write_text(text, encoding="utf-8")
        pages.append(page)
    return {
        "pages": pages,
        "page_titles": {name: title for title, name in names.items()},
        "links": links,
    }


# --- Python documentation ------------------------------------------------------------------


def ensure_python_docs(root: Path = PYTHON_DOC_ROOT) -> Path:
    """The Python docs folder, installed with apt-get when missing and we may (root).

    Exits with a message otherwise: the benchmark cannot substitute another corpus silently.
    """
    if root.is_dir():
        return root
    if root != PYTHON_DOC_ROOT:
        sys.exit(f"{root}: no such folder (expected the html folder of {PYTHON_DOC_PACKAGE})")
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        sys.exit(
            f"{root} is missing: install Debian's {PYTHON_DOC_PACKAGE} "
            f"(sudo apt-get install -y {PYTHON_DOC_PACKAGE}) and run again"
        )
    print(f"{root} is missing: installing {PYTHON_DOC_PACKAGE} with apt-get", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", PYTHON_DOC_PACKAGE]):
        if subprocess.run(command, env=env).returncode != 0:
            sys.exit(f"{' '.join(command)} failed; install {PYTHON_DOC_PACKAGE} by hand")
    if not root.is_dir():
        sys.exit(f"{PYTHON_DOC_PACKAGE} is installed but {root} does not exist")
    return root


def python_doc_pages(root: Path = PYTHON_DOC_ROOT, limit: int | None = None) -> list[Path]:
    """The HTML pages of the prose sections, sorted so a capped run always picks the same ones."""
    pages = sorted(
        page
        for section in PYTHON_DOC_SECTIONS
        for page in (root / section).rglob("*.html")
        if page.is_file()
    )
    return pages[:limit] if limit is not None else pages


# --- Serving -------------------------------------------------------------------------------


class StaticHandler(SimpleHTTPRequestHandler):
    """Static files with an explicit UTF-8 charset on HTML, and no request log on stderr."""

    # Keep-alive, as documentation hosts serve (the stdlib's default, HTTP/1.0, closes every
    # connection), so a rebuild's conditional requests reuse connections as they would against
    # a real site (requests alone, client and server in one process: 0.7 ms a 304, against
    # 1.7 ms with a new connection each; stop 51).
    protocol_version = "HTTP/1.1"
    extensions_map = {  # noqa: RUF012 (class attribute of the stdlib handler)
        **SimpleHTTPRequestHandler.extensions_map,
        ".html": "text/html; charset=utf-8",
        ".htm": "text/html; charset=utf-8",
    }

    def handle(self) -> None:
        # A client may close a kept-alive connection with a body unread (a fetcher refusing a
        # file that is not text): the reset is its choice, not an error to print.
        with suppress(ConnectionError):
            super().handle()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serve(folder: Path, port: int = 0) -> Iterator[str]:
    """Serve ``folder`` on 127.0.0.1 in a daemon thread; yield the base URL. ``port`` 0: an
    ephemeral one (a workspace whose packs an earlier run built names that run's port).

    A threading server because the fetcher fetches several pages at once; binding loopback
    only keeps the corpus off the machine's network.
    """
    handler = partial(StaticHandler, directory=str(folder))
    httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name=f"serve {folder}", daemon=True)
    thread.start()
    host, port = httpd.server_address[:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def page_urls(base_url: str, root: Path, pages: Iterable[Path]) -> list[str]:
    """The URL of each page as :func:`serve` serves ``root`` from ``base_url``."""
    return [f"{base_url}/{quote(page.relative_to(root).as_posix())}" for page in pages]


# --- Pack folders --------------------------------------------------------------------------


def make_pack(
    workspace: Path, name: str, urls: list[str], config: dict[str, Any] | None = None
) -> Path:
    """Write ``workspace/packs/<name>/`` with ``urls.txt`` and ``kg_config.json``.

    The config always allows private hosts (the corpus is on loopback); ``config`` adds or
    overrides top-level keys (e.g. ``{"extraction": "offline"}``) and fetch keys under "fetch".
    """
    folder = workspace / "packs" / name
    folder.mkdir(parents=True, exist_ok=True)
    extra = dict(config or {})
    kg_config = {**extra, "fetch": {**LOOPBACK_FETCH, **extra.get("fetch", {})}}
    (folder / "urls.txt").write_text("".join(f"{url}\n" for url in urls), encoding="utf-8")
    (folder / "kg_config.json").write_text(json.dumps(kg_config, indent=2) + "\n")
    return folder
