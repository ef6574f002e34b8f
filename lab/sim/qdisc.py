"""What netdev sees of an egress queue in one interval: the simulator's measurement side (pure).

The injectors set a port's true queue dynamics (:class:`QueueTruth`): lock-step traffic pushes a
burst into the queue at every step, which then drains at the port's rate until it is empty or
the next step comes (the real lab's picture: a 300 Mbit/s tbf on a rank's port held 150-350 kB
for 53-87 % of every step and was empty in between). :func:`observe` turns that into what the
collector reports for the interval (collectors/netdev/backlog.py): the dump's instant backlog,
the peak of 20 random-phase samples, the time-weighted mean, the busy share as the share of
samples that found a queue, and the drain rate the delay is computed from. Its randomness comes
from a generator of its own, so adding a queue changes no other draw of the run.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: samples per interval: the collector's default qdisc_sample_hz at the 1 s collection interval.
#: The real sampler watches at 2 Hz until it sees a queue and holds 20 Hz 5 s after the last one;
#: the faults here bring a queue every step (20 Hz throughout), and a healthy front end's rare
#: small queues are modelled at 20 too, an upper bound on what the watch would catch.
SAMPLES = 20


@dataclass
class QueueTruth:
    """A queue's dynamics over one interval (bytes, bytes/s, seconds)."""

    peak: float  # bytes in the queue right after each step's burst
    drain: float  # bytes/s it drains at while it stands (the shaper, a starved NIC, the link)
    period: float  # step period: a new burst arrives every ``period`` seconds
    packet: float = 1500.0  # mean queued packet size, for the qlen


@dataclass
class QueueView:
    """The collector's figures for one interval."""

    backlog: float  # the collection's dump: one instant
    qlen: float
    peak: float  # netdev_qdisc_backlog_max_bytes
    mean: float  # netdev_qdisc_backlog_mean_bytes
    busy: float  # netdev_qdisc_busy_ratio
    drain: float  # what the delay divides the peak by (capped by the shaper/link in _emit_net)


def _level(q: QueueTruth, phase: np.ndarray) -> np.ndarray:
    """Backlog at step phases in [0, 1): a burst at 0, a linear drain; a queue that cannot drain
    within a step stands between peak - drain x period and peak."""
    return np.maximum(0.0, q.peak - q.drain * q.period * phase)


def observe(rng: np.random.Generator, q: QueueTruth, samples: int = SAMPLES) -> QueueView:
    """Sample the queue at random phases as the collector's sampler does, plus one dump instant."""
    phases = rng.random(samples + 1)
    levels = _level(q, phases)
    seen = levels[:samples]
    drain_s = q.peak / q.drain if q.drain > 0 else q.period
    busy_true = min(1.0, drain_s / q.period)
    # the exact time-weighted mean of the sawtooth: the sampler's mean converges to it
    if busy_true < 1.0:
        mean = q.peak * busy_true / 2
    else:
        mean = q.peak - q.drain * q.period / 2
    backlog = float(levels[samples])
    return QueueView(backlog=backlog, qlen=float(round(backlog / q.packet)), peak=float(seen.max()),
                     mean=float(mean), busy=float((seen > 0).mean()), drain=float(q.drain))


def healthy_view(rng: np.random.Generator, busy_front: bool, speed: float) -> QueueView:
    """A healthy port: a busy front end queues a few packets now and then (a sample finds them
    in ~2 % of instants), drained at the link's speed; other ports never queue."""
    if not busy_front:
        return QueueView(0.0, 0.0, 0.0, 0.0, 0.0, speed)
    k = int(rng.binomial(SAMPLES, 0.02))
    if k == 0:
        return QueueView(0.0, 0.0, 0.0, 0.0, 0.0, speed)
    peak = float(rng.integers(1, 6) * rng.integers(90, 1500))
    busy = k / SAMPLES
    return QueueView(0.0, 0.0, peak, peak * busy / 2, busy, speed)
