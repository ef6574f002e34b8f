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

This module assembles the :class:`Controller` (its state, start/stop, restore from KV,
housekeeping, status); each step of the flow above is a module of its own: intake.py (what
comes in), storefeed.py (samples into the window store), evaluation.py (the tick, incidents),
suggestions.py, silence.py (silent nodes) and exchange.py (scale-out digests).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
from nats import errors as nats_errors

from skewd import wire
from skewd.catalogue import full_catalogue
from skewd.model import GROUP_SCOPES, Catalogue, Scope, State
from skewd.natsutil import (Backlog, DirectDelivery, connect, connect_intake, direct_delivery, ensure_streams,
                            flush_subscribed, hold_reads)
from skewd.rules.cli import PACKS
from skewd.rules.engine import Engine, RuleSet
from skewd.rules.reload import RuleManager
from skewd.rules.store import WindowStore

from . import ingest
from . import messages as M
from .align import Aligner
from .configtypes import ControllerConfig
from .correlator import Correlator
from .culprit import coverage as culprit_coverage
from .evaluation import Evaluation, TickGate
from .exchange import PartitionExchange
from .gcpolicy import GcPolicy
from .intake import Intake
from .layouts import IntakeLayouts
from .planner import Planner
from .roles import ROLE_ALL, ROLE_LEADER, ROLE_PARTITION
from .silence import SilentNodes, agent_open
from .state import StateStore, restore_engine
from .storefeed import StoreFeed
from .suggestions import Suggestions
from .timeline import Timelines
from .topology import Topology

log = logging.getLogger("skewd.controller")

#: stop() returns within this even with the broker gone (systemd's and the tests' expectation)
STOP_BUDGET_S = 1.8
#: the store forgets entities silent for the horizon at most this share of the horizon late: a
#: store gc walks every node's blocks (22 signals x 1,000 nodes: 3 % of a worker's event loop at
#: 50,000 summaries/s when it ran every evaluation interval)
STORE_GC_SHARE = 0.05


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


