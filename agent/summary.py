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

from . import steps as steps_mod
from .engines import engine_values


@dataclass(frozen=True)
class SummarySpec:
    name: str
    source: str  # collector signal it is computed from
    window: str  # "rate" (counter per-second over the interval), "last", "avg", "max", "min",
    # "queued" / "arrivals" (the engines' queue steps and arrival rate from the vLLM gauges and
    # counters together, see _queued and _arrivals; ``source`` is one of ENGINE_INPUTS)
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
    SummarySpec("summary_requests_queued_step_max", "vllm_requests_waiting", "queued", "sum", "requests",
                "largest number of requests that joined the node's engine queues from one vLLM collection to "
                "the next within the interval: per engine the smaller of the waiting queue's rise and the rise "
                "of waiting + running (a move between the two queues or a preemption is no arrival, a request "
                "admitted at once did not queue); a step out of a stretch in which an engine with running "
                "requests made no progress (its front end's stats frozen) counts as spread over that stretch. "
                "A burst of arrivals lands in one collection (NS-1)"),
    SummarySpec("summary_requests_arrived_per_second", "vllm_request_success_total", "arrivals", "sum",
                "requests/s", "requests that reached the node's engines per second over the interval: the "
                "rise of waiting + running plus the requests finished (the usual arrivals NS-1's step is "
                "measured against)"),
    SummarySpec("summary_requests_running", "vllm_requests_running", "last", "sum", "requests",
                "requests running in the node's engines (0 = not serving)"),
    SummarySpec("summary_cpu_busy_cores", "host_node_cpu_busy_seconds_total", "rate", "sum", "cores",
                "CPU cores busy (non-idle seconds per second)"),
    SummarySpec("summary_engine_phase", "vllm_phase", "last", "max", "enum",
                "engine phase: 0 idle, 1 decode-heavy, 2 prefill-heavy"),
    SummarySpec("summary_engine_steps_per_second", "vllm_iterations_total", "rate", "sum", "steps/s",
                "engine steps per second, the node's engines summed (a slow launch path steps less often: "
                "PCIE-3)"),
    SummarySpec("summary_burst_start_seconds", "pkt_burst_start_seconds", "last", "max", "seconds",
                "start time of the node's latest collective burst (aggregate traffic of the capture port)"),
    SummarySpec("summary_burst_bytes", "pkt_burst_bytes", "last", "sum", "bytes",
                "bytes of the node's latest collective burst"),
    SummarySpec("summary_ingress_bytes_per_second", "pkt_ingress_bytes_per_second", "avg", "sum", "bytes/s",
                "received bytes per second on the capture ports (NS-2 peer comparison)"),
    SummarySpec("summary_ingress_gap_p99_seconds", "pkt_ingress_gap_p99_seconds", "max", "max", "seconds",
                "p99 gap between received packets (NS-2)"),
)

CATALOGUE = [signal(s.name, "gauge", s.unit, "node", s.desc, "agent") for s in SPECS] + [
    signal(name, "gauge", unit, "node", desc, "agent") for name, (unit, desc) in steps_mod.SUMMARY_SIGNALS.items()]

_REDUCE: dict[str, Callable[[np.ndarray], float]] = {
    "sum": np.nansum, "mean": np.nanmean, "max": np.nanmax, "min": np.nanmin, "median": np.nanmedian,
}
_WINDOW = {"avg": F.avg, "max": F.wmax, "min": F.wmin, "last": F.last}


#: what the engine-queue summaries read, per engine (entity) of the node's vLLM collections
ENGINE_INPUTS = ("vllm_requests_waiting", "vllm_requests_running", "vllm_request_success_total",
                 "vllm_generation_tokens_total", "vllm_prompt_tokens_total")


def _engine_window(store: WindowStore, node: str, start: float, end: float):
    """The node's vLLM collections in (start, end]: their times and, per ENGINE_INPUTS signal, an
    [engine x collection] matrix on the waiting queue's rows and columns (NaN where that signal
    lacks the engine or the collection). None without a waiting queue."""
    wblk = store.blocks.get(ENGINE_INPUTS[0], {}).get(node)
    if wblk is None:
        return None
    tt, W = wblk.window(start, end)
    ents = sorted(wblk.rows, key=wblk.rows.__getitem__)
    out = {ENGINE_INPUTS[0]: W}
    for name in ENGINE_INPUTS[1:]:
        M = np.full(W.shape, np.nan)
        blk = store.blocks.get(name, {}).get(node)
        if blk is not None and len(tt):
            t2, V = blk.window(start - 0.5, end)
            if len(t2):
                # the same collection: a sample within a quarter second of the waiting queue's
                j = np.minimum(np.searchsorted(t2, tt - 0.25), len(t2) - 1)
                ok = np.abs(t2[j] - tt) <= 0.25
                for i, e in enumerate(ents):
                    r = blk.rows.get(e)
                    if r is not None:
                        M[i, ok] = V[r, j[ok]]
        out[name] = M
    return tt, out


