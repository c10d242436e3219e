"""How many questions the HTTP API works on at once: the thread pools' sizes."""

from __future__ import annotations

import os

LLM_THREADS = 16  # questions Claude answers at once; each mostly waits on the network


def retrieval_pool_size() -> int:
    """Questions worked on at once without Claude: one per core this process may use.

    More only contend for the cores and the interpreter lock. bench/serve_bench.py, 4 clients
    on 2 cores, Python docs pack, searches: with 4 threads (two per core) the server answered
    41.3/s at p50 94.3 ms against 44.9/s and 87.2 ms in-process from 4 threads; with 2, 46.7/s
    at 84.2 ms against 44.4/s and 86.5 ms (runs of the same hour). The bound also keeps a crowd
    of clients from starting a thread each: the others wait their turn, in order.
    """
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None  # Linux
    return len(usable) if usable else os.cpu_count() or 1
