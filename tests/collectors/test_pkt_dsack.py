"""Spurious resends told from loss: D-SACK blocks decoded from TCP options, and per flow the
retransmissions a D-SACK from the receiver shows were duplicates - on real captures of healthy
traffic (spurious resends only), of a drop on the wire (none spurious) and of a node whose ACKs
are dropped (mostly spurious), and on constructed edge cases."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from skewd.collectors.pkt.capfile import read_capture
from skewd.collectors.pkt.features import FlowTracker, analyze
from skewd.collectors.pkt.parse import decode
from skewd.collectors.pkt.samples import to_batch

pytest.importorskip("scapy.all")
from scapy.all import IP, TCP, Ether, IPv6, PcapReader  # noqa: E402
from scapy.utils import PcapWriter  # noqa: E402

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "pkt" / "veth-linux-6.18-tcp-loss"
MAC = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
T0 = 1_700_000_000.0
M32 = 1 << 32


def write(path: Path, items: list[tuple[float, object]]) -> Path:
    w = PcapWriter(str(path), linktype=1, nano=True)
    for t, p in sorted(items, key=lambda x: x[0]):
        p.time = t
        w.write(p)
    w.close()
    return path


def scapy_dsacks(path: Path) -> list[tuple[int, int, int]]:
    """(frame index, lo, hi) of every D-SACK per RFC 2883, read by scapy's option dissector."""
    out = []
    for i, p in enumerate(PcapReader(str(path))):
        if TCP not in p:
            continue
        t = p[TCP]
        for kind, v in t.options:
            if kind != "SAck" or len(v) < 2:
                continue
            lo, hi = v[0], v[1]
            below = (t.ack - hi) % M32 < M32 // 2
            inside = len(v) >= 4 and (lo - v[2]) % M32 < M32 // 2 and (v[3] - hi) % M32 < M32 // 2
            if (below or inside) and lo != hi:
                out.append((i, lo, hi))
    return out


def totals(pk, interval: float | None) -> dict[str, tuple[float, float]]:
    """Per TCP flow: (retransmissions, spurious retransmissions) at the end of the capture."""
    last: dict[str, tuple[float, float]] = {}
    for iv in analyze(pk, interval):
        for i, e in enumerate(iv.entities):
            r = iv.flows["tcp_retransmits_total"][i]
            if r == r:
                last[e] = (float(r), float(iv.flows["tcp_spurious_retransmits_total"][i]))
    return {e: v for e, v in last.items() if v[0] > 0}


@pytest.mark.parametrize("name", ["healthy-dsack", "wire-drop", "ack-loss-victim"])
def test_dsack_blocks_match_scapy_on_real_captures(tmp_path: Path, name: str) -> None:
    raw = tmp_path / f"{name}.pcap"
    raw.write_bytes(gzip.decompress((FIX / f"{name}.pcap.gz").read_bytes()))
    pk = decode(read_capture(str(raw)).frames)
    got = [(int(i), int(pk.tcp_dsack_lo[i]), int(pk.tcp_dsack_hi[i])) for i in np.flatnonzero(pk.tcp_dsack_lo >= 0)]
    assert got == scapy_dsacks(raw)
    assert (pk.tcp_dsack_hi[pk.tcp_dsack_lo < 0] == -1).all()


def test_real_healthy_resends_are_all_spurious() -> None:
    """Healthy veth traffic: every retransmission was answered by a D-SACK (the kernel agreed:
    166 retransmitted segments, 166 D-SACKed), whatever the interval cut."""
    pk = decode(read_capture(str(FIX / "healthy-dsack.pcap.gz")).frames)
    want = {"tcp 10.81.0.1:59064>10.81.0.2:7000": (1.0, 1.0), "tcp 10.81.0.3:49382>10.81.0.1:7000": (2.0, 2.0)}
    for interval in (None, 0.1, 0.01):
        assert totals(pk, interval) == want, interval


def test_real_wire_drop_resends_are_not_spurious() -> None:
    pk = decode(read_capture(str(FIX / "wire-drop.pcap.gz")).frames)
    for interval in (None, 0.1):
        assert totals(pk, interval) == {"tcp 10.81.0.1:38772>10.81.0.2:7000": (36.0, 0.0)}, interval


def test_real_ack_loss_victim_is_mostly_spurious() -> None:
    """The peer's ACKs are dropped: most resends were D-SACKed, the ones whose D-SACK was lost too are not."""
    pk = decode(read_capture(str(FIX / "ack-loss-victim.pcap.gz")).frames)
    for interval in (None, 0.25):
        t = totals(pk, interval)
        assert t["tcp 10.81.0.3:55960>10.81.0.1:7000"] == (9.0, 7.0), interval


