"""Issue 21's failed probes, run again as a user (or an attacker) would: one line per probe.

Every probe drives the real `kpack` command in a process of its own against real servers on
127.0.0.1 (a documentation site whose sources go down, archive servers that never end or drip,
a fake Anthropic API that refuses the key), real archives written byte for byte, a small tmpfs
for a full disk, a pseudo-terminal for Ctrl-C, and `kpack ui` / `kpack serve` as children. It
prints, per probe: its id, ``held`` or ``NOT HELD``, and what was observed (the message a user
sees, and the figures: seconds, peak RSS, bytes, statuses). The outcomes also go to
``WORKDIR/probes.json``.

    .venv/bin/python bench/hostile_probes.py --workdir /tmp/probes            # every probe
    .venv/bin/python bench/hostile_probes.py --workdir /tmp/probes --only 2,3  # some groups

Needs root for the tmpfs of the full-disk probes (they say so and are skipped without it). The
whole run takes about 15 minutes on an idle 2-core machine (most of it pack builds and
`kpack ui` starting); timings taken under load say so only by being slower.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pty
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import httpx  # noqa: E402
import psutil  # noqa: E402

from tests.dagster_ui import kpack_ui  # noqa: E402
from tests.loopback import LoopbackServer, fake_anthropic_server, wait_until_serving  # noqa: E402
from tests.sources_site import OUTAGE, Answer, SourcesSite, article_html, serve  # noqa: E402
from tests.test_archive_limits import (  # noqa: E402
    GIB,
    MIB,
    HostileArchives,
    Run,
    expansion_bomb,
    lowest_free_space,
    pax_bomb,
    run_kpack,
)
from tests.test_damage import fill  # noqa: E402
from tests.test_serving_limits import (  # noqa: E402
    INITIALIZE,
    NOT_JSON_RPC,
    NOT_JSON_RPC_REPLIES,
    SlowClient,
)

KPACK = Path(sys.executable).with_name("kpack")
FETCH = {
    "allow_private_hosts": True,  # the site is on 127.0.0.1
    "timeout_s": 1.0,
    "retries": 2,
    "max_bytes": 200_000,
    "per_host_delay_s": 0.0,
}
# A page the site holds back while a build waits for it (Ctrl-C, a UI run meanwhile).
HELD_FETCH = {**FETCH, "timeout_s": 120.0}
HELD_PAGE = "/docs/article-2.html"
QUESTION = "What are the details of article 3?"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class Outcome:
    probe: str
    held: bool
    observed: str


class Done(Run):
    """A `kpack` command's exit status, output, seconds and peak RSS, and what it said."""

    @property
    def said(self) -> str:
        """stderr, or stdout when stderr is empty, as one line (terminal wrapping undone)."""
        return " ".join((self.err.strip() or self.out.strip()).split())

    @property
    def one_line(self) -> bool:
        return "Traceback" not in self.out + self.err and len(self.err.strip().splitlines()) <= 1


# Where kpack keeps its state when these are unset: beside the packs folder.
STATE_VARIABLES = ("KPACK_STORAGE", "DAGSTER_HOME")


class Lab:
    """A project folder (packs, storage, Dagster home beside it) and the servers the probes
    break: the documentation site, archive servers and, on demand, small disks."""

    def __init__(self, root: Path, site: SourcesSite, archives: LoopbackServer) -> None:
        self.root = root
        self.packs = root / "packs"
        self.packs.mkdir(parents=True, exist_ok=True)
        # For what runs in this process or inherits its environment (kpack ui, the Dagster
        # instance read here): the state beside this packs folder.
        environment = self.env()
        os.environ.clear()
        os.environ.update(environment)
        self.site = site
        self.archives = archives
        self.mounted: list[Path] = []
        self.cwd = root / "cwd"  # where the commands run: any folder but the project's
        self.cwd.mkdir(exist_ok=True)
        os.chdir(self.cwd)
        self.state_before = self.state_in_project()

    def env(self, packs: Path | None = None, **extra: str) -> dict[str, str]:
        env = {**os.environ, "KPACK_PACKS_DIR": str(packs or self.packs), "COLUMNS": "200"}
        env |= {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(PROJECT)}
        for name in ("ANTHROPIC_API_KEY", *STATE_VARIABLES):
            env.pop(name, None)
        return env | extra

    def state_in_project(self) -> set[Path]:
        """The state folders kpack would create without KPACK_PACKS_DIR: in the project folder
        and in the folder the commands run in."""
        names = (".kpack_storage", ".dagster_home")
        return {f / n for f in (PROJECT, self.cwd) for n in names if (f / n).exists()}

    @property
    def stray_state(self) -> list[str]:
        """The state folders this run created where KPACK_PACKS_DIR says they do not belong."""
        return sorted(str(p) for p in self.state_in_project() - self.state_before)

    def kpack(self, *args: str, packs: Path | None = None, **extra: str) -> Done:
        """`kpack ARGS` over ``packs`` (the lab's by default) in a process of its own, with
        ``extra`` in its environment: exit status, output, peak RSS and seconds."""
        run = run_kpack(*args, packs=packs or self.packs, env={"COLUMNS": "200", **extra})
        return Done(**asdict(run))

    def write_pack(self, name: str, lines: list[str], config: dict) -> Path:
        folder = self.packs / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "urls.txt").write_text("".join(f"{line}\n" for line in lines))
        (folder / "kg_config.json").write_text(json.dumps(config))
        return folder

    def built(self, name: str, lines: list[str], config: dict) -> Path:
        """The pack, written and built unless it is published already."""
        folder = self.packs / name
        if not (folder / ".versions" / "current").exists():
            self.write_pack(name, lines, config)
            done = self.kpack("build", name, "--no-progress")
            assert done.code == 0, done.err[-3000:]
        return folder

    def sitemapped(self) -> Path:
        """The pack of the site's sitemap, built (the pack most probes leave as it is)."""
        return self.built("sitemapped", [self.site.url("/docs/sitemap.xml")], {"fetch": FETCH})

    def manifest(self, name: str) -> dict:
        return json.loads((self.packs / name / "manifest.json").read_text())

    def current(self, name: str) -> str:
        return os.readlink(self.packs / name / ".versions" / "current")

    def answers(self, name: str, packs: Path | None = None) -> bool:
        """Whether `kpack search` finds passages in the pack's published version."""
        done = self.kpack("search", name, QUESTION, "--k", "3", "--json", packs=packs)
        return done.code == 0 and bool(json.loads(done.out))

    def small_disk(self, size: str) -> Path | None:
        """A tmpfs of ``size`` (unmounted at the end), or None where mounting is not allowed."""
        folder = Path(tempfile.mkdtemp(prefix="disk-", dir=self.root))
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return None
        self.mounted.append(folder)
        return folder

    def unmount_all(self) -> None:
        for folder in self.mounted:
            subprocess.run(["umount", "-l", str(folder)], check=False)


PROBES: dict[str, tuple[str, Callable[[Lab], list[Outcome]]]] = {}


def probe(group: str, title: str) -> Callable:
    def register(run: Callable[[Lab], list[Outcome]]) -> Callable:
        PROBES[group] = (title, run)
        return run

    return register


def staged_leftovers(packs: Path) -> list[str]:
    """What installs, downloads and builds left behind in the packs folder: staging folders'
    contents and stray download files."""
    found = [str(p.relative_to(packs)) for p in packs.glob(".kpack-staging/*") if p.name != ".lock"]
    found += [str(p.relative_to(packs)) for p in packs.rglob(".download-*")]
    found += [str(p.relative_to(packs)) for p in packs.glob("*/.versions/staging*")]
    return found


# --- 1: a source outage on a rebuild --------------------------------------------------------


def outage_rebuild(lab: Lab, probe_id: str, name: str, broken: str, answer: Answer) -> Outcome:
    """Rebuild ``name`` while ``broken`` answers ``answer``: held when every article stays
    published and the failure is counted and named."""
    before = lab.manifest(name)
    lab.site.answers[broken] = answer
    try:
        done = lab.kpack("build", name, "--no-progress")
    finally:
        del lab.site.answers[broken]
    after = lab.manifest(name)
    failures = after["sources"]["failures"] if after["version"] != before["version"] else []
    kept = after["counts"]["Article"] == before["counts"]["Article"]
    named = [f"line {f['line']}: {f['error']}" for f in failures if f["url"].endswith(broken)]
    held = done.code == 0 and kept and len(named) == 1 and after["sources"]["failed"] >= 1
    return Outcome(
        probe_id,
        held,
        f"exit {done.code}; articles {before['counts']['Article']} -> "
        f"{after['counts']['Article']} (v{after['version']:04d}); failed URLs "
        f"{after['sources']['failed']}; failure: {named[0] if named else failures or 'none'}",
    )


OVERSIZED_SITEMAP = Answer(
    content_type="application/xml",
    body=b'<?xml version="1.0"?><urlset>' + b"<!-- padding -->" * 20_000 + b"</urlset>",
)


