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
NLM_F_REQUEST, NLM_F_ECHO, NLM_F_DUMP = 0x1, 0x8, 0x300
RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWQDISC, RTM_GETQDISC = 36, 38
RTM_NEWTCLASS, RTM_GETTCLASS = 40, 42
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
TCA_KIND, TCA_OPTIONS, TCA_STATS, TCA_STATS2 = 1, 2, 3, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE, TCA_STATS_PKT64 = 1, 3, 8
#: shaper options (include/uapi/linux/pkt_sched.h): the parms struct, then 64-bit rates that the
#: kernel adds only when a rate does not fit the struct's u32 bytes/s (>= ~34 Gbit/s)
TCA_TBF_PARMS, TCA_TBF_RATE64 = 1, 4
TCA_HTB_PARMS, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 6, 7

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
#: struct tc_ratespec (cell_log, linklayer, overhead, cell_align, mpu, rate in bytes/s)
_RATESPEC = struct.Struct("=BBHhHI")
#: struct tc_tbf_qopt: rate and peakrate ratespecs, limit, buffer, mtu (field names as pyroute2's)
_TBF_QOPT = struct.Struct("=12x12xIII")
#: struct tc_htb_opt: rate and ceil ratespecs, buffer, cbuffer, quantum, level, prio
_HTB_OPT = struct.Struct("=12x12xIIIII")


class NetlinkError(OSError):
    """The kernel answered a request with an NLMSG_ERROR carrying a negative errno."""


