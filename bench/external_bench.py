"""Questions nobody here wrote: developers' intents (CoNaLa) and long problem statements
(DS-1000, pandas), against the plain peers over the same chunks.

Sets (both written outside this project, see their READMEs under shared/benchmarks/):

- ``conala_dev``: the 149 CoNaLa development intents with a Python standard-library page among
  their labels, over the Python docs pack (the 374 library/tutorial/reference/howto/faq pages
  of Debian's python3.11-doc, as bench/docs_qa_bench.py builds it);
- ``ds1000_pandas_dev``: 119 DS-1000 problems whose solution is documented on a pandas API
  page, over a pack crawled, as a user would, from one seed line at the index of Debian's
  python-pandas-doc served on 127.0.0.1 under ``/pandas/``
  (``http://127.0.0.1:PORT/pandas/index.html depth=12``, crawl.max_pages raised to 5,000,
  genindex, _sources, _modules and search pages excluded).

Halves, declared before any result was read: the development half is the odd lines of each
file (the 1st, 3rd, ...: 0-based indexes 0, 2, 4, ...), the report half the even lines. Method
choices are made on the development half; the table gives both halves and the whole.

Per method, page level (a passage counts when its page path ends with a gold page), the top
10 passages per question, repeats kept: hit@1, hit@5, hit@10, MRR@10, and how many questions
the gate refused (a search that returns no passage). Methods, all over the pack's own chunks:

- our profiles (``retrieval.search``, k=10): baseline and balanced (the default); a question
  counts as refused when ``retrieval.query`` (offline) falls back past the gate;
- ``dense``: cosine over the pack's own chunk vectors, the question embedded by the pack's
  own query encoder;
- ``bm25s``: the bm25s package (BM25 with its English stopwords and the Snowball stemmer) over
  the same chunks, each read as its heading path and its text;
- ``rrf``: reciprocal rank fusion (k=60) of the two lists.

    .venv/bin/python bench/external_bench.py --workdir /work/bench-ext
    .venv/bin/python bench/external_bench.py --workdir /work/bench-ext --sets conala --half dev
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.harness import OFFLINE_ENV, OUT_DIR, build_here  # noqa: E402

os.environ.update(OFFLINE_ENV)  # before numpy and the model load (bench.harness says why)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.corpora import (  # noqa: E402
    BENCHMARKS,
    ensure_python_docs,
    make_pack,
    page_urls,
    python_doc_pages,
    serve,
)

PANDAS_DOC_ROOT = Path("/usr/share/doc/python-pandas-doc/html")
PANDAS_DOC_PACKAGE = "python-pandas-doc"
PROFILES = ("baseline", "balanced")
PEERS = ("dense", "bm25s", "rrf")
K = 10
RRF_K = 60
HALVES = ("dev", "report", "all")
GATED = "confidence_gated_fallback"


# --- Packs ---------------------------------------------------------------------------------


def ensure_pandas_docs() -> Path:
    if PANDAS_DOC_ROOT.is_dir():
        return PANDAS_DOC_ROOT
    import subprocess

    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", PANDAS_DOC_PACKAGE]):
        if subprocess.run(command, env=env).returncode != 0:
            sys.exit(f"{' '.join(command)} failed; install {PANDAS_DOC_PACKAGE} by hand")
    return PANDAS_DOC_ROOT


def build(workdir: Path, name: str) -> None:
    started = time.perf_counter()
    result = build_here(name, workdir).result
    if not result.success:
        raise SystemExit(f"the {name} build failed: {result.cause}")
    print(f"built {name} in {time.perf_counter() - started:.0f} s", flush=True)


def python_pack(workdir: Path, rebuild: bool, config: dict[str, Any]) -> Path:
    folder = workdir / "packs" / "python_docs"
    if (folder / "pack.db").exists() and not rebuild:
        return folder
    root = ensure_python_docs()
    pages = python_doc_pages(root)
    with serve(root) as base_url:
        make_pack(workdir, "python_docs", page_urls(base_url, root, pages), config)
        build(workdir, "python_docs")
    return folder


def pandas_pack(workdir: Path, rebuild: bool, config: dict[str, Any]) -> Path:
    """The pandas docs crawled from the index of the Debian package, with the settings a user
    writes for a whole site: one seed line, a raised page cap, the generated indexes left out."""
    folder = workdir / "packs" / "pandas_docs"
    if (folder / "pack.db").exists() and not rebuild:
        return folder
    root = ensure_pandas_docs()
    with tempfile.TemporaryDirectory() as site:
        (Path(site) / "pandas").symlink_to(root)
        with serve(Path(site)) as base_url:
            crawl = {
                "max_pages": 5000,
                "exclude": ["*/genindex*", "*/_sources/*", "*/_modules/*", "*/search.html*"],
            }
            make_pack(workdir, "pandas_docs", [], {**config, "crawl": crawl})
            (folder / "urls.txt").write_text(f"{base_url}/pandas/index.html depth=12\n")
            build(workdir, "pandas_docs")
    return folder


# --- Questions -----------------------------------------------------------------------------


def load_set(name: str) -> list[dict[str, Any]]:
    path = BENCHMARKS / name / "questions.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    for line_number, row in enumerate(rows, start=1):
        row["half"] = "dev" if line_number % 2 else "report"
    return [r for r in rows if r["gold_pages"]]


def page_of(url: str) -> str:
    return unquote(urlsplit(url).path).lstrip("/")


def scores(pages: Sequence[str], gold: Sequence[str]) -> dict[str, float]:
    rank = next(
        (i for i, page in enumerate(pages[:K], 1) if any(page.endswith(g) for g in gold)), None
    )
    return {
        "hit@1": float(rank is not None and rank <= 1),
        "hit@5": float(rank is not None and rank <= 5),
        "hit@10": float(rank is not None),
        "mrr@10": 1.0 / rank if rank else 0.0,
    }


# --- Peers over the pack's own chunks ----------------------------------------------------


class Peers:
    """Plain dense, bm25s and their RRF over one published version's chunks."""

    def __init__(self, pack: Path) -> None:
        import bm25s
        import Stemmer

        from retrieval.registry import open_pack

        self.reader = open_pack(pack)
        index = self.reader.version_dir / "indexes"
        chunks = pa.ipc.open_file(pa.memory_map(str(index / "chunks.arrow"))).read_all()
        sections = pa.ipc.open_file(pa.memory_map(str(index / "sections.arrow"))).read_all()
        section_of = {
            s: (url, heading)
            for s, url, heading in zip(
                sections["section_id"].to_pylist(),
                sections["article_url"].to_pylist(),
                sections["heading_path"].to_pylist(),
                strict=True,
            )
        }
        self.chunk_ids = chunks["chunk_id"].to_pylist()
        # A chunk id is "<section id>-<chunk index>" (kpack.contracts).
        owners = [section_of[c.rsplit("-", 1)[0]] for c in self.chunk_ids]
        self.pages = [page_of(url) for url, _ in owners]
        texts = [
            f"{heading}\n{content}"
            for (_, heading), content in zip(owners, chunks["content"].to_pylist(), strict=True)
        ]
        self.vectors = np.load(index / "chunk_vectors.npy", mmap_mode="r")
        assert len(self.vectors) == len(self.chunk_ids), "vectors and chunks disagree"
        self.stemmer = Stemmer.Stemmer("english")
        self.bm25 = bm25s.BM25()
        self.bm25.index(
            bm25s.tokenize(texts, stopwords="en", stemmer=self.stemmer, show_progress=False),
            show_progress=False,
        )
        self._tokenize = bm25s.tokenize

    def dense(self, question: str) -> list[int]:
        vector = self.reader.embed([question])[0]
        similarity = np.asarray(self.vectors @ vector)
        top = np.argpartition(-similarity, K)[:K]
        return [int(i) for i in top[np.argsort(-similarity[top], kind="stable")]]

    def keyword(self, question: str) -> list[int]:
        tokens = self._tokenize(
            [question], stopwords="en", stemmer=self.stemmer, show_progress=False
        )
        if not tokens.vocab:
            return []
        rows, _ = self.bm25.retrieve(tokens, k=K, show_progress=False)
        return [int(r) for r in rows[0]]

    @staticmethod
    def fuse(*rankings: list[int]) -> list[int]:
        fused: dict[int, float] = {}
        for ranking in rankings:
            for rank, row in enumerate(ranking, start=1):
                fused[row] = fused.get(row, 0.0) + 1.0 / (RRF_K + rank)
        return sorted(fused, key=lambda row: -fused[row])[:K]

    def methods(self) -> dict[str, Callable[[str], list[str]]]:
        def pages(rows: list[int]) -> list[str]:
            return [self.pages[r] for r in rows]

        return {
            "dense": lambda q: pages(self.dense(q)),
            "bm25s": lambda q: pages(self.keyword(q)),
            "rrf": lambda q: pages(self.fuse(self.dense(q), self.keyword(q))),
        }