@probe("1", "a source outage on a rebuild")
def source_outages(lab: Lab) -> list[Outcome]:
    site = lab.site
    lab.sitemapped()
    lab.built("crawled", [site.url("/docs/") + " depth=1"], {"fetch": FETCH})
    slow = Answer(content_type="application/xml", delay_s=5.0)  # past 1 s x 2 retries
    outcomes = [
        outage_rebuild(lab, "1a sitemap 503", "sitemapped", "/docs/sitemap.xml", OUTAGE),
        outage_rebuild(lab, "1a sitemap timeout", "sitemapped", "/docs/sitemap.xml", slow),
        outage_rebuild(lab, "1a robots.txt 503", "crawled", "/robots.txt", OUTAGE),
        outage_rebuild(lab, "1a crawl seed 503", "crawled", "/docs/", OUTAGE),
        outage_rebuild(
            lab,
            "1b sitemap over the size cap",
            "sitemapped",
            "/docs/sitemap.xml",
            OVERSIZED_SITEMAP,
        ),
    ]

    # A failed share past the pack's threshold: not published.
    strict = {"fetch": FETCH, "max_failed_fraction": 0.1}
    lab.write_pack("sitemapped", [site.url("/docs/sitemap.xml")], strict)
    version = lab.current("sitemapped")
    site.answers["/docs/sitemap.xml"] = OUTAGE
    try:
        done = lab.kpack("build", "sitemapped", "--no-progress")
    finally:
        del site.answers["/docs/sitemap.xml"]
    kept = lab.current("sitemapped") == version and lab.answers("sitemapped")
    outcomes.append(
        Outcome(
            "1a outage past max_failed_fraction",
            done.code == 1 and kept and "sitemap: HTTP 503" in done.said,
            f"exit {done.code}; {version} still current and answering: {kept}; "
            f"said: {done.said[:240]}",
        )
    )

    # A pack whose only line is a sitemap that cannot be read: no ZeroDivisionError.
    site.answers["/docs/sitemap-broken.xml"] = Answer(
        content_type="application/xml", body=b"<html>no"
    )
    lab.write_pack("unreadable", [site.url("/docs/sitemap-broken.xml")], {"fetch": FETCH})
    done = lab.kpack("build", "unreadable", "--no-progress")
    outcomes.append(
        Outcome(
            "1c only line an unreadable sitemap",
            done.code == 1 and "Traceback" not in done.err and "ZeroDivision" not in done.err,
            f"exit {done.code}; said: {done.said[:240]}",
        )
    )
    return outcomes


# --- 2: archive bombs ------------------------------------------------------------------------


def installed_copy(lab: Lab) -> tuple[str, str]:
    """`sitemapped` exported and installed as `widgets`, the pack a refused archive must leave
    as it is; the archive's path and the installed version."""
    lab.sitemapped()
    archive = lab.root / "sitemapped.kpack"
    done = lab.kpack("export", "sitemapped", "-o", str(archive))
    assert done.code == 0, done.err
    if not (lab.packs / "widgets").exists():
        done = lab.kpack("install", str(archive), "--as", "widgets")
        assert done.code == 0, done.err
    return str(archive), lab.current("widgets")


BOMBS = {
    "2a pax header of 1 GiB": lambda path: pax_bomb(path, GIB),
    "2b 1 GiB expansion, declared": lambda path: expansion_bomb(path, GIB, GIB),
    "2b 1 GiB behind a 1 KiB entry": lambda path: expansion_bomb(path, 1024, GIB),
}


@probe("2", "archive bombs: kpack validate / install")
def archive_bombs(lab: Lab) -> list[Outcome]:
    _, version = installed_copy(lab)
    junk = lab.root / "junk.kpack"
    junk.write_bytes(b"not a tarball")
    alone = lab.kpack("install", str(junk))  # what the CLI itself costs
    tmp = lab.small_disk("64m")  # $TMPDIR too small for a gigabyte
    extra = {"TMPDIR": str(tmp)} if tmp else {}
    outcomes = []
    for name, make in BOMBS.items():
        bomb = make(lab.root / "bomb.kpack")
        size = bomb.stat().st_size
        runs = {
            "validate": lab.kpack("validate", str(bomb), **extra),
            "install": lab.kpack("install", str(bomb), **extra),
            "install --replace": lab.kpack(
                "install", str(bomb), "--as", "widgets", "--replace", **extra
            ),
        }
        untouched = lab.current("widgets") == version and lab.answers("widgets")
        left = staged_leftovers(lab.packs) + [
            p.name for p in lab.packs.iterdir() if p.name == "bomb"
        ]
        worst = max(runs.values(), key=lambda r: r.peak_rss_mib)
        slowest = max(runs.values(), key=lambda r: r.seconds)
        held = (
            all(r.code in (1, 2) and "Traceback" not in r.err for r in runs.values())
            and worst.peak_rss_mib < alone.peak_rss_mib + 64
            and slowest.seconds < alone.seconds + 10
            and untouched
            and not left
        )
        install = runs["install"]
        outcomes.append(
            Outcome(
                name,
                held,
                f"{size / MIB:.1f} MiB archive; peak RSS {worst.peak_rss_mib:.0f} MiB (the CLI "
                f"alone {alone.peak_rss_mib:.0f}), at most {slowest.seconds:.2f} s (alone "
                f"{alone.seconds:.2f}); exits {[r.code for r in runs.values()]}; widgets "
                f"{version} untouched and answering: {untouched}; left: {left or 'nothing'}; "
                f"install said: {install.said[:200]}",
            )
        )
        bomb.unlink()
    return outcomes


# --- 3: downloads without bounds -------------------------------------------------------------

DRIP_EVERY_S = 5.0


class DrippingArchives(HostileArchives):
    """tests.test_archive_limits' hostile archive URLs (/endless.kpack, /huge.kpack, ...) and
    /drip.kpack: a length of 1 MiB declared, then a byte every DRIP_EVERY_S."""

    def do_GET(self) -> None:
        if self.path != "/drip.kpack":
            super().do_GET()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(MIB))
        self.end_headers()
        try:
            for _ in range(MIB):
                self.wfile.write(b"\0")
                self.wfile.flush()
                time.sleep(DRIP_EVERY_S)
        except OSError:  # the client gave up: what its deadline is for
            return


