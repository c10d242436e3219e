"""Answers that contain the answer, and sources that are what the answer cites (issue 10.5).

One pack is built for this module from five Markdown pages of a made-up static-site tool,
written so that the sentence that answers sits next to page-intro boilerplate and links.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from retrieval.agent import KnowledgeGraphAgent
from retrieval.citations import SUPPORT_THRESHOLD
from retrieval.decompose import DECOMPOSE_SYSTEM
from retrieval.extractive import NO_SENTENCE_ANSWER
from retrieval.missing_names import DECLINED
from retrieval.synthesis import SYNTHESIS_SYSTEM, UNSUPPORTED_ANSWER
from tests.conftest import build, write_pack
from tests.loopback import fake_anthropic_server

PAGES = {
    "publishing.md": """# Publishing Gizmo Sites

This page describes how a Gizmo site is published and what a rebuild does when nothing
changed. The layout of the output folder is described in [output layout](layout.md).

## Rebuilds That Change Nothing

A rebuild in which no page changed publishes nothing, and the version number of the site
stays the same. To publish a new version anyway, run `gizmo publish NAME --force`; the force
flag renders every page again but does not download unchanged pages again.

## Publishing Steps

Publishing copies the rendered site into a staging folder, checks every internal link, and
then renames the staging folder into place, so that readers never see half a site.
""",
    "layout.md": """# Output Layout

This page describes the files and folders that a Gizmo build writes to disk.

## Versions

Each published version of a site is a folder named v followed by four digits, such as
v0001, and a symbolic link named current points at the newest published version.

## Logs

Build logs are kept for thirty days in the logs folder of the site and are deleted after
that, so a failed build can still be investigated a few weeks later.
""",
    "install.md": """# Installing Gizmo

## From a Wheel

The simplest way to install the Gizmo command line tool is from its wheel:

```
pip install gizmo-site
gizmo --version
```

## From Source

The steps to compile Gizmo from a source checkout are these:

Compiling Gizmo from a source checkout needs a C compiler and version 3.12 of the toolchain.
""",
    "themes.md": """# Themes

Gizmo ships three themes, plain, paper and night, and every site starts with the plain
theme until its configuration names another one.

## Custom Themes

A custom theme is a folder of Jinja templates named after the theme and placed in the
themes directory of the site; a template it lacks is taken from the plain theme.
""",
    "search.md": """# Search

The search box of a Gizmo site uses an index of the headings and paragraphs of every page,
built once per published version and served as a static file.

## Index Size

The search index holds at most 50,000 entries; pages beyond that limit are left out of
search and listed in the build log so that they can be split.
""",
    "deploy.md": """# Deploying

Gizmo sites deploy to any static file host: the `gizmo deploy` command uploads the current
published version of the site over SFTP and then switches the live folder.

## Credentials

