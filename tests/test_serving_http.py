"""The HTTP API over real HTTP: uvicorn on a loopback port, httpx as the client.

One pack is built for the module from the loopback site; its /live/changing page lets the last
test rebuild it with new content while requests keep running.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

import retrieval
from kpack.config import PROFILE_NAMES
from retrieval.query import MAX_SERVED_K
from serving import catalog
from serving.http import MAX_BODY_BYTES, create_app
from tests.conftest import TEST_FETCH, build, write_pack
from tests.loopback import LoopbackServer, fake_anthropic_server, wait_until_serving

LIVE = "/live/changing/served.html"
PAGES = ["/docs/index.html", "/docs/guide.html", LIVE]
QUESTION = "Which environment variable sets where the sprocket cache lives?"
OUT_OF_DOMAIN = "Who won the football world cup in 1998?"
# Claude's answer to a question with passages: one the User Guide supports, so citation
# validation keeps it as written (the fake's default answer cites a passage it was not given).
SUPPORTED = {
    "<passages>": "The WIDGET_HOME variable points at the folder where the toolkit keeps its "
    "sprocket cache [Source: User Guide]."
}
SEED_KEYS = {"answer", "sources", "entities", "facts", "cypher_query", "query_type", "token_usage"}
QUERY_KEYS = SEED_KEYS | {"citations", "citations_checked", "version", "timings_ms", "trace"}


@contextmanager
def running(app, sock: socket.socket | None = None) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (an ephemeral port) in a thread; yield its URL."""
    sock = sock or socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture(scope="module")
