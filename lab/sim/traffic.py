"""How faults bend a simulated interval's collective traffic: the effects injectors write in their
``on_traffic`` hook (:mod:`.faults`) and the simulator applies when it lays out RDMA bursts
(:mod:`.simulator`). Neutral values are a healthy interval.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RepTraffic:
    """Per replica and interval: how faults bend its collective traffic (neutral = healthy)."""

    delay: dict[int, float] = field(default_factory=dict)  # node → seconds its bursts start late
    delay_jitter: dict[int, float] = field(default_factory=dict)  # node → extra random lateness (s)
    bytes_mult: dict[int, float] = field(default_factory=dict)  # node → bytes of its share
    skip: dict[int, float] = field(default_factory=dict)  # node → share of steps it sends nothing
    stage_weight: dict[int, float] = field(default_factory=dict)  # pp stage → compute weight
    kv_mult: float = 1.0  # KV transfer size multiplier (disaggregated)
    kv_rate: dict[int, float] = field(default_factory=dict)  # node → share of link rate KV transfers get


@dataclass
class NodeTraffic:
    """Per node and interval: per-port effects on its RDMA flows."""

    stall: dict[int, float] = field(default_factory=dict)  # port → share of that port's flows stalled
    rate: dict[int, float] = field(default_factory=dict)  # port → share of line rate available
    rtx: dict[int, float] = field(default_factory=dict)  # port → retransmitted packets per second
    ecn: dict[int, float] = field(default_factory=dict)  # port → CE-marked packets per second
