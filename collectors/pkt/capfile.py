"""Capture files (pcap, pcapng, optionally zstd/gzip-compressed) → :class:`Frames`.

The hard part is speed. A pcap file is a chain of length-prefixed records: each record's
position depends on every record before it, which is why pure-Python readers manage a few
hundred thousand records per second at best. Large pcap files are framed here with a
*lockstep walk*: the file is cut into a few thousand segments, a plausible record start is
found in a small window at the head of each segment (timestamp, length checks on two
consecutive headers), and all segments are walked at once with numpy, one record per step.
Each segment's walk must land exactly on the next segment's start; a segment whose start was
a false positive is re-walked in Python from the true landing point. The result is exactly
what a sequential walk gives (the tests compare both), at a cost of a few hundred numpy steps.

Damaged files never raise from :func:`read_capture` (unless ``strict``): the frames read
before the damage are kept and ``Capture.problems`` names the file and byte offset.

Budgets (:class:`CaptureLimits`): a ``.gz``/``.zst`` capture is decompressed as a stream and
stops with a :class:`CaptureError` once it would exceed ``max_ratio`` times its compressed size
(real captures compress 2-10x, a decompression bomb 1000x) or ``max_decompressed`` bytes; both
are settable (``skewd pkt --max-decompressed/--max-ratio``). pcapng option values that no
64-bit timestamp can honour (``if_tsresol`` finer than 10^-19 s or 2^-63 s, an ``if_tsoffset``
beyond +-2^33 s) make that interface's packets unreadable, reported with the interface block's
byte offset; the rest of the file is read.
"""
from __future__ import annotations

import gzip
import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .frames import (DIR_IN, DIR_OUT, DIR_UNKNOWN, SUPPORTED_LINKTYPES, Capture, Frames, Interface,
                     gather, unsupported_message)

PCAP_MAGICS = {  # magic as read little-endian → (big-endian file, nanosecond, record header size)
    0xA1B2C3D4: (False, False, 16), 0xD4C3B2A1: (True, False, 16),
    0xA1B23C4D: (False, True, 16), 0x4D3CB2A1: (True, True, 16),
    0xA1B2CD34: (False, False, 24), 0x34CDB2A1: (True, False, 24),  # Kuznetsov's modified pcap
}
PCAPNG_SHB = 0x0A0D0D0A
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
#: largest record we accept as sane (Wireshark's limit is 256 MiB for some encapsulations)
MAX_CAPLEN = 1 << 28
#: files below these sizes are framed with a plain Python walk (no setup cost)
LOCKSTEP_MIN_BYTES = 1 << 22
PCAPNG_RUNS_MIN_BYTES = 1 << 16
#: pcap framing cuts big files into about this many segments walked side by side
SEGDIV = 4096


#: if_tsresol exponents a uint64 tick count can mean (10^-19 s and 2^-63 s are its finest steps)
MAX_TSRESOL_DEC = 19
MAX_TSRESOL_BIN = 63
#: if_tsoffset (seconds) whose nanoseconds fit an int64 with room for the packet times
MAX_TSOFFSET = 1 << 33
_READ_CHUNK = 1 << 20


class CaptureError(Exception):
    """The file cannot be read at all (or, with ``strict``, not entirely)."""


@dataclass(frozen=True)
class CaptureLimits:
    """Decompression budget (see module doc). The floor lets a tiny compressed file of a
    highly regular capture expand more than the ratio says."""

    max_decompressed: int = 4 << 30
    max_ratio: float = 100.0
    ratio_floor: int = 64 << 20

    def cap(self, compressed_size: int) -> int:
        return int(min(self.max_decompressed, max(self.ratio_floor, self.max_ratio * compressed_size)))


DEFAULT_LIMITS = CaptureLimits()


# -- loading ---------------------------------------------------------------------------------

