"""Live source: every collector on its own cadence, on worker threads, never blocking the loop.

Each collector runs at its interval with a timeout shorter than the interval; a collection
still running when the next is due is skipped and counted (``overruns``) rather than queued,
so a stuck sysfs read or a slow scrape cannot pile up. Samples are stamped with the tick time
taken here – the only place in the agent besides the evaluation loop that reads the clock.

A collector that is not active (absent, unavailable, needing an operator, or failing to
start) is probed again for the life of the agent, with a backoff from ``reprobe.min_interval``
doubling up to ``reprobe.max_interval`` (1 s to 1 min by default), and at once on SIGHUP
(:meth:`LiveSource.reprobe_now`). The normal order at boot is an agent that starts while a 70B
model is still loading: its vLLM collector turns active when the endpoint answers, and every
change of availability is handed to ``on_change`` (the agent re-evaluates which rules can
run, logs the transition and publishes its health at once). Only ``enabled: false`` stops
the probing. An active collector stays active when its source fails (it reports that itself,
e.g. ``vllm_up`` = 0): rules such as the squatter watch an endpoint going down.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
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
    """One configured collector in the live agent: its instance, its availability and the
    scheduler's bookkeeping. ``factory`` builds the instance (again, if building failed)."""

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
    #: ``collectors.<name>.required``: not being active is an operator's problem
    required: bool = False
    factory: Callable[[], Collector] | None = None
    #: availability changes since the agent started, and probes run
    transitions: int = 0
    probes: int = 0

    @property
    def active(self) -> bool:
        return self.collector is not None and self.status.availability is Availability.ACTIVE


@dataclass(frozen=True)
class Backoff:
    """Delays between probes of an inactive collector: ``initial`` doubling up to ``maximum``."""

    initial: float = 1.0
    maximum: float = 60.0

    def next(self, delay: float | None) -> float:
        """The delay after ``delay`` (None: the first one)."""
        return self.initial if delay is None else min(self.maximum, max(delay, self.initial) * 2)


def collector_config_keys() -> dict[str, set[str]]:
    return {n: set(registry.collector_class(n).config_keys) for n in registry.available_names()}


def collector_config_checks() -> dict[str, Callable[[dict[str, Any]], list[str]]]:
    """Each collector's own validation of its settings (``Collector.config_problems``)."""
    return {n: registry.collector_class(n).config_problems for n in registry.available_names()}


