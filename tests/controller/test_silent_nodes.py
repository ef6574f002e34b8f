"""Stale nodes (issue 20) and per-node cardinality (issue 21): a node whose agent stops talking
has its open findings resolved "node silent" after ``ingest.silent_intervals`` of its intervals,
the incident that held them is published resolved with that reason, and a restarted controller
does not re-open (or re-announce) it - tested with a real nats-server and JetStream KV, across
controller restarts. A silent node's per-node state is forgotten; new nodes beyond
``ingest.max_nodes`` are rejected and counted."""
from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from types import SimpleNamespace

import nats
import pytest

from skewd import wire
from skewd.controller import messages
from skewd.controller.config import load_config
from skewd.controller.service import Controller
from skewd.controller.state import StateStore
from skewd.lab.harness import CaptureJetStream, MemoryState
from skewd.model import Layer, Scope, State

from .helpers import RULES, Heartbeats, config, incidents, wait_for
from .sim import finding, publish_finding

pytestmark = pytest.mark.timeout(240)

SILENT = {"silent_intervals": 3}  # 3 s at the 1 s evaluation interval


def _cfg(url: str, cluster: str):
    return config(url, cluster, ingest=SILENT, warmup="1s", correlation={"group_wait": "1s"})


def _stall(node: str, cluster: str):
    return finding(node, "GPU-3-stall", "GPU-3", Layer.ENGINE, time.time(), cluster=cluster, entity="engine0",
                   scope=Scope.ENGINE)


async def _messages_for(url: str, cluster: str, incident_id: str):
    return [i for i in await incidents(url, cluster) if i.id == incident_id]


async def _watch_incidents(nc, cluster: str) -> list:
    """Every incident message published from now on, as core NATS subscribers see it (the
    stream would hide a re-publication inside its 2-minute duplicate window)."""
    seen: list = []

    async def cb(msg) -> None:
        seen.append(messages.decode(msg.data, messages.Kind.INCIDENT))

    await nc.subscribe(messages.incident_subject(cluster), cb=cb)
    await nc.flush()
    return seen


async def _open_incident_for(url: str, cluster: str, finding_id: str):
    async def shown():
        return next((i for i in await incidents(url, cluster) if finding_id in i.findings and i.state == "open"), None)
    return await wait_for(shown, 20, "the incident, open", every=0.3)


async def _resolved_silent(url: str, cluster: str, incident_id: str, timeout: float = 20):
    async def resolved():
        return next((i for i in await _messages_for(url, cluster, incident_id) if i.state == "resolved"), None)
    inc = await wait_for(resolved, timeout, "the incident's resolution", every=0.3)
    assert inc.resolved_reason == "node silent" and "node silent" in inc.summary, inc
    return inc


async def test_a_silent_node_s_incident_resolves_node_silent_and_a_restart_does_not_reopen_it(nats_server) -> None:
    url, cluster = nats_server.url, "silent1"
    a = Controller(_cfg(url, cluster))
    await asyncio.wait_for(a.start(), 30)
    nc = await nats.connect(url)
    beats = Heartbeats(nc, cluster).start()
    b = None
    try:
        await asyncio.sleep(2.0)
        f = _stall("n1", cluster)
        await publish_finding(nc.jetstream(), f)
        inc = await _open_incident_for(url, cluster, f.id)
        beats.live.discard("n1")  # n1's agent stops (crash, power, partition)
        t0 = time.monotonic()
        await _resolved_silent(url, cluster, inc.id)
        assert time.monotonic() - t0 >= 2.5  # not before 3 intervals of silence (the others keep talking)
        assert a.stats.findings_silenced == 1 and a.stats.nodes_silenced == 1
        assert "n1" not in a.aligner.clocks and "n1" not in a.nodes
        saved = await StateStore(await nc.jetstream().key_value("SKEWD_CONTROLLER"), cluster).load()
        assert saved["finding"][f.fingerprint]["state"] == "resolved"
        assert not saved["incident"]
        await a.stop()
        seen = await _watch_incidents(nc, cluster)

        b = Controller(_cfg(url, cluster))
        await asyncio.wait_for(b.start(), 30)
        await asyncio.sleep(5.0)  # evaluating and correlating on the live nodes' summaries
        assert seen == []  # nothing re-published
        assert b.status()["open_incidents"] == []
        assert b.correlator.findings[f.fingerprint].state is State.RESOLVED
    finally:
        await beats.stop()
        await nc.close()
        await a.stop()
        if b is not None:
            await b.stop()


