"""Interval features → catalogued samples (pure)."""
from __future__ import annotations

import numpy as np

from skewd.model import SampleBatch

from .intervals import NS, IntervalFeatures

#: feature column → flow-scope signal
FLOW_SIGNALS = {
    "packets_total": "pkt_flow_packets_total",
    "bytes_total": "pkt_flow_bytes_total",
    "packets_per_second": "pkt_flow_packets_per_second",
    "bytes_per_second": "pkt_flow_bytes_per_second",
    "bytes_share_ratio": "pkt_flow_bytes_share_ratio",
    "gap_p50_seconds": "pkt_flow_gap_p50_seconds",
    "gap_p99_seconds": "pkt_flow_gap_p99_seconds",
    "gap_max_seconds": "pkt_flow_gap_max_seconds",
    "gap_p05_seconds": "pkt_flow_gap_p05_seconds",
    "jitter_cov": "pkt_flow_jitter_cov",
    "bursts_total": "pkt_flow_bursts_total",
    "burst_start_seconds": "pkt_flow_burst_start_seconds",
    "burst_bytes": "pkt_flow_burst_bytes",
    "burst_duration_seconds": "pkt_flow_burst_duration_seconds",
    "burst_bytes_max": "pkt_flow_burst_bytes_max",
    "inter_burst_gap_seconds": "pkt_flow_inter_burst_gap_seconds",
    "tcp_retransmits_total": "pkt_flow_tcp_retransmits_total",
    "tcp_spurious_retransmits_total": "pkt_flow_tcp_spurious_retransmits_total",
    "roce_retransmits_total": "pkt_flow_roce_retransmits_total",
    "ecn_ce_packets_total": "pkt_flow_ecn_ce_packets_total",
    "start_seconds": "pkt_flow_start_seconds",
    "end_seconds": "pkt_flow_end_seconds",
    "idle_seconds": "pkt_flow_idle_seconds",
    "closed": "pkt_flow_closed",
    "egress": "pkt_flow_egress",
}

#: PortFeatures attribute → nic_port-scope signal
PORT_SIGNALS = {
    "packets_total": "pkt_packets_total",
    "bytes_total": "pkt_bytes_total",
    "other_total": "pkt_other_packets_total",
    "kernel_drops_total": "pkt_kernel_drops_total",
    "flows": "pkt_flows",
    "share_max": "pkt_flow_bytes_share_max_ratio",
    "gini": "pkt_flow_bytes_gini_ratio",
    "ingress_pps": "pkt_ingress_packets_per_second",
    "ingress_bps": "pkt_ingress_bytes_per_second",
    "ingress_gap_p99": "pkt_ingress_gap_p99_seconds",
    "ingress_gap_max": "pkt_ingress_gap_max_seconds",
    "bursts_total": "pkt_bursts_total",
    "burst_start": "pkt_burst_start_seconds",
    "burst_bytes": "pkt_burst_bytes",
    "inter_burst_gap": "pkt_inter_burst_gap_seconds",
    "end_spread": "pkt_flow_end_spread_seconds",
    "tcp_retransmits_total": "pkt_tcp_retransmits_total",
}

#: one sample per silence of a port's collective traffic, stamped with the packet that ended it
#: (PortFeatures.silences): step timing on the node's own clock (EW-1, agent/steps.py)
SILENCE = "pkt_collective_silence_seconds"
SILENCE_BY_SEND = "pkt_collective_silence_by_send"
SILENCE_SENT = "pkt_collective_sent_bytes"


#: what a tracked flow without packets in the interval still reports (it is silent: its rate
#: is 0 and its idle time grows); its gap and burst values would only repeat stale numbers
IDLE_COLUMNS = frozenset({"packets_total", "bytes_total", "packets_per_second", "bytes_per_second",
                          "idle_seconds", "start_seconds", "end_seconds", "closed"})

#: counters that can rise while their flow is silent, with the interval column holding the rise:
#: emitted wherever they rose too (a D-SACK in the reverse flow marks a flow's retransmission of
#: the previous interval spurious; a rule subtracting it must not wait for the flow's next packet)
RISE_COLUMNS = {"tcp_spurious_retransmits_total": "tcp_spurious_retransmits"}


def to_batch(f: IntervalFeatures, node: str, t: float) -> SampleBatch:
    """Samples of one interval stamped ``t``; values that cannot be measured (NaN) are left out."""
    ents = np.empty(len(f.entities), dtype=object)
    ents[:] = f.entities
    active = f.flows["packets"] > 0 if len(f.entities) else np.zeros(0, bool)
    e_parts, s_parts, v_parts = [], [], []
    for col, sig in FLOW_SIGNALS.items() if len(f.entities) else ():  # no flows: nothing to select
        v = f.flows[col]
        ok = ~np.isnan(v)
        if col in RISE_COLUMNS:
            ok &= active | (f.flows[RISE_COLUMNS[col]] > 0)
        elif col not in IDLE_COLUMNS:
            ok &= active
        if not ok.any():
            continue
        k = int(ok.sum())
        e_parts.append(ents[ok])
        s = np.empty(k, dtype=object)
        s[:] = sig
        s_parts.append(s)
        v_parts.append(v[ok])
    for p in f.ports:
        for attr, sig in PORT_SIGNALS.items():
            v = getattr(p, attr)
            if v is None or v != v:
                continue
            e_parts.append(np.array([p.name], dtype=object))
            s_parts.append(np.array([sig], dtype=object))
            v_parts.append(np.array([float(v)]))
        if p.silences.connections or p.silences.unlisted_total:
            e_parts.append(np.array([p.name, p.name], dtype=object))
            s_parts.append(np.array(["pkt_collective_connections", "pkt_collective_silences_unlisted_total"],
                                    dtype=object))
            v_parts.append(np.array([float(p.silences.connections), float(p.silences.unlisted_total)]))
    t_parts = [np.full(sum(len(v) for v in v_parts), float(t))]
    for p in f.ports:
        sl = p.silences
        k = len(sl)
        if not k:
            continue
        st = sl.end_ns / NS
        t_parts += [st, st, st]
        e = np.empty(3 * k, dtype=object)
        e[:] = p.name
        e_parts.append(e)
        sg = np.empty(3 * k, dtype=object)
        sg[:k], sg[k:2 * k], sg[2 * k:] = SILENCE, SILENCE_BY_SEND, SILENCE_SENT
        s_parts.append(sg)
        v_parts.append(np.r_[sl.length_ns / NS, sl.by_send.astype(np.float64), sl.sent_bytes.astype(np.float64)])
    if not v_parts:
        return SampleBatch.empty()
    value = np.concatenate(v_parts)
    node_col = np.empty(len(value), dtype=object)
    node_col[:] = node
    return SampleBatch(np.concatenate(t_parts), node_col, np.concatenate(e_parts),
                       np.concatenate(s_parts), value)
