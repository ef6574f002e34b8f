"""Correlation: findings from every node (and the controller's own group rules) become
incidents with a culprit, victims, a root cause, the engine phase and the observed effect.

Modelled on Alertmanager: findings are *grouped* (by TP group and culprit for cross-node
findings, by node and pathology for node-local ones), *de-duplicated* (one finding per
fingerprint, its latest transition), and *inhibited*: while a culprit incident is open for a
TP group, the findings its victims raise (the peers waiting at every collective: low
utilisation, slow steps, eroding throughput) are attached to it instead of opening incidents of
their own, so they produce no remap of their own. Pathologies listed in
``correlation.never_inhibit`` (hardware faults, squatters) are never hidden that way.
``correlation.inhibit_rules`` add Alertmanager's explicit form: while a finding of a *source*
pathology fires, findings of a *target* pathology with the same labels (node, entity, TP group)
are attached to the source's incident (a lossy port's slow KV transfers, a stalled engine's
eroded throughput) instead of opening incidents of their own; an occurrence of a target that
began while its source held stays attached after the source resolves (its aftermath: a slowed
engine drains its queue), keeping the source's incident open until it ends.

:meth:`Correlator.correlate` recomputes the incident set from the current findings at a given
time, so every controller replica and a restarted controller reach the same incidents; only
the id an open incident was given is remembered (and persisted by the service) so that an
incident keeps its id while its first member resolves.

Like Alertmanager's first notification of a group, an incident is *held* (not published) until
it has been held ``correlation.group_wait`` (from when correlation first had it as an incident of
its own, :meth:`Correlator.hold_start`) and no culprit rule is pending in its TP group
(:meth:`Correlator.due`): a cause that fires a few seconds after its symptom then inhibits the
symptom before any subscriber was shown it, and an incident that resolves or is taken over
while held is never shown at all. The correlator keeps which incidents were published
(:attr:`Correlator.published`, persisted with the ids by the service); updates after the first
publication are published as they happen.

What a finding may do depends on its rule's maturity tag and, for a culprit claim, on its own
evidence (docs/rules.md, "Maturity"; :mod:`.culprit`): a *sandbox* finding stays a finding (no
incident, no remap, it hides nothing); a cross-node finding names its node the culprit only when
its own measurement singles that node out, and an *incubating* one only when something else
points at the same node too (a finding on that node its peers do not share, or another rule's
claim); an incident resting on incubating rules alone is shown but gets no remap until a second
rule corroborates it. Claims refused are counted and listed (:meth:`Correlator.report`). Direct
evidence beats inference: a node-local finding of a ``direct_evidence`` pathology (drops or a
backlog measured on that node) is never a victim of a culprit incident naming another node, nor
the target of an inhibit rule whose source is on another node. One exception, from the flows
themselves: flows from two or more nodes that lose into one node are that node's trouble, and
the senders' loss findings on them join its ingress-loss incident (:mod:`.losspath`,
``correlation.loss_paths``).

Root-cause attribution follows the runbooks: the culprit's GPUs report throttle reasons →
``gpu``; its host is CPU/IRQ-bound → ``host``; its PCIe feed is thin while its ingress is normal
(PCIe late after ingress) → ``pcie``; its PCIe is healthy but its egress stalls (transmit wait,
ECN/CNP, retransmits) → ``network``; its engine carries more load than its peers → ``engine``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from skewd.model import GROUP_SCOPES, Finding, Layer, Scope, State

from . import culprit as culprit_mod
from . import losspath
from .align import GroupReport
from .configtypes import InhibitRule, LossPaths
from .messages import Cause, Effect, Incident, PhaseContext, Target, stable_key
from .timeline import Timelines
from .topology import Topology

#: what a rule's maturity tag lets the controller do with its findings (docs/rules.md, "Maturity")
MATURITIES = ("stable", "incubating", "sandbox")
#: a finding that does not say, from a rule this controller does not know (an older agent's custom rule)
UNKNOWN_MATURITY = "incubating"

NodeValue = Callable[[str, str], "float | None"]  # (signal, node) → recent value

#: how much thinner than its peers' a node's PCIe feed (or fuller its egress wait) must be to count
PEER_RATIO = 0.7
EGRESS_RATIO = 2.0


@dataclass
class _Group:
    key: str
    kind: str  # "culprit" | "cluster" | "node"
    pathology: str
    rule_id: str
    group: dict[str, str]
    culprit: str
    members: list[Finding]
    inhibited: list[Finding]


class Correlator:
    """Owns one cluster's findings and the incidents made of them (culprit against victims, layer,
    inhibited symptoms); the controller hands it every finding (:meth:`observe`) and calls :meth:`correlate` each tick."""

    def __init__(self, cluster: str, topology: Topology, timelines: Timelines, *,
                 culprit_pathologies: Sequence[str], never_inhibit: Sequence[str], effect_window: float,
                 node_value: NodeValue | None = None, inhibit_rules: Sequence[InhibitRule] = (),
                 direct_evidence: Sequence[str] = (),
                 culprit_evidence: Mapping[str, culprit_mod.CulpritEvidence] | None = None,
                 maturities: Mapping[str, str] | None = None, loss_paths: LossPaths | None = None) -> None:
        """``direct_evidence``: pathologies whose node-local findings measure a fault on their
        own node (never inhibited by an inference naming another node); ``culprit_evidence``:
        where culprit rules' findings hold their measurement (:mod:`.culprit`);
        ``maturities``: rule id → maturity tag of the rules this controller loaded, for findings
        that do not carry their own (agents older than the field); ``loss_paths``: which end of
        a lossy path (:mod:`.losspath`; None: off)."""
        self.cluster = cluster
        self.topology = topology
        self.timelines = timelines
        self.culprit_pathologies = list(culprit_pathologies)
        self.never_inhibit = set(never_inhibit)
        self.inhibit_rules = tuple(inhibit_rules)
        self.effect_window = effect_window
        self.node_value: NodeValue = node_value or (lambda s, n: None)
        self.findings: dict[str, Finding] = {}  # fingerprint → latest transition
        self.ids: dict[str, tuple[str, float]] = {}  # group key → (incident id, opened_at) while open
        self.incidents: dict[str, Incident] = {}  # incident id → latest
        self.published: set[str] = set()  # incident ids subscribers were shown (no longer held)
        self.held_from: dict[str, float] = {}  # open incident id → when correlation first had it
        self.reports: Mapping[str, GroupReport] = {}
        self.direct_evidence = set(direct_evidence)
        self.culprit_evidence: Mapping[str, culprit_mod.CulpritEvidence] = dict(culprit_evidence or {})
        self.maturities: Mapping[str, str] = dict(maturities or {})
        self.loss_paths = loss_paths
        # what the last correlate() refused to name, and what it kept as findings only
        self.refused: dict[str, tuple[Finding, str]] = {}  # fingerprint → (culprit claim, why it names nobody)
        self.sandboxed: list[Finding] = []  # firing sandbox findings (no incident, no remap)
        self.refusals_total = 0  # culprit claims (finding occurrences) ever refused
        self.sandbox_total = 0  # sandbox finding occurrences ever seen firing
        self._counted: set[str] = set()  # finding ids already counted in the two totals
        self._plan: dict[str, str] = {}  # open incident id → "" (may be planned) or why not
        self._verdicts: dict[str, culprit_mod.Verdict] = {}  # fingerprint → verdict of the last correlate()

    # -- input --------------------------------------------------------------------------------
    def observe(self, f: Finding) -> bool:
        """Take a finding transition; False for a duplicate or an out-of-date one."""
        old = self.findings.get(f.fingerprint)
        if old is not None:
            if old.event_id == f.event_id:
                return False
            if (old.active_at, old.evaluated_at) > (f.active_at, f.evaluated_at):
                return False  # an older occurrence or transition re-delivered late
        self.findings[f.fingerprint] = f
        return True

    def restore_ids(self, ids: Mapping[str, tuple[str, float]], published: Iterable[str] = (),
                    held_from: Mapping[str, float] | None = None) -> None:
        """Ids of the incidents open before a restart, which of them had been published, and
        since when each was held (the others' hold resumes with its original deadline)."""
        self.ids.update(ids)
        self.published.update(published)
        self.held_from.update(held_from or {})

    # -- maturity and culprit evidence ---------------------------------------------------------
    def maturity(self, f: Finding) -> str:
        """The finding's maturity tag; for a finding without one, its rule's here, else
        incubating (shown, but names no culprit and gets no remap without corroboration)."""
        if f.maturity in MATURITIES:
            return f.maturity
        return self.maturities.get(f.rule_id, UNKNOWN_MATURITY)

    def verdict(self, f: Finding) -> culprit_mod.Verdict:
        """Whether the culprit claim ``f`` singles out its node (:func:`culprit.judge`)."""
        peers = (p for p in self.findings.values() if self.maturity(p) != "sandbox")
        return culprit_mod.judge(f, self.culprit_evidence.get(f.rule_id), peers)

    def contract(self, f: Finding) -> dict[str, float]:
        """The culprit-contract evidence of ``f`` (its own keys, or derived from its rule's
        ``correlation.culprit_evidence`` entry)."""
        return culprit_mod.contract_evidence(f, self.culprit_evidence.get(f.rule_id))

    def _corroboration(self, f: Finding, firing: Sequence[Finding], verdicts: Mapping[str, culprit_mod.Verdict]) -> str:
        """What else points at the node an incubating culprit claim names: a finding on that
        node itself that its TP peers do not share (a symptom every waiting peer shows is no
        evidence against one of them), or another rule's claim that singles out the same node.
        "" when nothing does."""
        grp = self.topology.group_of(f.node)
        peers = set(grp.nodes if grp else ()) - {f.node}
        for g in firing:
            if g.node != f.node or g.fingerprint == f.fingerprint:
                continue
            if self._is_group_finding(g):
                v = verdicts.get(g.fingerprint)
                if g.pathology in self.culprit_pathologies and g.rule_id != f.rule_id and v is not None and v.names:
                    return f"{g.rule_id} names {f.node} too ({v.measurement})"
                continue
            if any(h.pathology == g.pathology and h.node in peers for h in firing if not self._is_group_finding(h)):
                continue
            return f"{g.rule_id} fires on {f.node}{' (' + g.entity + ')' if g.entity else ''}"
        return ""

    # -- grouping -----------------------------------------------------------------------------
    def _is_group_finding(self, f: Finding) -> bool:
        return f.scope in GROUP_SCOPES

    def _groups(self, now: float) -> list[_Group]:
        firing = sorted((f for f in self.findings.values() if f.state is State.FIRING),
                        key=lambda f: (f.active_at, f.rule_id, f.node, f.entity))
        # sandbox rules give findings only: no incident, no culprit, no remap, and they hide nothing
        self.sandboxed = [f for f in firing if self.maturity(f) == "sandbox"]
        for f in self.sandboxed:
            if f.id not in self._counted:
                self._counted.add(f.id)
                self.sandbox_total += 1
        firing = [f for f in firing if self.maturity(f) != "sandbox"]
        # loss findings that the common end of several lossy flows explains (.losspath)
        loss_end = losspath.attribute(firing, self.loss_paths) if self.loss_paths is not None else {}
        # a cause that resolved while a symptom it explains is still pending or firing keeps its
        # incident open: that occurrence of the symptom began under the cause (its aftermath)
        firing = sorted((*firing, *self._lingering(firing, now)), key=lambda f: (f.active_at, f.rule_id, f.node, f.entity))
        groups: dict[str, _Group] = {}
        culprit_of: dict[str, _Group] = {}  # tp_group → culprit incident
        cluster_groups: list[_Group] = []
        rank = {p: i for i, p in enumerate(self.culprit_pathologies)}
        deferred: dict[str, tuple[Finding, Finding]] = {}  # fingerprint → (finding, its inhibitor)
        verdicts = {f.fingerprint: self.verdict(f) for f in firing
                    if self._is_group_finding(f) and f.pathology in rank and f.node}
        self._verdicts = verdicts
        refused: list[tuple[Finding, str, str]] = []  # (claim, its TP group, why it names nobody)
        # 1. the controller's cross-node findings (an inhibit rule may name one as a target: its
        # node label is the node it names, e.g. a straggler on a node whose port is lossy)
        for f in firing:
            if not self._is_group_finding(f):
                continue
            src = self._inhibitor(f, firing)
            if src is not None:
                deferred[f.fingerprint] = (f, src)
                continue
            tp = f.labels.get("tp_group") or (self.topology.group_of(f.node).name if self.topology.group_of(f.node) else "")
            if f.pathology in rank and tp and f.node:
                # a culprit is named only on the claim's own evidence (stable), plus something else
                # pointing at the same node (incubating)
                v = verdicts[f.fingerprint]
                why = v.reason
                if not why and self.maturity(f) != "stable":
                    if not self._corroboration(f, firing, verdicts):
                        why = (f"{f.rule_id} is {self.maturity(f)} and nothing else points at {f.node} "
                               f"({v.measurement})")
                if why:
                    refused.append((f, tp, why))
                    continue
                if tp in culprit_of and culprit_of[tp].culprit != f.node:
                    other = culprit_of[tp]
                    # two culprits in one group: keep the one found first; the other joins as evidence
                    other.members.append(f)
                    continue
                g = culprit_of.get(tp)
                if g is None:
                    key = f"tp:{tp}:culprit:{f.node}"
                    g = groups[key] = culprit_of[tp] = _Group(key, "culprit", f.pathology, f.rule_id,
                                                              {"tp_group": tp}, f.node, [], [])
                g.members.append(f)
                if rank[f.pathology] < rank.get(g.pathology, 99):
                    g.pathology, g.rule_id = f.pathology, f.rule_id
            else:
                key = f"cluster:{f.pathology}"
                g = groups.get(key)
                if g is None:
                    g = groups[key] = _Group(key, "cluster", f.pathology, f.rule_id, {"cluster": self.cluster}, "", [], [])
                    cluster_groups.append(g)
                g.members.append(f)
        # claims that name nobody stay findings (Controller.status() lists them with why); while
        # their group has a culprit incident they are attached to it, as its peers' findings are
        self.refused = {}
        for f, tp, why in refused:
            self.refused[f.fingerprint] = (f, why)
            if f.id not in self._counted:
                self._counted.add(f.id)
                self.refusals_total += 1
            if tp in culprit_of:
                culprit_of[tp].inhibited.append(f)
        # 2. node-local findings: evidence for a culprit, inhibited victims, or their own incident
        for f in firing:
            if self._is_group_finding(f):
                continue
            tpg = self.topology.group_of(f.node)
            c = culprit_of.get(tpg.name) if tpg is not None else None
            if c is not None and f.node == c.culprit:
                c.members.append(f)
                continue
            # a finding that measures a fault on its own node is never a victim of an inference
            # that names another node
            if c is not None and f.pathology not in self.never_inhibit and f.pathology not in self.direct_evidence:
                c.inhibited.append(f)
                continue
            # only a network-layer cluster incident (fabric congestion) explains a node's network
            # findings: a cluster-scope GPU or engine rule (GPU-7 across the group) does not
            fabric = next((g for g in cluster_groups if f.layer is Layer.NETWORK and g.members[0].layer is Layer.NETWORK
                           and f.node in {m.node for m in g.members}), None)
            if fabric is not None and f.pathology not in self.never_inhibit:
                fabric.inhibited.append(f)
                continue
            src = loss_end.get(f.fingerprint) or self._inhibitor(f, firing)
            if src is not None:
                deferred[f.fingerprint] = (f, src)
                continue
            key = f"node:{f.node}:{f.pathology}"
            g = groups.get(key)
            if g is None:
                g = groups[key] = _Group(key, "node", f.pathology, f.rule_id, {"node": f.node}, "", [], [])
            g.members.append(f)
        # 3. findings an inhibit rule hides: attached to the incident that holds their source
        # (following a chain of inhibitions; the configuration refuses cycles)
        holder = {m.fingerprint: g for g in groups.values() for m in (*g.members, *g.inhibited)}
        for fp, (f, src) in deferred.items():
            seen = {fp}
            while src.fingerprint in deferred and src.fingerprint not in seen:
                seen.add(src.fingerprint)
                src = deferred[src.fingerprint][1]
            g = holder.get(src.fingerprint)
            if g is None:  # unreachable with a valid configuration; never lose a finding
                key = f"node:{f.node}:{f.pathology}"
                g = groups.setdefault(key, _Group(key, "node", f.pathology, f.rule_id, {"node": f.node}, "", [], []))
                g.members.append(f)
                continue
            g.inhibited.append(f)
        return list(groups.values())

    def _label(self, f: Finding, name: str) -> str:
        """An inhibit rule's ``equal`` label of ``f``: its node, entity, TP group, or the model
        its node serves (the replicas a load balancer spreads one model's requests over; "" for
        a node of no known model, so in a one-model cluster without a topology every node
        matches)."""
        if name == "node":
            return f.node
        if name == "entity":
            return f.entity
        if name == "model":
            m = self.topology.model_of(f.node)
            return m.name if m is not None else ""
        grp = self.topology.group_of(f.node)
        return f.labels.get("tp_group") or (grp.name if grp is not None else "")

    def _inhibitor(self, f: Finding, firing: Sequence[Finding]) -> Finding | None:
        """The first finding in ``firing`` that inhibits ``f`` under ``correlation.inhibit_rules``:
        a firing source, or a resolved (lingering) one that held when ``f``'s occurrence began."""
        return next((s for s in self._sources_of(f, firing)
                     if s.state is State.FIRING or self._began_under(f, s)), None)

    def _sources_of(self, f: Finding, candidates: Sequence[Finding]) -> Iterator[Finding]:
        """The findings of ``candidates`` that an inhibit rule makes a source for ``f`` (rule by
        rule, in ``candidates``' order), whatever their state: the rule names ``f``'s pathology
        as target and theirs as source, the rule's ``equal`` labels match, and a ``direct_evidence``
        target is only taken over by a source on its own node. Nothing for a ``never_inhibit``."""
        if f.pathology in self.never_inhibit:
            return
        direct = f.pathology in self.direct_evidence
        for r in self.inhibit_rules:
            if f.pathology not in r.target:
                continue
            for s in candidates:
                if (s.pathology in r.source and s.fingerprint != f.fingerprint
                        and all(self._label(s, k) == self._label(f, k) for k in r.equal)
                        and not (direct and s.node != f.node)):
                    yield s

    @staticmethod
    def _began_under(f: Finding, s: Finding) -> bool:
        """Whether ``f``'s occurrence began (went pending) while the occurrence of ``s`` that
        fired held (from its own pending start to its resolution)."""
        return (s.fired_at is not None and s.resolved_at is not None
                and s.active_at <= f.active_at <= s.resolved_at)

    def _lingering(self, firing: Sequence[Finding], now: float) -> list[Finding]:
        """Resolved node-local findings that still hold a symptom: a pending or firing target
        of an inhibit rule, with no firing source of its own, whose occurrence began while the
        resolved source's occurrence held. A symptom outlives its cause - an engine slowed for minutes
        works off its queue over a full cache for a minute or more after its link, launch path
        or host recovered (GPU-2 after PCIE-3/5/6 in the fault lab) - and that occurrence is
        the cause's, not demand outgrowing the cache: the cause's incident stays open holding
        it until it resolves. A target whose occurrence begins after its cause resolved opens
        an incident of its own, as before. The resolved source stays a member of its incident
        (the incident is built as when it fired). A *pending* target holds it only for
        ``effect_window`` after the source resolved: an agent drops a pending alert that turns
        false without a transition (Prometheus semantics), so a pending finding here may be
        stale; one that fires later reopens the cause's incident."""
        kinds = {p for r in self.inhibit_rules for p in r.target}
        targets = [f for f in self.findings.values()
                   if f.pathology in kinds and f.state in (State.PENDING, State.FIRING) and self.maturity(f) != "sandbox"
                   and f.pathology not in self.never_inhibit and self._inhibitor(f, firing) is None]
        if not targets:
            return []
        resolved = [s for s in self.findings.values()
                    if s.state is State.RESOLVED and self.maturity(s) != "sandbox" and not self._is_group_finding(s)]
        out: dict[str, Finding] = {}
        for f in targets:
            s = self._inhibitor(f, resolved)
            if s is not None and (f.state is State.FIRING or now - (s.resolved_at or now) <= self.effect_window):
                out[s.fingerprint] = s
        return list(out.values())

    # -- the incident set ---------------------------------------------------------------------
    def correlate(self, now: float) -> list[Incident]:
        """Recompute incidents at ``now``; returns every incident whose content changed
        (opened, members/culprit/cause changed, resolved or inhibited)."""
        groups = self._groups(now)
        seen: set[str] = set()
        changed: list[Incident] = []
        # where each firing finding went: a node incident whose findings all moved into a
        # culprit/cluster incident (as evidence or as inhibited victims) is superseded, not resolved
        taken: dict[str, str] = {}
        for g in groups:
            for f in (g.inhibited if g.kind == "node" else (*g.members, *g.inhibited)):
                taken[f.fingerprint] = g.key
        for g in groups:
            if g.key in self.ids:
                iid, opened = self.ids[g.key]
            else:
                # a culprit incident is its claim's (the group rule's finding naming the node): the
                # culprit's own node findings ride JetStream and may reach the controller before or
                # after the claim fires, so the earliest member present would make the id (and the
                # opening time) depend on delivery order - and a replay would not match the live run
                claims = ([f for f in g.members if self._is_group_finding(f) and f.node == g.culprit]
                          if g.kind == "culprit" else [])
                first = min(claims or g.members, key=lambda f: f.active_at)
                opened = first.fired_at or first.active_at
                iid = stable_key(self.cluster, g.key, first.id)
                self.ids[g.key] = (iid, opened)
                self.held_from[iid] = max(now, opened)
            seen.add(g.key)
            inc = self._build(g, iid, opened, now)
            prev = self.incidents.get(iid)
            self.incidents[iid] = inc
            if prev is None or prev.digest() != inc.digest():
                changed.append(inc)
        # incidents whose members are gone: resolved, or inhibited when a culprit took them over
        for key, (iid, _) in list(self.ids.items()):
            if key in seen:
                continue
            prev = self.incidents.get(iid)
            del self.ids[key]
            self.held_from.pop(iid, None)
            if prev is None:  # restored after a restart, gone before it was rebuilt
                self.published.discard(iid)
                continue
            if prev.state != "open":
                continue
            by_key = {taken.get(fp) for fp in self._fps(prev.findings)} - {None}
            if by_key and all(fp in taken for fp in self._fps(prev.findings)):
                by = self.ids.get(next(iter(by_key)))  # type: ignore[arg-type]
                closed = _replace(prev, state="inhibited", updated_at=now, inhibited_by=by[0] if by else "")
            else:
                closed = _replace(prev, state="resolved", updated_at=now, resolved_at=now)
            self.incidents[iid] = closed
            changed.append(closed)
        return changed

    def _fps(self, finding_ids: Iterable[str]) -> list[str]:
        return [i.split("-", 1)[0] for i in finding_ids]

    def culprit_pending(self, inc: Incident) -> bool:
        """True while a culprit rule is *pending* for a node of the incident's TP group: a
        victim's incident (or the culprit's own, which would become evidence) must not be
        planned before that rule either fires (and takes it over) or lets go."""
        if "node" not in inc.group:
            return False
        grp = self.topology.group_of(inc.group["node"])
        if grp is None:
            return False
        return any(f.state is State.PENDING and self._is_group_finding(f) and f.pathology in self.culprit_pathologies
                   and f.node in grp.nodes and self.maturity(f) != "sandbox" for f in self.findings.values())

    def hold_start(self, inc: Incident) -> float:
        """When the hold of ``inc`` began: when correlation first had it as an incident of its
        own - its ``opened_at`` (first member fired; a culprit incident's claim) as a rule; later
        when that finding arrived late, or was until then attached to another incident (a
        symptom left firing after its cause resolved opens an incident of its own then, with
        its old ``opened_at``)."""
        return max(inc.opened_at, self.held_from.get(inc.id, inc.opened_at))

    def cause_pending(self, inc: Incident, now: float, wait: float) -> bool:
        """True while a finding that would take ``inc`` over is *pending*: a source of an
        inhibit rule with one of ``inc``'s members as its target, on the labels the rule's
        ``equal`` joins (a symptom that fires before its cause by more than ``group_wait``: a
        batch client's NS-1 fires on its first batch, the NS-8 its spread lengths explain goes
        pending 30 s later and fires after its own ``for``). Only node incidents: culprit and
        cluster incidents are no inhibit targets as a whole. Sandbox findings hide nothing. A
        pending source counts for ``wait`` + ``effect_window`` from its pending start only: an
        agent drops a pending alert that turns false without sending a transition, so the
        controller's pending copy may be stale, and a symptom is never held for ever by it."""
        if "node" not in inc.group:
            return False
        pending = [s for s in self.findings.values()
                   if s.state is State.PENDING and self.maturity(s) != "sandbox"
                   and now - s.active_at <= wait + self.effect_window]
        return bool(pending) and any(next(self._sources_of(f, pending), None) is not None
                                     for f in self.members(inc))

    def due(self, inc: Incident, now: float, wait: float) -> bool:
        """Whether a held open incident is to be published at ``now``: it has been held
        ``wait`` (``correlation.group_wait``), no culprit rule is pending in its TP group and no
        cause that would take it over is pending (the gate the planner applies too: what may
        still be explained is not shown yet)."""
        return (inc.state == "open" and now - self.hold_start(inc) >= wait and not self.culprit_pending(inc)
                and not self.cause_pending(inc, now, wait))

    def is_held(self, inc: Incident) -> bool:
        return inc.id not in self.published

    def mark_published(self, iid: str) -> None:
        self.published.add(iid)

    def open_incidents(self) -> list[Incident]:
        return [i for i in self.incidents.values() if i.state == "open"]

    def forget_closed(self, before: float) -> None:
        for iid, inc in list(self.incidents.items()):
            if inc.state != "open" and inc.updated_at < before:
                del self.incidents[iid]
                self.published.discard(iid)
        for fp, f in list(self.findings.items()):
            if f.state is State.RESOLVED and (f.resolved_at or f.evaluated_at) < before:
                del self.findings[fp]
        self._counted &= {f.id for f in self.findings.values()}
        self._plan = {i: v for i, v in self._plan.items() if i in self.incidents}

    # -- one incident ---------------------------------------------------------------------------
    def _build(self, g: _Group, iid: str, opened: float, now: float) -> Incident:
        members = sorted(g.members, key=lambda f: (f.active_at, f.rule_id, f.node, f.entity))
        culprit = None
        cause = None
        victims: list[str] = []
        nodes = sorted({f.node for f in members})
        if g.kind == "culprit":
            tp = g.group["tp_group"]
            grp = self.topology.tp_groups().get(tp)
            model = self.topology.model_of(g.culprit)
            # the culprit's most specific entity: the device its own node findings point at
            own = [f for f in members if f.node == g.culprit and not self._is_group_finding(f)]
            entity = next((f.entity for f in own if f.entity), "")
            culprit = Target(node=g.culprit, entity=entity, tp_group=tp,
                             model=model.name if model else "", engine=self.topology.engine_of(g.culprit))
            peers = [n for n in (grp.nodes if grp else ()) if n != g.culprit]
            victims = sorted(set(peers) | {f.node for f in g.inhibited})
            # the culprit's own node findings are the evidence; the group rule's finding says only "late"
            cause = self.attribute(g.culprit, peers, own)
            claim = next(f for f in members if self._is_group_finding(f) and f.node == g.culprit)
            cause = dataclasses.replace(cause, evidence={**cause.evidence, **self.contract(claim)})
        elif g.kind == "cluster":
            victims = nodes
            cause = Cause("network" if any(f.layer is Layer.NETWORK for f in members) else members[0].layer.value,
                          f"{len(nodes)} nodes at once: {', '.join(nodes[:8])}{'…' if len(nodes) > 8 else ''}",
                          min(0.95, 0.5 + 0.05 * len(nodes)), {"nodes": float(len(nodes))},
                          tuple(f.id for f in members))
        else:
            node = g.group["node"]
            culprit = Target(node=node, entity=members[0].entity if len({f.entity for f in members}) == 1 else "",
                             tp_group=(self.topology.group_of(node).name if self.topology.group_of(node) else ""),
                             model=(self.topology.model_of(node).name if self.topology.model_of(node) else ""),
                             engine=self.topology.engine_of(node))
            cause = Cause(members[0].layer.value, members[0].summary or members[0].rule_id, 0.6,
                          dict(members[0].evidence), tuple(f.id for f in members))
        # the phase and effect are measured from the onset (when the first member's condition
        # became true), not from when the incident was confirmed
        onset = min(f.active_at for f in members)
        where = culprit.node if culprit else (nodes[0] if nodes else "")
        # an engine's incident quotes that engine, not the node's other one (engine-scope members
        # name it: their entity is the engine)
        engines = {f.entity for f in members if f.scope is Scope.ENGINE and f.node == where and f.entity}
        phase, effect = self.phase_and_effect(where, culprit.engine if culprit else "", onset, now,
                                              entity=next(iter(engines)) if len(engines) == 1 else "")
        self._plan[iid] = self._plan_gate(g)
        summary = self._summary(g, culprit, cause, victims, phase, effect)
        if self._plan[iid]:
            summary += f"; no remap: {self._plan[iid]}"
        return Incident(id=iid, cluster=self.cluster, pathology=g.pathology, rule_id=g.rule_id, state="open",
                        group=dict(g.group), culprit=culprit, cause=cause, victims=victims,
                        findings=[f.id for f in members],
                        inhibited=sorted(f.id for f in g.inhibited), phase=phase, effect=effect, summary=summary,
                        opened_at=opened, updated_at=now)

    def _plan_gate(self, g: _Group) -> str:
        """Why the incident of ``g`` gets no remap suggestion ("" when it may get one): an
        incident resting on incubating rules alone needs a second rule's finding (a member or a
        symptom it holds) to corroborate it."""
        if g.kind == "culprit":
            return ""  # naming the culprit already took its own evidence (and corroboration if incubating)
        found = [f for f in (*g.members, *g.inhibited) if self.maturity(f) != "sandbox"]
        if any(self.maturity(f) == "stable" for f in g.members):
            return ""
        if len({f.rule_id for f in found}) >= 2:
            return ""
        rules = ", ".join(sorted({f.rule_id for f in g.members}))
        return f"{rules} is incubating and no other rule's finding corroborates it yet"

    def members(self, inc: Incident) -> list[Finding]:
        """The member findings of ``inc`` as last seen (what the planner reads their evidence from)."""
        out = []
        for fid in inc.findings:
            f = self.findings.get(fid.split("-", 1)[0])
            if f is not None and f.id == fid:
                out.append(f)
        return out

    def plannable(self, inc: Incident) -> bool:
        """Whether the planner may suggest a remap for ``inc`` (see :meth:`_plan_gate`)."""
        return not self._plan.get(inc.id, "")

    def report(self) -> dict[str, object]:
        """What correlation held back, for ``Controller.status()``: culprit claims refused
        (with why) and sandbox findings kept as findings only, now and in total."""
        return {"culprit_claims_refused_total": self.refusals_total,
                "sandbox_findings_total": self.sandbox_total,
                "culprit_claims_refused": [{"finding": f.id, "rule": f.rule_id, "node": f.node, "reason": why}
                                           for f, why in self.refused.values()],
                "sandbox_findings": [{"finding": f.id, "rule": f.rule_id, "node": f.node, "entity": f.entity}
                                     for f in self.sandboxed]}

    def phase_and_effect(self, node: str, engine: str, start: float, now: float, entity: str = ""
                         ) -> tuple[PhaseContext | None, Effect | None]:
        """The engine serving ``node``: its phase when the trouble started and the effect since.

        In order: the engine the incident is about (``entity``, an engine-scope finding's), the
        TP group's configured ``engine``, the node's plugin engines, the node's one engine (from
        its summaries), plugin engines elsewhere in the group, then the node's reductions over
        all its engines (which name no engine: the incident says so)."""
        grp = self.topology.group_of(node)
        nodes = list(grp.nodes) if grp else [node]
        plugin = sorted(k for k, tl in self.timelines.engines.items() if tl.source == "plugin"
                        and k.split("/", 1)[0] in nodes)
        own = self.timelines.node_engines(node)
        key = self.timelines.resolve([f"{node}/{entity}" if entity else "", engine,
                                      *[k for k in plugin if k.startswith(node + "/")],
                                      *(own if len(own) == 1 else []), *plugin, node, *nodes])
        if key is None:
            return None, None
        return (self.timelines.context(key, start),
                self.timelines.effect(key, start, max(now, start), self.effect_window))

    def attribute(self, node: str, peers: Sequence[str], own: Sequence[Finding]) -> Cause:
        """Runbook attribution of why ``node`` lags its peers (see module doc)."""
        nv = self.node_value

        def peer_median(sig: str) -> float | None:
            vals = sorted(v for v in (nv(sig, p) for p in peers) if v is not None)
            return vals[len(vals) // 2] if vals else None

        def fids(pred: Callable[[Finding], bool]) -> tuple[str, ...]:
            return tuple(f.id for f in own if pred(f))

        ev: dict[str, float | None] = {}
        for sig in ("summary_pcie_rx_bytes_per_second", "summary_net_rx_bytes_per_second",
                    "summary_rdma_xmit_wait_per_second", "summary_rdma_retrans_per_second",
                    "summary_rdma_ecn_marked_per_second", "summary_gpu_throttled", "summary_kv_cache_usage_ratio",
                    "summary_requests_waiting"):
            v, m = nv(sig, node), peer_median(sig)
            if v is not None:
                ev[sig] = v
            if m is not None:
                ev[f"{sig}_peer_median"] = m
        rep = next((r for r in self.reports.values() if node in r.lag_median_s), None)
        if rep is not None:
            ev["arrival_lag_seconds"] = rep.lag_median_s.get(node)
            ev["arrival_last_share_ratio"] = rep.last_share.get(node)
            ev["step_spread_seconds"] = rep.spread_median_s
            ev["aligned_steps"] = float(rep.steps)

        def thin(sig: str) -> bool:
            v, m = ev.get(sig), ev.get(f"{sig}_peer_median")
            return v is not None and m is not None and m > 0 and v < PEER_RATIO * m

        def high(sig: str) -> bool:
            v, m = ev.get(sig), ev.get(f"{sig}_peer_median")
            return v is not None and v > 0 and (m is None or v > EGRESS_RATIO * max(m, 1e-9))

        # gpu: throttle reasons
        gpu_f = fids(lambda f: f.layer is Layer.GPU and f.pathology in ("GPU-5", "GPU-6"))
        if gpu_f or (ev.get("summary_gpu_throttled") or 0) >= 1:
            return Cause("gpu", f"{node} reports GPU throttle / hardware slowdown reasons while its peers do not",
                         0.9 if gpu_f else 0.75, ev, gpu_f)
        # host: CPU / IRQ starvation of the feed
        host_f = fids(lambda f: f.layer is Layer.HOST or f.pathology in ("PCIE-8", "PCIE-3"))
        if host_f:
            return Cause("host", f"{node}'s host CPU cannot feed its GPUs (CPU/IRQ contention)", 0.8, ev, host_f)
        # pcie: feed late after ingress
        pcie_f = fids(lambda f: f.layer is Layer.PCIE)
        ingress_ok = not thin("summary_net_rx_bytes_per_second")
        if pcie_f or (thin("summary_pcie_rx_bytes_per_second") and ingress_ok):
            why = (f"{node}'s host-to-GPU PCIe feed is thin/late while its ingress matches its peers "
                   "(PCIe late after ingress)")
            return Cause("pcie", why, 0.85 if pcie_f and thin("summary_pcie_rx_bytes_per_second") else 0.7, ev, pcie_f)
        # network: PCIe healthy, egress stalls
        net_f = fids(lambda f: f.layer is Layer.NETWORK)
        egress = [s for s in ("summary_rdma_xmit_wait_per_second", "summary_rdma_retrans_per_second",
                              "summary_rdma_ecn_marked_per_second") if high(s)]
        if net_f or egress:
            what = ", ".join(s.removeprefix("summary_rdma_").removesuffix("_per_second") for s in egress) or "network findings"
            return Cause("network", f"{node}'s PCIe feed is healthy but its egress stalls ({what})",
                         0.8 if egress and net_f else 0.65, ev, net_f)
        # engine: more load than its peers
        eng_f = fids(lambda f: f.layer is Layer.ENGINE)
        if eng_f or high("summary_requests_waiting") or (
                (ev.get("summary_kv_cache_usage_ratio") or 0) > (ev.get("summary_kv_cache_usage_ratio_peer_median") or 1) + 0.1):
            return Cause("engine", f"{node}'s engine carries more load than its peers (KV / queue)", 0.6, ev, eng_f)
        return Cause("unknown", f"no layer signal on {node} explains it yet", 0.4, ev, ())

    def _summary(self, g: _Group, culprit: Target | None, cause: Cause | None, victims: list[str],
                 phase: PhaseContext | None, effect: Effect | None) -> str:
        of = ""
        if phase is not None:
            of = f" of {phase.engine}" if "/" in phase.engine else f" of {phase.engine} (all its engines)"
        ph = f"phase {phase.phase}{of} (KV {phase.kv_usage_ratio:.0%})" if phase and phase.kv_usage_ratio is not None \
            else (f"phase {phase.phase}{of}" if phase else "phase unknown (no engine data)")
        eff = f"effect: {effect.description}" if effect else "effect not observed (no engine data)"
        if g.kind == "culprit" and culprit is not None:
            # the claim's own measurement, never another signal's (an EW-9 claim once quoted the
            # aligner's "last in 2 % of steps" as if it were the reason)
            claim = next(f for f in g.members if self._is_group_finding(f) and f.node == culprit.node)
            v = self._verdicts.get(claim.fingerprint) or self.verdict(claim)
            lag = f" ({claim.rule_id}: {v.measurement})"
            return (f"{g.pathology}: {culprit.node} is the culprit in TP group {g.group['tp_group']}{lag}; "
                    f"cause {cause.layer if cause else 'unknown'}: {cause.reason if cause else ''}; "
                    f"victims {', '.join(victims) or 'none'} ({len(g.inhibited)} findings inhibited); {ph}; {eff}")
        where = culprit.node if culprit else ", ".join(victims)
        held = f" ({len(g.inhibited)} findings inhibited: {', '.join(sorted({f.pathology for f in g.inhibited}))})" \
            if g.inhibited else ""
        return f"{g.pathology} on {where}: {cause.reason if cause else ''}{held}; {ph}; {eff}"


def _replace(inc: Incident, **kw: object) -> Incident:
    d = {k: getattr(inc, k) for k in inc.__dataclass_fields__ if k != "kind"}
    d.update(kw)
    return Incident(**d)  # type: ignore[arg-type]
