"""Replay's core: capture bundles back through the agents' pipelines, deterministically.

The bundle is the Source: each node's samples are ingested in the recorded SampleBatch
boundaries and evaluated at the recorded tick times by the same :class:`Pipeline` the live
agent runs (node-local scopes), so a bundle replays to the findings the agent raised. Each step
also carries the node summaries of that tick (the recorded ones, or recomputed with
:func:`skewd.agent.summary.make_summary` when a bundle has none): what
:mod:`skewd.agent.replay.cluster` hands the controller.

Nothing here reads the clock: the output depends only on the bundle and the rules, so two
replays give byte-identical results.
"""
from __future__ import annotations

import hashlib
import heapq
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence, TextIO

import numpy as np

from skewd import wire
from skewd.controller import messages as controller_messages
from skewd.model import NODE_SCOPES, Catalogue, Finding, SampleBatch

from .ahead import AheadIngest
from .events import Checkpoint, Event
from .feed import SegmentFeed
from skewd.rules.engine import RuleSet
from skewd.rules.loader import LoadIssue, load_rules

from .. import bundle
from .. import summary as node_summary
from ..pipeline import Pipeline
from .output import fmt_t


class ReplayError(Exception):
    """Replay cannot start (no rules, rules do not load, no readable segment)."""


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

def open_segments(paths: Sequence[str | Path], limits: bundle.BundleLimits = bundle.DEFAULT_LIMITS
                  ) -> tuple[list[bundle.Segment], list[bundle.Damage]]:
    """Every segment under ``paths``, oldest first; unusable ones are reported, not fatal.
    A bundle may come from anyone: each is read within ``limits`` (docs/reliability.md)."""
    segs, damage = [], []
    for p in bundle.find_segments(paths):
        try:
            segs.append(bundle.Segment(p, limits))
        except bundle.BundleError as e:
            damage.append(bundle.Damage(e.path, e.offset or 0, e.message))
    segs.sort(key=lambda s: (s.start, str(s.path)))
    return segs, damage


def replay_catalogue(segments: Sequence[bundle.Segment], warn: TextIO | None = None) -> Catalogue:
    """This skewd's full catalogue plus any signal the bundles recorded that it does not know
    (a bundle from a host with another collector set still replays)."""
    try:
        from skewd.catalogue import full_catalogue

        cat = full_catalogue()
    except Exception as e:  # a broken collector package must not make a bundle unreadable
        if warn is not None:
            print(f"skewd replay: full signal catalogue unavailable ({type(e).__name__}: {e}); "
                  "using the bundle's catalogue snapshot", file=warn)
        cat = Catalogue(node_summary.CATALOGUE)
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


# ---------------------------------------------------------------------------------------------
# The replay loop
# ---------------------------------------------------------------------------------------------

@dataclass
class ReplayResult:
    """Everything a replay produced, for the CLI's summary line, the diff and the report."""

    findings: list[Finding]  # every transition, node and controller, in replay order
    damage: list[bundle.Damage]
    segments: list[bundle.Segment]
    rulesets: dict[str, RuleSet]  # version → rules used
    nodes: list[str]
    evaluations: int  # node evaluations
    controller_evaluations: int
    start: float
    end: float
    stopped_early: list[str] = field(default_factory=list)
    summaries: list[wire.Summary] = field(default_factory=list)
    #: incident messages the controller published (first publications and updates), in order
    incidents: list[controller_messages.Incident] = field(default_factory=list)
    suggestions: list[controller_messages.RemapSuggestion] = field(default_factory=list)
    #: incidents that were open when the replay ended but never published (still held)
    held: list[controller_messages.Incident] = field(default_factory=list)
    controller: bool = False  # whether the controller ran (cluster replay)
    controller_status: dict = field(default_factory=dict)

    @property
    def ruleset(self) -> RuleSet:
        return next(iter(self.rulesets.values())) if self.rulesets else RuleSet([], [], "")