@probe("3", "kpack install of a URL that never ends, drips, or is killed")
def downloads(lab: Lab) -> list[Outcome]:
    outcomes = []
    disk = lab.small_disk("64m")
    if disk is None:
        outcomes.append(Outcome("3a endless body, defaults", False, "no tmpfs here (needs root)"))
    else:
        packs = disk / "packs"
        endless = lab.archives.url("/endless.kpack")
        done, lowest = lowest_free_space(disk, lambda: lab.kpack("install", endless, packs=packs))
        left = staged_leftovers(packs)
        outcomes.append(
            Outcome(
                "3a endless body, defaults (64 MiB disk)",
                done.code == 2 and done.one_line and not left and lowest > 0,
                f"exit {done.code} after {done.seconds:.1f} s; least free meanwhile "
                f"{lowest / MIB:.1f} MiB; left: {left or 'nothing'}; said: {done.said[:240]}",
            )
        )
    cap = 16 * MIB
    done = lab.kpack(
        "install", lab.archives.url("/endless.kpack"), KPACK_MAX_ARCHIVE_BYTES=str(cap)
    )
    left = staged_leftovers(lab.packs)
    outcomes.append(
        Outcome(
            "3a endless body, KPACK_MAX_ARCHIVE_BYTES=16 MiB",
            done.code == 2 and done.one_line and not left,
            f"exit {done.code} after {done.seconds:.1f} s; left: {left or 'nothing'}; "
            f"said: {done.said[:240]}",
        )
    )

    deadline = 20
    done = lab.kpack(
        "install", lab.archives.url("/drip.kpack"), KPACK_DOWNLOAD_DEADLINE_S=str(deadline)
    )
    left = staged_leftovers(lab.packs)
    outcomes.append(
        Outcome(
            f"3b a byte every {DRIP_EVERY_S:g} s, deadline {deadline} s",
            done.code == 2 and done.one_line and done.seconds < deadline + 10 and not left,
            f"exit {done.code} after {done.seconds:.1f} s (default deadline 900 s); "
            f"left: {left or 'nothing'}; said: {done.said[:240]}",
        )
    )

    # Killed mid-download: what it leaves, and whether the next install removes it.
    client = subprocess.Popen(
        [str(KPACK), "install", lab.archives.url("/drip.kpack")],
        env=lab.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    stop = time.monotonic() + 120
    while not list(lab.packs.glob(".kpack-staging/*/drip.kpack")) and time.monotonic() < stop:
        time.sleep(0.1)
    client.send_signal(signal.SIGKILL)
    client.wait()
    after_kill = staged_leftovers(lab.packs)
    junk = lab.root / "junk.kpack"
    junk.write_bytes(b"not a tarball")
    lab.kpack("install", str(junk))
    after_next = staged_leftovers(lab.packs)
    listed = lab.kpack("list").out
    outcomes.append(
        Outcome(
            "3c install killed mid-download",
            not after_next and ".kpack-staging" not in listed,
            f"after SIGKILL: {after_kill or 'nothing'} (hidden staging folder, not a pack); "
            f"after the next install: {after_next or 'nothing'}",
        )
    )
    return outcomes


# --- 4: slow clients against kpack serve -----------------------------------------------------

OPEN_FILES = 256
SLOW_CLIENTS = 300


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe_socket:
        return probe_socket.getsockname()[1]


@contextlib.contextmanager
def kpack_serve(lab: Lab, open_files: int | None = None) -> Iterator[tuple[str, list[str]]]:
    """`kpack serve` over the lab's packs (open files limited to ``open_files``): its URL, and
    its stderr lines once it has stopped."""

    def limit() -> None:
        if open_files:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    port = free_port()
    server = subprocess.Popen(
        [str(KPACK), "serve", "--port", str(port)],
        env=lab.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
    )
    url, said = f"http://127.0.0.1:{port}", []
    try:
        wait_until_serving(server, url, 300)
        yield url, said
    finally:
        server.send_signal(signal.SIGINT)
        said += server.communicate(timeout=60)[1].splitlines()


def searches(url: str, seconds: float) -> tuple[list[int], list[float]]:
    """A normal client's searches, one every 0.5 s for ``seconds``: statuses and latencies."""
    statuses, latencies = [], []
    stop = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.monotonic() < stop:
            began = time.perf_counter()
            try:
                status = client.post(
                    "/packs/sitemapped/search", json={"question": QUESTION, "k": 3}
                ).status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            latencies.append(time.perf_counter() - began)
            statuses.append(status)
            time.sleep(0.5)
    return statuses, latencies


def latency_text(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    return f"median {ordered[len(ordered) // 2] * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"


@probe("4", f"{SLOW_CLIENTS} slow connections against kpack serve with {OPEN_FILES} open files")
def slow_clients(lab: Lab) -> list[Outcome]:
    lab.sitemapped()
    with kpack_serve(lab, OPEN_FILES) as (url, said):
        port = int(url.rsplit(":", 1)[1])
        _, quiet_latencies = searches(url, 3)
        slow = [SlowClient(port) for _ in range(SLOW_CLIENTS)]
        stop = threading.Event()

        def drip() -> None:  # one header line every 5 s on each slow connection
            while not stop.wait(5.0):
                for client in slow:
                    client.drip()

        dripping = threading.Thread(target=drip, daemon=True)
        dripping.start()
        try:
            statuses, latencies = searches(url, 15)  # past the 10 s header timeout
        finally:
            stop.set()
            dripping.join(timeout=30)
        answers: dict[str, int] = {}
        for client in slow:
            client.collect()
            answers[client.status] = answers.get(client.status, 0) + 1
            client.sock.close()
    exhausted = any("Too many open files" in line for line in said)
    held = set(statuses) == {200} and max(latencies) < 5 and not exhausted
    return [
        Outcome(
            f"4 {SLOW_CLIENTS} slow connections, {OPEN_FILES} fds",
            held,
            f"normal searches: {len(statuses)}, statuses {sorted(set(map(str, statuses)))}, "
            f"{latency_text(latencies)} (without the slow ones: {latency_text(quiet_latencies)}"
            f"); slow connections answered {answers}; 'Too many open files': {exhausted}",
        )
    ]


# --- 5 to 8: a build stopped, launched elsewhere, refused, failing ---------------------------


def held_pack(lab: Lab) -> Path:
    """`held`: the site's articles listed one by one, with a fetch timeout long enough for a
    page the site holds back (HELD_PAGE), built."""
    lines = [lab.site.url(p) for p in lab.site.article_paths()]
    return lab.built("held", lines, {"fetch": HELD_FETCH})


@contextlib.contextmanager
def page_held(lab: Lab) -> Iterator[Callable[[], bool]]:
    """HELD_PAGE held back by the site until the block ends; yields whether a request for it
    arrived since the block began."""
    release, hits = threading.Event(), lab.site.hits.get(HELD_PAGE, 0)
    lab.site.answers[HELD_PAGE] = Answer(body=article_html(2).encode(), hold=release)
    try:
        yield lambda: lab.site.hits.get(HELD_PAGE, 0) > hits
    finally:
        del lab.site.answers[HELD_PAGE]
        release.set()


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = 300) -> object:
    stop = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > stop:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.2)
    return value


def status_text(lab: Lab, name: str) -> str:
    return " ".join(lab.kpack("status", name).out.split())


@probe("5", "Ctrl-C in the terminal during kpack build")
def ctrl_c(lab: Lab) -> list[Outcome]:
    folder = held_pack(lab)
    version = lab.current("held")
    with page_held(lab) as requested:
        pid, terminal = pty.fork()
        if pid == 0:  # the child: `kpack build` on the pty, the terminal's foreground job
            env = lab.env(COLUMNS="100")
            os.execve(str(KPACK), ["kpack", "build", "held", "--force"], env)
        deadline = time.monotonic() + 300
        while not requested() and time.monotonic() < deadline:
            select.select([terminal], [], [], 0.2) and os.read(terminal, 65536)
        os.write(terminal, b"\x03")  # the terminal sends SIGINT to the job's processes
        pressed = time.monotonic()
        code, output = read_until_exit(terminal, pid, timeout_s=120)
        took = time.monotonic() - pressed
    lines = [ANSI.sub("", line).strip() for line in output.splitlines()]
    said = [line for line in lines if "interrupt" in line.lower()]
    status = status_text(lab, "held")
    held = (
        code == 130
        and "Traceback" not in output
        and "IndexError" not in output
        and said == ["interrupted; the published pack is unchanged"]
        and lab.current("held") == version
        and "interrupted" in status
        and lab.answers("held")
        and not list((folder / ".versions").glob("staging*"))
    )
    recorded = re.search(r"last build \S+ ago: (.*?) \(run", status)
    return [
        Outcome(
            "5 Ctrl-C during kpack build",
            held,
            f"exit {code} {took:.1f} s after Ctrl-C; lines about it: {said}; traceback: "
            f"{'Traceback' in output}; {version} still current: {lab.current('held') == version}"
            f"; kpack status: {recorded[1] if recorded else status[:160]}",
        )
    ]


# The build_pack job run as Dagster's run launcher runs it (tests/test_locking.py).
from tests.test_locking import DAGSTER_BUILD, KILLED_AFTER_FLIP, read_until_exit  # noqa: E402


def python_child(lab: Lab, code: str, *args: str) -> subprocess.CompletedProcess:
    script = lab.root / "child.py"  # a file: reconstructable() refuses jobs defined in `-c`
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script), *args],
        env=lab.env(),
        capture_output=True,
        text=True,
        timeout=900,
    )


@probe("6", "kpack status after a build outside kpack build, and after a kill after the flip")
def status_probes(lab: Lab) -> list[Outcome]:
    held_pack(lab)
    outside = python_child(lab, DAGSTER_BUILD, "held", "force")
    manifest = lab.manifest("held")
    status = status_text(lab, "held")
    named = f"published v{manifest['version']:04d} (run {manifest['run_id']})"
    outcomes = [
        Outcome(
            "6 status after a build_pack run outside kpack build",
            outside.stdout.strip().endswith("success") and named in status,
            f"the run published v{manifest['version']:04d}; status says: "
            + (named if named in status else status[:240]),
        )
    ]
    killed = python_child(lab, KILLED_AFTER_FLIP, "held")
    current = lab.current("held")
    status = status_text(lab, "held")
    expected = f"its process died before it finished ({current} is published)"
    outcomes.append(
        Outcome(
            "6 status after a kill just after the flip",
            killed.returncode == -signal.SIGKILL and expected in status and lab.answers("held"),
            f"child exit {killed.returncode}; {current} current; status says: "
            + (expected if expected in status else status[:240]),
        )
    )
    return outcomes


@probe("7", "kpack build with an API key the API refuses (401)")
def refused_key(lab: Lab) -> list[Outcome]:
    held_pack(lab)
    version = lab.current("held")
    with fake_anthropic_server(fail_with=401) as fake:
        done = lab.kpack(
            "build",
            "held",
            "--force",
            "--no-progress",
            ANTHROPIC_API_KEY="sk-ant-probe-not-a-real-key",
            ANTHROPIC_BASE_URL=fake.base,
        )
        requests = len(fake.requests)
    method = lab.manifest("held")["extraction"]["method"]
    first = done.said.split(" v0")[0]
    return [
        Outcome(
            "7 a refused key (401)",
            done.code == 1
            and "refused (401)" in done.said
            and lab.current("held") == version
            and "sk-ant-probe" not in done.out + done.err,
            f"exit {done.code}; {requests} requests sent; {version} still current "
            f"({method} extraction); said: {first[:240]}",
        )
    ]


