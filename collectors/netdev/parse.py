"""Pure parsing of rtnetlink link and qdisc messages into netdev samples.

Input is the dict form of pyroute2 messages (``msg.dump()``: ``{"index": .., "parent": ..,
"attrs": [[name, value], ...]}``, nested attributes as ``{"attrs": [...]}``), which is also
what the recorded fixtures hold, so the same code runs live and over recordings.

Qdisc choice: only each interface's **root egress qdisc** (parent ``TC_H_ROOT``) is
reported. The kernel already folds the children into it (``mq``/``mqprio`` sum their
per-queue children on dump; ``tbf``/``htb``/``prio`` count a child's drops and queue length
at the root too), so summing every qdisc of an interface would count the same packets two
or more times. Ingress/clsact (parent ``ffff:fff1``) carry no egress queue and are skipped.
"""
from __future__ import annotations

import fnmatch
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

TC_H_ROOT = 0xFFFFFFFF


class Sample(NamedTuple):
    entity: str
    signal: str
    value: float


#: IFLA_STATS64 field → signal (all cumulative since the device was created)
LINK_COUNTERS: dict[str, str] = {
    "rx_bytes": "netdev_rx_bytes_total",
    "tx_bytes": "netdev_tx_bytes_total",
    "rx_packets": "netdev_rx_packets_total",
    "tx_packets": "netdev_tx_packets_total",
    "rx_errors": "netdev_rx_errors_total",
    "tx_errors": "netdev_tx_errors_total",
    "rx_dropped": "netdev_rx_dropped_total",
    "tx_dropped": "netdev_tx_dropped_total",
    "rx_missed_errors": "netdev_rx_missed_total",
    "multicast": "netdev_rx_multicast_total",
    "collisions": "netdev_collisions_total",
    "rx_length_errors": "netdev_rx_length_errors_total",
    "rx_over_errors": "netdev_rx_over_errors_total",
    "rx_crc_errors": "netdev_rx_crc_errors_total",
    "rx_frame_errors": "netdev_rx_frame_errors_total",
    "rx_fifo_errors": "netdev_rx_fifo_errors_total",
    "tx_aborted_errors": "netdev_tx_aborted_errors_total",
    "tx_carrier_errors": "netdev_tx_carrier_errors_total",
    "tx_fifo_errors": "netdev_tx_fifo_errors_total",
    "tx_heartbeat_errors": "netdev_tx_heartbeat_errors_total",
    "tx_window_errors": "netdev_tx_window_errors_total",
}

#: TCA_STATS_QUEUE field → signal
QDISC_QUEUE: dict[str, str] = {
    "backlog": "netdev_qdisc_backlog_bytes",
    "qlen": "netdev_qdisc_qlen_packets",
    "drops": "netdev_qdisc_drops_total",
    "overlimits": "netdev_qdisc_overlimits_total",
    "requeues": "netdev_qdisc_requeues_total",
}
#: TCA_STATS_BASIC field → signal
QDISC_BASIC: dict[str, str] = {
    "bytes": "netdev_qdisc_sent_bytes_total",
    "packets": "netdev_qdisc_sent_packets_total",
}
#: old-style TCA_STATS (kernels/qdiscs without TCA_STATS2) field → signal; no requeues there
QDISC_LEGACY: dict[str, str] = {
    "backlog": "netdev_qdisc_backlog_bytes",
    "qlen": "netdev_qdisc_qlen_packets",
    "drop": "netdev_qdisc_drops_total",
    "overlimits": "netdev_qdisc_overlimits_total",
    "bytes": "netdev_qdisc_sent_bytes_total",
    "packets": "netdev_qdisc_sent_packets_total",
}

#: RFC 2863 operational states as the kernel numbers them (IF_OPER_*)
OPERSTATES: dict[str, int] = {
    "UNKNOWN": 0, "NOTPRESENT": 1, "DOWN": 2, "LOWERLAYERDOWN": 3,
    "TESTING": 4, "DORMANT": 5, "UP": 6,
}

#: values the kernel and drivers use for "speed not known" (SPEED_UNKNOWN as %d / %u, old u16)
_SPEED_UNKNOWN = {-1, 0xFFFFFFFF, 0xFFFF}


