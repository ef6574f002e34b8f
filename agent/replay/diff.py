"""``skewd replay --diff``: what a rule change would have changed, at incident level first.

The bundle is replayed with each rule set (nodes and controller); the incidents each run
published are paired when they concern the same thing - the same pathology for the same TP
group, node or cluster - and were open at overlapping times. A pair whose opening, culprit,
cause, resolution or suggested actions differ is a change ("would have opened 40 s earlier",
"with another culprit"); an incident only A published would not have opened at all with B, one
only B published is new. Below that, the same comparison for the findings: fired occurrences
(pending → firing → resolved of one rule on one entity) paired when their active periods overlap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from skewd.controller import messages as controller_messages
from skewd.model import Finding, State

from .output import fmt_t

@dataclass
class Occurrence:
    """One fired alert: pending → firing → (resolved), assembled from its transitions."""

    rule_id: str
    node: str
    entity: str
    labels: dict[str, str]
    active_at: float
    fired_at: float | None = None
    resolved_at: float | None = None
    severity: str = ""
    summary: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple:
        return (self.rule_id, self.node, self.entity, tuple(sorted(self.labels.items())))

    def overlaps(self, o: "Occurrence") -> bool:
        a_end = self.resolved_at if self.resolved_at is not None else math.inf
        b_end = o.resolved_at if o.resolved_at is not None else math.inf
        return self.active_at <= b_end and o.active_at <= a_end


def occurrences(findings: Sequence[Finding], fired_only: bool = True) -> list[Occurrence]:
    occ: dict[str, Occurrence] = {}
    for f in findings:
        o = occ.get(f.id)
        if o is None:
            o = occ[f.id] = Occurrence(f.rule_id, f.node, f.entity, dict(f.labels), f.active_at,
                                       severity=f.severity.value)
        o.summary = f.summary or o.summary
        if f.evidence:
            o.evidence = dict(f.evidence)
        if f.state is State.FIRING:
            o.fired_at = f.fired_at if f.fired_at is not None else f.evaluated_at
        elif f.state is State.RESOLVED:
            o.resolved_at = f.resolved_at if f.resolved_at is not None else f.evaluated_at
            if o.fired_at is None and f.fired_at is not None:
                o.fired_at = f.fired_at
    out = [o for o in occ.values() if o.fired_at is not None or not fired_only]
    return sorted(out, key=lambda o: (o.key, o.active_at))


@dataclass
class DiffEntry:
    kind: str  # "appears" (only with B), "disappears" (only with A), "timing"
    a: Occurrence | None
    b: Occurrence | None

    @property
    def occ(self) -> Occurrence:
        return self.b or self.a  # type: ignore[return-value]

    def to_dict(self) -> dict[str, Any]:
        o = self.occ

        def times(x: Occurrence | None) -> dict[str, Any] | None:
            return None if x is None else {"active_at": x.active_at, "fired_at": x.fired_at, "resolved_at": x.resolved_at}

        return {"level": "finding", "change": self.kind, "rule_id": o.rule_id, "node": o.node, "entity": o.entity, "labels": o.labels,
                "a": times(self.a), "b": times(self.b)}

    def line(self) -> str:
        o = self.occ
        where = f"{o.rule_id} {o.node}/{o.entity or '-'}"
        if self.kind == "appears":
            return f"+ appears     {where}  fired {fmt_t(o.fired_at)}  resolved {fmt_t(o.resolved_at)}"
        if self.kind == "disappears":
            return f"- disappears  {where}  fired {fmt_t(o.fired_at)}  resolved {fmt_t(o.resolved_at)}"
        a, b = self.a, self.b
        assert a is not None and b is not None
        parts = []
        for what, x, y in (("fired", a.fired_at, b.fired_at), ("resolved", a.resolved_at, b.resolved_at)):
            if x == y:
                continue
            if x is not None and y is not None:
                d = y - x
                parts.append(f"{what} {fmt_t(x)} → {fmt_t(y)} ({abs(d):.3f}s {'later' if d > 0 else 'earlier'})")
            else:
                parts.append(f"{what} {fmt_t(x)} → {fmt_t(y)}")
        return f"~ timing      {where}  " + "; ".join(parts)


def diff_findings(a: Sequence[Finding], b: Sequence[Finding]) -> list[DiffEntry]:
    """Fired occurrences that appear, disappear or change firing/resolution time from A to B.
    Occurrences of the same rule and entity are paired when their active periods overlap."""
    occ_a, occ_b = occurrences(a), occurrences(b)
    by_key: dict[tuple, list[Occurrence]] = {}
    for o in occ_b:
        by_key.setdefault(o.key, []).append(o)
    used: set[int] = set()
    out: list[DiffEntry] = []
    for oa in occ_a:
        match = None
        for ob in by_key.get(oa.key, []):
            if id(ob) not in used and oa.overlaps(ob):
                match = ob
                break
        if match is None:
            out.append(DiffEntry("disappears", oa, None))
            continue
        used.add(id(match))
        if (oa.fired_at, oa.resolved_at) != (match.fired_at, match.resolved_at):
            out.append(DiffEntry("timing", oa, match))
    out += [DiffEntry("appears", None, ob) for ob in occ_b if id(ob) not in used]
    return sorted(out, key=lambda e: (e.occ.fired_at or e.occ.active_at, e.occ.key, e.kind))


# ---------------------------------------------------------------------------------------------
# Incidents
# ---------------------------------------------------------------------------------------------

@dataclass
class IncidentStory:
    """One incident as a subscriber saw it over the run: its first publication, what it said
    last, when it closed, and the suggestion made for it."""

    id: str
    pathology: str
    rule_id: str
    group: dict[str, str]
    opened_at: float
    published_at: float  # first publication
    culprit_node: str = ""
    culprit_entity: str = ""
    cause_layer: str = ""
    cause_reason: str = ""
    victims: list[str] = field(default_factory=list)
    closed_at: float | None = None  # resolved or inhibited
    closed_as: str = ""  # "resolved" | "inhibited" | ""
    actions: list[tuple[str, str, float]] = field(default_factory=list)  # (type, target node, confidence)
    suggested_at: float | None = None
    last: controller_messages.Incident | None = None

    @property
    def subject(self) -> tuple[str, str]:
        """What the incident is about: its pathology and its group (TP group, node or cluster)."""
        where = ",".join(f"{k}={v}" for k, v in sorted(self.group.items()))
        return self.pathology, where

    @property
    def where(self) -> str:
        if self.culprit_node:
            return self.culprit_node + (f"/{self.culprit_entity}" if self.culprit_entity else "")
        return ", ".join(f"{k} {v}" for k, v in sorted(self.group.items()))

    def overlaps(self, o: "IncidentStory") -> bool:
        a_end = self.closed_at if self.closed_at is not None else math.inf
        b_end = o.closed_at if o.closed_at is not None else math.inf
        return self.opened_at <= b_end and o.opened_at <= a_end


def incident_stories(incidents: Sequence[controller_messages.Incident],
                     suggestions: Sequence[controller_messages.RemapSuggestion] = ()) -> list[IncidentStory]:
    """Each published incident's story, from the publications in order (and its suggestion)."""
    out: dict[str, IncidentStory] = {}
    for inc in incidents:
        s = out.get(inc.id)
        if s is None:
            s = out[inc.id] = IncidentStory(inc.id, inc.pathology, inc.rule_id, dict(inc.group), inc.opened_at,
                                            inc.updated_at)
        s.last = inc
        s.rule_id = inc.rule_id
        s.pathology = inc.pathology
        if inc.culprit is not None:
            s.culprit_node, s.culprit_entity = inc.culprit.node, inc.culprit.entity
        if inc.cause is not None:
            s.cause_layer, s.cause_reason = inc.cause.layer, inc.cause.reason
        s.victims = list(inc.victims)
        if inc.state != "open" and s.closed_at is None:
            s.closed_at = inc.resolved_at if inc.resolved_at is not None else inc.updated_at
            s.closed_as = inc.state
    for sg in suggestions:
        s = out.get(sg.incident)
        if s is not None and s.suggested_at is None:
            s.suggested_at = sg.created_at
            s.actions = [(a.type.value, a.target.node, round(a.confidence, 4)) for a in sg.actions]
    return sorted(out.values(), key=lambda s: (s.opened_at, s.subject, s.id))


