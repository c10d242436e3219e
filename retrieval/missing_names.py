"""The names a question asks about that the passages never mention: then they do not answer.

A name has no paraphrase (a question about Neo4j is not answered by a passage about Kuzu), so
the offline answer (retrieval.extractive) says plainly that the passages do not answer when
the question names something (a capitalised name: "Neo4j", "Windows"; an identifier:
"requests.get"; a release: "Python 3.14") that none of the passages mentions, however close
their other words are. A name one typing slip away from a passage's word is taken for that
word (:func:`misspelled`), and one the passages write as two words is mentioned
(:func:`written_apart`).
"""

from __future__ import annotations

import re
from collections.abc import Container
from functools import lru_cache
from itertools import pairwise

from kpack.text import fold_word, stem, words, written_identifiers
from retrieval.key_items import QUESTION_IDENTIFIER, QUESTION_NAME, RELEASE
from retrieval.query import ContextSection

# Every offline answer that declines starts so (the benchmarks count them by it).
DECLINED = "The pack's passages do not"
# A question's name is taken for a misspelled passage word from this many letters on: one
# letter's difference between two shorter words is most often two different words ("cart",
# "card"), not a typing slip.
MIN_TYPO_NAME = 5


@lru_cache(maxsize=16384)
def word_stems(text: str) -> frozenset[str]:
    """Every word of a text (stop words too), as a name key (kpack.text.fold_word: accents
    folded, so "Beyonce" is "Beyoncé") and stemmed: what a name is looked up in."""
    return frozenset(stem(fold_word(w)) for w in set(words(text)))


def misspelled(name: str, mentioned: frozenset[str]) -> bool:
    """True when a name of the question is a passage's word misspelled: one letter added,
    dropped or changed ("Brightwatr" for "Brightwater"), or the word with up to two letters
    more or fewer at its end, as an inflection or a derived word writes it ("Marrowan",
    "Marrow"). Names of fewer than ``MIN_TYPO_NAME``
    letters are not guessed at."""
    folded = fold_word(name.lower())
    # Both the stem and the whole word: the stemmer may cut a misspelled name as if it were an
    # inflected word ("Lindqvsted" -> "lindqvst").
    keys = {k for k in (stem(folded), folded) if len(k) >= MIN_TYPO_NAME}
    return any(
        _one_edit(key, word)
        or (
            abs(len(word) - len(key)) <= 2
            and min(len(word), len(key)) >= MIN_TYPO_NAME
            and (word.startswith(key) or key.startswith(word))
        )
        for key in keys
        for word in mentioned
        if abs(len(word) - len(key)) <= 2
    )


def _one_edit(a: str, b: str) -> bool:
    """True when a and b differ by one inserted, deleted or replaced letter."""
    if len(a) > len(b):
        a, b = b, a
    if len(b) - len(a) > 1:
        return False
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
    return a[at + (len(a) == len(b)) :] == b[at + 1 :] and a != b


def written_apart(name: str, passages: list[ContextSection]) -> bool:
    """True when the passages write a name of the question as two words ("Seawolf": "Sea
    Wolf")."""
    key = fold_word(name.lower())
    return any(
        fold_word(a.lower()) + fold_word(b.lower()) == key
        for p in passages
        for a, b in pairwise(words(p.text))
    )


def missing_names(
    question: str, passages: list[ContextSection], known: Container[str] | None = None
) -> list[str]:
    """The names the question asks about that none of the passages mentions, and the
    identifiers ("requests.get") that the pack never writes (``known``: the identifiers all
    its passages write; without it, those the given passages write). A name has no
    paraphrase (a question about Neo4j is not answered by a passage about Kuzu), so a passage
    that does not name it does not answer the question, however close its words are; a name
    one typing slip away from a passage's word is taken for that word (:func:`misspelled`),
    and one the passages write as two words is mentioned (:func:`written_apart`)."""
    mentioned = frozenset().union(*(word_stems(p.text) for p in passages))
    names = dict.fromkeys(m.group(0) for m in QUESTION_NAME.finditer(question))
    missing = [
        name
        for name in names
        if not word_stems(name) <= mentioned
        and not misspelled(name, mentioned)
        and not written_apart(name, passages)
    ]
    if known is None:
        known = written_identifiers(p.text for p in passages)
    for identifier in dict.fromkeys(m.group(0) for m in QUESTION_IDENTIFIER.finditer(question)):
        if identifier.lower() not in known:
            missing.append(identifier)
    # A release the question names ("Python 3.14") that no passage mentions: the passages
    # are about other releases, however close their words.
    held = " ".join(p.text for p in passages)
    missing += [v for v in dict.fromkeys(RELEASE.findall(question)) if not _holds_version(held, v)]
    return missing


def _holds_version(text: str, version: str) -> bool:
    """True when the text writes the version (not as part of a longer one: "3.14" is not
    "3.1")."""
    return re.search(rf"(?<![\w.]){re.escape(version)}(?![\w]|\.\d)", text) is not None
