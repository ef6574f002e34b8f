"""What the correlator may do with a finding: maturity tags, the culprit-evidence contract and
direct evidence against inference (issue 19: on real traffic a sandbox EW-3 and an incubating EW-9
named healthy nodes, and a true NS-7 drop incident was inhibited under a false EW-9 culprit).
No NATS here; tests/controller/test_controller_nats.py runs one case through the service."""
from __future__ import annotations

import pytest

from skewd.catalogue import full_catalogue
from skewd.controller import culprit
from skewd.controller.config import ConfigError, load_config
from skewd.controller.correlator import Correlator
from skewd.controller.planner import Planner
from skewd.controller.timeline import Timelines
from skewd.controller.topology import Topology
from skewd.model import Layer, Scope
from skewd.rules.cli import PACKS
from skewd.rules.loader import load_rules

from .sim import finding

NODES = ("n0", "n1", "n2", "n3")
# invented test values: a claim's own measurement against its bar (8 ms lag over a 2 ms bar, 300 steps)
CLEAR = {"culprit_measure": 0.008, "culprit_bar": 0.002, "culprit_steps": 300.0, "culprit_min_steps": 20.0}


def _cfg(**corr):
    return load_config(None, env={}, overrides={
        "cluster": "c", "correlation": corr,
        "topology": {"tp_groups": {"tp0": {"nodes": list(NODES), "model": "m1"}}, "models": {"m1": {"max_num_seqs": 64}}}})


def _corr(cfg=None, maturities=None) -> Correlator:
    cfg = cfg or _cfg()
    return Correlator("c", Topology.from_config(cfg), Timelines(), culprit_pathologies=cfg.culprit_pathologies,
                      never_inhibit=cfg.never_inhibit, effect_window=30.0, inhibit_rules=cfg.inhibit_rules,
                      direct_evidence=cfg.direct_evidence, culprit_evidence=cfg.culprit_evidence,
                      maturities=maturities, loss_paths=cfg.loss_paths)


def _claim(node: str, pathology: str = "EW-1", rule: str = "EW-1-x", maturity: str = "stable", evidence=None,
           t: float = 100.0, **kw):
    f = finding(node, rule, pathology, Layer.NETWORK, t, cluster="c", scope=Scope.TP_GROUP, maturity=maturity,
                evidence=CLEAR if evidence is None else evidence, **kw)
    f.labels = {"tp_group": "tp0"}
    return f


def _open(c: Correlator, t: float = 101.0):
    c.correlate(t)
    return [i for i in c.incidents.values() if i.state == "open"]


# -- maturity ---------------------------------------------------------------------------------

def test_sandbox_findings_stay_findings_no_incident_no_culprit_no_inhibition() -> None:
    c = _corr()
    # a sandbox byte-skew rule firing on every node (the real lab's EW-3) and a sandbox node rule
    skew = [_claim(n, "EW-3", "EW-3-sb", maturity="sandbox") for n in NODES]
    churn = finding("n2", "PCIE-9-sb", "PCIE-9", Layer.PCIE, 100.0, cluster="c", entity="mlx5_0", maturity="sandbox")
    victim = finding("n0", "GPU-8-x", "GPU-8", Layer.ENGINE, 100.0, cluster="c", entity="engine0")
    straggle = _claim("n2", evidence=CLEAR, t=100.0)  # a stable straggler on the node PCIE-9 fires on
    for f in (*skew, churn, victim, straggle):
        c.observe(f)
    incs = _open(c)
    assert {i.pathology for i in incs} == {"EW-1"}  # nothing of the sandbox rules' own
    (ew1,) = incs
    assert ew1.culprit.node == "n2" and victim.id in ew1.inhibited  # PCIE-9 (sandbox) hid nothing
    assert not {f.id for f in (*skew, churn)} & {*ew1.findings, *ew1.inhibited}
    rep = c.report()
    assert rep["sandbox_findings_total"] == 5 and {d["rule"] for d in rep["sandbox_findings"]} == {"EW-3-sb", "PCIE-9-sb"}


