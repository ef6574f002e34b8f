"""The spool's on-disk record format: framing, decoding, and finding the intact records of a
segment file (:class:`~.spool.Spool` keeps the queue; this is what its bytes look like).

Record framing (little-endian)::

    magic   4 bytes  b"SKR1"
    length  u32      body length
    seq     u64      record sequence number (strictly increasing, never reused)
    crc     u32      CRC-32 of seq (8 bytes) + body
    body    subject_len u16, subject UTF-8, headers_len u32, headers JSON (str → str), payload

Scanning a segment (:func:`scan_segment`, on open): a record with a bad magic, impossible
length or CRC mismatch stops the scan. If a valid record follows (corruption in the middle) the
scan resynchronises on it; otherwise (a torn tail: the process died mid-write) the segment is
truncated back to the end of the last good record. Either way a warning is logged and every
record before the damage is kept.

Why apart: the format is a contract with the files an older or newer agent left behind, and the
framing, its checks and the resynchronising scan can be read and tested without the queue's
bounds, locks and disk-failure handling. No pickle: headers are JSON, payloads opaque bytes.
"""
from __future__ import annotations

import json
import logging
import os
import struct
import zlib
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


@dataclass(frozen=True)
class SpoolRecord:
    """One record as :meth:`~.spool.Spool.peek` returns it."""

    seq: int
    subject: str
    headers: dict[str, str]
    payload: bytes


class Entry(NamedTuple):
    """Where one waiting record is: a segment file and offset, or (``data``) held in memory."""

    seq: int
    segment: int  # first seq of the segment (its name); -1 while held in memory
    offset: int
    size: int  # framed size (header + body)
    data: bytes | None = None  # the framed record while the disk refuses it


def encode_record(seq: int, subject: str, headers: Mapping[str, str], payload: bytes) -> bytes:
    """Frame one record (see module doc)."""
    subj = subject.encode("utf-8")
    if len(subj) > 0xFFFF:
        raise ValueError("subject longer than 65535 bytes")
    hdrs = json.dumps(dict(headers), sort_keys=True, separators=(",", ":")).encode("utf-8")
    body = b"".join((struct.pack("<H", len(subj)), subj, struct.pack("<I", len(hdrs)), hdrs, bytes(payload)))
    crc = zlib.crc32(body, zlib.crc32(_SEQ.pack(seq)))
    return _HDR.pack(MAGIC, len(body), seq, crc) + body


def decode_body(seq: int, body: bytes) -> SpoolRecord:
    (slen,) = struct.unpack_from("<H", body, 0)
    subject = body[2:2 + slen].decode("utf-8")
    (hlen,) = struct.unpack_from("<I", body, 2 + slen)
    start = 6 + slen
    headers = json.loads(body[start:start + hlen])
    if not isinstance(headers, dict):
        raise ValueError("headers are not a JSON object")
    return SpoolRecord(seq, subject, {str(k): str(v) for k, v in headers.items()}, body[start + hlen:])


def parse_at(buf: bytes | memoryview, off: int) -> tuple[int, int] | None:
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


def scan_segment(directory: Path, first: int, path: Path, prev_seq: int, head: int
                 ) -> tuple[list[Entry], int, int]:  # noqa: C901
    """Index one segment; cut a torn tail, skip damaged spans. Returns (entries, valid size,
    waiting records lost inside damaged spans: the caller counts them dropped and corrupt)."""
    data = path.read_bytes()
    buf = memoryview(data)
    entries: list[Entry] = []
    lost_total = 0
    off = 0
    last = prev_seq
    while off < len(data):
        got = parse_at(buf, off)
        if got is not None and got[0] > last:
            seq, size = got
            entries.append(Entry(seq, first, off, size))
            last = seq
            off += size
            continue
        # damage at `off`: look for the next record that parses and continues the sequence
        nxt = data.find(MAGIC, off + 1)
        while nxt != -1:
            g = parse_at(buf, nxt)
            if g is not None and g[0] > last:
                break
            nxt = data.find(MAGIC, nxt + 1)
        if nxt == -1:
            log.warning("spool %s: %s: discarded %d byte(s) of a torn or corrupt record at "
                        "offset %d (agent stopped mid-write?); kept the %d record(s) before it",
                        directory, path.name, len(data) - off, off, len(entries))
            buf.release()
            with open(path, "r+b") as f:
                f.truncate(off)
                f.flush()
                os.fsync(f.fileno())
            return entries, off, lost_total
        g = parse_at(buf, nxt)
        assert g is not None
        lost = max(0, g[0] - max(last + 1, first, head))  # waiting records inside the damage
        lost_total += lost
        log.warning("spool %s: %s: skipped %d corrupt byte(s) at offset %d (%d waiting record(s) "
                    "lost); resuming at the next intact record", directory, path.name,
                    nxt - off, off, lost)
        off = nxt
    buf.release()
    return entries, len(data), lost_total