def _load(path: Path, limits: CaptureLimits = DEFAULT_LIMITS) -> np.ndarray:
    """The file's bytes as a uint8 array (memory-mapped when not compressed)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise CaptureError(f"{path}: empty file (no capture header)")
            if head.startswith(ZSTD_MAGIC):
                try:
                    import zstandard  # type: ignore[import-not-found]
                except ImportError:
                    raise CaptureError(
                        f"{path}: zstd-compressed capture, and the 'zstandard' Python module is not "
                        f"installed: decompress it first (zstd -d '{path}') or pip install 'skewd[zstd]'") from None
                f.seek(0)
                try:
                    with zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True) as r:
                        return _bounded_read(r, path, "zstd", size, limits)
                except zstandard.ZstdError as e:
                    raise CaptureError(f"{path}: damaged zstd stream ({e})") from None
            if head.startswith(GZIP_MAGIC):
                f.seek(0)
                try:
                    with gzip.GzipFile(fileobj=f, mode="rb") as r:
                        return _bounded_read(r, path, "gzip", size, limits)
                except (OSError, EOFError, zlib.error) as e:
                    raise CaptureError(f"{path}: damaged gzip stream ({e})") from None
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            return np.frombuffer(mm, np.uint8)
    except OSError as e:
        raise CaptureError(f"{path}: cannot read ({e.strerror or e})") from None


def _bounded_read(r, path: Path, what: str, compressed: int, limits: CaptureLimits) -> np.ndarray:
    """Decompress a stream into memory, stopping at the budget instead of at the machine's end."""
    cap = limits.cap(compressed)
    buf = bytearray()
    while True:
        chunk = r.read(min(_READ_CHUNK, cap + 1 - len(buf)))
        if not chunk:
            return np.frombuffer(buf, np.uint8)
        buf += chunk
        if len(buf) > cap:
            raise CaptureError(
                f"{path}: {what} stream expands past {cap} bytes from {compressed} compressed "
                f"(limits: {limits.max_ratio:g}x its size, at least {limits.ratio_floor} and at most "
                f"{limits.max_decompressed} bytes): a decompression bomb, or raise --max-decompressed/--max-ratio")


def read_capture(path: str | os.PathLike[str], strict: bool = False,
                 limits: CaptureLimits = DEFAULT_LIMITS) -> Capture:
    """Read a pcap/pcapng file (``.zst``/``.gz`` too, within ``limits``). Problems go to
    ``Capture.problems``; ``strict`` turns them into a :class:`CaptureError` (whose
    ``capture`` keeps what was read)."""
    p = Path(path)
    cap = parse_capture(_load(p, limits), str(p))
    if strict and cap.problems:
        err = CaptureError("; ".join(cap.problems))
        err.capture = cap  # type: ignore[attr-defined]
        raise err
    return cap


def parse_capture(a: np.ndarray, name: str = "<buffer>") -> Capture:
    """Frame an in-memory capture file (the pure core of :func:`read_capture`)."""
    if len(a) < 4:
        raise CaptureError(f"{name}: too short for a capture header ({len(a)} bytes)")
    magic = int.from_bytes(bytes(a[:4]), "little")
    if magic == PCAPNG_SHB:
        cap = _read_pcapng(a, name)
    elif magic in PCAP_MAGICS:
        cap = _read_pcap(a, name, *PCAP_MAGICS[magic])
    else:
        raise CaptureError(f"{name}: not a pcap or pcapng file (magic {bytes(a[:4]).hex()})")
    lt = cap.frames.linktype
    if len(lt):
        kinds, counts = np.unique(lt, return_counts=True)
        for k, c in zip(kinds.tolist(), counts.tolist()):
            if k not in SUPPORTED_LINKTYPES:
                cap.unsupported[k] = c
                cap.problems.append(f"{name}: {unsupported_message(k, c)}")
    return cap


# -- pcap ------------------------------------------------------------------------------------

