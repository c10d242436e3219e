"""Reading an archive in one bounded pass: memory, bytes written and time all capped.

tarfile cannot be given an untrusted archive: it reads a pax or GNU long-name header of any
size into memory before returning a member (a 1.6 MB archive took 1.1 GB), and its members
are only as large as their headers say. So the archive is read here, front to back, one
512-byte header block at a time: tarfile parses each block (``TarInfo.frombuf``: fields and
checksum) and this module decides what is read next:

- a pax extended header is read only up to MAX_EXTENDED_HEADER_BYTES, and only its ``path``
  and ``size`` records are used; every other kind of extension (GNU long names, global
  headers, sparse files) is refused before its data is read;
- the header, ``kpack-archive.json``, must come first and be at most MAX_HEADER_BYTES; the
  sizes it declares are then checked against the archive's size and the absolute cap
  (format.check_unpacked_size) and against the free space where they will be written;
- every other member must be a file the header lists, with the size it lists, before a byte of
  it is read; it is written to a path of the caller's choosing while its SHA-256 is computed,
  so nothing beyond the declared sizes is ever written;
- the whole read must end within format.read_seconds of the declared size.
"""

from __future__ import annotations

import gzip
import hashlib
import re
import tarfile
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO
from urllib.parse import urlsplit

from kpack.archive.format import (
    ARCHIVE_MANIFEST,
    MAX_EXTENDED_HEADER_BYTES,
    MAX_HEADER_BYTES,
    MAX_MEMBERS,
    SUFFIX,
    check_unpacked_size,
    max_archive_bytes,
    member_problem,
    parse_header,
    read_seconds,
)
from kpack.errors import PackError, check_space

BLOCK = tarfile.BLOCKSIZE
END_OF_ARCHIVE = bytes(BLOCK)
CHUNK = 1 << 20
# What a damaged gzip stream raises while it is read.
READ_ERRORS = (OSError, EOFError, zlib.error)
SAFE_FILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,200}")


class Archive:
    """An archive whose header was read and checked; :meth:`extract_all` reads the rest."""

    def __init__(self, path: Path, stream: _TarStream, header: dict, unpacked: int) -> None:
        self.path, self.header, self.unpacked = path, header, unpacked
        self.files: dict[str, dict] = header["files"]
        self._stream = stream

    @property
    def pack(self) -> str:
        return self.header["pack"]

    @property
    def version(self) -> int:
        return int(self.header["version"])

    def extract_all(self, place: Callable[[str], Path], staging: Path) -> None:
        """Write every member to ``place(name)``, a path under ``staging``, checking it first
        (once: the archive is read front to back).

        Refused (PackError) when the disk of ``staging`` cannot hold what the archive declares,
        or at the first member that is not a file the header lists with that size, or whose
        SHA-256 differs; the caller removes what was written (it is all under ``staging``).
        """
        check_space(staging, self.unpacked, f"{self.path.name} unpacks to")
        name, seen = self.path.name, set()
        while (member := self._stream.next_member()) is not None:
            problem = member_problem(member)
            if problem:
                raise PackError(f"refusing {name}: {problem}")
            if member.isdir():
                continue
            if member.name in seen:
                raise PackError(f"refusing {name}: {member.name!r} appears twice")
            seen.add(member.name)
            expected = self.files.get(member.name)
            if expected is None:
                raise PackError(
                    f"refusing {name}: member {member.name!r} has no checksum in {ARCHIVE_MANIFEST}"
                )
            if member.size != expected["size"]:
                raise PackError(
                    f"{name}: {member.name} is {member.size:,} bytes but {ARCHIVE_MANIFEST} says "
                    f"{expected['size']:,}: the archive is damaged or was altered"
                )
            self._stream.extract(member, place(member.name), expected["sha256"])
        missing = sorted(set(self.files) - seen)
        if missing:
            raise PackError(f"{name}: listed but missing from the archive: {missing}")


