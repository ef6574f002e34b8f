"""Egress queue dynamics between two collections, from fast samples of a root qdisc (pure).

Why: lock-step traffic (a collective every 20-100 ms) fills an egress queue during each step's
burst and empties it before the next step. A once-a-second dump catches such a queue at one
instant, mostly empty: a real tbf-shaped port whose queue held 130-280 kB for 80 ms of every
115 ms step read 0 in most seconds, and a rule over the window's minimum could never fire.
Sampling the queue many times a second at random phases and keeping, per collection interval,
its peak, time-weighted mean and the share of time it was non-empty describes the queue
whatever the step period; the peak over the rate the queue drains at is how long a packet
joining the queue at its fullest waited.

The drain rate is the bytes the qdisc dequeued in the interval over the time a queue stood, at
most the shaping rate or link speed. Dequeues happen while a queue stands or within a moment of
an empty queue, so the estimate is right for a port that is busy most of the time (a tbf-shaped
port: 39 MB/s measured against its 37.5 MB/s rate) and too high, i.e. the delay too short, for a
port that is rarely busy, where the nominal rate caps it. It also sees what the nominal rate
cannot: a queue that stands while the NIC drains far below its link speed (flow-control pauses,
a starved TX ring).

Samples are weighted by the time since the previous sample of the same interface (the interval
length was chosen before the sample was taken, so a sample's value does not decide its weight);
a gap longer than ``max_weight`` (a sampler thread starved of CPU) counts as ``max_weight``.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterable

from .parse import Sample


@dataclass
class QueueWindow:
    """What one interface's queue did between two collections."""

    samples: int = 0
    #: seconds represented by the samples, and of those, with a non-empty queue
    time: float = 0.0
    busy_time: float = 0.0
    #: backlog (bytes) x seconds, for the time-weighted mean
    area: float = 0.0
    max_backlog: float = 0.0
    #: bytes the qdisc dequeued between the samples (the increase of its counter)
    sent_bytes: float = 0.0

    @property
    def mean_backlog(self) -> float:
        return self.area / self.time if self.time > 0 else 0.0

    @property
    def busy_ratio(self) -> float:
        return self.busy_time / self.time if self.time > 0 else 0.0

    def drain_rate(self, nominal: float | None) -> float | None:
        """Bytes/s the queue drained at while it stood: dequeued bytes over the time a queue
        stood, capped by the ``nominal`` rate (shaper or link); None without a standing queue."""
        if self.busy_time <= 0:
            return None
        measured = self.sent_bytes / self.busy_time
        return min(measured, nominal) if nominal and nominal > 0 else measured


class QueueTracker:
    """Folds one interface's samples into :class:`QueueWindow` s; keeps the previous sample
    across windows so the first sample of a window has a weight too."""

    def __init__(self, period: float, max_weight: float | None = None) -> None:
        self.period = float(period)
        self.max_weight = float(max_weight if max_weight is not None else 4 * period)
        self.window = QueueWindow()
        self._prev: tuple[float, float, float] | None = None  # (t, backlog, sent bytes)

    def add(self, t: float, backlog: float, sent_bytes: float) -> None:
        """One sample at monotonic time ``t`` (seconds): queued bytes and the qdisc's cumulative
        dequeued bytes."""
        w = self.window
        prev = self._prev
        if prev is None:
            dt = self.period
        else:
            dt = min(max(t - prev[0], 0.0), self.max_weight)
        w.samples += 1
        w.time += dt
        w.area += backlog * dt
        if backlog > 0:
            w.busy_time += dt
        if backlog > w.max_backlog:
            w.max_backlog = backlog
        if prev is not None and sent_bytes >= prev[2]:  # a decrease: the qdisc was replaced
            w.sent_bytes += sent_bytes - prev[2]
        self._prev = (t, backlog, sent_bytes)

    def take(self) -> QueueWindow:
        """The window since the last take, and start a new one."""
        w, self.window = self.window, QueueWindow()
        return w


def queue_samples(name: str, w: QueueWindow, rate: float | None) -> list[Sample]:
    """The interval's queue signals for interface ``name``; nothing without a sample.

    ``rate`` is the nominal rate the queue cannot drain faster than (bytes/s): the shaping
    rate, else the link speed, None when neither is known (see :meth:`QueueWindow.drain_rate`).
    When the qdisc dequeued nothing while a queue stood, the delay is at least the time it stood.
    """
    if w.samples == 0:
        return []
    out = [Sample(name, "netdev_qdisc_backlog_max_bytes", w.max_backlog),
           Sample(name, "netdev_qdisc_backlog_mean_bytes", w.mean_backlog),
           Sample(name, "netdev_qdisc_busy_ratio", w.busy_ratio)]
    drain = w.drain_rate(rate)
    if w.max_backlog <= 0 or w.busy_time <= 0:
        delay = 0.0
    else:
        delay = w.max_backlog / drain if drain else w.busy_time
    out.append(Sample(name, "netdev_qdisc_delay_max_seconds", delay))
    return out


class QueueBook:
    """The per-interface trackers, shared by the collector (its once-an-interval dump adds a
    sample, ``take`` ends the window) and the sampler thread (adds samples in between)."""

    def __init__(self, period: float, max_weight: float = 1.0) -> None:
        self.period = period
        self.max_weight = max_weight
        self._trackers: dict[str, QueueTracker] = {}
        self._lock = threading.Lock()

    def add(self, name: str, t: float, backlog: float, sent_bytes: float) -> None:
        with self._lock:
            tr = self._trackers.get(name)
            if tr is None:
                tr = self._trackers[name] = QueueTracker(self.period, self.max_weight)
            tr.add(t, backlog, sent_bytes)

    def take(self, names: Iterable[str]) -> dict[str, QueueWindow]:
        """The windows of ``names`` since the last take; interfaces not named are forgotten
        (gone, renamed, no longer selected), so the book stays bounded."""
        keep = set(names)
        with self._lock:
            for n in [n for n in self._trackers if n not in keep]:
                del self._trackers[n]
            return {n: tr.take() for n, tr in self._trackers.items()}
