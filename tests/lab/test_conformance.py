"""The simulator emits what the collectors would: only catalogued signals, with their scopes'
entity names, sane units, counters that only go up - and, for the packets it generates, the
same features the real pkt collector computes from them."""
from __future__ import annotations

import re
from collections import defaultdict

import numpy as np
import pytest

from skewd.catalogue import full_catalogue
from skewd.lab.sim import simulate
from skewd.model import Kind

from .helpers import scenario

ENTITY = {"gpu": r"gpu\d+", "nic_port": r"eth\d+", "rdma_port": r"mlx5_\d+(/1)?", "engine": r"(engine|vllm)\d+",
          "cpu": r"cpu\d+", "pci_device": r"[0-9a-f]{4}:[0-9a-f]{2}:00\.0",
          "flow": r"(tcp|udp) \d+\.\d+\.\d+\.\d+:\d+>\d+\.\d+\.\d+\.\d+:\d+", "node": r"(|doca-telemetry-service)"}
SHAPES = ("dp", "pergpu", "tp", "pp", "disagg")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("conf")
    out = {}
    for shape in SHAPES:
        sc = scenario(tmp, f"name: c-{shape}\nshape: {shape}\nduration: 1m\n", f"c-{shape}")
        out[shape] = list(simulate(sc, 5))
    return out


def test_only_catalogued_signals_with_their_scope_entities(runs):
    cat = full_catalogue()
    for shape, items in runs.items():
        for _, node, b in items:
            assert (b.node == node).all()
            for sig, ent in set(zip(b.signal.tolist(), b.entity.tolist())):
                assert sig in cat, f"{shape}: {sig} is not catalogued"
                scope = cat[sig].scope.value
                assert re.fullmatch(ENTITY[scope], ent), f"{shape}: {sig} ({scope}) has entity {ent!r}"


def test_most_of_the_catalogue_is_exercised(runs):
    cat = full_catalogue()
    seen = {s for items in runs.values() for _, _, b in items for s in b.signal.tolist()}
    own = {s for s, spec in cat.items() if spec.collector in ("gpu", "pcie", "netdev", "rdma", "host", "vllm", "pkt")}
    missing = own - seen
    # only these need a fault or a capture detail a healthy minute does not produce (the listing
    # cap is not reached by healthy collectives; a healthy cluster's ports are not shaped: NS-5's
    # and NS-9's shaping variants set a qdisc rate)
    assert missing <= {"pkt_flow_end_spread_seconds", "pkt_flow_roce_retransmits_total",
                       "pkt_collective_silences_unlisted_total", "netdev_qdisc_rate_bytes"}, sorted(missing)


def test_units_and_counters(runs):
    cat = full_catalogue()
    for shape, items in runs.items():
        series = defaultdict(list)
        for _, node, b in items:
            for t, e, s, v in zip(b.t.tolist(), b.entity.tolist(), b.signal.tolist(), b.value.tolist()):
                series[(node, s, e)].append((t, v))
        for (node, s, e), pts in series.items():
            spec = cat[s]
            t = np.array([p[0] for p in pts])
            v = np.array([p[1] for p in pts])
            assert np.all(np.diff(t) > 0), f"{s} timestamps not increasing"
            assert np.all(np.isfinite(v)), s
            if spec.kind is Kind.COUNTER:
                assert np.all(np.diff(v) >= 0), f"{shape} {node} {s}[{e}] went down: {v[:10]}"
            if spec.unit == "ratio" or s.endswith("_ratio") and spec.unit in ("ratio", "1"):
                assert np.all((v >= -1e-9) & (v <= 1 + 1e-6)), f"{s} outside 0..1: {v.min()}..{v.max()}"
            if spec.unit == "bool":
                assert set(np.unique(v)) <= {0.0, 1.0}, s
            if s == "rdma_port_xmit_bytes_total":
                assert np.all(v % 4 == 0), "port_xmit_data counts 4-byte words"
            if s.startswith("host_cpu_") and s.endswith("_seconds_total"):
                assert np.allclose(np.round(v * 100), v * 100), "USER_HZ ticks"


