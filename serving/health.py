"""Packs that failed to open or to answer in this server: reported, never fatal to the others.

A published version that cannot be read (an index of the wrong shape, a file the build never
sealed) raises something other than PackError deep in retrieval. The HTTP API (at warm-up
and per request) and the MCP server record it here against the pack's version; the pack list
and /healthz report it, that pack's questions get its one-line message, and every other pack
answers. A new version of the pack (a build, an install) clears it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import retrieval
from kpack.errors import PackError
from serving import catalog

log = logging.getLogger("kpack.serve")


class PackHealth:
    """The failures of this process's packs, by pack name, each with its version."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: dict[str, tuple[int | None, str]] = {}

    def record(self, name: str, folder: Path, exc: BaseException) -> PackError:
        """Remember that the current version of ``name`` failed with ``exc`` (its traceback goes
        to the server log); the PackError to answer with. The message names no path."""
        version = catalog.version_of(folder)
        log.error("pack %s version %s failed", name, version, exc_info=exc)
        message = (
            f"pack {name!r} cannot answer: its version {version} failed to open or search "
            f"({type(exc).__name__}; see the server log, and run `kpack validate {name}`)"
        )
        with self._lock:
            self._failures[name] = (version, message)
        return PackError(message)

    @contextmanager
    def failures_of(self, name: str, folder: Path | list[Path]) -> Iterator[None]:
        """Anything but a PackError from a pack's version is that pack's failure: recorded
        for the pack listings, and raised as a PackError with its one line; the other packs
        answer. Of several packs asked together, the failure is logged and named, not
        recorded."""
        try:
            yield
        except PackError:
            raise
        except Exception as exc:
            if isinstance(folder, list):
                raise self.record_several(name, exc) from exc
            raise self.record(name, folder, exc) from exc

    def record_several(self, name: str, exc: BaseException) -> PackError:
        """The PackError to answer with when one of several packs asked together ("a,b",
        retrieval.multipack) failed with ``exc``: which one is in the server log; nothing is
        recorded, since the failure is no single pack's."""
        log.error("packs %s failed", name, exc_info=exc)
        return PackError(
            f"packs {name!r} cannot answer together: one of their versions failed to open or "
            f"search ({type(exc).__name__}; see the server log, and ask each pack alone)"
        )

    def failure(self, name: str, folder: Path) -> str | None:
        """The failure recorded for the pack's current version, if any."""
        with self._lock:
            recorded = self._failures.get(name)
        if recorded is None or recorded[0] != catalog.version_of(folder):
            return None
        return recorded[1]

    def summaries(self, root: Path) -> list[dict[str, Any]]:
        """catalog.all_summaries, each failing pack's row with ``"serving": false`` and its
        ``"error"``."""
        rows = catalog.all_summaries(root)
        for row in rows:
            failure = self.failure(row["name"], root / row["name"])
            row["serving"] = failure is None and bool(row.get("published"))
            if failure is not None:
                row["error"] = failure
        return rows

    def failing(self, root: Path) -> dict[str, str]:
        """The messages of the packs whose current version failed, by name."""
        with self._lock:
            names = sorted(self._failures)
        failures = {name: self.failure(name, root / name) for name in names}
        return {name: message for name, message in failures.items() if message is not None}

    def warm_up(self, root: Path) -> None:
        """Open every published pack and load its model: the first real query is then fast.
        A pack that fails is recorded, and the others are still opened."""
        for row in catalog.all_summaries(root):
            if not row.get("published"):
                continue
            folder = root / row["name"]
            try:
                retrieval.search(folder, "warm up", k=1)
            except PackError as exc:
                log.warning("pack %s cannot answer yet: %s", row["name"], exc)
            except Exception as exc:  # a damaged version: reported per pack, never fatal
                self.record(row["name"], folder, exc)