def _read_pcap(a: np.ndarray, name: str, big: bool, nano: bool, hdrlen: int) -> Capture:
    if len(a) < 24:
        raise CaptureError(f"{name}: truncated pcap file header ({len(a)} of 24 bytes)")
    e = ">" if big else "<"
    _, _, _, _, snaplen, network = struct.unpack(e + "HHiIII", bytes(a[4:24]))
    linktype = network & 0xFFFF  # the upper bits carry FCS-length flags
    offs, h, caplen, problem = _frame_pcap(a, big, hdrlen)
    n = len(offs)
    ts = _header_field(h, 0, big).astype(np.int64)
    ts *= 1_000_000_000
    frac = _header_field(h, 4, big).astype(np.int64)
    if not nano:
        frac *= 1000
    ts += frac
    del frac
    doff = offs
    doff += hdrlen  # in place: the offsets are ours and not needed after this
    direction = np.zeros(n, np.int8)
    if hdrlen == 24:  # modified pcap: pkt_type at byte 22 (0-3 received, 4 outgoing)
        pt = h[:, 22]
        direction[pt <= 3] = DIR_IN
        direction[pt == 4] = DIR_OUT
    frames = Frames(a, doff, caplen, _header_field(h, 12, big).astype(np.int64), ts,
                    np.full(n, linktype, np.int32), np.zeros(n, np.int32), direction)
    cap = Capture(name, "pcap", frames, [Interface("", linktype, snaplen)])
    if problem:
        cap.problems.append(f"{name}: {problem}; kept the {n} packet(s) before it")
    return cap


def frame_pcap(a: np.ndarray, big: bool, hdrlen: int = 16, lockstep: bool | None = None
               ) -> tuple[np.ndarray, str | None]:
    """Byte offsets of every sound record header after the 24-byte file header, and the
    first problem (truncation/corruption, with its byte offset) if the walk stopped early."""
    offs, _, problem = frame_pcap_headers(a, big, hdrlen, lockstep)
    return offs, problem


def frame_pcap_headers(a: np.ndarray, big: bool, hdrlen: int = 16, lockstep: bool | None = None
                       ) -> tuple[np.ndarray, np.ndarray, str | None]:
    """:func:`frame_pcap` plus the record headers themselves (``(n, hdrlen)`` bytes)."""
    offs, h, _, problem = _frame_pcap(a, big, hdrlen, lockstep)
    return offs, h, problem


def _frame_pcap(a: np.ndarray, big: bool, hdrlen: int, lockstep: bool | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str | None]:
    """(offsets, headers, captured lengths as int64, problem) of the sound records."""
    end = len(a)
    if lockstep is None:
        lockstep = end >= LOCKSTEP_MIN_BYTES
    h = None
    if lockstep and end >= 24 + 2 * hdrlen:
        offs, h, problem = _lockstep_pcap(a, big, hdrlen)
    else:
        walked, _, problem = _walk_pcap(a, 24, end, big, hdrlen)
        offs = np.asarray(walked, np.int64)
    if h is None:
        h = gather(a, offs, hdrlen)
    caplen = _header_field(h, 8, big).astype(np.int64)
    n, problem = _validate_pcap(a, offs, caplen, hdrlen, big, problem)
    if n < len(offs):
        return offs[:n], h[:n], caplen[:n], problem
    return offs, h, caplen, problem


def _header_field(h: np.ndarray, at: int, big: bool) -> np.ndarray:
    """The 32-bit field ``at`` bytes into every row of a header matrix (a strided view)."""
    dt = np.dtype({"names": ["f"], "formats": [">u4" if big else "<u4"], "offsets": [at], "itemsize": h.shape[1]})
    return np.ascontiguousarray(h).view(dt)["f"][:, 0]


def _walk_pcap(a: np.ndarray, pos: int, stop: int, big: bool, hdrlen: int
               ) -> tuple[list[int], int, str | None]:
    """Sequential walk from ``pos`` until a record starts at or after ``stop``."""
    mv = memoryview(a)
    end = len(a)
    u32 = struct.Struct(">I" if big else "<I").unpack_from
    offs: list[int] = []
    ap = offs.append
    while pos < stop:
        if pos + hdrlen > end:
            return offs, pos, f"truncated record header at byte offset {pos} ({end - pos} of {hdrlen} bytes)"
        caplen = u32(mv, pos + 8)[0]
        if caplen > MAX_CAPLEN:
            return offs, pos, f"corrupt record header at byte offset {pos} (captured length {caplen})"
        nxt = pos + hdrlen + caplen
        if nxt > end:
            return offs, pos, (f"truncated record at byte offset {pos} (header says {caplen} bytes, "
                               f"{end - pos - hdrlen} left in the file)")
        ap(pos)
        pos = nxt
    return offs, pos, None


