"""Leaving the agent's own connection out of packet features: packet masks for both directions
(IPv4, IPv6, IPv4-mapped socket names) and forgetting flows the tracker already started."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from skewd.collectors.pkt.capfile import read_capture
from skewd.collectors.pkt.collector import PktCollector
from skewd.collectors.pkt.features import FlowTracker
from skewd.collectors.pkt.ignore import connection_mask, end_of, flow_keys
from skewd.collectors.pkt.parse import decode

pytest.importorskip("scapy.all")
from scapy.all import IP, TCP, UDP, Ether, IPv6  # noqa: E402
from scapy.utils import PcapWriter  # noqa: E402

T0 = 1_700_000_000.0


def capture(tmp_path: Path, pkts) -> object:
    w = PcapWriter(str(tmp_path / "i.pcap"), linktype=1, nano=True)
    for k, p in enumerate(pkts):
        p.time = T0 + k * 0.001
        w.write(p)
    w.close()
    return decode(read_capture(str(tmp_path / "i.pcap")).frames)


def seg(src: str, sp: int, dst: str, dp: int):
    ip = IPv6(src=src, dst=dst) if ":" in src else IP(src=src, dst=dst)
    return Ether() / ip / TCP(sport=sp, dport=dp, flags="A") / b"x"


def test_both_directions_of_the_connection_only(tmp_path: Path) -> None:
    pk = capture(tmp_path, [
        seg("10.0.0.1", 40000, "10.0.0.9", 4222), seg("10.0.0.9", 4222, "10.0.0.1", 40000),  # own, both ways
        seg("10.0.0.1", 40001, "10.0.0.9", 4222),  # another client of the same server
        seg("10.0.0.2", 40000, "10.0.0.9", 4222),  # same port, another host
        Ether() / IP(src="10.0.0.1", dst="10.0.0.9") / UDP(sport=40000, dport=4222),  # not TCP
        seg("fd00::1", 40000, "fd00::9", 4222), seg("fd00::9", 4222, "fd00::1", 40000),  # own over IPv6
    ])
    conns = [(end_of("::ffff:10.0.0.1", 40000), end_of("10.0.0.9", 4222)),  # dual-stack socket name
             (end_of("fd00::1", 40000), end_of("fd00::9", 4222))]
    assert connection_mask(pk, conns).tolist() == [True, True, False, False, False, True, True]
    assert not connection_mask(pk, []).any()


def test_forget_drops_tracked_flows_of_the_connection(tmp_path: Path) -> None:
    pk = capture(tmp_path, [seg("10.0.0.1", 40000, "10.0.0.9", 4222), seg("10.0.0.9", 4222, "10.0.0.1", 40000),
                            seg("10.0.0.1", 40001, "10.0.0.9", 4222)])
    tr = FlowTracker(0.001)
    tr.update(pk, T0, T0 + 1)
    conn = (end_of("10.0.0.1", 40000), end_of("10.0.0.9", 4222))
    assert tr.forget(flow_keys([conn])) == 2
    iv = tr.update(pk.take(np.zeros(0, np.int64)), T0 + 1, T0 + 2)
    assert iv.entities == ["tcp 10.0.0.1:40001>10.0.0.9:4222"]  # idle, still reported; the forgotten are gone
    assert tr.forget(flow_keys([conn])) == 0


def test_collector_accumulates_and_bounds_ignored_connections() -> None:
    c = PktCollector("n", {"interface": "lo"})
    c.ignore_connections([(("10.0.0.1", 40000), ("10.0.0.9", 4222))])
    c.ignore_connections([(("10.0.0.1", 40002), ("10.0.0.9", 4222)), (("/run/nats.sock", 0), ("", 0))])
    assert [a[3] for a, _ in c._ignore] == [40000, 40002]  # the non-IP one is skipped
    for p in range(20):
        c.ignore_connections([(("10.0.0.1", 41000 + p), ("10.0.0.9", 4222))])
    assert len(c._ignore) == 8 and c._ignore[-1][0][3] == 41019
