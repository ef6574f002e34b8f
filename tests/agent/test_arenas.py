"""The agent bounds glibc's malloc arenas: worker threads that allocate share them instead of
each keeping its own heap (agent/arenas.py says why). Counted with glibc's own ``malloc_info``
in a fresh interpreter whose threads allocate at the same time, with and without the bound."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from skewd.agent.arenas import bound_arenas, glibc_version

CHILD = textwrap.dedent("""
    import ctypes, os, sys, tempfile, threading
    from skewd.agent.arenas import bound_arenas
    if sys.argv[1] == "bound":
        print(bound_arenas(2, {}))
    else:
        print("unbound")
    barrier = threading.Barrier(9)
    keep = []
    def work():
        keep.append([bytearray(8192) for _ in range(200)])  # past pymalloc: glibc's malloc
        barrier.wait()  # every thread alive (holding its arena) while they are counted
        barrier.wait()
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    barrier.wait()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    fd, path = tempfile.mkstemp()
    os.close(fd)
    fp = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print(open(path).read().count("<heap nr="))
    os.unlink(path)
    barrier.wait()
""")


def arenas(mode: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=60,
                         env=env, check=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(glibc_version() is None, reason="malloc arenas are glibc's (musl has none to bound)")
def test_worker_threads_share_two_arenas() -> None:
    what, bounded = arenas("bound")
    assert what == "set"
    _, unbounded = arenas("unbound")
    assert bounded <= 2
    assert unbounded > bounded  # without the bound each allocating thread gets its own


def test_an_operators_setting_wins_and_a_bad_count_is_refused() -> None:
    assert bound_arenas(2, {"MALLOC_ARENA_MAX": "4"}) == "environment"
    with pytest.raises(ValueError):
        bound_arenas(0, {})
