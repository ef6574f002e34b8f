"""netdev over recorded rtnetlink dumps (tests/fixtures/netdev, see record.py there)."""
from __future__ import annotations

import asyncio
import copy
import json
import os
import struct
from pathlib import Path

import pytest

from skewd.collectors.base import Availability, CollectorError
from skewd.collectors.netdev import COLLECTOR as Netdev
from skewd.collectors.netdev import parse, rtnl
from skewd.collectors.netdev.collector import RecordedNetlink, RecordedWire
from skewd.model import SampleBatch

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "netdev"
VETH = FIX / "veth-tbf-linux-6.18"
VM = FIX / "vm-virtio-linux-6.18"
#: raw rtnetlink replies plus pyroute2's decoding of the same bytes (record.py --wire)
WIRE = [FIX / "veth-tbf-wire-linux-6.18", FIX / "vm-virtio-wire-linux-6.18"]


def fixture_collector(d: Path, config: dict | None = None) -> Netdev:
    return Netdev("node-a", config or {}, sys_root=d / "sys", source=RecordedNetlink(d))


def values(batch: SampleBatch) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for _, _, entity, sig, v in batch.rows():
        assert (entity, sig) not in out, f"duplicate sample {entity} {sig}"
        out[(entity, sig)] = v
    return out


def raw_qdiscs(d: Path) -> list[dict]:
    return json.loads((d / "qdiscs.json").read_text())


def wire_collector(d: Path, config: dict | None = None) -> Netdev:
    return Netdev("node-a", config or {}, sys_root=d / "sys", source=RecordedWire(d))


@pytest.mark.parametrize("d", WIRE, ids=lambda d: d.name)
@pytest.mark.parametrize("config", [{}, {"interfaces": ["*"]}])
def test_own_decoder_emits_what_pyroute2_decodes_from_the_same_bytes(d: Path, config: dict) -> None:
    """The collector decodes rtnetlink itself (a full pyroute2 decode cost a quarter of the
    agent's CPU); from the same recorded bytes it must emit exactly the same samples."""
    ours = wire_collector(d, config).collect(5.0)
    theirs = fixture_collector(d, config).collect(5.0)
    assert len(ours) > 20
    assert ours == theirs
    assert values(ours) == values(theirs)


def test_own_decoder_on_the_shaped_veth_recording() -> None:
    v = values(wire_collector(WIRE[0]).collect(1.0))
    assert v[("skwva", "netdev_qdisc_drops_total")] == 54  # root only, the child's 54 not added
    assert v[("skwva", "netdev_qdisc_backlog_bytes")] == 2084
    assert v[("skwmq0", "netdev_qdisc_sent_bytes_total")] == 10882  # mq root = sum of its queues
    assert v[("skwdown", "netdev_operstate")] == parse.OPERSTATES["DOWN"]
    assert v[("skwva", "netdev_link_speed_bytes")] == 10_000 * 125_000


def _nla(t: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), t) + payload + b"\0" * (-len(payload) % 4)


def test_qdisc_packet_count_beyond_32_bits_comes_from_tca_stats_pkt64() -> None:
    """Constructed message (not recorded: 2^32 packets take hours at line rate). Once the count
    no longer fits, the kernel sends it truncated in TCA_STATS_BASIC and whole in
    TCA_STATS_PKT64; the truncated one would look like a counter reset."""
    packets = (1 << 32) + 1234
    stats2 = (_nla(rtnl.TCA_STATS_BASIC, struct.pack("=QI4x", 10**13, packets & 0xFFFFFFFF))
              + _nla(rtnl.TCA_STATS_QUEUE, struct.pack("=5I", 0, 0, 7, 0, 0))
              + _nla(rtnl.TCA_STATS_PKT64, struct.pack("=Q", packets)))
    body = (struct.pack("=BxxxiIII", 0, 5, 0x10000, rtnl.TC_H_ROOT, 1)
            + _nla(rtnl.TCA_KIND, b"mq\0") + _nla(rtnl.TCA_STATS2 | 0x8000, stats2))
    msg = struct.pack("=IHHII", 16 + len(body), rtnl.RTM_NEWQDISC, 2, 9, 0) + body
    qd = rtnl.decode_qdiscs(rtnl.messages(msg, 9)[0])
    v = {s.signal: s.value for s in parse.qdisc_samples(qd, {5: "eth5"})}
    assert v["netdev_qdisc_sent_packets_total"] == packets
    assert v["netdev_qdisc_sent_bytes_total"] == 10**13
    assert v["netdev_qdisc_drops_total"] == 7


def test_a_refused_request_raises_with_the_kernels_errno() -> None:
    err = struct.pack("=IHHII", 36, rtnl.NLMSG_ERROR, 0, 4, 0) + struct.pack("=i", -1) + b"\0" * 16
    with pytest.raises(rtnl.NetlinkError) as e:
        rtnl.messages(err, 4)
    assert e.value.errno == 1
    assert rtnl.messages(err, 5) == ([], False)  # the answer to another request is not ours


