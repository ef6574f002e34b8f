"""What the report shows, worked out from a replay result: each incident's story (from the
controller's publications), the signals that explain it, the culprit's series against its peers'
over the incident window, and the findings grouped by rule and node.

Peers are *like-for-like*: the same signal on entities of the same family (``eth*`` with
``eth*``, never with ``ifb*`` or ``veth*``; GPUs with GPUs), on the culprit's peer nodes - or,
on a single node, its other entities of that family.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from skewd.controller import messages as controller_messages
from skewd.model import GROUP_SCOPES, Finding, Kind, SampleBatch, SignalSpec

from ..replay.core import ReplayResult
from ..replay.diff import IncidentStory, Occurrence, incident_stories, occurrences
from .units import rate_unit

MAX_EVIDENCE = 4  # signals per incident
MAX_CULPRIT_LINES = 4  # culprit entities drawn as their own line
_FAMILY = re.compile(r"^([A-Za-z_]+?)(?:\d|$)")


class Series:
    """One (signal, node, entity) over time, already a rate for counters."""

    def __init__(self, signal: str, node: str, entity: str, t: np.ndarray, v: np.ndarray) -> None:
        self.signal, self.node, self.entity, self.t, self.v = signal, node, entity, t, v

    @property
    def label(self) -> str:
        return f"{self.node}/{self.entity}" if self.entity else self.node

    def window(self, t0: float, t1: float) -> "Series":
        m = (self.t >= t0) & (self.t <= t1)
        return Series(self.signal, self.node, self.entity, self.t[m], self.v[m])


def family(entity: str) -> str:
    """The kind of entity, by name: ``eth0`` → ``eth``, ``ifb0`` → ``ifb``, ``veth1a2b`` →
    ``veth``, ``mlx5_0/1`` → ``mlx``, ``gpu3`` → ``gpu``, a PCI address → ``pci``, a flow →
    its protocol; node scope → ``""``."""
    if not entity:
        return ""
    if re.match(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:", entity):
        return "pci"
    if " " in entity:
        return entity.split(" ", 1)[0]  # "tcp 10.0.0.1:80>..." → tcp
    m = _FAMILY.match(entity)
    return m.group(1) if m else entity


@dataclass
class Card:
    """One incident's headline and evidence."""

    story: IncidentStory
    incident: controller_messages.Incident  # as last published
    suggestion: controller_messages.RemapSuggestion | None
    members: list[Occurrence]
    symptoms: list[Occurrence]  # inhibited findings it explains
    onset: float
    t0: float  # evidence window
    t1: float
    peers: list[str]
    signals: list[str] = field(default_factory=list)
    held: bool = False  # open at the end but never published


def _occ_by_id(occ: Iterable[Occurrence], findings: Sequence[Finding]) -> dict[str, Occurrence]:
    ids: dict[tuple, str] = {}
    for f in findings:
        ids[(f.rule_id, f.node, f.entity, tuple(sorted(f.labels.items())), f.active_at)] = f.id
    return {ids[(o.rule_id, o.node, o.entity, tuple(sorted(o.labels.items())), o.active_at)]: o for o in occ
            if (o.rule_id, o.node, o.entity, tuple(sorted(o.labels.items())), o.active_at) in ids}


def cards(result: ReplayResult, occ: list[Occurrence], t_end: float) -> list[Card]:
    """A card per incident the controller published (its last publication), then per incident
    still held when the replay ended, in order of onset."""
    stories = {s.id: s for s in incident_stories(result.incidents, result.suggestions)}
    by_id = _occ_by_id(occ, result.findings)
    sugg = {}
    for s in result.suggestions:
        sugg.setdefault(s.incident, s)
    items: list[tuple[IncidentStory, controller_messages.Incident, bool]] = [
        (s, s.last, False) for s in stories.values() if s.last is not None]  # type: ignore[misc]
    for inc in result.held:
        st = incident_stories([inc])[0]
        items.append((st, inc, True))
    out = []
    for story, inc, held in items:
        members = [by_id[i] for i in _all_ids(result, inc.id, "findings") if i in by_id]
        symptoms = [by_id[i] for i in _all_ids(result, inc.id, "inhibited") if i in by_id]
        onset = min([o.active_at for o in members] or [inc.opened_at])
        end = story.closed_at if story.closed_at is not None else t_end
        pad = max(30.0, 0.25 * max(end - onset, 1.0))
        peers = _peers(result, inc)
        out.append(Card(story, inc, sugg.get(inc.id), members, symptoms, onset, onset - pad, end + pad, peers,
                        held=held))
    return sorted(out, key=lambda c: (c.held, c.onset, c.story.id))


