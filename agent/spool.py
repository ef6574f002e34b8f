"""A bounded, crash-safe, on-disk FIFO of messages waiting for NATS.

Why on disk: findings produced while NATS (or the network, or the controller's cluster) is away
must survive an agent restart, and the agent must never block or grow without bound because of
it. Why bounded with drop-oldest: the newest state of a node is what an operator needs when the
link comes back; a full spool evicts the oldest records and *counts* them (the counter is
persisted, so a restart does not hide the loss).

Layout of ``directory``::

    00000000000000000001.seg   segment files, named by the seq of their first record
    00000000000000000513.seg   (append-only; the last one is the one being written)
    state.json                 {"head_seq": first record not yet consumed, "dropped": n}
    lock                       flock'ed while a Spool has the directory open

Record framing (little-endian)::

    magic   4 bytes  b"SKR1"
    length  u32      body length
    seq     u64      record sequence number (strictly increasing, never reused)
    crc     u32      CRC-32 of seq (8 bytes) + body
    body    subject_len u16, subject UTF-8, headers_len u32, headers JSON (str → str), payload

Recovery on open: every segment is scanned; a record with a bad magic, impossible length or
CRC mismatch stops the scan of that segment. If a valid record follows (corruption in the
middle) the scan resynchronises on it; otherwise (a torn tail: the process died mid-write)
the segment is truncated back to the end of the last good record. Either way a warning is
logged and every record before the damage is kept.

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
import json
import logging
import os
import stat
import struct
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, NamedTuple

log = logging.getLogger("skewd.agent.spool")

MAGIC = b"SKR1"
_HDR = struct.Struct("<4sIQI")  # magic, body length, seq, crc32(seq + body)
HEADER_SIZE = _HDR.size
_SEQ = struct.Struct("<Q")
#: hard ceiling on one record's body: nothing skewd publishes comes near (NATS max_payload is 1 MiB)
MAX_RECORD_BODY = 64 << 20
FSYNC_POLICIES = ("always", "interval", "never")
_SEG_SUFFIX = ".seg"


class SpoolError(Exception):
    """The spool cannot be used (directory locked by another process, unwritable, ...)."""


class RecordTooLarge(SpoolError, ValueError):
    """A single record is larger than the spool's byte bound: it could never be stored."""


class SpoolUnavailable(SpoolError):
    """The disk refuses writes and the in-memory overflow is full: this record is not kept
    (counted in :attr:`Spool.lost`)."""


#: errno values that mean "the disk cannot take this now", as opposed to a bug
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.ENOMEM})
FILE_MODE = 0o600
DIR_MODE = 0o700


@dataclass(frozen=True)
class SpoolRecord:
    seq: int
    subject: str
    headers: dict[str, str]
    payload: bytes


class _Entry(NamedTuple):
    seq: int
    segment: int  # first seq of the segment (its name); -1 while held in memory
    offset: int
    size: int  # framed size (header + body)
    data: bytes | None = None  # the framed record while the disk refuses it


class _Segment:
    __slots__ = ("first_seq", "path", "last_seq", "size")

    def __init__(self, first_seq: int, path: Path, last_seq: int, size: int) -> None:
        self.first_seq = first_seq
        self.path = path
        self.last_seq = last_seq  # 0 while empty
        self.size = size


def encode_record(seq: int, subject: str, headers: Mapping[str, str], payload: bytes) -> bytes:
    """Frame one record (see module doc)."""
    subj = subject.encode("utf-8")
    if len(subj) > 0xFFFF:
        raise ValueError("subject longer than 65535 bytes")
    hdrs = json.dumps(dict(headers), sort_keys=True, separators=(",", ":")).encode("utf-8")
    body = b"".join((struct.pack("<H", len(subj)), subj, struct.pack("<I", len(hdrs)), hdrs, bytes(payload)))
    crc = zlib.crc32(body, zlib.crc32(_SEQ.pack(seq)))
    return _HDR.pack(MAGIC, len(body), seq, crc) + body


def _decode_body(seq: int, body: bytes) -> SpoolRecord:
    (slen,) = struct.unpack_from("<H", body, 0)
    subject = body[2:2 + slen].decode("utf-8")
    (hlen,) = struct.unpack_from("<I", body, 2 + slen)
    start = 6 + slen
    headers = json.loads(body[start:start + hlen])
    if not isinstance(headers, dict):
        raise ValueError("headers are not a JSON object")
    return SpoolRecord(seq, subject, {str(k): str(v) for k, v in headers.items()}, body[start + hlen:])


def _parse_at(buf: bytes | memoryview, off: int) -> tuple[int, int] | None:
    """(seq, framed size) of a valid record at ``off``, or None."""
    if off + HEADER_SIZE > len(buf):
        return None
    magic, length, seq, crc = _HDR.unpack_from(buf, off)
    if magic != MAGIC or length > MAX_RECORD_BODY or off + HEADER_SIZE + length > len(buf):
        return None
    body = buf[off + HEADER_SIZE:off + HEADER_SIZE + length]
    if zlib.crc32(body, zlib.crc32(_SEQ.pack(seq))) != crc:
        return None
    return seq, HEADER_SIZE + length


