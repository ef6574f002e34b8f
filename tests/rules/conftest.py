"""A small fixed catalogue so rule-language tests do not depend on the shipped collectors."""
from __future__ import annotations

from pathlib import Path

import pytest

from skewd.model import Catalogue, signal

DATA = Path(__file__).parent / "data"


def make_catalogue() -> Catalogue:
    return Catalogue([
        signal("gpu_util_ratio", "gauge", "ratio", "gpu", "SM utilisation", "gpu"),
        signal("gpu_power_watts", "gauge", "watts", "gpu", "power draw", "gpu"),
        signal("pcie_rx_bytes_total", "counter", "bytes", "gpu", "host to device bytes", "pcie"),
        signal("rdma_port_xmit_bytes_total", "counter", "bytes", "rdma_port", "bytes sent", "rdma", wrap_bits=32),
        signal("netdev_qdisc_backlog_bytes", "gauge", "bytes", "nic_port", "qdisc backlog", "netdev"),
        signal("vllm_kv_cache_usage_ratio", "gauge", "ratio", "engine", "KV cache usage", "vllm"),
        signal("vllm_num_requests_waiting", "gauge", "requests", "engine", "waiting queue", "vllm"),
        signal("host_tcp_retrans_segs_total", "counter", "segments", "node", "TCP retransmits", "host"),
        signal("summary_burst_start_seconds", "gauge", "seconds", "node", "collective burst start", "agent"),
    ])


@pytest.fixture
def cat() -> Catalogue:
    return make_catalogue()
