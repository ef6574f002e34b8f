"""Argument types and checks every ``skewd`` subcommand shares, so one syntax holds everywhere.

Durations are :func:`skewd.model.parse_duration` (``5m30s``, ``250ms``, ``5`` = seconds) and
speeds :func:`skewd.model.parse_speed` (``1x``, ``4x``; ``max`` where a command can run
unpaced). Outputs are checked before long work starts: a replay of an hour of capture must not
end in a traceback because the report's directory does not exist.

Every command imports this module, so what only some arguments need (the data model's parsers,
difflib, tempfile) is imported when used: ``skewd pkt FILE`` with default options reads a
capture without them (10 ms of a 0.6 s run on a 1 M-packet file).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Iterable


def duration(text: str) -> float:
    """argparse ``type=`` for a positive duration."""
    from skewd.model import parse_duration

    try:
        v = parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: must be longer than 0s")
    return v


def size(text: str) -> int:
    """argparse ``type=`` for a positive size in bytes: ``512M``, ``4G``, ``4GiB``, ``1000000``."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        v = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write a size such as 512M or 4G") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive size")
    return int(v)


def speed(text: str) -> float:
    """argparse ``type=`` for a paced speed (``1x``, ``4x``, ``4``)."""
    from skewd.model import parse_speed

    try:
        v = parse_speed(text, allow_max=False)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    assert v is not None
    return v


def speed_or_max(text: str) -> float | None:
    """argparse ``type=`` for a speed that may be ``max`` (None: as fast as possible)."""
    from skewd.model import parse_speed

    try:
        return parse_speed(text, allow_max=True)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the closest option, or ``""``."""
    import difflib

    m = difflib.get_close_matches(str(word), list(options), n=1)
    return f"; did you mean {m[0]}?" if m else ""


class OutputError(ValueError):
    """An output path that cannot be written; ``str(e)`` says why and names the path."""


def check_output_file(path: str | Path) -> Path:
    """Make sure ``path`` can be written now, before the work that produces it. A file that did
    not exist is created and removed again (so a failure later leaves nothing behind)."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{p} is a directory; give a file name")
    existed = p.exists()
    try:
        with open(p, "ab"):
            pass
    except OSError as e:
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            raise OutputError(f"cannot write {p}: directory {parent} does not exist") from None
        raise OutputError(f"cannot write {p}: {e.strerror or e}") from None
    if not existed:
        try:
            os.unlink(p)
        except OSError:
            pass
    return p


def check_output_dir(path: str | Path) -> Path:
    """Create ``path`` (and its parents) if needed and prove a file can be written in it."""
    import tempfile

    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{p} exists and is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".skewd-write-check-", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputError(f"cannot write in {p}: {e.strerror or e}") from None
    return p
