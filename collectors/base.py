"""The collector contract (OpenTelemetry-style lifecycle, Home Assistant-style failure kinds).

A collector is a small package ``collectors/<name>/`` with thin I/O in ``collector.py``, pure
parsing in ``parse.py`` and its signals in ``catalogue.py``. The scheduler calls
``collect(t)`` with the tick time: collectors stamp samples with ``t`` (or with the true
capture time for packet data) and never decide time on their own.

The lifecycle, as ``agent/scheduler.py`` drives it:

1. **Construct** ``Cls(node, config, sys_root=, proc_root=)``: parse and check the settings,
   touch nothing on the host. A bad setting raises ValueError naming the key: the agent
   reports it when it loads its config (:meth:`Collector.config_problems`), as an operator
   error, never as "temporarily unavailable".
2. **probe()** says whether this host can supply the signals now. It never raises, and it
   *holds nothing*: whatever it opens (a socket, an NVML session, an HTTP connection) is
   closed before it returns. An inactive collector is probed again and again for the life of
   the agent (with backoff, and on SIGHUP) until it turns active: a vLLM still loading its
   model at boot, a dump directory NCCL has not created yet.
3. **start()** acquires what collecting needs and returns quickly (background work goes on a
   thread). It runs only after a probe said active. If it raises, the collector is
   unavailable and probed again later.
4. **collect(t)** runs on a worker thread with a timeout; a collection still running when the
   next is due is skipped, never queued. May raise CollectorError (counted by stage).
5. **stop()** releases everything; idempotent and safe when start() never ran. At stop the
   scheduler waits for a collection still running up to its timeout and discards its
   samples; one that outlives that (a read hung in the kernel) is abandoned on its thread and
   stop() is called anyway, so collect() must tolerate a concurrent or earlier stop() (return
   or raise, never crash the process). A stopped collector can be started again.

Failure kinds (:class:`Availability`): ``absent`` (nothing to do here), ``unavailable``
(retried quietly), ``needs_operator`` (say exactly what to fix), ``disabled`` (config).
A collector marked ``required: true`` in the config is reported ``needs_operator`` whenever it
is not active, and ``skewd agent --check`` exits 3 for it.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

from skewd.model import SampleBatch, SignalSpec


class Availability(str, Enum):
    ACTIVE = "active"
    #: the hardware/software is not present on this host: nothing to do (GPU-less host)
    ABSENT = "absent"
    #: present but failing right now; retried quietly, samples marked stale
    UNAVAILABLE = "unavailable"
    #: the user asked for it and it cannot work until an operator fixes something
    NEEDS_OPERATOR = "needs_operator"
    #: switched off in config
    DISABLED = "disabled"


@dataclass
class Status:
    availability: Availability
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.availability is Availability.ACTIVE


@dataclass
class CollectorStats:
    """Self-telemetry (Vector component spec): exposed on the agent's /metrics."""

    collections: int = 0
    samples_emitted: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # stage → count
    discarded: int = 0
    last_duration_s: float = 0.0
    total_duration_s: float = 0.0

    def error(self, stage: str) -> None:
        self.errors[stage] = self.errors.get(stage, 0) + 1


class CollectorError(Exception):
    """A collection failed in a way worth counting; ``stage`` names where (read/parse/...)."""

    def __init__(self, message: str, stage: str = "read") -> None:
        super().__init__(message)
        self.stage = stage


#: one TCP connection as its two ends, ``((local address, port), (peer address, port))``
Connection = tuple[tuple[str, int], tuple[str, int]]


class Collector(ABC):
    """Base class. Subclasses set ``name``, ``catalogue`` and ``default_interval``."""

    name: ClassVar[str]
    catalogue: ClassVar[list[SignalSpec]]
    default_interval: ClassVar[float] = 1.0
    #: config keys this collector accepts (besides the common ``enabled``/``interval``/``timeout``)
    config_keys: ClassVar[frozenset[str]] = frozenset()
    #: each of those keys (but the common ones) → (default as text, meaning): docs/config.md
    config_docs: ClassVar[dict[str, tuple[str, str]]] = {}

    def __init__(self, node: str, config: Mapping[str, Any] | None = None,
                 sys_root: str | Path = "/sys", proc_root: str | Path = "/proc") -> None:
        self.node = node
        self.config = dict(config or {})
        self.sys_root = Path(sys_root)
        self.proc_root = Path(proc_root)
        self.stats = CollectorStats()
        self.started = False

    # -- configuration ---------------------------------------------------------------------
    @classmethod
    def config_problems(cls, config: Mapping[str, Any]) -> list[str]:
        """Operator errors in this collector's settings, found without touching the host (the
        agent calls this when it loads its config). The default builds an instance, which
        parses the settings, and reports its ValueError; collectors that keep a config error
        for probe() to report override this."""
        try:
            cls("config-check", config)
        except ValueError as e:
            msg = str(e)
            if msg.startswith(f"{cls.name}: "):
                msg = msg[len(cls.name) + 2:]
            return [msg if msg.startswith("collectors.") else f"collectors.{cls.name}: {msg}"]
        return []

    # -- lifecycle -------------------------------------------------------------------------
    @abstractmethod
    def probe(self) -> Status:
        """Cheap check whether this host can supply the signals now. Never raises and holds
        nothing (whatever it opens is closed before it returns); called repeatedly while the
        collector is inactive."""

    def start(self) -> None:
        """Acquire resources. Returns quickly (background work goes on a thread)."""
        self.started = True

    def stop(self) -> None:
        """Release resources. Idempotent and safe when start() never ran."""
        self.started = False

    @abstractmethod
    def collect(self, t: float) -> SampleBatch:
        """Read and parse one round of samples stamped ``t``. May raise CollectorError."""

    def provides(self) -> set[str]:
        """Signals this collector supplies when active (rules needing others are inactive).
        Mapping collectors (exporter scrapes) override this with what their mapping yields."""
        return {s.name for s in self.catalogue}

    def ignore_connections(self, conns: Sequence[Connection]) -> None:
        """The agent's own connections (its NATS client), to leave out of what this collector
        reports: the agent's traffic is not the node's, and must never become a finding's
        entity. Called from the agent's event loop whenever the set changes (each (re)connect);
        only collectors that see individual connections (packet capture) have anything to do."""

    def unavailable_reason(self, signal_name: str) -> str:
        """Why an active collector does not supply one of its catalogued signals."""
        return f"{self.name} collector does not supply it on this host"

    # -- helpers ---------------------------------------------------------------------------
    def collect_counted(self, t: float) -> SampleBatch:
        """collect() with self-telemetry; errors are counted and re-raised."""
        t0 = time.perf_counter()
        try:
            batch = self.collect(t)
        except CollectorError as e:
            self.stats.error(e.stage)
            raise
        except Exception:
            self.stats.error("collect")
            raise
        finally:
            d = time.perf_counter() - t0
            self.stats.last_duration_s = d
            self.stats.total_duration_s += d
            self.stats.collections += 1
        self.stats.samples_emitted += len(batch)
        return batch

    @property
    def interval(self) -> float:
        return float(self.config.get("interval", self.default_interval))
