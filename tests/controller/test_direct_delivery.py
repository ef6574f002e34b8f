"""Summaries reach the controller's intake without nats-py's per-message path
(skewd.natsutil.direct_delivery), with a real nats-server: a routed subscription's messages, headers
or not, land in its backlog in the order sent and its callback gets none; every other subscription
is served as before; a client whose internals differ is left as it is; and a controller takes in
every summary through either path (which one carried them is checked; that both leave the same
state is not: both hand the same bodies to the same intake methods)."""
from __future__ import annotations

import asyncio

import nats
import numpy as np
import pytest

from skewd import wire
from skewd.controller import service
from skewd.controller.service import Controller
from skewd.natsutil import Backlog, direct_delivery

from .helpers import config, offline_controller, wait_for
from .test_binary_intake import _Msg, _messages

pytestmark = pytest.mark.timeout(120)


async def test_a_routed_subscription_fills_its_backlog_in_order_and_others_keep_their_callbacks(nats_server) -> None:
    nc = await nats.connect(nats_server.url)
    pub = await nats.connect(nats_server.url)
    routed_cb: list[bytes] = []
    other_cb: list[bytes] = []

    async def on_routed(msg) -> None:
        routed_cb.append(msg.data)

    probes = []

    async def on_other(msg) -> None:
        (probes if msg.data == b"probe" else other_cb).append(msg.data)

    try:
        tap = direct_delivery(nc)
        assert tap is not None and direct_delivery(nc) is tap  # once per connection
        b = Backlog()
        sub = await nc.subscribe("skewd.v1.summary.direct.>", cb=on_routed)
        assert tap.route(sub, b)
        await nc.subscribe("skewd.v1.health.direct.>", cb=on_other)
        await nc.flush()
        # a server just started has dropped a first burst now and then, callbacks or not: start
        # once a probe gets through
        for _ in range(50):
            await pub.publish("skewd.v1.health.direct.probe", b"probe")
            await pub.flush()
            await asyncio.sleep(0.05)
            if probes:
                break
        sent = []
        for i in range(600):
            body = f"summary {i}".encode()
            subject = f"skewd.v1.summary.direct.n{i % 7}"
            # as agents publish them (agent/publisher.py): with the kind and schema headers, or without
            await pub.publish(subject, body, headers={wire.HDR_KIND: "summary", wire.HDR_SCHEMA: "1"} if i % 2 else None)
            sent.append((subject.encode(), body))
            if i % 60 == 0:
                await pub.publish("skewd.v1.health.direct.n0", f"health {i}".encode())
        await pub.flush()
        await wait_for(lambda: asyncio.sleep(0, len(b.items) == 600 and len(other_cb) == 10), 10, "every message")
        assert list(b.items) == sent
        assert b.bytes == sum(len(d) for _, d in sent) and b.ready.is_set()
        assert routed_cb == [] and sub.delivered == 0  # nats-py built no message for them
        assert other_cb == [f"health {i}".encode() for i in range(0, 600, 60)]
        assert nc.stats["in_msgs"] == 610 + len(probes)  # counted as nats-py counts

        tap.unroute(sub)  # back to the callback
        await pub.publish("skewd.v1.summary.direct.n0", b"after")
        await pub.flush()
        await wait_for(lambda: asyncio.sleep(0, routed_cb == [b"after"]), 10, "the callback's message")
        assert len(b.items) == 600
    finally:
        await nc.close()
        await pub.close()


def test_a_client_without_the_expected_internals_gets_no_direct_delivery() -> None:
    class Other:
        stats: dict = {}
        _subs: dict = {}

        async def _process_msg(self, sid, subject, reply, data):  # another signature
            return None

    assert direct_delivery(Other()) is None
    assert direct_delivery(object()) is None


async def test_a_subscription_without_nats_pys_id_keeps_its_callback(nats_server) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        tap = direct_delivery(nc)
        assert tap is not None and tap.route(object(), Backlog()) is False
        assert tap._routes == {}
    finally:
        await nc.close()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "callbacks"])
