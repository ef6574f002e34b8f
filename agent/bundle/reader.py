"""Reading a segment: verify chunks in order, report damage with file and byte offset, hand out data.

Arrow IPC and JSON lines carry no checksums, and a post-mortem tool must not silently evaluate
rules over flipped bits. :class:`Segment` checks each data file chunk by chunk against
``index.jsonl`` and stops a file at the first chunk that is missing, short or fails its CRC;
earlier chunks stay usable because every file is append-only. Each problem is a
:class:`Damage` (file, byte offset, what), never an exception, except a ``meta.json`` that
cannot be used at all (:class:`BundleError`).
"""
from __future__ import annotations

import hashlib
import json
import mmap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from skewd.model import SampleBatch, SignalSpec

from .columns import NameColumn, int_column, name_column, num_column, same_indices
from .format import (FINDINGS, FORMAT, FORMAT_VERSION, INDEX, META, SAMPLES, SAMPLES_SCHEMA, SUMMARIES, TICKS,
                     TICKS_SCHEMA, crc32, line_crc, raw_line_crc_ok, spec_from_dict)
from .validate import (DEFAULT_LIMITS, BundleLimits, MetaCheck, describe, entry_problem, is_num, loads_bounded,
                       loads_bounded_lenient, schema_problem)


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


