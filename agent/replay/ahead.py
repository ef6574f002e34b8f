"""Ingesting many ticks' collections into a node's store at once, while its ticks wait for their range evaluation.

Why: the store's cost is per signal and write, not per sample (a slice assignment per block),
and a recording's tick brings ten collections of each collector at 10 Hz. Replay already
ingests ahead of a range of waiting ticks (``Replayer._may_ingest_ahead``); here the
collections of those ticks are held back and written in one go per layout when something reads
the store: the range evaluation, a recomputed summary, the gc check, a checkpoint digest.

Why it gives the same store: a run only takes collections whose layout the store has cached
(no row or block is created, so nothing is born in the range), whose signals are all
catalogued, whose samples are all newer than everything before (nothing is dropped as out of
order), whose layouts write disjoint blocks (the order between layouts does not matter then),
and fewer of them than the fewest free columns of any block (no block makes room, so no column
a waiting tick reads is dropped). Under these conditions ``WindowStore.ingest_collections`` of
a layout's collections equals ingesting them batch by batch, and the store's newest time after
each tick is the run's newest time so far. Anything else writes the run and goes the old way.
"""
from __future__ import annotations

import numpy as np

from skewd.agent.pipeline import Pipeline
from skewd.model import SampleBatch

from .feed import Shape


class _Run:
    """The held-back collections of one node since its store was last written."""

    __slots__ = ("version", "free", "latest", "layouts", "owner", "most")

    def __init__(self, version: tuple, free: int, latest: float) -> None:
        self.version = version
        self.free = free  # the fewest free columns of any block when the run began
        self.latest = latest  # the newest sample time, store and run together
        #: id(shape) → (shape, times, values, [collections], [newest time])
        self.layouts: dict[int, tuple[Shape, list[np.ndarray], list[np.ndarray], list[int], list[float]]] = {}
        self.owner: dict[int, int] = {}  # id(block) → id(shape) writing it
        self.most = 0  # the most collections of any one layout (new columns of its blocks)


class AheadIngest:
    """The runs of every node of a replay (``Replayer`` owns one)."""

    def __init__(self) -> None:
        self.runs: dict[str, _Run] = {}
        self.written = 0  # samples written by runs (the rest went batch by batch)

    def offer(self, node: str, pipe: Pipeline, cols: list[tuple[Shape, np.ndarray, np.ndarray]]) -> bool:
        """Hold back one tick's collections of ``node`` (grouped by shape, see
        ``feed.Chunk.collections``) if the run can take them (module doc); False: nothing held,
        ingest them now."""
        if pipe.sinks or not cols:
            return False
        st = pipe.store
        ver = (st.version, len(st.catalogue))
        run = self.runs.get(node)
        if run is not None and run.version != ver:  # the store changed under the run: never expected
            self.write(node, pipe)
            run = None
        latest = run.latest if run is not None else st.latest_t
        owner = run.owner if run is not None else {}
        layouts = run.layouts if run is not None else {}
        new_owner: dict[int, int] = {}
        adds: dict[int, tuple[int, float]] = {}  # id(shape) → (collections, newest time) this tick
        hi = latest
        for shape, ts, _ in cols:
            sid = id(shape)
            got = layouts.get(sid)
            before = adds.get(sid)
            last = before[1] if before is not None else (got[4][0] if got is not None else latest)
            if not float(ts[0]) > max(last, latest) or (len(ts) > 1 and not bool((ts[1:] > ts[:-1]).all())):
                return False
            if got is None and before is None:  # a layout new to the run: are its blocks free?
                blocks = st.cached_layout_blocks(shape.signal, shape.entity, shape.node)
                if blocks is None:
                    return False
                for b in blocks:
                    o = owner.get(b, new_owner.get(b))
                    if o is not None and o != sid:
                        return False
                    new_owner[b] = sid
            adds[sid] = ((before[0] if before is not None else 0) + len(ts), float(ts[-1]))
            hi = max(hi, float(ts[-1]))
        most = run.most if run is not None else 0
        for sid, (k, _) in adds.items():
            got = layouts.get(sid)
            most = max(most, (got[3][0] if got is not None else 0) + k)
        if run is None:
            run = _Run(ver, st.min_free_columns(), st.latest_t)
        if most >= run.free:
            return False
        self.runs[node] = run
        run.owner.update(new_owner)
        run.most = most
        run.latest = hi
        for shape, ts, vals in cols:
            got = run.layouts.get(id(shape))
            if got is None:
                got = run.layouts[id(shape)] = (shape, [], [], [0], [latest])
            got[1].append(ts)
            got[2].append(vals)
            got[3][0] += len(ts)
            got[4][0] = float(ts[-1])
        return True

    def latest(self, node: str, pipe: Pipeline) -> float:
        """The store's newest sample time as if the run were written."""
        run = self.runs.get(node)
        return run.latest if run is not None else pipe.store.latest_t

    def write(self, node: str, pipe: Pipeline) -> None:
        """Write ``node``'s run into its store (before anything reads the store)."""
        run = self.runs.pop(node, None)
        if run is None or not run.layouts:
            return
        st = pipe.store
        for shape, ts, vals, _, _ in run.layouts.values():
            t = np.concatenate(ts) if len(ts) > 1 else ts[0]
            v = np.concatenate(vals) if len(vals) > 1 else vals[0]
            if st.ingest_collections(shape.signal, shape.entity, shape.node, t, v):
                self.written += v.size
            else:  # the store let the layout go (its cache is bounded): the same, batch by batch
                n = len(shape.signal)
                st.ingest_many([SampleBatch(np.full(n, t[j]), shape.node, shape.entity, shape.signal, v[j])
                                for j in range(len(t))], shared_columns=True)
        pipe.__dict__.pop("_range_budget", None)  # Replayer._may_ingest_ahead counts from the store again

    def write_all(self, pipelines: dict[str, Pipeline]) -> None:
        for node in list(self.runs):
            self.write(node, pipelines[node])
