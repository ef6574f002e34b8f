"""Signals of the rdma collector (per device port, entity ``mlx5_0/1``, scope rdma_port).

Wrap semantics: every counter is catalogued with ``wrap_bits=None`` (a decrease is a reset).
- IBA PortCounters (the error counters, and port_xmit_wait, 32-bit) *saturate* at their
  maximum instead of wrapping; a saturated counter stays flat and reads as zero rate.
- port_{xmit,rcv}_{data,packets} and the unicast/multicast counts come from
  PortCountersExtended (64-bit) on every device that advertises it (all mlx4/mlx5); they do
  not wrap in practice.
- mlx5 Q counters (out_of_buffer, out_of_sequence, duplicate_request, *_err, roce_adp_*,
  roce_slow_restart, req_*_retries_exceeded) are 32-bit firmware fields; whether they wrap or
  saturate at 2**32 is not documented in sources we could check, so we do not claim a wrap.
  The congestion counters (np_*, rp_*) are 64-bit.
- Counters drop to 0 when the driver reloads or someone clears them (perfquery -R): a reset.
"""
from __future__ import annotations

from skewd.model import SignalSpec, signal

from .parse import hw_signal

C = "rdma"


def _c(name: str, unit: str, desc: str) -> SignalSpec:
    return signal(name, "counter", unit, "rdma_port", desc, C)


def _g(name: str, unit: str, desc: str) -> SignalSpec:
    return signal(name, "gauge", unit, "rdma_port", desc, C)


_HW_DESC: dict[str, tuple[str, str]] = {
    "out_of_sequence": ("packets", "Out-of-sequence packets received (responder): loss or reordering in the fabric."),
    "packet_seq_err": ("events", "NAK sequence errors received by the requester: the responder saw a PSN gap."),
    "local_ack_timeout_err": ("events", "Requester ACK timeouts (transport retry): lost packets or a stuck peer."),
    "rnr_nak_retry_err": ("events",
        "RNR NAKs received: the responder had no receive buffer posted (credit starvation)."),
    "out_of_buffer": ("packets", "Packets dropped because no receive WQE was posted (receive queue starvation)."),
    "duplicate_request": ("packets", "Duplicate requests received: the peer retransmitted."),
    "implied_nak_seq_err": ("events", "Implied NAK sequence errors (READ/ATOMIC responses out of order)."),
    "np_ecn_marked_roce_packets": ("packets",
        "RoCE packets received with ECN CE marks (notification point): fabric congestion."),
    "np_cnp_sent": ("packets", "Congestion notification packets sent by this notification point."),
    "rp_cnp_handled": ("packets", "CNPs handled by this reaction point, i.e. times DCQCN slowed our sender."),
    "rp_cnp_ignored": ("packets", "CNPs received and ignored by this reaction point."),
    "roce_adp_retrans": ("events", "Adaptive retransmissions of RoCE traffic."),
    "roce_adp_retrans_to": ("events", "Adaptive-retransmission timeouts of RoCE traffic."),
    "roce_slow_restart": ("events", "Times RoCE slow restart was used after a retransmission timeout."),
    "req_transport_retries_exceeded": ("events", "QPs that exhausted transport retries (connection broken)."),
    "req_rnr_retries_exceeded": ("events", "QPs that exhausted RNR retries (receiver never posted buffers)."),
}

CATALOGUE: list[SignalSpec] = [
    _c("rdma_port_xmit_bytes_total", "bytes", "Bytes sent by the port (counters/port_xmit_data x 4)."),
    _c("rdma_port_rcv_bytes_total", "bytes", "Bytes received by the port (counters/port_rcv_data x 4)."),
    _c("rdma_port_xmit_packets_total", "packets", "Packets sent (port_xmit_packets)."),
    _c("rdma_port_rcv_packets_total", "packets", "Packets received (port_rcv_packets)."),
    _c("rdma_port_unicast_xmit_packets_total", "packets", "Unicast packets sent."),
    _c("rdma_port_unicast_rcv_packets_total", "packets", "Unicast packets received."),
    _c("rdma_port_multicast_xmit_packets_total", "packets", "Multicast packets sent."),
    _c("rdma_port_multicast_rcv_packets_total", "packets", "Multicast packets received."),
    _c("rdma_port_xmit_wait_total", "ticks",
       "Ticks during which the port had data to send but no credit/pause let it (port_xmit_wait): "
       "back-pressure from the fabric. 32-bit and saturating."),
    _c("rdma_port_xmit_discards_total", "packets",
       "Outbound packets discarded, e.g. port down or congestion (port_xmit_discards)."),
    _c("rdma_port_rcv_errors_total", "packets", "Received packets with errors (port_rcv_errors)."),
    _c("rdma_port_rcv_remote_physical_errors_total", "packets",
       "Received packets marked bad by an upstream hop (EBP)."),
    _c("rdma_port_rcv_switch_relay_errors_total", "packets", "Packets the switch could not relay (switch ports only)."),
    _c("rdma_port_xmit_constraint_errors_total", "packets", "Outbound packets dropped by partition/raw constraints."),
    _c("rdma_port_rcv_constraint_errors_total", "packets", "Inbound packets dropped by partition/raw constraints."),
    _c("rdma_port_symbol_error_total", "events", "Minor link errors on any lane (symbol_error): bad cable or optic."),
    _c("rdma_port_link_downed_total", "events",
       "Times the link went down after training failed to recover (link_downed)."),
    _c("rdma_port_link_error_recovery_total", "events",
       "Successful link error recoveries (link_error_recovery): flapping link."),
    _c("rdma_port_local_link_integrity_errors_total", "events",
       "Local physical errors beyond threshold (local_link_integrity_errors)."),
    _c("rdma_port_excessive_buffer_overrun_errors_total", "events",
       "Consecutive receive buffer overruns (excessive_buffer_overrun_errors): lossless flow control broken."),
    _c("rdma_port_vl15_dropped_total", "packets", "Subnet management (VL15) packets dropped."),
] + [_c(hw_signal(n), unit, f"{desc} (mlx5 hw_counters/{n})") for n, (unit, desc) in _HW_DESC.items()] + [
    _g("rdma_port_state", "state",
       "Logical port state (ports/<p>/state): 1 down, 2 init, 3 armed, 4 active, 5 active_defer."),
    _g("rdma_port_active", "bool", "1 when the logical port state is ACTIVE (4), else 0."),
    _g("rdma_port_phys_state", "state",
       "Physical port state: 1 sleep, 2 polling, 3 disabled, 4 training, 5 link up, 6 error recovery, 7 phy test."),
    _g("rdma_port_rate_bytes", "bytes/s",
       "Active link rate in bytes per second (ports/<p>/rate, e.g. '100 Gb/sec (4X EDR)')."),
    _g("rdma_port_link_layer", "enum", "Link layer: 1 InfiniBand, 2 Ethernet (RoCE), 0 unknown."),
    _g("rdma_dev_mrs", "regions",
       "Memory regions registered on the device right now (RDMA netlink resource tracking, "
       "'rdma resource show'); entity is the device name. Rapid changes mean registration churn "
       "(PCIE-9): buffers registered and deregistered around transfers."),
    _g("rdma_dev_qps", "queue pairs", "Queue pairs on the device right now (RDMA netlink resource tracking)."),
]
