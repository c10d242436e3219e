"""What a search and a query hand back (issue 35 items 2-4): deep links to each section's anchor,
scores that mean something, and whole passages within a token budget.

The pack is built once for the module from a small Sphinx-like site served on 127.0.0.1: every
section in a ``<section id=...>``, definitions as ``<dt id="tidepool.Pool.drain">``, the
permalink pilcrows Sphinx adds, a code example, and a section whose heading has no id (it
inherits the anchor of the section before it).
"""

from __future__ import annotations

import re
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import retrieval
from cli.main import main
from kpack.ingest.html import main_content
from kpack.ingest.sections import parse_page
from retrieval.query import QuestionError
from tests.conftest import TEST_FETCH, build, write_pack
from tests.loopback import LoopbackServer

INTRO = """<!DOCTYPE html><html><head><title>tidepool — pools of workers</title></head><body>
<nav>contents</nav><div class="body" role="main">
<section id="module-tidepool"><span id="tidepool-intro"></span>
<h1>tidepool — pools of workers<a class="headerlink" href="#module-tidepool">¶</a></h1>
<p>The tidepool module runs tasks on a pool of worker threads that rise and fall with the tide
of work: a quiet pool keeps one worker, a busy one grows up to its limit.</p>
<section id="starting-a-pool"><h2>Starting a pool<a class="headerlink" href="#starting-a-pool">¶
</a></h2>
<p>Create a pool with a limit on its workers, hand it tasks with submit, and drain it before the
program exits so that no task is left half done.</p>
<div class="highlight-python3"><pre>import tidepool

with tidepool.Pool(limit=4) as pool:
    pool.submit(fetch_lobsters, "north bay")
    pool.drain(timeout=30)
</pre></div>
</section>
<section id="choosing-the-limit"><h2>Choosing the <a class="reference internal"
href="reference.html#tidepool.Pool"><code>limit</code></a><a class="headerlink"
href="#choosing-the-limit">¶</a></h2>
<p>A pool that waits on the network can have many more workers than the machine has cores; a
pool that computes should have about one worker per core.</p>
<h3>Limits in containers</h3>
<p>Inside a container, count the cores the container is allowed, not those of the host, or the
pool starts more workers than can run at once and each task waits its turn.</p>
</section></section></div></body></html>
"""
REFERENCE = """<!DOCTYPE html><html><head><title>tidepool reference</title></head><body>
<div class="body" role="main">
<section id="tidepool-reference"><h1>Reference<a class="headerlink" href="#tidepool-reference">¶
</a></h1>
<section id="pool-objects"><h2>Pool objects<a class="headerlink" href="#pool-objects">¶</a></h2>
<dl class="py class"><dt class="sig sig-object py" id="tidepool.Pool">class tidepool.Pool(limit=8)
</dt><dd><p>A pool of at most limit worker threads. Use it as a context manager: leaving the block
drains the pool.</p>
<dl class="py method"><dt class="sig sig-object py" id="tidepool.Pool.drain">drain(timeout=None)
</dt><dd><p>Wait until every submitted task has finished, or until timeout seconds have passed;
raises TideTimeout when tasks are still running at the timeout.</p></dd></dl>
</dd></dl>
</section>
<section id="exceptions"><h2>Exceptions<a class="headerlink" href="#exceptions">¶</a></h2>
<dl class="py exception"><dt class="sig sig-object py" id="tidepool.TideTimeout">exception
tidepool.TideTimeout</dt><dd><p>Raised by drain when tasks are still running when its timeout
passes; the tasks keep running.</p></dd></dl>
</section></section></div></body></html>
"""
PAGES = {"/docs/tidepool.html": INTRO, "/docs/reference.html": REFERENCE}
ON_TOPIC = [
    "How do I wait for every task of a pool to finish?",
    "How many workers should a pool have inside a container?",
    "What happens when drain times out?",
    "How do I start a pool of workers?",
]
OFF_TOPIC = "How far apart should tomato seedlings be planted on a balcony?"
ID = re.compile(r"""\sid=["']([^"']+)["']""")


