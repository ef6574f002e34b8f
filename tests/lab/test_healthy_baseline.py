"""An hour of noisy but healthy telemetry from a serving node, through every shipped rule pack
as its agent evaluates them (every second, node scopes, its own summaries fed back), raises no
finding - not even a pending one. A rule that fires on healthy traffic teaches on-call
engineers to ignore skewd."""
from __future__ import annotations

import pytest

from skewd.catalogue import full_catalogue
from skewd.lab.sim import simulate
from skewd.lab.harness import Harness
from skewd.rules.cli import PACKS
from skewd.rules.loader import load_rules

from .helpers import scenario

BODY = """\
name: baseline
pathology: healthy
description: One node of the dp fleet (TP8 405B FP8, BlueField DPU, RoCE, 100 GbE front end) for an hour.
shape: dp
cluster: {nodes: 1}
duration: 60m
"""


@pytest.mark.timeout(1800)  # a simulated hour: about two minutes on an idle 2-core machine
def test_an_hour_of_healthy_telemetry_raises_no_finding(tmp_path):
    cat = full_catalogue()
    rs = load_rules([PACKS], cat).ruleset
    sim = simulate(scenario(tmp_path, BODY), 11)
    assert not sim.truth
    h = Harness(sim, rs, cat, eval_interval=1, summary_interval=1, controller=False)
    res = h.run()

    # not vacuous: the node's agent evaluated the packs every second with most rules active
    assert res.node_evaluations >= 3590
    engine = next(iter(h.pipes.values())).engine
    active = [r.id for r in rs.rules if engine.evaluates(r) and r.id not in engine.inactive]
    assert len(active) >= 30, f"only {len(active)} rules active: {active}"
    assert {"NS-6-egress-jitter", "EW-8-kv-transfer-bottleneck", "GPU-2-kv-saturation",
            "NS-2-ingress-gaps", "PCIE-4-intra-node-gpu-skew"} <= set(active)

    found = sorted({(f.rule_id, f.entity, f.state.value) for f in res.findings})
    assert not found, "findings on healthy telemetry:\n" + "\n".join(map(str, found[:40]))