def test_an_incubating_claim_alone_names_nobody_until_its_node_corroborates_it() -> None:
    c = _corr()
    claim = _claim("n1", "EW-9", "EW-9-missing", maturity="incubating",
                   evidence={"culprit_measure": 0.7, "culprit_bar": 0.5})
    # every peer waits for the group: the same symptom on all of them is no evidence against n1
    waiting = [finding(n, "GPU-8-x", "GPU-8", Layer.ENGINE, 100.0, cluster="c", entity="engine0") for n in NODES]
    for f in (claim, *waiting):
        c.observe(f)
    incs = _open(c)
    assert all(i.culprit is None or i.pathology == "GPU-8" for i in incs)
    assert not [i for i in incs if i.pathology == "EW-9"]
    (ref,) = c.report()["culprit_claims_refused"]
    assert ref["node"] == "n1" and "incubating and nothing else points at n1" in ref["reason"]
    assert c.refusals_total == 1
    # a finding on n1 that its peers do not share corroborates the claim: now n1 is named
    c.observe(finding("n1", "PCIE-1-x", "PCIE-1", Layer.PCIE, 102.0, cluster="c", entity="gpu0"))
    incs = _open(c, 103.0)
    (ew9,) = [i for i in incs if i.pathology == "EW-9"]
    assert ew9.culprit.node == "n1" and ew9.cause.layer == "pcie"
    assert ew9.cause.evidence["culprit_measure"] == 0.7
    assert c.report()["culprit_claims_refused"] == [] and c.refusals_total == 1  # counted once


def test_two_rules_naming_the_same_node_corroborate_each_other() -> None:
    c = _corr()
    steps = _claim("n1", "EW-9", "EW-9-missing", maturity="incubating",
                   evidence={"culprit_measure": 0.7, "culprit_bar": 0.5})
    bytes_ = _claim("n1", "EW-9", "EW-9-bytes", maturity="incubating",
                    evidence={"culprit_measure": 0.35, "culprit_bar": 0.2})
    c.observe(steps)
    assert not _open(c)
    c.observe(bytes_)
    (inc,) = _open(c, 102.0)
    assert inc.culprit.node == "n1" and set(inc.findings) == {steps.id, bytes_.id}


def test_a_finding_without_a_maturity_takes_its_rules_tag_here_and_incubating_otherwise() -> None:
    old = _claim("n2", maturity="")  # from an agent older than the field
    assert _corr(maturities={"EW-1-x": "stable"}).maturity(old) == "stable"
    assert _corr(maturities={"EW-1-x": "sandbox"}).maturity(old) == "sandbox"
    assert _corr().maturity(old) == "incubating"
    c = _corr()
    c.observe(old)
    assert not _open(c)  # incubating, nothing corroborates it


def test_an_incubating_node_incident_is_shown_but_planned_only_when_a_second_rule_agrees() -> None:
    cfg = _cfg()
    c = _corr(cfg)
    kv = finding("n1", "GPU-2-inc", "GPU-2", Layer.ENGINE, 100.0, cluster="c", entity="engine0", maturity="incubating")
    c.observe(kv)
    (inc,) = _open(c)
    assert inc.culprit.node == "n1" and not c.plannable(inc) and "no remap: GPU-2-inc is incubating" in inc.summary
    assert Planner(cfg).plan(inc, 200.0) is not None  # the planner has actions; the gate is the correlator's
    # a preemption storm on the same engine (stable, GPU-4 -> GPU-2) takes it over: that one is planned
    storm = finding("n1", "GPU-4-x", "GPU-4", Layer.ENGINE, 101.0, cluster="c", entity="engine0")
    c.observe(storm)
    (inc2,) = _open(c, 102.0)
    assert inc2.pathology == "GPU-4" and c.plannable(inc2) and inc2.inhibited == [kv.id]
    # two incubating rules of one pathology on one node corroborate each other
    c3 = _corr(cfg)
    c3.observe(finding("n3", "NS-1-a", "NS-1", Layer.NETWORK, 100.0, cluster="c", entity="eth0", maturity="incubating"))
    c3.observe(finding("n3", "NS-1-b", "NS-1", Layer.NETWORK, 100.0, cluster="c", entity="eth0", maturity="incubating"))
    (inc3,) = _open(c3)
    assert c3.plannable(inc3)


# -- the culprit-evidence contract --------------------------------------------------------------

