"""A full disk under a running agent: the spool's filesystem (a real tmpfs) fills up while NATS is
away and while it is back. The agent must keep evaluating, publish what it finds while the disk
is still full, deliver every finding it had spooled before, and drain back to disk once space
returns: every transition stored in the stream exactly once, in order, none counted lost.

The findings are real: the host collector reads a /proc tree whose ``procs_running`` the test
flips, and a node rule fires and resolves on it."""
from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import nats
import pytest

from skewd import wire
from skewd.agent.config import load_config
from skewd.agent.runner import Agent
from skewd.agent.scheduler import build_slots, collector_config_keys

from .diskfull import mount_small_fs

pytestmark = pytest.mark.timeout(120)
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "host" / "vm-2cpu-linux-6.18" / "proc"
RULE = """required_engine_version: 1
rules:
  - id: TEST-busy-run-queue
    pathology: custom-disk-full-test
    desc: "flips with the test procs_running (NOTE: a test rule, no runbook behind it)"
    scope: node
    layer: host
    expr: host_procs_running > 8
"""


@pytest.fixture
def smallfs(tmp_path: Path):
    yield from mount_small_fs(tmp_path / "fs", 512 * 1024)


class Flipper:
    """Rewrites the fixture's /proc/stat so the rule fires and resolves, one transition a flip."""

    def __init__(self, proc: Path) -> None:
        self.stat = proc / "stat"
        self.text = self.stat.read_text()
        self.high = False

    def flip(self) -> None:
        self.high = not self.high
        tmp = self.stat.with_suffix(".tmp")
        tmp.write_text(self.text.replace("procs_running 4", f"procs_running {12 if self.high else 1}"))
        tmp.replace(self.stat)


async def _flips(f: Flipper, seconds: float, every: float = 0.35) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        f.flip()
        await asyncio.sleep(every)


async def _stream_ids(url: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=10)
        info = await js.stream_info(wire.FINDINGS_STREAM.name)
        sub = await js.pull_subscribe(wire.subject_filter("finding", cluster="df"), durable=f"df{time.time_ns()}")
        got: list[str] = []
        while len(got) < info.state.messages:
            for m in await asyncio.wait_for(sub.fetch(200, timeout=2), 10):
                got.append(m.headers[wire.HDR_MSG_ID])
                await m.ack()
        return got
    finally:
        await nc.close()


async def _stored(url: str) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream(timeout=10).stream_info(wire.FINDINGS_STREAM.name)).state.messages
    finally:
        await nc.close()