@probe("8", "what a failed build and a build's summary say")
def build_reports(lab: Lab) -> list[Outcome]:
    lines = [lab.site.url(f"/docs/missing-{n}.html") for n in range(1, 26)]
    lab.write_pack("broken", [*lines, lab.site.url("/docs/article-1.html")], {"fetch": FETCH})
    done = lab.kpack("build", "broken", "--no-progress")
    # One line per URL: "failed line N: URL: error", or, for URLs that failed alike, their
    # error once ("failed 20 URLs: ...") and then "  line N: URL" each.
    listed = [
        line
        for line in done.err.splitlines()
        if line.startswith("failed line") or line.startswith("  line ")
    ]
    more = [line for line in done.err.splitlines() if line.startswith("failed ... and")]
    outcomes = [
        Outcome(
            "8 a failed build names its failed URLs",
            done.code == 1 and len(listed) == 20 and more and "5 more" in more[0],
            f"exit {done.code}; {len(listed)} failed URLs listed, then: {more[0] if more else '-'}"
            f"; {len(done.out.splitlines()) + len(done.err.splitlines())} lines in all",
        )
    ]
    lab.sitemapped()
    lab.site.answers["/docs/article-1.html"] = Answer(body=b"<h1>Article 1</h1><p>New text.</p>")
    try:
        done = lab.kpack("build", "sitemapped", "--no-progress")
    finally:
        del lab.site.answers["/docs/article-1.html"]
    cells = [line.split("│") for line in done.out.splitlines() if line.count("│") == 1]
    rows = {what.strip(): value.strip() for what, value in cells}
    seconds = {k: float(v) for k, v in rows.items() if k.endswith(" s") and k != "total s"}
    total = float(rows.get("total s", "nan"))
    pages = rows.get("pages new / changed / unchanged / removed", "-")
    outcomes.append(
        Outcome(
            "8 the summary's times add up, pages counted once",
            done.code == 0 and abs(sum(seconds.values()) - total) < 0.05 * len(seconds) + 0.1,
            f"stage rows {', '.join(f'{k[:-2].strip()} {v:.1f}' for k, v in seconds.items())} "
            f"sum to {sum(seconds.values()):.1f} s of {total:.1f} s; pages new / changed / "
            f"unchanged / removed {pages}, 304s {rows.get('pages answered 304 Not Modified')}",
        )
    )
    return outcomes


# --- 9 and 10: kpack ui ------------------------------------------------------------------------


@probe("9", "kpack ui: a launched run meets the sensor's; then SIGTERM (item 10)")
def dagster_ui(lab: Lab) -> list[Outcome]:
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
    from dagster_graphql import DagsterGraphQLClient

    from pipelines.instance import ensure_dagster_home
    from pipelines.outcomes import OUTCOME_TAG
    from tests.test_locking import sensor_cursor

    folder = held_pack(lab)
    ensure_dagster_home()  # the instance `kpack ui` uses, beside the packs folder
    instance = DagsterInstance.get()
    outcomes = []
    with kpack_ui(lab.root / "ui.log") as (ui, port):
        wait_until(lambda: sensor_cursor(instance), "the sensor's first evaluation")
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        ours = RunsFilter(tags={"dagster/partition": "held"})
        earlier = {r.run_id for r in instance.get_runs(ours)}  # kpack build's runs
        with page_held(lab) as requested:
            # What the launchpad's Launch (or Materialize) does: a run of the pack's partition.
            clicked = client.submit_job_execution(
                "build_pack", tags={"dagster/partition": "held", "kpack/force": "true"}
            )
            wait_until(requested, "the launched run to reach the held page")
            with open(folder / "urls.txt", "a") as urls:  # the user edits urls.txt meanwhile
                urls.write(lab.site.url("/docs/") + "\n")
            sensed = wait_until(
                lambda: [r for r in instance.get_runs(ours) if r.run_id not in {clicked, *earlier}],
                "the sensor's run",
                timeout_s=180,
            )[0]
            time.sleep(5)  # the daemon looks at the queue every second or so
            meanwhile = instance.get_run_by_id(sensed.run_id).status.value
        ended = [  # a run's outcome is recorded (as a tag) once it has ended
            wait_until(
                lambda run_id=run_id: (
                    OUTCOME_TAG in (run := instance.get_run_by_id(run_id)).tags and run
                ),
                "the runs to end",
                timeout_s=600,
            )
            for run_id in (clicked, sensed.run_id)
        ]
        said = [f"{r.status.value} ({r.tags.get(OUTCOME_TAG, '-')})" for r in ended]
        outcomes.append(
            Outcome(
                "9 a launched run and the sensor's, one pack",
                meanwhile == "QUEUED" and all(r.status == DagsterRunStatus.SUCCESS for r in ended),
                f"the sensor's run while the launched one held the pack: {meanwhile}; "
                f"launched run: {said[0]}; sensor's run: {said[1]}; now {lab.current('held')}",
            )
        )

        family = psutil.Process(ui.pid).children(recursive=True)
        ui.send_signal(signal.SIGTERM)  # a service manager stopping it, say
        stopped_at = time.monotonic()
        code = ui.wait(timeout=120)
        _, left = psutil.wait_procs(family, timeout=10)
        took = time.monotonic() - stopped_at
    with socket.socket() as probe_socket:
        answering = probe_socket.connect_ex(("127.0.0.1", port)) == 0
    outcomes.append(
        Outcome(
            "10 SIGTERM to kpack ui",
            code == 0 and not left and not answering,
            f"exit {code} after {took:.1f} s; {len(family)} child processes, {len(left)} left "
            f"({[' '.join(p.cmdline()[:3]) for p in left]}); port {port} answering: {answering}",
        )
    )
    return outcomes


# --- 11: unclear messages --------------------------------------------------------------------

MISSING_MODEL = "kpack-probes/an-embedding-model-not-on-this-machine"


def mcp_session(lab: Lab, lines: list[str], answers: int) -> list[dict]:
    """What `kpack mcp` replies to ``lines`` (written to its stdin at once), read until
    ``answers`` replies came; stdin is closed only then (at its end the server stops)."""
    server = subprocess.Popen(
        [str(KPACK), "mcp"],
        env=lab.env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    server.stdin.write("".join(f"{line}\n" for line in lines))
    server.stdin.flush()
    replies = [json.loads(server.stdout.readline()) for _ in range(answers)]
    server.stdin.close()
    server.wait(timeout=60)
    return replies


INITIALIZED = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})


def full_disk(lab: Lab, alone: bool) -> Outcome:
    """A rebuild of a pack whose disk has not a byte left: the packs ``alone`` on it (the
    storage and the Dagster home elsewhere), or with the storage and the Dagster home beside
    them (kpack's layout)."""
    disk = lab.small_disk("300m")
    what = "packs alone" if alone else "packs, storage and Dagster home"
    if disk is None:
        return Outcome(f"11 a full disk: {what}", False, "no tmpfs here (needs root)")
    packs = disk / "packs"
    folder = packs / "full"
    folder.mkdir(parents=True)
    shutil.copy(lab.packs / "sitemapped" / "urls.txt", folder / "urls.txt")
    (folder / "kg_config.json").write_text(json.dumps({"fetch": FETCH}))
    elsewhere = lab.root / f"state-of-{disk.name}"
    state = {"KPACK_STORAGE": str(elsewhere / "storage"), "DAGSTER_HOME": str(elsewhere / "home")}
    state = state if alone else {}
    first = lab.kpack("build", "full", "--no-progress", packs=packs, **state)
    assert first.code == 0, first.err[-3000:]
    fill(disk, leave_bytes=0)
    again = lab.kpack("build", "full", "--no-progress", packs=packs, **state)
    answers = lab.answers("full", packs=packs)
    return Outcome(
        f"11 a full disk: {what}",
        again.code in (0, 2) and again.one_line and answers,
        f"exit {again.code}; stdout: {' '.join(again.out.split())[:100] or '-'}; stderr: "
        f"{' '.join(again.err.split())[:220]}; still answering: {answers}",
    )


