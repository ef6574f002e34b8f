"""Window columns of the store's slabs, found once per node and tick (the controller's store).

The controller's window store holds one block per (summary signal, node), and the blocks a
node's summaries fill together are one slab (:class:`~skewd.rules.store.WindowStore`'s
``node_slabs``): one time axis, one value matrix with a row per block. A window function over a
summary signal found its columns in each of its 1,000 blocks (``Block.window``: two bisections
and two views, ~0.8 us) and then stacked the blocks' windows for one reduction
(:func:`skewd.rules.windows._stacked`, ~1.5 us a block of Python bookkeeping): ~20 ms of the
group rules' ~36 ms a tick at 1,000 nodes. Every signal of one slab shares its columns, so
:class:`SlabWindows` finds a slab's columns once per tick and window (however many signals of it
the rules read) and takes a block's window as one row slice of the slab's matrix; the rows of
equal width are stacked with one call (in cache-sized pieces when they are many and wide).

The values are the very ones ``Block.window`` gives (the same bisection over the same times,
the same cells), and a stacked kernel's value is taken only for a window without a missing
sample, where the kernel itself returns its dense per-row value (windows.py's contract), so
every result is the per-block one, bit for bit; tests/rules/test_slab_windows.py compares them.
A block outside a slab (a new node's, one whose slab was undone) is read as before.
"""
from __future__ import annotations

from bisect import bisect_right
from operator import is_
from typing import Any, Callable, Iterator

import numpy as np

from . import functions

_NAN = np.nan


class _Plan:
    """One signal's blocks in the store's order, the slab (or None) and slab row of each, and
    each block's first value position (block row order, as the kernels' results are kept)."""

    __slots__ = ("version", "blocks", "slabs", "rows", "starts", "total", "slabbed", "alone", "pos", "dest")

    def __init__(self, version: int, blocks: list, slabs: list) -> None:
        self.version, self.blocks, self.slabs = version, blocks, slabs
        row_of: dict[int, dict[int, int]] = {}
        rows = []
        for b, sl in zip(blocks, slabs):
            if sl is None:
                rows.append(-1)
                continue
            m = row_of.get(id(sl))
            if m is None:
                m = row_of[id(sl)] = {id(x): i for i, x in enumerate(sl.blocks)}
            rows.append(m[id(b)])
        self.rows = rows
        sizes = [1 if sl is not None else b.nrows for b, sl in zip(blocks, slabs)]  # a slab's block: one row
        self.starts = (np.cumsum(sizes) - sizes).tolist()
        self.total = int(sum(sizes))
        self.slabbed = [(i, sl, r) for i, (sl, r) in enumerate(zip(slabs, rows)) if sl is not None]
        self.alone = [i for i, sl in enumerate(slabs) if sl is None]
        self.pos = np.array([i for i, _, _ in self.slabbed], dtype=np.int64)  # the slab blocks
        self.dest = np.array(self.starts, dtype=np.int64)[self.pos]  # their value positions


