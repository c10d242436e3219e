"""Offline answers over API reference pages: the definition line comes with what explains it.

Two packs are built for this module from HTML pages laid out as Sphinx writes a library
reference (a ``dl`` per function or exception: the signature in ``dt``, its explanation in
``dd``), with small chunks so a section is cut into passages of one sentence a line, as the
Python docs pack's long sections are. The second holds one long entry that the chunks cut in
the middle, and a lead-in whose code block falls into the next passage.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from kpack.index_files import IDENTIFIERS
from kpack.packs import INDEX_DIR
from kpack.store import seal_version
from retrieval.agent import KnowledgeGraphAgent
from retrieval.answer_units import units_of
from retrieval.missing_names import DECLINED
from retrieval.passage_context import passage_in_context
from retrieval.reader import PackReader
from retrieval.registry import open_pack, reading
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
        "function",
        "jsonlite.load(fp, *, object_hook=None)",
        "Deserialize fp, a file-like object with a read method, to a Python object.",
        "Changed in version 3.8: Available on every platform.",
    ),
    entry(
        "exception",
        "exception jsonlite.DepthExceeded(limit, path)",
        "Raised when a document nests arrays and objects deeper than the limit the decoder "
        "was given.",
        "Its path attribute lists the keys that lead to the innermost object.",
    ),
)
PALETTES = page(
    "palettes — colour schemes",
    "The palettes module keeps the colours of a drawing program's themes and converts them "
    "between colour spaces.",
    "Schemes",
    entry(
        "function",
        "palettes.blend(first, second, share=0.5)",
        "Return the colour that lies between first and second, nearer first as share falls.",
        "Both colours must be given in the same colour space.",
    ),
    entry(
        "class",
        "class palettes.Swatchbook(colours, fallback=None)",
        "Create an object that holds named colours together and returns any of them when it "
        "is looked up under its name.",
        "If fallback is given, it is returned for a name the object does not hold.",
    ),
)
TARLITE = page(
    "tarlite — archive files",
    "The tarlite module reads and writes archive files that bundle many members into one file.",
    "Archive Objects",
    entry(
        "class",
        "class tarlite.Archive(path, mode='r')",
        "Open the archive file at path for reading or, with mode 'a', for appending members.",
        "An archive keeps an index of its members in memory while it is open and reads the "
        "members themselves only when a caller asks for them.",
        "The path may be a string or any path-like object, and the file it names must exist "
        "unless the mode is 'w'.",
        "Several archives may be open at the same time; each keeps its own index and its own "
        "file handle.",
        "Closing the archive writes its index back to the end of the file, so the members "
        "added to an archive that is never closed are lost.",
        "Changed in version 3.9: Added the mode 'a' for appending members.",
    ),
    entry(
        "method",
        "Archive.add(name, data)",
        "Add a member called name that holds the bytes data to the index of the archive.",
        "The member is written to the file at once, but it can only be found again after the "
        "index is written when the archive is closed.",
        "To add a member and write the index in one step, use the archive in a with statement:"
        "<pre>with tarlite.Archive('backup.tar', mode='a') as archive:\n"
        "    archive.add('notes.txt', b'hello')\n    archive.add('todo.txt', b'later')\n"
        "# the index is written here</pre>",
        "Adding a member whose name is already in the archive replaces the older member.",
        "New in version 3.4.",
    ),
    "<p>The modes an archive is opened with:</p><table><tr><th>mode</th><th>meaning</th></tr>"
    "<tr><td>r</td><td>read the members of an existing archive</td></tr>"
    "<tr><td>a</td><td>append members to an existing archive</td></tr>"
    "<tr><td>w</td><td>write a new archive, replacing any file at path</td></tr></table>",
)
PAGES = {"jsonlite.html": JSONLITE, "palettes.html": PALETTES}
CITED = re.compile(r"\[Source: ([^\]]+)\]")


def built(root: Path, pages: dict[str, str], chunk_tokens: int = 120) -> Path:
    """A pack of the pages, cut into small chunks (of word pieces, heading path included)."""
    (root / "docs").mkdir()
    for name, text in pages.items():
        (root / "docs" / name).write_text(text)
    urls = [f"file:../../docs/{name}" for name in pages]
    config = {"chunk_tokens": chunk_tokens, "chunk_overlap_tokens": 8}
    folder: Path = write_pack(root, "apidocs", urls, config)
    assert build(root, "apidocs").success
    return folder


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> KnowledgeGraphAgent:
    folder = built(tmp_path_factory.mktemp("apidocs"), PAGES)
    # The gate is tested elsewhere: here every question reaches the answer stage.
    return KnowledgeGraphAgent(folder, use_llm=False, context_confidence_threshold=0.0)


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> Path:
    # Small enough that the lead-in of a code block ends a passage and its code opens the next.
    return built(tmp_path_factory.mktemp("archives"), {"tarlite.html": TARLITE}, chunk_tokens=90)


def passages_with(folder: Path, words: str) -> list[str]:
    """The texts of the pack's passages that hold the words."""
    return [text for text in open_pack(folder).chunk_text.values() if words in text]


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
    named = docs.query("How can I keep named colours together and look each one up by name?")
    assert "Swatchbook" in named["answer"]
    assert set(CITED.findall(named["answer"])) == {"palettes — colour schemes"}
    failure = docs.query("Which exception do I get when a document nests too deeply for jsonlite?")
    assert "DepthExceeded" in failure["answer"]


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


def test_a_version_question_asked_since_when_gets_the_version_note(docs):
    answer = docs.query("Since when does jsonlite have loads?")["answer"]
    assert answer.startswith("`jsonlite.loads(s, *, object_hook=None)`: New in version 3.6.")