@probe("11", "a missing model, unparseable bodies, MCP lines that are not JSON-RPC, a full disk")
def unclear_messages(lab: Lab) -> list[Outcome]:
    lab.sitemapped()
    foreign = lab.packs / "foreign"  # as a pack built elsewhere, with another model
    shutil.rmtree(foreign, ignore_errors=True)
    shutil.copytree(lab.packs / "sitemapped", foreign, symlinks=True)
    manifest_path = foreign / ".versions" / lab.current("foreign") / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["embedding"]["model"] = MISSING_MODEL
    manifest_path.write_text(json.dumps(manifest))
    asked = lab.kpack("query", "foreign", QUESTION, "--no-llm")
    with kpack_serve(lab) as (url, _):
        served = httpx.post(f"{url}/packs/foreign/search", json={"question": QUESTION}, timeout=120)
        bodies = {
            "latin-1": b'{"question": "caf\xe9"}',
            "20,000 deep": b'{"question": ' + b"[" * 20000 + b"]" * 20000 + b"}",
        }
        refused = {
            what: httpx.post(
                f"{url}/packs/sitemapped/query",
                content=body,
                headers={"content-type": "application/json"},
                timeout=30,
            )
            for what, body in bodies.items()
        }
    outcomes = [
        Outcome(
            "11 a manifest naming a model not here",
            asked.code == 2 and asked.one_line and served.status_code == 409,
            f"kpack query exit {asked.code}: {asked.said[:160]}; HTTP {served.status_code}: "
            f"{served.json().get('detail', '')[:120]}",
        ),
        Outcome(
            "11 a body not UTF-8 / nested too deeply",
            all(r.status_code == 400 for r in refused.values()),
            "; ".join(
                f"{what}: {r.status_code} {r.json().get('detail')}" for what, r in refused.items()
            )
            + " (documented in docs/serving.md)",
        ),
    ]
    replied = mcp_session(lab, NOT_JSON_RPC, len(NOT_JSON_RPC_REPLIES))
    replies = [(r.get("id"), r.get("error", {}).get("code")) for r in replied]
    outcomes.append(
        Outcome(
            "11 MCP lines that are not JSON-RPC",
            replies == NOT_JSON_RPC_REPLIES,
            f"replies (id, error code): {replies}",
        )
    )

    outcomes += [full_disk(lab, alone=True), full_disk(lab, alone=False)]
    return outcomes


# --- 12: the first hour of a new user --------------------------------------------------------


def widest(text: str) -> int:
    return max((len(ANSI.sub("", line)) for line in text.splitlines()), default=0)


@probe("12", "rough edges a new user meets")
def first_hour(lab: Lab) -> list[Outcome]:
    from tests.test_pdf import make_pdf

    lab.sitemapped()
    outcomes = []

    def check(name: str, held: bool, observed: str) -> None:
        outcomes.append(Outcome(f"12 {name}", held, observed))

    (lab.packs / "nourls").mkdir(exist_ok=True)
    done = lab.kpack("build", "nourls")
    check("a folder without urls.txt", done.code == 2 and "no urls.txt" in done.said, done.said)

    done = lab.kpack("new", "ftp", "--url", "ftp://files.example.org/guide.txt")
    check(
        "kpack new --url ftp://",
        done.code == 2
        and "ftp://files.example.org/guide.txt" in done.said
        and "line 7" not in done.said,
        done.said[:200],
    )

    done = lab.kpack("eval", "sitemapped")
    check(
        "kpack eval without questions",
        done.code == 2 and '"question"' in done.said,
        done.said[:240],
    )

    # A fresh clone's packs beside the built ones: the example packs that need the internet.
    for example in ("demo", "go-expert", "python-expert", "rust-expert"):
        shutil.copytree(PROJECT / "packs" / example, lab.packs / example, dirs_exist_ok=True)
    listed = lab.kpack("list", COLUMNS="80")
    web = [line.split()[0] for line in listed.out.splitlines() if line.rstrip().endswith(" web")]
    check(
        "kpack list at 80 columns, web packs marked",
        widest(listed.out) <= 80 and {"go-expert", "python-expert", "rust-expert"} <= set(web),
        f"widest line {widest(listed.out)}; marked web: {web}; footer: "
        f"{listed.out.strip().splitlines()[-1]}",
    )
    explained = lab.kpack("query", "sitemapped", QUESTION, "--explain", "--no-llm", COLUMNS="80")
    check(
        "kpack query --explain at 80 columns",
        explained.code == 0 and widest(explained.out) <= 80,
        f"widest line {widest(explained.out)} of {len(explained.out.splitlines())}",
    )
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "list_packs"}}
    call["params"]["arguments"] = {}
    listing = mcp_session(lab, [INITIALIZE, INITIALIZED, json.dumps(call)], 2)[-1]
    packs = json.loads(listing["result"]["content"][0]["text"])["packs"]
    go = next(p for p in packs if p["name"] == "go-expert")
    check(
        "MCP list_packs on a web pack never built",
        "internet" in go.get("error", ""),
        f"go-expert: {go.get('error')}",
    )
    offline = lab.kpack("build", "go-expert", "--no-progress")
    check(
        "kpack build go-expert offline",
        offline.code == 1 and "needs internet access" in offline.said,
        f"exit {offline.code} after {offline.seconds:.0f} s: "
        + " ".join(offline.said.split("nothing is published")[0].split())[-200:],
    )
    for example in ("demo", "go-expert", "python-expert", "rust-expert"):
        shutil.rmtree(lab.packs / example)

    with kpack_serve(lab) as (url, _):
        page = httpx.get(f"{url}/docs", timeout=30).text
        assets = re.findall(r"(?:src|href)=[\"']([^\"']+\.(?:js|css))", page)
        fetched = {a: httpx.get(httpx.URL(url).join(a), timeout=30).status_code for a in assets}
    remote = [a for a in assets if a.startswith(("http://", "https://", "//"))]
    check(
        "/docs of kpack serve offline",
        bool(assets) and not remote and set(fetched.values()) == {200},
        f"scripts and styles: {fetched}; from elsewhere: {remote or 'none'}",
    )

    skill = (lab.packs / "sitemapped" / "skill.md").read_text()
    docs_skill = Path("/work/ws/base/packs/python_docs/skill.md")
    topics = [line for line in skill.splitlines() if "question" in line.lower()][:1]
    if docs_skill.exists():
        topics = [line for line in docs_skill.read_text().splitlines() if "question" in line][:1]
    generic = {"None", "True", "False", "Python", "ValueError", "Return True"}
    named = set(re.findall(r"[\w ]+", topics[0])) if topics else set()
    check(
        "skill.md topics",
        bool(topics) and not generic & {n.strip() for n in named},
        f"{'Python docs pack' if docs_skill.exists() else 'sitemapped'}: {topics[0][:200] if topics else '-'}",
    )

    stray = [p for p in (".kpack_storage", ".dagster_home") if (PROJECT / p).exists()]
    beside = [p for p in (".kpack_storage", ".dagster_home") if (lab.root / p).exists()]
    check(
        "KPACK_PACKS_DIR keeps state beside it",
        beside == [".kpack_storage", ".dagster_home"] and not lab.stray_state,
        f"beside the packs folder: {beside}; created in the project folder by this run: "
        f"{lab.stray_state or 'nothing'} (there before: {stray})",
    )

    english = [
        page.name
        for page in sorted((PROJECT / "docs").glob("*.md"))
        if re.search(r"English[- ]only|trained on English", page.read_text())
    ]
    check(
        "the English-only model is said in docs/",
        {"building-packs.md", "querying.md", "troubleshooting.md"} <= set(english),
        f"said in README.md and docs/{', docs/'.join(english)}",
    )

    (lab.packs / "sitemapped" / "kg_config.json").write_text(
        json.dumps({"fetch": FETCH, "colour": "blue"})
    )
    done = lab.kpack("build", "sitemapped")
    (lab.packs / "sitemapped" / "kg_config.json").write_text(json.dumps({"fetch": FETCH}))
    documented = "unknown" in (PROJECT / "docs" / "building-packs.md").read_text().lower()
    check(
        "an unknown kg_config.json key",
        done.code == 2 and "colour" in done.said and documented,
        done.said[:200],
    )

    outline = [("Installing the gadget", 0, 0), ("Calibrating the gadget", 1, 0)]
    body = make_pdf(
        [["The gadget installs with one bolt."], ["Calibrate the gadget every spring."]], outline
    )
    lab.site.answers["/docs/manual.pdf"] = Answer(content_type="application/pdf", body=body)
    lab.write_pack("manual", [lab.site.url("/docs/manual.pdf")], {"fetch": FETCH})
    done = lab.kpack("build", "manual", "--no-progress")
    found = lab.kpack("search", "manual", "How often is the gadget calibrated?", "--k", "1")
    check(
        "a PDF in urls.txt",
        done.code == 0 and "every spring" in found.out,
        f"build exit {done.code}; sections "
        + (str(lab.manifest("manual")["counts"]["Section"]) if done.code == 0 else "-")
        + f"; top passage: {' '.join(found.out.split())[:140]}",
    )
    return outcomes


# --- 13 to 23: issue 36, packs from strangers, full disks and hostile pages ------------------


def exported(lab: Lab) -> Path:
    """`sitemapped` exported once: the archive the stranger probes alter."""
    archive = lab.root / "sitemapped-36.kpack"
    if not archive.exists():
        lab.sitemapped()
        done = lab.kpack("export", "sitemapped", "-o", str(archive))
        assert done.code == 0, done.err
    return archive


def altered(lab: Lab, name: str, edit: Callable[[dict[str, bytes]], None]) -> Path:
    """The exported archive with its files edited and every checksum recomputed (resealed)."""
    from tests.test_archive import rewrite

    return rewrite(exported(lab), lab.root / f"{name}.kpack", edit=edit)


