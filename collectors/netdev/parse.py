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


#: the root qdisc kinds that never hold a packet: sampling their queue is pointless
QUEUELESS_KINDS = frozenset({"noqueue"})


def root_qdiscs(qdiscs: Iterable[Mapping[str, Any]], names: Mapping[int, str]) -> dict[int, str]:
    """ifindex → kind of the root egress qdisc, for the interfaces in ``names``."""
    out: dict[int, str] = {}
    for msg in qdiscs:
        idx = int(msg.get("index", -1))
        if int(msg.get("parent", 0)) == TC_H_ROOT and idx in names and idx not in out:
            out[idx] = str(attr_map(msg).get("TCA_KIND", ""))
    return out


def queue_state(msg: Mapping[str, Any]) -> tuple[float, float] | None:
    """(backlog bytes, dequeued bytes) of a qdisc message: one sample of its queue."""
    a = attr_map(msg)
    st2 = a.get("TCA_STATS2")
    if isinstance(st2, Mapping):
        nested = attr_map(st2)
        q, b = nested.get("TCA_STATS_QUEUE"), nested.get("TCA_STATS_BASIC")
        if isinstance(q, Mapping) and q.get("backlog") is not None:
            sent = b.get("bytes") if isinstance(b, Mapping) else None
            return float(q["backlog"]), float(sent or 0)
    legacy = a.get("TCA_STATS")
    if isinstance(legacy, Mapping) and legacy.get("backlog") is not None:
        return float(legacy["backlog"]), float(legacy.get("bytes") or 0)
    return None


def _rate(opts: Mapping[str, Any], parms: str, field: str, rate64: str) -> float | None:
    """A shaper's rate in bytes/s: the 64-bit attribute when the kernel sent one (rates the
    u32 field cannot hold, >= ~34 Gbit/s), else the parms struct's field; 0 means unset."""
    a = attr_map(opts)
    v = a.get(rate64)
    if not v:
        p = a.get(parms)
        v = p.get(field) if isinstance(p, Mapping) else None
    return float(v) if v else None


def shaping_rate(root: Mapping[str, Any], classes: Iterable[Mapping[str, Any]] = ()) -> float | None:
    """The rate (bytes/s) at which a shaping root qdisc lets packets leave, or None when the
    root does not shape (or is a shaper netdev does not read).

    - ``tbf``: its rate (the long-term rate; a peakrate only bounds bursts).
    - ``htb``: the sum of the ``ceil`` of its top-level classes (parent root), the most the
      class tree can send. A child class with a lower ceil, or traffic sent to another class by a
      filter, can make the real drain slower; unclassified traffic without a default class
      bypasses the shaper. The rate is then an upper bound.
    """
    a = attr_map(root)
    kind = a.get("TCA_KIND")
    if kind == "tbf":
        opts = a.get("TCA_OPTIONS")
        return _rate(opts, "TCA_TBF_PARMS", "rate", "TCA_TBF_RATE64") if isinstance(opts, Mapping) else None
    if kind == "htb":
        idx = int(root.get("index", -1))
        total = 0.0
        for c in classes:
            if int(c.get("index", -1)) != idx or int(c.get("parent", 0)) != TC_H_ROOT:
                continue
            opts = attr_map(c).get("TCA_OPTIONS")
            ceil = _rate(opts, "TCA_HTB_PARMS", "ceil", "TCA_HTB_CEIL64") if isinstance(opts, Mapping) else None
            total += ceil or 0.0
        return total or None
    return None


def rate_samples(name: str, rate: float | None) -> list[Sample]:
    """The root qdisc's shaping rate; nothing for an unshaped interface."""
    return [] if rate is None else [Sample(name, "netdev_qdisc_rate_bytes", rate)]


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
