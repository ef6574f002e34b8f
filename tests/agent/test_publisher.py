"""Publisher against a real nats-server: ordered durable findings, de-duplication, best-effort
summaries/health, the spool bound while NATS is down, and agent restarts."""
from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import nats
import pytest

from skewd import wire
from skewd.agent.publisher import Publisher
from skewd.agent.spool import Spool
from skewd.model import Finding, Layer, Scope, Severity, State
from skewd.natsutil import NatsConfig, ensure_streams, free_port

pytestmark = pytest.mark.timeout(90)

_clusters = itertools.count()


def _cluster(tag: str) -> str:
    """A fresh cluster name per test, so tests sharing the module's stream do not see each other."""
    return f"{tag}.{next(_clusters)}"  # the dot also exercises token escaping end to end


def _finding(cluster: str, i: int, **kw) -> Finding:
    d = dict(rule_id=("GPU-2-kv-saturation", "NET-1-rdma-retrans", "PCIE-3-replay")[i % 3],
             pathology="demo", severity=Severity.WARNING, layer=Layer.GPU, scope=Scope.GPU,
             node=f"node.{i % 4}", entity=f"gpu{i % 8}", state=State.FIRING if i % 2 else State.PENDING,
             active_at=1700000000.0 + i, evaluated_at=1700000001.0 + i, evidence={"v": i / 10},
             summary=f"finding {i}", cluster=cluster,
             # event_id does not include the cluster (skewd.model fingerprint): without this label the
             # same i in two tests would share a Nats-Msg-Id and be de-duplicated across tests
             labels={"test_cluster": cluster})
    d.update(kw)
    return Finding(**d)


