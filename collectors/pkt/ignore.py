"""Leave given TCP connections out of a capture: the agent's own NATS connection.

The agent publishes findings over a TCP connection that the pkt collector captures like any
other when it shares the watched interface. That flow is the agent's traffic, not the
node's: its tail-loss probes once raised NS-7 on it, and its publishes read as bursts. The
agent knows the connection's two ends (:func:`skewd.natsutil.socket_endpoints`) and hands
them to the collector, which drops the connection's packets (both directions) before any
feature is computed - like a kernel filter would - and forgets the flows it had already
started to track from the packets that came before it knew.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import numpy as np

from .parse import Packets

#: (IP version, address high 64 bits, low 64 bits, port) of one end, as the decoder stores it
End = tuple[int, int, int, int]


def end_of(addr: str, port: int) -> End:
    """An address/port pair in the decoder's form; IPv4-mapped IPv6 (``::ffff:a.b.c.d``, what a
    dual-stack socket reports) becomes the IPv4 address on the wire."""
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    v = int(ip)
    return ip.version, v >> 64, v & 0xFFFFFFFFFFFFFFFF, int(port)


def connection_mask(pk: Packets, conns: Sequence[tuple[End, End]]) -> np.ndarray:
    """True for the TCP packets of any of ``conns``, in either direction."""
    hit = np.zeros(len(pk), bool)
    if not len(pk) or not conns:
        return hit
    tcp = (pk.proto == 6) & pk.l4ok
    if not tcp.any():
        return hit
    for a, b in conns:
        for (sv, shi, slo, sp), (_, dhi, dlo, dp) in ((a, b), (b, a)):
            hit |= (tcp & (pk.ipver == sv) & (pk.sport == sp) & (pk.dport == dp)
                    & (pk.src_lo == np.uint64(slo)) & (pk.dst_lo == np.uint64(dlo))
                    & (pk.src_hi == np.uint64(shi)) & (pk.dst_hi == np.uint64(dhi)))
    return hit


def flow_keys(conns: Sequence[tuple[End, End]]) -> np.ndarray:
    """The tracker's 5-word flow keys of both directions of each connection (see
    :func:`~skewd.collectors.pkt.flowkey.flow_key_columns`)."""
    rows = []
    for a, b in conns:
        for (ver, shi, slo, sp), (_, dhi, dlo, dp) in ((a, b), (b, a)):
            rows.append([shi, slo, dhi, dlo, (ver << 56) | (6 << 32) | (sp << 16) | dp])
    return np.array(rows, np.uint64).reshape(-1, 5)
