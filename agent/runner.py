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
import os
import signal as _signal
import time
from pathlib import Path
from typing import Any, Callable

from skewd import __version__, wire
from skewd.catalogue import full_catalogue
from skewd.model import NODE_SCOPES, Catalogue, Finding, SampleBatch
from skewd.rules.cli import PACKS
from skewd.rules.reload import ReloadResult, RuleManager

from . import summary as summary_mod
from .clock import clock_state
from .config import AgentConfig
from .pipeline import Pipeline
from .scheduler import CollectorSlot, LiveSource, availability, build_slots

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
        for rid, why in self.pipeline.engine.inactive.items():
            log.info("rule %s inactive: %s", rid, why)

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
        self._reload_requested = True

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
    async def run(self, stop: asyncio.Event) -> None:
        if self.pipeline is None:
            self.setup()
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(_signal.SIGHUP, self.request_reload)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (tests, embedded): reload on file change only
        await self._start_sinks()
        from .metrics import serve

        try:
            self._metrics_server = serve(self, self.cfg.metrics_listen)
        except OSError as e:
            log.error("metrics endpoint %s not started: %s", self.cfg.metrics_listen, e)
        self.source = LiveSource(self.slots, clock=self.clock)
        self.source.start()
        self.started.set()
        interval = self.cfg.evaluation_interval
        next_tick = self.clock()
        next_summary = next_tick
        next_health = next_tick
        next_reload_check = next_tick
        try:
            while not stop.is_set():
                delay = next_tick - self.clock()
                if delay > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=delay)
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
                if now >= next_health:
                    next_health = now + 10.0
                    await self._send_health(now)
        finally:
            await self.shutdown()

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
        return findings

    async def _send_summary(self, now: float) -> None:
        if self._clock is None or now - self._clock[0] > 30.0:  # the discipline changes slowly
            self._clock = (now, clock_state())
        clk = self._clock[1]
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

    def health(self, now: float) -> Any:
        eng = self.pipeline.engine
        collectors = {s.name: wire.CollectorHealth(state=s.status.availability.value,
                                                   reason=s.status.reason or s.last_error) for s in self.slots}
        rules = wire.RulesHealth(active=sum(1 for r in eng.rules.rules if r.id not in eng.inactive and eng.evaluates(r)),
                                 inactive=dict(eng.inactive))
        lr = self.last_reload
        reload = wire.ReloadStatus(ok=True) if lr is None else wire.ReloadStatus(
            ok=lr.ok, error="" if lr.ok else "\n".join(str(i) for i in lr.issues), t=now)
        spool_depth = self.publisher.spool.depth if self.publisher is not None else 0
        drops = self.publisher.drops() if self.publisher is not None else {}
        return wire.Health(node=self.cfg.node, cluster=self.cfg.cluster, t=now, collectors=collectors, rules=rules,
                           last_reload=reload, spool_depth=spool_depth, drops=drops, agent_version=__version__)

    async def _send_health(self, now: float) -> None:
        if self.publisher is not None:
            await self.publisher.publish_health(self.health(now))

    async def _start_sinks(self) -> None:
        nats = self.cfg.nats
        if nats.get("url") or nats.get("servers"):
            from skewd.natsutil import NatsConfig

            from .publisher import Publisher
            from .spool import Spool

            spool_dir = Path(self.cfg.spool.get("dir") or "/var/lib/skewd/spool") / self.cfg.node
            sc = self.cfg.spool
            spool = Spool(spool_dir, max_bytes=int(sc.get("max_bytes", 256 << 20)),
                          max_messages=sc.get("max_messages", 100_000), fsync=sc.get("fsync", "interval"),
                          fsync_interval=sc.get("fsync_interval", 1.0), memory_bytes=sc.get("memory_bytes", 4 << 20))
            self.publisher = Publisher(NatsConfig.from_dict(nats), spool, cluster=self.cfg.cluster)
            await self.publisher.start()
        if self.cfg.record.get("dir"):
            from .record import Recorder

            self.recorder = Recorder.for_agent(self.cfg, self.pipeline.engine.rules)
            # replay must leave inactive the rules this host could not evaluate
            self.recorder.set_available_signals(self.pipeline.engine.available)
            self.pipeline.add_sink(self.recorder)

    async def shutdown(self) -> None:
        if self.source is not None:
            await self.source.stop()
            self.source = None
        if self.publisher is not None:
            try:
                await self.publisher.close(drain_timeout=2.0)
            except Exception as e:  # shutting down anyway: findings stay spooled on disk
                log.warning("publisher close: %s", e)
        if self.recorder is not None:
            self.recorder.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server = None


def _suffix(name: str) -> str:
    """``PurePath(name).suffix``."""
    i = name.rfind(".")
    return name[i:] if 0 < i < len(name) - 1 else ""


def rule_mtimes(paths: list[str]) -> dict[str, float]:
    """``{str(f): mtime for f in rule_files(paths)}`` (-1.0 where stat fails) plus
    ``{"<dir>/": entry count}`` per rules directory (a new file counts as a change)."""
    out: dict[str, float] = {}
    counts: dict[str, float] = {}
    for p in paths:
        base = str(Path(p))
        try:
            entries = list(os.scandir(base))
        except OSError:
            if os.path.isdir(base):
                raise  # as rule_files does (an unreadable rules directory)
            entries = None
        if entries is None:  # a file (or nothing): rule_files passes it through
            try:
                out[base] = os.stat(base).st_mtime
            except OSError:
                out[base] = -1.0
            continue
        found = []
        for e in entries:
            if (_suffix(e.name) in (".yaml", ".yml") and not e.name.endswith((".test.yaml", ".test.yml"))
                    and e.is_file()):
                found.append(e)
        for e in sorted(found, key=lambda e: e.name):
            key = e.name if base == "." else os.path.join(base, e.name)  # str(Path(base) / name)
            try:
                out[key] = e.stat().st_mtime
            except OSError:
                out[key] = -1.0
        counts[f"{p}/"] = float(len(entries))
    out.update(counts)
    return out


def default_spool_dir() -> str:
    return os.environ.get("SKEWD_SPOOL_DIR", "/var/lib/skewd/spool")
