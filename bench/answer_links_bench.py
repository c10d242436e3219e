"""Deep links, score order and whole sentences on a built Python docs pack (issue 35).

Asks a built pack of Debian's python3.11-doc every question of the given files (by default
the python_docs_qa questions and the conala_dev intents), offline (``use_llm=False``), and
measures:

- the share of search-result URLs (``retrieval.search``, k=10) and of citation URLs (the
  offline answer's, ``retrieval.query``) that end in a ``#fragment`` the page defines: an
  ``id`` or ``name`` attribute of the page's HTML under the HTML root;
- how many rankings have a score that rises down the list (should be none);
- how many answers break a sentence at an abbreviation: an answer's text stops after a word
  ending in a full stop ("e.g.", "i.e.", "etc.", "Mr.", "3.11.") where the pack's text goes on
  with the same sentence (on the same line: lower case, a digit or a bracket next) everywhere
  it writes the words before it, or goes on there with other words than the answer's.

Unlike bench/deep_links_bench.py, which builds an 8-page pack, this reads a pack already
built (bench/docs_qa_bench.py or bench/external_bench.py builds one) and reads its questions
from shared benchmark files; it changes nothing and is tuned to none of them.

    .venv/bin/python bench/answer_links_bench.py --pack WS/packs/python_docs
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.corpora import BENCHMARKS, PYTHON_DOC_ROOT  # noqa: E402

DEFAULT_QUESTIONS = [
    BENCHMARKS / "python_docs_qa" / "questions.jsonl",
    BENCHMARKS / "conala_dev" / "questions.jsonl",
]
ANCHOR = re.compile(r"""\s(?:id|name)=["']([^"']+)["']""")
# A word ending in a full stop that need not end a sentence: an abbreviation or a version.
ABBREVIATION = re.compile(
    r"(?:\b(?:e\.g|i\.e|etc|vs|cf|al|approx|Mr|Mrs|Ms|Dr|St|No|Fig)|\b\d+(?:\.\d+)+)\.(?=\s|$)"
)
CITATION = re.compile(r"\s*\[Source: [^\]]*\]")
FENCE = re.compile(r"```.*?```", re.DOTALL)
SIGNATURE_PREFIX = re.compile(r"^`[^`\n]+`: ", re.MULTILINE)
# What a sentence goes on with after an abbreviation: not a new sentence.
GOES_ON = re.compile(r"^\s*[a-z0-9(\[,;:`'\"]")
WINDOW = 40  # characters before the full stop that find the spot in the passage


@cache
def anchors(root: Path, page: str) -> frozenset[str]:
    path = root / page
    if not path.is_file():
        return frozenset()
    return frozenset(ANCHOR.findall(path.read_text(encoding="utf-8", errors="replace")))


def on_a_defined_anchor(url: str, root: Path) -> bool:
    parts = urlsplit(url)
    page = unquote(parts.path).lstrip("/")
    return bool(parts.fragment) and unquote(parts.fragment) in anchors(root, page)


def prose_of(answer: str) -> list[str]:
    """The answer's quoted prose, paragraph by paragraph: no citations, code blocks or
    definition lines."""
    text = SIGNATURE_PREFIX.sub("", FENCE.sub("\n\n", CITATION.sub("", answer)))
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def flatten(text: str) -> tuple[str, set[int]]:
    """The text with each run of white space one space, and the offsets in it where a line
    of the text starts."""
    flat: list[str] = []
    line_starts: set[int] = set()
    length = 0
    for piece in re.findall(r"\S+|\s+", text):
        if piece.isspace():
            if "\n" in piece:
                line_starts.add(length + 1)
            piece = " "
        flat.append(piece)
        length += len(piece)
    return "".join(flat), line_starts


def broken_sentences(answer: str, source: str, line_starts: set[int]) -> tuple[list[str], int, int]:
    """The spots where the answer stops a sentence at an abbreviation that the pack's text
    (``source``, flattened) goes on after everywhere it writes the words before it (module
    docstring), how many abbreviations the answer writes, and how many of them were found in
    the pack's text and checked."""
    broken, written, checked = [], 0, 0
    for paragraph in prose_of(answer):
        for match in ABBREVIATION.finditer(paragraph):
            written += 1
            # The words before the full stop, fewer when the answer joined two of the
            # passage's sentences there.
            spans = (
                paragraph[max(0, match.end() - n) : match.end()] for n in (WINDOW, WINDOW // 2)
            )
            before = next((b for b in spans if b in source), "")
            if not before:
                continue
            checked += 1
            answer_goes_on = paragraph[match.end() : match.end() + WINDOW]
            goes_on = []
            for found in re.finditer(re.escape(before), source):
                after = source[found.end() : found.end() + WINDOW]
                # A new line of the pack's text starts a block of its own (a paragraph, a list
                # item, a definition line such as "shelf.open(path)"): the sentence ended.
                ended = found.end() + 1 in line_starts or not GOES_ON.match(after)
                if ended or after.startswith(answer_goes_on[:10] or "\0"):
                    break
                goes_on.append(after)
            else:
                broken.append(f"...{before}|| passage: {goes_on[0].strip()[:30]}")
    return broken, written, checked


def load(path: Path) -> list[str]:
    return [json.loads(line)["question"] for line in path.read_text().splitlines() if line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pack", type=Path, required=True, help="a built Python docs pack")
    parser.add_argument("--html-root", type=Path, default=PYTHON_DOC_ROOT)
    parser.add_argument("--questions", type=Path, nargs="*", default=DEFAULT_QUESTIONS)
    parser.add_argument("--out", type=Path, help="write the figures and failures here (JSON)")
    args = parser.parse_args()
    import retrieval

    folder, root = args.pack.resolve(), args.html_root
    # The pack's whole text: an answer quotes its passages with the text around them.
    source, line_starts = flatten("\n".join(retrieval.open_pack(folder).chunk_text.values()))
    report = {}
    for path in args.questions:
        search_urls, citation_urls, rising, broken = [], [], [], []
        answers = written = checked = 0
        for question in load(path):
            hits = retrieval.search(folder, question, k=10)
            scores = [hit["score"] for hit in hits]
            if any(b > a for a, b in itertools.pairwise(scores)):
                rising.append(question)
            search_urls += [hit["url"] for hit in hits]
            result = retrieval.query(folder, question, use_llm=False)
            citation_urls += [c["url"] for c in result["citations"]]
            answers += 1
            spots, in_answer, found = broken_sentences(result["answer"], source, line_starts)
            broken += [(question, spot) for spot in spots]
            written, checked = written + in_answer, checked + found
        landed = [u for u in search_urls if on_a_defined_anchor(u, root)]
        cited = [u for u in citation_urls if on_a_defined_anchor(u, root)]
        # A shared set is a folder's questions.jsonl; a file of this repository has its own name.
        label = path.parent.name if path.stem == "questions" else path.stem
        report[label] = {
            "questions": answers,
            "search_urls": len(search_urls),
            "search_urls_on_a_defined_anchor": round(len(landed) / max(len(search_urls), 1), 4),
            "citation_urls": len(citation_urls),
            "citation_urls_on_a_defined_anchor": round(len(cited) / max(len(citation_urls), 1), 4),
            "rankings_with_a_rising_score": len(rising),
            "abbreviations_in_answers": written,
            "abbreviations_in_answers_checked": checked,
            "answers_breaking_a_sentence_at_an_abbreviation": len({q for q, _ in broken}),
            "not_landed": sorted(
                {u for u in search_urls + citation_urls if not on_a_defined_anchor(u, root)}
            )[:15],
            "rising": rising[:10],
            "broken": broken[:10],
        }
        print(json.dumps({label: report[label]}, indent=2), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
