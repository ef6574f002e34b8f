"""A started controller moves its long-lived objects out of CPython's full collections once
warm (controller/gcpolicy.py): full collections of ~420k objects took 50-300 ms of a tick at
1,000 nodes. A harness, replay or test that drives ticks itself leaves the collector alone."""
from __future__ import annotations

import asyncio
import gc

import nats
import pytest

from skewd import wire
from skewd.controller.config import load_config
from skewd.controller.gcpolicy import REGROW, YOUNG_THRESHOLD, GcPolicy
from skewd.controller.service import Controller

from .helpers import config, wait_for
from .sim import ScriptedGroup


@pytest.fixture(autouse=True)
def _unfreeze():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_settles_on_the_first_warm_tick_and_when_the_nodes_grew():
    p = GcPolicy(enabled=True)
    junk = [[i] for i in range(1000)]  # tracked objects that survive the collection
    assert not p.after_tick(warm=False, nodes=100)  # warm-up: the store is still filling
    assert gc.get_freeze_count() == 0
    assert p.after_tick(warm=True, nodes=100)
    frozen = gc.get_freeze_count()
    assert frozen >= len(junk)
    assert not p.after_tick(warm=True, nodes=int(100 * REGROW) - 1)  # not grown enough
    assert gc.get_freeze_count() == frozen
    more = [[i] for i in range(1000)]
    assert p.after_tick(warm=True, nodes=int(100 * REGROW))
    assert gc.get_freeze_count() >= frozen + len(more)
    assert p.settles == 2


def test_a_disabled_policy_never_touches_the_collector():
    before = gc.get_threshold()
    p = GcPolicy()
    for n in (10, 100, 1000):
        assert not p.after_tick(warm=True, nodes=n)
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_the_first_settle_lets_the_young_generation_grow_once():
    gc.set_threshold(700, 10, 10)  # CPython's defaults
    p = GcPolicy(enabled=True)
    assert not p.after_tick(warm=False, nodes=100)
    assert gc.get_threshold() == (700, 10, 10)  # not before the controller is warm
    assert p.after_tick(warm=True, nodes=100)
    assert gc.get_threshold() == YOUNG_THRESHOLD
    gc.set_threshold(5_000, 10, 10)  # an operator's own tuning after that is left alone
    assert p.after_tick(warm=True, nodes=1000)
    assert gc.get_threshold() == (5_000, 10, 10)


def test_a_process_with_collection_switched_off_keeps_it_off():
    gc.set_threshold(0, 10, 10)
    assert GcPolicy(enabled=True).after_tick(warm=True, nodes=10)
    assert gc.get_threshold() == (0, 10, 10)


def test_only_a_started_controller_settles():
    ctl = Controller(load_config(None, env={}))
    assert not ctl.gc_policy.enabled  # harness / replay / tests: the collector as it is


def test_a_started_controller_freezes_once_warm(nats_server):
    """`skewd controller` (Controller.start) on a real nats-server: summaries of one TP group,
    and once the ticks are past the warm-up the process's long-lived objects are frozen."""
    cluster = "gcfreeze"
    g = ScriptedGroup(nodes=("n0", "n1", "n2", "n3"), cluster=cluster, t0=1_700_000_000.0, seed=3)

    async def run() -> None:
        ctl = Controller(config(nats_server.url, cluster, ingest={"max_clock_skew": "0s"}))  # invented times
        await ctl.start()
        nc = await nats.connect(nats_server.url)
        try:
            assert ctl.gc_policy.enabled and gc.get_freeze_count() == 0
            for i in range(12):  # 12 s of summary time against a 3 s warm-up
                for n in g.nodes:
                    await nc.publish(wire.summary_subject(cluster, n, "tp0"), g.summary(i, n))
            await nc.flush()
            await wait_for(lambda: asyncio.sleep(0, ctl.gc_policy.settles > 0), 30, "a settle after warm-up")
            assert gc.get_freeze_count() > 0
            assert gc.get_threshold() == YOUNG_THRESHOLD
        finally:
            await nc.close()
            await ctl.stop()

    asyncio.run(asyncio.wait_for(run(), 60))
