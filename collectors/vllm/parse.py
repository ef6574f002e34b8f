"""Pure parsing of a vLLM ``/metrics`` page and the signals derived between two scrapes.

Everything here takes text or parsed pages in and returns values out: no I/O, no clock. The
collector keeps the previous parsed page per endpoint and hands both to :func:`derive` with the
time between the two ticks, so rates and interval quantiles are computed the same way live and
in tests.

vLLM renamed metrics across releases; each quantity below lists its names newest first and the
first one present on the page wins (0.9-0.10 expose both the old and the new name).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

from skewd.collectors.promhttp import sample_value

#: gauge quantity → page names (newest first)
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}

#: counter quantity → sample names (newest first). Series with extra labels (finished_reason)
#: are summed per engine. A histogram's ``_count`` sample is a counter too: vLLM observes
#: ``vllm:iteration_tokens_total`` once per engine step, so its count is the steps run.
COUNTERS: dict[str, tuple[str, ...]] = {
    "preemptions": ("vllm:num_preemptions_total",),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "request_success": ("vllm:request_success_total",),
    "iterations": ("vllm:iteration_tokens_total_count",),
}

#: histogram quantity → metric base names (newest first)
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e_latency": ("vllm:e2e_request_latency_seconds",),
    "queue_time": ("vllm:request_queue_time_seconds",),
    "prefill_time": ("vllm:request_prefill_time_seconds",),
    "decode_time": ("vllm:request_decode_time_seconds",),
}

QUANTILES: dict[str, float] = {"p50": 0.5, "p99": 0.99}

#: value of the ``vllm_phase`` gauge
PHASE_IDLE, PHASE_DECODE, PHASE_PREFILL = 0, 1, 2


@dataclass
class Histogram:
    """One cumulative Prometheus histogram: ``buckets`` maps upper bound (``le``) → count."""

    buckets: dict[float, float] = field(default_factory=dict)
    count: float = 0.0
    sum: float = 0.0

    def minus(self, prev: "Histogram") -> "Histogram":
        """Observations made since ``prev`` (bucket-wise difference)."""
        return Histogram({le: c - prev.buckets.get(le, 0.0) for le, c in self.buckets.items()},
                         self.count - prev.count, self.sum - prev.sum)


@dataclass
class Engine:
    """What one page says about one engine (a ``model_name``/``engine`` label pair)."""

    model: str
    engine: str
    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    #: ``<counter>_created`` / ``<histogram>_created`` timestamps, used to spot restarts
    created: dict[str, float] = field(default_factory=dict)


Page = dict[tuple[str, str], Engine]


@dataclass(frozen=True)
class PhaseThresholds:
    """When an engine counts as idle, decode- or prefill-heavy between two scrapes.

    idle: prompt + generation tokens per second below ``idle_tokens_per_second``;
    prefill-heavy: the requests that finished in the interval spent at least ``prefill_share``
    of their prefill + decode time in prefill (the sums of ``vllm:request_prefill_time_seconds``
    and ``vllm:request_decode_time_seconds``); decode-heavy otherwise.

    Time, not tokens: a chat engine whose prompts are five times its answers processes mostly
    prompt tokens, yet prompt tokens go through the model in parallel while every generated
    token costs a step, so its requests spend nearly all their time decoding (vLLM 0.33 pages:
    0.12 s of prefill against 12 s of decode per request). Releases without those histograms
    fall back to the token mix (prompt tokens >= ``prefill_share`` of all tokens).
    """

    idle_tokens_per_second: float = 1.0
    prefill_share: float = 0.5


def _key(labels: Mapping[str, str]) -> tuple[str, str]:
    # V0 engines (vLLM < 0.8 default) have no ``engine`` label: one engine, index 0.
    return labels.get("model_name", ""), labels.get("engine", "0")


def _created_name(sample: str) -> str:
    """The ``_created`` series of a counter sample: ``x_total`` → ``x_created``, but a histogram
    count ``x_count`` → ``x_created`` of the histogram, whose own name may end in ``_total``
    (``vllm:iteration_tokens_total_count`` → ``vllm:iteration_tokens_total_created``)."""
    for suffix in ("_count", "_total"):
        if sample.endswith(suffix):
            return sample[: -len(suffix)] + "_created"
    return sample + "_created"


def parse_page(text: str) -> Page:
    """Parse Prometheus text exposition into per-engine quantities.

    Raises ValueError when the text is not Prometheus exposition format. A page without any
    ``vllm:`` metric parses to an empty dict.
    """
    # name → list of (labels, value); only vllm: samples are kept
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("vllm:"):
                samples.setdefault(s.name, []).append((s.labels, sample_value(s.value)))

    page: Page = {}

    def engine(labels: Mapping[str, str]) -> Engine:
        k = _key(labels)
        if k not in page:
            page[k] = Engine(model=k[0], engine=k[1])
        return page[k]

    # an engine is a label pair carrying at least one known quantity (info gauges such as
    # vllm:cache_config_info carry other labels and must not invent engines)
    known = [n for names in GAUGES.values() for n in names]
    known += [n for names in COUNTERS.values() for n in names]
    known += [f"{n}_count" for names in HISTOGRAMS.values() for n in names]
    for n in known:
        for labels, _ in samples.get(n, ()):
            engine(labels)

    def first_present(names: Iterable[str], k: tuple[str, str]) -> str | None:
        for n in names:
            if any(_key(lb) == k for lb, _ in samples.get(n, ())):
                return n
        return None

    for k, eng in page.items():
        for q, names in GAUGES.items():
            n = first_present(names, k)
            if n is not None:
                eng.gauges[q] = sum(v for lb, v in samples[n] if _key(lb) == k)
        for q, names in COUNTERS.items():
            n = first_present(names, k)
            if n is not None:
                eng.counters[q] = sum(v for lb, v in samples[n] if _key(lb) == k)
                vals = [v for lb, v in samples.get(_created_name(n), ()) if _key(lb) == k]
                if vals:
                    eng.created[q] = min(vals)
        for q, names in HISTOGRAMS.items():
            n = first_present([f"{b}_count" for b in names], k)
            if n is None:
                continue
            base = n[: -len("_count")]
            h = Histogram()
            for lb, v in samples.get(f"{base}_bucket", ()):
                if _key(lb) == k and "le" in lb:
                    le = float(lb["le"])
                    h.buckets[le] = h.buckets.get(le, 0.0) + v
            h.count = sum(v for lb, v in samples[n] if _key(lb) == k)
            h.sum = sum(v for lb, v in samples.get(f"{base}_sum", ()) if _key(lb) == k)
            eng.histograms[q] = h
            vals = [v for lb, v in samples.get(f"{base}_created", ()) if _key(lb) == k]
            if vals:
                eng.created["h:" + q] = min(vals)
    return page


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float:
    """Prometheus ``histogram_quantile`` over cumulative ``buckets`` (le → count).

    Linear interpolation inside the bucket holding the rank; the lowest bucket starts at 0;
    a rank in the +Inf bucket returns the highest finite bound. NaN when there are no
    observations (or no +Inf bucket).
    """
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return math.nan
    counts = [buckets[b] for b in bounds]
    # counts must be monotonic; scrape races can break that slightly (Prometheus fixes it too)
    for i in range(1, len(counts)):
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if not total > 0 or math.isinf(total) or len(bounds) < 2:  # also NaN counts from a broken page
        return math.nan
    rank = q * total
    i = next((j for j, c in enumerate(counts) if c >= rank), len(counts) - 1)
    if i == len(bounds) - 1:
        return bounds[-2]
    if i == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0 if i == 0 else bounds[i - 1]
    below = 0.0 if i == 0 else counts[i - 1]
    in_bucket = counts[i] - below
    if in_bucket <= 0:
        return bounds[i]
    return start + (bounds[i] - start) * (rank - below) / in_bucket


def restarted(prev: Engine, cur: Engine) -> bool:
    """True when the engine's counters started over between the two pages.

    A counter that went down, or a changed ``_created`` timestamp (a restart whose counters
    already grew past the old values), both mean the previous page is no baseline.
    """
    for q, v in cur.counters.items():
        if q in prev.counters and v < prev.counters[q]:
            return True
    for q, h in cur.histograms.items():
        if q in prev.histograms and h.count < prev.histograms[q].count:
            return True
    for q, c in cur.created.items():
        if q in prev.created and c != prev.created[q]:
            return True
    return False


def phase(prompt_rate: float, generation_rate: float, th: PhaseThresholds,
          prefill_s: float | None = None, decode_s: float | None = None) -> int | None:
    """The engine's phase over an interval (see :class:`PhaseThresholds`): ``prefill_s`` /
    ``decode_s`` are the prefill and decode seconds of the requests that finished in it. None
    when the engine worked but no request finished (the time split is unknown this interval)."""
    total = prompt_rate + generation_rate
    if total < th.idle_tokens_per_second:
        return PHASE_IDLE
    if prefill_s is not None and decode_s is not None:
        spent = prefill_s + decode_s
        if spent <= 0:
            return None
        return PHASE_PREFILL if prefill_s / spent >= th.prefill_share else PHASE_DECODE
    return PHASE_PREFILL if prompt_rate / total >= th.prefill_share else PHASE_DECODE


_GAUGE_SIGNALS = {"running": "vllm_requests_running", "waiting": "vllm_requests_waiting",
                  "kv": "vllm_kv_cache_usage_ratio"}
_COUNTER_SIGNALS = {"preemptions": "vllm_preemptions_total",
                    "prompt_tokens": "vllm_prompt_tokens_total",
                    "generation_tokens": "vllm_generation_tokens_total",
                    "prefix_queries": "vllm_prefix_cache_queries_total",
                    "prefix_hits": "vllm_prefix_cache_hits_total",
                    "request_success": "vllm_request_success_total",
                    "iterations": "vllm_iterations_total"}


def derive(prev: Engine | None, cur: Engine, dt: float | None,
           th: PhaseThresholds = PhaseThresholds(), last_phase: float | None = None) -> dict[str, float]:
    """Signals for one engine from the current page and, when there is one, the previous page.

    - gauges and counters: raw (counters stay cumulative; the window store makes rates);
    - ``vllm_<h>_p50_seconds`` / ``_p99_seconds``: quantiles of the observations made between
      the two pages (histogram_quantile over the bucket increase); on the first page or after
      a restart, over the cumulative buckets. Omitted when the interval saw no observation;
    - ``vllm_<h>_observations_total``: raw histogram counts;
    - token rates and ``vllm_phase``: only with a usable previous page and ``dt > 0``; when the
      engine worked but no request finished in the interval, the phase is ``last_phase`` (the
      workload's mix changes slowly; the caller keeps it), or absent without one.
    """
    out: dict[str, float] = {}
    for q, sig in _GAUGE_SIGNALS.items():
        if q in cur.gauges:
            out[sig] = cur.gauges[q]
    for q, sig in _COUNTER_SIGNALS.items():
        if q in cur.counters:
            out[sig] = cur.counters[q]

    baseline = prev if prev is not None and not restarted(prev, cur) else None
    for q, h in cur.histograms.items():
        out[f"vllm_{q}_observations_total"] = h.count
        window = h
        if baseline is not None and q in baseline.histograms:
            window = h.minus(baseline.histograms[q])
        for name, qv in QUANTILES.items():
            v = histogram_quantile(qv, window.buckets)
            if not math.isnan(v):
                out[f"vllm_{q}_{name}_seconds"] = v

    if prev is not None and dt is not None and dt > 0:
        rates: dict[str, float] = {}
        for q in ("prompt_tokens", "generation_tokens"):
            if q not in cur.counters:
                continue
            if baseline is None:
                inc = cur.counters[q]  # counter restarted: it counted up from zero (Prometheus)
            else:
                inc = cur.counters[q] - baseline.counters.get(q, 0.0)
            rates[q] = inc / dt
        if len(rates) == 2:
            out["vllm_prompt_tokens_per_second"] = rates["prompt_tokens"]
            out["vllm_generation_tokens_per_second"] = rates["generation_tokens"]
            spent = [_increase(cur, baseline, q) for q in ("prefill_time", "decode_time")]
            ph = phase(rates["prompt_tokens"], rates["generation_tokens"], th,
                       *(spent if None not in spent else (None, None)))
            if ph is None:
                ph = last_phase
            if ph is not None:
                out["vllm_phase"] = float(ph)
    return out


def _increase(cur: Engine, baseline: Engine | None, q: str) -> float | None:
    """Seconds a time histogram's sum grew since ``baseline`` (from zero after a restart);
    None when the page has no such histogram."""
    h = cur.histograms.get(q)
    if h is None:
        return None
    if baseline is None or q not in baseline.histograms:
        return h.sum
    return h.sum - baseline.histograms[q].sum


def entity_names(page: Iterable[tuple[str, str]], prefix: str = "") -> dict[tuple[str, str], str]:
    """Entity per (model, engine): ``engine<idx>`` for one model, ``<model>/<idx>`` for several.

    With an endpoint name as ``prefix``: ``<prefix>`` when the page holds a single engine,
    ``<prefix>/engine<idx>`` or ``<prefix>/<model>/<idx>`` otherwise.
    """
    keys = sorted(set(page))
    models = {m for m, _ in keys}
    out: dict[tuple[str, str], str] = {}
    for m, e in keys:
        core = f"engine{e}" if len(models) <= 1 else f"{m}/{e}"
        if prefix:
            out[(m, e)] = prefix if len(keys) == 1 else f"{prefix}/{core}"
        else:
            out[(m, e)] = core
    return out
