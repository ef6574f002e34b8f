"""Capture bundles: the on-disk format the recorder writes and replay reads (docs/capture-format.md).

A bundle is a directory of *segments*; a segment is a directory holding one stretch of one
agent's life: ``meta.json`` (what, where, which rules), ``samples.arrow`` and ``ticks.arrow``
(Arrow IPC *stream* format, so a segment cut short by a crash still opens with pyarrow),
``findings.jsonl`` and ``summaries.jsonl`` (what the agent raised and reported), optionally
``packets.pcapng``, a copy of the rule files in ``rules/``, and ``index.jsonl``.

Why an index: Arrow IPC and JSON lines carry no checksums, and a post-mortem tool must not
silently evaluate rules over flipped bits. Every append to a data file is one *chunk*, and
``index.jsonl`` records its file, byte offset, length and CRC32 (plus the time range and the
batch numbers it covers, which replay uses to stop exactly where damage begins). Each index
line carries a CRC32 of itself too. Readers verify chunks in order and stop a file at the
first chunk that is missing, short or fails its CRC, reporting the file and byte offset; all
earlier chunks stay usable, because every file is append-only.

Nothing is pickled: the formats are Arrow, JSON and pcapng, readable without skewd.

Bundles are shared (an operator attaches one to a ticket, a colleague replays it), so a reader
trusts nothing in them beyond what it checks. ``meta.json`` is validated field by field
against what the recorder writes (types, finite numbers, a bounded node count, stored rule
paths that stay inside the segment) and read under :class:`BundleLimits` (size, JSON depth):
a bad one is a :class:`BundleError` naming the file and the field. The index and the data are
checked as they are read - index entries of the wrong shape, Arrow streams whose schema or
dictionary codes are not the recorder's, JSON lines that are not objects - and each problem
is a :class:`Damage` with file and byte offset, never an exception: CRCs that match prove only
that nothing changed since the writer, not that the writer was skewd.
"""
from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import shutil
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from skewd.model import SampleBatch, SignalSpec, signal

FORMAT = "skewd-capture"
FORMAT_VERSION = 1

META = "meta.json"
INDEX = "index.jsonl"
SAMPLES = "samples.arrow"
TICKS = "ticks.arrow"
FINDINGS = "findings.jsonl"
SUMMARIES = "summaries.jsonl"
PACKETS = "packets.pcapng"
RULES_DIR = "rules"
CAPTURES_DIR = "captures"


def _indexed_name(name: str) -> bool:
    """A file an index entry may name: the data files, or a copied capture under captures/."""
    if name in (SAMPLES, TICKS, FINDINGS, SUMMARIES, PACKETS):
        return True
    parts = Path(name).parts
    return len(parts) == 2 and parts[0] == CAPTURES_DIR and parts[1] not in ("..", ".") and "\0" not in name

_DICT = pa.dictionary(pa.int32(), pa.string())
#: One row per sample. ``batch`` numbers the SampleBatches in arrival order within the segment,
#: so replay can re-create the exact ingest boundaries the live agent saw.
SAMPLES_SCHEMA = pa.schema([
    ("t", pa.float64()), ("node", _DICT), ("entity", _DICT), ("signal", _DICT),
    ("value", pa.float64()), ("batch", pa.int64()),
])
#: One row per evaluation: its time, how many sample batches had been ingested before it,
#: and how many transitions it produced.
TICKS_SCHEMA = pa.schema([("t", pa.float64()), ("batches", pa.int64()), ("findings", pa.int32())])

_COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class BundleLimits:
    """What a reader accepts before it calls a segment unusable (``skewd replay --limit``).

    The recorder writes one node per agent (a fault-lab bundle: one per simulated node, tens);
    meta.json is a few hundred KB with a full catalogue. The bounds sit far above that and
    below what costs an operator's laptop its memory (each node replays in its own pipeline)."""

    meta_bytes: int = 64 << 20
    json_depth: int = 32
    nodes: int = 1024
    signals: int = 100_000
    labels: int = 256  # labels per node
    text: int = 4096  # characters of a node name, label, signal name
    index_bytes: int = 1 << 30
    line_bytes: int = 16 << 20  # one index or JSON line

    @classmethod
    def from_items(cls, items: Sequence[str]) -> "BundleLimits":
        """``KEY=VALUE`` strings (positive integers); raises ValueError naming a bad one."""
        known = {f for f in cls.__dataclass_fields__}
        out: dict[str, int] = {}
        for item in items:
            k, sep, v = item.partition("=")
            k = k.strip()
            if not sep or k not in known:
                raise ValueError(f"bundle limit {item!r}: write KEY=VALUE with KEY one of {', '.join(sorted(known))}")
            try:
                n = int(v)
            except ValueError:
                raise ValueError(f"bundle limit {k}: {v!r} is not an integer") from None
            if n < 1:
                raise ValueError(f"bundle limit {k} must be at least 1")
            out[k] = n
        return cls(**out)


DEFAULT_LIMITS = BundleLimits()


