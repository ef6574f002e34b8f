"""Every collector skewd ships, by name. Each package exposes ``COLLECTOR`` (a Collector subclass)."""
from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable

from skewd.model import Catalogue

from .base import Collector

NAMES = ("netdev", "pkt", "rdma", "pcie", "gpu", "host", "vllm", "exporter", "nccl")


def collector_class(name: str) -> type[Collector]:
    if name not in NAMES:
        raise KeyError(f"unknown collector {name!r}; known: {', '.join(NAMES)}")
    mod = importlib.import_module(f"skewd.collectors.{name}")
    return mod.COLLECTOR


def available_names() -> list[str]:
    """Names whose package is importable (all of them, once every collector has landed)."""
    out = []
    for n in NAMES:
        try:
            collector_class(n)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith(f"skewd.collectors.{n}"):
                continue
            raise
        out.append(n)
    return out


def collector_config_keys() -> dict[str, set[str]]:
    """Each collector's accepted settings (``Collector.config_keys``): the agent config's schema
    for ``collectors.<name>``."""
    return {n: set(collector_class(n).config_keys) for n in available_names()}


def collector_config_checks() -> dict[str, Callable[[dict[str, Any]], list[str]]]:
    """Each collector's own validation of its settings (``Collector.config_problems``), run by the
    agent's config loader so a bad setting is an operator error at load time."""
    return {n: collector_class(n).config_problems for n in available_names()}


def catalogue(names: Iterable[str] | None = None) -> Catalogue:
    """The union of the collectors' catalogues (the contract rules are checked against).

    Read from each package's ``catalogue.py`` (``CATALOGUE``) without importing the collector's
    I/O code, so linting rules never needs pyroute2, NVML or a socket."""
    cat = Catalogue()
    for n in (NAMES if names is None else names):
        mod = importlib.import_module(f"skewd.collectors.{n}.catalogue")
        cat = cat.merge(mod.CATALOGUE)
    return cat