def test_vllm_engine_steps_carry_one_token_per_running_request(runs):
    # vllm_iterations_total counts the engine's steps (vLLM: observations of
    # vllm:iteration_tokens_total); a decode step gives each running request one token, so the
    # generation tokens per step are about the requests running
    checked = 0
    for shape, items in runs.items():
        series = defaultdict(list)
        for _, node, b in items:
            for t, e, s, v in zip(b.t.tolist(), b.entity.tolist(), b.signal.tolist(), b.value.tolist()):
                if s in ("vllm_iterations_total", "vllm_generation_tokens_total", "vllm_requests_running"):
                    series[(node, e, s)].append(v)
        for (node, e, s), steps in series.items():
            if s != "vllm_iterations_total":
                continue
            gen = series[(node, e, "vllm_generation_tokens_total")]
            running = float(np.mean(series[(node, e, "vllm_requests_running")][10:]))
            assert steps[-1] > steps[10] > 0, f"{shape} {node} {e}: the engine never stepped"
            if running < 5:
                continue  # a prefill-only engine (disaggregated serving) decodes next to nothing
            per_step = (gen[-1] - gen[10]) / (steps[-1] - steps[10])
            assert 0.8 * running <= per_step <= 1.15 * running, f"{shape} {node} {e}: {per_step:.1f} vs {running:.1f}"
            checked += 1
    assert checked >= 10


def test_vllm_engine_step_counter_starts_over_when_the_engine_restarts(tmp_path):
    # an engine down for 15 s (GPU-1 idle_job) comes back as a new process: its step counter
    # starts from zero, as its token counter does
    sc = scenario(tmp_path, "name: rs\nshape: dp\nduration: 100s\nfaults:\n  - pathology: GPU-1\n"
                            "    node: node1\n    variant: idle_job\n    onset: 60s\n    duration: 15s\n")
    seen = defaultdict(list)
    for _, node, b in simulate(sc, 3):
        if node == "node1":
            for s, v in zip(b.signal.tolist(), b.value.tolist()):
                if s in ("vllm_up", "vllm_iterations_total", "vllm_generation_tokens_total"):
                    seen[s].append(v)
    up = seen["vllm_up"]
    down = up.index(0.0)
    assert 1.0 in up[down:], "the engine must come back within the run for a restart to be seen"
    # counters are emitted only while up, so in their lists v[down - 1] is the last value before
    # the outage and v[down] the first after it
    for s in ("vllm_iterations_total", "vllm_generation_tokens_total"):
        v = seen[s]
        assert len(v) == up.count(1.0) and 0 < v[down] < v[down - 1] / 10, s


def test_vllm_quantiles_use_the_collectors_arithmetic():
    from skewd.collectors.vllm.parse import histogram_quantile
    from skewd.lab.sim.measure import hist_quantiles
    from skewd.lab.sim.workload import HISTS

    rng = np.random.default_rng(0)
    for name, bounds in HISTS.items():
        for _ in range(50):
            counts = np.cumsum(rng.integers(0, 5, len(bounds)) * (rng.random(len(bounds)) < 0.4))
            ref = [histogram_quantile(q, {float(b): float(c) for b, c in zip(bounds, counts)}) for q in (0.5, 0.99)]
            got = hist_quantiles((0.5, 0.99), bounds, counts)
            np.testing.assert_allclose(got, ref, equal_nan=True, err_msg=name)