def _all_ids(result: ReplayResult, iid: str, what: str) -> list[str]:
    """Every finding id an incident listed in any publication (members or inhibited)."""
    seen: dict[str, None] = {}
    for inc in result.incidents:
        if inc.id == iid:
            for x in getattr(inc, what):
                seen.setdefault(x, None)
    for inc in result.held:
        if inc.id == iid:
            for x in getattr(inc, what):
                seen.setdefault(x, None)
    return list(seen)


def _peers(result: ReplayResult, inc: controller_messages.Incident) -> list[str]:
    culprit = inc.culprit.node if inc.culprit is not None else ""
    if inc.victims and culprit:
        return sorted(set(inc.victims) - {culprit})
    return [n for n in result.nodes if n != culprit]


def evidence_signals(card: Card, rules: dict, catalogue: dict[str, SignalSpec], present: set[str]) -> list[str]:
    """The signals behind the incident: those its members' rules read (the group rule's first,
    then the culprit's own), then those of the symptoms it explains; recorded ones only."""
    out: list[str] = []
    groups = sorted(card.members, key=lambda o: (o.labels.get("tp_group", "") == "", o.active_at))
    for o in [*groups, *card.symptoms]:
        r = rules.get(o.rule_id)
        if r is None:
            continue
        for s in sorted(getattr(r.compiled, "signals", ()) or r.requires):
            if s in present and s not in out and s in catalogue:
                out.append(s)
    from .units import is_state

    return sorted(out, key=lambda s: is_state(catalogue[s].unit))  # stable: states after the measures


def load_series(result: ReplayResult, signals: Iterable[str], catalogue: dict[str, SignalSpec],
                t0: float, t1: float) -> dict[str, list[Series]]:
    """Every (node, entity) series of ``signals`` between t0 and t1 from the segments' samples
    and the summaries; counters as per-second rates."""
    wanted = set(signals)
    out: dict[str, list[Series]] = {s: [] for s in wanted}
    if not wanted:
        return out
    nodes = set(result.nodes)
    parts: list[SampleBatch] = [seg.samples(wanted) for seg in result.segments]
    allb = SampleBatch.concat(parts)
    have: set[tuple[str, str, str]] = set()
    if len(allb):
        keys = np.char.add(np.char.add(allb.signal.astype(str), "\x00"),
                           np.char.add(np.char.add(allb.node.astype(str), "\x00"), allb.entity.astype(str)))
        order = np.lexsort((allb.t, keys))
        ks = keys[order]
        cuts = np.flatnonzero(ks[1:] != ks[:-1]) + 1
        for a, b in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(order)]))):
            idx = order[a:b]
            sig, node, ent = str(allb.signal[idx[0]]), str(allb.node[idx[0]]), str(allb.entity[idx[0]])
            if node not in nodes:
                continue
            have.add((sig, node, ent))
            out[sig].append(_as_plotted(Series(sig, node, ent, allb.t[idx], allb.value[idx]), catalogue))
    sums: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for m in result.summaries:
        for name, ents in m.signals.items():
            if name in wanted:
                for ent, v in ents.items():
                    if (name, m.node, ent) not in have and m.node in nodes:
                        sums.setdefault((name, m.node, ent), []).append((m.t, np.nan if v is None else float(v)))
    for (name, node, ent), pts in sorted(sums.items()):
        arr = np.array(sorted(pts), dtype=np.float64)
        out[name].append(Series(name, node, ent, arr[:, 0], arr[:, 1]))
    pad = 0.0
    return {k: sorted((s.window(t0 - pad, t1 + pad) for s in v), key=lambda s: (s.node, s.entity))
            for k, v in out.items()}


def _as_plotted(s: Series, catalogue: dict[str, SignalSpec]) -> Series:
    spec = catalogue.get(s.signal)
    if spec is None or spec.kind is not Kind.COUNTER:
        return s
    t, v = s.t, s.v
    if len(t) < 2:
        return Series(s.signal, s.node, s.entity, t[:0], v[:0])
    dt, dv = np.diff(t), np.diff(v)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where((dt > 0) & (dv >= 0), dv / np.where(dt > 0, dt, 1.0), np.nan)  # a reset leaves a gap
    return Series(s.signal, s.node, s.entity, t[1:], r)


