"""An agent cut off from NATS re-announces its open findings when it reconnects.

While an agent is partitioned from NATS its summaries are dropped, so the controller resolves its
open findings "node silent" after ``ingest.silent_intervals`` (issue 20). An alert that kept
firing through the partition makes no new transition: without a re-announcement the incident
stays resolved while the engine is still stalled. After the reconnect the agent sends its open
alerts again; the controller reopens the incident (the same one: same finding id, same incident
id) and does not duplicate anything, also after a blip too short for the controller to notice.

Real parts: a real nats-server; the agent's connection runs through a TCP relay on loopback that
the test cuts (every connection closed, nothing listening) and restores, as a partition looks to
the agent's client; a real HTTP server serving a genuine vLLM 0.33 page (the saturated page,
frozen: the engine stalls); the real agent with the shipped packs and the real controller.
"""
from __future__ import annotations

import asyncio
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
from skewd.model import State
from skewd.rules.cli import PACKS

from ..controller.helpers import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collectors"))
from test_vllm_pageserver import VLLM, PageServer, free_port, page  # noqa: E402

pytestmark = pytest.mark.timeout(180)

CLUSTER = "reann"
RULE = "GPU-3-engine-stall"
#: the shipped GPU-3 with a 3 s window and 1 s ``for`` so the test takes seconds (a test site
#: override, not a tuning; test_boot_order.py uses the same)
SITE = """\
required_engine_version: 1
rules:
  - id: GPU-3-engine-stall
    override: {params: replace, for: replace, keep_firing_for: replace}
    params: {window: 3s}
    for: 1s
    keep_firing_for: 0s
"""
OTHERS_OFF = {n: {"enabled": False} for n in ("netdev", "pkt", "rdma", "pcie", "gpu", "host", "exporter", "nccl")}


class Relay:
    """A loopback TCP relay to ``target``: :meth:`cut` closes every relayed connection and stops
    listening (the client sees its connection drop and its reconnects refused), :meth:`restore`
    listens again on the same port."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.server: asyncio.AbstractServer | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def restore(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port)

    async def cut(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        for w in list(self.writers):
            w.close()
        self.writers.clear()

    async def _client(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cw.close()
            return
        self.writers |= {cw, sw}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                w.close()
                self.writers.discard(w)

        await asyncio.gather(pipe(cr, sw), pipe(sr, cw))


async def _watch(url: str) -> tuple[object, list[M.Incident]]:
    """Every incident message the controller publishes (core NATS: the stream's duplicate window
    would hide a re-publication)."""
    nc = await nats.connect(url)
    seen: list[M.Incident] = []

    async def cb(msg) -> None:
        seen.append(M.decode(msg.data, M.Kind.INCIDENT))

    await nc.subscribe(M.incident_subject(CLUSTER), cb=cb)
    await nc.flush()
    return nc, seen


def _latest(seen: list[M.Incident], iid: str) -> M.Incident | None:
    mine = [i for i in seen if i.id == iid]
    return mine[-1] if mine else None


async def test_findings_still_firing_are_reannounced_after_a_partition_and_reopen_the_incident(
        nats_server, tmp_path) -> None:
    relay = Relay(nats_server.port)
    await relay.restore()
    (tmp_path / "site.yaml").write_text(SITE)
    srv = PageServer()
    srv.body = page(VLLM / "v0.33" / "saturated.prom")  # frozen: running and waiting, no token moves
    acfg = agent_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": "n1", "cluster": CLUSTER, "rules": [str(PACKS), str(tmp_path / "site.yaml")],
        "evaluation_interval": "500ms", "summary_interval": "1s",
        "nats": {"url": relay.url, "reconnect_time_wait": 0.2}, "spool": {"dir": str(tmp_path / "spool")},
        "metrics": {"listen": ""},
        "collectors": {"vllm": {"endpoints": [srv.url], "interval": "500ms"}, **OTHERS_OFF}})
    ccfg = controller_config(None, env={}, overrides={
        "cluster": CLUSTER, "nats": {"servers": nats_server.url, "reconnect_time_wait": 0.2},
        "evaluation_interval": "1s", "warmup": "1s", "correlation": {"group_wait": "1s"},
        "ingest": {"silent_intervals": 3}, "metrics": {"listen": ""}})
    ctl = Controller(ccfg)
    await asyncio.wait_for(ctl.start(), 30)
    nc, seen = await _watch(nats_server.url)
    agent = Agent(acfg)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        async def opened():
            return next((i for i in seen if i.state == "open" and i.findings), None)
        inc = await wait_for(opened, 40, "the stall's incident, open")
        (fid,) = inc.findings
        assert fid.startswith(ctl.correlator.findings[fid.split("-", 1)[0]].fingerprint)

        # the partition: the agent keeps evaluating (the stall goes on) but reaches nobody
        await relay.cut()
        t_cut = time.monotonic()

        async def silenced():
            i = _latest(seen, inc.id)
            return i if i is not None and i.state == "resolved" else None
        resolved = await wait_for(silenced, 30, "the incident resolved for the node's silence")
        assert resolved.resolved_reason == "node silent", resolved
        assert not agent.publisher.connected
        assert [a.state for a in agent.pipeline.engine.alerts() if a.rule_id == RULE] == [State.FIRING]

        await relay.restore()
        t_back = time.monotonic()

        async def reopened():
            i = _latest(seen, inc.id)
            return i if i is not None and i.state == "open" else None
        again = await wait_for(reopened, 30, "the incident open again after the reconnect")
        print(f"silenced after {t_back - t_cut:.1f}s of partition; reopened "
              f"{time.monotonic() - t_back:.1f}s after the reconnect")
        assert again.findings == [fid] and again.opened_at == inc.opened_at
        assert agent.publisher.stats.reannounced >= 1
        assert ctl.correlator.findings[fid.split("-", 1)[0]].state is State.FIRING
        # one incident holds the stall, nothing else opened beside it
        assert [i.id for i in ctl.correlator.open_incidents()] == [inc.id]
        assert {i.id for i in seen} == {inc.id}

        # a blip shorter than the controller's silence: the re-announcement is a copy it drops
        n_msgs, dup_before = len(seen), ctl.stats.findings_duplicate
        reannounced = agent.publisher.stats.reannounced
        await relay.cut()
        await asyncio.sleep(0.5)
        await relay.restore()
        await wait_for(lambda: _async(agent.publisher.stats.reannounced > reannounced), 20, "the re-announcement")
        await wait_for(lambda: _async(ctl.stats.findings_duplicate > dup_before), 20, "the copy reaching the controller")
        await asyncio.sleep(2.0)
        assert [i.state for i in seen[n_msgs:]] in ([], ["open"] * len(seen[n_msgs:])), seen[n_msgs:]
        assert [i.id for i in ctl.correlator.open_incidents()] == [inc.id]
        assert _latest(seen, inc.id).state == "open"

        # the engine recovers: the incident resolves as the stall ends, not as a silent node's
        srv.body = page(VLLM / "v0.33" / "busy.prom")

        async def ended():
            i = _latest(seen, inc.id)
            return i if i is not None and i.state == "resolved" else None
        end = await wait_for(ended, 30, "the incident resolved when the stall ended")
        assert end.resolved_reason == "" and "node silent" not in end.summary, end
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        await nc.close()
        await ctl.stop()
        await relay.cut()
        srv.close()


async def _async(v):
    return v
