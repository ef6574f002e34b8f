"""Bound glibc's malloc arenas in the agent process.

Why: the agent's collectors run on worker threads, and glibc gives every thread that allocates
its own malloc arena (up to 8 per core). pkt's collect builds tens of numpy temporaries the size
of the interval's packets; freed, they stay in the arena of whichever worker ran that collect,
as fragmented heap glibc seldom returns, so the agent's anonymous memory grows with the packet
rate and the number of workers that happened to collect (docs/benchmarks.md, "Agent footprint
under real traffic": 77 MiB anonymous at 12k pkt/s against 37 MiB on an idle port;
``MALLOC_ARENA_MAX=2`` took most of that growth away). The agent's Python work is serialised
by the GIL, so threads hardly contend for malloc and extra arenas buy nothing.

Only on glibc (``mallopt(M_ARENA_MAX)``); musl and other C libraries are left alone, and an
operator's own ``MALLOC_ARENA_MAX`` wins (glibc has read it at start).
"""
from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

#: glibc's malloc.h: ``#define M_ARENA_MAX -8``
M_ARENA_MAX = -8
#: the main arena and one for the worker threads (measured: docs/benchmarks.md)
AGENT_ARENAS = 2


def glibc_version() -> str | None:
    """``"2.36"`` on glibc, None elsewhere (musl has no ``CS_GNU_LIBC_VERSION``)."""
    try:
        v = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):
        return None
    return v.split()[-1] if v and v.startswith("glibc") else None


def bound_arenas(arenas: int = AGENT_ARENAS, environ: Mapping[str, str] = os.environ) -> str:
    """Limit this process to ``arenas`` malloc arenas; call before threads start allocating.

    Returns what happened, for the agent's start-up log: ``"set"``, ``"environment"`` (the
    operator's ``MALLOC_ARENA_MAX`` stands), ``"not glibc"`` or ``"failed"``."""
    if arenas < 1:
        raise ValueError("arenas must be >= 1")
    if "MALLOC_ARENA_MAX" in environ:
        return "environment"
    if glibc_version() is None:
        return "not glibc"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "failed"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return "set" if mallopt(M_ARENA_MAX, arenas) == 1 else "failed"
