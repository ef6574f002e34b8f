"""Vectorised header decoding: :class:`Frames` in, one column per header field out.

Frames are decoded in chunks of a few thousand. For each chunk the first ``width`` bytes of
every frame are gathered into a fixed-size header matrix (one row per frame); header fields
are then read through numpy *structured views* laid over that matrix at the layer's offset,
so a field is one strided pass over rows that are still in the CPU cache. Frames whose
layer starts at a different offset (VLAN tags, IP options, IPv6 extension headers) form a
few more groups, each decoded the same way; headers beyond ``width`` bytes are gathered from
the original buffer. Loops run over chunks and header-stack depth, never over packets.

Tunnelled packets (IP-in-IP, GRE carrying IP or Ethernet) are described by their innermost
IP header, the flow a GPU job sees; ``outer_ip`` still records that the frame carried IP.
Non-first IP fragments have no transport header: they keep their protocol, no ports, and
are flagged ``frag``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from .frames import DIR_IN, DIR_OUT, SUPPORTED_LINKTYPES, Frames, gather

ROCE_PORT = 4791
TCP_FIN, TCP_SYN, TCP_RST, TCP_PSH, TCP_ACK = 0x01, 0x02, 0x04, 0x08, 0x10
_VLAN_TPIDS = (0x8100, 0x88A8, 0x9100)
_V6_EXT = (0, 43, 44, 51, 60, 135, 139, 140)
#: header bytes kept per frame: Ethernet + 2 VLAN tags + IPv6 + TCP, or + IPv4/UDP/BTH with room
DEFAULT_WIDTH = 96
CHUNK = 16384


@dataclass
class Packets:
    """Decoded header fields, one entry per frame (same order as the frames)."""

    ts_ns: np.ndarray  # int64 ns
    wirelen: np.ndarray  # int64 bytes on the wire
    decoded: np.ndarray  # bool: link type supported
    outer_ip: np.ndarray  # bool: the frame carries an IPv4/IPv6 header (tshark's "ip or ipv6")
    ipver: np.ndarray  # int8 4 / 6 / 0 (innermost IP header)
    proto: np.ndarray  # int16 IP protocol, -1 without IP
    src_hi: np.ndarray  # uint64 (IPv6 upper half; 0 for IPv4)
    src_lo: np.ndarray  # uint64 (IPv6 lower half; the address for IPv4)
    dst_hi: np.ndarray
    dst_lo: np.ndarray
    sport: np.ndarray  # int32, 0 without a transport header
    dport: np.ndarray
    l4ok: np.ndarray  # bool: TCP/UDP header decoded
    payload: np.ndarray  # int64 transport payload bytes (IP payload for other protocols)
    frag: np.ndarray  # bool: non-first fragment (no transport header)
    ecn: np.ndarray  # int8 ECN bits of the innermost IP header (3 = CE)
    tcp_flags: np.ndarray  # int16, -1 when not TCP
    tcp_seq: np.ndarray  # int64 (uint32 value)
    tcp_ack: np.ndarray  # int64
    tcp_win: np.ndarray  # int32 raw (unscaled) window
    bth_opcode: np.ndarray  # int16 RoCEv2 BTH opcode, -1 when not RoCEv2
    bth_qp: np.ndarray  # int32 destination QP, -1 when not RoCEv2
    bth_psn: np.ndarray  # int32 PSN, -1 when not RoCEv2
    direction: np.ndarray  # int8 DIR_*
    iface: np.ndarray  # int32
    #: the D-SACK block (RFC 2883) an ACK carries: the first SACK block when it lies at or below
    #: the cumulative ACK or inside the second block - "these bytes reached me twice". Raw
    #: 32-bit sequence numbers of the acknowledged direction, [lo, hi); -1 when the segment
    #: carries none. Built from the header when omitted (sources without TCP options).
    tcp_dsack_lo: np.ndarray = field(default=None)  # type: ignore[assignment]
    tcp_dsack_hi: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.tcp_dsack_lo is None:
            self.tcp_dsack_lo = np.full(len(self.ts_ns), -1, np.int64)
        if self.tcp_dsack_hi is None:
            self.tcp_dsack_hi = np.full(len(self.ts_ns), -1, np.int64)

    def __len__(self) -> int:
        return len(self.ts_ns)

    @property
    def is_tcp(self) -> np.ndarray:
        return (self.proto == 6) & self.l4ok

    @property
    def is_udp(self) -> np.ndarray:
        return (self.proto == 17) & self.l4ok

    def take(self, idx: np.ndarray | slice) -> "Packets":
        return Packets(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    @classmethod
    def concat(cls, parts: list["Packets"]) -> "Packets":
        if len(parts) == 1:
            return parts[0]
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)})

    @classmethod
    def alloc(cls, n: int, share: Frames | None = None) -> "Packets":
        """Empty columns for ``n`` packets; ``share``: take time, length and interface from
        these frames without copying (direction is copied: cooked captures fill it in)."""
        z = np.zeros
        if share is not None:
            return cls(ts_ns=share.ts_ns, wirelen=share.wirelen, decoded=z(n, bool), outer_ip=z(n, bool),
                       ipver=z(n, np.int8), proto=np.full(n, -1, np.int16), src_hi=z(n, np.uint64),
                       src_lo=z(n, np.uint64), dst_hi=z(n, np.uint64), dst_lo=z(n, np.uint64),
                       sport=z(n, np.int32), dport=z(n, np.int32), l4ok=z(n, bool), payload=z(n, np.int64),
                       frag=z(n, bool), ecn=z(n, np.int8), tcp_flags=np.full(n, -1, np.int16),
                       tcp_seq=z(n, np.int64), tcp_ack=z(n, np.int64), tcp_win=z(n, np.int32),
                       bth_opcode=np.full(n, -1, np.int16), bth_qp=np.full(n, -1, np.int32),
                       bth_psn=np.full(n, -1, np.int32), direction=share.direction.astype(np.int8, copy=True),
                       iface=share.iface, tcp_dsack_lo=np.full(n, -1, np.int64),
                       tcp_dsack_hi=np.full(n, -1, np.int64))
        return cls(ts_ns=z(n, np.int64), wirelen=z(n, np.int64), decoded=z(n, bool), outer_ip=z(n, bool),
                   ipver=z(n, np.int8), proto=np.full(n, -1, np.int16), src_hi=z(n, np.uint64),
                   src_lo=z(n, np.uint64), dst_hi=z(n, np.uint64), dst_lo=z(n, np.uint64),
                   sport=z(n, np.int32), dport=z(n, np.int32), l4ok=z(n, bool), payload=z(n, np.int64),
                   frag=z(n, bool), ecn=z(n, np.int8), tcp_flags=np.full(n, -1, np.int16),
                   tcp_seq=z(n, np.int64), tcp_ack=z(n, np.int64), tcp_win=z(n, np.int32),
                   bth_opcode=np.full(n, -1, np.int16), bth_qp=np.full(n, -1, np.int32),
                   bth_psn=np.full(n, -1, np.int32), direction=z(n, np.int8), iface=z(n, np.int32))


def _dt(spec: dict[str, tuple[str, int]], size: int) -> np.dtype:
    return np.dtype({"names": list(spec), "formats": [f for f, _ in spec.values()],
                     "offsets": [o for _, o in spec.values()], "itemsize": size})


_IP4 = _dt({"vihl": ("u1", 0), "tos": ("u1", 1), "tot": (">u2", 2), "ff": (">u2", 6), "proto": ("u1", 9),
            "src": (">u4", 12), "dst": (">u4", 16)}, 20)
_IP6 = _dt({"vtc": (">u2", 0), "plen": (">u2", 4), "nh": ("u1", 6), "s0": (">u8", 8), "s1": (">u8", 16),
            "d0": (">u8", 24), "d1": (">u8", 32)}, 40)
_TCP = _dt({"sport": (">u2", 0), "dport": (">u2", 2), "seq": (">u4", 4), "ack": (">u4", 8),
            "offfl": (">u2", 12), "win": (">u2", 14)}, 16)
_UDP = _dt({"sport": (">u2", 0), "dport": (">u2", 2)}, 4)
_BTH = _dt({"op": ("u1", 0), "qp": (">u4", 4), "psn": (">u4", 8)}, 12)  # qp/psn: low 24 bits


class _Chunk:
    """One chunk of frames: the header matrix plus where each row's bytes live in ``buf``."""

    def __init__(self, fr: Frames, a: int, b: int, width: int) -> None:
        self.buf = fr.buf
        self.doff = fr.doff[a:b]
        self.caplen = fr.caplen[a:b]
        self.wirelen = fr.wirelen[a:b]
        self.n = b - a
        self.width = width
        self.H = gather(fr.buf, self.doff, width)

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Header rows ``idx`` as a new matrix (one memcpy per row through a void view)."""
        w = self.width
        return self.H.view(np.dtype((np.void, w))).ravel()[idx].view(np.uint8).reshape(len(idx), w)

    def rec(self, rows: np.ndarray | slice, off: np.ndarray | int, dtype: np.dtype) -> np.ndarray:
        """Structured records of ``dtype`` starting ``off`` bytes into the frames ``rows``."""
        if isinstance(off, (int, np.integer)) and off + dtype.itemsize <= self.width:
            m = self.H if isinstance(rows, slice) else self.rows(rows)
            return np.ndarray((len(m),), dtype, buffer=m, offset=int(off), strides=(self.width,))
        doff = self.doff[rows] + off
        m = gather(self.buf, doff, dtype.itemsize)
        return m.view(dtype).ravel()

    def byte(self, rows: np.ndarray, off: np.ndarray) -> np.ndarray:
        """One byte per row at per-row offsets (small row sets: VLAN tags, extension headers)."""
        inside = off < self.width
        out = np.zeros(len(rows), np.int32)
        out[inside] = self.H[rows[inside], off[inside]]
        if not inside.all():
            out[~inside] = gather(self.buf, self.doff[rows[~inside]] + off[~inside], 1)[:, 0]
        return out

    def be16(self, rows: np.ndarray, off: np.ndarray) -> np.ndarray:
        return (self.byte(rows, off) << 8) | self.byte(rows, off + 1)


def _pick(mask: np.ndarray, a, b):
    """``np.where(mask, a, b)`` without its cost on mixed masks (arithmetic select)."""
    if mask.all():
        return a if isinstance(a, np.ndarray) else np.full(len(mask), a)
    if not mask.any():
        return b if isinstance(b, np.ndarray) else np.full(len(mask), b)
    m = mask.astype(np.int64)
    a = np.asarray(a).astype(np.int64) if not isinstance(a, np.ndarray) or a.dtype != np.int64 else a
    b = np.asarray(b).astype(np.int64) if not isinstance(b, np.ndarray) or b.dtype != np.int64 else b
    return b + (a - b) * m


def _groups(v: np.ndarray):
    """(value, rows) for each distinct value; rows is ``slice(None)`` when all share one."""
    if len(v) == 0:
        return
    lo, hi = v.min(), v.max()
    if lo == hi:
        yield int(lo), slice(None)
        return
    for x in np.unique(v).tolist():
        yield x, np.flatnonzero(v == x)


def _ethertype_to_ver(et: np.ndarray) -> np.ndarray:
    return np.where(et == 0x0800, 4, np.where(et == 0x86DD, 6, 0)).astype(np.int8)


def _ethernet(c: _Chunk, rows: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """L3 offset and IP version behind an Ethernet header at ``base`` (VLAN/QinQ tags, PPPoE
    session and MPLS labels skipped)."""
    off = base + 14
    et = c.be16(rows, base + 12)
    for _ in range(3):  # 802.1Q, 802.1ad QinQ, old 0x9100
        v = np.flatnonzero((et == 0x8100) | (et == 0x88A8) | (et == 0x9100))
        if not len(v):
            break
        et[v] = c.be16(rows[v], off[v] + 2)
        off[v] += 4
    v = np.flatnonzero(et == 0x8864)  # PPPoE session: 6-byte header + PPP protocol
    if len(v):
        ppp = c.be16(rows[v], off[v] + 6)
        et[v] = np.where(ppp == 0x0021, 0x0800, np.where(ppp == 0x0057, 0x86DD, 0))
        off[v] += 8
    v = np.flatnonzero((et == 0x8847) | (et == 0x8848))  # MPLS label stack, then IP by nibble
    if len(v):
        todo = v
        for _ in range(6):
            bos = c.byte(rows[todo], off[todo] + 2) & 1
            off[todo] += 4
            todo = todo[bos == 0]
            if not len(todo):
                break
        nib = c.byte(rows[v], off[v]) >> 4
        et[v] = np.where(nib == 4, 0x0800, np.where(nib == 6, 0x86DD, 0))
    return off, _ethertype_to_ver(et)


def _link(c: _Chunk, lt: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(L3 offset, IP version 4/6/0, direction or None) for frames of one link type."""
    n = len(rows)
    H = c.rows(rows) if n < c.n else c.H
    if lt == 1:
        et = (H[:, 12].astype(np.int32) << 8) | H[:, 13]
        if not ((et == 0x8100) | (et == 0x88A8) | (et == 0x9100) | (et == 0x8864)
                | (et == 0x8847) | (et == 0x8848)).any():
            return np.full(n, 14, np.int64), _ethertype_to_ver(et), None
        return (*_ethernet(c, rows, np.zeros(n, np.int64)), None)
    if lt in (12, 14, 101, 228, 229):
        nib = H[:, 0] >> 4
        ver = np.where(nib == 4, 4, np.where(nib == 6, 6, 0)).astype(np.int8)
        if lt == 228:
            ver[ver == 6] = 0
        elif lt == 229:
            ver[ver == 4] = 0
        return np.zeros(n, np.int64), ver, None
    if lt in (113, 276):
        if lt == 113:  # SLL: packet type(2) ARPHRD(2) addr len(2) addr(8) protocol(2)
            pkttype = (H[:, 0].astype(np.int32) << 8) | H[:, 1]
            et, hl = (H[:, 14].astype(np.int32) << 8) | H[:, 15], 16
        else:  # SLL2: protocol(2) reserved(2) ifindex(4) ARPHRD(2) packet type(1) addr len(1) addr(8)
            et, pkttype, hl = (H[:, 0].astype(np.int32) << 8) | H[:, 1], H[:, 10].astype(np.int32), 20
        d = np.where(pkttype <= 3, DIR_IN, np.where(pkttype == 4, DIR_OUT, 0)).astype(np.int8)
        off = np.full(n, hl, np.int64)
        v = np.flatnonzero((et == 0x8100) | (et == 0x88A8))  # a VLAN tag left in a cooked frame
        if len(v):
            et[v] = c.be16(rows[v], off[v] + 2)
            off[v] += 4
        return off, _ethertype_to_ver(et), d
    if lt in (0, 108):
        raw = np.ascontiguousarray(H[:, :4])
        if lt == 108:  # LOOP: address family in network byte order
            fam = raw.view(">u4")[:, 0].astype(np.int64)
        else:  # NULL: the capturing host's byte order, guessed the way Wireshark does
            h = raw.view("<u4")[:, 0].astype(np.int64)
            hi = (h & 0xFFFF0000) != 0
            shift = hi & ((h & 0xFF000000) == 0) & ((h & 0x00FF0000) < 0x00060000)
            swap32 = raw.view(">u4")[:, 0].astype(np.int64)
            swap16 = ((h & 0xFF) << 8) | ((h >> 8) & 0xFF)
            lo_swap = ~hi & ((h & 0xFF) == 0) & ((h & 0xFF00) < 0x0600)
            fam = np.where(hi, np.where(shift, h >> 16, swap32), np.where(lo_swap, swap16, h))
        # above 1500 the value is an Ethertype (low 16 bits), else a BSD/Linux AF_* value
        ver = np.where(fam > 1500, _ethertype_to_ver(fam & 0xFFFF),
                       np.where(fam == 2, 4, np.where(np.isin(fam, (10, 24, 28, 30)), 6, 0))).astype(np.int8)
        return np.full(n, 4, np.int64), ver, None
    return np.full(n, -1, np.int64), np.zeros(n, np.int8), None