def test_front_end_packet_features_match_the_real_pkt_collector(tmp_path):
    """Hand the simulator's own packets to collectors/pkt's FlowTracker and compare its samples
    with what the simulator emitted for the same interval."""
    from skewd.collectors.pkt.features import FlowTracker
    from skewd.collectors.pkt.frames import DIR_IN, DIR_OUT
    from skewd.collectors.pkt.parse import Packets
    from skewd.collectors.pkt.samples import to_batch

    sc = scenario(tmp_path, "name: pk\nshape: dp\nduration: 1m\n")
    sim = simulate(sc, 2)
    ns = sim.nodes[0]
    tracker = FlowTracker(0.001, 60.0)
    seq: dict[int, int] = {}
    compared = 0
    for k in range(25):
        items = sim.step()
        flow, ts, wl, rtx, fin, t0, t1 = ns.last_packets
        n = len(flow)
        names = [ns.flows.names[i] for i in flow.tolist()]
        parts = [re.match(r"tcp (\S+):(\d+)>(\S+):(\d+)", x).groups() for x in names]
        ip = lambda a: sum(int(o) << (8 * (3 - j)) for j, o in enumerate(a.split(".")))  # noqa: E731
        pay = wl - 66
        s = np.zeros(n, np.int64)
        for i, f in enumerate(flow.tolist()):  # sequence numbers advance by payload, per flow
            s[i] = seq.get(f, 1000)
            seq[f] = s[i] + pay[i]
        o = np.argsort(ts, kind="stable")
        pk = Packets(ts_ns=ts[o], wirelen=wl[o], decoded=np.ones(n, bool)[o], outer_ip=np.ones(n, bool),
                     ipver=np.full(n, 4, np.int8), proto=np.full(n, 6, np.int16), src_hi=np.zeros(n, np.uint64),
                     src_lo=np.array([ip(p[0]) for p in parts], np.uint64)[o], dst_hi=np.zeros(n, np.uint64),
                     dst_lo=np.array([ip(p[2]) for p in parts], np.uint64)[o],
                     sport=np.array([int(p[1]) for p in parts], np.int32)[o],
                     dport=np.array([int(p[3]) for p in parts], np.int32)[o], l4ok=np.ones(n, bool),
                     payload=pay[o], frag=np.zeros(n, bool), ecn=np.zeros(n, np.int8),
                     tcp_flags=np.where(pay > 0, 0x18, 0x10).astype(np.int16)[o] | np.where(fin[o], 1, 0).astype(np.int16),
                     tcp_seq=s[o], tcp_ack=np.arange(n, dtype=np.int64) + 1, tcp_win=np.full(n, 502, np.int32),
                     bth_opcode=np.full(n, -1, np.int16), bth_qp=np.full(n, -1, np.int32),
                     bth_psn=np.full(n, -1, np.int32),
                     direction=np.array([DIR_OUT if ns.flows.egress[f] else DIR_IN for f in flow.tolist()],
                                        np.int8)[o], iface=np.zeros(n, np.int32))
        ref = to_batch(tracker.update(pk, t0, t1, ["eth0"]), "node0", t1)
        mine = [b for (t, node, b) in items if node == "node0" and any(x.startswith("pkt_flow_") for x in b.signal)]
        if k < 3:
            continue  # both sides warm up (flows first seen)
        want = {(e, sg): v for e, sg, v in zip(ref.entity, ref.signal, ref.value) if sg.startswith("pkt_flow_")}
        got = {(e, sg): v for b in mine for e, sg, v in zip(b.entity, b.signal, b.value) if e.startswith("tcp ")}
        for key in ("pkt_flow_packets_per_second", "pkt_flow_bytes_per_second", "pkt_flow_gap_p50_seconds",
                    "pkt_flow_gap_p99_seconds", "pkt_flow_gap_max_seconds", "pkt_flow_jitter_cov",
                    "pkt_flow_bursts_total", "pkt_flow_burst_bytes_max", "pkt_flow_egress", "pkt_flow_idle_seconds",
                    "pkt_flow_packets_total", "pkt_flow_inter_burst_gap_seconds", "pkt_flow_bytes_share_ratio"):
            w = {e: v for (e, sg), v in want.items() if sg == key}
            g = {e: v for (e, sg), v in got.items() if sg == key}
            assert set(w) == set(g), f"{key}: flows differ at interval {k}: {sorted(set(w) ^ set(g))[:4]}"
            for e in w:
                assert g[e] == pytest.approx(w[e], rel=1e-6, abs=1e-9), f"{key} {e} at interval {k}"
                compared += 1
    assert compared > 1000