@contextmanager
def open_archive(path: Path) -> Iterator[Archive]:
    """Open an archive and read its header; every problem is a PackError naming it."""
    path = Path(path)
    if not path.is_file():
        raise PackError(f"{path}: no such file")
    archive_bytes = path.stat().st_size
    with open(path, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
        stream = _TarStream(path.name, unzipped)
        first = stream.next_member()
        if first is None or first.name != ARCHIVE_MANIFEST or member_problem(first):
            raise PackError(
                f"{path.name} is not a kpack archive: it does not start with {ARCHIVE_MANIFEST}"
            )
        if first.size > MAX_HEADER_BYTES:
            raise PackError(
                f"refusing {path.name}: its {ARCHIVE_MANIFEST} is {first.size:,} bytes "
                f"(a real one is a few KiB; at most {MAX_HEADER_BYTES:,} are read)"
            )
        header = parse_header(stream.read_member(first), path.name)
        unpacked = check_unpacked_size(header["files"], archive_bytes, path.name)
        stream.extend_deadline(read_seconds(unpacked))
        yield Archive(path, stream, header, unpacked)


class _TarStream:
    """The members of a gzip-compressed tar file, read front to back (see the module doc)."""

    def __init__(self, name: str, source: BinaryIO) -> None:
        self.name, self.source = name, source
        self.started = time.monotonic()
        self.deadline = self.started + read_seconds(MAX_HEADER_BYTES)
        self.members = 0

    def extend_deadline(self, seconds: float) -> None:
        self.deadline = self.started + seconds

    def next_member(self) -> tarfile.TarInfo | None:
        """The next member's header (pax records applied), its data not yet read; None at
        the end of the archive."""
        extended: dict[str, str] | None = None
        while True:
            block = self._read(BLOCK)
            if block == END_OF_ARCHIVE:
                return None
            if len(block) < BLOCK:
                raise PackError(f"{self.name} is damaged: it ends inside a member header")
            try:
                member = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as exc:
                if self.members == 0 and extended is None:
                    raise PackError(f"{self.name} is not a kpack archive: {exc}") from None
                raise PackError(f"{self.name} is damaged: {exc}") from None
            if member.type != tarfile.XHDTYPE:
                break
            if extended is not None:
                raise PackError(f"refusing {self.name}: two extended headers for one member")
            if member.size > MAX_EXTENDED_HEADER_BYTES:
                raise PackError(
                    f"refusing {self.name}: an extended (pax) header of {member.size:,} bytes "
                    f"(a kpack archive needs at most {MAX_EXTENDED_HEADER_BYTES:,})"
                )
            extended = self._pax_records(self.read_member(member))
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise PackError(f"refusing {self.name}: more than {MAX_MEMBERS} members")
        if extended:
            member.name = extended.get("path", member.name).removesuffix("/")
            size = extended.get("size", str(member.size))
            if not size.isdigit():
                raise PackError(f"{self.name} is damaged: a pax size of {size!r}")
            member.size = int(size)
        return member

    def read_member(self, member: tarfile.TarInfo) -> bytes:
        """A small member's data (the caller checked its size), padding skipped."""
        data = self._read(member.size)
        self._skip_padding(member.size)
        if len(data) < member.size:
            raise PackError(f"{self.name} is damaged: it ends inside {member.name}")
        return data

    def extract(self, member: tarfile.TarInfo, dest: Path, sha256: str) -> None:
        """Write a member's ``member.size`` bytes to the new file ``dest``, checking SHA-256."""
        digest, left = hashlib.sha256(), member.size
        dest.parent.mkdir(parents=True, exist_ok=True)
        # "xb": a fresh file, never one that exists already (or a link planted there).
        with dest.open("xb") as out:
            while left:
                chunk = self._read(min(left, CHUNK))
                if not chunk:
                    raise PackError(f"{self.name} is damaged: it ends inside {member.name}")
                digest.update(chunk)
                out.write(chunk)
                left -= len(chunk)
        self._skip_padding(member.size)
        if digest.hexdigest() != sha256:
            raise PackError(
                f"{self.name}: checksum mismatch for {member.name} (SHA-256 "
                f"{digest.hexdigest()}; the archive lists {sha256}): the archive is damaged or "
                "was altered"
            )

    def _skip_padding(self, size: int) -> None:
        self._read(-size % BLOCK)

    def _read(self, size: int) -> bytes:
        if time.monotonic() > self.deadline:
            raise PackError(
                f"refusing {self.name}: reading it took more than "
                f"{self.deadline - self.started:.0f} s, the bound for the size it declares"
            )
        try:
            return self.source.read(size)
        except gzip.BadGzipFile as exc:
            raise PackError(f"{self.name} is not a kpack archive (a .tar.gz): {exc}") from None
        except READ_ERRORS as exc:
            raise PackError(f"{self.name} is damaged: {exc}") from None

    def _pax_records(self, data: bytes) -> dict[str, str]:
        """The records of a pax header ("LENGTH KEY=VALUE\\n", LENGTH counting the whole
        record), of which only path and size change a member; sparse files are refused."""
        records: dict[str, str] = {}
        position = 0
        while position < len(data):
            space = data.find(b" ", position)
            length = data[position:space]
            if space < 0 or not length.isdigit() or int(length) <= space - position + 1:
                raise PackError(f"{self.name} is damaged: an invalid pax header")
            record = data[space + 1 : position + int(length)]
            key, equals, value = record.partition(b"=")
            if not equals or not record.endswith(b"\n"):
                raise PackError(f"{self.name} is damaged: an invalid pax header")
            keyword = key.decode("utf-8", "surrogateescape")
            if keyword.startswith("GNU.sparse"):
                raise PackError(f"refusing {self.name}: sparse members are not allowed")
            records[keyword] = value[:-1].decode("utf-8", "surrogateescape")
            position += int(length)
        return records


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def local_copy(source: str, staging: Path) -> Path:
    """The archive ``source`` names as a local file: the file itself, or an http(s) URL
    downloaded into ``staging`` (kpack.download: an overall deadline and a size cap)."""
    if not is_url(source):
        return Path(source.removeprefix("file://"))
    from kpack.download import download_url

    # Named as the URL names it (what the installed manifest records), when that is a plain
    # file name.
    path = staging / plain_file_name(PurePosixPath(urlsplit(source).path).name)
    download_url(source, path, max_bytes=max_archive_bytes())
    return path


def plain_file_name(name: str) -> str:
    """``name`` when it is a plain file name (letters, digits, ``._-``), else a fixed one: an
    archive downloaded into a staging folder is named as its source names it."""
    return name if SAFE_FILE_NAME.fullmatch(name) else f"download{SUFFIX}"