The SFTP password is read from the GIZMO_SFTP_PASSWORD environment variable when the deploy
command starts, and it is never written to disk or to the build log.
""",
}
PUBLISH_QUESTION = "How do I publish when nothing changed?"
CITED = re.compile(r"\[Source: ([^\]]+)\]")


@pytest.fixture(scope="module")
def pack(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("answers")
    (root / "docs").mkdir()
    for name, text in PAGES.items():
        (root / "docs" / name).write_text(text)
    folder = write_pack(root, "gizmo", [f"file:../../docs/{name}" for name in PAGES])
    assert build(root, "gizmo").success
    return folder


@pytest.fixture
def offline(pack) -> KnowledgeGraphAgent:
    # The gate is tested elsewhere: here every question reaches the answer stage.
    return KnowledgeGraphAgent(pack, use_llm=False, context_confidence_threshold=0.0)


def test_offline_answer_quotes_the_answering_sentence_and_skips_boilerplate(offline):
    result = offline.query(PUBLISH_QUESTION)
    answer = result["answer"]
    assert "gizmo publish NAME --force" in answer
    assert "This page describes" not in answer  # the page intro that shares the words
    assert "described in" not in answer and "layout.md" not in answer  # a pointer elsewhere
    assert set(CITED.findall(answer)) == set(result["sources"]) == {"Publishing Gizmo Sites"}


def test_offline_answer_says_plainly_when_no_sentence_answers(offline):
    weak = offline.query("How many calories does a ripe mango have?")
    assert weak["query_type"] == "vector_search"  # the passages reached the answer stage
    assert weak["answer"] == NO_SENTENCE_ANSWER
    assert weak["sources"] == weak["citations"] == []
    assert weak["trace"]["context"]  # what was considered stays in the trace
    # Close words, but the thing asked about is named nowhere in the passages.
    unnamed = offline.query("Can Gizmo publish a site to WordPress?")
    assert unnamed["answer"].startswith(DECLINED) and "WordPress" in unnamed["answer"]
    assert unnamed["sources"] == unnamed["citations"] == []


def test_a_misspelled_name_is_answered_and_an_unknown_one_still_refused(offline):
    # "Gizmmo" is one typing slip from the pages' "Gizmo"; "WordPress" is near no word of them.
    logs = offline.query("How long does a Gizmmo site keep its build logs?")["answer"]
    assert "thirty days" in logs and not logs.startswith(DECLINED)
    assert offline.query("Can Gizmo publish to WordPress?")["answer"].startswith(DECLINED)


def test_a_question_of_two_parts_is_answered_from_the_passage_of_each(offline):
    result = offline.query(
        "Where does the deploy command read the SFTP password from, and how long are build "
        "logs kept?"
    )
    answer = result["answer"]
    assert "GIZMO_SFTP_PASSWORD" in answer and "thirty days" in answer
    assert set(CITED.findall(answer)) == {"Deploying", "Output Layout"}


def test_offline_sources_are_only_the_passages_the_answer_quotes(offline):
    result = offline.query("Where does the deploy command read the SFTP password from?", 3)
    assert "GIZMO_SFTP_PASSWORD" in result["answer"]
    assert result["sources"] == list(dict.fromkeys(CITED.findall(result["answer"])))
    assert 1 <= len(result["citations"]) <= 3
    context_titles = {c["title"] for c in result["trace"]["context"]}
    assert len(context_titles) > len(result["sources"])  # the rest stays in the trace


def test_claude_answer_sources_are_the_two_passages_it_cites(pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    reply = (
        "Run `gizmo publish NAME --force` to publish a new version anyway "
        "[Source: Publishing Gizmo Sites]. The deploy command reads the password from "
        "GIZMO_SFTP_PASSWORD [Source: Deploying]."
    )
    with fake_anthropic_server(reply=reply) as fake:
        # baseline: the context is the 5 best passages themselves
        agent = KnowledgeGraphAgent(
            pack,
            profile="baseline",
            anthropic_base_url=fake.base,
            context_confidence_threshold=0.0,
        )
        result = agent.query(
            "How do I publish when nothing changed, and where does the deploy password come from?"
        )
    assert result["answer"] == reply
    prompt = answer_requests(fake)[0]["messages"][0]["content"]
    assert len(re.findall(r"<passage title=", prompt)) == 5  # five passages offered
    assert result["sources"] == ["Publishing Gizmo Sites", "Deploying"]
    # Each citation is the section of that article that says what the answer states.
    assert [c["section"] for c in result["citations"]] == [
        "Publishing Gizmo Sites > Rebuilds That Change Nothing",
        "Deploying > Credentials",
    ]
    assert len(result["trace"]["context"]) == 5  # the rest stays in the trace


def test_offline_howto_quotes_its_code_block_and_no_dangling_lead_in(offline):
    result = offline.query("How do I install the Gizmo command line tool from a wheel?")
    answer = result["answer"]
    # The lead-in and the code it introduces, the code as a fenced block.
    assert "install the Gizmo command line tool is from its wheel:" in answer
    assert re.search(r"```\npip install gizmo-site\ngizmo --version\n```", answer)
    # A lead-in whose code is not there ends in nothing: it is never quoted.
    source = offline.query("How do I compile Gizmo from a source checkout?")["answer"]
    assert "are these:" not in source
    assert "C compiler" in source


def test_offline_answer_reports_every_citation_checked(offline):
    result = offline.query(PUBLISH_QUESTION)
    checked = result["citations_checked"]
    cited = CITED.findall(result["answer"])
    assert checked["checked"] == len(cited) >= 1
    assert checked["supported"] == checked["checked"] and checked["support_rate"] == 1.0
    rows = result["trace"]["citations"]
    assert len(rows) == len(cited)
    assert all(row["supported"] and row["support"] >= SUPPORT_THRESHOLD for row in rows)


def answer_requests(fake) -> list[dict]:
    """The requests that asked Claude for an answer (not a decomposition)."""
    return [r["body"] for r in fake.requests if r["body"]["system"] == SYNTHESIS_SYSTEM]


def claude_agent(pack: Path, base_url: str, **options) -> KnowledgeGraphAgent:
    return KnowledgeGraphAgent(
        pack,
        profile="baseline",
        anthropic_base_url=base_url,
        context_confidence_threshold=0.0,
        **options,
    )


SEARCH_QUESTION = (
    "How many entries can the search index hold, and where is the SFTP password read from?"
)
CORRECT = (
    "The search index holds at most 50,000 entries [Source: Search]. The SFTP password is read "
    "from the GIZMO_SFTP_PASSWORD environment variable [Source: Deploying]."
)


def test_claude_citations_are_checked_fabricated_and_wrong_number_caught(pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    fabricated = "Gizmo publishes to WordPress with one click [Source: Gizmo Cloud Manual]."
    wrong_number = "The search index holds at most 80,000 entries [Source: Search]."
    correct_part = (
        "The SFTP password is read from the GIZMO_SFTP_PASSWORD environment variable "
        "[Source: Deploying]."
    )
    reply = f"{fabricated} {wrong_number} {correct_part}"
    with fake_anthropic_server(reply=reply) as fake:
        result = claude_agent(pack, fake.base).query(SEARCH_QUESTION)
    # One repair request was made; the fake answered the same, so both failures stay caught.
    asked = answer_requests(fake)
    assert len(asked) == 2
    assert "not supported by the passage they cite" in str(asked[1])
    assert result["answer"] == correct_part
    assert result["sources"] == ["Deploying"]  # a title not in the context is never a source
    rows = {row["statement"]: row for row in result["trace"]["citations"]}
    assert rows[fabricated.split(" [")[0]]["in_context"] is False
    assert rows[wrong_number.split(" [")[0]]["missing"] == ["80,000"]
    assert not rows[wrong_number.split(" [")[0]]["supported"]
    assert result["citations_checked"] == {
        "checked": 3,
        "supported": 1,
        "removed": 2,
        "marked": 0,
        "support_rate": 0.333,
    }


def test_claude_correct_answer_passes_and_unsupported_can_be_marked(pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    with fake_anthropic_server(reply=CORRECT) as fake:
        result = claude_agent(pack, fake.base).query(SEARCH_QUESTION)
    assert len(answer_requests(fake)) == 1  # nothing to repair
    assert result["answer"] == CORRECT
    assert result["citations_checked"]["support_rate"] == 1.0
    assert result["sources"] == ["Search", "Deploying"]
    wrong = "The search index holds at most 80,000 entries [Source: Search]."
    with fake_anthropic_server(reply=wrong) as fake:
        marked = claude_agent(pack, fake.base, unsupported_citations="mark").query(SEARCH_QUESTION)
        removed = claude_agent(pack, fake.base).query(SEARCH_QUESTION)
    assert marked["answer"] == wrong + " [unsupported]"
    assert marked["citations_checked"]["marked"] == 1
    assert removed["answer"] == UNSUPPORTED_ANSWER and removed["sources"] == []


def test_claude_repair_request_replaces_an_unsupported_answer(pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    wrong = "The search index holds at most 80,000 entries [Source: Search]."
    replies = {"not supported by the passage they cite": CORRECT}
    with fake_anthropic_server(reply=wrong, replies=replies) as fake:
        result = claude_agent(pack, fake.base).query(SEARCH_QUESTION)
    asked = answer_requests(fake)
    assert len(asked) == 2
    assert "80,000" in str(asked[1])  # the repair names what was not found
    assert result["answer"] == CORRECT
    assert result["trace"]["citation_repair"] == ["The search index holds at most 80,000 entries"]
    assert result["citations_checked"]["removed"] == 0


def test_claude_splits_a_two_part_question_and_each_part_is_retrieved_and_cited(pack, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
    parts = [
        "How many entries can the search index of a Gizmo site hold?",
        "Which environment variable holds the SFTP password for deploys?",
    ]
    replies = {DECOMPOSE_SYSTEM[:40]: json.dumps({"sub_questions": parts})}
    with fake_anthropic_server(reply=CORRECT, replies=replies) as fake:
        result = claude_agent(pack, fake.base).query(SEARCH_QUESTION, 2)
    split = [r["body"] for r in fake.requests if r["body"]["system"] == DECOMPOSE_SYSTEM]
    assert len(split) == 1 and SEARCH_QUESTION in split[0]["messages"][0]["content"]
    # Each sub-question was searched on its own and kept its own best passage.
    found = {p["question"]: p["passages"] for p in result["trace"]["sub_questions"]}
    assert "Search > Index Size" in found[parts[0]]
    assert "Deploying > Credentials" in found[parts[1]]
    assert not set(found[parts[0]]) & set(found[parts[1]])
    # The number of passages follows the number of parts: 2 parts, 3 passages each (k was 2).
    prompt = answer_requests(fake)[0]["messages"][0]["content"]
    assert len(re.findall(r"<passage title=", prompt)) == 6
    assert "1. How many entries" in prompt and "2. Which environment variable" in prompt
    assert result["sources"] == ["Search", "Deploying"]
    assert result["citations_checked"]["support_rate"] == 1.0
    # Without a key nothing is split: the question is searched whole.
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    offline = KnowledgeGraphAgent(pack, use_llm=False, context_confidence_threshold=0.0)
    assert "sub_questions" not in offline.query(SEARCH_QUESTION)["trace"]
