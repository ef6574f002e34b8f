"""The controller's /metrics as ``skewd controller`` runs it: localhost by default, Prometheus
conventions (counters end in _total, process_* and skewd_build_info present), and every metric
the shipped controller dashboard queries is exposed."""
from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

import pytest

from skewd.controller.main import start_edges, stop_edges
from skewd.controller.service import Controller

from .helpers import config

pytestmark = pytest.mark.timeout(60)
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "skewd-controller.json"


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


async def test_controller_metrics_follow_prometheus_conventions(nats_server) -> None:
    ctl = Controller(config(nats_server.url, "metr", metrics={"listen": "127.0.0.1:0"},
                            alertmanager={"url": "http://127.0.0.1:9", "resend_interval": "1h"}))
    await asyncio.wait_for(ctl.start(), 30)
    sink, server = await start_edges(ctl)
    try:
        assert server.server_address[0] == "127.0.0.1"  # listeners bind to localhost unless configured
        text = await asyncio.to_thread(_scrape, server.server_address[1])
    finally:
        await stop_edges(sink, server)
        await ctl.stop()
    # (prometheus_client >= 0.22 names a counter's family with _total in # TYPE, older without)
    types = {n.removesuffix("_total"): k for n, k in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)}
    assert types["skewd_controller_findings_in"] == "counter" and "skewd_controller_findings_in_total 0.0" in text
    assert types["skewd_controller_remaps_published"] == "counter"
    assert types["skewd_controller_incidents"] == "gauge"
    assert 'skewd_controller_incidents{state="open"} 0.0' in text and "skewd_controller_up 1.0" in text
    assert "skewd_controller_nats_connected 1.0" in text
    assert re.search(r'^skewd_build_info\{component="controller",python="[\d.]+",version="[^"]+"\} 1\.0$', text, re.M)
    assert "process_cpu_seconds_total" in text and "process_resident_memory_bytes" in text
    assert types["skewd_alertmanager_post_errors"] == "counter" and types["skewd_alertmanager_alerts_firing"] == "gauge"
    # every counter is exposed with _total; no skewd gauge counts events
    for name, kind in types.items():
        if name.startswith("skewd_") and kind == "counter":
            assert re.search(rf"^{name}_total(\{{|\s)", text, re.M), name
    exposed = set(re.findall(r"^([a-z_:]+)(?:\{|\s)", text, re.M))
    wanted = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            wanted |= set(re.findall(r"\b(skewd_[a-z_]+)", target["expr"]))
    assert wanted and wanted <= exposed, sorted(wanted - exposed)
