"""Signals of the host collector: per-CPU time (scope cpu) and node-level CPU, softirq, TCP/UDP."""
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
