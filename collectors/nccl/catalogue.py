"""Signals of the ``nccl`` collector. Scope ``rank``; entity ``<comm_id>/r<rank>`` (the
communicator hash the NCCL Inspector prints, e.g. ``0x7f8c496ae9f661/r2``). The peers of a rank
entity are the ranks of the same communicator on the same node (docs/data-model.md).

Every value is reduced over one collection interval from the Inspector's records of that
interval; a collective is compared across ranks by (communicator, ``coll_sn``) over the ranks of
this node that reported it (``reduce.py``)."""
from __future__ import annotations

from skewd.model import SignalSpec, signal


def _r(name: str, kind: str, unit: str, desc: str) -> SignalSpec:
    return signal(name, kind, unit, "rank", desc, "nccl")


CATALOGUE: list[SignalSpec] = [
    _r("nccl_collectives_total", "counter", "collectives",
       "The rank's latest collective sequence number (coll_sn) on this communicator: its rate is "
       "the collectives issued per second, exact even where the Inspector writes only samples. "
       "Emitted while the rank reported within the last 2 minutes."),
    _r("nccl_matched_collectives_total", "counter", "collectives",
       "Collectives of this rank that at least one other rank of its communicator on this node "
       "also reported (same coll_sn): the evidence behind the wait and start-lag signals."),
    _r("nccl_collective_exec_p50_seconds", "gauge", "seconds",
       "Median coll_exec_time_us of the rank's collectives reported in the interval (GPU kernel "
       "time when coll_timing_source is kernel_gpu). A rank others wait for has the shortest."),
    _r("nccl_message_size_p50_bytes", "gauge", "bytes",
       "Median coll_msg_size_bytes of the rank's collectives in the interval (Prometheus mode: "
       "from the message_size label, rounded to two decimals of its unit)."),
    _r("nccl_bus_bandwidth_p50_bytes_per_second", "gauge", "bytes_per_second",
       "Median coll_busbw_gbs x 1e9 of the rank's collectives in the interval (NCCL's bus "
       "bandwidth: algorithm bandwidth scaled by the collective's traffic factor)."),
    _r("nccl_collective_wait_p50_seconds", "gauge", "seconds",
       "Median, over the interval's matched collectives, of this rank's execution time minus the "
       "shortest execution time of the same collective among this node's ranks of the "
       "communicator (same timing source): how long it waited inside the collective for a later "
       "rank. Durations only, no clocks. The rank everyone waits for reads about 0."),
    _r("nccl_collective_least_wait_ratio", "gauge", "ratio",
       "Share of the interval's matched collectives in which this rank had the shortest "
       "execution time of the node's ranks (ties count for each): near 1 on a straggler."),
    _r("nccl_kernel_start_lag_p50_seconds", "gauge", "seconds",
       "Median, over the interval's matched collectives, of this rank's first kernel start minus "
       "the earliest first kernel start of the same collective among this node's ranks "
       "(event_trace_ts, one host clock). Needs NCCL_INSPECTOR_DUMP_VERBOSE=1."),
    _r("nccl_kernel_start_last_ratio", "gauge", "ratio",
       "Share of the interval's matched collectives in which this rank's kernel started last of "
       "the node's ranks (ties count for each). Needs NCCL_INSPECTOR_DUMP_VERBOSE=1."),
]
