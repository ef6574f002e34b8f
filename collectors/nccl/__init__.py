"""nccl collector: per-rank collective timing from the NCCL Inspector profiler plugin
(JSON dump files or its Prometheus textfiles)."""
from .collector import NcclCollector

COLLECTOR = NcclCollector

__all__ = ["COLLECTOR", "NcclCollector"]
