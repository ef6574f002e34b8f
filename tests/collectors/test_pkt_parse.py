"""Header decoding against packets built and dissected by scapy (the independent reference):
every link type we claim, VLAN/QinQ, IPv6 extension headers, fragments, tunnels, RoCEv2."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from skewd.collectors.pkt.capfile import read_capture
from skewd.collectors.pkt.frames import DIR_IN, DIR_OUT
from skewd.collectors.pkt.parse import counts, decode

scapy_all = pytest.importorskip("scapy.all")
from scapy.all import (GRE, IP, TCP, UDP, Dot1AD, Dot1Q, Ether, IPv6, IPv6ExtHdrFragment,  # noqa: E402
                       IPv6ExtHdrHopByHop, Raw)
from scapy.contrib.roce import BTH  # noqa: E402
from scapy.utils import PcapWriter  # noqa: E402

MAC = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")  # never let scapy resolve addresses


def _write(tmp_path: Path, pkts, linktype: int, name: str = "t.pcap") -> Path:
    path = tmp_path / name
    w = PcapWriter(str(path), linktype=linktype, nano=True)
    for i, p in enumerate(pkts):
        if isinstance(p, bytes):
            p = Raw(p)
        p.time = 1_700_000_000 + i / 1000
        w.write(p)
    w.close()
    data = bytearray(path.read_bytes())
    if struct.unpack_from("<I", data, 20)[0] != linktype:  # scapy treats linktype 0 (NULL) as "unset"
        struct.pack_into("<I", data, 20, linktype)
        path.write_bytes(bytes(data))
    return path


def _decode(tmp_path: Path, pkts, linktype: int = 1):
    cap = read_capture(_write(tmp_path, pkts, linktype))
    assert cap.problems == []
    return decode(cap.frames)


def _addr4(a: str) -> int:
    return struct.unpack(">I", bytes(int(x) for x in a.split(".")))[0]


def test_ethernet_vlan_qinq_tcp_fields(tmp_path: Path) -> None:
    base = IP(src="10.1.0.1", dst="10.1.0.2", tos=0x03) / TCP(sport=40000, dport=443, seq=4294967000, ack=77,
                                                              flags="PA", window=501) / (b"d" * 100)
    pkts = [Ether(**MAC) / base, Ether(**MAC) / Dot1Q(vlan=7) / base,
            Ether(**MAC) / Dot1AD(vlan=100) / Dot1Q(vlan=7) / base]
    pk = _decode(tmp_path, pkts)
    assert counts(pk) == {"frames": 3, "ip": 3, "tcp": 3, "udp": 0, "undecoded": 0}
    for i, p in enumerate(pkts):
        t = p[TCP]
        assert (pk.sport[i], pk.dport[i]) == (t.sport, t.dport)
        assert pk.tcp_seq[i] == t.seq and pk.tcp_ack[i] == t.ack and pk.tcp_win[i] == t.window
        assert pk.tcp_flags[i] == int(t.flags)
        assert pk.payload[i] == 100
        assert pk.src_lo[i] == _addr4("10.1.0.1") and pk.dst_lo[i] == _addr4("10.1.0.2")
        assert pk.ecn[i] == 3 and pk.wirelen[i] == len(bytes(p))


def test_ipv6_extension_headers_and_fragments(tmp_path: Path) -> None:
    u = UDP(sport=5353, dport=4791) / BTH(opcode=10, dqpn=0xABCDE, psn=0xFFFFF0) / (b"r" * 64)
    whole = IPv6(src="fd00::1", dst="fd00::2") / IPv6ExtHdrHopByHop() / u
    frag0 = IPv6(src="fd00::1", dst="fd00::2") / IPv6ExtHdrFragment(offset=0, m=1, id=9) / UDP(sport=1, dport=2) / (b"a" * 40)
    frag1 = IPv6(src="fd00::1", dst="fd00::2") / IPv6ExtHdrFragment(offset=6, m=0, id=9, nh=17) / (b"b" * 40)
    pk = _decode(tmp_path, [Ether(**MAC) / whole, Ether(**MAC) / frag0, Ether(**MAC) / frag1])
    assert pk.ipver.tolist() == [6, 6, 6] and pk.proto.tolist() == [17, 17, 17]
    assert pk.sport.tolist()[:2] == [5353, 1] and pk.sport[2] == 0
    assert pk.frag.tolist() == [False, False, True]
    assert counts(pk)["udp"] == 2  # the later fragment has no UDP header
    assert pk.src_hi[0] == 0xFD00 << 48 and pk.src_lo[0] == 1 and pk.dst_lo[0] == 2
    assert (pk.bth_opcode[0], pk.bth_qp[0], pk.bth_psn[0]) == (10, 0xABCDE, 0xFFFFF0)
    assert pk.payload[0] == len(bytes(u)) - 8


def test_ipv4_options_and_fragments(tmp_path: Path) -> None:
    opt = IP(src="10.2.0.1", dst="10.2.0.2", options=b"\x94\x04\x00\x00") / UDP(sport=7, dport=8) / b"x"
    f0 = IP(src="10.2.0.1", dst="10.2.0.2", flags="MF", frag=0, proto=17) / UDP(sport=9, dport=10) / (b"y" * 32)
    f1 = IP(src="10.2.0.1", dst="10.2.0.2", frag=5, proto=17) / (b"z" * 32)
    pk = _decode(tmp_path, [Ether(**MAC) / opt, Ether(**MAC) / f0, Ether(**MAC) / f1])
    assert pk.sport.tolist() == [7, 9, 0] and pk.frag.tolist() == [False, False, True]
    assert pk.payload.tolist()[0] == 1


def test_gre_and_ip_in_ip_use_the_inner_flow(tmp_path: Path) -> None:
    inner = IP(src="192.168.5.1", dst="192.168.5.2") / TCP(sport=1111, dport=2222, flags="S")
    gre = Ether(**MAC) / IP(src="10.3.0.1", dst="10.3.0.2") / GRE(key_present=1, key=5) / inner
    ipip = Ether(**MAC) / IP(src="10.3.0.1", dst="10.3.0.2") / inner
    gre_eth = Ether(**MAC) / IP(src="10.3.0.1", dst="10.3.0.2") / GRE(proto=0x6558) / Ether(**MAC) / inner
    pk = _decode(tmp_path, [gre, ipip, gre_eth])
    assert pk.outer_ip.all() and pk.proto.tolist() == [6, 6, 6]
    assert pk.src_lo.tolist() == [_addr4("192.168.5.1")] * 3
    assert pk.sport.tolist() == [1111] * 3


@pytest.mark.parametrize("lt", [101, 12, 228])
def test_raw_ipv4(tmp_path: Path, lt: int) -> None:
    pk = _decode(tmp_path, [bytes(IP(src="10.4.0.1", dst="10.4.0.2") / UDP(sport=3, dport=4))], lt)
    assert counts(pk)["udp"] == 1 and pk.sport[0] == 3


def test_raw_ipv6_linktype_rejects_ipv4(tmp_path: Path) -> None:
    pk = _decode(tmp_path, [bytes(IPv6(src="::1", dst="::2") / TCP(sport=5, dport=6)),
                            bytes(IP(src="10.4.0.1", dst="10.4.0.2") / UDP(sport=3, dport=4))], 229)
    assert pk.ipver.tolist() == [6, 0]


def _sll(pkttype: int, proto: int, payload: bytes) -> bytes:
    return struct.pack(">HHH8sH", pkttype, 1, 6, b"\x02\0\0\0\0\x01\0\0", proto) + payload


def _sll2(pkttype: int, proto: int, payload: bytes) -> bytes:
    return struct.pack(">HHIHBB8s", proto, 0, 3, 1, pkttype, 6, b"\x02\0\0\0\0\x01\0\0") + payload


@pytest.mark.parametrize("lt,make", [(113, _sll), (276, _sll2)])
def test_linux_cooked_direction(tmp_path: Path, lt: int, make) -> None:
    ip4 = bytes(IP(src="10.5.0.1", dst="10.5.0.2") / UDP(sport=1, dport=2))
    ip6 = bytes(IPv6(src="fd00::1", dst="fd00::2") / TCP(sport=3, dport=4))
    pk = _decode(tmp_path, [make(0, 0x0800, ip4), make(4, 0x86DD, ip6), make(0, 0x0806, b"\0" * 28)], lt)
    assert pk.ipver.tolist() == [4, 6, 0]
    assert pk.direction.tolist() == [DIR_IN, DIR_OUT, DIR_IN]


@pytest.mark.parametrize("family", [struct.pack("<I", 2), struct.pack(">I", 2), struct.pack("<I", 30),
                                    struct.pack("<I", 24), struct.pack("<I", 10)])
def test_null_loopback_families(tmp_path: Path, family: bytes) -> None:
    v6 = struct.unpack("<I", family)[0] in (30, 24, 10)
    body = bytes(IPv6(src="::1", dst="::1") / UDP(sport=9, dport=9)) if v6 else \
        bytes(IP(src="127.0.0.1", dst="127.0.0.1") / UDP(sport=9, dport=9))
    pk = _decode(tmp_path, [family + body], 0)
    assert pk.ipver[0] == (6 if v6 else 4) and pk.sport[0] == 9


def test_non_ip_and_truncated_headers(tmp_path: Path) -> None:
    arp = Ether(src="02:00:00:00:00:01", dst="ff:ff:ff:ff:ff:ff", type=0x0806) / (b"\0" * 28)
    full = Ether(**MAC) / IP(src="10.6.0.1", dst="10.6.0.2") / TCP(sport=1, dport=2) / (b"p" * 500)
    path = tmp_path / "snap.pcap"
    w = PcapWriter(str(path), linktype=1, snaplen=40)  # header-only capture: TCP header cut short
    for i, p in enumerate([arp, full]):
        p.time = 1.0 + i
        w.write(p)
    w.close()
    raw = bytearray(path.read_bytes())
    # scapy writes full frames; truncate the second to 40 bytes as tcpdump -s 40 would
    cap = read_capture(path)
    assert counts(decode(cap.frames))["ip"] == 1
    off = int(cap.frames.doff[1])
    rec = off - 16
    struct.pack_into("<I", raw, rec + 8, 40)
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(bytes(raw[: off + 40]))
    pk = decode(read_capture(cut).frames)
    assert pk.ipver.tolist() == [0, 4]
    assert not pk.l4ok[1]  # 40 bytes hold Ethernet + IP but only 6 of TCP's 14: not decoded
    assert pk.wirelen[1] == len(bytes(full))  # rates count what was on the wire, not what was kept
    assert pk.payload[1] == 520  # without the TCP header, the IP payload is what is known


def test_roce_bth_over_ipv4(tmp_path: Path) -> None:
    pkts = [Ether(**MAC) / IP(src="10.7.0.1", dst="10.7.0.2") / UDP(sport=49152 + i, dport=4791)
            / BTH(opcode=op, dqpn=0x10 + i, psn=i) / (b"q" * 32) for i, op in enumerate([0, 1, 2, 4, 17, 0x81])]
    pk = _decode(tmp_path, pkts)
    assert pk.bth_opcode.tolist() == [0, 1, 2, 4, 17, 0x81]
    assert pk.bth_qp.tolist() == [0x10 + i for i in range(6)]
    assert pk.bth_psn.tolist() == list(range(6))
    # a UDP datagram to another port carries no BTH
    pk = _decode(tmp_path, [Ether(**MAC) / IP(src="10.7.0.1", dst="10.7.0.2") / UDP(sport=1, dport=4792) / (b"q" * 32)])
    assert pk.bth_opcode[0] == -1


def test_chunking_and_width_do_not_change_results(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    pkts = []
    for i in range(300):
        kind = rng.integers(0, 4)
        if kind == 0:
            p = Ether(**MAC) / IP(src="10.8.0.1", dst=f"10.8.0.{i % 7 + 2}") / TCP(sport=1000 + i % 5, dport=80, seq=i * 100) / (b"a" * 10)
        elif kind == 1:
            p = Ether(**MAC) / Dot1Q(vlan=3) / IPv6(src="fd00::1", dst="fd00::9") / UDP(sport=i, dport=4791) / BTH(psn=i) / b"b"
        elif kind == 2:
            p = Ether(**MAC) / IP(src="10.8.0.1", dst="10.8.0.2", options=b"\x01\x01\x01\x00") / UDP(sport=i, dport=53)
        else:
            p = Ether(**MAC, type=0x0806) / (b"\0" * 28)
        pkts.append(p)
    cap = read_capture(_write(tmp_path, pkts, 1))
    ref = decode(cap.frames, width=256, chunk=1 << 20)
    for width, chunk in ((64, 7), (96, 50), (128, 300)):
        got = decode(cap.frames, width=width, chunk=chunk)
        for name in ("ipver", "proto", "src_lo", "dst_lo", "src_hi", "sport", "dport", "l4ok", "payload",
                     "tcp_flags", "bth_psn", "bth_opcode"):
            assert np.array_equal(getattr(got, name), getattr(ref, name)), (name, width, chunk)
        assert np.array_equal(got.tcp_seq[got.is_tcp], ref.tcp_seq[ref.is_tcp])
