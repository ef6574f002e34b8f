"""Per-flow, per-interval timing features from decoded packets: the flow tracker.

One :class:`FlowTracker` serves both paths: the live collector feeds it the packets captured
since the previous collect, the offline reader (:func:`.features.analyze`) feeds it one
``--interval`` bucket at a time. Because the tracker carries a little state per flow (last
packet time, the open burst, TCP sequence and RoCE PSN high-water marks), a gap, burst or
retransmission that spans two intervals is measured the same way wherever the interval boundary
falls, and live and offline give the same features for the same packets.

All arithmetic is vectorised over the packets of an interval: packets are grouped by flow
(:func:`.flowkey.group_flows`, one sort) and every statistic is a segmented numpy reduction
(:mod:`.segmented`). The tracker owns the flow slots and the per-flow state columns and builds
the flow rows; retransmissions (:mod:`.retransmits`) and per-port aggregates
(:mod:`.portstats`) are mixins over the same state.

Definitions (also in README.md; retransmissions in :mod:`.retransmits`):
- gap: time between consecutive packets of the same flow; the first packet of an interval is
  measured against the flow's previous packet, so a stall spanning intervals is not lost.
- jitter: coefficient of variation (stddev / mean) of the gaps in the interval.
- burst: maximal run of packets whose gaps are all below ``burst_gap``.
- Packets are taken in capture order (as tshark does); a clock stepping back reads as a 0 gap.
"""
from __future__ import annotations

import math

import numpy as np

from .collective import CollectiveTracker, connection_hash
from .flowkey import entity_of, flow_key_columns, group_flows
from .frames import DIR_IN, DIR_OUT
from .intervals import FLOW_COLUMNS, NS, IntervalFeatures
from .parse import Packets
from .portstats import PortAggregation, PortState
from .retransmits import ROCE_NO_PSN, RetransmitAnalysis
from .segmented import NONE, group_quantiles


class FlowTracker(RetransmitAnalysis, PortAggregation):
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
        self.ports: dict[int, PortState] = {}
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
        self.s["seq_max"][slots] = NONE
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
        p05, p50, p99 = group_quantiles(gi, gap, gs, ng, (0.05, 0.5, 0.99), lim)
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
            keep = ~np.isin(ops[rsel], ROCE_NO_PSN)
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
        # the collective silences key packets by connection: a flow's fields are its packets', so
        # hash once per flow (not per packet); only IP packets (the flows' rows) are read
        conn = np.zeros(len(pk), np.uint64)
        if F:
            fr = rows[gs]
            conn[rows] = connection_hash(pk.src_hi[fr], pk.src_lo[fr], pk.dst_hi[fr], pk.dst_lo[fr],
                                         pk.sport[fr], pk.dport[fr], pk.proto[fr])[gi]
        feats.ports = self._ports(pk, ipm, conn, t0, t1, port_all, cols, newly_closed, port_names or [],
                                  drops or {}, rtx_g, port_g)
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
        feats.ports = self._ports(pk, e_b, np.zeros(0, np.uint64), t0, t1, e_i, cols, e_b, port_names or [],
                                  drops or {}, e_i, e_i)
        return feats
