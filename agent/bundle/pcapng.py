"""pcapng blocks for the packets a segment carries (``packets.pcapng``).

Hand-written: the recorder needs only three fixed block layouts (section header, interface,
enhanced packet), and the hosts we run on have no libpcap. Timestamps are nanoseconds
(``if_tsresol = 9``) so packet times survive as recorded; Wireshark and scapy read the result.
"""
from __future__ import annotations

import struct

def _pad4(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def _block(btype: int, body: bytes) -> bytes:
    n = 12 + len(body)
    return struct.pack("<II", btype, n) + body + struct.pack("<I", n)


def pcapng_section_header() -> bytes:
    return _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))


def pcapng_interface(linktype: int, snaplen: int = 0) -> bytes:
    # if_tsresol = 9: timestamps in nanoseconds, so packet times survive as recorded
    opts = struct.pack("<HH", 9, 1) + _pad4(b"\x09") + struct.pack("<HH", 0, 0)
    return _block(0x00000001, struct.pack("<HHI", linktype, 0, snaplen) + opts)


def pcapng_packet(iface: int, ns: int, data: bytes, orig_len: int | None = None) -> bytes:
    """An Enhanced Packet Block; ``ns`` is nanoseconds since the epoch (if_tsresol = 9)."""
    ns = int(ns)
    body = struct.pack("<IIIII", iface, (ns >> 32) & 0xFFFFFFFF, ns & 0xFFFFFFFF, len(data),
                       len(data) if orig_len is None else orig_len) + _pad4(bytes(data))
    return _block(0x00000006, body)
