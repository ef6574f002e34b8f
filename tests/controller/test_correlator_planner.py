"""Correlation (grouping, de-duplication, inhibition, root cause) and planning, without NATS."""
from __future__ import annotations

import dataclasses

import pytest

from skewd.controller import messages
from skewd.controller.config import load_config
from skewd.controller.correlator import Correlator
from skewd.controller.planner import Planner, semantic_key
from skewd.controller.timeline import Timelines
from skewd.controller.topology import Topology
from skewd.model import Layer, Scope, State

from .sim import finding

PEERS = ("n0", "n1", "n3")


def _cfg(**over):
    base = {"cluster": "c", "topology": {"tp_groups": {"tp0": {"nodes": ["n0", "n1", "n2", "n3"], "model": "m1"}},
                                         "models": {"m1": {"max_num_seqs": 200}}}}
    base.update(over)
    return load_config(None, env={}, overrides=base)


def _corr(values: dict[tuple[str, str], float] | None = None, cfg=None) -> Correlator:
    cfg = cfg or _cfg()
    vals = values or {}
    return Correlator("c", Topology.from_config(cfg), Timelines(), culprit_pathologies=cfg.culprit_pathologies,
                      never_inhibit=cfg.never_inhibit, effect_window=30.0, node_value=lambda s, n: vals.get((s, n)),
                      inhibit_rules=cfg.inhibit_rules)


#: a straggler claim whose own evidence singles its node out (controller/culprit.py): 8 ms late
#: beyond the clocks' error against a 2 ms bar, over 300 aligned steps (invented test values)
NAMES_N2 = {"culprit_measure": 0.008, "culprit_bar": 0.002, "culprit_steps": 300.0, "culprit_min_steps": 20.0}


def _straggler(t: float = 100.0, node: str = "n2", maturity: str = "stable", evidence=None, rule: str = "EW-1-x",
               pathology: str = "EW-1"):
    f = finding(node, rule, pathology, Layer.NETWORK, t, cluster="c", scope=Scope.TP_GROUP, maturity=maturity,
                evidence=NAMES_N2 if evidence is None else evidence)
    f.labels = {"tp_group": "tp0"}
    return f


def _peers(sig: str, peer: float, culprit: float) -> dict[tuple[str, str], float]:
    return {**{(sig, n): peer for n in PEERS}, (sig, "n2"): culprit}


@pytest.mark.parametrize("values,own,layer", [
    (_peers("summary_gpu_throttled", 0.0, 1.0), [], "gpu"),
    ({}, [("GPU-5", Layer.GPU)], "gpu"),
    ({}, [("PCIE-8", Layer.PCIE)], "host"),
    ({**_peers("summary_pcie_rx_bytes_per_second", 12e9, 3e9), **_peers("summary_net_rx_bytes_per_second", 1e9, 1e9)},
     [], "pcie"),
    ({**_peers("summary_pcie_rx_bytes_per_second", 12e9, 12e9), **_peers("summary_rdma_xmit_wait_per_second", 100, 5000)},
     [], "network"),
    (_peers("summary_requests_waiting", 2, 40), [], "engine"),
    # the PCIe feed is thin but so is the ingress: not "PCIe late after ingress" — no layer explains it
    ({**_peers("summary_pcie_rx_bytes_per_second", 12e9, 3e9), **_peers("summary_net_rx_bytes_per_second", 1e9, 0.2e9)},
     [], "unknown"),
])
def test_root_cause_follows_the_runbooks(values, own, layer) -> None:
    c = _corr(values)
    c.observe(_straggler())
    for p, lay in own:
        c.observe(finding("n2", f"{p}-x", p, lay, 100.0, cluster="c"))
    (inc,) = c.correlate(101.0)
    assert inc.culprit.node == "n2" and inc.cause.layer == layer, inc.cause


def test_victims_inhibited_hardware_faults_never_and_duplicates_dropped() -> None:
    c = _corr()
    assert c.observe(_straggler())
    assert not c.observe(_straggler())  # the same transition again (a redelivery)
    victims = [finding(n, "GPU-8-x", "GPU-8", Layer.ENGINE, 100.0, cluster="c") for n in PEERS]
    xid = finding("n0", "GPU-6-x", "GPU-6", Layer.GPU, 100.0, cluster="c", entity="gpu3")
    for f in (*victims, xid):
        c.observe(f)
    incs = {i.group.get("tp_group") or i.group.get("node"): i for i in c.correlate(101.0)}
    assert set(incs["tp0"].inhibited) == {f.id for f in victims}
    assert incs["tp0"].victims == list(PEERS)
    assert incs["n0"].pathology == "GPU-6" and incs["n0"].state == "open"  # a real fault on a victim stays visible
    # an older transition delivered late does not overwrite the newer one
    old = _straggler(50.0)
    assert not c.observe(old) or c.findings[old.fingerprint].active_at == 99.0