def test_shaped_veth_backlog_drops_and_root_only_accounting() -> None:
    """tbf root + 5-packet pfifo child, recorded mid-burst of 60 x 1042-byte frames."""
    v = values(fixture_collector(VETH).collect(12.5))
    assert v[("skwva", "netdev_qdisc_backlog_bytes")] == 2084  # two 1042-byte frames waiting
    assert v[("skwva", "netdev_qdisc_qlen_packets")] == 2
    assert v[("skwva", "netdev_qdisc_overlimits_total")] == 65
    assert v[("skwva", "netdev_qdisc_sent_bytes_total")] == 4210
    # The child pfifo also reports these 54 drops; the root already includes them, so the
    # interface must show 54, not 108.
    assert v[("skwva", "netdev_qdisc_drops_total")] == 54
    child = [q for q in raw_qdiscs(VETH) if q["parent"] == 0x10001][0]
    child_q = dict(dict(child["attrs"])["TCA_STATS2"]["attrs"])["TCA_STATS_QUEUE"]
    assert child_q["drops"] == 54
    # 60 datagrams: 4 left the qdisc (plus one 42-byte ARP reply), 2 queued, 54 dropped
    assert v[("skwva", "netdev_qdisc_sent_packets_total")] - 1 + 2 + 54 == 60
    # The qdisc's dequeued bytes are what the link transmitted (plus frames sent before tbf existed)
    assert v[("skwva", "netdev_tx_bytes_total")] == 3168
    assert v[("skwva", "netdev_link_speed_bytes")] == 10_000 * 125_000  # veth: 10000 Mb/s


def test_mq_root_equals_sum_of_its_queues_and_ingress_is_ignored() -> None:
    v = values(fixture_collector(VETH).collect(1.0))
    children = [q for q in raw_qdiscs(VETH) if q["index"] == 3 and q["parent"] != parse.TC_H_ROOT
                and dict(q["attrs"])["TCA_KIND"] == "pfifo_fast"]
    assert len(children) == 4
    child_bytes = sum(dict(dict(q["attrs"])["TCA_STATS2"]["attrs"])["TCA_STATS_BASIC"]["bytes"]
                      for q in children)
    assert v[("skwmq0", "netdev_qdisc_sent_bytes_total")] == child_bytes == 10882
    assert v[("skwmq0", "netdev_tx_bytes_total")] == 10882
    assert v[("skwmq0", "netdev_tx_packets_total")] == 21
    assert v[("skwmq0", "netdev_rx_bytes_total")] == 3462


def test_state_of_a_link_without_carrier_and_lo_excluded_by_default() -> None:
    v = values(fixture_collector(VETH).collect(1.0))
    assert v[("skwdown", "netdev_up")] == 0
    assert v[("skwdown", "netdev_operstate")] == parse.OPERSTATES["DOWN"]
    assert v[("skwdown", "netdev_carrier_changes_total")] == 1
    assert v[("skwva", "netdev_up")] == 1
    assert v[("skwva", "netdev_operstate")] == 6
    assert not any(e == "lo" for e, _ in v)


def test_virtio_vm_host_unknown_speed_is_not_emitted() -> None:
    c = fixture_collector(VM)
    v = values(c.collect(3.0))
    entities = {e for e, _ in v}
    assert entities == {"eth0", "ifb0", "ifb1"}
    assert ("eth0", "netdev_link_speed_bytes") not in v  # sysfs says -1 (virtio)
    assert ("ifb0", "netdev_link_speed_bytes") not in v  # read fails (EINVAL): no file recorded
    assert v[("eth0", "netdev_rx_bytes_total")] == 593592882
    assert v[("eth0", "netdev_tx_packets_total")] == 7089
    # pfifo_fast root: everything eth0 sent went through it
    assert v[("eth0", "netdev_qdisc_sent_bytes_total")] == v[("eth0", "netdev_tx_bytes_total")]
    assert v[("eth0", "netdev_qdisc_sent_packets_total")] == 7089
    # ifb devices are down with the 'noop' qdisc, which the kernel does not dump
    assert ("ifb0", "netdev_qdisc_backlog_bytes") not in v
    assert v[("ifb0", "netdev_up")] == 0


def test_interface_selection_by_name_and_glob() -> None:
    v = values(fixture_collector(VM, {"interfaces": ["lo"]}).collect(1.0))
    assert {e for e, _ in v} == {"lo"}
    assert v[("lo", "netdev_operstate")] == parse.OPERSTATES["UNKNOWN"]
    assert v[("lo", "netdev_up")] == 0
    assert v[("lo", "netdev_rx_bytes_total")] == v[("lo", "netdev_tx_bytes_total")] == 485374
    assert v[("lo", "netdev_qdisc_qlen_packets")] == 0  # noqueue
    v = values(fixture_collector(VETH, {"interfaces": ["skwm*", "skwva"]}).collect(1.0))
    assert {e for e, _ in v} == {"skwmq0", "skwva"}