async def test_agent_keeps_evaluating_and_publishing_on_a_full_spool_disk(nats_server_factory, smallfs, tmp_path):
    srv = nats_server_factory()
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURE, proc)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE)
    flipper = Flipper(proc)
    cfg = load_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": "df1", "cluster": "df", "proc_root": str(proc), "rules": [str(rules)],
        "evaluation_interval": "100ms", "metrics": {"listen": ""}, "reload": {"watch": False},
        "collectors": {"host": {"interval": "100ms"}},
        "nats": {"url": srv.url, "reconnect_time_wait": 0.2},
        "spool": {"dir": str(smallfs.path / "spool"), "fsync": "always", "fsync_interval": "200ms"}})
    agent = Agent(cfg, slots=build_slots(cfg, ["host"]))
    produced: list[str] = []
    agent.findings.listeners.append(lambda f: produced.append(f.event_id))
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.started.wait(), 10)
        pub = agent.publisher
        spool = pub.spool
        assert (spool.fsync, spool.fsync_interval) == ("always", 0.2)  # spool.fsync reaches the spool
        await asyncio.wait_for(pub.wait_connected(5), 10)
        await _flips(flipper, 1.5)
        assert await pub.wait_drained(10) and produced

        # 1. NATS goes away: findings are spooled on disk
        srv.kill()
        await _flips(flipper, 1.5)
        spooled_on_disk = spool.depth
        assert spooled_on_disk >= 2 and spool.in_memory == 0

        # 2. the spool's filesystem fills up while NATS is still away
        smallfs.fill()
        evals = agent.pipeline.engine.evaluations
        await _flips(flipper, 1.5)
        assert agent.pipeline.engine.evaluations > evals + 5, "evaluation stopped on a full disk"
        assert spool.degraded and spool.in_memory >= 2, spool.stats()
        held = spool.in_memory
        assert pub.metrics()["spool_degraded"] == 1.0 and pub.metrics()["spool_in_memory"] >= 2

        # 3. NATS returns, the disk is still full: everything spooled and held goes out, and new
        #    findings keep being published
        srv.start()
        assert await pub.wait_drained(20), pub.metrics()
        assert spool.degraded or spool.in_memory == 0
        before = await _stored(srv.url)
        n_before = len(produced)
        await _flips(flipper, 1.5)
        assert len(produced) > n_before
        assert await pub.wait_drained(10)
        assert await _stored(srv.url) >= before + (len(produced) - n_before)
        assert smallfs.filler.exists()  # all of this with the disk still full

        # 4. space returns: the spool goes back to disk on its own
        smallfs.free()
        deadline = time.monotonic() + 5
        while spool.degraded and time.monotonic() < deadline:
            await _flips(flipper, 0.3)
        assert not spool.degraded and spool.in_memory == 0
        srv.kill()  # and spools to disk again, as before the trouble
        await _flips(flipper, 1.0)
        assert spool.depth >= 1 and spool.in_memory == 0 and list((smallfs.path / "spool").glob("*/*.seg"))
        srv.start()
        assert await pub.wait_drained(20)

        health = agent.health(time.time())
        assert health.drops["spool_error"] == 0 and health.spool_depth == 0
        assert spool.lost == 0 and pub.stats.spool_errors == 0 and agent.tick_errors == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    ids = await _stream_ids(srv.url)
    # after each NATS outage the agent re-announces its open alerts (a copy under
    # "<event id>@<evaluation ms>": a controller that resolved them "node silent" reopens them)
    got = [i for i in ids if "@" not in i]
    again = [i for i in ids if "@" in i]
    assert len(again) == agent.publisher.stats.reannounced and {i.split("@")[0] for i in again} <= set(produced)
    assert len(set(produced)) == len(produced)
    assert got == produced, f"stream holds {len(got)} findings, the agent produced {len(produced)}"
    # the figures of docs/reliability.md's fault table (pytest -s shows them)
    print(f"\ndisk full: produced {len(produced)}, delivered {len(got)}, lost {len(produced) - len(set(got))}, "
          f"duplicated {len(got) - len(set(got))}; {spooled_on_disk} spooled on disk before the disk filled, "
          f"{held} held in memory while it was full")


async def test_a_failing_tick_is_logged_and_counted_and_the_loop_goes_on(tmp_path, caplog):
    """Whatever breaks inside one evaluation tick (here: the pipeline raising once), the next
    ticks run: the agent never exits because of one bad tick."""
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURE, proc)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE)
    cfg = load_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": "t1", "cluster": "t", "proc_root": str(proc), "rules": [str(rules)],
        "evaluation_interval": "100ms", "metrics": {"listen": ""}, "reload": {"watch": False},
        "collectors": {"host": {"interval": "100ms"}}})
    agent = Agent(cfg, slots=build_slots(cfg, ["host"]))
    agent.setup()
    real = agent.pipeline.evaluate
    calls = {"n": 0}

    def evaluate_once_broken(t):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("write to closed file")  # what a broken spool used to raise
        return real(t)

    agent.pipeline.evaluate = evaluate_once_broken
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.started.wait(), 10)
        deadline = time.monotonic() + 10
        while calls["n"] < 8 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not task.done() and calls["n"] >= 8
        assert agent.tick_errors == 1
        assert any("evaluation tick" in r.message and "continuing" in r.message for r in caplog.records)
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
