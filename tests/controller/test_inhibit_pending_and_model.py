"""Two ways a symptom reaches the cause that explains it (controller/correlator.py):

- a held incident stays held while a finding that would take it over is *pending* - a symptom
  that fires more than ``group_wait`` before its cause (a batch client's NS-1 on its first batch,
  NS-8's latency tail after its own ``for``) is taken over when the cause fires, never shown on its
  own; a pending copy the agent silently dropped holds it ``group_wait`` + ``effect_window`` at most;
- an inhibit rule may join findings by the ``model`` their nodes serve: a load balancer that starves
  one node (NS-2) sends that node's share to the peers serving the same model, whose cache may then
  fill (GPU-2 on another node) - the starvation's incident holds it; a node of another model is not
  joined.

The controller service itself, with in-memory KV and JetStream, as the fault lab runs it."""
from __future__ import annotations

from skewd.controller.config import load_config
from skewd.controller.service import Controller
from skewd.lab.harness import CaptureJetStream
from skewd.model import Finding, Layer, Scope, State

from .helpers import RULES
from .sim import finding
from .test_incident_hold import WAIT, _KV, _resolved, _run, _shown

EFFECT = 30.0  # correlation.effect_window's default


def _controller(tp_groups: dict | None = None, models: dict | None = None) -> Controller:
    cfg = load_config(None, env={}, overrides={
        "cluster": "c", "rules": [RULES], "correlation": {"group_wait": f"{WAIT:g}s"},
        "topology": {"tp_groups": tp_groups or {"tp0": {"nodes": ["n0", "n1", "n2", "n3"], "model": "m1"}},
                     "models": models or {"m1": {"max_num_seqs": 200}}}})
    ctl = Controller(cfg)
    ctl.state = _KV("c")
    ctl.js = CaptureJetStream()
    return ctl


def _burst(t: float) -> Finding:
    return finding("n0", "NS-1-x", "NS-1", Layer.NETWORK, t, cluster="c", entity="eth0", scope=Scope.NIC_PORT)


def _tail(t: float, state: State = State.FIRING) -> Finding:
    return finding("n0", "NS-8-x", "NS-8", Layer.ENGINE, t, cluster="c", entity="engine0", scope=Scope.ENGINE,
                   state=state)


def test_a_symptom_stays_held_while_its_cause_is_pending_and_joins_it_when_it_fires() -> None:
    ctl = _controller()
    # NS-1 fires at 100; NS-8 (the batch client's spread lengths, its cause) goes pending at 106,
    # before NS-1's hold ends at 108, and fires at 125 - long after group_wait
    _run(ctl, 100.0, 150.0, {100.0: [_burst(100.0)], 106.0: [_tail(106.0, State.PENDING)], 125.0: [_tail(125.0)]})
    shown = _shown(ctl)
    assert [i.pathology for i in shown] == ["NS-8"], [(i.pathology, i.state, i.updated_at) for i in shown]
    assert shown[0].inhibited == [_burst(100.0).id]
    assert ctl.stats.incidents_withheld == 1


def test_a_symptom_whose_pending_cause_lets_go_is_shown_then() -> None:
    ctl = _controller()
    # the cause turns false while pending (the agent says so): the symptom is shown at once
    pend = _tail(106.0, State.PENDING)
    _run(ctl, 100.0, 130.0, {100.0: [_burst(100.0)], 106.0: [pend], 112.0: [_resolved(pend, 112.0)]})
    (inc,) = _shown(ctl)
    assert inc.pathology == "NS-1" and inc.updated_at == 112.0


def test_a_stale_pending_cause_holds_its_symptom_no_longer_than_group_wait_plus_effect_window() -> None:
    ctl = _controller()
    # the agent dropped the pending NS-8 without a transition: the controller's copy stays pending
    pend = _tail(101.0, State.PENDING)  # pending since 100
    _run(ctl, 100.0, 160.0, {100.0: [_burst(100.0)], 101.0: [pend]})
    (inc,) = _shown(ctl)
    assert inc.pathology == "NS-1" and inc.updated_at == pend.active_at + WAIT + EFFECT + 1.0


def test_an_unrelated_pending_finding_holds_nothing() -> None:
    ctl = _controller()
    # GPU-3 is no inhibit source of NS-1 on another node
    other = finding("n1", "GPU-3-x", "GPU-3", Layer.ENGINE, 101.0, cluster="c", entity="engine0",
                    scope=Scope.ENGINE, state=State.PENDING)
    _run(ctl, 100.0, 120.0, {100.0: [_burst(100.0)], 101.0: [other]})
    (inc,) = _shown(ctl)
    assert inc.pathology == "NS-1" and inc.updated_at == 100.0 + WAIT


def _starved(node: str, t: float) -> Finding:
    return finding(node, "NS-2-x", "NS-2", Layer.NETWORK, t, cluster="c", entity="", scope=Scope.NODE)


def _saturated(node: str, t: float) -> Finding:
    return finding(node, "GPU-2-x", "GPU-2", Layer.ENGINE, t, cluster="c", entity="engine0", scope=Scope.ENGINE)


def test_a_peer_saturating_while_the_balancer_starves_another_node_of_its_model_joins_the_starvation() -> None:
    groups = {"r0": {"nodes": ["n0"], "model": "m1"}, "r1": {"nodes": ["n1"], "model": "m1"},
              "r2": {"nodes": ["n2"], "model": "m2"}}
    models = {"m1": {"max_num_seqs": 200}, "m2": {"max_num_seqs": 200}}
    ctl = _controller(groups, models)
    # NS-2 on n0 (m1); GPU-2 on n1 (m1, takes n0's share) and on n2 (m2, another balancer's pool)
    _run(ctl, 100.0, 140.0, {100.0: [_starved("n0", 100.0)], 110.0: [_saturated("n1", 110.0), _saturated("n2", 110.0)]})
    shown = {(i.pathology, i.group.get("node")): i for i in _shown(ctl)}
    assert set(shown) == {("NS-2", "n0"), ("GPU-2", "n2")}, list(shown)
    assert shown[("NS-2", "n0")].inhibited == [_saturated("n1", 110.0).id]
    # the starvation ends first: the saturation that began under it stays with it until it ends
    _run(ctl, 141.0, 200.0, {150.0: [_resolved(_starved("n0", 100.0), 150.0)]})
    assert not any(i.pathology == "GPU-2" and i.group.get("node") == "n1" for i in _shown(ctl))