def vectors_as(array: object) -> Callable[[dict[str, bytes]], None]:
    """An edit putting ``array`` in place of the chunk vectors, resealed in the manifest."""
    import hashlib
    import io

    import numpy as np

    def edit(files: dict[str, bytes]) -> None:
        out = io.BytesIO()
        np.save(out, array)
        data = out.getvalue()
        manifest = json.loads(files["manifest.json"])
        seal = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        manifest["indexes"]["indexes/chunk_vectors.npy"] = seal
        files["manifest.json"] = json.dumps(manifest).encode()
        files["indexes/chunk_vectors.npy"] = data

    return edit


def manifest_edit(**fields: object) -> Callable[[dict[str, bytes]], None]:
    def edit(files: dict[str, bytes]) -> None:
        files["manifest.json"] = json.dumps(
            {**json.loads(files["manifest.json"]), **fields}
        ).encode()

    return edit


def refused(done: Done, *words: str) -> bool:
    return (
        done.code in (1, 2) and "Traceback" not in done.err and all(w in done.said for w in words)
    )


@probe("13", "a resealed archive with a wrong-shape index: validate, install, serve")
def resealed_archives(lab: Lab) -> list[Outcome]:
    import numpy as np

    installed_copy(lab)
    version = lab.current("widgets")
    outcomes = []
    dim = lab.manifest("sitemapped")["embedding"]["dimension"]
    rows = lab.manifest("sitemapped")["counts"]["Chunk"]
    cases = {
        "13a (3, 7) vectors": np.ones((3, 7), dtype=np.float32),
        "13b one vector short": np.ones((rows - 1, dim), dtype=np.float32),
        "13c float64 vectors": np.ones((rows, dim), dtype=np.float64),
        "13d integer vectors": np.ones((rows, dim), dtype=np.int32),
        "13e a flat array": np.ones(rows * dim, dtype=np.float32),
    }
    for name, array in cases.items():
        bad = altered(lab, "resealed", vectors_as(array))
        checked = lab.kpack("validate", str(bad))
        installed = lab.kpack("install", str(bad), "--as", "resealed")
        replaced = lab.kpack("install", str(bad), "--as", "widgets", "--replace")
        untouched = lab.current("widgets") == version and lab.answers("widgets")
        held = (
            checked.code == 1
            and "indexes/chunk_vectors.npy" in checked.out + checked.err
            and refused(installed, "indexes/chunk_vectors.npy")
            and refused(replaced)
            and not (lab.packs / "resealed").exists()
            and untouched
        )
        outcomes.append(
            Outcome(
                name,
                held,
                f"validate exit {checked.code}, install exit {installed.code}, --replace exit "
                f"{replaced.code}; widgets {version} untouched: {untouched}; install said: "
                f"{installed.said[:200]}",
            )
        )
    # A version damaged in place past its seal (resealed by hand): the server still starts.
    from kpack.store import seal_version

    # A name of its own: probe 8 leaves a never-published pack called "broken" behind.
    damaged = lab.packs / "damaged"
    shutil.rmtree(damaged, ignore_errors=True)
    shutil.copytree(lab.packs / "sitemapped", damaged, symlinks=True)
    current = damaged / ".versions" / os.readlink(damaged / ".versions" / "current")
    np.save(current / "indexes" / "chunk_vectors.npy", np.ones((3, 7), dtype=np.float32))
    (current / ".verified.json").unlink(missing_ok=True)
    seal_version(current)
    with kpack_serve(lab) as (url, _):
        health = httpx.get(f"{url}/healthz", timeout=60).json()
        listed = {p["name"]: p for p in httpx.get(f"{url}/packs", timeout=60).json()["packs"]}
        good = httpx.post(f"{url}/packs/sitemapped/search", json={"question": QUESTION}, timeout=60)
        bad = httpx.post(f"{url}/packs/damaged/query", json={"question": QUESTION}, timeout=60)
    outcomes.append(
        Outcome(
            "13f kpack serve with one damaged pack starts",
            health.get("failing_packs") == ["damaged"] and good.status_code == 200,
            f"/healthz {health}; search of another pack {good.status_code}",
        )
    )
    outcomes.append(
        Outcome(
            "13g the damaged pack is reported, in one line",
            not listed["damaged"].get("serving", True)
            and bad.status_code == 409
            and "kpack validate damaged" in bad.json()["detail"],
            f"/packs serving={listed['damaged'].get('serving')}; query {bad.status_code}: "
            f"{bad.text[:200]}",
        )
    )
    shutil.rmtree(damaged)
    return outcomes


SECRET_LINE = "AWS_SECRET_ACCESS_KEY=probe-invented-0000"


@probe("14", "an archive whose kg_config.json widens what the next build reads")
def widening_archives(lab: Lab) -> list[Outcome]:
    secret = lab.root / "home" / "creds.txt"
    secret.parent.mkdir(exist_ok=True)
    secret.write_text(SECRET_LINE + "\n")

    def widen(files: dict[str, bytes]) -> None:
        config = json.loads(files.get("kg_config.json", b"{}"))
        config["fetch"] = {**config.get("fetch", {}), "file_roots": ["/"]}
        config["fetch"]["allow_private_hosts"] = True
        files["kg_config.json"] = json.dumps(config).encode()
        urls = f"{secret.as_uri()}\nhttp://10.0.0.1/admin\n{lab.site.url('/docs/article-1.html')}\n"
        files["urls.txt"] = urls.encode()

    stranger = altered(lab, "stranger", widen)
    outcomes = []
    shutil.rmtree(lab.packs / "stranger", ignore_errors=True)
    done = lab.kpack("install", str(stranger), "--as", "stranger")
    outcomes.append(
        Outcome(
            "14a install says what it dropped, in one line",
            done.code == 0
            and "dropped from the archive's kg_config.json" in done.said
            and 'fetch.file_roots ["/"]' in done.said
            and "fetch.allow_private_hosts" in done.said,
            done.said[:300],
        )
    )
    config = json.loads((lab.packs / "stranger" / "kg_config.json").read_text())
    outcomes.append(
        Outcome(
            "14b the installed settings reach nothing outside",
            config["fetch"].get("file_roots") == ["."]
            and not config["fetch"].get("allow_private_hosts"),
            f"fetch: {config['fetch']}",
        )
    )
    before = lab.current("stranger")
    rebuilt = lab.kpack("build", "stranger", "--force", "--no-progress")
    leaked = [
        str(p)
        for p in (lab.packs / "stranger").rglob("*")
        if p.is_file() and SECRET_LINE.encode() in p.read_bytes()
    ]
    found = lab.kpack("search", "stranger", "AWS_SECRET_ACCESS_KEY", "--json")
    outcomes.append(
        Outcome(
            "14c a rebuild does not publish the file",
            not leaked and SECRET_LINE not in found.out,
            f"build exit {rebuilt.code} ({rebuilt.said[:160]}); files holding the secret: "
            f"{leaked or 'none'}; current {before} -> {lab.current('stranger')}",
        )
    )
    outcomes.append(
        Outcome(
            "14d the rebuild says why the file was not read",
            "outside the allowed file roots" in rebuilt.said,
            rebuilt.said[:240],
        )
    )
    shutil.rmtree(lab.packs / "trusted", ignore_errors=True)
    trusted = lab.kpack("install", str(stranger), "--as", "trusted", "--trust-config")
    kept = json.loads((lab.packs / "trusted" / "kg_config.json").read_text())["fetch"]
    outcomes.append(
        Outcome(
            "14e --trust-config keeps them, as the user said",
            trusted.code == 0 and kept.get("file_roots") == ["/"] and "dropped" not in trusted.said,
            f"exit {trusted.code}; fetch: {kept}",
        )
    )
    for name in ("stranger", "trusted"):
        shutil.rmtree(lab.packs / name, ignore_errors=True)
    return outcomes


def graph_writers(disk: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or ())
        if "kpack.graphdb" in line and str(disk) in line:
            found.append(process)
    return found


