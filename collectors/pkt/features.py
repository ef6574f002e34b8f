"""Per-flow, per-interval timing features from decoded packets.

One :class:`FlowTracker` serves both paths: the live collector feeds it the packets captured
since the previous collect, the offline reader feeds it one ``--interval`` bucket at a time.
Because the tracker carries a little state per flow (last packet time, the open burst, TCP
sequence and RoCE PSN high-water marks), a gap, burst or retransmission that spans two
intervals is measured the same way wherever the interval boundary falls, and live and offline
give the same features for the same packets.

All arithmetic is vectorised over the packets of an interval: packets are grouped by flow
with one sort of (64-bit hash of the 5-tuple, position) (a hash-prefix collision is detected
and regrouped on the full hash), and every statistic is a segmented numpy reduction.

Definitions (also in README.md):
- gap: time between consecutive packets of the same flow; the first packet of an interval is
  measured against the flow's previous packet, so a stall spanning intervals is not lost.
- jitter: coefficient of variation (stddev / mean) of the gaps in the interval.
- burst: maximal run of packets whose gaps are all below ``burst_gap``.
- TCP retransmission: a segment with data (or SYN/FIN) starting below the highest sequence
  end already seen in the same direction of the flow, classified as Wireshark does: keep-alives
  are ignored, fast retransmissions (answering >= 2 duplicate ACKs) count, segments arriving
  within the handshake RTT (or 3 ms) of the last forward progress are reordering and do not.
  Sequence numbers are unwrapped, so flows crossing 2**32 are handled.
- spurious TCP retransmission: a retransmission whose bytes a D-SACK block (RFC 2883) in the
  reverse flow's ACKs covers, in the same or the next interval: the receiver had them already
  (a tail-loss probe answered by a D-SACK, a fast retransmission caused by reordering).
- RoCE retransmission: a request packet whose PSN (unwrapped modulo 2**24) is not above the
  highest PSN already seen for the same destination QP in the flow (ACK/CNP packets excluded).
- Packets are taken in capture order (as tshark does); a clock stepping back reads as a 0 gap.
"""
from __future__ import annotations

import math
import socket
from dataclasses import dataclass, field

import numpy as np

from .collective import CollectiveTracker, Silences, connection_hash
from .frames import DIR_IN, DIR_OUT
from .parse import TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, Packets

