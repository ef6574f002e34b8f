"""Ground truth says what was injected, where and when - and the injected effect shows up there,
and only there, while the fault lasts."""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from skewd.lab.sim import list_scenarios, load_scenario, simulate
from skewd.lab.sim.faults import INJECTORS

from .helpers import scenario


def test_truth_of_every_shipped_scenario_is_consistent():
    for p in list_scenarios():
        sc = load_scenario(p)
        for seed in (1, 2):
            sim = simulate(sc, seed)
            assert len(sim.truth) == len(sc.faults)
            for spec, t in zip(sc.faults, sim.truth):
                inj = INJECTORS[t.pathology]
                assert sim.start + spec.onset[0] <= t.onset <= sim.start + spec.onset[1]
                assert spec.duration[0] <= t.end - t.onset <= spec.duration[1] + 1e-9
                assert t.end <= sim.end
                assert spec.severity[0] <= t.severity <= spec.severity[1]
                assert t.variant in inj.variants
                assert t.nodes and set(t.nodes) <= set(sim.node_names)
                assert set(t.nodes) & set(inj.eligible_nodes(sim.cluster)) or inj.target == "fabric"
                if t.entity:
                    assert t.entity in inj.eligible_entities(sim.cluster, sim.cluster.node(t.nodes[0]))
                assert t.to_dict()["pathology"] == t.pathology


def _series(sim, signal: str):
    out = defaultdict(list)
    for t, node, b in sim:
        m = b.signal == signal
        for e, v in zip(b.entity[m].tolist(), b.value[m].tolist()):
            out[(node, e)].append((t, v))
    return {k: np.array(v) for k, v in out.items()}


def _during(arr, a, b):
    return arr[(arr[:, 0] >= a) & (arr[:, 0] < b), 1]


@pytest.mark.parametrize("pid,shape,signal,counter", [
    ("NS-5", "dp", "netdev_qdisc_backlog_max_bytes", False),
    ("GPU-5", "dp", "gpu_clocks_event_reasons", False),
    ("EW-6", "tp", "rdma_port_out_of_sequence_total", True),
    ("GPU-6", "dp", "pcie_gpu_replays_total", True),
])
def test_effect_only_on_the_culprit_and_only_during_the_fault(tmp_path, pid, shape, signal, counter):
    variant = {"GPU-6": "variant: replay_storm\n    ", "GPU-5": "variant: power_brake\n    "}.get(pid, "")
    sc = scenario(tmp_path, f"""\
name: eff-{pid}
shape: {shape}
duration: 3m
faults:
  - pathology: {pid}
    {variant}onset: 70s
    duration: 60s
    severity: 0.8
""")
    sim = simulate(sc, 4)
    truth = sim.truth[0]
    ser = _series(sim, signal)
    culprit = [(n, e) for (n, e) in ser if n in truth.nodes and (not truth.entity or e == truth.entity)]
    assert culprit, f"no {signal} on the culprit {truth.nodes}/{truth.entity}"

    def level(arr, a, b):
        v = _during(arr, a, b)
        return float(v[-1] - v[0]) if counter else float(np.mean(v))

    on = (truth.onset + 10, truth.end)
    before = (sim.start + 5, truth.onset)
    after = (truth.end + 10, sim.end)
    for key in culprit:
        assert level(ser[key], *on) > 10 * max(level(ser[key], *before), 1.0), (key, signal)
        if not counter:
            assert level(ser[key], *after) < 0.2 * level(ser[key], *on)
    hit = min(level(ser[k], *on) for k in culprit)
    for key, arr in ser.items():
        if key not in culprit:  # natural noise elsewhere stays far below the injected effect
            assert level(arr, *on) < 0.05 * hit, f"{key} changed too"


def test_oversized_kv_ships_larger_transfers_than_the_healthy_cap(tmp_path):
    """EW-8's long-prompt cause must reach the wire: the culprit prefill node's largest KV burst
    during the fault is well above any before it. The load's 32k-token prompt cap once clipped
    every long prompt back to the healthy maximum, and the fault changed no transfer size."""
    sc = scenario(tmp_path, """\
name: eff-ew8
shape: disagg
duration: 4m
faults:
  - pathology: EW-8
    variant: oversized_kv
    onset: 60s
    duration: 150s
    severity: 0.8
""")
    sim = simulate(sc, 4)
    truth = sim.truth[0]
    ser = _series(sim, "pkt_flow_burst_bytes_max")
    mine = [k for k in ser if k[0] in truth.nodes and ":4791" in k[1]]
    assert mine, "no RDMA flow bursts on the culprit"
    before = max((float(np.nanmax(_during(ser[k], sim.start, truth.onset), initial=0.0)) for k in mine))
    during = max((float(np.nanmax(_during(ser[k], truth.onset, truth.end), initial=0.0)) for k in mine))
    assert before > 0
    assert during > 1.5 * before, (before, during)
