"""Generated classic BPF filters, run by a small reference interpreter (below) on frames built
by scapy; whether a frame should match is decided by scapy's own dissection. The kernel runs
the same programs in test_pkt_live.py."""
from __future__ import annotations

import struct

import pytest

from skewd.collectors.pkt.bpf import FilterError, compile_filter, pack, parse_program, to_text

pytest.importorskip("scapy.all")
from scapy.all import ARP, IP, TCP, UDP, Dot1Q, Ether, IPv6  # noqa: E402
from scapy.contrib.roce import BTH  # noqa: E402

MAC = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
SNAP = 128


def run(prog, pkt: bytes) -> int:
    """Interpret classic BPF as the kernel does (a load past the end rejects the packet)."""
    A = X = 0
    pc = 0
    while True:
        code, jt, jf, k = prog[pc]
        cls = code & 0x07
        if cls == 0x00:  # LD
            size = {0x00: 4, 0x08: 2, 0x10: 1}[code & 0x18]
            off = k + (X if code & 0xE0 == 0x40 else 0)
            if off + size > len(pkt):
                return 0
            A = int.from_bytes(pkt[off:off + size], "big")
        elif cls == 0x01:  # LDX (only BPF_MSH is generated)
            assert code == 0xB1
            if k >= len(pkt):
                return 0
            X = 4 * (pkt[k] & 0x0F)
        elif cls == 0x04:  # ALU (only AND #k)
            assert code == 0x54
            A &= k
        elif cls == 0x05:  # JMP
            op = code & 0xF0
            cond = {0x10: A == k, 0x20: A > k, 0x30: A >= k, 0x40: bool(A & k)}[op]
            pc += jt if cond else jf
        elif cls == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
        pc += 1


def frames():
    v4 = dict(src="10.20.0.1", dst="10.20.0.2")
    v6 = dict(src="fd00::1", dst="fd00::2")
    return [
        Ether(**MAC) / IP(**v4) / UDP(sport=1234, dport=4791) / BTH(psn=1) / b"x",
        Ether(**MAC) / IP(**v4) / UDP(sport=4791, dport=1234) / b"x",
        Ether(**MAC) / IP(**v4) / UDP(sport=53, dport=5353) / b"x",
        Ether(**MAC) / IP(**v4, options=b"\x01\x01\x01\x00") / TCP(sport=40000, dport=8000),
        Ether(**MAC) / IP(**v4) / TCP(sport=8000, dport=40000),
        Ether(**MAC) / IP(**v4, frag=10, proto=17) / (b"\x12\xb7\x12\xb7" + b"y" * 20),  # later fragment
        Ether(**MAC) / IPv6(**v6) / UDP(sport=7, dport=4791) / BTH(psn=2) / b"x",
        Ether(**MAC) / IPv6(**v6) / TCP(sport=8000, dport=9),
        Ether(**MAC) / IPv6(**v6, nh=58) / b"\x80\0\0\0",
        Ether(**MAC) / ARP(),
        Ether(**MAC) / IP(src="10.20.0.9", dst="10.20.0.1") / UDP(sport=1, dport=2),
        Ether(**MAC) / Dot1Q(vlan=5) / IP(**v4) / UDP(sport=1, dport=4791),  # tagged (the kernel strips it)
    ]


def truth(expr: str, p) -> bool:
    """Scapy's verdict for the supported expressions (no VLAN: the kernel strips tags)."""
    if Dot1Q in p:
        return False
    l4 = p[TCP] if TCP in p else p[UDP] if UDP in p else None
    ip4 = p[IP] if IP in p else None
    if ip4 is not None and ip4.frag:
        l4 = None
    terms = []
    for t in expr.split(" or "):
        w = t.split()
        if w == ["ip"]:
            terms.append(IP in p)
        elif w == ["ip6"]:
            terms.append(IPv6 in p)
        elif w in (["tcp"], ["udp"]):  # like tcpdump: the protocol field, later fragments included
            num = 6 if w[0] == "tcp" else 17
            terms.append((ip4 is not None and ip4.proto == num) or (IPv6 in p and p[IPv6].nh == num))
        elif w[0] == "host":
            terms.append(ip4 is not None and w[1] in (ip4.src, ip4.dst))
        else:
            if w == ["roce"]:
                w = ["udp", "dst", "port", "4791"]
            proto = w.pop(0) if w[0] in ("tcp", "udp") else None
            d = w.pop(0) if w[0] in ("src", "dst") else ""
            port = int(w[1])
            ok = l4 is not None and (proto is None or isinstance(l4, TCP if proto == "tcp" else UDP))
            ports = {"": (l4.sport, l4.dport) if ok else (), "src": (l4.sport,) if ok else (),
                     "dst": (l4.dport,) if ok else ()}[d]
            terms.append(ok and port in ports)
    return any(terms)


EXPRS = ["ip", "ip6", "ip or ip6", "tcp", "udp", "udp port 4791", "udp dst port 4791", "roce", "tcp port 8000",
         "port 4791", "src port 4791", "tcp src port 8000", "host 10.20.0.9", "udp port 53 or tcp port 8000",
         "roce or ip6"]


@pytest.mark.parametrize("expr", EXPRS)
def test_generated_filter_matches_scapy_verdict(expr: str) -> None:
    prog = compile_filter(expr, SNAP)
    for p in frames():
        got = run(prog, bytes(p))
        assert (got > 0) == truth(expr, p), (expr, p.summary())
        assert got in (0, SNAP)


def test_no_filter_truncates_only() -> None:
    prog = compile_filter(None, 96)
    assert all(run(prog, bytes(p)) == 96 for p in frames())


def test_raw_ip_link_filters() -> None:
    prog = compile_filter("udp dst port 4791 or ip6", SNAP, link="raw")
    v4 = bytes(IP(src="10.20.0.1", dst="10.20.0.2") / UDP(sport=1, dport=4791))
    v4_other = bytes(IP(src="10.20.0.1", dst="10.20.0.2") / UDP(sport=1, dport=4792))
    v6 = bytes(IPv6(src="::1", dst="::2") / TCP())
    assert [run(prog, b) > 0 for b in (v4, v4_other, v6)] == [True, False, True]


@pytest.mark.parametrize("bad", ["udp and port 5", "portrange 1-5", "tcp port 99999", "host fd00::1", "udp port"])
def test_unsupported_expressions_say_what_is_supported(bad: str) -> None:
    with pytest.raises(FilterError, match="supported|IPv4"):
        compile_filter(bad, SNAP)


def test_raw_program_text_and_list() -> None:
    prog = compile_filter("udp port 53", 262144)
    text = to_text(prog)
    assert text.splitlines()[0] == str(len(prog))
    again = parse_program(text, SNAP)  # tcpdump -ddd form; accepting returns capped to the snaplen
    assert [i[:3] for i in again] == [i[:3] for i in prog]
    assert {i[3] for i in again if i[0] == 0x06} == {0, SNAP}
    assert parse_program([list(i) for i in prog], SNAP) == again
    assert len(pack(again)) == 8 * len(again)
    with pytest.raises(FilterError, match="ret"):
        parse_program([[0x28, 0, 0, 12]], SNAP)
    with pytest.raises(FilterError, match="tcpdump -ddd"):
        parse_program("3\n1 2 3", SNAP)
    assert struct.unpack("HBBI", pack(again)[:8]) == again[0]
