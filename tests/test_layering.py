"""The layering is enforced: the core knows nothing above it, retrieval reads packs through
the core only, the CLI sits on top, and the query path never loads the orchestrator."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    linter = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(linter), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "broken" in result.stdout and "0 broken" in result.stdout


def test_no_contract_ignores_an_import():
    """Every dependency between the packages is declared by a contract, none excused."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    excused = {c["name"]: c["ignore_imports"] for c in config["contracts"] if "ignore_imports" in c}
    assert excused == {}


def test_no_module_imports_itself_through_others():
    """No import cycle among the product modules, imports inside functions included (grimp
    reads them all): a module that needs another's job imports it one way only."""
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"][
        "root_packages"
    ]
    graph = grimp.build_graph(*packages, cache_dir=None)
    cycles = sorted(
        (importer, imported)
        for importer in graph.modules
        if importer.split(".")[0] in packages
        for imported in graph.find_modules_directly_imported_by(importer)
        if imported.split(".")[0] in packages
        and imported != importer
        and graph.chain_exists(imported=importer, importer=imported)
    )
    assert cycles == []


def test_the_build_imports_retrieval_for_its_evaluation_only():
    """The contracts let assets.evaluate import retrieval; what it imports is retrieval.eval
    (the harness that runs the query pipeline), never a stage of the pipeline itself."""
    graph = grimp.build_graph("assets", "retrieval", cache_dir=None)
    imported = {
        target
        for importer in graph.find_descendants("assets")
        for target in graph.find_modules_directly_imported_by(importer)
        if target.split(".")[0] == "retrieval"
    }
    assert imported, "assets no longer import retrieval.eval: drop it from the contracts"
    beyond_eval = {module for module in imported if module.split(".")[:2] != ["retrieval", "eval"]}
    assert beyond_eval == set()


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
