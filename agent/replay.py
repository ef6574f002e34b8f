"""``skewd replay``: capture bundles back through the agent's pipeline, deterministically.

The bundle is the Source: each node's samples are ingested in the recorded SampleBatch
boundaries and evaluated at the recorded tick times by the same :class:`Pipeline` the live
agent runs (node-local scopes), so a bundle replays to the findings the agent raised. When
the bundles cover several nodes, the group rules (``tp_group``/``cluster`` scopes) run too,
as the controller runs them: one group :class:`Engine` over the node summaries (the recorded
ones, or recomputed with :func:`skewd.agent.summary.compute` when a bundle has none),
evaluated every ``evaluation_interval`` from the first tick.

Nothing here reads the clock except the optional pacing (``--speed 1x``): the output depends
only on the bundle and the rules, so two replays print byte-identical results.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import heapq
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence, TextIO

import numpy as np

from skewd import wire
from skewd.model import (GROUP_SCOPES, NODE_SCOPES, BatchBuilder, Catalogue, Finding, SampleBatch, State,
                         parse_duration)
from skewd.rules.engine import Engine, RuleSet
from skewd.rules.loader import LoadIssue, load_rules
from skewd.rules.store import WindowStore

from . import bundle as B
from . import summary as summary_mod
from .pipeline import Pipeline

EXIT_OK, EXIT_DIFF, EXIT_USAGE, EXIT_DAMAGED = 0, 1, 2, 3


class ReplayError(Exception):
    """Replay cannot start (no rules, rules do not load, no readable segment)."""


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

def open_segments(paths: Sequence[str | Path], limits: B.BundleLimits = B.DEFAULT_LIMITS
                  ) -> tuple[list[B.Segment], list[B.Damage]]:
    """Every segment under ``paths``, oldest first; unusable ones are reported, not fatal."""
    segs, damage = [], []
    for p in B.find_segments(paths):
        try:
            segs.append(B.Segment(p, limits))
        except B.BundleError as e:
            damage.append(B.Damage(e.path, e.offset or 0, e.message))
    segs.sort(key=lambda s: (s.start, str(s.path)))
    return segs, damage


def replay_catalogue(segments: Sequence[B.Segment], warn: TextIO | None = None) -> Catalogue:
    """This skewd's full catalogue plus any signal the bundles recorded that it does not know
    (a bundle from a host with another collector set still replays)."""
    try:
        from skewd.catalogue import full_catalogue

        cat = full_catalogue()
    except Exception as e:  # a broken collector package must not make a bundle unreadable
        if warn is not None:
            print(f"skewd replay: full signal catalogue unavailable ({type(e).__name__}: {e}); "
                  "using the bundle's catalogue snapshot", file=warn)
        cat = Catalogue(summary_mod.CATALOGUE)
    for seg in segments:
        for spec in seg.catalogue():
            if spec.name not in cat:
                cat.add(spec)
    return cat


def _load(paths: Sequence[str | Path], catalogue: Catalogue) -> RuleSet:
    res = load_rules(paths, catalogue)
    if not res.ok:
        raise RuleLoadFailed(res.issues)
    return res.ruleset


class RuleLoadFailed(ReplayError):
    def __init__(self, issues: list[LoadIssue]) -> None:
        super().__init__("rules do not load:\n" + "\n".join(f"  {i}" for i in issues))
        self.issues = issues


def parse_time(text: str, start: float) -> float:
    """``--from/--to``: a duration from the first recorded evaluation (``90s``, ``2m``), an ISO-8601
    time (``2024-05-01T12:00:00Z``) or epoch seconds (``1714564800.5``)."""
    s = text.strip()
    try:
        return start + parse_duration(s) if not _is_number(s) else float(s)
    except ValueError:
        pass
    try:
        d = _dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"bad time {text!r}: write a duration from the start (30s, 2m), "
                         "an ISO time (2024-05-01T12:00:00Z) or epoch seconds") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=_dt.timezone.utc)
    return d.timestamp()


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def parse_speed(text: str) -> float | None:
    """``max`` → None (as fast as possible); ``1x``, ``10x``, ``0.5x`` → factor."""
    s = text.strip().lower()
    if s == "max":
        return None
    if s.endswith("x"):
        s = s[:-1]
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"bad speed {text!r}: write max, 1x, 10x ...") from None
    if not v > 0:
        raise ValueError(f"bad speed {text!r}: must be positive")
    return v


# ---------------------------------------------------------------------------------------------
# The replay loop
# ---------------------------------------------------------------------------------------------

@dataclass
class Event:
    """One step of the replay: an evaluation time and what it produced."""

    t: float
    findings: list[Finding]
    summaries: list[wire.Summary] = field(default_factory=list)


@dataclass
class ReplayResult:
    findings: list[Finding]
    damage: list[B.Damage]
    segments: list[B.Segment]
    rulesets: dict[str, RuleSet]  # version → rules used
    nodes: list[str]
    evaluations: int
    group_evaluations: int
    start: float
    end: float
    stopped_early: list[str] = field(default_factory=list)
    summaries: list[wire.Summary] = field(default_factory=list)

    @property
    def ruleset(self) -> RuleSet:
        return next(iter(self.rulesets.values())) if self.rulesets else RuleSet([], [], "")


class _SegmentFeed:
    """Pulls one segment's batches in order up to a batch number and routes them per node.

    It reads whole stored chunks: a chunk's node column is checked once, not per batch, and the
    batches of a chunk with the same (node, entity, signal) codes share one set of those column
    arrays, so the store recognises a collector's layout by identity instead of comparing
    strings (see ``WindowStore.ingest_many``'s ``shared_columns``)."""

    def __init__(self, seg: B.Segment, nodes: set[str] | None) -> None:
        self.seg = seg
        self.chunks = seg.iter_sample_chunks()
        self.nodes = nodes
        self.done = 0
        self._chunk: tuple | None = None
        self._pos = 0

    def _load(self) -> bool:
        for seq, c, codes in self.chunks:
            if not len(seq):
                continue
            cuts = np.flatnonzero(seq[1:] != seq[:-1]) + 1
            node = c.node
            one = str(node[0]) if bool((node == node[0]).all()) else None
            self._chunk = (seq, c, codes, [0] + cuts.tolist(), cuts.tolist() + [len(seq)], one, {})
            self._pos = 0
            return True
        self._chunk = None
        return False

    def until(self, n: int) -> Iterator[tuple[str, SampleBatch]]:
        while True:
            if self._chunk is None or self._pos == len(self._chunk[3]):
                if not self._load():
                    return
            seq, c, codes, starts, ends, one, shapes = self._chunk
            a, b = starts[self._pos], ends[self._pos]
            num = int(seq[a])
            if num >= n:
                return
            self._pos += 1
            self.done = num + 1
            cols = None
            if codes is not None:
                key = codes[a:b].tobytes()
                cols = shapes.get(key)
                if cols is None:
                    # copies: the store may keep them, and must not keep the whole chunk alive
                    cols = shapes[key] = (c.node[a:b].copy(), c.entity[a:b].copy(), c.signal[a:b].copy())
            else:
                cols = (c.node[a:b], c.entity[a:b], c.signal[a:b])
            batch = SampleBatch(c.t[a:b], cols[0], cols[1], cols[2], c.value[a:b])
            if one is not None:
                if self.nodes is None or one in self.nodes:
                    yield one, batch
                continue
            nodes = batch.node
            first = nodes[0]
            if (nodes == first).all():
                if self.nodes is None or first in self.nodes:
                    yield str(first), batch
                continue
            for n_ in dict.fromkeys(nodes.tolist()):
                if self.nodes is None or n_ in self.nodes:
                    yield str(n_), batch.select(nodes == n_)


class Replayer:
    """Drives pipelines from segments. Iterate :meth:`events` (for pacing/publishing), or
    call :meth:`run` for the whole result."""

    def __init__(self, segments: Sequence[B.Segment], catalogue: Catalogue, *,
                 rules: Sequence[str | Path] | None = None, t_from: float | None = None,
                 t_to: float | None = None, nodes: Sequence[str] | None = None, group: bool = True,
                 open_damage: Sequence[B.Damage] = (), range_eval: bool = True, max_range: int = 300,
                 max_nodes: int = B.DEFAULT_LIMITS.nodes) -> None:
        """``range_eval``: evaluate each node's ticks in ranges of up to ``max_range`` ticks
        (same findings, see :meth:`events`); False evaluates at every tick as it is reached."""
        if not segments:
            raise ReplayError("no readable capture segment")
        self.segments = list(segments)
        self.catalogue = catalogue
        self.t_from = t_from
        self.t_to = t_to
        self.only = set(nodes) if nodes else None
        self.open_damage = list(open_damage)
        self.range_eval = bool(range_eval)
        self.max_range = max(1, int(max_range))
        self.max_nodes = max(1, int(max_nodes))
        self._refused_nodes: set[str] = set()
        self._sig_cache: dict[int, tuple] = {}
        self.stopped_early: list[str] = []
        self._fixed = _load(rules, catalogue) if rules else None
        self._by_version: dict[str, RuleSet] = {}
        self._seg_rules: dict[int, RuleSet] = {}
        for i, seg in enumerate(self.segments):
            self._seg_rules[i] = self._fixed or self._recorded_rules(seg)
        self.rulesets: dict[str, RuleSet] = {}
        first = self.segments[0]
        st = first.settings
        self.lookback = float(st.get("lookback", 60.0))
        self.horizon = float(st.get("horizon", 600.0))
        self.interval = float(st.get("evaluation_interval", 1.0))
        self.summary_interval = float(st.get("summary_interval", 1.0))
        self.cluster = first.cluster
        self.labels: dict[str, dict[str, str]] = {}
        for seg in self.segments:
            for n, lab in seg.node_labels.items():
                self.labels.setdefault(n, lab)
        self.nodes = sorted({n for seg in self.segments for n in self._seg_nodes(seg)
                             if self.only is None or n in self.only})
        self.group = group and len(self.nodes) >= 2
        self.pipelines: dict[str, Pipeline] = {}
        self._avail: dict[str, list[str] | None] = {}
        self.evaluations = 0
        self.group_evaluations = 0
        self.summaries: list[wire.Summary] = []  # the node summaries used (recorded or recomputed)
        self.start = math.inf
        self.end = -math.inf

    def _recorded_rules(self, seg: B.Segment) -> RuleSet:
        files = seg.rule_files()
        if not files:
            if (seg.meta.get("rules") or {}).get("rules") == []:  # recorded without any rule
                self.stopped_early.append(f"{seg.path}: recorded without rules; pass --rules to evaluate some")
                return RuleSet([], [], "")
            raise ReplayError(f"{seg.path}: the bundle holds no rule files; pass --rules")
        version = (seg.meta.get("rules") or {}).get("version") or str(seg.path)
        rs = self._by_version.get(version)
        if rs is None:
            rs = self._by_version[version] = _load(files, self.catalogue)
        return rs

    @staticmethod
    def _seg_nodes(seg: B.Segment) -> list[str]:
        return seg.nodes or [str(seg.meta.get("recorder_node") or "")]

    def _pipeline(self, node: str, rs: RuleSet, seg: B.Segment) -> Pipeline | None:
        """The node's pipeline, created on its first sample; None once ``max_nodes`` pipelines
        exist (each holds a window store: a bundle naming 100,000 nodes must not take 3 GB)."""
        p = self.pipelines.get(node)
        avail = seg.meta.get("available_signals")
        if p is None and len(self.pipelines) >= self.max_nodes:
            if node not in self._refused_nodes:
                self._refused_nodes.add(node)
                if len(self._refused_nodes) == 1:
                    self.stopped_early.append(
                        f"{seg.path}: more than {self.max_nodes} nodes; the samples of the others are not replayed "
                        "(skewd replay --limit nodes=N, or --node to pick)")
            return None
        if p is None:
            lab = {k: v for k, v in self.labels.get(node, {}).items() if k != "cluster"}
            p = self.pipelines[node] = Pipeline(self.catalogue, rs, node=node, cluster=self.cluster, labels=lab,
                                                lookback=self.lookback, horizon=self.horizon)
            p.engine.scopes = set(NODE_SCOPES)
            self._avail[node] = None
        elif p.engine.rules is not rs and p.engine.rules.version != rs.version:
            p.engine.replace_rules(rs)  # a hot reload happened between these segments
            self._avail[node] = None
        if avail is not None and self._avail[node] != avail:
            # the rules the live agent had inactive (their signals' collectors were absent) stay so
            p.engine.set_available_signals(avail, {s: "not available on the recorded host" for s in self.catalogue})
            self._avail[node] = avail
        self.rulesets.setdefault(rs.version, rs)
        return p

    def _ticks(self, seg: B.Segment) -> tuple[np.ndarray, np.ndarray]:
        t, batches, _ = seg.ticks()
        limit = seg.readable_batches()
        if limit is not None:
            ok = batches <= limit
            if not ok.all():
                k = int(np.argmin(ok))
                t, batches = t[:k], batches[:k]
                self.stopped_early.append(f"{seg.path}: samples damaged; replay of this segment stops at "
                                          f"t={_fmt_t(float(t[-1])) if len(t) else 'start'}")
        s_end = seg.readable_until(B.SUMMARIES)
        if self.group and s_end < math.inf:
            self.stopped_early.append(f"{seg.path}: summaries damaged from t={_fmt_t(s_end)}; "
                                      "group rules see no summaries of this segment after it")
        return t, batches

    def events(self) -> Iterator[Event]:
        """Events in tick order. With ``range_eval`` (the default) each node's ticks are
        evaluated in ranges (``Engine.evaluate_range``): batches are still ingested tick by tick
        (summaries and group rules see the store as at each tick), evaluation waits until a
        range must end, and the events are yielded then, in the same order and with the same
        findings as evaluating at every tick."""
        heap: list[tuple[float, int, int]] = []
        ticks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        feeds: dict[int, _SegmentFeed] = {}
        summaries: dict[int, list[dict[str, Any]]] = {}
        for i, seg in enumerate(self.segments):
            nodes = [n for n in self._seg_nodes(seg) if self.only is None or n in self.only]
            if not nodes:
                continue
            t, b = ticks[i] = self._ticks(seg)
            feeds[i] = _SegmentFeed(seg, self.only)
            rec = [s for s in seg.summaries() if self.only is None or s.get("node") in self.only]
            summaries[i] = sorted(rec, key=lambda s: (float(s.get("t", 0.0)), str(s.get("node"))))
            for k in range(len(t)):
                heapq.heappush(heap, (float(t[k]), i, k))
        group = self._group_engine()
        next_group = None
        next_summary: dict[str, float] = {}
        pending: list[wire.Summary] = []  # summaries waiting to be ingested by the group engine
        sum_pos = {i: 0 for i in summaries}
        # range evaluation: ticks waiting per node, and the events waiting for their findings
        waiting: dict[str, list[float]] = {}
        seen: dict[str, list[float]] = {}  # the store's latest sample time at each waiting tick
        queue: list[tuple] = []  # (Event,) ready, or (t, [(node, index in its range)], made)

        def flush() -> Iterator[Event]:
            found = {node: self.pipelines[node].evaluate_range(ts, seen[node])
                     for node, ts in waiting.items() if ts}
            waiting.clear()
            seen.clear()
            for item in queue:
                if len(item) == 1:
                    yield item[0]
                    continue
                t_, where, made_ = item
                fs: list[Finding] = []
                for node, j in where:
                    fs += found[node][j]
                yield Event(t_, fs, made_)
            queue.clear()

        while heap:
            t, i, k = heapq.heappop(heap)
            if self.t_to is not None and t > self.t_to:
                break
            if group is not None:
                if next_group is None:
                    next_group = t
                while next_group < t:
                    ev = self._group_eval(group, next_group, pending)
                    if ev is not None:
                        if queue:
                            queue.append((ev,))
                        else:
                            yield ev
                    next_group += self.interval
            seg = self.segments[i]
            rs = self._seg_rules[i]
            _, nb = ticks[i]
            due: dict[str, list[SampleBatch]] = {}
            for node, batch in feeds[i].until(int(nb[k])):
                got = due.get(node)
                if got is None:
                    if waiting.get(node) and self._reconfigures(node, rs, seg):
                        yield from flush()  # a hot reload: the waiting ticks ran with the old rules
                    if self._pipeline(node, rs, seg) is None:  # created in arrival order, as before
                        continue  # past max_nodes (noted once)
                    got = due[node] = []
                got.append(batch)
            evaluate = self.t_from is None or t >= self.t_from
            for node, batches in due.items():  # one ingest per node and tick: see WindowStore.ingest_many
                pipe = self._pipeline(node, rs, seg)
                w = waiting.get(node)
                if w and not self._may_ingest_ahead(pipe, w, batches):
                    yield from flush()
                    w = None
                if self.range_eval and evaluate:
                    pipe.store.track_births(len(w) if w else 0)
                pipe.ingest_many(batches, shared_columns=True)
            found: list[Finding] = []
            where: list[tuple[str, int]] = []
            made: list[wire.Summary] = []
            for node in [n for n in self._seg_nodes(seg) if self.only is None or n in self.only]:
                if self.range_eval and evaluate and waiting.get(node) and self._reconfigures(node, rs, seg):
                    yield from flush()
                pipe = self._pipeline(node, rs, seg)
                if pipe is None:
                    continue
                if evaluate:
                    if self.range_eval:
                        w = waiting.setdefault(node, [])
                        where.append((node, len(w)))
                        w.append(t)
                        seen.setdefault(node, []).append(pipe.store.latest_t)
                    else:
                        found += pipe.evaluate(t)
                    self.evaluations += 1
                    self.start = min(self.start, t)
                    self.end = max(self.end, t)
                # summaries: the recorded ones when this segment has them, else recompute
                if summaries[i]:
                    continue
                if t >= next_summary.get(node, -math.inf):
                    next_summary[node] = t + self.summary_interval
                    made.append(summary_mod.make_summary(pipe.store, node, self.cluster, t, self.summary_interval))
            rec = summaries[i]
            while sum_pos[i] < len(rec) and float(rec[sum_pos[i]]["t"]) <= t:
                try:
                    made.append(wire.summary_from_dict(rec[sum_pos[i]]))
                except Exception as e:  # noqa: BLE001 - any summary the decoder refuses, however it fails
                    why = str(e) if isinstance(e, wire.WireError) else f"{type(e).__name__}: {e}"
                    self.stopped_early.append(f"{seg.path}/{B.SUMMARIES}: summary skipped: {why[:300]}")
                sum_pos[i] += 1
            pending += made
            if evaluate:
                self.summaries += made
                if self.range_eval:
                    queue.append((t, where, made))
                    if any(self._range_ends(self.pipelines[n], w) for n, w in waiting.items() if w):
                        yield from flush()
                else:
                    yield Event(t, found, made)
        yield from flush()
        if group is not None and next_group is not None and self.end > -math.inf:
            while next_group <= self.end:
                ev = self._group_eval(group, next_group, pending)
                if ev is not None:
                    yield ev
                next_group += self.interval

    # -- range evaluation ------------------------------------------------------------------------
    def _reconfigures(self, node: str, rs: RuleSet, seg: B.Segment) -> bool:
        """Whether ``_pipeline`` would change this node's rules or available signals now."""
        p = self.pipelines.get(node)
        if p is None:
            return False
        if p.engine.rules is not rs and p.engine.rules.version != rs.version:
            return True
        avail = seg.meta.get("available_signals")
        return avail is not None and self._avail.get(node) != avail

    def _may_ingest_ahead(self, pipe: Pipeline, waiting: list[float], batches: list[SampleBatch]) -> bool:
        """Whether these batches can be ingested before the node's waiting ticks are evaluated
        without changing what those ticks see: every sample newer than any in the store (so each
        is a new column after those the ticks saw, and the store's latest time at each tick
        bounds its windows: see ``Engine.evaluate_range``), and no block filling up (making room
        is the only time the store drops columns, and windows longer than the horizon see what
        it keeps)."""
        batches = [b for b in batches if len(b)]
        if not batches:
            return True
        allt = np.concatenate([b.t for b in batches]) if len(batches) > 1 else batches[0].t
        at = np.cumsum([0] + [len(b) for b in batches[:-1]])
        mins = np.minimum.reduceat(allt, at)
        maxs = np.maximum.reduceat(allt, at)
        lo = float(mins.min())
        if lo <= pipe.store.latest_t:
            return False
        by_layout: dict[int, list] = {}  # id(signal column) → [array, new columns]
        for b, one in zip(batches, (mins == maxs).tolist()):
            cols = 1 if one else len(np.unique(b.t))
            got = by_layout.get(id(b.signal))
            if got is None:
                by_layout[id(b.signal)] = [b.signal, cols]
            else:
                got[1] += cols
        per_sig: dict[str, int] = {}
        for arr, cols in by_layout.values():
            for name in self._signal_names(arr):
                per_sig[name] = per_sig.get(name, 0) + cols
        if lo <= pipe.store.latest_t:
            return False
        cols = max(per_sig.values())  # the most new columns any one block can get
        # the fewest free columns of any block, counted down as ticks are ingested ahead, and
        # recomputed when the store has changed shape (a new block or row)
        st = pipe.store
        budget = pipe.__dict__.get("_range_budget")
        if budget is None or budget[0] != (st.version, waiting[0]):
            budget = [(st.version, waiting[0]), st.min_free_columns()]
        if cols >= budget[1]:
            return False
        budget[1] -= cols
        pipe.__dict__["_range_budget"] = budget
        return True

    def _signal_names(self, arr: np.ndarray) -> tuple:
        """The distinct signal names of a batch's signal column; replay's batches of one layout
        share that array, so it is worked out once per array (kept alive with its entry)."""
        hit = self._sig_cache.get(id(arr))
        if hit is not None and hit[0] is arr:
            return hit[1]
        if len(self._sig_cache) > 4096:
            self._sig_cache.clear()
        names = tuple(dict.fromkeys(arr.tolist()))
        self._sig_cache[id(arr)] = (arr, names)
        return names

    def _range_ends(self, pipe: Pipeline, waiting: list[float]) -> bool:
        """After adding a tick: a range ends at the length limit, or where the pipeline's store
        gc (due after this tick) would forget an entity (later ticks must not see it)."""
        if len(waiting) >= self.max_range:
            return True
        t = waiting[-1]
        last = pipe._last_gc if pipe._last_gc is not None else waiting[0]
        for tt in waiting[:-1]:  # the gc times of the ticks before (each checked a no-op when added)
            if tt - last >= pipe.gc_every:
                last = tt
        return t - last >= pipe.gc_every and pipe.store.gc_would_remove(t)

    # -- group rules (the controller's half) ---------------------------------------------------
    def _group_engine(self) -> Engine | None:
        if not self.group:
            return None
        rs = self._fixed or self._seg_rules[0]
        if not any(r.scope in GROUP_SCOPES and r.enabled for r in rs.rules):
            return None
        store = WindowStore(self.catalogue, horizon=self.horizon)
        for n in self.nodes:
            store.registry.set_node_labels(n, {"cluster": self.cluster, **self.labels.get(n, {})})
        self.rulesets.setdefault(rs.version, rs)
        return Engine(rs, store, lookback=self.lookback, cluster=self.cluster, scopes=set(GROUP_SCOPES))

    def _group_eval(self, engine: Engine, t: float, pending: list[wire.Summary]) -> Event | None:
        keep = []
        for s in sorted(pending, key=lambda s: (s.t, s.node)):
            if s.t > t:
                keep.append(s)
                continue
            b = BatchBuilder(s.node)
            for name, ents in s.signals.items():
                if name not in self.catalogue:
                    continue
                for ent, v in ents.items():
                    b.add(s.t, ent, name, np.nan if v is None else v)
            engine.store.ingest(b.build())
        pending[:] = keep
        if self.t_from is not None and t < self.t_from:
            return None
        self.group_evaluations += 1
        found = engine.evaluate(t)
        return Event(t, found) if found else None

    def run(self) -> ReplayResult:
        findings: list[Finding] = []
        for ev in self.events():
            findings += ev.findings
        return self.result(findings)

    def result(self, findings: list[Finding]) -> ReplayResult:
        damage = list(self.open_damage)
        for seg in self.segments:
            seg.verify()
            damage += [d for d in seg.damage if d not in damage]
        return ReplayResult(findings, damage, self.segments, dict(self.rulesets), self.nodes, self.evaluations,
                            self.group_evaluations, self.start, self.end, list(dict.fromkeys(self.stopped_early)),
                            list(self.summaries))


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def _clean(v: Any) -> Any:
    if isinstance(v, float):
        if not math.isfinite(v):
            return None
        return 0.0 if v == 0 else v
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def finding_json(f: Finding) -> str:
    """One canonical JSON line: sorted keys, no spaces, floats in Python's shortest round-trip
    form (a fixed rule, so equal findings print equal bytes), NaN/inf as null."""
    return json.dumps(_clean(f.to_dict()), sort_keys=True, separators=(",", ":"), allow_nan=False)


def _fmt_t(t: float | None) -> str:
    if t is None or not math.isfinite(t):
        return "-"
    d = _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


TABLE_HEADER = f"{'TIME (UTC)':24}  {'STATE':8}  {'SEVERITY':8}  {'RULE':28}  {'NODE':14}  {'ENTITY':16}  SUMMARY"


def finding_row(f: Finding) -> str:
    ent = f.entity or "-"
    return (f"{_fmt_t(f.evaluated_at):24}  {f.state.value:8}  {f.severity.value:8}  {f.rule_id:28}  "
            f"{f.node:14}  {ent:16}  {f.summary}")


# ---------------------------------------------------------------------------------------------
# Rule diffs
# ---------------------------------------------------------------------------------------------

@dataclass
class Occurrence:
    """One fired alert: pending → firing → (resolved), assembled from its transitions."""

    rule_id: str
    node: str
    entity: str
    labels: dict[str, str]
    active_at: float
    fired_at: float | None = None
    resolved_at: float | None = None
    severity: str = ""
    summary: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple:
        return (self.rule_id, self.node, self.entity, tuple(sorted(self.labels.items())))

    def overlaps(self, o: "Occurrence") -> bool:
        a_end = self.resolved_at if self.resolved_at is not None else math.inf
        b_end = o.resolved_at if o.resolved_at is not None else math.inf
        return self.active_at <= b_end and o.active_at <= a_end


def occurrences(findings: Sequence[Finding], fired_only: bool = True) -> list[Occurrence]:
    occ: dict[str, Occurrence] = {}
    for f in findings:
        o = occ.get(f.id)
        if o is None:
            o = occ[f.id] = Occurrence(f.rule_id, f.node, f.entity, dict(f.labels), f.active_at,
                                       severity=f.severity.value)
        o.summary = f.summary or o.summary
        if f.evidence:
            o.evidence = dict(f.evidence)
        if f.state is State.FIRING:
            o.fired_at = f.fired_at if f.fired_at is not None else f.evaluated_at
        elif f.state is State.RESOLVED:
            o.resolved_at = f.resolved_at if f.resolved_at is not None else f.evaluated_at
            if o.fired_at is None and f.fired_at is not None:
                o.fired_at = f.fired_at
    out = [o for o in occ.values() if o.fired_at is not None or not fired_only]
    return sorted(out, key=lambda o: (o.key, o.active_at))


@dataclass
class DiffEntry:
    kind: str  # "appears" (only with B), "disappears" (only with A), "timing"
    a: Occurrence | None
    b: Occurrence | None

    @property
    def occ(self) -> Occurrence:
        return self.b or self.a  # type: ignore[return-value]

    def to_dict(self) -> dict[str, Any]:
        o = self.occ

        def times(x: Occurrence | None) -> dict[str, Any] | None:
            return None if x is None else {"active_at": x.active_at, "fired_at": x.fired_at, "resolved_at": x.resolved_at}

        return {"change": self.kind, "rule_id": o.rule_id, "node": o.node, "entity": o.entity, "labels": o.labels,
                "a": times(self.a), "b": times(self.b)}

    def line(self) -> str:
        o = self.occ
        where = f"{o.rule_id} {o.node}/{o.entity or '-'}"
        if self.kind == "appears":
            return f"+ appears     {where}  fired {_fmt_t(o.fired_at)}  resolved {_fmt_t(o.resolved_at)}"
        if self.kind == "disappears":
            return f"- disappears  {where}  fired {_fmt_t(o.fired_at)}  resolved {_fmt_t(o.resolved_at)}"
        a, b = self.a, self.b
        assert a is not None and b is not None
        parts = []
        for what, x, y in (("fired", a.fired_at, b.fired_at), ("resolved", a.resolved_at, b.resolved_at)):
            if x == y:
                continue
            if x is not None and y is not None:
                d = y - x
                parts.append(f"{what} {_fmt_t(x)} → {_fmt_t(y)} ({abs(d):.3f}s {'later' if d > 0 else 'earlier'})")
            else:
                parts.append(f"{what} {_fmt_t(x)} → {_fmt_t(y)}")
        return f"~ timing      {where}  " + "; ".join(parts)


def diff_findings(a: Sequence[Finding], b: Sequence[Finding]) -> list[DiffEntry]:
    """Fired occurrences that appear, disappear or change firing/resolution time from A to B.
    Occurrences of the same rule and entity are paired when their active periods overlap."""
    occ_a, occ_b = occurrences(a), occurrences(b)
    by_key: dict[tuple, list[Occurrence]] = {}
    for o in occ_b:
        by_key.setdefault(o.key, []).append(o)
    used: set[int] = set()
    out: list[DiffEntry] = []
    for oa in occ_a:
        match = None
        for ob in by_key.get(oa.key, []):
            if id(ob) not in used and oa.overlaps(ob):
                match = ob
                break
        if match is None:
            out.append(DiffEntry("disappears", oa, None))
            continue
        used.add(id(match))
        if (oa.fired_at, oa.resolved_at) != (match.fired_at, match.resolved_at):
            out.append(DiffEntry("timing", oa, match))
    out += [DiffEntry("appears", None, ob) for ob in occ_b if id(ob) not in used]
    return sorted(out, key=lambda e: (e.occ.fired_at or e.occ.active_at, e.occ.key, e.kind))


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="skewd replay",
        description="Replay capture bundles through the rules: the same pipeline as the live agent, "
                    "evaluated at the recorded tick times.")
    p.add_argument("bundles", nargs="+", metavar="BUNDLE",
                   help="capture bundle(s): a segment, a bundle directory, or a directory of per-node bundles")
    p.add_argument("--rules", action="append", metavar="PATH",
                   help="rule files/directories to use instead of the ones recorded in the bundle (repeatable)")
    p.add_argument("--speed", default="max", help="max (default), 1x (real time) or Nx")
    p.add_argument("--from", dest="t_from", metavar="T",
                   help="evaluate from T: duration after the first recorded evaluation (30s), ISO time, or epoch seconds")
    p.add_argument("--to", dest="t_to", metavar="T", help="stop after T (same forms as --from)")
    p.add_argument("--node", action="append", metavar="N", help="replay only this node (repeatable)")
    p.add_argument("--publish", metavar="URL", help="publish findings (and summaries) to NATS, e.g. nats://127.0.0.1:4222")
    p.add_argument("--report", metavar="OUT.html", help="write a self-contained HTML post-mortem report")
    p.add_argument("--json", action="store_true", help="findings as JSON lines instead of a table")
    p.add_argument("--diff", nargs=2, metavar=("RULES_A", "RULES_B"),
                   help="compare two rule versions on the bundle: findings that appear, disappear or change timing")
    p.add_argument("--no-group", action="store_true", help="skip the group (tp_group/cluster) rules")
    p.add_argument("--per-tick", action="store_true",
                   help="evaluate at every tick as it is reached instead of in ranges of ticks "
                        "(same findings; the default at --speed max is range evaluation)")
    p.add_argument("--explain", action="store_true",
                   help="print on stderr how each rule is evaluated (range or per tick, and which window "
                        "functions have range kernels), then replay")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or statistics on stderr")
    p.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                   help="raise a bundle reading budget, e.g. nodes=4096, meta_bytes=268435456 "
                        "(see docs/reliability.md); rule files read under the agent's default rule_limits")
    return p


