"""What the agent's and the controller's ``/metrics`` endpoints share: the registry with the
standard process and platform collectors, a ``skewd_build_info`` gauge, and the listener.

Values of skewd's own metrics are read from live objects at scrape time by each component's
custom collector (nothing on a hot path updates metric objects). Listeners bind to 127.0.0.1
unless an address is configured, and an empty ``listen`` disables the endpoint.
"""
from __future__ import annotations

import logging
import platform
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, start_http_server
from prometheus_client.core import GaugeMetricFamily

from skewd import __version__

log = logging.getLogger("skewd.metrics")


class BuildInfo:
    """``skewd_build_info{version, component, python}`` = 1: joins a series to the release that
    produced it (the Prometheus ``*_build_info`` convention)."""

    def __init__(self, component: str) -> None:
        self.component = component

    def collect(self) -> Iterator[Any]:
        g = GaugeMetricFamily("skewd_build_info", "skewd release that serves these metrics",
                              labels=["version", "component", "python"])
        g.add_metric([__version__, self.component, platform.python_version()], 1.0)
        yield g


def registry(component: str, *collectors: Any) -> CollectorRegistry:
    """A fresh registry with ``process_*``, ``python_info``, ``skewd_build_info`` and ``collectors``."""
    reg = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    reg.register(BuildInfo(component))
    for c in collectors:
        reg.register(c)
    return reg


def parse_listen(listen: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``"host:port"`` / ``"[v6]:port"`` / ``":port"`` → (host, port). Raises ValueError."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {listen!r} must be host:port (port 0-65535), e.g. 127.0.0.1:9465")
    return host.strip("[]") or default_host, int(port)


def serve(reg: CollectorRegistry, listen: str, what: str) -> Any:
    """Serve ``reg`` on ``listen``; returns the server (``.shutdown()``, ``.server_address``)
    or None when ``listen`` is empty."""
    if not listen:
        return None
    host, port = parse_listen(listen)
    server, _thread = start_http_server(port, addr=host, registry=reg)
    log.info("%s metrics on http://%s:%s/metrics", what, host, server.server_port)
    return server
