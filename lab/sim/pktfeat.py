"""What the ``pkt`` collector reports for simulated traffic.

Two paths, both following the definitions of ``collectors/pkt/tracker.py`` and ``retransmits.py`` (gap = time
between consecutive packets of a flow, measured against the flow's previous packet across
intervals; burst = run of packets with gaps below ``burst_gap``; jitter = stddev/mean of the
interval's gaps; quantiles by linear interpolation):

- **explicit packets** (:class:`FlowTable.update`) for the front-end TCP traffic: the simulator
  generates every request segment, token (SSE) packet and ACK with its timestamp, and the
  features are computed from those packets exactly.
- **burst classes** (:func:`roce_flow_features`) for RoCE collective traffic, which runs at
  10^5-10^6 packets/s per port: each flow's gaps are described as counts of three kinds (packet
  spacing inside a layer's all-reduce, the compute gap between layers, the idle gap between
  decode steps), and quantiles/moments are taken over that weighted multiset.

Per-port aggregates (flows, byte share, Gini, ingress gaps, aggregate bursts) are computed
from the per-flow results the same way the collector does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


NS = 1_000_000_000
#: flow signals a flow without packets in the interval still reports (collectors/pkt/samples.py)
IDLE_SIGNALS = frozenset({"pkt_flow_packets_total", "pkt_flow_bytes_total", "pkt_flow_packets_per_second",
                          "pkt_flow_bytes_per_second", "pkt_flow_idle_seconds", "pkt_flow_start_seconds",
                          "pkt_flow_end_seconds", "pkt_flow_closed"})
BURST_GAP = 0.001  # the pkt collector's default burst_gap
FLOW_TIMEOUT = 60.0


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """Quantiles (numpy 'linear') of the multiset where ``values[i]`` occurs ``weights[i]`` times."""
    w = np.asarray(weights, dtype=np.int64)
    keep = w > 0
    v = np.asarray(values, dtype=float)[keep]
    w = w[keep]
    if not len(v):
        return [math.nan for _ in qs]
    o = np.argsort(v, kind="stable")
    v, w = v[o], w[o]
    cum = np.cumsum(w)
    n = int(cum[-1])
    out = []
    for q in qs:
        pos = q * (n - 1)
        lo = int(math.floor(pos))
        hi = min(lo + 1, n - 1)
        a = v[np.searchsorted(cum, lo + 1)]
        b = v[np.searchsorted(cum, hi + 1)]
        out.append(float(a + (b - a) * (pos - lo)))
    return out


@dataclass
class PortAgg:
    """Per capture port state kept across intervals (cumulative counters, aggregate burst)."""

    name: str
    packets: int = 0
    bytes: int = 0
    other: int = 0
    rtx: int = 0
    bursts: int = 0
    last_ns: int = -1
    last_in_ns: int = -1
    b_start: float = math.nan
    b_bytes: float = math.nan
    b_gap: float = math.nan


@dataclass
class FlowTable:
    """Explicit-packet flows of one node (front-end TCP). Flow index → name/direction/port."""

    names: list[str] = field(default_factory=list)
    egress: list[bool] = field(default_factory=list)
    port: list[int] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cap = 0
        self.s: dict[str, np.ndarray] = {}
        self._grow(256)

    _INT = ("last", "first", "packets", "bytes", "bursts", "rtx", "ecn", "b_start", "b_last", "b_bytes", "closed")

    def _grow(self, need: int) -> None:
        if need <= self.cap:
            return
        new = max(need, 2 * self.cap)
        for c in self._INT:
            arr = np.full(new, -1 if c in ("last", "first", "b_start", "b_last") else 0, np.int64)
            if c in self.s:
                arr[: self.cap] = self.s[c]
            self.s[c] = arr
        g = np.full(new, np.nan)
        if "b_gap" in self.s:
            g[: self.cap] = self.s["b_gap"]
        self.s["b_gap"] = g
        self.cap = new

    def flow(self, name: str, egress: bool, port: int) -> int:
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.names)
            self.names.append(name)
            self.egress.append(egress)
            self.port.append(port)
            self._grow(len(self.names))
        return i

    def reopen(self, idx: np.ndarray) -> None:
        """A closed connection's 5-tuple seen again after its timeout: a new flow (counters restart)."""
        for c in self._INT:
            self.s[c][idx] = -1 if c in ("last", "first", "b_start", "b_last") else 0
        self.s["b_gap"][idx] = np.nan

    def update(self, flow: np.ndarray, ts_ns: np.ndarray, wl: np.ndarray, rtx: np.ndarray, fin: np.ndarray,
               t0: float, t1: float) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """Features of the interval. Returns (flow indices reported, columns, newly closed mask)."""
        st = self.s
        dur = t1 - t0
        t1_ns = int(round(t1 * NS))
        o = np.lexsort((ts_ns, flow))
        flow, ts, wl, rtx, fin = flow[o], ts_ns[o], wl[o], rtx[o], fin[o]
        first = np.r_[True, flow[1:] != flow[:-1]] if len(flow) else np.zeros(0, bool)
        gs = np.flatnonzero(first)
        gi = np.cumsum(first) - 1
        F = len(gs)
        fl = flow[gs] if F else np.zeros(0, np.int64)
        prev = np.empty_like(ts)
        if F:
            prev[1:] = ts[:-1]
            prev[gs] = st["last"][fl]
        has_prev = prev >= 0
        gap = np.where(has_prev, ts - prev, 0)
        cnt = np.diff(np.r_[gs, len(ts)]) if F else np.zeros(0, np.int64)
        byt = np.add.reduceat(wl, gs) if F else np.zeros(0, np.int64)
        p50 = np.full(F, np.nan)
        p99 = np.full(F, np.nan)
        gmax = np.full(F, np.nan)
        p05 = np.full(F, np.nan)
        cov = np.full(F, np.nan)
        gsel = np.flatnonzero(has_prev)
        if len(gsel):
            ggi = gi[gsel]
            gv = gap[gsel]
            key = np.lexsort((gv, ggi))
            ggi, gv = ggi[key], gv[key]
            c = np.bincount(ggi, minlength=F)
            start = np.cumsum(c) - c
            has = c > 0
            for arr, q in ((p05, 0.05), (p50, 0.5), (p99, 0.99)):
                pos = start[has] + q * (c[has] - 1)
                lo = np.floor(pos).astype(np.int64)
                hi = np.minimum(lo + 1, start[has] + c[has] - 1)
                arr[has] = (gv[lo] + (gv[hi] - gv[lo]) * (pos - lo)) / NS
            gend = start + c - 1  # sorted by (flow, gap): a flow's largest gap is its last
            gmax = np.where(has, gv[np.maximum(gend, 0)] / NS, np.nan)
            s1 = np.bincount(ggi, weights=gv.astype(float), minlength=F)
            s2 = np.bincount(ggi, weights=gv.astype(float) ** 2, minlength=F)
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = s1 / c
                var = np.maximum(s2 / c - mean ** 2, 0.0)
                cov = np.where((c >= 2) & (mean > 0), np.sqrt(var) / mean, np.nan)
        # bursts: a new burst starts at a flow's first packet ever or after a gap >= burst_gap
        bstart = ~has_prev | (gap >= int(BURST_GAP * NS))
        seg = first | bstart
        sgs = np.flatnonzero(seg)
        sgi = gi[sgs] if len(sgs) else np.zeros(0, np.int64)
        s_bytes = np.add.reduceat(wl, sgs) if len(sgs) else np.zeros(0, np.int64)
        s_cont = ~bstart[sgs] if len(sgs) else np.zeros(0, bool)
        s_flow = fl[sgi] if len(sgs) else np.zeros(0, np.int64)
        s_bytes = s_bytes + np.where(s_cont, st["b_bytes"][s_flow], 0)
        s_start = np.where(s_cont, st["b_start"][s_flow], ts[sgs] if len(sgs) else 0)
        s_gap = np.where(s_cont, st["b_gap"][s_flow], np.where(has_prev[sgs], gap[sgs] / NS, np.nan)) if len(sgs) else np.zeros(0)
        s_last = np.r_[sgs[1:], len(ts)] - 1 if len(sgs) else np.zeros(0, np.int64)
        nb = np.bincount(sgi, weights=(~s_cont).astype(float), minlength=F).astype(np.int64) if len(sgs) else np.zeros(F, np.int64)
        bmax = np.zeros(F)
        if len(sgs):
            gf = np.flatnonzero(np.concatenate(([True], np.diff(sgi) != 0)))  # first segment of each flow
            bmax[sgi[gf]] = np.maximum.reduceat(s_bytes.astype(float), gf)
            gl = np.concatenate((gf[1:] - 1, [len(sgi) - 1]))  # last segment of each flow
        rtx_g = np.bincount(gi, weights=rtx.astype(float), minlength=F).astype(np.int64) if F else np.zeros(0, np.int64)
        fin_g = np.bincount(gi, weights=fin.astype(float), minlength=F) > 0 if F else np.zeros(0, bool)
        was_closed = st["closed"][fl].astype(bool) if F else np.zeros(0, bool)
        if F:
            st["first"][fl] = np.where(st["first"][fl] < 0, ts[gs], st["first"][fl])
            st["last"][fl] = ts[np.r_[gs[1:], len(ts)] - 1]
            st["packets"][fl] += cnt
            st["bytes"][fl] += byt
            st["bursts"][fl] += nb
            st["rtx"][fl] += rtx_g
            st["closed"][fl] |= fin_g.astype(np.int64)
            st["b_start"][fl] = s_start[gl]
            st["b_last"][fl] = ts[s_last[gl]]
            st["b_bytes"][fl] = s_bytes[gl]
            st["b_gap"][fl] = s_gap[gl]
        live = np.flatnonzero((st["last"][: len(self.names)] >= 0)
                              & (st["last"][: len(self.names)] >= t1_ns - int(FLOW_TIMEOUT * NS)))
        idle = np.setdiff1d(live, fl)
        rows = np.concatenate((fl, idle)).astype(np.int64)
        Fi = len(idle)
        z = np.zeros(Fi)
        nan = np.full(Fi, np.nan)
        cols: dict[str, np.ndarray] = {}
        cols["packets"] = np.r_[cnt.astype(float), z]
        cols["bytes"] = np.r_[byt.astype(float), z]
        cols["pkt_flow_packets_per_second"] = cols["packets"] / dur
        cols["pkt_flow_bytes_per_second"] = cols["bytes"] / dur
        cols["pkt_flow_gap_p50_seconds"] = np.r_[p50, nan]
        cols["pkt_flow_gap_p99_seconds"] = np.r_[p99, nan]
        cols["pkt_flow_gap_max_seconds"] = np.r_[gmax, nan]
        cols["pkt_flow_gap_p05_seconds"] = np.r_[p05, nan]
        cols["pkt_flow_jitter_cov"] = np.r_[cov, nan]
        cols["pkt_flow_burst_bytes_max"] = np.r_[np.where(cnt > 0, bmax, np.nan), nan]
        bs = st["b_start"][rows]
        cols["pkt_flow_bursts_total"] = st["bursts"][rows].astype(float)
        cols["pkt_flow_burst_start_seconds"] = np.where(bs >= 0, bs / NS, np.nan)
        cols["pkt_flow_burst_bytes"] = np.where(bs >= 0, st["b_bytes"][rows], np.nan)
        cols["pkt_flow_burst_duration_seconds"] = np.where(bs >= 0, (st["b_last"][rows] - bs) / NS, np.nan)
        cols["pkt_flow_inter_burst_gap_seconds"] = st["b_gap"][rows].copy()
        cols["pkt_flow_packets_total"] = st["packets"][rows].astype(float)
        cols["pkt_flow_bytes_total"] = st["bytes"][rows].astype(float)
        cols["pkt_flow_tcp_retransmits_total"] = st["rtx"][rows].astype(float)
        # the simulator's resends are the faults' losses: no receiver D-SACKs one
        cols["pkt_flow_tcp_spurious_retransmits_total"] = np.zeros(len(rows))
        cols["pkt_flow_ecn_ce_packets_total"] = st["ecn"][rows].astype(float)
        cols["pkt_flow_start_seconds"] = st["first"][rows] / NS
        cols["pkt_flow_end_seconds"] = st["last"][rows] / NS
        cols["pkt_flow_idle_seconds"] = np.maximum(t1 - st["last"][rows] / NS, 0.0)
        cols["pkt_flow_closed"] = st["closed"][rows].astype(float)
        cols["pkt_flow_egress"] = np.r_[np.array([1.0 if self.egress[i] else 0.0 for i in fl]), nan]
        cols["rtx"] = np.r_[rtx_g.astype(float), z]
        # a flow without packets in the interval reports only that it is silent (as the pkt
        # collector's samples.to_batch does): rates 0, idle time, totals, start/end, closed
        for k in cols:
            if k.startswith("pkt_") and k not in IDLE_SIGNALS:
                cols[k][F:] = np.nan
        newly_closed = np.concatenate((fin_g & ~was_closed, np.zeros(Fi, bool)))
        # report flows in a stable order (by first appearance), as a tick-to-tick consumer likes
        o = np.argsort(rows, kind="stable")
        return rows[o], {k: v[o] for k, v in cols.items()}, newly_closed[o]