class _Progress:
    """A one-line progress bar on stderr, only when it is a terminal and the replay is long."""

    def __init__(self, total: float, stream: TextIO, enabled: bool) -> None:
        self.total = max(total, 1e-9)
        self.stream = stream
        self.enabled = enabled and stream.isatty()
        self._last = 0.0

    def update(self, done: float, findings: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1:
            return
        self._last = now
        frac = min(1.0, max(0.0, done / self.total))
        bar = "#" * int(frac * 30)
        self.stream.write(f"\r[{bar:30}] {frac * 100:5.1f}%  {findings} transitions ")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 60 + "\r")
            self.stream.flush()


def _first_tick(seg: B.Segment) -> float:
    t = seg.ticks()[0]
    return float(t[0]) if len(t) else seg.start


def _make_replayer(args: argparse.Namespace, segments: list[B.Segment], damage: list[B.Damage],
                   catalogue: Catalogue, rules: Sequence[str] | None, range_eval: bool = True) -> Replayer:
    start = min(_first_tick(s) for s in segments)
    t_from = parse_time(args.t_from, start) if args.t_from else None
    t_to = parse_time(args.t_to, start) if args.t_to else None
    limits = getattr(args, "bundle_limits", B.DEFAULT_LIMITS)
    return Replayer(segments, catalogue, rules=rules, t_from=t_from, t_to=t_to, nodes=args.node,
                    group=not args.no_group, open_damage=damage, range_eval=range_eval, max_nodes=limits.nodes)


