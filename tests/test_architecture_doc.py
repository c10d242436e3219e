"""docs/architecture.md is the map of the code: every module it names exists, and every product
module is named there or lies in a folder it describes, so a change finds its module there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cli", "kpack", "resources", "assets", "pipelines", "retrieval", "serving")
NAMES = "|".join(PACKAGES)
MODULE_PATH = re.compile(rf"`((?:{NAMES})/[\w/]+\.py)`")
DOTTED = re.compile(rf"`((?:{NAMES})\.[\w.]+)`")
# A folder the page describes: a sub-package named as `package/folder/` (a top-level package
# named so, such as `retrieval/`, describes its __init__.py only: its modules are each named).
FOLDER = re.compile(rf"`((?:{NAMES})/[\w/]+/)`")


def uncovered_modules(text: str, root: Path) -> list[str]:
    """The product modules under ``root`` the page neither names nor describes a folder of."""
    named = set(MODULE_PATH.findall(text))
    folders = set(FOLDER.findall(text))
    missing = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = path.relative_to(root).as_posix()
            folder = module.rsplit("/", 1)[0] + "/"
            described = any(module.startswith(f) for f in folders) or (
                path.name == "__init__.py" and f"`{folder}`" in text
            )
            if module not in named and not described:
                missing.append(module)
    return missing


def test_every_module_the_architecture_page_names_exists():
    text = (ROOT / "docs" / "architecture.md").read_text()
    paths = set(MODULE_PATH.findall(text))
    dotted = set(DOTTED.findall(text))
    assert len(paths) >= 40  # the page names a module for each step
    missing = [p for p in paths if not (ROOT / p).is_file()]
    missing += [
        d
        for d in dotted
        if not (ROOT / (d.replace(".", "/") + ".py")).is_file()
        and not (ROOT / d.replace(".", "/") / "__init__.py").is_file()
    ]
    assert missing == []


def test_the_architecture_page_names_every_package_and_is_linked_from_the_index():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert all(f"{package}/" in text for package in PACKAGES)
    assert "architecture.md" in (ROOT / "docs" / "index.md").read_text()


def test_every_product_module_is_named_or_in_a_folder_the_page_describes():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert uncovered_modules(text, ROOT) == []


def test_a_module_the_page_does_not_cover_is_reported(tmp_path):
    """A new module of a folder the page only lists module by module is reported; one inside a
    described folder is not."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "kpack" / "ingest").mkdir()
    (tmp_path / "kpack" / "ingest" / "fresh.py").write_text("")
    (tmp_path / "retrieval" / "fresh.py").write_text("")
    text = " ".join(f"`{package}/`" for package in PACKAGES) + " `kpack/ingest/`"
    assert uncovered_modules(text, tmp_path) == ["retrieval/fresh.py"]
