"""A scenario as the simulator runs it: cluster shape, load and the faults to place, validated.

:mod:`.scenario` reads scenario files into these (checking every fault against its injector);
the injectors (:mod:`.faults`) and the simulator take them. Kept apart from the file reader so
the injectors can name the spec they are placed from without importing the reader that
validates against them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from skewd.rules.yamlpos import Pos

DEFAULT_START = 1767225600.0  # 2026-01-01T00:00:00Z: fixed, so runs are reproducible


class ScenarioError(ValueError):
    """Every problem found in one scenario file, one ``file:line:col: message`` per line."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


Range = tuple[float, float]


@dataclass
class FaultSpec:
    pathology: str
    node: str  # node name or "any"
    entity: str  # entity name or "any"
    onset: Range
    duration: Range
    severity: Range
    variant: str
    params: dict[str, float]
    pos: Pos


@dataclass
class Scenario:
    name: str
    description: str
    shape: str
    duration: float
    cluster: dict[str, Any]
    load: dict[str, Any]
    faults: list[FaultSpec]
    start: float = DEFAULT_START
    pathology: str = ""  # what the scenario is about (defaults to its faults' IDs, or "healthy")
    path: str = ""

    @property
    def label(self) -> str:
        if self.pathology:
            return self.pathology
        ids = sorted({f.pathology for f in self.faults})
        return ",".join(ids) if ids else "healthy"
