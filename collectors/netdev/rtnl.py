"""rtnetlink wire format: dump requests and the few attributes netdev reads (pure, bytes in).

Why not pyroute2 here: its ``get_links()``/``get_qdiscs()`` decode every attribute of every
message into objects (AF_SPEC, XDP, qdisc options, ...) each second, and importing it costs
about 12 MiB of the agent's RSS. netdev needs four link attributes and the root qdisc's
statistics; walking the attribute headers with ``struct`` and decoding only those is a small
fraction of the cost. The output is the shape of pyroute2's ``msg.dump()`` restricted to those
attributes, so :mod:`.parse` reads live dumps and the recorded fixtures the same way (and
the tests check this decoder against pyroute2's on the same bytes).
"""
from __future__ import annotations

import struct
from typing import Any, Iterator

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWQDISC, RTM_GETQDISC = 36, 38
TC_H_ROOT = 0xFFFFFFFF

_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_NLA = struct.Struct("=HH")  # len, type
_IFINFO = struct.Struct("=BxHiII")  # family, type, index, flags, change
_TCMSG = struct.Struct("=BxxxiIII")  # family, index, handle, parent, info
_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")
_NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER

IFLA_IFNAME, IFLA_OPERSTATE, IFLA_STATS64, IFLA_CARRIER_CHANGES = 3, 16, 23, 35
_LINK_ATTRS = frozenset({IFLA_IFNAME, IFLA_OPERSTATE, IFLA_STATS64, IFLA_CARRIER_CHANGES})
TCA_KIND, TCA_STATS, TCA_STATS2 = 1, 3, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE, TCA_STATS_PKT64 = 1, 3, 8

#: struct rtnl_link_stats64, in order (the kernel appends fields; older kernels send fewer)
STATS64_FIELDS = (
    "rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_errors", "tx_errors", "rx_dropped",
    "tx_dropped", "multicast", "collisions", "rx_length_errors", "rx_over_errors", "rx_crc_errors",
    "rx_frame_errors", "rx_fifo_errors", "rx_missed_errors", "tx_aborted_errors",
    "tx_carrier_errors", "tx_fifo_errors", "tx_heartbeat_errors", "tx_window_errors",
)
_STATS64 = struct.Struct(f"={len(STATS64_FIELDS)}Q")
#: IF_OPER_* numbers → the names pyroute2 (and ``ip link``) use
OPERSTATE_NAMES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")
#: struct tc_stats (TCA_STATS, the pre-STATS2 layout the kernel still sends)
_TC_STATS = struct.Struct("=QIIIIIII")
_TC_STATS_FIELDS = ("bytes", "packets", "drop", "overlimits", "bps", "pps", "qlen", "backlog")
_GNET_BASIC = struct.Struct("=QI")  # struct gnet_stats_basic: bytes, packets (u32)
_GNET_QUEUE = struct.Struct("=IIIII")
_GNET_QUEUE_FIELDS = ("qlen", "backlog", "drops", "requeues", "overlimits")


class NetlinkError(OSError):
    """The kernel answered a request with an NLMSG_ERROR carrying a negative errno."""