class SlabWindows:
    """Per signal, which of its blocks sit in which slab (kept while the store's shape and the
    slabs stay); per tick, each slab's window columns. Owned by the
    :class:`~skewd.rules.engine.Engine`, read by :func:`skewd.rules.windows.window_vec`."""

    def __init__(self) -> None:
        self._plans: dict[str, _Plan] = {}

    def plan(self, store: Any, sig: str) -> _Plan | None:
        """The signal's plan at the store's present state; None when no block is in a slab."""
        blocks = list(store.signal_blocks(sig))
        slabs = [b.slab for b in blocks]
        p = self._plans.get(sig)
        if p is None or p.version != store.version or len(p.blocks) != len(blocks) \
                or not all(map(is_, p.slabs, slabs)) or not all(map(is_, p.blocks, blocks)):
            p = self._plans[sig] = _Plan(store.version, blocks, slabs)
        return p if p.slabbed else None

    @staticmethod
    def _columns(p: _Plan, start: float, end: float, memo: dict) -> tuple[dict, list]:
        """Each slab's window columns and values, id(slab) → (lo, hi, values[:, lo:hi]) as
        ``Block.window`` finds them (start < t <= end), found once per tick and window; and the
        window of each of the plan's slab blocks (a row of those values)."""
        key = ("slab columns", start, end)
        cols = memo.get(key)
        if cols is None:
            cols = memo[key] = {}
        get = cols.get
        views = []
        for _, sl, r in p.slabbed:
            c = get(id(sl))
            if c is None:  # Block.window's bisection (inline: ~1,000 slabs a window and tick)
                times, n = sl.times, sl.n
                tv = sl.blocks[0].times_view
                if tv is None or tv.obj is not times:
                    tv = memoryview(times)
                lo = bisect_right(tv, start, 0, n)
                hi = n if not n or end >= tv[n - 1] else bisect_right(tv, end, lo, n)
                c = cols[id(sl)] = (lo, hi, sl.data[:, lo:hi])
            views.append(c[2][r])
        return cols, views

    def slices(self, store: Any, sig: str, start: float, end: float, memo: dict) -> list | None:
        """``[blk.window(start, end) for blk in store.signal_blocks(sig)]`` (the same views'
        values and shapes), with each slab's columns found once per tick; None: no slab."""
        p = self.plan(store, sig)
        if p is None:
            return None
        cols, views = self._columns(p, start, end, memo)
        out: list = [None] * len(p.blocks)
        for i, sl, r in p.slabbed:
            c = cols[id(sl)]
            out[i] = (sl.times[c[0]:c[1]], c[2][r: r + 1])
        for i in p.alone:
            out[i] = p.blocks[i].window(start, end)
        return out

    def stacked(self, store: Any, sig: str, start: float, end: float, memo: dict, dense: Callable,
                kernel: Callable) -> np.ndarray | None:
        """``kernel`` over every block's window, in block row order (what
        :func:`~skewd.rules.windows._stacked` gives): ``dense`` (a per-row reduction equal to the
        kernel's value for a window without NaN) over the slab windows of equal width stacked
        into one matrix (or, when they are many and wide, a few: :func:`_pieces`); a window
        with a NaN value, an empty one and a block outside a slab take the kernel alone. None:
        no slab."""
        p = self.plan(store, sig)
        if p is None:
            return None
        cols, views = self._columns(p, start, end, memo)
        out = np.empty(p.total)
        starts = p.starts
        alone = list(p.alone)
        pos, dest_all = p.pos, p.dest
        for js, M in _pieces(views):  # (M is reused: each piece is used up before the next)
            if not M.shape[1]:
                alone += pos[js].tolist()
                continue
            v = dense(M)
            out[dest_all[js]] = v
            if functions.has_nan(v):  # those blocks: their own kernel's exact path
                alone += pos[js[np.isnan(v)]].tolist()
        blocks, slabs, rows = p.blocks, p.slabs, p.rows
        for i in alone:
            sl = slabs[i]
            if sl is None:
                t, W = blocks[i].window(start, end)
                out[starts[i]: starts[i] + W.shape[0]] = np.asarray(kernel(t, W), dtype=float)
            else:
                lo, hi, V = cols[id(sl)]
                r = rows[i]
                out[starts[i]] = np.asarray(kernel(sl.times[lo:hi], V[r: r + 1]), dtype=float)[0]
        return out


#: the stacked windows are reduced in pieces of at most this many bytes, copied into one buffer
#: that stays in the core's cache: one window matrix of a signal can be megabytes (125 nodes x
#: 1 min at 70 summaries/s: 4 MB), and a fresh matrix per window function wrote all of it to new
#: memory and read it back, which on a core shared with NATS and other workers made stacking the
#: largest part of the group rules (bench/controller_ingest.py; docs/benchmarks.md)
STACK_PIECE_BYTES = 1 << 18


def _pieces(views: list[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The windows ``views`` (1-D float64 rows) stacked by width: (their positions, the
    matrix of their rows). When a width's windows take more than :data:`STACK_PIECE_BYTES`,
    in pieces of as many rows as fit (at least one) that share one buffer, made for this call:
    a piece is valid until the next is asked for. A dense reduction is per row, so its values
    are the same whatever rows are stacked together."""
    n = len(views)
    if not n:
        return
    ks = np.fromiter(map(len, views), dtype=np.int64, count=n)
    if ks.min() == ks.max():  # the common case: every window as wide
        groups = [(np.arange(n), int(ks[0]))]
    else:  # windows of several widths (a node's summary late or missing)
        by_k: dict[int, list[int]] = {}
        for j, k in enumerate(ks.tolist()):
            by_k.setdefault(k, []).append(j)
        groups = [(np.array(js), k) for k, js in by_k.items()]
    buf = None
    for js, k in groups:
        rows_of = views if len(groups) == 1 else [views[j] for j in js.tolist()]
        rows = max(1, STACK_PIECE_BYTES // (views[0].itemsize * k)) if k else len(js)
        if rows >= len(js):
            yield js, np.concatenate(rows_of).reshape(len(js), k)
            continue
        if buf is None or buf.shape[0] < rows * k:
            buf = np.empty(rows * k)
        for a in range(0, len(js), rows):
            m = min(rows, len(js) - a)
            yield js[a: a + m], np.concatenate(rows_of[a: a + m], out=buf[: m * k]).reshape(m, k)


def quantile_dense(kernel: Callable) -> Callable:
    """A dense form of a ``quantile`` kernel for :meth:`SlabWindows.stacked`: its value for the
    rows without a missing sample (a per-row sort and pick, ``functions.quantile``'s dense path,
    whatever other rows are stacked with them; the times are not read), NaN for the others."""

    def dense(W: np.ndarray) -> np.ndarray:
        v = np.asarray(kernel(None, W), dtype=float)
        bad = np.isnan(W)
        if functions.count_nonzero(bad):
            v = v.copy()
            v[bad.any(axis=1)] = _NAN
        return v

    return dense
