"""The qdisc sampler: a thread that reads the root egress queues many times a second.

Why a thread and not a faster collection: the agent collects, evaluates and publishes once a
second; only the queue needs a finer view (see :mod:`.backlog`). Each round is one ``send()``
of one root-qdisc GET per interface and one small reply each, decoded by
:func:`.rtnl.queue_stats` (no dump, no pyroute2): on the build VM about 4 us of CPU per
interface plus the thread's wake-up, which dominates (20-100 us under load). The default 20 Hz
keeps the whole thread near 0.1-0.2 % of a core; interfaces whose root qdisc is ``noqueue``
(veth, lo, most virtual devices) are never sampled, so a host without queues pays nothing.

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
    """Samples the root qdisc of the target interfaces ``hz`` times a second into a
    :class:`QueueBook`. Owns its thread and netlink socket; the netdev collector sets the
    targets after each dump and starts/stops it with itself."""

    def __init__(self, book: QueueBook, hz: float, open_socket: Callable[[], socket.socket],
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> None:
        if hz <= 0:
            raise ValueError("qdisc sampler: hz must be > 0")
        self.book = book
        self.period = 1.0 / hz
        self._open_socket = open_socket
        self._clock = clock
        self._rng = rng or random.Random()
        self._targets: dict[int, str] = {}
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
        while not self._stop.wait(self.period * self._rng.uniform(0.5, 1.5)):
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
        by_seq = {(base + k) & 0x7FFFFFFF: name for k, (_, name) in enumerate(order)}
        added = 0
        pending = len(order)
        while pending:
            try:
                n = sock.recv_into(self._buf)
            except socket.timeout:
                self.errors += 1
                self.last_error = "no answer to a root qdisc GET within 1 s"
                return added
            for mtype, seq, err, payload in rtnl.answers(self._buf, n):
                name = by_seq.pop(seq, None)
                if name is None:
                    continue  # a late answer to an earlier round
                pending -= 1
                if mtype == rtnl.NLMSG_ERROR:
                    if err and err not in (errno.ENODEV, errno.ENOENT):
                        self.errors += 1
                        self.last_error = f"root qdisc GET for {name}: errno {err}"
                    continue  # interface gone or no qdisc: the next dump updates the targets
                if mtype != rtnl.RTM_NEWQDISC:
                    continue
                st = rtnl.queue_stats(payload)
                if st is not None:
                    self.book.add(name, t, float(st[0]), float(st[3]))
                    added += 1
        self.rounds += 1
        return added
