"""Issue 19's last "Done when", end to end: an incident on a two-engine node quotes *that*
engine's phase, KV and TTFT/ITL effect.

Real parts throughout: a live vLLM 0.33 /metrics endpoint (vllm_dp2_server.py: vLLM's own
PrometheusStatLogger in the vLLM CPU venv records the steps of two engine cores and serves what
its registry renders, over HTTP); the real agent scraping it with the shipped packs; a real
nats-server; the real controller, whose published incident the test reads as a subscriber does.
Engine 0 chats (decode dominates its time although prompts are 5x its answers, KV 0.55, TTFT
0.2 s); engine 1 summarises (prefill dominates, KV 0.93, TTFT 2 s) and its queue starts to grow:
GPU-2 fires on engine 1 only. Before issue 19 the incident quoted the node's maximum over both
engines, the token-mix phase and "TTFT not observed; ITL not observed".
"""
from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest

from skewd.agent.config import load_config as agent_config
from skewd.agent.runner import Agent
from skewd.agent.scheduler import collector_config_keys
from skewd.controller import messages as M
from skewd.controller.config import load_config as controller_config
from skewd.controller.service import Controller
from skewd.rules.cli import PACKS

from .. import vllm_venv
from .helpers import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collectors"))
from test_vllm_pageserver import free_port  # noqa: E402

pytestmark = pytest.mark.timeout(1800)

SERVER = Path(__file__).parent / "vllm_dp2_server.py"
CLUSTER = "ph2"
#: the shipped GPU-2 over a 4 s window with a 1 s ``for`` so the test takes seconds, not minutes
#: (a test site override, not a tuning). Its work guard - the window's prompt + generation
#: tokens a second at least ``work`` times the long window's - is a tie on this server, whose
#: engines process the same tokens every step: over 4 s of 500 ms scrapes one step more or less
#: is 12-14 %, and a step the loaded host delays tips it for a while. At the shipped 1.0 the
#: rule went pending and dropped back three times before it held for its second (alone, quiet
#: host), and in two full suite runs the incident had not come after 90 s. At 0.8 it fired at
#: its first pending (two runs); the guard still holds (an engine that slowed by well over a
#: fifth does not fire).
SITE = """\
required_engine_version: 1
rules:
  - id: GPU-2-kv-saturation
    override: {params: replace, for: replace}
    params: {window: 4s, kv_high: 0.9, queue_growth: 0, work: 0.8}
    for: 1s
"""
OTHERS_OFF = {n: {"enabled": False} for n in ("netdev", "pkt", "rdma", "pcie", "gpu", "host", "exporter", "nccl")}


@pytest.fixture(scope="module")
def vllm_endpoint():
    python = vllm_venv.python_or_skip()
    port = free_port()
    proc = subprocess.Popen([python, str(SERVER), str(port), "--step", "0.5", "--saturate-after", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # vLLM's imports take a while on a loaded 2-core host
        assert line.strip() == "ready", (line, proc.stderr.read()[-3000:] if proc.poll() is not None else "")
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        proc.kill()
        proc.wait(10)


def _seconds(text: str) -> float:
    v = float(text.rstrip("ms"))
    return v / 1000 if text.endswith("ms") else v


async def test_an_incident_on_a_two_engine_node_quotes_that_engines_phase_kv_and_latency(
        nats_server, vllm_endpoint, tmp_path) -> None:
    (tmp_path / "site.yaml").write_text(SITE)
    acfg = agent_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": "n1", "cluster": CLUSTER, "rules": [str(PACKS), str(tmp_path / "site.yaml")],
        "evaluation_interval": "500ms", "summary_interval": "1s", "nats": {"url": nats_server.url},
        "spool": {"dir": str(tmp_path / "spool")}, "metrics": {"listen": ""},
        "collectors": {"vllm": {"endpoints": [vllm_endpoint], "interval": "500ms"}, **OTHERS_OFF}})
    ctl = Controller(controller_config(None, env={}, overrides={
        "cluster": CLUSTER, "nats": {"servers": nats_server.url}, "warmup": "1s",
        "correlation": {"group_wait": "3s"}, "metrics": {"listen": ""}}))
    await asyncio.wait_for(ctl.start(), 30)
    nc = await nats.connect(nats_server.url)
    seen: list[M.Incident] = []

    async def on_incident(msg) -> None:
        seen.append(M.decode(msg.data, M.Kind.INCIDENT))

    await nc.subscribe(M.incident_subject(CLUSTER), cb=on_incident)
    agent = Agent(acfg)
    transitions: list[str] = []  # the agent's finding transitions, for a failure's message
    agent.findings.listeners.append(lambda f: transitions.append(f"{f.rule_id} {f.entity} {f.state.name}"))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        async def shown():
            return next((i for i in seen if i.state == "open" and i.pathology == "GPU-2"), None)
        t0 = time.monotonic()
        try:
            inc = await wait_for(shown, 90, "the GPU-2 incident")
        except AssertionError as e:  # (before SITE's work bar: twice in full suite runs) say what there was
            raise AssertionError(f"{e}; agent findings: {transitions[-20:]}; incidents: "
                                 f"{[(i.pathology, i.state) for i in seen]}; controller summaries: "
                                 f"{ctl.stats.summaries} taken, {ctl.stats.summaries_rejected} rejected") from None
        print(f"shown {time.monotonic() - t0:.0f}s after the agent started: {inc.summary}")

        # the engine that saturates, not the node's other one
        assert inc.culprit.node == "n1" and inc.culprit.entity == "engine1"
        assert inc.phase.engine == "n1/engine1" and inc.phase.phase == "prefill_heavy"
        assert inc.phase.kv_usage_ratio == pytest.approx(0.93)
        assert "phase prefill_heavy of n1/engine1 (KV 93%)" in inc.summary
        # its users' latency, quoted in the text: TTFT 2 s (vLLM's buckets 1-2.5 s), ITL 30 ms (25-50 ms)
        ttft = re.search(r"TTFT (\d+(?:\.\d+)?m?s)", inc.summary)
        itl = re.search(r"ITL (\d+(?:\.\d+)?m?s)", inc.summary)
        assert ttft and itl, inc.summary
        assert 1.0 < _seconds(ttft.group(1)) <= 2.5 and 0.025 <= _seconds(itl.group(1)) <= 0.05, inc.summary
        assert inc.effect.ttft_s == pytest.approx(_seconds(ttft.group(1)), rel=0.01)
        assert "not observed" not in inc.effect.description
        # nothing of engine 0 (decode-heavy, KV 55 %, TTFT 200 ms) in it, and no incident for it
        assert "engine0" not in inc.summary and "decode_heavy" not in inc.summary and "55%" not in inc.summary
        assert {i.culprit.entity for i in seen if i.culprit} == {"engine1"}
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        await nc.close()
        await ctl.stop()