def plotted_unit(signal: str, catalogue: dict[str, SignalSpec]) -> str:
    spec = catalogue.get(signal)
    if spec is None:
        return ""
    return rate_unit(spec.unit, spec.kind is Kind.COUNTER)


@dataclass
class Comparison:
    """The culprit's series of one signal against the band of its like-for-like peers."""

    signal: str
    unit: str
    culprit: list[Series]
    peers: list[Series]
    family: str
    note: str = ""


def compare(card: Card, signal: str, series: list[Series], unit: str) -> Comparison | None:
    """Split a signal's series into the culprit's and its peers' (same entity family)."""
    inc = card.incident
    node = inc.culprit.node if inc.culprit is not None else ""
    entity = inc.culprit.entity if inc.culprit is not None else ""
    if not node:  # a cluster incident: its members' nodes are the "culprits"
        mine_nodes = {o.node for o in card.members}
    else:
        mine_nodes = {node}
    fired = {(o.node, o.entity) for o in card.members}
    own = [s for s in series if s.node in mine_nodes and len(s.t)]
    if not own:
        return None
    pick = [s for s in own if s.entity == entity] if entity else []
    if not pick:  # the signal is about other entities than the culprit's (flows of its port): its members'
        hit = [s for s in own if (s.node, s.entity) in fired]
        if hit:
            fam0 = family(hit[0].entity)
            pick = [s for s in hit if family(s.entity) == fam0]
        elif not entity:
            fam0 = family(own[0].entity)
            pick = [s for s in own if family(s.entity) == fam0]
    if not pick:
        return None
    fam = family(pick[0].entity)
    note = ""
    if len(pick) > MAX_CULPRIT_LINES:
        # the entities that deviate most from their peers' median carry the story
        note = f"{MAX_CULPRIT_LINES} of {len(pick)} {fam or 'node'} series shown (largest mean)"
        pick = sorted(pick, key=lambda s: (-_mean(s), s.label))[:MAX_CULPRIT_LINES]
        pick = sorted(pick, key=lambda s: s.label)
    chosen = {(s.node, s.entity) for s in pick}
    peers = [s for s in series if family(s.entity) == fam and (s.node, s.entity) not in chosen
             and (s.node in card.peers or (s.node in mine_nodes and not card.peers))]
    return Comparison(signal, unit, pick, peers, fam, note)


def _mean(s: Series) -> float:
    v = s.v[np.isfinite(s.v)]
    return float(v.mean()) if len(v) else -math.inf


@dataclass
class FindingGroup:
    """Occurrences of one rule on one node."""

    rule_id: str
    node: str
    severity: str
    pathology: str
    occurrences: list[Occurrence]
    inhibited_by: str = ""  # incident id, when every fired occurrence was a symptom it explains

    @property
    def fired(self) -> list[Occurrence]:
        return [o for o in self.occurrences if o.fired_at is not None]

    @property
    def entities(self) -> int:
        return len({o.entity for o in self.occurrences})

    @property
    def first(self) -> float:
        return min((o.fired_at if o.fired_at is not None else o.active_at) for o in self.occurrences)


def finding_groups(result: ReplayResult, occ: list[Occurrence], card_list: list[Card], rules: dict
                   ) -> list[FindingGroup]:
    """Occurrences grouped by rule × node, fired groups first (by first firing), then those
    that only went pending."""
    inhibited: dict[tuple, str] = {}
    for c in card_list:
        for o in c.symptoms:
            inhibited[(o.rule_id, o.node, o.entity, o.active_at)] = c.story.id
    groups: dict[tuple[str, str], FindingGroup] = {}
    for o in occ:
        r = rules.get(o.rule_id)
        g = groups.get((o.rule_id, o.node))
        if g is None:
            g = groups[(o.rule_id, o.node)] = FindingGroup(o.rule_id, o.node, o.severity,
                                                           r.pathology if r is not None else "", [])
        g.occurrences.append(o)
    for g in groups.values():
        by = {inhibited.get((o.rule_id, o.node, o.entity, o.active_at)) for o in g.fired}
        if g.fired and len(by) == 1 and None not in by:
            g.inhibited_by = next(iter(by))  # type: ignore[arg-type]
        g.occurrences.sort(key=lambda o: (o.fired_at if o.fired_at is not None else o.active_at, o.entity))
    return sorted(groups.values(), key=lambda g: (not g.fired, g.first, g.rule_id, g.node))


def all_occurrences(result: ReplayResult) -> list[Occurrence]:
    return occurrences(result.findings, fired_only=False)


def is_group(f: Finding) -> bool:
    return f.scope in GROUP_SCOPES