class Controller(Intake, Evaluation, Suggestions, SilentNodes, PartitionExchange):
    """The controller of one cluster: owns the window store, aligner, group rule engine,
    correlator and planner, and the NATS subscriptions that feed them. ``skewd controller``,
    ``skewd up``/``demo`` and the lab harness run it (the harness calls :meth:`ingest_summary`
    and :meth:`tick` directly); a scaled-out worker (controller/scaleout.py) runs one per
    partition it holds (``role="partition"``) and, while it holds the lease, the leader.

    Its state is declared here; its behaviour is split by idea: taking messages in
    (:class:`~skewd.controller.intake.Intake`), the tick
    (:class:`~skewd.controller.evaluation.Evaluation`), suggestions
    (:class:`~skewd.controller.suggestions.Suggestions`), silent nodes
    (:class:`~skewd.controller.silence.SilentNodes`) and the scale-out digests
    (:class:`~skewd.controller.exchange.PartitionExchange`); this module keeps construction,
    start/stop, the restore from KV, housekeeping and :meth:`status`."""

    def __init__(self, cfg: ControllerConfig, *, catalogue: Catalogue | None = None,
                 ruleset: RuleSet | None = None, wall_clock: Callable[[], float] = time.time,
                 role: str = ROLE_ALL, partition: int | None = None) -> None:
        if role not in (ROLE_ALL, ROLE_PARTITION, ROLE_LEADER) or (role == ROLE_PARTITION) != (partition is not None):
            raise ValueError(f"role {role!r} with partition {partition!r}")
        self.cfg = cfg
        self.role = role
        self.partition = partition
        self.catalogue = catalogue or full_catalogue()
        self.wall = wall_clock
        if ruleset is None:
            ruleset = RuleManager(cfg.rules or [str(PACKS)], self.catalogue).load_initial()
        self.store = WindowStore(self.catalogue, horizon=cfg.horizon)
        # a partition evaluates the TP-group rules of its groups, the leader the cluster-wide ones
        scopes = {ROLE_ALL: GROUP_SCOPES.keys(), ROLE_PARTITION: (Scope.TP_GROUP,), ROLE_LEADER: (Scope.CLUSTER,)}[role]
        self.engine = Engine(ruleset, self.store, lookback=cfg.lookback, cluster=cfg.cluster, scopes=scopes)
        self.topology = Topology.from_config(cfg)
        self.aligner = Aligner(cfg.align_window, cfg.max_skew, cfg.unsynced_clock_error, cfg.min_group_fraction,
                               cfg.stale_after, cfg.horizon)
        self.timelines = Timelines(horizon=cfg.horizon, stale_after=max(cfg.stale_after * 6, 30.0))
        self.correlator = Correlator(cfg.cluster, self.topology, self.timelines,
                                     culprit_pathologies=cfg.culprit_pathologies, never_inhibit=cfg.never_inhibit,
                                     effect_window=cfg.effect_window, node_value=self._node_value,
                                     inhibit_rules=cfg.inhibit_rules, direct_evidence=cfg.direct_evidence,
                                     culprit_evidence=cfg.culprit_evidence, loss_paths=cfg.loss_paths,
                                     maturities={r.id: r.maturity for r in ruleset.rules})
        self.planner = Planner(cfg)
        self.stats = ControllerStats()
        self.nc: Any = None  # control: KV state, JetStream, findings, digests, replies, health, phase
        #: summaries only, on a connection of their own (see :func:`skewd.natsutil.connect_intake`)
        self.intake_nc: Any = None
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
        #: summaries delivered and not yet taken in (natsutil.direct_delivery), at most
        #: _summary_share bytes of them taken (the oldest beyond are shed)
        self._backlog = Backlog()
        self._summary_share = 0
        self._direct: DirectDelivery | None = None  # the intake connection's, once started
        self._tasks: list[asyncio.Task] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._stopping = False
        #: evaluate ticks on the tick thread (evaluation.py), off the event loop: set by start();
        #: a harness or replay that calls tick() itself evaluates inline, the same way
        self.tick_in_thread = False
        #: full garbage collections kept off warm ticks (gcpolicy.py): on for a started controller
        self.gc_policy = GcPolicy()
        self._on_thread = 0  # jobs of this controller on the tick thread (a tick, a flush): intake waits
        self._idle = asyncio.Event()  # set while no tick is on the tick thread
        self._idle.set()
        self.tick_gate = TickGate()  # the intake's: a scaled-out worker's controllers share one
        self.started = asyncio.Event()
        self._health: dict[str, wire.Health] = {}
        self._open_keys: set[str] = set()  # incident group keys whose ids are stored in KV
        self.feed = StoreFeed(self.store)  # summary samples on their way into the store
        self.layouts = IntakeLayouts()  # binary summaries' layouts learned, and their reading plans
        self.rejections = ingest.Rejections(log)
        self.nodes = ingest.NodeBook(cfg.max_nodes, cfg.silent_intervals, cfg.evaluation_interval)
        self.loops: dict[str, LoopHealth] = {}
        #: nodes whose open findings were restored from KV but that this process has not heard
        #: from yet: their incidents are not (re)published until they are, and are resolved
        #: "node silent" if they stay silent (a restart must not re-announce a dead node's trouble)
        self._unconfirmed: set[str] = set()
        self._store_gc_at = -math.inf  # controller time of the last store gc (housekeeping)
        #: summary subject → the (cluster, node) a body named on it that matched it: every node
        #: sends on the same subject every interval, and the check was a tenth of a summary's cost
        self._subject_ok: dict[str, tuple[str, str]] = {}
        #: node → (subject, cluster, plan) of its last binary summary taken in by the full checks:
        #: its next ones alike skip the checks those decided (intake.py, _take_binary)
        self._lanes: dict[str, tuple[str, str, Any]] = {}
        self._deferred: set[str] = set()  # incident ids whose publication waits for their node
        self._silenced: dict[str, float] = {}  # finding id → controller time it was resolved for silence
        self._shared = False  # started on another instance's connection (a scaled-out worker's)
        #: save the engine snapshot at stop (a worker that lost this partition's lease must not
        #: write over its new holder's)
        self.save_on_stop = True
        #: partition role: each node's latest summary samples since the last digest (for the leader)
        self._digest_rows: dict[str, tuple] = {}
        self._leader_ctl: frozenset[str] | None = None
        #: leader role: digests received, taken in at the next tick; the groups' alignment reports
        self._digests: list[Any] = []
        self._reports: dict[str, Any] = {}
        self.digests_in = 0
        self.digests_refused = 0  # leader: digests unreadable or of another schema (logged)
        self.unpartitioned = 0  # leader: summaries that reached the unmapped subject (no server mapping)
        self.misplaced: dict[str, str] = {}  # partition: node → why its summaries may split its group
        self._placed: set[str] = set()  # nodes whose placement was checked at topology version ...
        self._placed_version = -1

    # ------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------
    async def start(self, shared: tuple[Any, Any, Any, StateStore] | None = None) -> None:
        """Connect (or use ``shared`` = (nc, intake_nc, js, state) of a scaled-out worker),
        restore state from KV and subscribe to what this role takes in: summaries on the intake
        connection, everything else on the control connection."""
        cfg = self.cfg
        self.tick_in_thread = True
        self.gc_policy.enabled = True
        self.feed.defer_flush = True  # flushed on the tick thread (intake.py)
        # the flush's slab growths are prepared between ticks by the summary intake (intake.py);
        # the leader takes no summaries in: its growths stay in its flush
        self.store.defer_prepare = self.role != ROLE_LEADER
        if shared is not None:
            self.nc, self.intake_nc, self.js, self.state = shared
            self._shared = True
        else:
            self.nc = await connect(cfg.nats, initial_timeout=30.0, error_cb=self._on_error)
            self.js = self.nc.jetstream()
            await ensure_streams(self.js, [wire.FINDINGS_STREAM], update=False)
            await ensure_streams(self.js, [wire.REMAPS_STREAM, M.INCIDENTS_STREAM], update=True)
            self.state = await StateStore.open(self.js, cfg.bucket, cfg.cluster, cfg.state_max_age, nc=self.nc)
            self.intake_nc = await connect_intake(cfg.nats, error_cb=self._on_intake_error)
            hold_reads(self.intake_nc, self.tick_gate)  # none read while a tick computes
        await self._restore()
        sub = self.nc.subscribe

        # a bounded backlog: ingest.summary_backlog_bytes over the intake's summary subscriptions
        # (a worker's partitions share it). A callback that finds more than its share waiting
        # sheds the summary it was handed - the oldest - and counts it: a few microseconds against
        # the tens a summary costs to take in, so the backlog stays at the bound and what is taken
        # in is the newest. Measured at saturation (docs/benchmarks.md): p50 latency 4.5 s instead
        # of 35 s, for 27 % fewer summaries taken in (the sheds' dispatch). nats-py's own pending
        # limit drops the newest instead and calls the error callback for each (slower still).
        subs_per_controller = len(wire.summary_filters(cfg.cluster)) if self.role == ROLE_ALL else 1
        share = max(16 << 10, cfg.summary_backlog_bytes // (max(1, cfg.partitions) * subs_per_controller))

        # summaries reach _take_summaries through the intake connection's direct delivery
        # (natsutil.direct_delivery: no Msg, queue or coroutine per summary), the subscription's
        # callback only when that is not available (or for a message it does not route)
        direct = self._direct = direct_delivery(self.intake_nc)
        self._summary_share = share * subs_per_controller

        async def sub_summaries(subject: str, cb: Callable[..., Any]) -> Any:
            # the callback sheds (``held``: the subscription, once made; ``share``: its bound)
            # itself: a wrapping coroutine cost every summary a frame more
            held: list[Any] = []
            held.append(await self.intake_nc.subscribe(subject, cb=functools.partial(cb, held=held, share=share)))
            if direct is not None and cb == self._on_summary:
                direct.route(held[0], self._backlog)
            return held[0]
        loops: list[tuple[str, Callable[[], Any]]] = [("eval", self._eval_loop), ("housekeeping", self._housekeeping_loop)]
        if direct is not None and self.role != ROLE_LEADER:
            loops.append(("intake", self._take_summaries))
        if self.role == ROLE_PARTITION:
            for subject in wire.summary_filters(cfg.cluster, self.partition):
                self._subs.append(await sub_summaries(subject, cb=self._on_summary))
            self._subs.append(await sub(wire.subject_filter("phase", cluster=cfg.cluster), cb=self._on_phase))
        else:
            if self.role == ROLE_ALL:
                for subject in wire.summary_filters(cfg.cluster):
                    self._subs.append(await sub_summaries(subject, cb=self._on_summary))
            else:
                self._subs.append(await sub(wire.digest_subject(cfg.cluster, "*"), cb=self._on_digest))
                self._subs.append(await sub_summaries(wire.summary_filters(cfg.cluster)[0], cb=self._on_unpartitioned))
            self._subs.append(await sub(wire.subject_filter("health", cluster=cfg.cluster), cb=self._on_health))
            self._subs.append(await sub(wire.subject_filter("phase", cluster=cfg.cluster), cb=self._on_phase))
            self._subs.append(await sub(M.reply_subject(cfg.cluster), queue=cfg.queue, cb=self._on_reply))
            await self._recover_planned()
            loops += [("findings", self._findings_loop), ("kvwatch", self._kv_watch_loop)]
        self._tasks = [asyncio.create_task(self._supervised(name, fn), name=f"skewd-ctl-{name}") for name, fn in loops]
        await flush_subscribed(self.nc)  # started: the server has every subscription
        await flush_subscribed(self.intake_nc)
        for rid, how in culprit_coverage(self.engine.rules.rules, cfg.culprit_pathologies,
                                         cfg.culprit_evidence).items():
            if how.startswith("PROBLEM"):
                log.warning("culprit rule %s: %s", rid, how)
        log.info("controller %s (%s%s) started for cluster %s: %d rules (%d group-scope), %d TP groups configured",
                 cfg.controller_id, self.role, "" if self.partition is None else f" {self.partition}",
                 cfg.cluster, len(self.engine.rules.rules),
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

        if self._direct is not None:  # nobody takes them in any more (a shared connection stays open)
            for sub in self._subs:
                self._direct.unroute(sub)
        for t in self._tasks:
            t.cancel()
        # nats-py's fetch can swallow a cancellation (asyncio.wait_for race on 3.10/3.11): the
        # loops also watch _stopping, and we never wait for a task without a bound
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=left(0.3))
        self._tasks = []
        if self._on_thread:  # a cancelled tick's computation still runs: the snapshot waits for it
            await asyncio.wait([asyncio.ensure_future(self._idle.wait())], timeout=left(0.3))
        if self.nc is not None:
            if self.nc.is_connected:
                try:
                    async def goodbye() -> None:
                        for sub in self._subs:
                            await sub.unsubscribe()
                        if self.state is not None and self.next_eval is not None and self.save_on_stop:
                            await self._save_engine(self.now)
                        await self.nc.flush()
                    await asyncio.wait_for(goodbye(), left(0.6))
                except Exception:  # noqa: BLE001 - the connection may be going; the snapshot is a bonus
                    pass
            if self._shared:
                return  # the worker's connections: it closes them
            for nc in (self.intake_nc, self.nc):
                if nc is None:
                    continue
                try:
                    await asyncio.wait_for(nc.close(), left(0.5))
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

    async def _on_intake_error(self, e: Exception) -> None:
        if self._stopping:
            return
        if isinstance(e, nats_errors.SlowConsumerError):
            self.summary_dropped(e.subject)  # counted; logged a few times a minute
            return
        log.warning("nats (summary intake): %s", e)

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
    def _engine_key(self) -> str | None:
        """KV key (under ``engine.``) of this instance's alert-state snapshot: a partition's own,
        so whoever holds the partition next resumes its alerts."""
        return None if self.partition is None else f"p{self.partition}"

    async def _save_engine(self, t: float) -> None:
        assert self.state is not None
        await self.state.put_engine(self.engine, t, self._engine_key())

    async def _restore(self) -> None:
        assert self.state is not None
        if self.role == ROLE_PARTITION:  # alert states only: findings and incidents are the leader's
            got = await self.state.get(self.state.key("engine", self._engine_key() or ""))
            try:
                n = restore_engine(self.engine, got[0]) if got is not None else 0
            except Exception as e:  # noqa: BLE001 - rebuilt from the summaries then
                log.warning("state: partition %s engine snapshot not restored: %s: %s", self.partition,
                            type(e).__name__, e)
                n = 0
            log.info("partition %s: %d alert states restored", self.partition, n)
            return
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
            # a new leader has no data of any node yet (their partitions' digests bring it): a
            # restored group finding's incident waits for its node's first digest too, or it
            # would be planned at once without cause, phase or effect
            lead_open = self.role == ROLE_LEADER and f.state in (State.PENDING, State.FIRING)
            if (agent_open(f) or lead_open) and f.node not in self._unconfirmed:
                self._unconfirmed.add(f.node)
                self._lanes.pop(f.node, None)  # its next summary confirms it (intake.py, _heard)
                self.nodes.admit(f.node, wall)
        log.info("state restored: %d findings, %d open incidents, %d suggestions, %d alert states; "
                 "%d nodes with open findings not heard from yet", len(self.correlator.findings),
                 len(self.correlator.ids), len(self.remaps), n, len(self._unconfirmed))

    # ------------------------------------------------------------------------------------------
    # housekeeping
    # ------------------------------------------------------------------------------------------
    async def _housekeeping_loop(self) -> None:
        ival = self.cfg.evaluation_interval
        last_log = self.wall()
        while not self._stopping:
            await asyncio.sleep(ival)
            try:
                await self._tick_idle()  # (each synchronous stretch below starts after a wait)
                wall = self.wall()
                if self.role == ROLE_PARTITION:  # the leader resolves their findings; here state goes
                    for node, _ in self.nodes.pop_silent(wall):
                        self._forget_node(node)
                        self._digest_rows.pop(node, None)
                else:
                    await self.expire_silent_nodes(wall)
                if self.role != ROLE_PARTITION and self.next_eval is not None and wall - self._wall_at_now > 3 * ival \
                        and self.now > -math.inf:
                    # no summaries: findings may still arrive; let wall time advance correlation
                    async with self._lock:
                        self.now = self.now + (wall - self._wall_at_now)
                        self._wall_at_now = wall
                        await self._correlate_and_plan(self.now)
                planned = [k for k, r in self.remaps.items() if r.get("status") == M.SuggestionStatus.PLANNED.value
                           and wall - float(r.get("planned_wall", wall)) > 10.0]
                for k in planned:
                    await self._publish_remap(k, self.remaps[k])
                await self._tick_idle()
                if self.now > -math.inf and self.now >= self._store_gc_at + max(ival, self.cfg.horizon * STORE_GC_SHARE):
                    self.gc_store(self.now)
                    self._store_gc_at = self.now
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
    # queries
    # ------------------------------------------------------------------------------------------
    def _node_value(self, sig: str, node: str) -> float | None:
        """Mean of a node signal over the engine's lookback (for cause attribution)."""
        t, v = self.store.series(sig, node)
        if len(t) == 0:
            return None
        sel = v[t > self.now - self.cfg.lookback] if self.now > -math.inf else v
        return float(np.mean(sel)) if len(sel) else None

    def gc_store(self, now: float) -> int:
        """``store.gc`` (always through here: the feed must know when rows were forgotten)."""
        return self.feed.gc(now)

    def status(self) -> dict[str, Any]:
        return {"cluster": self.cfg.cluster, "controller": self.cfg.controller_id, "now": self.now,
                "role": self.role, "partition": self.partition, "digests_in": self.digests_in,
                "unpartitioned_summaries": self.unpartitioned, "misplaced_nodes": dict(self.misplaced),
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