def _u32_at(a: np.ndarray, pos: np.ndarray, big: bool) -> np.ndarray:
    return gather(a, pos, 4).view(">u4" if big else "<u4")[:, 0].astype(np.int64)


def _segment_starts(a: np.ndarray, big: bool, hdrlen: int, nano: bool, seg: int, win: int) -> np.ndarray:
    """A plausible record start near the head of each segment (or none for that segment)."""
    end = len(a)
    e = ">u4" if big else "<u4"
    ts0 = int(_u32_at(a, np.array([24]), big)[0])
    # records outside this window are not candidates (their segment is then walked in Python)
    lo, span = max(0, ts0 - 86400), 86400 * 31
    fracmax = 1_000_000_000 if nano else 1_000_000
    heads = np.arange(seg, end - win - 2 * hdrlen, seg, dtype=np.int64)
    if len(heads) == 0:
        return heads
    w4 = win + 4
    m = gather(a, heads, w4)  # (S, win + 4) bytes at the head of each segment
    # first screen: the most significant byte of ts_sec (one cheap byte compare), then the
    # full checks on the few candidates
    msb_at = 0 if big else 3
    msbs = np.arange(lo >> 24, ((lo + span) >> 24) + 1) & 0xFF
    hit = m[:, msb_at:msb_at + win] == msbs[0]
    for b in msbs[1:]:
        hit |= m[:, msb_at:msb_at + win] == b
    flat = np.flatnonzero(hit)
    rows, c = flat // win, flat % win
    pos = heads[rows] + c
    h = gather(a, pos, 16).view(e)
    ok_ts = ((h[:, 0].astype(np.int64) - lo).astype(np.uint64) < span)
    rows, pos, h = rows[ok_ts], pos[ok_ts], h[ok_ts]
    caplen = h[:, 2].astype(np.int64)
    nxt = pos + hdrlen + caplen
    ok = (h[:, 1] < fracmax) & (caplen <= MAX_CAPLEN) & (h[:, 3] >= h[:, 2]) & (nxt + hdrlen <= end)
    h2 = gather(a, np.where(ok, nxt, 0), 16).view(e)
    ok &= ((h2[:, 0].astype(np.int64) - lo).astype(np.uint64) < span) & (h2[:, 1] < fracmax) \
        & (h2[:, 3] >= h2[:, 2]) & (h2[:, 2] <= MAX_CAPLEN)
    rows, pos = rows[ok], pos[ok]
    if len(pos) == 0:
        return pos
    first = np.r_[True, rows[1:] != rows[:-1]]
    return pos[first]