def _ip_block(c: _Chunk, M: np.ndarray | None, rows: np.ndarray, v: int, ver: np.ndarray,
              st: dict[str, np.ndarray], out: np.ndarray | slice, fresh: bool) -> None:
    """IP fields of frames ``rows`` whose IP header starts ``v`` bytes in, written to
    ``st[field][out]``. ``M`` is the header matrix of exactly those rows (None = gather them
    from the buffer). ``fresh``: the outputs still hold their initial zeros."""
    n = len(rows)
    width = c.width
    whole = isinstance(out, slice)

    def view(dt: np.dtype) -> np.ndarray:
        if M is not None and v + dt.itemsize <= width:
            return np.ndarray((n,), dt, buffer=M, offset=v, strides=(width,))
        return gather(c.buf, c.doff[rows] + v, dt.itemsize).view(dt).ravel()

    def put(name: str, x) -> None:
        st[name][out] = x

    cl = c.caplen if whole else c.caplen[rows]
    wire = c.wirelen if whole else c.wirelen[rows]
    nib = view(np.dtype("u1")) >> 4
    r4 = (ver == 4) & (nib == 4) & (cl >= v + 20)
    r6 = (ver == 6) & (nib == 6) & (cl >= v + 40)
    all4 = bool(r4.all())
    any6 = not all4 and bool(r6.any())
    put("ipver", r4 * np.int8(4) + r6 * np.int8(6))
    if all4 or r4.any():
        h = view(_IP4)
        ihl = (h["vihl"] & 15).astype(np.int32) << 2
        tot = h["tot"].astype(np.int32)
        hdr = np.maximum(ihl, 20)
        pay = tot - ihl
        bad = pay < 0
        if bad.any():  # total length 0 (TSO captures) or garbage: use the frame length
            pay = _pick(bad, np.maximum(wire - v - ihl, 0), pay)
        if all4:
            put("ecn", h["tos"] & 3)
            put("proto", h["proto"])
            put("src_lo", h["src"])
            put("dst_lo", h["dst"])
            if not fresh:
                put("src_hi", 0)
                put("dst_hi", 0)
            put("frag", (h["ff"] & 0x1FFF) > 0)
            put("l4off", hdr + v)
            put("l3pay", pay)
            return
        four = {"ecn": h["tos"] & 3, "proto": h["proto"].astype(np.int64), "src_lo": h["src"].astype(np.int64),
                "dst_lo": h["dst"].astype(np.int64), "src_hi": 0, "dst_hi": 0,
                "frag": (h["ff"] & 0x1FFF) > 0, "l4off": hdr + v, "l3pay": pay}
    else:
        four = {}
    six: dict = {}
    if any6:
        h = view(_IP6)
        plen = h["plen"].astype(np.int64)
        l4 = np.full(n, v + 40, np.int64)
        pay = _pick(plen > 0, plen, np.maximum(wire - l4, 0))
        nh = h["nh"].astype(np.int16)
        frag = np.zeros(n, bool)
        for _ in range(8):  # extension header chain (rare): per-row offsets
            e = np.flatnonzero(r6 & np.isin(nh, _V6_EXT) & (l4 + 8 <= cl))
            if not len(e):
                break
            ge = rows[e]
            nxt = c.byte(ge, l4[e]).astype(np.int16)
            hlen = c.byte(ge, l4[e] + 1).astype(np.int64)
            is_frag = nh[e] == 44
            size = np.where(is_frag, 8, np.where(nh[e] == 51, (hlen + 2) * 4, (hlen + 1) * 8))
            fo = c.be16(ge[is_frag], l4[e][is_frag] + 2)
            frag[e[is_frag]] = (fo >> 3) > 0
            nh[e] = nxt
            l4[e] += size
            pay[e] -= size
        six = {"ecn": (h["vtc"] >> 4) & 3, "proto": nh.astype(np.int64), "src_hi": h["s0"], "src_lo": h["s1"],
               "dst_hi": h["d0"], "dst_lo": h["d1"], "frag": frag, "l4off": l4, "l3pay": np.maximum(pay, 0)}
    for k in ("ecn", "proto", "src_hi", "src_lo", "dst_hi", "dst_lo", "frag", "l4off", "l3pay"):
        dflt = {"proto": -1, "l4off": -1}.get(k, 0)
        x4, x6 = four.get(k, dflt), six.get(k, dflt)
        if k in ("src_hi", "src_lo", "dst_hi", "dst_lo"):  # 64-bit words: select without arithmetic
            val = np.where(r4, np.asarray(x4, np.uint64), np.where(r6, np.asarray(x6, np.uint64), np.uint64(0)))
        elif k == "frag":
            val = (r4 & x4) | (r6 & x6)
        else:
            val = _pick(r4, x4, _pick(r6, x6, dflt))
        put(k, val)


