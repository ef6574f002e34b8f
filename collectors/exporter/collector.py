"""The ``exporter`` collector: scrape Prometheus exporters (dcgm-exporter, DOCA Telemetry
Service) and turn their series into skewd signals through a mapping file per target.

A node without NVML access (or a BlueField watching its host) reads GPUs through
dcgm-exporter this way; the signals are the gpu/pcie collectors' own names, so the same rules
apply. Thin I/O here; matching in :mod:`.parse`, validation in :mod:`.mapping`.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from skewd.collectors.base import Availability, Collector, Status
from skewd.collectors.promhttp import ScrapeError, check_url, fetch, scrape_timeout
from skewd.model import BatchBuilder, SampleBatch, SignalSpec

from . import mapping as mapping_mod
from . import parse
from .catalogue import CATALOGUE, OWN, UP

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:9400/metrics"
DEFAULT_MAPPING = "dcgm-exporter"


def known_signals() -> dict[str, SignalSpec]:
    """Every signal a mapping may target: all other collectors' catalogues plus ours."""
    from skewd.collectors import registry  # late: the registry imports this package

    specs: dict[str, SignalSpec] = {}
    for n in registry.NAMES:
        if n == "exporter":
            continue
        try:
            cls = registry.collector_class(n)
        except Exception as e:  # a collector not landed or broken must not break mappings
            log.debug("exporter: catalogue of %s unavailable: %r", n, e)
            continue
        for s in cls.catalogue:
            specs[s.name] = s
    for s in OWN:
        specs[s.name] = s
    return specs


@dataclass
class Target:
    url: str
    name: str
    mapping: mapping_mod.MappingFile


def parse_targets(raw: Any, known: Mapping[str, SignalSpec]) -> list[Target]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("collectors.exporter.targets: expected a list of {url, mapping, name} maps")
    out: list[Target] = []
    for i, item in enumerate(raw):
        where = f"collectors.exporter.targets[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a {{url, mapping, name}} map, got {item!r}")
        unknown = set(item) - {"url", "mapping", "name"}
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {sorted(unknown)} (known: mapping, name, url)")
        url = check_url(item.get("url"), f"{where}.url")
        m = item.get("mapping", DEFAULT_MAPPING)
        if not isinstance(m, str) or not m:
            raise ValueError(f"{where}.mapping: expected a shipped mapping name or a .yaml path")
        try:
            mf = mapping_mod.load(mapping_mod.resolve(m), known)
        except FileNotFoundError as e:
            raise ValueError(f"{where}.mapping: {e}") from None
        name = item.get("name", mf.source)
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.name: expected a non-empty string")
        out.append(Target(url, name, mf))
    names = [t.name for t in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"collectors.exporter.targets: give each target a distinct name, "
                         f"repeated: {dup}")
    return out


class ExporterCollector(Collector):
    name = "exporter"
    catalogue = CATALOGUE
    default_interval = 5.0
    config_keys = frozenset({"targets"})
    config_docs = {
        "targets": ("dcgm-exporter at `http://127.0.0.1:9400/metrics`",
                    "`{url, mapping, name}` maps: `mapping` is a shipped name (`dcgm-exporter`, `dts`) or a "
                    "mapping `.yaml` path; `name` defaults to the mapping's `source` (collectors/exporter/README.md)"),
    }

    def __init__(self, node: str, config: Mapping[str, Any] | None = None,
                 sys_root: str | Path = "/sys", proc_root: str | Path = "/proc") -> None:
        super().__init__(node, config, sys_root, proc_root)
        self.timeout = scrape_timeout(self.config, self.interval, self.name)
        known = known_signals()
        self.configured = parse_targets(self.config.get("targets"), known)
        if self.configured:
            self.targets = self.configured
        else:
            default = mapping_mod.load(mapping_mod.resolve(DEFAULT_MAPPING), known)
            self.targets = [Target(DEFAULT_URL, default.source, default)]
        # what this instance can emit: exporter_up + the targets of its mappings
        specs: dict[str, SignalSpec] = {UP.name: UP}
        for t in self.targets:
            for s in t.mapping.signals:
                specs.setdefault(s.name, s)
        self.catalogue = list(specs.values())
        self._pool: ThreadPoolExecutor | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def probe(self) -> Status:
        try:
            return self._probe()
        except Exception as e:  # probe never raises
            return Status(Availability.UNAVAILABLE, f"exporter probe failed unexpectedly: {e!r}")

    def _probe(self) -> Status:
        ok, problems = [], []
        for t in self.targets:
            res = self._scrape(t)
            if isinstance(res, str):
                problems.append(f"{t.url}: {res}")
                continue
            wanted = {r.metric for r in t.mapping.rules}
            if not res.metrics_seen:
                hint = "" if t.mapping.confirmed else " (this mapping's names are unconfirmed)"
                problems.append(f"{t.url} answers but shows none of the {len(wanted)} metrics of "
                                f"mapping {t.mapping.path}{hint}")
                continue
            ok.append(f"{t.name} at {t.url} ({len(res.metrics_seen)}/{len(wanted)} mapped metrics)")
        if ok:
            return Status(Availability.ACTIVE, "scraping " + "; ".join(ok))
        if not self.configured:
            return Status(Availability.ABSENT, f"no dcgm-exporter /metrics at {DEFAULT_URL} "
                                               "(set collectors.exporter.targets)")
        return Status(Availability.UNAVAILABLE, "; ".join(problems))

    def start(self) -> None:
        super().start()
        if len(self.targets) > 1 and self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=min(8, len(self.targets)),
                                            thread_name_prefix="skewd-exporter")

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        super().stop()

    # -- collection -----------------------------------------------------------------------------
    def _scrape(self, t: Target) -> parse.Applied | str:
        try:
            text = fetch(t.url, self.timeout)
        except ScrapeError as e:
            return str(e)
        try:
            return parse.apply(t.mapping, text)
        except ValueError as e:
            return f"not Prometheus text format ({e})"

    def collect(self, t: float) -> SampleBatch:
        b = BatchBuilder(self.node)
        pool = self._pool
        try:
            if pool is None:
                raise RuntimeError("no pool")
            results = list(pool.map(self._scrape, self.targets))
        except RuntimeError:  # not started, or stopped while collecting: scrape in turn
            results = [self._scrape(tg) for tg in self.targets]
        for tg, res in zip(self.targets, results):
            if isinstance(res, str):
                self.stats.error("parse" if res.startswith("not Prometheus") else "read")
                log.debug("exporter scrape of %s failed: %s", tg.url, res)
                b.add(t, tg.name, UP.name, 0.0)
                continue
            b.add(t, tg.name, UP.name, 1.0)
            self.stats.discarded += res.discarded_series
            for (ent, sig), v in sorted(res.values.items()):
                b.add(t, ent, sig, v)
        return b.build()
