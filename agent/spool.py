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

Durability (``fsync``): ``"always"`` fsyncs every append and state change (survives power
loss, costs a disk flush per record); ``"interval"`` (default) fsyncs at most every
``fsync_interval`` seconds, on the append that crosses it and on close (a power loss may lose
the last interval; a process crash loses nothing, data is always flushed to the OS);
``"never"`` leaves it to the OS.

Bounds: ``max_messages`` and ``max_bytes`` (framed size of pending records) — either may be
``None``. Disk use is at most ``max_bytes`` plus one segment (the consumed prefix of the
oldest segment, deleted once it is fully consumed).

Pure Python, stdlib only, no pickle: headers are JSON, payloads opaque bytes. Methods are
synchronous and thread-safe (one lock); each is a few small file operations.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
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


@dataclass(frozen=True)
class SpoolRecord:
    seq: int
    subject: str
    headers: dict[str, str]
    payload: bytes


class _Entry(NamedTuple):
    seq: int
    segment: int  # first seq of the segment (its name)
    offset: int
    size: int  # framed size (header + body)


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
                 fsync: str = "interval", fsync_interval: float = 1.0) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"spool fsync policy {fsync!r}: use one of {', '.join(FSYNC_POLICIES)}")
        for name, v in (("max_bytes", max_bytes), ("max_messages", max_messages)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise ValueError(f"spool {name} must be a positive integer or None, got {v!r}")
        if segment_bytes <= HEADER_SIZE:
            raise ValueError(f"spool segment_bytes must exceed {HEADER_SIZE}, got {segment_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.fsync_interval = fsync_interval
        self._lock = threading.RLock()
        self._entries: deque[_Entry] = deque()
        self._segments: dict[int, _Segment] = {}  # insertion order = seq order
        self._tail: _Segment | None = None
        self._tail_file = None
        self._bytes = 0
        self._dropped = 0
        self._corrupt = 0
        self._head_seq = 1
        self._next_seq = 1
        self._last_sync = time.monotonic()
        self._unsynced = False
        self._last_drop_log = 0.0
        self._closed = False
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lockfile = open(self.directory / "lock", "a+b")
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
        """Records waiting (appended, not yet acked or dropped)."""
        return len(self._entries)

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
    def head_seq(self) -> int:
        return self._head_seq

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def stats(self) -> dict[str, int]:
        return {"depth": self.depth, "bytes": self.bytes, "dropped": self.dropped, "corrupt": self.corrupt,
                "disk_bytes": sum(s.size for s in self._segments.values())}

    def append(self, subject: str, headers: Mapping[str, str], payload: bytes) -> int:
        """Store one record durably (per the fsync policy) and return its seq. Evicts the
        oldest records first if the new one would exceed a bound. Raises
        :class:`RecordTooLarge` if the record alone exceeds ``max_bytes``."""
        with self._lock:
            self._check_open()
            seq = self._next_seq
            rec = encode_record(seq, subject, headers, payload)
            size = len(rec)
            if size - HEADER_SIZE > MAX_RECORD_BODY or (self.max_bytes is not None and size > self.max_bytes):
                raise RecordTooLarge(f"record of {size} bytes for {subject} exceeds the spool bound "
                                     f"({self.max_bytes} bytes)")
            evicted = 0
            while self._entries and (
                    (self.max_messages is not None and len(self._entries) + 1 > self.max_messages)
                    or (self.max_bytes is not None and self._bytes + size > self.max_bytes)):
                e = self._entries.popleft()
                self._bytes -= e.size
                evicted += 1
            if evicted:
                self._dropped += evicted
                self._head_seq = self._entries[0].seq if self._entries else seq
                self._note_drops(evicted)
                self._write_state()
            tail = self._tail
            if tail is None or (tail.size > 0 and (tail.size + size > self.segment_bytes
                                                   or tail.last_seq < self._head_seq)):
                tail = self._roll(seq)
            offset = tail.size
            f = self._tail_file
            assert f is not None
            try:
                f.write(rec)
                f.flush()
            except OSError as e:
                self._repair_tail(offset)
                raise SpoolError(f"spool write to {tail.path} failed: {e.strerror}") from None
            tail.size += size
            tail.last_seq = seq
            self._entries.append(_Entry(seq, tail.first_seq, offset, size))
            self._bytes += size
            self._next_seq = seq + 1
            self._unsynced = True
            self._maybe_sync()
            if evicted:
                self._delete_consumed()
            return seq

    def peek(self, n: int = 1) -> list[SpoolRecord]:
        """Up to ``n`` oldest waiting records, in order, without consuming them. A record that
        fails its checksum on read-back (disk damage since it was written) is dropped, counted
        and logged when it is at the head; behind intact records, the batch stops before it."""
        with self._lock:
            self._check_open()
            out: list[SpoolRecord] = []
            handles: dict[int, object] = {}
            try:
                for e in list(self._entries)[:max(0, n)]:
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
        """fsync the open segment now (e.g. on a timer with ``fsync="interval"``)."""
        with self._lock:
            if self._tail_file is not None and self._unsynced:
                os.fsync(self._tail_file.fileno())
                self._unsynced = False
                self._last_sync = time.monotonic()

    def close(self) -> None:
        """Flush, fsync (unless ``fsync="never"``), persist state, release the directory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._tail_file is not None:
                    self._tail_file.flush()
                    if self.fsync != "never":
                        os.fsync(self._tail_file.fileno())
                    self._tail_file.close()
                    self._tail_file = None
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

    def _consume_through(self, seq: int) -> int:
        n = 0
        while self._entries and self._entries[0].seq <= seq:
            e = self._entries.popleft()
            self._bytes -= e.size
            n += 1
        new_head = self._entries[0].seq if self._entries else self._next_seq
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
        if self._tail_file is not None:
            self._tail_file.flush()
            if self.fsync != "never":
                os.fsync(self._tail_file.fileno())
            self._tail_file.close()
            self._tail_file = None
        seg = _Segment(first_seq, self._seg_path(first_seq), 0, 0)
        self._tail_file = open(seg.path, "ab")
        self._segments[first_seq] = seg
        self._tail = seg
        if self.fsync == "always":
            self._fsync_dir()
        self._delete_consumed()
        return seg

    def _repair_tail(self, offset: int) -> None:
        """After a failed write, cut the segment back so no partial record stays behind."""
        try:
            assert self._tail is not None and self._tail_file is not None
            self._tail_file.close()
            os.truncate(self._tail.path, offset)
            self._tail_file = open(self._tail.path, "ab")
        except OSError:
            log.exception("spool %s: cannot repair %s after a failed write", self.directory,
                          self._tail.path if self._tail else "?")

    def _maybe_sync(self) -> None:
        if self.fsync == "always" or (
                self.fsync == "interval" and time.monotonic() - self._last_sync >= self.fsync_interval):
            self.sync()

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
        """Persist head and drop counter atomically (write temp, rename)."""
        path = self.directory / "state.json"
        tmp = self.directory / "state.json.tmp"
        data = json.dumps({"version": 1, "head_seq": self._head_seq, "dropped": self._dropped},
                          sort_keys=True).encode()
        sync = force_sync or self.fsync == "always"
        with open(tmp, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if sync:
            self._fsync_dir()

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
            self._tail_file = open(self._tail.path, "ab")
        self._delete_consumed()
        if self._entries:
            log.info("spool %s: resuming with %d waiting record(s) (seq %d..%d), %d dropped so far",
                     self.directory, len(self._entries), self._entries[0].seq, self._entries[-1].seq, self._dropped)

    def _scan_segment(self, first: int, path: Path, prev_seq: int, head: int) -> tuple[list[_Entry], int]:
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
