"""Run a simulated cluster through skewd itself: one agent pipeline per node, the controller's
group evaluation over their summaries - no NATS, same code paths.

Per node this does what ``agent/runner.py`` does at each tick (ingest the collectors' batches,
evaluate node-scope rules at the tick time, every summary interval compute the summary with
:func:`skewd.agent.summary.make_summary` and feed it back into the node's own store); the
summaries go to the controller service itself, run in-process by
:class:`skewd.controller.offline.OfflineController` (its summary intake, then ``Controller.tick``
at every group interval: topology from labels, the burst aligner's ``ctl_*`` signals, the
group-scope rule engine, the correlator and the planner), with its NATS and KV sinks in memory -
the same offline controller cluster replay runs. Node findings reach it through its findings
consumer's handler, encoded and decoded as they travel through JetStream.

Clocks: summaries report the node's clock error bound (``clock_report="sim"``), as the agent
does from the kernel (``adjtimex`` maxerror, kept by chrony/ntpd: ``agent/clock.py``);
``clock_report="none"`` sends no bound, as from a node whose time daemon keeps none: the
controller then assumes ``unsynced_clock_error`` (50 ms) and no millisecond straggler can be
told from clock error.

Collective steps: the summary carries the node's step timing on its own clock
(``summary_collective_*``) and the step entries for cross-node alignment
(``collective_burst_starts``/``collective_burst_bytes``, the controller's contract), both from the
silences its pkt collector listed (agent/steps.py; the simulator lists them as collectors/pkt
does, lab/sim/steps.py) - ``bursts="agent"``; or, for alignment, the simulator's true step
starts from its RDMA timeline (``bursts="every"``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from skewd.agent import steps as steps_mod
from skewd.agent import summary as summary_mod
from skewd.controller.offline import CaptureJetStream, MemoryState, OfflineController, offline_config
from skewd.agent.pipeline import Pipeline
from skewd.model import NODE_SCOPES, Catalogue, Finding
from skewd.rules.engine import RuleSet

from .sim.simulator import Simulation

#: collectors a simulated node runs (the exporter only where the cluster has DPUs)
SIM_COLLECTORS = ("gpu", "pcie", "netdev", "rdma", "host", "vllm", "pkt")


@dataclass
class Suggestion:
    t: float
    incident: str
    key: str
    nodes: list[str]
    actions: list[str]
    summary: str


@dataclass
class HarnessResult:
    findings: list[Finding]  # every transition, node and controller, in time order
    suggestions: list[Suggestion]
    incidents: list = field(default_factory=list)
    #: every incident the controller published during the run, as first published (what a
    #: subscriber to skew events was shown: incidents held ``correlation.group_wait`` and then
    #: resolved or taken over by their cause's incident were never shown and are not here), in
    #: publication order
    opened: list[dict] = field(default_factory=list)
    node_evaluations: int = 0
    group_evaluations: int = 0
    samples: int = 0


def needed_signals(ruleset: RuleSet) -> set[str]:
    """Signals any rule or the node summary reads: the rest never influences a finding."""
    out: set[str] = set()
    for r in ruleset.rules:
        out |= set(r.compiled.signals)
    out |= {s.source for s in summary_mod.SPECS}
    out.add("pkt_burst_start_seconds")
    # what the summary's collective steps are made of (agent/steps.py)
    out |= {steps_mod.SILENCE, steps_mod.BY_SEND, steps_mod.SENT}
    # what the summary's engine-queue steps and arrival rate read (NS-1), whether a rule does or not
    out |= set(summary_mod.ENGINE_INPUTS)
    return out


def node_available(catalogue: Catalogue, sim: Simulation, node: str) -> set[str]:
    """What this node's agent would declare available: the catalogued signals of the collectors
    it runs (no rdma collector without RDMA ports, the exporter only with a DPU), plus its own
    summary signals."""
    n = sim.cluster.node(node)
    cols = set(SIM_COLLECTORS)
    if not n.rdma_ports:
        cols.discard("rdma")
    own = {s.name for s in catalogue.values() if s.collector in cols or s.collector == "agent"}
    if sim.cluster.dpu:
        own |= set(DPU_SIGNALS)
    return own


DPU_SIGNALS = ("dpu_pcie_inbound_bytes_per_second", "dpu_pcie_inbound_tlps_per_second")


class Harness:
    """Owns one agent :class:`Pipeline` per simulated node and the :class:`OfflineController`;
    called by the detection benchmark and the lab's tests: :meth:`run` plays the simulation to
    its end and returns every transition, incident and suggestion (:class:`HarnessResult`)."""

    def __init__(self, sim: Simulation, ruleset: RuleSet, catalogue: Catalogue, *, eval_interval: float = 1.0,
                 summary_interval: float = 1.0, group_interval: float = 1.0, lookback: float = 60.0,
                 horizon: float = 600.0, bursts: str = "every", filter_signals: bool = True,
                 controller: bool = True, clock_report: str = "sim") -> None:
        self.sim = sim
        self.ruleset = ruleset
        self.cat = catalogue
        self.eval_interval = eval_interval
        self.summary_interval = summary_interval
        self.group_interval = group_interval
        self.bursts = bursts
        self.clock_report = clock_report
        self.cluster = sim.cluster.name
        self.keep = needed_signals(ruleset) if filter_signals else None
        if self.keep is not None and sim.only is None:
            sim.only = frozenset(self.keep)
        self.labels = sim.node_labels()
        self.pipes: dict[str, Pipeline] = {}
        for n in sim.node_names:
            p = Pipeline(catalogue, ruleset, node=n, cluster=self.cluster, labels=self.labels[n],
                         lookback=lookback, horizon=horizon)
            p.engine.scopes = set(NODE_SCOPES)
            p.engine.set_available_signals(node_available(catalogue, sim, n))
            self.pipes[n] = p
        self.ctl: OfflineController | None = None
        self._opened_ids: set[str] = set()
        if controller:
            self._make_controller(lookback, horizon)

    # -- the controller, offline -------------------------------------------------------------------
    def _make_controller(self, lookback: float, horizon: float) -> None:
        """The controller service itself on simulated time (:class:`OfflineController`: its KV
        and JetStream in memory); its own intake, ``tick`` and housekeeping run unchanged."""
        cfg = offline_config(self.cluster, overrides={"controller_id": "sim",
                                                      "evaluation_interval": f"{self.group_interval:g}s"})
        self.ctl = OfflineController(cfg, catalogue=self.cat, ruleset=self.ruleset)
        self.cfg = cfg

    def _ctl_tick(self, t: float, sugg: list[Suggestion], res: HarnessResult) -> list[Finding]:
        """``Controller.tick(t)``; returns the controller's own transitions."""
        out = self.ctl.tick(t)
        for s in out.suggestions:
            nodes = sorted({a.target.node for a in s.actions} - {""})
            cul = s.culprit.node if s.culprit is not None else ""
            if cul and cul not in nodes:
                nodes.insert(0, cul)
            sugg.append(Suggestion(t, s.incident, s.key, nodes, [a.type.value for a in s.actions], s.summary))
        self._log_opened(res, out.incidents, t)
        return out.findings

    # -- the run ----------------------------------------------------------------------------------
    def run(self, on_step: Callable[[float, list[Finding]], None] | None = None) -> HarnessResult:
        sim = self.sim
        res = HarnessResult([], [])
        next_eval = sim.start + self.eval_interval
        next_sum = sim.start + self.summary_interval
        next_group = sim.start + self.group_interval
        last_sum = {n: sim.start for n in sim.node_names}
        while sim.t + 1.0 <= sim.end + 1e-9:
            batch = sim.step()
            t = sim.t  # the interval's end: every collector has reported by now
            for _, node, b in batch:
                if self.keep is not None and sim.only != self.keep:
                    b = b.select(np.fromiter((s in self.keep for s in b.signal), bool, len(b)))
                res.samples += len(b)
                self.pipes[node].ingest(b)
            step_found: list[Finding] = []
            if t >= next_eval - 1e-9:
                next_eval += self.eval_interval
                for node, p in self.pipes.items():
                    f = p.evaluate(t)
                    res.node_evaluations += 1
                    step_found += f
                    if self.ctl is not None:
                        for x in f:  # through the controller's findings consumer, as published
                            self.ctl.finding(x)
            if t >= next_sum - 1e-9:
                next_sum += self.summary_interval
                for node, p in self.pipes.items():
                    self._summary(node, p, t, t - last_sum[node])
                    last_sum[node] = t
            if self.ctl is not None and t >= next_group - 1e-9:
                next_group += self.group_interval
                step_found += self._ctl_tick(t, res.suggestions, res)
                res.group_evaluations += 1
            res.findings += step_found
            if on_step is not None:
                on_step(t, step_found)
        if self.ctl is not None:
            res.incidents = self.ctl.open_incidents()
        return res

    def _log_opened(self, res: HarnessResult, published: list, t: float) -> None:
        """The incidents published on the incident subject at this tick, each counted at its
        first publication."""
        seen = self._opened_ids
        for inc in published:
            if inc.id in seen or inc.state != "open":
                continue
            seen.add(inc.id)
            nodes = [inc.culprit.node] if inc.culprit is not None and inc.culprit.node else list(inc.victims)
            res.opened.append({"id": inc.id, "pathology": inc.pathology, "rule": inc.rule_id, "nodes": nodes,
                               "entity": inc.culprit.entity if inc.culprit is not None else "",
                               "opened_at": inc.opened_at, "published_at": t, "findings": len(inc.findings)})

    def _summary(self, node: str, p: Pipeline, t: float, interval: float) -> None:
        # "sim": the node reports its time daemon's error bound (the agent reads it with adjtimex);
        # "none": no bound (the controller assumes its worst case)
        err = self.sim.clock_error[node] if self.clock_report == "sim" else None
        synced = self.sim.cluster.clock != "none"  # an undisciplined clock: the kernel says unsynchronised
        msg = summary_mod.make_summary(p.store, node, self.cluster, t, interval, clock_synced=synced,
                                       clock_error=err)
        vals = {k: v[""] for k, v in msg.signals.items() if "" in v}
        p.ingest(summary_mod.to_batch(node, t, vals))  # as the agent does: node rules read summaries
        if self.ctl is None:
            return
        if self.bursts == "every":
            bs = self.sim.collective_bursts(node, t - interval, t)
            msg.signals.pop("collective_burst_starts", None)
            msg.signals.pop("collective_burst_bytes", None)
            if bs:
                msg.signals["collective_burst_starts"] = {str(k): s for k, (s, _) in enumerate(bs)}
                msg.signals["collective_burst_bytes"] = {str(k): b for k, (_, b) in enumerate(bs)}
        self.ctl.summary(msg, self.labels.get(node, {}))


#: the controller's in-memory sinks live with the offline controller; named here for the tests
#: and benchmarks that plugged them into a Controller through this module
__all__ = ["CaptureJetStream", "DPU_SIGNALS", "Harness", "HarnessResult", "MemoryState", "SIM_COLLECTORS",
           "Suggestion", "needed_signals", "node_available"]