def _collector_silences(ts, d, pay, t_start: float):
    """Packets at times ``ts`` (s) with directions ``d`` and payloads ``pay`` on one UDP
    connection, handed to collectors/pkt's FlowTracker one 1 s interval at a time from
    ``t_start``: the silences it lists, as (ends s, lengths s, ended by the node's send)."""
    from skewd.collectors.pkt.features import NS, FlowTracker
    from skewd.collectors.pkt.frames import DIR_OUT
    from skewd.lab.sim import steps as sim_steps
    from tests.pkt_packets import udp_packets

    out = d == DIR_OUT
    pk = udp_packets(np.round(ts * NS).astype(np.int64), pay + 66, dst=np.where(out, 2, 1),
                     sport=np.where(out, 5000, 6000), dport=np.where(out, 6000, 5000), direction=d, payload=pay)
    pk.src_lo[:] = np.where(out, 1, 2)
    tr = FlowTracker(sim_steps.MIN_SILENCE, 60.0)
    got_e, got_l, got_k = [], [], []
    t0 = t_start
    while t0 < ts[-1] + 1:
        sel = np.flatnonzero((pk.ts_ns > t0 * NS) & (pk.ts_ns <= (t0 + 1) * NS))
        f = tr.update(pk.take(sel), t0, t0 + 1, ["eth1"])
        if f.ports:
            s_ = f.ports[0].silences
            got_e += (s_.end_ns / NS).tolist()
            got_l += (s_.length_ns / NS).tolist()
            got_k += s_.by_send.tolist()
        t0 += 1
    return got_e, got_l, got_k


def test_collective_silences_match_the_real_pkt_collector():
    """The simulator lists a node's collective silences from its step timeline
    (lab/sim/steps.py), not from packets: realise the same timeline as packets - the node's
    sends in its active stretches, its peers' data arriving where a wait ends, nothing during a
    silence - hand them to collectors/pkt's FlowTracker interval by interval, and compare its
    silences (ends, lengths, how they ended, bytes) with the simulator's."""
    from skewd.collectors.pkt.frames import DIR_IN, DIR_OUT
    from skewd.lab.sim import steps as sim_steps

    rng = np.random.default_rng(11)
    T = 1_700_000_000.0
    k = 300
    step = 0.03 + rng.uniform(0, 0.01, k)
    entry = T + 0.5 + np.cumsum(step)
    latest = entry + rng.choice([0.0, 0.0, 0.004, 0.012], k)
    end = np.maximum(entry + 0.02, latest + 0.008)
    entry[1:] = np.maximum(entry[1:], end[:-1] + 0.002)  # a step starts after the previous one ended
    latest = np.maximum(latest, entry)
    end = np.maximum(end, latest + 0.006)
    sil, _ = sim_steps.step_silences(np.random.default_rng(3), float("nan"), entry, latest, end,
                                     np.full(k, 4_000_000.0), "tcp")
    # realise it: one 60 kB send every 0.2 ms in each active stretch (the silences are the gaps
    # between stretches), the stretch after a wait starting with a peer's data segment
    starts = np.r_[entry[0], sil.end]
    stops = np.r_[sil.end - sil.length, end[-1]]
    ts, d = [], []
    for a, b, by_send in zip(starts.tolist(), stops.tolist(), np.r_[1, sil.by_send].tolist()):
        t = np.unique(np.r_[np.arange(a, b, 0.0002), b])
        dd = np.full(len(t), DIR_OUT)
        if not by_send:
            dd[0] = DIR_IN  # the wait (or pause) ended with a peer's data
        ts.append(t)
        d.append(dd)
    ts, d = np.concatenate(ts), np.concatenate(d)
    got_e, got_l, got_k = _collector_silences(ts, d, np.full(len(ts), 60_000), T)
    # a silence within a few ns of the 1 ms threshold may fall either side once its packets'
    # times are rounded to ns: compare the rest
    keep_s = sil.length >= sim_steps.MIN_SILENCE + 5e-6
    keep_r = np.array(got_l) >= sim_steps.MIN_SILENCE + 5e-6
    got_e, got_l, got_k = (np.array(x)[keep_r] for x in (got_e, got_l, got_k))
    sil = sim_steps.StepSilences(sil.end[keep_s], sil.length[keep_s], sil.by_send[keep_s], sil.sent[keep_s])
    assert len(sil.end) > 500 and len(got_e) == len(sil.end)
    assert np.allclose(got_e, sil.end, atol=2e-6) and np.allclose(got_l, sil.length, atol=4e-6)
    assert got_k.tolist() == sil.by_send.tolist()


