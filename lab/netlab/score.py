"""Score one lab run from what its NATS subscriber recorded, against its truth.json.

Every message is decoded with the product's own strict decoders (``skewd.wire`` for findings,
summaries and health; ``skewd.controller.messages`` for incidents and remap suggestions).

- A **firing finding** is a finding transition to ``firing``; one per finding id (a finding
  that flaps fires again under a new id and counts again).
- **Found on the right node** (per expected ID): a firing finding of that pathology on the
  faulty node, fired at or after onset. **Latency**: onset → its ``fired_at``.
- **False findings**: every other firing finding (in a healthy run: every firing finding).
  Per node-hour over the time the agents ran (t0 → end).
- Incident times: ``t`` is the controller's ``opened_at`` (its group's first finding, which may
  predate the incident's pathology joining it; for an incident naming a culprit, the group
  rule's finding that names it), ``published`` when a subscriber first saw it.
- **A fault that ends** (``cleared`` in truth.json): a detection counts up to
  :data:`RECOVERY_GRACE_S` after it; ``recovery`` lists what still fired and how many incidents
  were still open when the run ended, and the false findings that fired after the grace.
- **Clocks**: per node, whether any of its summaries said its clock was not synchronised, and
  the largest error bound they gave.
- **Incidents / remaps naming a healthy node**: an incident whose culprit node (or, without a
  culprit, its group's node) is not the faulty node; a remap suggestion whose culprit or any
  action's target node is not the faulty node. In a healthy run every node is healthy.
  Incidents count once per id (first publication), suggestions once per key.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from skewd import wire
from skewd.controller import messages
from skewd.model import State

from .steps import step_stats


def read_messages(path: Path) -> list[dict[str, Any]]:
    """The recorder's JSONL; a line cut by a kill at the end is skipped."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def _decoded(msgs: list[dict[str, Any]]) -> Iterator[tuple[str, Any, float]]:
    for m in msgs:
        kind = m["msg"].get("kind")
        data = json.dumps(m["msg"])
        if kind in ("finding", "summary", "health"):
            yield kind, wire.decode(data, kind), m["recv"]
        elif kind in (messages.Kind.INCIDENT.value, messages.Kind.REMAP.value):
            yield kind, messages.decode(data, kind), m["recv"]
        elif m["subject"].startswith(f"{wire.SUBJECT_PREFIX}.finding."):
            yield "finding", wire.decode(data, "finding"), m["recv"]


def incident_nodes(inc: messages.Incident) -> list[str]:
    if inc.culprit is not None and inc.culprit.node:
        return [inc.culprit.node]
    return [inc.group["node"]] if inc.group.get("node") else []


def remap_nodes(s: messages.RemapSuggestion) -> list[str]:
    nodes = [s.culprit.node] if s.culprit is not None and s.culprit.node else []
    nodes += [a.target.node for a in s.actions if a.target.node]
    return sorted(set(nodes))


#: after a fault is removed, findings that fire within this long still count as its detection
#: (a rule's window still holds the fault), and the product has this long to let go of it
RECOVERY_GRACE_S = 60.0


