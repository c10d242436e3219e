"""The layering is enforced: the core knows nothing above it, retrieval reads packs through
the core only, and the query path never loads the orchestrator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    linter = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(linter), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "broken" in result.stdout and "0 broken" in result.stdout


def test_importing_retrieval_loads_no_dagster_torch_or_kuzu():
    probe = (
        "import sys, retrieval; "
        "print(sorted(m for m in ('dagster', 'torch', 'kuzu', 'sentence_transformers') "
        "if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
