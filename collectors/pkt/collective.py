"""Collective step timing from a port's packets: the silences of a node's collective traffic.

A collective library (gloo or NCCL over TCP sockets, NCCL over RoCE) moves each step's data
between tensor-parallel peers in lock step: a rank enters the collective when its compute is
done, sends, waits for its peers' data, and leaves once it has everything. Without synchronised
clocks a capture can still time each node's *own* rhythm, and that is enough to name a
straggler: the rank everybody waits for computes longest and never waits inside the collective,
its peers compute as long as usual and then wait for it.

This module lists, per capture port, every *silence* of the port's collective traffic - a
stretch of at least ``min_silence`` in which the node neither sent a payload byte nor received a
data segment on its collective connections - and how it ended:

- **ended by a send** (``by_send`` 1): the node started talking on its own. After its compute a
  rank enters the next collective and sends first: collective libraries rendezvous (gloo's
  receiver notifies the sender, NCCL's receiver grants credits), so while a rank computes nothing
  but small control messages reaches it.
- **ended by a peer** (``by_send`` 0): received data ended it, or the node's send followed a
  message from a peer (any size: a rendezvous notification) within ``react`` - the node was
  waiting and reacted. Runtimes react within their poll loop, but a process woken on a busy
  host waits for a CPU first. In the real-traffic lab (gloo over TCP on a loaded 2-core host) a
  rank waiting for its peer's rendezvous notification usually sent 0.02-0.26 ms after it, but
  with 0.5 ms a quarter of the waits of a straggler's peers read as compute gaps (their step
  period came out 10-25 % short, their waits split); with 3 ms a healthy rank that entered its
  collective within 3 ms of its neighbour's notification lost so many entries that its period
  came out 20 % long. ``react`` is 2 ms: late wake-ups on a busy host are caught, and it stays
  below the 5 ms lag EW-1 names (a straggler's peers notified it at least that long before it
  entered). A healthy rank that enters its collective within ``react`` of a peer's
  notification loses that step's compute gap (steps are medians, and the wait of a span with a
  missed entry is not counted).

``agent/steps.py`` turns the listed silences into steps: per step the compute gap (the longest
silence ended by a send, once per step period) and the wait inside the collective.

Which connections are collective: per port, connections (both directions of a 5-tuple) whose
payload bytes, decayed with time constant ``tau``, reach ``share`` of the port's heaviest
connection. Collectives move megabytes per step; token streams, the agent's own NATS connection
and other control traffic on the same port stay orders of magnitude below (measured in the
real-traffic lab: gloo all-reduce 39 MB/s per ring connection, a token stream ~25 kB/s). Pure
ACKs never count (no payload), nor do RoCE ACK/NAK/CNP packets; received segments under
``min_data`` bytes are control messages (gloo's 48-byte notifications), not data - they must not
end a straggler's compute silence.

Everything is vectorised over an interval's packets; state carried across intervals (the last
event, bytes sent since the last listed silence, the connection weights) makes the listing the
same wherever interval boundaries fall, except for the decayed connection weights, which are
updated once per interval.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .frames import DIR_IN, DIR_OUT
from .keyhash import hash_rows

NS = 1_000_000_000
#: RoCEv2 BTH opcodes that answer data rather than carry it (ACK, atomic ACK, CNP)
ROCE_REPLIES = (17, 18, 0x81)


@dataclass
class Silences:
    """Silences of one port's collective traffic that ended in one interval, in time order."""

    end_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    length_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    by_send: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    #: payload bytes the node sent on its collective connections between the previous listed
    #: silence and this one (the activity this silence followed)
    sent_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: silences not listed because an interval reached the cap (counter)
    unlisted_total: int = 0
    #: connections currently counted as collective
    connections: int = 0

    def __len__(self) -> int:
        return len(self.end_ns)


class _PortState:
    def __init__(self) -> None:
        self.weights: dict[int, float] = {}
        self.last_evt = -1  # ns of the latest send or received data segment
        self.last_in = -1  # ns of the latest received message of any size
        self.acc_bytes = 0  # sent since the latest listed silence
        self.unlisted = 0


#: RoCEv2's UDP destination port (IANA)
ROCE_PORT = 4791


def connection_hash(src_hi: np.ndarray, src_lo: np.ndarray, dst_hi: np.ndarray, dst_lo: np.ndarray,
                    sport: np.ndarray, dport: np.ndarray, proto: np.ndarray) -> np.ndarray:
    """A 64-bit key per packet that is the same for both directions of a 5-tuple.

    RoCEv2 is keyed by the address pair alone: each side of a queue pair picks its UDP source
    port from its own QP (entropy for ECMP), so the two directions of one connection have
    different 5-tuples. A receiver-driven transfer (a pipeline hand-off: NCCL's receiver writes
    a clear-to-send, the sender then writes megabytes) would otherwise split into a heavy
    direction and one of small writes that never reaches the collective share, and the
    receiver's clear-to-send - its own send, ending its compute silence - would not count."""
    roce = (proto == 17) & ((dport == ROCE_PORT) | (sport == ROCE_PORT))
    s_port = np.where(roce, 0, sport).astype(np.uint64)
    d_port = np.where(roce, 0, dport).astype(np.uint64)
    swap = (src_hi > dst_hi) | ((src_hi == dst_hi) & ((src_lo > dst_lo) | ((src_lo == dst_lo) & (s_port > d_port))))
    k = np.empty((len(src_hi), 5), np.uint64)
    k[:, 0] = np.where(swap, dst_hi, src_hi)
    k[:, 1] = np.where(swap, dst_lo, src_lo)
    k[:, 2] = np.where(swap, src_hi, dst_hi)
    k[:, 3] = np.where(swap, src_lo, dst_lo)
    lo_p = np.where(swap, d_port, s_port)
    hi_p = np.where(swap, s_port, d_port)
    k[:, 4] = (proto.astype(np.uint64) & np.uint64(0xFFFF)) << np.uint64(32) | lo_p << np.uint64(16) | hi_p
    return hash_rows(k)


