"""pkt: per-flow packet timing (gaps, jitter, bursts, retransmissions) from a live
AF_PACKET/TPACKET_V3 capture or from pcap/pcapng files (``skewd pkt FILE``)."""
from .collector import PktCollector

COLLECTOR = PktCollector

__all__ = ["COLLECTOR", "PktCollector"]
