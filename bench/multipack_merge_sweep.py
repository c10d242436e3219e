"""How a search of several packs merges their passages (retrieval.multipack): the rules compared
when PACK_EVIDENCE_PASSAGES and PACK_RANK_STEP were chosen, on packs a run of
bench/ecosystem_bench.py built (``--keep-built`` keeps them in its ``--workdir``).

Each question is searched in every library pack (its top ``--k``, as the merge receives them)
and in the combined pack; the merges are then applied to those lists. A pack's relevance is
read from its passages' cosine similarities: the best one, the mean of the best three, or the
mean of all; a passage's merge score is that relevance less a step per place in its pack's
ranking. Reported: hit@5 (a result's page is a gold page) per question set, on the development
half (even line numbers, where the rule was chosen), the other half and the whole, beside the
combined pack's and the old merge's (each passage's own similarity).

    .venv/bin/python bench/multipack_merge_sweep.py --workdir /tmp/eco \\
        ../shared/benchmarks/conala_dev/questions.jsonl \\
        ../shared/benchmarks/python_docs_qa/questions.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ecosystem_bench import COMBINED, LIBRARIES, hit
from harness import workspace_env

Hits = list[dict[str, Any]]
STRENGTHS: dict[str, Callable[[list[float]], float]] = {
    "best": lambda s: s[0],
    "best 3": lambda s: sum(s[:3]) / len(s[:3]),
    "all": lambda s: sum(s) / len(s),
}
STEPS = (0.0, 0.01, 0.02, 0.04)


def searched(workdir: Path, files: list[Path], k: int) -> list[dict[str, Any]]:
    """Per question: its set, line, gold pages, each library pack's hits and the combined's."""
    os.environ.update(workspace_env(workdir))
    import retrieval

    packs = workdir / "packs"
    rows = []
    for file in files:
        for line, text in enumerate(file.read_text().splitlines()):
            row = json.loads(text) if text.strip() else {}
            if not row.get("gold_pages"):
                continue
            keep = ("url", "similarity")
            rows.append(
                {
                    "set": file.parent.name if file.name == "questions.jsonl" else file.stem,
                    "line": line,
                    "gold_pages": row["gold_pages"],
                    "packs": {
                        lib: [
                            {key: h.get(key) for key in keep}
                            for h in retrieval.search(packs / lib, row["question"], k=k)
                        ]
                        for lib in LIBRARIES
                        if (packs / lib).is_dir()
                    },
                    "combined": [
                        h["url"] for h in retrieval.search(packs / COMBINED, row["question"], k=5)
                    ],
                }
            )
    return rows


def by_similarity(packs: dict[str, Hits]) -> list[str]:
    hits = [h for found in packs.values() for h in found]
    return [h["url"] for h in sorted(hits, key=lambda h: -(h["similarity"] or 0.0))]


def by_relevance(strength: Callable[[list[float]], float], step: float) -> Callable:
    def merge(packs: dict[str, Hits]) -> list[str]:
        scored = []
        for found in packs.values():
            similarities = sorted((h["similarity"] or 0.0 for h in found), reverse=True)
            relevance = strength(similarities) if similarities else 0.0
            scored += [(relevance - step * place, h["url"]) for place, h in enumerate(found)]
        return [url for _, url in sorted(scored, key=lambda t: -t[0])]

    return merge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("questions", nargs="+", type=Path)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument(
        "--k",
        type=int,
        default=10,
        help="passages asked of each pack (the merge asks retrieval.multipack.PACK_SEARCH_DEPTH)",
    )
    args = parser.parse_args()
    rows = searched(args.workdir.resolve(), args.questions, args.k)
    rules: dict[str, Callable] = {"combined pack": None, "each passage's similarity": by_similarity}  # type: ignore[dict-item]
    for name, strength in STRENGTHS.items():
        for step in STEPS:
            rules[f"relevance {name}, step {step}"] = by_relevance(strength, step)
    sets = sorted({row["set"] for row in rows})
    print("| merge | " + " | ".join(f"{s} dev / other / all" for s in sets) + " |")
    print("|---" * (len(sets) + 1) + "|")
    for name, merge in rules.items():
        cells = []
        for name_of_set in sets:
            shares = []
            for half in (0, 1, None):
                chosen = [
                    r for r in rows if r["set"] == name_of_set and half in (None, r["line"] % 2)
                ]
                found = sum(
                    hit(
                        (r["combined"] if merge is None else merge(r["packs"]))[:5], r["gold_pages"]
                    )
                    for r in chosen
                )
                shares.append(f"{found / max(len(chosen), 1):.3f}")
            cells.append(
                " / ".join(shares) + f" ({len([r for r in rows if r['set'] == name_of_set])})"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
