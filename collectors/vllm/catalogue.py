"""Signals of the ``vllm`` collector. Scope engine; entity ``engine<idx>`` (``<model>/<idx>``
when a page serves several models; prefixed by the endpoint name when one is configured)."""
from __future__ import annotations

from skewd.model import SignalSpec, signal


def _e(name: str, kind: str, unit: str, desc: str) -> SignalSpec:
    return signal(name, kind, unit, "engine", desc, "vllm")


_HIST = {
    "ttft": ("time to first token", "vllm:time_to_first_token_seconds", "requests"),
    "itl": ("inter-token latency", "vllm:inter_token_latency_seconds (old: "
            "vllm:time_per_output_token_seconds)", "tokens"),
    "e2e_latency": ("end-to-end request latency", "vllm:e2e_request_latency_seconds", "requests"),
    "queue_time": ("time spent waiting before first scheduled", "vllm:request_queue_time_seconds",
                   "requests"),
    "prefill_time": ("time in the prefill phase", "vllm:request_prefill_time_seconds", "requests"),
    "decode_time": ("time in the decode phase", "vllm:request_decode_time_seconds", "requests"),
}


def _histogram_signals() -> list[SignalSpec]:
    out = []
    for key, (what, source, unit) in _HIST.items():
        for q, pct in (("p50", "median"), ("p99", "99th percentile")):
            out.append(_e(f"vllm_{key}_{q}_seconds", "gauge", "seconds",
                          f"{pct} of {what} over the observations made since the previous scrape "
                          f"(histogram_quantile over the bucket increase of {source}; first scrape "
                          "or after a restart: cumulative). Absent when nothing was observed."))
        out.append(_e(f"vllm_{key}_observations_total", "counter", unit,
                      f"Observations of {what} ({source}_count)."))
    return out


CATALOGUE: list[SignalSpec] = [
    _e("vllm_up", "gauge", "bool",
       "1 when the engine's /metrics endpoint answered with a vLLM page this tick, 0 when the "
       "scrape failed (endpoint down, timeout, not vLLM). On failure it is emitted for the "
       "engines last seen there, or for the endpoint name if none was ever seen."),
    _e("vllm_requests_running", "gauge", "requests",
       "Requests in the running batch (vllm:num_requests_running)."),
    _e("vllm_requests_waiting", "gauge", "requests",
       "Requests queued, not yet scheduled (vllm:num_requests_waiting)."),
    _e("vllm_kv_cache_usage_ratio", "gauge", "ratio",
       "KV-cache blocks in use, 0..1 (vllm:kv_cache_usage_perc; old: vllm:gpu_cache_usage_perc)."),
    _e("vllm_preemptions_total", "counter", "requests",
       "Requests preempted by the scheduler to free KV cache (vllm:num_preemptions_total)."),
    _e("vllm_prompt_tokens_total", "counter", "tokens",
       "Prompt (prefill) tokens processed (vllm:prompt_tokens_total)."),
    _e("vllm_generation_tokens_total", "counter", "tokens",
       "Generated (decode) tokens (vllm:generation_tokens_total)."),
    _e("vllm_prefix_cache_queries_total", "counter", "tokens",
       "Prefix-cache lookups in tokens (vllm:prefix_cache_queries_total; old: "
       "vllm:gpu_prefix_cache_queries_total, counted in blocks before 0.9)."),
    _e("vllm_prefix_cache_hits_total", "counter", "tokens",
       "Prefix-cache hits in tokens (vllm:prefix_cache_hits_total; old: "
       "vllm:gpu_prefix_cache_hits_total)."),
    _e("vllm_request_success_total", "counter", "requests",
       "Finished requests, all finished_reason values summed (vllm:request_success_total)."),
    _e("vllm_iterations_total", "counter", "steps",
       "Engine steps run (the observation count of vllm:iteration_tokens_total, which vLLM "
       "observes once per engine step). Its rate is the engine's iteration rate: a slow kernel "
       "launch path (PCIE-3) lowers it."),
    *_histogram_signals(),
    _e("vllm_prompt_tokens_per_second", "gauge", "tokens_per_second",
       "Prompt-token rate between the previous and the current scrape."),
    _e("vllm_generation_tokens_per_second", "gauge", "tokens_per_second",
       "Generation-token rate between the previous and the current scrape."),
    _e("vllm_phase", "gauge", "enum",
       "What the engine spent its time on between the two scrapes: 0 idle (prompt+generation "
       "tokens/s below collectors.vllm.phase_idle_tokens_per_second, default 1), 2 prefill-heavy "
       "(the requests that finished spent >= collectors.vllm.phase_prefill_share, default 0.5, of "
       "their prefill+decode time in prefill: vllm:request_prefill_time_seconds and "
       "vllm:request_decode_time_seconds sums), 1 decode-heavy. No request finished: the last "
       "measured phase is held (absent before the first). Releases without those histograms: the "
       "token mix decides (prompt tokens >= phase_prefill_share of all tokens)."),
]