def _depth_ok(doc: Any, limit: int) -> bool:
    """True when ``doc`` nests at most ``limit`` containers deep (iterative: the point is to
    refuse what recursive walks, json.dumps and deepcopy among them, would choke on). Walks
    level by level and only through containers: every index line passes through here."""
    level = [doc] if isinstance(doc, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return False
        nxt: list[Any] = []
        for node in level:
            nxt.extend(v for v in (node.values() if isinstance(node, dict) else node) if isinstance(v, (dict, list)))
        level = nxt
    return True


def _few_brackets(raw: bytes | str, limit: int) -> bool:
    """True when ``raw`` holds at most ``limit`` opening brackets: then its JSON cannot nest
    deeper than ``limit`` (a cheap exit before :func:`_depth_ok` walks the document)."""
    if isinstance(raw, str):
        return raw.count("[") + raw.count("{") <= limit
    return raw.count(b"[") + raw.count(b"{") <= limit


def loads_bounded(raw: bytes | str, depth: int) -> Any:
    """``json.loads`` that raises ValueError (never RecursionError) for input nested deeper than
    ``depth``, or for the non-standard NaN/Infinity tokens (the writers never emit them)."""
    try:
        doc = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {depth} levels") from None
    if not _few_brackets(raw, depth) and not _depth_ok(doc, depth):
        raise ValueError(f"JSON nested deeper than {depth} levels")
    return doc


def loads_bounded_lenient(raw: bytes | str, depth: int) -> Any:
    """:func:`loads_bounded` accepting NaN/Infinity (finding evidence may carry them)."""
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {depth} levels") from None
    if not _few_brackets(raw, depth) and not _depth_ok(doc, depth):
        raise ValueError(f"JSON nested deeper than {depth} levels")
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _is_num(v: Any) -> bool:
    """A finite JSON number that is also a finite float (10**400 is an int but no time)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return abs(v) < 1 << 1000 if isinstance(v, int) else math.isfinite(v)


def _is_int(v: Any, lo: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v < 1 << 63


class _MetaCheck:
    """Collects what is wrong with a meta.json document (see module doc)."""

    #: settings replay steps by: positive, finite, and not so small that stepping never ends
    SETTINGS = {"evaluation_interval": (1e-3, 86400.0), "summary_interval": (1e-3, 86400.0),
                "lookback": (1e-3, 30 * 86400.0), "horizon": (1e-3, 30 * 86400.0)}

    def __init__(self, limits: BundleLimits) -> None:
        self.limits = limits
        self.problems: list[str] = []

    def bad(self, field_: str, why: str) -> None:
        self.problems.append(f"{field_}: {why}")

    def text(self, v: Any, field_: str, optional: bool = True) -> None:
        if v is None and optional:
            return
        if not isinstance(v, str) or len(v) > self.limits.text:
            self.bad(field_, f"expected text of at most {self.limits.text} characters, got {_kind(v)}")

    def texts(self, v: Any, field_: str, most: int) -> None:
        if v is None:
            return
        if not isinstance(v, list):
            self.bad(field_, f"expected a list of names, got {_kind(v)}")
        elif len(v) > most:
            self.bad(field_, f"{len(v)} entries; the limit is {most} (skewd replay --limit)")
        elif not all(isinstance(x, str) and len(x) <= self.limits.text for x in v):
            self.bad(field_, "expected names (text)")

    def check(self, m: dict[str, Any]) -> list[str]:
        lim = self.limits
        self.texts(m.get("nodes"), "nodes", lim.nodes)
        for k in ("cluster", "recorder_node", "skewd_version"):
            self.text(m.get(k), k)
        cl = m.get("cluster")
        if isinstance(cl, str) and any(c in cl for c in " .*>\t"):
            # what the agent and controller configs accept: the replayed controller runs in it (an
            # empty cluster is a recording made without one; cluster replay names it "replay")
            self.bad("cluster", f"{cl[:40]!r} is not a cluster name (no spaces, dots, '*' or '>')")
        labels = m.get("node_labels")
        if labels is not None:
            if not isinstance(labels, dict) or len(labels) > lim.nodes:
                self.bad("node_labels", f"expected a mapping of at most {lim.nodes} nodes, got {_kind(labels)}")
            else:
                for n, lab in labels.items():
                    if not isinstance(lab, dict) or len(lab) > lim.labels or not all(
                            isinstance(k, str) and isinstance(v, str) and len(k) <= lim.text and len(v) <= lim.text
                            for k, v in lab.items()) or len(n) > lim.text:
                        self.bad(f"node_labels.{n[:40]}", f"expected at most {lim.labels} text labels")
                        break
        st = m.get("settings")
        if st is not None:
            if not isinstance(st, dict):
                self.bad("settings", f"expected a mapping, got {_kind(st)}")
            else:
                for k, (lo, hi) in self.SETTINGS.items():
                    if k in st and not (_is_num(st[k]) and lo <= st[k] <= hi):
                        self.bad(f"settings.{k}", f"expected seconds in {lo:g}..{hi:g}, got {_kind(st[k])}")
        tr = m.get("time_range")
        if tr is not None:
            if not isinstance(tr, dict):
                self.bad("time_range", f"expected a mapping, got {_kind(tr)}")
            else:
                for k in ("start", "end"):
                    if tr.get(k) is not None and not _is_num(tr[k]):
                        self.bad(f"time_range.{k}", f"expected a finite time, got {_kind(tr[k])}")
        cat = m.get("catalogue")
        if cat is not None:
            if not isinstance(cat, list) or len(cat) > lim.signals:
                self.bad("catalogue", f"expected a list of at most {lim.signals} signals, got {_kind(cat)}")
            else:
                for i, d in enumerate(cat):
                    try:
                        if not isinstance(d, dict) or any(not isinstance(d.get(k), str) or len(d[k]) > lim.text
                                                          for k in ("name", "kind", "unit", "scope")):
                            raise ValueError("expected name, kind, unit and scope as text")
                        if d.get("wrap_bits") is not None and not (_is_int(d["wrap_bits"]) and d["wrap_bits"] <= 64):
                            raise ValueError("wrap_bits must be an integer up to 64")
                        spec_from_dict(d)
                    except (ValueError, TypeError, KeyError) as e:
                        self.bad(f"catalogue[{i}]", str(e)[:200])
                        break
        self.texts(m.get("signals"), "signals", lim.signals)
        self.texts(m.get("available_signals"), "available_signals", lim.signals)
        rules = m.get("rules")
        if rules is not None:
            if not isinstance(rules, dict):
                self.bad("rules", f"expected a mapping, got {_kind(rules)}")
            else:
                self.text(rules.get("version"), "rules.version")
                files = rules.get("files")
                if files is not None and (not isinstance(files, list) or len(files) > 10_000):
                    self.bad("rules.files", f"expected a list of stored rule files, got {_kind(files)}")
                elif files:
                    for i, f in enumerate(files):
                        stored = f.get("stored") if isinstance(f, dict) else None
                        if not (isinstance(stored, str) and isinstance(f.get("sha256"), str)
                                and stored.startswith(RULES_DIR + "/") and ".." not in Path(stored).parts
                                and "\0" not in stored and len(stored) <= lim.text):
                            self.bad(f"rules.files[{i}]", "expected {stored: rules/<name>, sha256: <hex>}")
                            break
                if rules.get("rules") is not None and not isinstance(rules.get("rules"), list):
                    self.bad("rules.rules", f"expected a list, got {_kind(rules.get('rules'))}")
        return self.problems


def _kind(v: Any) -> str:
    """A short description of a value for an error message."""
    if isinstance(v, (dict, list)):
        return f"a {type(v).__name__} of {len(v)}"
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


class BundleError(Exception):
    """A bundle (or one of its files) that cannot be read at all; names the file and offset."""

    def __init__(self, path: str | Path, offset: int | None, message: str) -> None:
        self.path = str(path)
        self.offset = offset
        self.message = message
        where = f"{self.path}: byte offset {offset}" if offset is not None else self.path
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Damage:
    """Where a file stops being trustworthy. Everything before ``offset`` was verified."""

    path: str
    offset: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}: byte offset {self.offset}: {self.message}"


def _canon(d: Mapping[str, Any]) -> str:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _line_crc(entry: Mapping[str, Any]) -> int:
    return zlib.crc32(_canon({k: v for k, v in entry.items() if k != "line_crc32"}).encode())


def _finite(x: float | None) -> float | None:
    if x is None or not np.isfinite(x):
        return None
    return float(x)


def spec_to_dict(s: SignalSpec) -> dict[str, Any]:
    return {"name": s.name, "kind": s.kind.value, "unit": s.unit, "scope": s.scope.value, "desc": s.desc,
            "collector": s.collector, "wrap_bits": s.wrap_bits}


def spec_from_dict(d: Mapping[str, Any]) -> SignalSpec:
    return signal(d["name"], d["kind"], d["unit"], d["scope"], d.get("desc", ""), d.get("collector", ""),
                  d.get("wrap_bits"))


# ---------------------------------------------------------------------------------------------
# pcapng (hand-written: a few fixed block layouts, no libpcap on the hosts we run on)
# ---------------------------------------------------------------------------------------------

def _pad4(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def _block(btype: int, body: bytes) -> bytes:
    n = 12 + len(body)
    return struct.pack("<II", btype, n) + body + struct.pack("<I", n)


def pcapng_section_header() -> bytes:
    return _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))


def pcapng_interface(linktype: int, snaplen: int = 0) -> bytes:
    # if_tsresol = 9: timestamps in nanoseconds, so packet times survive as recorded
    opts = struct.pack("<HH", 9, 1) + _pad4(b"\x09") + struct.pack("<HH", 0, 0)
    return _block(0x00000001, struct.pack("<HHI", linktype, 0, snaplen) + opts)


def pcapng_packet(iface: int, ns: int, data: bytes, orig_len: int | None = None) -> bytes:
    """An Enhanced Packet Block; ``ns`` is nanoseconds since the epoch (if_tsresol = 9)."""
    ns = int(ns)
    body = struct.pack("<IIIII", iface, (ns >> 32) & 0xFFFFFFFF, ns & 0xFFFFFFFF, len(data),
                       len(data) if orig_len is None else orig_len) + _pad4(bytes(data))
    return _block(0x00000006, body)


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------

class _Tap:
    """A write-only file object for pyarrow that counts bytes and CRCs what passes through,
    so each Arrow message group becomes one indexed chunk without re-reading the file."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.pos = 0
        self.crc = 0
        self.closed = False

    def write(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        self.f.write(mv)
        self.crc = zlib.crc32(mv, self.crc)
        self.pos += len(mv)
        return len(mv)

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:  # pyarrow closes its sink on writer.close(); we own the file
        self.closed = True

    def tell(self) -> int:
        return self.pos

    def writable(self) -> bool:
        return True


class _ArrowStream:
    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.file = open(path, "wb")
        self.tap = _Tap(self.file)
        self.writer = ipc.new_stream(self.tap, schema)

    def write(self, rb: pa.RecordBatch) -> tuple[int, int, int]:
        start = self.tap.pos
        self.tap.crc = 0
        self.writer.write_batch(rb)
        return start, self.tap.pos - start, self.tap.crc

    def close(self) -> tuple[int, int, int]:
        start = self.tap.pos
        self.tap.crc = 0
        self.writer.close()  # end-of-stream marker
        self.file.flush()
        self.file.close()
        return start, self.tap.pos - start, self.tap.crc


class SegmentWriter:
    """Appends to one segment directory. Not thread-safe: the recorder's writer thread owns it.

    Every ``write_*`` call is one chunk: data first, then its index line, both flushed, so a
    crash leaves at most one unindexed tail chunk (readers report it and ignore it).
    """

    def __init__(self, path: str | Path, meta: Mapping[str, Any],
                 rule_texts: Sequence[tuple[str, str]] = ()) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=False)
        self.meta: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta}
        self.bytes_written = 0
        self._store_rules(rule_texts)
        self._index = open(self.path / INDEX, "w", encoding="utf-8")
        self._chunks: dict[str, int] = {}
        self._samples: _ArrowStream | None = None
        self._ticks: _ArrowStream | None = None
        self._lines: dict[str, Any] = {}
        self._pcap: Any = None
        self._ifaces: dict[int, int] = {}
        self.batches = 0
        self.counts = {"samples": 0, "batches": 0, "ticks": 0, "findings": 0, "summaries": 0, "packets": 0}
        self.t_min = np.inf
        self.t_max = -np.inf
        self.nodes: set[str] = set(self.meta.get("nodes") or [])
        self.signals: set[str] = set()
        self.closed = False
        self.write_meta(complete=False)

    # -- helpers -------------------------------------------------------------------------------
    def _store_rules(self, rule_texts: Sequence[tuple[str, str]]) -> None:
        if not rule_texts:
            return
        d = self.path / RULES_DIR
        d.mkdir()
        files = []
        for i, (orig, text) in enumerate(rule_texts):
            stored = f"{RULES_DIR}/{i:03d}-{Path(orig).name}"
            data = text.encode("utf-8")
            (self.path / stored).write_bytes(data)
            files.append({"path": orig, "stored": stored, "sha256": hashlib.sha256(data).hexdigest()})
        self.meta.setdefault("rules", {})["files"] = files
        self.bytes_written += sum(len(t.encode()) for _, t in rule_texts)

    def _index_line(self, file: str, offset: int, length: int, crc: int, **extra: Any) -> None:
        k = self._chunks.get(file, 0)
        self._chunks[file] = k + 1
        entry = {"file": file, "chunk": k, "offset": offset, "length": length, "crc32": crc, **extra}
        entry["line_crc32"] = _line_crc(entry)
        line = _canon(entry) + "\n"
        self._index.write(line)
        self._index.flush()
        self.bytes_written += length + len(line)

    def _time(self, lo: float, hi: float) -> None:
        if np.isfinite(lo):
            self.t_min = min(self.t_min, lo)
        if np.isfinite(hi):
            self.t_max = max(self.t_max, hi)

    # -- chunks --------------------------------------------------------------------------------
    def write_samples(self, batches: Sequence[SampleBatch]) -> None:
        """One chunk of whole SampleBatches, numbered on from the segment's previous batches."""
        batches = [b for b in batches]
        if not batches:
            return
        lens = np.array([len(b) for b in batches], dtype=np.int64)
        first = self.batches
        seq = np.repeat(np.arange(first, first + len(batches), dtype=np.int64), lens)
        allb = SampleBatch.concat(batches)
        self.batches += len(batches)
        self.counts["batches"] = self.batches
        if not len(allb):  # empty batches still advance the numbering (ticks refer to it)
            return
        if self._samples is None:
            self._samples = _ArrowStream(self.path / SAMPLES, SAMPLES_SCHEMA)
        cols = [pa.array(allb.t, pa.float64())]
        for c in (allb.node, allb.entity, allb.signal):
            cols.append(pa.array(c, pa.string()).dictionary_encode())
        cols += [pa.array(allb.value, pa.float64()), pa.array(seq, pa.int64())]
        rb = pa.record_batch(cols, schema=SAMPLES_SCHEMA)
        off, n, crc = self._samples.write(rb)
        self._samples.file.flush()
        lo, hi = float(np.min(allb.t)), float(np.max(allb.t))
        self._index_line(SAMPLES, off, n, crc, rows=len(allb), t_min=_finite(lo), t_max=_finite(hi),
                         batches=[first, first + len(batches)])
        self.counts["samples"] += len(allb)
        self._time(lo, hi)
        self.nodes.update(np.unique(allb.node.astype(str)).tolist())
        self.signals.update(np.unique(allb.signal.astype(str)).tolist())

    def write_ticks(self, ticks: Sequence[tuple[float, int, int]]) -> None:
        if not ticks:
            return
        if self._ticks is None:
            self._ticks = _ArrowStream(self.path / TICKS, TICKS_SCHEMA)
        t = np.array([x[0] for x in ticks], dtype=np.float64)
        rb = pa.record_batch([pa.array(t), pa.array([x[1] for x in ticks], pa.int64()),
                              pa.array([x[2] for x in ticks], pa.int32())], schema=TICKS_SCHEMA)
        off, n, crc = self._ticks.write(rb)
        self._ticks.file.flush()
        first = self.counts["ticks"]
        self._index_line(TICKS, off, n, crc, rows=len(t), t_min=float(t.min()), t_max=float(t.max()),
                         ticks=[first, first + len(t)])
        self.counts["ticks"] += len(t)
        self._time(float(t.min()), float(t.max()))

    def write_lines(self, name: str, lines: Sequence[str], times: Sequence[float] = ()) -> None:
        """Append JSON lines (findings / summaries) as one chunk."""
        if not lines:
            return
        f = self._lines.get(name)
        if f is None:
            f = self._lines[name] = open(self.path / name, "wb")
        data = "".join(line.rstrip("\n") + "\n" for line in lines).encode("utf-8")
        off = f.tell()
        f.write(data)
        f.flush()
        extra: dict[str, Any] = {"rows": len(lines)}
        if len(times):
            extra.update(t_min=_finite(min(times)), t_max=_finite(max(times)))
        self._index_line(name, off, len(data), zlib.crc32(data), **extra)
        key = "findings" if name == FINDINGS else "summaries" if name == SUMMARIES else None
        if key:
            self.counts[key] += len(lines)

    def write_packets(self, packets: Sequence[tuple[int, bytes, int | None, int]]) -> None:
        """``(ns since the epoch, data, orig_len or None, linktype)`` tuples as Enhanced Packet Blocks."""
        if not packets:
            return
        out = bytearray()
        if self._pcap is None:
            self._pcap = open(self.path / PACKETS, "wb")
            out += pcapng_section_header()
        for t, data, orig, linktype in packets:
            iface = self._ifaces.get(linktype)
            if iface is None:
                iface = self._ifaces[linktype] = len(self._ifaces)
                out += pcapng_interface(linktype)
            out += pcapng_packet(iface, t, data, orig)
        off = self._pcap.tell()
        self._pcap.write(out)
        self._pcap.flush()
        times = [p[0] / 1e9 for p in packets]
        self._index_line(PACKETS, off, len(out), zlib.crc32(out), rows=len(packets),
                         t_min=_finite(min(times)), t_max=_finite(max(times)))
        self.counts["packets"] += len(packets)
        self.meta["packets"] = {"file": PACKETS, "linktypes": sorted(self._ifaces)}

    def add_capture_file(self, src: str | Path) -> str:
        """Copy a capture file (e.g. the pkt collector's pcapng) into ``captures/``, CRC-indexed
        in 1 MiB chunks. Returns its name inside the segment."""
        src = Path(src)
        (self.path / CAPTURES_DIR).mkdir(exist_ok=True)
        name = f"{CAPTURES_DIR}/{src.name}"
        i = 1
        while (self.path / name).exists():
            name = f"{CAPTURES_DIR}/{src.stem}-{i}{src.suffix}"
            i += 1
        with open(src, "rb") as fi, open(self.path / name, "wb") as fo:
            off = 0
            while True:
                data = fi.read(_COPY_CHUNK)
                if not data:
                    break
                fo.write(data)
                fo.flush()
                self._index_line(name, off, len(data), zlib.crc32(data))
                off += len(data)
        self.meta.setdefault("captures", []).append(name)
        return name

    # -- meta ----------------------------------------------------------------------------------
    def write_meta(self, complete: bool, catalogue: Iterable[SignalSpec] | None = None, sync: bool = True) -> None:
        """Rewrite meta.json atomically (write, rename; fsync first when ``sync``): it is never
        half-written. Readers take the time range from the data when a segment is incomplete."""
        m = dict(self.meta)
        m["nodes"] = sorted(self.nodes)
        m["time_range"] = {"start": _finite(self.t_min), "end": _finite(self.t_max)}
        m["counts"] = dict(self.counts)
        m["signals"] = sorted(self.signals)
        if catalogue is not None:
            m["catalogue"] = [spec_to_dict(s) for s in sorted(catalogue, key=lambda s: s.name)]
            self.meta["catalogue"] = m["catalogue"]
        m["complete"] = complete
        tmp = self.path / (META + ".tmp")
        data = (json.dumps(m, sort_keys=True, indent=1, allow_nan=False) + "\n").encode()
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, self.path / META)
        self._meta_key = (len(self.nodes), len(self.signals))

    def meta_stale(self) -> bool:
        """True when nodes or signals appeared since meta.json was last written."""
        return getattr(self, "_meta_key", None) != (len(self.nodes), len(self.signals))

    def close(self, catalogue: Iterable[SignalSpec] | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        for name, stream in ((SAMPLES, self._samples), (TICKS, self._ticks)):
            if stream is not None:
                off, n, crc = stream.close()
                self._index_line(name, off, n, crc, eos=True)
        for f in self._lines.values():
            f.close()
        if self._pcap is not None:
            self._pcap.close()
        self._index.close()
        self.write_meta(complete=True, catalogue=catalogue)


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

@dataclass
class Chunk:
    file: str
    chunk: int
    offset: int
    length: int
    crc32: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class FileView:
    """A data file's verified prefix: ``good`` chunks are intact, ``end`` is where they stop."""

    name: str
    data: Any  # bytes-like (mmap or bytes); empty when the file is missing
    good: list[Chunk]
    end: int
    damage: Damage | None


def _entry_problem(e: dict[str, Any]) -> str:
    """What is wrong with the shape of an index entry ("" when nothing): a matching line CRC
    proves only that the line was not changed after it was written."""
    if not isinstance(e.get("file"), str) or not _indexed_name(e["file"]):
        return f"file {_kind(e.get('file'))} is not a data file of a segment"
    for k in ("chunk", "offset", "length", "crc32"):
        if not _is_int(e.get(k)):
            return f"{k} {_kind(e.get(k))} is not a non-negative integer"
    if e["crc32"] >= 1 << 32:
        return "crc32 is not a 32-bit value"
    for k in ("t_min", "t_max"):
        if e.get(k) is not None and not _is_num(e[k]):
            return f"{k} {_kind(e[k])} is not a finite time"
    for k in ("batches", "ticks"):
        v = e.get(k)
        if v is not None and not (isinstance(v, list) and len(v) == 2 and all(_is_int(x) for x in v)):
            return f"{k} {_kind(v)} is not a [first, end] pair of integers"
    if e.get("rows") is not None and not _is_int(e["rows"]):
        return f"rows {_kind(e['rows'])} is not a non-negative integer"
    return ""


def _schema_problem(got: pa.Schema, want: pa.Schema) -> str:
    """Why a stream's schema cannot be read as ``want`` ("" when it can): the same columns, of
    the same kinds (numbers as numbers, names as strings or dictionaries of strings)."""
    for f in want:
        i = got.get_field_index(f.name)
        if i < 0:
            return f"no column {f.name!r}"
        t = got.field(i).type
        if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type):
            ok = pa.types.is_string(t) or (pa.types.is_dictionary(t) and pa.types.is_string(t.value_type)
                                           and pa.types.is_integer(t.index_type))
        else:
            ok = pa.types.is_integer(t) or pa.types.is_floating(t)
        if not ok:
            return f"column {f.name!r} is {t}, expected {f.type}"
    return ""


