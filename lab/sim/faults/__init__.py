"""Fault injectors: one per pathology ID of docs/pathologies.md, each with its ground truth.

Every injector models its pathology the way the runbooks describe it (red flag, likely causes)
with natural variability: each declares *variants* (the causes the runbook lists), a natural
*severity* range (mild cases included: a mild case is part of reality, and it may be missed),
and draws timing, magnitude, culprit and variant from the run's seed. Injectors act at three
points of an interval: on the engine (request rate, step time, stall), on the RDMA traffic
(late, resized, missing or slowed bursts), and on the node's true state (GPU, PCIe, NIC, host).
They never look at rules: what a rule needs is not what an injector does.

``detectable`` on the ground truth says when a pathology's defining signal is not catalogued by
any collector (it is then still injected through its side effects, and reported as such).
"""
from __future__ import annotations

import numpy as np

from ..spec import Scenario
from ..topology import Cluster
from .base import Injector
from .eastwest import EW1, EW2, EW3, EW4, EW5, EW6, EW7, EW8, EW9
from .gpu import GPU1, GPU2, GPU3, GPU4, GPU5, GPU6, GPU7, GPU8
from .network import NS1, NS2, NS3, NS4, NS5, NS6, NS7, NS8, NS9
from .pcie import PCIE1, PCIE2, PCIE3, PCIE4, PCIE5, PCIE6, PCIE7, PCIE8, PCIE9, PCIE10

__all__ = ["INJECTORS", "Injector", "make_injectors"]


INJECTORS: dict[str, type[Injector]] = {cls.id: cls for cls in (
    NS1, NS2, NS3, NS4, NS5, NS6, NS7, NS8, NS9,
    PCIE1, PCIE2, PCIE3, PCIE4, PCIE5, PCIE6, PCIE7, PCIE8, PCIE9, PCIE10,
    EW1, EW2, EW3, EW4, EW5, EW6, EW7, EW8, EW9,
    GPU1, GPU2, GPU3, GPU4, GPU5, GPU6, GPU7, GPU8,
)}


def make_injectors(scenario: Scenario, c: Cluster, rng: np.random.Generator, start: float) -> list[Injector]:
    return [INJECTORS[f.pathology](f, c, rng, start) for f in scenario.faults]