def port_features(agg: PortAgg, ts_ns: np.ndarray, wl: np.ndarray, ingress: np.ndarray, flow_bytes: np.ndarray,
                  rtx: int, end_times_closed: np.ndarray, t0: float, t1: float) -> dict[str, float]:
    """Per-port aggregates of one interval from the port's packets (explicit-packet path)."""
    dur = t1 - t0
    o = np.argsort(ts_ns, kind="stable")
    ts, wl, ingress = ts_ns[o], wl[o], ingress[o]
    agg.packets += len(ts)
    agg.bytes += int(wl.sum())
    agg.rtx += rtx
    out: dict[str, float] = {"pkt_packets_total": agg.packets, "pkt_bytes_total": agg.bytes,
                             "pkt_other_packets_total": agg.other, "pkt_kernel_drops_total": 0.0,
                             "pkt_tcp_retransmits_total": agg.rtx}
    b = flow_bytes[flow_bytes > 0]
    out["pkt_flows"] = float(len(b))
    if len(b):
        out["pkt_flow_bytes_share_max_ratio"] = float(b.max() / b.sum())
        sb = np.sort(b)
        k = np.arange(1, len(sb) + 1)
        out["pkt_flow_bytes_gini_ratio"] = float(2 * (k * sb).sum() / (len(sb) * sb.sum()) - (len(sb) + 1) / len(sb))
    tin = ts[ingress]
    out["pkt_ingress_packets_per_second"] = len(tin) / dur
    out["pkt_ingress_bytes_per_second"] = float(wl[ingress].sum()) / dur
    g = np.diff(np.r_[[agg.last_in_ns] if agg.last_in_ns >= 0 else [], tin].astype(np.int64))
    if len(g):
        out["pkt_ingress_gap_p99_seconds"] = float(np.quantile(g, 0.99)) / NS
        out["pkt_ingress_gap_max_seconds"] = float(g.max()) / NS
    if len(tin):
        agg.last_in_ns = int(tin[-1])
    _aggregate_bursts(agg, ts, wl)
    out.update(_burst_out(agg))
    if len(end_times_closed) >= 2:
        out["pkt_flow_end_spread_seconds"] = float(end_times_closed.max() - end_times_closed.min())
    return out


