"""Per-flow features against traffic with a known schedule (written to pcap by scapy), the
catalogue contract, and the ``skewd pkt`` command."""
from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from skewd.collectors.pkt.capfile import read_capture
from skewd.collectors.pkt.catalogue import CATALOGUE, NAMES
from skewd.collectors.pkt.cli import main as cli_main
from skewd.collectors.pkt.features import FlowTracker, analyze, burst_list
from skewd.collectors.pkt.parse import decode
from skewd.collectors.pkt.samples import to_batch

pytest.importorskip("scapy.all")
from scapy.all import IP, TCP, UDP, Ether  # noqa: E402
from scapy.contrib.roce import BTH  # noqa: E402
from scapy.utils import PcapWriter  # noqa: E402

MAC = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "pkt" / "pcapplusplus-200853b3a"
T0 = 1_700_000_000.0


def write(path: Path, items: list[tuple[float, object]], linktype: int = 1) -> Path:
    w = PcapWriter(str(path), linktype=linktype, nano=True)
    for t, p in sorted(items, key=lambda x: x[0]):
        p.time = t
        w.write(p)
    w.close()
    return path


def burst_schedule(cycles: int = 10, pps: float = 2000.0, on: float = 0.080, off: float = 0.020) -> np.ndarray:
    per = int(round(on * pps))
    return np.concatenate([T0 + c * (on + off) + np.arange(per) / pps for c in range(cycles)])


def udp(sport: int, dport: int, n: int = 100, **ip):
    return Ether(**MAC) / IP(src="10.10.0.1", dst="10.10.0.2", **ip) / UDP(sport=sport, dport=dport) / (b"u" * n)


