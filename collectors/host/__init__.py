"""host: per-CPU and node CPU time, NET_RX/NET_TX softirqs, TCP/UDP counters, load (/proc)."""
from .collector import HostCollector

COLLECTOR = HostCollector

__all__ = ["COLLECTOR", "HostCollector"]
