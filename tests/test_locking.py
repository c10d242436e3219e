"""One build of a pack at a time, whoever starts it; killed and failed builds leave no trace.

Builds run in real child processes: ``kpack build``, and the ``build_pack`` Dagster job through
``dagster.execute_job`` (the way the UI, the sensor and the schedule run it). A page of the
pack is held by the loopback server until the test releases it, so a build can be kept inside
its run, holding the lock, for as long as the test needs.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.scheduler.instigation import InstigatorType

import retrieval
from cli.main import main
from kpack.store import PackStore, build_running
from pipelines.instance import ensure_dagster_home
from pipelines.outcomes import OUTCOME_TAG, run_summary
from tests.conftest import TEST_FETCH, build, write_pack
from tests.dagster_ui import kpack_ui
from tests.loopback import LoopbackServer, SiteHandler

PROJECT = Path(__file__).resolve().parent.parent
PAGES = ["/docs/index.html", "/docs/guide.html", "/docs/readme.md"]
HELD = "/held/notes.html"
QUESTION = "Which environment variable sets where the sprocket cache lives?"
ANSWER = "WIDGET_HOME"
# A held page waits far longer than any fetch timeout would allow otherwise.
HELD_FETCH = {**TEST_FETCH, "timeout_s": 120.0}

# The build_pack job run the way Dagster's run launcher runs it: a reconstructable job,
# executed with its own executor against the instance in DAGSTER_HOME.
DAGSTER_BUILD = """
import sys
from dagster import DagsterInstance, execute_job, reconstructable
from pipelines.instance import ensure_dagster_home

def build_pack_job():
    from pipelines.definitions import defs
    return defs.get_job_def("build_pack")

if __name__ == "__main__":  # dagster imports this file again to reconstruct the job
    pack, force = sys.argv[1], sys.argv[2] == "force"
    ensure_dagster_home()  # creates DAGSTER_HOME as `kpack build` and `kpack ui` do
    instance = DagsterInstance.get()
    if not instance.has_dynamic_partition("packs", pack):
        instance.add_dynamic_partitions("packs", [pack])
    result = execute_job(
        reconstructable(build_pack_job),
        instance,
        tags={"dagster/partition": pack, "kpack/force": "true" if force else "false"},
    )
    for event in result.all_events:
        error = getattr(event.event_specific_data, "error", None)
        if event.is_failure and error is not None:
            print("failure:", error.message.strip().splitlines()[0])
    print("success" if result.success else "failed")
"""


class HeldSite(SiteHandler):
    """The test site, plus pages under /held/ that answer only once the test releases them."""

    def do_GET(self) -> None:
        if not self.path.startswith("/held/"):
            return super().do_GET()
        server = self.server.owner  # type: ignore[attr-defined]
        server.count(self.path)
        server.release.wait(timeout=300)
        page = b"<html><body><h1>Held notes</h1><p>Notes the server held back.</p></body></html>"
        self._send(200, page, "text/html; charset=utf-8")


@pytest.fixture(scope="module")
def held_site():
    with LoopbackServer(HeldSite) as server:
        server.release = threading.Event()
        yield server
        server.release.set()


@pytest.fixture(scope="module")
def published(held_site, tmp_path_factory) -> Path:
    """A workspace with pack "widgets" (one held page) published once, the page released."""
    root = tmp_path_factory.mktemp("locking")
    held_site.release.set()
    urls = [held_site.url(p) for p in [*PAGES, HELD]]
    write_pack(root, "widgets", urls, {"fetch": HELD_FETCH})
    assert build(root, "widgets").published
    return root


@pytest.fixture
def pack(workspace, published, held_site) -> Path:
    """This test's copy of the published pack and its stored intermediates; page held."""
    for part in ("packs", "storage"):
        shutil.copytree(published / part, workspace / part, symlinks=True, dirs_exist_ok=True)
    held_site.release.clear()
    return workspace / "packs" / "widgets"


