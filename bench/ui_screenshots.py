"""Screenshots of the Dagster UI pages docs/dagster.md describes, from headless Chromium.

In a temporary folder (the user's packs, storage and run history are untouched) this copies
the demo pack, starts `kpack ui`, builds the pack from the UI (the GraphQL requests of the
"Materialize" button), rebuilds it with `kpack build` (nothing changed), materializes
eval_results for the demo partition from the UI, waits for the runs' outcome tags, and then
photographs with Debian's chromium:

* dagster-asset-graph.png: Global asset lineage, the asset groups and their dependencies;
* dagster-eval-results.png: eval_results' page, its summary table and inline chart;
* dagster-runs.png: the run list with the ``kpack/outcome`` tags;
* dagster-automation.png: the sensors and the schedule, on or off;
* dagster-run.png: the page of the UI build run.

Each PNG is reduced to a 256-colour palette (and cropped where the page is long) to stay under
300 KB. Usage, from the project root (about 3 minutes)::

    .venv/bin/python bench/ui_screenshots.py              # writes docs/images/dagster-*.png
    .venv/bin/python bench/ui_screenshots.py --out /tmp/shots --keep
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from dagster_ui import KPACK, PROJECT_ROOT, DagsterUI, add_partitions, prepare, seed_caches
from PIL import Image

CHROMIUM = "/usr/bin/chromium"
PACK = "demo"
MAX_BYTES = 300_000
OUTCOME_TAG = "kpack/outcome"


def screenshot(url: str, path: Path, size: tuple[int, int], profile: Path) -> None:
    """One page as Chromium renders it once the UI's queries have settled."""
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            "--virtual-time-budget=15000",
            f"--screenshot={path}",
            url,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


def shrink(path: Path, crop: tuple[int, int, int, int] | None = None) -> int:
    """Crop, then store as a 256-colour PNG (UI pages have few colours); returns the bytes."""
    image = Image.open(path).convert("RGB")
    if crop:
        image = image.crop(crop)
    image.quantize(colors=256).save(path, optimize=True)
    if path.stat().st_size > MAX_BYTES:  # a busier page than expected: halve it
        image = image.resize((image.width // 2, image.height // 2), Image.LANCZOS)
        image.quantize(colors=256).save(path, optimize=True)
    return path.stat().st_size


def wait_for_outcome(ui: DagsterUI, run_id: str, timeout_s: float = 90) -> str | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        outcome = ui.run(run_id)["tags"].get(OUTCOME_TAG)
        if outcome:
            return outcome
        time.sleep(2)
    return None


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs" / "images")
    cli.add_argument("--workdir", type=Path, help="default: a new temporary folder")
    cli.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = cli.parse_args()

    work = args.workdir or Path(tempfile.mkdtemp(prefix="ui_screenshots_"))
    env = prepare(work, [PACK], with_eval=True)
    os.environ.update(env)  # add_partitions writes the temporary instance only
    add_partitions([PACK])
    seed_caches(PROJECT_ROOT / ".kpack_storage", work / "storage", PACK, PACK)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        with DagsterUI(env, work / "kpack_ui.log") as ui:
            ui.graphql("mutation { setNuxSeen }")  # the one-time "join the community" dialog
            build = ui.wait_for_run(ui.materialize("build_pack", PACK))
            print(f"UI build: {build['status']}", flush=True)
            subprocess.run(
                [KPACK, "build", PACK, "--no-progress"], env=env, check=True, capture_output=True
            )
            evaluation = ui.wait_for_run(ui.materialize("__ASSET_JOB", PACK, ["eval_results"]))
            print(f"eval_results: {evaluation['status']}", flush=True)
            print(f"outcome tag of the UI build: {wait_for_outcome(ui, build['runId'])}")
            profile = work / "chromium"
            pages = {
                "dagster-asset-graph.png": ("/asset-groups", (1600, 700), None),
                "dagster-eval-results.png": (
                    f"/assets/eval_results?partition={PACK}",
                    (1600, 2000),
                    (0, 0, 1600, 1500),
                ),
                "dagster-runs.png": ("/runs", (1600, 700), None),
                "dagster-automation.png": ("/automation", (1600, 560), None),
                "dagster-run.png": (f"/runs/{build['runId']}", (1600, 1000), None),
            }
            for name, (page, size, crop) in pages.items():
                path = args.out / name
                screenshot(ui.url + page, path, size, profile)
                print(f"{path}: {shrink(path, crop) // 1024} KB", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
