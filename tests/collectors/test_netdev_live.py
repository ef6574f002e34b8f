"""netdev against real kernels objects: two namespaces joined by a veth pair, shaped with tbf.

Traffic stays inside namespaces created here (10.213.7.0/24 exists only inside them).
IPv6 is disabled and neighbours are static, so the only frames on the wire are the test's
UDP datagrams: byte and packet counts can be asserted exactly. On a host shared with other
network experiments, ``SKEWD_TEST_NETNS_PREFIX`` and ``SKEWD_TEST_NET`` (three octets) move
the namespaces' names and subnet.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Iterator

import pytest

from skewd.collectors.base import Availability
from skewd.collectors.netdev import COLLECTOR as Netdev
from skewd.collectors.netdev.netns import run_in_netns, socket_in_netns
from skewd.model import SampleBatch

pyroute2 = pytest.importorskip("pyroute2")
from pyroute2 import IPRoute, netns  # noqa: E402

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="creating network namespaces needs root"),
]

NS_PREFIX = os.environ.get("SKEWD_TEST_NETNS_PREFIX", "skwnet-")
NET = os.environ.get("SKEWD_TEST_NET", "10.213.7")
PAYLOAD = 1000
FRAME = PAYLOAD + 8 + 20 + 14  # UDP + IPv4 + Ethernet headers: what the qdisc and link count
PORT = 5001


@dataclass
class Pair:
    ns_a: str
    ns_b: str
    if_a: str
    if_b: str
    idx_a: int
    ip_b: str = f"{NET}.2"


def _disable_ipv6() -> None:
    for key in ("all", "default"):
        with open(f"/proc/sys/net/ipv6/conf/{key}/disable_ipv6", "w") as f:
            f.write("1")


@pytest.fixture
def pair() -> Iterator[Pair]:
    tag = f"{os.getpid() % 100000}"
    ns_a, ns_b = f"{NS_PREFIX}{tag}-a", f"{NS_PREFIX}{tag}-b"
    if_a, if_b = f"skwa{tag}", f"skwb{tag}"
    netns.create(ns_a)
    netns.create(ns_b)
    try:
        for ns in (ns_a, ns_b):
            run_in_netns(ns, _disable_ipv6)
        with IPRoute(netns=ns_a, flags=0) as ia, IPRoute(netns=ns_b, flags=0) as ib:
            ia.link("add", ifname=if_a, kind="veth", peer={"ifname": if_b, "net_ns_fd": ns_b})
            a = ia.link_lookup(ifname=if_a)[0]
            b = ib.link_lookup(ifname=if_b)[0]
            ia.addr("add", index=a, address=f"{NET}.1", prefixlen=24)
            ib.addr("add", index=b, address=f"{NET}.2", prefixlen=24)
            mac_a = ia.get_links(a)[0].get_attr("IFLA_ADDRESS")
            mac_b = ib.get_links(b)[0].get_attr("IFLA_ADDRESS")
            ia.neigh("add", dst=f"{NET}.2", lladdr=mac_b, ifindex=a, state=0x80)  # NUD_PERMANENT
            ib.neigh("add", dst=f"{NET}.1", lladdr=mac_a, ifindex=b, state=0x80)
            ia.link("set", index=a, state="up")
            ib.link("set", index=b, state="up")
        yield Pair(ns_a, ns_b, if_a, if_b, a)
    finally:
        for ns in (ns_a, ns_b):
            try:
                netns.remove(ns)
            except OSError:
                pass


def values(batch: SampleBatch) -> dict[tuple[str, str], float]:
    return {(e, s): v for _, _, e, s, v in batch.rows()}


def delta(after: dict, before: dict, entity: str, sig: str) -> float:
    return after[(entity, sig)] - before[(entity, sig)]


def receiver(p: Pair) -> socket.socket:
    r = socket_in_netns(p.ns_b)
    r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    r.bind((f"{NET}.2", PORT))
    r.settimeout(0.5)
    return r


def drain(r: socket.socket) -> int:
    n = 0
    while True:
        try:
            r.recv(65536)
        except socket.timeout:
            return n
        n += 1


def wait_empty(c: Netdev, ifname: str, t0: float, timeout: float = 8.0) -> None:
    """Poll until the qdisc has drained. A frame just dequeued may still be in the driver, so
    callers read the link counters only after the receiver has had time to see everything."""
    deadline = time.monotonic() + timeout
    while values(c.collect(t0))[(ifname, "netdev_qdisc_qlen_packets")] and time.monotonic() < deadline:
        time.sleep(0.1)


def test_tbf_backlog_overlimits_drops_and_exact_byte_counts(pair: Pair) -> None:
    with IPRoute(netns=pair.ns_a, flags=0) as ia:
        # 1 mbit/s, 200 ms of queue: ~26 kB, about 25 frames; the rest of a burst is dropped
        ia.tc("add", "tbf", pair.idx_a, 0x10000, rate="1mbit", burst=1600, latency="200ms")
    tx = Netdev("node-a", {"netns": pair.ns_a, "interfaces": [pair.if_a]})
    rx = Netdev("node-b", {"netns": pair.ns_b, "interfaces": [pair.if_b]})
    r = receiver(pair)
    s = socket_in_netns(pair.ns_a)
    try:
        st = tx.probe()
        assert st.availability is Availability.ACTIVE and pair.if_a in st.reason
        tx.start()
        rx.start()
        v0, w0 = values(tx.collect(0.0)), values(rx.collect(0.0))
        assert v0[(pair.if_a, "netdev_link_speed_bytes")] == 10_000 * 125_000  # veth via ethtool
        assert v0[(pair.if_a, "netdev_up")] == 1

        n = 100
        for _ in range(n):
            s.sendto(b"\xab" * PAYLOAD, (pair.ip_b, PORT))
        v1 = values(tx.collect(1.0))
        qlen = v1[(pair.if_a, "netdev_qdisc_qlen_packets")]
        assert qlen > 5
        assert v1[(pair.if_a, "netdev_qdisc_backlog_bytes")] == qlen * FRAME
        drops = delta(v1, v0, pair.if_a, "netdev_qdisc_drops_total")
        assert drops > 0
        assert delta(v1, v0, pair.if_a, "netdev_qdisc_overlimits_total") > 0
        sent = delta(v1, v0, pair.if_a, "netdev_qdisc_sent_packets_total")
        assert sent + qlen + drops == n  # every datagram is accounted for exactly once

        wait_empty(tx, pair.if_a, 2.0)
        got = drain(r)  # also lets the last dequeued frame finish its trip through the driver
        v2 = values(tx.collect(2.0))
        assert v2[(pair.if_a, "netdev_qdisc_backlog_bytes")] == 0
        assert delta(v2, v0, pair.if_a, "netdev_qdisc_drops_total") == drops  # no more drops
        delivered = n - drops
        assert got == delivered  # what the receiver saw, independently of any counter
        assert delta(v2, v0, pair.if_a, "netdev_tx_packets_total") == delivered
        assert delta(v2, v0, pair.if_a, "netdev_tx_bytes_total") == delivered * FRAME
        assert delta(v2, v0, pair.if_a, "netdev_qdisc_sent_bytes_total") == delivered * FRAME
        w2 = values(rx.collect(2.0))
        assert delta(w2, w0, pair.if_b, "netdev_rx_packets_total") == got
        assert delta(w2, w0, pair.if_b, "netdev_rx_bytes_total") == got * FRAME
        assert delta(w2, w0, pair.if_b, "netdev_tx_packets_total") == 0  # no ICMP, ARP, IPv6
    finally:
        s.close()
        r.close()
        tx.stop()
        rx.stop()


def _child_stats(ns: str, idx: int, parent: int) -> dict:
    with IPRoute(netns=ns, flags=0) as ia:
        for q in ia.get_qdiscs(index=idx):
            if q["parent"] == parent:
                return dict(q.get_attr("TCA_STATS2").get_attr("TCA_STATS_QUEUE"))
    raise AssertionError("child qdisc not found")


def test_tiny_pfifo_limit_drops_are_counted_once(pair: Pair) -> None:
    with IPRoute(netns=pair.ns_a, flags=0) as ia:
        ia.tc("add", "tbf", pair.idx_a, 0x10000, rate="1mbit", burst=1600, latency="500ms")
        ia.tc("add", "pfifo", pair.idx_a, 0x100000, parent=0x10001, limit=5)
    c = Netdev("node-a", {"netns": pair.ns_a, "interfaces": [pair.if_a]})
    r = receiver(pair)
    s = socket_in_netns(pair.ns_a)
    try:
        v0 = values(c.collect(0.0))
        n = 40
        for _ in range(n):
            s.sendto(b"\xcd" * PAYLOAD, (pair.ip_b, PORT))
        v1 = values(c.collect(1.0))
        qlen = v1[(pair.if_a, "netdev_qdisc_qlen_packets")]
        assert 0 < qlen <= 5  # the pfifo holds at most its limit
        drops = delta(v1, v0, pair.if_a, "netdev_qdisc_drops_total")
        assert drops >= n - 5 - 3  # at most a couple of frames fit the tbf burst
        child = _child_stats(pair.ns_a, pair.idx_a, 0x10001)
        assert child["drops"] == drops  # root reports the child's drops once, not twice
        sent = delta(v1, v0, pair.if_a, "netdev_qdisc_sent_packets_total")
        assert sent + qlen + drops == n
        wait_empty(c, pair.if_a, 2.0)
        assert drain(r) == n - drops
        v2 = values(c.collect(2.0))
        assert delta(v2, v0, pair.if_a, "netdev_tx_bytes_total") == (n - drops) * FRAME
    finally:
        s.close()
        r.close()
        c.stop()


def test_peer_down_shows_as_link_down_and_a_carrier_change(pair: Pair) -> None:
    c = Netdev("node-a", {"netns": pair.ns_a})  # default selection: everything but lo
    try:
        v0 = values(c.collect(0.0))
        assert {e for e, _ in v0} == {pair.if_a}
        with IPRoute(netns=pair.ns_b, flags=0) as ib:
            ib.link("set", index=ib.link_lookup(ifname=pair.if_b)[0], state="down")
        deadline = time.monotonic() + 5
        while True:
            v1 = values(c.collect(1.0))
            if v1[(pair.if_a, "netdev_up")] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert v1[(pair.if_a, "netdev_up")] == 0
        assert v1[(pair.if_a, "netdev_operstate")] in (2, 3)  # down / lowerlayerdown
        assert delta(v1, v0, pair.if_a, "netdev_carrier_changes_total") == 1
    finally:
        c.stop()


def test_namespace_given_as_a_path(pair: Pair) -> None:
    """``netns`` also takes a path such as /proc/<pid>/ns/net (a container's namespace)."""
    path = f"/run/netns/{pair.ns_a}"
    c = Netdev("node-a", {"netns": path})
    try:
        assert c.probe().availability is Availability.ACTIVE
        v = values(c.collect(0.0))
        assert {e for e, _ in v} == {pair.if_a}
        assert v[(pair.if_a, "netdev_link_speed_bytes")] == 10_000 * 125_000
    finally:
        c.stop()
    own = Netdev("here", {"netns": f"/proc/{os.getpid()}/ns/net", "interfaces": ["lo"]})
    try:
        assert values(own.collect(0.0))[("lo", "netdev_operstate")] == 0  # this process's own lo
    finally:
        own.stop()


def test_own_rtnetlink_decoder_agrees_with_pyroute2_live(pair: Pair) -> None:
    """The collector decodes rtnetlink itself; on a quiet namespace (no IPv6, static
    neighbours, so no counter moves) pyroute2's full decode must give the same samples."""
    from skewd.collectors.netdev import parse
    from skewd.collectors.netdev.collector import RtnlSocket

    with IPRoute(netns=pair.ns_a, flags=0) as ia:
        ia.tc("add", "tbf", pair.idx_a, 0x10000, rate="1mbit", burst=1600, latency="200ms")
    s = socket_in_netns(pair.ns_a)
    try:
        for _ in range(30):
            s.sendto(b"\xee" * PAYLOAD, (pair.ip_b, PORT))  # backlog, drops, overlimits
    finally:
        s.close()
    ours = RtnlSocket(pair.ns_a)
    try:
        def queued() -> float:
            return sum(x.value for x in parse.qdisc_samples(ours.qdiscs(), {pair.idx_a: pair.if_a})
                       if x.signal == "netdev_qdisc_qlen_packets")

        deadline = time.monotonic() + 8  # let tbf drain: afterwards nothing moves
        while queued() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)  # the last dequeued frame leaves the driver
        with IPRoute(netns=pair.ns_a, flags=0) as ia:
            theirs_links = [m.dump() for m in ia.get_links()]
            theirs_qdiscs = [m.dump() for m in ia.get_qdiscs()]
            our_links, our_qdiscs = ours.links(), ours.qdiscs()
    finally:
        ours.close()
    every = parse.interface_filter(["*"])
    names = parse.interface_names(theirs_links)
    assert parse.interface_names(our_links) == names
    assert parse.link_samples(our_links, every) == parse.link_samples(theirs_links, every)
    q_ours = parse.qdisc_samples(our_qdiscs, names)
    assert q_ours == parse.qdisc_samples(theirs_qdiscs, names)
    drops = {s.value for s in q_ours if s.entity == pair.if_a and s.signal == "netdev_qdisc_drops_total"}
    assert drops and drops.pop() > 0  # the comparison covered a qdisc that was actually working