def start(workspace: Path, how: str, force: bool = True) -> subprocess.Popen:
    """A build of "widgets" in a child process: ``kpack build`` or the Dagster job."""
    if how == "kpack":
        argv = ["-m", "cli.main", "build", "widgets", "--no-progress"]
        argv += ["--force"] if force else []
    else:  # a file: reconstructable() refuses jobs defined in `python -c`
        script = workspace / "dagster_build.py"
        script.write_text(DAGSTER_BUILD)
        argv = [str(script), "widgets", "force" if force else "no"]
    return subprocess.Popen(
        [sys.executable, *argv],
        cwd=PROJECT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200", "PYTHONPATH": str(PROJECT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_held(workspace: Path, how: str, site: LoopbackServer, force: bool = True):
    """A build started by ``start`` once it holds the lock and waits for the held page."""
    hits = site.hits.get(HELD, 0)
    child = start(workspace, how, force)
    deadline = time.monotonic() + 300
    while not (site.hits.get(HELD, 0) > hits and build_running(workspace / "packs" / "widgets")):
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the build never reached the held page"
        time.sleep(0.1)
    return child


def finish(child: subprocess.Popen) -> tuple[int, str, str]:
    """Exit status, the last line of stdout, and all output (whitespace folded)."""
    out, err = child.communicate(timeout=600)
    assert child.returncode >= 0, f"crashed with signal {-child.returncode}: {err[-3000:]}"
    last = out.strip().splitlines()[-1] if out.strip() else ""
    return child.returncode, last, " ".join((out + err).split())


def answer(folder: Path) -> str:
    retrieval.close_all()  # the published version may have changed under this process
    return retrieval.query(folder, QUESTION, use_llm=False)["answer"]


@pytest.mark.parametrize(("first", "second"), [("kpack", "dagster"), ("dagster", "kpack")])
def test_a_second_build_of_a_pack_fails_fast_whoever_started_either(pack, held_site, first, second):
    running = start_held(pack.parent.parent, first, held_site)

    # The first build is stuck on the held page: the second must give up, not wait or race.
    code, last, output = finish(start(pack.parent.parent, second))
    assert "pack 'widgets' is already being built" in output, output[-3000:]
    assert "Traceback" not in output
    if second == "kpack":
        assert code == 2
    else:  # the run failed setting up its resources, before any step, and says why
        assert (code, last) == (0, "failed")
        instance = DagsterInstance.get()
        [lost] = instance.get_runs(
            RunsFilter(statuses=[DagsterRunStatus.FAILURE], tags={"dagster/partition": "widgets"})
        )
        cause = run_summary(instance, lost)["cause"]
        assert "pack 'widgets' is already being built" in cause, cause
    assert running.poll() is None  # it gave up while the first still held the lock

    held_site.release.set()
    code, _, output = finish(running)
    assert code == 0, output[-3000:]
    assert os.readlink(pack / ".versions" / "current") == "v0002"
    assert not list((pack / ".versions").glob("staging*"))
    assert ANSWER in answer(pack)
    assert not build_running(pack)


def sensor_cursor(instance: DagsterInstance) -> str | None:
    """pack_sources_sensor's cursor: set once the daemon evaluated it the first time."""
    for state in instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
        if state.name == "pack_sources_sensor" and state.instigator_data:
            return state.instigator_data.cursor
    return None


def wait_for(what: str, found, timeout_s: float = 240):
    """``found()``'s first true value, polled every second."""
    deadline = time.monotonic() + timeout_s
    while not (value := found()):
        assert time.monotonic() < deadline, f"waited {timeout_s:.0f}s for {what}"
        time.sleep(1)
    return value


def test_a_build_the_sensor_starts_waits_for_the_running_build_of_the_pack(
    pack, held_site, workspace
):
    """urls.txt edited while `kpack ui` runs and a build of the pack holds its lock: the
    sensor's build waits in the run queue (one run per pack) instead of failing on the lock,
    then builds the edited sources."""
    ensure_dagster_home()  # the dagster.yaml `kpack ui` reads, written as kpack writes it
    instance = DagsterInstance.get()
    with kpack_ui(workspace / "ui.log"):
        wait_for("the sensor's first evaluation", lambda: sensor_cursor(instance))
        running = start_held(workspace, "kpack", held_site)
        with open(pack / "urls.txt", "a") as urls:
            urls.write(held_site.url("/docs/malformed.html") + "\n")
        queued = RunsFilter(
            statuses=[DagsterRunStatus.QUEUED], tags={"dagster/partition": "widgets"}
        )
        [waiting] = wait_for("the sensor's run", lambda: instance.get_runs(queued))
        time.sleep(5)  # the queue is looked at every second
        assert instance.get_run_by_id(waiting.run_id).status == DagsterRunStatus.QUEUED

        held_site.release.set()
        code, _, output = finish(running)
        assert code == 0, output[-3000:]
        ended = wait_for(
            "the sensor's run to end",
            lambda: OUTCOME_TAG in (run := instance.get_run_by_id(waiting.run_id)).tags and run,
            timeout_s=400,
        )
    assert ended.status == DagsterRunStatus.SUCCESS, ended.tags
    assert ended.tags[OUTCOME_TAG] == "published v0003"
    assert os.readlink(pack / ".versions" / "current") == "v0003"
    manifest = json.loads((pack / "manifest.json").read_text())
    assert manifest["counts"]["Article"] == len(PAGES) + 2  # the held page and the new one


def test_a_killed_build_is_marked_failed_and_its_leftovers_removed_by_the_next(
    pack, held_site, workspace, capsys
):
    killed = start_held(workspace, "kpack", held_site)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    # What a build killed in pack_graph leaves: its staging folder, half a database in it.
    leftover = pack / ".versions" / "staging-0123456789abcdef"
    leftover.mkdir()
    (leftover / "pack.db").write_bytes(b"\0" * 4096)

    instance = DagsterInstance.get()  # the one in DAGSTER_HOME the child used
    started = RunsFilter(statuses=[DagsterRunStatus.STARTED], tags={"dagster/partition": "widgets"})
    [stuck] = instance.get_runs(started)
    assert main(["status", "widgets", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["build_running"] is False  # died with it

    # The next build, launched the way Dagster launches one, cleans up after the killed one.
    held_site.release.set()
    code, last, output = finish(start(workspace, "dagster", force=False))
    assert (code, last) == (0, "success"), output[-3000:]
    assert instance.get_run_by_id(stuck.run_id).status == DagsterRunStatus.FAILURE
    assert not instance.get_runs(started)
    assert not leftover.exists()


# A build killed (SIGKILL) right after it flipped `current` to its new version.
KILLED_AFTER_FLIP = """
import os, signal, sys
from pipelines.build import build_pack
from resources.pack_store import PackStore

class DiesAfterTheFlip(PackStore):
    def publish(self, pack, version, staging):
        published = super().publish(pack, version, staging)
        os.kill(os.getpid(), signal.SIGKILL)

packs = os.environ["KPACK_PACKS_DIR"]
build_pack(sys.argv[1], force=True, resource_overrides={"pack_store": DiesAfterTheFlip(packs_dir=packs)})
"""


def test_status_names_a_version_published_outside_kpack_build(pack, held_site, workspace, capsys):
    held_site.release.set()
    code, last, output = finish(start(workspace, "dagster"))  # no daemon records it
    assert (code, last) == (0, "success"), output[-3000:]
    [run] = DagsterInstance.get().get_runs(RunsFilter(tags={"dagster/partition": "widgets"}))
    assert PackStore(workspace / "packs").last_build("widgets")["run_id"] != run.run_id

    assert main(["status", "widgets"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "version v0002" in out and "previous kept version v0001" in out
    assert f"published v0002 (run {run.run_id})" in out

    script = workspace / "killed_after_flip.py"
    script.write_text(KILLED_AFTER_FLIP)
    child = subprocess.run(
        [sys.executable, str(script), "widgets"],
        cwd=PROJECT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(PROJECT)},
        capture_output=True,
        timeout=600,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    assert os.readlink(pack / ".versions" / "current") == "v0003"
    assert main(["status", "widgets"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "version v0003" in out
    assert "its process died before it finished (v0003 is published)" in out
    assert ANSWER in answer(pack)


def read_until_exit(fd: int, pid: int, timeout_s: float) -> tuple[int, str]:
    """Everything a pty child writes until it exits, and its exit status."""
    output, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        try:
            chunk = os.read(fd, 65536) if ready else b""
        except OSError:  # EIO: the child closed the terminal by exiting
            break
        output += chunk
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), output.decode(errors="replace")


def test_ctrl_c_in_a_terminal_stops_the_build_with_one_line(pack, held_site, workspace, capsys):
    """Ctrl-C typed at `kpack build` in a terminal, its progress table live, while a page is
    being fetched: one line says so, nothing else is printed, the outcome is recorded, and
    the published version still answers."""
    hits = held_site.hits.get(HELD, 0)
    pid, fd = pty.fork()
    if pid == 0:  # the child: `kpack build` on the pty, the terminal's foreground job
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "100"}
        os.execve(str(Path(sys.executable).parent / "kpack"), ["kpack", "build", "widgets"], env)
    started = time.monotonic()
    while held_site.hits.get(HELD, 0) == hits:
        assert time.monotonic() - started < 300, "the build never reached the held page"
        select.select([fd], [], [], 0.2) and os.read(fd, 65536)
    os.write(fd, b"\x03")  # the terminal sends SIGINT to every process of the job
    interrupted_at = time.monotonic()
    code, output = read_until_exit(fd, pid, timeout_s=60)

    assert code == 130, output[-3000:]
    assert time.monotonic() - interrupted_at < 30  # not waiting for the held page
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", line).strip() for line in output.splitlines()]
    assert lines.count("interrupted; the published pack is unchanged") == 1, output[-3000:]
    assert os.readlink(pack / ".versions" / "current") == "v0001"
    assert not build_running(pack)
    last = PackStore(workspace / "packs").last_build("widgets")
    assert (last["outcome"], last["version"]) == ("interrupted", 1)
    assert main(["status", "widgets"]) == 0
    status = " ".join(capsys.readouterr().out.split())
    assert f"interrupted (v0001 is still published) (run {last['run_id']})" in status
    held_site.release.set()
    assert ANSWER in answer(pack)


def test_status_after_a_first_build_that_failed(workspace, site, capsys):
    urls = [site.url("/missing-one.html"), site.url("/missing-two.html")]
    write_pack(workspace, "broken", urls, {"fetch": TEST_FETCH})
    result = build(workspace, "broken")
    assert result.outcome == "failed"
    assert main(["status", "broken"]) == 0  # it raised TypeError on the missing version
    out = " ".join(capsys.readouterr().out.split())
    assert "published never (build it with kpack build broken)" in out
    assert "failed (nothing is published yet)" in out and result.run_id in out


def test_status_tells_an_interrupted_publish_from_a_rollback(workspace, capsys):
    from tests.test_cli import publish_fake_version

    folder = write_pack(workspace, "orphan", ["https://docs.example.org/a"])
    publish_fake_version(workspace, "orphan")
    publish_fake_version(workspace, "orphan")
    (folder / ".versions" / "v0003").mkdir()  # killed between the rename and the flip
    assert main(["status", "orphan", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["rolled_back_from"] is None
    assert status["unpublished_versions"] == ["v0003"]

    assert main(["rollback", "orphan"]) == 0
    capsys.readouterr()
    assert main(["status", "orphan", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["version"], status["rolled_back_from"]) == (1, "v0002")
    assert status["unpublished_versions"] == ["v0003"]
    assert PackStore(workspace / "packs").rolled_back_from("orphan").name == "v0002"
