"""Real corpora for the benchmarks: rendered, served on loopback, and turned into pack folders.

The build, query and eval benchmarks all need the same thing: a few hundred real pages behind
real HTTP, so the pipeline is measured through its fetcher exactly as in production, but with
no network and no variance from a remote site. This module prepares two corpora:

* SQuAD (``squad_wiki6.json``): six Wikipedia articles, one HTML page per article, one ``<p>``
  per SQuAD paragraph, so the eval benchmark can check retrieved passages against the gold
  answers of the questions.
* The Python 3.11 documentation from Debian's ``python3.11-doc`` package: a Sphinx site with
  cross-links between pages, i.e. the kind of site the project is built for.

Both are served by :func:`serve` from a ``ThreadingHTTPServer`` bound to 127.0.0.1 on an
ephemeral port; :func:`make_pack` writes the pack folder (``urls.txt`` and a ``kg_config.json``
that allows loopback hosts, which the fetcher refuses by default).
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SQUAD = REPO.parent / "shared/benchmarks/squad/squad_wiki6.json"
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

    extensions_map = {  # noqa: RUF012 (class attribute of the stdlib handler)
        **SimpleHTTPRequestHandler.extensions_map,
        ".html": "text/html; charset=utf-8",
        ".htm": "text/html; charset=utf-8",
    }

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve ``folder`` on 127.0.0.1 (ephemeral port) in a daemon thread; yield the base URL.

    A threading server because the fetcher fetches several pages at once; binding loopback
    only keeps the corpus off the machine's network.
    """
    handler = partial(StaticHandler, directory=str(folder))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
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