def _burst(p: Pair, n: int) -> None:
    s = socket_in_netns(p.ns_a)
    # a socket's queued datagrams count against its send buffer (~90 frames by default): make
    # room for the whole burst so that it reaches the qdisc at once
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    try:
        for _ in range(n):
            s.sendto(b"\x5a" * PAYLOAD, (p.ip_b, PORT))
    finally:
        s.close()


def _sampler_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "netdev-qdisc-sampler"]


@pytest.mark.parametrize("hz", [100, 0])
def test_the_sampler_sees_a_queue_that_fills_and_drains_between_dumps(pair: Pair, hz: int) -> None:
    """A tbf at 2 Mbit/s (250 kB/s) gets 150 frames at once: ~156 kB queue and drain in ~0.63 s,
    inside one collection interval. The dump at the end of the interval finds the queue
    empty; the sampler (100 Hz here) sees its peak, how long it stood and what a packet waited.
    Without the sampler (hz 0) the collection's own dump is the only sample and sees nothing.
    A first, longer burst wakes the sampler from its 2 Hz watch, as the first steps of a job do."""
    with IPRoute(netns=pair.ns_a, flags=0) as ia:
        ia.tc("add", "tbf", pair.idx_a, 0x10000, rate="2mbit", burst=1600, latency="3s")
    c = Netdev("node-a", {"netns": pair.ns_a, "interfaces": [pair.if_a], "qdisc_sample_hz": hz})
    r = receiver(pair)
    try:
        c.start()
        assert len(_sampler_threads()) == (1 if hz else 0)
        c.collect(0.0)  # the first dump names the sampler's targets
        _burst(pair, 300)  # ~1.25 s of queue: seen by the 2 Hz watch for sure
        time.sleep(1.6)
        c.collect(1.0)
        if hz:
            assert c.sampler is not None and c.sampler.fast
        time.sleep(0.2)
        _burst(pair, 150)
        time.sleep(1.0)
        v = values(c.collect(2.0))
        sent = n = 450 - v[(pair.if_a, "netdev_qdisc_drops_total")]
        assert n == 450  # the queue is deep enough for all of it
        assert v[(pair.if_a, "netdev_qdisc_backlog_bytes")] == 0  # the dump: already drained
        assert v[(pair.if_a, "netdev_qdisc_rate_bytes")] == 250e3
        if hz:
            peak = v[(pair.if_a, "netdev_qdisc_backlog_max_bytes")]
            # sampled near its top: the first sample comes within ~15 ms of the burst (or a few
            # tens of ms when this 2-core box is loaded), while the shaper drains 250 kB/s
            assert 0.7 * 150 * FRAME < peak <= 150 * FRAME
            busy = v[(pair.if_a, "netdev_qdisc_busy_ratio")]
            assert 0.3 < busy < 0.7  # ~0.63 s of a ~1.2 s interval
            # the peak drains at the shaper's rate: a frame joining it then waited peak / 250 kB/s
            assert v[(pair.if_a, "netdev_qdisc_delay_max_seconds")] == pytest.approx(peak / 250e3, rel=0.01)
            assert 0 < v[(pair.if_a, "netdev_qdisc_backlog_mean_bytes")] < peak
            assert c.sampler is not None and c.sampler.errors == 0 and c.sampler.rounds > 50
        else:
            assert v[(pair.if_a, "netdev_qdisc_backlog_max_bytes")] == 0
            assert v[(pair.if_a, "netdev_qdisc_busy_ratio")] == 0
        assert drain(r) == sent
    finally:
        r.close()
        c.stop()
    assert not _sampler_threads()  # stop() ended the thread before returning
    c.stop()