@dataclass
class IncidentChange:
    kind: str  # "new" (only with B), "gone" (only with A), "changed"
    a: IncidentStory | None
    b: IncidentStory | None
    changes: list[str] = field(default_factory=list)  # what differs, in words

    @property
    def story(self) -> IncidentStory:
        return self.a or self.b  # type: ignore[return-value]

    def line(self) -> str:
        s = self.story
        head = f"incident {s.id} {s.pathology} on {s.where} (opened {fmt_t(s.opened_at)})"
        if self.kind == "gone":
            return f"- {head}: would not have opened at all"
        if self.kind == "new":
            acts = ", ".join(t for t, _, _ in s.actions) or "no suggestion"
            return f"+ {head}: would open (new), published {fmt_t(s.published_at)}, cause {s.cause_layer or '-'}; {acts}"
        return f"~ {head}: would have " + "; ".join(self.changes)

    def to_dict(self) -> dict[str, Any]:
        def story(x: IncidentStory | None) -> dict[str, Any] | None:
            if x is None:
                return None
            return {"id": x.id, "pathology": x.pathology, "rule_id": x.rule_id, "group": x.group,
                    "opened_at": x.opened_at, "published_at": x.published_at, "closed_at": x.closed_at,
                    "closed_as": x.closed_as, "culprit": {"node": x.culprit_node, "entity": x.culprit_entity},
                    "cause": x.cause_layer, "actions": [list(a) for a in x.actions]}

        return {"level": "incident", "change": self.kind, "changes": list(self.changes), "a": story(self.a),
                "b": story(self.b)}


