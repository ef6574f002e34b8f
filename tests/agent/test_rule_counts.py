"""One rule count everywhere: ``agent --check``, the health message, ``/metrics`` and the live
views all classify the loaded rules the same way (active / inactive / controller-evaluated)."""
from __future__ import annotations

import io
import json

from skewd.agent.check import run_check
from skewd.agent.config import load_config
from skewd.agent.metrics import AgentMetrics
from skewd.agent.runner import Agent
from skewd.agent.scheduler import collector_config_keys
from skewd.agent.view import LiveView, ViewState
from skewd.catalogue import full_catalogue
from skewd.model import NODE_SCOPES
from skewd.rules.counts import rule_counts
from skewd.rules.engine import Engine
from skewd.rules.loader import load_rules
from skewd.rules.store import WindowStore

RULES = """\
required_engine_version: 1
rules:
  - id: LOCAL-ON
    pathology: custom-a
    scope: node
    layer: host
    expr: rate(host_tcp_retrans_segs_total, 1m) > 1
  - id: LOCAL-OFF
    pathology: custom-b
    scope: node
    layer: host
    enabled: false
    expr: rate(host_tcp_retrans_segs_total, 1m) > 2
  - {id: NEEDS-GPU, pathology: custom-c, scope: gpu, layer: gpu, expr: gpu_utilization_ratio > 0.5}
  - {id: GROUP, pathology: custom-d, scope: cluster, layer: network, expr: peer_dev(summary_net_tx_bytes_per_second) < -0.5}
"""


def test_every_rule_is_counted_once(tmp_path):
    (tmp_path / "r.yaml").write_text(RULES)
    cat = full_catalogue()
    rs = load_rules([tmp_path / "r.yaml"], cat).ruleset
    with_gpu = Engine(rs, WindowStore(cat), scopes=NODE_SCOPES)
    with_gpu.set_available_signals({"host_tcp_retrans_segs_total", "gpu_utilization_ratio"})
    without = Engine(rs, WindowStore(cat), scopes=NODE_SCOPES)
    without.set_available_signals({"host_tcp_retrans_segs_total"})
    c = rule_counts(without)
    assert (c.active, c.inactive, c.controller) == (1, 2, 1) and c.total == 4
    assert set(c.inactive_reasons) == {"LOCAL-OFF", "NEEDS-GPU"} and "gpu_utilization_ratio" in c.inactive_reasons["NEEDS-GPU"]
    assert c.describe() == "1 active, 2 inactive, 1 controller-evaluated"
    # across nodes (the demo): active where any node runs it
    c2 = rule_counts([without, with_gpu])
    assert (c2.active, c2.inactive, c2.controller) == (2, 1, 1)


def test_check_health_metrics_and_view_show_the_same_numbers(tmp_path):
    (tmp_path / "r.yaml").write_text(RULES)
    cfg = load_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": "c1", "rules": [str(tmp_path / "r.yaml")], "metrics": {"listen": ""},
        "collectors": {"gpu": {"enabled": False}, "pkt": {"enabled": False}}})
    out = io.StringIO()
    run_check(cfg, out, as_json=True)
    checked = json.loads(out.getvalue())["rule_counts"]
    assert checked == {"active": 1, "inactive": 2, "controller": 1}

    agent = Agent(cfg)
    agent.setup()
    try:
        health = agent.health(0.0)
        assert (health.rules.active, len(health.rules.inactive)) == (checked["active"], checked["inactive"])
        gauges = {s.labels["status"]: s.value for fam in AgentMetrics(agent).collect() if fam.name == "skewd_rules"
                  for s in fam.samples}
        # (clock_weakened overlaps the three classes: a separate count)
        assert {k: v for k, v in gauges.items() if k != "clock_weakened"} == {k: float(v) for k, v in checked.items()}
        view = io.StringIO()
        LiveView(view, interactive=False).update(ViewState("t", rules=rule_counts(agent.pipeline.engine)))
        assert "rules: 1 active, 2 inactive, 1 controller-evaluated" in view.getvalue()
    finally:
        for s in agent.slots:
            if s.collector is not None:
                s.collector.stop()