def test_incident_keeps_its_id_resolves_and_releases_victims() -> None:
    c = _corr()
    s = _straggler()
    v = finding("n0", "GPU-8-x", "GPU-8", Layer.ENGINE, 100.0, cluster="c")
    c.observe(s), c.observe(v)
    (inc,) = c.correlate(101.0)
    assert c.correlate(102.0) == []  # nothing changed: nothing to publish again
    resolved = _straggler()
    resolved.state, resolved.resolved_at, resolved.evaluated_at = State.RESOLVED, 110.0, 110.0
    c.observe(resolved)
    changed = {i.id: i for i in c.correlate(110.0)}
    assert changed[inc.id].state == "resolved"
    own = [i for i in changed.values() if i.group.get("node") == "n0"]
    assert len(own) == 1 and own[0].state == "open"  # no culprit any more: the victim's finding stands alone


def test_planner_orders_least_disruptive_first_and_keys_are_stable() -> None:
    cfg = _cfg()
    c = _corr(_peers("summary_gpu_throttled", 0.0, 1.0), cfg)
    c.observe(_straggler())
    (inc,) = c.correlate(101.0)
    p = Planner(cfg)
    s1, s2 = p.plan(inc, 200.0, "a"), p.plan(inc, 300.0, "b")
    assert [a.type for a in s1.actions] == [messages.ActionType.REROUTE, messages.ActionType.MOVE_TP_RANK,
                                            messages.ActionType.DRAIN_RECLAIM]
    assert s1.key == s2.key and [a.key for a in s1.actions] == [a.key for a in s2.actions]
    assert semantic_key(s1) == semantic_key(s2)
    assert s1.actions[0].params["weight"] == cfg.reroute_weight


def test_planner_host_cause_gives_the_concrete_command_and_skew_gives_rebalance() -> None:
    cfg = _cfg()
    c = _corr(cfg=cfg)
    c.observe(_straggler())
    c.observe(finding("n2", "PCIE-8-x", "PCIE-8", Layer.PCIE, 100.0, cluster="c"))
    (inc,) = c.correlate(101.0)
    s = Planner(cfg).plan(inc, 200.0)
    assert s.actions[0].type is messages.ActionType.HOST_TUNING and s.actions[0].command == "tuned-adm profile network-latency"
    skew = _straggler(rule="EW-3-x", pathology="EW-3")
    c2 = _corr(cfg=cfg)
    c2.observe(skew)
    (inc2,) = c2.correlate(101.0)
    assert messages.ActionType.REBALANCE_SHARDS in [a.type for a in Planner(cfg).plan(inc2, 200.0).actions]


def test_planner_kv_saturation_caps_concurrency_and_low_confidence_is_dropped() -> None:
    cfg = _cfg(remap={"min_confidence": 0.5})
    c = _corr(cfg=cfg)
    c.observe(finding("n1", "GPU-2-x", "GPU-2", Layer.ENGINE, 100.0, cluster="c", entity="engine0"))
    (inc,) = c.correlate(101.0)
    s = Planner(cfg).plan(inc, 200.0)
    assert [a.type for a in s.actions] == [messages.ActionType.REROUTE, messages.ActionType.CAP_CONCURRENCY]
    cap = s.actions[1]
    assert cap.params["max_num_seqs"] == 150 and cap.target.node == "n1"
    c3 = _corr(cfg=cfg)
    c3.observe(finding("n1", "NS-5-x", "NS-5", Layer.NETWORK, 100.0, cluster="c"))
    (inc3,) = c3.correlate(101.0)
    assert Planner(cfg).plan(inc3, 200.0) is None  # nothing a remap can do for an egress backlog


