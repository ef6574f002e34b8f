"""Pure parsers for /proc/stat, /proc/softirqs, /proc/net/snmp, /proc/net/netstat and /proc/loadavg.

CPU times in /proc/stat are in USER_HZ ticks. USER_HZ is part of the kernel ABI and is 100 on
every architecture Linux runs GPUs on (x86-64, arm64, ppc64le), whatever CONFIG_HZ is; we
take it as a parameter so a capture from an exotic system can still be read.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

USER_HZ = 100

#: column order of a ``cpu`` line (kernel 2.6.33+; older kernels simply have fewer columns)
STAT_COLUMNS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
                "guest", "guest_nice")

#: modes emitted, each as the sum of /proc/stat columns. guest/guest_nice are already
#: counted inside user/nice by the kernel, so they are not added again.
MODES: dict[str, tuple[str, ...]] = {
    "user": ("user", "nice"),
    "system": ("system",),
    "irq": ("irq",),
    "softirq": ("softirq",),
    "iowait": ("iowait",),
    "steal": ("steal",),
    "idle": ("idle",),
    # time this OS spent doing work on the CPU: not idle, not waiting, not stolen
    "busy": ("user", "nice", "system", "irq", "softirq"),
}

#: /proc/softirqs row → per-CPU signal
SOFTIRQS = {"NET_RX": "host_softirq_net_rx_total", "NET_TX": "host_softirq_net_tx_total"}

#: (/proc/net/snmp protocol, field) → node signal
SNMP = {
    ("Tcp", "InSegs"): "host_tcp_in_segs_total",
    ("Tcp", "OutSegs"): "host_tcp_out_segs_total",
    ("Tcp", "RetransSegs"): "host_tcp_retrans_segs_total",
    ("Tcp", "InErrs"): "host_tcp_in_errs_total",
    ("Tcp", "OutRsts"): "host_tcp_out_rsts_total",
    ("Udp", "InErrors"): "host_udp_in_errors_total",
    ("Udp", "RcvbufErrors"): "host_udp_rcvbuf_errors_total",
    ("Udp", "SndbufErrors"): "host_udp_sndbuf_errors_total",
}

_SNMP_PROTOS = frozenset(proto for proto, _ in SNMP)

#: (/proc/net/netstat section, field) → node signal: how the kernel itself classifies its TCP
#: retransmissions (tail-loss probe, fast retransmit, timeout, ...) and what the peers' D-SACKs
#: said about them (Documentation/networking/snmp_counter.rst; include/uapi/linux/snmp.h)
NETSTAT = {
    ("TcpExt", "TCPLossProbes"): "host_tcp_loss_probes_total",
    ("TcpExt", "TCPLossProbeRecovery"): "host_tcp_loss_probe_recoveries_total",
    ("TcpExt", "TCPDSACKRecv"): "host_tcp_dsack_recv_total",
    ("TcpExt", "TCPDSACKRecvSegs"): "host_tcp_dsack_recv_segs_total",
    ("TcpExt", "TCPDSACKOfoRecv"): "host_tcp_dsack_ofo_recv_total",
    ("TcpExt", "TCPDSACKOldSent"): "host_tcp_dsack_old_sent_total",
    ("TcpExt", "TCPSpuriousRTOs"): "host_tcp_spurious_rtos_total",
    ("TcpExt", "TCPSpuriousRtxHostQueues"): "host_tcp_spurious_rtx_host_queues_total",
    ("TcpExt", "TCPTimeouts"): "host_tcp_timeouts_total",
    ("TcpExt", "TCPLossUndo"): "host_tcp_loss_undo_total",
    ("TcpExt", "TCPLostRetransmit"): "host_tcp_lost_retransmits_total",
    ("TcpExt", "TCPFastRetrans"): "host_tcp_fast_retransmits_total",
    ("TcpExt", "TCPSlowStartRetrans"): "host_tcp_slow_start_retransmits_total",
    ("TcpExt", "TCPRetransFail"): "host_tcp_retrans_fail_total",
    ("TcpExt", "TCPSACKReneging"): "host_tcp_sack_reneging_total",
    ("TcpExt", "TCPSackRecovery"): "host_tcp_sack_recoveries_total",
    ("TcpExt", "TCPOrigDataSent"): "host_tcp_orig_data_sent_total",
    ("IpExt", "InCEPkts"): "host_ip_in_ce_packets_total",
}

_NETSTAT_SECTIONS = frozenset(sec for sec, _ in NETSTAT)


class Sample(NamedTuple):
    entity: str
    signal: str
    value: float


def cpu_signal(mode: str) -> str:
    return f"host_cpu_{mode}_seconds_total"


def node_cpu_signal(mode: str) -> str:
    return f"host_node_cpu_{mode}_seconds_total"


def _ticks(x: str) -> int:
    """One /proc/stat time column: a u64 count of USER_HZ ticks. Raises ValueError otherwise."""
    v = int(x)
    if not 0 <= v < 1 << 64:
        raise ValueError(f"/proc/stat time {x[:30]!r} is not a 64-bit tick count")
    return v


def parse_stat(text: str, user_hz: int = USER_HZ) -> list[Sample]:
    """Per-CPU (entity ``cpuN``) and node (entity ``""``) CPU seconds, online CPU count,
    and the run-queue gauges ``procs_running``/``procs_blocked``.

    The node aggregate comes from the kernel's own ``cpu`` line, which also keeps the time of
    CPUs that are now offline; per-CPU lines exist only for online CPUs. Raises ValueError on a
    line that is not /proc/stat's (the collector reports it as a read error).
    """
    # only cpu* and procs_* lines are read: the others (``intr`` holds one number per interrupt
    # source, thousands on a large node) are dropped before they are split
    return _stat_samples([line for line in text.splitlines() if line.lstrip().startswith(("cpu", "procs_"))],
                         user_hz)


def _stat_samples(lines: Iterable[str], user_hz: int) -> list[Sample]:
    out: list[Sample] = []
    online = 0
    for line in lines:
        parts = line.split()
        if not parts:
            continue
        key = parts[0]
        if key.startswith("cpu"):
            ticks = dict(zip(STAT_COLUMNS, (_ticks(x) for x in parts[1:])))
            if key == "cpu":
                entity, name = "", node_cpu_signal
            elif key[3:].isdigit():
                entity, name = key, cpu_signal
                online += 1
            else:
                continue
            for mode, cols in MODES.items():
                if any(c in ticks for c in cols):
                    out.append(Sample(entity, name(mode), sum(ticks.get(c, 0) for c in cols) / user_hz))
        elif key in ("procs_running", "procs_blocked") and len(parts) > 1:
            out.append(Sample("", f"host_{key}", float(parts[1])))
    if online:
        out.append(Sample("", "host_cpus_online", float(online)))
    return out


def parse_softirqs(text: str) -> list[Sample]:
    """NET_RX / NET_TX softirq counts per CPU column (every *possible* CPU has a column)."""
    lines = text.splitlines()
    if not lines:
        return []
    cpus = [c.lower() for c in lines[0].split()]  # CPU0 → cpu0
    out: list[Sample] = []
    for line in lines[1:]:
        name, _, rest = line.partition(":")
        sig = SOFTIRQS.get(name.strip())
        if sig is None:
            continue
        for cpu, v in zip(cpus, rest.split()):
            out.append(Sample(cpu, sig, float(v)))
    return out


def parse_snmp(text: str) -> list[Sample]:
    """Selected TCP/UDP counters from the header/value line pairs of /proc/net/snmp."""
    lines = text.splitlines()
    # Ip, Icmp, IcmpMsg, UdpLite: nothing is read from them
    return _snmp_samples([(head, vals) for head, vals in zip(lines[::2], lines[1::2])
                          if head.partition(":")[0] in _SNMP_PROTOS])


def parse_netstat(text: str) -> list[Sample]:
    """Selected TcpExt/IpExt counters from the header/value line pairs of /proc/net/netstat.

    The file is laid out as /proc/net/snmp is (a ``Section: names`` line, then ``Section:
    values``). Which fields exist depends on the kernel (``TCPDSACKRecvSegs`` only in recent
    ones): a field the kernel lacks is not emitted, so a rule using it stays unknown there
    rather than reading zero. MPTcpExt is not read."""
    lines = text.splitlines()
    return _snmp_samples([(head, vals) for head, vals in zip(lines[::2], lines[1::2])
                          if head.partition(":")[0] in _NETSTAT_SECTIONS], NETSTAT)


def _snmp_samples(pairs: Iterable[tuple[str, str]],
                  fields: dict[tuple[str, str], str] = SNMP) -> list[Sample]:
    """The wanted ``(section, field)`` values of header/value line pairs (a value line naming
    another section than its header is skipped)."""
    out: list[Sample] = []
    for head, vals in pairs:
        proto, _, names = head.partition(":")
        vproto, _, values = vals.partition(":")
        if proto != vproto:
            continue
        for field, v in zip(names.split(), values.split()):
            sig = fields.get((proto, field))
            if sig is not None:
                out.append(Sample("", sig, float(v)))
    return out


def parse_loadavg(text: str) -> list[Sample]:
    """1/5/15-minute load averages (runnable + uninterruptible tasks, exponentially averaged)."""
    parts = text.split()
    if len(parts) < 3:
        return []
    return [Sample("", f"host_load{n}", float(v)) for n, v in zip((1, 5, 15), parts[:3])]