class CollectiveTracker:
    """Per-port collective silences across intervals; :meth:`update` lists one interval's."""

    def __init__(self, min_silence: float = 0.001, share: float = 0.1, tau: float = 10.0,
                 min_data: int = 256, react: float = 0.002, max_listed: int = 256,
                 max_connections: int = 4096) -> None:
        if min_silence <= 0 or not 0 < share <= 1 or tau <= 0 or max_listed < 1:
            raise ValueError("min_silence and tau must be > 0, share in (0, 1], max_listed >= 1")
        self.min_silence_ns = int(round(min_silence * NS))
        self.share = float(share)
        self.tau = float(tau)
        self.min_data = int(min_data)
        self.react_ns = int(round(react * NS))
        self.max_listed = int(max_listed)
        self.max_connections = int(max_connections)
        self.ports: dict[int, _PortState] = {}

    def _heavy(self, ps: _PortState, conn: np.ndarray, pay: np.ndarray, dur: float) -> np.ndarray:
        """Update the port's decayed connection weights with this interval's payload bytes and
        return the keys of the connections that count as collective."""
        k = 0.0 if dur <= 0 else math.exp(-dur / self.tau)
        w = ps.weights
        if k != 1.0:
            for c in w:
                w[c] *= k
        has = pay > 0
        if has.any():
            keys, inv = np.unique(conn[has], return_inverse=True)
            sums = np.bincount(inv.ravel(), weights=pay[has].astype(np.float64))
            for c, s in zip(keys.tolist(), sums.tolist()):
                w[c] = w.get(c, 0.0) + s
        if not w:
            return np.zeros(0, np.uint64)
        top = max(w.values())
        if len(w) > self.max_connections or any(v < top * 1e-6 for v in w.values()):
            keep = sorted(w.items(), key=lambda kv: -kv[1])[: self.max_connections]
            ps.weights = w = {c: v for c, v in keep if v >= top * 1e-6}
        return np.fromiter((c for c, v in w.items() if v >= self.share * top and v > 0), np.uint64)

    def update(self, port: int, ts: np.ndarray, direction: np.ndarray, payload: np.ndarray,
               conn: np.ndarray, roce_opcode: np.ndarray, dur: float) -> Silences:
        """List the silences that ended among one interval's packets of ``port`` (IP packets only,
        capture order; ``conn`` from :func:`connection_hash`). Needs the direction of each
        packet: a capture that does not tell it lists nothing."""
        ps = self.ports.setdefault(port, _PortState())
        heavy = self._heavy(ps, conn, payload, dur)
        out = Silences(unlisted_total=ps.unlisted, connections=len(heavy))
        if not len(ts) or not len(heavy):
            return out
        sent = (direction == DIR_OUT) & (payload > 0) & ~np.isin(roce_opcode, ROCE_REPLIES)
        got = (direction == DIR_IN) & (payload > 0)
        ev = (sent | got) & np.isin(conn, heavy)
        if not ev.any():
            return out
        T = ts[ev]
        S = sent[ev]
        D = got[ev] & (payload[ev] >= self.min_data)
        B = np.where(S, payload[ev], 0).astype(np.int64)
        if len(T) > 1 and np.any(T[1:] < T[:-1]):  # frames of several CPUs' ring blocks
            o = np.argsort(T, kind="stable")
            T, S, D, B = T[o], S[o], D[o], B[o]
        # the latest message received before each packet (strictly before: a tie is no reaction)
        lin = np.where(~S, T, -1)
        lin = np.maximum.accumulate(np.r_[ps.last_in, lin[:-1]])
        if (~S).any():
            ps.last_in = max(ps.last_in, int(T[~S].max()))
        # silences: between sends and data segments only (a notification does not end one)
        keep = S | D
        if not keep.any():
            return out
        T, S, B, lin = T[keep], S[keep], B[keep], lin[keep]
        gap = np.empty(len(T), np.int64)
        np.subtract(T[1:], T[:-1], out=gap[1:])
        gap[0] = T[0] - ps.last_evt if ps.last_evt >= 0 else -1
        idx = np.flatnonzero(gap >= self.min_silence_ns)
        cs = np.cumsum(B)
        excl = cs - B  # bytes sent before each event (in this interval)
        if len(idx):
            before = excl[idx]
            nbytes = np.diff(before, prepend=0)
            nbytes[0] += ps.acc_bytes
            ps.acc_bytes = int(cs[-1] - before[-1])
            if len(idx) > self.max_listed:
                ps.unlisted += len(idx) - self.max_listed
                idx, nbytes = idx[: self.max_listed], nbytes[: self.max_listed]
            Ti = T[idx]
            # a send within the reaction window of a peer's message that came during the
            # silence answered that message: the node was waiting, not computing
            reacted = (lin[idx] >= Ti - self.react_ns) & (lin[idx] > Ti - gap[idx])
            out.end_ns = Ti.astype(np.int64)
            out.length_ns = gap[idx]
            out.by_send = (S[idx] & ~reacted).astype(np.int8)
            out.sent_bytes = nbytes
            out.unlisted_total = ps.unlisted
        else:
            ps.acc_bytes += int(cs[-1])
        ps.last_evt = max(ps.last_evt, int(T[-1]))
        return out
