"""The agent's spine, shared by live mode and replay: batches in, evaluation at given times,
transitions out to plugged-in sinks.

Live mode feeds it from scheduled collectors and passes the wall clock at each tick; replay
feeds it a capture bundle's batches and recorded tick times. Nothing here reads the clock.
"""
from __future__ import annotations

from typing import Iterable, Protocol

import numpy as np

from skewd.model import Catalogue, Finding, SampleBatch
from skewd.rules.engine import Engine, RuleSet
from skewd.rules.store import WindowStore


class Sink(Protocol):
    """Anything that wants the stream: publisher, recorder, live view, tests."""

    def on_batch(self, batch: SampleBatch) -> None: ...

    def on_tick(self, t: float, findings: list[Finding]) -> None: ...


def by_time(batch: SampleBatch) -> list[SampleBatch]:
    """A batch whose samples carry several timestamps (the pkt collector stamps each ended
    burst with its own time) as one batch per timestamp, in time order (sample order kept
    within each). The store ingests them exactly as the whole batch, but each part has one
    timestamp, so it takes the store's cached-layout path: the collection's bulk keeps its
    layout and the few burst samples form small layouts of their own."""
    t = batch.t
    if not len(t) or (t == t[0]).all():
        return [batch]
    o = np.argsort(t, kind="stable")  # keeps sample order within a timestamp
    ts, nd, en, sg, va = t[o], batch.node[o], batch.entity[o], batch.signal[o], batch.value[o]
    cut = np.flatnonzero(ts[1:] != ts[:-1]) + 1
    return [SampleBatch(ts[a:b], nd[a:b], en[a:b], sg[a:b], va[a:b])  # views of one sorted copy
            for a, b in zip(np.r_[0, cut].tolist(), np.r_[cut, len(o)].tolist())]


class Pipeline:
    """Owns one node's window store, rule engine and sinks: batches in, transitions out to the
    sinks; the live agent, the recorder CLI, replay and the lab harness feed it."""

    def __init__(self, catalogue: Catalogue, ruleset: RuleSet, *, node: str, cluster: str = "",
                 labels: dict[str, str] | None = None, lookback: float = 60.0, horizon: float = 600.0,
                 sinks: Iterable[Sink] = (), gc_every: float = 30.0) -> None:
        self.catalogue = catalogue
        self.node = node
        self.store = WindowStore(catalogue, horizon=horizon)
        self.engine = Engine(ruleset, self.store, lookback=lookback, cluster=cluster)
        self.store.registry.set_node_labels(node, {"cluster": cluster, **(labels or {})})
        self.sinks: list[Sink] = list(sinks)
        self.gc_every = gc_every
        self._last_gc = None
        self.ticks = 0
        self.findings_total: dict[str, int] = {}

    def add_sink(self, sink: Sink) -> None:
        self.sinks.append(sink)

    def ingest(self, batch: SampleBatch) -> None:
        if not len(batch):
            return
        t = batch.t
        if t[0] == t[-1] and (t == t[0]).all():
            self.store.ingest(batch)
        else:
            self.store.ingest_many(by_time(batch))
        for s in self.sinks:
            s.on_batch(batch)

    def ingest_many(self, batches: list[SampleBatch], shared_columns: bool = False) -> None:
        """Every batch due before an evaluation at once (replay): the store writes a collector's
        collections together; the store ends up as with one :meth:`ingest` per batch. Sinks see
        each batch in order after the store has taken them all. ``shared_columns``: see
        :meth:`WindowStore.ingest_many`."""
        if any(len(b) and not (b.t == b.t[0]).all() for b in batches):
            self.store.ingest_many([p for b in batches for p in by_time(b)], shared_columns)
        else:
            self.store.ingest_many(batches, shared_columns)
        for batch in batches:
            if len(batch):
                for s in self.sinks:
                    s.on_batch(batch)

    def evaluate(self, t: float) -> list[Finding]:
        findings = self.engine.evaluate(t)
        self._after_tick(t, findings, gc=True)
        return findings

    def evaluate_range(self, ts: list[float], seen: list[float]) -> list[list[Finding]]:
        """:meth:`evaluate` at each of ``ts`` (their samples are in the store already) in one
        range evaluation; the store gc runs only at the last tick (a replay ends its ranges
        where a gc at an earlier tick would change what later ticks see)."""
        per_tick = self.engine.evaluate_range(ts, self.store.take_births(), seen)
        for j, (t, findings) in enumerate(zip(ts, per_tick)):
            self._after_tick(t, findings, gc=j == len(ts) - 1)
        return per_tick

    def _after_tick(self, t: float, findings: list[Finding], gc: bool) -> None:
        if self._last_gc is None:
            self._last_gc = t
        elif t - self._last_gc >= self.gc_every:
            if gc:
                self.store.gc(t)
            self._last_gc = t
        self.ticks += 1
        for f in findings:
            self.findings_total[f.state.value] = self.findings_total.get(f.state.value, 0) + 1
        for s in self.sinks:
            s.on_tick(t, findings)
