"""Politeness: request starts to one host spaced by ``fetch.per_host_delay_s``, or the longer
``Crawl-delay`` its robots.txt asks for, across every worker thread of a run."""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit


class HostThrottle:
    """Spaces request starts to one host by ``delay_s``, or by the longer delay the host asked
    for (set_delay), whichever worker thread sends them."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self._next_at: dict[str, float] = {}
        self._host_delays: dict[str, float] = {}

    def set_delay(self, host: str, delay_s: float) -> None:
        """Space the requests to ``host`` by at least ``delay_s`` from now on."""
        with self._lock:
            self._host_delays[host.lower()] = delay_s

    def wait(self, url: str) -> None:
        host = (urlsplit(url).hostname or "").lower()
        with self._lock:
            delay = max(self.delay_s, self._host_delays.get(host, 0.0))
            if delay <= 0:
                return
            now = time.monotonic()
            start = max(now, self._next_at.get(host, 0.0))
            self._next_at[host] = start + delay
        if start > now:
            time.sleep(start - now)