def _str_column(arr: pa.Array) -> np.ndarray:
    return _str_codes(arr)[0]


def _str_codes(arr: pa.Array) -> tuple[np.ndarray, np.ndarray | None, int]:
    """(strings, dictionary index per row or None, dictionary size + 1). Equal indices within
    one column are equal strings, and the decoded strings are then the same objects."""
    if pa.types.is_dictionary(arr.type):
        n = len(arr.dictionary)
        d = np.array([("" if v is None else v) for v in arr.dictionary.to_pylist()] + [""], dtype=object)
        idx = arr.indices
        if idx.null_count:
            idx = idx.fill_null(n)
        idx = idx.to_numpy(zero_copy_only=False)
        return d[idx], idx, n + 1
    out = np.empty(len(arr), dtype=object)
    out[:] = [("" if v is None else v) for v in arr.to_pylist()]
    return out, None, 0


def _int_column(arr: pa.Array) -> np.ndarray:
    """An integer column as int64 (a missing or non-integer value reads as -1: never a batch)."""
    if pa.types.is_floating(arr.type) or arr.null_count:
        x = _num_column(arr)
        ok = np.isfinite(x) & (np.abs(x) < 2.0 ** 62)
        return np.where(ok, x, -1).astype(np.int64)
    return arr.to_numpy(zero_copy_only=False).astype(np.int64)


