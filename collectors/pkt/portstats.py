"""Per-capture-port aggregates of the flow tracker: totals, flow share and Gini, ingress rate
and gaps, port-wide bursts, the end spread of closing flows and collective silences.

Why apart from :mod:`.tracker`: a port's figures are computed over all its packets in capture
order (not flow by flow) and carry their own small state per port (:class:`PortState`), so they
read separately from the per-flow reductions. A mixin because the tracker's ``update`` hands it
the flow columns it has just built.
"""
from __future__ import annotations

import math

import numpy as np

from .collective import CollectiveTracker
from .frames import DIR_IN
from .intervals import NS, PortFeatures
from .parse import Packets


class PortState:
    """Cumulative figures of one capture port across intervals (owned by the tracker)."""

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


class PortAggregation:
    """Builds each interval's :class:`~.intervals.PortFeatures` for :class:`~.tracker.FlowTracker`
    (its base class), from the tracker's ``ports``, ``collective`` and ``burst_gap_ns``."""

    ports: dict[int, PortState]
    collective: CollectiveTracker
    burst_gap_ns: int

    def _ports(self, pk: Packets, ipm: np.ndarray, conn: np.ndarray, t0: float, t1: float, port_all: np.ndarray,
               cols: dict[str, np.ndarray], newly_closed: np.ndarray, names: list[str],
               drops: dict[int, int], rtx_g: np.ndarray, port_g: np.ndarray) -> list[PortFeatures]:
        """``ipm``: which packets are IP (decoded); ``conn``: :func:`.collective.connection_hash`
        of each packet (read only where ``ipm``)."""
        dur = t1 - t0
        out = []
        ifs = [int(pk.iface[0])] if len(pk) and pk.iface.min() == pk.iface.max() else np.unique(pk.iface).tolist()
        ids = set(ifs) | set(self.ports) | set(drops)
        for p in sorted(ids):
            ps = self.ports.setdefault(p, PortState())
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
                f.silences = self.collective.update(p, ts[ip_sel], dirs[ip_sel], pk.payload[sel][ip_sel],
                                                    conn[sel][ip_sel], pk.bth_opcode[sel][ip_sel], dur)
            f.bursts_total = ps.bursts
            if ps.b_start >= 0:
                f.burst_start, f.burst_bytes, f.inter_burst_gap = ps.b_start / NS, float(ps.b_bytes), ps.b_gap
            ends = cols["end_seconds"][mine & newly_closed]
            if len(ends) >= 2:
                f.end_spread = float(ends.max() - ends.min())
            out.append(f)
        return out