def explain(rep: Replayer) -> list[str]:
    """How replay evaluates each rule: node rules by range (window functions with a range kernel
    computed for all ticks at once, the others by their per-tick kernel at each tick inside the
    range), group rules per tick in the group engine."""
    from skewd.model import Scope
    from skewd.rules.expr import _COND_WINDOW, _WINDOW, RANGE_KERNELS

    WINDOW_FUNCTIONS = set(_WINDOW) | set(_COND_WINDOW) | {"quantile", "last", "age"}

    lines = []
    mode = "ranges of up to %d ticks" % rep.max_range if rep.range_eval else "per tick (--per-tick or --speed)"
    lines.append(f"node rules: {mode}; group rules: per tick, every {rep.interval:g}s")
    lines.append("range kernels: " + ", ".join(sorted(RANGE_KERNELS)) + "; every other window function runs "
                 "its per-tick kernel at each tick of a range (bit-identical sums need the per-tick order)")
    seen: set[str] = set()
    for i in sorted(rep._seg_rules):
        rs = rep._seg_rules[i]
        if rs.version in seen:
            continue
        seen.add(rs.version)
        for r in rs.rules:
            if not r.enabled:
                continue
            if r.scope in (Scope.TP_GROUP, Scope.CLUSTER):
                how = "per tick (group engine)"
            elif not rep.range_eval:
                how = "per tick"
            else:
                # evidence labels are the text of each function call (a bare signal: its last value)
                fns = sorted({lab.split("(")[0] if "(" in lab else "last" for lab in r.compiled.evidence_labels})
                wins = [f for f in fns if f in WINDOW_FUNCTIONS]
                ranged = [f for f in wins if f in RANGE_KERNELS]
                per = [f for f in wins if f not in RANGE_KERNELS]
                how = "range" + (f"; range kernels: {', '.join(ranged)}" if ranged else "") + \
                      (f"; per-tick kernels: {', '.join(per)}" if per else "")
            lines.append(f"  {r.id}: {how}")
    return lines


