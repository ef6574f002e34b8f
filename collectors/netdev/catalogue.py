"""Signals of the netdev collector (per interface, scope nic_port)."""
from __future__ import annotations

from skewd.model import SignalSpec, signal

C = "netdev"


def _c(name: str, unit: str, desc: str) -> SignalSpec:
    return signal(name, "counter", unit, "nic_port", desc, C)


def _g(name: str, unit: str, desc: str) -> SignalSpec:
    return signal(name, "gauge", unit, "nic_port", desc, C)


# IFLA_STATS64 counters are 64-bit in the kernel: a decrease means the device was re-created.
CATALOGUE = [
    _c("netdev_rx_bytes_total", "bytes", "Bytes received by the interface (IFLA_STATS64 rx_bytes)."),
    _c("netdev_tx_bytes_total", "bytes", "Bytes transmitted by the interface (IFLA_STATS64 tx_bytes)."),
    _c("netdev_rx_packets_total", "packets", "Packets received (rx_packets)."),
    _c("netdev_tx_packets_total", "packets", "Packets transmitted (tx_packets)."),
    _c("netdev_rx_errors_total", "packets", "Receive errors of any kind (rx_errors)."),
    _c("netdev_tx_errors_total", "packets", "Transmit errors of any kind (tx_errors)."),
    _c("netdev_rx_dropped_total", "packets",
       "Received packets dropped by the stack or driver, e.g. no buffer or unknown protocol (rx_dropped)."),
    _c("netdev_tx_dropped_total", "packets", "Packets dropped on transmit by the driver (tx_dropped)."),
    _c("netdev_rx_missed_total", "packets",
       "Packets the NIC missed because its receive ring/FIFO was full (rx_missed_errors): host too slow to drain."),
    _c("netdev_rx_multicast_total", "packets", "Multicast packets received (multicast)."),
    _c("netdev_collisions_total", "events", "Collisions (half-duplex links only)."),
    _c("netdev_rx_length_errors_total", "packets", "Frames with a bad length (rx_length_errors)."),
    _c("netdev_rx_over_errors_total", "packets", "Receive ring buffer overflows (rx_over_errors)."),
    _c("netdev_rx_crc_errors_total", "packets", "Frames with a bad CRC (rx_crc_errors): cabling/optics."),
    _c("netdev_rx_frame_errors_total", "packets", "Frame alignment errors (rx_frame_errors)."),
    _c("netdev_rx_fifo_errors_total", "packets", "Receive FIFO overruns (rx_fifo_errors)."),
    _c("netdev_tx_aborted_errors_total", "packets", "Aborted transmissions (tx_aborted_errors)."),
    _c("netdev_tx_carrier_errors_total", "packets", "Transmit carrier errors (tx_carrier_errors)."),
    _c("netdev_tx_fifo_errors_total", "packets", "Transmit FIFO underruns (tx_fifo_errors)."),
    _c("netdev_tx_heartbeat_errors_total", "packets", "Heartbeat errors (tx_heartbeat_errors)."),
    _c("netdev_tx_window_errors_total", "packets", "Late collisions (tx_window_errors)."),
    _c("netdev_carrier_changes_total", "events",
       "Carrier up/down transitions (IFLA_CARRIER_CHANGES): link flaps."),
    _g("netdev_operstate", "state",
       "RFC 2863 operational state (IFLA_OPERSTATE): 0 unknown, 1 notpresent, 2 down, "
       "3 lowerlayerdown, 4 testing, 5 dormant, 6 up."),
    _g("netdev_up", "bool",
       "1 when the operational state is UP, else 0 (virtual devices that report UNKNOWN read 0)."),
    _g("netdev_link_speed_bytes", "bytes/s",
       "Negotiated link speed in bytes per second (sysfs speed in Mb/s x 125000); "
       "absent when the driver does not know it (-1) or the link is down."),
    _g("netdev_qdisc_backlog_bytes", "bytes",
       "Bytes queued in the interface's root egress qdisc right now (TCA_STATS_QUEUE backlog)."),
    _g("netdev_qdisc_qlen_packets", "packets",
       "Packets queued in the root egress qdisc right now (TCA_STATS_QUEUE qlen)."),
    _c("netdev_qdisc_drops_total", "packets",
       "Packets the root egress qdisc (or any child under it) dropped: queue full or policer."),
    _c("netdev_qdisc_overlimits_total", "events",
       "Times the root qdisc held a packet back because a shaper was over its rate (tbf/htb)."),
    _c("netdev_qdisc_requeues_total", "packets",
       "Packets put back in the qdisc because the driver's TX ring was busy."),
    _c("netdev_qdisc_sent_bytes_total", "bytes",
       "Bytes dequeued by the root egress qdisc towards the driver (TCA_STATS_BASIC)."),
    _c("netdev_qdisc_sent_packets_total", "packets",
       "Packets dequeued by the root egress qdisc towards the driver (TCA_STATS_BASIC)."),
    # Shaping and queue dynamics (collectors/netdev/README.md "Queues under lock-step traffic")
    _g("netdev_qdisc_rate_bytes", "bytes/s",
       "Shaping rate of the root egress qdisc (TCA_OPTIONS): tbf's rate, or the sum of the ceil of "
       "htb's top-level classes. Absent when the root qdisc does not shape (or is another shaper)."),
    _g("netdev_qdisc_backlog_max_bytes", "bytes",
       "Largest root-qdisc backlog seen in the collection interval, sampled qdisc_sample_hz times a "
       "second at jittered instants while a queue is about, twice a second otherwise (plus the "
       "collection's own dump): the peak of a queue that fills during each step's burst and drains "
       "between steps."),
    _g("netdev_qdisc_backlog_mean_bytes", "bytes",
       "Time-weighted mean of the root-qdisc backlog over the collection interval, from the same samples."),
    _g("netdev_qdisc_busy_ratio", "ratio",
       "Share of the collection interval (time-weighted samples) in which the root qdisc held at "
       "least one byte: how much of the time this port was the bottleneck of what it sends."),
    _g("netdev_qdisc_delay_max_seconds", "seconds",
       "Estimated queueing delay at the interval's peak: netdev_qdisc_backlog_max_bytes over the "
       "rate the queue drained at (bytes dequeued in the interval over the time a queue stood, at "
       "most the shaping rate or link speed). 0 when no queue was seen."),
]
