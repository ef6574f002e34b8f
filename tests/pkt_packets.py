"""Decoded IPv4/UDP packets for pkt-collector tests: the columns ``FlowTracker.update`` reads,
filled the way ``collectors/pkt/parse.py`` fills them for a RoCE (UDP 4791) frame."""
from __future__ import annotations

import numpy as np

from skewd.collectors.pkt.parse import Packets


def udp_packets(ts: np.ndarray, wl: np.ndarray | int, *, dst=2, sport=5000, dport=4791, direction=None,
                iface=None, payload=None) -> Packets:
    """UDP packets at ``ts`` (ns) of ``wl`` wire bytes from 10.x source 1 to ``dst``; the keyword
    columns are scalars or per-packet arrays (direction and iface left at 0 when not given)."""
    p = Packets.alloc(len(ts))
    p.ts_ns[:] = ts
    p.wirelen[:] = wl
    p.decoded[:] = p.outer_ip[:] = p.l4ok[:] = True
    p.ipver[:] = 4
    p.proto[:] = 17
    p.src_lo[:] = 1
    p.dst_lo[:] = dst
    p.sport[:] = sport
    p.dport[:] = dport
    p.tcp_flags[:] = -1
    if payload is not None:
        p.payload[:] = payload
    if direction is not None:
        p.direction[:] = direction
    if iface is not None:
        p.iface[:] = iface
    return p
