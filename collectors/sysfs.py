"""Small, forgiving readers for sysfs/procfs files under a re-rootable path.

Real sysfs files vanish (hot-unplug), return EINVAL/EOPNOTSUPP on read, or hold "N/A":
every reader returns None instead of raising so a collector can emit what it could read.
"""
from __future__ import annotations

import os
from pathlib import Path


def read_bytes(path: Path | str) -> bytes | None:
    """The whole file, or None. Plain ``os.open``/``os.read``: agents read dozens of tiny sysfs
    files a second, and ``Path.read_text``'s buffered text stack costs about twice the syscalls."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        chunks = []
        while True:
            c = os.read(fd, 65536)
            if not c:
                break
            chunks.append(c)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_str(path: Path | str) -> str | None:
    data = read_bytes(path)
    return None if data is None else data.decode("utf-8", "replace").strip()


def read_int(path: Path, base: int = 0) -> int | None:
    s = read_str(path)
    if s is None or s == "":
        return None
    try:
        return int(s.split()[0], base)
    except ValueError:
        return None


def read_float(path: Path) -> float | None:
    s = read_str(path)
    if s is None or s == "":
        return None
    try:
        return float(s.split()[0])
    except ValueError:
        return None


def list_dir(path: Path) -> list[str]:
    try:
        return sorted(p.name for p in path.iterdir())
    except OSError:
        return []
