"""Summary samples into the window store, batched: the controller's hot path.

Every node sends a summary per interval; taking each into the store as it arrives would cost a
store ingest per message, and a multi-node batch per tick goes the store's general path (seconds
for 250,000 rows, the event loop blocked). So summaries wait here until the next tick (or until
:data:`FLUSH_ROWS` pile up), and a node's summaries, which carry the same signals and entities
time after time, are recognised by their *layout*: the column arrays the store already holds
rows for, shared by identity, so a flush of known layouts takes the store's fast path. The
controller's own derived ``ctl_*`` values go the same way at every tick.

This is bookkeeping about the store, apart from what the controller does with a summary
(:mod:`skewd.controller.intake`); the one thing it must be told is when the store forgot rows
(:meth:`StoreFeed.gc`, :meth:`StoreFeed.forget_node`), since a layout learned before is then void.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from skewd import wire
from skewd.model import SampleBatch
from skewd.rules.store import WindowStore

from .catalogue import NAMES as CTL_SIGNALS
from .timeline import ENGINE_KEYS

#: summary keys that carry per-burst data for alignment, not signals
BURST_STARTS = wire.BURST_STARTS
BURST_BYTES = wire.BURST_BYTES
#: pending samples that force a flush between ticks: at a rate the ticks cannot keep up with, a
#: tick's flush would otherwise grow to seconds with the event loop blocked (250,000 rows took
#: ~1 s on this machine under load); 50,000 bound it to a few hundred ms
FLUSH_ROWS = 50_000
#: the same for samples that wait as float64 rows (binary summaries, :meth:`StoreFeed.add_row`):
#: ~17 bytes a sample waiting (as lists of Python floats ~43), so ~9 MB at this bound (the
#: lists' bound holds ~2 MB). A flush writes each node's rows as one matrix, so its cost is
#: mostly per node: 1.0 us a summary with 50 rows a node, 2.0 with 10, 4.8 with 3 (1,000
#: nodes); larger bounds made the ticks that flush longer for little gain (1,000,000: 18 against
#: 17 us a summary at 50,000/s, ticks up to 600 ms)
FLUSH_ARRAY_ROWS = 500_000
#: pending samples of layouts the store does not know yet that force a flush: new nodes go the
#: store's general path (seconds for 250,000 rows, the event loop blocked); a small early flush
#: teaches the store their layouts, and later flushes take the fast path
FLUSH_NEW_ROWS = 20_000
_F8 = np.dtype("<f8")
LAYOUTS_PER_NODE = 4  # a node whose values come and go (None) sends a few layouts
LAYOUT_BUDGET_PER_SAMPLE = 4  # store layout-cache budget per sample of the layouts we know (see StoreFeed.flush)
#: summary keys that are not window-store samples
NOT_SAMPLES = frozenset({BURST_STARTS, BURST_BYTES}) | frozenset(CTL_SIGNALS) | ENGINE_KEYS


def _matrix(run: list["_Pending"], all_bytes: bool) -> np.ndarray:
    """The values of consecutive summaries of one layout, a row each: float64 rows' bytes
    joined and read as they are (``all_bytes``: each is such a row), Python floats converted
    once."""
    if all_bytes:
        return np.frombuffer(b"".join([p.values for p in run]), _F8).reshape(len(run), -1)  # type: ignore[misc]
    return np.array([_row(p.values) for p in run], dtype=np.float64)


def _row(values: list[float] | bytes) -> list[float] | np.ndarray:
    return np.frombuffer(values, _F8) if type(values) is bytes else values  # type: ignore[arg-type]


@dataclass
class _Layout:
    """Which samples a node's summary carries (signal and entity per position), as the column
    arrays of a SampleBatch, shared by every batch of that layout."""

    names: list[str]
    entities: list[str]
    signal_col: np.ndarray
    entity_col: np.ndarray
    node_col: np.ndarray

    @classmethod
    def of(cls, p: "_Pending") -> "_Layout":
        def col(values: list[str]) -> np.ndarray:
            a = np.empty(len(values), dtype=object)
            a[:] = values
            return a

        return cls(list(p.names), list(p.entities), col(p.names), col(p.entities), col([p.node] * len(p.names)))


@dataclass(slots=True)
class _Pending:
    """One summary's samples, waiting for the next store flush."""

    node: str
    t: float
    names: list[str]
    entities: list[str]
    values: list[float] | bytes  # Python floats, or a float64 LE row's bytes (add_row); no NaN
    layout: _Layout | None  # the node's known layout when the summary matches it


