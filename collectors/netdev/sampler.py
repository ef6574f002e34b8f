"""The qdisc sampler: a thread that reads the root egress queues many times a second.

Why a thread and not a faster collection: the agent collects, evaluates and publishes once a
second; only the queue needs a finer view (see :mod:`.backlog`). Each round is one ``send()``
of one root-qdisc GET per interface and one small reply each, decoded by
:func:`.rtnl.queue_stats` (no dump, no pyroute2): about 4 us of CPU per interface in a tight
loop. What costs is the thread's wake-up: 20-35 us of CPU on this VM even for a bare sleep, and
more inside the agent, whose other threads hold the GIL (20 wake-ups a second added ~0.4 % of a
core to the agent at load 7-8, docs/benchmarks.md). So the sampler watches at ``IDLE_HZ`` while
no queue is seen and samples at the configured rate (default 20 Hz) only while one is: from a
sample that finds a backlog, or drops or shaper overlimits that moved, until ``HOLD_S`` seconds
pass without one. A port whose queue fills every step keeps it at the full rate; a port that
never queues costs two wake-ups a second; interfaces whose root qdisc is ``noqueue`` (veth, lo,
most virtual devices) are never sampled.

Rounds are spaced by a uniformly jittered period (0.5-1.5x) so they do not lock onto a step
period that divides the sampling period and see the same phase of every step.
"""
from __future__ import annotations

import errno
import random
import socket
import threading
import time
from typing import Callable, Mapping

from . import rtnl
from .backlog import QueueBook

NETLINK_ROUTE = 0
#: rounds per second while no queue is seen (a recurring queue is noticed within seconds)
IDLE_HZ = 2.0
#: seconds at the full rate after the last sample that saw a queue, drops or overlimits
HOLD_S = 5.0


def open_rtnl(netns: str | None) -> socket.socket:
    """A bound rtnetlink socket, inside ``netns`` when given."""
    from .netns import socket_in_netns

    family, kind = socket.AF_NETLINK, socket.SOCK_RAW
    s = (socket_in_netns(netns, family, kind, NETLINK_ROUTE) if netns
         else socket.socket(family, kind, NETLINK_ROUTE))
    try:
        s.settimeout(1.0)
        s.bind((0, 0))
    except BaseException:
        s.close()
        raise
    return s


class QdiscSampler:
    """Samples the root qdisc of the target interfaces into a :class:`QueueBook`, ``hz`` times
    a second while a queue is about, ``IDLE_HZ`` otherwise. Owns its thread and netlink socket;
    the netdev collector sets the targets after each dump and starts/stops it with itself."""

    def __init__(self, book: QueueBook, hz: float, open_socket: Callable[[], socket.socket],
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 idle_hz: float = IDLE_HZ, hold: float = HOLD_S) -> None:
        if hz <= 0:
            raise ValueError("qdisc sampler: hz must be > 0")
        self.book = book
        self.period = 1.0 / hz
        self.idle_period = 1.0 / min(idle_hz, hz)
        self.hold = hold
        self._open_socket = open_socket
        self._clock = clock
        self._rng = rng or random.Random()
        self._targets: dict[int, str] = {}
        self._last: dict[int, tuple[int, int]] = {}  # ifindex → (drops, overlimits) last seen
        self._busy_until = 0.0
        self._sock: socket.socket | None = None
        self._buf = bytearray(1 << 14)
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: self-telemetry: rounds done, rounds or answers that failed, CPU of the thread
        self.rounds = 0
        self.errors = 0
        self.cpu_seconds = 0.0
        self.last_error = ""

    # -- configuration -------------------------------------------------------------------------
    def set_targets(self, targets: Mapping[int, str]) -> None:
        """ifindex → name of the interfaces to sample (replaces the previous set)."""
        self._targets = dict(targets)
        self._last = {i: v for i, v in self._last.items() if i in self._targets}

    def notice_queue(self) -> None:
        """Something else (the collection's dump) saw a queue: sample at the full rate."""
        self._busy_until = self._clock() + self.hold

    @property
    def fast(self) -> bool:
        """Sampling at the full rate (a queue, drops or overlimits seen within ``hold`` s)."""
        return self._clock() < self._busy_until

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="netdev-qdisc-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread before returning; idempotent, safe without start()."""
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(5.0)
        self._close()

    def _close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def _run(self) -> None:
        while not self._stop.wait((self.period if self.fast else self.idle_period) * self._rng.uniform(0.5, 1.5)):
            c0 = time.thread_time()
            try:
                self.sample_once()
            except OSError as e:  # namespace gone, socket broken: reopen on the next round
                self.errors += 1
                self.last_error = str(e)
                self._close()
            self.cpu_seconds += time.thread_time() - c0

    # -- one round -----------------------------------------------------------------------------
    def sample_once(self) -> int:
        """One GET per target in one send, one answer each; returns the samples added."""
        targets = self._targets
        if not targets:
            return 0
        if self._sock is None:
            self._sock = self._open_socket()
        sock = self._sock
        base = self._seq
        order = list(targets.items())
        self._seq = (base + len(order)) & 0x7FFFFFFF
        sock.send(b"".join(rtnl.root_qdisc_request(idx, (base + k) & 0x7FFFFFFF)
                           for k, (idx, _) in enumerate(order)))
        t = self._clock()  # the kernel answered while processing send(): the answers are from now
        by_seq = {(base + k) & 0x7FFFFFFF: item for k, item in enumerate(order)}
        added = 0
        queue_seen = False
        while by_seq:
            try:
                n = sock.recv_into(self._buf)
            except socket.timeout:
                self.errors += 1
                self.last_error = "no answer to a root qdisc GET within 1 s"
                return added
            for mtype, seq, err, payload in rtnl.answers(self._buf, n):
                item = by_seq.pop(seq, None)
                if item is None:
                    continue  # a late answer to an earlier round
                idx, name = item
                if mtype == rtnl.NLMSG_ERROR:
                    if err and err not in (errno.ENODEV, errno.ENOENT):
                        self.errors += 1
                        self.last_error = f"root qdisc GET for {name}: errno {err}"
                    continue  # interface gone or no qdisc: the next dump updates the targets
                if mtype != rtnl.RTM_NEWQDISC:
                    continue
                st = rtnl.queue_stats(payload)
                if st is None:
                    continue
                backlog, _qlen, drops, sent, overlimits = st
                self.book.add(name, t, float(backlog), float(sent))
                added += 1
                last = self._last.get(idx)
                if backlog > 0 or (last is not None and (drops > last[0] or overlimits > last[1])):
                    queue_seen = True
                self._last[idx] = (drops, overlimits)
        if queue_seen:
            self._busy_until = t + self.hold
        self.rounds += 1
        return added