# -- constructed cases: option layouts and interval boundaries ---------------------------------

SRC, DST = "10.12.0.1", "10.12.0.2"


def data(seq: int, n: int = 1000, t: float | None = None):
    """Data segment of the flow 10.12.0.1:40000 > 10.12.0.2:80 (timestamps on, as Linux sends them)."""
    return Ether(**MAC) / IP(src=SRC, dst=DST) / TCP(sport=40000, dport=80, seq=seq, ack=1, flags="A",
                                                      options=[("NOP", None), ("NOP", None),
                                                               ("Timestamp", (100, 200))]) / (b"d" * n)


def ack(a: int, sack: list[int] | None = None, ts: bool = True, v6: bool = False):
    """ACK from the receiver; ``sack``: SACK block edges [lo1, hi1, lo2, hi2, ...]."""
    opts: list = [("NOP", None), ("NOP", None), ("Timestamp", (300, 400))] if ts else []
    if sack:
        opts += [("NOP", None), ("NOP", None), ("SAck", tuple(sack))]
    ip = IPv6(src="fd00::2", dst="fd00::1") if v6 else IP(src=DST, dst=SRC)
    return Ether(**MAC) / ip / TCP(sport=80, dport=40000, seq=1, ack=a, flags="A", options=opts)


def decoded(tmp_path: Path, items) -> object:
    return decode(read_capture(str(write(tmp_path / "c.pcap", items))).frames)


def test_dsack_option_layouts(tmp_path: Path) -> None:
    items = [
        (T0 + 0.0, ack(5000, [3000, 4000])),                       # below the ACK: D-SACK
        (T0 + 0.1, ack(5000, [7000, 8000, 6000, 9000])),            # inside the second block: D-SACK
        (T0 + 0.2, ack(5000, [6000, 7000])),                       # plain SACK above the ACK: no
        (T0 + 0.3, ack(5000, [4000, 5000], ts=False)),             # no timestamps (header length 32)
        (T0 + 0.4, ack(5000, [4000, 5000], v6=True)),              # IPv6
        (T0 + 0.5, ack(5000)),                                     # timestamps only
        (T0 + 0.6, ack(M32 - 10, [M32 - 1000, 500])),              # block across the 2^32 wrap, below the ACK? no
        (T0 + 0.7, ack(600, [M32 - 1000, 500])),                   # ... and with the ACK beyond it: D-SACK
    ]
    pk = decoded(tmp_path, items)
    lo, hi = pk.tcp_dsack_lo.tolist(), pk.tcp_dsack_hi.tolist()
    assert list(zip(lo, hi)) == [(3000, 4000), (7000, 8000), (-1, -1), (4000, 5000), (4000, 5000), (-1, -1),
                                 (-1, -1), (M32 - 1000, 500)]


def test_malformed_or_cut_options_are_ignored(tmp_path: Path) -> None:
    base = bytes(ack(5000, [3000, 4000]))
    # the same ACK with its SACK option's length byte set to 0 (a walk must not loop) and one
    # whose capture stops inside the SACK block
    off = 14 + 20 + 20 + 12 + 2  # Ethernet, IP, TCP, NOP NOP TS, NOP NOP: the SACK kind byte
    bad = bytearray(base)
    bad[off + 1] = 0
    w = PcapWriter(str(tmp_path / "m.pcap"), linktype=1, nano=True, snaplen=65535)
    w.write_header(None)
    w.write_packet(bytes(bad), sec=int(T0), usec=0)
    w.write_packet(base[:off + 6], sec=int(T0) + 1, usec=0, wirelen=len(base))
    w.write_packet(base, sec=int(T0) + 2, usec=0)
    w.close()
    pk = decode(read_capture(str(tmp_path / "m.pcap")).frames)
    assert pk.tcp_dsack_lo.tolist() == [-1, -1, 3000]