async def _drive(rep: Replayer, speed: float | None, publish: str | None, out: TextIO, as_json: bool,
                 err: TextIO, quiet: bool) -> list[Finding]:
    publisher = None
    spool_dir = None
    if publish:
        import tempfile

        from skewd.natsutil import NatsConfig

        from .publisher import Publisher
        from .spool import Spool

        spool_dir = tempfile.mkdtemp(prefix="skewd-replay-spool-")
        try:
            publisher = Publisher(NatsConfig.from_dict({"servers": [publish], "name": "skewd-replay"}),
                                  Spool(spool_dir), cluster=rep.cluster)
            await publisher.start()
            await publisher.wait_connected(10.0)
        except BaseException:
            if publisher is not None:
                await publisher.close()
                publisher.spool.close()
            shutil.rmtree(spool_dir, ignore_errors=True)
            raise
    t_first = min((s.start for s in rep.segments), default=0.0)
    t_last = max((s.end for s in rep.segments), default=t_first)
    progress = _Progress(t_last - t_first, err, not quiet and (t_last - t_first) > 60)
    wall0 = time.monotonic()
    findings: list[Finding] = []
    if not as_json:
        out.write(TABLE_HEADER + "\n")
    try:
        for ev in rep.events():
            if speed is not None:
                delay = (ev.t - t_first) / speed - (time.monotonic() - wall0)
                if delay > 0:
                    await asyncio.sleep(delay)
            for f in ev.findings:
                out.write((finding_json(f) if as_json else finding_row(f)) + "\n")
                if publisher is not None:
                    publisher.publish_finding(f)
            if publisher is not None:
                for s in ev.summaries:
                    await publisher.publish_summary(s)
            findings += ev.findings
            progress.update(ev.t - t_first, len(findings))
            if speed is None:
                await asyncio.sleep(0)  # let the publisher drain while we run
        out.flush()
    finally:
        progress.close()
        if publisher is not None:
            ok = await publisher.wait_drained(30.0)
            await publisher.close()
            publisher.spool.close()
            shutil.rmtree(spool_dir, ignore_errors=True)
            if not ok:
                print("skewd replay: not every finding was acknowledged by NATS within 30s", file=err)
            elif not quiet:
                print(f"skewd replay: published {publisher.stats.published} findings to {publish}", file=err)
    return findings


