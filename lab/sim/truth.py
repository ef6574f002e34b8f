"""What a simulation injected: the answer key the detection benchmark scores findings against.

Each fault injector (:mod:`.faults`) records one :class:`GroundTruth` when it is placed; the
simulation lists them (``Simulation.truth``), a fault-lab bundle keeps them in its metadata
(``fault_lab.truth``), and nothing the agents or the controller run ever reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GroundTruth:
    """What was injected: the answer key the benchmark scores findings against."""

    pathology: str
    nodes: list[str]  # culprit node(s)
    entity: str  # culprit entity on those nodes ("" = the node itself)
    onset: float  # epoch seconds
    end: float
    severity: float  # 0..1 as drawn
    variant: str
    params: dict[str, float] = field(default_factory=dict)
    detectable: str = ""  # non-empty: why no catalogued signal can show it on this host type

    def to_dict(self) -> dict:
        return {"pathology": self.pathology, "nodes": self.nodes, "entity": self.entity, "onset": self.onset,
                "end": self.end, "severity": round(self.severity, 4), "variant": self.variant,
                "params": self.params, "detectable": self.detectable}