@pytest.fixture(scope="module")
def sched_capture(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    bursty = burst_schedule()
    jittered = T0 + 0.001 * np.arange(1, 801) + rng.uniform(-2e-4, 2e-4, 800)
    items = [(t, udp(5000, 6000)) for t in bursty] + [(t, udp(5001, 6001)) for t in jittered]
    path = write(tmp_path_factory.mktemp("sched") / "sched.pcap", items)
    return path, {"bursty": bursty, "jittered": jittered}


def flows_by_name(iv) -> dict[str, dict[str, float]]:
    return {e: iv.flow(e) for e in iv.entities}


def test_bursty_flow_matches_its_schedule(sched_capture) -> None:
    path, sched = sched_capture
    (iv,) = analyze(decode(read_capture(path).frames), burst_gap=0.005)
    f = flows_by_name(iv)["udp 10.10.0.1:5000>10.10.0.2:6000"]
    t = sched["bursty"]
    gaps = np.diff(t)
    frame = 14 + 20 + 8 + 100
    assert f["packets"] == len(t) == 1600 and f["bytes"] == 1600 * frame
    assert f["bursts_total"] == 10  # one per on-period: the 20 ms pauses exceed burst_gap
    assert f["burst_bytes"] == 160 * frame and f["burst_bytes_max"] == 160 * frame
    assert f["burst_start_seconds"] == pytest.approx(t[-160], abs=1e-6)
    assert f["burst_duration_seconds"] == pytest.approx(t[-1] - t[-160], abs=1e-6)
    assert f["inter_burst_gap_seconds"] == pytest.approx(0.020 + 0.0005, abs=1e-6)
    assert f["gap_p50_seconds"] == pytest.approx(np.percentile(gaps, 50), abs=1e-6)
    assert f["gap_p99_seconds"] == pytest.approx(np.percentile(gaps, 99), abs=1e-6)
    assert f["gap_max_seconds"] == pytest.approx(gaps.max(), abs=1e-6)
    assert f["gap_p05_seconds"] == pytest.approx(np.percentile(gaps, 5), abs=1e-6)
    assert f["jitter_cov"] == pytest.approx(gaps.std() / gaps.mean(), rel=1e-4)
    span = iv.duration  # the whole capture, both flows
    assert f["packets_per_second"] == pytest.approx(1600 / span)
    assert f["start_seconds"] == pytest.approx(t[0], abs=1e-6) and f["end_seconds"] == pytest.approx(t[-1], abs=1e-6)


def test_jittered_flow_cov(sched_capture) -> None:
    path, sched = sched_capture
    (iv,) = analyze(decode(read_capture(path).frames), burst_gap=0.005)
    f = flows_by_name(iv)["udp 10.10.0.1:5001>10.10.0.2:6001"]
    gaps = np.diff(sched["jittered"])
    assert f["bursts_total"] == 1
    assert f["jitter_cov"] == pytest.approx(gaps.std() / gaps.mean(), rel=1e-3)
    assert 0.1 < f["jitter_cov"] < 0.25  # uniform +-0.2 ms on 1 ms: sqrt(2/3)*0.2 = 0.163
    port = iv.ports[0]
    assert port.flows == 2 and port.share_max == pytest.approx(1600 / 2400)
    assert 0 < port.gini < 0.5


def test_intervals_and_chunks_agree_with_one_pass(sched_capture) -> None:
    """Gaps, bursts and counters spanning interval boundaries come out the same however the
    packets are split: the tracker carries state (this is what live collect() relies on)."""
    path, _ = sched_capture
    pk = decode(read_capture(path).frames)
    (whole,) = analyze(pk, burst_gap=0.005)
    parts = analyze(pk, interval=0.037, burst_gap=0.005)
    assert len(parts) > 20
    for name in whole.entities:
        w = whole.flow(name)
        last = [iv.flow(name) for iv in parts if name in iv.entities][-1]
        assert last["bursts_total"] == w["bursts_total"] and last["packets_total"] == w["packets_total"]
        assert np.nanmax([iv.flow(name)["gap_max_seconds"] for iv in parts if name in iv.entities]) \
            == pytest.approx(w["gap_max_seconds"])
        assert sum(iv.flow(name)["bursts"] for iv in parts if name in iv.entities) == w["bursts_total"]
    # random split points through the live entry point
    rng = np.random.default_rng(3)
    cuts = np.sort(rng.choice(np.arange(1, len(pk)), 15, replace=False))
    tr = FlowTracker(0.005)
    bounds = np.r_[0, cuts, len(pk)]
    for a, b in zip(bounds[:-1], bounds[1:]):
        last = tr.update(pk.take(np.arange(a, b)), pk.ts_ns[a] / 1e9, pk.ts_ns[b - 1] / 1e9)
    for name in whole.entities:
        lf, wf = last.flow(name), whole.flow(name)
        for k in ("bursts_total", "packets_total", "bytes_total", "burst_bytes", "burst_start_seconds",
                  "inter_burst_gap_seconds"):
            assert lf[k] == pytest.approx(wf[k], nan_ok=True), k


def test_burst_list(sched_capture) -> None:
    path, sched = sched_capture
    bl = [b for b in burst_list(decode(read_capture(path).frames), 0.005) if b[0].endswith(":6000")]
    assert len(bl) == 10 and all(b[4] == 160 for b in bl)
    assert [round(b[1], 6) for b in bl] == [round(x, 6) for x in sched["bursty"][::160]]


# -- retransmissions --------------------------------------------------------------------------

def tcp(seq: int, n: int = 0, flags: str = "A", sport: int = 40000, dport: int = 80, ack: int = 1, win: int = 100):
    return Ether(**MAC) / IP(src="10.11.0.1", dst="10.11.0.2") / TCP(sport=sport, dport=dport, seq=seq, ack=ack,
                                                                       flags=flags, window=win) / (b"t" * n)


def tcp_rev(seq: int, ack: int, n: int = 0, flags: str = "A", win: int = 200):
    return Ether(**MAC) / IP(src="10.11.0.2", dst="10.11.0.1") / TCP(sport=80, dport=40000, seq=seq, ack=ack,
                                                                       flags=flags, window=win) / (b"r" * n)


def rtx_of(tmp_path: Path, items) -> int:
    (iv,) = analyze(decode(read_capture(write(tmp_path / "r.pcap", items)).frames))
    return int(sum(p.tcp_retransmits_total for p in iv.ports))


def test_retransmission_across_sequence_wrap(tmp_path: Path) -> None:
    base = 2**32 - 3000
    items = [(T0 + k * 0.01, tcp((base + k * 1000) % 2**32, 1000)) for k in range(6)]
    items.append((T0 + 1.0, tcp((base + 2000) % 2**32, 1000)))  # resend of the segment before the wrap
    items.append((T0 + 1.1, tcp((base + 4000) % 2**32, 1000)))  # and one after it
    assert rtx_of(tmp_path, items) == 2


def test_syn_retransmission_keepalive_and_reordering(tmp_path: Path) -> None:
    items = [(T0, tcp(100, flags="S")), (T0 + 1.0, tcp(100, flags="S"))]  # SYN sent again: counted
    items += [(T0 + 2.0, tcp(101, 10)), (T0 + 2.1, tcp(111, 10))]
    items += [(T0 + 30, tcp(120, 1))]  # keep-alive: 1 byte at next-1
    items += [(T0 + 31.0, tcp(131, 10)), (T0 + 31.0005, tcp(121, 10))]  # reordered by 0.5 ms: not loss
    assert rtx_of(tmp_path, items) == 1


def test_fast_retransmission_after_duplicate_acks(tmp_path: Path) -> None:
    # data 1000..5000 sent; the receiver keeps asking for 1000 (three duplicate ACKs); the
    # sender resends 1000 within 1 ms of the highest segment: a fast retransmission, counted
    items = [(T0 + k * 1e-4, tcp(1000 + k * 1000, 1000)) for k in range(5)]
    items += [(T0 + 6e-4 + k * 1e-5, tcp_rev(1, 1000)) for k in range(4)]
    items += [(T0 + 8e-4, tcp(1000, 1000))]
    assert rtx_of(tmp_path, items) == 1
    # the same late segment without duplicate ACKs is reordering (within 3 ms): not counted
    items2 = [(T0 + k * 1e-4, tcp(1000 + k * 1000, 1000)) for k in range(5)] + [(T0 + 8e-4, tcp(1000, 1000))]
    assert rtx_of(tmp_path, items2) == 0


def test_roce_psn_retransmission_and_wrap(tmp_path: Path) -> None:
    def roce(qp: int, psn: int, op: int = 4):
        return Ether(**MAC) / IP(src="10.12.0.1", dst="10.12.0.2") / UDP(sport=49152, dport=4791) \
            / BTH(opcode=op, dqpn=qp, psn=psn) / (b"k" * 64)

    psns = [(1 << 24) - 2, (1 << 24) - 1, 0, 1, 2]  # wraps at 2^24: not a retransmission
    items = [(T0 + i * 1e-3, roce(7, p)) for i, p in enumerate(psns)]
    items += [(T0 + 0.01 + i * 1e-3, roce(9, p)) for i, p in enumerate(range(100, 105))]  # 2nd QP, same flow
    items += [(T0 + 0.02, roce(7, 0)), (T0 + 0.021, roce(7, 1))]  # go-back-N resend on QP 7
    items += [(T0 + 0.022, roce(7, 1, op=17))]  # an ACK carrying an old PSN: not a request
    (iv,) = analyze(decode(read_capture(write(tmp_path / "roce.pcap", items)).frames))
    f = iv.flow("udp 10.12.0.1:49152>10.12.0.2:4791")
    assert f["roce_retransmits_total"] == 2
    assert np.isnan(f["tcp_retransmits_total"])


def test_idle_flow_is_reported_until_timeout() -> None:
    from tests.pkt_packets import udp_packets

    def pk_at(times: list[float], sport: int):
        return udp_packets((np.array(times) * 1e9).astype(np.int64), 100, sport=sport, dport=9)

    tr = FlowTracker(0.001, flow_timeout=5.0)
    tr.update(pk_at([T0, T0 + 0.5], 1), T0, T0 + 1)
    iv = tr.update(pk_at([T0 + 1.5], 2), T0 + 1, T0 + 2)
    stalled = iv.flow("udp 0.0.0.1:1>0.0.0.2:9")
    assert stalled["packets"] == 0 and stalled["idle_seconds"] == pytest.approx(1.5)
    assert stalled["packets_total"] == 2
    iv = tr.update(pk_at([T0 + 9], 2), T0 + 8, T0 + 10)
    assert "udp 0.0.0.1:1>0.0.0.2:9" not in iv.entities  # forgotten after flow_timeout


# -- catalogue contract -----------------------------------------------------------------------

def _coverage_captures(tmp: Path) -> list[Path]:
    """Real captures plus scapy-written ones for what the corpus lacks (RoCE, ECN, two TCP
    flows closing together, direction from Linux cooked headers)."""
    roce = [(T0 + i * 1e-4, Ether(**MAC) / IP(src="10.13.0.1", dst="10.13.0.2", tos=3) / UDP(sport=50000, dport=4791)
             / BTH(opcode=4, dqpn=3, psn=p) / (b"k" * 32)) for i, p in enumerate([1, 2, 3, 2, 3, 4])]
    fins = []
    for k, sport in enumerate((41000, 41001)):
        fins += [(T0 + k * 0.1, tcp(10, 5, sport=sport)), (T0 + 0.3 + k * 0.2, tcp(15, 0, flags="FA", sport=sport))]
    sll = []
    for i in range(6):
        ip = bytes(IP(src="10.14.0.1", dst="10.14.0.2") / UDP(sport=1, dport=2) / b"s")
        hdr = struct.pack(">HHH8sH", 4 if i % 2 else 0, 1, 6, b"\0" * 8, 0x0800)
        sll.append((T0 + i * 1e-3, hdr + ip))
    from scapy.all import Raw

    paths = [write(tmp / "roce.pcap", roce), write(tmp / "fins.pcap", fins),
             write(tmp / "sll.pcap", [(t, Raw(b)) for t, b in sll], linktype=113)]
    return paths + [FIX / "many_interfaces-1.pcapng", FIX / "one_tcp_stream.pcap", FIX / "sll.pcap"]


def test_catalogue_coverage(tmp_path: Path) -> None:
    emitted: set[str] = set()
    for path in _coverage_captures(tmp_path):
        cap = read_capture(path)
        assert cap.problems == [], path
        names = [i.name or path.name for i in cap.interfaces]
        drops = {k: i.drops for k, i in enumerate(cap.interfaces) if i.drops is not None}
        for iv in analyze(decode(cap.frames), 0.25, 0.001, names, drops):
            batch = to_batch(iv, "node1", iv.t1)
            assert set(batch.signal.tolist()) <= NAMES, set(batch.signal.tolist()) - NAMES
            emitted |= batch.signals()
    assert emitted == NAMES, f"catalogued but never emitted: {sorted(NAMES - emitted)}"
    assert all(s.collector == "pkt" for s in CATALOGUE)
    assert {s.scope.value for s in CATALOGUE} == {"flow", "nic_port"}


def test_samples_shape(sched_capture) -> None:
    path, _ = sched_capture
    (iv,) = analyze(decode(read_capture(path).frames), burst_gap=0.005, port_names=["cap0"])
    b = to_batch(iv, "n7", 123.0)
    ended = np.isin(b.signal, ["pkt_burst_ended_start_seconds", "pkt_burst_ended_bytes"])
    assert (b.t[~ended] == 123.0).all() and set(b.node.tolist()) == {"n7"}
    # ended bursts of the port are stamped when they ended (a start and bytes sample each)
    assert ended.sum() % 2 == 0 and (b.t[ended] > T0).all()
    rows = {(e, s): v for _, _, e, s, v in b.rows()}
    assert rows[("udp 10.10.0.1:5000>10.10.0.2:6000", "pkt_flow_bursts_total")] == 10
    assert rows[("cap0", "pkt_packets_total")] == 2400
    assert not np.isnan(b.value).any()


# -- skewd pkt ----------------------------------------------------------------------------------

def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = cli_main(list(argv), out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def test_cli_table_and_json(sched_capture) -> None:
    path, _ = sched_capture
    rc, out, err = run_cli(str(path), "--burst-gap", "5ms")
    assert rc == 0 and err == ""
    assert "2400 frames" in out and "udp 10.10.0.1:5000>10.10.0.2:6000" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("udp 10.10.0.1:5000"))
    assert line.split()[2] == "1.6k" and "66.7%" in line
    rc, out, _ = run_cli(str(path), "--json", "--interval", "100ms", "--burst-gap", "5ms")
    rows = [json.loads(x) for x in out.splitlines()]
    flows = [r for r in rows if r["type"] == "flow" and r["flow"].endswith(":6000")]
    assert sum(r["packets"] for r in flows) == 1600
    assert flows[-1]["bursts_total"] == 10
    assert rows[-1]["type"] == "capture" and rows[-1]["frames"] == 2400


def test_cli_errors(tmp_path: Path) -> None:
    rc, _, err = run_cli(str(FIX / "microsecs_big_endian.pcap"))
    assert rc == 2 and "link type 253" in err
    rc, _, err = run_cli(str(tmp_path / "missing.pcap"))
    assert rc == 2 and "cannot read" in err
    data = (FIX / "one_tcp_stream.pcap").read_bytes()
    (tmp_path / "cut.pcap").write_bytes(data[:-30])  # inside the last record
    rc, out, err = run_cli(str(tmp_path / "cut.pcap"))
    assert rc == 1 and "truncated record at byte offset" in err and "35 frames" in out
    with pytest.raises(SystemExit):
        run_cli(str(tmp_path / "cut.pcap"), "--interval", "soon")


@pytest.mark.parametrize("cuts", [[], [5], [3, 10, 19], [20], [1, 2, 3, 4]])
def test_sequence_state_survives_interval_cuts(tmp_path: Path, cuts: list[int]) -> None:
    """In-order TCP (across the 2^32 wrap) and RoCE PSNs (across 2^24), fed to the tracker in
    pieces as live collects do: exactly the one resend of each is a retransmission."""
    base = 2**32 - 5500

    def roce(psn: int):
        return Ether(**MAC) / IP(src="10.15.0.1", dst="10.15.0.2") / UDP(sport=49999, dport=4791) \
            / BTH(opcode=4, dqpn=5, psn=psn % (1 << 24)) / b"r"

    items = [(T0 + k * 0.01, tcp((base + k * 1000) % 2**32, 1000)) for k in range(20)]
    items += [(T0 + k * 0.01 + 0.005, roce((1 << 24) - 10 + k)) for k in range(20)]
    items += [(T0 + 0.5, tcp((base + 3000) % 2**32, 1000)), (T0 + 0.6, roce((1 << 24) - 8))]
    items += [(T0 + 0.7, tcp((base + 20000) % 2**32, 1000)), (T0 + 0.8, roce(10))]  # in order again
    pk = decode(read_capture(write(tmp_path / "seq.pcap", items)).frames)
    tr = FlowTracker(0.001)
    bounds = [0, *[2 * c for c in cuts], len(pk)]
    rtx = roce_rtx = 0
    for a, b in zip(bounds[:-1], bounds[1:]):
        if a == b:
            continue
        iv = tr.update(pk.take(np.arange(a, b)), pk.ts_ns[a] / 1e9, pk.ts_ns[b - 1] / 1e9)
        rtx = sum(p.tcp_retransmits_total for p in iv.ports)
        e = "udp 10.15.0.1:49999>10.15.0.2:4791"
        if e in iv.entities:
            roce_rtx = iv.flow(e)["roce_retransmits_total"]
    assert (rtx, roce_rtx) == (1, 1)


# -- probe() on this host, without privileges or hardware --------------------------------------

def test_probe_without_interface_or_capability() -> None:
    from skewd.collectors.base import Availability
    from skewd.collectors.pkt import COLLECTOR as Pkt

    st = Pkt("n", {}).probe()
    assert st.availability is Availability.ABSENT
    assert st.reason == "no interface configured (set collectors.pkt.interface)"
    st = Pkt("n", {"interface": "eth0", "snaplen": 20}).probe()
    assert st.availability is Availability.NEEDS_OPERATOR and "snaplen" in st.reason
    st = Pkt("n", {"interface": "eth0", "burst_gap": "soon"}).probe()
    assert st.availability is Availability.NEEDS_OPERATOR and "bad duration" in st.reason
    # an unprivileged agent: /proc/self/status without CAP_NET_RAW (fixture tree, see NOTE.md)
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "pkt" / "proc-no-cap-net-raw"
    st = Pkt("n", {"interface": "lo"}, proc_root=fixture).probe()
    assert st.availability is Availability.NEEDS_OPERATOR and "CAP_NET_RAW" in st.reason
    assert Pkt.config_keys >= {"interface", "filter", "snaplen", "ring_blocks", "ring_block_size", "burst_gap"}