# --- Running -------------------------------------------------------------------------------


def profile_method(pack: Path, profile: str) -> Callable[[str], list[str] | None]:
    import retrieval

    def run(question: str) -> list[str] | None:
        answered = retrieval.query(pack, question, profile=profile, use_llm=False)
        if answered["query_type"] == GATED:
            return None  # the gate refused: no passage is used
        hits = retrieval.search(pack, question, k=K, profile=profile)
        return [page_of(h["url"]) for h in hits]

    return run


def evaluate(
    questions: list[dict[str, Any]], methods: dict[str, Callable[[str], list[str] | None]]
) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    timings: dict[str, list[float]] = {m: [] for m in methods}
    for question in questions:
        for name, method in methods.items():
            started = time.perf_counter()
            pages = method(question["question"])
            timings[name].append((time.perf_counter() - started) * 1000)
            row = {
                "id": question["id"],
                "half": question["half"],
                "refused": pages is None,
                "pages": (pages or [])[:K],
                **scores(pages or [], question["gold_pages"]),
            }
            rows[name].append(row)
    table: dict[str, Any] = {}
    for name, method_rows in rows.items():
        table[name] = {}
        for half in HALVES:
            picked = [r for r in method_rows if half == "all" or r["half"] == half]
            table[name][half] = {
                "n": len(picked),
                **{
                    metric: round(statistics.fmean(r[metric] for r in picked), 3)
                    for metric in ("hit@1", "hit@5", "hit@10", "mrr@10")
                },
                "refused": sum(r["refused"] for r in picked),
            }
        table[name]["p50_ms"] = round(statistics.median(timings[name]), 1)
    return {"table": table, "rows": rows}


