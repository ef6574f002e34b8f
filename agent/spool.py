"""A bounded, crash-safe, on-disk FIFO of messages waiting for NATS.

Why on disk: findings produced while NATS (or the network, or the controller's cluster) is away
must survive an agent restart, and the agent must never block or grow without bound because of
it. Why bounded with drop-oldest: the newest state of a node is what an operator needs when the
link comes back; a full spool evicts the oldest records and *counts* them (the counter is
persisted, so a restart does not hide the loss).

The record format and the scan that recovers from a torn write are in :mod:`.spoolrecord`, the
segment files, state file and recovery in :mod:`.spoolsegments`, the file modes in
:mod:`.spoolperms`.

Consumption is at-least-once: ``peek`` then ``ack(seq)`` after the server acknowledged. A crash
between the two re-sends the record on restart; JetStream drops it by ``Nats-Msg-Id``.

Durability (``fsync``, agent config ``spool.fsync``). Every append is handed to the kernel
(one ``write(2)``, no user-space buffer) before it returns, so a crash of the agent process
(kill -9, OOM kill, panic) never loses an appended record under any policy. What the policy
decides is what survives a *power loss or kernel crash*:

- ``"always"``: every append and every state change is fsynced (and the directory when a
  segment is created) before ``append`` returns: nothing appended is lost. Costs one disk flush
  per record (milliseconds on a spinning disk, ~0.1 ms on NVMe).
- ``"interval"`` (default): the open segment is fsynced on the first append at least
  ``fsync_interval`` seconds after the last fsync, and by :meth:`Spool.maintain`, which the
  publisher calls every ``fsync_interval`` seconds, so an idle spool is synced too: a power
  loss loses at most the records of the last ``fsync_interval`` seconds (1 s by default). The
  head/drop state is synced on close only: after a power loss records may be re-sent (the
  server drops the copies by ``Nats-Msg-Id``), never skipped.
- ``"never"``: the kernel writes back when it likes (typically within 30 s).

Disk trouble (ENOSPC, EIO, EDQUOT, a read-only remount): ``append`` never raises for it. A
record the disk refuses is kept in memory (up to ``memory_bytes``) behind the records already
on disk, in order, and is published from there like any other; what does not fit in memory
either is refused with :class:`SpoolUnavailable` and counted in :attr:`Spool.lost`. A
partial write is cut back so the segment holds only whole records. Every later append and
every :meth:`Spool.maintain` call retries the disk, writing the held records first, so the
spool returns to disk as soon as space does. :attr:`Spool.degraded` and :meth:`Spool.stats`
say how many records are held in memory and how many disk writes failed; the publisher puts
them on the agent's health and ``/metrics``.

Permissions: the directory is created ``0700`` and every file ``0600`` whatever the umask
(findings name nodes, rules and what is wrong with them); an existing spool directory and its
files are tightened to the same modes when opened.

Bounds: ``max_messages`` and ``max_bytes`` (framed size of pending records) — either may be
``None``. Disk use is at most ``max_bytes`` plus one segment (the consumed prefix of the
oldest segment, deleted once it is fully consumed).

Pure Python, stdlib only, no pickle: headers are JSON, payloads opaque bytes. Methods are
synchronous and thread-safe (one lock); each is a few small file operations.
"""
from __future__ import annotations

import errno
import fcntl
import itertools
import logging
import os
import struct
import threading
import time
from collections import deque
from pathlib import Path
from typing import Mapping

from .spoolperms import DIR_MODE, FILE_MODE, make_private_dir
from .spoolrecord import HEADER_SIZE, MAGIC, MAX_RECORD_BODY, Entry, SpoolRecord, decode_body, encode_record, parse_at
from .spoolsegments import Segment, SegmentFiles

