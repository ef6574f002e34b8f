"""rdma: RDMA port counters, mlx5 hw_counters, state and rate (sysfs /class/infiniband)."""
from .collector import RdmaCollector

COLLECTOR = RdmaCollector

__all__ = ["COLLECTOR", "RdmaCollector"]