async def _pull_all(url: str, cluster: str, durable: str, expect: int, timeout: float = 10.0) -> list:
    """Every stored finding of ``cluster``, in stream order, via a durable pull consumer."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=20)  # API calls: a loaded CI machine can be slow to answer
        sub = await js.pull_subscribe(wire.subject_filter("finding", cluster=cluster), durable=durable,
                                      stream=wire.FINDINGS_STREAM.name)
        got: list = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(200, timeout=0.5)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):  # nats-py raises the bare one when the deadline ran out between its two requests
                if len(got) >= expect:
                    break
                continue
            for m in msgs:
                await m.ack()
            got.extend(msgs)
        return got
    finally:
        await nc.close()


@pytest.fixture
def spool(tmp_path: Path):
    sp = Spool(tmp_path / "spool")
    yield sp
    sp.close()


async def _started(url: str, sp: Spool, cluster: str = "c", **kw) -> Publisher:
    pub = Publisher(NatsConfig(servers=(url,), reconnect_time_wait=0.2), sp, cluster=cluster, **kw)
    await pub.start()
    return pub


async def test_findings_arrive_in_order_with_headers_and_decode_equal(nats_server, spool) -> None:
    cluster = _cluster("order")
    pub = await _started(nats_server.url, spool)
    try:
        await asyncio.wait_for(pub.wait_connected(5), 10)
        sent = [_finding(cluster, i) for i in range(60)]
        for f in sent:
            pub.publish_finding(f)
        assert await pub.wait_drained(15), f"spool not drained: {pub.metrics()}"
    finally:
        await pub.stop()
    msgs = await _pull_all(nats_server.url, cluster, "order", len(sent))
    assert [m.headers[wire.HDR_MSG_ID] for m in msgs] == [f.event_id for f in sent]
    for m, f in zip(msgs, sent):
        assert m.subject == wire.finding_subject(cluster, f.node, f.rule_id)
        assert m.headers[wire.HDR_KIND] == "finding" and m.headers[wire.HDR_SCHEMA] == "1"
        back = wire.decode_finding(m.data)
        assert back.to_dict() == f.to_dict()
        assert wire.parse_subject(m.subject).tokens == {"cluster": cluster, "node": f.node, "rule": f.rule_id}
    assert pub.stats.published == 60 and pub.stats.publish_errors == 0 and pub.stats.duplicates == 0


async def test_streams_are_created_as_specified_and_ensure_is_idempotent(nats_server, spool) -> None:
    pub = await _started(nats_server.url, spool)
    try:
        await asyncio.wait_for(pub.wait_connected(5), 10)
        pub.publish_finding(_finding(_cluster("streams"), 0))
        assert await pub.wait_drained(10)
    finally:
        await pub.stop()
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream(timeout=20)
        info = await js.stream_info("SKEWD_FINDINGS")
        c = info.config
        assert c.subjects == ["skewd.v1.finding.>"] and c.storage == "file"
        assert c.duplicate_window == pytest.approx(120.0) and c.discard == "old"
        assert c.max_age == pytest.approx(7 * 86400.0)
        assert await ensure_streams(js, [wire.FINDINGS_STREAM]) == {"SKEWD_FINDINGS": "unchanged"}
        # an agent with newer limits brings the stream up to date; the remap stream is created
        import dataclasses
        wider = dataclasses.replace(wire.FINDINGS_STREAM, max_age_s=14 * 86400.0)
        assert await ensure_streams(js, [wider, wire.REMAPS_STREAM]) == {
            "SKEWD_FINDINGS": "updated", "SKEWD_REMAPS": "created"}
        assert (await js.stream_info("SKEWD_FINDINGS")).config.max_age == pytest.approx(14 * 86400.0)
        # an agent with the default publisher leaves an operator's changed limits alone
        pub = await _started(nats_server.url, spool)
        try:
            await asyncio.wait_for(pub.wait_connected(5), 10)
            pub.publish_finding(_finding(_cluster("streams"), 1))
            assert await pub.wait_drained(10)
        finally:
            await pub.stop()
        assert (await js.stream_info("SKEWD_FINDINGS")).config.max_age == pytest.approx(14 * 86400.0)
        await ensure_streams(js, [wire.FINDINGS_STREAM])  # back to the default for the other tests
    finally:
        await nc.close()


async def test_a_resent_finding_is_stored_once(nats_server, spool) -> None:
    """A crash between the server's PubAck and the spool ack re-sends on restart: the stream's
    duplicate window must drop the copy."""
    cluster = _cluster("dedup")
    f = _finding(cluster, 1)
    pub = await _started(nats_server.url, spool)
    try:
        await asyncio.wait_for(pub.wait_connected(5), 10)
        pub.publish_finding(f)
        pub.publish_finding(f)  # the same transition again
        pub.publish_finding(_finding(cluster, 2))
        assert await pub.wait_drained(10)
    finally:
        await pub.stop()
    msgs = await _pull_all(nats_server.url, cluster, "dedup", 2)
    assert [m.headers[wire.HDR_MSG_ID] for m in msgs] == [f.event_id, _finding(cluster, 2).event_id]
    assert pub.stats.published == 3 and pub.stats.duplicates == 1


async def test_an_oversized_finding_is_rejected_without_blocking_the_queue(nats_server, spool) -> None:
    cluster = _cluster("big")
    huge = _finding(cluster, 0, summary="x" * (2 << 20))  # larger than the server's max_payload
    pub = await _started(nats_server.url, spool)
    try:
        await asyncio.wait_for(pub.wait_connected(5), 10)
        pub.publish_finding(huge)
        pub.publish_finding(_finding(cluster, 1))
        assert await pub.wait_drained(10)
    finally:
        await pub.stop()
    msgs = await _pull_all(nats_server.url, cluster, "big", 1)
    assert [m.headers[wire.HDR_MSG_ID] for m in msgs] == [_finding(cluster, 1).event_id]
    assert pub.stats.rejected == 1 and pub.drops()["rejected"] == 1


async def test_summary_and_health_go_best_effort_over_core_nats(nats_server, spool) -> None:
    cluster = _cluster("be")
    summary = wire.Summary(node="n.1", cluster=cluster, t=1700000000.0, interval=5.0,
                           signals={"gpu_utilization_ratio": {"gpu0": 0.5}},
                           clock_sync=wire.ClockSync(True, 0.001), agent_version="0.1.0")
    health = wire.Health(node="n.1", cluster=cluster, t=1700000000.0,
                         collectors={"nvml": wire.CollectorHealth("absent", "no driver")},
                         rules=wire.RulesHealth(3, {"R-1": "needs nvml"}), last_reload=wire.ReloadStatus(True),
                         spool_depth=0, drops={}, agent_version="0.1.0")
    nc = await nats.connect(nats_server.url)
    pub = await _started(nats_server.url, spool)
    try:
        sums = await nc.subscribe(wire.subject_filter("summary", cluster=cluster))
        hs = await nc.subscribe(wire.subject_filter("health", cluster=cluster))
        await nc.flush()
        await asyncio.wait_for(pub.wait_connected(5), 10)
        assert await pub.publish_summary(summary) and await pub.publish_health(health)
        m1 = await asyncio.wait_for(sums.next_msg(), 5)
        m2 = await asyncio.wait_for(hs.next_msg(), 5)
        assert m1.subject == wire.summary_subject(cluster, "n.1") and wire.decode(m1.data) == summary
        assert m2.subject == wire.health_subject(cluster, "n.1") and wire.decode(m2.data) == health
        assert m1.headers[wire.HDR_KIND] == "summary"
        assert spool.depth == 0  # never spooled
        assert pub.stats.best_effort_published == 2
    finally:
        await pub.stop()
        await nc.close()


async def test_binary_summaries_carry_their_layout_first_and_again_after_a_drop(nats_server, spool) -> None:
    """publish.summary_encoding: binary. A subscriber reading with a BinarySummaryReader gets
    the summaries the JSON decoder would; the first carries its layout, the next ones do not,
    and after a summary the publisher could not send the next one carries it again."""
    cluster = _cluster("bin")
    summaries = [wire.Summary(node="n1", cluster=cluster, t=1700000000.0 + i, interval=1.0,
                              signals={"summary_gpu_util_mean_ratio": {"": 0.5 + i / 10}, "x": {"": None}},
                              clock_sync=wire.ClockSync(True, 0.001), agent_version="0.1.0",
                              labels={"tp_group": "tp0"}) for i in range(3)]
    nc = await nats.connect(nats_server.url)
    pub = await _started(nats_server.url, spool, summary_encoding="binary", summary_layout_every=60.0)
    try:
        sub = await nc.subscribe(wire.subject_filter("summary", cluster=cluster) + ".*")
        await nc.flush()
        await asyncio.wait_for(pub.wait_connected(5), 10)
        for s in summaries[:2]:
            assert await pub.publish_summary(s)
        got = [await asyncio.wait_for(sub.next_msg(), 5) for _ in range(2)]
        assert [bool(wire.read_binary(m.data).layout) for m in got] == [True, False]
        reader = wire.BinarySummaryReader()
        assert [reader.read(m.data) for m in got] == [wire.decode(wire.encode(s)) for s in summaries[:2]]
        assert got[0].subject == wire.subject_for(summaries[0]) and got[0].headers[wire.HDR_KIND] == "summary"
        connected, pub._nc = pub._nc, None  # as while disconnected: dropped, counted
        assert await pub.publish_summary(summaries[2]) is False
        pub._nc = connected
        assert await pub.publish_summary(summaries[2])
        again = await asyncio.wait_for(sub.next_msg(), 5)
        assert wire.read_binary(again.data).layout  # a reader may have missed it
    finally:
        await pub.stop()
        await nc.close()


async def test_spool_bound_while_nats_is_down(nats_server_factory, tmp_path: Path) -> None:
    """NATS down: publish_* never blocks; past the bound the oldest are evicted and counted; the
    newest are delivered, in order, once NATS comes up."""
    srv = nats_server_factory(start=False, port=free_port())
    cluster = _cluster("bound")
    sp = Spool(tmp_path / "spool", max_messages=10)
    pub = await _started(srv.url, sp)
    try:
        sent = [_finding(cluster, i) for i in range(25)]
        slowest = 0.0
        for f in sent:
            t0 = time.perf_counter()
            pub.publish_finding(f)
            slowest = max(slowest, time.perf_counter() - t0)
        assert slowest < 0.5  # a disk append, not a network wait
        summary = wire.Summary(node="n", cluster=cluster, t=0.0, interval=1.0, signals={},
                               clock_sync=wire.ClockSync(False), agent_version="x")
        assert await asyncio.wait_for(pub.publish_summary(summary), 1) is False
        m = pub.metrics()
        assert (m["spool_depth"], m["spool_dropped"], m["best_effort_dropped"]) == (10, 15, 1)
        assert pub.drops() == {"spool_full": 15, "rejected": 0, "spool_error": 0, "best_effort": 1}
        srv.start()
        await asyncio.wait_for(pub.wait_connected(10), 15)
        assert await pub.wait_drained(15)
    finally:
        await pub.stop()
        sp.close()
    msgs = await _pull_all(srv.url, cluster, "bound", 10)
    assert [m.headers[wire.HDR_MSG_ID] for m in msgs] == [f.event_id for f in sent[15:]]


async def test_spooled_findings_survive_an_agent_restart(nats_server_factory, tmp_path: Path) -> None:
    srv = nats_server_factory(start=False, port=free_port())
    cluster = _cluster("restart")
    sent = [_finding(cluster, i) for i in range(7)]
    sp = Spool(tmp_path / "spool")
    pub = await _started(srv.url, sp)
    for f in sent:
        pub.publish_finding(f)
    await pub.stop()  # the agent stops while NATS is still down
    sp.close()
    srv.start()
    sp2 = Spool(tmp_path / "spool")
    assert sp2.depth == 7
    pub2 = await _started(srv.url, sp2)
    try:
        await asyncio.wait_for(pub2.wait_connected(10), 15)
        assert await pub2.wait_drained(10)
    finally:
        await pub2.stop()
        sp2.close()
    msgs = await _pull_all(srv.url, cluster, "restart", 7)
    assert [m.headers[wire.HDR_MSG_ID] for m in msgs] == [f.event_id for f in sent]


async def test_publish_finding_from_another_thread_wakes_the_drain(nats_server, spool) -> None:
    cluster = _cluster("thread")
    pub = await _started(nats_server.url, spool)
    try:
        await asyncio.wait_for(pub.wait_connected(5), 10)
        await asyncio.to_thread(pub.publish_finding, _finding(cluster, 0))
        assert await pub.wait_drained(5)
    finally:
        await pub.stop()
    assert len(await _pull_all(nats_server.url, cluster, "thread", 1)) == 1


async def test_metrics_expose_the_counters_the_agent_needs(nats_server, spool) -> None:
    pub = await _started(nats_server.url, spool)
    try:
        await asyncio.wait_for(pub.wait_connected(5), 10)
        m = pub.metrics()
    finally:
        await pub.stop()
    for key in ("published", "publish_errors", "duplicates", "rejected", "reconnects", "spool_depth",
                "spool_bytes", "spool_dropped", "best_effort_dropped", "connected"):
        assert key in m and isinstance(m[key], float)
    assert m["connected"] == 1.0