def _lockstep_pcap(a: np.ndarray, big: bool, hdrlen: int) -> tuple[np.ndarray, np.ndarray | None, str | None]:
    """Record offsets, and their headers (``(n, hdrlen)`` bytes) when the lockstep walk ran
    (each step reads whole headers: they sit in the cache line the walk has to load anyway,
    so the caller needs no second pass over the file for them)."""
    end = len(a)
    nano = int.from_bytes(bytes(a[:4]), "little") in (0xA1B23C4D, 0x4D3CB2A1)
    # window to find a record start in: a few typical records (from the first ones)
    head, _, _ = _walk_pcap(a, 24, min(end, 24 + (1 << 18)), big, hdrlen)
    sizes = np.diff(np.asarray(head[:257], np.int64))
    win = int(min(8192, max(256, 1.5 * np.percentile(sizes, 90)))) & ~3 if len(sizes) > 8 else 4096
    seg = max(1 << 13, end // SEGDIV, 8 * win)
    starts = np.concatenate([[24], _segment_starts(a, big, hdrlen, nano, seg, win)]).astype(np.int64)
    if len(starts) < 64:  # too few chains to gain anything (e.g. timestamps far from the first)
        offs_l, _, problem = _walk_pcap(a, 24, end, big, hdrlen)
        return np.asarray(offs_l, np.int64), None, problem
    bounds = np.r_[starts[1:], end]
    S = len(starts)
    # the captured length of each header as one strided field of the gathered rows
    cl_dt = np.dtype({"names": ["caplen"], "formats": [">u4" if big else "<u4"], "offsets": [8], "itemsize": hdrlen})
    # walk every segment at once, one record per step; the last few long chains finish in
    # Python (a numpy step costs tens of microseconds however few chains are left)
    P = starts.copy()
    land = np.full(S, -1, np.int64)
    act = np.arange(S)
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    while len(act) >= 16:
        p = P[act]
        hs = gather(a, p, hdrlen)  # rows past the end read zeros; such chains end below
        steps.append((act, p, hs))
        cl = hs.view(cl_dt)["caplen"][:, 0].astype(np.int64)
        cl[p + hdrlen > end] = MAX_CAPLEN + 1  # a truncated header ends the chain
        nxt = p + hdrlen + cl
        done = nxt >= bounds[act]
        land[act[done]] = nxt[done]
        act = act[~done]
        P[act] = nxt[~done]
    counts = np.zeros(S, np.int64)
    for idx, _, _ in steps:
        counts[idx] += 1
    # the unfinished chains continue in Python (their problem counts only if the segment is used)
    tails: dict[int, tuple[list[int], str | None]] = {}
    for k in act.tolist():
        offs, land[k], tail_problem = _walk_pcap(a, int(P[k]), int(bounds[k]), big, hdrlen)
        tails[k] = (offs, tail_problem)
        counts[k] += len(offs)
    base = np.r_[0, np.cumsum(counts)[:-1]]
    total = int(counts.sum())
    flat = np.empty(total, np.int64)
    hflat = np.empty((total, hdrlen), np.uint8)
    hview = hflat.view(np.dtype((np.void, hdrlen))).ravel()
    for j, (idx, p, hs) in enumerate(steps):
        at = base[idx] + j
        flat[at] = p
        hview[at] = hs.view(np.dtype((np.void, hdrlen))).ravel()
    del steps
    for k, (offs, _) in tails.items():
        if offs:
            b1 = int(base[k] + counts[k])
            flat[b1 - len(offs): b1] = offs
            hflat[b1 - len(offs): b1] = gather(a, flat[b1 - len(offs): b1], hdrlen)
    # stitch: a segment is valid when the previous valid walk lands exactly on its start
    pieces: list[tuple[int, int] | np.ndarray] = []  # (from, to) in flat, or walked offsets
    problem: str | None = None
    cur = 24
    for k in range(S):
        if k and cur != starts[k]:  # a false start (or a damaged file): walk this segment in Python
            offs, cur, problem = _walk_pcap(a, int(cur), int(bounds[k]), big, hdrlen)
            if offs:
                pieces.append(np.asarray(offs, np.int64))
        else:
            b0 = int(base[k])
            if pieces and isinstance(pieces[-1], tuple) and pieces[-1][1] == b0:
                pieces[-1] = (pieces[-1][0], b0 + int(counts[k]))
            else:
                pieces.append((b0, b0 + int(counts[k])))
            cur = int(land[k])
            if k in tails:
                problem = tails[k][1]
        if problem:
            break
    if len(pieces) == 1 and isinstance(pieces[0], tuple) and pieces[0] == (0, total):
        return flat, hflat, problem  # the usual case: every segment start was a true record start
    op: list[np.ndarray] = []
    hp: list[np.ndarray] = []
    for piece in pieces:
        if isinstance(piece, tuple):
            op.append(flat[piece[0]: piece[1]])
            hp.append(hflat[piece[0]: piece[1]])
        else:
            op.append(piece)
            hp.append(gather(a, piece, hdrlen))
    if not op:
        return np.zeros(0, np.int64), np.zeros((0, hdrlen), np.uint8), problem
    return np.concatenate(op), np.concatenate(hp), problem  # the caller validates every record


def _validate_pcap(a: np.ndarray, offs: np.ndarray, caplen: np.ndarray, hdrlen: int, big: bool,
                   problem: str | None) -> tuple[int, str | None]:
    """How many leading records are sound, and the first problem: a walk can look valid and
    still have crossed a damaged header (the lockstep walk does not check as it goes)."""
    end = len(a)
    if not len(offs):
        return 0, problem
    reach = offs + caplen  # each record must end inside the file (caplen >= 0: header included)
    if int(caplen.max()) <= MAX_CAPLEN and int(reach.max()) <= end - hdrlen:
        return len(offs), problem
    bad = (caplen > MAX_CAPLEN) | (reach > end - hdrlen)
    i = int(np.argmax(bad))
    _, _, first_problem = _walk_pcap(a, int(offs[i]), int(offs[i]) + 1, big, hdrlen)
    return i, first_problem


# -- pcapng ----------------------------------------------------------------------------------

def _tsresol(opt: bytes | None) -> tuple[int, int]:
    """if_tsresol → (base, exponent): 10^-6 by default."""
    if not opt:
        return 10, 6
    v = opt[0]
    return (2, v & 0x7F) if v & 0x80 else (10, v)


def _timing_problem(base: int, exp: int, off: int) -> str | None:
    """Why an interface's timestamps cannot be read (None: they can)."""
    if (base == 10 and exp > MAX_TSRESOL_DEC) or (base == 2 and exp > MAX_TSRESOL_BIN):
        return (f"if_tsresol {base}^-{exp} is finer than a 64-bit tick count can mean "
                f"(at most 10^-{MAX_TSRESOL_DEC} or 2^-{MAX_TSRESOL_BIN})")
    if abs(off) > MAX_TSOFFSET:
        return f"if_tsoffset {off} s is beyond +-{MAX_TSOFFSET} s (centuries from 1970)"
    return None


def _ticks_to_ns(t: np.ndarray, base: int, exp: int) -> np.ndarray:
    t = t.astype(np.uint64)
    if base == 10:
        if exp <= 9:
            return (t * np.uint64(10 ** (9 - exp))).astype(np.int64)
        return (t // np.uint64(10 ** (exp - 9))).astype(np.int64)
    if exp <= 32:
        sec = (t >> np.uint64(exp)).astype(np.int64)
        frac = (t & np.uint64((1 << exp) - 1)) * np.uint64(1_000_000_000)
        return sec * 1_000_000_000 + (frac >> np.uint64(exp)).astype(np.int64)
    return (t.astype(np.float64) / float(1 << exp) * 1e9).astype(np.int64)


def _options(b: bytes, e: str) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    o = 0
    while o + 4 <= len(b):
        code, ln = struct.unpack_from(e + "HH", b, o)
        if code == 0:
            break
        out.setdefault(code, b[o + 4: o + 4 + ln])
        o += 4 + ((ln + 3) & ~3)
    return out


def _epb_runs(a: np.ndarray, e: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidate enhanced packet blocks of a whole file in byte order ``e``: (positions, next
    block positions, indices where a run of back-to-back candidates ends).

    Blocks are 32-bit aligned and carry their length at both ends, so type 6 at an aligned
    offset with matching leading and trailing lengths is almost surely a block. The walker
    only ever accepts candidates starting exactly where the previous block ended, so a false
    candidate inside some payload merely ends a run early."""
    end = len(a)
    u = np.ndarray((end // 4,), dtype=e + "u4", buffer=a)
    p = np.flatnonzero(u == 6).astype(np.int64)
    p = p[p + 1 < len(u)]
    ln = u[p + 1].astype(np.int64)
    ok = (ln >= 32) & (ln % 4 == 0) & ((p * 4 + ln) <= end)
    p, ln = p[ok], ln[ok]
    ok = u[p + ln // 4 - 1] == ln
    pos = p[ok] * 4
    succ = pos + ln[ok]
    brk = np.flatnonzero(succ[:-1] != pos[1:]) if len(pos) else np.zeros(0, np.int64)
    return pos, succ, brk


def _read_pcapng(a: np.ndarray, name: str) -> Capture:
    """pcapng with any number of sections and interfaces. Blocks are walked in Python except
    runs of enhanced packet blocks, which are located with numpy (:func:`_epb_runs`); packet
    blocks are then decoded per section with numpy."""
    end = len(a)
    mv = memoryview(a)
    ifaces: list[Interface] = []
    resol: list[tuple[int, int, int]] = []  # (base, exp, offset seconds) per global interface
    # packet blocks: (section order, global-iface base of the section, kind, positions)
    sections: list[dict] = []
    problems: list[str] = []
    pos = 0
    e = "<"
    sec: dict | None = None
    runs: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    untimed: set[int] = set()  # interfaces whose timestamps cannot be read (see _timing_problem)
    while pos < end:
        if sec is not None and end >= PCAPNG_RUNS_MIN_BYTES:
            # runs of enhanced packet blocks are taken in one step (see _epb_runs)
            if e not in runs:
                runs[e] = _epb_runs(a, e)
            P, SUCC, BRK = runs[e]
            j = int(np.searchsorted(P, pos))
            if j < len(P) and P[j] == pos:
                b = int(np.searchsorted(BRK, j))
                r = int(BRK[b]) if b < len(BRK) else len(P) - 1
                sec["epb"].append(P[j: r + 1])
                pos = int(SUCC[r])
                continue
        if pos + 12 > end:
            problems.append(f"{name}: truncated block header at byte offset {pos} ({end - pos} bytes left)")
            break
        btype = struct.unpack_from(e + "I", mv, pos)[0]
        if btype == PCAPNG_SHB:
            bom = bytes(mv[pos + 8: pos + 12])
            if bom == b"\x4d\x3c\x2b\x1a":
                e = "<"
            elif bom == b"\x1a\x2b\x3c\x4d":
                e = ">"
            else:
                problems.append(f"{name}: corrupt section header at byte offset {pos} (byte-order magic {bom.hex()})")
                break
            sec = {"e": e, "base": len(ifaces), "epb": [], "spb": [], "opb": []}
            sections.append(sec)
        blen = struct.unpack_from(e + "I", mv, pos + 4)[0]
        if blen < 12 or blen % 4:
            problems.append(f"{name}: corrupt block at byte offset {pos} (type {btype:#x}, length {blen})")
            break
        if pos + blen > end:
            problems.append(f"{name}: truncated block at byte offset {pos} (type {btype:#x} says {blen} bytes, "
                            f"{end - pos} left in the file)")
            break
        if sec is None:
            problems.append(f"{name}: block at byte offset {pos} before any section header")
            break
        if btype == 6:
            sec["epb"].append(np.array([pos], np.int64))
        elif btype == 1:
            lt, _, snap = struct.unpack_from(e + "HHI", mv, pos + 8)
            opts = _options(bytes(mv[pos + 16: pos + blen - 4]), e)
            base, exp = _tsresol(opts.get(9))
            off = struct.unpack(e + "q", opts[14])[0] if len(opts.get(14, b"")) == 8 else 0
            ifname = opts.get(2, b"").split(b"\0")[0].decode("utf-8", "replace")
            why = _timing_problem(base, exp, off)
            if why:
                problems.append(f"{name}: interface {len(ifaces)} (block at byte offset {pos}): {why}; "
                                "its packets are skipped")
                untimed.add(len(ifaces))
            ifaces.append(Interface(ifname, lt, snap))
            resol.append((base, exp, off))
        elif btype == 5 and blen >= 24:
            ifid = struct.unpack_from(e + "I", mv, pos + 8)[0]
            opts = _options(bytes(mv[pos + 20: pos + blen - 4]), e)
            g = sec["base"] + ifid
            if len(opts.get(5, b"")) == 8 and g < len(ifaces):
                ifaces[g].drops = struct.unpack(e + "Q", opts[5])[0]  # isb_ifdrop (latest ISB wins)
        elif btype == 3:
            sec["spb"].append(pos)
        elif btype == 2:
            sec["opb"].append(pos)
        pos += blen
    parts: list[Frames] = []
    order: list[np.ndarray] = []
    nosts = 0
    for sec in sections:
        e = sec["e"]
        for kind in ("epb", "opb", "spb"):
            if not sec[kind]:
                continue
            bp = np.concatenate(sec[kind]) if kind == "epb" else np.asarray(sec[kind], np.int64)
            h = gather(a, bp, 28)
            u = h.view(e + "u4")
            blen = u[:, 1].astype(np.int64)
            if kind == "spb":
                local = np.zeros(len(bp), np.int64)
                wire = u[:, 2].astype(np.int64)
                dstart = bp + 12
                room = blen - 16
                g0 = sec["base"]
                snap = ifaces[g0].snaplen if g0 < len(ifaces) else 0
                caplen = np.minimum(wire, room) if not snap else np.minimum(np.minimum(wire, snap), room)
                ticks = np.zeros(len(bp), np.uint64)
                nosts += len(bp)
            else:
                local = (u[:, 2] if kind == "epb" else (u[:, 2] & 0xFFFF if e == "<" else u[:, 2] >> 16)).astype(np.int64)
                ticks = (u[:, 3].astype(np.uint64) << np.uint64(32)) | u[:, 4].astype(np.uint64)
                caplen = u[:, 5].astype(np.int64)
                wire = u[:, 6].astype(np.int64)
                dstart = bp + 28
                room = blen - 32
            g = sec["base"] + local
            bad = (g >= len(ifaces)) | (caplen > room) | (caplen < 0)
            if untimed:
                bad |= np.isin(g, list(untimed))
            if bad.any():
                i = int(np.argmax(bad))
                what = ("unknown interface id" if g[i] >= len(ifaces) else "interface with unreadable timestamps"
                        if int(g[i]) in untimed else "captured length larger than the block")
                problems.append(f"{name}: {int(bad.sum())} packet block(s) skipped ({what}, first at byte offset {bp[i]})")
                keep = ~bad
                bp, g, caplen, wire, dstart, ticks = bp[keep], g[keep], caplen[keep], wire[keep], dstart[keep], ticks[keep]
            ts = np.zeros(len(bp), np.int64)
            for gi in np.unique(g).tolist():
                sel = g == gi
                base, exp, off = resol[gi]
                ts[sel] = _ticks_to_ns(ticks[sel], base, exp) + off * 1_000_000_000
            lt = np.asarray([i.linktype for i in ifaces], np.int32)[g] if len(g) else np.zeros(0, np.int32)
            parts.append(Frames(a, dstart, caplen, wire, ts, lt, g.astype(np.int32),
                                np.full(len(bp), DIR_UNKNOWN, np.int8)))
            order.append(bp)
    if nosts:
        problems.append(f"{name}: {nosts} simple packet block(s) carry no timestamp (read as time 0)")
    if parts:
        frames = _concat_same_buffer(parts)
        o = np.concatenate(order)
        if len(parts) > 1:
            frames = frames.select(np.argsort(o, kind="stable"))
    else:
        frames = Frames.empty()
        frames.buf = a
    return Capture(name, "pcapng", frames, ifaces, problems)


def _concat_same_buffer(parts: list[Frames]) -> Frames:
    if len(parts) == 1:
        return parts[0]
    cat = np.concatenate
    return Frames(parts[0].buf, cat([p.doff for p in parts]), cat([p.caplen for p in parts]),
                  cat([p.wirelen for p in parts]), cat([p.ts_ns for p in parts]),
                  cat([p.linktype for p in parts]), cat([p.iface for p in parts]),
                  cat([p.direction for p in parts]))


__all__ = ["CaptureError", "read_capture", "parse_capture", "frame_pcap", "DIR_IN", "DIR_OUT"]
