"""The live agent: scheduled collectors → pipeline → publisher / recorder / live view.

The evaluation loop is the only consumer of the wall clock besides the scheduler: at every
tick it drains the collectors' batches, evaluates at ``clock()``, publishes transitions, and
every ``summary_interval`` publishes the node summary. Rule files are re-read on SIGHUP and
when they change on disk; a bad edit keeps the last good rules running (reported in the log
and on the health subject).
"""
from __future__ import annotations

import asyncio
import logging
import signal as _signal
import time
from pathlib import Path
from typing import Any, Callable

from skewd import __version__, wire
from skewd.catalogue import full_catalogue
from skewd.model import NODE_SCOPES, Catalogue, Finding, SampleBatch
from skewd.rules.cli import PACKS
from skewd.rules.paths import rule_mtimes
from skewd.rules.reload import ReloadResult, RuleManager

from . import summary as summary_mod
from .clock import clock_state
from .rulestatus import RuleStatus, clock_words, rule_status
from .config import AgentConfig
from .metrics import serve
from .pipeline import Pipeline
from .scheduler import Backoff, CollectorSlot, LiveSource, availability, build_slots

log = logging.getLogger("skewd.agent")


class FindingLog:
    """Keeps recent transitions for the live view and tests (bounded)."""

    def __init__(self, keep: int = 500) -> None:
        self.keep = keep
        self.items: list[Finding] = []
        self.listeners: list[Callable[[Finding], None]] = []

    def on_batch(self, batch: SampleBatch) -> None:
        pass

    def on_tick(self, t: float, findings: list[Finding]) -> None:
        for f in findings:
            self.items.append(f)
            for cb in self.listeners:
                cb(f)
        if len(self.items) > self.keep:
            del self.items[: len(self.items) - self.keep]