def test_what_kind_of_error_is_answered_by_the_exception_entry(docs):
    question = (
        "I decode files with jsonlite and some of them nest objects far too deep. What kind "
        "of error is raised then?"
    )
    answer = docs.query(question)["answer"]
    assert answer.startswith("`exception jsonlite.DepthExceeded(limit, path)`: ")


def test_a_release_the_passages_never_name_is_declined(docs):
    answer = docs.query("What did Python 3.14 change in jsonlite.loads?")["answer"]
    assert answer.startswith(DECLINED) and "3.14" in answer
    # A number that is no release is no reason to decline.
    decimal = docs.query("Can jsonlite.dump pretty-print with an indent of 2.5?")["answer"]
    assert not decimal.startswith(DECLINED)


def test_an_identifier_no_passage_writes_is_declined_from_the_built_index(docs, tmp_path):
    # jsonlite.dumps is one letter from jsonlite.dump, which the passages found do write.
    question = "How do I pretty-print with jsonlite.dumps?"
    declined = docs.query(question)["answer"]
    assert declined.startswith(DECLINED) and "jsonlite.dumps" in declined
    assert not docs.query("How do I pretty-print with jsonlite.dump?")["answer"].startswith(
        DECLINED
    )
    with reading(docs.source) as reader:
        # The build saved the identifiers every passage writes, so no reader reads them all.
        assert (reader.version_dir / INDEX_DIR / IDENTIFIERS).is_file()
        assert "jsonlite.dump" in reader.identifiers and "palettes" in reader.identifiers
        assert "jsonlite.dumps" not in reader.identifiers
        # A version built before that index reads its passages instead, and declines alike.
        older = tmp_path / "apidocs" / "versions" / reader.version_dir.name
        shutil.copytree(reader.version_dir, older)
    (older / INDEX_DIR / IDENTIFIERS).unlink()
    seal_version(older)
    with PackReader(older.parent.parent, older) as old_reader:
        assert "jsonlite.dumps" not in old_reader.identifiers
        assert docs.query(question, reader=old_reader)["answer"] == declined


def test_a_sentence_deep_in_a_long_entry_keeps_its_definition_line(archives):
    # The entry is longer than a passage: the passage holding its last sentence starts after
    # the definition line, which the answer takes from the passage before it.
    (cut,) = passages_with(archives, "Closing the archive writes")
    assert "class tarlite.Archive" not in cut
    agent = KnowledgeGraphAgent(archives, use_llm=False, context_confidence_threshold=0.0)
    result = agent.query("What happens to the members I add to an archive if I never close it?")
    assert result["answer"].startswith(
        "`class tarlite.Archive(path, mode='r')`: Closing the archive writes its index back"
    )
    checked = result["citations_checked"]
    assert checked["supported"] == checked["checked"] >= 1


def test_a_lead_in_is_quoted_with_the_code_the_next_passage_holds(archives):
    (lead_in,) = passages_with(archives, "use the archive in a with statement:")
    assert "archive.add('notes.txt'" not in lead_in  # the passage ends before its code
    agent = KnowledgeGraphAgent(archives, use_llm=False, context_confidence_threshold=0.0)
    result = agent.query("How do I add a member and write the index in one step?")
    answer = result["answer"]
    assert "use the archive in a with statement:\n\n```\n" in answer
    # The code as the page writes it, indentation included, before the citation.
    assert (
        "with tarlite.Archive('backup.tar', mode='a') as archive:\n"
        "    archive.add('notes.txt', b'hello')\n"
    ) in answer
    assert answer.index("# the index is written here") < answer.index("[Source: tarlite")
    checked = result["citations_checked"]
    assert checked["supported"] == checked["checked"] >= 1


def test_a_table_row_is_quoted_on_its_own(archives):
    agent = KnowledgeGraphAgent(archives, use_llm=False, context_confidence_threshold=0.0)
    answer = agent.query("Which mode writes a new archive and replaces the file that is there?")[
        "answer"
    ]
    # The row that answers, though it starts with a name in lower case; not the whole table.
    assert "w | write a new archive, replacing any file at path [Source:" in answer
    assert "r | read the members" not in answer


def test_a_passage_is_read_with_the_release_notes_at_the_end_of_its_long_entry(archives):
    # For a when / which-version question the note that closes the entry passages later is
    # read with the passage that says what the question asks; the next entry's are not.
    reader = open_pack(archives)
    (opening,) = [
        (chunk, text)
        for chunk, text in reader.chunk_text.items()
        if "with mode 'a', for appending members" in text
    ]
    assert "Changed in version 3.9" not in opening[1]
    plain = passage_in_context(*opening, reader.chunk_text)
    read = passage_in_context(*opening, reader.chunk_text, release_notes=True)
    assert "Changed in version 3.9" not in plain
    assert read.endswith("\n\nChanged in version 3.9: Added the mode 'a' for appending members.")
    (note,) = [u for u in units_of(read) if u.sentence.startswith("Changed in version 3.9")]
    assert note.signature == "class tarlite.Archive(path, mode='r')"


def test_a_passage_inside_a_long_entry_is_read_with_the_entry_opening(archives):
    # What the definition does is said at the start of its entry, a passage before.
    reader = open_pack(archives)
    ((chunk, text),) = [
        (chunk, text)
        for chunk, text in reader.chunk_text.items()
        if "Closing the archive writes" in text
    ]
    assert "Open the archive file at path" not in text
    read = passage_in_context(chunk, text, reader.chunk_text)
    assert read.startswith(
        "class tarlite.Archive(path, mode='r')\nOpen the archive file at path for reading or, "
        "with mode 'a', for appending members."
    )
    assert read.endswith(text)
    opening = [u for u in units_of(read) if u.sentence.startswith("Open the archive file")]
    assert [u.signature for u in opening] == ["class tarlite.Archive(path, mode='r')"]