_IP_KEYS = ("ipver", "ecn", "proto", "src_hi", "src_lo", "dst_hi", "dst_lo", "frag")


def _ip(c: _Chunk, st: dict[str, np.ndarray], rows: np.ndarray, off: np.ndarray, ver: np.ndarray,
        fresh: bool = False) -> None:
    """Decode IP headers at per-row offsets into the chunk state ``st`` (row-indexed arrays)."""
    for v, sel in _groups(off):
        whole = isinstance(sel, slice) and len(rows) == c.n
        r = rows if isinstance(sel, slice) else rows[sel]
        vv = ver if isinstance(sel, slice) else ver[sel]
        M = c.H if whole else (c.rows(r) if v + 20 <= c.width else None)
        _ip_block(c, M, r, v, vv, st, slice(None) if whole else r, fresh)


def _tunnels(c: _Chunk, st: dict[str, np.ndarray]) -> None:
    """Up to two levels of IPv4/IPv6-in-IP and GRE (version 0) carrying IP or Ethernet."""
    for _ in range(2):
        p = st["proto"]
        t = np.flatnonzero(((p == 4) | (p == 41) | (p == 47)) & ~st["frag"] & (st["ipver"] > 0))
        if not len(t):
            return
        p = p[t]
        inner_off = st["l4off"][t].copy()
        inner_ver = np.where(p == 4, 4, np.where(p == 41, 6, 0)).astype(np.int8)
        gre = np.flatnonzero(p == 47)
        if len(gre):
            tg = t[gre]
            flags, ptype = c.be16(tg, inner_off[gre]), c.be16(tg, inner_off[gre] + 2)
            hl = 4 + 4 * ((flags & 0x8000) > 0) + 4 * ((flags & 0x2000) > 0) + 4 * ((flags & 0x1000) > 0)
            ok = (flags & 0x4007) == 0  # version 0, no source routing
            gv = _ethertype_to_ver(ptype)
            teb = np.flatnonzero(ok & (ptype == 0x6558))  # transparent Ethernet bridging
            if len(teb):
                eoff, ever = _ethernet(c, tg[teb], inner_off[gre[teb]] + hl[teb])
                gv[teb] = ever
                hl[teb] = eoff - inner_off[gre[teb]]
            inner_ver[gre] = np.where(ok, gv, 0)
            inner_off[gre] += hl
        go = inner_ver > 0
        if not go.any():
            return
        _ip(c, st, t[go], inner_off[go], inner_ver[go])