def test_topology_from_agent_labels_and_conflicts() -> None:
    topo = Topology.from_config(_cfg())
    assert topo.observe("x1", {"tp_group": "tpX", "tp_rank": "1", "model": "m2"})
    topo.observe("x0", {"tp_group": "tpX", "tp_rank": "0"})
    assert not topo.observe("x0", {"tp_group": "tpX", "tp_rank": "0"})  # unchanged
    assert topo.tp_groups()["tpX"].nodes == ("x0", "x1") and topo.tp_groups()["tpX"].model == "m2"
    topo.observe("n2", {"tp_group": "elsewhere"})
    assert topo.group_of("n2").name == "tp0" and "config wins" in topo.conflicts["n2"]
    topo.observe("p0", {"pp_group": "pp", "pp_stage": "0", "tp_group": "tpX"})
    topo.observe("p1", {"pp_group": "pp", "pp_stage": "1"})
    assert topo.pp_groups()["pp"].stages == ("tpX", "p1")
    # the rule engine sees every label the agent sent (peers_by splits groups by them), with the
    # group scopes' labels as the topology decided them: n2's claimed group loses to the config
    assert topo.node_labels("n2") == {"cluster": topo.cluster, "tp_group": "tp0"}
    v = topo.version
    topo.observe("n2", {"tp_group": "elsewhere", "role": "prefill"})  # no topology change, a new label
    assert topo.version > v
    assert topo.node_labels("n2") == {"cluster": topo.cluster, "tp_group": "tp0", "role": "prefill"}
    assert topo.node_labels("p1") == {"cluster": topo.cluster, "pp_group": "pp", "pp_stage": "1"}


def test_fabric_congestion_on_many_nodes_is_one_incident_that_inhibits_their_network_findings() -> None:
    c = _corr()
    for n in ("n0", "n1", "n3"):
        f = finding(n, "EW-4-x", "EW-4", Layer.NETWORK, 100.0, cluster="c", scope=Scope.CLUSTER)
        c.observe(f)
    local = finding("n1", "EW-6-x", "EW-6", Layer.NETWORK, 100.0, cluster="c", entity="mlx5_0/1")
    gpu = finding("n1", "GPU-2-x", "GPU-2", Layer.ENGINE, 100.0, cluster="c")
    c.observe(local), c.observe(gpu)
    incs = {i.pathology: i for i in c.correlate(101.0)}
    fabric = incs["EW-4"]
    assert fabric.culprit is None and fabric.victims == ["n0", "n1", "n3"] and len(fabric.findings) == 3
    assert fabric.cause.layer == "network" and "3 nodes at once" in fabric.cause.reason
    assert fabric.inhibited == [local.id]  # the node's own retransmits are explained by the fabric
    assert incs["GPU-2"].state == "open"  # an engine problem on the same node is not


def test_a_cluster_wide_gpu_incident_does_not_swallow_the_nodes_network_findings() -> None:
    # GPU-7 compares a node with the group (cluster scope) but says nothing about its network
    c = _corr()
    c.observe(finding("n1", "GPU-7-x", "GPU-7", Layer.GPU, 100.0, cluster="c", scope=Scope.CLUSTER))
    burst = finding("n1", "NS-1-x", "NS-1", Layer.NETWORK, 100.0, cluster="c", entity="eth0")
    c.observe(burst)
    incs = {i.pathology: i for i in c.correlate(101.0)}
    assert incs["GPU-7"].inhibited == []
    assert incs["NS-1"].state == "open" and incs["NS-1"].findings == [burst.id]


def test_victims_wait_while_a_culprit_rule_is_pending_in_their_group() -> None:
    c = _corr()
    v = finding("n0", "GPU-8-x", "GPU-8", Layer.ENGINE, 100.0, cluster="c")
    c.observe(v)
    (inc,) = c.correlate(101.0)
    assert not c.culprit_pending(inc)
    pending = _straggler()
    pending.state, pending.fired_at = State.PENDING, None
    c.observe(pending)
    c.correlate(102.0)
    assert c.culprit_pending(inc)  # the planner holds the victim's incident
    other = finding("x9", "GPU-8-x", "GPU-8", Layer.ENGINE, 100.0, cluster="c")  # not in tp0
    c.observe(other)
    assert not c.culprit_pending(next(i for i in c.correlate(103.0) if i.group.get("node") == "x9"))


def _kv(node: str, flow: str, t: float = 100.0):
    return finding(node, "EW-8-x", "EW-8", Layer.NETWORK, t, cluster="c", entity=flow, scope=Scope.FLOW)