class Agent:
    """Owns the live node agent: collector slots, the pipeline, its sinks (publisher, recorder,
    view), /metrics and rule reloads; ``skewd agent`` and ``skewd up`` build it and :meth:`run` it."""

    def __init__(self, cfg: AgentConfig, *, catalogue: Catalogue | None = None,
                 clock: Callable[[], float] = time.time, slots: list[CollectorSlot] | None = None) -> None:
        self.cfg = cfg
        self.catalogue = catalogue or full_catalogue()
        self.clock = clock
        self.rule_paths = cfg.rules or [str(PACKS)]
        self.rules = RuleManager(self.rule_paths, self.catalogue, cfg.rule_limits)
        self.slots = slots if slots is not None else []
        self._given_slots = slots is not None
        self.pipeline: Pipeline | None = None
        self.publisher: Any = None
        self.recorder: Any = None
        self.source: LiveSource | None = None
        self.findings = FindingLog()
        self.reloads_ok = 0
        self.reloads_rejected = 0
        self.last_reload: ReloadResult | None = None
        self._reload_requested = False
        self._rule_mtimes: dict[str, float] = {}
        self._metrics_server = None
        self.summaries_sent = 0
        self.tick_errors = 0
        self._last_tick_error_log = float("-inf")
        self.last_summary: dict[str, float] = {}
        self.started = asyncio.Event()
        self._clock: tuple[float, Any] | None = None
        #: a collector changed availability: publish health at the next tick, not in 10 s
        self._health_now = False
        #: publisher reconnects already answered by re-announcing the open alerts
        self._announced_reconnects = 0

    # -- setup -------------------------------------------------------------------------------
    def setup(self) -> None:
        ruleset = self.rules.load_initial()  # raises RuleLoadError: an operator must fix the files
        if not self._given_slots:
            self.slots = build_slots(self.cfg)
        self.pipeline = Pipeline(self.catalogue, ruleset, node=self.cfg.node, cluster=self.cfg.cluster,
                                 labels=self.cfg.labels, lookback=self.cfg.lookback, horizon=self.cfg.horizon,
                                 sinks=[self.findings])
        self.pipeline.engine.scopes = set(NODE_SCOPES)
        self._apply_availability()
        self._rule_mtimes = self._mtimes()
        for s in self.slots:
            level = logging.INFO if s.active else logging.WARNING
            log.log(level, "collector %s: %s%s", s.name, s.status.availability.value,
                    f" ({s.status.reason})" if s.status.reason else "")
        st = rule_status(self.pipeline.engine, self.catalogue, self.clock_now(self.clock()))
        for rid, why in st.inactive.items():
            log.info("rule %s inactive: %s", rid, why)
        if st.controller:
            log.info("%d rules evaluated by the controller over node summaries: %s", len(st.controller),
                     ", ".join(st.controller))
        if st.clock_weakened:
            log.warning("clock %s: weakens %s (the controller cannot tell this node's cross-node lags from "
                        "clock error)", clock_words(self.clock_now(self.clock())), ", ".join(st.clock_weakened))

    def _apply_availability(self) -> None:
        signals, reasons = availability(self.slots)
        signals |= {s.name for s in self.catalogue.values() if s.collector == "agent"}
        self.pipeline.engine.set_available_signals(signals, reasons)

    def _mtimes(self) -> dict[str, float]:
        """What the reload poll compares: each rule file's mtime (-1 when it cannot be read)
        and each rules directory's entry count. The files are those :func:`rule_files` picks,
        found with one ``scandir`` per directory (this runs every ``reload.poll_interval``)."""
        return rule_mtimes(self.rule_paths)

    # -- reload --------------------------------------------------------------------------------
    def request_reload(self) -> None:
        """SIGHUP: re-read the rule files and probe every inactive collector again now."""
        self._reload_requested = True
        if self.source is not None:
            self.source.reprobe_now()

    def _on_collector_change(self, slot: CollectorSlot, old: Any) -> None:
        """A collector became active or stopped being so: recompute which rules can run here
        (and tell the log which ones changed), record the new availability in a new capture
        segment, and publish health at the next tick."""
        eng = self.pipeline.engine
        before = {r.id for r in eng.rules.rules if r.id not in eng.inactive and eng.evaluates(r)}
        self._apply_availability()
        after = {r.id for r in eng.rules.rules if r.id not in eng.inactive and eng.evaluates(r)}
        if after - before:
            log.info("collector %s %s: rules now active: %s", slot.name, slot.status.availability.value,
                     ", ".join(sorted(after - before)))
        if before - after:
            log.warning("collector %s %s: rules now inactive: %s", slot.name, slot.status.availability.value,
                        ", ".join(sorted(before - after)))
        if self.recorder is not None:
            self.recorder.set_available_signals(eng.available, roll=True)
        self._health_now = True

    def maybe_reload(self) -> ReloadResult | None:
        changed = False
        if self.cfg.reload_watch:
            now = self._mtimes()
            if now != self._rule_mtimes:
                self._rule_mtimes = now
                changed = True
        if not (changed or self._reload_requested):
            return None
        self._reload_requested = False
        res = self.rules.reload(self.pipeline.engine)
        self.last_reload = res
        if res.ok:
            self.reloads_ok += 1
            self._apply_availability()
            if self.recorder is not None:
                self.recorder.set_rules(self.pipeline.engine.rules)
            log.info(res.describe())
        else:
            self.reloads_rejected += 1
            log.error(res.describe())
        return res

    # -- run -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Set up if needed, start the sinks (publisher, recorder), /metrics and the collectors'
        schedule; returns once they run (the publisher connects in the background)."""
        if self.pipeline is None:
            self.setup()
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(_signal.SIGHUP, self.request_reload)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (tests, embedded): reload on file change only
        await self._start_sinks()
        try:
            self._metrics_server = serve(self, self.cfg.metrics_listen)
        except OSError as e:
            log.error("metrics endpoint %s not started: %s", self.cfg.metrics_listen, e)
        self.source = LiveSource(self.slots, clock=self.clock,
                                 backoff=Backoff(self.cfg.reprobe_min, self.cfg.reprobe_max),
                                 on_change=self._on_collector_change)
        self.source.start()
        self.started.set()

    async def run(self, stop_requested: asyncio.Event) -> None:
        """:meth:`start`, then evaluate every ``evaluation_interval`` until ``stop_requested`` is
        set, then :meth:`stop` (also when the loop fails)."""
        await self.start()
        interval = self.cfg.evaluation_interval
        next_tick = self.clock()
        next_summary = next_tick
        next_health = next_tick
        next_reload_check = next_tick
        try:
            while not stop_requested.is_set():
                delay = next_tick - self.clock()
                if delay > 0:
                    try:
                        await asyncio.wait_for(stop_requested.wait(), timeout=delay)
                        break
                    except asyncio.TimeoutError:
                        pass
                now = self.clock()
                next_tick = max(next_tick + interval, now)
                self._guarded_tick(now)
                if now >= next_summary - 1e-3:  # a tick may wake a hair early: do not skip an interval
                    next_summary += self.cfg.summary_interval
                    if next_summary <= now:  # fell behind (suspend, overload): skip ahead, no burst
                        next_summary = now + self.cfg.summary_interval
                    await self._send_summary(now)
                if now >= next_reload_check or self._reload_requested:
                    next_reload_check = now + self.cfg.reload_poll
                    if self.maybe_reload() is not None:
                        await self._send_health(now)
                if now >= next_health or self._health_now:
                    self._health_now = False
                    next_health = now + 10.0
                    await self._send_health(now)
        finally:
            await self.stop()

    def _guarded_tick(self, now: float) -> None:
        """One tick that cannot end the loop: an unexpected error is logged (once a minute with
        its traceback) and counted, and the next tick runs as planned."""
        try:
            self.tick(now)
        except Exception:  # noqa: BLE001 - the evaluation loop outlives any one bad tick
            self.tick_errors += 1
            if now - self._last_tick_error_log >= 60.0:
                self._last_tick_error_log = now
                log.exception("evaluation tick at %.3f failed (%d failed ticks so far); continuing", now,
                              self.tick_errors)

    def tick(self, now: float) -> list[Finding]:
        """One evaluation at ``now``: ingest what the collectors produced, evaluate, publish."""
        if self.source is not None:
            for b in self.source.drain():
                self.pipeline.ingest(b)
        findings = self.pipeline.evaluate(now)
        if self.publisher is not None:
            for f in findings:
                self.publisher.publish_finding(f)
            if self.publisher.reconnected_since(self._announced_reconnects):
                self._announced_reconnects = self.publisher.stats.reconnects
                self._reannounce(now, findings)
        return findings

    def _reannounce(self, now: float, sent: list[Finding]) -> None:
        """After a NATS outage, tell the controller again about every alert still open (those
        that transitioned at this tick were just sent). A controller that resolved them for this
        node's silence reopens them; one that did not drops the copies by ``event_id``. They
        follow whatever the outage spooled, so the controller sees the transitions in order."""
        just_sent = {f.fingerprint for f in sent}
        again = [f for f in self.pipeline.engine.open_findings(now) if f.fingerprint not in just_sent]
        for f in again:
            self.publisher.publish_finding(f, again=True)
        if again:
            log.info("reconnected to NATS: re-announced %d open finding(s)", len(again))

    async def _send_summary(self, now: float) -> None:
        clk = self.clock_now(now)
        msg = summary_mod.make_summary(self.pipeline.store, self.cfg.node, self.cfg.cluster, now,
                                       self.cfg.summary_interval, clock_synced=clk.synced,
                                       clock_error=clk.max_error_s, labels=self.cfg.labels)
        self.last_summary = {k: v[""] for k, v in msg.signals.items() if "" in v}
        # node rules may combine scopes through the summaries (e.g. a NIC rule that also looks
        # at the engines' waiting queue), so they enter the local store like any sample
        self.pipeline.ingest(summary_mod.to_batch(self.cfg.node, now, self.last_summary))
        if self.recorder is not None:
            self.recorder.on_summary(msg)
        if self.publisher is not None and await self.publisher.publish_summary(msg):
            self.summaries_sent += 1

    def clock_now(self, now: float) -> Any:
        """The kernel's clock discipline, read at most every 30 s (it changes slowly)."""
        if self._clock is None or now - self._clock[0] > 30.0:
            self._clock = (now, clock_state())
        return self._clock[1]

    def rule_status(self, now: float) -> RuleStatus:
        """Rules by where and whether they run, and what this node's clock costs them: the one
        answer health, /metrics and the view give (agent/rulestatus.py)."""
        return rule_status(self.pipeline.engine, self.catalogue, self.clock_now(now))

    def health(self, now: float) -> Any:
        collectors = {s.name: wire.CollectorHealth(state=s.status.availability.value,
                                                   reason=s.status.reason or s.last_error) for s in self.slots}
        st = self.rule_status(now)
        clk = self.clock_now(now)
        rules = wire.RulesHealth(active=len(st.active), inactive=dict(st.inactive), controller=list(st.controller),
                                 clock_weakened=dict(st.clock_weakened))
        lr = self.last_reload
        reload = wire.ReloadStatus(ok=True) if lr is None else wire.ReloadStatus(
            ok=lr.ok, error="" if lr.ok else "\n".join(str(i) for i in lr.issues), t=now)
        spool_depth = self.publisher.spool.depth if self.publisher is not None else 0
        drops = self.publisher.drops() if self.publisher is not None else {}
        return wire.Health(node=self.cfg.node, cluster=self.cfg.cluster, t=now, collectors=collectors, rules=rules,
                           last_reload=reload, spool_depth=spool_depth, drops=drops, agent_version=__version__,
                           clock=wire.ClockHealth(clk.synced, clk.max_error_s, clk.source))

    async def _send_health(self, now: float) -> None:
        if self.publisher is not None:
            await self.publisher.publish_health(self.health(now))

    async def _start_sinks(self) -> None:
        nats = self.cfg.nats
        if nats.get("url") or nats.get("servers"):
            from skewd.natsutil import NatsConfig, inbox_prefix

            from .publisher import Publisher
            from .spool import Spool

            spool_dir = Path(self.cfg.spool.get("dir") or "/var/lib/skewd/spool") / self.cfg.node
            sc = self.cfg.spool
            spool = Spool(spool_dir, max_bytes=int(sc.get("max_bytes", 256 << 20)),
                          max_messages=sc.get("max_messages", 100_000), fsync=str(sc.get("fsync", "interval")),
                          fsync_interval=sc.get("fsync_interval", 1.0), memory_bytes=sc.get("memory_bytes", 4 << 20))
            # replies under this node's own inbox: what a per-node NATS user may read (docs/security.md)
            ncfg = NatsConfig.from_dict(nats).with_default_inbox(inbox_prefix("agent", self.cfg.cluster, self.cfg.node))
            self.publisher = Publisher(ncfg, spool, cluster=self.cfg.cluster,
                                       summary_encoding=self.cfg.summary_encoding,
                                       summary_layout_every=self.cfg.summary_layout_every)
            self.publisher.add_connect_listener(self._leave_out_own_connection)
            await self.publisher.start()
        if self.cfg.record.get("dir"):
            from .record import Recorder

            self.recorder = Recorder.for_agent(self.cfg, self.pipeline.engine.rules)
            # replay must leave inactive the rules this host could not evaluate
            self.recorder.set_available_signals(self.pipeline.engine.available)
            self.pipeline.add_sink(self.recorder)

    def _leave_out_own_connection(self, conn: Any) -> None:
        """The agent's NATS connection is the agent's traffic, not the node's: every collector
        that sees connections (packet capture) leaves it out, so it is never a finding's entity."""
        for s in self.slots:
            if s.collector is not None:
                s.collector.ignore_connections([conn])

    async def stop(self) -> None:
        """Stop the collectors (see :meth:`LiveSource.stop` for a collection still running), then
        the publisher (2 s to drain; the rest stays spooled), the recorder and /metrics.
        Idempotent, and safe when :meth:`start` never ran."""
        if self.source is not None:
            await self.source.stop()
            self.source = None
        if self.publisher is not None:
            try:
                await self.publisher.stop(drain_timeout=2.0)
            except Exception as e:  # shutting down anyway: findings stay spooled on disk
                log.warning("publisher stop: %s", e)
        if self.recorder is not None:
            self.recorder.stop()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server = None
