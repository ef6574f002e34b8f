"""The intake connection reads nothing while a tick computes (skewd.natsutil.hold_reads), with a
real nats-server: summaries published meanwhile are delivered, all of them and in order, once the
gate opens; a gate that stays closed holds reads no longer than the bound; a client whose
internals differ is left as it is."""
from __future__ import annotations

import asyncio
import time

import nats

from skewd.controller.evaluation import TickGate
from skewd.natsutil import flush_subscribed, hold_reads


async def _collect(url: str, gate: TickGate, max_hold: float) -> tuple:
    intake = await nats.connect(url)
    pub = await nats.connect(url)
    got: list[tuple[int, float]] = []

    async def cb(msg) -> None:
        got.append((int(msg.data), time.monotonic()))

    try:
        assert hold_reads(intake, gate, max_hold)
        await intake.subscribe("skewd.v1.summary.held.>", cb=cb)
        await flush_subscribed(intake)  # (one flush() left the SUB behind now and then)
        gate.close()
        closed_at = time.monotonic()
        for i in range(2000):
            await pub.publish(f"skewd.v1.summary.held.n{i % 8}", str(i).encode())
        await pub.flush()
        await asyncio.sleep(0.3)
        during = len(got)
        return got, during, closed_at, intake, pub
    except BaseException:
        await intake.close()
        await pub.close()
        raise


async def test_summaries_wait_while_the_gate_is_closed_and_all_arrive_in_order_after(nats_server) -> None:
    gate = TickGate()
    got, during, _, intake, pub = await _collect(nats_server.url, gate, max_hold=30.0)
    try:
        assert during == 0  # nothing parsed, so nothing handed to the subscription, while closed
        gate.open()
        for _ in range(200):
            if len(got) == 2000:
                break
            await asyncio.sleep(0.02)
        assert [i for i, _ in got] == list(range(2000))
    finally:
        await intake.close()
        await pub.close()


async def test_a_gate_that_stays_closed_holds_reads_no_longer_than_the_bound(nats_server) -> None:
    gate = TickGate()
    got, during, closed_at, intake, pub = await _collect(nats_server.url, gate, max_hold=0.1)
    try:
        for _ in range(200):
            if len(got) == 2000:
                break
            await asyncio.sleep(0.02)
        assert [i for i, _ in got] == list(range(2000)) and gate.busy  # all arrived, the gate still closed
    finally:
        await intake.close()
        await pub.close()


def test_a_client_without_the_parser_it_wraps_is_left_alone() -> None:
    class Other:
        _ps = None

    assert hold_reads(Other(), TickGate()) is False
    assert hold_reads(object(), TickGate()) is False
