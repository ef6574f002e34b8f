"""The client library: typed events of every kind from a real server, resumable durable
consumption, and the reply helpers' failure mode when no controller runs."""
from __future__ import annotations

import asyncio
import contextlib

import nats
import pytest

from skewd import wire
from skewd.controller import client
from skewd.controller import messages
from skewd.model import Finding, Layer
from skewd.natsutil import ensure_streams

from .sim import ScriptedGroup, finding
from .test_messages import _suggestion

pytestmark = pytest.mark.timeout(60)


async def _streams(js) -> None:
    await ensure_streams(js, [wire.FINDINGS_STREAM, wire.REMAPS_STREAM, messages.INCIDENTS_STREAM])


def _sug(cluster: str, key: str) -> messages.RemapSuggestion:
    s = _suggestion()
    s.cluster, s.key = cluster, key
    return s


async def _publish_sug(js, s: messages.RemapSuggestion) -> None:
    await js.publish(wire.remap_subject(s.cluster), messages.encode(s), headers=messages.headers(s, s.key))


async def test_subscribe_yields_typed_events_of_every_kind(nats_server) -> None:
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await _streams(js)
    got: list = []
    done = asyncio.Event()

    async def consume():
        async for ev in client.subscribe(nc, "ck", kinds=client.KINDS, deliver="all"):
            got.append(ev)
            if len(got) == 6:
                done.set()

    task = asyncio.create_task(consume())
    try:
        await asyncio.sleep(0.5)  # subscriptions in place before the best-effort kinds are sent
        f = finding("n1", "GPU-2-x", "GPU-2", Layer.ENGINE, 100.0, cluster="ck")
        await js.publish(wire.subject_for(f), wire.encode(f), headers=wire.headers_for(f))
        await _publish_sug(js, _sug("ck", "k1"))
        inc = messages.Incident(id="i", cluster="ck", pathology="EW-1", rule_id="r", state="open", group={}, culprit=None,
                                cause=None, victims=[], findings=[], inhibited=[], phase=None, effect=None, summary="",
                                opened_at=1.0, updated_at=1.0)
        await js.publish(messages.incident_subject("ck"), messages.encode(inc))
        g = ScriptedGroup(cluster="ck")
        await nc.publish(wire.summary_subject("ck", "n0"), g.summary(0, "n0"))
        await nc.publish(wire.phase_subject("ck", "n0", "engine0"), g.phase(0))
        h = wire.Health(node="n0", cluster="ck", t=1.0, collectors={}, rules=wire.RulesHealth(active=3),
                        last_reload=wire.ReloadStatus(ok=True), spool_depth=0, drops={}, agent_version="t")
        await nc.publish(wire.health_subject("ck", "n0"), wire.encode(h))
        await nc.publish(wire.summary_subject("ck", "n1"), b'{"schema": 1, "kind": "summary"}')  # skipped
        await asyncio.wait_for(done.wait(), 10)
        kinds = {type(e) for e in got}
        assert kinds == {Finding, messages.RemapSuggestion, messages.Incident, wire.Summary, messages.PhaseRecord, wire.Health}
        sug = next(e for e in got if isinstance(e, messages.RemapSuggestion))
        assert sug.actions[0].type is messages.ActionType.HOST_TUNING
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await nc.close()


async def test_binary_summaries_are_read_once_their_layout_came_by(nats_server) -> None:
    nc = await nats.connect(nats_server.url)
    got: list = []
    errors: list = []
    done = asyncio.Event()

    async def consume():
        async for ev in client.subscribe(nc, "cb", kinds=("summary",), on_error=lambda k, e: errors.append(e)):
            got.append(ev)
            if len(got) == 2:
                done.set()

    task = asyncio.create_task(consume())
    try:
        await asyncio.sleep(0.5)
        summaries = [wire.Summary(node="n0", cluster="cb", t=100.0 + i, interval=1.0,
                                  signals={"summary_gpu_util_mean_ratio": {"": 0.5}}, clock_sync=wire.ClockSync(True),
                                  agent_version="t") for i in range(3)]
        enc = wire.SummaryEncoder()
        raw = [enc.encode(s) for s in summaries]  # the first carries the layout
        for r in (raw[1], raw[0], raw[2]):  # the second before it: its layout not come by yet
            await nc.publish(wire.summary_subject("cb", "n0"), r)
        await asyncio.wait_for(done.wait(), 10)
        assert [e.t for e in got] == [100.0, 102.0] and got[0] == wire.decode(wire.encode(summaries[0]))
        assert len(errors) == 1 and isinstance(errors[0], wire.LayoutUnknownError)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await nc.close()


async def test_durable_subscription_resumes_where_it_left_off(nats_server) -> None:
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await _streams(js)
    try:
        for k in ("d1", "d2", "d3"):
            await _publish_sug(js, _sug("dur", k))
        seen: list[str] = []
        async with contextlib.aclosing(client.subscribe(nc, "dur", kinds=["remap"], deliver="all",
                                                        durable="router-x")) as events:
            async for ev in events:
                seen.append(ev.key)
                if len(seen) == 2:
                    break  # stopped while handling d2: d1 is acknowledged, d2 is not
        async def second() -> None:
            async with contextlib.aclosing(client.subscribe(nc, "dur", kinds=["remap"], durable="router-x")) as evs:
                async for ev in evs:
                    seen.append(ev.key)
                    if {"d2", "d3"} <= set(seen[2:]):
                        break
        await asyncio.wait_for(second(), 20)
        # d1 is not seen again; d2 (handed back) and d3 come next, a redelivery may overtake
        assert seen[:2] == ["d1", "d2"] and sorted(seen[2:]) == ["d2", "d3"]
    finally:
        await nc.close()


async def test_a_message_that_reached_the_pull_inbox_unfetched_is_found_to_hand_back(nats_server) -> None:
    # what a puller's lingering pull request delivers after the puller was cancelled sits in the
    # subscription's inbox: subscribe() hands it back on close instead of leaving it to ack_wait
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await _streams(js)
    try:
        await _publish_sug(js, _sug("inbox", "i1"))
        psub = await js.pull_subscribe(wire.remap_subject("inbox"), durable="inbox-remap",
                                       stream=wire.REMAPS_STREAM.name)
        assert client._left_in_inbox([psub]) == []
        # a pull request of our own, answered into the subscription's inbox, never fetched
        await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{wire.REMAPS_STREAM.name}.inbox-remap", b'{"batch": 1}',
                         reply=psub._deliver)
        for _ in range(100):
            left = client._left_in_inbox([psub])
            if left:
                break
            await asyncio.sleep(0.05)
        assert len(left) == 1 and messages.decode(left[0].data).key == "i1"
        await left[0].nak()
        (again,) = await psub.fetch(1, timeout=5)  # handed back: at once, not after ack_wait
        assert again.metadata.num_delivered == 2
    finally:
        await nc.close()


async def test_reply_without_a_controller_raises_a_clear_error(nats_server) -> None:
    with pytest.raises(client.ReplyError, match="no skewd controller for cluster 'nobody'"):
        await client.ack(nats_server.url, "k", consumer="me", cluster="nobody", timeout=0.5)
    with pytest.raises(ValueError):
        client.subscribe(nats_server.url, "c", kinds=["bogus"]).__anext__().send(None)
