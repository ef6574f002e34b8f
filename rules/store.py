"""The window store: per (signal, node) blocks of ring-buffered samples.

A block holds one node's samples of one signal on a shared time axis (one column per
collection tick) and one row per entity, so a window is a contiguous column slice found with
a single binary search and every window function is one numpy reduction over all entities.
A block of many entities (an agent's ~1,000 flows) stores its samples time-major, one
contiguous run of every entity's values per collection: its window is then one contiguous
piece of memory and numpy runs its loops along the entities (a reduction over 984 flows x 60 s
costs a few microseconds instead of one inner-loop call per flow). A block of a few entities
(GPUs, ports, engines) stays row-major, where numpy's row reductions are fastest. The window
kernels (functions.py) give the same results, bit for bit, for either layout.
Samples from different nodes never share a time axis (their clocks and ticks differ), so a
late summary from one node never reorders another's.

A store of many nodes' one-row blocks (the controller's: a block per summary signal and node)
may write the blocks of a node that one cached layout fills together as one *slab*
(``node_slabs``): one shared time axis, one value matrix whose rows are the blocks' values,
and one write per node and flush instead of one per signal (a few slabs, one per time axis,
when a summary once left a signal out or signals appeared later than others). It is the store per-block writes
leave; any other write to one of its blocks first gives the blocks their own arrays back.

Entities get small integer ids from a registry (recycled when they age out) so that values
from different signals and blocks align by fancy indexing instead of dictionaries.

Nothing here reads the clock: callers pass ``now``.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from skewd.model import Catalogue, SampleBatch, Scope, SignalSpec

_NAN = np.nan
#: row capacity from which a block is stored time-major (see the module doc; functions._WIDE)
WIDE_ROWS = 64
_NO_ROWS = np.empty(0, dtype=np.int64)
_LAYOUT_BUDGET = 1 << 16  # samples + signals over all cached batch layouts (a few MB at most)
_SHARED_MIN = 256  # identity-recognised column arrays kept at least (see shared_columns)


class EntityRegistry:
    """(scope, node, entity) ↔ dense integer id; node labels for group scopes."""

    def __init__(self) -> None:
        self._ids: dict[tuple[Scope, str, str], int] = {}
        self.keys: list[tuple[Scope, str, str] | None] = []
        self.scope_of: list[Scope | None] = []
        self._free: list[int] = []
        self._refs: list[int] = []  # how many block rows use an id
        self.node_labels: dict[str, dict[str, str]] = {}
        self.version = 0  # bumps on every add/remove: invalidates cached index arrays

    def get(self, scope: Scope, node: str, entity: str) -> int:
        key = (scope, node, entity)
        eid = self._ids.get(key)
        if eid is None:
            if self._free:
                eid = self._free.pop()
                self.keys[eid] = key
                self.scope_of[eid] = scope
                self._refs[eid] = 0
            else:
                eid = len(self.keys)
                self.keys.append(key)
                self.scope_of.append(scope)
                self._refs.append(0)
            self._ids[key] = eid
            self.version += 1
        return eid

    def lookup(self, scope: Scope, node: str, entity: str) -> int | None:
        return self._ids.get((scope, node, entity))

    def ref(self, eid: int, n: int = 1) -> None:
        self._refs[eid] += n
        if self._refs[eid] <= 0:
            key = self.keys[eid]
            if key is not None:
                del self._ids[key]
            self.keys[eid] = None
            self.scope_of[eid] = None
            self._free.append(eid)
            self.version += 1

    def __len__(self) -> int:
        return len(self.keys)

    def node_id(self, node: str) -> int:
        """The node-scope entity of ``node`` (created on demand, for broadcasting)."""
        return self.get(Scope.NODE, node, "")

    def set_node_labels(self, node: str, labels: Mapping[str, str]) -> None:
        self.node_labels[node] = dict(labels)
        self.version += 1


@dataclass
class Block:
    """One node's samples of one signal: times[cap], values[rows, cap], used columns [0, n).

    ``data`` holds the values row-major ([rows, cap]) or, from ``WIDE_ROWS`` rows of capacity
    on, time-major ([cap, rows]); ``values`` is always the [rows, cap] view (writes go
    through)."""

    node: str
    scope: Scope
    times: np.ndarray
    data: np.ndarray
    eids: np.ndarray  # row → entity id (int64); -1 for a row being recycled
    rows: dict[str, int] = field(default_factory=dict)  # entity name → row
    n: int = 0
    last_seen: np.ndarray = field(default_factory=lambda: np.empty(0))  # row → last sample time
    cache: tuple | None = None  # (entities of the last append, their rows)
    time_major: bool = False  # ``data`` is [cap, rows] (set with it, see _empty_values)
    #: a memoryview of ``times`` for ``window``'s bisection, made again when ``times`` is replaced
    times_view: memoryview | None = field(default=None, repr=False, compare=False)
    #: the :class:`_Slab` whose arrays ``times``, ``data`` and ``last_seen`` are views of, if any
    slab: "_Slab | None" = field(default=None, repr=False, compare=False)

    @classmethod
    def new(cls, node: str, scope: Scope, cap: int = 64, rows: int = 4) -> "Block":
        return cls(node, scope, np.full(cap, np.inf), _empty_values(rows, cap),
                   np.full(rows, -1, dtype=np.int64), {}, 0, np.full(rows, -np.inf), None, rows >= WIDE_ROWS)

    @property
    def values(self) -> np.ndarray:
        return self.data.T if self.time_major else self.data

    @property
    def nrows(self) -> int:
        return len(self.rows)

    def window(self, start: float, end: float, all_rows: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Columns with start < t <= end: (times[k], values[rows, k]) as views. ``all_rows``: of
        a time-major block, every row of its capacity, used or not (the window is then one
        contiguous piece of memory; the rows past ``nrows`` hold nothing to read)."""
        times = self.times
        n = self.n
        # a bisection over the used columns (a memoryview: plain floats, none of numpy's
        # per-call set-up), and none at all for a window ending after the newest sample
        tv = self.times_view
        if tv is None or tv.obj is not times:
            tv = self.times_view = memoryview(times)
        lo = bisect_right(tv, start, 0, n)
        hi = n if not n or end >= tv[n - 1] else bisect_right(tv, end, lo, n)
        if self.time_major:
            return times[lo:hi], (self.data[lo:hi] if all_rows else self.data[lo:hi, : len(self.rows)]).T
        return times[lo:hi], self.data[: len(self.rows), lo:hi]


