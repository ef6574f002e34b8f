"""The running controller: NATS in and out, the group rule engine, correlation and planning.

Flow (one asyncio loop)::

    summaries (core NATS, every node) ──▶ topology · aligner · timelines · window store
    phase records (vLLM plugin)       ──▶ timelines
    findings (JetStream durable)      ──▶ KV (finding.<fp>) ──▶ correlator
                 ┌────────────────────────────────────────────┘
    evaluation at grid times of the *summaries'* clock:
        aligner.derive → ctl_* samples → Engine.evaluate(t) → controller findings (published)
        → correlator.correlate(t) → incidents (held group_wait, then published) → planner
        → remap suggestions (KV, published)
    replies (request/reply)           ──▶ KV (remap.<key>.replies) ──▶ receipt

Time is the summaries' time: evaluation happens at multiples of ``evaluation_interval`` once
the newest summary has passed them, so replaying recorded summaries, or scripting them in a
test, gives the same findings as live traffic. Only housekeeping (findings arriving while no
agent reports) advances time by the wall clock.

Replicas: every controller instance subscribes to *all* summaries (a TP group's correlation
needs every peer's bursts in one place, so a core-NATS queue group, which hands each summary
to one member, would split the group); they share the findings stream through one durable
pull consumer (JetStream hands each finding to one replica) and the reply subject through a
queue group. The KV bucket is the shared memory: findings are stored there and watched by
every replica, suggestion publication is claimed with ``kv.create``, and ``Nats-Msg-Id`` lets
JetStream drop the rest. See docs/controller.md.
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from skewd import wire
from skewd.catalogue import full_catalogue
from skewd.model import GROUP_SCOPES, Catalogue, Finding, SampleBatch, State
from skewd.natsutil import connect, ensure_streams
from skewd.rules.cli import PACKS
from skewd.rules.engine import Engine, RuleSet
from skewd.rules.reload import RuleManager
from skewd.rules.store import WindowStore

from . import ingest
from . import messages as M
from .align import Aligner
from .catalogue import NAMES as CTL_SIGNALS
from .config import ControllerConfig
from .correlator import Correlator
from .culprit import coverage as culprit_coverage
from .planner import Planner, semantic_key, suggestion_key
from .state import STATE_VALUE_BYTES, StateStore, restore_engine
from .timeline import ENGINE_KEYS, Timelines
from .topology import Topology

log = logging.getLogger("skewd.controller")

#: summary keys that carry per-burst data for alignment, not signals
BURST_STARTS = "collective_burst_starts"
BURST_BYTES = "collective_burst_bytes"
FLUSH_ROWS = 250_000  # pending samples that force a flush between ticks (a few MB of Python lists)
LAYOUTS_PER_NODE = 4  # a node whose values come and go (None) sends a few layouts
LAYOUT_BUDGET_PER_SAMPLE = 4  # store layout-cache budget per sample of the layouts we know (see _flush)
LIVE_STATUSES = (M.SuggestionStatus.PLANNED.value, M.SuggestionStatus.PUBLISHED.value, M.SuggestionStatus.ACKED.value)
#: grid times evaluated per wake-up of the evaluation loop; more due ones wait for the next
#: turn of the event loop, so no summary time can keep the loop busy (a catch-up is at most
#: 10 ticks anyway: further behind, only the latest is evaluated)
MAX_TICKS_PER_WAKE = 10
#: stop() returns within this even with the broker gone (systemd's and the tests' expectation)
STOP_BUDGET_S = 1.8
NODE_SILENT = "node silent"  # the resolution reason of a silent node's findings and incidents


def _agent_open(f: Finding) -> bool:
    """An open (pending or firing) finding an agent raised about its own node: what a silent
    node leaves behind (the controller's own group findings follow the summaries instead)."""
    return f.scope not in GROUP_SCOPES and f.state in (State.PENDING, State.FIRING)


#: summary keys that are not window-store samples
_NOT_SAMPLES = frozenset({BURST_STARTS, BURST_BYTES}) | frozenset(CTL_SIGNALS) | ENGINE_KEYS


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


@dataclass
class _Pending:
    """One summary's samples, waiting for the next store flush."""

    node: str
    t: float
    names: list[str]
    entities: list[str]
    values: list[float]
    layout: _Layout | None  # the node's known layout when the summary matches it


@dataclass
class ControllerStats:
    """Counters since start (logged periodically; the ``status()`` snapshot has them)."""

    summaries: int = 0
    summaries_rejected: int = 0
    phase_records: int = 0
    phase_rejected: int = 0
    health: int = 0
    findings_in: int = 0
    findings_duplicate: int = 0
    findings_rejected: int = 0
    evaluations: int = 0
    controller_findings: int = 0
    incidents_published: int = 0  # incident messages published (first publication and updates)
    incidents_shown: int = 0  # incidents published for the first time (held group_wait first)
    incidents_withheld: int = 0  # incidents resolved or taken over while held: never published
    remaps_published: int = 0
    remaps_deduplicated: int = 0
    remaps_suppressed: int = 0  # an equivalent suggestion was still live
    remaps_recovered: int = 0  # planned before a crash, published after restart
    replies: int = 0
    health_rejected: int = 0
    nodes_silenced: int = 0  # nodes that fell silent (their open findings resolved, their state forgotten)
    findings_silenced: int = 0  # open findings the controller resolved because their node fell silent
    evaluations_deferred: int = 0  # wake-ups that left due grid times for the next turn (MAX_TICKS_PER_WAKE)
    errors: int = 0


@dataclass
class LoopHealth:
    """A supervised background loop: whether it runs, how often it crashed and was restarted."""

    running: bool = False
    restarts: int = 0
    last_error: str = ""
    last_error_wall: float | None = None
    backoff_s: float = 0.0


class Controller:
    def __init__(self, cfg: ControllerConfig, *, catalogue: Catalogue | None = None,
                 ruleset: RuleSet | None = None, wall_clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.catalogue = catalogue or full_catalogue()
        self.wall = wall_clock
        if ruleset is None:
            ruleset = RuleManager(cfg.rules or [str(PACKS)], self.catalogue).load_initial()
        self.store = WindowStore(self.catalogue, horizon=cfg.horizon)
        self.engine = Engine(ruleset, self.store, lookback=cfg.lookback, cluster=cfg.cluster,
                             scopes=GROUP_SCOPES.keys())
        self.topology = Topology.from_config(cfg)
        self.aligner = Aligner(cfg.align_window, cfg.max_skew, cfg.unsynced_clock_error, cfg.min_group_fraction,
                               cfg.stale_after, cfg.horizon)
        self.timelines = Timelines(horizon=cfg.horizon, stale_after=max(cfg.stale_after * 6, 30.0))
        self.correlator = Correlator(cfg.cluster, self.topology, self.timelines,
                                     culprit_pathologies=cfg.culprit_pathologies, never_inhibit=cfg.never_inhibit,
                                     effect_window=cfg.effect_window, node_value=self._node_value,
                                     inhibit_rules=cfg.inhibit_rules, direct_evidence=cfg.direct_evidence,
                                     culprit_evidence=cfg.culprit_evidence,
                                     maturities={r.id: r.maturity for r in ruleset.rules})
        self.planner = Planner(cfg)
        self.stats = ControllerStats()
        self.nc: Any = None
        self.js: Any = None
        self.state: StateStore | None = None
        self.remaps: dict[str, dict[str, Any]] = {}  # key → KV record (cache)
        self.first_t: float | None = None
        self.watermark = -math.inf
        self.next_eval: float | None = None
        self.now = -math.inf  # the controller's time: last evaluation time
        self._wall_at_now = 0.0
        self._labels_version = -1
        self._subs: list[Any] = []
        self._tasks: list[asyncio.Task] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._stopping = False
        self.started = asyncio.Event()
        self._health: dict[str, wire.Health] = {}
        self._open_keys: set[str] = set()  # incident group keys whose ids are stored in KV
        self._pending: list[_Pending] = []  # summary samples not yet in the store
        self._pending_rows = 0
        self._layouts: dict[str, list[_Layout]] = {}  # node → its summaries' layouts the store holds rows for
        self._store_gcs = 0  # store.gc calls that forgot entities (rows our layouts may point at)
        self._layouts_gcs = -1  # ... when _layouts was last known valid
        self._ncat = -1
        self._derived_layouts: dict[str, _Layout] = {}  # node → its ctl_* signals the store holds rows for
        self._derived_gcs = -1
        self._derived_ncat = -1
        self.fast_flushes = 0  # flushes that took the per-summary path (tests look)
        self.rejections = ingest.Rejections(log)
        self.nodes = ingest.NodeBook(cfg.max_nodes, cfg.silent_intervals, cfg.evaluation_interval)
        self.loops: dict[str, LoopHealth] = {}
        #: nodes whose open findings were restored from KV but that this process has not heard
        #: from yet: their incidents are not (re)published until they are, and are resolved
        #: "node silent" if they stay silent (a restart must not re-announce a dead node's trouble)
        self._unconfirmed: set[str] = set()
        self._deferred: set[str] = set()  # incident ids whose publication waits for their node
        self._silenced: dict[str, float] = {}  # finding id → controller time it was resolved for silence

    # ------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.cfg
        self.nc = await connect(cfg.nats, initial_timeout=30.0, error_cb=self._on_error)
        self.js = self.nc.jetstream()
        await ensure_streams(self.js, [wire.FINDINGS_STREAM], update=False)
        await ensure_streams(self.js, [wire.REMAPS_STREAM, M.INCIDENTS_STREAM], update=True)
        self.state = await StateStore.open(self.js, cfg.bucket, cfg.cluster, cfg.state_max_age, nc=self.nc)
        await self._restore()
        self._subs.append(await self.nc.subscribe(wire.subject_filter("summary", cluster=cfg.cluster),
                                                  cb=self._on_summary))
        self._subs.append(await self.nc.subscribe(wire.subject_filter("health", cluster=cfg.cluster),
                                                  cb=self._on_health))
        self._subs.append(await self.nc.subscribe(wire.subject_filter("phase", cluster=cfg.cluster),
                                                  cb=self._on_phase))
        self._subs.append(await self.nc.subscribe(M.reply_subject(cfg.cluster), queue=cfg.queue, cb=self._on_reply))
        await self._recover_planned()
        self._tasks = [asyncio.create_task(self._supervised(name, fn), name=f"skewd-ctl-{name}")
                       for name, fn in (("findings", self._findings_loop), ("kvwatch", self._kv_watch_loop),
                                        ("eval", self._eval_loop), ("housekeeping", self._housekeeping_loop))]
        await self.nc.flush()
        for rid, how in culprit_coverage(self.engine.rules.rules, cfg.culprit_pathologies,
                                         cfg.culprit_evidence).items():
            if how.startswith("PROBLEM"):
                log.warning("culprit rule %s: %s", rid, how)
        log.info("controller %s started for cluster %s: %d rules (%d group-scope), %d TP groups configured",
                 cfg.controller_id, cfg.cluster, len(self.engine.rules.rules),
                 sum(1 for r in self.engine.rules.rules if r.scope in GROUP_SCOPES), len(cfg.tp_groups))
        self.started.set()

    async def stop(self) -> None:
        """Graceful stop within :data:`STOP_BUDGET_S`, the broker there or not: state is already
        in KV after every step, so nothing is flushed here beyond the engine snapshot, and that
        only while connected (with NATS gone a put would wait for its timeout, and nats-py
        would keep reconnecting meanwhile)."""
        if self._stopping:
            return
        self._stopping = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_BUDGET_S

        def left(share: float = 1.0) -> float:
            return max(0.05, (deadline - loop.time()) * share)

        for t in self._tasks:
            t.cancel()
        # nats-py's fetch can swallow a cancellation (asyncio.wait_for race on 3.10/3.11): the
        # loops also watch _stopping, and we never wait for a task without a bound
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=left(0.3))
        self._tasks = []
        if self.nc is not None:
            if self.nc.is_connected:
                try:
                    async def goodbye() -> None:
                        for sub in self._subs:
                            await sub.unsubscribe()
                        if self.state is not None and self.next_eval is not None:
                            await self.state.put_engine(self.engine, self.now)
                        await self.nc.flush()
                    await asyncio.wait_for(goodbye(), left(0.6))
                except Exception:  # noqa: BLE001 - the connection may be going; the snapshot is a bonus
                    pass
            try:
                await asyncio.wait_for(self.nc.close(), left())
            except Exception:  # noqa: BLE001 - the connection may be gone already
                pass

    async def run_forever(self) -> None:
        await self.start()
        try:
            while True:
                await asyncio.sleep(3600)
        finally:
            await self.stop()

    async def _on_error(self, e: Exception) -> None:
        if self._stopping:
            return  # reconnect attempts racing the close: not news
        log.warning("nats: %s", e)

    async def _supervised(self, name: str, run: Callable[[], Any]) -> None:
        """Run a background loop for the controller's life: a crash is logged with its
        traceback, counted and shown in ``status()["loops"]``, and the loop is started again
        after a backoff (0.1 s doubling to 30 s; back to 0.1 s after a minute without a crash).
        Without this, one unexpected exception ended finding ingestion silently."""
        health = self.loops[name] = LoopHealth()
        backoff = 0.1
        while not self._stopping:
            began = time.monotonic()
            health.running = True
            try:
                await run()
                if self._stopping:
                    break
                raise RuntimeError("returned while the controller runs")
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the point: log, count, restart
                health.running = False
                health.restarts += 1
                health.last_error = f"{type(e).__name__}: {e}"[:300]
                health.last_error_wall = self.wall()
                self.stats.errors += 1
                if time.monotonic() - began > 60.0:
                    backoff = 0.1
                health.backoff_s = backoff
                log.error("controller %s loop crashed (restart %d in %.1fs): %s", name, health.restarts, backoff,
                          health.last_error, exc_info=True)
                await asyncio.sleep(backoff)
                backoff = min(30.0, backoff * 2)
        health.running = False

    # ------------------------------------------------------------------------------------------
    # restore
    # ------------------------------------------------------------------------------------------
    async def _restore(self) -> None:
        assert self.state is not None
        saved = await self.state.load()
        for d in saved.get("finding", {}).values():
            try:
                self.correlator.observe(wire.finding_from_dict(d))
            except wire.WireError as e:
                log.warning("state: unreadable finding skipped: %s", e)
        ids: dict[str, tuple[str, float]] = {}
        published: list[str] = []
        held_from: dict[str, float] = {}
        for v in saved.get("incident", {}).values():
            try:  # KV is ours, but a damaged record must cost itself, not the start
                ids[str(v["group_key"])] = (str(v["id"]), float(v["opened_at"]))
                if v.get("published", True):
                    published.append(str(v["id"]))
                if "held_from" in v:
                    held_from[str(v["id"])] = float(v["held_from"])
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                log.warning("state: unreadable incident record skipped: %r (%s)", v, e)
        self.correlator.restore_ids(ids, published=published, held_from=held_from)
        self._open_keys = set(self.correlator.ids)
        self.remaps = {k: v for k, v in saved.get("remap", {}).items() if isinstance(v, dict)}
        eng = saved.get("engine", {}).get("engine")
        try:
            n = restore_engine(self.engine, eng) if isinstance(eng, dict) else 0
        except Exception as e:  # noqa: BLE001 - alert states are rebuilt from the summaries then
            log.warning("state: engine snapshot not restored: %s: %s", type(e).__name__, e)
            n = 0
        # nodes with open findings: alive or not, this process has not heard them yet. Their
        # silence is timed from now (the controller was not listening before), and until they
        # are heard their incidents are not re-announced
        wall = self.wall()
        for f in self.correlator.findings.values():
            if _agent_open(f) and f.node not in self._unconfirmed:
                self._unconfirmed.add(f.node)
                self.nodes.admit(f.node, wall)
        log.info("state restored: %d findings, %d open incidents, %d suggestions, %d alert states; "
                 "%d nodes with open findings not heard from yet", len(self.correlator.findings),
                 len(self.correlator.ids), len(self.remaps), n, len(self._unconfirmed))

    async def _recover_planned(self) -> None:
        """Suggestions stored as planned but maybe never published (crash in between): publish
        those the remap stream does not hold. Within the stream's duplicate window the
        ``Nats-Msg-Id`` would drop a copy anyway; the scan covers restarts after it."""
        planned = {k: r for k, r in self.remaps.items() if r.get("status") == M.SuggestionStatus.PLANNED.value}
        if not planned:
            return
        since = min(float(r.get("planned_wall", 0)) for r in planned.values()) - 5.0
        seen = await self._published_ids(since)
        for key, rec in planned.items():
            if key in seen:
                await self._mark_published(key, seen[key])
            else:
                await self._publish_remap(key, rec)
                self.stats.remaps_recovered += 1

    async def _published_ids(self, since_wall: float) -> dict[str, int]:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        out: dict[str, int] = {}
        start = _dt.datetime.fromtimestamp(max(0.0, since_wall), tz=_dt.timezone.utc)
        sub = await self.js.pull_subscribe(
            wire.remap_subject(self.cfg.cluster), durable=None, stream=wire.REMAPS_STREAM.name,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start,
                                  ack_policy=AckPolicy.NONE, inactive_threshold=30.0))
        try:
            while True:
                try:
                    msgs = await sub.fetch(256, timeout=0.5)
                except Exception:  # noqa: BLE001 - nats TimeoutError: nothing more stored
                    break
                for m in msgs:
                    mid = (m.headers or {}).get(wire.HDR_MSG_ID)
                    if mid:
                        out[mid] = m.metadata.sequence.stream
                if msgs and msgs[-1].metadata.num_pending == 0:
                    break
        finally:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001
                pass
        return out

    # ------------------------------------------------------------------------------------------
    # inputs
    # ------------------------------------------------------------------------------------------
    def _reject(self, kind: str, reason: str, subject: str, detail: str) -> None:
        """Count (status and the per-kind counter) and log one rejected message."""
        self.rejections.reject(kind, reason, subject, detail)
        if kind == "summary":
            self.stats.summaries_rejected += 1
        elif kind == "finding":
            self.stats.findings_rejected += 1
        elif kind == "phase":
            self.stats.phase_rejected += 1
        elif kind == "health":
            self.stats.health_rejected += 1

    def _heard(self, node: str, interval: float | None = None) -> bool:
        """Note a message from ``node``'s agent; False when it is a new node and
        ``ingest.max_nodes`` are live (the message is then rejected)."""
        if not self.nodes.admit(node, self.wall(), interval):
            return False
        self._unconfirmed.discard(node)
        return True

    async def _on_summary(self, msg: Any) -> None:
        subject = msg.subject
        try:
            s = wire.decode_summary(msg.data)
        except wire.WireError as e:
            self._reject("summary", ingest.reason_of(e), subject, str(e))
            return
        try:
            why = ingest.subject_mismatch(subject, wire.MessageKind.SUMMARY, s.cluster, s.node)
            if why is not None:
                self._reject("summary", ingest.SUBJECT_MISMATCH, subject, why)
                return
            why = ingest.summary_clock_problem(s.t, self.wall(), self.cfg.max_clock_skew)
            if why is not None:
                self._reject("summary", ingest.CLOCK_SKEW, subject, why)
                return
            if not self._heard(s.node, s.interval):
                self._reject("summary", ingest.TOO_MANY_NODES, subject,
                             f"node {s.node!r} is new and {self.cfg.max_nodes} nodes are live (ingest.max_nodes)")
                return
            self.ingest_summary(s, s.labels)  # the decoder checked: an object of strings
        except Exception:  # noqa: BLE001 - a callback must not die on one message; counted and shown
            self.stats.errors += 1
            log.exception("summary on %s not taken in", subject)

    def ingest_summary(self, s: wire.Summary, labels: dict[str, str] | None = None) -> None:
        """Take one node summary (public so replay and tests can feed summaries directly)."""
        self.stats.summaries += 1
        if labels:
            self.topology.observe(s.node, labels)
        starts = s.signals.get(BURST_STARTS) or {}
        nbytes = s.signals.get(BURST_BYTES) or {}
        bursts = []
        for k, v in starts.items():
            if v is None:
                continue
            b = nbytes.get(k)
            bursts.append((float(v), float(b) if b is not None else float("nan")))
        bursts.sort()
        self.aligner.observe(s.node, s.t, s.clock_sync.synced, s.clock_sync.max_error_s, bursts)
        self.timelines.add_summary(s.node, s.t, s.signals)
        # buffered: one store ingest per tick (or per FLUSH_ROWS) instead of one per summary
        names: list[str] = []
        ents_of: list[str] = []
        values: list[float] = []
        for name, ents in s.signals.items():
            if name in _NOT_SAMPLES:
                continue
            for ent, v in ents.items():
                if v is not None:
                    names.append(name)
                    ents_of.append(ent)
                    values.append(float(v))
        if values:
            lay = None
            for known in self._layouts.get(s.node, ()):
                if known.names == names and known.entities == ents_of:
                    lay = known
                    break
            if lay is not None:  # the layout's lists stand for these (equal) ones
                names, ents_of = lay.names, lay.entities
            self._pending.append(_Pending(s.node, s.t, names, ents_of, values, lay))
            self._pending_rows += len(values)
            if self._pending_rows >= FLUSH_ROWS:
                self._flush()
        if s.node not in self.store.registry.node_labels:
            self._labels_version = -1
        if self.first_t is None:
            self.first_t = s.t
            self.next_eval = math.ceil(s.t / self.cfg.evaluation_interval) * self.cfg.evaluation_interval
        if s.t > self.watermark:
            self.watermark = s.t
            self._wake.set()

    def _flush(self) -> None:
        """Summary samples into the window store. The store's fast path takes one-node,
        one-time batches whose rows it knows, so when every pending summary has a layout the
        store already holds (and the store's shape is unchanged since), each summary goes in
        as its own batch, grouped by node and in time order per node: the same columns and
        values as the one multi-node batch of the general path, which is taken otherwise, so
        new entities get their ids in the same order as always."""
        if not self._pending:
            return
        pend, self._pending, self._pending_rows = self._pending, [], 0
        store = self.store
        # a known layout means the store holds a row for each of its catalogued samples: only a
        # gc that forgets entities, or a catalogue that grows, can make that untrue (new rows
        # and blocks elsewhere leave it true)
        same_shape = self._store_gcs == self._layouts_gcs and len(store.catalogue) == self._ncat
        if same_shape and all(p.layout is not None for p in pend):
            by_node: dict[str, list[_Pending]] = {}
            for p in pend:
                by_node.setdefault(p.node, []).append(p)
            batches = []
            for ps in by_node.values():
                if len(ps) > 1 and any(a.t > b.t for a, b in zip(ps, ps[1:])):
                    ps = sorted(ps, key=lambda p: p.t)  # stable: a repeated time keeps arrival order
                for p in ps:
                    lay = p.layout
                    batches.append(SampleBatch(np.full(len(p.values), p.t), lay.node_col, lay.entity_col,
                                               lay.signal_col, np.array(p.values, dtype=np.float64)))
            # a layout's column arrays are made once and never modified: the store may know
            # them by identity; its layout cache is sized to hold every node's (see below)
            store.ingest_many(batches, shared_columns=True)
            self.fast_flushes += 1
        else:
            store.ingest(SampleBatch.from_rows(
                [(p.t, p.node, e, n, v) for p in pend for n, e, v in zip(p.names, p.entities, p.values)]))
            if not same_shape:
                self._layouts.clear()
            for p in pend:
                known = self._layouts.setdefault(p.node, [])
                if any(k.names == p.names and k.entities == p.entities for k in known) or not self._in_store(p):
                    continue
                known.append(_Layout.of(p))
                del known[:-LAYOUTS_PER_NODE]
            self._size_layout_cache()
        self._layouts_gcs, self._ncat = self._store_gcs, len(store.catalogue)

    def _ingest_derived(self, t: float, derived: dict[str, dict[str, float]]) -> None:
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
            store.ingest_many([SampleBatch(np.full(len(vs), t), lay.node_col, lay.entity_col, lay.signal_col,
                                           np.array(vs, dtype=np.float64)) for _, _, vs, lay in per_node],
                              shared_columns=True)
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

    def gc_store(self, now: float) -> int:
        """``store.gc`` (always through here: the flush must know when rows were forgotten)."""
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

    async def _on_health(self, msg: Any) -> None:
        try:
            h = wire.decode_health(msg.data)
        except wire.WireError as e:
            self._reject("health", ingest.reason_of(e), msg.subject, str(e))
            return
        why = ingest.subject_mismatch(msg.subject, wire.MessageKind.HEALTH, h.cluster, h.node)
        if why is not None:
            self._reject("health", ingest.SUBJECT_MISMATCH, msg.subject, why)
            return
        if not self._heard(h.node):
            self._reject("health", ingest.TOO_MANY_NODES, msg.subject, f"node {h.node!r} is new and "
                         f"{self.cfg.max_nodes} nodes are live (ingest.max_nodes)")
            return
        self.stats.health += 1
        self._health[h.node] = h

    async def _on_phase(self, msg: Any) -> None:
        try:
            rec = M.decode(msg.data, M.Kind.PHASE)
        except wire.WireError as e:
            self._reject("phase", ingest.reason_of(e), msg.subject, str(e))
            return
        why = ingest.subject_mismatch(msg.subject, wire.MessageKind.PHASE, rec.cluster, rec.node,  # type: ignore[union-attr]
                                      engine=rec.engine)  # type: ignore[union-attr]
        if why is not None:
            self._reject("phase", ingest.SUBJECT_MISMATCH, msg.subject, why)
            return
        # the vLLM plugin is not the agent: its records say nothing about the agent's liveness,
        # and create no node state beyond the engine's bounded timeline
        if rec.node not in self.nodes and len(self.nodes) >= self.cfg.max_nodes:  # type: ignore[union-attr]
            self._reject("phase", ingest.TOO_MANY_NODES, msg.subject, f"node {rec.node!r} is not live and "  # type: ignore[union-attr]
                         f"{self.cfg.max_nodes} nodes are (ingest.max_nodes)")
            return
        try:
            self.timelines.add_record(rec)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - a callback must not die on one message
            self.stats.errors += 1
            log.exception("phase record on %s not taken in", msg.subject)
            return
        self.stats.phase_records += 1

    async def _findings_loop(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        cfg = self.cfg
        sub = await self.js.pull_subscribe(
            wire.subject_filter("finding", cluster=cfg.cluster), durable=cfg.durable, stream=wire.FINDINGS_STREAM.name,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=cfg.ack_wait, max_deliver=-1,
                                  deliver_policy=DeliverPolicy.ALL, max_ack_pending=10000))
        while not self._stopping:
            try:
                msgs = await sub.fetch(cfg.batch, timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - fetch timeout (nothing new) or a reconnect in progress
                continue
            for m in msgs:
                await self._take_finding_msg(m)

    async def _refuse(self, m: Any, reason: str, detail: str) -> None:
        """Reject a finding for good: counted, logged, and terminated so JetStream never
        redelivers it (a malformed, spoofed or mistimed message never becomes acceptable)."""
        self._reject("finding", reason, m.subject, detail)
        try:
            await m.term()
        except Exception as e:  # noqa: BLE001 - no connection: it comes back after ack_wait and is refused again
            log.debug("term of a rejected finding failed: %s", e)

    async def _take_finding_msg(self, m: Any) -> None:
        try:
            f = wire.decode_finding(m.data)
        except wire.WireError as e:
            await self._refuse(m, ingest.reason_of(e), str(e))
            return
        why = ingest.subject_mismatch(m.subject, wire.MessageKind.FINDING, f.cluster, f.node, rule=f.rule_id)
        if why is not None:
            await self._refuse(m, ingest.SUBJECT_MISMATCH, why)
            return
        why = ingest.finding_clock_problem(f, self.wall(), self.cfg.max_clock_skew, wire.FINDINGS_STREAM.max_age_s)
        if why is not None:
            await self._refuse(m, ingest.CLOCK_SKEW, why)
            return
        if f.scope not in GROUP_SCOPES and not self._heard(f.node):
            # not lost: JetStream offers it again once silent nodes have made room
            self._reject("finding", ingest.TOO_MANY_NODES, m.subject, f"node {f.node!r} is new and "
                         f"{self.cfg.max_nodes} nodes are live (ingest.max_nodes); redelivered later")
            try:
                await m.nak(delay=self.nodes.silent_after(f.node))
            except Exception:  # noqa: BLE001 - then ack_wait brings it back
                pass
            return
        self.stats.findings_in += 1
        try:
            async with self._lock:
                if self.correlator.observe(f):
                    await self.state.put_finding(f)  # type: ignore[union-attr]
                else:
                    self.stats.findings_duplicate += 1
            await m.ack()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - KV unavailable: leave unacked, JetStream redelivers
            self.stats.errors += 1
            log.warning("finding %s not stored yet (%s); it will be redelivered", f.event_id, e)

    async def _kv_watch_loop(self) -> None:
        """Findings other replicas stored: every replica correlates over all of them."""
        assert self.state is not None
        while not self._stopping:
            try:
                w = await self.state.kv.watch(f"{self.state.prefix}.finding.>", ignore_deletes=True)
                async for e in w:
                    if e is None or not e.value:
                        continue
                    try:
                        f = wire.finding_from_dict(wire.load_json(e.value, max_bytes=STATE_VALUE_BYTES))
                    except wire.WireError as err:
                        log.warning("KV finding %s unreadable, skipped: %s", e.key, err)
                        continue
                    async with self._lock:
                        self.correlator.observe(f)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - watcher lost with the connection: start again
                log.debug("kv watch restarting: %s", e)
                await asyncio.sleep(1.0)

    async def _on_reply(self, msg: Any) -> None:
        self.stats.replies += 1
        try:
            rep = M.decode(msg.data, M.Kind.REMAP_REPLY)
        except wire.WireError as e:
            await self._respond(msg, M.RemapReceipt(key="", status=M.ReceiptStatus.INVALID, error=str(e)))
            return
        receipt = await self.record_reply(rep)  # type: ignore[arg-type]
        await self._respond(msg, receipt)

    async def _respond(self, msg: Any, receipt: M.RemapReceipt) -> None:
        if msg.reply:
            await self.nc.publish(msg.reply, M.encode(receipt), headers=M.headers(receipt))

    async def record_reply(self, rep: M.RemapReply) -> M.RemapReceipt:
        """Record a consumer's ack/reject in the suggestion's KV record (compare-and-set)."""
        assert self.state is not None
        recorded_at = self.wall()
        outcome: dict[str, Any] = {}

        def apply(rec: dict[str, Any]) -> dict[str, Any] | None:
            replies = rec.setdefault("replies", [])
            same = [r for r in replies if r["consumer"] == rep.consumer and r["decision"] == rep.decision.value
                    and sorted(r.get("actions", [])) == sorted(rep.actions)]
            expired = float(rec["suggestion"]["expires_at"]) < max(self.now, 0.0) or rec.get("status") == "expired"
            outcome["status"] = (M.ReceiptStatus.DUPLICATE if same else
                                 M.ReceiptStatus.EXPIRED if expired else M.ReceiptStatus.RECORDED)
            if same:
                return None
            replies.append({"consumer": rep.consumer, "decision": rep.decision.value, "reason": rep.reason,
                            "t": rep.t, "actions": list(rep.actions), "recorded_at": recorded_at})
            if not expired:
                rec["status"] = (M.SuggestionStatus.ACKED if rep.decision is M.Decision.ACK
                                 else M.SuggestionStatus.REJECTED).value
            return rec

        rec = await self.state.update_remap(rep.key, apply)
        if rec is None:
            return M.RemapReceipt(key=rep.key, status=M.ReceiptStatus.UNKNOWN, decision=rep.decision.value,
                                  error=f"no suggestion with key {rep.key!r} in cluster {self.cfg.cluster!r}")
        self.remaps[rep.key] = rec
        log.info("suggestion %s: %s by %s (%s)", rep.key, rep.decision.value, rep.consumer, outcome["status"].value)
        return M.RemapReceipt(key=rep.key, status=outcome["status"], decision=rep.decision.value, recorded_at=recorded_at)

    # ------------------------------------------------------------------------------------------
    # evaluation
    # ------------------------------------------------------------------------------------------
    async def _eval_loop(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)  # a deferred catch-up lets summaries and findings in first
            try:
                await self.evaluate_due()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - never let one bad tick stop the controller
                self.stats.errors += 1
                log.exception("evaluation failed")

    async def evaluate_due(self) -> None:
        """Evaluate the grid times the summaries' clock has passed: at most
        :data:`MAX_TICKS_PER_WAKE` per call (the rest are left for the next wake-up, which is
        requested), and the next grid time is always later than the one evaluated, however
        large the times are (t + interval == t for t = 1e17 once looped here for ever)."""
        ival = self.cfg.evaluation_interval
        done = 0
        while self.next_eval is not None and self.watermark >= self.next_eval:
            if done >= MAX_TICKS_PER_WAKE:
                self.stats.evaluations_deferred += 1
                self._wake.set()
                return
            if self.watermark - self.next_eval > 10 * ival:  # far behind (outage, replay jump): latest only
                self.next_eval = math.floor(self.watermark / ival) * ival
            t = self.next_eval
            self.next_eval = max(t + ival, math.nextafter(t, math.inf))
            done += 1
            async with self._lock:
                await self.tick(t)

    async def tick(self, t: float) -> None:
        """One evaluation at time ``t``: derived signals, group rules, correlation, planning."""
        self.now, self._wall_at_now = t, self.wall()
        self._flush()
        if self.topology.version != self._labels_version or len(self.store.registry.node_labels) < len(self.aligner.clocks):
            for node in set(self.aligner.clocks) | {n for g in self.topology.tp_groups().values() for n in g.nodes}:
                self.store.registry.set_node_labels(node, self.topology.node_labels(node))
            self._labels_version = self.topology.version
        tp = {name: g.nodes for name, g in self.topology.tp_groups().items()}
        pp = {name: [self.topology.stage_members(s) for s in p.stages] for name, p in self.topology.pp_groups().items()}
        derived = await self._derive(t, tp, pp)
        self._ingest_derived(t, derived)
        self.correlator.reports = self.aligner.reports
        warm = self.first_t is not None and t - self.first_t >= self.cfg.warmup
        if warm:
            transitions = self.engine.evaluate(t)
            self.stats.evaluations += 1
            for f in transitions:
                self._enrich(f, t)
                await self._emit_finding(f)
            if transitions or self.stats.evaluations % 10 == 1:
                await self.state.put_engine(self.engine, t)  # type: ignore[union-attr]
            await self._drop_lapsed_pending()
        await self._correlate_and_plan(t)

    async def _derive(self, t: float, tp: dict, pp: dict) -> dict[str, dict[str, float]]:
        """``Aligner.derive``, one TP group at a time, letting the event loop run in between:
        with many groups a tick takes long enough that summaries would otherwise queue up
        (latency) or be dropped by the client as a slow consumer."""
        steps = self.aligner.derive_steps(t, tp, pp)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            await asyncio.sleep(0)

    async def _drop_lapsed_pending(self) -> None:
        """The engine forgets a pending alert whose expression turned false without emitting a
        transition (Prometheus semantics); forget its pending finding too, or it would hold
        the victims of its group (``Correlator.culprit_pending``) for ever."""
        ours = {r.id for r in self.engine.rules.rules if r.scope in GROUP_SCOPES}
        # matched by identity, not by key: the engine's state keys and Finding.fingerprint
        # need not be computed alike
        alive = {(st.rule_id, st.node, st.entity, tuple(sorted(st.labels.items())))
                 for states in self.engine.states.values() for st in states.values()}
        for fp, f in list(self.correlator.findings.items()):
            if f.state is State.PENDING and f.rule_id in ours and \
                    (f.rule_id, f.node, f.entity, tuple(sorted(f.labels.items()))) not in alive:
                del self.correlator.findings[fp]
                try:
                    await self.state.delete_finding(fp)  # type: ignore[union-attr]
                except Exception as e:  # noqa: BLE001 - expires with the bucket's max_age otherwise
                    log.debug("pending finding %s not deleted from KV: %s", fp, e)

    def _enrich(self, f: Finding, now: float) -> None:
        """State the culprit measurement (controller/culprit.py), the engine phase and the
        observed effect on a controller finding."""
        if f.pathology in self.cfg.culprit_pathologies:
            f.evidence.update(self.correlator.contract(f))
        phase, effect = self.correlator.phase_and_effect(f.node, self.topology.engine_of(f.node), f.active_at, now)
        if phase is not None:
            code = M.Phase(phase.phase).code if phase.phase in {p.value for p in M.Phase} else None
            f.evidence.update({"phase_code": code, "kv_usage_ratio": phase.kv_usage_ratio,
                               "requests_waiting": phase.waiting})
        if effect is not None:
            f.evidence.update({"ttft_seconds": effect.ttft_s, "ttft_baseline_seconds": effect.ttft_baseline_s,
                               "itl_seconds": effect.itl_s, "itl_baseline_seconds": effect.itl_baseline_s,
                               "queue_growth_per_second": effect.queue_growth_per_s})
        f.summary = (f"{f.summary} [phase: {phase.phase if phase else 'unknown'}; "
                     f"effect: {effect.description if effect else 'not observed'}]")

    async def _emit_finding(self, f: Finding) -> None:
        self.stats.controller_findings += 1
        self.correlator.observe(f)
        await self.state.put_finding(f)  # type: ignore[union-attr]
        try:
            await self.js.publish(wire.subject_for(f, self.cfg.cluster), wire.encode(f), headers=wire.headers_for(f),
                                  timeout=5.0)
        except Exception as e:  # noqa: BLE001 - stored in KV already; the next transition is published again
            self.stats.errors += 1
            log.warning("controller finding %s not published: %s", f.event_id, e)

    async def _correlate_and_plan(self, t: float) -> None:
        assert self.state is not None
        corr = self.correlator
        changed = corr.correlate(t)
        key_of = {iid: k for k, (iid, _) in corr.ids.items()}
        for inc in changed:
            self._note_silence(inc)
            key = key_of.get(inc.id)
            shown = not corr.is_held(inc)
            if inc.state == "open" and key is not None and (shown or not corr.due(inc, t, self.cfg.group_wait)):
                await self.state.put_incident_id(key, inc.id, inc.opened_at, published=shown,
                                                 held_from=corr.hold_start(inc))
            if shown and inc.state == "open" and self._awaits_node(inc):
                self._deferred.add(inc.id)  # restored, its node not heard since the restart: not re-announced
                continue
            if shown:
                self._deferred.discard(inc.id)
                await self._publish_incident(inc)
            elif inc.state != "open":  # resolved or taken over while held: nobody is shown it
                self.stats.incidents_withheld += 1
                log.info("incident %s (%s) %s while held: never published", inc.id, inc.pathology, inc.state)
        # Alertmanager's group_wait for the first notification: an incident is shown once it has
        # been open group_wait (and no culprit rule is pending in its TP group), so a cause that
        # fires a few seconds after its symptom takes the symptom over before anyone saw it
        for iid in [i for i in self._deferred if not self._awaits_node(corr.incidents.get(i))]:
            self._deferred.discard(iid)  # its node spoke again: its latest state, if it changed meanwhile
            inc = corr.incidents.get(iid)
            if inc is not None and inc.state == "open" and not corr.is_held(inc):
                await self._publish_incident(inc)
        for inc in sorted(corr.open_incidents(), key=lambda i: (i.opened_at, i.id)):
            if corr.is_held(inc) and corr.due(inc, t, self.cfg.group_wait) and not self._awaits_node(inc):
                key = key_of.get(inc.id)
                if key is not None:
                    await self.state.put_incident_id(key, inc.id, inc.opened_at, published=True,
                                                     held_from=corr.hold_start(inc))
                corr.mark_published(inc.id)
                self.stats.incidents_shown += 1
                await self._publish_incident(inc)
        for key in list(self._open_keys - set(corr.ids)):
            await self.state.delete_incident_id(key)
        self._open_keys = set(corr.ids)
        for inc in sorted(corr.open_incidents(), key=lambda i: (i.opened_at, i.id)):
            if corr.is_held(inc):
                continue  # not shown yet (group_wait, or a culprit rule pending): nothing to plan
            if self._awaits_node(inc):
                continue  # restored, its node not heard from since the restart
            if t - inc.opened_at < self.cfg.group_wait:
                continue  # Alertmanager's group_wait: a culprit may still explain it
            if self.correlator.culprit_pending(inc):
                continue  # a culprit rule is pending in this incident's TP group: wait for its verdict
            if not self.correlator.plannable(inc):
                continue  # names no culprit, or rests on an incubating rule alone (docs/rules.md, Maturity)
            key = suggestion_key(self.cfg.cluster, inc.id)
            if key in self.remaps:
                continue
            s = self.planner.plan(inc, t, self.cfg.controller_id)
            if s is None:
                self.remaps[key] = {"status": "none", "suggestion": None}  # nothing to suggest: remember that
                continue
            await self.propose(s)
        for key, rec in list(self.remaps.items()):
            sug = rec.get("suggestion")
            if sug and rec.get("status") in (M.SuggestionStatus.PUBLISHED.value, M.SuggestionStatus.PLANNED.value) \
                    and float(sug["expires_at"]) < t:
                new = await self.state.update_remap(key, lambda r: {**r, "status": M.SuggestionStatus.EXPIRED.value}
                                                    if r.get("status") in LIVE_STATUSES[:2] else None)
                if new is not None:
                    self.remaps[key] = new

    async def _publish_incident(self, inc: M.Incident) -> None:
        try:
            await self.js.publish(M.incident_subject(self.cfg.cluster), M.encode(inc),
                                  headers=M.headers(inc, f"{inc.id}-{inc.digest()}"), timeout=5.0)
            self.stats.incidents_published += 1
        except Exception as e:  # noqa: BLE001 - the next change publishes the incident again
            self.stats.errors += 1
            log.warning("incident %s not published: %s", inc.id, e)

    # ------------------------------------------------------------------------------------------
    # suggestions: exactly once
    # ------------------------------------------------------------------------------------------
    async def propose(self, s: M.RemapSuggestion) -> bool:
        """Store then publish a suggestion, unless it (or an equivalent live one) exists.
        Returns True when this call published it."""
        assert self.state is not None
        sem = semantic_key(s)
        live = next((k for k, r in self.remaps.items() if r.get("semantic") == sem and r.get("status") in LIVE_STATUSES
                     and r.get("suggestion") and float(r["suggestion"]["expires_at"]) >= self.now), None)
        if live is not None:
            self.stats.remaps_suppressed += 1
            self.remaps[s.key] = {"status": "suppressed", "suggestion": None, "by": live}
            log.info("suggestion for incident %s suppressed: equivalent %s still live", s.incident, live)
            return False
        rec = {"suggestion": s.to_dict(), "status": M.SuggestionStatus.PLANNED.value, "semantic": sem,
               "planned_wall": self.wall(), "controller": self.cfg.controller_id, "replies": []}
        if not await self.state.create_remap(s.key, rec):
            existing = await self.state.get_remap(s.key)
            self.remaps[s.key] = existing or rec
            self.stats.remaps_deduplicated += 1
            return False
        self.remaps[s.key] = rec
        return await self._publish_remap(s.key, rec)

    async def _publish_remap(self, key: str, rec: dict[str, Any]) -> bool:
        body = json.dumps(rec["suggestion"], sort_keys=True, separators=(",", ":")).encode()
        hdr = {wire.HDR_MSG_ID: key, wire.HDR_KIND: M.Kind.REMAP.value, wire.HDR_SCHEMA: str(M.SCHEMA)}
        try:
            ack = await self.js.publish(wire.remap_subject(self.cfg.cluster), body, headers=hdr, timeout=5.0)
        except Exception as e:  # noqa: BLE001 - stays "planned": retried at the next start / by housekeeping
            self.stats.errors += 1
            log.warning("suggestion %s stored but not published yet: %s", key, e)
            return False
        if ack.duplicate:
            self.stats.remaps_deduplicated += 1
        else:
            self.stats.remaps_published += 1
            log.info("suggestion %s published (seq %d): %s", key, ack.seq, rec["suggestion"].get("summary", "")[:200])
        await self._mark_published(key, ack.seq)
        return not ack.duplicate

    async def _mark_published(self, key: str, seq: int) -> None:
        assert self.state is not None
        new = await self.state.update_remap(
            key, lambda r: {**r, "status": M.SuggestionStatus.PUBLISHED.value if r["status"] == "planned" else r["status"],
                            "seq": seq})
        if new is not None:
            self.remaps[key] = new

    # ------------------------------------------------------------------------------------------
    # housekeeping
    # ------------------------------------------------------------------------------------------
    async def _housekeeping_loop(self) -> None:
        ival = self.cfg.evaluation_interval
        last_log = self.wall()
        while not self._stopping:
            await asyncio.sleep(ival)
            try:
                wall = self.wall()
                await self.expire_silent_nodes(wall)
                if self.next_eval is not None and wall - self._wall_at_now > 3 * ival and self.now > -math.inf:
                    # no summaries: findings may still arrive; let wall time advance correlation
                    async with self._lock:
                        self.now = self.now + (wall - self._wall_at_now)
                        self._wall_at_now = wall
                        await self._correlate_and_plan(self.now)
                planned = [k for k, r in self.remaps.items() if r.get("status") == M.SuggestionStatus.PLANNED.value
                           and wall - float(r.get("planned_wall", wall)) > 10.0]
                for k in planned:
                    await self._publish_remap(k, self.remaps[k])
                if self.now > -math.inf:
                    self.gc_store(self.now)
                    self.correlator.forget_closed(self.now - self.cfg.horizon)
                    for fid in [i for i, at in self._silenced.items() if at < self.now - self.cfg.horizon]:
                        del self._silenced[fid]
                if wall - last_log > 60:
                    last_log = wall
                    log.info("controller stats: %s", asdict(self.stats))
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001
                self.stats.errors += 1
                log.exception("housekeeping failed")

    # ------------------------------------------------------------------------------------------
    # silent nodes
    # ------------------------------------------------------------------------------------------
    async def expire_silent_nodes(self, wall: float) -> list[str]:
        """Nodes not heard from for ``ingest.silent_intervals`` of their intervals at ``wall``:
        their agents' open findings are resolved (:data:`NODE_SILENT`, stored in KV so a
        restart does not re-open them), the incidents that held only those close as resolved
        with ``resolved_reason`` "node silent" (published), and their per-node state is
        forgotten (cardinality: a node that left costs nothing). Returns the silent nodes.

        Why: an agent that stops (crash, node down, partition) sends no resolved transition,
        so without this its incidents stay open for ever, as Alertmanager's would without
        ``resolve_timeout``; a node's summaries are its heartbeat."""
        silent = self.nodes.pop_silent(wall)
        if not silent:
            return []
        async with self._lock:
            t = self.now if self.now > -math.inf else wall
            # incidents restored from KV are rebuilt first, so their resolution is published
            await self._correlate_and_plan(t)
            for node, last in silent:
                await self._node_silent(node, wall - last, t)
            await self._correlate_and_plan(t)
        return [n for n, _ in silent]

    async def _node_silent(self, node: str, silent_for: float, t: float) -> None:
        n = 0
        for fp, f in list(self.correlator.findings.items()):
            if f.node != node or not _agent_open(f):
                continue
            at = max(t, f.evaluated_at)
            r = dataclasses.replace(f, state=State.RESOLVED, evaluated_at=at, resolved_at=at,
                                    evidence=dict(f.evidence), labels=dict(f.labels), params=dict(f.params),
                                    summary=f"{f.summary} [resolved by the controller: {NODE_SILENT} "
                                            f"for {silent_for:.0f}s]")
            self.correlator.findings[fp] = r
            self._silenced[r.id] = at
            n += 1
            try:
                await self.state.put_finding(r)  # type: ignore[union-attr]
            except Exception as e:  # noqa: BLE001 - a restart would then re-check the node's silence
                self.stats.errors += 1
                log.warning("silenced finding %s not stored: %s", r.event_id, e)
        self.stats.nodes_silenced += 1
        self.stats.findings_silenced += n
        self._unconfirmed.discard(node)
        self._forget_node(node)
        (log.warning if n else log.info)("node %s silent for %.0fs (limit %.0fs): %d open findings resolved, "
                                         "its state forgotten", node, silent_for, self.nodes.silent_after(node), n)

    def _forget_node(self, node: str) -> None:
        """Drop every piece of per-node state (it comes back with the node's next summary)."""
        self.aligner.bursts.pop(node, None)
        self.aligner.clocks.pop(node, None)
        for key in [k for k in self.timelines.engines if k == node or k.startswith(node + "/")]:
            del self.timelines.engines[key]
        self.topology.forget(node)
        if self.store.forget_node(node):
            self._store_gcs += 1  # the store's rows moved: layouts learned before are void
        self._layouts.pop(node, None)
        self._derived_layouts.pop(node, None)
        self._health.pop(node, None)

    def _note_silence(self, inc: M.Incident) -> None:
        """Say why an incident resolved when its findings were resolved for their node's silence."""
        if inc.state == "resolved" and not inc.resolved_reason and inc.findings \
                and all(fid in self._silenced for fid in inc.findings):
            inc.resolved_reason = NODE_SILENT
            inc.summary = f"{inc.summary} [resolved: {NODE_SILENT}]"

    def _awaits_node(self, inc: M.Incident | None) -> bool:
        """Whether ``inc`` is made only of agent findings from nodes restored from KV but not
        heard from since this process started (not re-announced until they are)."""
        if inc is None or not self._unconfirmed or inc.state != "open":
            return False
        nodes = set()
        for fid in inc.findings:
            f = self.correlator.findings.get(fid.split("-", 1)[0])
            if f is None or f.scope in GROUP_SCOPES:
                return False
            nodes.add(f.node)
        return bool(nodes) and nodes <= self._unconfirmed

    # ------------------------------------------------------------------------------------------
    # queries
    # ------------------------------------------------------------------------------------------
    def _node_value(self, sig: str, node: str) -> float | None:
        """Mean of a node signal over the engine's lookback (for cause attribution)."""
        t, v = self.store.series(sig, node)
        if len(t) == 0:
            return None
        sel = v[t > self.now - self.cfg.lookback] if self.now > -math.inf else v
        return float(np.mean(sel)) if len(sel) else None

    def status(self) -> dict[str, Any]:
        return {"cluster": self.cfg.cluster, "controller": self.cfg.controller_id, "now": self.now,
                "watermark": self.watermark, "stats": asdict(self.stats),
                # held incidents (not published yet: group_wait, or a culprit rule pending) are
                # listed too, marked "held", with the earliest time they may be published
                "open_incidents": [{**i.to_dict(), "held": self.correlator.is_held(i),
                                    "publish_after": self.correlator.hold_start(i) + self.cfg.group_wait}
                                   for i in self.correlator.open_incidents()],
                "suggestions": {k: r.get("status") for k, r in self.remaps.items()},
                # culprit claims the evidence did not support and sandbox findings kept as findings
                "correlation": self.correlator.report(),
                "topology_conflicts": dict(self.topology.conflicts),
                # TP groups whose steps are not matched across nodes, and why (unsynced clocks)
                "unaligned_groups": {g: r.unaligned for g, r in self.aligner.reports.items() if r.unaligned},
                "eval_errors": dict(self.engine.last_eval_errors),
                # what was refused, by kind and reason (docs/controller.md, "What the controller trusts")
                "rejected": {k: dict(v) for k, v in self.rejections.counts.items()},
                "nodes": {"live": len(self.nodes), "max": self.cfg.max_nodes,
                          "not_heard_since_restart": sorted(self._unconfirmed)},
                # supervised background loops: a crash restarts the loop and shows here
                "loops": {name: asdict(h) for name, h in self.loops.items()},
                "state_load": dict(getattr(self.state, "load_report", {}) or {})}