def test_each_resend_counts_once_and_only_with_an_overlapping_dsack(tmp_path: Path) -> None:
    items = [(T0 + k * 1e-3, data(1000 + 1000 * k)) for k in range(5)]  # 1000..6000 sent
    items += [(T0 + 0.3, data(5000)), (T0 + 0.31, ack(6000, [5000, 6000])), (T0 + 0.311, ack(6000, [5000, 6000]))]
    items += [(T0 + 0.6, data(3000)), (T0 + 0.61, ack(6000, [1000, 2000]))]  # D-SACK for other bytes
    (iv,) = analyze(decoded(tmp_path, items))
    f = iv.flow(f"tcp {SRC}:40000>{DST}:80")
    assert (f["tcp_retransmits_total"], f["tcp_spurious_retransmits_total"]) == (2, 1)


def test_dsack_in_the_next_interval_reaches_an_idle_flow(tmp_path: Path) -> None:
    """A tail-loss probe at the end of one collect, its D-SACK in the next while the data flow
    is silent: the flow's spurious count rises in that next collect and is emitted there."""
    items = [(T0 + k * 1e-3, data(1000 + 1000 * k)) for k in range(3)]
    items += [(T0 + 0.99, data(3000)), (T0 + 1.001, ack(4000, [3000, 4000]))]
    pk = decoded(tmp_path, items)
    tr = FlowTracker(0.001)
    cut = int(np.searchsorted(pk.ts_ns, int((T0 + 1.0) * 1e9)))
    first = tr.update(pk.take(np.arange(cut)), T0, T0 + 1.0)
    second = tr.update(pk.take(np.arange(cut, len(pk))), T0 + 1.0, T0 + 2.0)
    e = f"tcp {SRC}:40000>{DST}:80"
    assert first.flow(e)["tcp_spurious_retransmits_total"] == 0 and first.flow(e)["tcp_retransmits_total"] == 1
    assert second.flow(e)["packets"] == 0 and second.flow(e)["tcp_spurious_retransmits_total"] == 1
    b = to_batch(second, "n1", T0 + 2.0)
    got = {(str(en), str(s)): v for en, s, v in zip(b.entity, b.signal, b.value)}
    assert got[(e, "pkt_flow_tcp_spurious_retransmits_total")] == 1
    assert (e, "pkt_flow_tcp_retransmits_total") not in got  # silent flows do not repeat other counters


def test_dsack_two_intervals_late_is_not_matched(tmp_path: Path) -> None:
    """Unmatched resends wait one interval: a D-SACK arriving after that (longer than an
    interval's round trip) no longer marks them spurious."""
    items = [(T0 + k * 1e-3, data(1000 + 1000 * k)) for k in range(3)]
    items += [(T0 + 0.5, data(3000)), (T0 + 2.5, ack(4000, [3000, 4000]))]
    pk = decoded(tmp_path, items)
    ivs = analyze(pk, 1.0)
    e = f"tcp {SRC}:40000>{DST}:80"
    assert ivs[-1].flow(e)["tcp_retransmits_total"] == 1
    assert ivs[-1].flow(e)["tcp_spurious_retransmits_total"] == 0
    (whole,) = analyze(pk)  # one interval: the D-SACK is in it
    assert whole.flow(e)["tcp_spurious_retransmits_total"] == 1


def test_handshake_rtt_is_learnt_in_an_in_order_interval(tmp_path: Path) -> None:
    """The handshake usually arrives in an interval where everything is in order; its RTT (here
    100 us) must still become the flow's reordering threshold, so a resend 1 ms after the last
    forward progress in a later interval is a retransmission - as in a single pass - and not
    reordering under the 3 ms default."""
    def seg(seq: int, flags: str, n: int = 0, a: int = 0):
        return Ether(**MAC) / IP(src=SRC, dst=DST) / TCP(sport=40000, dport=80, seq=seq, ack=a, flags=flags) / (b"d" * n)

    def rev(flags: str, a: int):
        return Ether(**MAC) / IP(src=DST, dst=SRC) / TCP(sport=80, dport=40000, seq=0, ack=a, flags=flags)

    items = [(T0, seg(999, "S")), (T0 + 5e-5, rev("SA", 1000)), (T0 + 1e-4, seg(1000, "A", a=1))]
    items += [(T0 + 0.01 + k * 1e-4, seg(1000 + 1000 * k, "A", 1000, 1)) for k in range(3)]
    items += [(T0 + 1.5, seg(4000, "A", 1000, 1)), (T0 + 1.501, seg(2000, "A", 1000, 1))]
    pk = decoded(tmp_path, items)
    e = f"tcp {SRC}:40000>{DST}:80"
    (whole,) = analyze(pk)
    assert whole.flow(e)["tcp_retransmits_total"] == 1
    assert analyze(pk, 1.0)[-1].flow(e)["tcp_retransmits_total"] == 1
