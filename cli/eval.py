"""eval, eval generate: a pack measured against its questions (retrieval.eval), and candidate
questions written by Claude for a person to review."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cli.output import console, err, print_skipped
from kpack.errors import PackError


def cmd_eval(args: argparse.Namespace) -> int:
    """kpack eval PACK [...]; kpack eval generate PACK --n N."""
    from retrieval.eval import (
        check_profiles,
        evaluate,
        load_questions,
        markdown_summary,
        write_query_settings,
        write_results,
        write_threshold,
    )
    from retrieval.reader import QUESTIONS_FILE
    from retrieval.registry import resolve_folder

    if args.target == "generate":
        return _eval_generate(args)
    profiles = check_profiles([p.strip() for p in args.profiles.split(",") if p.strip()])
    folder = resolve_folder(args.target)
    path = Path(args.questions) if args.questions else folder / QUESTIONS_FILE
    if not path.is_file():
        raise PackError(f"no question file at {path}; {questions_hint(folder.name)}")
    questions, problems = load_questions(path, folder)
    print_skipped(problems)
    if not questions:
        raise PackError(f"no valid question to evaluate in {path}; {questions_hint(folder.name)}")
    results = evaluate(
        folder,
        questions,
        profiles,
        use_llm=not args.no_llm,
        judge_model=args.judge_model,
        progress=_eval_progress,
        calibrate_graph_weights=args.write_config,
    )
    paths = write_results(results, folder / "eval" / "results")
    if args.write_config:
        best = results["calibration"]["best_threshold"]
        graph = results["calibration"]["graph"]
        write_query_settings(folder, graph["chosen"])
        split = results["split"]
        console.print(
            f"context_confidence_threshold = {best} written to {write_threshold(folder, best)}; "
            f"graph settings {graph['chosen']} ({graph['why']}) too; chosen on "
            f"{split['chosen_on']} questions, the summary below is of the other "
            f"{split['reported_on']}; queries use them once `kpack build {folder.name}` has "
            "published them",
            markup=False,
        )
    if args.json:
        print(json.dumps(results, indent=2, default=str))
        return 0
    print(markdown_summary(results))
    console.print(f"results: {paths['json']}\nchart:   {paths['png']}")
    return 0


# One line of eval/questions.jsonl, as docs/evaluating-packs.md describes the format.
EXAMPLE_QUESTION = (
    '{"question": "How do I install it?", "answers": ["pip install"], '
    '"gold_urls": ["https://docs.example.org/install"]}'
)


def questions_hint(pack: str) -> str:
    """How to start a question file: its format by example, and the offline generator."""
    return (
        f"write one JSON object a line, such as {EXAMPLE_QUESTION} "
        "(the fields: docs/evaluating-packs.md), or let `kpack eval generate "
        f"{pack} --offline` write candidate questions from the pack's headings for you to review"
    )


def _eval_progress(condition: str, number: int, total: int, record: dict) -> None:
    """One line per question on stderr (plain when piped): how it went and how long it took."""
    if record["gated"]:
        outcome = "gated"
    elif record["unanswerable"]:
        outcome = "refused (unanswerable)" if record["refused"] else "answered (unanswerable)"
    elif record["out_of_domain"]:
        outcome = "answered (out of domain)"
    elif record["hit_rank"]:
        outcome = f"hit at {record['hit_rank']}"
    else:
        outcome = "no hit" if record["retrieved"] else "answered"
    total_ms = record["timings_ms"].get("total", 0.0)
    err.print(
        f"{condition} {number}/{total}: {outcome}, {total_ms:.0f} ms - {record['question'][:60]}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _eval_generate(args: argparse.Namespace) -> int:
    from kpack.llm import ClaudeClient
    from retrieval.eval import (
        OFFLINE_MARK,
        candidate_sections,
        generate_questions,
        offline_questions,
        write_candidates,
    )
    from retrieval.registry import reading

    if not args.pack:
        raise PackError("usage: kpack eval generate PACK --n N [--offline]")
    llm = ClaudeClient()
    if not args.offline and not llm.available:
        raise PackError(
            "generating questions with Claude needs ANTHROPIC_API_KEY; without a key, "
            f"`kpack eval generate {args.pack} --offline` makes candidate questions from the "
            "pack's headings and section links"
        )
    with reading(args.pack) as reader:
        if args.offline:
            made = offline_questions(reader, args.n)
            if not made:
                raise PackError(
                    "no candidate question was made: the pack has no section long enough to "
                    "ask about"
                )
            path = write_candidates(reader.folder, made)
            console.print(
                f"wrote {len(made)} candidate questions made from the pack's headings to {path} "
                f'(each marked "generated": "{OFFLINE_MARK}"; a heading is found by its own '
                "words, so rewrite them as a user would ask before adding them to "
                "eval/questions.jsonl)",
                highlight=False,
            )
            return 0
        generated = generate_questions(reader.folder, candidate_sections(reader), args.n, llm)
    if not generated.written:
        raise PackError(f"no candidate question was written: {generated.why_none()}")
    console.print(
        f"wrote {len(generated.written)} candidate questions to {generated.path}; "
        "review them, then add the good ones to eval/questions.jsonl",
        highlight=False,
    )
    if generated.failures:
        err.print(f"skipped sections: {generated.why_none()}", markup=False, highlight=False)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser(
        "eval", help="evaluate a pack (or: kpack eval generate PACK --n N [--offline])"
    )
    ev.add_argument("target", help="the pack, or 'generate'")
    ev.add_argument("pack", nargs="?", help="with 'generate': the pack")
    ev.add_argument(
        "--questions", help="a questions.jsonl (default: the pack's eval/questions.jsonl)"
    )
    ev.add_argument("--profiles", default="baseline,balanced,max")
    ev.add_argument("--no-llm", action="store_true", help="score answers without an API key")
    ev.add_argument("--judge-model", default="claude-haiku-4-5")
    ev.add_argument(
        "--write-config",
        action="store_true",
        help="store the best gate threshold and graph settings in kg_config.json",
    )
    ev.add_argument("--json", action="store_true")
    ev.add_argument("--n", type=int, default=20, help="with 'generate': how many questions")
    ev.add_argument(
        "--offline",
        action="store_true",
        help="with 'generate': make them from the pack's headings, without Claude",
    )
    ev.set_defaults(run=cmd_eval)
