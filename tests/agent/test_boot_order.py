"""Boot order: systemd starts the agent while a 70B model is still loading, so vLLM's /metrics
answers only later. The agent must keep probing its inactive collectors for its whole life (and
at once on SIGHUP), turn the engine rules on when the signals appear, publish the engine
findings over NATS, and report every availability change on the health subject.

Real parts: a real HTTP server (``PageServer``) that starts listening on the configured port
15 s after the agent, serving a genuine vLLM 0.33 page; a real nats-server; the shipped packs.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from skewd import wire
from skewd.agent.config import load_config
from skewd.agent.runner import Agent
from skewd.agent.scheduler import Backoff, collector_config_keys
from skewd.model import Finding, State
from skewd.natsutil import NatsConfig, connect
from skewd.rules.cli import PACKS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collectors"))
from test_vllm_pageserver import VLLM, PageServer, free_port, page  # noqa: E402

pytestmark = pytest.mark.timeout(120)

#: the saturated page frozen: 96 running, 40 waiting and not one token processed between two
#: scrapes, which is what GPU-3 (engine stall) watches. The site file shortens its window and
#: ``for`` so the test takes seconds, not the shipped minute (a test site override, not a tuning).
SITE = """\
required_engine_version: 1
rules:
  - id: GPU-3-engine-stall
    override: {params: replace, for: replace}
    params: {window: 3s}
    for: 1s
"""
OTHERS_OFF = {n: {"enabled": False} for n in ("netdev", "pkt", "rdma", "pcie", "gpu", "host", "exporter", "nccl")}


def test_backoff_doubles_from_a_second_up_to_a_minute():
    b, d, seen = Backoff(), None, []
    for _ in range(9):
        d = b.next(d)
        seen.append(d)
    assert seen == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def _config(tmp_path: Path, nats_url: str, endpoint: str, reprobe: dict) -> object:
    (tmp_path / "site.yaml").write_text(SITE)
    return load_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": "boot-node", "cluster": "boot", "rules": [str(PACKS), str(tmp_path / "site.yaml")],
        "evaluation_interval": "500ms", "summary_interval": "1s", "reprobe": reprobe,
        "nats": {"url": nats_url}, "spool": {"dir": str(tmp_path / "spool")}, "metrics": {"listen": ""},
        "collectors": {"vllm": {"endpoints": [endpoint], "interval": "500ms"}, **OTHERS_OFF}})


async def _subscribe(nats_url: str, cluster: str, findings: list[Finding], health: list[wire.Health]):
    nc = await connect(NatsConfig.from_dict({"url": nats_url}), initial_timeout=10)

    async def on_finding(msg) -> None:
        findings.append(wire.decode_finding(msg.data))

    async def on_health(msg) -> None:
        health.append(wire.decode_health(msg.data))

    await nc.subscribe(wire.subject_filter(wire.MessageKind.FINDING, cluster=cluster), cb=on_finding)
    await nc.subscribe(wire.subject_filter(wire.MessageKind.HEALTH, cluster=cluster), cb=on_health)
    return nc


async def _wait_for(pred, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        await asyncio.sleep(0.2)
    return None


def _stall_firing(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.rule_id == "GPU-3-engine-stall" and f.state is State.FIRING]


async def test_agent_started_before_vllm_publishes_engine_findings_once_it_answers(nats_server, tmp_path):
    port = free_port()
    cfg = _config(tmp_path, nats_server.url, f"http://127.0.0.1:{port}/metrics",
                  {"min_interval": "1s", "max_interval": "2s"})
    findings: list[Finding] = []
    health: list[wire.Health] = []
    nc = await _subscribe(nats_server.url, "boot", findings, health)
    agent = Agent(cfg)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    srv = None
    try:
        await asyncio.wait_for(agent.started.wait(), 20)
        first = await _wait_for(lambda: health and health[0], 15)
        assert first, "no health message"
        assert first.collectors["vllm"].state == "unavailable"
        assert "connection refused" in first.collectors["vllm"].reason
        assert "GPU-3-engine-stall" in first.rules.inactive
        active_before = first.rules.active

        await asyncio.sleep(15)  # the model is loading
        assert not [f for f in findings if f.rule_id.startswith("GPU-")]
        slot = next(s for s in agent.slots if s.name == "vllm")
        assert slot.probes >= 5, "the inactive collector was not probed again while vLLM was down"

        srv = PageServer(port)  # vLLM answers
        srv.body = page(VLLM / "v0.33" / "saturated.prom")
        t_up = time.monotonic()
        fired = await _wait_for(lambda: _stall_firing(findings), 30)
        assert fired, f"no engine finding after the endpoint came up; health: {health[-1] if health else None}"
        assert fired[0].node == "boot-node" and fired[0].entity == "engine0"
        assert time.monotonic() - t_up < 15

        # health reported the transition, with the engine rules now active
        up = next(h for h in health if h.collectors["vllm"].state == "active")
        assert "GPU-3-engine-stall" not in up.rules.inactive and up.rules.active > active_before
        assert slot.transitions == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        await nc.close()
        if srv is not None:
            srv.close()


@pytest.mark.skipif(os.name != "posix", reason="SIGHUP")
async def test_sighup_probes_inactive_collectors_at_once(nats_server, tmp_path):
    """With a long backoff, SIGHUP (systemctl reload) is how an operator says "it is up now"."""
    port = free_port()
    cfg = _config(tmp_path, nats_server.url, f"http://127.0.0.1:{port}/metrics",
                  {"min_interval": "40s", "max_interval": "1m"})
    findings: list[Finding] = []
    health: list[wire.Health] = []
    nc = await _subscribe(nats_server.url, "boot", findings, health)
    agent = Agent(cfg)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    srv = PageServer(port)
    try:
        await asyncio.wait_for(agent.started.wait(), 20)
        slot = next(s for s in agent.slots if s.name == "vllm")
        assert not slot.active  # probed at setup: it answered with no vLLM metrics yet (loading)
        srv.body = page(VLLM / "v0.33" / "saturated.prom")
        await asyncio.sleep(1.0)
        assert not slot.active  # next probe is 40 s away
        assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, None), "agent did not install SIGHUP"
        os.kill(os.getpid(), signal.SIGHUP)
        assert await _wait_for(lambda: slot.active, 5), slot.status
        assert await _wait_for(lambda: any(h.collectors["vllm"].state == "active" for h in health), 5)
        assert await _wait_for(lambda: _stall_firing(findings), 20)
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        await nc.close()
        srv.close()
