"""The outage the spool exists for: nats-server crashes mid-run and comes back ~10 s later on the
same port and store while the agent keeps publishing at 20 findings/s. Every finding must be
stored exactly once, in publish order, and the agent must never block."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import pytest

from skewd import wire
from skewd.agent.publisher import Publisher
from skewd.agent.spool import Spool
from skewd.model import Finding, Layer, Scope, Severity, State
from skewd.natsutil import NatsConfig

pytestmark = pytest.mark.timeout(120)

RATE = 20.0  # findings per second
BEFORE, OUTAGE, AFTER = 3.0, 10.0, 3.0  # seconds


def _finding(i: int) -> Finding:
    return Finding(rule_id=("GPU-2-kv-saturation", "NET-1-rdma-retrans")[i % 2], pathology="demo",
                   severity=Severity.CRITICAL, layer=Layer.NETWORK, scope=Scope.RDMA_PORT,
                   node=f"node-{i % 5}", entity="mlx5_0/1", state=(State.PENDING, State.FIRING, State.RESOLVED)[i % 3],
                   active_at=1700000000.0 + i * 0.001, evaluated_at=1700000000.0 + i, cluster="outage")


async def test_findings_survive_a_server_crash_exactly_once_and_in_order(nats_server_factory, tmp_path: Path) -> None:
    srv = nats_server_factory()
    port, store = srv.port, srv.store_dir
    sp = Spool(tmp_path / "spool", fsync="interval")
    pub = Publisher(NatsConfig(servers=(srv.url,), reconnect_time_wait=0.5, connect_timeout=1.0), sp,
                    cluster="outage", pub_ack_timeout=1.0)
    await pub.start()
    await asyncio.wait_for(pub.wait_connected(5), 10)

    sent: list[Finding] = []
    slowest_call = 0.0
    max_depth_while_down = 0
    down = asyncio.Event()

    async def produce() -> None:
        nonlocal slowest_call, max_depth_while_down
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < BEFORE + OUTAGE + AFTER:
            f = _finding(i)
            c0 = time.perf_counter()
            pub.publish_finding(f)
            slowest_call = max(slowest_call, time.perf_counter() - c0)
            sent.append(f)
            if down.is_set():
                max_depth_while_down = max(max_depth_while_down, sp.depth)
            i += 1
            await asyncio.sleep(max(0.0, t0 + i / RATE - time.monotonic()))

    producer = asyncio.create_task(produce())
    try:
        await asyncio.sleep(BEFORE)
        srv.kill()  # crash: no goodbye to clients
        down.set()
        await asyncio.sleep(OUTAGE)
        down.clear()
        srv.start()  # same port, same store dir
        assert (srv.port, srv.store_dir) == (port, store)
        await asyncio.wait_for(producer, BEFORE + OUTAGE + AFTER + 10)
        assert await pub.wait_drained(30), f"spool not drained after the outage: {pub.metrics()}"
    finally:
        producer.cancel()
        await pub.stop()
        sp.close()

    expected = (BEFORE + OUTAGE + AFTER) * RATE
    assert 0.8 * expected <= len(sent) <= 1.05 * expected, "producer was held up"
    assert slowest_call < 0.25, f"publish_finding blocked for {slowest_call:.3f}s"
    assert max_depth_while_down >= 0.8 * OUTAGE * RATE, "findings were not spooled during the outage"
    assert pub.stats.disconnects >= 1 and pub.stats.reconnects >= 1

    nc = await nats.connect(srv.url)
    try:
        js = nc.jetstream(timeout=20)
        info = await js.stream_info(wire.FINDINGS_STREAM.name)
        sub = await js.pull_subscribe(wire.subject_filter("finding", cluster="outage"), durable="outage")
        got: list[str] = []
        while len(got) < info.state.messages:
            for m in await asyncio.wait_for(sub.fetch(500, timeout=2), 10):
                got.append(m.headers[wire.HDR_MSG_ID])
                assert wire.decode_finding(m.data).event_id == got[-1]
                await m.ack()
    finally:
        await nc.close()
    ids = [f.event_id for f in sent]
    assert len(set(ids)) == len(ids)
    assert info.state.messages == len(sent), f"stored {info.state.messages}, published {len(sent)}"
    assert got == ids  # every finding once, in publish order
