"""docs/architecture.md names modules; every one it names must exist, so the map stays true."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cli", "kpack", "resources", "assets", "pipelines", "retrieval", "serving")
NAMES = "|".join(PACKAGES)
MODULE_PATH = re.compile(rf"`((?:{NAMES})/[\w/]+\.py)`")
DOTTED = re.compile(rf"`((?:{NAMES})\.[\w.]+)`")


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
