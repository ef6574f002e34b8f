"""Follow the files of one directory as they grow (``tail -F`` for many writers at once).

The NCCL Inspector appends to one file per process and never rotates it; operators may.
Files are followed by identity (device, inode), not by name, so:

- a file renamed away by a rotation (``x.log`` → ``x.log.1``) is read to its end under its new
  name, and the new file created in its place is read from its start;
- a file that shrank below the offset read so far was truncated (``copytruncate``, or a
  restarted writer reopening with ``fopen("w")``): it is read again from its start and its
  parser context is reset. A writer without ``O_APPEND`` keeps writing at its old offset after
  a truncation; the NUL bytes in front of its next line are the parser's to skip;
- a file that disappears is forgotten.

Files present at the first scan are read from their end (only what is written from then on
counts, as Telegraf's ``tail`` does by default); a file found later is read from its start,
except a rotated copy (a name that does not end like a live file), whose lines are older.
The bytes read per poll are bounded, and so is a line: memory stays bounded however fast the
writers go; what is not read this poll is read the next.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Generic, TypeVar

C = TypeVar("C")


@dataclass
class _File(Generic[C]):
    name: str
    offset: int
    context: C
    partial: bytearray = field(default_factory=bytearray)
    #: reading started mid-line (picked up at its end): drop bytes up to the next newline
    skipping: bool = False
    #: number of the next complete line, when reading began at the file's start
    line_no: int | None = 1


@dataclass
class Lines(Generic[C]):
    """Complete lines read from one file in one poll."""

    name: str
    context: C
    #: (line number, or None when reading began mid-file; the line without its newline)
    lines: list[tuple[int | None, bytes]]


@dataclass
class Poll(Generic[C]):
    files: list[Lines[C]] = field(default_factory=list)
    #: what happened to files, for the log: "x.log truncated", "x.log: line over 1 MiB dropped"
    events: list[str] = field(default_factory=list)
    #: the directory could not be listed (missing, permission): the reason
    error: str = ""


class DirTailer(Generic[C]):
    """Owns the read offsets of the files of ``directory`` that ``accept`` lets through; each
    file carries a ``context`` made by ``new_context`` (a parser's per-file state), replaced
    when the file is truncated. Not thread-safe: one poller."""

    def __init__(self, directory: Path, accept: Callable[[str], bool], new_context: Callable[[], C],
                 live: Callable[[str], bool] = lambda name: True,
                 max_bytes: int = 8 << 20, max_line: int = 1 << 20) -> None:
        self.directory = Path(directory)
        self.accept = accept
        self.live = live
        self.new_context = new_context
        self.max_bytes = max_bytes
        self.max_line = max_line
        self._files: dict[tuple[int, int], _File[C]] = {}
        self._primed = False
        self._turn = 0

    @property
    def primed(self) -> bool:
        return self._primed

    def prime(self) -> None:
        """Take the files present now as read up to their current end."""
        if self._primed:
            return
        self._primed = True
        for key, name, size in self._scan()[0]:
            self._files[key] = self._at_end(name, size)

    def _at_end(self, name: str, size: int) -> _File[C]:
        f = _File(name, size, self.new_context(), line_no=None)
        if size > 0:
            try:
                with open(self.directory / name, "rb") as fh:
                    fh.seek(size - 1)
                    f.skipping = fh.read(1) != b"\n"
            except OSError:
                f.skipping = True
        return f

    def _scan(self) -> tuple[list[tuple[tuple[int, int], str, int]], str]:
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return [], f"{self.directory} does not exist"
        except OSError as e:
            return [], f"cannot list {self.directory}: {e.strerror or e}"
        out = []
        for e in entries:
            if not self.accept(e.name):
                continue
            try:
                st = e.stat()
            except OSError:
                continue  # vanished between listing and stat
            if not os.path.isfile(e.path):
                continue
            out.append(((st.st_dev, st.st_ino), e.name, st.st_size))
        out.sort(key=lambda x: x[1])
        return out, ""

    def poll(self) -> Poll[C]:
        res: Poll[C] = Poll()
        if not self._primed:
            self.prime()
            return res
        found, res.error = self._scan()
        seen = set()
        for key, name, size in found:
            seen.add(key)
            f = self._files.get(key)
            if f is None:
                if self.live(name):
                    f = _File(name, 0, self.new_context())
                else:  # a rotated copy appearing now holds lines already read from the live file
                    f = self._at_end(name, size)
                self._files[key] = f
            elif f.name != name:
                res.events.append(f"{f.name} renamed to {name}: following it")
                f.name = name
            if size < f.offset:
                res.events.append(f"{name} truncated ({size} < {f.offset} bytes read): reading it again "
                                  "from its start")
                f.offset, f.partial, f.skipping, f.line_no = 0, bytearray(), False, 1
                f.context = self.new_context()
        for key in list(self._files):
            if key not in seen:
                del self._files[key]
        # read, round-robin so one fast writer cannot starve the others
        order = [k for _, k in sorted((self._files[k].name, k) for k in self._files)]
        if order:
            self._turn %= len(order)
            order = order[self._turn:] + order[:self._turn]
            self._turn += 1
        budget = self.max_bytes
        for key in order:
            if budget <= 0:
                break
            f = self._files[key]
            got = self._read(f, budget, res)
            budget -= got
        return res

    def _read(self, f: _File[C], budget: int, res: Poll[C]) -> int:
        try:
            with open(self.directory / f.name, "rb") as fh:
                hole = _skip_hole(fh.fileno(), f.offset)
                if hole:  # a writer without O_APPEND went on at its offset after a truncation
                    res.events.append(f"{f.name}: skipped {hole} bytes of a hole (truncated under "
                                      "a writer that kept its offset)")
                    f.offset += hole
                    f.partial = bytearray()
                fh.seek(f.offset)
                data = fh.read(budget)
        except FileNotFoundError:
            return 0  # gone since the scan: forgotten at the next one
        except OSError as e:
            res.events.append(f"{f.name}: read failed: {e.strerror or e}")
            return 0
        if not data:
            return 0
        f.offset += len(data)
        if not f.partial and not f.skipping:
            data = data.lstrip(b"\0")  # the NULs of a hole's last block before the next line
        lines: list[tuple[int | None, bytes]] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            piece = data[start:nl]
            start = nl + 1
            if f.skipping:
                f.skipping, f.partial = False, bytearray()
                continue
            if f.partial:
                f.partial += piece
                piece = bytes(f.partial)
                f.partial = bytearray()
            if len(piece) > self.max_line:
                res.events.append(f"{f.name}: a line of {len(piece)} bytes (over {self.max_line}) dropped")
            else:
                lines.append((f.line_no, piece))
            if f.line_no is not None:
                f.line_no += 1
        rest = data[start:]
        if rest and not f.skipping:
            if len(f.partial) + len(rest) > self.max_line:
                res.events.append(f"{f.name}: a line over {self.max_line} bytes dropped")
                f.partial, f.skipping = bytearray(), True
                if f.line_no is not None:
                    f.line_no += 1
            else:
                f.partial += rest
        if lines:
            res.files.append(Lines(f.name, f.context, lines))
        return len(data)

    def names(self) -> list[str]:
        return sorted(f.name for f in self._files.values())


def _skip_hole(fd: int, offset: int) -> int:
    """Bytes of a hole (a sparse region) starting at ``offset``, 0 if data starts there or the
    platform cannot tell (``SEEK_DATA``: Linux, most file systems)."""
    seek_data = getattr(os, "SEEK_DATA", None)
    if seek_data is None:
        return 0
    try:
        return max(0, os.lseek(fd, offset, seek_data) - offset)
    except OSError:  # ENXIO: no data after offset (yet); EINVAL: not supported
        return 0
