"""An archive is data, never policy: the settings of a stranger's kg_config.json that would let
the next build of the installed pack reach outside it are dropped unless the user trusts them.

``fetch.file_roots`` says which folders ``file:`` URLs may read, ``fetch.allow_private_hosts``
whether the build may reach loopback and private addresses. An archive carrying
``file_roots: ["/"]`` and a urls.txt naming ``file:///home/me/.aws/credentials`` would publish
the file on the next `kpack build`, and search and export would carry it on. Installed without
``trust_config``, a pack's file roots are its own folder only (also when the archive says
nothing: the default reaches the project folder) and private hosts are refused; the query
settings, which decide how it answers, are kept as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

from kpack.config import CONFIG_FILE, parse_config, read_config_json
from kpack.errors import PackError

# What an installed pack may read with file: URLs: its own folder.
OWN_FOLDER = "."


def contain_settings(pack_files: Path, trusted: bool) -> list[str]:
    """Rewrite the staged ``kg_config.json`` in ``pack_files`` so its build reaches nothing
    outside the pack (unless ``trusted``); the settings dropped, as ``key value`` texts. A
    kg_config.json that is not valid settings is refused (PackError naming the key)."""
    path, where = pack_files / CONFIG_FILE, f"the archive's {CONFIG_FILE}"
    try:
        raw = read_config_json(path) if path.is_file() else {}
    except PackError as exc:  # named by the staged file's path: named as the archive's
        raise PackError(where + str(exc).removeprefix(str(path))) from None
    parse_config(raw, where)
    if trusted:
        return []
    assert isinstance(raw, dict)  # parse_config refused anything else
    fetch = dict(raw.get("fetch") or {})
    dropped = []
    if fetch.pop("allow_private_hosts", False):
        dropped.append("fetch.allow_private_hosts true")
    roots = fetch.get("file_roots")
    if roots is not None and list(roots) != [OWN_FOLDER]:
        dropped.append(f"fetch.file_roots {json.dumps(roots)}")
    fetch["file_roots"] = [OWN_FOLDER]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**raw, "fetch": fetch}, indent=2) + "\n")
    return dropped


def dropped_note(dropped: list[str]) -> str:
    """The one line install says about what it dropped."""
    return (
        f"dropped from the archive's {CONFIG_FILE}: {', '.join(dropped)} (they would let a "
        "rebuild read files outside the pack or private network addresses; install with "
        "--trust-config to keep them)"
    )
