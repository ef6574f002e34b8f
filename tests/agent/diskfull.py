"""A small real filesystem that can be filled: a tmpfs mounted for one test (needs root).

Used by the spool's disk-trouble tests: ``fill()`` writes a filler file until the kernel
answers ENOSPC, ``free()`` deletes it. Nothing is simulated: the spool sees the same errors it
would on a full /var.
"""
from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


class SmallFs:
    """A mounted tmpfs of ``size`` bytes at ``path``."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.filler = path / "filler"

    def fill(self) -> int:
        """Write until ENOSPC (4 KiB, then byte by byte); returns the bytes written."""
        n = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (b"\0" * 65536, b"\0" * 4096, b"\0"):
                while True:
                    try:
                        n += os.write(fd, chunk)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        return n

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def used(self) -> int:
        st = os.statvfs(self.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize


def mount_small_fs(path: Path, size: int) -> Iterator[SmallFs]:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root and mount rights): {r.stderr.strip()}")
    try:
        yield SmallFs(path, size)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
