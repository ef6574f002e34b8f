"""pkt: per-flow packet timing (gaps, jitter, bursts, retransmissions) from a live
AF_PACKET/TPACKET_V3 capture or from pcap/pcapng files (``skewd pkt FILE``).

The collector (live capture: ring, BPF, sample batches) is imported on first use of
``COLLECTOR``: ``skewd pkt FILE`` needs only the file reader, parser and feature modules, and
the capture machinery's imports were a tenth of its run time on a 1 M-packet file.
"""
from __future__ import annotations

from typing import Any

__all__ = ["COLLECTOR", "PktCollector"]


def __getattr__(name: str) -> Any:
    if name in ("COLLECTOR", "PktCollector"):
        from .collector import PktCollector

        return PktCollector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