def test_inhibit_rules_fold_a_lossy_ports_slow_kv_transfers_into_its_incident() -> None:
    c = _corr()
    storm = finding("n1", "EW-6-x", "EW-6", Layer.NETWORK, 100.0, cluster="c", entity="mlx5_0/1", scope=Scope.RDMA_PORT)
    slow = [_kv("n1", f"udp 10.0.0.1:{p}>10.0.0.2:4791") for p in (5001, 5002)]
    other = _kv("n3", "udp 10.0.0.3:5003>10.0.0.2:4791")  # another node: the rule's equal: [node] keeps it
    for f in (storm, *slow, other):
        c.observe(f)
    incs = {(i.pathology, i.group.get("node")): i for i in c.correlate(101.0)}
    assert set(incs) == {("EW-6", "n1"), ("EW-8", "n3")}
    held = incs[("EW-6", "n1")]
    assert held.inhibited == sorted(f.id for f in slow) and "2 findings inhibited: EW-8" in held.summary
    # the storm ends: the KV findings that are still firing open their own incident again
    done = finding("n1", "EW-6-x", "EW-6", Layer.NETWORK, 130.0, cluster="c", entity="mlx5_0/1",
                   scope=Scope.RDMA_PORT, state=State.RESOLVED)
    c.observe(done)
    changed = {(i.pathology, i.group.get("node")): i for i in c.correlate(131.0)}
    assert changed[("EW-6", "n1")].state == "resolved" and changed[("EW-8", "n1")].state == "open"


def test_a_port_that_drops_holds_its_backlog_and_the_resends_it_causes_in_one_incident() -> None:
    """Default NS-7 -> NS-4, NS-5 (same node): the tiny queue that tail-drops is full, and drops
    the node's ACKs too, so its peers resend to it. One incident on the dropping node; the same
    symptoms on another node open their own."""
    c = _corr()
    drops = finding("n2", "NS-7-egress-drops", "NS-7", Layer.NETWORK, 100.0, cluster="c", entity="eth1",
                    scope=Scope.NIC_PORT)
    backlog = finding("n2", "NS-5-egress-backlog", "NS-5", Layer.NETWORK, 110.0, cluster="c", entity="eth1",
                      scope=Scope.NIC_PORT)
    resends = finding("n2", "NS-4-ingress-retransmits", "NS-4", Layer.NETWORK, 125.0, cluster="c",
                      entity="tcp 10.0.0.1:5000>10.0.0.3:4000", scope=Scope.FLOW)
    elsewhere = finding("n1", "NS-5-egress-backlog", "NS-5", Layer.NETWORK, 120.0, cluster="c", entity="eth1",
                        scope=Scope.NIC_PORT)
    for f in (drops, backlog, resends, elsewhere):
        c.observe(f)
    incs = {(i.pathology, i.group.get("node")): i for i in c.correlate(126.0)}
    assert set(incs) == {("NS-7", "n2"), ("NS-5", "n1")}
    assert incs[("NS-7", "n2")].inhibited == sorted([backlog.id, resends.id])


def _resolved(f, t: float):
    """``f``'s resolution as the agent sends it: the same occurrence, fired_at kept, resolved at ``t``."""
    return dataclasses.replace(f, state=State.RESOLVED, evaluated_at=t, resolved_at=t)


def test_a_symptom_that_began_under_its_cause_stays_with_it_after_the_cause_resolves() -> None:
    # default PCIE-5 -> GPU-2 (same node): a downtrained link slows the engine; its queue over a full
    # cache goes on draining after the link recovers (pcie5-link-saturation seed 110 in the fault lab:
    # GPU-2 went pending 20 s before the fault ended and fired 5 s after PCIE-5 resolved)
    c = _corr()
    link = finding("n1", "PCIE-5-x", "PCIE-5", Layer.PCIE, 165.0, cluster="c", entity="gpu4", scope=Scope.GPU)
    link.active_at = 135.0
    c.observe(link)
    (cause,) = c.correlate(166.0)
    full = finding("n1", "GPU-2-x", "GPU-2", Layer.ENGINE, 260.0, cluster="c", entity="engine0", scope=Scope.ENGINE,
                   state=State.PENDING)
    c.observe(full)
    c.observe(_resolved(link, 285.0))
    assert c.correlate(286.0) == []  # still open: the pending symptom began under it
    fired = dataclasses.replace(full, state=State.FIRING, evaluated_at=290.0, fired_at=290.0)
    c.observe(fired)
    (held,) = [i for i in c.correlate(291.0) if i.state == "open"]
    assert held.id == cause.id and held.pathology == "PCIE-5" and held.inhibited == [fired.id]
    assert not [i for i in c.open_incidents() if i.pathology == "GPU-2"]
    # the symptom's occurrence ends: so does the cause's incident
    c.observe(_resolved(fired, 340.0))
    (done,) = c.correlate(341.0)
    assert done.id == cause.id and done.state == "resolved"
    # a pending symptom holds the cause only for effect_window (30 s here): a pending alert that
    # turns false is dropped by its agent without a transition
    c2 = _corr()
    c2.observe(link)
    c2.correlate(166.0)
    c2.observe(full)
    c2.observe(_resolved(link, 285.0))
    assert c2.correlate(300.0) == []
    (closed,) = c2.correlate(320.0)
    assert closed.id == cause.id and closed.state == "resolved"
    # a new occurrence that begins after the cause resolved is demand outgrowing the cache: its own incident
    again = finding("n1", "GPU-2-x", "GPU-2", Layer.ENGINE, 400.0, cluster="c", entity="engine0", scope=Scope.ENGINE)
    c.observe(again)
    (own,) = c.correlate(401.0)
    assert own.pathology == "GPU-2" and own.state == "open" and own.findings == [again.id]


