"""Signals of the host collector: per-CPU time (scope cpu) and node-level CPU, softirq, TCP/UDP
and the kernel's TCP loss classification (/proc/net/netstat)."""
from __future__ import annotations

from skewd.model import SignalSpec, signal

from .parse import MODES, cpu_signal, node_cpu_signal

C = "host"

_MODE_DESC = {
    "user": "user space, including nice and guest time",
    "system": "the kernel, outside interrupt handling",
    "irq": "hard interrupt handlers",
    "softirq": "softirq handling (network receive/transmit processing lands here)",
    "iowait": "idle while I/O was outstanding (unreliable per CPU on tickless kernels)",
    "steal": "involuntary wait while the hypervisor ran something else",
    "idle": "the idle task",
    "busy": "doing work for this OS: user + nice + system + irq + softirq",
}


def _cpu_specs() -> list[SignalSpec]:
    out = []
    for mode in MODES:
        out.append(signal(cpu_signal(mode), "counter", "seconds", "cpu",
                          f"Seconds this CPU spent in {_MODE_DESC[mode]} (/proc/stat, USER_HZ=100).", C))
    for mode in MODES:
        out.append(signal(node_cpu_signal(mode), "counter", "seconds", "node",
                          f"Seconds all CPUs together spent in {_MODE_DESC[mode]} (/proc/stat 'cpu' "
                          "line; keeps the time of CPUs now offline). Divide its rate by "
                          "host_cpus_online for a 0..1 ratio.", C))
    return out


