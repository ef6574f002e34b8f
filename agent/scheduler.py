"""Live source: every collector on its own cadence, on worker threads, never blocking the loop.

Each collector runs at its interval with a timeout shorter than the interval; a collection
still running when the next is due is skipped and counted (``overruns``) rather than queued,
so a stuck sysfs read or a slow scrape cannot pile up. Samples are stamped with the tick time
taken here – the only place in the agent besides the evaluation loop that reads the clock.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from skewd.collectors import registry
from skewd.collectors.base import Availability, Collector, Status
from skewd.model import SampleBatch

from .config import AgentConfig

log = logging.getLogger("skewd.agent.scheduler")


@dataclass
class CollectorSlot:
    name: str
    collector: Collector | None
    status: Status
    interval: float
    timeout: float
    consecutive_errors: int = 0
    overruns: int = 0
    timeouts: int = 0
    last_error: str = ""
    last_ok: float | None = None
    busy: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.collector is not None and self.status.availability is Availability.ACTIVE


def collector_config_keys() -> dict[str, set[str]]:
    return {n: set(registry.collector_class(n).config_keys) for n in registry.available_names()}


def build_slots(cfg: AgentConfig, names: list[str] | None = None) -> list[CollectorSlot]:
    """Instantiate and probe every collector (none started). Never raises for a collector."""
    slots = []
    for name in names or registry.available_names():
        cc = cfg.collector_config(name)
        cls = registry.collector_class(name)
        interval = float(cc.get("interval", cls.default_interval))
        timeout = float(cc.get("timeout", max(0.05, interval * 0.8)))
        if cc.get("enabled") is False:
            slots.append(CollectorSlot(name, None, Status(Availability.DISABLED, "disabled in config"), interval, timeout))
            continue
        try:
            col = cls(cfg.node, cc, sys_root=cfg.sys_root, proc_root=cfg.proc_root)
            status = col.probe()
        except Exception as e:  # a collector bug must not take the agent down
            log.exception("collector %s failed to initialise", name)
            col, status = None, Status(Availability.UNAVAILABLE, f"failed to initialise: {type(e).__name__}: {e}")
        slots.append(CollectorSlot(name, col, status, interval, timeout))
    return slots


def availability(slots: list[CollectorSlot]) -> tuple[set[str], dict[str, str]]:
    """(signals available, reason per unavailable signal) from probed slots."""
    available: set[str] = set()
    reasons: dict[str, str] = {}
    for s in slots:
        cls = registry.collector_class(s.name)
        if s.active:
            provided = s.collector.provides()
            available |= provided
            for spec in cls.catalogue:
                if spec.name not in provided:
                    reasons.setdefault(spec.name, s.collector.unavailable_reason(spec.name))
        else:
            for spec in cls.catalogue:
                reasons.setdefault(spec.name, f"{s.name} collector {s.status.availability.value}: {s.status.reason}")
    for sig in available:
        reasons.pop(sig, None)
    return available, reasons


class LiveSource:
    def __init__(self, slots: list[CollectorSlot], clock: Callable[[], float] = time.time,
                 max_workers: int = 4) -> None:
        self.slots = slots
        self.clock = clock
        self.queue: asyncio.Queue[SampleBatch] = asyncio.Queue()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="skewd-collect")
        self._tasks: list[asyncio.Task] = []
        self._stopped = False

    def start(self) -> None:
        for s in self.slots:
            if not s.active:
                continue
            try:
                s.collector.start()
            except Exception as e:
                s.status = Status(Availability.UNAVAILABLE, f"start failed: {type(e).__name__}: {e}")
                log.warning("collector %s start failed: %s", s.name, e)
                continue
            self._tasks.append(asyncio.get_running_loop().create_task(self._run(s), name=f"collect-{s.name}"))

    async def _run(self, s: CollectorSlot) -> None:
        loop = asyncio.get_running_loop()
        next_due = self.clock()
        while not self._stopped:
            now = self.clock()
            if now < next_due:
                await asyncio.sleep(next_due - now)
                continue
            next_due += s.interval
            if next_due < now:  # fell behind (suspend, overload): skip ahead, don't burst
                skipped = int((now - next_due) // s.interval) + 1
                s.overruns += skipped
                next_due += skipped * s.interval
            if s.busy:
                s.overruns += 1
                continue
            t = now
            s.busy = True
            fut = loop.run_in_executor(self._pool, s.collector.collect_counted, t)
            try:
                batch = await asyncio.wait_for(asyncio.shield(fut), timeout=s.timeout)
            except asyncio.TimeoutError:
                s.timeouts += 1
                s.collector.stats.error("timeout")
                s.last_error = f"collection took longer than {s.timeout:g}s"
                fut.add_done_callback(lambda _f, s=s: setattr(s, "busy", False))
                continue
            except asyncio.CancelledError:
                s.busy = False
                raise
            except Exception as e:
                s.busy = False
                s.consecutive_errors += 1
                s.last_error = f"{type(e).__name__}: {e}"
                if s.consecutive_errors in (1, 10, 100) or s.consecutive_errors % 1000 == 0:
                    log.warning("collector %s failed (%d in a row): %s", s.name, s.consecutive_errors, s.last_error)
                continue
            s.busy = False
            s.consecutive_errors = 0
            s.last_ok = t
            if len(batch):
                self.queue.put_nowait(batch)

    def drain(self) -> list[SampleBatch]:
        out = []
        while True:
            try:
                out.append(self.queue.get_nowait())
            except asyncio.QueueEmpty:
                return out

    async def stop(self) -> None:
        self._stopped = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        for s in self.slots:
            if s.collector is not None:
                try:
                    s.collector.stop()
                except Exception as e:
                    log.warning("collector %s stop failed: %s", s.name, e)
        self._pool.shutdown(wait=False, cancel_futures=True)