def root(site, tmp_path_factory) -> Path:
    workspace = tmp_path_factory.mktemp("serving")
    site.revisions[LIVE] = 1
    write_pack(workspace, "widgets", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    write_pack(workspace, "unbuilt", [site.url("/docs/index.html")], {"fetch": TEST_FETCH})
    assert build(workspace, "widgets").published
    return workspace


@pytest.fixture(scope="module")
def api(root) -> Iterator[httpx.Client]:
    with (
        running(create_app(root / "packs", warmup=True)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        yield client


def test_health_and_openapi(api):
    assert api.get("/healthz").json() == {"status": "ok"}
    schema = api.get("/openapi.json").json()
    assert {
        "/healthz",
        "/packs",
        "/packs/{name}",
        "/packs/{name}/query",
        "/packs/{name}/search",
    } <= set(schema["paths"])
    assert api.get("/docs").status_code == 200


def test_a_pack_whose_pages_are_on_the_web_says_its_build_needs_the_internet(tmp_path):
    write_pack(tmp_path, "go-docs", ["# the Go docs", "https://go.dev/doc/effective_go"])
    row = catalog.summary("go-docs", tmp_path / "packs")  # what /packs and MCP list_packs say
    assert row["sources"] == "web" and "the build needs internet access" in row["error"]


def test_the_docs_page_needs_nothing_but_the_server(api):
    """/docs offline: Swagger UI's script and stylesheet come from the server itself."""
    page = api.get("/docs")
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text
    assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert assets and all(a.startswith("/") and not a.startswith("//") for a in assets), assets
    for asset in assets:
        served = api.get(asset)
        assert served.status_code == 200 and len(served.content) > 1000, asset
    assert "url: '/openapi.json'" in page.text


def test_lists_packs_and_describes_one(api, root):
    packs = {p["name"]: p for p in api.get("/packs").json()["packs"]}
    assert packs["widgets"]["published"] and packs["widgets"]["version"] == 1
    assert packs["widgets"]["articles"] == 3
    assert packs["unbuilt"] == {
        "name": "unbuilt",
        "published": False,
        "serving": False,
        "sources": "local",  # the loopback site: no internet needed to build it
        "version": None,
        "error": "never built: run `kpack build unbuilt`",
    }
    info = api.get("/packs/widgets").json()
    assert info["manifest"]["name"] == "widgets" and info["version"] == 1
    assert info["skill_md"].startswith("---\nname: widgets-pack")
    assert "kpack mcp" in info["skill_md"]


def test_query_answers_as_in_process(api, root):
    response = api.post("/packs/widgets/query", json={"question": QUESTION, "use_llm": False})
    assert response.status_code == 200, response.text
    assert response.headers["x-kpack-version"] == "1"
    body = response.json()
    assert set(body) == QUERY_KEYS
    local = retrieval.query(root / "packs" / "widgets", QUESTION, use_llm=False)
    for key in ("answer", "sources", "citations", "query_type", "entities", "facts"):
        assert body[key] == json.loads(json.dumps(local[key])), key
    assert "[Source: " in body["answer"] and body["token_usage"]["api_calls"] == 0


def test_search_returns_the_ranked_passages(api, root):
    response = api.post("/packs/widgets/search", json={"question": QUESTION, "k": 3})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["pack"] == "widgets" and body["version"] == 1
    local = retrieval.search(root / "packs" / "widgets", QUESTION, k=3)
    assert body["results"] == json.loads(json.dumps(local))
    assert len(body["results"]) == 3 and body["results"][0]["title"] == "User Guide"
    assert body["gate"] == local.gate and not body["gate"]["refused"]


def test_a_search_is_also_a_link_and_takes_a_token_budget(api, root):
    linked = api.get("/packs/widgets/search", params={"q": QUESTION, "k": 3})
    assert linked.status_code == 200, linked.text
    posted = api.post("/packs/widgets/search", json={"question": QUESTION, "k": 3})
    assert linked.json() == posted.json()
    assert api.get("/packs/widgets/search", params={"q": " "}).status_code == 422
    budget = api.post("/packs/widgets/search", json={"question": QUESTION, "tokens": 150}).json()
    assert budget["results"] and sum(hit["tokens"] for hit in budget["results"]) <= 150
    off = api.get("/packs/widgets/search", params={"q": OUT_OF_DOMAIN}).json()
    assert off["gate"]["refused"] and off["results"][0]["confidence"] < 0.5


@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_every_profile_is_accepted(api, root, profile):
    """The five profiles of kg_config.json and the CLI, each answered with its own stages."""
    response = api.post(
        "/packs/widgets/query", json={"question": QUESTION, "use_llm": False, "profile": profile}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["trace"]["profile"] == profile and "[Source: " in body["answer"]
    local = retrieval.agent(root / "packs" / "widgets", profile, use_llm=False)
    assert list(body["timings_ms"])[:-2] == local.stages  # then "response" and "total"
    found = api.post("/packs/widgets/search", json={"question": QUESTION, "profile": profile})
    assert found.status_code == 200, found.text
    hits = retrieval.search(root / "packs" / "widgets", QUESTION, profile=profile)
    assert [h["passage_id"] for h in found.json()["results"]] == [h["passage_id"] for h in hits]
    schema = api.get("/openapi.json").json()["components"]["schemas"]
    for model in ("QueryRequest", "SearchRequest"):
        assert profile in json.dumps(schema[model]["properties"]["profile"])


def server_timing(response: httpx.Response) -> dict[str, float]:
    """``queue;dur=0.1, retrieval;dur=20.5, ...`` -> {"queue": 0.1, "retrieval": 20.5, ...}."""
    entries = (
        entry.strip().split(";dur=") for entry in response.headers["server-timing"].split(",")
    )
    return {name: float(ms) for name, ms in entries}


def test_responses_say_where_their_time_went(api):
    assert set(server_timing(api.get("/healthz"))) == {"app"}
    for endpoint in ("search", "query"):
        response = api.post(f"/packs/widgets/{endpoint}", json={"question": QUESTION})
        timing = server_timing(response)
        assert set(timing) == {"queue", "retrieval", "encode", "app"}, endpoint
        assert timing["retrieval"] > 0
        # The app's time holds the others: they are parts of one request.
        assert timing["app"] >= timing["queue"] + timing["retrieval"] + timing["encode"]


def test_questions_beyond_the_pool_wait_their_turn(root):
    """With one retrieval thread, questions asked at once are answered one after another:
    the ones that came later say they waited in the queue."""
    clients = 3
    timings: list[dict[str, float]] = []
    start = threading.Barrier(clients)

    def ask(url: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            start.wait()
            response = client.post("/packs/widgets/search", json={"question": QUESTION})
            assert response.status_code == 200
            timings.append(server_timing(response))

    with running(create_app(root / "packs", warmup=True, retrieval_threads=1)) as url:
        threads = [threading.Thread(target=ask, args=(url,)) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert len(timings) == clients
    waited = sorted(t["queue"] for t in timings)
    # The last one waited for at least one other question to be answered.
    assert waited[-1] >= min(t["retrieval"] for t in timings), timings


def events_of(response: httpx.Response) -> Iterator[tuple[str, dict, float]]:
    """(event, data, time.monotonic() when it arrived) for each server-sent event."""
    event = None
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            assert event is not None, line
            yield event, json.loads(line.removeprefix("data: ")), time.monotonic()
        else:
            assert line == "", line  # an event is its two lines and a blank line
            event = None


def stream_query(api: httpx.Client, **request) -> list[tuple[str, dict, float]]:
    with api.stream("POST", "/packs/widgets/query", **request) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-kpack-version"] == "1"
        return list(events_of(response))


def same_answer(streamed: dict, plain: dict) -> None:
    for key in ("answer", "sources", "citations", "query_type", "entities", "facts"):
        assert streamed[key] == plain[key], key
    assert set(streamed) == set(plain) == QUERY_KEYS


def test_offline_query_streams_one_delta_then_the_result(api):
    plain = api.post("/packs/widgets/query", json={"question": QUESTION, "use_llm": False}).json()
    for request in (
        {"json": {"question": QUESTION, "use_llm": False, "stream": True}},
        {
            "json": {"question": QUESTION, "use_llm": False},
            "headers": {"Accept": "text/event-stream"},
        },
    ):
        events = stream_query(api, **request)
        assert [event for event, _, _ in events] == ["delta", "result"]
        result = events[-1][1]
        assert events[0][1]["text"] == result["answer"] and "[Source: " in result["answer"]
        same_answer(result, plain)


@pytest.fixture
def claude(monkeypatch: pytest.MonkeyPatch):
    """Start a fake Messages API with the given stream options; the server's queries use it."""
    started = []

    def start(**options) -> LoopbackServer:
        fake = fake_anthropic_server(**options).__enter__()
        started.append(fake)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key-not-real")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base)
        return fake

    yield start
    for fake in started:
        fake.__exit__(None, None, None)


def test_claude_answer_streams_as_it_is_written(api, claude):
    fake = claude(stream_pieces=8, delta_delay_s=0.1, replies=SUPPORTED)
    events = stream_query(api, json={"question": QUESTION, "stream": True})
    names = [event for event, _, _ in events]
    assert names == ["delta"] * 8 + ["result"], names
    (sent,) = fake.streams
    # The first piece reached the HTTP client while Claude was still writing the answer.
    assert events[0][2] < sent["last_sent"]
    result = events[-1][1]
    assert "".join(data["text"] for _, data, _ in events[:-1]) == result["answer"]
    assert result["answer"] == SUPPORTED["<passages>"]  # every citation checked, supported
    assert result["token_usage"] == {"input_tokens": 100, "output_tokens": 20, "api_calls": 1}
    plain = api.post("/packs/widgets/query", json={"question": QUESTION})
    assert fake.requests[-1]["body"].get("stream") is None  # answered without streaming
    same_answer(result, plain.json())
    assert result["token_usage"] == plain.json()["token_usage"]
    # When the pack has nothing to say, Claude's answer on its own streams the same way.
    events = stream_query(api, json={"question": OUT_OF_DOMAIN, "stream": True})
    result = events[-1][1]
    assert result["query_type"] == "confidence_gated_fallback"
    assert "".join(data["text"] for _, data, _ in events[:-1]) == result["answer"]
    assert len(events) > 2 and "own expertise" in result["answer"]


def test_claude_failing_part_way_resets_to_the_offline_answer(api, claude):
    claude(fail_after_deltas=3)
    events = stream_query(api, json={"question": QUESTION, "stream": True})
    names = [event for event, _, _ in events]
    assert names == ["delta"] * 3 + ["reset", "delta", "result"], names
    result = events[-1][1]
    assert events[-2][1]["text"] == result["answer"]
    assert "overloaded_error: Overloaded" in events[3][1]["detail"]
    note, offline = result["answer"].split("\n\n", 1)
    assert (
        note
        == "The Claude API did not answer (APIStatusError overloaded_error: Overloaded); offline answer below:"
    )
    plain = api.post("/packs/widgets/query", json={"question": QUESTION, "use_llm": False})
    assert offline == plain.json()["answer"]
    assert "overloaded_error" in result["trace"]["llm_error"]
    # The server stays up and answers the next streamed question.
    assert api.get("/healthz").json() == {"status": "ok"}
    assert stream_query(api, json={"question": QUESTION, "use_llm": False, "stream": True})


def test_a_client_that_hangs_up_stops_the_claude_request(api, claude):
    fake = claude(stream_pieces=8, delta_delay_s=0.2)
    with api.stream(
        "POST", "/packs/widgets/query", json={"question": QUESTION, "stream": True}
    ) as response:
        event, data, _ = next(events_of(response))
        assert event == "delta" and data["text"]
    deadline = time.monotonic() + 10
    while not fake.streams[0]["aborted"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake.streams[0]["aborted"], fake.streams  # the server closed its request to Claude
    assert api.get("/healthz").json() == {"status": "ok"}


def test_a_slow_claude_answer_does_not_hold_back_offline_questions(root, claude):
    # Claude takes 2 s to write its answer
    fake = claude(stream_pieces=8, delta_delay_s=0.25, replies=SUPPORTED)
    with (
        running(create_app(root / "packs", warmup=True, retrieval_threads=1)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        streamed: list[tuple[str, dict, float]] = []

        def ask_claude() -> None:
            with client.stream(
                "POST", "/packs/widgets/query", json={"question": QUESTION, "stream": True}
            ) as response:
                streamed.extend(events_of(response))

        claude_thread = threading.Thread(target=ask_claude)
        claude_thread.start()
        while not fake.streams:  # Claude is writing
            time.sleep(0.02)
        # The one retrieval thread is free: the Claude question waits in a pool of its own.
        search = client.post("/packs/widgets/search", json={"question": QUESTION})
        offline = client.post("/packs/widgets/query", json={"question": QUESTION, "use_llm": False})
        answered_offline = time.monotonic()
        claude_thread.join(timeout=60)
    assert search.status_code == offline.status_code == 200
    assert server_timing(search)["queue"] < 100 and server_timing(offline)["queue"] < 100
    assert [event for event, _, _ in streamed] == ["delta"] * 8 + ["result"]
    assert answered_offline < streamed[-1][2]  # both offline answers came while Claude wrote


@pytest.mark.parametrize(
    ("path", "payload", "status", "detail"),
    [
        ("/packs/nope/query", {"question": "x"}, 404, "unknown pack 'nope'"),
        ("/packs/nope/search", {"question": "x"}, 404, "unknown pack 'nope'"),
        ("/packs/widgets/query", {"question": ""}, 422, "the question is empty"),
        ("/packs/widgets/search", {"question": "   "}, 422, "the question is empty"),
        (
            "/packs/widgets/query",
            {"question": "why " * 2001},
            422,
            "the question is 8,004 characters long; the limit is 8,000",
        ),
        ("/packs/widgets/query", {}, 422, "question: Field required"),
        ("/packs/widgets/search", {"question": "x", "k": 0}, 422, "k: Input should be greater"),
        (
            "/packs/widgets/query",
            {"question": "x", "k": MAX_SERVED_K + 1},
            422,
            f"k: Input should be less than or equal to {MAX_SERVED_K}",
        ),
        ("/packs/widgets/query", {"question": "x", "profile": "fast"}, 422, "profile: Input"),
        ("/packs/widgets/query", {"question": "x", "colour": 1}, 422, "colour: Extra inputs"),
        ("/packs/unbuilt/query", {"question": "x"}, 409, "has not been built yet"),
        ("/packs/unbuilt/search", {"question": "x"}, 409, "has not been built yet"),
    ],
)
def test_errors_are_clear(api, path, payload, status, detail):
    response = api.post(path, json=payload)
    assert response.status_code == status, response.text
    assert detail in response.json()["detail"]
    assert "Traceback" not in response.text


def test_unknown_pack_info_and_bad_json(api):
    response = api.get("/packs/nope")
    assert (
        response.status_code == 404
        and "the pack list names the packs served here" in response.json()["detail"]
    )
    response = api.post(
        "/packs/widgets/query", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422 and "JSON" in response.json()["detail"]


def test_request_bodies_are_bounded(api):
    big = json.dumps({"question": "x" * (MAX_BODY_BYTES + 10)}).encode()
    response = api.post(
        "/packs/widgets/query", content=big, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413 and "too large" in response.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding
        yield b'{"question": "'
        for _ in range(MAX_BODY_BYTES // 1000 + 2):
            yield b"x" * 1000
        yield b'"}'

    response = api.post(
        "/packs/widgets/search", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413 and "too large" in response.json()["detail"]


def test_bearer_token(root):
    with (
        running(create_app(root / "packs", token="s3cret")) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        assert client.get("/healthz").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            response = client.get("/packs", headers=headers)
            assert response.status_code == 401
            assert response.json() == {"detail": "missing or wrong bearer token"}
            assert response.headers["www-authenticate"] == "Bearer"
        ok = client.post(
            "/packs/widgets/search",
            json={"question": QUESTION, "k": 1},
            headers={"Authorization": "Bearer s3cret"},
        )
        assert ok.status_code == 200 and ok.json()["results"][0]["title"] == "User Guide"


def test_kpack_serve_command(root):
    """The CLI entry point: loopback, token from the environment, a clean stop on SIGINT."""
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    env = {
        **os.environ,
        "KPACK_PACKS_DIR": str(root / "packs"),
        "KPACK_API_TOKEN": "from-env",
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("ANTHROPIC_API_KEY", None)
    kpack = Path(sys.executable).with_name("kpack")
    process = subprocess.Popen(
        [str(kpack), "serve", "--port", str(port), "--no-warmup"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_serving(process, url, 120)
        assert httpx.get(f"{url}/packs").status_code == 401
        response = httpx.post(
            f"{url}/packs/widgets/search",
            json={"question": QUESTION, "k": 2},
            headers={"Authorization": "Bearer from-env"},
            timeout=120,
        )
        assert response.status_code == 200 and len(response.json()["results"]) == 2
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert f"on http://127.0.0.1:{port}" in stderr and "bearer token required" in stderr
    assert "Traceback" not in stderr


def test_rebuild_publishes_while_requests_run(api, root, site):
    """A rebuild that changes a page publishes v2 while clients query; no request fails, and
    the server answers from v2 afterwards without a restart."""
    statuses: list[int] = []
    versions: set[str] = set()
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=str(api.base_url), timeout=60) as own:
            while not stop.is_set():
                response = own.post(
                    "/packs/widgets/search", json={"question": "calibration step", "k": 3}
                )
                statuses.append(response.status_code)
                versions.add(response.headers.get("x-kpack-version", "?"))

    threads = [threading.Thread(target=client) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        site.revisions[LIVE] = 2
        assert build(root, "widgets").published
        deadline = time.monotonic() + 30
        while "2" not in versions and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert statuses and set(statuses) == {200}, statuses
    assert {"1", "2"} <= versions
    assert api.get("/packs/widgets").json()["version"] == 2
    response = api.post(
        "/packs/widgets/query",
        json={"question": "Which revision documents calibration step number 2?", "use_llm": False},
    )
    assert response.headers["x-kpack-version"] == "2"
    texts = " ".join(
        hit["text"]
        for hit in api.post(
            "/packs/widgets/search", json={"question": "calibration step number", "k": 5}
        ).json()["results"]
    )
    assert "revision 2" in texts and "revision 1 " not in texts