class Replayer:
    """Owns one agent pipeline per recorded node and drives them from the segments at the
    recorded tick times. Called by :class:`~skewd.agent.replay.cluster.ClusterReplay` (which
    adds the controller) and the CLI: iterate :meth:`events`, or :meth:`run` for the result."""

    def __init__(self, segments: Sequence[bundle.Segment], catalogue: Catalogue, *,
                 rules: Sequence[str | Path] | None = None, t_from: float | None = None,
                 t_to: float | None = None, nodes: Sequence[str] | None = None,
                 open_damage: Sequence[bundle.Damage] = (), range_eval: bool = True, max_range: int = 300,
                 max_nodes: int = bundle.DEFAULT_LIMITS.nodes) -> None:
        """``range_eval``: evaluate each node's ticks in ranges of up to ``max_range`` ticks
        (same findings, see :meth:`events`); False evaluates at every tick as it is reached.
        ``max_nodes``: at most this many nodes get a pipeline (:meth:`_pipeline`).
        Time slices replayed in parallel processes: :class:`.slices.ParallelReplayer`."""
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
        self.rule_paths = [str(r) for r in rules] if rules else None
        self.samples_elsewhere = 0  # samples the slice workers ingested (see .slices)
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
        self.pipelines: dict[str, Pipeline] = {}
        self._avail: dict[str, list[str] | None] = {}
        self.evaluations = 0
        self.summaries: list[wire.Summary] = []  # the node summaries used (recorded or recomputed)
        self.start = math.inf
        self.end = -math.inf
        self._next_summary: dict[str, float] = {}
        self._seed_gc: dict[str, float | None] = {}  # a slice's pipelines start on the serial gc schedule
        self._ahead = AheadIngest()  # collections held back until the store is read (range evaluation)
        self._has_summaries: dict[str, bool] = {}  # segment path → whether it recorded summaries

    @property
    def fixed_rules(self) -> RuleSet | None:
        """The ``rules=`` given instead of the recorded ones (None: each segment's own)."""
        return self._fixed

    def segment_rules(self) -> list[RuleSet]:
        """The rule set each segment replays with, in segment order."""
        return [self._seg_rules[i] for i in sorted(self._seg_rules)]

    def _recorded_rules(self, seg: bundle.Segment) -> RuleSet:
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
    def _seg_nodes(seg: bundle.Segment) -> list[str]:
        return seg.nodes or [str(seg.meta.get("recorder_node") or "")]

    def _pipeline(self, node: str, rs: RuleSet, seg: bundle.Segment) -> Pipeline | None:
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
            p._last_gc = self._seed_gc.get(node)
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

    def _ticks(self, seg: bundle.Segment) -> tuple[np.ndarray, np.ndarray]:
        t, batches, _ = seg.ticks()
        limit = seg.readable_batches()
        if limit is not None:
            ok = batches <= limit
            if not ok.all():
                k = int(np.argmin(ok))
                t, batches = t[:k], batches[:k]
                self.stopped_early.append(f"{seg.path}: samples damaged; replay of this segment stops at "
                                          f"t={fmt_t(float(t[-1])) if len(t) else 'start'}")
        s_end = seg.readable_until(bundle.SUMMARIES)
        if s_end < math.inf:
            self.stopped_early.append(f"{seg.path}: summaries damaged from t={fmt_t(s_end)}; "
                                      "the controller sees no summaries of this segment after it")
        return t, batches

    def events(self) -> Iterator[Event]:
        """Events in tick order. With ``range_eval`` (the default) each node's ticks are
        evaluated in ranges (``Engine.evaluate_range``): the waiting ticks' collections are
        held back and written per layout when the store is read (:mod:`.ahead`: summaries are
        still made from the store as at each tick), evaluation waits until a range must end, and the events are yielded then, in the same order and with the same
        findings as evaluating at every tick (:class:`.slices.ParallelReplayer` cuts the recording
        into time slices replayed in parallel, with the same events)."""
        for x in self.steps():
            if isinstance(x, Event):
                yield x

    def steps(self, warm_from: float | None = None, emit_from: float | None = None,
              checkpoints: Sequence[float] = ()) -> Iterator[Event | Checkpoint]:
        """:meth:`events`, for one time slice: ticks before ``warm_from`` are skipped (their
        batches neither read nor ingested; the pipelines start on the serial replay's gc and
        summary schedule), ticks before ``emit_from`` are evaluated but yield nothing and count
        nothing (warm-up), and a :class:`Checkpoint` is yielded before the first tick at or
        after each of ``checkpoints``."""
        cps = sorted(float(c) for c in checkpoints)
        if warm_from is not None:
            self._seed_schedule(warm_from)
        heap: list[tuple[float, int, int]] = []
        ticks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        feeds: dict[int, SegmentFeed] = {}
        summaries: dict[int, list[dict[str, Any]]] = {}
        for i, seg in enumerate(self.segments):
            nodes = [n for n in self._seg_nodes(seg) if self.only is None or n in self.only]
            if nodes:  # opened when its time comes (a slice reads and verifies only its segments)
                heapq.heappush(heap, (seg.start, i, -1))
        next_summary = self._next_summary
        sum_pos: dict[int, int] = {}
        # range evaluation: ticks waiting per node, and the events waiting for their findings
        waiting: dict[str, list[float]] = {}
        seen: dict[str, list[float]] = {}  # the store's latest sample time at each waiting tick
        queue: list[tuple] = []  # (t, [(node, index in its range)], made) waiting for their findings

        def flush() -> Iterator[Event]:
            self._ahead.write_all(self.pipelines)
            found = {node: self.pipelines[node].evaluate_range(ts, seen[node])
                     for node, ts in waiting.items() if ts}
            waiting.clear()
            seen.clear()
            for t_, where, made_ in queue:
                fs: list[Finding] = []
                for node, j in where:
                    fs += found[node][j]
                if emit_from is None or t_ >= emit_from:
                    yield Event(t_, fs, made_)
            queue.clear()

        while heap:
            t, i, k = heapq.heappop(heap)
            if self.t_to is not None and t > self.t_to:
                break
            seg = self.segments[i]
            if k < 0:  # open the segment: its ticks, its feed from the first batch needed
                if warm_from is not None:  # a slice: what precedes it is the verifying process's
                    t0, b0, _ = seg.ticks()
                    k_ = int(np.searchsorted(t0, warm_from, "left"))
                    if k_ == len(t0):
                        continue  # wholly before the warm-up: not even its index is read
                    if k_:
                        seg.trust_samples_below(int(b0[k_ - 1]))
                tt, nb = ticks[i] = self._ticks(seg)
                k0 = 0 if warm_from is None else int(np.searchsorted(tt, warm_from, "left"))
                if k0 == len(tt):
                    continue
                feeds[i] = SegmentFeed(seg, self.only, int(nb[k0 - 1]) if k0 else 0)
                rec = [s for s in seg.summaries() if self.only is None or s.get("node") in self.only]
                summaries[i] = sorted(rec, key=lambda s: (float(s.get("t", 0.0)), str(s.get("node"))))
                sum_pos[i] = 0
                for kk in range(k0, len(tt)):
                    heapq.heappush(heap, (float(tt[kk]), i, kk))
                continue
            while cps and t >= cps[0]:
                yield from flush()
                yield Checkpoint(cps[0], self.state_digest(cps[0]))
                cps.pop(0)
            rs = self._seg_rules[i]
            _, nb = ticks[i]
            # per node, in arrival order: SampleBatches, or (chunk, first, end) pieces of a chunk
            # of plain collections of that one node (see .feed)
            due: dict[str, list] = {}
            for ch, a, b in feeds[i].until(int(nb[k])):
                if ch.fast:
                    items: Any = [(ch.one_node, (ch, a, b))] if self.only is None or ch.one_node in self.only else []
                else:
                    items = ch.batches(a, b, self.only)
                for node, item in items:
                    got = due.get(node)
                    if got is None:
                        if waiting.get(node) and self._reconfigures(node, rs, seg):
                            yield from flush()  # a hot reload: the waiting ticks ran with the old rules
                        if self._pipeline(node, rs, seg) is None:  # created in arrival order, as before
                            continue  # past max_nodes (noted once)
                        got = due[node] = []
                    got.append(item)
            evaluate = self.t_from is None or t >= self.t_from
            emit = evaluate and (emit_from is None or t >= emit_from)
            for node, items in due.items():  # one ingest per node and tick: see WindowStore.ingest_many
                pipe = self._pipeline(node, rs, seg)
                assert pipe is not None  # due holds only nodes with a pipeline
                if self.range_eval and evaluate and all(type(x) is tuple for x in items):
                    if self._ahead.offer(node, pipe, [c for ch, a, b in items for c in ch.collections(a, b)]):
                        continue  # held back until the store is read (see .ahead)
                batches = self._batches(items)
                self._ahead.write(node, pipe)
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
                        seen.setdefault(node, []).append(self._ahead.latest(node, pipe))
                    else:
                        found += pipe.evaluate(t)
                    if emit:
                        self.evaluations += 1
                        self.start = min(self.start, t)
                        self.end = max(self.end, t)
                # summaries: the recorded ones when this segment has them, else recompute
                if summaries[i]:
                    continue
                if t >= next_summary.get(node, -math.inf):
                    next_summary[node] = t + self.summary_interval
                    self._ahead.write(node, pipe)  # the summary reads the store
                    made.append(node_summary.make_summary(pipe.store, node, self.cluster, t, self.summary_interval))
            rec = summaries[i]
            while sum_pos[i] < len(rec) and float(rec[sum_pos[i]]["t"]) <= t:
                try:
                    made.append(wire.summary_from_dict(rec[sum_pos[i]]))
                except wire.WireError as e:
                    self.stopped_early.append(f"{seg.path}/{bundle.SUMMARIES}: summary skipped: {e}")
                sum_pos[i] += 1
            if evaluate:
                if emit:
                    self.summaries += made
                if self.range_eval:
                    queue.append((t, where, made))
                    if any(self._range_ends(self.pipelines[n], w) for n, w in waiting.items() if w):
                        yield from flush()
                elif emit:
                    yield Event(t, found, made)
        yield from flush()

    # -- time slices (see .slices) ----------------------------------------------------------------
    def tick_times(self) -> np.ndarray:
        """Every recorded evaluation time (sorted; repeats kept), for slicing. Damage is not
        checked here (that CRCs every sample: 0.4 s per GB before any worker could start): a
        slice boundary past where damage stops the replay is simply never reached."""
        out = [seg.ticks()[0] for seg in self.segments
               if any(self.only is None or n in self.only for n in self._seg_nodes(seg))]
        t = np.sort(np.concatenate(out)) if out else np.empty(0)
        if self.t_from is not None:
            t = t[t >= self.t_from]
        if self.t_to is not None:
            t = t[t <= self.t_to]
        return t

    def warmup(self) -> float:
        """How long before its first tick a time slice starts ingesting and evaluating: the
        longest window any rule reads (its windows are full at the slice's start), plus the
        lookback and two gc periods (entities the serial replay would still hold are gone)."""
        rule_sets = [self._fixed] if self._fixed is not None else list(self._seg_rules.values())
        longest = max([self.horizon] + [r.compiled.max_window for rs in rule_sets for r in rs.rules])
        return longest + self.lookback + 2 * 30.0

    def _seed_schedule(self, warm_from: float) -> None:
        """The serial replay's gc time and next summary time of every node as at ``warm_from``:
        both follow from the tick times alone (``Pipeline._after_tick``; the loop above)."""
        heap: list[tuple[float, int]] = []
        for i, seg in enumerate(self.segments):
            nodes = [n for n in self._seg_nodes(seg) if self.only is None or n in self.only]
            if not nodes:
                continue
            t = seg.ticks()[0]
            recorded = bool(self._seg_has_summaries(seg))
            for x in t[t < warm_from].tolist():
                heap.append((x, i))
            self._seg_flags = getattr(self, "_seg_flags", {})
            self._seg_flags[i] = (nodes, recorded)
        heap.sort()
        last_gc: dict[str, float] = {}
        for t, i in heap:
            nodes, recorded = self._seg_flags[i]
            for node in nodes:
                if self.t_from is None or t >= self.t_from:
                    lg = last_gc.get(node)
                    if lg is None or t - lg >= 30.0:
                        last_gc[node] = t
                if not recorded and t >= self._next_summary.get(node, -math.inf):
                    self._next_summary[node] = t + self.summary_interval
        self._seed_gc = dict(last_gc)

    def _seg_has_summaries(self, seg: bundle.Segment) -> bool:
        got = self._has_summaries.get(str(seg.path))
        if got is None:
            got = self._has_summaries[str(seg.path)] = any(c.extra.get("rows")
                                                           for c in seg.index().get(bundle.SUMMARIES, []))
        return got

    def tick_index(self) -> dict[str, Any]:
        """What a time slice's worker needs to know of the segments before it and would
        otherwise read again from every one of them (index, tick file: ~0.2 s a segment, ~5 s a
        day): each segment's tick index and whether it holds summaries (:meth:`adopt_tick_index`)."""
        return {str(seg.path): (*seg.ticks(), self._seg_has_summaries(seg)) for seg in self.segments
                if any(self.only is None or n in self.only for n in self._seg_nodes(seg))}

    def adopt_tick_index(self, known: dict[str, Any]) -> None:
        """Take :meth:`tick_index` of the replay process (same bundle, already read there)."""
        for seg in self.segments:
            got = known.get(str(seg.path))
            if got is not None:
                seg.adopt_ticks(*got[:3])
                self._has_summaries.setdefault(str(seg.path), bool(got[3]))

    def state_digest(self, t: float) -> str:
        """A hash of everything that decides the findings after ``t``: each node's alert states
        (with their start times and evidence), held alerts, refills, last evaluations, gc and
        summary schedule, entity ids and block rows, and every stored sample a rule can still
        read. Two replays with equal digests at a tick boundary give the same events after it."""
        h = hashlib.sha256()

        def put(x: Any) -> None:
            h.update(repr(x).encode())
            h.update(b"\0")

        put(sorted(self._next_summary.items()))
        for node in sorted(self.pipelines):
            p = self.pipelines[node]
            e = p.engine
            st = p.store
            put((node, p._last_gc, e.rules.version, self._avail.get(node),
                 None if e.available is None else sorted(e.available)))
            for rid in sorted(e.states):
                for fp, a in sorted(e.states[rid].items()):
                    put((rid, fp, a.state.value, a.active_at, a.last_true_at, a.fired_at,
                         sorted(a.evidence.items()), sorted(a.labels.items())))
            put(sorted((k, sorted(v)) for k, v in e.held.items()))
            put(sorted((k, v) for k, v in e._refill_until.items() if v > t))
            put(sorted(e._last_eval.items()))
            put(st.registry.keys)
            span = max(st.horizon, e.lookback_needed())
            for sig in sorted(st.blocks):
                for nd in sorted(st.blocks[sig]):
                    b = st.blocks[sig][nd]
                    put((sig, nd, list(b.rows.items()), b.eids[: b.nrows].tolist()))
                    h.update(b.last_seen[: b.nrows].tobytes())
                    times, vals = b.window(t - span, math.inf)
                    h.update(times.tobytes())
                    h.update(np.ascontiguousarray(vals).tobytes())
        return h.hexdigest()

    # -- range evaluation ------------------------------------------------------------------------
    def _reconfigures(self, node: str, rs: RuleSet, seg: bundle.Segment) -> bool:
        """Whether ``_pipeline`` would change this node's rules or available signals now."""
        p = self.pipelines.get(node)
        if p is None:
            return False
        if p.engine.rules is not rs and p.engine.rules.version != rs.version:
            return True
        avail = seg.meta.get("available_signals")
        return avail is not None and self._avail.get(node) != avail

    def _batches(self, items: list) -> list[SampleBatch]:
        """The SampleBatches of a node's due items (see ``steps``), in arrival order."""
        out: list[SampleBatch] = []
        for x in items:
            if type(x) is tuple:
                ch, a, b = x
                out += [bt for _, bt in ch.batches(a, b, None)]
            else:
                out.append(x)
        return out

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
        if t - last < pipe.gc_every:
            return False
        self._ahead.write(pipe.node, pipe)  # the gc check reads the store's last sample times
        return pipe.store.gc_would_remove(t)

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
                            0, self.start, self.end, list(dict.fromkeys(self.stopped_early)), list(self.summaries))