@probe("15", "a build on a nearly full disk, and a build stopped while its writer runs")
def bounded_writer(lab: Lab) -> list[Outcome]:
    lab.sitemapped()
    outcomes = []
    disk = lab.small_disk("300m")
    if disk is None:
        return [Outcome("15a a few MiB free", False, "no tmpfs here (needs root to mount)")]
    packs = disk / "packs"
    folder = packs / "nearly"
    folder.mkdir(parents=True)
    shutil.copy(lab.packs / "sitemapped" / "urls.txt", folder / "urls.txt")
    (folder / "kg_config.json").write_text(json.dumps({"fetch": FETCH}))
    elsewhere = lab.root / f"state-of-{disk.name}"
    state = {"KPACK_STORAGE": str(elsewhere / "storage"), "DAGSTER_HOME": str(elsewhere / "home")}
    first = lab.kpack("build", "nearly", "--no-progress", packs=packs, **state)
    assert first.code == 0, first.err[-3000:]
    version = os.readlink(folder / ".versions" / "current")
    filler = fill(disk, leave_bytes=3 * MIB)
    runs = [
        lab.kpack("build", "nearly", "--force", "--no-progress", packs=packs, **state)
        for _ in range(3)
    ]
    slowest = max(r.seconds for r in runs)
    left = graph_writers(disk)
    answers = lab.answers("nearly", packs=packs)
    outcomes.append(
        Outcome(
            "15a 3 MiB free: three builds end within a minute",
            all(r.code in (1, 2) for r in runs) and slowest < 60,
            f"exits {[r.code for r in runs]}, slowest {slowest:.1f} s",
        )
    )
    outcomes.append(
        Outcome(
            "15b ... each in one line",
            all("Traceback" not in r.err and "no space left" in r.said for r in runs),
            runs[-1].said[:240],
        )
    )
    outcomes.append(
        Outcome(
            "15c ... no writer left, the previous version current",
            not left and os.readlink(folder / ".versions" / "current") == version and answers,
            f"writers left: {[p.pid for p in left]}; current {version}; answering {answers}",
        )
    )
    filler.unlink()
    # A build stopped while its writer runs: SIGINT (Ctrl-C) and SIGKILL.
    for name, sig in (("15d Ctrl-C", signal.SIGINT), ("15e kill -9", signal.SIGKILL)):
        build = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "build", "nearly", "--force", "--no-progress"],
            env=lab.env(packs, **state),
            cwd=PROJECT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        writer = None
        deadline = time.monotonic() + 300
        while writer is None and time.monotonic() < deadline and build.poll() is None:
            writers = graph_writers(disk)
            writer = writers[0] if writers else None
            time.sleep(0.05)
        if writer is None:
            build.kill()
            build.wait()
            outcomes.append(Outcome(name, False, "the build ended before its writer started"))
            continue
        os.killpg(build.pid, sig) if sig == signal.SIGINT else build.send_signal(sig)
        build.wait(timeout=120)
        gone = False
        for _ in range(100):
            try:
                gone = writer.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                gone = True
            if gone:
                break
            time.sleep(0.1)
        again = lab.kpack("build", "nearly", "--no-progress", packs=packs, **state)
        outcomes.append(
            Outcome(
                f"{name} while the writer runs",
                gone and again.code == 0,
                f"writer gone: {gone}; the next build (the lock free) exit {again.code}",
            )
        )
        if not gone:
            with contextlib.suppress(psutil.Error):
                writer.kill()
    return outcomes


@probe("16", "kpack serve and the Host header (DNS rebinding)")
def host_header(lab: Lab) -> list[Outcome]:
    lab.sitemapped()
    outcomes = []
    with kpack_serve(lab) as (url, _):
        port = url.rsplit(":", 1)[1]

        def get(host: str) -> httpx.Response:
            return httpx.get(f"{url}/packs", headers={"Host": host}, timeout=60)

        for probe_id, host, wanted in (
            ("16a Host: attacker.example", f"attacker.example:{port}", 400),
            ("16b Host: localhost", f"localhost:{port}", 200),
            ("16c Host: 127.0.0.1", f"127.0.0.1:{port}", 200),
            ("16d Host: [::1]", f"[::1]:{port}", 200),
        ):
            response = get(host)
            outcomes.append(
                Outcome(
                    probe_id,
                    response.status_code == wanted
                    and ("sitemapped" in response.text) == (wanted == 200),
                    f"{response.status_code} {response.text[:80]}",
                )
            )
        rebound = httpx.post(
            f"{url}/packs/sitemapped/search",
            json={"question": QUESTION},
            headers={"Host": "rebound.example"},
            timeout=60,
        )
        outcomes.append(
            Outcome("16e a rebound search", rebound.status_code == 400, f"{rebound.status_code}")
        )
    port = free_port()
    server = subprocess.Popen(
        [str(KPACK), "serve", "--port", str(port), "--no-warmup", "--allow-host", "docs.internal"],
        env=lab.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_serving(server, f"http://127.0.0.1:{port}", 300)
        named = httpx.get(f"http://127.0.0.1:{port}/healthz", headers={"Host": "docs.internal"})
        other = httpx.get(f"http://127.0.0.1:{port}/healthz", headers={"Host": "other.internal"})
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    outcomes.append(
        Outcome(
            "16f --allow-host docs.internal",
            named.status_code == 200 and other.status_code == 400,
            f"docs.internal {named.status_code}, other.internal {other.status_code}",
        )
    )
    return outcomes


def nested_page(depth: int) -> bytes:
    return (
        "<html><body>" + "<b>" * depth + "<p>flange gasket</p>" + "</b>" * depth + "</body></html>"
    ).encode()


@probe("17", "pages nested deep in inline elements")
def deep_pages(lab: Lab) -> list[Outcome]:
    outcomes = []
    for probe_id, depth in (("17a 12,500 nested <b>", 12_500), ("17b 40,000 nested <b>", 40_000)):
        path = f"/docs/nested-{depth}.html"
        lab.site.answers[path] = Answer(body=nested_page(depth))
        name = f"nested{depth}"
        # Beyond FETCH's 200 kB cap: the page must be fetched to be parsed.
        roomy = {"fetch": {**FETCH, "max_bytes": 1_000_000}}
        lab.write_pack(name, [lab.site.url(path), lab.site.url("/docs/article-1.html")], roomy)
        done = lab.kpack("build", name, "--no-progress")
        outcomes.append(
            Outcome(
                probe_id,
                # The whole build (most of it embedding): the page parses in seconds (17c), where
                # it held parsed_pages for minutes before.
                done.code == 0 and done.seconds < 300,
                f"{len(nested_page(depth)) / 1024:.0f} KB page; build exit {done.code} in "
                f"{done.seconds:.1f} s",
            )
        )
        shutil.rmtree(lab.packs / name)
    from kpack.ingest.html import html_blocks

    started = time.perf_counter()
    list(html_blocks(nested_page(40_000).decode(), marks=True))
    seconds = time.perf_counter() - started
    outcomes.append(Outcome("17c parsing 40,000 nested <b> alone", seconds < 5, f"{seconds:.2f} s"))
    from kpack.ingest import html

    outcomes.append(
        Outcome(
            "17d a per-page parse budget",
            html.PARSE_BUDGET_S > 0,
            f"{html.PARSE_BUDGET_S:g} s per page (a page past it fails alone)",
        )
    )
    return outcomes


@probe("18", "a manifest whose built_at is not a date")
def bad_built_at(lab: Lab) -> list[Outcome]:
    outcomes = []
    bad = altered(lab, "undated", manifest_edit(built_at="sometime"))
    checked = lab.kpack("validate", str(bad))
    outcomes.append(
        Outcome(
            "18a validate refuses it",
            checked.code == 1 and "build time" in checked.out + checked.err,
            " ".join(checked.out.split())[:200],
        )
    )
    shutil.copytree(lab.packs / "sitemapped", lab.packs / "undated", symlinks=True)
    current = (
        lab.packs
        / "undated"
        / ".versions"
        / os.readlink(lab.packs / "undated" / ".versions" / "current")
    )
    data = json.loads((current / "manifest.json").read_text())
    (current / "manifest.json").unlink()
    (current / "manifest.json").write_text(json.dumps({**data, "built_at": "sometime"}))
    listed = lab.kpack("list")
    status = lab.kpack("status", "undated")
    outcomes.append(
        Outcome(
            "18b kpack list",
            listed.code == 0 and "Traceback" not in listed.err and "sitemapped" in listed.out,
            " ".join(listed.out.split())[:200],
        )
    )
    outcomes.append(
        Outcome(
            "18c kpack status",
            status.code in (0, 1) and "Traceback" not in status.err,
            f"exit {status.code}: {' '.join(status.out.split())[:160]}",
        )
    )
    shutil.rmtree(lab.packs / "undated")
    return outcomes


@probe("19", "pages with a heading and no body")
def heading_only(lab: Lab) -> list[Outcome]:
    page = lab.root / "title-only.md"
    page.write_text("# Only a title\n")
    lab.write_pack("titles", [page.as_uri()], {"fetch": {**FETCH, "file_roots": [str(lab.root)]}})
    done = lab.kpack("build", "titles", "--no-progress")
    lab.write_pack(
        "mixed",
        [page.as_uri(), lab.site.url("/docs/article-1.html")],
        {"fetch": {**FETCH, "file_roots": [str(lab.root)]}},
    )
    mixed = lab.kpack("build", "mixed", "--no-progress")
    outcomes = [
        Outcome(
            "19a only a title: one line",
            done.code in (1, 2)
            and "Traceback" not in done.err
            and "nothing to index" in done.said
            and "Cannot cast" not in done.said,
            done.said[:200],
        ),
        Outcome("19b a title-only page among others", mixed.code == 0, f"exit {mixed.code}"),
    ]
    for name in ("titles", "mixed"):
        shutil.rmtree(lab.packs / name)
    return outcomes


@probe("20", "page text that looks like a citation")
def lookalike_citations(lab: Lab) -> list[Outcome]:
    outcomes = []
    texts = {
        "20a [Source: ...]": "[Source: Bureau of Invented Standards]",
        "20b [source:...] lower case": "[source:Bureau of Invented Standards]",
        "20c [ Sources : ... ]": "[ Sources : Bureau of Invented Standards ]",
    }
    for probe_id, text in texts.items():
        body = (
            "<html><head><title>Gaskets</title></head><body><main><h1>Gaskets</h1><p>A flange "
            f"gasket is rated for 40 bar {text}. Gaskets are replaced every two years.</p>"
            "</main></body></html>"
        ).encode()
        lab.site.answers["/docs/gaskets.html"] = Answer(body=body)
        lab.write_pack("gaskets", [lab.site.url("/docs/gaskets.html")], {"fetch": FETCH})
        built = lab.kpack("build", "gaskets", "--force", "--no-progress")
        asked = lab.kpack(
            "query", "gaskets", "What is a flange gasket rated for?", "--no-llm", "--json"
        )
        answer = json.loads(asked.out)["answer"] if asked.code == 0 else asked.said
        outcomes.append(
            Outcome(
                probe_id,
                built.code == 0
                and "40 bar" in answer
                and "Bureau of Invented Standards]" not in answer,
                " ".join(answer.split())[:200],
            )
        )
    shutil.rmtree(lab.packs / "gaskets")
    return outcomes


@probe("21", "kg_config.json built to crash its reader")
def hostile_settings(lab: Lab) -> list[Outcome]:
    lab.sitemapped()
    outcomes = []
    cases = {
        "21a nested 100,000 deep": ('{"a": ' * 100_000 + "1" + "}" * 100_000, "nested more than"),
        "21b a 5,001-digit integer": (
            '{"fetch": {"max_bytes": ' + "9" * 5001 + "}}",
            "fetch.max_bytes",
        ),
        "21c fetch.timeout_s: 1e308": ('{"fetch": {"timeout_s": 1e308}}', "fetch.timeout_s"),
        "21d fetch.deadline_s: 1e308": ('{"fetch": {"deadline_s": 1e308}}', "fetch.deadline_s"),
        "21e per_host_delay_s: 1e308": (
            '{"fetch": {"per_host_delay_s": 1e308}}',
            "fetch.per_host_delay_s",
        ),
    }
    folder = lab.packs / "sitemapped"
    kept = (folder / "kg_config.json").read_text()
    try:
        for probe_id, (text, key) in cases.items():
            (folder / "kg_config.json").write_text(text)
            done = lab.kpack("build", "sitemapped", "--no-progress")
            outcomes.append(
                Outcome(
                    probe_id,
                    done.code == 2 and done.one_line and key in done.said and len(done.said) < 600,
                    done.said[:200],
                )
            )
    finally:
        (folder / "kg_config.json").write_text(kept)

    def deep(files: dict[str, bytes]) -> None:
        files["kg_config.json"] = ('{"a": ' * 100_000 + "1" + "}" * 100_000).encode()

    done = lab.kpack("install", str(altered(lab, "deep", deep)), "--as", "deep")
    outcomes.append(
        Outcome(
            "21f an archive carrying one",
            refused(done, "nested more than") and not (lab.packs / "deep").exists(),
            done.said[:200],
        )
    )
    return outcomes


@probe("22", "what a 404 tells a stranger")
def unknown_packs(lab: Lab) -> list[Outcome]:
    lab.sitemapped()
    outcomes = []
    with kpack_serve(lab) as (url, _):
        for probe_id, response in (
            ("22a GET /packs/NAME", httpx.get(f"{url}/packs/no-such", timeout=60)),
            (
                "22b POST /packs/NAME/query",
                httpx.post(f"{url}/packs/no-such/query", json={"question": "x"}, timeout=60),
            ),
        ):
            outcomes.append(
                Outcome(
                    probe_id,
                    response.status_code == 404
                    and str(lab.packs) not in response.text
                    and "sitemapped" not in response.text,
                    f"{response.status_code} {response.text[:160]}",
                )
            )
    replies = mcp_session(
        lab,
        [
            INITIALIZE,
            INITIALIZED,
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tools/call",
                    "params": {
                        "name": "search_pack",
                        "arguments": {"pack": "no-such", "question": "x"},
                    },
                }
            ),
        ],
        2,
    )
    text = json.dumps(replies[-1])
    outcomes.append(
        Outcome(
            "22c MCP search_pack",
            "unknown pack" in text and str(lab.packs) not in text and "sitemapped" not in text,
            text[:200],
        )
    )
    return outcomes


