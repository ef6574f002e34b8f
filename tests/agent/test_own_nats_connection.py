"""The agent's own NATS connection is never a flow the packet features report: the publisher
knows its socket's two ends (checked against a real nats-server's own view of its clients), tells
the agent on every (re)connect, and the pkt collector leaves that connection out - while another
client's connection to the same server stays in."""
from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from pathlib import Path

import pytest

from skewd.agent.publisher import Publisher
from skewd.agent.spool import Spool
from skewd.natsutil import NatsConfig, connect, free_port, socket_endpoints

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def monitored(nats_server_factory):
    """A nats-server with its HTTP monitoring port, to ask it which clients it sees."""
    mport = free_port()
    srv = nats_server_factory(extra_args=["-m", str(mport)])
    return srv, mport


def server_clients(mport: int) -> set[tuple[str, int]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/connz", timeout=5) as r:
        return {(c["ip"], c["port"]) for c in json.load(r)["connections"]}


async def test_socket_endpoints_are_what_the_server_sees(monitored) -> None:
    srv, mport = monitored
    nc = await asyncio.wait_for(connect(NatsConfig.from_dict({"url": srv.url})), 10)
    try:
        ends = socket_endpoints(nc)
        assert ends is not None
        local, peer = ends
        assert peer == ("127.0.0.1", srv.port)
        assert local in server_clients(mport)
    finally:
        await nc.close()
    assert socket_endpoints(nc) is None  # closed: no connection to name


async def test_publisher_names_each_new_connection(monitored, tmp_path: Path) -> None:
    """A listener learns the ends at the first connect and again after the server restarts
    (a new local port); a listener added later is told the current ends at once."""
    srv, mport = monitored
    seen: list = []
    pub = Publisher(NatsConfig.from_dict({"url": srv.url, "reconnect_time_wait": 0.2}),
                    Spool(tmp_path / "spool"), cluster="c")
    pub.add_connect_listener(seen.append)
    await pub.start()
    try:
        await pub.wait_connected(10)
        assert len(seen) == 1 and seen[0] == pub.endpoints and seen[0][0] in server_clients(mport)
        srv.kill()
        srv.start()
        for _ in range(100):
            if len(seen) == 2 and pub.connected:
                break
            await asyncio.sleep(0.1)
        assert len(seen) == 2, seen
        assert seen[1][1] == ("127.0.0.1", srv.port) and seen[1][0] != seen[0][0]
        assert seen[1][0] in server_clients(mport)
        late: list = []
        pub.add_connect_listener(late.append)
        assert late == [seen[1]]
    finally:
        await pub.close()


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="packet capture needs CAP_NET_RAW (root)")
async def test_agent_leaves_its_own_connection_out_of_packet_features(monitored, tmp_path: Path) -> None:
    """A real agent captures the NATS port on loopback while it publishes there: the flows of
    another client of the same server show up, the agent's own (both directions) never do."""
    from skewd.agent.config import load_config
    from skewd.agent.runner import Agent
    from skewd.agent.scheduler import build_slots, collector_config_keys
    from skewd.rules.cli import PACKS

    srv, _ = monitored
    cfg = load_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": "n1", "cluster": "own", "rules": [str(PACKS)], "evaluation_interval": "1s",
        "summary_interval": "1s", "nats": {"url": srv.url}, "spool": {"dir": str(tmp_path / "spool")},
        "metrics": {"listen": "127.0.0.1:0"},
        "collectors": {"pkt": {"interface": "lo", "filter": f"tcp port {srv.port}"}},
    })
    agent = Agent(cfg, slots=build_slots(cfg, ["pkt"]))
    entities: set[str] = set()

    class Flows:
        def on_batch(self, batch) -> None:
            entities.update(str(e) for e, s in zip(batch.entity, batch.signal) if s == "pkt_flow_packets_total")

        def on_tick(self, t, findings) -> None:
            pass

    agent.setup()
    agent.pipeline.add_sink(Flows())
    other = await asyncio.wait_for(connect(NatsConfig.from_dict({"url": srv.url})), 10)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.started.wait(), 20)
        assert [s.name for s in agent.slots if s.active] == ["pkt"], [s.status for s in agent.slots]
        for _ in range(50):  # the other client keeps talking; the agent publishes summaries
            await other.publish("chatter", b"x" * 200)
            await other.flush()
            await asyncio.sleep(0.1)
        own = agent.publisher.endpoints
        assert own is not None
        (la, lp), (ra, rp) = own
        mine = {f"tcp {la}:{lp}>{ra}:{rp}", f"tcp {ra}:{rp}>{la}:{lp}"}
        (ola, olp), (ora, orp) = socket_endpoints(other)
        theirs = {f"tcp {ola}:{olp}>{ora}:{orp}", f"tcp {ora}:{orp}>{ola}:{olp}"}
        assert theirs <= entities, f"the other client's flows were not captured: {sorted(entities)}"
        assert not (mine & entities), f"the agent's own NATS flows were reported: {sorted(mine & entities)}"
        assert agent.summaries_sent > 0  # it did publish over that connection meanwhile
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        await other.close()
