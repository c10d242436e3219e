"""The archive format: which members an archive holds, its header, and the limits of both.

An archive (``NAME-vN.kpack``) is a gzip-compressed tar file with these members, the header
first::

    kpack-archive.json      format, pack, version, embedding, and a SHA-256 and size per file
    pack.db                 the Kuzu database of the version          } the version folder
    manifest.json           the build's manifest                      }
    skill.md                the Claude Code skill                     }
    articles.json           url -> content hash, if any               }
    graph_evidence.json     the graph stages it runs, if measured     }
    urls.txt                the sources                               } the pack folder (the
    kg_config.json          build and query settings, if any          } query side reads
    few_shot_examples.json  example answers, if any                   } kg_config.json and the
    eval/questions.jsonl    evaluation questions, if any              } examples at query time)

Every member is a plain file (``eval`` may appear as a folder), written by kpack.archive.export
with tarfile's POSIX (pax) format.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path, PurePosixPath

from kpack.errors import PackError
from kpack.graph_evidence import EVIDENCE_FILE
from kpack.index_files import INDEX_FILES
from kpack.packs import INDEX_DIR, PUBLISHED_FILES, validate_pack_name

ARCHIVE_FORMAT = 1
ARCHIVE_MANIFEST = "kpack-archive.json"
SUFFIX = ".kpack"
# The files of the published version (installed into .versions/vN); articles.json (url ->
# content hash, what the next build compares with) and graph_evidence.json (the graph stages
# its queries run, kpack.graph_evidence) travel when the version has them ...
VERSION_FILES = PUBLISHED_FILES
# ... as do its retrieval indexes (kpack.index_files), sealed in its manifest like pack.db ...
VERSION_MEMBERS = (
    *VERSION_FILES,
    "articles.json",
    EVIDENCE_FILE,
    *(f"{INDEX_DIR}/{name}" for name in INDEX_FILES),
)
# ... and the user's files of the pack folder that travel with it: the query side reads
# kg_config.json ("query" settings) and few_shot_examples.json at query time, so a pack answers
# the same only with them.
PACK_FILES = ("urls.txt", "kg_config.json", "few_shot_examples.json", "eval/questions.jsonl")
REQUIRED_FILES = (*VERSION_FILES, "urls.txt")
ALLOWED_MEMBERS = frozenset({ARCHIVE_MANIFEST, *VERSION_MEMBERS, *PACK_FILES})
ALLOWED_FOLDERS = frozenset({"eval", INDEX_DIR, "."})
# Files whose absence in an archive means "the defaults": installing over an existing pack
# removes the local ones, or the installed pack would answer with settings it was not built for.
SETTINGS_FILES = ("kg_config.json", "few_shot_examples.json")

# Limits. An archive is read before anything in it can be trusted, so each of these holds
# whatever the archive claims about itself.
MAX_MEMBERS = 64  # a real archive has at most 28 entries; anything far beyond is not one of ours
MAX_HEADER_BYTES = 1 << 20  # kpack-archive.json: a few KiB in a real archive
MAX_MANIFEST_BYTES = 16 << 20  # manifest.json, parsed while installing
# A pax extended header carries a long name or a size over 8 GiB: a few hundred bytes. tarfile
# would read one of any size into memory, hence the archive's own reader (kpack.archive.reader).
MAX_EXTENDED_HEADER_BYTES = 64 << 10
# What the files may declare unpacked, against the archive's own size: a database of a small
# pack is mostly empty pages (139x smaller gzipped for the 3-page test pack), so a fixed
# allowance comes first; beyond it, 100 times the archive.
UNPACKED_ALLOWANCE_BYTES = 256 << 20
MAX_EXPANSION = 100
# And never more than this, whatever the archive's size (KPACK_MAX_ARCHIVE_BYTES); also the
# cap of a download that declares no length.
MAX_ARCHIVE_VARIABLE = "KPACK_MAX_ARCHIVE_BYTES"
DEFAULT_MAX_ARCHIVE_BYTES = 64 << 30
# Reading an archive (gunzip, SHA-256, write) may take this long plus a second per this many
# bytes declared: far slower than any disk, so only something stuck or pathological hits it.
READ_SECONDS = 60.0
READ_BYTES_PER_SECOND = 8 << 20


def max_archive_bytes() -> int:
    """The most an archive may unpack to or download as (KPACK_MAX_ARCHIVE_BYTES)."""
    text = os.environ.get(MAX_ARCHIVE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_MAX_ARCHIVE_BYTES
    if not text.isdigit() or int(text) == 0:
        raise PackError(f"{MAX_ARCHIVE_VARIABLE} must be a whole number of bytes: {text!r}")
    return int(text)


def parse_header(data: bytes, archive: str) -> dict:
    """The header (kpack-archive.json) checked for its fields; PackError naming ``archive``."""
    try:
        header = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PackError(f"{archive}: {ARCHIVE_MANIFEST} is not valid JSON ({exc})") from exc
    if not isinstance(header, dict) or not isinstance(header.get("files"), dict):
        raise PackError(f"{archive}: {ARCHIVE_MANIFEST} has no files table")
    if header.get("format") != ARCHIVE_FORMAT:
        raise PackError(
            f"{archive}: archive format {header.get('format')!r} is not supported "
            f"(this kpack reads format {ARCHIVE_FORMAT})"
        )
    try:
        validate_pack_name(header.get("pack"))
        int(header.get("version"))
    except (PackError, TypeError, ValueError) as exc:
        raise PackError(f"{archive}: {ARCHIVE_MANIFEST} names no valid pack and version") from exc
    files: dict = header["files"]
    for name, entry in files.items():
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and len(entry["sha256"]) == 64
            and isinstance(entry.get("size"), int)
            and entry["size"] >= 0
        ):
            raise PackError(f"{archive}: {ARCHIVE_MANIFEST} has no SHA-256 and size for {name}")
    unexpected = sorted(set(files) - ALLOWED_MEMBERS - {ARCHIVE_MANIFEST})
    if unexpected or ARCHIVE_MANIFEST in files:
        raise PackError(
            f"refusing {archive}: {ARCHIVE_MANIFEST} lists unexpected files "
            f"{unexpected or [ARCHIVE_MANIFEST]}"
        )
    missing = [f for f in REQUIRED_FILES if f not in files]
    if missing:
        raise PackError(f"{archive}: the archive lacks {missing}")
    return header


def check_unpacked_size(files: dict[str, dict], archive_bytes: int, archive: str) -> int:
    """The bytes the files declare, refused when far beyond the archive's own size (a
    compression bomb) or beyond the absolute cap; see the limits above."""
    unpacked = sum(entry["size"] for entry in files.values())
    expansion_cap = UNPACKED_ALLOWANCE_BYTES + MAX_EXPANSION * archive_bytes
    if unpacked > expansion_cap:
        raise PackError(
            f"refusing {archive}: it declares {unpacked:,} bytes unpacked from {archive_bytes:,} "
            f"(more than {UNPACKED_ALLOWANCE_BYTES >> 20} MiB plus {MAX_EXPANSION} times its "
            "size): not a kpack archive, or a compression bomb"
        )
    cap = max_archive_bytes()
    if unpacked > cap:
        raise PackError(
            f"refusing {archive}: it declares {unpacked:,} bytes unpacked, more than the "
            f"{cap:,} allowed ({MAX_ARCHIVE_VARIABLE})"
        )
    return unpacked


def read_seconds(unpacked: int) -> float:
    """How long reading an archive that declares ``unpacked`` bytes may take."""
    return READ_SECONDS + unpacked / READ_BYTES_PER_SECOND


def member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a member must not be installed, or None. Installing writes each allowed member to a
    path of its own choosing anyway; these checks make a hostile archive fail loudly."""
    name = member.name
    if member.issym() or member.islnk():
        kind = "symbolic" if member.issym() else "hard"
        return f"member {name!r} is a {kind} link (to {member.linkname!r}); links are not allowed"
    # REGTYPE and AREGTYPE only: tarfile's isreg() also accepts sparse and contiguous files.
    plain_file = member.type in (tarfile.REGTYPE, tarfile.AREGTYPE)
    if not (plain_file or member.isdir()):
        return f"member {name!r} is not a regular file or folder"
    posix = PurePosixPath(name)
    if posix.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return f"member {name!r} has an absolute path and would write outside the pack folder"
    if ".." in posix.parts or "\\" in name:
        return f"member {name!r} would write outside the pack folder"
    if plain_file and name not in ALLOWED_MEMBERS:
        return f"unexpected member {name!r} (a pack archive holds only {sorted(ALLOWED_MEMBERS)})"
    if member.isdir() and (name.rstrip("/") not in ALLOWED_FOLDERS or member.size):
        return f"unexpected folder {name!r}"
    return None


def read_json(path: Path, what: str, max_bytes: int = MAX_MANIFEST_BYTES) -> dict:
    """A JSON object from a file of at most ``max_bytes``; PackError naming ``what``."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise PackError(f"{what} is {size:,} bytes, more than the {max_bytes:,} allowed")
        data = json.loads(path.read_bytes())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PackError(f"{what} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise PackError(f"{what} is not a JSON object")
    return data