class StoreFeed:
    """Owns the samples waiting for the window store and the layouts the store knows; the
    :class:`~skewd.controller.service.Controller` feeds it every summary (and the leader every
    digest row) and flushes it at each tick."""

    def __init__(self, store: WindowStore) -> None:
        self.store = store
        # a node's summary signals are one-row blocks written together: one slab write per
        # node and flush instead of one per signal (the flush's largest cost)
        store.node_slabs = True
        #: summary samples not yet in the store, per node in arrival order: a flush writes a
        #: node's at a time (the general path's one batch, node after node, gives new entities
        #: the ids that batch in arrival order gives them: tests/controller/test_ingest_flush.py)
        self._pending: dict[str, list[_Pending]] = {}
        self._unsorted: set[str] = set()  # nodes with a pending summary older than one before it
        self._unknown = 0  # pending summaries without a known layout (the flush's general path)
        self._pending_rows = 0
        self._pending_lists = 0  # ... of them held as lists of Python floats (see FLUSH_ARRAY_ROWS)
        self._pending_new = 0  # ... of them from summaries whose layout the store does not know yet
        self._layouts: dict[str, list[_Layout]] = {}  # node → its summaries' layouts the store holds rows for
        self._store_gcs = 0  # store.gc calls that forgot entities (rows our layouts may point at)
        self._layouts_gcs = -1  # ... when _layouts was last known valid
        self._ncat = -1
        self._derived_layouts: dict[str, _Layout] = {}  # node → its ctl_* signals the store holds rows for
        self._derived_gcs = -1
        self._derived_ncat = -1
        self.fast_flushes = 0  # flushes that took the per-summary path (tests look)
        #: leave a due flush to the owner (:attr:`due`) instead of flushing inside :meth:`add`:
        #: a started controller flushes on its tick thread, off the event loop
        self.defer_flush = False
        self._shapes: dict[str, tuple] = {}  # node → its summaries' last shape (see samples)
        self._layouts_changed = 0  # bumped whenever _layouts changes: add_row's matches stay valid until then
        self._row_layouts: dict[tuple[str, object], tuple[int, _Layout | None]] = {}  # (node, key) → match

    def samples(self, node: str, sig: dict[str, dict[str, float | None]]) -> tuple[list, list, list]:
        """A summary's samples as (signal names, entities, values), None values left out. A node
        sends the same signals and entities summary after summary: when this one has the
        node's last shape (same signal keys in the same order, the same entity count per
        sample signal, no None), the values are read in one comprehension and the names and
        entities are the shape's own lists; anything else is walked and becomes the new shape."""
        sh = self._shapes.get(node)
        if sh is not None and sh[0] == tuple(sig):
            _, pairs, names, ents, sample_names, counts = sh
            try:
                if list(map(len, map(sig.__getitem__, sample_names))) == counts:
                    values = [sig[n][e] for n, e in pairs]
                    if None not in values:
                        return names, ents, values
            except KeyError:  # an entity renamed: the walk below
                pass
        names, ents, values = [], [], []
        sample_names, counts = [], []
        complete = True
        for name, es in sig.items():
            if name in NOT_SAMPLES:
                continue
            sample_names.append(name)
            counts.append(len(es))
            for ent, v in es.items():
                if v is not None:
                    names.append(name)
                    ents.append(ent)
                    values.append(float(v))
                else:
                    complete = False
        if complete:
            self._shapes[node] = (tuple(sig), list(zip(names, ents)), names, ents, sample_names, counts)
        return names, ents, values

    def add(self, node: str, t: float, names: list[str], ents: list[str],
            values: list[float]) -> tuple[list[str], list[str]]:
        """Queue one node's samples at ``t`` for the next store flush, recognising the node's
        known layout (returns the layout's lists when they match, else the ones given)."""
        lay = self._known(node, names, ents)
        if lay is not None:  # the layout's lists stand for these (equal) ones
            names, ents = lay.names, lay.entities
        self._pending_lists += len(values)
        self._queue(_Pending(node, t, names, ents, values, lay))
        return names, ents

    def add_row(self, node: str, t: float, key: object, names: list[str], ents: list[str], row: bytes) -> None:
        """:meth:`add` of a row of float64s (little-endian bytes) without NaN whose signals
        and entities are always ``names`` and ``ents`` for ``key`` (a binary summary's layout):
        the node's known layout is looked up once per key, not compared per summary, and the
        rows are joined, not converted, at the flush."""
        hit = self._row_layouts.get((node, key))
        if hit is not None and hit[0] == self._layouts_changed:
            lay = hit[1]
        else:
            lay = self._known(node, names, ents)
            if len(self._row_layouts) > 4 * (len(self._layouts) + 1) * LAYOUTS_PER_NODE:
                self._row_layouts.clear()  # keys of nodes gone, layouts replaced
            self._row_layouts[(node, key)] = (self._layouts_changed, lay)
        n = len(names)
        if lay is not None:
            names, ents = lay.names, lay.entities
        else:
            self._pending_new += n
            self._unknown += 1
        # (_queue, inline: the hot path)
        ps = self._pending.get(node)
        if ps is None:
            ps = self._pending[node] = []
        elif t < ps[-1].t:
            self._unsorted.add(node)
        ps.append(_Pending(node, t, names, ents, row, lay))
        self._pending_rows += n
        if not self.defer_flush and self.due:
            self.flush()

    def _known(self, node: str, names: list[str], ents: list[str]) -> _Layout | None:
        """The node's known layout of these samples, if any."""
        for known in self._layouts.get(node, ()):
            if known.names == names and known.entities == ents:
                return known
        return None

    def _queue(self, p: _Pending) -> None:
        ps = self._pending.get(p.node)
        if ps is None:
            ps = self._pending[p.node] = []
        elif p.t < ps[-1].t:
            self._unsorted.add(p.node)
        ps.append(p)
        self._pending_rows += len(p.values)
        if p.layout is None:
            self._pending_new += len(p.values)
            self._unknown += 1
        if not self.defer_flush and self.due:
            self.flush()

    @property
    def due(self) -> bool:
        """Enough samples wait that they should go into the store before the next tick."""
        # one summary of a layout the store does not know sends them all the general way: as
        # many as lists then
        return (self._pending_lists >= FLUSH_ROWS or self._pending_new >= FLUSH_NEW_ROWS
                or self._pending_rows >= (FLUSH_ROWS if self._pending_new else FLUSH_ARRAY_ROWS))

    def flush(self) -> None:
        """Summary samples into the window store. The store's fast path takes one-node,
        one-time batches whose rows it knows, so when every pending summary has a layout the
        store already holds (and the store's shape is unchanged since), each summary goes in
        as its own batch, grouped by node and in time order per node: the same columns and
        values as the one multi-node batch of the general path, which is taken otherwise, so
        new entities get their ids in the same order as always."""
        if not self._pending:
            return
        pend, self._pending, self._pending_rows, self._pending_new = self._pending, {}, 0, 0
        all_bytes, self._pending_lists = not self._pending_lists, 0  # (add_row's rows only)
        unsorted, self._unsorted = self._unsorted, set()
        new, self._unknown = self._unknown, 0
        store = self.store
        # a known layout means the store holds a row for each of its catalogued samples: only a
        # gc that forgets entities, or a catalogue that grows, can make that untrue (new rows
        # and blocks elsewhere leave it true)
        same_shape = self._store_gcs == self._layouts_gcs and len(store.catalogue) == self._ncat
        if same_shape and not new:
            # a layout's column arrays are made once and never modified: the store may know
            # them by identity; its layout cache is sized to hold every node's (see below).
            # A node's consecutive summaries of one layout go in as one matrix (the store's
            # ingest_collections: what ingest_many does with consecutive batches of a layout,
            # without a SampleBatch and a layout check per summary); a run whose layout the
            # store no longer caches takes ingest_many, which learns it again
            for node, ps in pend.items():
                if node in unsorted:
                    ps = sorted(ps, key=lambda p: p.t)  # stable: a repeated time keeps arrival order
                i = 0
                while i < len(ps):
                    lay = ps[i].layout
                    j = i + 1
                    while j < len(ps) and ps[j].layout is lay:
                        j += 1
                    if j == i + 1:  # one summary of the layout (a node at the agents' 1 s, a digest row)
                        p = ps[i]
                        store.ingest_collection(lay.signal_col, lay.entity_col, lay.node_col, p.t,
                                                np.asarray(_row(p.values), dtype=np.float64))
                        i = j
                        continue
                    run = ps[i:j]
                    ts = np.array([p.t for p in run])
                    V = _matrix(run, all_bytes)
                    if not store.ingest_collections(lay.signal_col, lay.entity_col, lay.node_col, ts, V):
                        store.ingest_many([SampleBatch(np.full(V.shape[1], p.t), lay.node_col, lay.entity_col,
                                                       lay.signal_col, V[k]) for k, p in enumerate(run)],
                                          shared_columns=True)
                    i = j
            self.fast_flushes += 1
        else:
            pend = [p for ps in pend.values() for p in ps]
            store.ingest(SampleBatch.from_rows(
                [(p.t, p.node, e, n, v) for p in pend for n, e, v in zip(p.names, p.entities, _row(p.values))]))
            if not same_shape:
                self._layouts.clear()
            self._layouts_changed += 1
            for p in pend:
                known = self._layouts.setdefault(p.node, [])
                if any(k.names == p.names and k.entities == p.entities for k in known) or not self._in_store(p):
                    continue
                known.append(_Layout.of(p))
                del known[:-LAYOUTS_PER_NODE]
            self._size_layout_cache()
        self._layouts_gcs, self._ncat = self._store_gcs, len(store.catalogue)

    def ingest_derived(self, t: float, derived: dict[str, dict[str, float]]) -> None:
        """The tick's ctl_* values into the store. Like summaries: when every node's derived
        signals are a set the store already holds rows for, one batch per node (the store's
        fast path, by identity); otherwise one multi-node batch, the general way, and the
        nodes' sets are learned."""
        store = self.store
        per_node = []
        known = self._store_gcs == self._derived_gcs and len(store.catalogue) == self._derived_ncat
        for node, vals in derived.items():
            names = [sig for sig, v in vals.items() if v is not None and not math.isnan(v)]
            if not names:
                continue
            lay = self._derived_layouts.get(node)
            if known and (lay is None or lay.names != names):
                known = False
            per_node.append((node, names, [vals[n] for n in names], lay))
        if not per_node:
            return
        if known:
            for _, _, vs, lay in per_node:  # as the summaries' flush: one collection per node
                store.ingest_collection(lay.signal_col, lay.entity_col, lay.node_col, t, np.array(vs, dtype=np.float64))
            return
        store.ingest(SampleBatch.from_rows([(t, node, "", n, v) for node, names, vs, _ in per_node
                                            for n, v in zip(names, vs)]))
        if self._store_gcs != self._derived_gcs or len(store.catalogue) != self._derived_ncat:
            self._derived_layouts.clear()
        for node, names, vs, lay in per_node:
            if lay is not None and lay.names == names:
                continue
            p = _Pending(node, t, names, [""] * len(names), vs, None)
            if self._in_store(p):
                self._derived_layouts[node] = _Layout.of(p)
            else:
                self._derived_layouts.pop(node, None)
        self._derived_gcs, self._derived_ncat = self._store_gcs, len(store.catalogue)
        self._size_layout_cache()

    def _size_layout_cache(self) -> None:
        """Every node's summaries and derived values are one-node batches to the store: keep all
        their layouts cached there (the default bound is one agent's; only speed depends on it)."""
        n = sum(len(k.names) for ks in self._layouts.values() for k in ks)
        n += sum(len(k.names) for k in self._derived_layouts.values())
        self.store.layout_budget = max(self.store.layout_budget, LAYOUT_BUDGET_PER_SAMPLE * n)

    def gc(self, now: float) -> int:
        """``store.gc`` (always through here: :meth:`flush` must know when rows were forgotten)."""
        removed = self.store.gc(now)
        if removed:
            self._store_gcs += 1
        return removed

    def _in_store(self, p: "_Pending") -> bool:
        """Whether the store has a row for every catalogued sample of ``p``."""
        cat, blocks = self.store.catalogue, self.store.blocks
        for name, ent in zip(p.names, p.entities):
            if cat.get(name) is None:
                continue  # uncatalogued: the store counts and drops it on either path
            blk = blocks.get(name, {}).get(p.node)
            if blk is None or ent not in blk.rows:
                return False
        return True


    def forget_node(self, node: str) -> None:
        """Drop the node's rows from the store and what is known of its layouts (they come back
        with its next summary)."""
        if self.store.forget_node(node):
            self._store_gcs += 1  # the store's rows moved: layouts learned before are void
        self._layouts.pop(node, None)
        self._layouts_changed += 1
        self._shapes.pop(node, None)
        self._derived_layouts.pop(node, None)
