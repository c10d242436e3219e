"""Offline answers over API reference pages: the definition line comes with what explains it.

One pack is built for this module from two HTML pages laid out as Sphinx writes a library
reference (a ``dl`` per function or exception: the signature in ``dt``, its explanation in
``dd``), with small chunks so a section is cut into passages of one sentence a line, as the
Python docs pack's long sections are.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from retrieval.agent import KnowledgeGraphAgent
from tests.conftest import build, write_pack


def entry(kind: str, signature: str, *paragraphs: str) -> str:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return f'<dl class="py {kind}"><dt class="sig">{signature}</dt><dd>{body}</dd></dl>'


def page(title: str, intro: str, heading: str, *entries: str) -> str:
    return (
        f"<html><head><title>{title}</title></head><body><div role='main'><section>"
        f"<h1>{title}</h1><p>{intro}</p><section><h2>{heading}</h2>{''.join(entries)}"
        "</section></section></div></body></html>"
    )


JSONLITE = page(
    "jsonlite — JSON encoder and decoder",
    "The jsonlite module reads and writes JSON documents with an interface familiar to users "
    "of the marshal and pickle modules of the standard library.",
    "Basic Usage",
    entry(
        "function",
        "jsonlite.dump(obj, fp, *, indent=None, sort_keys=False)",
        "Serialize obj as a JSON formatted stream to fp, a file-like object with a write method.",
        "If indent is a non-negative integer or string, then array elements and object "
        "members are pretty-printed with that indent level.",
        "If sort_keys is true, the output of dictionaries is sorted by key.",
        "New in version 3.2.",
    ),
    entry(
        "function",
        "jsonlite.loads(s, *, object_hook=None)",
        "Deserialize s, a str or bytes instance holding a JSON document, to a Python object.",
        "The object_hook is called with the result of every object literal decoded.",
        "New in version 3.6.",
    ),
    entry(
        "exception",
        "exception jsonlite.DecodeFailure(msg, doc, pos)",
        "Subclass of ValueError raised when the document being decoded is not valid JSON.",
        "Its pos attribute is the index in the document where parsing failed.",
    ),
)
CSVLITE = page(
    "csvlite — CSV files",
    "The csvlite module reads and writes tabular data in the comma separated values format "
    "that spreadsheets and databases export.",
    "Reading",
    entry(
        "function",
        "csvlite.reader(f, delimiter=',')",
        "Return a reader object that iterates over the lines of the file f.",
        "Each row read from the file is returned as a list of strings.",
    ),
    entry(
        "class",
        "class csvlite.MappingReader(f, fieldnames=None)",
        "Create an object that operates like a regular reader but maps the information in "
        "each row to a dict whose keys are the column names.",
        "If fieldnames is omitted, the values in the first row of the file are used as the "
        "column names.",
    ),
)
PAGES = {"jsonlite.html": JSONLITE, "csvlite.html": CSVLITE}
CITED = re.compile(r"\[Source: ([^\]]+)\]")


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> KnowledgeGraphAgent:
    root = tmp_path_factory.mktemp("apidocs")
    (root / "docs").mkdir()
    for name, text in PAGES.items():
        (root / "docs" / name).write_text(text)
    urls = [f"file:../../docs/{name}" for name in PAGES]
    config = {"chunk_tokens": 90, "chunk_overlap_tokens": 8}
    folder: Path = write_pack(root, "apidocs", urls, config)
    assert build(root, "apidocs").success
    # The gate is tested elsewhere: here every question reaches the answer stage.
    return KnowledgeGraphAgent(folder, use_llm=False, context_confidence_threshold=0.0)


def test_pretty_printing_is_answered_with_indent_under_its_signature(docs):
    result = docs.query("How do I pretty-print the JSON that jsonlite writes?")
    answer = result["answer"]
    assert "pretty-printed with that indent level" in answer
    # The definition line the sentence explains is quoted before it, once, as code.
    assert "`jsonlite.dump(obj, fp, *, indent=None, sort_keys=False)`: " in answer
    assert answer.count("jsonlite.dump(obj") == 1
    checked = result["citations_checked"]
    assert checked["supported"] == checked["checked"] >= 1  # the signature is the page's own


def test_the_name_a_definition_line_gives_reaches_the_answer(docs):
    # The sentences say what the class does; only its definition line says what it is called.
    rows = docs.query("How can I read each row of a CSV file as a dict keyed by column name?")
    assert "MappingReader" in rows["answer"]
    assert set(CITED.findall(rows["answer"])) == {"csvlite — CSV files"}
    failure = docs.query("Which exception do I get when jsonlite cannot parse a document?")
    assert "DecodeFailure" in failure["answer"]


def test_a_version_note_is_not_taken_for_the_next_definition(docs):
    # "New in version 3.2." ends the entry of dump(); the loads() line after it, in the same
    # passage, starts the next entry: read as one sentence, 3.2 would be the version of loads.
    answer = docs.query("Since which version does jsonlite have loads?")["answer"]
    assert answer.startswith("`jsonlite.loads(s, *, object_hook=None)`: New in version 3.6.")
    assert "3.2. jsonlite.loads" not in answer


def test_a_question_naming_two_definitions_is_answered_from_both(docs):
    answer = docs.query("Should I use jsonlite.dump or jsonlite.loads to read a document?")[
        "answer"
    ]
    assert "`jsonlite.dump(obj, fp, *, indent=None, sort_keys=False)`: " in answer
    assert "`jsonlite.loads(s, *, object_hook=None)`: " in answer