def test_a_symptom_that_began_after_its_cause_resolved_opens_its_own_incident() -> None:
    c = _corr()
    link = finding("n1", "PCIE-5-x", "PCIE-5", Layer.PCIE, 165.0, cluster="c", entity="gpu4", scope=Scope.GPU)
    c.observe(link)
    c.correlate(166.0)
    c.observe(_resolved(link, 200.0))
    c.correlate(201.0)
    late = finding("n1", "GPU-2-x", "GPU-2", Layer.ENGINE, 260.0, cluster="c", entity="engine0", scope=Scope.ENGINE)
    c.observe(late)
    (own,) = c.correlate(261.0)
    assert own.pathology == "GPU-2" and own.findings == [late.id]
    # on another node the cause explains nothing, even while it held
    c2 = _corr()
    c2.observe(link)
    other = finding("n3", "GPU-2-x", "GPU-2", Layer.ENGINE, 170.0, cluster="c", entity="engine0", scope=Scope.ENGINE)
    c2.observe(other)
    c2.observe(_resolved(link, 200.0))
    (own2,) = [i for i in c2.correlate(201.0) if i.state == "open"]
    assert own2.pathology == "GPU-2" and own2.group == {"node": "n3"}


def test_a_symptom_that_fired_first_is_marked_inhibited_by_the_cause_that_follows() -> None:
    c = _corr()
    erosion = finding("n0", "GPU-8-x", "GPU-8", Layer.ENGINE, 100.0, cluster="c", entity="engine0", scope=Scope.ENGINE)
    c.observe(erosion)
    (own,) = c.correlate(101.0)
    assert own.pathology == "GPU-8" and own.state == "open"
    stall = finding("n0", "GPU-3-x", "GPU-3", Layer.ENGINE, 110.0, cluster="c", entity="engine0", scope=Scope.ENGINE)
    c.observe(stall)
    changed = {i.pathology: i for i in c.correlate(111.0)}
    assert changed["GPU-8"].state == "inhibited" and changed["GPU-8"].inhibited_by == changed["GPU-3"].id
    assert changed["GPU-3"].inhibited == [erosion.id]


def test_a_deadlocked_engine_explains_its_full_cache_but_not_another_engines() -> None:
    # default GPU-3 -> GPU-2 (same engine): a scheduler deadlock holds the KV blocks while requests queue
    c = _corr()
    full = finding("n0", "GPU-2-x", "GPU-2", Layer.ENGINE, 100.0, cluster="c", entity="engine0", scope=Scope.ENGINE)
    other = finding("n0", "GPU-2-x", "GPU-2", Layer.ENGINE, 100.0, cluster="c", entity="engine1", scope=Scope.ENGINE)
    stall = finding("n0", "GPU-3-x", "GPU-3", Layer.ENGINE, 102.0, cluster="c", entity="engine0", scope=Scope.ENGINE)
    for f in (full, other, stall):
        c.observe(f)
    incs = {(i.pathology, i.group.get("entity", "")): i for i in c.correlate(103.0) if i.state == "open"}
    gpu3 = [i for i in incs.values() if i.pathology == "GPU-3"]
    assert len(gpu3) == 1 and gpu3[0].inhibited == [full.id]
    assert [i.findings for i in incs.values() if i.pathology == "GPU-2"] == [[other.id]]