__all__ = ["DIR_MODE", "DISK_ERRORS", "FILE_MODE", "FSYNC_POLICIES", "HEADER_SIZE", "MAGIC", "MAX_RECORD_BODY",
           "RecordTooLarge", "Spool", "SpoolError", "SpoolRecord", "SpoolUnavailable", "encode_record"]

log = logging.getLogger("skewd.agent.spool")

FSYNC_POLICIES = ("always", "interval", "never")


class SpoolError(Exception):
    """The spool cannot be used (directory locked by another process, unwritable, ...)."""


class RecordTooLarge(SpoolError, ValueError):
    """A single record is larger than the spool's byte bound: it could never be stored."""


class SpoolUnavailable(SpoolError):
    """The disk refuses writes and the in-memory overflow is full: this record is not kept
    (counted in :attr:`Spool.lost`)."""


#: errno values that mean "the disk cannot take this now", as opposed to a bug
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.ENOMEM})


class Spool(SegmentFiles):
    """Bounded on-disk FIFO. ``append`` never blocks on the network and never fails for lack
    of room (it evicts the oldest instead); ``peek``/``ack`` consume in order.

    >>> sp = Spool("/var/lib/skewd/spool", max_bytes=64 << 20)       # doctest: +SKIP
    >>> seq = sp.append("skewd.v1.finding.c.n.r", {"Nats-Msg-Id": "x"}, b"{}")
    >>> for rec in sp.peek(10): ...publish...; sp.ack(rec.seq)
    """

    def __init__(self, directory: str | os.PathLike[str], *, max_bytes: int | None = 64 << 20,
                 max_messages: int | None = 100_000, segment_bytes: int = 4 << 20,
                 fsync: str = "interval", fsync_interval: float = 1.0, memory_bytes: int = 4 << 20) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"spool fsync policy {fsync!r}: use one of {', '.join(FSYNC_POLICIES)}")
        for name, v in (("max_bytes", max_bytes), ("max_messages", max_messages)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise ValueError(f"spool {name} must be a positive integer or None, got {v!r}")
        if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 0:
            raise ValueError(f"spool memory_bytes must be an integer >= 0, got {memory_bytes!r}")
        if isinstance(fsync_interval, bool) or not isinstance(fsync_interval, (int, float)) or not fsync_interval > 0:
            raise ValueError(f"spool fsync_interval must be a number of seconds > 0, got {fsync_interval!r}")
        if segment_bytes <= HEADER_SIZE:
            raise ValueError(f"spool segment_bytes must exceed {HEADER_SIZE}, got {segment_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.fsync_interval = float(fsync_interval)
        self.memory_bytes = memory_bytes
        self._lock = threading.RLock()
        self._entries: deque[Entry] = deque()  # on disk, oldest first
        self._mem: deque[Entry] = deque()  # refused by the disk, held in memory; all newer than _entries
        self._mem_bytes = 0
        self._segments: dict[int, Segment] = {}  # insertion order = seq order
        self._tail: Segment | None = None
        self._tail_fd: int | None = None
        self._bytes = 0
        self._dropped = 0
        self._corrupt = 0
        self._head_seq = 1
        self._next_seq = 1
        self._last_sync = time.monotonic()
        self._unsynced = False
        self._last_drop_log = 0.0
        self._lost = 0
        self._write_errors = 0
        self._last_error = ""
        self._last_error_log = 0.0
        self._state_dirty = False
        self._closed = False
        try:
            make_private_dir(self.directory)
            self._lockfile = os.fdopen(os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT | os.O_APPEND,
                                               FILE_MODE), "a+b")
        except OSError as e:
            raise SpoolError(f"spool directory {self.directory}: {e.strerror}") from None
        try:
            fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lockfile.close()
            raise SpoolError(f"spool directory {self.directory} is in use by another process "
                             "(two agents configured with the same spool dir?)") from None
        self._recover()

    # ---- public API ---------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Records waiting (appended, not yet acked or dropped), on disk or held in memory."""
        return len(self._entries) + len(self._mem)

    @property
    def bytes(self) -> int:
        """Framed bytes of the waiting records (what ``max_bytes`` bounds)."""
        return self._bytes

    @property
    def dropped(self) -> int:
        """Records evicted unsent because the spool was full (or found corrupt), ever; persisted."""
        return self._dropped

    @property
    def corrupt(self) -> int:
        """Records skipped because they failed their checksum when read back (this process)."""
        return self._corrupt

    @property
    def lost(self) -> int:
        """Records refused because the disk failed and the memory overflow was full (this process)."""
        return self._lost

    @property
    def in_memory(self) -> int:
        """Records held in memory because the disk refused them (published like the others)."""
        return len(self._mem)

    @property
    def degraded(self) -> bool:
        """True while the disk refuses writes (records are held in memory meanwhile)."""
        return bool(self._mem) or self._state_dirty

    @property
    def write_errors(self) -> int:
        """Failed disk operations (write, fsync, state file) since this Spool was opened."""
        return self._write_errors

    @property
    def last_error(self) -> str:
        """The latest disk error, e.g. ``"No space left on device"`` ("" while healthy)."""
        return self._last_error if self.degraded else ""

    @property
    def head_seq(self) -> int:
        return self._head_seq

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def stats(self) -> dict[str, int]:
        return {"depth": self.depth, "bytes": self.bytes, "dropped": self.dropped, "corrupt": self.corrupt,
                "disk_bytes": sum(s.size for s in self._segments.values()), "in_memory": len(self._mem),
                "memory_bytes": self._mem_bytes, "lost": self._lost, "write_errors": self._write_errors,
                "degraded": int(self.degraded)}

    def append(self, subject: str, headers: Mapping[str, str], payload: bytes) -> int:
        """Store one record and return its seq: on disk (durable per the fsync policy) or, while
        the disk refuses writes, in memory (see module doc). Evicts the oldest records first if
        the new one would exceed a bound. Raises :class:`RecordTooLarge` if the record alone
        exceeds ``max_bytes``, :class:`SpoolUnavailable` if neither disk nor memory can take it."""
        with self._lock:
            self._check_open()
            seq = self._next_seq
            rec = encode_record(seq, subject, headers, payload)
            size = len(rec)
            if size - HEADER_SIZE > MAX_RECORD_BODY or (self.max_bytes is not None and size > self.max_bytes):
                raise RecordTooLarge(f"record of {size} bytes for {subject} exceeds the spool bound "
                                     f"({self.max_bytes} bytes)")
            if self._mem or self._state_dirty:
                self._retry_disk()
            evicted = self._evict(size)
            on_disk = False
            if not self._mem:
                on_disk = self._write_record(seq, rec)
            if not on_disk and self._mem_bytes + size > self.memory_bytes:
                self._lost += 1
                self._note_error(f"record {seq} for {subject} not kept: the disk refuses writes "
                                 f"({self._last_error}) and {len(self._mem)} record(s) already fill the "
                                 f"{self.memory_bytes}-byte memory overflow", force=self._lost == 1)
                raise SpoolUnavailable(f"spool {self.directory}: disk refuses writes ({self._last_error}) and the "
                                       f"memory overflow ({self.memory_bytes} bytes) is full")
            self._next_seq = seq + 1
            if on_disk:
                tail = self._tail
                assert tail is not None
                self._entries.append(Entry(seq, tail.first_seq, tail.size - size, size))
            else:
                self._mem.append(Entry(seq, -1, 0, size, rec))
                self._mem_bytes += size
            self._bytes += size
            if on_disk:
                self._maybe_sync()
            if evicted:
                self._delete_consumed()
            return seq

    def maintain(self) -> None:
        """Periodic upkeep (the publisher calls it every ``fsync_interval``): write records held
        in memory back to disk once it takes them again, retry a state file the disk refused,
        and fsync what the ``"interval"`` policy owes. Never raises for disk trouble."""
        with self._lock:
            if self._closed:
                return
            if self._mem or self._state_dirty:
                self._retry_disk()
            if self.fsync == "interval" and time.monotonic() - self._last_sync >= self.fsync_interval:
                self.sync()

    def peek(self, n: int = 1) -> list[SpoolRecord]:
        """Up to ``n`` oldest waiting records, in order, without consuming them. A record that
        fails its checksum on read-back (disk damage since it was written) is dropped, counted
        and logged when it is at the head; behind intact records, the batch stops before it."""
        with self._lock:
            self._check_open()
            out: list[SpoolRecord] = []
            handles: dict[int, object] = {}
            try:
                for e in self._waiting(max(0, n)):
                    if e.data is not None:
                        out.append(decode_body(e.seq, e.data[HEADER_SIZE:]))
                        continue
                    fh = handles.get(e.segment)
                    if fh is None:
                        fh = handles[e.segment] = open(self._segments[e.segment].path, "rb")
                    fh.seek(e.offset)  # type: ignore[attr-defined]
                    buf = fh.read(e.size)  # type: ignore[attr-defined]
                    rec = None
                    if parse_at(buf, 0) == (e.seq, e.size):
                        try:
                            rec = decode_body(e.seq, buf[HEADER_SIZE:])
                        except (ValueError, UnicodeDecodeError, struct.error):
                            rec = None
                    if rec is None:
                        if out:
                            break  # return what precedes the damage; it is dropped at the head next time
                        log.error("spool %s: record %d at %s:%d is corrupt on disk; dropping it",
                                  self.directory, e.seq, self._segments[e.segment].path.name, e.offset)
                        self._corrupt += 1
                        self._dropped += 1
                        self._consume_through(e.seq)
                        continue
                    out.append(rec)
            finally:
                for fh in handles.values():
                    fh.close()  # type: ignore[attr-defined]
            return out

    def ack(self, seq: int) -> int:
        """Consume every waiting record with sequence ≤ ``seq`` (after the server confirmed it).
        Returns how many were removed (0 if they were already evicted or acked)."""
        with self._lock:
            self._check_open()
            return self._consume_through(seq)

    def sync(self) -> None:
        """fsync the open segment now (:meth:`maintain` does when the policy says so). A failing
        fsync is counted and logged, not raised: the records stay indexed and are sent."""
        with self._lock:
            if self._tail_fd is not None and self._unsynced:
                self._last_sync = time.monotonic()
                try:
                    os.fsync(self._tail_fd)
                except OSError as e:
                    self._note_error(f"fsync of {self._tail.path.name if self._tail else '?'} failed: "
                                     f"{e.strerror or e}; records since the last fsync may not survive a "
                                     "power loss", e)
                    return
                self._unsynced = False

    def close(self) -> None:
        """Write back records held in memory if the disk takes them again, fsync (unless
        ``fsync="never"``), persist state, release the directory. Idempotent; never raises for
        disk trouble (what cannot be written is logged with its count)."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._mem or self._state_dirty:
                    self._retry_disk()
                if self._mem:
                    log.error("spool %s: closing with %d record(s) the disk would not take (%s); they are "
                              "lost", self.directory, len(self._mem), self._last_error)
                if self._tail_fd is not None:
                    if self.fsync != "never":
                        try:
                            os.fsync(self._tail_fd)
                        except OSError as e:
                            self._note_error(f"fsync on close failed: {e.strerror or e}", e)
                    try:
                        os.close(self._tail_fd)
                    except OSError as e:
                        self._note_error(f"close of the open segment failed: {e.strerror or e}", e)
                    self._tail_fd = None
                self._write_state(force_sync=self.fsync != "never")
            finally:
                self._closed = True
                fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_UN)
                self._lockfile.close()

    def __enter__(self) -> "Spool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Spool({str(self.directory)!r}, depth={self.depth}, bytes={self.bytes}, dropped={self.dropped})"

    # ---- internals ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SpoolError(f"spool {self.directory} is closed")

    def _waiting(self, n: int) -> list[Entry]:
        """The ``n`` oldest waiting entries, disk ones first (they are older)."""
        out = list(itertools.islice(self._entries, n))
        if len(out) < n:
            out += itertools.islice(self._mem, n - len(out))
        return out

    def _pop_head(self) -> Entry:
        if self._entries:
            e = self._entries.popleft()
        else:
            e = self._mem.popleft()
            self._mem_bytes -= e.size
        self._bytes -= e.size
        return e

    def _first_waiting(self) -> int | None:
        if self._entries:
            return self._entries[0].seq
        return self._mem[0].seq if self._mem else None

    def _evict(self, incoming: int) -> int:
        """Drop the oldest records until one more of ``incoming`` bytes fits the bounds."""
        evicted = 0
        while self.depth and (
                (self.max_messages is not None and self.depth + 1 > self.max_messages)
                or (self.max_bytes is not None and self._bytes + incoming > self.max_bytes)):
            self._pop_head()
            evicted += 1
        if evicted:
            self._dropped += evicted
            first = self._first_waiting()
            self._head_seq = first if first is not None else self._next_seq
            self._note_drops(evicted)
            self._write_state()
        return evicted

    def _consume_through(self, seq: int) -> int:
        n = 0
        while True:
            first = self._first_waiting()
            if first is None or first > seq:
                break
            self._pop_head()
            n += 1
        first = self._first_waiting()
        new_head = first if first is not None else self._next_seq
        if n or new_head != self._head_seq:
            self._head_seq = max(self._head_seq, new_head)
            self._write_state()
            self._delete_consumed()
        return n

    def _note_drops(self, n: int) -> None:
        now = time.monotonic()
        if now - self._last_drop_log >= 60.0:
            self._last_drop_log = now
            log.warning("spool %s full (bounds: %s messages, %s bytes): evicted the %d oldest "
                        "record(s); %d dropped in total", self.directory, self.max_messages,
                        self.max_bytes, n, self._dropped)

    def _retry_disk(self) -> None:
        """Write the records held in memory back to disk, oldest first, until one is refused;
        then a state file the disk refused earlier."""
        while self._mem:
            e = self._mem[0]
            if e.seq < self._head_seq:  # consumed or evicted meanwhile
                self._mem.popleft()
                self._mem_bytes -= e.size
                continue
            assert e.data is not None
            if not self._write_record(e.seq, e.data):
                return
            self._mem.popleft()
            self._mem_bytes -= e.size
            tail = self._tail
            assert tail is not None
            self._entries.append(Entry(e.seq, tail.first_seq, tail.size - e.size, e.size))
            if not self._mem:
                log.warning("spool %s: the disk takes writes again; every record held in memory is back on "
                            "disk", self.directory)
        if self._state_dirty:
            self._write_state()

    def _note_error(self, message: str, exc: OSError | None = None, force: bool = False) -> None:
        """Count a disk failure and log it (at most once a minute unless ``force``)."""
        if exc is not None:
            self._write_errors += 1
            self._last_error = exc.strerror or str(exc)
            if exc.errno is not None and exc.errno not in DISK_ERRORS:
                log.debug("spool %s: unexpected error %s", self.directory, errno.errorcode.get(exc.errno, exc.errno))
        now = time.monotonic()
        if force or now - self._last_error_log >= 60.0:
            self._last_error_log = now
            log.error("spool %s: %s (%d record(s) held in memory, %d lost, %d disk error(s) so far)",
                      self.directory, message, len(self._mem), self._lost, self._write_errors)

    def _maybe_sync(self) -> None:
        if self.fsync == "always" or (
                self.fsync == "interval" and time.monotonic() - self._last_sync >= self.fsync_interval):
            self.sync()
            if self.fsync == "always" and self._state_dirty:
                self._write_state()