async def test_a_node_that_died_while_the_controller_was_down_is_not_reannounced(nats_server) -> None:
    url, cluster = nats_server.url, "silent2"
    a = Controller(_cfg(url, cluster))
    await asyncio.wait_for(a.start(), 30)
    nc = await nats.connect(url)
    beats = Heartbeats(nc, cluster).start()
    b = None
    try:
        await asyncio.sleep(2.0)
        dead, alive = _stall("n1", cluster), _stall("n2", cluster)
        await publish_finding(nc.jetstream(), dead)
        await publish_finding(nc.jetstream(), alive)
        inc_dead = await _open_incident_for(url, cluster, dead.id)
        inc_alive = await _open_incident_for(url, cluster, alive.id)
        await a.stop()
        beats.live.discard("n1")  # n1 dies while no controller runs
        await asyncio.sleep(1.0)
        seen = await _watch_incidents(nc, cluster)

        b = Controller(_cfg(url, cluster))
        await asyncio.wait_for(b.start(), 30)
        assert b.status()["nodes"]["not_heard_since_restart"] == ["n1", "n2"]
        resolved = await _resolved_silent(url, cluster, inc_dead.id)
        # the restarted controller never announced the dead node's incident as open again
        after = [i.state for i in seen if i.id == inc_dead.id]
        assert after == ["resolved"], after
        assert resolved.opened_at == inc_dead.opened_at
        # the live node was heard at once and its incident is still open
        assert [i.id for i in b.correlator.open_incidents()] == [inc_alive.id]
        assert b.status()["nodes"]["not_heard_since_restart"] == []
    finally:
        await beats.stop()
        await nc.close()
        await a.stop()
        if b is not None:
            await b.stop()


# -- cardinality (the controller service with in-memory KV and JetStream, as the lab runs it) ----

def _summary_msg(cluster: str, node: str, t: float) -> SimpleNamespace:
    s = wire.Summary(node=node, cluster=cluster, t=t, interval=1.0,
                     signals={"summary_gpu_util_mean_ratio": {"": 0.5}, "summary_requests_waiting": {"": 3.0},
                              "gpu_utilization_ratio": {f"gpu{g}": 0.5 for g in range(8)},
                              "collective_burst_starts": {"0": t - 0.5, "1": t - 0.25},
                              "summary_engine_phase": {"": 1.0}},
                     clock_sync=wire.ClockSync(True, 0.001), agent_version="test",
                     labels={"tp_group": f"tp-{node[:-1]}", "tp_rank": node[-1]})
    return SimpleNamespace(subject=wire.summary_subject(cluster, node), data=wire.encode(s))


def _offline(max_nodes: int) -> tuple[Controller, list[float]]:
    wall = [1_800_000_000.0]
    cfg = load_config(None, env={}, overrides={"cluster": "card", "rules": [RULES], "warmup": "1s",
                                               "ingest": {"max_nodes": max_nodes, "silent_intervals": 5}})
    ctl = Controller(cfg, wall_clock=lambda: wall[0])
    ctl.state = MemoryState(cfg.cluster)
    ctl.js = CaptureJetStream()
    return ctl, wall


def _feed(ctl: Controller, wall: list[float], nodes: list[str], seconds: int) -> None:
    loop = asyncio.new_event_loop()
    try:
        for _ in range(seconds):
            wall[0] += 1.0
            for n in nodes:
                loop.run_until_complete(ctl._on_summary(_summary_msg("card", n, wall[0])))
            loop.run_until_complete(ctl.tick(wall[0]))
    finally:
        loop.close()


def _expire(ctl: Controller, wall: list[float], after: float) -> list[str]:
    wall[0] += after
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(ctl.expire_silent_nodes(wall[0]))
    finally:
        loop.close()


def test_new_nodes_beyond_max_nodes_are_rejected_until_silent_ones_make_room() -> None:
    ctl, wall = _offline(max_nodes=300)
    first = [f"a{i:04d}" for i in range(1000)]
    _feed(ctl, wall, first, 2)
    assert len(ctl.nodes) == 300 and len(ctl.aligner.clocks) == 300
    assert ctl.status()["rejected"] == {"summary": {"too_many_nodes": 2 * 700}}
    assert ctl.stats.summaries == 2 * 300
    gone = _expire(ctl, wall, 6.0)  # 5 intervals of silence, and then some
    assert sorted(gone) == first[:300]
    # nothing of them is left: aligner, timelines, topology, store rows, node labels, layouts
    assert not ctl.aligner.clocks and not ctl.aligner.bursts and not ctl.timelines.engines
    assert not ctl.topology.learned and not ctl.topology.reported
    assert not ctl.store.blocks and not ctl.store.registry.node_labels and not ctl.feed._layouts
    assert len(ctl.store.registry._ids) == 0
    second = [f"b{i:04d}" for i in range(300)]
    _feed(ctl, wall, second, 2)
    assert len(ctl.nodes) == 300 and set(ctl.aligner.clocks) == set(second)
    assert ctl.status()["rejected"] == {"summary": {"too_many_nodes": 2 * 700}}


def test_memory_of_nodes_that_left_is_given_back() -> None:
    """100,000 distinct node names took the controller from 58 MB to 1.85 GB in the report
    (100k); here 150 come, talk for 2 s and leave: what they cost is given back."""
    ctl, wall = _offline(max_nodes=10_000)
    _feed(ctl, wall, ["warm"], 2)  # rules, catalogue and caches made before the baseline
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        _feed(ctl, wall, [f"n{i:05d}" for i in range(150)], 2)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
        _expire(ctl, wall, 10.0)
        _feed(ctl, wall, ["warm"], 1)
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown > 150 * 2_000, grown  # the nodes did cost something (kB each)
    print(f"150 nodes: {grown / 1e6:.1f} MB, left after they fell silent: {left / 1e6:.2f} MB")
    assert left < 0.1 * grown, (grown, left)
