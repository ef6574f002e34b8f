"""The agent's own ``/metrics`` (Vector's component spec, prometheus_client conventions).

Values are read from the live objects at scrape time (a custom collector), so nothing on the
hot path updates metric objects. Bound to 127.0.0.1 unless configured otherwise.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from skewd import metrics

from .clock import ClockState
from .pipeline import Pipeline
from .rulestatus import RuleStatus
from .scheduler import CollectorSlot

log = logging.getLogger("skewd.agent.metrics")

#: publisher values that go down as well as up (everything else it reports is a count)
PUBLISHER_GAUGES = frozenset({"connected", "spool_depth", "spool_bytes",
                              "spool_in_memory", "spool_degraded"})  # held in memory now; 1 while the disk refuses


class MeteredAgent(Protocol):
    """What the endpoint reads of the live agent (:class:`skewd.agent.runner.Agent` is one): the
    agent serves its metrics, so this module names the reading it needs instead of importing it."""

    slots: list[CollectorSlot]
    pipeline: Pipeline | None
    publisher: Any
    clock: Callable[[], float]
    reloads_ok: int
    reloads_rejected: int

    def rule_status(self, now: float) -> RuleStatus: ...

    def clock_now(self, now: float) -> ClockState: ...


class AgentMetrics:
    """The prometheus_client custom collector over one :class:`MeteredAgent`; built by :func:`serve`."""

    def __init__(self, agent: MeteredAgent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Any]:
        a = self.agent
        up = GaugeMetricFamily("skewd_collector_up", "1 when the collector is active", labels=["collector", "state"])
        dur = GaugeMetricFamily("skewd_collector_duration_seconds", "duration of the last collection",
                                labels=["collector"])
        samples = CounterMetricFamily("skewd_collector_samples", "samples emitted", labels=["collector"])
        errs = CounterMetricFamily("skewd_collector_errors", "collection errors by stage", labels=["collector", "stage"])
        over = CounterMetricFamily("skewd_collector_overruns", "collections skipped: previous one still running",
                                   labels=["collector"])
        for s in a.slots:
            up.add_metric([s.name, s.status.availability.value], 1.0 if s.active else 0.0)
            if s.collector is None:
                continue
            st = s.collector.stats
            dur.add_metric([s.name], st.last_duration_s)
            samples.add_metric([s.name], st.samples_emitted)
            over.add_metric([s.name], s.overruns)
            # the usual stages exist from the start at 0, so rate() works before the first error
            for stage, n in sorted({"collect": 0, "timeout": 0, **st.errors}.items()):
                errs.add_metric([s.name, stage], n)
        yield from (up, dur, samples, errs, over)
        p = a.pipeline
        if p is not None:
            yield CounterMetricFamily("skewd_samples_ingested", "samples ingested by the window store",
                                      value=p.store.samples_ingested)
            yield CounterMetricFamily("skewd_samples_dropped_out_of_order", "samples older than their series' newest",
                                      value=p.store.dropped_out_of_order)
            yield CounterMetricFamily("skewd_rule_evaluations", "evaluation ticks", value=p.engine.evaluations)
            yield CounterMetricFamily("skewd_evaluation_tick_errors", "evaluation ticks that failed (logged)",
                                      value=getattr(a, "tick_errors", 0))
            # the same answer as health and --check (agent/rulestatus.py): the controller's rules are
            # neither active here nor inactive; clock_weakened overlaps the others
            st = a.rule_status(a.clock())
            rules = GaugeMetricFamily("skewd_rules", "rules by status: active/inactive on this node, "
                                      "controller (evaluated by the controller over node summaries), "
                                      "clock_weakened (this node's unsynced clock weakens them)", labels=["status"])
            rules.add_metric(["active"], len(st.active))
            rules.add_metric(["inactive"], len(st.inactive))
            rules.add_metric(["controller"], len(st.controller))
            rules.add_metric(["clock_weakened"], len(st.clock_weakened))
            yield rules
            clk = a.clock_now(a.clock())
            yield GaugeMetricFamily("skewd_clock_synced", "1 when the kernel reports the clock synchronised (adjtimex)",
                                    value=1.0 if clk.synced else 0.0)
            if clk.max_error_s is not None:
                yield GaugeMetricFamily("skewd_clock_max_error_seconds", "the kernel's clock error bound (adjtimex "
                                        "maxerror)", value=clk.max_error_s)
            f = CounterMetricFamily("skewd_findings", "finding transitions by state", labels=["state"])
            for state, n in sorted({"pending": 0, "firing": 0, "resolved": 0, **p.findings_total}.items()):
                f.add_metric([state], n)
            yield f
            alerts = GaugeMetricFamily("skewd_alerts", "current alerts by state", labels=["state"])
            counts: dict[str, int] = {}
            for st in p.engine.alerts():
                counts[st.state.value] = counts.get(st.state.value, 0) + 1
            for state in ("pending", "firing"):
                alerts.add_metric([state], counts.get(state, 0))
            yield alerts
        pub = a.publisher
        if pub is not None:
            # counts that only rise are counters (exposed with _total, so rate() applies); the
            # state values (connected, spool depth and bytes) are gauges
            for k, v in sorted(pub.metrics().items()):
                family = GaugeMetricFamily if k in PUBLISHER_GAUGES else CounterMetricFamily
                yield family(f"skewd_publisher_{k}", f"publisher {k.replace('_', ' ')}", value=float(v))
        yield _reloads(a)


def _reloads(a: MeteredAgent) -> CounterMetricFamily:
    c = CounterMetricFamily("skewd_rule_reloads", "rule reloads by result", labels=["result"])
    c.add_metric(["ok"], a.reloads_ok)
    c.add_metric(["rejected"], a.reloads_rejected)
    return c


def serve(agent: MeteredAgent, listen: str):
    """Start the endpoint (with ``process_*`` and ``skewd_build_info``); returns the server
    (call .shutdown()) or None when disabled."""
    return metrics.serve(metrics.registry("agent", AgentMetrics(agent)), listen, "agent")