def _transport(c: _Chunk, st: dict[str, np.ndarray], pk: Packets, a: int) -> None:
    """TCP/UDP headers (and the RoCEv2 BTH behind UDP 4791). ``tcp_seq/ack/win`` are raw
    header words, meaningful only where ``is_tcp``."""
    n = c.n
    seg = slice(a, a + n)
    ipv = st["ipver"] > 0
    proto = st["proto"]
    pk.payload[seg] = st["l3pay"] * ipv
    l4 = np.flatnonzero(ipv & ~st["frag"] & ((proto == 6) | (proto == 17)))
    if not len(l4):
        return
    for v, sel in _groups(st["l4off"][l4]):
        whole = isinstance(sel, slice) and len(l4) == n
        r = l4 if isinstance(sel, slice) else l4[sel]
        out: np.ndarray | slice = seg if whole else a + r

        def put(name: str, x: np.ndarray) -> None:
            getattr(pk, name)[out] = x

        M = (c.H if whole else c.rows(r)) if v + 16 <= c.width else None
        if M is not None:
            h = np.ndarray((len(r),), _TCP, buffer=M, offset=v, strides=(c.width,))
        else:
            h = gather(c.buf, c.doff[r] + v, 16).view(_TCP).ravel()
        tcp = proto[r] == 6
        room = c.caplen[r] - v
        short = room < 14
        if short.any():  # TCP needs its flags, UDP its 8 bytes
            ok = (room >= 8) & ~(tcp & short)
            tcp &= ok
        else:
            ok = np.ones(len(r), bool)
        put("l4ok", ok)
        put("sport", h["sport"] * ok if not ok.all() else h["sport"])
        put("dport", h["dport"] * ok if not ok.all() else h["dport"])
        l3pay = st["l3pay"][r]
        any_tcp = bool(tcp.any())
        if any_tcp:
            offfl = h["offfl"].astype(np.int32)
            all_tcp = bool(tcp.all())
            put("tcp_flags", (offfl & 0x1FF) if all_tcp else _pick(tcp, offfl & 0x1FF, -1))
            put("tcp_seq", h["seq"])
            put("tcp_ack", h["ack"])
            put("tcp_win", h["win"])
            hl = np.maximum((offfl >> 12) << 2, 20)
            _dsack(c, pk, a, r, v, tcp & ok, hl, offfl, h["ack"], M)
            hl = hl if all_tcp else _pick(tcp, hl, 8)
        else:
            hl = 8
        hl = hl * ok if not ok.all() else hl
        put("payload", np.maximum(l3pay - hl, 0))
        if not any_tcp or not tcp.all():
            roce = ~tcp & ok & (h["dport"] == ROCE_PORT) & (room >= 20)
            if roce.any():
                gr = r[roce]
                if v + 20 <= c.width:
                    b = np.ndarray((len(gr),), _BTH, buffer=c.rows(gr), offset=v + 8, strides=(c.width,))
                else:
                    b = gather(c.buf, c.doff[gr] + v + 8, 12).view(_BTH).ravel()
                pk.bth_opcode[a + gr] = b["op"]
                pk.bth_qp[a + gr] = b["qp"] & 0xFFFFFF
                pk.bth_psn[a + gr] = b["psn"] & 0xFFFFFF


