"""The collector contract (OpenTelemetry-style lifecycle, Home Assistant-style failure kinds).

A collector is a small package ``collectors/<name>/`` with thin I/O in ``collector.py``, pure
parsing in ``parse.py`` and its signals in ``catalogue.py``. The scheduler calls
``collect(t)`` with the tick time: collectors stamp samples with ``t`` (or with the true
capture time for packet data) and never decide time on their own.
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

    def __init__(self, node: str, config: Mapping[str, Any] | None = None,
                 sys_root: str | Path = "/sys", proc_root: str | Path = "/proc") -> None:
        self.node = node
        self.config = dict(config or {})
        self.sys_root = Path(sys_root)
        self.proc_root = Path(proc_root)
        self.stats = CollectorStats()
        self.started = False

    # -- lifecycle -------------------------------------------------------------------------
    @abstractmethod
    def probe(self) -> Status:
        """Cheap check whether this host can supply the signals. Never raises."""

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
