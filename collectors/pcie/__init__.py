"""pcie collector: sysfs PCIe link state + AER per PCI device, NVML PCIe throughput/replays per GPU."""
from .collector import PcieCollector

COLLECTOR = PcieCollector

__all__ = ["COLLECTOR", "PcieCollector"]
