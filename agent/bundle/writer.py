"""Writing a segment: every append is one CRC-indexed chunk, so a crash loses at most the chunk in flight.

The recorder's writer thread owns a :class:`SegmentWriter`; it also names and prunes its own
segment directories (:func:`segment_dirs`, :func:`remove_segment`) when it rotates. Arrow data
passes through a tap that CRCs bytes on their way to the file, so sealing a chunk never re-reads it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from skewd.model import SampleBatch, SignalSpec

from .format import (CAPTURES_DIR, FINDINGS, FORMAT, FORMAT_VERSION, INDEX, META, PACKETS, RULES_DIR, SAMPLES,
                     SAMPLES_SCHEMA, SUMMARIES, TICKS, TICKS_SCHEMA, canon, crc32, finite, line_crc, spec_to_dict)
from .pcapng import pcapng_interface, pcapng_packet, pcapng_section_header

_COPY_CHUNK = 1 << 20


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
        self.crc = crc32(mv, self.crc)
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
        entry["line_crc32"] = line_crc(entry)
        line = canon(entry) + "\n"
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
        self._index_line(SAMPLES, off, n, crc, rows=len(allb), t_min=finite(lo), t_max=finite(hi),
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
            extra.update(t_min=finite(min(times)), t_max=finite(max(times)))
        self._index_line(name, off, len(data), crc32(data), **extra)
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
        self._index_line(PACKETS, off, len(out), crc32(out), rows=len(packets),
                         t_min=finite(min(times)), t_max=finite(max(times)))
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
                self._index_line(name, off, len(data), crc32(data))
                off += len(data)
        self.meta.setdefault("captures", []).append(name)
        return name

    # -- meta ----------------------------------------------------------------------------------
    def write_meta(self, complete: bool, catalogue: Iterable[SignalSpec] | None = None, sync: bool = True) -> None:
        """Rewrite meta.json atomically (write, rename; fsync first when ``sync``): it is never
        half-written. Readers take the time range from the data when a segment is incomplete."""
        m = dict(self.meta)
        m["nodes"] = sorted(self.nodes)
        m["time_range"] = {"start": finite(self.t_min), "end": finite(self.t_max)}
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


def segment_dirs(bundle: str | Path) -> list[Path]:
    """This recorder's own segment directories in a bundle, oldest first."""
    b = Path(bundle)
    if not b.is_dir():
        return []
    return sorted(d for d in b.iterdir() if d.is_dir() and d.name.startswith("seg-") and d.name[4:].isdigit())


def remove_segment(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
