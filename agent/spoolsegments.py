"""How the spool's records lie on disk: segment files, the state file, and recovery on open.

Layout of the spool directory::

    00000000000000000001.seg   segment files, named by the seq of their first record
    00000000000000000513.seg   (append-only; the last one is the one being written)
    state.json                 {"head_seq": first record not yet consumed, "dropped": n}
    lock                       flock'ed while a Spool has the directory open

Recovery on open: every segment is scanned (:func:`~.spoolrecord.scan_segment`), records before
the persisted head are skipped, and the last segment is reopened for appending. The state file
is replaced atomically (write temp, rename), so a crash leaves the old or the new one.

Why apart from :mod:`.spool`: :class:`~.spool.Spool` is the queue (bounds, eviction, in-order
consumption, holding records in memory while the disk refuses them); this mixin is the file
work under it (rolling, writing and cutting back segments, fsync, deleting consumed segments,
state and recovery). A mixin because both work on the same index under the spool's one lock.
"""
from __future__ import annotations

import errno
import json
import logging
import os
from collections import deque
from pathlib import Path
from typing import Callable

from .spoolperms import FILE_MODE, tighten
from .spoolrecord import Entry, scan_segment

log = logging.getLogger("skewd.agent.spool")

SEG_SUFFIX = ".seg"


class Segment:
    """One segment file of the spool: its first and last seq and its size in bytes."""

    __slots__ = ("first_seq", "path", "last_seq", "size")

    def __init__(self, first_seq: int, path: Path, last_seq: int, size: int) -> None:
        self.first_seq = first_seq
        self.path = path
        self.last_seq = last_seq  # 0 while empty
        self.size = size