def score_run(run_dir: Path) -> dict[str, Any]:
    truth = json.loads((run_dir / "truth.json").read_text())
    msgs = read_messages(run_dir / "messages.jsonl")
    t0, end, onset = truth["t0"], truth["end"], truth["onset"]
    cleared = truth.get("cleared")  # a fault removed before the end: detections count up to a grace after it
    latest_f: dict[str, str] = {}  # finding fingerprint -> the state of its latest transition
    latest_i: dict[str, str] = {}  # incident id -> its latest state
    names: dict[str, str] = {}  # finding fingerprint -> rule@node
    faulty = truth["node"]
    healthy = set(truth["healthy_nodes"])
    firing: dict[str, dict[str, Any]] = {}
    incidents: dict[str, dict[str, Any]] = {}
    remaps: dict[str, dict[str, Any]] = {}
    counts = {"finding": 0, "summary": 0, "health": 0, "incident": 0, "remap": 0}
    clocks: dict[str, tuple[bool, float | None]] = {}  # node -> what its summaries said, unsynced sticks
    for kind, msg, recv in _decoded(msgs):
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "finding":
            latest_f[msg.fingerprint] = msg.state.value
            names[msg.fingerprint] = f"{msg.rule_id}@{msg.node}"
        elif kind == "incident":
            latest_i[msg.id] = msg.state
        if kind == "summary":
            was = clocks.get(msg.node, (True, None))
            errs = [e for e in (was[1], msg.clock_sync.max_error_s) if e is not None]
            clocks[msg.node] = (was[0] and msg.clock_sync.synced, max(errs) if errs else None)
        elif kind == "finding" and msg.state is State.FIRING and msg.id not in firing:
            fired = msg.fired_at if msg.fired_at is not None else msg.evaluated_at
            firing[msg.id] = {"rule_id": msg.rule_id, "pathology": msg.pathology, "node": msg.node,
                              "entity": msg.entity, "scope": msg.scope.value, "fired_at": fired,
                              "t": round(fired - t0, 1), "summary": msg.summary}
        elif kind == "incident" and msg.id not in incidents:
            incidents[msg.id] = {"id": msg.id, "pathology": msg.pathology, "rule_id": msg.rule_id,
                                 "state": msg.state, "nodes": incident_nodes(msg), "group": msg.group,
                                 "t": round(msg.opened_at - t0, 1), "published": round(recv - t0, 1),
                                 "summary": msg.summary}
        elif kind == "remap" and msg.key not in remaps:
            remaps[msg.key] = {"key": msg.key, "pathology": msg.pathology, "nodes": remap_nodes(msg),
                               "actions": [a.type.value for a in msg.actions], "t": round(msg.created_at - t0, 1),
                               "summary": msg.summary}
    detected: dict[str, dict[str, Any]] = {}
    true_ids: set[str] = set()
    for pid in truth["expected"]:
        hits = sorted((f for fid, f in firing.items() if f["pathology"] == pid and f["node"] == faulty
                       and onset is not None and f["fired_at"] >= onset
                       and (cleared is None or f["fired_at"] <= cleared + RECOVERY_GRACE_S)),
                      key=lambda f: f["fired_at"])
        true_ids |= {fid for fid, f in firing.items() if f in hits}
        detected[pid] = {"found": bool(hits), "latency_s": round(hits[0]["fired_at"] - onset, 1) if hits else None,
                         "rule_id": hits[0]["rule_id"] if hits else None}
    false = [f for fid, f in firing.items() if fid not in true_ids]
    hours = max(0.0, end - t0) / 3600
    node_hours = hours * len(truth["nodes"])
    bad_incidents = [i for i in incidents.values() if set(i["nodes"]) & healthy]
    bad_remaps = [r for r in remaps.values() if set(r["nodes"]) & healthy]
    return {
        "run": run_dir.name, "scenario": truth["scenario"], "seed": truth["seed"], "fault": truth["fault"],
        "node": faulty, "expected": truth["expected"], "error": truth.get("error", ""),
        "duration_s": round(end - t0, 1), "node_hours": round(node_hours, 4), "nodes": len(truth["nodes"]),
        "onset_s": truth.get("onset_after_t0_s"),
        **_ground_truth(run_dir, truth),
        "detected": detected,
        "found": any(d["found"] for d in detected.values()) if detected else None,
        "false_findings": len(false),
        "false_before_onset": sum(1 for f in false if onset is not None and f["fired_at"] < onset),
        "false_per_node_hour": round(len(false) / node_hours, 2) if node_hours else None,
        "incidents": len(incidents), "incidents_naming_healthy": len(bad_incidents),
        "remaps": len(remaps), "remaps_naming_healthy": len(bad_remaps),
        "firing": sorted(firing.values(), key=lambda f: f["fired_at"]),
        "incident_list": sorted(incidents.values(), key=lambda i: i["t"]),
        "remap_list": sorted(remaps.values(), key=lambda r: r["t"]),
        "messages": counts,
        # a fault that ended: did the product let go? (what still fired, and which incidents
        # were still open, when the run ended, RECOVERY_GRACE_S or more after the fault ended)
        "recovery": None if cleared is None else {
            "cleared_s": round(cleared - t0, 1),
            "findings_firing_at_end": sorted(names[fp] for fp, st in latest_f.items() if st == State.FIRING.value),
            "incidents_open_at_end": sum(1 for st in latest_i.values() if st == "open"),
            "false_after_recovery": sum(1 for f in false if f["fired_at"] > cleared + RECOVERY_GRACE_S)},
        # the clocks the run's agents reported (adjtimex, in every summary): the controller's
        # cross-node alignment runs with its default unsynced-clock error for an unsynced node
        "clocks": {"nodes": len(clocks), "unsynced": sum(1 for ok, _ in clocks.values() if not ok),
                   "max_error_s": max((e for _, e in clocks.values() if e is not None), default=None)},
    }


def _ground_truth(run_dir: Path, truth: dict[str, Any]) -> dict[str, Any]:
    """What the fault did, from the ranks' step logs (recomputed, so a re-score picks up a
    better measure), else as truth.json recorded it."""
    logs = sorted((run_dir / "steps").glob("rank*.log"), key=lambda p: int(p.stem[4:]))
    st = truth.get("steps") or {}
    if logs and truth.get("t0"):
        faulty = int(truth["node"][1:]) if truth.get("node") else None
        st = step_stats(logs, truth["t0"], truth.get("onset"), truth["end"], faulty)
    lag = st.get("straggler_lag_s") or {}
    return {"slowdown_s": st.get("slowdown_s"), "straggler_lag_s": lag.get("after"),
            "straggler_lag_before_s": lag.get("before")}


def firing_table(result: dict[str, Any]) -> str:
    """Which findings fired where (rule, node, count, first time after t0): for reading a run."""
    agg: dict[tuple[str, str], list[float]] = {}
    for f in result["firing"]:
        agg.setdefault((f["rule_id"], f["node"]), []).append(f["t"])
    lines = [f"  {r:40} {n:6} x{len(ts):<3} first +{min(ts):.0f}s" for (r, n), ts in sorted(agg.items())]
    return "\n".join(lines) or "  (none)"