def attr_map(msg: Mapping[str, Any]) -> dict[str, Any]:
    """``attrs`` list → dict; the first occurrence of a name wins (as ``get_attr`` does)."""
    out: dict[str, Any] = {}
    for pair in msg.get("attrs", ()):
        name, value = pair[0], pair[1]
        if name not in out:
            out[name] = value
    return out


def interface_filter(patterns: Sequence[str] | None) -> Callable[[str], bool]:
    """``None`` → every interface except ``lo``; otherwise names or shell globs (``eth*``)."""
    if not patterns:
        return lambda name: name != "lo"
    pats = list(patterns)
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in pats)


def interface_names(links: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """ifindex → name, for joining qdiscs (which carry only the index) to interfaces."""
    out: dict[int, str] = {}
    for msg in links:
        name = attr_map(msg).get("IFLA_IFNAME")
        if name is not None:
            out[int(msg["index"])] = str(name)
    return out


def link_samples(links: Iterable[Mapping[str, Any]],
                 want: Callable[[str], bool] = lambda n: n != "lo") -> list[Sample]:
    """Counters from IFLA_STATS64, carrier changes and operational state per wanted interface."""
    out: list[Sample] = []
    for msg in links:
        a = attr_map(msg)
        name = a.get("IFLA_IFNAME")
        if name is None or not want(name):
            continue
        stats = a.get("IFLA_STATS64")
        if isinstance(stats, Mapping):
            for field, sig in LINK_COUNTERS.items():
                v = stats.get(field)
                if v is not None:
                    out.append(Sample(name, sig, float(v)))
        cc = a.get("IFLA_CARRIER_CHANGES")
        if cc is not None:
            out.append(Sample(name, "netdev_carrier_changes_total", float(cc)))
        state = a.get("IFLA_OPERSTATE")
        if isinstance(state, str) and state.upper() in OPERSTATES:
            code = OPERSTATES[state.upper()]
            out.append(Sample(name, "netdev_operstate", float(code)))
            out.append(Sample(name, "netdev_up", 1.0 if code == OPERSTATES["UP"] else 0.0))
    return out


def qdisc_samples(qdiscs: Iterable[Mapping[str, Any]], names: Mapping[int, str]) -> list[Sample]:
    """Root egress qdisc statistics for the interfaces in ``names`` (index → name)."""
    out: list[Sample] = []
    seen: set[int] = set()
    for msg in qdiscs:
        idx = int(msg.get("index", -1))
        if int(msg.get("parent", 0)) != TC_H_ROOT or idx not in names or idx in seen:
            continue
        seen.add(idx)
        name = names[idx]
        a = attr_map(msg)
        st2 = a.get("TCA_STATS2")
        if isinstance(st2, Mapping):
            nested = attr_map(st2)
            for key, table in (("TCA_STATS_QUEUE", QDISC_QUEUE), ("TCA_STATS_BASIC", QDISC_BASIC)):
                part = nested.get(key)
                if isinstance(part, Mapping):
                    out.extend(Sample(name, sig, float(part[f])) for f, sig in table.items()
                               if part.get(f) is not None)
            continue
        legacy = a.get("TCA_STATS")
        if isinstance(legacy, Mapping):
            out.extend(Sample(name, sig, float(legacy[f])) for f, sig in QDISC_LEGACY.items()
                       if legacy.get(f) is not None)
    return out


def speed_mbps(text: str | int | None) -> int | None:
    """sysfs ``speed`` (Mb/s, ``%d``) or an ethtool speed → Mb/s; None when unknown."""
    if text is None:
        return None
    try:
        v = int(str(text).split()[0]) if isinstance(text, str) else int(text)
    except (ValueError, IndexError):
        return None
    if v in _SPEED_UNKNOWN or v <= 0 or v >= 1 << 32:  # the kernel prints a u32 (%d of an int)
        return None
    return v


def speed_samples(name: str, text: str | int | None) -> list[Sample]:
    """Link speed as bytes per second (1 Mb/s = 125 000 B/s), nothing when unknown."""
    mbps = speed_mbps(text)
    if mbps is None:
        return []
    return [Sample(name, "netdev_link_speed_bytes", mbps * 125_000.0)]