def probe_slot(slot: CollectorSlot) -> tuple[Collector | None, Status]:
    """Build the collector if needed and probe it: (instance, status). Never raises; blocking
    (a probe may scrape an endpoint), so the live agent runs it on a worker thread. A
    ``required`` collector that is not active is reported as needing an operator."""
    col = slot.collector
    try:
        if col is None:
            assert slot.factory is not None
            col = slot.factory()
        status = col.probe()
    except Exception as e:  # a collector bug must not take the agent down
        if slot.probes == 0:
            log.exception("collector %s failed to initialise", slot.name)
        status = Status(Availability.UNAVAILABLE, f"failed to initialise: {type(e).__name__}: {e}")
    slot.probes += 1
    if slot.required and status.availability not in (Availability.ACTIVE, Availability.NEEDS_OPERATOR):
        status = Status(Availability.NEEDS_OPERATOR,
                        f"required (collectors.{slot.name}.required: true) but {status.availability.value}"
                        + (f": {status.reason}" if status.reason else ""))
    return col, status


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
        slot = CollectorSlot(name, None, Status(Availability.UNAVAILABLE, "not probed yet"), interval, timeout,
                             required=bool(cc.get("required")),
                             factory=functools.partial(cls, cfg.node, cc, sys_root=cfg.sys_root,
                                                       proc_root=cfg.proc_root))
        slot.collector, slot.status = probe_slot(slot)
        slots.append(slot)
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
    """Runs the slots: collects from the active ones, re-probes the others (module docstring).
    ``on_change(slot, old_status)`` is called on the event loop after a slot's availability
    changed; the agent recomputes which rules run from it."""

    def __init__(self, slots: list[CollectorSlot], clock: Callable[[], float] = time.time,
                 max_workers: int = 4, backoff: Backoff | None = None,
                 on_change: Callable[[CollectorSlot, Status], None] | None = None) -> None:
        self.slots = slots
        self.clock = clock
        self.backoff = backoff or Backoff()
        self.on_change = on_change
        self.queue: asyncio.Queue[SampleBatch] = asyncio.Queue()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="skewd-collect")
        self._tasks: list[asyncio.Task] = []
        self._wake: dict[str, asyncio.Event] = {}
        self._delay: dict[str, float | None] = {}
        self._inflight: dict[str, asyncio.Future] = {}
        self._stopped = False

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for s in self.slots:
            if s.status.availability is Availability.DISABLED:
                continue
            self._wake[s.name] = asyncio.Event()
            self._delay[s.name] = None
            self._tasks.append(loop.create_task(self._life(s), name=f"collector-{s.name}"))

    def reprobe_now(self) -> None:
        """Probe every inactive collector at once and restart its backoff (SIGHUP)."""
        for s in self.slots:
            if not s.active and s.name in self._wake:
                self._delay[s.name] = None
                self._wake[s.name].set()

    def _set_status(self, s: CollectorSlot, status: Status) -> None:
        old = s.status
        s.status = status
        if old.availability is status.availability:
            return
        s.transitions += 1
        level = logging.INFO if status.active else logging.WARNING
        log.log(level, "collector %s: %s -> %s%s", s.name, old.availability.value, status.availability.value,
                f" ({status.reason})" if status.reason else "")
        if self.on_change is not None:
            try:
                self.on_change(s, old)
            except Exception:
                log.exception("handling the availability change of collector %s failed", s.name)

    async def _life(self, s: CollectorSlot) -> None:
        """A slot for the life of the agent: probe until active (with backoff), start, collect."""
        loop = asyncio.get_running_loop()
        while not self._stopped:
            if not s.active:
                delay = self._delay[s.name] = self.backoff.next(self._delay[s.name])
                wake = self._wake[s.name]
                try:
                    await asyncio.wait_for(wake.wait(), timeout=delay)
                except asyncio.TimeoutError:
                    pass
                wake.clear()
                if self._stopped:
                    return
                col, status = await loop.run_in_executor(self._pool, probe_slot, s)
                s.collector = col
                self._set_status(s, status)
                if not s.active:
                    continue
            try:
                s.collector.start()
            except Exception as e:
                log.warning("collector %s start failed: %s", s.name, e)
                self._set_status(s, Status(Availability.UNAVAILABLE, f"start failed: {type(e).__name__}: {e}"))
                try:
                    s.collector.stop()
                except Exception:
                    pass
                continue
            self._delay[s.name] = None
            await self._run(s)

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
            self._inflight[s.name] = fut
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

    async def stop(self, grace: float = 2.0) -> None:
        """Stop collecting and probing, then stop every collector. A collection still running
        on its worker thread is given up to its timeout (at most ``grace``) to finish, so
        ``Collector.stop()`` normally never races a ``collect()``; its samples are discarded.
        One that outlives that (a hung read) is abandoned on its thread and ``stop()`` runs
        anyway: collectors must tolerate that (collectors/base.py). Idempotent."""
        self._stopped = True
        for ev in self._wake.values():
            ev.set()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        pending = [f for f in self._inflight.values() if not f.done()]
        if pending:
            wait = min(grace, max(s.timeout for s in self.slots))
            await asyncio.wait(pending, timeout=wait)
        self._inflight.clear()
        for s in self.slots:
            if s.collector is not None:
                try:
                    s.collector.stop()
                except Exception as e:
                    log.warning("collector %s stop failed: %s", s.name, e)
        self._pool.shutdown(wait=False, cancel_futures=True)