def _queued(tt: np.ndarray, M: dict[str, np.ndarray], first: int) -> np.ndarray:
    """Largest number of requests that joined the engines' queues in one step (collection k to
    k+1, for the steps into column ``first`` and after it), summed over the engines: per engine
    min(rise of waiting, rise of waiting + running). A request that moves between the two queues
    (a deadlocked scheduler returning its running requests, a preemption) or that finishes while
    another arrives changes only one of the two; one admitted at once did not queue. When the
    engine reported running requests but no new token between two collections, its front end's
    stats were frozen (an engine core hung inside a step): the step out of such a stretch holds
    every request that arrived during it, so it counts as spread over the stretch (as much of it
    as the window holds). An engine missing at either end of a step adds nothing to it."""
    W, R = M["vllm_requests_waiting"], M["vllm_requests_running"]
    if W.shape[1] < 2:
        return np.full(1, np.nan)
    dW = np.diff(W, axis=1)
    step = np.minimum(dW, dW + np.diff(R, axis=1))
    step = np.where(np.isnan(step), dW, step)  # no running gauge: the waiting queue alone
    tokens = M["vllm_generation_tokens_total"] + np.nan_to_num(M["vllm_prompt_tokens_total"])
    # progress into collection k+1: tokens advanced (or unknown), or nothing was running at k
    progressed = ~(np.diff(tokens, axis=1) == 0) | ~(R[:, :-1] > 0)
    dt = np.diff(tt)
    # per engine and step k (collection k to k+1): the last collection the engine had progressed
    # into before it - the latest j <= k with progress into j, or the window's first collection
    K = len(dt)
    into = np.maximum.accumulate(np.where(progressed, np.arange(1, K + 1), 0), axis=1)
    stall = tt[1:] - tt[np.concatenate([np.zeros((len(W), 1), np.int64), into[:, :-1]], axis=1)]
    spread = (np.arange(1, K + 1) >= first) & (stall > dt * 1.5) & (step > 0)
    step = np.where(spread, step * dt / np.where(spread, stall, 1.0), step)
    ok = ~np.isnan(step[:, max(first - 1, 0):])
    if not ok.any():
        return np.full(1, np.nan)
    S = np.where(ok, step[:, max(first - 1, 0):], 0.0).sum(axis=0)
    return np.array([float(S[ok.any(axis=0)].max())])


def _arrivals(tt: np.ndarray, M: dict[str, np.ndarray], first: int) -> np.ndarray:
    """Requests that reached the engines per second over the steps into column ``first`` and
    after it: per engine and step, the rise of waiting + running plus the requests finished
    (never below zero: an engine restart resets its gauges and counters)."""
    W, R, S = M["vllm_requests_waiting"], M["vllm_requests_running"], M["vllm_request_success_total"]
    if W.shape[1] < 2:
        return np.full(1, np.nan)
    a = np.maximum(np.diff(W + R, axis=1) + np.diff(S, axis=1), 0.0)[:, max(first - 1, 0):]
    ok = ~np.isnan(a)
    steps = ok.any(axis=0)
    if not steps.any():
        return np.full(1, np.nan)
    span = float(np.diff(tt)[max(first - 1, 0):][steps].sum())
    return np.array([float(np.where(ok, a, 0.0).sum() / span)]) if span > 0 else np.full(1, np.nan)


def compute(store: WindowStore, node: str, t: float, interval: float, lookback: float = 60.0) -> dict[str, float]:
    """Summary values for ``node`` at ``t`` from what the store holds (missing sources omitted)."""
    out: dict[str, float] = {}
    engines = None  # the engine window, read once for both engine-queue summaries
    for spec in SPECS:
        blk = store.blocks.get(spec.source, {}).get(node)
        if blk is None or spec.source not in store.catalogue:
            continue
        if spec.window in ("queued", "arrivals"):
            # the interval's steps, and the one into it from the collection before it (both read
            # only those); the queue steps look back as far as the summary's lookback for an
            # engine that made no progress
            if engines is None:
                engines = _engine_window(store, node, t - max(lookback, interval + 2.0), t) or ()
            if not engines:
                continue
            tt, M = engines
            first = int(np.searchsorted(tt, t - interval, side="right"))
            vals = (_queued if spec.window == "queued" else _arrivals)(tt, M, first)
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
    """The collective step entries a summary at ``t`` reports (see :func:`make_summary`)."""
    st = steps_mod.node_steps(store, node, t)
    return [] if st is None else steps_mod.settled_steps(st, t, interval)[0].tolist()


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

    values = compute(store, node, t, interval)
    # the node's collective steps, on its own clock: local durations for clock-free straggler
    # detection, and the step entries for cross-node alignment where clocks are good
    st = steps_mod.node_steps(store, node, t)
    if st is not None:
        values.update(steps_mod.summary_values(st))
    signals: dict[str, dict[str, float | None]] = {k: {"": v} for k, v in values.items()}
    signals.update(engine_values(store, node, t, interval))  # each engine's own (agent/engines.py)
    if st is not None:
        starts, nbytes = steps_mod.settled_steps(st, t, interval)
        if len(starts):
            signals["collective_burst_starts"] = {str(k): v for k, v in enumerate(starts.tolist())}
            signals["collective_burst_bytes"] = {str(k): (None if v != v else v) for k, v in enumerate(nbytes.tolist())}
    return wire.Summary(node=node, cluster=cluster, t=t, interval=interval, signals=signals,
                        clock_sync=wire.ClockSync(synced=clock_synced, max_error_s=clock_error),
                        agent_version=__version__, labels=dict(labels or {}))

