"""Per-engine keys of the node summary: each vLLM engine's own phase, KV, queue and latencies.

The node summary's ``summary_*`` signals reduce the node's engines to one value (the highest KV
usage, the summed queue, the "largest" phase), which is what the cross-node rules compare. An
incident about one engine must quote that engine, though: on a node serving two engines an
incident on the busy one quoted the other's saturated cache. So the summary also carries, keyed
by the engine entity (as the vLLM collector names it: ``engine0``, ``<model>/<idx>``, ...), the
values below. They are not signals (the controller does not store them; no rule reads them):
the controller's engine timelines (``controller/timeline.py``) take them, like
``collective_burst_starts`` feeds its aligner.

| key | value per engine |
|---|---|
| ``engine_phase`` | latest ``vllm_phase`` (0 idle, 1 decode-heavy, 2 prefill-heavy: by time) |
| ``engine_kv_cache_usage_ratio`` | latest ``vllm_kv_cache_usage_ratio`` |
| ``engine_requests_waiting`` / ``engine_requests_running`` | latest queue gauges |
| ``engine_ttft_p50_seconds`` | median of the interval's per-scrape TTFT medians (absent: no first token in it) |
| ``engine_itl_p50_seconds`` | the same for the inter-token latency |
"""
from __future__ import annotations

import numpy as np

from skewd.rules.store import WindowStore

#: summary key → (collector signal, reduction over the interval: "last" within lookback, or "median")
ENGINE_KEYS: dict[str, tuple[str, str]] = {
    "engine_phase": ("vllm_phase", "last"),
    "engine_kv_cache_usage_ratio": ("vllm_kv_cache_usage_ratio", "last"),
    "engine_requests_waiting": ("vllm_requests_waiting", "last"),
    "engine_requests_running": ("vllm_requests_running", "last"),
    "engine_ttft_p50_seconds": ("vllm_ttft_p50_seconds", "median"),
    "engine_itl_p50_seconds": ("vllm_itl_p50_seconds", "median"),
}


def engine_values(store: WindowStore, node: str, t: float, interval: float,
                  lookback: float = 60.0) -> dict[str, dict[str, float]]:
    """``{key: {engine entity: value}}`` for the node's engines at ``t`` (keys without any value
    are left out). "last" looks back ``lookback`` (a gauge holds until it changes); latencies
    only over the interval (an old TTFT is not this interval's)."""
    out: dict[str, dict[str, float]] = {}
    for key, (sig, how) in ENGINE_KEYS.items():
        blk = store.blocks.get(sig, {}).get(node)
        if blk is None:
            continue
        tt, W = blk.window(t - (lookback if how == "last" else interval), t)
        if not len(tt):
            continue
        vals: dict[str, float] = {}
        for ent, row in blk.rows.items():
            v = W[row]
            v = v[~np.isnan(v)]
            if len(v):
                vals[ent] = float(v[-1] if how == "last" else np.median(v))
        if vals:
            out[key] = vals
    return out