def test_a_slow_pipeline_stage_explains_its_engines_throughput_erosion() -> None:
    # EW-2 names both stages of a hand-off; the engine's node is one of them and its eroded
    # token rate (GPU-8) is the bubble's effect, not an incident of its own
    # (pipeline stages on nodes of their own, no TP group: as in the fault lab's pp shape)
    c = _corr(cfg=_cfg(topology={}))
    erosion = finding("s0", "GPU-8-x", "GPU-8", Layer.ENGINE, 100.0, cluster="c", entity="engine0", scope=Scope.ENGINE)
    bubble = finding("s0", "EW-2-x", "EW-2", Layer.NETWORK, 105.0, cluster="c", scope=Scope.CLUSTER)
    elsewhere = finding("s3", "GPU-8-x", "GPU-8", Layer.ENGINE, 105.0, cluster="c", entity="engine0",
                        scope=Scope.ENGINE)
    for f in (erosion, bubble, elsewhere):
        c.observe(f)
    incs = {(i.pathology, i.group.get("node")): i for i in c.correlate(106.0)}
    ew2 = next(i for (p, _), i in incs.items() if p == "EW-2")
    assert ew2.inhibited == [erosion.id]
    assert incs[("GPU-8", "s3")].state == "open"  # a node the bubble does not name keeps its own incident


def test_a_host_side_launch_stall_explains_the_thin_gpu_feeds_on_its_node() -> None:
    c = _corr()
    thin = [finding("n0", "PCIE-1-x", "PCIE-1", Layer.PCIE, 100.0, cluster="c", entity=f"gpu{g}", scope=Scope.GPU)
            for g in (0, 3)]
    stall = finding("n0", "PCIE-3-x", "PCIE-3", Layer.PCIE, 104.0, cluster="c", entity="gpu0", scope=Scope.GPU)
    other = finding("n1", "PCIE-1-x", "PCIE-1", Layer.PCIE, 104.0, cluster="c", entity="gpu0", scope=Scope.GPU)
    for f in (*thin, stall, other):
        c.observe(f)
    incs = {(i.pathology, i.group.get("node")): i for i in c.correlate(105.0)}
    assert incs[("PCIE-3", "n0")].inhibited == sorted(f.id for f in thin)  # any GPU of the node, not only gpu0
    assert incs[("PCIE-1", "n1")].state == "open"


def test_a_preemption_storm_explains_kv_saturation_and_a_thin_feed_and_early_stops_a_length_tail() -> None:
    # the default inhibits added with the fault lab: GPU-4 -> GPU-2 (same engine), GPU-4 -> PCIE-4
    # (same node: the storm names the engine, the thin feed a GPU), PCIE-10 -> NS-8 (same node)
    c = _corr()
    kv = finding("n0", "GPU-2-x", "GPU-2", Layer.ENGINE, 100.0, cluster="c", entity="engine0", scope=Scope.ENGINE)
    kv_other = finding("n0", "GPU-2-x", "GPU-2", Layer.ENGINE, 100.0, cluster="c", entity="engine1",
                       scope=Scope.ENGINE)
    thin = finding("n0", "PCIE-4-x", "PCIE-4", Layer.PCIE, 101.0, cluster="c", entity="gpu3", scope=Scope.GPU)
    storm = finding("n0", "GPU-4-x", "GPU-4", Layer.ENGINE, 104.0, cluster="c", entity="engine0", scope=Scope.ENGINE)
    tail = finding("n1", "NS-8-x", "NS-8", Layer.ENGINE, 100.0, cluster="c", entity="vllm0", scope=Scope.ENGINE)
    early = finding("n1", "PCIE-10-x", "PCIE-10", Layer.PCIE, 104.0, cluster="c", entity="vllm0", scope=Scope.ENGINE)
    for f in (kv, kv_other, thin, storm, tail, early):
        c.observe(f)
    incs = {(i.pathology, i.group.get("node")): i for i in c.correlate(105.0) if i.state == "open"}
    assert incs[("GPU-4", "n0")].inhibited == sorted([kv.id, thin.id])
    assert incs[("GPU-2", "n0")].findings == [kv_other.id]  # another engine's full cache is its own incident
    assert incs[("PCIE-10", "n1")].inhibited == [tail.id]
    assert ("NS-8", "n1") not in incs


