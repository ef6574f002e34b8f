"""gpu collector: NVML utilisation, memory, power, clocks and their event reasons, NVLink, XID."""
from .collector import GpuCollector

COLLECTOR = GpuCollector

__all__ = ["COLLECTOR", "GpuCollector"]
