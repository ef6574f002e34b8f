"""Small, forgiving readers for sysfs/procfs files under a re-rootable path.

Real sysfs files vanish (hot-unplug), return EINVAL/EOPNOTSUPP on read, or hold "N/A":
every reader returns None instead of raising so a collector can emit what it could read.
"""
from __future__ import annotations

from pathlib import Path


def read_str(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except (OSError, ValueError):
        return None


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
