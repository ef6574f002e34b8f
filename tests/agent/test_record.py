"""Recording: the Recorder sink driven the way the agent drives it, bounds and rotation, and
``skewd record`` on this host.

The helpers at the top (``catalogue``, ``write_rules``, ``run_live``) are shared by the replay
and report tests: they run a real :class:`Pipeline` over synthetic netdev batches (signals from
the real netdev catalogue) with a Recorder plugged in, exactly as ``agent.runner`` does.
"""
from __future__ import annotations

import json
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pytest

from skewd.agent import bundle as B
from skewd.agent import summary as summary_mod
from skewd.agent.pipeline import Pipeline
from skewd.agent.record import Recorder, parse_size
from skewd.collectors.netdev.catalogue import CATALOGUE as NETDEV
from skewd.model import NODE_SCOPES, BatchBuilder, Catalogue, Finding, SampleBatch
from skewd.rules.loader import load_rules

T0 = 1_700_000_000.0  # synthetic epoch start (invented)
SETTINGS = {"evaluation_interval": 1.0, "lookback": 60.0, "horizon": 600.0, "summary_interval": 1.0}

RULES = """\
required_engine_version: 1
rules:
  - id: NS5-BACKLOG
    pathology: NS-5
    scope: nic_port
    layer: network
    severity: warning
    params: {{limit: {limit}}}
    expr: last(netdev_qdisc_backlog_bytes, 5s) > limit
    for: {for_}
    summary: "egress backlog on {{node}}/{{entity}}"
    mitigation: reduce the egress rate or move traffic off {{entity}}
    tags: [stable]
  - id: LOW-TX-PEER
    pathology: NS-2
    scope: cluster
    layer: network
    params: {{dev: -0.5}}
    expr: peer_dev(summary_net_tx_bytes_per_second) < dev
    for: 2s
    mitigation: check the slow node's NIC
    tags: [stable]
"""


def catalogue() -> Catalogue:
    return Catalogue(NETDEV).merge(summary_mod.CATALOGUE)


def write_rules(path: Path, limit: float = 100_000, for_: str = "2s") -> Path:
    path.write_text(RULES.format(limit=limit, for_=for_))
    return path


def ramp_backlog(i: int) -> float:
    """Egress backlog of eth0 at tick i: quiet, a ramp of 20 kB/s from tick 8, a plateau at
    300 kB until tick 28, then quiet again (invented profile)."""
    if 8 <= i < 28:
        return min(300_000.0, 20_000.0 * (i - 7))
    return 1_000.0


@dataclass
class LiveRun:
    findings: list[Finding]
    batches: list[SampleBatch]
    bundle: Path
    recorder: Recorder
    pipeline: Pipeline


