"""Calibrating the confidence gate: sweep the threshold over the questions' best similarities,
and store the best one in the pack's kg_config.json."""

from __future__ import annotations

import json
from pathlib import Path

from kpack.config import CONFIG_FILE, parse_config
from kpack.errors import PackError

THRESHOLDS = tuple(round(0.2 + 0.05 * i, 2) for i in range(13))  # 0.2 .. 0.8


def calibrate(
    similarities: list[tuple[float | None, bool]], thresholds: tuple[float, ...] = THRESHOLDS
) -> list[dict]:
    """Per threshold: share of in-domain questions answered and of out-of-domain refused."""
    inside = [s for s, ood in similarities if not ood]
    outside = [s for s, ood in similarities if ood]
    rows = []
    for threshold in thresholds:
        answered = (
            sum(1 for s in inside if s is not None and s >= threshold) / len(inside)
            if inside
            else None
        )
        refused = (
            sum(1 for s in outside if s is None or s < threshold) / len(outside)
            if outside
            else None
        )
        scored = [v for v in (answered, refused) if v is not None]
        rows.append(
            {
                "threshold": threshold,
                "in_domain_answered": answered,
                "out_of_domain_refused": refused,
                "balanced": sum(scored) / len(scored) if scored else None,
            }
        )
    return rows


def best_threshold(rows: list[dict], default: float) -> float:
    """The threshold with the best balanced share; ties go to the one nearest ``default``."""
    scored = [r for r in rows if r["balanced"] is not None]
    if not scored:
        return default
    return min(scored, key=lambda r: (-r["balanced"], abs(r["threshold"] - default)))["threshold"]


def write_threshold(pack_folder: Path, threshold: float) -> Path:
    """Set query.context_confidence_threshold in kg_config.json (see write_query_settings)."""
    return write_query_settings(pack_folder, {"context_confidence_threshold": threshold})


def write_query_settings(pack_folder: Path, settings: dict) -> Path:
    """Set these query settings in kg_config.json, keeping every other key.

    The file is checked before and after, so it is never left invalid; the settings reach
    queries with the next published version (``kpack build``), like every setting.
    """
    path = pack_folder / CONFIG_FILE
    config: dict = {}
    if path.is_file():
        try:
            config = json.loads(path.read_bytes().decode("utf-8-sig"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PackError(
                f"{path} cannot be updated: it is not valid UTF-8 JSON ({exc})"
            ) from None
        parse_config(config, str(path))
    query = config.setdefault("query", {})
    query.update(settings)
    parse_config(config, str(path))
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path