async def test_a_controller_takes_in_every_summary_directly_or_through_callbacks(nats_server, monkeypatch,
                                                                                   direct) -> None:
    if not direct:
        monkeypatch.setattr(service, "direct_delivery", lambda nc: None)
    cluster = "c1"  # the messages' cluster (tests/controller/test_binary_intake.py)
    msgs = [m for m in _messages(seed=4, seconds=12, change_at=6) if m is not None]
    ctl = Controller(config(nats_server.url, cluster, ingest={"max_clock_skew": "0s"}))
    await asyncio.wait_for(ctl.start(), 30)
    pub = await nats.connect(nats_server.url)
    try:
        for subject, js, bn in msgs:  # odd nodes binary (a node's first carries its layout), even ones JSON
            node = subject.split(".")[4]
            await pub.publish(subject, bn if int(node[1:]) % 2 else js,
                              headers={wire.HDR_KIND: "summary", wire.HDR_SCHEMA: "1"})
        await pub.flush()
        await wait_for(lambda: asyncio.sleep(0, ctl.stats.summaries + ctl.stats.summaries_rejected >= len(msgs)),
                       20, "every summary taken in")
        assert ctl.stats.summaries == len(msgs) and ctl.stats.summaries_rejected == 0 and ctl.stats.errors == 0
        assert sorted(ctl.aligner.bursts) == [f"n{i}" for i in range(8)]
        delivered = sum(s.delivered for s in ctl._subs if ctl.subscribes(s))
        assert delivered == (0 if direct else len(msgs))  # which path carried them
    finally:
        await pub.close()
        await ctl.stop()
    if direct:  # a stopped controller takes nothing in: nothing is routed to it any more (a
        # scaled-out worker's connection outlives the partitions it gives up)
        assert ctl._direct is not None and ctl._direct._routes == {}


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "callbacks"])
async def test_a_started_controller_prepares_slab_growth_between_ticks_and_stores_the_same(nats_server, monkeypatch,
                                                                                          direct) -> None:
    """A started controller's store queues its slabs' growth preparations (defer_prepare) and
    the summary intake makes them between ticks, however the summaries are delivered: slabs grow
    into prepared arrays, and the store holds the very values of a controller driven by hand
    (which prepares in the write) fed the same summaries."""
    if not direct:
        monkeypatch.setattr(service, "direct_delivery", lambda nc: None)
    msgs = _messages(seed=5, seconds=90, change_at=45)  # 90 columns a node; None: a second ends
    ctl = Controller(config(nats_server.url, "c1", ingest={"max_clock_skew": "0s"}))
    ref = offline_controller()
    grew: list[bool] = []  # per slab growth: into arrays prepared ahead
    room = ctl.store._slab_room

    def counting_room(sl, t):
        grew.append(sl.spare is not None)
        room(sl, t)

    ctl.store._slab_room = counting_room
    await asyncio.wait_for(ctl.start(), 30)
    assert ctl.store.defer_prepare and not ref.store.defer_prepare
    pub = await nats.connect(nats_server.url)
    sent = 0
    try:
        for m in msgs:  # a second at a time, taken in before the next: the controller ticks each second
            if m is None:
                await pub.flush()
                await wait_for(lambda: asyncio.sleep(0, ctl.stats.summaries + ctl.stats.summaries_rejected >= sent),
                               20, "the second's summaries taken in")
                continue
            await pub.publish(m[0], m[2])
            await ref._on_summary(_Msg(m[0], m[2]))
            sent += 1
        assert ctl.stats.summaries == ref.stats.summaries == sent - ref.stats.summaries_rejected
        assert ctl.stats.evaluations > 45
    finally:
        await pub.close()
        await ctl.stop()
    assert grew and any(grew)  # the intake made queued preparations (nothing else does, live)
    ctl.feed.flush()
    ref.feed.flush()

    def summary_values(store) -> dict:
        return {(sig, node): (b.window(-np.inf, np.inf)[0].tolist(), np.nan_to_num(b.window(-np.inf, np.inf)[1],
                                                                                     nan=-1.5).tolist())
                for sig, per_node in store.blocks.items() if not sig.startswith("ctl_")
                for node, b in per_node.items()}

    assert summary_values(ctl.store) == summary_values(ref.store)