def dump_request(msg_type: int, seq: int, ifindex: int = 0) -> bytes:
    """An ``NLM_F_DUMP`` request for every link (RTM_GETLINK) or qdisc (RTM_GETQDISC), or for the
    classes of interface ``ifindex`` (RTM_GETTCLASS: the kernel dumps one device's classes)."""
    body = _IFINFO.pack(0, 0, 0, 0, 0) if msg_type == RTM_GETLINK else _TCMSG.pack(0, ifindex, 0, 0, 0)
    return _NLMSG.pack(_NLMSG.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def root_qdisc_request(ifindex: int, seq: int) -> bytes:
    """A request for one interface's root egress qdisc (not a dump: one reply message).

    ``NLM_F_ECHO`` is what makes the kernel answer the asker: without it a qdisc GET on Linux
    6.18 is acknowledged and answered to nobody (checked on this machine). Several of these
    may go out in one ``send()``; each gets its own reply datagram (or an NLMSG_ERROR).
    """
    body = _TCMSG.pack(0, ifindex, 0, TC_H_ROOT, 0)
    return _NLMSG.pack(_NLMSG.size + len(body), RTM_GETQDISC, NLM_F_REQUEST | NLM_F_ECHO, seq, 0) + body


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


def answers(data: bytes | bytearray | memoryview, size: int | None = None) -> Iterator[tuple[int, int, int, memoryview]]:
    """(type, seq, errno, payload) of every message in one datagram, without filtering or
    raising: for requests sent together, whose answers are told apart by their sequence number.
    ``errno`` is the positive error of an NLMSG_ERROR (0 for an acknowledgement and for every
    other message)."""
    mv = memoryview(data)[: len(data) if size is None else size]
    off, end = 0, len(mv)
    while off + _NLMSG.size <= end:
        length, mtype, _flags, mseq, _pid = _NLMSG.unpack_from(mv, off)
        if length < _NLMSG.size or off + length > end:
            return
        payload = mv[off + _NLMSG.size: off + length]
        err = -struct.unpack_from("=i", payload, 0)[0] if mtype == NLMSG_ERROR and len(payload) >= 4 else 0
        yield mtype, mseq, err, payload
        off += (length + 3) & ~3


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


def _u64_at(mv: memoryview, a: int, b: int) -> int | None:
    return _U64.unpack_from(mv, a)[0] if b - a >= 8 else None


def _tbf_options(mv: memoryview, a: int, b: int) -> dict[str, Any]:
    """tbf's TCA_OPTIONS → ``{"attrs": [["TCA_TBF_PARMS", {"rate", "peak", "limit", ...}], ...]}``
    (pyroute2's names). Rates are bytes per second."""
    out: list[list[Any]] = []
    for t, x, y in _attrs(mv[:b], a):
        if t == TCA_TBF_PARMS and y - x >= _TBF_QOPT.size:
            rate = _RATESPEC.unpack_from(mv, x)[5]
            peak = _RATESPEC.unpack_from(mv, x + _RATESPEC.size)[5]
            limit, buffer, mtu = _TBF_QOPT.unpack_from(mv, x)
            out.append(["TCA_TBF_PARMS", {"rate": rate, "peak": peak, "limit": limit, "buffer": buffer, "mtu": mtu}])
        elif t == TCA_TBF_RATE64 and (v := _u64_at(mv, x, y)) is not None:
            out.append(["TCA_TBF_RATE64", v])
    return {"attrs": out}


def _htb_class_options(mv: memoryview, a: int, b: int) -> dict[str, Any]:
    """An htb class's TCA_OPTIONS → ``{"attrs": [["TCA_HTB_PARMS", {"rate", "ceil", ...}], ...]}``."""
    out: list[list[Any]] = []
    for t, x, y in _attrs(mv[:b], a):
        if t == TCA_HTB_PARMS and y - x >= _HTB_OPT.size:
            rate = _RATESPEC.unpack_from(mv, x)[5]
            ceil = _RATESPEC.unpack_from(mv, x + _RATESPEC.size)[5]
            _buf, _cbuf, _quantum, level, prio = _HTB_OPT.unpack_from(mv, x)
            out.append(["TCA_HTB_PARMS", {"rate": rate, "ceil": ceil, "level": level, "prio": prio}])
        elif t in (TCA_HTB_RATE64, TCA_HTB_CEIL64) and (v := _u64_at(mv, x, y)) is not None:
            out.append(["TCA_HTB_RATE64" if t == TCA_HTB_RATE64 else "TCA_HTB_CEIL64", v])
    return {"attrs": out}


#: qdisc kind → decoder of its TCA_OPTIONS (only the shapers whose rate netdev reports)
_QDISC_OPTIONS = {"tbf": _tbf_options}
_CLASS_OPTIONS = {"htb": _htb_class_options}


def decode_qdisc(mv: memoryview, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """An RTM_NEWQDISC (or RTM_NEWTCLASS) payload → ``{"index", "parent", "handle", "attrs"}``
    with TCA_KIND, TCA_STATS2 (queue and basic statistics), the legacy TCA_STATS and, for the
    kinds in ``options`` (default: the shaping qdiscs, tbf), their TCA_OPTIONS."""
    index, handle, parent = qdisc_header(mv)
    opts = _QDISC_OPTIONS if options is None else options
    attrs: list[list[Any]] = []
    seen: set[int] = set()
    kind = ""
    for t, a, b in _attrs(mv, _TCMSG.size):
        if t in seen:
            continue
        if t == TCA_KIND:
            kind = _asciiz(mv, a, b)
            attrs.append(["TCA_KIND", kind])
        elif t == TCA_OPTIONS:  # the kernel writes TCA_KIND first (tc_fill_qdisc/tc_fill_tclass)
            if kind not in opts:
                continue
            attrs.append(["TCA_OPTIONS", opts[kind](mv, a, b)])
        elif t == TCA_STATS2:
            attrs.append(["TCA_STATS2", _stats2(mv, a, b)])
        elif t == TCA_STATS and b - a >= _TC_STATS.size:
            attrs.append(["TCA_STATS", dict(zip(_TC_STATS_FIELDS, _TC_STATS.unpack_from(mv, a)))])
        else:
            continue
        seen.add(t)
    return {"index": index, "parent": parent, "handle": handle, "attrs": attrs}


def queue_stats(mv: memoryview) -> tuple[int, int, int, int, int] | None:
    """(backlog bytes, qlen, drops, sent bytes, overlimits) of an RTM_NEWQDISC payload, or None
    without statistics. The sampler's hot path: reads TCA_STATS2's queue and basic blocks (or
    the legacy TCA_STATS) and builds nothing else."""
    nla = _NLA.unpack_from
    end = len(mv)
    off = _TCMSG.size
    legacy: tuple[int, int, int, int, int] | None = None
    while off + 4 <= end:
        length, t = nla(mv, off)
        if length < 4 or off + length > end:
            break
        t &= _NLA_TYPE_MASK
        if t == TCA_STATS2:
            sent = -1
            queue: tuple[int, ...] | None = None
            for st, x, y in _attrs(mv[:off + length], off + 4):
                if st == TCA_STATS_BASIC and sent < 0 and y - x >= _GNET_BASIC.size:
                    sent = _GNET_BASIC.unpack_from(mv, x)[0]
                elif st == TCA_STATS_QUEUE and queue is None and y - x >= _GNET_QUEUE.size:
                    queue = _GNET_QUEUE.unpack_from(mv, x)
            if queue is not None:
                return queue[1], queue[0], queue[2], max(sent, 0), queue[4]
        elif t == TCA_STATS and legacy is None and length - 4 >= _TC_STATS.size:
            by, _pk, drop, ovl, _bps, _pps, qlen, backlog = _TC_STATS.unpack_from(mv, off + 4)
            legacy = (backlog, qlen, drop, by, ovl)
        off += (length + 3) & ~3
    return legacy


def decode_classes(payloads: list[tuple[int, memoryview]]) -> list[dict[str, Any]]:
    """Class messages (RTM_NEWTCLASS) in dump shape, with the options of htb classes."""
    return [decode_qdisc(p, _CLASS_OPTIONS) for t, p in payloads if t == RTM_NEWTCLASS]


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
