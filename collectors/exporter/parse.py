"""Pure: apply a validated mapping to a Prometheus text page.

Matching uses the metric name as the exporter writes it. prometheus_client's parser renames a
counter sample written without ``_total`` (dcgm-exporter writes
``DCGM_FI_DEV_PCIE_REPLAY_COUNTER`` under ``# TYPE ... counter``) to ``<name>_total``; both the
family name and the sample name are therefore tried.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

from prometheus_client.parser import text_string_to_metric_families

from skewd.collectors.promhttp import sample_value

from .mapping import MappingFile, Rule


@dataclass
class Applied:
    """What one page gave under one mapping."""

    values: dict[tuple[str, str], float] = field(default_factory=dict)  # (entity, signal) → v
    matched_series: int = 0
    #: series of a mapped metric dropped because they lack a label the entity template needs
    discarded_series: int = 0
    #: mapped metric names seen on the page
    metrics_seen: set[str] = field(default_factory=set)


def series(text: str) -> Iterable[tuple[tuple[str, ...], dict[str, str], float]]:
    """(candidate names, labels, value) per sample. Raises ValueError on malformed text."""
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            names: tuple[str, ...] = (s.name,)
            if fam.type == "counter" and s.name == fam.name + "_total":
                names = (s.name, fam.name)
            yield names, s.labels, sample_value(s.value)


def apply(mapping: MappingFile, text: str) -> Applied:
    rules = mapping.by_metric()
    out = Applied()
    # (entity, signal) → [(rule order, series order, value)], combined below
    found: dict[tuple[str, str], list[tuple[int, int, float]]] = {}
    combine: dict[str, str] = {}
    order = {id(r): i for i, r in enumerate(mapping.rules)}
    for n, (names, labels, value) in enumerate(series(text)):
        hit: list[Rule] = []
        for name in names:
            if name in rules:
                hit = rules[name]
                out.metrics_seen.add(name)
                break
        if not hit or math.isnan(value):
            continue
        used = False
        for r in hit:
            if not r.accepts(labels):
                continue
            ent = r.entity_for(labels)
            if ent is None:
                out.discarded_series += 1
                continue
            used = True
            v = r.value(value)
            if v is None:  # a value this rule cannot read (a bit field of +Inf): no sample of its signal
                continue
            combine[r.signal] = r.combine
            found.setdefault((ent, r.signal), []).append((order[id(r)], n, v))
        out.matched_series += used
    for key, vals in found.items():
        how = combine[key[1]]
        if how == "sum":
            out.values[key] = math.fsum(v for _, _, v in vals)
        elif how == "max":
            out.values[key] = max(v for _, _, v in vals)
        elif how == "min":
            out.values[key] = min(v for _, _, v in vals)
        else:  # first
            out.values[key] = min(vals)[2]
    return out