def test_pipeline_hand_off_silences_match_the_real_pkt_collector():
    """The simulator lists a pipeline stage's hand-off silences from the stages' compute ends
    (lab/sim/steps.py, "pipeline hand-offs"), not from packets: realise the same hand-offs as
    packets on one stage connection - the receiver's 64-byte clear-to-send, the sender's
    activations once asked - hand each node's to collectors/pkt's FlowTracker interval by
    interval and compare its silences (ends, lengths, how they ended) with the simulator's. The
    stages take turns being slow, so both a downstream stage waiting for its input and an
    upstream one answering its receiver are covered."""
    from skewd.collectors.pkt.frames import DIR_IN, DIR_OUT
    from skewd.lab.sim import steps as sim_steps

    rng = np.random.default_rng(5)
    T = 1_700_000_000.0
    k = 600
    P = 0.03 + rng.uniform(0, 0.02, k)
    starts = T + 0.5 + np.cumsum(P)
    slow_first = (np.arange(k) // 100) % 2 == 0  # stage 0 slow for 100 steps, then stage 1
    w = np.where(rng.random(k) < 0.2, 1.0, rng.uniform(1.2, 2.0, k))  # some steps balanced
    f0 = starts + P * np.where(slow_first, 1.0, 1.0 / w) - rng.uniform(0, 4e-4, k)
    f1 = starts + P * np.where(slow_first, 1.0 / w, 1.0) - rng.uniform(0, 4e-4, k)
    nbytes = np.full(k, 2_000_000.0)
    snd, rcv = sim_steps.handoff_events(f0, f1, nbytes, 50e9)
    checked = 0
    for ev in (snd, rcv):
        sil = sim_steps.event_silences(ev, sim_steps.SilenceState())
        # realise: a stretch is packets every 10 us from its start to its end (one packet when
        # it has no length), sends outgoing, data and messages incoming
        ts, d, pay = [], [], []
        for a, b, kind, by in zip(ev.start.tolist(), ev.end.tolist(), ev.kind.tolist(), ev.nbytes.tolist()):
            t = np.unique(np.r_[np.arange(a, b, 1e-5), b]) if b > a else np.array([a])
            ts.append(t)
            d.append(np.full(len(t), DIR_OUT if kind == sim_steps.EV_SEND else DIR_IN))
            pay.append(np.full(len(t), max(1, int(by // len(t))) if by >= 256 else int(by)))
        ts, d, pay = np.concatenate(ts), np.concatenate(d), np.concatenate(pay)
        o = np.argsort(ts, kind="stable")
        ts, d, pay = ts[o], d[o], pay[o]
        got_e, got_l, got_k = _collector_silences(ts, d, pay, T)
        keep_s = sil.length >= sim_steps.MIN_SILENCE + 5e-6
        keep_r = np.array(got_l) >= sim_steps.MIN_SILENCE + 5e-6
        got_e, got_l, got_k = (np.array(x)[keep_r] for x in (got_e, got_l, got_k))
        assert len(got_e) == keep_s.sum() > 400
        assert np.allclose(got_e, sil.end[keep_s], atol=2e-6) and np.allclose(got_l, sil.length[keep_s], atol=4e-6)
        assert got_k.tolist() == sil.by_send[keep_s].tolist()
        checked += 1
        # both ways of ending a silence occur on each side over the two halves
        assert 0 < sil.by_send.sum() < len(sil.by_send)
    assert checked == 2
