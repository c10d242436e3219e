"""GitHub blob pages rewritten to their raw files: a blob page is HTML around the file, and the
raw file is what a pack wants."""

from __future__ import annotations

from urllib.parse import urlsplit

GITHUB_HOST = "github.com"
GITHUB_RAW_BASE = "https://raw.githubusercontent.com"


def rewrite_github_blob(url: str, host: str = GITHUB_HOST, raw_base: str = GITHUB_RAW_BASE) -> str:
    """``https://github.com/OWNER/REPO/blob/REF/PATH`` as its raw file's URL under
    ``raw_base``; any other URL as it is."""
    parts = urlsplit(url)
    segments = parts.path.strip("/").split("/")
    if parts.netloc.lower() != host or len(segments) < 5 or segments[2] != "blob":
        return url
    owner, repo, _, ref, *path = segments
    return f"{raw_base.rstrip('/')}/{owner}/{repo}/{ref}/{'/'.join(path)}"