def _aggregate_bursts(agg: PortAgg, ts: np.ndarray, wl: np.ndarray) -> None:
    if not len(ts):
        return
    prev = np.r_[agg.last_ns, ts[:-1]]
    gap = ts - prev
    start = (prev < 0) | (gap >= int(BURST_GAP * NS))
    idx = np.flatnonzero(start)
    agg.bursts += len(idx)
    if len(idx):
        k = idx[-1]
        agg.b_start = ts[k] / NS
        agg.b_bytes = float(wl[k:].sum())
        agg.b_gap = gap[k] / NS if prev[k] >= 0 else math.nan
    else:
        agg.b_bytes = (0.0 if math.isnan(agg.b_bytes) else agg.b_bytes) + float(wl.sum())
    agg.last_ns = int(ts[-1])


def _burst_out(agg: PortAgg) -> dict[str, float]:
    out = {"pkt_bursts_total": float(agg.bursts)}
    if not math.isnan(agg.b_start):
        out["pkt_burst_start_seconds"] = agg.b_start
        out["pkt_burst_bytes"] = agg.b_bytes
    if not math.isnan(agg.b_gap):
        out["pkt_inter_burst_gap_seconds"] = agg.b_gap
    return out


# ------------------------------------------------------------------------------------------------
# RoCE collective flows (burst classes)
# ------------------------------------------------------------------------------------------------