def dump_request(msg_type: int, seq: int) -> bytes:
    """An ``NLM_F_DUMP`` request for every link (RTM_GETLINK) or qdisc (RTM_GETQDISC)."""
    body = _IFINFO.pack(0, 0, 0, 0, 0) if msg_type == RTM_GETLINK else _TCMSG.pack(0, 0, 0, 0, 0)
    return _NLMSG.pack(_NLMSG.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def messages(data: bytes, seq: int | None) -> tuple[list[tuple[int, memoryview]], bool]:
    """One recv()'s worth of a dump reply → ([(type, payload)], done). Messages answering
    another request than ``seq`` are skipped (``None``: a recorded reply, take them all).
    Raises NetlinkError when the kernel refused the request."""
    out: list[tuple[int, memoryview]] = []
    mv = memoryview(data)
    off, end = 0, len(data)
    while off + _NLMSG.size <= end:
        length, mtype, _flags, mseq, _pid = _NLMSG.unpack_from(mv, off)
        if length < _NLMSG.size or off + length > end:
            raise NetlinkError(0, f"malformed netlink message (length {length} at offset {off})")
        if seq is None or mseq == seq:
            if mtype == NLMSG_DONE:
                return out, True
            if mtype == NLMSG_ERROR:
                err = -struct.unpack_from("=i", mv, off + _NLMSG.size)[0]
                if err:
                    raise NetlinkError(err, f"rtnetlink request failed: errno {err}")
                return out, True
            out.append((mtype, mv[off + _NLMSG.size: off + length]))
        off += (length + 3) & ~3
    return out, False


def _attrs(mv: memoryview, off: int) -> Iterator[tuple[int, int, int]]:
    """(type, payload start, payload end) of each attribute from ``off`` to the end."""
    end = len(mv)
    while off + 4 <= end:
        length, atype = _NLA.unpack_from(mv, off)
        if length < 4 or off + length > end:
            return
        yield atype & _NLA_TYPE_MASK, off + 4, off + length
        off += (length + 3) & ~3


def _asciiz(mv: memoryview, a: int, b: int) -> str:
    raw = bytes(mv[a:b])
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def decode_link(mv: memoryview) -> dict[str, Any]:
    """An RTM_NEWLINK payload → ``{"index", "attrs": [[name, value], ...]}`` with the interface
    name, operational state (by name), carrier changes and the IFLA_STATS64 counters."""
    _family, _type, index, _flags, _change = _IFINFO.unpack_from(mv, 0)
    attrs: list[list[Any]] = []
    seen: set[int] = set()
    nla = _NLA.unpack_from
    off, end = _IFINFO.size, len(mv)
    # A link carries ~45 attributes and we want 4: this loop only reads headers (hot path).
    while off + 4 <= end:
        length, t = nla(mv, off)
        if length < 4 or off + length > end:
            break
        t &= _NLA_TYPE_MASK
        a, b = off + 4, off + length
        off += (length + 3) & ~3
        if t not in _LINK_ATTRS or t in seen:
            continue  # the first occurrence wins, as with pyroute2's get_attr()
        if t == IFLA_IFNAME:
            attrs.append(["IFLA_IFNAME", _asciiz(mv, a, b)])
        elif t == IFLA_OPERSTATE and b > a:
            code = mv[a]
            if code < len(OPERSTATE_NAMES):
                attrs.append(["IFLA_OPERSTATE", OPERSTATE_NAMES[code]])
        elif t == IFLA_CARRIER_CHANGES and b - a >= 4:
            attrs.append(["IFLA_CARRIER_CHANGES", _U32.unpack_from(mv, a)[0]])
        elif t == IFLA_STATS64:
            n = min((b - a) // 8, len(STATS64_FIELDS))
            vals = _STATS64.unpack_from(mv, a) if n == len(STATS64_FIELDS) else \
                struct.unpack_from(f"={n}Q", mv, a)
            attrs.append(["IFLA_STATS64", dict(zip(STATS64_FIELDS, vals))])
        else:
            continue
        seen.add(t)
    return {"index": index, "attrs": attrs}


def qdisc_header(mv: memoryview) -> tuple[int, int, int]:
    """(ifindex, handle, parent) of an RTM_NEWQDISC payload, without reading its attributes."""
    _family, index, handle, parent, _info = _TCMSG.unpack_from(mv, 0)
    return index, handle, parent


def _stats2(mv: memoryview, a: int, b: int) -> dict[str, Any]:
    nested: list[list[Any]] = []
    pkt64: int | None = None
    basic: dict[str, int] | None = None
    for t, x, y in _attrs(mv[:b], a):
        if t == TCA_STATS_BASIC and basic is None and y - x >= _GNET_BASIC.size:
            by, pk = _GNET_BASIC.unpack_from(mv, x)
            basic = {"bytes": by, "packets": pk}
            nested.append(["TCA_STATS_BASIC", basic])
        elif t == TCA_STATS_QUEUE and y - x >= _GNET_QUEUE.size:
            nested.append(["TCA_STATS_QUEUE", dict(zip(_GNET_QUEUE_FIELDS, _GNET_QUEUE.unpack_from(mv, x)))])
        elif t == TCA_STATS_PKT64 and y - x >= 8:
            pkt64, = _U64.unpack_from(mv, x)
    if basic is not None and pkt64 is not None:
        # The kernel sends the packet count as u32 in TCA_STATS_BASIC and adds TCA_STATS_PKT64
        # only once it no longer fits: the 64-bit value is the real one.
        basic["packets"] = pkt64
    return {"attrs": nested}


def decode_qdisc(mv: memoryview) -> dict[str, Any]:
    """An RTM_NEWQDISC payload → ``{"index", "parent", "handle", "attrs"}`` with TCA_KIND,
    TCA_STATS2 (queue and basic statistics) and the legacy TCA_STATS."""
    index, handle, parent = qdisc_header(mv)
    attrs: list[list[Any]] = []
    seen: set[int] = set()
    for t, a, b in _attrs(mv, _TCMSG.size):
        if t in seen:
            continue
        if t == TCA_KIND:
            attrs.append(["TCA_KIND", _asciiz(mv, a, b)])
        elif t == TCA_STATS2:
            attrs.append(["TCA_STATS2", _stats2(mv, a, b)])
        elif t == TCA_STATS and b - a >= _TC_STATS.size:
            attrs.append(["TCA_STATS", dict(zip(_TC_STATS_FIELDS, _TC_STATS.unpack_from(mv, a)))])
        else:
            continue
        seen.add(t)
    return {"index": index, "parent": parent, "handle": handle, "attrs": attrs}


def decode_links(payloads: list[tuple[int, memoryview]]) -> list[dict[str, Any]]:
    return [decode_link(p) for t, p in payloads if t == RTM_NEWLINK]


def decode_qdiscs(payloads: list[tuple[int, memoryview]], roots_only: bool = False) -> list[dict[str, Any]]:
    """Qdisc messages in dump shape; ``roots_only`` skips children and ingress/clsact without
    decoding them (a multi-queue NIC has one ``mq`` child per queue)."""
    out = []
    for t, p in payloads:
        if t != RTM_NEWQDISC:
            continue
        if roots_only and qdisc_header(p)[2] != TC_H_ROOT:
            continue
        out.append(decode_qdisc(p))
    return out
