"""Scoring a real-traffic lab run from what its NATS recorder wrote.

The messages are built with the product's own dataclasses and encoders, so they are exactly
what agents and the controller publish. NOTE: their values (times, rules, nodes) are invented
for the test; the recorder's line format is the one workers/recorder.py writes.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from skewd import wire
from skewd.controller import messages
from skewd.lab.netlab.score import score_run
from skewd.model import Finding, Layer, Scope, Severity, State

T0, ONSET, END = 1_000_000.0, 1_000_090.0, 1_000_300.0
CLUSTER = "reallab"


def finding(rule: str, pathology: str, node: str, state: State, active: float, fired: float | None,
            scope: Scope = Scope.FLOW, entity: str = "tcp 10.79.0.10:8080>10.79.0.2:50000") -> Finding:
    return Finding(rule_id=rule, pathology=pathology, severity=Severity.WARNING, layer=Layer.NETWORK, scope=scope,
                   node=node, entity=entity, state=state, active_at=active, evaluated_at=fired or active,
                   fired_at=fired, cluster=CLUSTER)


def incident(iid: str, pathology: str, culprit: str | None, group: dict, opened: float) -> messages.Incident:
    return messages.Incident(id=iid, cluster=CLUSTER, pathology=pathology, rule_id=f"{pathology}-x", state="open",
                             group=group, culprit=messages.Target(node=culprit) if culprit else None, cause=None, victims=[],
                             findings=[], inhibited=[], phase=None, effect=None, summary="", opened_at=opened,
                             updated_at=opened)


def remap(key: str, culprit: str | None, targets: list[str], t: float) -> messages.RemapSuggestion:
    acts = [messages.RemapAction(key=f"{key}-{i}", type=messages.ActionType.REROUTE, target=messages.Target(node=n), rationale="",
                                 evidence=(), confidence=0.5, expected_effect="", ttl_s=600) for i, n in enumerate(targets)]
    return messages.RemapSuggestion(key=key, cluster=CLUSTER, incident="i", pathology="EW-1", created_at=t, expires_at=t + 600,
                                    ttl_s=600, culprit=messages.Target(node=culprit) if culprit else None, cause=None, phase=None,
                                    effect=None, actions=acts, evidence=[], confidence=0.5, summary="")


def write_run(tmp: Path, fault: str | None, node: str | None, expected: list[str], msgs: list[tuple[str, bytes]],
              tail: str = "") -> Path:
    run = tmp / "run"
    run.mkdir()
    nodes = ["n0", "n1", "n2", "n3"]
    (run / "truth.json").write_text(json.dumps({
        "scenario": "straggler" if fault else "healthy", "seed": 1, "fault": fault, "node": node,
        "expected": expected, "nodes": nodes, "healthy_nodes": [n for n in nodes if n != node],
        "t0": T0, "onset": ONSET if fault else None, "end": END,
        "onset_after_t0_s": (ONSET - T0) if fault else None, "error": ""}))
    with open(run / "messages.jsonl", "w") as f:
        for subject, data in msgs:
            f.write(json.dumps({"recv": T0, "subject": subject, "msg": json.loads(data)}) + "\n")
        f.write(tail)
    return run


def fmsg(f: Finding) -> tuple[str, bytes]:
    return wire.subject_for(f), wire.encode(f)


def test_a_straggler_run_is_scored_by_node_time_and_who_was_named(tmp_path: Path) -> None:
    ew1_pending = finding("EW-1-tp-straggler", "EW-1", "n2", State.PENDING, ONSET + 10, None, Scope.NODE, "")
    ew1 = dataclasses.replace(ew1_pending, state=State.FIRING, evaluated_at=ONSET + 25, fired_at=ONSET + 25)
    ew1_wrong_node = finding("EW-1-tp-straggler", "EW-1", "n1", State.FIRING, ONSET + 5, ONSET + 20, Scope.NODE, "")
    noise = finding("NS-7-egress-retransmits", "NS-7", "n0", State.FIRING, T0 + 10, T0 + 12)
    early_ew1 = finding("EW-1-tp-straggler", "EW-1", "n2", State.FIRING, T0 + 30, T0 + 40, Scope.NODE, "")
    msgs = [fmsg(noise), fmsg(early_ew1), fmsg(ew1_pending), fmsg(ew1_wrong_node), fmsg(ew1),
            fmsg(ew1),  # the same transition seen twice (JetStream re-delivery): one finding
            (messages.incident_subject(CLUSTER), messages.encode(incident("i1", "NS-7", "n0", {"node": "n0"}, T0 + 40))),
            (messages.incident_subject(CLUSTER), messages.encode(incident("i2", "EW-1", "n2", {"tp_group": "tp0"}, ONSET + 55))),
            (messages.incident_subject(CLUSTER), messages.encode(incident("i3", "EW-9", None, {"tp_group": "tp0"}, ONSET + 60))),
            (wire.remap_subject(CLUSTER), messages.encode(remap("r1", "n2", ["n2"], ONSET + 60))),
            (wire.remap_subject(CLUSTER), messages.encode(remap("r2", "n2", ["n3"], ONSET + 70)))]
    run = write_run(tmp_path, "straggler", "n2", ["EW-1"], msgs, tail='{"recv": 1, "subj')  # cut by a kill
    r = score_run(run)
    assert r["detected"] == {"EW-1": {"found": True, "latency_s": 25.0, "rule_id": "EW-1-tp-straggler"}}
    assert r["found"] is True
    # everything else that fired is false: the noise, EW-1 on a healthy node, EW-1 before onset
    assert r["false_findings"] == 3 and r["false_before_onset"] == 2
    # i1 names healthy n0; i3 names no node; r2 moves traffic off healthy n3
    assert (r["incidents"], r["incidents_naming_healthy"]) == (3, 1)
    assert (r["remaps"], r["remaps_naming_healthy"]) == (2, 1)
    # when a subscriber saw each incident first (the recorder's clock), not only when it opened
    assert [(i["t"], i["published"]) for i in r["incident_list"]] == [(40.0, 0.0), (145.0, 0.0), (150.0, 0.0)]
    assert r["node_hours"] == round(4 * 300 / 3600, 4)


def test_a_healthy_run_counts_every_firing_finding_per_node_hour(tmp_path: Path) -> None:
    fs = [finding("NS-4-ingress-retransmits", "NS-4", f"n{i}", State.FIRING, T0 + 10 * i, T0 + 10 * i + 2)
          for i in range(4)]
    resolved = dataclasses.replace(fs[0], state=State.RESOLVED, resolved_at=T0 + 100)
    msgs = [fmsg(f) for f in fs] + [fmsg(resolved),
                                    (messages.incident_subject(CLUSTER),
                                     messages.encode(incident("i1", "NS-4", "n3", {"node": "n3"}, T0 + 50)))]
    r = score_run(write_run(tmp_path, None, None, [], msgs))
    assert r["detected"] == {} and r["found"] is None
    assert r["false_findings"] == 4
    assert r["false_per_node_hour"] == round(4 / (4 * 300 / 3600), 2)
    assert r["incidents_naming_healthy"] == 1


def summary(node: str, t: float, synced: bool, err: float | None) -> tuple[str, bytes]:
    s = wire.Summary(node=node, cluster=CLUSTER, t=t, interval=1.0, signals={}, agent_version="test",
                     clock_sync=wire.ClockSync(synced=synced, max_error_s=err))
    return wire.subject_for(s), wire.encode(s)


def test_the_clocks_the_agents_reported_are_scored_per_node(tmp_path: Path) -> None:
    """The issue's bar must hold on hosts whose clocks are not synced: the score says which they
    were. A node that said unsynced once counts as unsynced, with its largest error bound."""
    msgs = [summary("n0", T0 + 1, True, 0.0004), summary("n1", T0 + 1, False, 16.0),
            summary("n1", T0 + 2, True, 0.001), summary("n2", T0 + 1, False, None)]
    r = score_run(write_run(tmp_path, None, None, [], msgs))
    assert r["clocks"] == {"nodes": 3, "unsynced": 2, "max_error_s": 16.0}
    assert r["messages"]["summary"] == 4


def test_a_fault_that_ends_counts_detections_up_to_a_grace_and_reports_what_it_left_open(tmp_path: Path) -> None:
    """A straggler removed 100 s after onset: EW-1 firing 10 s after onset is its detection; a
    finding firing 90 s after the fault ended is not, and it (and its incident) still open at
    the end is what the product failed to let go of."""
    cleared = ONSET + 100
    ew1 = finding("EW-1-tp-straggler", "EW-1", "n2", State.FIRING, ONSET + 5, ONSET + 10, Scope.NODE, "")
    ew1_done = dataclasses.replace(ew1, state=State.RESOLVED, evaluated_at=cleared + 20, resolved_at=cleared + 20)
    late = finding("EW-1-tp-straggler-time-share", "EW-1", "n2", State.FIRING, cleared + 80, cleared + 90,
                   Scope.NODE, "")
    msgs = [fmsg(ew1), fmsg(ew1_done), fmsg(late),
            (messages.incident_subject(CLUSTER), messages.encode(incident("i1", "EW-1", "n2", {"node": "n2"},
                                                                          cleared + 95)))]
    run = write_run(tmp_path, "straggler", "n2", ["EW-1"], msgs)
    truth = json.loads((run / "truth.json").read_text())
    (run / "truth.json").write_text(json.dumps(dict(truth, cleared=cleared)))
    r = score_run(run)
    assert r["detected"]["EW-1"] == {"found": True, "latency_s": 10.0, "rule_id": "EW-1-tp-straggler"}
    assert r["false_findings"] == 1
    assert r["recovery"] == {"cleared_s": round(cleared - T0, 1),
                             "findings_firing_at_end": ["EW-1-tp-straggler-time-share@n2"],
                             "incidents_open_at_end": 1, "false_after_recovery": 1}
    # without the end, the late finding is a detection like any other, and there is no recovery
    (run / "truth.json").write_text(json.dumps(truth))
    assert score_run(run)["recovery"] is None
