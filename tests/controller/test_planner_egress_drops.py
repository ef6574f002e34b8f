"""NS-7 (egress drops / retransmits) gets a remap only on direct evidence on its node.

The runbook's action for NS-7 is "check offloads, enable ECN/PFC"; an operator facing a port
that drops at its egress first looks where it drops (qdisc at its limit, driver tx ring, offloads)
and, until it is fixed, sends the node less traffic. Both only when the node's *own* port counted
the drops (NS-7-egress-drops: qdisc and driver counters of that node's kernel): a flow's
retransmits alone may be loss anywhere on the path, and rerouting away from a healthy node is a
wrong remap, which is worse than a missed one. Sandbox rules never get one.

Findings are built as the agents send them (tests/controller/sim.py); values invented.
"""
from __future__ import annotations

import asyncio

from skewd.controller import messages as M
from skewd.controller.config import load_config
from skewd.controller.correlator import Correlator
from skewd.controller.offline import CaptureJetStream, MemoryState
from skewd.controller.planner import Planner
from skewd.controller.service import Controller
from skewd.controller.timeline import Timelines
from skewd.controller.topology import Topology
from skewd.model import Layer, Scope

from .sim import finding

FLOW = "tcp 10.245.0.2:8000>10.245.0.9:51234"


def _cfg():
    return load_config(None, env={}, overrides={"cluster": "c"})


def _corr(cfg) -> Correlator:
    return Correlator("c", Topology.from_config(cfg), Timelines(), culprit_pathologies=cfg.culprit_pathologies,
                      never_inhibit=cfg.never_inhibit, effect_window=30.0, inhibit_rules=cfg.inhibit_rules,
                      direct_evidence=cfg.direct_evidence)


def _drops(node: str = "n1", maturity: str = "stable"):
    return finding(node, "NS-7-egress-drops", "NS-7", Layer.NETWORK, 100.0, cluster="c", entity="eth0",
                   scope=Scope.NIC_PORT, maturity=maturity,
                   evidence={"default(rate(netdev_qdisc_drops_total, window), 0)": 1840.0})


def _retransmits(node: str = "n1", maturity: str = "stable"):
    return finding(node, "NS-7-egress-retransmits", "NS-7", Layer.NETWORK, 100.0, cluster="c", entity=FLOW,
                   scope=Scope.FLOW, maturity=maturity, evidence={"unconfirmed_retransmits": 40.0})


def _plan(cfg, *fs):
    c = _corr(cfg)
    for f in fs:
        c.observe(f)
    incs = c.correlate(101.0)
    return incs, [Planner(cfg).plan(i, 200.0, members=c.members(i)) for i in incs if c.plannable(i)]


def test_drops_counted_on_the_nodes_port_get_the_qdisc_check_then_less_traffic() -> None:
    cfg = _cfg()
    (inc,), (s,) = _plan(cfg, _drops())
    assert [a.type for a in s.actions] == [M.ActionType.HOST_TUNING, M.ActionType.REROUTE]
    check, reroute = s.actions
    assert check.target.node == "n1" and check.params == {"port": "eth0"}
    assert check.command.startswith("tc -s qdisc show dev eth0") and "ethtool -k eth0" in check.command
    assert "qdisc" in check.rationale and "ECN" in check.rationale
    assert reroute.params == {"weight": cfg.reroute_weight, "port": "eth0"} and reroute.target.node == "n1"
    assert reroute.confidence < check.confidence
    assert s.evidence == inc.findings


def test_drops_with_the_flows_retransmits_still_name_the_dropping_port() -> None:
    cfg = _cfg()
    (inc,), (s,) = _plan(cfg, _retransmits(), _drops())
    assert len(inc.findings) == 2 and inc.culprit.entity == ""  # two entities: the port and the flow
    assert [a.params["port"] for a in s.actions] == ["eth0", "eth0"]


def test_retransmits_alone_get_no_remap_the_loss_may_be_anywhere_on_the_path() -> None:
    cfg = _cfg()
    (inc,), plans = _plan(cfg, _retransmits())
    assert inc.state == "open"  # shown: an operator sees it
    assert plans == [None]


def test_sandbox_drop_rules_get_no_remap() -> None:
    cfg = _cfg()
    incs, plans = _plan(cfg, _drops(maturity="sandbox"))
    assert incs == [] and plans == []  # a finding only
    # and the planner itself ignores a sandbox member, should one reach it
    c = _corr(cfg)
    c.observe(_retransmits())
    (inc,) = c.correlate(101.0)
    assert Planner(cfg).plan(inc, 200.0, members=[*c.members(inc), _drops(maturity="sandbox")]) is None


def test_the_controller_plans_it_from_the_incidents_own_findings() -> None:
    """The service hands the planner the incident's member findings (offline controller: in-memory
    KV and JetStream, as the fault lab runs it)."""
    cfg = load_config(None, env={}, overrides={"cluster": "c", "correlation": {"group_wait": "1s"}})
    ctl = Controller(cfg, wall_clock=lambda: 1_800_000_000.0)
    ctl.state = MemoryState(cfg.cluster)
    ctl.js = CaptureJetStream()
    loop = asyncio.new_event_loop()
    try:
        for f in (_retransmits("n2"), _drops("n1")):
            ctl.correlator.observe(f)
        for t in (100.0, 101.0, 102.0, 103.0):
            loop.run_until_complete(ctl._correlate_and_plan(t))
    finally:
        loop.close()
    planned = {r["suggestion"]["culprit"]["node"]: r["suggestion"] for r in ctl.remaps.values() if r.get("suggestion")}
    assert list(planned) == ["n1"]  # n2 only retransmits: nothing moves off it
    assert [a["type"] for a in planned["n1"]["actions"]] == ["host_tuning", "reroute"]