@pytest.mark.parametrize("evidence,why", [
    ({"v": 1.0}, "gives no culprit measurement"),
    ({"culprit_measure": 0.0002, "culprit_bar": 0.002}, "does not clear the rule's bar"),
    ({**CLEAR, "culprit_steps": 5.0}, "too few steps"),
    ({**CLEAR, "culprit_peer_max": 0.004}, "a peer is over the bar too"),
])
def test_a_stable_claim_whose_own_evidence_does_not_single_out_its_node_names_nobody(evidence, why) -> None:
    c = _corr()
    claim = _claim("n1", evidence=evidence)
    victim = finding("n0", "GPU-8-x", "GPU-8", Layer.ENGINE, 100.0, cluster="c", entity="engine0")
    c.observe(claim), c.observe(victim)
    incs = _open(c)
    assert [i.pathology for i in incs] == ["GPU-8"]  # the peer is no victim of a claim that names nobody
    (ref,) = c.report()["culprit_claims_refused"]
    assert why in ref["reason"] and ref["finding"] == claim.id


def test_the_same_rule_on_two_nodes_of_a_group_singles_out_neither() -> None:
    c = _corr()
    a, b = _claim("n1"), _claim("n3")
    c.observe(a), c.observe(b)
    assert not _open(c)
    reasons = {r["node"]: r["reason"] for r in c.report()["culprit_claims_refused"]}
    assert set(reasons) == {"n1", "n3"} and "holds for n1, n3 at once" in reasons["n1"]


def test_the_incident_quotes_the_claims_own_measurement_never_the_aligners_lag() -> None:
    from skewd.controller.align import GroupReport

    cfg = _cfg()
    c = _corr(cfg)
    # the aligner saw n1 last in 2 % of 505 steps (what a real-lab EW-9 incident once quoted)
    rep = GroupReport.__new__(GroupReport)
    rep.__dict__.update({"lag_median_s": {"n1": 0.0002}, "last_share": {"n1": 0.02}, "steps": 505,
                         "spread_median_s": 0.0002})
    c.reports = {"tp0": rep}
    miss = finding("n1", "EW-9-missing-steps", "EW-9", Layer.NETWORK, 100.0, cluster="c", scope=Scope.TP_GROUP,
                   evidence={"avg(ctl_step_missing_ratio, window)": 0.72,
                             "avg(summary_rdma_xmit_bytes_per_second, window)": 1e8})
    miss.labels, miss.params = {"tp_group": "tp0"}, {"window": "30s", "missing": 0.5, "quiet": 0.2}
    c.observe(miss)
    c.observe(finding("n1", "PCIE-1-x", "PCIE-1", Layer.PCIE, 100.0, cluster="c", entity="gpu1"))
    (inc,) = [i for i in _open(c) if i.pathology == "EW-9"]
    assert inc.culprit.node == "n1"
    assert "EW-9-missing-steps: avg(ctl_step_missing_ratio, window) 0.72 > missing 0.5" in inc.summary
    assert "last in" not in inc.summary and "% of 505" not in inc.summary


def test_a_bar_that_is_a_share_of_the_step_divides_the_measure_by_its_label() -> None:
    """EW-2-pp-stage-straggler fires when its neighbours wait idle x the step period longer than
    it does: its culprit claim must read the same share, not compare seconds with a ratio."""
    cfg = load_config(None, env={})
    spec = cfg.culprit_evidence["EW-2-pp-stage-straggler"]
    others, own, period = ("peer_others(avg(summary_collective_wait_seconds, window))",
                           "avg(summary_collective_wait_seconds, window)", "avg(summary_collective_period_seconds, window)")
    f = _claim("n1", evidence={others: 0.012, own: 0.001, period: 0.05, "min(summary_collective_steps, window)": 400.0})
    f.params = {"idle": 0.1, "min_steps": 5}
    ev = culprit.contract_evidence(f, spec)
    assert abs(ev["culprit_measure"] - 0.22) < 1e-12 and ev["culprit_bar"] == 0.1  # 11 ms of a 50 ms step
    v = culprit.judge(f, spec)
    assert v.names and v.measurement.startswith(f"({others} - {own}) / {period} 0.22 > idle 0.1")
    f.evidence[others] = 0.005  # 4 ms of a 50 ms step: under the rule's tenth, names nobody
    assert not culprit.judge(f, spec).names
    f.evidence[period] = 0.0  # no step period: no measurement, so no claim
    assert culprit.contract_evidence(f, spec) == {}