def _empty_values(rows: int, cap: int) -> np.ndarray:
    """A block's value storage for ``rows`` x ``cap``, all NaN, in the layout the row count calls for."""
    return np.full((cap, rows) if rows >= WIDE_ROWS else (rows, cap), _NAN)


def _span(ix: np.ndarray) -> slice | np.ndarray:
    """``ix`` as a slice when it is a run of consecutive integers (views, not copies)."""
    if len(ix) and int(ix[-1]) - int(ix[0]) == len(ix) - 1 and (len(ix) < 2 or bool((np.diff(ix) == 1).all())):
        return slice(int(ix[0]), int(ix[-1]) + 1)
    return ix


@dataclass
class _Group:
    """One signal of a layout: where its samples sit in the batch and which block rows they fill."""

    name: str
    blk: Block | None  # None: uncatalogued, counted and dropped
    cols: slice | np.ndarray  # sample positions in the batch
    rows: slice | np.ndarray  # block rows, in sample order
    count: int
    unique: bool  # no entity twice (a repeated one would make the write order matter)
    #: a group of one sample (a node-scope signal: every summary signal the controller stores):
    #: its block row and batch position as plain ints, so a write is a few scalar assignments
    #: instead of slice and fancy-index set-ups (-1: more than one sample)
    row: int = -1
    col: int = -1

    @classmethod
    def make(cls, name: str, blk: Block | None, idx: np.ndarray, rows: np.ndarray) -> "_Group":
        unique = len(np.unique(rows)) == len(rows)
        one = len(idx) == 1 and len(rows) == 1  # (an uncatalogued signal has no rows)
        return cls(name, blk, _span(idx), _span(rows) if unique else rows, len(idx), unique,
                   int(rows[0]) if one else -1, int(idx[0]) if one else -1)