@probe("23", "a charset that lies, URL variants of one page, and the 409 of docs/serving.md")
def charsets_and_variants(lab: Lab) -> list[Outcome]:
    outcomes = []
    body = (
        "<html><head><title>Declared</title></head><body><main><h1>Declared</h1><p>The gasket "
        "table lists every flange size.</p></main></body></html>"
    ).encode("ascii")
    lab.site.answers["/docs/declared.html"] = Answer(
        content_type="text/html; charset=utf-16", body=body
    )
    lab.write_pack("declared", [lab.site.url("/docs/declared.html")], {"fetch": FETCH})
    done = lab.kpack("build", "declared", "--no-progress")
    found = lab.kpack("search", "declared", "gasket table flange size", "--json")
    outcomes.append(
        Outcome(
            "23a declared utf-16, ASCII: read as text",
            done.code == 0 and "flange size" in found.out,
            f"build exit {done.code}; search: {' '.join(found.out.split())[:120]}",
        )
    )
    logged = done.out + done.err
    verbose = lab.kpack("build", "declared", "--force", "--verbose", "--no-progress")
    outcomes.append(
        Outcome(
            "23b ... and warned",
            "declared UTF-16 but has no NUL byte" in logged + verbose.out + verbose.err,
            " ".join((verbose.out + verbose.err).split())[-200:],
        )
    )
    shutil.rmtree(lab.packs / "declared")
    page = lab.site.url("/docs/article-2.html")
    for probe_id, variant in (
        ("23c ?utm_source= variant", page + "?utm_source=newsletter&utm_medium=mail"),
        ("23d // variant", page.replace("/docs/", "/docs//")),
    ):
        lab.write_pack("variants", [page, variant], {"fetch": FETCH})
        built = lab.kpack("build", "variants", "--no-progress")
        articles = lab.manifest("variants")["counts"]["Article"] if built.code == 0 else None
        outcomes.append(
            Outcome(
                probe_id,
                built.code == 0 and articles == 1,
                f"exit {built.code}; articles {articles}",
            )
        )
        shutil.rmtree(lab.packs / "variants")
    folder = lab.packs / "sitemapped"
    kept = (folder / "kg_config.json").read_text()
    (folder / "kg_config.json").write_text("{broken")
    try:
        with kpack_serve(lab) as (url, _):
            response = httpx.post(
                f"{url}/packs/sitemapped/query", json={"question": QUESTION}, timeout=60
            )
    finally:
        (folder / "kg_config.json").write_text(kept)
    docs = (PROJECT / "docs" / "serving.md").read_text()
    says_200 = "changes no answer and is no error here" in docs
    outcomes.append(
        Outcome(
            "23e a broken kg_config.json: docs/serving.md says what the server does",
            response.status_code == 200 and says_200,
            f"query {response.status_code}; docs say edits change no answer: {says_200}",
        )
    )
    return outcomes


# --- the run ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="emptied first")
    parser.add_argument(
        "--only", help="comma-separated probe groups, the issue's items (9 also runs item 10)"
    )
    args = parser.parse_args(argv)
    groups = args.only.split(",") if args.only else list(PROBES)
    if unknown := set(groups) - set(PROBES):
        parser.error(f"no probe group {', '.join(sorted(unknown))} (groups: {', '.join(PROBES)})")
    args.workdir = args.workdir.resolve()  # the commands run in a folder of their own
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    outcomes: list[Outcome] = []
    with (
        serve(SourcesSite(articles=4)) as site,
        LoopbackServer(DrippingArchives) as archives,
    ):
        lab = Lab(args.workdir, site, archives)
        try:
            for group in groups:
                title, run = PROBES[group]
                print(f"# {group}: {title}", flush=True)
                started = time.perf_counter()
                try:
                    found = run(lab)
                except Exception as exc:  # a probe that could not run says why, and the rest run
                    found = [
                        Outcome(f"{group} (could not run)", False, f"{type(exc).__name__}: {exc}")
                    ]
                for outcome in found:
                    verdict = "held" if outcome.held else "NOT HELD"
                    print(f"{outcome.probe:<44} {verdict:<8} {outcome.observed}", flush=True)
                print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)
                outcomes += found
        finally:
            lab.unmount_all()
    (args.workdir / "probes.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=2))
    failed = [o.probe for o in outcomes if not o.held]
    print(
        f"{len(outcomes) - len(failed)} of {len(outcomes)} held"
        + (f"; not: {failed}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
