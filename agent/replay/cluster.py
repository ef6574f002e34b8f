"""Cluster replay: every recorded node's agent pipeline and the controller, together, on the
recorded time - the findings, incidents, inhibitions and remap suggestions the live system
published, reproduced after the fact.

The nodes run in :class:`~skewd.agent.replay.core.Replayer` (the recorded batches, evaluated at
the recorded ticks); the controller is the deployed service run in-process
(:class:`skewd.controller.offline.OfflineController`, the one the fault lab's harness runs too).
Each replay step hands the controller what the agents sent at that tick - their finding
transitions through its findings consumer's handler, then their summaries - and lets it evaluate
the grid times the summaries' clock has passed, as its live evaluation loop does. What it
publishes (its own findings, incident messages, suggestions) joins the step.

Live, a finding travels by JetStream and may reach the controller a little after the summary of
the same tick; replay delivers it first. An incident's publication can therefore differ by one
evaluation interval from the live one; its id, culprit, cause, members and suggestion do not
(ids are derived from the findings' activation times, which are the recorded ones).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Mapping, Sequence

from skewd.controller import messages as controller_messages
from skewd.controller.config import ConfigError
from skewd.controller.offline import OfflineController, offline_config
from skewd.model import GROUP_SCOPES, Catalogue, Finding
from skewd.rules.engine import RuleSet
from skewd.rules.loader import RuleLoadError

from .. import bundle
from .core import Event, ReplayError, Replayer, ReplayResult


class ClusterReplay:
    """Owns a :class:`Replayer` (the nodes) and an :class:`OfflineController`; called by the
    CLI (``skewd replay``), the diff and tests. Iterate :meth:`events` or call :meth:`run`."""

    def __init__(self, replayer: Replayer, *, controller_config: str | None = None,
                 overrides: Mapping[str, object] | None = None) -> None:
        """``controller_config``: the YAML file the live controller ran with (topology, group
        wait, inhibit rules...); by default the controller's defaults, the bundle's cluster, and
        the topology the agents' labels describe. The controller's rules are the replay's: the
        ones recorded in the bundle, or ``--rules``."""
        self.replayer = replayer
        rs = self._controller_rules()
        try:
            self.cfg = offline_config(replayer.cluster or "replay", controller_config, overrides)
            self.controller = OfflineController(self.cfg, catalogue=replayer.catalogue, ruleset=rs)
        except (ConfigError, RuleLoadError) as e:  # an operator's file, or a bundle's cluster no controller takes
            problems = getattr(e, "problems", None) or getattr(e, "issues", None)
            raise ReplayError(f"controller config: {e}" + ("".join(f"\n  {p}" for p in problems) if problems else "")
                              ) from None
        self.incidents: list[controller_messages.Incident] = []
        self.suggestions: list[controller_messages.RemapSuggestion] = []

    def _controller_rules(self) -> RuleSet:
        """The rule set the controller evaluates (its group scopes): the replay's fixed rules, or
        the first recorded set that has group rules, else the first one."""
        rep = self.replayer
        if rep.fixed_rules is not None:
            return rep.fixed_rules
        sets = rep.segment_rules()
        for rs in sets:
            if any(r.scope in GROUP_SCOPES and r.enabled for r in rs.rules):
                return rs
        return sets[0] if sets else RuleSet([], [], "")

    def events(self) -> Iterator[Event]:
        rep = self.replayer
        ctl = self.controller
        for ev in rep.events():
            for f in ev.findings:
                ctl.finding(f)
            for s in ev.summaries:
                ctl.summary(s, _labels(rep.labels.get(s.node, {})))
            out = ctl.advance()
            self.incidents += out.incidents
            self.suggestions += out.suggestions
            if out:
                ev = Event(ev.t, ev.findings + out.findings, ev.summaries, out.incidents, out.suggestions)
            yield ev

    def run(self) -> ReplayResult:
        findings: list[Finding] = []
        for ev in self.events():
            findings += ev.findings
        return self.result(findings)

    def result(self, findings: list[Finding]) -> ReplayResult:
        res = self.replayer.result(findings)
        res.controller = True
        res.controller_evaluations = self.controller.ctl.stats.evaluations
        res.incidents = list(self.incidents)
        res.suggestions = list(self.suggestions)
        shown = {i.id for i in self.incidents}
        res.held = [i for i in self.controller.open_incidents() if i.id not in shown]
        st = self.controller.ctl.stats
        res.controller_status = {"incidents_withheld": st.incidents_withheld, "incidents_shown": st.incidents_shown,
                                 "findings_refused": len(self.controller.refused),
                                 "remaps_suppressed": st.remaps_suppressed}
        return res


def _labels(labels: Mapping[str, str]) -> dict[str, str]:
    """A node's recorded labels as its summaries carry them (without the cluster)."""
    return {k: v for k, v in labels.items() if k != "cluster"}


def replay_cluster(segments: Sequence[bundle.Segment], catalogue: Catalogue, *, controller: bool = True,
                   controller_config: str | Path | None = None, **replayer_args: object) -> ReplayResult:
    """Replay ``segments`` to a result, with the controller (default) or the agents alone."""
    rep = Replayer(segments, catalogue, **replayer_args)  # type: ignore[arg-type]
    if not controller:
        return rep.run()
    return ClusterReplay(rep, controller_config=str(controller_config) if controller_config else None).run()