NS = 1_000_000_000
_NONE = np.int64(-(1 << 62))
_PROTO = {1: "icmp", 2: "igmp", 6: "tcp", 17: "udp", 47: "gre", 50: "esp", 58: "icmp6", 132: "sctp"}
_ROCE_NO_PSN = (17, 18, 0x81)  # ACK, atomic ACK, CNP: not part of the request PSN sequence
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
def _mix(x: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """Avalanche mix of a uint64 array. With ``scratch`` (a uint64 array of the same shape) it
    works in place on ``x`` (which it returns), without full-size temporaries."""
    with np.errstate(over="ignore"):
        if scratch is None:
            x = x ^ (x >> np.uint64(33))
            x = x * np.uint64(0xFF51AFD7ED558CCD)
            x = x ^ (x >> np.uint64(33))
            x = x * np.uint64(0xC4CEB9FE1A85EC53)
            return x ^ (x >> np.uint64(33))
        s33 = np.uint64(33)
        x ^= np.right_shift(x, s33, out=scratch)
        x *= np.uint64(0xFF51AFD7ED558CCD)
        x ^= np.right_shift(x, s33, out=scratch)
        x *= np.uint64(0xC4CEB9FE1A85EC53)
        x ^= np.right_shift(x, s33, out=scratch)
        return x


def flow_key_columns(pk: Packets, idx: np.ndarray) -> np.ndarray:
    """(len(idx), 5) uint64 key: src hi/lo, dst hi/lo, version|proto|sport|dport."""
    k = np.empty((len(idx), 5), np.uint64)
    k[:, 0] = pk.src_hi[idx]
    k[:, 1] = pk.src_lo[idx]
    k[:, 2] = pk.dst_hi[idx]
    k[:, 3] = pk.dst_lo[idx]
    k[:, 4] = ((pk.ipver[idx].astype(np.uint64) << np.uint64(56))
               | (pk.proto[idx].astype(np.uint64) & np.uint64(0xFFFF)) << np.uint64(32)
               | pk.sport[idx].astype(np.uint64) << np.uint64(16) | pk.dport[idx].astype(np.uint64))
    return k


def _hash(k: np.ndarray) -> np.ndarray:
    """64-bit hash of each row of a uint64 matrix (grouping key; collisions are checked)."""
    with np.errstate(over="ignore"):
        h = _mix(k[:, -1] ^ np.uint64(0x9E3779B97F4A7C15))
        for c in range(k.shape[1] - 1):
            h = _mix(h ^ k[:, c] * np.uint64(0x100000001B3 + 2 * c))
    return h


def group_flows(pk: Packets, idx: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group packets ``idx`` (None: all) by direction-aware 5-tuple, keeping capture order inside a flow.

    Returns (packet indices grouped by flow, group index per element, start of each group).
    One ``np.sort`` of (hash prefix | position): sorting values is cheaper than a stable
    argsort and the position bits make it stable. Groups are then checked against the full
    64-bit hash; a prefix collision falls back to a stable sort of the full hash.
    """
    n = len(pk) if idx is None else len(idx)
    if n == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    whole = n == len(pk)

    def col(a: np.ndarray) -> np.ndarray:
        return a if whole else a[idx]

    # the hash is built in place in one buffer: every full-size temporary costs page faults
    u64 = np.uint64
    h = col(pk.ipver).astype(u64)
    h <<= u64(56)
    t = col(pk.proto).astype(u64)
    t &= u64(0xFFFF)
    t <<= u64(32)
    h |= t
    t[...] = col(pk.sport)
    t <<= u64(16)
    h |= t
    t[...] = col(pk.dport)
    h |= t  # h = version|proto|sport|dport (the key's misc word)
    v6 = bool((col(pk.ipver) == 6).any())
    with np.errstate(over="ignore"):  # odd-multiplier linear combination, then one avalanche mix
        h *= u64(0x9E3779B97F4A7C15)
        h += np.multiply(col(pk.src_lo), u64(0xC2B2AE3D27D4EB4F), out=t)
        h += np.multiply(col(pk.dst_lo), u64(0x165667B19E3779F9), out=t)
        if v6:
            h += np.multiply(col(pk.src_hi), u64(0xD6E8FEB86659FD93), out=t)
            h += np.multiply(col(pk.dst_hi), u64(0xFF51AFD7ED558CCD), out=t)
        h = _mix(h, t)
    bits = max(1, int(n - 1).bit_length())
    mask = u64((1 << bits) - 1)
    comp = np.bitwise_and(h, ~mask, out=t)
    comp |= np.arange(n, dtype=u64)
    comp.sort()
    order = (comp & mask).view(np.int64)
    comp &= ~mask  # the hash prefix of each element in sorted order
    first = np.empty(n, bool)
    first[0] = True
    np.not_equal(comp[1:], comp[:-1], out=first[1:])
    hf = np.take(h, order, out=comp)
    if not ((hf[1:] == hf[:-1]) | first[1:]).all():  # hash prefix collision: group on the full hash
        order = np.argsort(h, kind="stable")
        hf = h[order]
        np.not_equal(hf[1:], hf[:-1], out=first[1:])
    gi = np.cumsum(first)
    gi -= 1
    gs = np.flatnonzero(first)
    return (order if whole else idx[order]), gi, gs


def entity_of(key: np.ndarray) -> str:
    """``udp 10.0.0.1:5000>10.0.0.2:4791`` from one 5-word flow key."""
    shi, slo, dhi, dlo, misc = key.tolist()
    ver, proto, sport, dport = misc >> 56, (misc >> 32) & 0xFFFF, (misc >> 16) & 0xFFFF, misc & 0xFFFF
    name = _PROTO.get(proto) or f"ip{proto}"
    if ver == 6:
        src = socket.inet_ntop(socket.AF_INET6, ((shi << 64) | slo).to_bytes(16, "big"))
        dst = socket.inet_ntop(socket.AF_INET6, ((dhi << 64) | dlo).to_bytes(16, "big"))
        if proto in (6, 17, 132):
            return f"{name} [{src}]:{sport}>[{dst}]:{dport}"
    else:
        src = socket.inet_ntop(socket.AF_INET, (slo & 0xFFFFFFFF).to_bytes(4, "big"))
        dst = socket.inet_ntop(socket.AF_INET, (dlo & 0xFFFFFFFF).to_bytes(4, "big"))
        if proto in (6, 17, 132):
            return f"{name} {src}:{sport}>{dst}:{dport}"
    return f"{name} {src}>{dst}"


def _group_quantiles(gid: np.ndarray, val: np.ndarray, gs: np.ndarray, cnt: np.ndarray,
                     qs: tuple[float, ...], lim: int = (1 << 40) - 1) -> list[np.ndarray]:
    """Per-group quantiles (numpy's linear interpolation) of non-negative int64 values.

    Elements are grouped contiguously (``gs`` = group starts); negative values are missing
    and ``cnt`` counts the others per group. One sort of (group << 40 | value): missing
    values sort last in their group, values above ``lim`` (18 minutes of ns) clamp.
    """
    ng = len(gs)
    out = [np.full(ng, np.nan) for _ in qs]
    if len(gid) == 0:
        return out
    if ng < (1 << 22):
        key = np.minimum(val, lim)
        np.putmask(key, val < 0, lim)
        key |= np.left_shift(gid, 40, dtype=np.int64)
        key.sort()
        srt, low = key, lim  # only the few elements the quantiles read are converted
    else:
        srt, low = np.where(val < 0, lim, val)[np.lexsort((np.where(val < 0, lim, val), gid))], -1
    has = cnt > 0
    for o, q in zip(out, qs):
        pos = gs[has] + q * (cnt[has] - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, gs[has] + cnt[has] - 1)
        vlo = (srt[lo] & low).astype(np.float64)
        vhi = (srt[hi] & low).astype(np.float64)
        o[has] = vlo + (vhi - vlo) * (pos - lo)
    return out


def _seg_first(first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group index per element, index of each group's first element) from a first-flag array."""
    starts = np.flatnonzero(first)
    return np.cumsum(first) - 1, starts


def _unwrap(raw: np.ndarray, first: np.ndarray, prev_raw: np.ndarray, prev_u: np.ndarray,
            bits: int) -> np.ndarray:
    """Unwrap a modulo-2**bits sequence per group. ``prev_raw``/``prev_u`` (per group, -1 = none)
    carry the last raw and unwrapped value from before this batch."""
    gi, gs = _seg_first(first)
    mod, half = 1 << bits, 1 << (bits - 1)
    prev = np.empty_like(raw)
    prev[1:] = raw[:-1]
    prev[gs] = prev_raw
    have = prev >= 0
    d = np.where(have, ((raw - prev + half) & (mod - 1)) - half, 0)
    base = np.where(prev_raw >= 0, prev_u, raw[gs])
    cs = np.cumsum(d)
    off = cs[gs] - d[gs]
    return base[gi] + cs - off[gi]


def _excl_cummax(val: np.ndarray, first: np.ndarray, init: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per element, the max of ``val`` over earlier elements of its group and the group's
    ``init`` (``_NONE`` = nothing); plus each group's inclusive max at its end.

    Segmented cummax as one ``maximum.accumulate``: each element's key is
    (group << 42) + value, so a later group always dominates an earlier one."""
    gi, gs = _seg_first(first)
    ng = len(gs)
    n = len(val)
    valid = val != _NONE
    vmax = int(val.max()) if n else 0
    vmin = int(np.min(val, where=valid, initial=1 << 62)) if n else 0
    if ng < (1 << 21) and vmax < (1 << 41) - 1 and vmin >= -(1 << 41):
        key = (gi.astype(np.int64) << 42) + np.where(valid, val + (1 << 41) + 1, 0)
        low = np.maximum.accumulate(key) & ((1 << 42) - 1)
        incl = np.where(low == 0, _NONE, low - (1 << 41) - 1)
    else:  # huge value ranges: normalise each group by its minimum first
        lo = np.minimum.reduceat(np.where(valid, val, np.iinfo(np.int64).max), gs) if n else val
        lo = np.where(lo == np.iinfo(np.int64).max, 0, lo)
        rel = np.where(valid, val - lo[gi], -1)
        span = int(rel.max()) + 2 if n else 2
        if span * max(ng, 1) < (1 << 62):
            cm = np.maximum.accumulate(gi.astype(np.int64) * span + rel + 1) - gi.astype(np.int64) * span - 1
            incl = np.where(cm < 0, _NONE, cm + lo[gi])
        else:  # absurd spans: exact per-group loop (never seen with real traffic)
            incl = np.empty_like(val)
            for a, b in zip(gs, np.r_[gs[1:], n]):
                incl[a:b] = np.maximum.accumulate(val[a:b])
    excl = np.empty_like(val)
    excl[1:] = incl[:-1]
    excl[gs] = _NONE
    if (init != _NONE).any():
        excl = np.maximum(excl, init[gi])
    last = np.r_[gs[1:], n] - 1
    return excl, np.maximum(incl[last], init)


@dataclass
class PortFeatures:
    """Aggregates of one capture port over one interval (NaN = not measurable)."""

    name: str
    packets_total: int = 0
    bytes_total: int = 0
    other_total: int = 0
    tcp_retransmits_total: int = 0
    kernel_drops_total: int | None = None
    flows: int = 0
    share_max: float = math.nan
    gini: float = math.nan
    ingress_pps: float = math.nan
    ingress_bps: float = math.nan
    ingress_gap_p99: float = math.nan
    ingress_gap_max: float = math.nan
    bursts_total: int = 0
    burst_start: float = math.nan
    burst_bytes: float = math.nan
    inter_burst_gap: float = math.nan
    end_spread: float = math.nan
    #: silences of the port's collective traffic that ended in the interval (collective.py)
    silences: Silences = field(default_factory=Silences)


@dataclass
class IntervalFeatures:
    """Features of one interval: ``flows`` maps column name → array (one row per flow)."""

    t0: float
    t1: float
    entities: list[str]
    flows: dict[str, np.ndarray]
    ports: list[PortFeatures] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.t1 - self.t0

    def flow(self, entity: str) -> dict[str, float]:
        i = self.entities.index(entity)
        return {k: v[i].item() for k, v in self.flows.items()}


#: the flow columns of :attr:`IntervalFeatures.flows`, in the order :meth:`FlowTracker.update` builds them
FLOW_COLUMNS = ("packets", "bytes", "packets_per_second", "bytes_per_second", "gap_p50_seconds",
                "gap_p99_seconds", "gap_max_seconds", "gap_p05_seconds", "jitter_cov", "bursts",
                "burst_bytes_max", "bursts_total", "burst_start_seconds", "burst_bytes",
                "burst_duration_seconds", "inter_burst_gap_seconds", "packets_total", "bytes_total",
                "tcp_retransmits_total", "tcp_retransmits", "tcp_spurious_retransmits_total",
                "tcp_spurious_retransmits", "roce_retransmits_total", "ecn_ce_packets_total",
                "start_seconds", "end_seconds", "idle_seconds", "closed", "egress", "bytes_share_ratio")


class _Port:
    def __init__(self) -> None:
        self.packets = 0
        self.bytes = 0
        self.other = 0
        self.rtx = 0
        self.last_ns = -1
        self.last_in_ns = -1
        self.bursts = 0
        self.b_start = -1
        self.b_bytes = 0
        self.b_gap = math.nan


class FlowTracker:
    """Flow state across intervals; :meth:`update` turns one interval's packets into features.

    ``flow_timeout``: a flow without packets for this long is forgotten (and its counters
    restart if it comes back: the window store treats that as a counter reset).
    """

    #: intervals without packets while no flow is tracked take :meth:`_update_quiet` (same
    #: result; the differential test turns it off on its reference tracker)
    quiet_fast_path = True

    _COLS = ("first", "last", "packets", "bytes", "bursts", "ecn", "rtx", "rrtx", "srtx",
             "b_start", "b_last", "b_bytes", "b_packets", "seq_raw", "seq_u", "seq_max", "closed",
             "tcp", "roce", "port", "irtt", "adv")

    def __init__(self, burst_gap: float = 0.001, flow_timeout: float = 60.0, max_flows: int = 100_000,
                 max_listed_silences: int = 256) -> None:
        if burst_gap <= 0:
            raise ValueError("burst_gap must be > 0")
        if max_listed_silences < 1:
            raise ValueError("max_listed_silences must be >= 1")
        self.burst_gap_ns = int(round(burst_gap * NS))
        self.flow_timeout = flow_timeout
        self.max_flows = max_flows
        self.slots: dict[bytes, int] = {}
        self.keys: list[np.ndarray | None] = []
        self.entities: list[str | None] = []
        self.free: list[int] = []
        self.cap = 0
        self.s: dict[str, np.ndarray] = {}
        self.b_gap = np.zeros(0)
        self.psn: dict[tuple[int, int], tuple[int, int, int]] = {}
        self.ports: dict[int, _Port] = {}
        self.evicted = 0
        #: silences of each port's collective traffic (step timing without synced clocks)
        self.collective = CollectiveTracker(min_silence=burst_gap, max_listed=max_listed_silences)
        #: retransmissions of the previous interval no D-SACK has covered yet: (slot, first
        #: byte, end) in the flow's unwrapped sequence space; a D-SACK in this interval may still
        self._rtx_open = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        #: flows whose spurious-retransmission count rose in the interval being built (slot → +n)
        self._spurious_new: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._grow(1024)

    # -- slots -------------------------------------------------------------------------------
    def _grow(self, need: int) -> None:
        if need <= self.cap:
            return
        new = max(need, 2 * self.cap, 1024)
        for c in self._COLS:
            old = self.s.get(c)
            arr = np.zeros(new, np.int64)
            if old is not None:
                arr[: self.cap] = old
            self.s[c] = arr
        g = np.full(new, np.nan)
        g[: self.cap] = self.b_gap
        self.b_gap = g
        self.cap = new

    def _reset(self, slots: np.ndarray) -> None:
        for c in self._COLS:
            self.s[c][slots] = 0
        for c in ("last", "b_start", "b_last", "seq_raw", "seq_u", "irtt", "adv"):
            self.s[c][slots] = -1
        self.s["seq_max"][slots] = _NONE
        self.b_gap[slots] = np.nan

    def _slots(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slot per key row (allocating new ones); second array flags new flows."""
        out = np.empty(len(keys), np.int64)
        new = np.zeros(len(keys), bool)
        for i, kb in enumerate(keys.view(np.dtype((np.void, 40))).ravel().tolist()):
            s = self.slots.get(kb)
            if s is None:
                if self.free:
                    s = self.free.pop()
                else:
                    s = len(self.keys)
                    self.keys.append(None)
                    self.entities.append(None)
                self.slots[kb] = s
                self.keys[s] = keys[i].copy()
                self.entities[s] = None
                new[i] = True
            out[i] = s
        self._grow(len(self.keys))
        if new.any():
            self._reset(out[new])
        return out, new

    def _reverse_slot(self, slot: int) -> int | None:
        """Slot of the opposite direction of a flow, if tracked."""
        k = self.keys[slot]
        if k is None:
            return None
        misc = int(k[4])
        sp, dp = (misc >> 16) & 0xFFFF, misc & 0xFFFF
        rk = np.array([k[2], k[3], k[0], k[1], (misc & ~0xFFFFFFFF) | (dp << 16) | sp], np.uint64)
        return self.slots.get(rk.tobytes())

    def entity(self, slot: int) -> str:
        e = self.entities[slot]
        if e is None:
            e = self.entities[slot] = entity_of(self.keys[slot])
        return e

    def _expire(self, now_ns: int) -> None:
        live = np.fromiter(self.slots.values(), np.int64, len(self.slots))
        if not len(live):
            return
        old = live[self.s["last"][live] < now_ns - int(self.flow_timeout * NS)] \
            if math.isfinite(self.flow_timeout) else np.zeros(0, np.int64)
        if len(self.slots) - len(old) > self.max_flows:  # keep the most recently active
            keep = live[np.argsort(self.s["last"][live])][-self.max_flows:]
            old = np.setdiff1d(live, keep)
        if not len(old):
            return
        dead = set(old.tolist())
        for kb, s in list(self.slots.items()):
            if s in dead:
                del self.slots[kb]
                self.keys[s] = None
                self.entities[s] = None
                self.free.append(s)
        self.psn = {k: v for k, v in self.psn.items() if k[0] not in dead}
        keep = ~np.isin(self._rtx_open[0], old)
        self._rtx_open = tuple(a[keep] for a in self._rtx_open)  # type: ignore[assignment]
        self.evicted += len(dead)

    def forget(self, keys: np.ndarray) -> int:
        """Stop tracking the flows with these 5-word keys (rows of :func:`flow_key_columns`), as
        if they had timed out: they leave the output now, and count from zero if they come back.
        Returns how many were tracked. (The pkt collector drops the agent's own connection this
        way once it learns its ends.)"""
        gone = []
        for kb in np.ascontiguousarray(keys, np.uint64).view(np.dtype((np.void, 40))).ravel().tolist():
            s = self.slots.pop(kb, None)
            if s is not None:
                self.keys[s] = None
                self.entities[s] = None
                self.free.append(s)
                gone.append(s)
        if gone:
            self.psn = {k: v for k, v in self.psn.items() if k[0] not in gone}
            keep = ~np.isin(self._rtx_open[0], gone)
            self._rtx_open = tuple(a[keep] for a in self._rtx_open)  # type: ignore[assignment]
        return len(gone)

    # -- one interval ------------------------------------------------------------------------
    def update(self, pk: Packets, t0: float, t1: float, port_names: list[str] | None = None,
               drops: dict[int, int] | None = None) -> IntervalFeatures:
        """Features of the interval ``[t0, t1]`` (Unix seconds) given its packets (in capture order)."""
        if self.quiet_fast_path and not len(pk) and not self.slots:
            return self._update_quiet(pk, t0, t1, port_names, drops)
        dur = t1 - t0
        st = self.s
        t1_ns = int(round(t1 * NS))
        ipm = (pk.ipver > 0) & pk.decoded
        idx = None if ipm.all() else np.flatnonzero(ipm)
        # ---- group by flow: rows = packet indices, flow after flow, capture order inside
        rows, gi, gs = group_flows(pk, idx)
        F = len(gs)
        m = len(rows)
        slot_g, new_g = (self._slots(flow_key_columns(pk, rows[gs])) if F
                         else (np.zeros(0, np.int64), np.zeros(0, bool)))
        ts = pk.ts_ns[rows]
        wl = pk.wirelen[rows]
        last_i = np.r_[gs[1:], m] - 1 if F else gs
        cnt = np.diff(np.r_[gs, m]) if F else np.zeros(0, np.int64)
        byt = np.add.reduceat(wl, gs) if F else np.zeros(0, np.int64)
        # ---- gaps: -1 marks a flow's first packet ever (no gap); a clock step back reads 0
        prev_last = st["last"][slot_g]
        gap = np.empty(m, np.int64)
        if m:
            np.subtract(ts[1:], ts[:-1], out=gap[1:])
            gap[gs] = ts[gs] - prev_last
            np.maximum(gap, 0, out=gap)
            gap[gs[prev_last < 0]] = -1
        nog = (prev_last < 0).astype(np.int64)  # 0/1 missing gap per flow (always its first element)
        ng = cnt - nog
        lim = (1 << 40) - 1
        # p05: packets held back by a send-path stall leave back to back; a paced token stream
        # has at most one such gap a request (its last token and the end marker) (NS-6)
        p05, p50, p99 = _group_quantiles(gi, gap, gs, ng, (0.05, 0.5, 0.99), lim)
        gmax = np.maximum.reduceat(gap, gs).astype(np.float64) if F else np.zeros(0)
        gmax[gmax < 0] = np.nan
        gf = gap.astype(np.float64)
        np.maximum(gf, 0.0, out=gf)
        gsum = np.add.reduceat(gf, gs) if F else np.zeros(0)
        gsq = np.add.reduceat(np.square(gf, out=gf), gs) if F else np.zeros(0)
        del gf
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = gsum / ng
            var = np.maximum(gsq / ng - mean ** 2, 0.0)
            cov = np.where((ng >= 2) & (mean > 0), np.sqrt(var) / mean, np.nan)
        # ---- bursts: a burst starts at a flow's first packet ever or after an idle gap. Bursts
        # ("segments") are cut at every start and at every flow's first packet of the interval;
        # a flow's first segment may continue the burst open at the end of the previous one.
        bstart = gap >= self.burst_gap_ns
        bstart |= gap < 0
        seg = bstart.copy()
        seg[gs] = True
        sgs = np.flatnonzero(seg)
        del seg
        s_bytes = np.add.reduceat(wl, sgs) if len(sgs) else np.zeros(0, np.int64)
        g_first_seg = np.searchsorted(sgs, gs)  # every flow's first element starts a segment
        g_last_seg = np.r_[g_first_seg[1:], len(sgs)] - 1 if len(sgs) else sgs
        cont = ~bstart[gs]  # per flow: its first segment continues the previous interval's burst
        del bstart
        nb = (g_last_seg - g_first_seg + 1) - cont  # bursts started in the interval
        # the latest burst of each flow (its last segment)
        l_el = sgs[g_last_seg]
        l_start = ts[l_el]
        l_pk = last_i - l_el + 1
        l_gap = np.where(gap[l_el] >= 0, gap[l_el] / NS, np.nan)
        if cont.any():
            c = np.flatnonzero(cont)
            cs = slot_g[c]
            s_bytes[g_first_seg[c]] += st["b_bytes"][cs]
            only = c[g_first_seg[c] == g_last_seg[c]]  # the continued burst is also the latest
            cs = slot_g[only]
            l_pk[only] += st["b_packets"][cs]
            l_start[only] = st["b_start"][cs]
            l_gap[only] = self.b_gap[cs]
        l_bytes = s_bytes[g_last_seg]
        bmax = np.maximum.reduceat(s_bytes, g_first_seg) if len(sgs) else np.zeros(0, np.int64)
        # ---- TCP retransmissions
        is_tcp = (pk.proto == 6) & pk.l4ok
        if is_tcp.any():
            rtx_g, tcp_any, closed_g = self._tcp(pk, rows, gi, gs, ts, slot_g, F, is_tcp)
        else:
            rtx_g, tcp_any, closed_g = np.zeros(F, np.int64), np.zeros(F, bool), np.zeros(F, bool)
            self._rtx_open = tuple(a[:0] for a in self._rtx_open)  # type: ignore[assignment]
        # ---- RoCE PSN retransmissions, per (flow, destination QP)
        rrtx_g = np.zeros(F, np.int64)
        roce_any = np.zeros(F, bool)
        if (pk.bth_opcode >= 0).any():
            ops = pk.bth_opcode[rows]
            rsel = np.flatnonzero(ops >= 0)
            rg = gi[rsel]
            roce_any |= np.bincount(rg, minlength=F) > 0
            keep = ~np.isin(ops[rsel], _ROCE_NO_PSN)
            del ops
            if not keep.all():
                rsel, rg = rsel[keep], rg[keep]
            if len(rsel):
                rrtx_g += self._roce(pk, rows[rsel], rg, slot_g, F)
        # ---- direction, ECN
        egress = np.full(F, np.nan)
        if pk.direction.any():
            d = pk.direction[rows]
            n_out = np.add.reduceat((d == DIR_OUT).astype(np.int64), gs)
            n_in = np.add.reduceat((d == DIR_IN).astype(np.int64), gs)
            egress = np.where(n_out + n_in > 0, (n_out > n_in).astype(np.float64), np.nan)
        ecn_g = (np.add.reduceat((pk.ecn[rows] == 3).astype(np.int64), gs) if (pk.ecn == 3).any()
                 else np.zeros(F, np.int64))
        port_g = pk.iface[rows[gs]].astype(np.int64) if F else np.zeros(0, np.int64)
        # ---- state update for flows with packets
        was_closed = st["closed"][slot_g].astype(bool)
        st["first"][slot_g] = np.where(new_g, ts[gs] if F else gs, st["first"][slot_g])
        st["last"][slot_g] = ts[last_i] if F else last_i
        st["packets"][slot_g] += cnt
        st["bytes"][slot_g] += byt
        st["bursts"][slot_g] += nb
        st["ecn"][slot_g] += ecn_g
        st["rtx"][slot_g] += rtx_g
        st["rrtx"][slot_g] += rrtx_g
        st["closed"][slot_g] |= closed_g
        st["tcp"][slot_g] |= tcp_any
        st["roce"][slot_g] |= roce_any
        st["port"][slot_g] = port_g
        if len(sgs):
            st["b_start"][slot_g] = l_start
            st["b_last"][slot_g] = ts[last_i]
            st["b_bytes"][slot_g] = l_bytes
            st["b_packets"][slot_g] = l_pk
            self.b_gap[slot_g] = l_gap
        # ---- one row per flow with packets, then per tracked flow idle in this interval
        live = np.fromiter(self.slots.values(), np.int64, len(self.slots))
        idle = np.setdiff1d(live, slot_g)
        if math.isfinite(self.flow_timeout):
            idle = idle[st["last"][idle] >= t1_ns - int(self.flow_timeout * NS)]
        sl = np.r_[slot_g, idle]
        Fi = len(idle)
        nan_i = np.full(Fi, np.nan)
        z = np.zeros(Fi)

        def cat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return np.r_[a.astype(np.float64), b]

        cols: dict[str, np.ndarray] = {}
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["packets"] = cat(cnt, z)
            cols["bytes"] = cat(byt, z)
            cols["packets_per_second"] = cols["packets"] / dur if dur > 0 else np.full(F + Fi, np.nan)
            cols["bytes_per_second"] = cols["bytes"] / dur if dur > 0 else np.full(F + Fi, np.nan)
            cols["gap_p50_seconds"] = cat(p50 / NS, nan_i)
            cols["gap_p99_seconds"] = cat(p99 / NS, nan_i)
            cols["gap_max_seconds"] = cat(gmax / NS, nan_i)
            cols["gap_p05_seconds"] = cat(p05 / NS, nan_i)
            cols["jitter_cov"] = cat(cov, nan_i)
            cols["bursts"] = cat(nb, z)
            cols["burst_bytes_max"] = cat(bmax, nan_i)
        bs = st["b_start"][sl]
        cols["bursts_total"] = st["bursts"][sl].astype(np.float64)
        cols["burst_start_seconds"] = np.where(bs >= 0, bs / NS, np.nan)
        cols["burst_bytes"] = np.where(bs >= 0, st["b_bytes"][sl], np.nan)
        cols["burst_duration_seconds"] = np.where(bs >= 0, (st["b_last"][sl] - bs) / NS, np.nan)
        cols["inter_burst_gap_seconds"] = self.b_gap[sl].copy()
        cols["packets_total"] = st["packets"][sl].astype(np.float64)
        cols["bytes_total"] = st["bytes"][sl].astype(np.float64)
        tcp_f = st["tcp"][sl].astype(bool)
        roce_f = st["roce"][sl].astype(bool)
        cols["tcp_retransmits_total"] = np.where(tcp_f, st["rtx"][sl], np.nan)
        cols["tcp_retransmits"] = cat(rtx_g, z)
        cols["tcp_spurious_retransmits_total"] = np.where(tcp_f, st["srtx"][sl], np.nan)
        cols["tcp_spurious_retransmits"] = self._spurious_rows(sl)
        cols["roce_retransmits_total"] = np.where(roce_f, st["rrtx"][sl], np.nan)
        cols["ecn_ce_packets_total"] = st["ecn"][sl].astype(np.float64)
        cols["start_seconds"] = st["first"][sl] / NS
        cols["end_seconds"] = st["last"][sl] / NS
        cols["idle_seconds"] = np.maximum(t1 - st["last"][sl] / NS, 0.0)
        cols["closed"] = np.where(tcp_f, st["closed"][sl], np.nan)
        cols["egress"] = cat(egress, nan_i)
        port_all = st["port"][sl]
        tb = np.zeros(len(sl))
        for p in (np.unique(port_all).tolist() if len(sl) else []):
            mine = port_all == p
            tb[mine] = cols["bytes"][mine].sum()
        with np.errstate(invalid="ignore", divide="ignore"):
            cols["bytes_share_ratio"] = np.where(tb > 0, cols["bytes"] / tb, np.nan)
        newly_closed = np.r_[closed_g & ~was_closed, np.zeros(Fi, bool)]
        ents = [self.entity(int(x)) for x in sl.tolist()]
        feats = IntervalFeatures(t0, t1, ents, cols)
        feats.ports = self._ports(pk, ipm, t0, t1, port_all, cols, newly_closed, port_names or [], drops or {},
                                  rtx_g, port_g)
        self._expire(t1_ns)
        return feats

    def _update_quiet(self, pk: Packets, t0: float, t1: float, port_names: list[str] | None,
                      drops: dict[int, int] | None) -> IntervalFeatures:
        """:meth:`update` of an interval without packets while no flow is tracked (an idle
        capture port): no flow rows, only the ports' cumulative figures. The same result as the
        general path (tests/collectors/test_pkt_quiet.py), without its ~100 numpy calls on
        empty arrays, which cost ~1 ms a second on an idle port."""
        e_f, e_i, e_b = np.zeros(0), np.zeros(0, np.int64), np.zeros(0, bool)
        cols = {c: e_f.copy() for c in FLOW_COLUMNS}
        feats = IntervalFeatures(t0, t1, [], cols)
        feats.ports = self._ports(pk, e_b, t0, t1, e_i, cols, e_b, port_names or [], drops or {}, e_i, e_i)
        return feats

    def _roce(self, pk: Packets, rr: np.ndarray, rg: np.ndarray, slot_g: np.ndarray, F: int) -> np.ndarray:
        """RoCE retransmissions per flow: PSN not above the highest seen for the same dest QP.
        ``rr``: the request packets (indices into ``pk``, grouped by flow), ``rg``: their flow."""
        qp = pk.bth_qp[rr].astype(np.int64)
        comp = rg * (1 << 24) + qp
        if (comp[1:] < comp[:-1]).any():  # several QPs interleaved in a flow: group by QP too
            o2 = np.argsort(comp, kind="stable")
            rr, comp, rg, qp = rr[o2], comp[o2], rg[o2], qp[o2]
        rfirst = np.r_[True, comp[1:] != comp[:-1]]
        rgs = np.flatnonzero(rfirst)
        rslot = slot_g[rg]
        init = np.array([self.psn.get((int(s), int(q)), (-1, -1, int(_NONE)))
                         for s, q in zip(rslot[rgs].tolist(), qp[rgs].tolist())], np.int64).reshape(-1, 3)
        psn = pk.bth_psn[rr].astype(np.int64)
        rl = np.r_[rgs[1:], len(rr)] - 1
        expect = np.empty(len(psn), np.int64)
        expect[1:] = (psn[:-1] + 1) & 0xFFFFFF
        expect[rgs] = np.where(init[:, 0] >= 0, (init[:, 0] + 1) & 0xFFFFFF, psn[rgs])
        if (psn == expect).all():  # every PSN one above the previous: no retransmission (fast path)
            u_first = np.where(init[:, 0] >= 0, init[:, 1] + 1, psn[rgs])
            u_last = u_first + (rl - rgs)
            for s_, q, raw, uu in zip(rslot[rgs].tolist(), qp[rgs].tolist(), psn[rl].tolist(), u_last.tolist()):
                self.psn[(s_, q)] = (raw, uu, uu)
            return np.zeros(F, np.int64)
        u = _unwrap(psn, rfirst, init[:, 0], init[:, 1], 24)
        excl, incl_last = _excl_cummax(u, rfirst, init[:, 2])
        rr = (excl != _NONE) & (u <= excl)
        for s_, q, raw, uu, mx in zip(rslot[rgs].tolist(), qp[rgs].tolist(), psn[rl].tolist(),
                                      u[rl].tolist(), incl_last.tolist()):
            self.psn[(s_, q)] = (raw, uu, mx)
        return np.bincount(rg, weights=rr.astype(np.float64), minlength=F).astype(np.int64)

    def _tcp(self, pk: Packets, rows: np.ndarray, gi: np.ndarray, gs: np.ndarray, ts_rows: np.ndarray,
             slot_g: np.ndarray, F: int, is_tcp: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Retransmissions per flow, classified the way Wireshark's TCP analysis does:
        a segment starting below the highest sequence end seen is a keep-alive (ignored),
        a fast retransmission (the peer sent >= 2 duplicate ACKs asking for exactly this
        sequence number within 20 ms), out-of-order (it came within the handshake RTT, or
        3 ms, of the last forward progress: reordering, not loss) or else a retransmission."""
        st = self.s
        rtx_g = np.zeros(F, np.int64)
        tcp_any = np.zeros(F, bool)
        closed_g = np.zeros(F, bool)
        tsel = np.flatnonzero(is_tcp[rows])
        if not len(tsel):
            return rtx_g, tcp_any, closed_g
        tg = gi[tsel]
        tslot = slot_g[tg]
        tfirst = np.r_[True, tg[1:] != tg[:-1]]
        tgs = np.flatnonzero(tfirst)
        pr = rows[tsel]
        ts = ts_rows[tsel]
        seq = pk.tcp_seq[pr]
        fl = pk.tcp_flags[pr].astype(np.int64)
        pay = pk.payload[pr]
        seglen = pay + ((fl & TCP_SYN) > 0) + ((fl & TCP_FIN) > 0)
        tcp_any[tg[tgs]] = True
        closed_g[tg[tgs]] = (np.bitwise_or.reduceat(fl, tgs) & (TCP_FIN | TCP_RST)) != 0
        hs = (fl & (TCP_SYN | TCP_ACK)) == TCP_SYN
        # a handshake in the interval takes the full path, which learns its RTT (the reordering
        # threshold) even when every segment is in order
        if not hs.any() and self._tcp_in_order(seq, seglen, ts, tfirst, tgs, tslot):
            self._tcp_spurious(pk, pr, tslot, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
            return rtx_g, tcp_any, closed_g
        tgi = np.cumsum(tfirst) - 1
        u = _unwrap(seq, tfirst, st["seq_raw"][tslot[tgs]], st["seq_u"][tslot[tgs]], 32)
        endv = np.where(seglen > 0, u + seglen, _NONE)
        excl, incl_last = _excl_cummax(endv, tfirst, st["seq_max"][tslot[tgs]])
        backward = (seglen > 0) & (excl != _NONE) & (u < excl)
        keepalive = (seglen <= 1) & (u == excl - 1) & ((fl & (TCP_SYN | TCP_FIN | TCP_RST)) == 0)
        # time the highest sequence end last advanced, before each packet
        adv = (endv != _NONE) & (endv > excl)
        cm = np.maximum.accumulate(np.where(adv, np.arange(len(tsel)), -1))
        pa = np.r_[-1, cm[:-1]]
        mine = pa >= tgs[tgi]
        t_adv = np.where(mine, ts[np.maximum(pa, 0)], st["adv"][tslot])
        # the conversation join (both directions, capture order) only where it can matter:
        # flows with backward segments (fast retransmission?) or a handshake (its RTT)
        fast = np.zeros(len(tsel), bool)
        irtt_conv_slots: list[tuple[np.ndarray, int]] = []
        need = np.flatnonzero(np.bincount(tg, weights=(backward | hs).astype(np.float64), minlength=F) > 0)
        if len(need):
            want = set(slot_g[need].tolist())
            want |= {r for r in (self._reverse_slot(int(x)) for x in slot_g[need].tolist()) if r is not None}
            sub = np.flatnonzero(np.isin(tslot, np.fromiter(want, np.int64, len(want))))
            fast[sub], irtt_conv_slots = self._tcp_conversations(pk, pr[sub], ts[sub], seq[sub], fl[sub],
                                                                 seglen[sub], tslot[sub])
        for sl_arr, irtt in irtt_conv_slots:
            unknown = st["irtt"][sl_arr] <= 0
            st["irtt"][sl_arr[unknown]] = irtt
        irtt = st["irtt"][tslot]
        thres = np.where(irtt > 0, irtt, 3_000_000)
        ooo = (t_adv >= 0) & (ts - t_adv < thres) & (excl != u + seglen)
        rtx = backward & ~keepalive & (fast | ~ooo)
        rtx_g += np.bincount(tg, weights=rtx.astype(np.float64), minlength=F).astype(np.int64)
        tl = np.r_[tgs[1:], len(tsel)] - 1
        s_sl = tslot[tgs]
        st["seq_raw"][s_sl] = seq[tl]
        st["seq_u"][s_sl] = u[tl]
        st["seq_max"][s_sl] = incl_last
        last_adv = cm[tl]
        st["adv"][s_sl] = np.where(last_adv >= tgs, ts[np.maximum(last_adv, 0)], st["adv"][s_sl])
        self._tcp_spurious(pk, pr, tslot, tslot[rtx], u[rtx], u[rtx] + seglen[rtx])
        return rtx_g, tcp_any, closed_g

    def _tcp_spurious(self, pk: Packets, pr: np.ndarray, tslot: np.ndarray, r_slot: np.ndarray,
                      r_lo: np.ndarray, r_hi: np.ndarray) -> None:
        """Count the retransmissions the receiver reports as spurious (``srtx`` per flow).

        A receiver that gets bytes it already holds says so with a D-SACK block in its next ACK
        (RFC 2883; Linux sends one for every duplicate unless net.ipv4.tcp_dsack=0): a tail-loss
        probe answered that way, or a fast retransmission caused by reordering, cost nothing on
        the wire. A retransmission (``r_slot``/``r_lo``/``r_hi``: its flow and unwrapped byte
        range, found in this interval by :meth:`_tcp`) is spurious when a D-SACK from the peer
        overlaps its bytes, in this interval or the next one (a D-SACK follows its duplicate by
        about one round trip; the unmatched ones are carried one interval in ``_rtx_open``).
        ``pr``/``tslot``: this interval's TCP packets and their flow slots, in flow order, after
        the flows' sequence state was updated. Each retransmission counts at most once, so a
        flow's spurious count never exceeds its retransmission count."""
        st = self.s
        c_slot, c_lo, c_hi = self._rtx_open
        self._spurious_new = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        if not len(c_slot) and not len(r_slot):  # no resend to judge (the usual interval)
            return
        cand_slot, cand_lo, cand_hi = np.r_[c_slot, r_slot], np.r_[c_lo, r_lo], np.r_[c_hi, r_hi]
        d_slot = d_lo = d_hi = np.zeros(0, np.int64)
        dl = pk.tcp_dsack_lo[pr]
        has = np.flatnonzero(dl >= 0)
        if len(has) and len(cand_slot):
            # a D-SACK travels in the ACK flow and speaks of the reverse (data) flow's bytes
            ack_slots, inv = np.unique(tslot[has], return_inverse=True)
            rev = np.array([-1 if (r := self._reverse_slot(int(x))) is None else r for x in ack_slots.tolist()],
                           np.int64)
            data = rev[inv.ravel()]
            ok = data >= 0
            ok[ok] &= st["seq_raw"][data[ok]] >= 0
            data, raw_lo, raw_hi = data[ok], dl[has][ok], pk.tcp_dsack_hi[pr][has][ok]
            half, mask = 1 << 31, (1 << 32) - 1
            d_slot = data
            d_lo = st["seq_u"][data] + (((raw_lo - st["seq_raw"][data] + half) & mask) - half)
            d_hi = d_lo + ((raw_hi - raw_lo) & mask)
        hit = _overlapping(cand_slot, cand_lo, cand_hi, d_slot, d_lo, d_hi)
        if hit.any():
            inc_slot, inc = np.unique(cand_slot[hit], return_counts=True)
            st["srtx"][inc_slot] += inc
            self._spurious_new = (inc_slot, inc.astype(np.int64))
        keep = ~hit[len(c_slot):]  # this interval's unmatched retransmissions wait one more interval
        self._rtx_open = (r_slot[keep], r_lo[keep], r_hi[keep])

    def _spurious_rows(self, sl: np.ndarray) -> np.ndarray:
        """Per output row (flow slots ``sl``): spurious retransmissions found in this interval."""
        out = np.zeros(len(sl))
        inc_slot, inc = self._spurious_new
        if len(inc_slot) and len(sl):
            o = np.argsort(sl)
            pos = np.searchsorted(sl[o], inc_slot)
            pos = np.minimum(pos, len(sl) - 1)
            found = sl[o][pos] == inc_slot
            out[o[pos[found]]] = inc[found]
        self._spurious_new = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        return out

    def _tcp_in_order(self, seq: np.ndarray, seglen: np.ndarray, ts: np.ndarray, tfirst: np.ndarray,
                      tgs: np.ndarray, tslot: np.ndarray) -> bool:
        """Fast path for the usual case: every segment starts exactly where the previous one of
        its flow ended (so nothing can be a retransmission). Updates the flow state and says
        True; False means the full analysis must run (it then updates the state itself)."""
        st = self.s
        mask = (1 << 32) - 1
        n = len(seq)
        expect = np.empty(n, np.int64)
        expect[1:] = (seq[:-1] + seglen[:-1]) & mask
        first_sl = tslot[tgs]
        smax, sraw, su = st["seq_max"][first_sl], st["seq_raw"][first_sl], st["seq_u"][first_sl]
        expect[tgs] = np.where(smax != _NONE, smax & mask, np.where(sraw >= 0, sraw, seq[tgs]))
        if not (seq == expect).all():
            return False
        # unwrapped values follow from the segment lengths
        tl = np.r_[tgs[1:], n] - 1
        u_first = np.where(sraw >= 0, su + (((seq[tgs] - sraw + (1 << 31)) & mask) - (1 << 31)), seq[tgs])
        cs = np.cumsum(seglen)
        before_last = cs[tl] - seglen[tl] - (cs[tgs] - seglen[tgs])  # lengths of all but the last
        u_last = u_first + before_last
        data = np.add.reduceat(seglen > 0, tgs) > 0
        st["seq_raw"][first_sl] = seq[tl]
        st["seq_u"][first_sl] = u_last
        st["seq_max"][first_sl] = np.where(data, u_last + seglen[tl], smax)
        last_data_t = np.maximum.reduceat(np.where(seglen > 0, ts, -1), tgs)
        st["adv"][first_sl] = np.where(last_data_t >= 0, last_data_t, st["adv"][first_sl])
        return True

    @staticmethod
    def _tcp_conversations(pk: Packets, pr: np.ndarray, ts: np.ndarray, seq: np.ndarray, fl: np.ndarray,
                           seglen: np.ndarray, tslot: np.ndarray
                           ) -> tuple[np.ndarray, list[tuple[np.ndarray, int]]]:
        """Both directions of each TCP conversation in this batch, joined in capture order:
        which segments answer the peer's duplicate ACKs (fast retransmissions), and the
        handshake RTT (SYN to the first ACK) of conversations whose handshake is seen."""
        n = len(pr)
        a = np.stack([pk.src_hi[pr], pk.src_lo[pr], pk.sport[pr].astype(np.uint64)], 1)
        b = np.stack([pk.dst_hi[pr], pk.dst_lo[pr], pk.dport[pr].astype(np.uint64)], 1)
        lt = (a[:, 0] < b[:, 0]) | ((a[:, 0] == b[:, 0]) & ((a[:, 1] < b[:, 1])
                                                           | ((a[:, 1] == b[:, 1]) & (a[:, 2] <= b[:, 2]))))
        lo_ep = np.where(lt[:, None], a, b)
        hi_ep = np.where(lt[:, None], b, a)
        key = np.concatenate([lo_ep, hi_ep], 1)
        ck = _hash(key)
        d = (~lt).astype(np.int64)
        o = np.lexsort((pr, ck))  # conversation, then capture order (pr is the packet index)
        cks = ck[o]
        cfirst = np.r_[True, cks[1:] != cks[:-1]]
        cgi = np.cumsum(cfirst) - 1
        cgs = np.flatnonzero(cfirst)
        # per (conversation, direction) stream: duplicate-ACK run lengths
        o2 = np.argsort(cgi * 2 + d[o], kind="stable")
        so = o[o2]
        sk = (cgi * 2 + d[o])[o2]
        sfirst = np.r_[True, sk[1:] != sk[:-1]]
        ack = pk.tcp_ack[pr]
        win = pk.tcp_win[pr]
        prev_ack = np.r_[-1, ack[so][:-1]]
        prev_win = np.r_[-1, win[so][:-1]]
        f = fl[so]
        dup = (~sfirst & (seglen[so] == 0) & (ack[so] == prev_ack) & (win[so] == prev_win)
               & ((f & 0x10) > 0) & ((f & (TCP_SYN | TCP_FIN | TCP_RST)) == 0))
        cs = np.cumsum(dup)
        reset = np.maximum.accumulate(np.where(~dup, cs, 0))
        run = np.empty(n, np.int64)
        run[so] = cs - reset
        # the latest packet of the other direction before each packet (conversation order)
        pos = np.arange(n)
        dd = d[o]
        last = [np.maximum.accumulate(np.where(dd == k, pos, -1)) for k in (0, 1)]
        opp = np.where(dd == 0, last[1], last[0])
        ok = opp >= cgs[cgi]
        oo = o[np.maximum(opp, 0)]
        fast = np.zeros(n, bool)
        fast[o] = ok & (run[oo] >= 2) & (ack[oo] == seq[o]) & (ts[o] - ts[oo] < 20_000_000)
        # handshake RTT: first SYN (no ACK) to the first ACK without SYN after it
        big = np.iinfo(np.int64).max
        fo = fl[o]
        syn_t = np.minimum.reduceat(np.where(((fo & TCP_SYN) > 0) & ((fo & 0x10) == 0), ts[o], big), cgs)
        after = ((fo & 0x10) > 0) & ((fo & (TCP_SYN | TCP_RST)) == 0) & (ts[o] >= syn_t[cgi])
        ack_t = np.minimum.reduceat(np.where(after, ts[o], big), cgs)
        known = np.flatnonzero((syn_t < big) & (ack_t < big))
        out = []
        for c in known.tolist():
            e = cgs[c + 1] if c + 1 < len(cgs) else n
            out.append((np.unique(tslot[o[cgs[c]:e]]), int(ack_t[c] - syn_t[c])))
        return fast, out

    def _ports(self, pk: Packets, ipm: np.ndarray, t0: float, t1: float, port_all: np.ndarray,
               cols: dict[str, np.ndarray], newly_closed: np.ndarray, names: list[str],
               drops: dict[int, int], rtx_g: np.ndarray, port_g: np.ndarray) -> list[PortFeatures]:
        dur = t1 - t0
        out = []
        ifs = [int(pk.iface[0])] if len(pk) and pk.iface.min() == pk.iface.max() else np.unique(pk.iface).tolist()
        ids = set(ifs) | set(self.ports) | set(drops)
        for p in sorted(ids):
            ps = self.ports.setdefault(p, _Port())
            sel = np.flatnonzero(pk.iface == p) if len(ids) > 1 else slice(None)
            ts, wl, ip_sel, dirs = pk.ts_ns[sel], pk.wirelen[sel], ipm[sel], pk.direction[sel]
            n_sel = len(ts)
            all_ip = bool(ip_sel.all())
            ps.packets += n_sel
            ps.bytes += int(wl.sum())
            ps.other += 0 if all_ip else int(n_sel - ip_sel.sum())
            ps.rtx += int(rtx_g[port_g == p].sum())
            f = PortFeatures(names[p] if p < len(names) and names[p] else f"if{p}")
            f.packets_total, f.bytes_total, f.other_total, f.tcp_retransmits_total = ps.packets, ps.bytes, ps.other, ps.rtx
            f.kernel_drops_total = drops.get(p)
            mine = port_all == p
            f.flows = int((cols["packets"][mine] > 0).sum())
            b = cols["bytes"][mine]
            b = b[b > 0]
            if len(b) and b.sum() > 0:
                f.share_max = float(b.max() / b.sum())
                sb = np.sort(b)
                k = np.arange(1, len(sb) + 1)
                f.gini = float((2 * (k * sb).sum() / (len(sb) * sb.sum())) - (len(sb) + 1) / len(sb))
            # ingress (needs direction)
            known = bool(dirs.any()) or ps.last_in_ns >= 0
            if known and dur > 0:
                din = dirs == DIR_IN
                tin = ts[din]
                f.ingress_pps = len(tin) / dur
                f.ingress_bps = float(wl[din].sum()) / dur
                g = np.maximum(np.diff(np.r_[[ps.last_in_ns] if ps.last_in_ns >= 0 else [], tin].astype(np.int64)), 0)
                if len(g):
                    f.ingress_gap_p99 = float(np.quantile(g, 0.99)) / NS
                    f.ingress_gap_max = float(g.max()) / NS
                if len(tin):
                    ps.last_in_ns = int(tin[-1])
            # aggregate bursts over the port's IP packets
            tip = ts if all_ip else ts[ip_sel]
            if len(tip):
                g = np.empty(len(tip), np.int64)
                np.subtract(tip[1:], tip[:-1], out=g[1:])
                g[0] = tip[0] - ps.last_ns if ps.last_ns >= 0 else -1
                start = (g >= self.burst_gap_ns)
                if ps.last_ns < 0:
                    start[0] = True
                si = np.flatnonzero(start)
                ps.bursts += len(si)
                wip = wl if all_ip else wl[ip_sel]
                if len(si):
                    k = int(si[-1])
                    ps.b_start = int(tip[k])
                    ps.b_bytes = int(wip[k:].sum())
                    ps.b_gap = float(max(g[k], 0)) / NS if g[k] >= 0 else math.nan
                else:
                    ps.b_bytes += int(wip.sum())
                ps.last_ns = max(ps.last_ns, int(tip[-1]))
            if known:
                conn = connection_hash(pk.src_hi[sel], pk.src_lo[sel], pk.dst_hi[sel], pk.dst_lo[sel],
                                       pk.sport[sel], pk.dport[sel], pk.proto[sel])
                f.silences = self.collective.update(p, ts[ip_sel], dirs[ip_sel], pk.payload[sel][ip_sel],
                                                    conn[ip_sel], pk.bth_opcode[sel][ip_sel], dur)
            f.bursts_total = ps.bursts
            if ps.b_start >= 0:
                f.burst_start, f.burst_bytes, f.inter_burst_gap = ps.b_start / NS, float(ps.b_bytes), ps.b_gap
            ends = cols["end_seconds"][mine & newly_closed]
            if len(ends) >= 2:
                f.end_spread = float(ends.max() - ends.min())
            out.append(f)
        return out

def _overlapping(c_slot: np.ndarray, c_lo: np.ndarray, c_hi: np.ndarray, d_slot: np.ndarray,
                 d_lo: np.ndarray, d_hi: np.ndarray) -> np.ndarray:
    """Per candidate range ``[c_lo, c_hi)`` of flow ``c_slot``: does any range ``[d_lo, d_hi)``
    of the same flow overlap it? One sort of the ``d`` ranges by (flow, start) and a running
    maximum of their ends: the candidate overlaps when the ranges of its flow starting before
    its end reach beyond its start. Byte offsets are taken relative to each flow's lowest
    value here so the (flow, offset) keys fit one int64."""
    out = np.zeros(len(c_slot), bool)
    if not len(c_slot) or not len(d_slot):
        return out
    flows, inv = np.unique(np.r_[c_slot, d_slot], return_inverse=True)
    inv = inv.ravel()
    cf, df = inv[:len(c_slot)], inv[len(c_slot):]
    base = np.full(len(flows), np.iinfo(np.int64).max)
    np.minimum.at(base, cf, c_lo)
    np.minimum.at(base, df, d_lo)
    off = 1 << 42  # offsets beyond 4 TB from the lowest byte of the flow in question are ignored
    cl, ch = c_lo - base[cf], c_hi - base[cf]
    dl, dh = d_lo - base[df], d_hi - base[df]
    fits = (np.maximum(ch, 0) < off) & (cl >= 0)
    dfit = (dh < off) & (dl >= 0)
    df, dl, dh = df[dfit], dl[dfit], dh[dfit]
    if not len(df):
        return out
    o = np.lexsort((dl, df))
    df, dl, dh = df[o], dl[o], dh[o]
    key = (df << 43) | dl
    reach = np.maximum.accumulate((df << 43) | dh)  # within a flow: the furthest end so far
    pos = np.searchsorted(key, (cf << 43) | np.minimum(np.maximum(ch, 0), off - 1), side="left") - 1
    ok = fits & (pos >= 0)
    p = np.maximum(pos, 0)
    out[ok] = (df[p[ok]] == cf[ok]) & ((reach[p[ok]] & ((1 << 43) - 1)) > cl[ok])
    return out


def analyze(pk: Packets, interval: float | None = None, burst_gap: float = 0.001,
            port_names: list[str] | None = None, drops: dict[int, int] | None = None,
            max_intervals: int = 100_000) -> list[IntervalFeatures]:
    """Offline: features per interval of a whole capture (one interval when ``interval`` is None).

    Intervals are aligned to multiples of ``interval`` in Unix time (so captures taken on
    different nodes line up); the first and last are clipped to the capture's span, which is
    what the rates are divided by.
    """
    tr = FlowTracker(burst_gap, flow_timeout=math.inf)
    if len(pk) == 0:
        return []
    lo_ns, hi_ns = int(pk.ts_ns.min()), int(pk.ts_ns.max())
    if not interval:
        return [tr.update(pk, lo_ns / NS, hi_ns / NS, port_names, drops)]
    iv = int(round(interval * NS))
    if iv <= 0:
        raise ValueError("interval must be > 0")
    b0 = (lo_ns // iv) * iv
    nb = (hi_ns - b0) // iv + 1
    if nb > max_intervals:
        raise ValueError(f"{nb} intervals of {interval:g}s: the capture spans {(hi_ns - lo_ns) / NS:.0f}s; "
                         f"use a longer --interval")
    bi = (pk.ts_ns - b0) // iv
    if np.any(bi[1:] < bi[:-1]):  # out-of-order timestamps: bucket, keeping capture order inside
        o = np.argsort(bi, kind="stable")
        pk, bi = pk.take(o), bi[o]
    bounds = np.searchsorted(bi, np.arange(nb + 1), side="left")
    out = []
    for k in range(nb):
        a, b = int(bounds[k]), int(bounds[k + 1])
        t0 = max(b0 + k * iv, lo_ns) / NS
        t1 = min(b0 + (k + 1) * iv, hi_ns) / NS
        out.append(tr.update(pk.take(np.arange(a, b)), t0, t1, port_names, drops))
    return out


def burst_list(pk: Packets, burst_gap: float) -> list[tuple[str, float, float, int, int]]:
    """Every burst of every flow in a capture: (entity, start s, end s, bytes, packets)."""
    tr = FlowTracker(burst_gap, flow_timeout=math.inf)
    idx = np.flatnonzero((pk.ipver > 0) & pk.decoded)
    if not len(idx):
        return []
    keys = flow_key_columns(pk, idx)
    vk = np.ascontiguousarray(keys).view(np.dtype((np.void, 40))).ravel()
    _, first_i, inv = np.unique(vk, return_index=True, return_inverse=True)
    inv = inv.ravel()
    order = np.argsort(inv, kind="stable")
    g = inv[order]
    ts = pk.ts_ns[idx[order]]
    wl = pk.wirelen[idx[order]]
    first = np.r_[True, g[1:] != g[:-1]]
    start = first | (np.r_[0, np.diff(ts)] >= tr.burst_gap_ns)
    ss = np.flatnonzero(start)
    se = np.r_[ss[1:], len(ts)] - 1
    byt = np.add.reduceat(wl, ss)
    ents = [entity_of(keys[first_i[k]]) for k in range(len(first_i))]
    return [(ents[g[a]], ts[a] / NS, ts[e] / NS, int(bb), int(e - a + 1))
            for a, e, bb in zip(ss.tolist(), se.tolist(), byt.tolist())]
