"""A cold Python-docs build on this machine's embedding device, for comparing a GPU with the CPU.

Runs the project's own build benchmark code (``bench/build_bench.py``: the loopback server, the
pack, ``build_paths`` with the default settings) once, with the embedding device taken from
``KPACK_EMBED_DEVICE`` (``auto`` picks CUDA when torch sees a GPU; ``cpu`` forces the CPU), and
prints the build's wall time, its stage seconds and the manifest's embedding record (device,
texts/s). Run it twice on the same machine, once per device::

    KPACK_EMBED_DEVICE=auto .venv/bin/python bench/device_build.py /tmp/ws_gpu
    KPACK_EMBED_DEVICE=cpu .venv/bin/python bench/device_build.py /tmp/ws_cpu

Needs Debian's python3.11-doc html under /usr/share/doc/python3.11/html (bench/corpora.py).
The JSON also lands in $OUT (a device run's result folder) or bench/out/.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import build_bench  # noqa: E402


def main() -> None:
    device = os.environ.get("KPACK_EMBED_DEVICE", "auto")
    workspace = Path(sys.argv[1]).resolve()
    args = build_bench.parse_args(["--only", "python_docs", "--workdir", str(workspace)])
    corpus = build_bench.CORPORA["python_docs"](args, workspace)
    build = build_bench.build_paths(corpus, workspace, ["default"])["default"]
    manifest = build["manifest"]
    result = {
        "device_setting": device,
        "build_s": build["process_s"],
        "build_pack_s": build["build_pack_s"],
        "import_s": build["import_s"],
        "embedding": manifest["embedding"],
        "stage_seconds": manifest["stage_seconds"],
    }
    print(json.dumps(result, indent=1))
    out = Path(os.environ.get("OUT", HERE / "out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"device_build_{device}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
