"""Run a simulated cluster through skewd itself: one agent pipeline per node, the controller's
group evaluation over their summaries - no NATS, same code paths.

Per node this does what ``agent/runner.py`` does at each tick (ingest the collectors' batches,
evaluate node-scope rules at the tick time, every summary interval compute the summary with
:func:`skewd.agent.summary.make_summary` and feed it back into the node's own store); the
summaries then go to the controller's components exactly as ``Controller.ingest_summary`` and
``Controller.tick`` use them: topology from labels, the burst aligner's derived ``ctl_*``
signals, the group-scope rule engine, the correlator (incidents) and the planner (remap
suggestions). Node findings reach the correlator as they would through JetStream.

Clocks: summaries report the node's clock error bound (``clock_report="sim"``) - the agent
does not fill ``clock_sync.max_error_s`` yet, and without it the controller assumes 50 ms and no
millisecond straggler can be told apart (``clock_report="agent"`` shows that).

Collective bursts: the summary carries every collective burst start the node saw in the
interval (``collective_burst_starts``/``collective_burst_bytes``, the controller's contract),
taken from the simulator's RDMA timeline (``bursts="every"``), or only what the agent derives
today from ``pkt_burst_start_seconds`` samples (``bursts="agent"``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from skewd import wire
from skewd.agent import summary as summary_mod
from skewd.agent.pipeline import Pipeline
from skewd.model import GROUP_SCOPES, NODE_SCOPES, Catalogue, Finding, SampleBatch, State
from skewd.rules.engine import RuleSet

from .simulator import Simulation

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
        self.ctl = None
        if controller:
            self._make_controller(lookback, horizon)

    # -- the controller, offline -------------------------------------------------------------------
    def _make_controller(self, lookback: float, horizon: float) -> None:
        from skewd.controller.config import load_config
        from skewd.controller.service import Controller

        cfg = load_config(None, env={}, overrides={"cluster": self.cluster,
                                                   "evaluation_interval": f"{self.group_interval:g}s"})
        self.ctl = Controller(cfg, catalogue=self.cat, ruleset=self.ruleset)
        self.cfg = cfg
        self.planned: set[str] = set()

    def _ctl_tick(self, t: float, out: list[Finding], sugg: list[Suggestion]) -> list[Finding]:
        """What ``Controller.tick`` does at time ``t``, minus persistence and publishing."""
        import math as _m

        from skewd.controller.planner import suggestion_key

        c = self.ctl
        c.now = t
        if c.topology.version != c._labels_version or len(c.store.registry.node_labels) < len(c.aligner.clocks):
            for node in set(c.aligner.clocks) | {n for g in c.topology.tp_groups().values() for n in g.nodes}:
                c.store.registry.set_node_labels(node, c.topology.node_labels(node))
            c._labels_version = c.topology.version
        tp = {name: g.nodes for name, g in c.topology.tp_groups().items()}
        pp = {name: [c.topology.stage_members(s) for s in p.stages] for name, p in c.topology.pp_groups().items()}
        derived = c.aligner.derive(t, tp, pp)
        rows = [(t, node, "", sig, v) for node, vals in derived.items() for sig, v in vals.items()
                if v is not None and not _m.isnan(v)]
        if rows:
            c.store.ingest(SampleBatch.from_rows(rows))
        c.correlator.reports = c.aligner.reports
        found: list[Finding] = []
        if c.first_t is not None and t - c.first_t >= self.cfg.warmup:
            found = c.engine.evaluate(t)
            for f in found:
                c._enrich(f, t)
                c.correlator.observe(f)
        c.correlator.correlate(t)
        for inc in sorted(c.correlator.open_incidents(), key=lambda i: (i.opened_at, i.id)):
            if t - inc.opened_at < self.cfg.group_wait:
                continue
            key = suggestion_key(self.cfg.cluster, inc.id)
            if key in self.planned:
                continue
            self.planned.add(key)
            s = c.planner.plan(inc, t, self.cfg.controller_id)
            if s is None:
                continue
            d = s.to_dict()
            targets = sorted({a.get("target", {}).get("node", "") for a in d.get("actions", []) if isinstance(a, dict)}
                             - {""})
            sugg.append(Suggestion(t, inc.id, key, targets or [n for n in getattr(inc, "nodes", [])],
                                   [str(a.get("type", "")) for a in d.get("actions", []) if isinstance(a, dict)],
                                   str(d.get("summary", ""))))
        return found

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
                        for x in f:
                            self.ctl.correlator.observe(x)
            if t >= next_sum - 1e-9:
                next_sum += self.summary_interval
                for node, p in self.pipes.items():
                    self._summary(node, p, t, t - last_sum[node])
                    last_sum[node] = t
            if self.ctl is not None and t >= next_group - 1e-9:
                next_group += self.group_interval
                step_found += self._ctl_tick(t, step_found, res.suggestions)
                res.group_evaluations += 1
            res.findings += step_found
            if on_step is not None:
                on_step(t, step_found)
        if self.ctl is not None:
            res.incidents = list(self.ctl.correlator.open_incidents())
        return res

    def _summary(self, node: str, p: Pipeline, t: float, interval: float) -> None:
        # "sim": the node reports its time daemon's error bound (what clock_sync is for);
        # "agent": what today's agent sends (no bound: the controller assumes its worst case)
        err = self.sim.clock_error[node] if self.clock_report == "sim" else None
        msg = summary_mod.make_summary(p.store, node, self.cluster, t, interval, clock_error=err)
        vals = {k: v[""] for k, v in msg.signals.items() if "" in v}
        p.ingest(summary_mod.to_batch(node, t, vals))  # as the agent does: node rules read summaries
        if self.ctl is None:
            return
        if self.bursts == "every":
            bs = self.sim.collective_bursts(node, t - interval, t)
            msg.signals.pop("collective_burst_starts", None)
            if bs:
                msg.signals["collective_burst_starts"] = {str(k): s for k, (s, _) in enumerate(bs)}
                msg.signals["collective_burst_bytes"] = {str(k): b for k, (_, b) in enumerate(bs)}
        self.ctl.ingest_summary(msg, self.labels.get(node, {}))