def test_contract_keys_come_from_the_configured_labels_and_params() -> None:
    spec = culprit.CulpritEvidence(measure="peer_dev(x)", above="quiet", negate=True, steps="min(s, window)",
                                   min_steps="min_steps")
    f = _claim("n1", evidence={"peer_dev(x)": -0.35, "min(s, window)": 40.0})
    f.params = {"quiet": 0.2, "min_steps": 20}
    assert culprit.contract_evidence(f, spec) == {"culprit_measure": 0.35, "culprit_bar": 0.2, "culprit_steps": 40.0,
                                                  "culprit_min_steps": 20.0}
    v = culprit.judge(f, spec)
    assert v.names and v.measurement == "-peer_dev(x) 0.35 > quiet 0.2 over 40 steps (min 20)"
    import copy

    both = copy.deepcopy(f)  # what the controller publishes: the label and the keys, in the same words
    both.evidence.update(culprit.contract_evidence(f, spec))
    assert culprit.judge(both, spec).measurement == v.measurement
    f.params = {"quiet": 0.5, "min_steps": 20}  # a site override raised the bar: the same deficit no longer names
    assert not culprit.judge(f, spec).names
    lag = culprit.CulpritEvidence(measure="avg(l, window)", above="lag")
    g = _claim("n1", evidence={"avg(l, window)": 0.0086})
    g.params = {"lag": "2ms"}  # durations travel as their text
    assert culprit.judge(g, lag).names


def test_every_default_culprit_evidence_entry_matches_its_shipped_rule() -> None:
    """The defaults read the shipped rules' evidence labels: a rule whose expression changes
    (EW-1's signals are being redesigned) must bring its entry along, or put the contract keys
    into its evidence itself - otherwise its claims are refused."""
    res = load_rules([str(PACKS)], full_catalogue())
    assert res.ok
    rules = res.ruleset.by_id()
    cfg = load_config(None, env={})
    for rid, spec in cfg.culprit_evidence.items():
        r = rules[rid]
        assert r.pathology in cfg.culprit_pathologies, rid
        labels = set(r.compiled.evidence_labels)
        assert spec.measure in labels, (rid, spec.measure, labels)
        assert not spec.steps or spec.steps in labels, (rid, spec.steps)
        for p in (spec.above, spec.min_steps):
            assert p is None or not isinstance(p, str) or p in r.params, (rid, p)
    group = {r.id for r in res.ruleset.rules if r.scope.value in ("tp_group", "cluster")
             and r.pathology in cfg.culprit_pathologies}
    assert group <= set(cfg.culprit_evidence), group - set(cfg.culprit_evidence)


# -- direct evidence beats inference ------------------------------------------------------------

def test_drops_on_a_node_are_never_a_victim_of_a_claim_naming_another_node() -> None:
    c = _corr()
    claim = _claim("n1")  # a straggler claim naming n1, stable and singled out
    drops = finding("n3", "NS-7-egress-drops", "NS-7", Layer.NETWORK, 100.0, cluster="c", entity="eth0")
    waiting = finding("n0", "GPU-8-x", "GPU-8", Layer.ENGINE, 100.0, cluster="c", entity="engine0")
    for f in (claim, drops, waiting):
        c.observe(f)
    incs = {i.pathology: i for i in _open(c)}
    assert incs["EW-1"].culprit.node == "n1" and incs["EW-1"].inhibited == [waiting.id]
    assert incs["NS-7"].culprit.node == "n3" and incs["NS-7"].findings == [drops.id]


@pytest.mark.parametrize("pathology,rule", [("NS-7", "NS-7-egress-drops"), ("NS-5", "NS-5-egress-backlog"),
                                            ("NS-9", "NS-9-link-saturation"), ("NS-4", "NS-4-rx-drops"),
                                            ("EW-6", "EW-6-loss-retransmit-storm")])
@pytest.mark.parametrize("claim_pathology", ["EW-1", "EW-3", "EW-9"])
def test_direct_evidence_on_the_named_node_takes_the_claim_into_its_own_incident(pathology, rule,
                                                                                 claim_pathology) -> None:
    c = _corr()
    claim = _claim("n3", claim_pathology, f"{claim_pathology}-x", t=105.0)
    own = finding("n3", rule, pathology, Layer.NETWORK, 100.0, cluster="c", entity="eth0")
    c.observe(claim), c.observe(own)
    (inc,) = _open(c, 106.0)
    assert inc.pathology == pathology and inc.culprit.node == "n3" and inc.inhibited == [claim.id]