def _shift(what: str, x: float | None, y: float | None) -> str | None:
    if x == y:
        return None
    if x is None or y is None:
        return f"{what} {fmt_t(x)} → {fmt_t(y)}" if (x, y) != (None, None) else None
    d = y - x
    return f"{what} {abs(d):.3f}s {'later' if d > 0 else 'earlier'} ({fmt_t(x)} → {fmt_t(y)})"


def diff_incidents(a: Sequence[IncidentStory], b: Sequence[IncidentStory]) -> list[IncidentChange]:
    """Incidents only A published (gone), only B published (new), and pairs that differ."""
    by_subject: dict[tuple[str, str], list[IncidentStory]] = {}
    for s in b:
        by_subject.setdefault(s.subject, []).append(s)
    used: set[str] = set()
    out: list[IncidentChange] = []
    for sa in a:
        match = next((sb for sb in by_subject.get(sa.subject, []) if sb.id not in used and sa.overlaps(sb)), None)
        if match is None:
            out.append(IncidentChange("gone", sa, None))
            continue
        used.add(match.id)
        changes = []
        opened = _shift("opened", sa.opened_at, match.opened_at)
        if opened:
            changes.append(opened)
        shown = _shift("been published", sa.published_at, match.published_at)
        if shown:
            changes.append(shown)
        if (sa.culprit_node, sa.culprit_entity) != (match.culprit_node, match.culprit_entity):
            changes.append(f"named another culprit: {match.where} instead of {sa.where}")
        if sa.cause_layer != match.cause_layer:
            changes.append(f"given another cause: {match.cause_layer or '-'} instead of {sa.cause_layer or '-'}")
        closed = _shift(sa.closed_as or "closed", sa.closed_at, match.closed_at)
        if closed:
            changes.append(closed)
        if sa.actions != match.actions:
            fmt = lambda acts: ", ".join(f"{t}→{n or '-'}" for t, n, _ in acts) or "nothing"  # noqa: E731
            changes.append(f"suggested {fmt(match.actions)} instead of {fmt(sa.actions)}")
        if changes:
            out.append(IncidentChange("changed", sa, match, changes))
    out += [IncidentChange("new", None, sb) for sb in b if sb.id not in used]
    return sorted(out, key=lambda c: (c.story.opened_at, c.story.subject, c.kind))
