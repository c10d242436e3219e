"""skill.md names what sets a pack's pages apart, not the words every page uses."""

from __future__ import annotations

import json

import yaml

from kpack.skill import SkillInputs, skill_markdown
from tests.conftest import build, write_pack

# Every page of a Python pack says these, in prose and in code.
EVERYWHERE = (
    "In Python, the call returns None when nothing is found, True or False otherwise, and "
    "raises ValueError for a bad argument. Python checks `None` first. "
)
PAGES = {
    "comprehensions": ("List Comprehensions", ["Nested Comprehensions", "Filtering Items"]),
    "context": ("Context Managers", ["The with Statement", "Writing Your Own Manager"]),
    "decorators": ("Function Decorators", ["Decorators With Arguments", "Stacking Decorators"]),
    "generators": ("Generator Functions", ["The yield Expression", "Generator Pipelines"]),
}
COMMON = ("None", "True", "False", "Python", "ValueError", "Examples")


def page(title: str, headings: list[str]) -> str:
    sections = "".join(
        f"## {heading}\n\n{EVERYWHERE}{heading} are explained here with care and detail.\n\n"
        for heading in [*headings, "Examples"]
    )
    return f"# {title}\n\n{EVERYWHERE * 2}\n\n{sections}"


def test_skill_topics_are_distinctive_headings_not_common_words(workspace):
    folder = write_pack(workspace, "pyish", [f"file:pages/{name}.md" for name in PAGES])
    (folder / "pages").mkdir()
    for name, (title, headings) in PAGES.items():
        (folder / "pages" / f"{name}.md").write_text(page(title, headings))
    assert build(workspace, "pyish").published

    skill = (folder / "skill.md").read_text()
    front = yaml.safe_load(skill.split("---\n")[1])  # the front matter is valid YAML
    assert front["name"] == "pyish-pack"
    topics = front["description"].split("Use for questions on ")[1].rstrip(".").split(", ")
    assert len(topics) == 8, topics
    headings = {h for title, more in PAGES.values() for h in [title, *more]}
    assert set(topics) <= headings, topics
    terms = skill.split("## Distinctive terms\n\n")[1].strip().split(", ")
    listed = skill.split("## Topics (the most distinctive section headings)\n\n")[1]
    for word in COMMON:
        assert word not in topics and word not in terms, (word, topics, terms)
    assert "Examples" not in listed.split("\n\n")[0].split(", ")
    assert json.loads(skill.splitlines()[2].removeprefix("description: ")) == front["description"]


def test_a_packs_own_description_leads_its_skill():
    manifest = {
        "name": "widgets",
        "version": 1,
        "built_at": "2026-11-28T00:00:00+00:00",
        "counts": {"Article": 3, "Section": 9, "Chunk": 12, "Entity": 4, "Fact": 0},
        "sources": {"ok": 3},
        "embedding": {"model": "all-MiniLM-L6-v2", "dimension": 384},
        "config": {"description": "Widget toolkit guides: install, cache, releases"},
    }
    inputs = SkillInputs([("Guide", "https://docs.example.org/guide")], ["Setup"], ["cache"])
    skill = skill_markdown(manifest, inputs)
    front = yaml.safe_load(skill.split("---\n")[1])
    assert front["description"].startswith("Widget toolkit guides: install, cache, releases. ")
    assert "Use for questions on" not in front["description"]
    assert "\nWidget toolkit guides: install, cache, releases\n" in skill
    made_up = skill_markdown({**manifest, "config": {}}, inputs)
    assert "Use for questions on Setup." in yaml.safe_load(made_up.split("---\n")[1])["description"]