@dataclass
class SampleColumns:
    """One stored chunk of samples: batch number, time and value per sample as numpy arrays, and
    the node, entity and signal columns undecoded (decoding every row's names is most of the cost
    of reading a chunk, and replay needs them once per collector layout)."""

    seq: np.ndarray
    t: np.ndarray
    value: np.ndarray
    node: NameColumn
    entity: NameColumn
    signal: NameColumn

    def codes(self) -> np.ndarray | None:
        """A code per sample of its (node, entity, signal), equal codes meaning equal names
        (None for plain string columns, or dictionaries too large to combine)."""
        nc, ec, sc = self.node, self.entity, self.signal
        if nc.codes is None or ec.codes is None or sc.codes is None or nc.size * ec.size * sc.size >= 1 << 62:
            return None
        return (nc.codes.astype(np.int64) * ec.size + ec.codes) * sc.size + sc.codes


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
            raise BundleError(mp, 0, f"capture format version {describe(meta.get('format_version'))}; this skewd reads "
                                     f"version {FORMAT_VERSION} (use the skewd release that recorded it)")
        problems = MetaCheck(limits).check(meta)
        if problems:
            raise BundleError(mp, 0, "not what a skewd recorder writes: " + "; ".join(problems[:5]))
        self.meta: dict[str, Any] = meta
        self.damage: list[Damage] = []
        self._index: dict[str, list[Chunk]] | None = None
        self._index_damage: Damage | None = None
        self._views: dict[str, FileView] = {}
        self._maps: list[Any] = []
        self._trusted_below = 0  # see trust_samples_below
        self._tick_index: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # see ticks

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
                line = raw[pos:nl]
                entry = loads_bounded(line, self.limits.json_depth)
                ok = isinstance(entry, dict) and (raw_line_crc_ok(line) or entry.get("line_crc32") == line_crc(entry))
                if ok:
                    why = entry_problem(entry)
                    ok = not why
            except (UnicodeDecodeError, ValueError, TypeError) as e:
                ok = False
                why = str(e)[:120]
            if not ok:
                self._index_damage = self._note(Damage(
                    str(p), pos, "index entry corrupted (" + (why or "bad JSON or line CRC32 mismatch") + "); "
                                 "data after the last good entry is ignored"))
                break
            extra = {k: v for k, v in entry.items()  # a null field (batches: null) reads as absent
                     if k not in ("file", "chunk", "offset", "length", "crc32", "line_crc32") and v is not None}
            out.setdefault(entry["file"], []).append(
                Chunk(entry["file"], entry["chunk"], entry["offset"], entry["length"], entry["crc32"], extra))
            pos = nl + 1
        self._index = out
        return out

    def trust_samples_below(self, batch: int) -> None:
        """Skip the CRC32 of the samples chunks that hold only batches numbered below ``batch``
        (their offsets and lengths are still checked). For a replay time slice in a worker
        process (agent/replay/slices.py): it never decodes those chunks, and its events are used
        only when the process that verified the whole file reached the slice's start with the same
        state. Call before anything reads the samples; a CRC costs 0.4 s per GB (~20 s for a day)."""
        if SAMPLES not in self._views:
            self._trusted_below = max(0, int(batch))

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
            if name == SAMPLES and c.extra.get("batches", (0, 1 << 63))[1] <= self._trusted_below:
                good.append(c)  # see trust_samples_below
                end = c.offset + c.length
                continue
            crc = crc32(mv[c.offset:c.offset + c.length])
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
        seen: dict[int, tuple[int, pa.Array]] = {}
        try:
            reader = ipc.open_stream(stream)
            why = schema_problem(reader.schema, want)
            if why:
                self._note(Damage(path, 0, f"Arrow schema is not a skewd {name}: {why}"))
                return
            while True:
                at = stream.tell()
                try:
                    rb = reader.read_next_batch()
                except StopIteration:
                    return
                _validate(rb, seen)  # dictionary codes in range, offsets inside the buffers
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

    def iter_sample_columns(self, first_batch: int = 0) -> Iterator[SampleColumns]:
        """Per stored chunk over the intact prefix, in arrival order, its columns with the names
        not yet decoded (:class:`SampleColumns`). ``first_batch``: chunks holding only earlier
        batches are skipped undecoded (a replay's time slice starting inside the segment)."""
        prev: SampleColumns | None = None
        for rb in self._record_batches(SAMPLES):
            names = rb.schema.names
            if first_batch and "batch" in names and len(rb) and \
                    rb.column(names.index("batch"))[len(rb) - 1].as_py() < first_batch:
                continue
            t = num_column(rb.column(names.index("t")))
            seq = (int_column(rb.column(names.index("batch")))
                   if "batch" in names else np.zeros(len(t), dtype=np.int64))
            prev = SampleColumns(seq, t, num_column(rb.column(names.index("value"))),
                                 name_column(rb.column(names.index("node")), prev and prev.node),
                                 name_column(rb.column(names.index("entity")), prev and prev.entity),
                                 name_column(rb.column(names.index("signal")), prev and prev.signal))
            yield prev

    def iter_sample_chunks(self, first_batch: int = 0) -> Iterator[tuple[np.ndarray, SampleBatch, np.ndarray | None]]:
        """Per stored chunk over the intact prefix, in arrival order: (batch number per sample,
        the chunk's samples, a code per sample of its (node, entity, signal) or None). Two runs
        of samples of one chunk with equal codes have equal node, entity and signal columns.
        ``first_batch``: as for :meth:`iter_sample_columns`."""
        for c in self.iter_sample_columns(first_batch):
            yield c.seq, SampleBatch(c.t, c.node.strings(), c.entity.strings(), c.signal.strings(), c.value), c.codes()

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
        """(t, batches ingested before, findings raised) per evaluation, over the intact prefix.
        Read once (replay asks for them when slicing, scheduling and stepping); the arrays are
        read-only."""
        if self._tick_index is None:
            out = self._read_ticks_whole()
            if out is None:
                out = self._read_ticks()
            for a in out:
                a.flags.writeable = False
            self._tick_index = out
        return self._tick_index

    def adopt_ticks(self, t: np.ndarray, batches: np.ndarray, findings: np.ndarray) -> None:
        """Use a tick index another process of the same replay read from this segment (a time
        slice's worker, agent/replay/slices.py: the replay process read and verified it, and a
        day's index costs seconds to read again). Call before :meth:`ticks`."""
        if self._tick_index is None:
            out = (np.asarray(t, dtype=np.float64), np.asarray(batches, dtype=np.int64),
                   np.asarray(findings, dtype=np.int64))
            for a in out:
                a.flags.writeable = False
            self._tick_index = out

    def _read_ticks_whole(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`_read_ticks` in one read of the stream (a tick per record batch, thousands an
        hour, made reading them one by one cost 15 us each); None when anything is unusual
        (damage, a wrong schema, a row to skip), left to :meth:`_read_ticks` to report."""
        v = self.view(TICKS)
        if not v.good:
            return np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        try:
            reader = ipc.open_stream(pa.BufferReader(pa.py_buffer(v.data)[: v.end]))
            if schema_problem(reader.schema, TICKS_SCHEMA):
                return None
            table = reader.read_all()
            table.validate(full=True)
            cols = [table.column(n).combine_chunks() if table.num_rows else None for n in ("t", "batches", "findings")]
        except (pa.ArrowException, OSError, ValueError, IndexError, KeyError, TypeError, MemoryError):
            return None
        if not table.num_rows:
            return np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        t, b, f = num_column(cols[0]), int_column(cols[1]), int_column(cols[2])
        if not (np.isfinite(t) & (b >= 0)).all():
            return None
        return t, b, f

    def _read_ticks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ts, bs, fs = [], [], []
        for rb in self._record_batches(TICKS):
            names = rb.schema.names
            t = num_column(rb.column(names.index("t")))
            b = int_column(rb.column(names.index("batches")))
            ok = np.isfinite(t) & (b >= 0)  # a tick without a time or a batch count never ran
            if not ok.all():
                self._note(Damage(str(self.path / TICKS), 0, f"{int((~ok).sum())} tick row(s) without a finite time "
                                                              "or batch count; skipped"))
            ts.append(t[ok])
            bs.append(b[ok])
            fs.append(int_column(rb.column(names.index("findings")))[ok])
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
            if not (is_num(d.get("t")) and isinstance(d.get("node"), str) and len(d["node"]) <= self.limits.text):
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


def _validate(rb: pa.RecordBatch, seen: dict[int, tuple[int, pa.Array]]) -> None:
    """``rb.validate(full=True)`` (raises on a malformed batch), without checking again the
    codes of a dictionary column whose codes repeat, byte for byte, those of an earlier batch of
    the stream checked against a dictionary of the same size. A recorder writes the same
    collections in the same order every chunk, and the full check of three code columns was
    ~70 us of a chunk's ~370 (a chunk a second). ``seen``: per column, the dictionary size and
    codes last checked in full. Every dictionary itself (offsets, UTF-8) is checked in full."""
    rb.validate()  # lengths and buffer sizes, so the codes' bytes can be compared
    for i in range(rb.num_columns):
        col = rb.column(i)
        if not pa.types.is_dictionary(col.type):
            col.validate(full=True)
            continue
        dic = col.dictionary
        dic.validate(full=True)
        idx = col.indices
        got = seen.get(i)
        if got is not None and got[0] == len(dic) and same_indices(idx, got[1]):
            continue
        col.validate(full=True)
        if not idx.null_count:
            seen[i] = (len(dic), idx)


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
