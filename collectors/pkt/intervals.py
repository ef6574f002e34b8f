"""What the feature path produces: one interval's flow rows and port aggregates.

:class:`IntervalFeatures` is the hand-off between the tracker (:mod:`.tracker`, which builds
it) and its readers (:mod:`.samples` turns it into signals, :mod:`.cli` into JSON lines), so
the result types and the column list sit apart from how they are computed: a reader imports
these without the tracker's machinery.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .collective import Silences

#: nanoseconds per second (packet timestamps are int64 ns)
NS = 1_000_000_000


@dataclass
class PortFeatures:
    """Aggregates of one capture port over one interval (NaN = not measurable)."""

    name: str
    packets_total: int = 0
    bytes_total: int = 0
    other_total: int = 0
    tcp_retransmits_total: int = 0
    kernel_drops_total: int | None = None
    flows: int = 0
    share_max: float = math.nan
    gini: float = math.nan
    ingress_pps: float = math.nan
    ingress_bps: float = math.nan
    ingress_gap_p99: float = math.nan
    ingress_gap_max: float = math.nan
    bursts_total: int = 0
    burst_start: float = math.nan
    burst_bytes: float = math.nan
    inter_burst_gap: float = math.nan
    end_spread: float = math.nan
    #: silences of the port's collective traffic that ended in the interval (collective.py)
    silences: Silences = field(default_factory=Silences)


@dataclass
class IntervalFeatures:
    """Features of one interval: ``flows`` maps column name → array (one row per flow)."""

    t0: float
    t1: float
    entities: list[str]
    flows: dict[str, np.ndarray]
    ports: list[PortFeatures] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.t1 - self.t0

    def flow(self, entity: str) -> dict[str, float]:
        i = self.entities.index(entity)
        return {k: v[i].item() for k, v in self.flows.items()}


#: the flow columns of :attr:`IntervalFeatures.flows`, in the order :meth:`FlowTracker.update` builds them
FLOW_COLUMNS = ("packets", "bytes", "packets_per_second", "bytes_per_second", "gap_p50_seconds",
                "gap_p99_seconds", "gap_max_seconds", "gap_p05_seconds", "jitter_cov", "bursts",
                "burst_bytes_max", "bursts_total", "burst_start_seconds", "burst_bytes",
                "burst_duration_seconds", "inter_burst_gap_seconds", "packets_total", "bytes_total",
                "tcp_retransmits_total", "tcp_retransmits", "tcp_spurious_retransmits_total",
                "tcp_spurious_retransmits", "roce_retransmits_total", "ecn_ce_packets_total",
                "start_seconds", "end_seconds", "idle_seconds", "closed", "egress", "bytes_share_ratio")