def run_live(bundle: Path, rules: list[Path], *, node: str = "n1", ticks: int = 40, t0: float = T0,
             backlog: Callable[[int], float] = ramp_backlog, tx_rate: float = 1e6,
             labels: dict[str, str] | None = None, on_tick: Callable[[int, Pipeline, Recorder], None] | None = None,
             available: set[str] | None = None, **rec_kw) -> LiveRun:
    """Drive Pipeline + Recorder like agent.runner: batches in, evaluate at the tick, summary."""
    cat = catalogue()
    rs = load_rules(rules, cat).ruleset
    assert rs is not None
    labels = labels if labels is not None else {"tp_group": "tp0"}
    kw = dict(node=node, cluster="c1", labels=labels, ruleset=rs, catalogue=cat, settings=SETTINGS)
    kw.update(rec_kw)
    rec = Recorder(bundle, **kw)
    pipe = Pipeline(cat, rs, node=node, cluster="c1", labels=labels, sinks=[rec])
    pipe.engine.scopes = set(NODE_SCOPES)
    if available is not None:  # as agent.runner does from the probed collectors
        pipe.engine.set_available_signals(available)
        rec.set_available_signals(available)
    findings: list[Finding] = []
    batches: list[SampleBatch] = []
    for i in range(ticks):
        t = t0 + i
        # fast collector: two batches per tick
        for j in range(2):
            b = BatchBuilder(node)
            ts = t - 0.5 + 0.25 * j
            b.add(ts, "eth0", "netdev_qdisc_backlog_bytes", backlog(i))
            b.add(ts, "eth1", "netdev_qdisc_backlog_bytes", 10.0)
            b.add(ts, "eth0", "netdev_tx_bytes_total", tx_rate * (ts - t0))
            b.add(ts, "eth1", "netdev_tx_bytes_total", 1000.0 * i)
            batches.append(b.build())
        if i % 3 == 0:  # a slow collector whose batch arrives late, stamped before the last one
            b = BatchBuilder(node)
            b.add(t - 1.2, "eth0", "netdev_rx_bytes_total", 5e5 * i)
            b.add(t - 1.2, "eth0", "netdev_carrier_changes_total", float(i // 20))
            batches.append(b.build())
        for b in batches[-3:] if i % 3 == 0 else batches[-2:]:
            pipe.ingest(b)
        if on_tick is not None:
            on_tick(i, pipe, rec)
        findings += pipe.evaluate(t)
        rec.on_summary(summary_mod.make_summary(pipe.store, node, "c1", t, 1.0))
    rec.close()
    return LiveRun(findings, batches, bundle, rec, pipe)


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    return write_rules(tmp_path / "rules.yaml")


# ---------------------------------------------------------------------------------------------


def test_live_run_writes_a_bundle_with_everything_the_agent_saw(tmp_path: Path, rules_file: Path) -> None:
    run = run_live(tmp_path / "cap", [rules_file])
    assert [f.state.value for f in run.findings] == ["pending", "firing", "resolved"]
    segs = B.segment_dirs(tmp_path / "cap")
    assert [s.name for s in segs] == ["seg-000001"]
    seg = B.Segment(segs[0])
    assert seg.verify() == []
    # samples: identical to what was ingested, in order, with batch boundaries kept
    assert seg.samples() == SampleBatch.concat(run.batches)
    got = list(seg.iter_batches())
    assert [b for _, b in got] == run.batches
    assert [n for n, _ in got] == list(range(len(run.batches)))
    # ticks: the live evaluation times and how many batches preceded each
    t, nb, nf = seg.ticks()
    assert t.tolist() == [T0 + i for i in range(40)]
    assert nb[0] == 3 and nb[-1] == len(run.batches)
    assert int(nf.sum()) == 3
    # findings and summaries as the agent produced them
    assert seg.findings() == [f.to_dict() for f in run.findings]
    sums = seg.summaries()
    assert len(sums) == 40 and sums[5]["node"] == "n1" and "summary_net_tx_bytes_per_second" in sums[5]["signals"]
    m = seg.meta
    assert m["complete"] is True and m["nodes"] == ["n1"] and m["cluster"] == "c1"
    assert m["node_labels"] == {"n1": {"cluster": "c1", "tp_group": "tp0"}}
    assert m["rules"]["version"] == run.pipeline.engine.rules.version
    assert [r["id"] for r in m["rules"]["rules"]] == ["NS5-BACKLOG", "LOW-TX-PEER"]
    assert m["time_range"] == {"start": T0 - 1.2, "end": T0 + 39}
    names = {c["name"] for c in m["catalogue"]}
    assert {"netdev_qdisc_backlog_bytes", "netdev_tx_bytes_total", "summary_net_tx_bytes_per_second"} <= names
    assert m["counts"]["samples"] == sum(len(b) for b in run.batches)
    # the recorded rule file is a faithful copy
    (stored,) = seg.rule_files()
    assert stored.read_text() == rules_file.read_text()


def test_bundle_reads_without_skewd(tmp_path: Path, rules_file: Path) -> None:
    """The documented promise: pyarrow + json + zlib are enough."""
    import zlib

    run = run_live(tmp_path / "cap", [rules_file], ticks=10)
    seg = B.segment_dirs(tmp_path / "cap")[0]
    table = pa.ipc.open_stream(seg / "samples.arrow").read_all()
    assert table.column_names == ["t", "node", "entity", "signal", "value", "batch"]
    assert table.num_rows == sum(len(b) for b in run.batches)
    assert set(table.column("signal").to_pylist()) == {"netdev_qdisc_backlog_bytes", "netdev_tx_bytes_total",
                                                       "netdev_rx_bytes_total", "netdev_carrier_changes_total"}
    ticks = pa.ipc.open_stream(seg / "ticks.arrow").read_all()
    assert ticks.column("t").to_pylist() == [T0 + i for i in range(10)]
    meta = json.loads((seg / "meta.json").read_text())
    assert meta["format"] == "skewd-capture" and meta["format_version"] == 1
    data = (seg / "samples.arrow").read_bytes()
    for line in (seg / "index.jsonl").read_text().splitlines():
        entry = json.loads(line)
        body = {k: v for k, v in entry.items() if k != "line_crc32"}
        assert zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()) == entry["line_crc32"]
        if entry["file"] == "samples.arrow":
            chunk = data[entry["offset"]:entry["offset"] + entry["length"]]
            assert zlib.crc32(chunk) == entry["crc32"]


def test_flushes_are_buffered_per_interval_not_per_batch(tmp_path: Path, rules_file: Path) -> None:
    run_live(tmp_path / "cap", [rules_file], ticks=30, flush_interval=5.0)
    seg = B.Segment(B.segment_dirs(tmp_path / "cap")[0])
    chunks = seg.index()["samples.arrow"]
    # 30 ticks at one flush per 5 s of tick time (+ the final one), never one chunk per batch
    assert 6 <= len([c for c in chunks if "rows" in c.extra]) <= 8


def test_rotation_keeps_the_newest_segments_within_the_size_bound(tmp_path: Path, rules_file: Path) -> None:
    run = run_live(tmp_path / "cap", [rules_file], ticks=120, max_bytes=60_000, rotate=3)
    segs = B.segment_dirs(tmp_path / "cap")
    assert len(segs) == 3
    numbers = [int(s.name[4:]) for s in segs]
    assert numbers == sorted(numbers) and numbers[0] > 1  # older ones were removed
    assert run.recorder.segments_removed == numbers[0] - 1
    total = sum(f.stat().st_size for s in segs for f in s.rglob("*") if f.is_file())
    # each segment closes once past max_bytes/rotate; one flush (~1 s of data) may overshoot
    assert total < 60_000 * 1.5
    # the newest segment holds the end of the run and every segment is intact
    last = B.Segment(segs[-1])
    assert last.ticks()[0][-1] == T0 + 119
    assert all(B.Segment(s).verify() == [] for s in segs)


def test_rotation_by_duration(tmp_path: Path, rules_file: Path) -> None:
    run_live(tmp_path / "cap", [rules_file], ticks=60, max_duration=30.0, rotate=3)
    segs = [B.Segment(s) for s in B.segment_dirs(tmp_path / "cap")]
    assert len(segs) == 3
    spans = [float(s.ticks()[0][-1] - s.ticks()[0][0]) for s in segs]
    assert all(sp <= 11.0 for sp in spans), spans  # 30 s / 3 segments, closed on a tick boundary
    # consecutive segments continue one another: no tick lost between them
    t_all = np.concatenate([s.ticks()[0] for s in segs])
    assert np.all(np.diff(t_all) == 1.0) and t_all[-1] == T0 + 59


def test_rotate_zero_stops_at_the_size_limit(tmp_path: Path, rules_file: Path) -> None:
    run = run_live(tmp_path / "cap", [rules_file], ticks=100, max_bytes=20_000, rotate=0)
    assert run.recorder.full
    (seg,) = B.segment_dirs(tmp_path / "cap")
    s = B.Segment(seg)
    assert s.verify() == [] and s.meta["complete"]
    t = s.ticks()[0]
    assert 0 < len(t) < 100 and t[0] == T0


def test_a_writer_that_cannot_keep_up_drops_data_instead_of_blocking(tmp_path: Path, rules_file: Path) -> None:
    def stall(i: int, pipe: Pipeline, rec: Recorder) -> None:
        if i == 10:
            rec.max_pending = 0  # from now on the writer never has room: the disk has stalled

    run = run_live(tmp_path / "cap", [rules_file], ticks=40, max_buffer_rows=60, rotate=20, on_tick=stall)
    rec = run.recorder
    assert rec.dropped_rows > 0 and rec.errors >= 1 and "cannot keep up" in rec.last_error
    # what was written stays consistent: every segment verifies and the bundle replays
    segs = [B.Segment(s) for s in B.segment_dirs(tmp_path / "cap")]
    assert len(segs) >= 2 and all(s.verify() == [] for s in segs)
    assert segs[0].ticks()[0][-1] >= T0 + 9  # everything before the stall was kept
    assert len(segs) == 2  # dropped backlogs did not leave a segment behind each
    from skewd.agent.replay import Replayer

    assert Replayer(segs, catalogue()).run().damage == []


def test_new_rules_start_a_new_segment_that_names_them(tmp_path: Path) -> None:
    a = write_rules(tmp_path / "a.yaml", limit=100_000)
    b = write_rules(tmp_path / "b.yaml", limit=50_000)
    cat = catalogue()
    rs_b = load_rules([b], cat).ruleset

    def reload(i: int, pipe: Pipeline, rec: Recorder) -> None:
        if i == 20:
            pipe.engine.replace_rules(rs_b)
            rec.set_rules(rs_b)

    run_live(tmp_path / "cap", [a], on_tick=reload)
    segs = [B.Segment(s) for s in B.segment_dirs(tmp_path / "cap")]
    assert len(segs) == 2
    assert segs[1].meta["rules"]["version"] == rs_b.version != segs[0].meta["rules"]["version"]
    assert segs[1].rule_files()[0].read_text() == b.read_text()
    assert segs[1].ticks()[0][0] == T0 + 20
    # the batches ingested for tick 20 before the reload moved on with it
    assert segs[1].ticks()[1][0] == 2 and len(list(segs[1].iter_batches())) == 2 * 20 + 7
    assert segs[0].ticks()[1][-1] == len(list(segs[0].iter_batches()))


def test_packets_are_written_as_pcapng_scapy_reads(tmp_path: Path) -> None:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.utils import rdpcap

    rec = Recorder(tmp_path / "cap", node="n1", threaded=False)
    frames = [bytes(Ether() / IP(src="127.0.0.1", dst="127.0.0.2") / UDP(sport=5000 + i, dport=4791) / (b"x" * i))
              for i in range(5)]
    rec.on_packets([(T0 + i * 0.001, f) for i, f in enumerate(frames)])
    rec.on_tick(T0, [])
    rec.on_packets([(T0 + 1.5, frames[0][:14 + 20], len(frames[0]))])  # a truncated header capture
    rec.on_tick(T0 + 2, [])
    rec.close()
    seg = B.segment_dirs(tmp_path / "cap")[0]
    pkts = rdpcap(str(seg / "packets.pcapng"))
    assert [bytes(p) for p in pkts] == frames + [frames[0][:34]]
    assert [float(p.time) for p in pkts][:2] == pytest.approx([T0, T0 + 0.001], abs=1e-6)
    assert pkts[1][UDP].sport == 5001
    s = B.Segment(seg)
    assert s.verify() == [] and s.meta["counts"]["packets"] == 6


def test_frames_keep_nanosecond_timestamps(tmp_path: Path) -> None:
    """The pkt collector's Frames layout (one buffer, offsets, int64 ns): exact times in pcapng."""
    import struct
    from types import SimpleNamespace

    frames_data = [b"\x01" * 60, b"\x02" * 42, b"\x03" * 90]
    buf = np.frombuffer(b"".join(frames_data), dtype=np.uint8)
    ts = np.array([1_700_000_000_123_456_789, 1_700_000_000_123_456_790, 1_700_000_001_000_000_001], np.int64)
    frames = SimpleNamespace(buf=buf, doff=np.array([0, 60, 102]), caplen=np.array([60, 42, 90]),
                             wirelen=np.array([60, 1500, 90]), ts_ns=ts, linktype=np.array([1, 1, 101], np.int32))
    rec = Recorder(tmp_path / "cap", node="n1", threaded=False)
    rec.on_frames(frames)
    rec.on_tick(T0, [])
    rec.close()
    raw = (B.segment_dirs(tmp_path / "cap")[0] / "packets.pcapng").read_bytes()
    got, linktypes, pos = [], [], 0
    while pos < len(raw):
        btype, blen = struct.unpack_from("<II", raw, pos)
        if btype == 1:
            linktypes.append(struct.unpack_from("<H", raw, pos + 8)[0])
        if btype == 6:
            _, hi, lo, cap, orig = struct.unpack_from("<IIIII", raw, pos + 8)
            got.append(((hi << 32) | lo, raw[pos + 28:pos + 28 + cap], orig))
        pos += blen
    assert got == [(int(t), d, w) for t, d, w in zip(ts, frames_data, (60, 1500, 90))]
    assert linktypes == [1, 101]


def test_capture_files_are_copied_with_crcs(tmp_path: Path) -> None:
    src = tmp_path / "pkt.pcapng"
    src.write_bytes(bytes(range(256)) * 9000)  # 2.3 MB: three indexed chunks
    rec = Recorder(tmp_path / "cap", node="n1", threaded=False)
    rec.add_capture_file(src)
    rec.on_tick(T0, [])
    rec.close()
    seg = B.Segment(B.segment_dirs(tmp_path / "cap")[0])
    assert seg.meta["captures"] == ["captures/pkt.pcapng"]
    assert (seg.path / "captures/pkt.pcapng").read_bytes() == src.read_bytes()
    assert len(seg.index()["captures/pkt.pcapng"]) == 3 and seg.verify() == []


def test_for_agent_uses_the_agent_config(tmp_path: Path, rules_file: Path) -> None:
    from skewd.agent.config import load_config

    cfg = load_config(None, env={}, overrides={"node": "gpu-node-7", "cluster": "prod", "labels": {"tp_group": "tp3"},
                                               "record": {"dir": str(tmp_path), "max_bytes": 4096 * 1024,
                                                          "max_duration": "10m", "rotate": 2}})
    rs = load_rules([rules_file], catalogue()).ruleset
    rec = Recorder.for_agent(cfg, rs)
    try:
        assert rec.directory == tmp_path / "gpu-node-7"
        assert rec.seg_bytes == 2048 * 1024 and rec.seg_duration == 300.0
        assert rec.node_labels == {"gpu-node-7": {"cluster": "prod", "tp_group": "tp3"}}
    finally:
        rec.close()


def test_parse_size() -> None:
    assert parse_size("1048576") == 1 << 20
    assert parse_size("64M") == 64 << 20 and parse_size("1GiB") == 1 << 30 and parse_size("10k") == 10240
    with pytest.raises(ValueError):
        parse_size("lots")


def test_skewd_record_on_this_host(tmp_path: Path, rules_file: Path) -> None:
    """Real collectors (whatever is active here, netdev at least on any Linux host), real clock."""
    from skewd.agent.record import main
    from skewd.agent.replay import main as replay_main

    cfg = tmp_path / "agent.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        node: rectest
        cluster: lab
        evaluation_interval: 500ms
        summary_interval: 1s
        rules: [{rules_file}]
        metrics: {{listen: ""}}
        collectors:
          netdev: {{interval: 250ms}}
        """))
    out = tmp_path / "bundle"
    rc = main(["--out", str(out), "--duration", "3s", "--config", str(cfg), "--quiet"])
    assert rc == 0
    (seg_dir,) = B.segment_dirs(out)
    seg = B.Segment(seg_dir)
    assert seg.verify() == []
    assert seg.meta["nodes"] == ["rectest"] and seg.meta["complete"]
    samples = seg.samples()
    assert "netdev_rx_bytes_total" in samples.signals()
    ifaces = set(samples.entity[samples.signal == "netdev_rx_bytes_total"].tolist())
    assert ifaces and ifaces <= set(os.listdir("/sys/class/net"))
    t = seg.ticks()[0]
    assert 4 <= len(t) <= 8 and np.all(np.diff(t) > 0.3)
    assert len(seg.summaries()) >= 2
    assert "netdev_rx_bytes_total" in seg.meta["available_signals"]
    import io

    buf = io.StringIO()
    assert replay_main([str(out), "--json", "--quiet"], out=buf) == 0
