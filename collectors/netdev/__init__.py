"""netdev: per-interface link counters and root-qdisc stats (rtnetlink), speed and state."""
from .collector import NetdevCollector

COLLECTOR = NetdevCollector

__all__ = ["COLLECTOR", "NetdevCollector"]