def main(argv: Sequence[str], out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = build_parser().parse_args(list(argv))
    try:
        speed = parse_speed(args.speed)
        args.bundle_limits = B.BundleLimits.from_items(args.limit)
        segments, damage = open_segments(args.bundles, args.bundle_limits)
    except (ValueError, B.BundleError) as e:
        print(f"skewd replay: {e}", file=err)
        return EXIT_USAGE
    if not segments:
        for d in damage:
            print(f"skewd replay: {d}", file=err)
        return EXIT_DAMAGED if damage else EXIT_USAGE
    catalogue = replay_catalogue(segments, None if args.quiet else err)
    try:
        if args.diff:
            return _diff(args, segments, damage, catalogue, out, err)
        rep = _make_replayer(args, segments, damage, catalogue, args.rules,
                             range_eval=speed is None and not args.per_tick and not args.publish)
        if args.explain:
            for line in explain(rep):
                print(line, file=err)
        findings = asyncio.run(_drive(rep, speed, args.publish, out, args.json, err, args.quiet))
    except (ReplayError, B.BundleError, ValueError) as e:
        print(f"skewd replay: {e}", file=err)
        return EXIT_USAGE
    except Exception as e:
        from skewd.natsutil import NatsError

        if isinstance(e, NatsError):
            print(f"skewd replay: {e}", file=err)
            return EXIT_USAGE
        raise
    result = rep.result(findings)
    if args.report:
        from .report import write_report

        write_report(result, args.report)
        if not args.quiet:
            print(f"skewd replay: report written to {args.report}", file=err)
    return _finish(result, err, args.quiet)


def _finish(result: ReplayResult, err: TextIO, quiet: bool) -> int:
    if not quiet:
        span = f"{_fmt_t(result.start)} .. {_fmt_t(result.end)}" if result.evaluations else "nothing"
        print(f"skewd replay: {result.evaluations} evaluations on {len(result.nodes)} node(s) "
              f"({span}), {result.group_evaluations} group evaluations, {len(result.findings)} transitions",
              file=err)
    for note in result.stopped_early:
        print(f"skewd replay: {note}", file=err)
    if result.damage:
        print("skewd replay: the bundle is damaged; everything before the damage was replayed:", file=err)
        for d in result.damage:
            print(f"  {d}", file=err)
        return EXIT_DAMAGED
    return EXIT_OK


def _diff(args: argparse.Namespace, segments: list[B.Segment], damage: list[B.Damage], catalogue: Catalogue,
          out: TextIO, err: TextIO) -> int:
    runs = []
    for rules in args.diff:
        segs, dmg = open_segments(args.bundles, args.bundle_limits)  # fresh readers: no state shared
        rep = _make_replayer(args, segs, dmg, catalogue, [rules])
        runs.append(rep.run())
    a, b = runs
    entries = diff_findings(a.findings, b.findings)
    for e in entries:
        out.write((json.dumps(_clean(e.to_dict()), sort_keys=True, separators=(",", ":")) if args.json
                   else e.line()) + "\n")
    if not args.json:
        n = {k: sum(1 for e in entries if e.kind == k) for k in ("appears", "disappears", "timing")}
        out.write(f"# {args.diff[0]} → {args.diff[1]}: {n['appears']} appear, {n['disappears']} disappear, "
                  f"{n['timing']} change timing ({len(occurrences(a.findings))} vs "
                  f"{len(occurrences(b.findings))} fired occurrences)\n")
    code = _finish(b, err, True)
    if code == EXIT_DAMAGED:
        return code
    return EXIT_DIFF if entries else EXIT_OK
