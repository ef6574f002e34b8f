"""The window store: per (signal, node) blocks of ring-buffered samples.

A block holds one node's samples of one signal on a shared time axis (one column per
collection tick) and one row per entity, so a window is a contiguous column slice found with
a single ``searchsorted`` and every window function is one numpy reduction over all entities.
Samples from different nodes never share a time axis (their clocks and ticks differ), so a
late summary from one node never reorders another's.

Entities get small integer ids from a registry (recycled when they age out) so that values
from different signals and blocks align by fancy indexing instead of dictionaries.

Nothing here reads the clock: callers pass ``now``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from skewd.model import Catalogue, SampleBatch, Scope, SignalSpec

_NAN = np.nan


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
    """One node's samples of one signal: times[cap], values[rows, cap], used columns [0, n)."""

    node: str
    scope: Scope
    times: np.ndarray
    values: np.ndarray
    eids: np.ndarray  # row → entity id (int64); -1 for a row being recycled
    rows: dict[str, int] = field(default_factory=dict)  # entity name → row
    n: int = 0
    last_seen: np.ndarray = field(default_factory=lambda: np.empty(0))  # row → last sample time
    cache: tuple | None = None  # (entities of the last append, their rows)

    @classmethod
    def new(cls, node: str, scope: Scope, cap: int = 64, rows: int = 4) -> "Block":
        return cls(node, scope, np.full(cap, np.inf), np.full((rows, cap), _NAN),
                   np.full(rows, -1, dtype=np.int64), {}, 0, np.full(rows, -np.inf))

    @property
    def nrows(self) -> int:
        return len(self.rows)

    def window(self, start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
        """Columns with start < t <= end: (times[k], values[rows, k]) as views."""
        lo = int(np.searchsorted(self.times[: self.n], start, side="right"))
        hi = int(np.searchsorted(self.times[: self.n], end, side="right"))
        return self.times[lo:hi], self.values[: self.nrows, lo:hi]


class WindowStore:
    """Ingests SampleBatches; serves windows per signal across nodes.

    ``horizon`` bounds how far back any rule may look; older columns are compacted away.
    Out-of-order samples (older than the newest column of their block) are dropped and
    counted in ``dropped_out_of_order`` – collectors stamp monotonic tick times, so this
    only happens with a misbehaving source.
    """

    def __init__(self, catalogue: Catalogue, horizon: float = 600.0, initial_cap: int = 64) -> None:
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

    # -- ingest ----------------------------------------------------------------------------
    def ingest(self, batch: SampleBatch) -> None:
        if not len(batch):
            return
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
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            idx = order[a:b]
            i0 = idx[0]
            self._append(sig[i0], node[i0], float(t[i0]), batch.entity[idx], batch.value[idx])
        self.samples_ingested += len(batch)

    def _append(self, signal_name: str, node: str, t: float, entities: np.ndarray,
                values: np.ndarray) -> None:
        spec = self.catalogue.get(signal_name)
        if spec is None:
            self.dropped_uncatalogued[signal_name] = self.dropped_uncatalogued.get(signal_name, 0) + len(values)
            return
        per_node = self.blocks.setdefault(signal_name, {})
        blk = per_node.get(node)
        if blk is None:
            blk = per_node[node] = Block.new(node, spec.scope, self.initial_cap)
            self.version += 1
        if blk.n and t < blk.times[blk.n - 1]:
            self.dropped_out_of_order += len(values)
            return
        if not blk.n or t > blk.times[blk.n - 1]:
            if blk.n == blk.times.shape[0]:
                self._make_room(blk, t)
            blk.times[blk.n] = t
            blk.n += 1
        col = blk.n - 1
        # collectors report the same entities in the same order tick after tick: reuse the rows
        cached = blk.cache
        if cached is not None and len(cached[0]) == len(entities) and (cached[0] == entities).all():
            rows = cached[1]
        else:
            rows = np.fromiter((self._row(blk, str(e)) for e in entities), dtype=np.int64, count=len(entities))
            blk.cache = (entities.copy(), rows)
        blk.values[rows, col] = values
        blk.last_seen[rows] = t
        if t > self.latest_t:
            self.latest_t = t

    def _row(self, blk: Block, entity: str) -> int:
        r = blk.rows.get(entity)
        if r is not None:
            return r
        r = len(blk.rows)
        if r == blk.values.shape[0]:
            grow = max(4, r)
            blk.values = np.vstack([blk.values, np.full((grow, blk.values.shape[1]), _NAN)])
            blk.eids = np.concatenate([blk.eids, np.full(grow, -1, dtype=np.int64)])
            blk.last_seen = np.concatenate([blk.last_seen, np.full(grow, -np.inf)])
        blk.rows[entity] = r
        eid = self.registry.get(blk.scope, blk.node, entity)
        self.registry.ref(eid)
        blk.eids[r] = eid
        self.version += 1
        return r

    def _make_room(self, blk: Block, t: float) -> None:
        """Drop columns older than the horizon; grow when the horizon still needs them."""
        cutoff = t - self.horizon
        keep_from = int(np.searchsorted(blk.times[: blk.n], cutoff, side="right"))
        if keep_from == 0 or blk.n - keep_from > blk.times.shape[0] // 2:
            cap = blk.times.shape[0] * 2
            times = np.full(cap, np.inf)
            values = np.full((blk.values.shape[0], cap), _NAN)
        else:
            times, values = blk.times, blk.values
        m = blk.n - keep_from
        times[:m] = blk.times[keep_from: blk.n]
        values[:, :m] = blk.values[:, keep_from: blk.n]
        times[m:] = np.inf
        values[:, m:] = _NAN
        blk.times, blk.values, blk.n = times, values, m

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