def _num_column(arr: pa.Array) -> np.ndarray:
    if arr.null_count:  # fill_null costs a pass and a copy even when there is nothing to fill
        arr = arr.fill_null(np.nan)
    return arr.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


class Segment:
    """Read access to one segment directory (see module doc). Verification is lazy and cached;
    every problem found is appended to :attr:`damage`, never raised, except when ``meta.json``
    itself is unusable (:class:`BundleError`)."""

    def __init__(self, path: str | Path, limits: BundleLimits = DEFAULT_LIMITS) -> None:
        self.path = Path(path)
        self.limits = limits
        mp = self.path / META
        try:
            with open(mp, "rb") as f:
                raw = f.read(limits.meta_bytes + 1)
        except OSError as e:
            raise BundleError(mp, None, f"cannot read segment metadata: {e.strerror or e}") from None
        if len(raw) > limits.meta_bytes:
            raise BundleError(mp, limits.meta_bytes, f"larger than {limits.meta_bytes} bytes (skewd replay --limit "
                                                     "meta_bytes=...)")
        try:
            meta = loads_bounded(raw, limits.json_depth)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BundleError(mp, getattr(e, "pos", getattr(e, "start", 0)), f"not valid JSON: {e}") from None
        except ValueError as e:
            raise BundleError(mp, 0, f"not usable JSON: {e}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise BundleError(mp, 0, f"not a skewd capture segment (format is {meta.get('format') if isinstance(meta, dict) else None!r}, "
                                     f"expected {FORMAT!r})")
        if meta.get("format_version") != FORMAT_VERSION:
            raise BundleError(mp, 0, f"capture format version {_kind(meta.get('format_version'))}; this skewd reads "
                                     f"version {FORMAT_VERSION} (use the skewd release that recorded it)")
        problems = _MetaCheck(limits).check(meta)
        if problems:
            raise BundleError(mp, 0, "not what a skewd recorder writes: " + "; ".join(problems[:5]))
        self.meta: dict[str, Any] = meta
        self.damage: list[Damage] = []
        self._index: dict[str, list[Chunk]] | None = None
        self._index_damage: Damage | None = None
        self._views: dict[str, FileView] = {}
        self._maps: list[Any] = []

    def __repr__(self) -> str:
        return f"Segment({str(self.path)!r}, nodes={self.nodes})"

    # -- meta ----------------------------------------------------------------------------------
    @property
    def nodes(self) -> list[str]:
        return list(self.meta.get("nodes") or [])

    @property
    def cluster(self) -> str:
        return str(self.meta.get("cluster") or "")

    @property
    def node_labels(self) -> dict[str, dict[str, str]]:
        return {n: dict(v) for n, v in (self.meta.get("node_labels") or {}).items()}

    @property
    def settings(self) -> dict[str, float]:
        return dict(self.meta.get("settings") or {})

    @property
    def start(self) -> float:
        tr = self.meta.get("time_range") or {}
        if tr.get("start") is not None:
            return float(tr["start"])
        t = self.ticks()[0]
        return float(t[0]) if len(t) else float("inf")

    @property
    def end(self) -> float:
        tr = self.meta.get("time_range") or {}
        return float(tr["end"]) if tr.get("end") is not None else float("-inf")

    def catalogue(self) -> list[SignalSpec]:
        return [spec_from_dict(d) for d in self.meta.get("catalogue") or []]

    def rule_files(self) -> list[Path]:
        """The rule files the agent ran, as stored in the segment (checked against their sha256)."""
        out = []
        for f in (self.meta.get("rules") or {}).get("files") or []:
            p = self.path / f["stored"]  # validated: rules/<name>, no "..", so inside the segment
            if p.is_symlink():
                raise BundleError(p, None, "stored rule file is a symbolic link (a bundle holds files)")
            try:
                with open(p, "rb") as fh:
                    data = fh.read(self.limits.line_bytes + 1)
            except OSError as e:
                raise BundleError(p, None, f"stored rule file unreadable: {e.strerror or e}") from None
            if len(data) > self.limits.line_bytes:
                raise BundleError(p, self.limits.line_bytes, "stored rule file larger than any rule file can be")
            if hashlib.sha256(data).hexdigest() != f.get("sha256"):
                raise BundleError(p, 0, "stored rule file does not match the sha256 in meta.json (corrupted)")
            out.append(p)
        return out

    # -- integrity -----------------------------------------------------------------------------
    def _note(self, d: Damage) -> Damage:
        if d not in self.damage:
            self.damage.append(d)
        return d

    def index(self) -> dict[str, list[Chunk]]:
        if self._index is not None:
            return self._index
        out: dict[str, list[Chunk]] = {}
        p = self.path / INDEX
        try:
            with open(p, "rb") as f:
                raw = f.read(self.limits.index_bytes + 1)
            if len(raw) > self.limits.index_bytes:
                raw = raw[: self.limits.index_bytes]
                self._note(Damage(str(p), self.limits.index_bytes, f"index larger than {self.limits.index_bytes} bytes "
                                                                   "(skewd replay --limit index_bytes=...); the rest "
                                                                   "is ignored"))
        except OSError as e:
            self._index_damage = self._note(Damage(str(p), 0, f"index unreadable: {e.strerror or e}; "
                                                              "no data in this segment can be verified"))
            self._index = out
            return out
        pos = 0
        while pos < len(raw):
            nl = raw.find(b"\n", pos)
            if nl < 0:
                self._index_damage = self._note(Damage(
                    str(p), pos, f"index ends in a partial line ({len(raw) - pos} bytes; recording interrupted?); "
                                 "data after the last complete entry is ignored"))
                break
            why = ""
            try:
                if nl - pos > self.limits.line_bytes:
                    raise ValueError(f"line longer than {self.limits.line_bytes} bytes")
                entry = loads_bounded(raw[pos:nl], self.limits.json_depth)
                ok = isinstance(entry, dict) and entry.get("line_crc32") == _line_crc(entry)
                if ok:
                    why = _entry_problem(entry)
                    ok = not why
            except (UnicodeDecodeError, ValueError, TypeError) as e:
                ok = False
                why = str(e)[:120]
            if not ok:
                self._index_damage = self._note(Damage(
                    str(p), pos, "index entry corrupted (" + (why or "bad JSON or line CRC32 mismatch") + "); "
                                 "data after the last good entry is ignored"))
                break
            extra = {k: v for k, v in entry.items()
                     if k not in ("file", "chunk", "offset", "length", "crc32", "line_crc32")}
            out.setdefault(entry["file"], []).append(
                Chunk(entry["file"], entry["chunk"], entry["offset"], entry["length"], entry["crc32"], extra))
            pos = nl + 1
        self._index = out
        return out

    def view(self, name: str) -> FileView:
        """Verify ``name`` chunk by chunk; the view covers the longest intact prefix."""
        v = self._views.get(name)
        if v is not None:
            return v
        chunks = self.index().get(name, [])
        p = self.path / name
        data: Any = b""
        size = 0
        if p.exists():
            try:
                if not p.is_file() or p.is_symlink():
                    raise OSError(f"{name} is not a regular file")
                size = p.stat().st_size
                if size:
                    with open(p, "rb") as f:
                        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    self._maps.append(data)
            except (OSError, ValueError) as e:
                d = self._note(Damage(str(p), 0, f"unreadable: {getattr(e, 'strerror', None) or e}"))
                v = self._views[name] = FileView(name, b"", [], 0, d)
                return v
        elif chunks:
            d = self._note(Damage(str(p), 0, f"file missing but {len(chunks)} chunks are indexed"))
            v = self._views[name] = FileView(name, b"", [], 0, d)
            return v
        good: list[Chunk] = []
        end = 0
        damage = None
        mv = memoryview(data) if size else memoryview(b"")
        for c in chunks:
            if c.offset != end:
                damage = Damage(str(p), end, f"chunk {c.chunk} indexed at byte {c.offset}, expected {end} "
                                             "(index and file disagree)")
                break
            if c.offset + c.length > size:
                damage = Damage(str(p), c.offset,
                                f"truncated: chunk {c.chunk} needs bytes {c.offset}..{c.offset + c.length} "
                                f"but the file ends at {size}")
                break
            crc = zlib.crc32(mv[c.offset:c.offset + c.length])
            if crc != c.crc32:
                damage = Damage(str(p), c.offset,
                                f"CRC32 mismatch in chunk {c.chunk} (bytes {c.offset}..{c.offset + c.length}: "
                                f"expected {c.crc32:08x}, got {crc:08x}): corrupted")
                break
            good.append(c)
            end = c.offset + c.length
        mv.release()
        if damage is None and size > end:
            why = ("not covered by the index (recording interrupted?)" if self._index_damage is None
                   else "after the damaged index entry")
            damage = Damage(str(p), end, f"{size - end} trailing bytes {why}; ignored")
        if damage is not None:
            self._note(damage)
        v = self._views[name] = FileView(name, data, good, end, damage)
        return v

    def verify(self) -> list[Damage]:
        """Check every indexed file; returns (and keeps in :attr:`damage`) what is wrong."""
        names = set(self.index())
        for n in (SAMPLES, TICKS, FINDINGS, SUMMARIES):
            if (self.path / n).exists():
                names.add(n)
        for n in sorted(names):
            self.view(n)
        try:
            self.rule_files()
        except BundleError as e:
            self._note(Damage(e.path, e.offset or 0, e.message))
        return list(self.damage)

    # -- data ----------------------------------------------------------------------------------
    def _record_batches(self, name: str) -> Iterator[pa.RecordBatch]:
        """The intact prefix's record batches. A stream Arrow cannot read, or whose schema is not
        the recorder's, is damage at the offset where reading stopped (CRCs that match prove
        only that nothing changed after the writer)."""
        v = self.view(name)
        if not v.good:
            return
        path = str(self.path / name)
        want = SAMPLES_SCHEMA if name == SAMPLES else TICKS_SCHEMA
        buf = pa.py_buffer(v.data)[: v.end]
        stream = pa.BufferReader(buf)
        try:
            reader = ipc.open_stream(stream)
            why = _schema_problem(reader.schema, want)
            if why:
                self._note(Damage(path, 0, f"Arrow schema is not a skewd {name}: {why}"))
                return
            while True:
                at = stream.tell()
                try:
                    rb = reader.read_next_batch()
                except StopIteration:
                    return
                rb.validate(full=True)  # dictionary codes in range, offsets inside the buffers
                yield rb
        except (pa.ArrowException, OSError, ValueError, IndexError, KeyError, TypeError, MemoryError) as e:
            self._note(Damage(path, locals().get("at", 0), f"Arrow stream unreadable despite valid CRCs: "
                                                           f"{type(e).__name__}: {str(e)[:200]}"))

    def readable_batches(self) -> int | None:
        """How many sample batches are intact (None: all of them). Chunks hold whole batches in
        order, so batches numbered below this are complete."""
        v = self.view(SAMPLES)
        if v.damage is None:
            return None
        return max([c.extra["batches"][1] for c in v.good if "batches" in c.extra] or [0])

    def iter_sample_chunks(self, first_batch: int = 0) -> Iterator[tuple[np.ndarray, SampleBatch, np.ndarray | None]]:
        """Per stored chunk over the intact prefix, in arrival order: (batch number per sample,
        the chunk's samples, a code per sample of its (node, entity, signal) or None). Two runs
        of samples of one chunk with equal codes have equal node, entity and signal columns:
        replay uses that to recognise a collector's batch layout without comparing strings.
        ``first_batch``: chunks holding only earlier batches are skipped undecoded (a replay's
        time slice starting inside the segment)."""
        for rb in self._record_batches(SAMPLES):
            names = rb.schema.names
            if first_batch and "batch" in names and len(rb) and \
                    rb.column(names.index("batch"))[len(rb) - 1].as_py() < first_batch:
                continue
            t = _num_column(rb.column(names.index("t")))
            node, nc, nn = _str_codes(rb.column(names.index("node")))
            ent, ec, en = _str_codes(rb.column(names.index("entity")))
            sig, sc, sn = _str_codes(rb.column(names.index("signal")))
            val = _num_column(rb.column(names.index("value")))
            seq = (_int_column(rb.column(names.index("batch")))
                   if "batch" in names else np.zeros(len(t), dtype=np.int64))
            codes = None
            if nc is not None and ec is not None and sc is not None and nn * en * sn < 1 << 62:
                codes = (nc.astype(np.int64) * en + ec) * sn + sc
            yield seq, SampleBatch(t, node, ent, sig, val), codes

    def iter_batches(self, signals: set[str] | None = None) -> Iterator[tuple[int, SampleBatch]]:
        """(batch number, SampleBatch) in arrival order over the intact prefix. ``signals``
        keeps only those signals (for reports); batch numbering is unaffected."""
        for seq, chunk, _ in self.iter_sample_chunks():
            t, node, ent, sig, val = chunk.t, chunk.node, chunk.entity, chunk.signal, chunk.value
            if signals is not None:
                keep = np.isin(sig.astype(str), list(signals))
                t, node, ent, sig, val, seq = t[keep], node[keep], ent[keep], sig[keep], val[keep], seq[keep]
            if not len(t):
                continue
            cuts = np.flatnonzero(seq[1:] != seq[:-1]) + 1
            for a, b in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(t)]))):
                yield int(seq[a]), SampleBatch(t[a:b], node[a:b], ent[a:b], sig[a:b], val[a:b])

    def samples(self, signals: set[str] | None = None) -> SampleBatch:
        return SampleBatch.concat([b for _, b in self.iter_batches(signals)])

    def ticks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(t, batches ingested before, findings raised) per evaluation, over the intact prefix."""
        ts, bs, fs = [], [], []
        for rb in self._record_batches(TICKS):
            names = rb.schema.names
            t = _num_column(rb.column(names.index("t")))
            b = _int_column(rb.column(names.index("batches")))
            ok = np.isfinite(t) & (b >= 0)  # a tick without a time or a batch count never ran
            if not ok.all():
                self._note(Damage(str(self.path / TICKS), 0, f"{int((~ok).sum())} tick row(s) without a finite time "
                                                              "or batch count; skipped"))
            ts.append(t[ok])
            bs.append(b[ok])
            fs.append(_int_column(rb.column(names.index("findings")))[ok])
        if not ts:
            return np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        return np.concatenate(ts), np.concatenate(bs), np.concatenate(fs)

    def _lines(self, name: str) -> list[dict[str, Any]]:
        v = self.view(name)
        out = []
        if not v.good:
            return out
        raw = bytes(memoryview(v.data)[: v.end])
        pos = 0
        path = str(self.path / name)
        for line in raw.split(b"\n"):
            if line.strip():
                try:
                    if len(line) > self.limits.line_bytes:
                        raise ValueError(f"line longer than {self.limits.line_bytes} bytes")
                    d = loads_bounded_lenient(line, self.limits.json_depth)
                    if not isinstance(d, dict):
                        raise ValueError(f"a JSON {type(d).__name__}, not an object")
                    out.append(d)
                except (UnicodeDecodeError, ValueError) as e:
                    self._note(Damage(path, pos, f"line is not a JSON object despite a valid CRC: {str(e)[:200]}"))
                    break
            pos += len(line) + 1
        return out

    def findings(self) -> list[dict[str, Any]]:
        """The transitions the live agent raised (``Finding.to_dict`` form)."""
        return self._lines(FINDINGS)

    def summaries(self) -> list[dict[str, Any]]:
        """The node summaries the live agent reported (``skewd.wire.to_dict`` form); a line
        without a finite time and a node name is damage, and reading stops there."""
        out = self._lines(SUMMARIES)
        for i, d in enumerate(out):
            if not (_is_num(d.get("t")) and isinstance(d.get("node"), str) and len(d["node"]) <= self.limits.text):
                self._note(Damage(str(self.path / SUMMARIES), 0, f"summary line {i + 1} has no finite t or no node "
                                                                  "name; summaries after it are ignored"))
                return out[:i]
        return out

    def readable_until(self, name: str) -> float:
        """Time from which a file's content is lost (inf when intact)."""
        v = self.view(name)
        if v.damage is None:
            return float("inf")
        bad = self.index().get(name, [])[len(v.good):]
        if bad and bad[0].extra.get("t_min") is not None:
            return float(bad[0].extra["t_min"])
        good_t = [c.extra.get("t_max") for c in v.good if c.extra.get("t_max") is not None]
        return float(max(good_t)) if good_t else float("-inf")

    def close(self) -> None:
        for m in self._maps:
            try:
                m.close()
            except BufferError:  # an Arrow buffer still points into it; the GC will unmap it
                pass
        self._maps.clear()
        self._views.clear()


def is_segment(path: Path) -> bool:
    return (path / META).is_file()


def find_segments(paths: Iterable[str | Path], depth: int = 3) -> list[Path]:
    """Segment directories under each path (a segment, a bundle of segments, or a directory
    of per-node bundles), in a stable order. Raises BundleError for a path with none."""
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise BundleError(p, None, "no such file or directory")
        found: list[Path] = []

        def walk(d: Path, left: int) -> None:
            if is_segment(d):
                found.append(d)
                return
            if left <= 0:
                return
            try:
                subs = sorted(x for x in d.iterdir() if x.is_dir())
            except OSError:
                return
            for s in subs:
                walk(s, left - 1)

        if p.is_dir():
            walk(p, depth)
        if not found:
            raise BundleError(p, None, f"no capture segment (a directory with {META}) found here")
        out += [f for f in found if f not in out]
    return out


def segment_dirs(bundle: str | Path) -> list[Path]:
    """This recorder's own segment directories in a bundle, oldest first."""
    b = Path(bundle)
    if not b.is_dir():
        return []
    return sorted(d for d in b.iterdir() if d.is_dir() and d.name.startswith("seg-") and d.name[4:].isdigit())


def remove_segment(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