ROCE_FRAME = 4096 + 58  # payload + Eth/IP/UDP/BTH/ICRC


@dataclass
class RoceFlowState:
    packets: float = 0.0
    bytes: float = 0.0
    bursts: float = 0.0
    rtx: float = 0.0
    ecn: float = 0.0
    first: float = math.nan
    last: float = math.nan
    b_start: float = math.nan
    b_bytes: float = math.nan
    b_dur: float = math.nan
    b_gap: float = math.nan


def roce_flow_features(st: RoceFlowState, starts: np.ndarray, durs: np.ndarray, nbytes: np.ndarray, layers: int,
                       line_rate: float, rtx: float, ecn: float, t0: float, t1: float,
                       rng: np.random.Generator) -> dict[str, float]:
    """Features of one RoCE flow over an interval in which it sent one burst per entry of
    ``starts`` (each ``durs`` long, ``nbytes`` bytes, split into ``layers`` all-reduce pieces
    separated by compute). ``rtx`` retransmitted and ``ecn`` CE-marked packets are added."""
    dur = t1 - t0
    out: dict[str, float] = {}
    keep = nbytes > 0
    starts, durs, nbytes = starts[keep], durs[keep], nbytes[keep]
    n = len(starts)
    pk = np.ceil(nbytes / ROCE_FRAME)
    rtx = float(rtx)
    tot_pk = float(pk.sum()) + rtx
    tot_b = float(nbytes.sum()) + rtx * ROCE_FRAME
    if n:
        pieces = np.maximum(1, np.minimum(layers, pk)).astype(np.int64)
        small_n = np.maximum(pk - pieces, 0)
        g_small = ROCE_FRAME / line_rate
        g_layer = np.maximum(durs / pieces - g_small * (pk / pieces), g_small)
        # gap before each burst: from the previous burst's end (or the flow's last packet)
        prev_end = np.r_[st.last if not math.isnan(st.last) else np.nan, (starts + durs)[:-1]]
        g_inter = starts - prev_end
        vals = [np.full(1, g_small), g_layer * np.exp(0.1 * rng.standard_normal(n)), g_inter[~np.isnan(g_inter)]]
        wts = [np.array([small_n.sum() + rtx]), pieces - 1, np.ones(int((~np.isnan(g_inter)).sum()))]
        v = np.concatenate(vals)
        w = np.concatenate(wts).astype(np.int64)
        p05, p50, p99 = weighted_quantiles(v, w, (0.05, 0.5, 0.99))
        out["pkt_flow_gap_p05_seconds"] = p05
        out["pkt_flow_gap_p50_seconds"] = p50
        out["pkt_flow_gap_p99_seconds"] = p99
        vv, ww = v[w > 0], w[w > 0]
        if len(vv):
            out["pkt_flow_gap_max_seconds"] = float(vv.max())
            cnt = ww.sum()
            mean = float((vv * ww).sum() / cnt)
            var = max(float((vv * vv * ww).sum() / cnt) - mean * mean, 0.0)
            if cnt >= 2 and mean > 0:
                out["pkt_flow_jitter_cov"] = math.sqrt(var) / mean
        # bursts: an inter gap below burst_gap merges a step's burst into the previous one
        new = np.isnan(g_inter) | (g_inter >= BURST_GAP)
        bid = np.cumsum(new) - 1
        if not new[0] and not math.isnan(st.b_start):
            b_start0, b_bytes0 = st.b_start, st.b_bytes
        else:
            b_start0, b_bytes0 = None, 0.0
        nb_bytes = np.bincount(np.maximum(bid, 0), weights=nbytes, minlength=max(1, bid.max() + 1)) if len(bid) else np.zeros(1)
        if not new[0]:
            nb_bytes = nb_bytes.copy()
            nb_bytes[0] += b_bytes0 if b_start0 is not None else 0.0
        st.bursts += float(new.sum())
        last_new = np.flatnonzero(new)
        if len(last_new):
            k = last_new[-1]
            st.b_start = float(starts[k])
            st.b_gap = float(g_inter[k]) if not np.isnan(g_inter[k]) else math.nan
        st.b_bytes = float(nb_bytes[-1])
        st.b_dur = float(starts[-1] + durs[-1] - st.b_start)
        out["pkt_flow_burst_bytes_max"] = float(nb_bytes.max())
        if math.isnan(st.first):
            st.first = float(starts[0])
        st.last = float(starts[-1] + durs[-1])
    st.packets += tot_pk
    st.bytes += tot_b
    st.rtx += rtx
    st.ecn += ecn
    out["pkt_flow_packets_per_second"] = tot_pk / dur
    out["pkt_flow_bytes_per_second"] = tot_b / dur
    out["pkt_flow_packets_total"] = st.packets
    out["pkt_flow_bytes_total"] = st.bytes
    out["pkt_flow_bursts_total"] = st.bursts
    out["pkt_flow_roce_retransmits_total"] = st.rtx
    out["pkt_flow_ecn_ce_packets_total"] = st.ecn
    if not math.isnan(st.b_start):
        out["pkt_flow_burst_start_seconds"] = st.b_start
        out["pkt_flow_burst_bytes"] = st.b_bytes
        out["pkt_flow_burst_duration_seconds"] = st.b_dur
    if not math.isnan(st.b_gap):
        out["pkt_flow_inter_burst_gap_seconds"] = st.b_gap
    if not math.isnan(st.first):
        out["pkt_flow_start_seconds"] = st.first
        out["pkt_flow_end_seconds"] = st.last
        out["pkt_flow_idle_seconds"] = max(t1 - st.last, 0.0)
    if not n and not rtx:  # silent this interval: only what an idle flow reports
        out = {k: v for k, v in out.items() if k in IDLE_SIGNALS}
    out["_bytes"] = tot_b
    out["_packets"] = tot_pk
    return out
