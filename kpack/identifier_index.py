"""The identifiers a version's passages write (kpack.text.written_identifiers), as an index
file the build writes and a reader maps.

An identifier a question names ("os.path.join") that no passage of the pack writes is one
the pack cannot answer about (retrieval.missing_names). Finding that out by reading every
passage took a fresh process 12 s on the first offline answer of a 100,000-chunk pack, so
the build reads them once and saves the identifiers' 64-bit key hashes (kpack.mapped_tables),
sorted: a reader asks for one by bisection over the mapped array. Two identifiers sharing a
hash are one in 2^64 per pair, a false "the pack writes it" that costs nothing worse than the
scan it replaces would have given for a name the pack does write.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from pathlib import Path

import numpy as np

from kpack.index_files import IDENTIFIERS
from kpack.mapped_tables import key_hash, load_array
from kpack.text import written_identifiers


class IdentifierIndex(Container[str]):
    """Whether the version's passages write an identifier (lower case, as
    kpack.text.written_identifiers spells them)."""

    def __init__(self, hashes: np.ndarray) -> None:
        self._hashes = hashes

    def __contains__(self, identifier: object) -> bool:
        if not isinstance(identifier, str):
            return False
        wanted = np.uint64(key_hash(identifier))
        at = int(np.searchsorted(self._hashes, wanted))
        return at < len(self._hashes) and self._hashes[at] == wanted

    def __len__(self) -> int:
        return len(self._hashes)


def write_identifier_index(folder: Path, texts: Iterable[str]) -> None:
    """Save the sorted key hashes of the identifiers the texts write into ``folder``."""
    hashes = np.fromiter((key_hash(name) for name in written_identifiers(texts)), np.uint64)
    np.save(folder / IDENTIFIERS, np.unique(hashes))


def load_identifier_index(folder: Path) -> IdentifierIndex | None:
    """The version's identifier index, mapped; None for a version built before it had one."""
    if not (folder / IDENTIFIERS).is_file():
        return None
    return IdentifierIndex(load_array(folder, IDENTIFIERS))
