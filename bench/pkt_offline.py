"""Offline packet-timing speed: pcap → frames → headers → per-flow features.

Generates a pcap of N packets with numpy (scapy would need minutes for a million packets):
Ethernet/IPv4, a mix of UDP (some RoCEv2 on 4791) and TCP over F flows, varied frame sizes
(so records have different lengths), header-only snaplen optional. Then times each stage.

    .venv/bin/python bench/pkt_offline.py [--packets 1000000] [--flows 1000] [--snaplen 0]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def make_pcap(path: str, n: int = 1_000_000, flows: int = 1000, snaplen: int = 0, seed: int = 1,
              nano: bool = False) -> None:
    rng = np.random.default_rng(seed)
    sizes = rng.choice(np.array([64, 200, 590, 1514]), size=n, p=[0.3, 0.4, 0.1, 0.2]).astype(np.int64)
    caplen = sizes if not snaplen else np.minimum(sizes, snaplen)
    flow = rng.integers(0, flows, n)
    is_tcp = flow % 3 == 0
    ts = 1_700_000_000 * 10**9 + np.cumsum(rng.exponential(2_000, n)).astype(np.int64)  # ~500k pps
    hdr = np.zeros((n, 16 + 54), np.uint8)
    rec = hdr[:, :16].view("<u4")
    rec[:, 0] = ts // 10**9
    rec[:, 1] = (ts % 10**9) if nano else (ts % 10**9) // 1000
    rec[:, 2] = caplen
    rec[:, 3] = sizes
    f = hdr[:, 16:]
    f[:, 0:6] = [2, 0, 0, 0, 0, 2]
    f[:, 6:12] = [2, 0, 0, 0, 0, 1]
    f[:, 12:14] = [8, 0]
    f[:, 14] = 0x45
    tot = sizes - 14
    f[:, 16] = tot >> 8
    f[:, 17] = tot & 255
    f[:, 22] = 64
    f[:, 23] = np.where(is_tcp, 6, 17)
    f[:, 26:30] = [10, 0, 0, 1]
    f[:, 28] = flow >> 8
    f[:, 29] = flow & 255
    f[:, 30:34] = [10, 0, 1, 1]
    sport = 10000 + flow
    dport = np.where(is_tcp, 5201, np.where(flow % 3 == 1, 4791, 5000))
    f[:, 34], f[:, 35] = sport >> 8, sport & 255
    f[:, 36], f[:, 37] = dport >> 8, dport & 255
    # TCP: increasing sequence numbers per flow, data offset 5, ACK flag
    seq = np.zeros(n, np.int64)
    pay = sizes - 54
    o = np.argsort(flow, kind="stable")
    cs = np.cumsum(pay[o])
    seq[o] = cs - pay[o]
    seq = (seq + flow * 7919) & 0xFFFFFFFF
    f[:, 38:42] = seq.astype(">u4").view(np.uint8).reshape(n, 4)
    f[:, 46] = np.where(is_tcp, 0x50, 0)
    f[:, 47] = np.where(is_tcp, 0x10, 0)
    udplen = sizes - 34
    f[:, 38] = np.where(is_tcp, f[:, 38], udplen >> 8)
    f[:, 39] = np.where(is_tcp, f[:, 39], udplen & 255)
    roce = ~is_tcp & (dport == 4791)
    f[:, 42] = np.where(roce, 4, f[:, 42])  # BTH opcode RC SEND_ONLY
    psn = np.zeros(n, np.int64)
    psn[o] = np.arange(n) - np.searchsorted(flow[o], flow[o])
    f[:, 51] = np.where(roce, (psn >> 16) & 255, f[:, 51])
    f[:, 52] = np.where(roce, (psn >> 8) & 255, f[:, 52])
    f[:, 53] = np.where(roce, psn & 255, f[:, 53])
    reclen = 16 + caplen
    offs = 24 + np.r_[0, np.cumsum(reclen)[:-1]]
    out = np.zeros(24 + int(reclen.sum()), np.uint8)
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out[:24] = np.frombuffer(np.array([magic, 0x00040002, 0, 0, snaplen or 262144, 1], "<u4").tobytes()[:24],
                             np.uint8)
    w = min(70, int(reclen.min()))
    view = np.ndarray((len(out) - w + 1,), np.dtype((np.void, w)), buffer=out, strides=(1,))
    view[offs] = np.ascontiguousarray(hdr[:, :w]).view(np.dtype((np.void, w))).ravel()
    with open(path, "wb") as fh:
        fh.write(out.tobytes())


def pcap_to_pcapng(src: str, dst: str) -> None:
    """Rewrap a pcap (from make_pcap) as pcapng: SHB, one IDB (ns resolution), one EPB per record."""
    import struct

    from skewd.collectors.pkt.capfile import frame_pcap_headers

    a = np.fromfile(src, np.uint8)
    offs, h, _ = frame_pcap_headers(a, False)
    u = np.ascontiguousarray(h).view("<u4")
    ts = u[:, 0].astype(np.int64) * 10**9 + u[:, 1].astype(np.int64) * (1 if a[0] == 0x4D else 1000)
    cap = u[:, 2].astype(np.int64)
    pad = (-cap) % 4
    blen = 32 + cap + pad
    n = len(offs)
    shb = struct.pack("<IIIHHqI", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1, 28)
    idb_body = struct.pack("<HHI", 1, 0, 0) + struct.pack("<HHB3x", 9, 1, 9) + struct.pack("<HH", 0, 0)
    idb = struct.pack("<II", 1, 12 + len(idb_body)) + idb_body + struct.pack("<I", 12 + len(idb_body))
    head = np.frombuffer(shb + idb, np.uint8)
    starts = len(head) + np.r_[0, np.cumsum(blen)[:-1]]
    out = np.zeros(len(head) + int(blen.sum()), np.uint8)
    out[: len(head)] = head
    hdr = np.zeros((n, 7), "<u4")
    hdr[:, 0], hdr[:, 1], hdr[:, 2] = 6, blen, 0
    hdr[:, 3], hdr[:, 4] = ts >> 32, ts & 0xFFFFFFFF
    hdr[:, 5], hdr[:, 6] = cap, u[:, 3]
    view = np.ndarray((len(out) - 27,), np.dtype((np.void, 28)), buffer=out, strides=(1,))
    view[starts] = hdr.view(np.dtype((np.void, 28))).ravel()
    # packet data: copy record bodies with one gather per 64-byte slice
    w = int(cap.min())
    body = np.ndarray((len(a) - w + 1,), np.dtype((np.void, w)), buffer=a, strides=(1,))[offs + 16]
    dview = np.ndarray((len(out) - w + 1,), np.dtype((np.void, w)), buffer=out, strides=(1,))
    dview[starts + 28] = body
    rest = np.flatnonzero(cap > w)
    for k in rest.tolist():  # the few bytes beyond the shortest frame (not timed)
        o, c = int(offs[k]) + 16, int(cap[k])
        out[starts[k] + 28 + w: starts[k] + 28 + c] = a[o + w: o + c]
    trail = starts + blen - 4
    tv = np.ndarray((len(out) - 3,), np.dtype((np.void, 4)), buffer=out, strides=(1,))
    tv[trail] = blen.astype("<u4").view(np.dtype((np.void, 4)))
    out.tofile(dst)


def main() -> None:
    from skewd.collectors.pkt.capfile import read_capture
    from skewd.collectors.pkt.features import analyze
    from skewd.collectors.pkt.parse import decode

    ap = argparse.ArgumentParser()
    ap.add_argument("--packets", type=int, default=1_000_000)
    ap.add_argument("--flows", type=int, default=1000)
    ap.add_argument("--snaplen", type=int, default=0)
    ap.add_argument("--interval", type=float, default=0.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pcapng", action="store_true", help="rewrap the generated file as pcapng")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.pcap")
        t = time.perf_counter()
        make_pcap(path, a.packets, a.flows, a.snaplen)
        if a.pcapng:
            pcap_to_pcapng(path, path + "ng")
            os.unlink(path)
            path += "ng"
        print(f"generated {a.packets} packets, {os.path.getsize(path) / 1e6:.0f} MB in {time.perf_counter() - t:.1f}s")
        best = None
        for _ in range(a.repeat):
            c0, t0 = time.process_time(), time.perf_counter()
            cap = read_capture(path)
            t1 = time.perf_counter()
            pk = decode(cap.frames)
            t2 = time.perf_counter()
            res = analyze(pk, interval=a.interval or None, burst_gap=0.001)
            t3, c3 = time.perf_counter(), time.process_time()
            row = (t3 - t0, t1 - t0, t2 - t1, t3 - t2, c3 - c0)
            best = row if best is None or row[0] < best[0] else best
            del cap, pk
        tot, fr, de, fe, cpu = best
        n = a.packets
        print(f"frame {fr:.3f}s  decode {de:.3f}s  features {fe:.3f}s  total {tot:.3f}s wall, {cpu:.3f}s CPU")
        print(f"{n / tot / 1e6:.2f} M packets/s end to end wall clock, {n / cpu / 1e6:.2f} M packets/s per CPU "
              f"second ({len(res)} interval(s), {len(res[-1].entities)} flows; os.getloadavg {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