def test_without_the_default_rule_direct_evidence_still_resists_another_nodes_inhibit_source() -> None:
    # a site rule that would let a cluster-wide claim hide drops anywhere in the TP group
    cfg = _cfg(inhibit_rules=[{"source": ["EW-9"], "target": ["NS-7", "GPU-8"], "equal": ["tp_group"]}])
    c = _corr(cfg)
    claim = _claim("n1", "EW-9", "EW-9-x", evidence={"culprit_measure": 0.7, "culprit_bar": 0.5})
    drops = finding("n3", "NS-7-egress-drops", "NS-7", Layer.NETWORK, 100.0, cluster="c", entity="eth0")
    slow = finding("n2", "GPU-8-x", "GPU-8", Layer.ENGINE, 100.0, cluster="c", entity="engine0")
    for f in (claim, drops, slow):
        c.observe(f)
    incs = {i.pathology: i for i in _open(c)}
    assert incs["NS-7"].findings == [drops.id]  # not hidden under n1's claim
    assert slow.id in incs["EW-9"].inhibited  # an ordinary symptom still is


# -- configuration ------------------------------------------------------------------------------

@pytest.mark.parametrize("corr,message", [
    ({"direct_evidence": ["NS-77"]}, "correlation.direct_evidence: unknown pathology ID 'NS-77'; did you mean NS-7?"),
    ({"culprit_evidence": {"r": {"measure": "x", "abov": "lag"}}}, "unknown key correlation.culprit_evidence.r.abov; "
                                                                  "did you mean above?"),
    ({"culprit_evidence": {"r": {"above": "lag"}}}, "correlation.culprit_evidence.r.measure must be the evidence label"),
    ({"culprit_evidence": {"r": {"measure": "x", "above": True}}}, "correlation.culprit_evidence.r.above must be a param"),
    ({"culprit_evidence": {"r": {"measure": "x", "above": 1, "abs": True, "negate": True}}}, "abs and negate exclude"),
])
def test_bad_correlation_settings_are_refused_with_the_field(corr, message, tmp_path) -> None:
    import yaml

    f = tmp_path / "controller.yaml"
    f.write_text(yaml.safe_dump({"correlation": corr}))
    with pytest.raises(ConfigError) as e:
        load_config(f, env={})
    assert message in str(e.value) and str(f) in str(e.value), str(e.value)


def test_a_site_switches_a_default_culprit_entry_off_and_adds_its_own() -> None:
    cfg = _cfg(culprit_evidence={"EW-9-missing-steps": None, "my-straggler": {"measure": "x", "above": 0.1}})
    assert "EW-9-missing-steps" not in cfg.culprit_evidence and "EW-1-tp-straggler" in cfg.culprit_evidence
    assert cfg.culprit_evidence["my-straggler"] == culprit.CulpritEvidence(measure="x", above=0.1)


def test_check_shows_how_each_culprit_rule_names_its_node_and_which_cannot(tmp_path, capsys) -> None:
    from skewd.controller.main import main

    rules = tmp_path / "r.yaml"
    rules.write_text("""required_engine_version: 1
rules:
  - id: EW-1-renamed-signals
    pathology: EW-1
    scope: tp_group
    layer: network
    params: {lag: 2ms}
    expr: ctl_arrival_lag_seconds > lag
    tags: [stable]
""")
    cfg = tmp_path / "c.yaml"
    import yaml

    cfg.write_text(yaml.safe_dump({"rules": [str(rules)], "correlation": {"culprit_evidence": {
        "EW-1-renamed-signals": {"measure": "avg(ctl_arrival_lag_excess_seconds, window)", "above": "lag"}}}}))
    assert main(["--config", str(cfg), "--check"]) == 0
    out = capsys.readouterr().out
    assert "EW-1-renamed-signals" in out and "PROBLEM: the rule has no evidence label(s) " \
        "'avg(ctl_arrival_lag_excess_seconds, window)'" in out and "its labels: ctl_arrival_lag_seconds" in out
