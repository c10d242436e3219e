"""Definitions as units of their own: an API entry's signature line and its first line of
description, embedded apart from the passage that holds it.

A reference page packs many entries into one passage ("os.listdir(path='.')", "Return a list
containing the names of the entries in the directory given by path.", then the next entry),
so the passage's vector is the average of several APIs and matches none of them well. An
intent written by a developer ("list the files of a directory") reads like one entry's first
sentence. Each identifier a section defines (kpack.ingest.sections: ``defines``) therefore
gets an entry text: its name, the line of its defining passage that writes its signature,
and the line after it; the embeddings stage embeds these texts beside the passages
(kpack.ingest.vectors), and the documentation graph stores their vectors in the order of its
definitions (kpack.docgraph ``definition_vectors.npy``), so a query finds the entry, and with
it the passage that defines it.

The defining passage is the first of the section's passages that writes the identifier's last
part and a parenthesis (a signature: "default(o)" for ``json.JSONEncoder.default``), else the
first that writes the last part (an attribute), else the section's first passage.
"""

from __future__ import annotations

from collections.abc import Sequence

from kpack.contracts import content_hash

# The lines of an entry after its name: the signature line and the first line of its
# description, which is where reference documentation says what the API does.
ENTRY_LINES = 2
# An entry text stops at this many characters (a long first paragraph says what it does in
# its first sentence; the model reads at most its first word pieces anyway).
MAX_ENTRY_CHARS = 400


def last_part(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def defining_passage(name: str, texts: Sequence[str]) -> int:
    """The index in ``texts`` (a section's passages, in order) of the one defining ``name``."""
    last = last_part(name)
    for written in (f"{last}(", last):
        found = next((i for i, text in enumerate(texts) if written in text), None)
        if found is not None:
            return found
    return 0


def entry_text(name: str, passage: str) -> str:
    """The entry of ``name`` in its defining passage: its name, then its signature line (the
    first line writing its last part and a parenthesis, else its last part) and the line after
    it; the name alone when the passage does not write it."""
    last = last_part(name)
    lines = [line.strip() for line in passage.split("\n") if line.strip()]
    at = next((i for i, line in enumerate(lines) if f"{last}(" in line), None)
    if at is None:
        at = next((i for i, line in enumerate(lines) if last in line), None)
    body = "\n".join(lines[at : at + ENTRY_LINES]) if at is not None else ""
    return f"{name}\n{body}"[:MAX_ENTRY_CHARS].strip()


def entry_hash(text: str) -> str:
    """The content hash an entry's vector is cached and found under: apart from the passages'
    (an entry text is never a passage text, whose hash covers a heading path)."""
    return content_hash(f"definition\n{text}")
