"""Node summaries: the compact per-interval features the controller's cross-node rules need.

Each summary signal is a node-scope reduction of a collector signal over the last interval
(e.g. the node's total PCIe host→device byte rate, its mean GPU utilisation, the start time of
its latest collective burst). The agent publishes them on ``skewd.v1.summary.<cluster>.<node>``
and the controller ingests them as ordinary node-scope samples, so group rules (``tp_group``,
``cluster`` scopes) run on the same engine. Summary signals are catalogued here, under the
``agent`` collector name, like every other signal.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from skewd.model import BatchBuilder, SampleBatch, signal
from skewd.rules import functions as F
from skewd.rules.store import WindowStore

from skewd import __version__


@dataclass(frozen=True)
class SummarySpec:
    name: str
    source: str  # collector signal it is computed from
    window: str  # "rate" (counter per-second over the interval), "last", "avg", "max", "min",
    # "rise" (largest step of the entities' sum between consecutive collections)
    reduce: str  # across the node's entities: "sum", "mean", "max", "min", "median"
    unit: str
    desc: str


#: What each node reports upwards. Signals a node does not have are simply absent.
SPECS: tuple[SummarySpec, ...] = (
    SummarySpec("summary_gpu_util_mean_ratio", "gpu_utilization_ratio", "avg", "mean", "ratio",
                "mean GPU utilisation over the node's GPUs"),
    SummarySpec("summary_gpu_util_min_ratio", "gpu_utilization_ratio", "avg", "min", "ratio",
                "lowest GPU utilisation on the node"),
    SummarySpec("summary_gpu_power_watts", "gpu_power_watts", "avg", "sum", "watts", "node GPU power draw"),
    SummarySpec("summary_gpu_throttled", "gpu_clocks_event_hw_slowdown", "max", "max", "bool",
                "1 when any GPU reports a hardware slowdown"),
    SummarySpec("summary_pcie_rx_bytes_per_second", "pcie_gpu_rx_bytes_per_second", "avg", "sum", "bytes/s",
                "host→device PCIe throughput, all GPUs"),
    SummarySpec("summary_rdma_xmit_bytes_per_second", "rdma_port_xmit_bytes_total", "rate", "sum", "bytes/s",
                "RDMA bytes sent per second, all ports"),
    SummarySpec("summary_rdma_rcv_bytes_per_second", "rdma_port_rcv_bytes_total", "rate", "sum", "bytes/s",
                "RDMA bytes received per second, all ports"),
    SummarySpec("summary_rdma_xmit_wait_per_second", "rdma_port_xmit_wait_total", "rate", "sum", "ticks/s",
                "RDMA transmit-wait ticks per second (credit starvation / congestion)"),
    SummarySpec("summary_rdma_ecn_marked_per_second", "rdma_port_np_ecn_marked_roce_packets_total", "rate", "sum",
                "packets/s", "ECN-marked RoCE packets received per second"),
    SummarySpec("summary_rdma_cnp_sent_per_second", "rdma_port_np_cnp_sent_total", "rate", "sum", "packets/s",
                "congestion notification packets sent per second"),
    SummarySpec("summary_rdma_retrans_per_second", "rdma_port_roce_adp_retrans_total", "rate", "sum", "packets/s",
                "RoCE adaptive retransmissions per second"),
    SummarySpec("summary_net_rx_bytes_per_second", "netdev_rx_bytes_total", "rate", "sum", "bytes/s",
                "NIC bytes received per second, all interfaces"),
    SummarySpec("summary_net_tx_bytes_per_second", "netdev_tx_bytes_total", "rate", "sum", "bytes/s",
                "NIC bytes sent per second, all interfaces"),
    SummarySpec("summary_kv_cache_usage_ratio", "vllm_kv_cache_usage_ratio", "last", "max", "ratio",
                "highest KV-cache usage of the node's engines"),
    SummarySpec("summary_requests_waiting", "vllm_requests_waiting", "last", "sum", "requests",
                "requests waiting in the node's engines"),
    SummarySpec("summary_requests_waiting_rise_max", "vllm_requests_waiting", "rise", "max", "requests",
                "largest rise of the node's waiting requests (all engines) from one vLLM collection to the "
                "next within the interval: a burst of arrivals lands in one collection (NS-1)"),
    SummarySpec("summary_requests_running", "vllm_requests_running", "last", "sum", "requests",
                "requests running in the node's engines (0 = not serving)"),
    SummarySpec("summary_cpu_busy_cores", "host_node_cpu_busy_seconds_total", "rate", "sum", "cores",
                "CPU cores busy (non-idle seconds per second)"),
    SummarySpec("summary_engine_phase", "vllm_phase", "last", "max", "enum",
                "engine phase: 0 idle, 1 decode-heavy, 2 prefill-heavy"),
    SummarySpec("summary_burst_start_seconds", "pkt_burst_start_seconds", "last", "max", "seconds",
                "start time of the node's latest collective burst (aggregate traffic of the capture port)"),
    SummarySpec("summary_burst_bytes", "pkt_burst_bytes", "last", "sum", "bytes",
                "bytes of the node's latest collective burst"),
    SummarySpec("summary_ingress_bytes_per_second", "pkt_ingress_bytes_per_second", "avg", "sum", "bytes/s",
                "received bytes per second on the capture ports (NS-2 peer comparison)"),
    SummarySpec("summary_ingress_gap_p99_seconds", "pkt_ingress_gap_p99_seconds", "max", "max", "seconds",
                "p99 gap between received packets (NS-2)"),
)

CATALOGUE = [signal(s.name, "gauge", s.unit, "node", s.desc, "agent") for s in SPECS]

_REDUCE: dict[str, Callable[[np.ndarray], float]] = {
    "sum": np.nansum, "mean": np.nanmean, "max": np.nanmax, "min": np.nanmin, "median": np.nanmedian,
}
_WINDOW = {"avg": F.avg, "max": F.wmax, "min": F.wmin, "last": F.last}


def _rise(W: np.ndarray) -> np.ndarray:
    """Largest rise of the entities' sum between consecutive columns (one value; NaN with fewer
    than two columns). Each step adds every entity's change between its two samples, so an
    entity missing at either end of a step adds nothing to it rather than its whole level."""
    if W.shape[1] < 2:
        return np.full(1, np.nan)
    D = W[:, 1:] - W[:, :-1]
    ok = ~np.isnan(D)
    if not ok.any():
        return np.full(1, np.nan)
    return np.array([float(np.where(ok, D, 0.0).sum(axis=0)[ok.any(axis=0)].max())])


def compute(store: WindowStore, node: str, t: float, interval: float, lookback: float = 60.0) -> dict[str, float]:
    """Summary values for ``node`` at ``t`` from what the store holds (missing sources omitted)."""
    out: dict[str, float] = {}
    for spec in SPECS:
        blk = store.blocks.get(spec.source, {}).get(node)
        if blk is None or spec.source not in store.catalogue:
            continue
        if spec.window == "rise":
            # the interval's steps, and the one into it from the collection before it
            tt, W = blk.window(t - interval - max(interval, 2.0), t)
            first = np.searchsorted(tt, t - interval, side="right")
            vals = _rise(W[:, max(int(first) - 1, 0):])
        elif spec.window == "rate":
            # two samples at least: look back further than one interval when collectors are slower
            tt, W = blk.window(t - max(interval * 2, 2.0), t)
            vals = F.rate(tt, W, store.catalogue[spec.source].wrap_bits)
        else:
            win = interval if spec.window != "last" else lookback
            tt, W = blk.window(t - win, t)
            vals = _WINDOW[spec.window](tt, W)
        vals = vals[~np.isnan(vals)]
        if len(vals):
            out[spec.name] = float(_REDUCE[spec.reduce](vals))
    return out


def burst_starts(store: WindowStore, node: str, t: float, interval: float) -> list[float]:
    """Every collective-burst start of the interval, in time order: the controller aligns these
    across TP peers step by step (EW-1). The pkt collector lists each burst once, when it ends
    (``pkt_burst_ended_*``); :func:`skewd.agent.bursts.collective_bursts` picks the
    collective port's and the bursts the interval's collections listed."""
    from .bursts import collective_bursts

    return collective_bursts(store, node, t, interval)[0].tolist()


def to_batch(node: str, t: float, values: dict[str, float]) -> SampleBatch:
    b = BatchBuilder(node)
    for name, v in values.items():
        b.add(t, "", name, v)
    return b.build()


def make_summary(store: WindowStore, node: str, cluster: str, t: float, interval: float,
                 clock_synced: bool = True, clock_error: float | None = None,
                 labels: dict[str, str] | None = None):
    """The wire message for one interval (signals keyed by entity ``""``)."""
    from skewd import wire

    from .bursts import collective_bursts

    values = compute(store, node, t, interval)
    signals: dict[str, dict[str, float | None]] = {k: {"": v} for k, v in values.items()}
    starts, nbytes = collective_bursts(store, node, t, interval)
    if len(starts):
        signals["collective_burst_starts"] = {str(k): v for k, v in enumerate(starts.tolist())}
        signals["collective_burst_bytes"] = {str(k): (None if v != v else v) for k, v in enumerate(nbytes.tolist())}
    return wire.Summary(node=node, cluster=cluster, t=t, interval=interval, signals=signals,
                        clock_sync=wire.ClockSync(synced=clock_synced, max_error_s=clock_error),
                        agent_version=__version__, labels=dict(labels or {}))

