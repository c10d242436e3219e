"""The offline answer: the sentences of the top passages that answer the question, quoted.

Without a Claude key the answer is made of the pack's own sentences, so it can only say what
the pack says. Which sentences:

1. Candidates are the sentences of the passages kept for the answer (the k best), never the
   whole context. Sentences that only talk about the page ("This page describes ..."), point
   elsewhere ("... is described in [pack layout](pack-layout.md)"), are navigation (a line of
   links) or are the tail of a sentence cut at a passage boundary are no answers and are
   skipped; markdown links are quoted as their text.
2. Each sentence gets two scores on the same 0..1 scale: the cosine similarity of its passage
   to the question (the embedding model's, as the search computed it) and the IDF-weighted
   share of the question's terms the sentence contains (a light stemmer, IDF over the
   candidates, so a term every candidate has counts little and a term none has counts fully
   against all). The answer score is their mean: on SQuAD an equal weight was within a point
   of the best weight. Embedding each sentence as well scored about two points higher on SQuAD
   (0.86 against 0.84 of the answers containing the gold span), but the packaged model costs
   about 40 ms of CPU per sentence, a second or more per question for the few dozen sentences
   of five passages, far beyond the query latency budget, so sentences are not embedded.
   Preferring sentences that hold the kind of answer a question asks for (a number for "how
   many", a name for "who") changed nothing measurable on SQuAD, so there is no such rule.
3. The answer says plainly that the passages do not answer, instead of quoting weak matches,
   when the question names something (a capitalised name: "Neo4j", "Windows") that none of
   the passages mentions, or when even the best sentence scores below ``ANSWER_THRESHOLD``.
   The threshold was measured, not tuned per question: it is the highest round score that
   wrongly refuses at most 1% of the answerable questions whose gold passage was retrieved,
   on SQuAD (0.7%) and on the demo pack's 32 questions, which paraphrase more (none); at
   0.35 SQuAD lost 3.6% of them, 2.7 points of answers that contain the answer.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from kpack.text import prose_lines, split_sentences, stem, words
from retrieval.quality import terms
from retrieval.query import ContextSection

EXTRACTIVE_SENTENCES = 3
MIN_SENTENCE_WORDS, MAX_SENTENCE_WORDS = 4, 80
# Below this answer score the best sentence is not taken for an answer (module docstring).
ANSWER_THRESHOLD = 0.3
# A further sentence is quoted only when it scores at least this share of the best one.
FOLLOWER_SHARE = 0.8

# Every offline answer that declines starts so (the benchmarks count them by it).
DECLINED = "The pack's passages do not"
NO_SENTENCE_ANSWER = (
    f"{DECLINED} answer this question: none of their sentences says what was asked."
)

# Markdown links: quoted as their text, the way the page reads.
MARKDOWN_LINK = re.compile(r"\[([^\]\n]+)\]\(([^)\s]+)\)")
# A sentence about the page or section it is on, not about the subject.
SELF_REFERENCE = re.compile(
    r"^(this|the (following|next|previous|present)|these)\s+(\w+\s+)?"
    r"(page|pages|section|sections|document|chapter|guide|article|tutorial|reference)\b",
    re.IGNORECASE,
)
# A sentence whose point is where something else is explained.
POINTER = re.compile(
    r"\b(is|are)\s+(also\s+)?(described|explained|covered|documented|detailed|introduced)"
    r"\s+(below|above|later|elsewhere|in|on)\b"
    r"|^(see|read)\b|^(if|for)\b[^,]*,\s*(see|read)\b",
    re.IGNORECASE,
)
# A link's target without its text ("as described in (building-packs.md)").
LINK_RESIDUE = re.compile(r"(?<!\])\([\w./-]+\.(md|html?|rst|txt)\)")
# A list of links: a table of contents, "Next: [x](y)".
NAVIGATION_LINKS = 3


# A name in a question: a capitalised word that does not start it ("Neo4j", "Windows"), but
# not a short abbreviation ("TV", "QB"), which has its spelled-out paraphrase.
NAME = re.compile(r"(?<=\s)(?![A-Z]{1,3}s?\b)[A-Z][A-Za-z0-9]*")


@dataclass(frozen=True)
class ScoredSentence:
    text: str  # as quoted: the passage's words, links shown as their text
    passage: ContextSection
    similarity: float  # its passage's cosine similarity to the question
    coverage: float  # IDF-weighted share of the question's terms
    score: float
    position: int  # its place among the candidates, which keep the passages' order


@lru_cache(maxsize=16384)
def stems(text: str) -> frozenset[str]:
    """The stemmed content terms of a text (pack sentences repeat across questions)."""
    return frozenset(map(stem, terms(text)))


def is_boilerplate(sentence: str) -> bool:
    """True for a sentence about the page itself, a pointer elsewhere, navigation, or the tail
    of a sentence that a passage boundary cut (it starts in lower case)."""
    if sentence[:1].islower():
        return True
    plain = MARKDOWN_LINK.sub(r"\1", sentence).strip(" -*")
    if SELF_REFERENCE.match(plain) or POINTER.search(plain) or LINK_RESIDUE.search(sentence):
        return True
    links = MARKDOWN_LINK.findall(sentence)
    linked_words = sum(len(text.split()) for text, _ in links)
    return len(links) >= NAVIGATION_LINKS or linked_words >= 0.5 * len(plain.split())


@lru_cache(maxsize=16384)
def sentences_of(text: str) -> tuple[str, ...]:
    """The prose sentences of a passage (4 to 80 words) that could answer, as quoted."""
    # Code blocks are quoted as they are by Claude, but are no sentences to answer with.
    prose = " ".join(" ".join(prose_lines(text)).split())
    return tuple(
        MARKDOWN_LINK.sub(r"\1", sentence)
        for sentence in split_sentences(prose)
        if MIN_SENTENCE_WORDS <= len(sentence.split()) <= MAX_SENTENCE_WORDS
        and not is_boilerplate(sentence)
    )


@lru_cache(maxsize=16384)
def word_stems(text: str) -> frozenset[str]:
    """Every word of a text (stop words too), stemmed: what a name is looked up in."""
    return frozenset(map(stem, set(words(text))))


def missing_names(question: str, passages: list[ContextSection]) -> list[str]:
    """The names the question asks about that none of the passages mentions. A name has no
    paraphrase (a question about Neo4j is not answered by a passage about Kuzu), so a passage
    that does not name it does not answer the question, however close its words are."""
    mentioned = frozenset().union(*(word_stems(p.text) for p in passages))
    names = dict.fromkeys(m.group(0) for m in NAME.finditer(question))
    return [name for name in names if not word_stems(name) <= mentioned]


def score_sentences(question: str, passages: list[ContextSection]) -> list[ScoredSentence]:
    """Every candidate sentence of the passages with its scores, best first."""
    seen: dict[str, ContextSection] = {}
    for passage in passages:
        for sentence in sentences_of(passage.text):
            seen.setdefault(sentence, passage)  # a sentence of two passages: the better one's
    wanted = stems(question)
    if not seen or not wanted:
        return []
    texts = list(seen)
    found = [stems(t) & wanted for t in texts]
    frequency = Counter(t for f in found for t in f)
    idf = {t: math.log(1 + len(texts) / (1 + frequency[t])) for t in wanted}
    total = sum(idf.values())
    scored = []
    for position, (text, matched) in enumerate(zip(texts, found, strict=True)):
        coverage = sum(idf[t] for t in matched) / total
        similarity = seen[text].similarity
        score = (similarity + coverage) / 2
        scored.append(ScoredSentence(text, seen[text], similarity, coverage, score, position))
    return sorted(scored, key=lambda s: -s.score)


def answering_sentences(scored: list[ScoredSentence]) -> list[ScoredSentence]:
    """The sentences to quote, at most three: the best, if it answers, and those close to it,
    each followed by the sentence after it in its passage when that one answers too.

    The sentence that matches a question best often restates its situation ("A rebuild in
    which no page changed publishes nothing") and the next one says what to do about it ("To
    publish a new version anyway, run ... --force"): a continuation that clears the answer
    threshold is quoted with it, as the passage reads.
    """
    if not scored or scored[0].score < ANSWER_THRESHOLD:
        return []
    floor = max(ANSWER_THRESHOLD, FOLLOWER_SHARE * scored[0].score)
    at = {s.position: s for s in scored}
    chosen: dict[int, ScoredSentence] = {}
    for sentence in (s for s in scored if s.score >= floor):
        following = at.get(sentence.position + 1)
        chosen.setdefault(sentence.position, sentence)
        if (
            following is not None
            and following.passage is sentence.passage
            and following.score >= ANSWER_THRESHOLD
        ):
            chosen.setdefault(following.position, following)
        if len(chosen) >= EXTRACTIVE_SENTENCES:
            break
    return list(chosen.values())[:EXTRACTIVE_SENTENCES]


def extractive_answer(
    question: str, passages: list[ContextSection]
) -> tuple[str, list[ContextSection]]:
    """The quoted answer, each sentence followed by [Source: title], and the passages quoted;
    a plain statement that the passages do not answer, and no passage, when none does."""
    missing = missing_names(question, passages)
    if missing:
        return f"{DECLINED} mention {', '.join(missing)}, so they do not answer this question.", []
    chosen = answering_sentences(score_sentences(question, passages))
    if not chosen:
        return NO_SENTENCE_ANSWER, []
    answer = " ".join(f"{s.text} [Source: {s.passage.title}]" for s in chosen)
    return answer, list({id(s.passage): s.passage for s in chosen}.values())