class SegmentFiles:
    """Segment-file I/O, the state file and recovery for :class:`~.spool.Spool` (its base class).

    Works on the spool's index and counters, declared in ``Spool.__init__``; reports disk
    failures through the spool's ``_note_error``.
    """

    directory: Path
    fsync: str
    segment_bytes: int
    _entries: deque[Entry]
    _segments: dict[int, Segment]
    _tail: Segment | None
    _tail_fd: int | None
    _bytes: int
    _dropped: int
    _corrupt: int
    _head_seq: int
    _next_seq: int
    _unsynced: bool
    _write_errors: int
    _state_dirty: bool
    #: count and log a disk failure (the spool's)
    _note_error: Callable[..., None]

    def _seg_path(self, first_seq: int) -> Path:
        return self.directory / f"{first_seq:020d}{SEG_SUFFIX}"

    def _roll(self, first_seq: int) -> Segment:
        """Close the open segment and start a new one named by its first record's seq."""
        if self._tail_fd is not None:
            fd, self._tail_fd = self._tail_fd, None
            try:
                if self.fsync != "never" and self._unsynced:
                    os.fsync(fd)
                    self._unsynced = False
            except OSError as e:
                self._note_error(f"fsync of {self._tail.path.name if self._tail else '?'} failed: "
                                 f"{e.strerror or e}", e)
            finally:
                os.close(fd)
        seg = Segment(first_seq, self._seg_path(first_seq), 0, 0)
        self._tail_fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        self._segments[first_seq] = seg
        self._tail = seg
        if self.fsync == "always":
            self._fsync_dir()
        self._delete_consumed()
        return seg

    def _write_record(self, seq: int, rec: bytes) -> bool:
        """Append one framed record to the open segment (rolling when due). False when the disk
        refused it: nothing of it stays in the file, and the error is counted."""
        tail = self._tail
        offset = -1  # set once bytes may have reached the file
        try:
            if (tail is None or self._tail_fd is None
                    or (tail.size > 0 and (tail.size + len(rec) > self.segment_bytes or tail.last_seq < self._head_seq))):
                tail = self._roll(seq)
            offset = tail.size
            view = memoryview(rec)
            while view:
                n = os.write(self._tail_fd, view)  # type: ignore[arg-type]
                view = view[n:]
        except OSError as e:
            self._note_error(f"write to {tail.path.name if tail else 'a new segment'} failed: {e.strerror or e}", e)
            if offset >= 0 and tail is not None and self._tail is tail:
                self._cut_tail(offset)
            return False
        tail.size += len(rec)
        tail.last_seq = seq
        self._unsynced = True
        return True

    def _cut_tail(self, offset: int) -> None:
        """After a failed write, truncate the segment back to its last whole record. If even
        that fails the segment is left as it is (recovery skips a torn record) and the next
        record starts a new segment, so nothing is ever appended after the damage."""
        assert self._tail is not None
        try:
            if self._tail_fd is None:
                raise OSError(errno.EBADF, "segment not open")
            os.ftruncate(self._tail_fd, offset)
        except OSError as e:
            self._note_error(f"cannot cut {self._tail.path.name} back to byte {offset} after a failed write "
                             f"({e.strerror or e}); continuing in a new segment", e)
            if self._tail_fd is not None:
                try:
                    os.close(self._tail_fd)
                except OSError:
                    pass
            self._tail_fd = None


    def _delete_consumed(self) -> None:
        for first, seg in list(self._segments.items()):
            if seg is self._tail:
                break
            if seg.last_seq >= self._head_seq:
                break
            try:
                seg.path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("spool %s: cannot delete consumed segment %s: %s", self.directory, seg.path.name, e)
                break
            del self._segments[first]

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_state(self, force_sync: bool = False) -> None:
        """Persist head and drop counter atomically (write temp, rename). A disk that refuses
        it leaves the previous state.json in place (a restart then re-sends, never skips) and
        the write is retried by the next state change or :meth:`maintain`."""
        path = self.directory / "state.json"
        tmp = self.directory / "state.json.tmp"
        data = json.dumps({"version": 1, "head_seq": self._head_seq, "dropped": self._dropped},
                          sort_keys=True).encode()
        sync = force_sync or self.fsync == "always"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            if sync:
                self._fsync_dir()
        except OSError as e:
            if not self._state_dirty:
                self._note_error(f"cannot write state.json ({e.strerror or e}); the previous one stays", e)
            else:
                self._write_errors += 1
            self._state_dirty = True
            try:
                tmp.unlink()
            except OSError:
                pass
            return
        if self._state_dirty:
            self._state_dirty = False

    def _read_state(self) -> tuple[int | None, int]:
        path = self.directory / "state.json"
        try:
            st = json.loads(path.read_bytes())
            head, dropped = st["head_seq"], st["dropped"]
            if not (isinstance(head, int) and isinstance(dropped, int) and head >= 1 and dropped >= 0):
                raise ValueError("bad values")
            return head, dropped
        except FileNotFoundError:
            return None, 0
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("spool %s: state.json unreadable (%s); resending every record on disk "
                        "(the server de-duplicates) and restarting the drop counter at 0", self.directory, e)
            return None, 0

    def _recover(self) -> None:
        head, self._dropped = self._read_state()
        segs = []
        for p in self.directory.glob(f"*{SEG_SUFFIX}"):
            try:
                segs.append((int(p.stem), p))
            except ValueError:
                log.warning("spool %s: ignoring unexpected file %s", self.directory, p.name)
                continue
            tighten(p, FILE_MODE)
        tighten(self.directory / "state.json", FILE_MODE)
        segs.sort()
        if head is None and segs:
            log.warning("spool %s: no state.json beside %d segment(s); starting from the oldest record",
                        self.directory, len(segs))
        entries: list[Entry] = []
        last_seq = 0
        dropped_before = self._dropped
        for first, path in segs:
            seg_entries, size, lost = scan_segment(self.directory, first, path, last_seq, head or 1)
            self._dropped += lost
            self._corrupt += lost
            if seg_entries:
                last_seq = seg_entries[-1].seq
            self._segments[first] = Segment(first, path, seg_entries[-1].seq if seg_entries else 0, size)
            entries.extend(seg_entries)
        if head is None:
            head = entries[0].seq if entries else 1
        self._head_seq = head
        self._next_seq = max(head, last_seq + 1)
        for e in entries:
            if e.seq >= head:
                self._entries.append(e)
                self._bytes += e.size
        if self._dropped != dropped_before:
            self._write_state()
        if self._segments:
            self._tail = next(reversed(self._segments.values()))
            try:
                self._tail_fd = os.open(self._tail.path, os.O_WRONLY | os.O_APPEND, FILE_MODE)
            except OSError as e:  # the next append starts a new segment
                self._note_error(f"cannot reopen {self._tail.path.name}: {e.strerror or e}", e)
        self._delete_consumed()
        if self._entries:
            log.info("spool %s: resuming with %d waiting record(s) (seq %d..%d), %d dropped so far",
                     self.directory, len(self._entries), self._entries[0].seq, self._entries[-1].seq, self._dropped)