#: NOP NOP TIMESTAMP(len 10): how Linux starts the options of every segment when timestamps are on
_TS_FIRST = 0x0101080A
_OPT_MAX = 40  # TCP option bytes at most (header length field: 60 - 20)


def _dsack(c: _Chunk, pk: Packets, a: int, r: np.ndarray, v: int, tcp: np.ndarray, hl: np.ndarray,
           offfl: np.ndarray, ack: np.ndarray, M: np.ndarray | None) -> None:
    """The D-SACK block of ACK segments (RFC 2883), into ``pk.tcp_dsack_lo/hi``.

    A receiver that gets bytes it already has reports them in the first SACK block, below the
    cumulative ACK or inside the second block: the resend was spurious. Only segments whose
    options can hold a SACK option are walked; the usual segment with nothing but timestamps
    (``NOP NOP TS``, header length 32) is recognised from one 32-bit word. The walk steps through
    the options of all candidates side by side, one option per step (at most 40 steps)."""
    cand = tcp & ((offfl & TCP_ACK) > 0) & (hl >= 32) & (c.caplen[r] >= v + 32)
    if not cand.any():
        return
    if M is not None and v + 24 <= c.width:
        first = np.ndarray((len(r),), ">u4", buffer=M, offset=v + 20, strides=(c.width,))
    else:
        first = gather(c.buf, c.doff[r] + v + 20, 4).view(">u4").ravel()
    cand &= (hl > 32) | (first != _TS_FIRST)
    k = np.flatnonzero(cand)
    if not len(k):
        return
    rows = r[k]
    opt = gather(c.buf, c.doff[rows] + v + 20, _OPT_MAX).astype(np.int64)
    avail = np.minimum(hl[k] - 20, c.caplen[rows] - v - 20)  # option bytes present and captured
    pos = np.zeros(len(k), np.int64)
    at = np.full(len(k), -1, np.int64)  # where the SACK option starts
    todo = np.arange(len(k))
    for _ in range(_OPT_MAX):
        p = pos[todo]
        todo = todo[p < avail[todo]]
        if not len(todo):
            break
        p = pos[todo]
        kind = opt[todo, p]
        length = opt[todo, np.minimum(p + 1, _OPT_MAX - 1)]
        sack = kind == 5
        at[todo[sack]] = p[sack]
        step = np.where(kind == 1, 1, length)
        go = ~sack & (kind != 0) & (step >= 1) & ((kind == 1) | (length >= 2))
        pos[todo[go]] += step[go]
        todo = todo[go]
    f = np.flatnonzero((at >= 0) & (at + 10 <= avail))
    if not len(f):
        return
    p = at[f]
    ln = opt[f, p + 1]
    f, p = f[ln >= 10], p[ln >= 10]
    if not len(f):
        return

    def word(off: np.ndarray) -> np.ndarray:
        o = opt[f[:, None], off[:, None] + np.arange(4)]
        return (o[:, 0] << 24) | (o[:, 1] << 16) | (o[:, 2] << 8) | o[:, 3]

    lo, hi = word(p + 2), word(p + 6)
    ak = ack[k[f]].astype(np.int64)
    half, mask = 1 << 31, (1 << 32) - 1
    below = ((ak - hi) & mask) < half  # the block ends at or below the cumulative ACK
    two = (opt[f, p + 1] >= 18) & (p + 18 <= avail[f])
    inside = np.zeros(len(f), bool)
    if two.any():
        lo2, hi2 = word(np.where(two, p + 10, p + 2)), word(np.where(two, p + 14, p + 6))
        inside = two & (((lo - lo2) & mask) < half) & (((hi2 - hi) & mask) < half)
    d = (below | inside) & (lo != hi)
    if d.any():
        out = a + rows[f[d]]
        pk.tcp_dsack_lo[out] = lo[d]
        pk.tcp_dsack_hi[out] = hi[d]


