"""The tests' loopback site stays quiet when a client gives up on it, as the fetcher's timeout
tests make it do: a passing `make test` prints no http.server traceback."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.loopback import LoopbackServer, SiteHandler


class QuickSlowHandler(SiteHandler):
    slow_seconds = 0.5


def test_a_client_that_gives_up_on_a_slow_answer_prints_no_traceback(capfd):
    with LoopbackServer(QuickSlowHandler) as server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(server.url("/slow.html"), timeout=0.1)
        time.sleep(1.0)  # the handler writes its late answer to a closed connection
    _, err = capfd.readouterr()
    assert "Traceback" not in err and "Exception occurred" not in err, err
