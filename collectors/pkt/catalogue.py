"""Signals of the pkt collector: per-flow packet timing (scope flow) and per-capture-port
aggregates (scope nic_port, entity = the captured interface, or the file name offline).

Flow entities are the direction-aware 5-tuple: ``udp 10.0.0.1:5000>10.0.0.2:4791``,
``tcp [fd00::1]:443>[fd00::2]:50000``, ``icmp 10.0.0.1>10.0.0.2`` (no ports).
Per-interval gauges describe the packets seen since the previous collect (live) or within
one ``--interval`` bucket (offline); absolute times are Unix seconds so the controller can
align bursts across nodes (EW-1).
"""
from __future__ import annotations

from skewd.model import SignalSpec, signal

C = "pkt"


def _f(name: str, kind: str, unit: str, desc: str) -> SignalSpec:
    return signal(name, kind, unit, "flow", desc, C)


def _p(name: str, kind: str, unit: str, desc: str) -> SignalSpec:
    return signal(name, kind, unit, "nic_port", desc, C)


CATALOGUE: list[SignalSpec] = [
    # -- per flow ----------------------------------------------------------------------------
    _f("pkt_flow_packets_total", "counter", "packets", "Packets of this flow since it was first seen."),
    _f("pkt_flow_bytes_total", "counter", "bytes", "Wire bytes (frame length) of this flow since it was first seen."),
    _f("pkt_flow_packets_per_second", "gauge", "packets/s",
       "Packet rate of the flow over the interval (NS-2 ingress rate vs peers)."),
    _f("pkt_flow_bytes_per_second", "gauge", "bytes/s", "Byte rate of the flow over the interval."),
    _f("pkt_flow_bytes_share_ratio", "gauge", "ratio",
       "This flow's share of all IP bytes on the port in the interval (NS-3 flow skew)."),
    _f("pkt_flow_gap_p50_seconds", "gauge", "seconds",
       "Median inter-arrival gap between consecutive packets of the flow (gaps ending in the interval)."),
    _f("pkt_flow_gap_p99_seconds", "gauge", "seconds",
       "99th percentile inter-arrival gap (NS-2 ingress starvation, NS-6 p99/p50 egress jitter)."),
    _f("pkt_flow_gap_max_seconds", "gauge", "seconds",
       "Longest inter-arrival gap in the interval, including the gap since the flow's previous packet "
       "(EW-5 head-of-line blocking: one flow stalls while others flow)."),
    _f("pkt_flow_gap_p05_seconds", "gauge", "seconds",
       "5th percentile inter-arrival gap (gaps ending in the interval). A paced token stream has at "
       "most one sub-millisecond gap a request (last token, end marker); packets held back by a "
       "send-path stall leave back to back and pull it down (NS-6 egress jitter)."),
    _f("pkt_flow_jitter_cov", "gauge", "1",
       "Jitter: coefficient of variation (stddev/mean) of the flow's inter-departure gaps in the interval "
       "(NS-6); needs at least two gaps."),
    _f("pkt_flow_bursts_total", "counter", "bursts",
       "Bursts started by this flow; a burst is a run of packets separated by idle gaps shorter than "
       "the burst_gap parameter."),
    _f("pkt_flow_burst_start_seconds", "gauge", "seconds",
       "Unix time of the start of the flow's most recent burst (one per collection)."),
    _f("pkt_flow_burst_bytes", "gauge", "bytes", "Wire bytes of the flow's most recent burst so far."),
    _f("pkt_flow_burst_duration_seconds", "gauge", "seconds",
       "First to last packet of the flow's most recent burst so far."),
    _f("pkt_flow_burst_bytes_max", "gauge", "bytes",
       "Largest burst of the flow with packets in the interval (EW-8 KV-transfer burst sizes)."),
    _f("pkt_flow_inter_burst_gap_seconds", "gauge", "seconds",
       "Idle gap that preceded the flow's most recent burst (EW-2 pipeline bubbles between hand-offs)."),
    _f("pkt_flow_tcp_retransmits_total", "counter", "packets",
       "TCP segments carrying data (or SYN/FIN) that start below the highest sequence number already "
       "seen in the flow: retransmissions (NS-4 ingress, NS-7 egress). Emitted for TCP flows."),
    _f("pkt_flow_tcp_spurious_retransmits_total", "counter", "packets",
       "Retransmissions of this flow (as counted in pkt_flow_tcp_retransmits_total) that the receiver "
       "reported as duplicates: a D-SACK block (RFC 2883) in the peer's ACKs, in the same or the next "
       "interval, covers their bytes - tail-loss probes answered by a D-SACK, fast retransmissions "
       "caused by reordering. Never above the retransmission count; the difference is the resends "
       "with no sign the original arrived (NS-4, NS-7, EW-6). Emitted for TCP flows, also in an "
       "interval where only the reverse flow's D-SACK raised it."),
    _f("pkt_flow_roce_retransmits_total", "counter", "packets",
       "RoCEv2 request packets whose PSN is not above the highest PSN already seen for the same "
       "destination QP in the flow (go-back-N retransmission). Emitted for RoCEv2 flows (UDP 4791)."),
    _f("pkt_flow_ecn_ce_packets_total", "counter", "packets",
       "Packets with ECN Congestion Experienced set in the IP header (fabric congestion)."),
    _f("pkt_flow_start_seconds", "gauge", "seconds", "Unix time of the flow's first packet."),
    _f("pkt_flow_end_seconds", "gauge", "seconds",
       "Unix time of the flow's latest packet (NS-8: response streams ending early vs their peers)."),
    _f("pkt_flow_idle_seconds", "gauge", "seconds",
       "Time from the flow's latest packet to the end of the interval; flows stay reported while "
       "idle up to flow_timeout, so a stalled flow shows up here (EW-5, NS-2)."),
    _f("pkt_flow_closed", "gauge", "bool", "1 once a TCP FIN or RST was seen in the flow, else 0."),
    _f("pkt_flow_egress", "gauge", "bool",
       "1 when the flow's packets were sent by this host, 0 when received; emitted only when the "
       "capture tells the direction (live AF_PACKET, Linux cooked captures)."),
    # -- per capture port ---------------------------------------------------------------------
    _p("pkt_packets_total", "counter", "packets", "Frames captured on the port (after the kernel filter)."),
    _p("pkt_bytes_total", "counter", "bytes", "Wire bytes of the captured frames."),
    _p("pkt_other_packets_total", "counter", "packets",
       "Captured frames not attributed to an IP flow: non-IP (ARP, LLDP...) or an unsupported link type."),
    _p("pkt_kernel_drops_total", "counter", "packets",
       "Packets the kernel dropped because the capture ring was full (PACKET_STATISTICS tp_drops), or "
       "the interface drops a pcapng file reports (isb_ifdrop): above 0 means timing features miss packets."),
    _p("pkt_flows", "gauge", "flows", "Flows with at least one packet in the interval."),
    _p("pkt_flow_bytes_share_max_ratio", "gauge", "ratio",
       "Largest single-flow share of the port's IP bytes in the interval (NS-3 flow skew)."),
    _p("pkt_flow_bytes_gini_ratio", "gauge", "ratio",
       "Gini coefficient of bytes per flow in the interval: 0 all flows equal, towards 1 few flows "
       "carry everything (NS-3)."),
    _p("pkt_ingress_packets_per_second", "gauge", "packets/s",
       "Received-packet rate on the port (NS-1/NS-2 vs peers); needs direction (live capture)."),
    _p("pkt_ingress_bytes_per_second", "gauge", "bytes/s", "Received wire bytes per second on the port."),
    _p("pkt_ingress_gap_p99_seconds", "gauge", "seconds",
       "99th percentile gap between consecutive received packets on the port, any flow (NS-2)."),
    _p("pkt_ingress_gap_max_seconds", "gauge", "seconds",
       "Longest gap between consecutive received packets on the port in the interval (NS-2)."),
    _p("pkt_bursts_total", "counter", "bursts",
       "Bursts of the port's aggregate IP traffic (idle gaps of at least burst_gap separate them)."),
    _p("pkt_burst_start_seconds", "gauge", "seconds",
       "Unix time the port's most recent aggregate burst started (one per collection: decode steps "
       "come every 20-60 ms, so step timing (EW-1) reads pkt_collective_silence_seconds)."),
    _p("pkt_burst_bytes", "gauge", "bytes", "Wire bytes of the port's most recent aggregate burst so far."),
    _p("pkt_inter_burst_gap_seconds", "gauge", "seconds",
       "Idle gap before the port's most recent aggregate burst (EW-2 pipeline bubble growth)."),
    _p("pkt_collective_silence_seconds", "gauge", "seconds",
       "A silence of the port's collective traffic: at least burst_gap without a payload byte sent or a "
       "data segment (>= 256 bytes) received on the port's collective connections (those carrying at "
       "least a tenth of the heaviest connection's payload, decayed over 10 s). One sample per silence, "
       "stamped with the packet that ended it (EW-1 straggler timing on the node's own clock, agent/steps.py)."),
    _p("pkt_collective_silence_by_send", "gauge", "bool",
       "1 when the node ended the silence by sending (it entered a collective: compute gap), 0 when a "
       "peer's data ended it (it was waiting); same stamps as pkt_collective_silence_seconds."),
    _p("pkt_collective_sent_bytes", "gauge", "bytes",
       "Payload bytes the node sent on its collective connections between the previous listed silence and "
       "this one; same stamps as pkt_collective_silence_seconds."),
    _p("pkt_collective_connections", "gauge", "connections",
       "Connections (both directions of a 5-tuple) currently counted as the port's collective traffic."),
    _p("pkt_collective_silences_unlisted_total", "counter", "silences",
       "Silences left out of pkt_collective_silence_* because a collection reached the listing cap."),
    _p("pkt_flow_end_spread_seconds", "gauge", "seconds",
       "Spread (max - min) of the end times of TCP flows that closed in the interval; "
       "needs two closing flows (NS-8 early completion skew)."),
    _p("pkt_tcp_retransmits_total", "counter", "packets", "TCP retransmissions on the port, all flows summed."),
]

NAMES = frozenset(s.name for s in CATALOGUE)