def print_table(title: str, table: dict[str, Any]) -> None:
    print(f"\n{title}")
    print("| method | half | n | hit@1 | hit@5 | hit@10 | MRR@10 | refused | p50 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, halves in table.items():
        for half in HALVES:
            h = halves[half]
            print(
                f"| {name} | {half} | {h['n']} | {h['hit@1']:.3f} | {h['hit@5']:.3f} | "
                f"{h['hit@10']:.3f} | {h['mrr@10']:.3f} | {h['refused']} | {halves['p50_ms']} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--sets", default="conala,ds1000", help="conala, ds1000 or both")
    parser.add_argument("--profiles", default=",".join(PROFILES))
    parser.add_argument("--rebuild", action="store_true", help="build the packs again")
    parser.add_argument(
        "--precision",
        default=None,
        help="embedding_precision of the packs (default: the pack default)",
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR / "external_bench.json")
    args = parser.parse_args()
    os.environ.update(
        {
            "KPACK_PACKS_DIR": str(args.workdir / "packs"),
            "KPACK_STORAGE": str(args.workdir / "storage"),
        }
    )
    config: dict[str, Any] = {"extraction": "offline"}
    if args.precision:
        config["embedding_precision"] = args.precision
    wanted = set(args.sets.split(","))
    sets = []
    if "conala" in wanted:
        sets.append(("conala_dev", python_pack(args.workdir, args.rebuild, config)))
    if "ds1000" in wanted:
        sets.append(("ds1000_pandas_dev", pandas_pack(args.workdir, args.rebuild, config)))
    report: dict[str, Any] = {}
    for name, pack in sets:
        questions = load_set(name)
        methods: dict[str, Callable[[str], list[str] | None]] = {
            p: profile_method(pack, p) for p in args.profiles.split(",") if p
        }
        methods.update(Peers(pack).methods())
        result = evaluate(questions, methods)
        report[name] = result
        print_table(f"{name} ({len(questions)} questions, pack {pack.name})", result["table"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"\nrows: {args.out}")


if __name__ == "__main__":
    main()
