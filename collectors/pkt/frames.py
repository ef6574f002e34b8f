"""Captured frames as columns, the hand-off between capture sources and the header parser.

Both sources (a capture file, the live TPACKET_V3 ring) produce the same :class:`Frames`:
one byte buffer plus per-frame offsets into it. The parser then reads every header field
with numpy gathers at those offsets, so no Python code runs per packet.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: link types (LINKTYPE_* of pcap/pcapng) the parser decodes
LINKTYPE_NAMES: dict[int, str] = {
    0: "NULL (BSD loopback)", 1: "ETHERNET", 12: "RAW (DLT_RAW)", 14: "RAW (OpenBSD DLT_RAW)",
    101: "RAW", 108: "LOOP (OpenBSD loopback)", 113: "LINUX_SLL (Linux cooked v1)",
    228: "IPV4", 229: "IPV6", 276: "LINUX_SLL2 (Linux cooked v2)",
    # common ones we do not decode, named so errors can say what the file holds
    6: "IEEE802_5 (Token Ring)", 9: "PPP", 10: "FDDI", 50: "PPP_HDLC", 104: "C_HDLC",
    105: "IEEE802_11 (Wi-Fi)", 119: "PRISM_HEADER", 127: "IEEE802_11_RADIOTAP", 147: "USER0",
    187: "BLUETOOTH_HCI_H4", 189: "USB_LINUX", 192: "PPI", 195: "IEEE802_15_4", 201: "BLUETOOTH_HCI_H4_WITH_PHDR",
    220: "USB_LINUX_MMAPPED", 249: "USBPCAP", 251: "BLUETOOTH_LE_LL", 253: "NETLINK (Linux netlink)",
    254: "BLUETOOTH_LINUX_MONITOR", 263: "DOCSIS31_XRA31", 264: "ETHERNET_MPACKET", 293: "ZWAVE_R3",
}
SUPPORTED_LINKTYPES = frozenset({0, 1, 12, 14, 101, 108, 113, 228, 229, 276})


def linktype_name(lt: int) -> str:
    return f"{lt} {LINKTYPE_NAMES.get(lt, '(unknown)')}"


def unsupported_message(lt: int, count: int) -> str:
    return (f"link type {linktype_name(lt)} is not supported: {count} frame(s) counted but not decoded "
            f"(supported: Ethernet/VLAN, raw IPv4/IPv6, Linux cooked SLL/SLL2, NULL/loopback)")


#: frame directions (AF_PACKET sll_pkttype folded, or pcapng/SLL metadata)
DIR_UNKNOWN, DIR_IN, DIR_OUT = 0, 1, 2


@dataclass
class Frames:
    """``n`` frames: data of frame i is ``buf[doff[i] : doff[i] + caplen[i]]``.

    ``wirelen`` is the length on the wire (what rates count), ``caplen`` what was captured
    (header-only snaplen makes it smaller). ``ts_ns`` is int64 nanoseconds since the epoch so
    sub-microsecond gaps survive; ``linktype`` is per frame because pcapng mixes interfaces.
    """

    buf: np.ndarray  # uint8, 1-D
    doff: np.ndarray  # int64
    caplen: np.ndarray  # int64
    wirelen: np.ndarray  # int64
    ts_ns: np.ndarray  # int64
    linktype: np.ndarray  # int32
    iface: np.ndarray  # int32 index into the source's interface list
    direction: np.ndarray  # int8 DIR_*

    def __len__(self) -> int:
        return len(self.doff)

    @classmethod
    def empty(cls) -> "Frames":
        z = np.zeros(0, np.int64)
        return cls(np.zeros(0, np.uint8), z, z, z, z, z.astype(np.int32), z.astype(np.int32), z.astype(np.int8))

    def select(self, idx: np.ndarray) -> "Frames":
        return Frames(self.buf, self.doff[idx], self.caplen[idx], self.wirelen[idx], self.ts_ns[idx],
                      self.linktype[idx], self.iface[idx], self.direction[idx])

    @classmethod
    def concat(cls, parts: list["Frames"]) -> "Frames":
        """Join frames from several buffers into one (copies the buffers)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        bufs, doffs, base = [], [], 0
        for p in parts:
            bufs.append(p.buf)
            doffs.append(p.doff + base)
            base += len(p.buf)
        cat = np.concatenate
        return cls(cat(bufs), cat(doffs), cat([p.caplen for p in parts]), cat([p.wirelen for p in parts]),
                   cat([p.ts_ns for p in parts]), cat([p.linktype for p in parts]),
                   cat([p.iface for p in parts]), cat([p.direction for p in parts]))


@dataclass
class Interface:
    """One capture interface (pcap has one; pcapng one per IDB)."""

    name: str
    linktype: int
    snaplen: int = 0
    #: kernel/interface drops reported by the capture tool (pcapng ISB isb_ifdrop), if any
    drops: int | None = None


@dataclass
class Capture:
    """A capture file read into frames, plus what went wrong on the way (never silently)."""

    path: str
    format: str
    frames: Frames
    interfaces: list[Interface] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: frames whose link type the parser cannot decode, by link type
    unsupported: dict[int, int] = field(default_factory=dict)


def gather(buf: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """Rows ``buf[s : s + width]`` for every start, as a new ``(n, width)`` uint8 array.

    Uses a byte-strided void view so numpy copies each row with one memcpy (the index array
    stays n long instead of n*width). Rows running past the buffer end read zeros.
    """
    n = len(starts)
    if n == 0 or len(buf) == 0:
        return np.zeros((n, width), np.uint8)
    starts = np.asarray(starts, np.int64)
    limit = len(buf) - width
    if limit >= 0:
        rows = np.ndarray(shape=(limit + 1,), dtype=np.dtype((np.void, width)), buffer=buf, strides=(1,))
        if int(starts.min()) >= 0 and int(starts.max()) <= limit:  # the usual case: all inside
            return rows[starts].view(np.uint8).reshape(n, width)
    inside = (starts >= 0) & (starts <= limit)
    out = np.zeros((n, width), np.uint8)
    if limit >= 0:
        idx = np.flatnonzero(inside)
        out[idx] = rows[starts[idx]].view(np.uint8).reshape(len(idx), width)
    rest = np.flatnonzero(~inside)
    if len(rest):
        lo = max(0, min(len(buf), int(starts[rest].min())))
        tail = np.concatenate([buf[lo:], np.zeros(width, np.uint8)])
        rel = starts[rest] - lo
        ok = (rel >= 0) & (rel < len(buf) - lo + 1)
        trows = np.ndarray(shape=(len(tail) - width + 1,), dtype=np.dtype((np.void, width)),
                           buffer=tail, strides=(1,))
        vals = np.zeros((len(rest), width), np.uint8)
        if ok.any():
            vals[ok] = trows[rel[ok]].view(np.uint8).reshape(int(ok.sum()), width)
        out[rest] = vals
    return out
