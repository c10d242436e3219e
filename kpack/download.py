"""Bounded downloads to a local file: one overall deadline and a size cap.

Two callers bring an archive here before installing it: ``kpack install https://...``
(:func:`download_url`) and ``kpack pull`` (kpack.remote, which reads the shared store's file
with the store's client and hands the stream to :func:`copy_bounded`). Both write a new file
that the caller places in its staging folder (kpack.archive.staging), so whatever stops a
download (the cap, the deadline, a full disk, a kill) leaves nothing the next operation does
not remove.

Bounds:

- **size**: an answer that declares its length (``Content-Length``, the store's recorded size)
  may bring that many bytes and no more; one that declares none is cut at the cap the caller
  gives (kpack.archive: ``KPACK_MAX_ARCHIVE_BYTES``), so an endless answer ends there;
- **disk**: never more than the disk of the file has room for, less the margin kept free for
  other writers (kpack.errors.SPACE_MARGIN_BYTES): a declared length beyond that is refused
  before the first byte, and an endless answer stops before it fills the disk (the cap alone,
  64 GiB by default, would let it fill most disks first);
- **time**: the whole download, from connecting to the last byte, must end within
  ``KPACK_DOWNLOAD_DEADLINE_S`` seconds (900 by default). Over HTTP the deadline shuts the
  socket (kpack.ingest.network_guard.guarded), which also ends a read blocked on a server that sends a
  byte every few seconds: a timeout per read would never fire there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import requests
import urllib3

from kpack.errors import SPACE_MARGIN_BYTES, PackError, check_space, disk_errors, room_on_disk
from kpack.ingest.deadline import Deadline
from kpack.ingest.network_guard import guarded, guarded_session

DEADLINE_VARIABLE = "KPACK_DOWNLOAD_DEADLINE_S"
DEFAULT_DEADLINE_S = 900.0
CONNECT_TIMEOUT_S = 30.0
CHUNK = 1 << 20
USER_AGENT = "knowledge-packs/0.1 (kpack install)"


def download_deadline() -> Deadline:
    """A deadline of KPACK_DOWNLOAD_DEADLINE_S seconds from now."""
    text = os.environ.get(DEADLINE_VARIABLE, "").strip()
    try:
        seconds = float(text) if text else DEFAULT_DEADLINE_S
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise PackError(f"{DEADLINE_VARIABLE} must be a number of seconds above 0: {text!r}")
    return Deadline(seconds)


def copy_bounded(
    source: BinaryIO, dest: Path, *, max_bytes: int, deadline: Deadline, what: str
) -> int:
    """Copy ``source`` to the new file ``dest`` until its end; the bytes copied.

    PackError once more than ``max_bytes`` arrive, more than the disk has room for, or the
    deadline passes; the partial file is removed then, as on any other failure.
    """
    written = 0
    try:
        with disk_errors(f"{what}: cannot write {dest}"):
            room = room_on_disk(dest.parent)
            out = dest.open("xb")
        with out:
            while chunk := source.read(CHUNK):
                written += len(chunk)
                if written > max_bytes:
                    raise PackError(
                        f"{what} is larger than {max_bytes:,} bytes: stopped there "
                        "(not a kpack archive of the size it declares, or endless)"
                    )
                if written > room:
                    raise PackError(
                        f"{what} stopped at {written - len(chunk):,} bytes, before it filled the "
                        f"disk of {dest.parent} ({SPACE_MARGIN_BYTES >> 20} MiB are kept free): "
                        "free some space and try again"
                    )
                if deadline.expired:
                    raise _late(what, deadline)
                with disk_errors(f"{what}: cannot write {dest}"):
                    out.write(chunk)
                    out.flush()  # a full disk is reported here, not when the file is closed
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    if deadline.expired:  # a read the deadline cut short can end like a complete one
        dest.unlink(missing_ok=True)
        raise _late(what, deadline)
    return written


def download_url(url: str, dest: Path, *, max_bytes: int) -> int:
    """GET ``url`` into the new file ``dest`` within the download deadline; the bytes written.

    Any host is allowed (the user names the URL); the size is capped at the answer's
    Content-Length when it gives one, else at ``max_bytes``.
    """
    deadline = download_deadline()
    session = guarded_session(USER_AGENT)
    try:
        # identity: the archive is compressed already, and a body decoded on the fly could
        # grow far beyond what the answer declared.
        with (
            guarded(deadline, allow_private=True),
            session.get(
                url,
                stream=True,
                headers={"Accept-Encoding": "identity"},
                timeout=(min(CONNECT_TIMEOUT_S, deadline.remaining()), deadline.seconds),
            ) as response,
        ):
            if response.status_code != 200:
                raise PackError(
                    f"cannot download {url}: HTTP {response.status_code} "
                    f"{response.reason or ''}".rstrip()
                )
            encoding = response.headers.get("content-encoding", "identity").lower()
            if encoding != "identity":
                raise PackError(
                    f"cannot download {url}: the server sent it {encoding}-encoded; "
                    "serve .kpack files as they are (application/octet-stream)"
                )
            cap = _declared_length(response.headers.get("content-length"), url, max_bytes)
            if cap < max_bytes:  # a declared length: known to fit, or not, before it comes
                check_space(dest.parent, cap, f"cannot download {url}: it is")
            return copy_bounded(
                response.raw, dest, max_bytes=cap, deadline=deadline, what=f"download of {url}"
            )
    except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        # A socket the deadline shut surfaces as whatever the read was doing.
        if deadline.expired:
            raise _late(f"download of {url}", deadline) from None
        raise PackError(f"cannot download {url}: {exc}") from None
    finally:
        session.close()


def _declared_length(header: str | None, url: str, max_bytes: int) -> int:
    if header is None:
        return max_bytes
    if not header.strip().isdigit():
        raise PackError(f"cannot download {url}: invalid Content-Length {header!r}")
    declared = int(header)
    if declared > max_bytes:
        raise PackError(
            f"cannot download {url}: it is {declared:,} bytes, more than the {max_bytes:,} an "
            "archive may have (KPACK_MAX_ARCHIVE_BYTES)"
        )
    return declared


def _late(what: str, deadline: Deadline) -> PackError:
    return PackError(
        f"{what} did not finish within {deadline.seconds:g} s (set {DEADLINE_VARIABLE} for a "
        "slower link): stopped"
    )