def _decode_chunk(fr: Frames, pk: Packets, a: int, b: int, width: int) -> None:
    c = _Chunk(fr, a, b, width)
    n = c.n
    lt = fr.linktype[a:b]
    kinds = [int(lt[0])] if lt[0] == lt[-1] and lt.min() == lt.max() else np.unique(lt).tolist()
    if len(kinds) == 1 and kinds[0] in SUPPORTED_LINKTYPES:
        pk.decoded[a:b] = True
        l3off, l3ver, d = _link(c, kinds[0], np.arange(n))
        if d is not None:
            pk.direction[a:b] = _pick(d != 0, d, pk.direction[a:b].astype(np.int64))
    else:
        l3off = np.full(n, -1, np.int64)
        l3ver = np.zeros(n, np.int8)
        for k in kinds:
            if k not in SUPPORTED_LINKTYPES:
                continue
            rows = np.flatnonzero(lt == k)
            pk.decoded[a + rows] = True
            off, ver, d = _link(c, k, rows)
            l3off[rows] = off
            l3ver[rows] = ver
            if d is not None:
                seg = pk.direction[a:b]
                seg[rows] = np.where(d != 0, d, seg[rows])
    good = (l3ver > 0) & (l3off >= 0) & (l3off < c.caplen)
    if not good.any():
        return
    rows = np.arange(n) if good.all() else np.flatnonzero(good)
    st = {k: getattr(pk, k)[a:b] for k in _IP_KEYS}  # views: the IP layer writes straight into pk
    st["l4off"] = np.full(n, -1, np.int64)
    st["l3pay"] = np.zeros(n, np.int64)
    _ip(c, st, rows, l3off[rows], l3ver[rows], fresh=True)
    pk.outer_ip[a:b] = st["ipver"] > 0
    _tunnels(c, st)
    _transport(c, st, pk, a)


def decode(fr: Frames, width: int = DEFAULT_WIDTH, chunk: int = CHUNK) -> Packets:
    """Decode every frame's headers (see the module docstring for what is understood)."""
    n = len(fr)
    pk = Packets.alloc(n, share=fr)
    for a in range(0, n, chunk):
        _decode_chunk(fr, pk, a, min(n, a + chunk), width)
    return pk


def counts(pk: Packets) -> dict[str, int]:
    """Frame counts in tshark's terms (``ip or ipv6``, ``tcp``, ``udp``)."""
    return {"frames": len(pk), "ip": int(pk.outer_ip.sum()), "tcp": int(pk.is_tcp.sum()),
            "udp": int(pk.is_udp.sum()), "undecoded": int((~pk.decoded).sum())}