def _room(times: np.ndarray, n: int, cutoff: float) -> tuple[int, int]:
    """Making room in a time axis of ``n`` used columns: the first column to keep (newer than
    ``cutoff``) and the capacity after (doubled when nothing ages out or more than half of it
    would stay full)."""
    keep_from = int(np.searchsorted(times[:n], cutoff, side="right"))
    cap = times.shape[0]
    return keep_from, (cap * 2 if keep_from == 0 or n - keep_from > cap // 2 else cap)


def _shift(times: np.ndarray, values: np.ndarray, keep_from: int, n: int,
           to_times: np.ndarray, to_values: np.ndarray) -> int:
    """Move columns ``keep_from:n`` of ``times``/``values`` (rows x columns) to the front of
    ``to_times``/``to_values`` (the same arrays or larger ones), blank the rest; the new count."""
    m = n - keep_from
    to_times[:m] = times[keep_from:n]
    to_values[:, :m] = values[:, keep_from:n]
    to_times[m:] = np.inf
    to_values[:, m:] = _NAN
    return m


#: fewest one-sample groups for which a layout's blocks are written as one slab (below it the
#: per-block writes cost about as much as the slab's set-up)
SLAB_MIN_GROUPS = 4
#: a slab prepares its doubled arrays (:meth:`_Slab.prepare`) once it is this share of its
#: capacity away from full at most; each slab at its own point within that share (a golden-ratio
#: sequence over the slabs), so that nodes that send at one rate, which fill their slabs
#: together, spread the cost of growing over the flushes instead of all growing in one
SLAB_PREPARE_SHARE = 0.5
_GOLDEN = 0.6180339887498949


class _Slab:
    """One node's one-row blocks that a layout writes together, stored as one matrix.

    The controller's store holds a block per (summary signal, node), one row each, all written
    by the node's summary at the same times: a flush wrote ~22 blocks per summary, four numpy
    scalar or slice assignments each. A slab gives those blocks one shared ``times`` array, one
    ``data`` matrix (a row per block: each block's ``data`` is a [1, cap] view of its row, the
    same memory layout as a row-major block's row) and one ``last_seen`` vector, so the layout's
    write is a few numpy calls whatever the number of blocks. It is exactly the store of
    per-block writes as long as only whole-slab writes reach the blocks: a layout of the node
    that writes every block of the slab (and maybe others) writes it too; every other write
    path (a late sample, a new row, a layout writing some of its blocks, gc) first
    :meth:`WindowStore._detach`-es the slab, which gives each block its own arrays back, shaped
    as they would have been. Only blocks on one time axis can share one, so a node's blocks
    may sit in a few slabs (:meth:`WindowStore._layout_slabs`)."""

    __slots__ = ("blocks", "times", "data", "last_seen", "n", "row_caps", "spread", "prepare_at", "spare")

    def __init__(self, blocks: list[Block], seq: int = 0) -> None:
        self.blocks = blocks
        first = blocks[0]
        self.n = first.n
        cap = first.times.shape[0]
        self.times = first.times.copy()
        self.data = np.empty((len(blocks), cap))
        self.last_seen = np.empty(len(blocks))
        self.row_caps = [b.values.shape[0] for b in blocks]  # restored on detach
        for i, b in enumerate(blocks):
            self.data[i] = b.values[0]
            self.last_seen[i] = b.last_seen[0]
        #: where within SLAB_PREPARE_SHARE this slab prepares to grow, in [0, 1)
        self.spread = (seq * _GOLDEN) % 1.0
        #: the doubled (times, data) arrays made ahead of the growth, and how many of the
        #: current columns they hold already (see prepare)
        self.spare: tuple[np.ndarray, np.ndarray, int] | None = None
        self._set_prepare_at()
        self._bind()

    def _set_prepare_at(self) -> None:
        cap = self.times.shape[0]
        self.prepare_at = cap - int(cap * SLAB_PREPARE_SHARE * self.spread)

    def prepare(self) -> None:
        """Make the arrays a doubling would make (all ``inf``/NaN) and copy the columns written
        so far into them: the costly part of a growth (fresh memory touched, a copy of the
        whole slab), done while this slab still has room. Columns only ever get appended
        until room is made, so at the growth only the columns written since are copied
        (:meth:`WindowStore._slab_room`), and the result is exactly the doubling's."""
        cap, n = self.times.shape[0], self.n
        times = np.empty(cap * 2)  # (each cell written once: a slab can be megabytes)
        data = np.empty((self.data.shape[0], cap * 2))
        times[:n] = self.times[:n]
        times[n:] = np.inf
        data[:, :n] = self.data[:, :n]
        data[:, n:] = _NAN
        self.spare = (times, data, n)

    def _bind(self) -> None:
        """Point every block at its views of the slab's arrays."""
        times, data, seen, n = self.times, self.data, self.last_seen, self.n
        # one memoryview for all (window's bisection): every buffer export of an array makes
        # numpy's slicing of it slower (~100 -> ~180 ns with 30 exports)
        view = memoryview(times)
        for i, b in enumerate(self.blocks):
            b.times = times
            b.times_view = view
            b.data = data[i: i + 1]
            b.last_seen = seen[i: i + 1]
            b.n = n
            b.slab = self


@dataclass
class _Layout:
    """A one-node, one-timestamp batch shape (signal and entity per position) resolved to rows.
    Valid until :meth:`WindowStore.gc` replaces blocks (it clears every layout) or the
    catalogue grows."""

    sig: list
    ent: list
    node: list
    groups: list[_Group]
    ncat: int
    block_ids: frozenset = frozenset()
    #: the slabs that write the layout's blocks (WindowStore.node_slabs), one per time axis its
    #: blocks share (WindowStore._layout_slabs); another layout of the node may write one too
    slabs: list = field(default_factory=list)
    #: per slab, the batch position of each of its blocks' samples (None: the batch's positions
    #: in order, as when every signal is catalogued and in the one slab)
    slab_cols: list = field(default_factory=list)
    slab_rest: list = field(default_factory=list)  # the groups written without a slab
    slab_tried: int = -1  # the store version at which the blocks last did not fit a slab

    def __post_init__(self) -> None:
        self.block_ids = frozenset(id(g.blk) for g in self.groups if g.blk is not None)


class WindowStore:
    """Ingests SampleBatches; serves windows per signal across nodes.

    ``horizon`` bounds how far back any rule may look; older columns are compacted away.
    Out-of-order samples (older than the newest column of their block) are dropped and
    counted in ``dropped_out_of_order`` – collectors stamp monotonic tick times, so this
    only happens with a misbehaving source.
    """

    def __init__(self, catalogue: Catalogue, horizon: float = 600.0, initial_cap: int = 64,
                 layout_budget: int | None = None) -> None:
        self.catalogue = catalogue
        self.horizon = float(horizon)
        self.initial_cap = initial_cap
        self.registry = EntityRegistry()
        self.blocks: dict[str, dict[str, Block]] = {}
        self.dropped_out_of_order = 0
        self.dropped_uncatalogued: dict[str, int] = {}
        self.samples_ingested = 0
        self.latest_t = -np.inf
        self.version = 0  # bumps when rows or blocks change shape
        self._layouts: dict[tuple, _Layout] = {}  # batch shape → rows (see ingest_many)
        self._layout_size = 0  # samples and groups the cached layouts describe
        #: bound on _layout_size (the cache is cleared beyond it). One agent's store needs the
        #: default; a store fed by many nodes (the controller) raises it so that every node's
        #: layouts stay cached between its batches. Only speed depends on it, never results.
        self.layout_budget = _LAYOUT_BUDGET if layout_budget is None else layout_budget
        self._shared: dict[int, tuple] = {}  # id(signal array) → (arrays, layout): shared_columns
        # row births, recorded while a caller ingests ahead of a range evaluation (see track_births)
        self._birth_tick: int | None = None
        self._births: dict[int, tuple[Block, dict[int, int]]] = {}
        #: write a cached layout's one-row blocks as one slab (see _Slab): for a store of many
        #: nodes' one-sample signals (the controller turns it on). Only speed depends on it.
        self.node_slabs = False
        self._slabbed = False  # a slab was ever made (the per-block writes then check for one)
        self._slab_seq = 0  # slabs made (each slab's place in the spread of growths)
        #: leave the preparation of a slab's growth to :meth:`prepare_next` instead of making it
        #: in the write that reached the slab's point: the controller, whose writes are its tick's
        #: flush, makes them between ticks (controller/intake.py). A preparation allocates and
        #: copies the slab (megabytes for a node that sends often), and under load it was over half
        #: of a tick's flush. Only speed depends on it: a slab grows the same, prepared or not.
        self.defer_prepare = False
        self._to_prepare: list[tuple[_Slab, int]] = []  # (slab, its capacity when queued)

    # -- ingest ----------------------------------------------------------------------------
    def ingest(self, batch: SampleBatch) -> None:
        self.ingest_many((batch,))

    def ingest_many(self, batches: Iterable[SampleBatch], shared_columns: bool = False) -> None:
        """Ingest ``batches`` in order, exactly as one :meth:`ingest` per batch would.

        A collector sends the same signals for the same entities in the same order at every
        collection, so each such *layout* is resolved to (block, rows) once and cached; a batch
        with a known layout costs a few list comparisons. Consecutive batches of a layout are
        then written together: one slice assignment per signal for all their timestamps (replay
        passes every batch due before an evaluation tick), making room in a block at the column
        where one batch at a time would have; late or repeated timestamps are written column by
        column with the same drop rule. Anything else - a batch spanning several nodes or
        timestamps, a new entity, an unknown layout - flushes what is pending and takes the
        general path, one batch at a time, so entity ids and rows are assigned in the same order
        as always.

        ``shared_columns``: the caller promises that batches whose ``signal``, ``entity`` and
        ``node`` arrays are the very same objects hold the same strings (it builds them so and
        never modifies them), so a layout seen with those arrays is recognised by identity.
        """
        pending: dict[int, tuple[_Layout, list[float], list[np.ndarray]]] = {}
        busy: set[int] = set()  # ids of blocks with pending writes
        for batch in batches:
            n = len(batch)
            if not n:
                continue
            lay = self._known_layout(batch, shared_columns)
            if lay is None:
                if pending:
                    self._flush(pending)
                    busy.clear()
                self._ingest_general(batch)
                continue
            entry = pending.get(id(lay))
            if entry is None:
                if not lay.block_ids.isdisjoint(busy):
                    # another layout writes one of these blocks (a collector's entity set
                    # changed): keep the per-block arrival order
                    self._flush(pending)
                    busy.clear()
                busy |= lay.block_ids
                entry = pending[id(lay)] = (lay, [], [])
            entry[1].append(float(batch.t[0]))
            entry[2].append(batch.value)
            self.samples_ingested += n
        if pending:
            self._flush(pending)

    def cached_layout_blocks(self, signal: np.ndarray, entity: np.ndarray, node: np.ndarray) -> frozenset | None:
        """The ids of the blocks a one-node, one-timestamp collection with these columns writes,
        when the store has its layout cached and every signal of it is catalogued; None
        otherwise. Such a collection creates no row or block and drops no sample as
        uncatalogued, so :meth:`ingest_collections` can write many at once, and the ids tell a
        caller which collections share blocks (their order matters then). The arrays are
        recognised by identity as with ``ingest_many(shared_columns=True)``. Added for replay
        (agent/replay/ahead.py)."""
        n = len(signal)
        if not n:
            return None
        lay = self._known_layout(SampleBatch(np.zeros(n), node, entity, signal, np.zeros(n)), shared=True)
        if lay is None or any(g.blk is None for g in lay.groups):
            return None
        return lay.block_ids

    def ingest_collections(self, signal: np.ndarray, entity: np.ndarray, node: np.ndarray, ts: np.ndarray,
                           values: np.ndarray) -> bool:
        """``len(ts)`` collections of one cached layout, ``values[j]`` (one row per collection)
        at ``ts[j]``, written at once: the store ends up exactly as after one :meth:`ingest` of
        each collection in order (it is :meth:`ingest_many`'s write of consecutive batches of a
        layout, for a caller that already holds them as a matrix). Returns False, having
        written nothing, when the layout is not cached (ingest them as SampleBatches then).
        Column arrays as for :meth:`cached_layout_blocks`. Added for replay."""
        n = len(signal)
        if not len(ts) or not n:
            return True
        hit = self._shared.get(id(signal))  # _known_layout's identity check, without a batch to check
        if (hit is not None and hit[0] is signal and hit[1] is entity and hit[2] is node
                and hit[3].ncat == len(self.catalogue)):
            lay = hit[3]
        else:
            lay = self._known_layout(SampleBatch(np.full(n, float(ts[0])), node, entity, signal, values[0]),
                                     shared=True)
            if lay is None:
                return False
        self._write(lay, np.asarray(ts, dtype=np.float64), values)
        self.samples_ingested += len(ts) * n
        return True

    def ingest_collection(self, signal: np.ndarray, entity: np.ndarray, node: np.ndarray, t: float,
                          values: np.ndarray) -> None:
        """One collection, ``values`` at ``t`` (column arrays as for :meth:`ingest_collections`),
        exactly as one :meth:`ingest` of it: the controller's write of a node that sent one
        summary since the last flush (every node at the agents' 1 s interval), of a leader's
        digest row and of a node's ctl_* values. A slabbed layout's new column is written
        without the time array, one-row matrix and order checks a run of collections needs;
        anything else (a late or repeated time, a full or undone slab, blocks outside the slab)
        goes through :meth:`ingest_collections`, and a layout it does not cache through
        :meth:`ingest_many`, which learns it."""
        n = len(signal)
        hit = self._shared.get(id(signal))
        if (n and self.node_slabs and hit is not None and hit[0] is signal and hit[1] is entity and hit[2] is node
                and hit[3].ncat == len(self.catalogue)):
            lay = hit[3]
            sls = lay.slabs
            if sls and not lay.slab_rest:
                for sl in sls:
                    k = sl.n
                    if sl.blocks[0].slab is not sl or k == sl.times.shape[0] or (k and t <= sl.times[k - 1]):
                        break
                else:
                    for sl, cols in zip(sls, lay.slab_cols):
                        self._slab_put_one(sl, t, values if cols is None else values[cols])
                    if t > self.latest_t:
                        self.latest_t = t
                    self.samples_ingested += n
                    return
        if not self.ingest_collections(signal, entity, node, np.array([t]), values[None, :]):
            self.ingest_many([SampleBatch(np.full(n, t), node, entity, signal, values)], shared_columns=True)

    def _known_layout(self, batch: SampleBatch, shared: bool = False) -> "_Layout | None":
        """The cached layout of a one-node, one-timestamp batch, if it is still valid."""
        sig, ent, node = batch.signal, batch.entity, batch.node
        t = batch.t
        if shared:
            hit = self._shared.get(id(sig))
            if (hit is not None and hit[0] is sig and hit[1] is ent and hit[2] is node
                    and hit[3].ncat == len(self.catalogue)):
                return hit[3] if (t == t[0]).all() else None
        n = len(sig)
        key = (n, node[0], sig[0], ent[0], sig[n - 1], ent[n - 1])
        lay = self._layouts.get(key)
        if lay is None or lay.ncat != len(self.catalogue):
            return None
        # lists compare element by element with an identity shortcut: the strings of one
        # collector (or one decoded bundle chunk) are the same objects batch after batch
        if sig.tolist() != lay.sig or ent.tolist() != lay.ent or node.tolist() != lay.node:
            return None
        if not (t == t[0]).all():
            return None
        if shared:
            if len(self._shared) >= max(_SHARED_MIN, len(self._layouts)):
                self._shared.clear()
            self._shared[id(sig)] = (sig, ent, node, lay)  # holds the arrays: ids stay unique
        return lay

    def _flush(self, pending: dict) -> None:
        for lay, ts, vals in pending.values():
            self._write(lay, np.array(ts), np.stack(vals) if len(vals) > 1 else vals[0][None, :])
        pending.clear()

    def _write(self, lay: "_Layout", ts: np.ndarray, V: np.ndarray) -> None:
        """Write ``len(ts)`` collections of one layout: ``V[j]`` holds the values at ``ts[j]``."""
        k = len(ts)
        increasing = k == 1 or bool((ts[1:] > ts[:-1]).all())
        t0 = float(ts[0])
        t_last = float(ts[-1])
        groups = lay.groups
        if self.node_slabs:
            sls = lay.slabs
            for sl in sls:
                if sl.blocks[0].slab is not sl:  # undone meanwhile: the layout's slabs anew
                    sls = lay.slabs = []
                    break
            if not sls and lay.slab_tried != self.version:
                sls = self._layout_slabs(lay)
            if sls:
                late = not increasing
                for sl in sls:
                    if sl.n and t0 <= sl.times[sl.n - 1]:
                        late = True
                if not late:
                    for sl, cols in zip(sls, lay.slab_cols):
                        self._slab_put(sl, ts, V, cols)
                    if t_last > self.latest_t:
                        self.latest_t = t_last
                    groups = lay.slab_rest  # blocks on time axes of their own (and uncatalogued)
                    if not groups:
                        return
                else:  # late or repeated times: block by block
                    lay.slabs = []
                    for sl in sls:
                        self._detach(sl)
        wrote = False
        slabbed = self._slabbed
        # one-sample groups read their value(s) from these: a Python float (k = 1) or a row
        # of the transposed matrix, the same float64s either way
        one = V[0].tolist() if k == 1 else V.T
        for g in groups:
            blk = g.blk
            if blk is None:
                self.dropped_uncatalogued[g.name] = self.dropped_uncatalogued.get(g.name, 0) + g.count * k
                continue
            if slabbed and blk.slab is not None:  # another layout's slab holds it: write it alone from now on
                self._detach(blk.slab)
            n = blk.n
            if increasing and (not n or t0 > blk.times[n - 1]):
                if n + k <= blk.times.shape[0]:  # the common case, inline: k new columns
                    r = g.row
                    if r >= 0:  # one sample: scalar indices (same cells, same values)
                        if k == 1:
                            blk.times[n] = t0
                            if blk.time_major:
                                blk.data[n, r] = one[g.col]
                            else:
                                blk.data[r, n] = one[g.col]
                        else:
                            blk.times[n: n + k] = ts
                            if blk.time_major:
                                blk.data[n: n + k, r] = one[g.col]
                            else:
                                blk.data[r, n: n + k] = one[g.col]
                        blk.n = n + k
                        blk.last_seen[r] = t_last
                        wrote = True
                        continue
                    rows = g.rows
                    if k == 1:
                        blk.times[n] = t0
                        if blk.time_major:
                            blk.data[n, rows] = V[0, g.cols]
                        else:
                            blk.data[rows, n] = V[0, g.cols]
                    else:
                        blk.times[n: n + k] = ts
                        if blk.time_major:
                            blk.data[n: n + k, rows] = V[:, g.cols]
                        else:
                            blk.data[rows, n: n + k] = V[:, g.cols].T
                    blk.n = n + k
                    blk.last_seen[rows] = t_last
                    wrote = True
                else:
                    self._put_columns(blk, g.rows, ts, V[:, g.cols])
            else:
                vals = V[:, g.cols]
                for j in range(k):  # the general path's column logic, rows already known
                    self._put(blk, g.rows, float(ts[j]), vals[j])
        if wrote and t_last > self.latest_t:
            self.latest_t = t_last

    def _put_columns(self, blk: Block, rows, ts: np.ndarray, vals: np.ndarray) -> None:
        """Append ``len(ts)`` new columns (increasing times after the block's newest); room is
        made at exactly the column where one append at a time would have made it."""
        if blk.slab is not None:
            self._detach(blk.slab)
        k = len(ts)
        j = 0
        while j < k:
            if blk.n == blk.times.shape[0]:
                self._make_room(blk, float(ts[j]))
            c0 = blk.n
            m = min(k - j, blk.times.shape[0] - c0)
            blk.times[c0: c0 + m] = ts[j: j + m]
            blk.values[rows, c0: c0 + m] = vals[j: j + m].T
            blk.n = c0 + m
            j += m
        t = float(ts[-1])
        blk.last_seen[rows] = t
        if t > self.latest_t:
            self.latest_t = t

    def _put(self, blk: Block, rows, t: float, values: np.ndarray) -> bool:
        """One collection's values of known rows at ``t``; False if dropped as out of order."""
        if blk.slab is not None:
            self._detach(blk.slab)
        if blk.n and t < blk.times[blk.n - 1]:
            self.dropped_out_of_order += len(values)
            return False
        if not blk.n or t > blk.times[blk.n - 1]:
            if blk.n == blk.times.shape[0]:
                self._make_room(blk, t)
            blk.times[blk.n] = t
            blk.n += 1
        col = blk.n - 1
        if blk.time_major:
            blk.data[col, rows] = values
        else:
            blk.data[rows, col] = values
        blk.last_seen[rows] = t
        if t > self.latest_t:
            self.latest_t = t
        return True

    def _ingest_general(self, batch: SampleBatch) -> None:
        sig = batch.signal
        node = batch.node
        t = batch.t
        # factorise signals with a dict (strings are interned by the collectors: cheap)
        codes_of: dict = {}
        codes = np.fromiter((codes_of.setdefault(x, len(codes_of)) for x in sig), dtype=np.int64, count=len(sig))
        one_node = bool((node == node[0]).all())
        one_t = bool((t == t[0]).all())
        if one_node and one_t:
            key = codes  # the common case: one collector, one node, one tick
        else:
            ncodes: dict = {}
            nc = np.fromiter((ncodes.setdefault(x, len(ncodes)) for x in node), dtype=np.int64, count=len(node))
            _, tc = np.unique(t, return_inverse=True)
            key = (codes * (len(ncodes) + 1) + nc) * (int(tc.max()) + 2) + tc.reshape(-1)
        order = np.argsort(key, kind="stable")
        ks = key[order]
        cut = np.flatnonzero(ks[1:] != ks[:-1]) + 1
        bounds = np.concatenate(([0], cut, [len(order)]))
        groups: list[_Group] | None = [] if one_node and one_t else None
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            idx = order[a:b]
            i0 = idx[0]
            name = sig[i0]
            written = self._append(name, node[i0], float(t[i0]), batch.entity[idx], batch.value[idx])
            if groups is None:
                continue
            if written is None:  # out of order: no layout (the next batch may create rows)
                groups = None
                continue
            blk, rows = written
            groups.append(_Group.make(name, blk, idx, rows))
        self.samples_ingested += len(batch)
        if groups is not None:
            self._remember(batch, groups)

    def _remember(self, batch: SampleBatch, groups: "list[_Group]") -> None:
        if any(g.blk is not None and not g.unique for g in groups):
            return  # an entity twice in one collection: always the general path
        self._layout_size += len(groups) + len(batch)
        if self._layout_size > self.layout_budget:  # entity churn (flows) makes new layouts: stay bounded
            self._layouts.clear()
            self._layout_size = len(groups) + len(batch)
        sig, ent, node = batch.signal, batch.entity, batch.node
        n = len(sig)
        key = (n, node[0], sig[0], ent[0], sig[n - 1], ent[n - 1])
        self._layouts[key] = _Layout(sig.tolist(), ent.tolist(), node.tolist(), groups, len(self.catalogue))

    def _append(self, signal_name: str, node: str, t: float, entities: np.ndarray,
                values: np.ndarray) -> tuple[Block | None, np.ndarray] | None:
        """Returns (block, rows) written, (None, empty) for an uncatalogued signal, None for
        samples dropped as out of order."""
        spec = self.catalogue.get(signal_name)
        if spec is None:
            self.dropped_uncatalogued[signal_name] = self.dropped_uncatalogued.get(signal_name, 0) + len(values)
            return None, _NO_ROWS
        per_node = self.blocks.setdefault(signal_name, {})
        blk = per_node.get(node)
        if blk is None:
            blk = per_node[node] = Block.new(node, spec.scope, self.initial_cap)
            self.version += 1
        if blk.n and t < blk.times[blk.n - 1]:
            self.dropped_out_of_order += len(values)
            return None
        # collectors report the same entities in the same order tick after tick: reuse the rows
        cached = blk.cache
        if cached is not None and len(cached[0]) == len(entities) and cached[0] == entities.tolist():
            rows = cached[1]
        else:
            rows = np.fromiter((self._row(blk, str(e)) for e in entities), dtype=np.int64, count=len(entities))
            blk.cache = (entities.tolist(), rows)
        self._put(blk, rows, t, values)
        return blk, rows

    def _row(self, blk: Block, entity: str) -> int:
        r = blk.rows.get(entity)
        if r is not None:
            return r
        if blk.slab is not None:
            self._detach(blk.slab)
        r = len(blk.rows)
        if r == blk.values.shape[0]:
            grow = max(4, r)
            tm = r + grow >= WIDE_ROWS
            data = _empty_values(r + grow, blk.times.shape[0])
            if tm:
                data[:, :r] = blk.values.T
            else:
                data[:r] = blk.data
            blk.data, blk.time_major = data, tm
            blk.eids = np.concatenate([blk.eids, np.full(grow, -1, dtype=np.int64)])
            blk.last_seen = np.concatenate([blk.last_seen, np.full(grow, -np.inf)])
        blk.rows[entity] = r
        if self._birth_tick is not None:
            self._births.setdefault(id(blk), (blk, {}))[1][r] = self._birth_tick
        eid = self.registry.get(blk.scope, blk.node, entity)
        self.registry.ref(eid)
        blk.eids[r] = eid
        self.version += 1
        return r

    def _make_room(self, blk: Block, t: float) -> None:
        """Drop columns older than the horizon; grow when the horizon still needs them."""
        if blk.slab is not None:
            self._detach(blk.slab)
        keep_from, cap = _room(blk.times, blk.n, t - self.horizon)
        if cap != blk.times.shape[0]:
            times = np.full(cap, np.inf)
            data = _empty_values(blk.values.shape[0], cap)
        else:
            times, data = blk.times, blk.data
        m = _shift(blk.times, blk.values, keep_from, blk.n, times, data.T if blk.time_major else data)
        blk.times, blk.data, blk.n = times, data, m

    # -- slabs (node_slabs) -----------------------------------------------------------------------
    def _layout_slabs(self, lay: _Layout) -> "list[_Slab]":
        """The slabs to write ``lay``'s blocks through, remembered in ``lay``: another layout's
        of the node that holds only blocks of ``lay`` (a node's summaries with and without a
        signal write the blocks they share through it), and a new one per time axis (same
        capacity, columns and times) that at least :data:`SLAB_MIN_GROUPS` of the other
        blocks share. A summary that left a signal out puts that block on an axis of its own
        for good (per-block writes never give it the column back), and signals that appeared
        later than the others (an engine that came up) are on one of their own: each is
        written alone or in a slab of its own, the rest of the node stays in a slab. Only a
        group of one sample in row 0 of a row-major block of one row qualifies; no slab at
        all is not tried again until the store's shape changes."""
        cands = [g.blk for g in lay.groups
                 if g.blk is not None and g.row == 0 and not g.blk.time_major and len(g.blk.rows) == 1]
        ids = {id(b) for b in cands}
        for b in cands:  # another layout's slab with blocks this one does not write: undone
            if b.slab is not None and not all(id(x) in ids for x in b.slab.blocks):
                self._detach(b.slab)
        sls: list[_Slab] = []
        axes: list[list[Block]] = []  # the free candidates by time axis, in layout order
        for b in cands:
            if b.slab is not None:
                if b.slab not in sls:  # (identity: _Slab has no __eq__)
                    sls.append(b.slab)
                continue
            n, cap = b.n, b.times.shape[0]
            for ax in axes:
                a = ax[0]
                if a.n == n and a.times.shape[0] == cap and np.array_equal(a.times[:n], b.times[:n]):
                    ax.append(b)
                    break
            else:
                axes.append([b])
        for ax in axes:
            if len(ax) >= SLAB_MIN_GROUPS:
                self._slabbed = True
                self._slab_seq += 1
                sls.append(_Slab(ax, self._slab_seq))
        if not sls:
            lay.slab_tried = self.version
            return sls
        where = {id(b): (j, i) for j, sl in enumerate(sls) for i, b in enumerate(sl.blocks)}
        cols = [np.empty(len(sl.blocks), dtype=np.int64) for sl in sls]
        rest = []
        for g in lay.groups:
            at = where.get(id(g.blk)) if g.blk is not None else None
            if at is None:
                rest.append(g)
            else:
                cols[at[0]][at[1]] = g.col
        width = len(lay.sig)
        lay.slabs, lay.slab_rest = sls, rest
        lay.slab_cols = [None if len(c) == width and bool((c == np.arange(width)).all()) else c for c in cols]
        return sls

    def _slab_put(self, sl: _Slab, ts: np.ndarray, V: np.ndarray, cols: np.ndarray | None) -> None:
        """:meth:`_put_columns` for every block of the slab at once: ``len(ts)`` new columns
        (increasing times after the newest), room made at the same columns; ``V[:, cols]`` (or
        ``V`` for ``cols`` None) holds the slab rows' values."""
        k = len(ts)
        if k == 1 and sl.n < sl.times.shape[0]:  # one collection, room for it
            self._slab_put_one(sl, float(ts[0]), V[0] if cols is None else V[0, cols])
            return
        vals = V if cols is None else V[:, cols]
        j = 0
        while j < k:
            if sl.n == sl.times.shape[0]:
                self._slab_room(sl, float(ts[j]))
            c0 = sl.n
            m = min(k - j, sl.times.shape[0] - c0)
            sl.times[c0: c0 + m] = ts[j: j + m]
            sl.data[:, c0: c0 + m] = vals[j: j + m].T
            sl.n = c0 + m
            j += m
        n = sl.n
        for b in sl.blocks:
            b.n = n
        sl.last_seen[:] = ts[-1]
        if n >= sl.prepare_at and sl.spare is None:
            self._slab_prepare(sl, float(ts[-1]))

    def _slab_put_one(self, sl: _Slab, t: float, column: np.ndarray) -> None:
        """:meth:`_slab_put` of one collection at ``t`` (after the newest), the slab rows'
        values ``column``, into a slab with room for it."""
        c0 = sl.n
        sl.times[c0] = t
        sl.data[:, c0] = column
        sl.n = n = c0 + 1
        for b in sl.blocks:
            b.n = n
        sl.last_seen.fill(t)
        if n >= sl.prepare_at and sl.spare is None:
            self._slab_prepare(sl, t)

    def _slab_prepare(self, sl: _Slab, t: float) -> None:
        """Prepare the slab's growth (:meth:`_Slab.prepare`) if making room at ``t`` would double
        it keeping every column (nothing older than the horizon yet): the growths of slabs
        filled at one pace are then spread over the flushes (SLAB_PREPARE_SHARE). With
        :attr:`defer_prepare`, queued for :meth:`prepare_next` instead."""
        if not (sl.n and sl.times[0] > t - self.horizon):
            # at the horizon room is made by dropping columns: no doubled arrays to prepare
            sl.prepare_at = sl.times.shape[0] + 1
        elif self.defer_prepare:
            self._to_prepare.append((sl, sl.times.shape[0]))
            sl.prepare_at = sl.times.shape[0] + 1  # queued once (making room sets it again)
        else:
            sl.prepare()

    @property
    def preparations_queued(self) -> int:
        """Slab growth preparations queued for :meth:`prepare_next` (:attr:`defer_prepare`)."""
        return len(self._to_prepare)

    def prepare_next(self) -> int:
        """Make the oldest queued preparation of a slab's growth (:attr:`defer_prepare`): passed
        over when the slab grew or was undone since, or has reached the horizon (its newest
        column is the time of its latest write, the time the write checked). Returns how many
        are left; the caller decides how many to make at a time (the store reads no clock)."""
        q = self._to_prepare
        if not q:
            return 0
        sl, cap = q.pop(0)
        if sl.spare is None and sl.times.shape[0] == cap and sl.blocks[0].slab is sl and sl.n \
                and sl.times[0] > sl.times[sl.n - 1] - self.horizon:
            sl.prepare()
        return len(q)

    def _slab_room(self, sl: _Slab, t: float) -> None:
        """:meth:`_make_room` for every block of the slab (one time axis: the same decision)."""
        keep_from, cap = _room(sl.times, sl.n, t - self.horizon)
        spare, sl.spare = sl.spare, None
        if spare is not None and keep_from == 0 and spare[0].shape[0] == cap:
            # the doubling, prepared: the columns written since the preparation are still to copy
            times, data, c = spare
            n = sl.n
            times[c:n] = sl.times[c:n]
            data[:, c:n] = sl.data[:, c:n]
            sl.times, sl.data = times, data
        else:
            if cap != sl.times.shape[0]:  # (_shift writes every cell)
                times = np.empty(cap)
                data = np.empty((sl.data.shape[0], cap))
            else:
                times, data = sl.times, sl.data
            sl.n = _shift(sl.times, sl.data, keep_from, sl.n, times, data)
            if times is not sl.times:
                sl.times, sl.data = times, data
        sl._set_prepare_at()
        sl._bind()

    def _detach(self, sl: _Slab) -> None:
        """Give every block of the slab its own arrays again, shaped as per-block writes would
        have left them (row capacity, NaN and -inf in the rows unused); the slab is void."""
        cap = sl.times.shape[0]
        for i, b in enumerate(sl.blocks):
            if b.slab is not sl:
                continue
            rows = sl.row_caps[i]
            data = _empty_values(rows, cap)
            data[0] = sl.data[i]
            seen = np.full(rows, -np.inf)
            seen[0] = sl.last_seen[i]
            b.times = sl.times.copy()
            b.data = data
            b.last_seen = seen
            b.n = sl.n
            b.slab = None
        sl.spare = None

    # -- row births (range evaluation) -----------------------------------------------------------
    def track_births(self, tick_index: int) -> None:
        """Rows created from now on are born at tick ``tick_index`` of a range being ingested
        ahead of its evaluation (``Engine.evaluate_range``): the engine then leaves them out of
        the ticks before. Call before ingesting each tick's batches."""
        self._birth_tick = int(tick_index)

    def take_births(self) -> dict[int, np.ndarray]:
        """Stop recording; id(block) → first tick index per row (0 for rows that were there
        already) for every block that gained rows."""
        out = {}
        for key, (blk, rows) in self._births.items():
            b = np.zeros(blk.values.shape[0], dtype=np.int64)
            for r, tick in rows.items():
                b[r] = tick
            out[key] = b
        self._births = {}
        self._birth_tick = None
        return out

    def min_free_columns(self) -> int:
        """The fewest columns any block can still take before it must make room (the only time
        columns are dropped): ingesting fewer new timestamps than this drops nothing."""
        free = 1 << 62
        for per_node in self.blocks.values():
            for blk in per_node.values():
                f = blk.times.shape[0] - blk.n
                if f < free:
                    free = f
        return free

    def gc_would_remove(self, now: float) -> bool:
        """Whether :meth:`gc` at ``now`` would forget an entity (it changes nothing otherwise)."""
        cutoff = now - self.horizon
        for per_node in self.blocks.values():
            for blk in per_node.values():
                nr = blk.nrows
                if nr and np.count_nonzero(blk.last_seen[:nr] < cutoff):
                    return True
        return False

    # -- housekeeping ------------------------------------------------------------------------
    def gc(self, now: float) -> int:
        """Forget entities with no sample within the horizon (ended flows, removed GPUs)."""
        removed = 0
        cutoff = now - self.horizon
        for signal_name, per_node in list(self.blocks.items()):
            for node, blk in list(per_node.items()):
                stale = [e for e, r in blk.rows.items() if blk.last_seen[r] < cutoff]
                if not stale:
                    continue
                if blk.slab is not None:  # the new block must not share the slab's time axis
                    self._detach(blk.slab)
                keep = [(e, r) for e, r in blk.rows.items() if blk.last_seen[r] >= cutoff]
                for e in stale:
                    self.registry.ref(int(blk.eids[blk.rows[e]]), -1)
                removed += len(stale)
                if not keep:
                    del per_node[node]
                    continue
                idx = np.array([r for _, r in keep], dtype=np.int64)
                nb = Block.new(node, blk.scope, blk.times.shape[0], max(4, len(keep)))
                nb.times = blk.times
                nb.n = blk.n
                nb.values[: len(keep)] = blk.values[idx]
                nb.eids[: len(keep)] = blk.eids[idx]
                nb.last_seen[: len(keep)] = blk.last_seen[idx]
                nb.rows = {e: i for i, (e, _) in enumerate(keep)}
                per_node[node] = nb
            if not per_node:
                del self.blocks[signal_name]
        if removed:
            self.version += 1
            self._layouts.clear()  # they point at the blocks just replaced
            self._layout_size = 0
            self._shared.clear()
        return removed

    def forget_node(self, node: str) -> int:
        """Forget every row of ``node`` (a node that left: the controller's cardinality bound);
        returns how many rows went. Like :meth:`gc`, for one node at once and without waiting
        for the horizon."""
        removed = 0
        for signal_name, per_node in list(self.blocks.items()):
            blk = per_node.pop(node, None)
            if blk is None:
                continue
            for r in blk.rows.values():
                self.registry.ref(int(blk.eids[r]), -1)
            removed += len(blk.rows)
            if not per_node:
                del self.blocks[signal_name]
        eid = self.registry.lookup(Scope.NODE, node, "")
        if eid is not None and self.registry._refs[eid] <= 0:
            self.registry.ref(eid, 0)  # the node id made for broadcasting: nothing uses it now
        if self.registry.node_labels.pop(node, None) is not None:
            self.registry.version += 1
        if removed:
            self.version += 1
            self._layouts.clear()  # they may point at the blocks just dropped
            self._layout_size = 0
            self._shared.clear()
        return removed

    # -- queries ---------------------------------------------------------------------------
    def signal_blocks(self, signal_name: str) -> Iterable[Block]:
        return self.blocks.get(signal_name, {}).values()

    def spec(self, signal_name: str) -> SignalSpec:
        return self.catalogue[signal_name]

    def entities(self, signal_name: str) -> np.ndarray:
        """Entity ids that have rows for a signal (any node)."""
        parts = [b.eids[: b.nrows] for b in self.signal_blocks(signal_name)]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def series(self, signal_name: str, node: str, entity: str = "") -> tuple[np.ndarray, np.ndarray]:
        """All retained (times, values) of one entity – for reports, tests and replay output."""
        blk = self.blocks.get(signal_name, {}).get(node)
        if blk is None or entity not in blk.rows:
            return np.empty(0), np.empty(0)
        r = blk.rows[entity]
        v = blk.values[r, : blk.n]
        ok = ~np.isnan(v)
        return blk.times[: blk.n][ok].copy(), v[ok].copy()