def test_probe_reports_missing_configured_interfaces() -> None:
    st = fixture_collector(VETH, {"interfaces": ["skwva", "eth9"]}).probe()
    assert st.availability is Availability.ACTIVE
    assert "eth9" in st.reason and "skwva" in st.reason
    st = fixture_collector(VETH, {"interfaces": ["eth9"]}).probe()
    assert st.availability is Availability.NEEDS_OPERATOR
    assert "eth9" in st.reason and "skwva" in st.reason  # says what is there instead


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="interfaces"):
        Netdev("n", {"interfaces": "eth0"})
    with pytest.raises(ValueError, match="netns"):
        Netdev("n", {"netns": 3})


def test_legacy_tca_stats_fallback_uses_the_same_numbers() -> None:
    """A qdisc without TCA_STATS2 (old kernels) still reports from TCA_STATS."""
    msgs = copy.deepcopy(raw_qdiscs(VETH))
    for m in msgs:
        m["attrs"] = [a for a in m["attrs"] if a[0] != "TCA_STATS2"]
    names = {2: "skwva"}
    legacy = {s.signal: s.value for s in parse.qdisc_samples(msgs, names)}
    modern = {s.signal: s.value for s in parse.qdisc_samples(raw_qdiscs(VETH), names)}
    assert legacy["netdev_qdisc_drops_total"] == modern["netdev_qdisc_drops_total"] == 54
    assert legacy["netdev_qdisc_backlog_bytes"] == 2084
    assert "netdev_qdisc_requeues_total" not in legacy  # TCA_STATS has no requeue count


@pytest.mark.parametrize("text,expected", [
    ("100000\n", 100_000 * 125_000.0),  # 100GbE
    ("25000\n", 25_000 * 125_000.0),
    ("-1\n", None),  # SPEED_UNKNOWN (virtio, many virtual NICs)
    ("4294967295\n", None),  # SPEED_UNKNOWN printed unsigned by old kernels
    ("0\n", None),
    ("", None),
    (None, None),  # read failed (link down: EINVAL)
    ("N/A", None),
])
def test_speed_conversion(text: str | None, expected: float | None) -> None:
    out = parse.speed_samples("eth0", text)
    assert (out[0].value if out else None) == expected


def test_catalogue_covers_exactly_what_the_fixtures_emit() -> None:
    cat = {s.name: s for s in Netdev.catalogue}
    emitted: set[str] = set()
    for d in (VETH, VM):
        b = fixture_collector(d, {"interfaces": ["*"]}).collect(1.0)
        emitted |= b.signals()
    assert emitted - set(cat) == set(), "emitted but not catalogued"
    assert set(cat) - emitted == set(), "catalogued but never emitted by a fixture"
    for s in cat.values():
        assert s.collector == "netdev" and s.scope.value == "nic_port"
        assert s.name.endswith("_total") == (s.kind.value == "counter")


def test_probe_on_this_host() -> None:
    c = Netdev("here")
    try:
        st = c.probe()
        non_lo = sorted(n for n in os.listdir("/sys/class/net") if n != "lo")
        if non_lo:
            assert st.availability is Availability.ACTIVE, st
            assert all(n in st.reason for n in non_lo)
        else:
            assert st.availability is Availability.ABSENT
    finally:
        c.stop()


def test_missing_namespace_needs_operator_and_collect_says_why() -> None:
    c = Netdev("here", {"netns": "skwnet-does-not-exist"})
    try:
        st = c.probe()
        assert st.availability is Availability.NEEDS_OPERATOR
        assert "/run/netns/skwnet-does-not-exist" in st.reason
        c.start()  # must not raise
        with pytest.raises(CollectorError, match="skwnet-does-not-exist"):
            c.collect(1.0)
        assert not os.path.exists("/run/netns/skwnet-does-not-exist")  # never created
    finally:
        c.stop()


def test_live_lifecycle_and_collect_from_inside_an_event_loop() -> None:
    """The agent calls collect() from threads that may run an event loop; nothing may care."""
    c = Netdev("here", {"interfaces": ["*"]})
    c.stop()  # safe before start
    c.start()

    async def inside_loop() -> SampleBatch:
        return c.collect(7.0)

    b = asyncio.run(inside_loop())
    assert ("lo", "netdev_rx_packets_total") in values(b)
    assert set(b.t.tolist()) == {7.0}
    c.stop()
    c.stop()
    c.start()
    assert len(c.collect(8.0)) == len(b)
    c.stop()
