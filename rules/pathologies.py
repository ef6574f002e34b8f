"""The pathology catalogue: stable IDs every shipped rule maps to (from the runbooks in
docs/pathologies.md). ``skewd rules coverage`` checks that each has a rule."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pathology:
    id: str
    title: str
    runbook: str


PATHOLOGIES: dict[str, Pathology] = {p.id: p for p in (
    Pathology("NS-1", "Burst admission backlog", "north-south"),
    Pathology("NS-2", "Ingress starvation", "north-south"),
    Pathology("NS-3", "Flow skew across sessions", "north-south"),
    Pathology("NS-4", "Ingress drop / retransmit", "north-south"),
    Pathology("NS-5", "Egress backlog", "north-south"),
    Pathology("NS-6", "Egress jitter", "north-south"),
    Pathology("NS-7", "Egress drop / retransmit", "north-south"),
    Pathology("NS-8", "Early completion skew", "north-south"),
    Pathology("NS-9", "Link bandwidth saturation", "north-south"),
    Pathology("PCIE-1", "H2D starvation", "pcie"),
    Pathology("PCIE-2", "D2H return bottleneck", "pcie"),
    Pathology("PCIE-3", "Launch / control latency", "pcie"),
    Pathology("PCIE-4", "Intra-node GPU skew", "pcie"),
    Pathology("PCIE-5", "PCIe link saturation", "pcie"),
    Pathology("PCIE-6", "P2P throttling over PCIe", "pcie"),
    Pathology("PCIE-7", "Pinned-memory shortage", "pcie"),
    Pathology("PCIE-8", "Host CPU bottleneck", "pcie"),
    Pathology("PCIE-9", "Registration churn", "pcie"),
    Pathology("PCIE-10", "Decode early-stop skew", "pcie"),
    Pathology("EW-1", "TP straggler", "east-west"),
    Pathology("EW-2", "PP bubble", "east-west"),
    Pathology("EW-3", "Cross-node load skew", "east-west"),
    Pathology("EW-4", "Fabric congestion", "east-west"),
    Pathology("EW-5", "Head-of-line blocking", "east-west"),
    Pathology("EW-6", "Loss / retransmit storm", "east-west"),
    Pathology("EW-7", "Credit starvation", "east-west"),
    Pathology("EW-8", "KV-transfer bottleneck", "east-west"),
    Pathology("EW-9", "Early-stop skew across nodes", "east-west"),
    Pathology("GPU-1", "Squatter (zero-dollar yield)", "gpu-engine"),
    Pathology("GPU-2", "KV saturation / queue instability onset", "gpu-engine"),
    Pathology("GPU-3", "Engine stall", "gpu-engine"),
    Pathology("GPU-4", "Preemption storm", "gpu-engine"),
    Pathology("GPU-5", "Throttle skew", "gpu-engine"),
    Pathology("GPU-6", "Hardware fault signs", "gpu-engine"),
    Pathology("GPU-7", "Resource imbalance", "gpu-engine"),
    Pathology("GPU-8", "Throughput erosion", "gpu-engine"),
)}