def test_the_sampler_watches_slowly_while_no_queue_is_seen(pair: Pair) -> None:
    """A queue-capable port that never queues costs two wake-ups a second, not twenty."""
    with IPRoute(netns=pair.ns_a, flags=0) as ia:
        ia.tc("add", "tbf", pair.idx_a, 0x10000, rate="100mbit", burst=16000, latency="100ms")
    c = Netdev("node-a", {"netns": pair.ns_a, "interfaces": [pair.if_a]})  # default 20 Hz
    try:
        c.start()
        c.collect(0.0)
        r0 = c.sampler.rounds
        time.sleep(3.0)
        slow = c.sampler.rounds - r0
        assert 2 <= slow <= 9 and not c.sampler.fast, (slow, c.sampler.fast)
        _burst(pair, 10)  # 10 kB through a 12.5 MB/s shaper: a queue for under a millisecond
        c.sampler.notice_queue()  # as a dump that caught it would
        r0 = c.sampler.rounds
        time.sleep(1.0)
        fast = c.sampler.rounds - r0
        # the full rate while a queue is about: 20 a second nominally, 9-20 on this loaded 2-core
        # box (each wake-up waits for a core); the watch makes at most 4
        assert fast >= 7, fast
    finally:
        c.stop()


def test_noqueue_interfaces_are_not_sampled_and_the_sampler_follows_qdisc_changes(pair: Pair) -> None:
    c = Netdev("node-a", {"netns": pair.ns_a, "interfaces": [pair.if_a], "qdisc_sample_hz": 50})
    try:
        c.start()
        v = values(c.collect(0.0))
        assert c.sampler is not None and c.sampler._targets == {}  # veth: noqueue
        assert v[(pair.if_a, "netdev_qdisc_busy_ratio")] == 0  # the dump's own sample
        assert (pair.if_a, "netdev_qdisc_rate_bytes") not in v
        with IPRoute(netns=pair.ns_a, flags=0) as ia:
            ia.tc("add", "tbf", pair.idx_a, 0x10000, rate="100mbit", burst=16000, latency="100ms")
        c.collect(1.0)
        assert c.sampler._targets == {pair.idx_a: pair.if_a}
        time.sleep(1.0)  # the 2 Hz watch: no queue yet
        assert c.sampler.rounds > 0
        v = values(c.collect(2.0))
        assert v[(pair.if_a, "netdev_qdisc_rate_bytes")] == 12.5e6
    finally:
        c.stop()
    assert not _sampler_threads()
