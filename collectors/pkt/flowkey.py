"""What a flow is: its 5-word key, grouping a batch's packets by flow, and its entity name.

A flow is one direction of a 5-tuple (IP version, protocol, addresses, ports). The tracker
(:mod:`.tracker`), the burst list (:mod:`.features`) and the collector's ignore list
(:mod:`.ignore`) must agree on that identity, so the key layout, the one-sort grouping and the
``udp 10.0.0.1:5000>10.0.0.2:4791`` entity string live here, apart from the statistics computed
over the groups.
"""
from __future__ import annotations

import socket

import numpy as np

from .keyhash import mix64
from .parse import Packets

_PROTO = {1: "icmp", 2: "igmp", 6: "tcp", 17: "udp", 47: "gre", 50: "esp", 58: "icmp6", 132: "sctp"}


def flow_key_columns(pk: Packets, idx: np.ndarray) -> np.ndarray:
    """(len(idx), 5) uint64 key: src hi/lo, dst hi/lo, version|proto|sport|dport."""
    k = np.empty((len(idx), 5), np.uint64)
    k[:, 0] = pk.src_hi[idx]
    k[:, 1] = pk.src_lo[idx]
    k[:, 2] = pk.dst_hi[idx]
    k[:, 3] = pk.dst_lo[idx]
    k[:, 4] = ((pk.ipver[idx].astype(np.uint64) << np.uint64(56))
               | (pk.proto[idx].astype(np.uint64) & np.uint64(0xFFFF)) << np.uint64(32)
               | pk.sport[idx].astype(np.uint64) << np.uint64(16) | pk.dport[idx].astype(np.uint64))
    return k


def group_flows(pk: Packets, idx: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group packets ``idx`` (None: all) by direction-aware 5-tuple, keeping capture order inside a flow.

    Returns (packet indices grouped by flow, group index per element, start of each group).
    One ``np.sort`` of (hash prefix | position): sorting values is cheaper than a stable
    argsort and the position bits make it stable. Groups are then checked against the full
    64-bit hash; a prefix collision falls back to a stable sort of the full hash.
    """
    n = len(pk) if idx is None else len(idx)
    if n == 0:
        z = np.zeros(0, np.int64)
        return z, z, z
    whole = n == len(pk)

    def col(a: np.ndarray) -> np.ndarray:
        return a if whole else a[idx]

    # the hash is built in place in one buffer: every full-size temporary costs page faults
    u64 = np.uint64
    h = col(pk.ipver).astype(u64)
    h <<= u64(56)
    t = col(pk.proto).astype(u64)
    t &= u64(0xFFFF)
    t <<= u64(32)
    h |= t
    t[...] = col(pk.sport)
    t <<= u64(16)
    h |= t
    t[...] = col(pk.dport)
    h |= t  # h = version|proto|sport|dport (the key's misc word)
    v6 = bool((col(pk.ipver) == 6).any())
    with np.errstate(over="ignore"):  # odd-multiplier linear combination, then one avalanche mix
        h *= u64(0x9E3779B97F4A7C15)
        h += np.multiply(col(pk.src_lo), u64(0xC2B2AE3D27D4EB4F), out=t)
        h += np.multiply(col(pk.dst_lo), u64(0x165667B19E3779F9), out=t)
        if v6:
            h += np.multiply(col(pk.src_hi), u64(0xD6E8FEB86659FD93), out=t)
            h += np.multiply(col(pk.dst_hi), u64(0xFF51AFD7ED558CCD), out=t)
        h = mix64(h, t)
    bits = max(1, int(n - 1).bit_length())
    mask = u64((1 << bits) - 1)
    comp = np.bitwise_and(h, ~mask, out=t)
    comp |= np.arange(n, dtype=u64)
    comp.sort()
    order = (comp & mask).view(np.int64)
    comp &= ~mask  # the hash prefix of each element in sorted order
    first = np.empty(n, bool)
    first[0] = True
    np.not_equal(comp[1:], comp[:-1], out=first[1:])
    hf = np.take(h, order, out=comp)
    if not ((hf[1:] == hf[:-1]) | first[1:]).all():  # hash prefix collision: group on the full hash
        order = np.argsort(h, kind="stable")
        hf = h[order]
        np.not_equal(hf[1:], hf[:-1], out=first[1:])
    gi = np.cumsum(first)
    gi -= 1
    gs = np.flatnonzero(first)
    return (order if whole else idx[order]), gi, gs


def entity_of(key: np.ndarray) -> str:
    """``udp 10.0.0.1:5000>10.0.0.2:4791`` from one 5-word flow key."""
    shi, slo, dhi, dlo, misc = key.tolist()
    ver, proto, sport, dport = misc >> 56, (misc >> 32) & 0xFFFF, (misc >> 16) & 0xFFFF, misc & 0xFFFF
    name = _PROTO.get(proto) or f"ip{proto}"
    if ver == 6:
        src = socket.inet_ntop(socket.AF_INET6, ((shi << 64) | slo).to_bytes(16, "big"))
        dst = socket.inet_ntop(socket.AF_INET6, ((dhi << 64) | dlo).to_bytes(16, "big"))
        if proto in (6, 17, 132):
            return f"{name} [{src}]:{sport}>[{dst}]:{dport}"
    else:
        src = socket.inet_ntop(socket.AF_INET, (slo & 0xFFFFFFFF).to_bytes(4, "big"))
        dst = socket.inet_ntop(socket.AF_INET, (dlo & 0xFFFFFFFF).to_bytes(4, "big"))
        if proto in (6, 17, 132):
            return f"{name} {src}:{sport}>{dst}:{dport}"
    return f"{name} {src}>{dst}"


def hosts_of(entity: str) -> tuple[str, str] | None:
    """``(source address, destination address)`` of an :func:`entity_of` string (IPv6 without
    its brackets), or None when ``entity`` is not a flow's name. The controller uses it to find
    which end of several lossy flows they share (``controller/losspath.py``)."""
    name, sep, rest = entity.partition(" ")
    if not sep or not name or ">" not in rest:
        return None
    src, _, dst = rest.partition(">")

    def host(end: str) -> str:
        if end.startswith("["):  # [v6]:port
            return end[1:end.find("]")] if "]" in end else ""
        # v4:port; else a port-less v4 or bare v6 address (entity_of writes ports only for tcp/udp/sctp)
        return end.rpartition(":")[0] if end.count(":") == 1 else end

    s, d = host(src), host(dst)
    return (s, d) if s and d else None