# default GPU-2 -> PCIE-4 (node): a full cache whose queue grows admits only what frees up, so its
# GPU's H2D feed reads thin against its node peers (gpu4-preemption-storm-l40s seed 1, a storm that
# stayed under GPU-4's bar). Default GPU-7 -> GPU-4 (node): a replica bound by memory (GPU-7-memory-
# bound, a controller finding naming the node) thrashes - its few long sequences outgrow the cache and
# are evicted and recomputed - so the storm on that node is the imbalance's symptom (gpu7 memory-bound
# seeds 113-115: 8 wrong GPU-4 incidents while the rule was the other way round). Either symptom on
# another node is its own incident.
@pytest.mark.parametrize("cause, symptom", [
    (("GPU-2", Layer.ENGINE, "vllm3", Scope.ENGINE), ("PCIE-4", Layer.PCIE, "gpu3", Scope.GPU)),
    (("GPU-7", Layer.GPU, "", Scope.CLUSTER), ("GPU-4", Layer.ENGINE, "engine0", Scope.ENGINE)),
    # GPU-4 -> GPU-8 (same engine): a storm's steps recompute what it evicted, so each running
    # request's token rate falls while the batch holds (gpu7 memory-bound seed 107)
    (("GPU-4", Layer.ENGINE, "engine0", Scope.ENGINE), ("GPU-8", Layer.ENGINE, "engine0", Scope.ENGINE)),
    # NS-8 -> GPU-2 (node): generation lengths that spread leave a long tail holding its KV blocks,
    # which fills the node's cache while its queue grows (ns8 seeds 107 and 109)
    (("NS-8", Layer.ENGINE, "engine0", Scope.ENGINE), ("GPU-2", Layer.ENGINE, "engine0", Scope.ENGINE)),
    # NS-8 -> NS-1 (node): a batch client with early stops sends its batch at once, so the port's bytes
    # burst and the engine's queue jumps - NS-1's red flag from NS-8's client (ns8 batch_early_stop seed
    # 116: two NS-1 incidents on the NS-8 node)
    (("NS-8", Layer.ENGINE, "engine0", Scope.ENGINE), ("NS-1", Layer.NETWORK, "eth0", Scope.NIC_PORT)),
])
def test_an_engine_cause_takes_its_nodes_symptom_not_another_nodes(cause, symptom) -> None:
    c = _corr()
    src = finding("n0", f"{cause[0]}-x", cause[0], cause[1], 100.0, cluster="c", entity=cause[2], scope=cause[3])
    here, there = (finding(n, f"{symptom[0]}-x", symptom[0], symptom[1], 101.0, cluster="c", entity=symptom[2],
                           scope=symptom[3]) for n in ("n0", "n1"))
    for f in (src, here, there):
        c.observe(f)
    incs = [i for i in c.correlate(102.0) if i.state == "open"]
    assert [i.inhibited for i in incs if i.pathology == cause[0]] == [[here.id]]
    assert [i.findings for i in incs if i.pathology == symptom[0]] == [[there.id]]


def test_a_lossy_or_congested_port_explains_the_straggler_and_missing_steps_it_names() -> None:
    # default EW-4/EW-6/PCIE-9 -> EW-1/EW-9 on the node: the controller's cross-node findings are
    # targets too, matched by the node they name
    c = _corr()
    loss = finding("n2", "EW-6-x", "EW-6", Layer.NETWORK, 100.0, cluster="c", entity="mlx5_0/1")
    for f in (_straggler(101.0), loss):
        c.observe(f)
    incs = {i.pathology: i for i in c.correlate(102.0) if i.state == "open"}
    assert set(incs) == {"EW-6"} and incs["EW-6"].inhibited == [_straggler(101.0).id]
    # fabric congestion on n0, n1, n3 takes the missing steps EW-9 names on n3, not a straggler on n2
    c = _corr()
    for n in ("n0", "n1", "n3"):
        c.observe(finding(n, "EW-4-x", "EW-4", Layer.NETWORK, 100.0, cluster="c", scope=Scope.CLUSTER))
    gone = _straggler(101.0, node="n3", rule="EW-9-x", pathology="EW-9")
    c.observe(gone)
    incs = {i.pathology: i for i in c.correlate(102.0) if i.state == "open"}
    assert set(incs) == {"EW-4"} and incs["EW-4"].inhibited == [gone.id]
    c.observe(_straggler(103.0))
    incs = {i.pathology: i for i in c.correlate(104.0) if i.state == "open"}
    assert incs["EW-1"].culprit.node == "n2"


def test_inhibit_rules_respect_entity_equality_never_inhibit_and_chains() -> None:
    c = _corr()
    # GPU-6 on gpu3 hides PCIE-1 on gpu3 (not on gpu5); PCIE-1 on gpu3 in turn would hide PCIE-4 on gpu3
    xid = finding("n0", "GPU-6-x", "GPU-6", Layer.GPU, 100.0, cluster="c", entity="gpu3", scope=Scope.GPU)
    link3 = finding("n0", "PCIE-1-x", "PCIE-1", Layer.PCIE, 100.0, cluster="c", entity="gpu3", scope=Scope.GPU)
    link5 = finding("n0", "PCIE-1-x", "PCIE-1", Layer.PCIE, 100.0, cluster="c", entity="gpu5", scope=Scope.GPU)
    skew3 = finding("n0", "PCIE-4-x", "PCIE-4", Layer.PCIE, 100.0, cluster="c", entity="gpu3", scope=Scope.GPU)
    for f in (xid, link3, link5, skew3):
        c.observe(f)
    incs = {(i.pathology, i.group.get("node")): i for i in c.correlate(101.0)}
    assert set(incs) == {("GPU-6", "n0"), ("PCIE-1", "n0")}
    assert incs[("GPU-6", "n0")].inhibited == sorted([link3.id, skew3.id])  # the chain ends at the root
    assert incs[("PCIE-1", "n0")].findings == [link5.id]
    # a configuration without the rules: every finding stands alone
    bare = _corr(cfg=_cfg(correlation={"inhibit_rules": []}))
    for f in (xid, link3, link5, skew3):
        bare.observe(f)
    assert sorted(i.pathology for i in bare.correlate(101.0)) == ["GPU-6", "PCIE-1", "PCIE-4"]


