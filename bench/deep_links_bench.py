"""Deep links and scores on a Sphinx docs pack (issue 35 items 2 and 3).

Builds a pack of a few pages of Debian's python3.11-doc (served on 127.0.0.1), asks it the
questions below (written for this script, about those pages; none is from a shared benchmark
set), and measures:

- the share of search result URLs (k=10) and citation URLs (offline answers) that end in a
  ``#fragment`` the page's HTML defines (an ``id`` attribute);
- how many rankings have a score that rises down the list (should be none);
- the top confidence of on-topic questions and of off-topic ones, and how many of each the
  gate would refuse.

    .venv/bin/python bench/deep_links_bench.py --workdir /tmp/deep-links-ws
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.corpora import ensure_python_docs, make_pack, page_urls, serve  # noqa: E402
from bench.harness import build_here  # noqa: E402

PACK = "deep_links"
PAGES = [
    "library/csv.html",
    "library/json.html",
    "library/hashlib.html",
    "library/shutil.html",
    "library/functools.html",
    "library/textwrap.html",
    "library/secrets.html",
    "library/tempfile.html",
]
ON_TOPIC = [
    "How do I write rows of a dictionary to a CSV file?",
    "Which quoting options does the csv writer accept?",
    "How can I pretty-print JSON with indentation?",
    "How do I turn a JSON string into a Python object?",
    "How can I compute a SHA-256 digest of some bytes?",
    "What is a salted password hash function in hashlib?",
    "How do I copy a whole directory tree?",
    "How can I move a file to another folder?",
    "How do I cache the results of an expensive function?",
    "How do I fix some arguments of a function and get a new callable?",
    "How do I wrap a long paragraph to 70 columns?",
    "How can I remove common leading whitespace from a block of text?",
    "How do I generate a secure random token for a URL?",
    "How should I compare two secrets without timing attacks?",
    "How do I create a temporary directory that is removed afterwards?",
    "How do I get a named temporary file?",
]
OFF_TOPIC = [
    "What is the capital of Mongolia?",
    "How do I bake sourdough bread?",
    "Who painted the ceiling of the Sistine Chapel?",
    "How many moons does Neptune have?",
]
ID = re.compile(r"""\sid=["']([^"']+)["']""")


def page_ids(root: Path) -> dict[str, set[str]]:
    return {page: set(ID.findall((root / page).read_text(encoding="utf-8"))) for page in PAGES}


def landed(url: str, ids: dict[str, set[str]]) -> bool:
    parts = urlsplit(url)
    page = unquote(parts.path).lstrip("/")
    return bool(parts.fragment) and unquote(parts.fragment) in ids.get(page, set())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args()
    root = ensure_python_docs()
    workdir = args.workdir.resolve()
    for name in ("KPACK_PACKS_DIR", "KPACK_STORAGE"):
        os.environ[name] = str(workdir / ("packs" if name == "KPACK_PACKS_DIR" else "storage"))
    with serve(root) as base_url:
        make_pack(workdir, PACK, page_urls(base_url, root, [root / p for p in PAGES]))
        build = build_here(PACK, workdir)
    if not build.result.success:
        raise SystemExit(f"the build failed: {build.result.cause}")
    import retrieval

    folder = workdir / "packs" / PACK
    ids = page_ids(root)
    search_urls, citation_urls, rising, on_conf, off_conf = [], [], 0, [], []
    refused = {"on_topic": 0, "off_topic": 0}
    for question in ON_TOPIC + OFF_TOPIC:
        hits = retrieval.search(folder, question, k=10)
        scores = [hit["score"] for hit in hits]
        rising += any(b > a for a, b in itertools.pairwise(scores))
        kind = "on_topic" if question in ON_TOPIC else "off_topic"
        (on_conf if kind == "on_topic" else off_conf).append(hits[0]["confidence"])
        refused[kind] += bool(hits.gate["refused"])
        if kind == "on_topic":
            search_urls += [hit["url"] for hit in hits]
            result = retrieval.query(folder, question, use_llm=False)
            citation_urls += [c["url"] for c in result["citations"]]
    share = lambda urls: round(sum(landed(u, ids) for u in urls) / max(len(urls), 1), 4)  # noqa: E731
    print(
        json.dumps(
            {
                "pages": len(PAGES),
                "build_s": build.total_s,
                "search_urls": len(search_urls),
                "search_urls_on_a_defined_anchor": share(search_urls),
                "citation_urls": len(citation_urls),
                "citation_urls_on_a_defined_anchor": share(citation_urls),
                "rankings_with_a_rising_score": rising,
                "rankings": len(ON_TOPIC) + len(OFF_TOPIC),
                "top_confidence_on_topic_min": min(on_conf),
                "top_confidence_off_topic_max": max(off_conf),
                "gate_would_refuse": refused,
                "not_landed": [u for u in search_urls + citation_urls if not landed(u, ids)][:10],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
