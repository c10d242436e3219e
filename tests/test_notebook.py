"""docs/notebook.ipynb runs headless: nbclient executes a copy with this interpreter's
ipykernel against a demo pack built in a temporary packs folder, and the rendered query shows
clickable citations and the trace, with nothing on stderr (no tqdm warning, no progress bar)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec
from nbclient import NotebookClient

from tests.conftest import build, write_pack

ROOT = Path(__file__).resolve().parents[1]
# Two pages of the demo pack, which the notebook's questions are about: a smaller build.
PAGES = ("index.md", "pack-layout.md")
CITATION_LINK = re.compile(r"<a href='(file://[^']+)' target='_blank'>\[([^\]]+)\]</a>")


def demo_questions(pages: tuple[str, ...]) -> list[str]:
    """The demo pack's eval questions about these pages, and two out-of-domain ones."""
    urls = {f"file:../../docs/{page}" for page in pages}
    lines = (ROOT / "packs" / "demo" / "eval" / "questions.jsonl").read_text().splitlines()
    about = [line for line in lines if urls & set(json.loads(line).get("gold_urls", []))]
    off_topic = [line for line in lines if json.loads(line).get("out_of_domain")]
    return about + off_topic[:2]


@pytest.fixture(scope="module")
def notebook(tmp_path_factory: pytest.TempPathFactory) -> nbformat.NotebookNode:
    """The notebook executed (its stored outputs replaced) against a pack laid out as
    packs/demo is, its urls.txt naming ../../docs/<page>; KPACK_PACKS_DIR makes the notebook's
    "demo" this pack."""
    workspace = tmp_path_factory.mktemp("notebook")
    (workspace / "docs").mkdir()
    for page in PAGES:
        shutil.copy(ROOT / "docs" / page, workspace / "docs" / page)
    config = json.loads((ROOT / "packs" / "demo" / "kg_config.json").read_text())
    folder = write_pack(workspace, "demo", [f"file:../../docs/{p}" for p in PAGES], config)
    (folder / "eval").mkdir()
    (folder / "eval" / "questions.jsonl").write_text("\n".join(demo_questions(PAGES)) + "\n")
    assert build(workspace, "demo").outcome == "published"

    # The kernel is this interpreter, whatever kernels the machine has registered.
    write_kernel_spec(workspace / "jupyter" / "kernels" / "python3")
    notebook = nbformat.read(ROOT / "docs" / "notebook.ipynb", as_version=4)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KPACK_PACKS_DIR", str(workspace / "packs"))
        env.setenv("JUPYTER_PATH", str(workspace / "jupyter"))
        env.setenv("IPYTHONDIR", str(workspace / "ipython"))
        env.setenv("PYTHONPATH", str(ROOT))  # the kernel imports this checkout's code
        env.delenv("MPLBACKEND", raising=False)  # Agg would keep plots from showing inline
        client = NotebookClient(
            notebook,
            kernel_name="python3",
            timeout=300,
            resources={"metadata": {"path": str(workspace / "docs")}},
        )
        client.execute()  # a cell that raises fails the test with its traceback
    return notebook


def outputs_of(notebook: nbformat.NotebookNode, code: str) -> list[dict]:
    (cell,) = [c for c in notebook.cells if c.cell_type == "code" and code in c.source]
    return cell.outputs


def test_the_query_renders_clickable_citations_and_the_trace(
    notebook: nbformat.NotebookNode,
) -> None:
    (output,) = outputs_of(notebook, "retrieval.query(")
    html = output["data"]["text/html"]
    links = CITATION_LINK.findall(html)
    assert links, html[:2000]
    assert {Path(urlsplit(url).path).name for url, _ in links} <= set(PAGES)
    # Each citation links to its section: the slug of its Markdown heading.
    assert all(urlsplit(url).fragment for url, _ in links), links
    assert "Pack Layout" in {title for _, title in links}
    trace = html.split("<b>Trace</b>", 1)[1]
    assert "<th style='text-align:left'>why</th>" in trace
    assert trace.count("<tr>") > 1 + len(links)  # a row per candidate, dropped ones too
    assert "below top k" in trace
    assert "](file://" in output["data"]["text/markdown"]  # the same links in Markdown


def test_every_cell_runs_quietly_and_the_evaluation_plots_inline(
    notebook: nbformat.NotebookNode,
) -> None:
    stderr = [
        o["text"] for c in notebook.cells for o in c.get("outputs", []) if o.get("name") == "stderr"
    ]
    assert stderr == []
    (summary,) = outputs_of(notebook, "summary_frame(results)")
    assert all(f"<th>{p}</th>" in summary["data"]["text/html"] for p in ("baseline", "balanced"))
    # Writing the results (and their chart) must leave inline plotting working.
    (plot,) = outputs_of(notebook, "metrics.T.plot")
    assert "image/png" in plot["data"]
    (search,) = outputs_of(notebook, "retrieval.search(")
    assert "kpack-search-results" in search["data"]["text/html"]


def test_the_stored_notebook_shows_no_machines_own_paths():
    """docs/notebook.md and the stored outputs of docs/notebook.ipynb name the project's place
    (`make notebook` writes /path/to/knowledge-packs), never the folders of the machine that
    ran it."""
    # The demo pack's pages are file: URLs: where a machine's folders would show.
    machine = re.compile(r"file://(?!/path/to/knowledge-packs/)")
    for name in ("notebook.md", "notebook.ipynb"):
        text = (ROOT / "docs" / name).read_text()
        assert str(ROOT) not in text and not machine.search(text), (name, machine.search(text))
