"""Replay's source: one segment's stored chunks, cut into the batches due before each tick, in bulk.

Why in bulk: a recording at 10 Hz holds about a hundred SampleBatches a second, and one Python
object per batch (decoding its names, routing it, the store recognising its layout) cost more
than evaluating the rules. So a stored chunk is decoded once: its batches are cut with numpy
and grouped by *shape* (equal node, entity and signal codes: one collector's collection), the
names of a shape are decoded once, and the values of a shape's collections become one matrix,
a row per collection. :mod:`.ahead` hands the store such matrices for many ticks at once.

A chunk whose batches are not all plain collections (several nodes in the chunk, several
timestamps in a batch, names stored without dictionary codes) still comes out batch by batch
as SampleBatches, exactly as before. Shapes keep their column arrays from chunk to chunk while
the chunks' dictionaries are equal, so the store recognises a layout by identity
(``WindowStore.ingest_many``'s ``shared_columns``): equal arrays hold equal strings.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa

from skewd.model import SampleBatch

from .. import bundle
from ..bundle.reader import SampleColumns


class Shape:
    """One collection layout of a segment: its (node, entity, signal) arrays, shared by every
    batch of that layout (never modified: the store may keep them)."""

    __slots__ = ("node", "entity", "signal")

    def __init__(self, node: np.ndarray, entity: np.ndarray, signal: np.ndarray) -> None:
        self.node = node
        self.entity = entity
        self.signal = signal


class _Structure:
    """How a chunk is cut: its batches, its one node, its shapes and where their samples sit.
    Consecutive chunks of a steady recording have the same structure (the same collections in
    the same order), so the feed works it out once and checks it against each chunk's codes."""

    def __init__(self, cols: SampleColumns, shapes: dict[bytes, Shape]) -> None:
        seq = cols.seq
        self.rel = seq - seq[0]  # batch numbers relative to the chunk's first
        self.node_codes = cols.node.codes
        self.entity_codes = cols.entity.codes
        self.signal_codes = cols.signal.codes
        cuts = np.flatnonzero(seq[1:] != seq[:-1]) + 1
        self.starts = np.concatenate(([0], cuts)).astype(np.int64)
        self.ends = np.concatenate((cuts, [len(seq)])).astype(np.int64)
        self.nums = self.rel[self.starts]
        self.monotonic = bool((self.nums[1:] > self.nums[:-1]).all())
        self._inner: np.ndarray | None = None  # per sample from the second: not a batch's first (one_time)
        self.one_node: str | None = None
        nc = cols.node
        if nc.codes is not None:
            if bool((nc.codes == nc.codes[0]).all()):
                self.one_node = str(nc.names[nc.codes[0]])
        else:
            node = nc.strings()
            if bool((node == node[0]).all()):
                self.one_node = str(node[0])
        self.codes = cols.codes()
        self.shapes = shapes
        #: (shape, positions of its batches, their first samples, [batches, samples] sample indices)
        self.parts: list[tuple[Shape, np.ndarray, np.ndarray, np.ndarray]] = []
        if self.codes is None or self.one_node is None:
            return
        lens = self.ends - self.starts
        for L in np.unique(lens).tolist():
            sel = np.flatnonzero(lens == L)
            at = self.starts[sel]
            m = self.codes[at[:, None] + np.arange(L)]
            left = np.arange(len(sel))
            while len(left):
                rep = m[left[0]]
                same = (m[left] == rep).all(axis=1)
                mine = left[same]
                left = left[~same]
                rows = at[mine]
                self.parts.append((self.shape(cols, rep, int(rows[0]), L), sel[mine], rows,
                                   rows[:, None] + np.arange(L)))

    def one_time(self, t: np.ndarray) -> bool:
        """Whether every batch's samples share one time that is not NaN: ``(t ==
        t[first_of]).all()`` without gathering a copy of ``t`` (no time changes inside a batch;
        NaN differs from itself, so a NaN inside a batch is a change, and one at a batch's
        start is caught by the check of the starts)."""
        if self._inner is None:
            inner = np.ones(len(t), dtype=bool)
            inner[self.starts] = False
            self._inner = inner[1:]
        if np.isnan(t[self.starts]).any():
            return False
        return not bool(((t[1:] != t[:-1]) & self._inner).any())

    def shape(self, cols: SampleColumns, rep: np.ndarray, a: int, n: int) -> Shape:
        key = rep.tobytes()
        s = self.shapes.get(key)
        if s is None:
            s = self.shapes[key] = Shape(cols.node.strings(slice(a, a + n)), cols.entity.strings(slice(a, a + n)),
                                         cols.signal.strings(slice(a, a + n)))
        return s

    def fits(self, cols: SampleColumns, shapes: dict[bytes, Shape]) -> bool:
        """Whether ``cols`` (a chunk read with the same dictionaries) is cut the same way."""
        return (shapes is self.shapes and len(cols.seq) == len(self.rel)
                and _same(cols.node.codes, self.node_codes) and _same(cols.entity.codes, self.entity_codes)
                and _same(cols.signal.codes, self.signal_codes)
                and _same(cols.seq - cols.seq[0], self.rel))


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    """Equal arrays, compared as bytes when they allow it (a memcmp: ~1 us against ~12 for
    ``np.array_equal`` on a chunk's 15,000 codes; run for three columns of every chunk)."""
    if a is None or b is None:
        return False
    if a.dtype == b.dtype and a.shape == b.shape and a.flags.c_contiguous and b.flags.c_contiguous \
            and a.dtype.kind in "iu":
        return pa.py_buffer(a).equals(pa.py_buffer(b))
    return bool(np.array_equal(a, b))