class Spool:
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
        self._entries: deque[_Entry] = deque()  # on disk, oldest first
        self._mem: deque[_Entry] = deque()  # refused by the disk, held in memory; all newer than _entries
        self._mem_bytes = 0
        self._segments: dict[int, _Segment] = {}  # insertion order = seq order
        self._tail: _Segment | None = None
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
            _make_private_dir(self.directory)
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
                self._entries.append(_Entry(seq, tail.first_seq, tail.size - size, size))
            else:
                self._mem.append(_Entry(seq, -1, 0, size, rec))
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
                        out.append(_decode_body(e.seq, e.data[HEADER_SIZE:]))
                        continue
                    fh = handles.get(e.segment)
                    if fh is None:
                        fh = handles[e.segment] = open(self._segments[e.segment].path, "rb")
                    fh.seek(e.offset)  # type: ignore[attr-defined]
                    buf = fh.read(e.size)  # type: ignore[attr-defined]
                    rec = None
                    if _parse_at(buf, 0) == (e.seq, e.size):
                        try:
                            rec = _decode_body(e.seq, buf[HEADER_SIZE:])
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

    def _waiting(self, n: int) -> list[_Entry]:
        """The ``n`` oldest waiting entries, disk ones first (they are older)."""
        out = list(itertools.islice(self._entries, n))
        if len(out) < n:
            out += itertools.islice(self._mem, n - len(out))
        return out

    def _pop_head(self) -> _Entry:
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

    def _seg_path(self, first_seq: int) -> Path:
        return self.directory / f"{first_seq:020d}{_SEG_SUFFIX}"

    def _roll(self, first_seq: int) -> _Segment:
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
        seg = _Segment(first_seq, self._seg_path(first_seq), 0, 0)
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
            self._entries.append(_Entry(e.seq, tail.first_seq, tail.size - e.size, e.size))
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
        for p in self.directory.glob(f"*{_SEG_SUFFIX}"):
            try:
                segs.append((int(p.stem), p))
            except ValueError:
                log.warning("spool %s: ignoring unexpected file %s", self.directory, p.name)
                continue
            _tighten(p, FILE_MODE)
        _tighten(self.directory / "state.json", FILE_MODE)
        segs.sort()
        if head is None and segs:
            log.warning("spool %s: no state.json beside %d segment(s); starting from the oldest record",
                        self.directory, len(segs))
        entries: list[_Entry] = []
        last_seq = 0
        dropped_before = self._dropped
        for first, path in segs:
            seg_entries, size = self._scan_segment(first, path, last_seq, head or 1)
            if seg_entries:
                last_seq = seg_entries[-1].seq
            self._segments[first] = _Segment(first, path, seg_entries[-1].seq if seg_entries else 0, size)
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

    def _scan_segment(self, first: int, path: Path, prev_seq: int, head: int) -> tuple[list[_Entry], int]:  # noqa: C901
        """Index one segment; cut a torn tail, skip damaged spans. Returns (entries, valid size)."""
        data = path.read_bytes()
        buf = memoryview(data)
        entries: list[_Entry] = []
        off = 0
        last = prev_seq
        while off < len(data):
            got = _parse_at(buf, off)
            if got is not None and got[0] > last:
                seq, size = got
                entries.append(_Entry(seq, first, off, size))
                last = seq
                off += size
                continue
            # damage at `off`: look for the next record that parses and continues the sequence
            nxt = data.find(MAGIC, off + 1)
            while nxt != -1:
                g = _parse_at(buf, nxt)
                if g is not None and g[0] > last:
                    break
                nxt = data.find(MAGIC, nxt + 1)
            if nxt == -1:
                log.warning("spool %s: %s: discarded %d byte(s) of a torn or corrupt record at "
                            "offset %d (agent stopped mid-write?); kept the %d record(s) before it",
                            self.directory, path.name, len(data) - off, off, len(entries))
                buf.release()
                with open(path, "r+b") as f:
                    f.truncate(off)
                    f.flush()
                    os.fsync(f.fileno())
                return entries, off
            g = _parse_at(buf, nxt)
            assert g is not None
            lost = max(0, g[0] - max(last + 1, first, head))  # waiting records inside the damage
            self._dropped += lost
            self._corrupt += lost
            log.warning("spool %s: %s: skipped %d corrupt byte(s) at offset %d (%d waiting record(s) "
                        "lost); resuming at the next intact record", self.directory, path.name,
                        nxt - off, off, lost)
            off = nxt
        buf.release()
        return entries, len(data)


def _make_private_dir(path: Path) -> None:
    """Create ``path`` and any missing parent as 0700 (whatever the umask); tighten an existing
    spool directory that others could read."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            pass
        os.chmod(d, DIR_MODE)  # mkdir's mode is filtered by the umask; this one is not widened by it
    try:
        st = os.stat(path)
    except OSError:
        return
    if st.st_uid == os.geteuid() and not st.st_mode & stat.S_ISVTX:  # never a shared dir such as /tmp
        _tighten(path, DIR_MODE)
    elif st.st_mode & 0o077:
        log.warning("spool directory %s is shared (mode %o, owner uid %d): give the agent a directory of its "
                    "own; its files stay 0600", path, stat.S_IMODE(st.st_mode), st.st_uid)


def _tighten(path: Path, mode: int) -> None:
    """chmod ``path`` to ``mode`` if it grants more (a spool written by an older skewd)."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if st.st_mode & 0o777 & ~mode:
        try:
            os.chmod(path, mode)
        except OSError as e:
            log.warning("spool: cannot restrict %s to %o: %s", path, mode, e.strerror or e)