CATALOGUE: list[SignalSpec] = _cpu_specs() + [
    signal("host_cpus_online", "gauge", "cpus", "node", "Online CPUs (per-CPU lines in /proc/stat).", C),
    signal("host_procs_running", "gauge", "tasks", "node",
           "Runnable tasks right now (/proc/stat procs_running): above the CPU count means CPU contention.", C),
    signal("host_procs_blocked", "gauge", "tasks", "node",
           "Tasks blocked on I/O right now (/proc/stat procs_blocked).", C),
    signal("host_softirq_net_rx_total", "counter", "events", "cpu",
           "NET_RX softirq runs on this CPU (/proc/softirqs): where receive processing lands.", C),
    signal("host_softirq_net_tx_total", "counter", "events", "cpu",
           "NET_TX softirq runs on this CPU (/proc/softirqs).", C),
    signal("host_tcp_in_segs_total", "counter", "segments", "node",
           "TCP segments received, including errored ones (/proc/net/snmp Tcp InSegs; this network namespace).", C),
    signal("host_tcp_out_segs_total", "counter", "segments", "node",
           "TCP segments sent, excluding retransmissions (Tcp OutSegs).", C),
    signal("host_tcp_retrans_segs_total", "counter", "segments", "node",
           "TCP segments retransmitted (Tcp RetransSegs): rate / out_segs rate = retransmit ratio.", C),
    signal("host_tcp_in_errs_total", "counter", "segments", "node",
           "TCP segments received in error, e.g. bad checksum (Tcp InErrs).", C),
    signal("host_tcp_out_rsts_total", "counter", "segments", "node", "TCP RST segments sent (Tcp OutRsts).", C),
    # /proc/net/netstat TcpExt: the kernel's own classification of its resends (NS-4, NS-7, EW-6)
    signal("host_tcp_loss_probes_total", "counter", "probes", "node",
           "Tail-loss probes sent (TcpExt TCPLossProbes): no ACK came for about two round trips after "
           "the last segment, so the kernel resent it (or sent new data) to draw one. On a healthy "
           "low-latency path most are answered by a D-SACK: the original had arrived, its ACK was late.", C),
    signal("host_tcp_loss_probe_recoveries_total", "counter", "events", "node",
           "Tail-loss probes that repaired a loss: the probe episode ended without a D-SACK "
           "(TCPLossProbeRecovery).", C),
    signal("host_tcp_dsack_recv_total", "counter", "blocks", "node",
           "D-SACK blocks received (TCPDSACKRecv): a peer reports data that reached it twice, so the "
           "resend was spurious. One block may cover several segments.", C),
    signal("host_tcp_dsack_recv_segs_total", "counter", "segments", "node",
           "Segments the received D-SACKs cover (TCPDSACKRecvSegs; recent kernels only, absent before): "
           "comparable with host_tcp_retrans_segs_total, whose excess over it is the resends no peer "
           "called spurious.", C),
    signal("host_tcp_dsack_ofo_recv_total", "counter", "blocks", "node",
           "D-SACK blocks received for data above the cumulative ACK (TCPDSACKOfoRecv).", C),
    signal("host_tcp_dsack_old_sent_total", "counter", "blocks", "node",
           "D-SACKs this host sent for data it already had (TCPDSACKOldSent): its peers resent spuriously.", C),
    signal("host_tcp_spurious_rtos_total", "counter", "events", "node",
           "Retransmission timeouts F-RTO found spurious (TCPSpuriousRTOs); also counted in "
           "host_tcp_loss_undo_total.", C),
    signal("host_tcp_spurious_rtx_host_queues_total", "counter", "events", "node",
           "Resends given up because the original was still in a queue of this host (qdisc or driver): "
           "not sent, not in host_tcp_retrans_segs_total (TCPSpuriousRtxHostQueues).", C),
    signal("host_tcp_timeouts_total", "counter", "events", "node",
           "Retransmission timeouts that fired, SYN, data or FIN, each backed-off one again "
           "(TCPTimeouts; every RTO since Linux 4.20).", C),
    signal("host_tcp_loss_undo_total", "counter", "events", "node",
           "Timeout recoveries undone because a D-SACK, the timestamps (the ACK echoed the original) "
           "or F-RTO showed the timeout was spurious (TCPLossUndo).", C),
    signal("host_tcp_lost_retransmits_total", "counter", "segments", "node",
           "Resent segments that were lost again (TCPLostRetransmit, RACK): loss on the path, never "
           "a late ACK.", C),
    signal("host_tcp_fast_retransmits_total", "counter", "segments", "node",
           "Segments resent by fast retransmit / SACK recovery rather than on a timeout (TCPFastRetrans). "
           "Reordering triggers them too; D-SACKs then show them spurious.", C),
    signal("host_tcp_slow_start_retransmits_total", "counter", "segments", "node",
           "Segments resent in slow start after a timeout (TCPSlowStartRetrans).", C),
    signal("host_tcp_retrans_fail_total", "counter", "segments", "node",
           "Resends that could not leave this host (TCPRetransFail), e.g. its egress qdisc dropped them.", C),
    signal("host_tcp_sack_reneging_total", "counter", "events", "node",
           "A peer discarded data it had SACKed (TCPSACKReneging): a receiver under memory pressure.", C),
    signal("host_tcp_sack_recoveries_total", "counter", "events", "node",
           "SACK loss-recovery episodes entered (TCPSackRecovery).", C),
    signal("host_tcp_orig_data_sent_total", "counter", "segments", "node",
           "Data segments sent for the first time (TCPOrigDataSent): the base of a retransmission share "
           "that pure ACKs do not dilute.", C),
    signal("host_ip_in_ce_packets_total", "counter", "packets", "node",
           "IP packets received marked ECN Congestion Experienced (IpExt InCEPkts).", C),
    signal("host_udp_in_errors_total", "counter", "datagrams", "node",
           "UDP datagrams that could not be delivered, other than no port (Udp InErrors).", C),
    signal("host_udp_rcvbuf_errors_total", "counter", "datagrams", "node",
           "UDP datagrams dropped because a socket receive buffer was full (Udp RcvbufErrors).", C),
    signal("host_udp_sndbuf_errors_total", "counter", "datagrams", "node",
           "UDP sends that failed for lack of send buffer or qdisc room (Udp SndbufErrors).", C),
    signal("host_load1", "gauge", "tasks", "node", "1-minute load average (/proc/loadavg).", C),
    signal("host_load5", "gauge", "tasks", "node", "5-minute load average (/proc/loadavg).", C),
    signal("host_load15", "gauge", "tasks", "node", "15-minute load average (/proc/loadavg).", C),
]