@pytest.mark.parametrize("rules,message", [
    ("nope", "correlation.inhibit_rules must be a list"),
    ([{"source": ["EW-4"], "target": ["EW-8"], "equl": ["node"]}], "unknown key correlation.inhibit_rules[0].equl; did you mean equal?"),
    ([{"source": ["EW-4"], "target": ["EW-88"]}], "correlation.inhibit_rules[0].target: unknown pathology ID 'EW-88'; did you mean EW-8?"),
    ([{"source": ["EW-4"], "target": ["EW-8"], "equal": ["host"]}], "unknown label 'host'"),
    ([{"source": ["EW-4"], "target": []}], "correlation.inhibit_rules[0].target must be a non-empty list"),
    ([{"source": ["EW-4"], "target": ["EW-4"]}], "EW-4 is both source and target"),
    ([{"source": ["GPU-3"], "target": ["GPU-8"]}, {"source": ["GPU-8"], "target": ["GPU-3"]}],
     "GPU-3 -> GPU-8 -> GPU-3 inhibit each other in a cycle"),
])
def test_bad_inhibit_rules_are_refused_with_the_field_and_what_to_do(rules, message, tmp_path) -> None:
    from skewd.controller.config import ConfigError

    f = tmp_path / "controller.yaml"
    import yaml

    f.write_text(yaml.safe_dump({"correlation": {"inhibit_rules": rules}}))
    with pytest.raises(ConfigError) as e:
        load_config(f, env={})
    text = str(e.value)
    assert message in text and str(f) in text, text


@pytest.mark.parametrize("own_first", [True, False])
def test_a_culprit_incident_has_the_same_id_whichever_its_evidence_or_claim_arrived_first(own_first) -> None:
    # the culprit's own node finding (earlier onset) rides JetStream; the claim is the controller's.
    # Live, either may reach the correlator first; a replay hands both over at once. The incident
    # they make must be the same one (id and opening time), or a replay cannot match the live run.
    def run(together: bool):
        c = _corr()
        own = finding("n2", "GPU-5-x", "GPU-5", Layer.GPU, 98.0, cluster="c")
        claim = _straggler(100.0)
        if together:
            c.observe(own), c.observe(claim)
            (inc,) = c.correlate(101.0)
            return inc
        c.observe(own if own_first else claim)
        c.correlate(100.5)
        c.observe(claim if own_first else own)
        return next(i for i in c.correlate(101.0) if i.culprit and i.culprit.node == "n2")

    live, replayed = run(False), run(True)
    assert live.id == replayed.id and live.opened_at == replayed.opened_at == 100.0
    assert sorted(live.findings) == sorted(replayed.findings)


def test_a_claim_that_resolved_and_fires_again_opens_a_new_culprit_incident() -> None:
    # docs/controller.md, Stale nodes: a culprit incident's id is its claim's, so the claim's next
    # occurrence is a new incident even while the culprit's own finding fired throughout
    c = _corr()
    own = finding("n2", "GPU-5-x", "GPU-5", Layer.GPU, 98.0, cluster="c")
    c.observe(own), c.observe(_straggler(100.0))
    (first,) = c.correlate(101.0)
    gone = _straggler(100.0)
    gone.state, gone.resolved_at, gone.evaluated_at = State.RESOLVED, 110.0, 110.0
    c.observe(gone)
    changed = {i.id: i for i in c.correlate(110.0)}
    assert changed[first.id].state == "resolved"
    c.observe(_straggler(120.0))
    again = next(i for i in c.correlate(121.0) if i.culprit and i.culprit.node == "n2" and i.state == "open"
                 and i.group.get("tp_group"))
    assert again.id != first.id and again.opened_at == 120.0 and own.id in again.findings