class SphinxHandler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        page = PAGES.get(self.path)
        body = (page or "not found").encode()
        self.send_response(200 if page else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def site():
    with LoopbackServer(SphinxHandler) as server:
        yield server


@pytest.fixture(scope="module")
def pack(site, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("deeplinks")
    folder = write_pack(root, "tidepool", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    assert build(root, "tidepool").published
    return folder


def defined_ids(site: LoopbackServer) -> dict[str, set[str]]:
    return {site.url(path): set(ID.findall(html)) for path, html in PAGES.items()}


def lands_on_a_defined_anchor(url: str, ids: dict[str, set[str]]) -> bool:
    page, fragment = url.split("#", 1) if "#" in url else (url, "")
    return bool(fragment) and unquote(fragment) in ids.get(page, set())


# Deep links


def test_each_section_keeps_the_anchor_it_opens_at_or_the_one_before_it():
    page = {
        "url": "https://docs.example.org/tidepool.html",
        "final_url": "https://docs.example.org/tidepool.html",
        "format": "html",
        "body": main_content(INTRO)[1],
        "title_hint": None,
        "content_hash": "x",
    }
    anchors = {row["title"]: row["anchor"] for row in parse_page(page).sections}
    assert anchors == {
        "tidepool — pools of workers": "module-tidepool",
        "Starting a pool": "starting-a-pool",
        "Choosing the limit": "choosing-the-limit",
        # An h3 without an id of its own: the nearest place above it.
        "Limits in containers": "choosing-the-limit",
    }


def test_search_and_query_links_land_on_anchors_the_page_defines(pack, site):
    ids = defined_ids(site)
    urls = []
    for question in ON_TOPIC:
        urls += [hit["url"] for hit in retrieval.search(pack, question, k=5)]
        result = retrieval.query(pack, question, use_llm=False)
        urls += [citation["url"] for citation in result["citations"]]
        assert all(c["url"] in result._repr_html_() for c in result["citations"])
    landed = [url for url in urls if lands_on_a_defined_anchor(url, ids)]
    assert len(urls) >= 20
    assert len(landed) / len(urls) >= 0.9, [u for u in urls if u not in landed]
    hits = retrieval.search(pack, "How do I start a pool of workers?", k=5)
    fragments = {hit["heading"].split(" > ")[-1]: urlsplit(hit["url"]).fragment for hit in hits}
    assert fragments["Starting a pool"] == "starting-a-pool"
    assert all(hit["url"] in hits._repr_html_() for hit in hits)


# Scores


def test_scores_never_rise_down_a_ranking_and_an_off_topic_question_rates_low(pack):
    for question in [*ON_TOPIC, OFF_TOPIC]:
        hits = retrieval.search(pack, question, k=8)
        scores = [hit["score"] for hit in hits]
        assert scores == sorted(scores, reverse=True), (question, scores)
        assert all(0 <= hit["score"] <= hit["confidence"] <= 1 for hit in hits)
    off = retrieval.search(pack, OFF_TOPIC, k=5)
    on = retrieval.search(pack, ON_TOPIC[0], k=5)
    assert off[0]["score"] < 0.5 and off.gate["refused"], (off[0], off.gate)
    assert on[0]["score"] > 0.5 and not on.gate["refused"], (on[0], on.gate)
    assert off.gate["why"]
    # The refusal is the query's too: search and query agree.
    assert retrieval.query(pack, OFF_TOPIC, use_llm=False)["query_type"] != "vector_search"


# Context for agents


def test_a_token_budget_gives_whole_sections_with_code_verbatim_and_deep_links(pack):
    hits = retrieval.search(pack, "How do I start a pool of workers?", k=10, tokens=400)
    assert hits and sum(hit["tokens"] for hit in hits) <= 400
    [starting] = [hit for hit in hits if hit["url"].endswith("#starting-a-pool")]
    assert starting["whole_section"]
    # The code example as written: its lines, its indentation.
    assert (
        'with tidepool.Pool(limit=4) as pool:\n    pool.submit(fetch_lobsters, "north bay")'
        in (starting["text"])
    )
    small = retrieval.search(pack, "How do I start a pool of workers?", k=10, tokens=10)
    assert all(hit["tokens"] <= 10 for hit in small)
    with pytest.raises(QuestionError, match="tokens"):
        retrieval.search(pack, "How do I start a pool of workers?", tokens=0)


def test_kpack_search_keeps_code_lines_links_whole_and_fits_80_columns(pack, capsys):
    assert main(["search", str(pack), "How do I start a pool of workers?", "--k", "5"]) == 0
    out = capsys.readouterr().out
    assert '    pool.submit(fetch_lobsters, "north bay")\n' in out
    url = next(line.strip() for line in out.splitlines() if "#starting-a-pool" in line)
    assert url.startswith("http://127.0.0.1:") and url.endswith(
        "/docs/tidepool.html#starting-a-pool"
    )
    assert all(len(line) <= 80 for line in out.splitlines() if "http" not in line)
    assert "confidence" in out
    assert main(["search", str(pack), OFF_TOPIC]) == 0
    assert "the confidence gate would refuse this question" in capsys.readouterr().out
