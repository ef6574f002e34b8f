"""The agent's own /metrics: bound to localhost, and every metric the shipped Grafana
dashboard queries is exposed."""
from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

import pytest

from skewd.agent.config import load_config
from skewd.agent.runner import Agent
from skewd.agent.scheduler import build_slots, collector_config_keys

pytestmark = pytest.mark.timeout(60)
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "skewd-agent.json"


async def test_metrics_endpoint_serves_what_the_dashboard_needs(nats_server, tmp_path):
    cfg = load_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": "m1", "cluster": "mt", "evaluation_interval": "200ms", "metrics": {"listen": "127.0.0.1:0"},
        "nats": {"url": nats_server.url}, "spool": {"dir": str(tmp_path / "spool")}})
    agent = Agent(cfg, slots=build_slots(cfg, ["netdev", "host", "gpu"]))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.started.wait(), 10)
        await asyncio.sleep(1.5)
        srv = agent._metrics_server
        host, port = srv.server_address[:2]
        assert host == "127.0.0.1"  # listeners bind to localhost unless configured
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
                                       .read().decode())
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
    exposed = set(re.findall(r"^([a-z_:]+)(?:\{|\s)", text, re.M))
    wanted = set()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):  # rows have none
            wanted |= {m for m in re.findall(r"\b((?:skewd|process)_[a-z_]+)", target["expr"])}
    assert wanted and wanted <= exposed, sorted(wanted - exposed)
    gpu = next(sl for sl in agent.slots if sl.name == "gpu")  # as this host's probe saw it
    assert (f'skewd_collector_up{{collector="gpu",state="{gpu.status.availability.value}"}} '
            f'{1.0 if gpu.active else 0.0}') in text
    assert 'skewd_collector_up{collector="netdev",state="active"} 1.0' in text
    samples = float(re.search(r'^skewd_collector_samples_total\{collector="netdev"\} (\S+)', text, re.M).group(1))
    assert samples > 0
    # Prometheus conventions: counts that only rise are counters (_total), state values gauges
    # (prometheus_client >= 0.22 names a counter's family with _total in # TYPE, older without)
    types = {n.removesuffix("_total"): k for n, k in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)}
    publisher = {k: v for k, v in types.items() if k.startswith("skewd_publisher_")}
    assert {k for k, v in publisher.items() if v == "gauge"} == {
        "skewd_publisher_connected", "skewd_publisher_spool_depth", "skewd_publisher_spool_bytes",
        "skewd_publisher_spool_in_memory", "skewd_publisher_spool_degraded"}
    assert len([v for v in publisher.values() if v == "counter"]) == 14, publisher
    for name, kind in types.items():
        if kind == "counter":
            assert re.search(rf"^{name}_total(\{{|\s)", text, re.M), name
    assert re.search(r'^skewd_build_info\{component="agent",python="[\d.]+",version="[^"]+"\} 1\.0$', text, re.M)
    assert "process_cpu_seconds_total" in text and "process_resident_memory_bytes" in text