class Chunk:
    """A decoded stored chunk: its batches (positions ``0..len(nums)``, batch numbers ``nums``),
    and, when every batch is a plain one-node, one-timestamp collection with dictionary codes
    (``fast``), per shape the positions of its batches, their times and their values as a
    matrix (a row per collection)."""

    def __init__(self, cols: SampleColumns, st: _Structure) -> None:
        self.cols = cols
        self.st = st
        self.starts, self.ends, self.monotonic, self.one_node = st.starts, st.ends, st.monotonic, st.one_node
        self.nums = st.nums + cols.seq[0]
        self.fast = False
        #: (shape, positions of its batches, their times, values [collections, samples])
        self.parts: list[tuple[Shape, np.ndarray, np.ndarray, np.ndarray]] = []
        t = cols.t
        if not st.parts or not st.one_time(t):  # NaN times too: batch by batch
            return
        self.fast = True
        v = cols.value
        self.parts = [(shape, pos, t[rows], v[idx]) for shape, pos, rows, idx in st.parts]

    def collections(self, i0: int, i1: int) -> list[tuple[Shape, np.ndarray, np.ndarray]]:
        """(shape, times, values) of the batches at positions ``i0..i1`` of a ``fast`` chunk,
        grouped by shape (the order between shapes is not kept: see :mod:`.ahead`)."""
        out = []
        for shape, pos, ts, vals in self.parts:
            r0, r1 = np.searchsorted(pos, [i0, i1]).tolist()
            if r1 > r0:
                out.append((shape, ts[r0:r1], vals[r0:r1]))
        return out

    def batches(self, i0: int, i1: int, nodes: set[str] | None) -> Iterator[tuple[str, SampleBatch]]:
        """(node, SampleBatch) of the batches at positions ``i0..i1`` in arrival order, a batch
        of several nodes split per node (first appearance first); ``nodes``: only these."""
        c = self.cols
        codes = self.st.codes
        for p in range(i0, i1):
            a, b = int(self.starts[p]), int(self.ends[p])
            if codes is not None:
                s = self.st.shape(c, codes[a:b], a, b - a)
                cols = (s.node, s.entity, s.signal)
            else:
                cols = (c.node.strings(slice(a, b)), c.entity.strings(slice(a, b)), c.signal.strings(slice(a, b)))
            batch = SampleBatch(c.t[a:b], cols[0], cols[1], cols[2], c.value[a:b])
            if self.one_node is not None:
                if nodes is None or self.one_node in nodes:
                    yield self.one_node, batch
                continue
            nd = batch.node
            first = nd[0]
            if (nd == first).all():
                if nodes is None or first in nodes:
                    yield str(first), batch
                continue
            for n_ in dict.fromkeys(nd.tolist()):
                if nodes is None or n_ in nodes:
                    yield str(n_), batch.select(nd == n_)


class SegmentFeed:
    """Pulls one segment's batches in order up to a batch number, as (chunk, first position,
    end position) pieces of decoded chunks."""

    def __init__(self, seg: bundle.Segment, nodes: set[str] | None, start: int = 0) -> None:
        """``start``: the first batch number delivered; earlier ones are skipped (a time slice's
        warm-up begins inside the segment), whole stored chunks below it without decoding."""
        self.seg = seg
        self.chunks = seg.iter_sample_columns(first_batch=start)
        self.nodes = nodes
        self.start = start
        self.done = start
        self._chunk: Chunk | None = None
        self._pos = 0
        self._dicts: tuple | None = None
        self._shapes: dict[bytes, Shape] = {}
        self._structure: _Structure | None = None

    def _load(self) -> bool:
        for cols in self.chunks:
            if not len(cols.seq) or int(cols.seq[-1]) < self.start:
                continue
            d = (cols.node.dictionary, cols.entity.dictionary, cols.signal.dictionary)
            if self._dicts is None or any(x is None or y is None or not x.equals(y) for x, y in zip(d, self._dicts)):
                self._shapes = {}  # codes mean other names now
            self._dicts = d
            st = self._structure
            if st is None or not st.fits(cols, self._shapes):
                st = self._structure = _Structure(cols, self._shapes)
            ch = self._chunk = Chunk(cols, st)
            self._pos = 0
            nums = ch.nums
            while self._pos < len(nums) and int(nums[self._pos]) < self.start:
                self._pos += 1
            return True
        self._chunk = None
        return False

    def until(self, n: int) -> list[tuple[Chunk, int, int]]:
        """The batches numbered below ``n`` not delivered yet (arrival order stops at the first
        batch numbered ``n`` or more)."""
        out = []
        while True:
            ch = self._chunk
            if ch is None or self._pos == len(ch.nums):
                if not self._load():
                    return out
                ch = self._chunk
                assert ch is not None
            nums = ch.nums
            p = self._pos
            if ch.monotonic:  # the first batch numbered n or more, by bisection
                e = max(p, int(np.searchsorted(nums, n, "left")))
            else:
                e = p
                while e < len(nums) and int(nums[e]) < n:
                    e += 1
            if e > p:
                out.append((ch, p, e))
                self._pos = e
                self.done = int(nums[e - 1]) + 1
            if e < len(nums):
                return out
