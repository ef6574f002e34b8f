"""The node summary carries every collective burst (``collective_burst_starts`` and
``collective_burst_bytes``): each burst the pkt collector listed on the collective port reaches
exactly one summary, whatever the summary interval and however the pkt collections fall
between summaries; a front-end port's token packets are not collectives."""
from __future__ import annotations

import json

import numpy as np

from skewd.agent import summary as summary_mod
from skewd.agent.pipeline import Pipeline
from skewd.collectors.pkt.catalogue import CATALOGUE as PKT
from skewd.collectors.pkt.features import NS, FlowTracker
from skewd.collectors.pkt.frames import DIR_OUT
from skewd.collectors.pkt.parse import Packets
from skewd.collectors.pkt.samples import to_batch
from skewd.model import Catalogue
from skewd.rules.engine import RuleSet
from tests.pkt_packets import udp_packets

T0 = 1_700_000_000  # synthetic epoch start (invented)


def traffic(seconds: int, seed: int = 1) -> tuple[Packets, np.ndarray, np.ndarray]:
    """Sent packets of two ports: eth0 (front end) one ~200-byte SSE token packet every ~5 ms,
    eth1 (RoCE) decode-step all-reduces 20-60 ms apart, 40 packets of 4 KiB 30 us apart.
    Returns (packets in time order, eth1 burst starts ns, their bytes)."""
    rng = np.random.default_rng(seed)
    n = int(seconds / 0.04) + 10
    starts = T0 * NS + 3_000_000 + np.cumsum(rng.uniform(20e6, 60e6, n)).astype(np.int64)
    starts = starts[starts < (T0 + seconds) * NS - NS // 2]
    r_ts = (starts[:, None] + np.arange(40)[None, :] * 30_000).ravel()
    r_wl = np.full(len(r_ts), 4154)
    f_ts = T0 * NS + np.cumsum(rng.exponential(5e6, seconds * 250)).astype(np.int64)
    f_ts = f_ts[f_ts < (T0 + seconds) * NS]
    ts = np.r_[r_ts, f_ts]
    iface = np.r_[np.ones(len(r_ts), np.int32), np.zeros(len(f_ts), np.int32)]
    wl = np.r_[r_wl, rng.integers(150, 260, len(f_ts))]
    o = np.argsort(ts, kind="stable")
    p = udp_packets(ts[o], wl[o], iface=iface[o], dst=np.where(iface[o] == 1, 2, 3),
                    dport=np.where(iface[o] == 1, 4791, 443), direction=DIR_OUT)
    return p, starts, np.full(len(starts), 40.0 * 4154)


def agent_store(seconds: int, phase: float) -> tuple[Pipeline, np.ndarray, np.ndarray]:
    """A node's pipeline after pkt collections every second at T0 + k + phase."""
    pk, starts, nbytes = traffic(seconds)
    cat = Catalogue(PKT).merge(summary_mod.CATALOGUE)
    pipe = Pipeline(cat, RuleSet([]), node="n1")
    tr = FlowTracker(0.001, burst_settle=0.1)
    prev = float(T0)
    for k in range(1, seconds + 6):
        t = T0 + k + phase
        sel = np.flatnonzero((pk.ts_ns > prev * NS) & (pk.ts_ns <= t * NS))
        pipe.ingest(to_batch(tr.update(pk.take(sel), prev, t, ["eth0", "eth1"]), "n1", t))
        prev = t
    return pipe, starts, nbytes


def summarised(pipe: Pipeline, interval: float, until: float) -> tuple[list[float], list[float]]:
    starts, nbytes = [], []
    t = T0 + interval
    while t <= until:
        msg = summary_mod.make_summary(pipe.store, "n1", "c", t, interval)
        s = msg.signals.get("collective_burst_starts", {})
        b = msg.signals.get("collective_burst_bytes", {})
        assert list(s) == list(b)
        starts += list(s.values())
        nbytes += list(b.values())
        assert summary_mod.burst_starts(pipe.store, "n1", t, interval) == list(s.values())
        t += interval
    return starts, nbytes


def test_every_collective_burst_reaches_one_summary() -> None:
    for phase in (0.3, 0.95):  # pkt collections just after and just before the summaries
        pipe, starts, nbytes = agent_store(20, phase)
        for interval in (1.0, 5.0):
            got, got_b = summarised(pipe, interval, T0 + 25)
            assert got == (starts / NS).tolist(), (phase, interval)  # every step, once, no token packet
            assert got_b == nbytes.tolist()


def test_a_summary_holds_the_steps_of_its_interval() -> None:
    pipe, starts, _ = agent_store(10, 0.3)
    msg = summary_mod.make_summary(pipe.store, "n1", "c", T0 + 6.0, 1.0)
    got = list(msg.signals["collective_burst_starts"].values())
    assert len(got) >= 15  # 20-60 ms steps: dozens a second, not the latest one
    # those listed by the collection at T0 + 5.3 (ended after T0 + 4.3)
    assert min(got) >= T0 + 4.3 - 0.1 and max(got) <= T0 + 5.3


def test_a_replayed_capture_gives_the_same_bursts(tmp_path) -> None:
    """Captures record what the agent ingests (the pkt batches with their per-burst stamps):
    replaying one without its recorded summaries recomputes the same collective bursts."""
    from skewd.agent import bundle as B
    from skewd.agent import replay as R
    from skewd.agent.record import Recorder
    from skewd.catalogue import full_catalogue
    from skewd.model import NODE_SCOPES
    from skewd.rules.loader import load_rules

    from .test_record import SETTINGS, write_rules

    cat = full_catalogue()
    rs = load_rules([write_rules(tmp_path / "rules.yaml")], cat).ruleset
    rec = Recorder(tmp_path / "cap", node="n1", cluster="c1", labels={"tp_group": "tp0"}, ruleset=rs,
                   catalogue=cat, settings=SETTINGS)
    pipe = Pipeline(cat, rs, node="n1", cluster="c1", labels={"tp_group": "tp0"}, sinks=[rec])
    pipe.engine.scopes = set(NODE_SCOPES)
    pk, starts, _ = traffic(12)
    tr = FlowTracker(0.001, burst_settle=0.1)
    live = []
    prev = float(T0)
    for k in range(1, 15):
        t = T0 + k + 0.4
        sel = np.flatnonzero((pk.ts_ns > prev * NS) & (pk.ts_ns <= t * NS))
        pipe.ingest(to_batch(tr.update(pk.take(sel), prev, t, ["eth0", "eth1"]), "n1", t))
        prev = t
        pipe.evaluate(T0 + k + 1)
        msg = summary_mod.make_summary(pipe.store, "n1", "c1", T0 + k + 1, 1.0)
        rec.on_summary(msg)
        live.append(list(msg.signals.get("collective_burst_starts", {}).values()))
    rec.close()
    assert sum(live, []) == (starts / NS).tolist()
    for seg in B.segment_dirs(tmp_path / "cap"):  # an agent that sent no summaries: recompute them
        (seg / B.SUMMARIES).unlink()
        idx = seg / B.INDEX
        idx.write_text("".join(x for x in idx.read_text().splitlines(keepends=True)
                               if json.loads(x)["file"] != B.SUMMARIES))
    segs, _ = R.open_segments([tmp_path / "cap"])
    assert not segs[0].summaries()
    rep = R.Replayer(segs, R.replay_catalogue(segs))
    rep.run()
    again = [list(s.signals.get("collective_burst_starts", {}).values()) for s in rep.summaries]
    assert again == live
