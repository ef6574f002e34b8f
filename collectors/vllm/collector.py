"""The ``vllm`` collector: scrape each engine's Prometheus ``/metrics`` page every tick.

Thin I/O: fetch with urllib, parse and derive in :mod:`.parse`. The previous parsed page of
each endpoint is kept so token rates, the phase and interval quantiles can be computed between
two scrapes; the time between them is the difference of the tick times handed to ``collect``.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from skewd.collectors.base import Availability, Collector, Status
from skewd.model import BatchBuilder, SampleBatch

from . import parse
from .catalogue import CATALOGUE
from skewd.collectors.promhttp import ScrapeError, check_url, fetch, scrape_timeout

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:8000/metrics"


@dataclass
class Endpoint:
    url: str
    #: entity prefix; "" for a single unnamed endpoint
    name: str
    #: entity used for vllm_up=0 before any engine was ever seen there
    fallback_entity: str
    prev: parse.Page | None = None
    prev_t: float | None = None
    last_entities: list[str] = field(default_factory=list)
    #: each engine's last measured phase, held while no request finishes (parse.derive)
    phases: dict[tuple[str, str], float] = field(default_factory=dict)


def _float(config: Mapping[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    v = config.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise ValueError(f"collectors.vllm.{key}: expected a number in [{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def parse_endpoints(raw: Any) -> list[Endpoint]:
    """``endpoints``: a list of URLs or ``{url, name}`` maps. With several endpoints each one
    needs a distinct entity prefix: an unnamed one is called ``host:port``."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("collectors.vllm.endpoints: expected a list of URLs or {url, name} maps")
    items: list[tuple[str, str | None]] = []
    for i, item in enumerate(raw):
        where = f"collectors.vllm.endpoints[{i}]"
        if isinstance(item, str):
            items.append((check_url(item, where), None))
        elif isinstance(item, dict):
            unknown = set(item) - {"url", "name"}
            if unknown:
                raise ValueError(f"{where}: unknown key(s) {sorted(unknown)} (known: name, url)")
            name = item.get("name")
            if name is not None and (not isinstance(name, str) or not name
                                     or any(c.isspace() for c in name)):
                raise ValueError(f"{where}.name: expected a non-empty name without spaces")
            items.append((check_url(item.get("url"), f"{where}.url"), name))
        else:
            raise ValueError(f"{where}: expected a URL or a {{url, name}} map, got {item!r}")
    out = []
    for url, name in items:
        if name is None and len(items) > 1:
            name = urlsplit(url).netloc
        out.append(Endpoint(url, name or "", name or "engine0"))
    names = [e.name for e in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"collectors.vllm.endpoints: names must be distinct, repeated: {sorted(dup)}")
    return out


class VllmCollector(Collector):
    name = "vllm"
    catalogue = CATALOGUE
    default_interval = 1.0
    config_keys = frozenset({"endpoints", "phase_idle_tokens_per_second", "phase_prefill_share"})
    config_docs = {
        "endpoints": ("`[http://127.0.0.1:8000/metrics]`",
                      "vLLM `/metrics` URLs, or `{url, name}` maps (`name` prefixes the engine entities; "
                      "with several endpoints an unnamed one is called `host:port`)"),
        "phase_idle_tokens_per_second": ("`1`", "below this prompt+generation token rate the phase is idle"),
        "phase_prefill_share": ("`0.5`", "prompt tokens at least this share of all tokens: prefill-heavy"),
    }

    def __init__(self, node: str, config: Mapping[str, Any] | None = None,
                 sys_root: str | Path = "/sys", proc_root: str | Path = "/proc") -> None:
        super().__init__(node, config, sys_root, proc_root)
        self.timeout = scrape_timeout(self.config, self.interval, self.name)
        self.thresholds = parse.PhaseThresholds(
            idle_tokens_per_second=_float(self.config, "phase_idle_tokens_per_second", 1.0,
                                          0.0, 1e12),
            prefill_share=_float(self.config, "phase_prefill_share", 0.5, 0.0, 1.0))
        self.configured = parse_endpoints(self.config.get("endpoints"))
        #: with nothing configured the default URL is scraped (probe says whether it answers)
        self.endpoints = self.configured or [Endpoint(DEFAULT_URL, "", "engine0")]
        self._pool: ThreadPoolExecutor | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def probe(self) -> Status:
        try:
            return self._probe()
        except Exception as e:  # probe never raises
            return Status(Availability.UNAVAILABLE, f"vLLM probe failed unexpectedly: {e!r}")

    def _probe(self) -> Status:
        results = [(ep, self._scrape(ep)) for ep in self.endpoints]
        ok = [ep for ep, r in results if isinstance(r, dict)]
        if ok:
            return Status(Availability.ACTIVE,
                          f"scraping {len(ok)}/{len(results)} vLLM endpoint(s): "
                          + ", ".join(ep.url for ep in ok))
        if not self.configured:
            return Status(Availability.ABSENT,
                          f"no vLLM /metrics at {DEFAULT_URL} (set collectors.vllm.endpoints)")
        return Status(Availability.UNAVAILABLE,
                      "; ".join(f"{ep.url}: {r}" for ep, r in results))

    def start(self) -> None:
        super().start()
        if len(self.endpoints) > 1 and self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=min(8, len(self.endpoints)),
                                            thread_name_prefix="skewd-vllm")

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        super().stop()

    # -- collection -----------------------------------------------------------------------------
    def _scrape(self, ep: Endpoint) -> parse.Page | str:
        """The parsed page, or the reason it could not be had."""
        try:
            text = fetch(ep.url, self.timeout)
        except ScrapeError as e:
            return str(e)
        try:
            page = parse.parse_page(text)
        except ValueError as e:
            return f"not Prometheus text format ({e})"
        if not page:
            return "answers but exposes no vllm: engine metrics (is this a vLLM server?)"
        return page

    def collect(self, t: float) -> SampleBatch:
        b = BatchBuilder(self.node)
        pool = self._pool
        try:
            if pool is None:
                raise RuntimeError("no pool")
            results = list(pool.map(self._scrape, self.endpoints))
        except RuntimeError:  # not started, or stopped while collecting: scrape in turn
            results = [self._scrape(ep) for ep in self.endpoints]
        for ep, res in zip(self.endpoints, results):
            if isinstance(res, str):
                self.stats.error("parse" if res.startswith(("not Prometheus", "answers")) else "read")
                log.debug("vllm scrape of %s failed: %s", ep.url, res)
                for ent in ep.last_entities or [ep.fallback_entity]:
                    b.add(t, ent, "vllm_up", 0.0)
                continue
            self._emit(b, t, ep, res)
        return b.build()

    def _emit(self, b: BatchBuilder, t: float, ep: Endpoint, page: parse.Page) -> None:
        names = parse.entity_names(page, ep.name)
        dt = None if ep.prev_t is None else t - ep.prev_t
        for key, eng in sorted(page.items()):
            prev = ep.prev.get(key) if ep.prev is not None else None
            ent = names[key]
            b.add(t, ent, "vllm_up", 1.0)
            out = parse.derive(prev, eng, dt, self.thresholds, ep.phases.get(key))
            if "vllm_phase" in out:
                ep.phases[key] = out["vllm_phase"]
            for sig, v in out.items():
                b.add(t, ent, sig, v)
        ep.prev, ep.prev_t = page, t
        ep.last_entities = [names[k] for k in sorted(page)]
