"""Readers in a long-lived server (issue 20): over real HTTP (uvicorn on loopback) with real
packs built from the loopback site.

- the version a response reports is the version whose reader answered, across publishes;
- a reader in use is never closed: held across two publishes it still answers, and closes
  on its release;
- a new version is opened beside the requests: one slow to open holds back no request to
  another pack, nor to itself (its old version answers until the new one is warm), and one
  that fails to open leaves the old version answering.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import retrieval
from retrieval import registry
from serving.http import create_app
from tests.conftest import TEST_FETCH, build, write_pack
from tests.test_serving_http import LIVE, PAGES, QUESTION, running

SLOW_OPEN_S = 6.0


@pytest.fixture(scope="module")
def root(site, tmp_path_factory) -> Path:
    workspace = tmp_path_factory.mktemp("readers")
    site.revisions[LIVE] = 1
    write_pack(workspace, "widgets", [site.url(p) for p in PAGES], {"fetch": TEST_FETCH})
    write_pack(workspace, "gadgets", [site.url("/docs/guide.html")], {"fetch": TEST_FETCH})
    assert build(workspace, "widgets").published
    assert build(workspace, "gadgets").published
    return workspace


@pytest.fixture(scope="module")
def url(root) -> Iterator[str]:
    retrieval.close_all()
    with running(create_app(root / "packs", warmup=True, retrieval_threads=4)) as served:
        yield served


def search(client: httpx.Client, pack: str, question: str = QUESTION) -> httpx.Response:
    response = client.post(f"/packs/{pack}/search", json={"question": question, "k": 5})
    assert response.status_code == 200, response.text
    return response


def test_reported_version_is_the_answering_version_and_held_readers_stay_open(root, url, site):
    packs = root / "packs"
    held = retrieval.registry.checkout(packs / "widgets")  # a query in flight on version 1
    assert held.version == 1
    with httpx.Client(base_url=url, timeout=120) as client:
        seen: list[tuple[str, int, str]] = []
        stop = threading.Event()

        def ask() -> None:
            with httpx.Client(base_url=url, timeout=120) as own:
                while not stop.is_set():
                    response = search(own, "widgets", "calibration step number")
                    texts = " ".join(hit["text"] for hit in response.json()["results"])
                    seen.append(
                        (response.headers["x-kpack-version"], response.json()["version"], texts)
                    )

        asking = threading.Thread(target=ask)
        asking.start()
        try:
            for revision in (2, 3):  # two publishes while the held reader is in use
                site.revisions[LIVE] = revision
                assert build(root, "widgets").published
                deadline = time.monotonic() + 60
                while not any(body == revision for _, body, _ in seen[-3:]):
                    assert time.monotonic() < deadline, seen[-3:]
                    time.sleep(0.1)
        finally:
            stop.set()
            asking.join(timeout=120)

        # Every response named the version that answered it: header and body agree, and the
        # text is that version's (each revision of the live page says its number).
        assert {body for _, body, _ in seen} >= {1, 2, 3}
        for header, body, texts in seen:
            assert header == str(body)
            for other in {1, 2, 3} - {body}:
                assert f"revision {other} " not in texts, (body, texts)

        # The reader held since version 1 was never closed; it still answers, from version 1.
        assert not held.closed and held.users == 1
        pinned = retrieval.search(held, "calibration step number", k=5)
        assert pinned.version == 1
        assert "revision 1" in " ".join(hit["text"] for hit in pinned)
        answered = retrieval.query(held, QUESTION, use_llm=False)
        assert answered["version"] == 1
        assert search(client, "widgets").headers["x-kpack-version"] == "3"
        held.release()  # the last user of a retired version closes it
        assert held.closed
        # A streamed answer reports the same version in its header and in its result.
        with client.stream(
            "POST",
            "/packs/widgets/query",
            json={"question": QUESTION, "use_llm": False, "stream": True},
        ) as response:
            assert response.headers["x-kpack-version"] == "3"


@pytest.fixture
def slow_gadgets(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Opening any new gadgets version takes SLOW_OPEN_S longer (a warmer that waits); the
    event is set when such an open starts."""
    started = threading.Event()

    def slow(reader: retrieval.PackReader) -> None:
        if reader.name == "gadgets":
            started.set()
            time.sleep(SLOW_OPEN_S)

    monkeypatch.setattr(registry, "WARMERS", [*registry.WARMERS, slow])
    return started


def test_a_new_version_opens_beside_the_requests(root, url, slow_gadgets):
    with httpx.Client(base_url=url, timeout=120) as client:
        before = search(client, "gadgets").json()["version"]
        assert build(root, "gadgets", force=True).published  # a new version to open
        published = time.perf_counter()
        # The first request after the publish starts the open and is answered at once by the
        # old version; so is every request while it opens, to this pack and to the other.
        waits = []
        for pack in ("gadgets", "widgets", "gadgets", "widgets", "gadgets"):
            started = time.perf_counter()
            response = search(client, pack)
            waits.append(time.perf_counter() - started)
            if pack == "gadgets":
                assert response.headers["x-kpack-version"] == str(before)
            assert slow_gadgets.wait(60), "the new gadgets version was not opened"
        assert max(waits) < SLOW_OPEN_S / 2, waits
        # Once warm, the new version answers.
        while search(client, "gadgets").headers["x-kpack-version"] != str(before + 1):
            assert time.perf_counter() - published < 120, "the new version never answered"
            time.sleep(0.2)
        assert time.perf_counter() - published >= SLOW_OPEN_S


def test_a_version_that_fails_to_open_leaves_the_old_one_answering(root, url, monkeypatch, caplog):
    def broken(reader: retrieval.PackReader) -> None:
        if reader.name == "gadgets":
            raise RuntimeError("the warm-up failed")

    monkeypatch.setattr(registry, "WARMERS", [*registry.WARMERS, broken])
    with httpx.Client(base_url=url, timeout=120) as client:
        before = search(client, "gadgets").json()["version"]
        assert build(root, "gadgets", force=True).published
        deadline = time.perf_counter() + 60
        while "could not be opened" not in caplog.text:
            assert search(client, "gadgets").headers["x-kpack-version"] == str(before)
            assert time.perf_counter() < deadline, "the failed open was not logged"
            time.sleep(0.2)
        assert "gadgets" in caplog.text and "the warm-up failed" in caplog.text
        # Not tried again for every request: the old version keeps answering.
        assert search(client, "gadgets").headers["x-kpack-version"] == str(before)
        monkeypatch.setattr(registry, "WARMERS", [w for w in registry.WARMERS if w is not broken])
        assert build(root, "gadgets", force=True).published  # the next version opens
        while search(client, "gadgets").headers["x-kpack-version"] != str(before + 2):
            assert time.perf_counter() < deadline + 60, "the next version never answered"
            time.sleep(0.2)
