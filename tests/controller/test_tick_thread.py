"""A started controller computes its ticks on the tick thread: the event loop (where a scaled-out
worker renews its leases and nats-py reads the socket) keeps running during a tick, and the
controller's own intake waits for the tick instead of changing its state underneath it; the
findings and ctl_* values are the same as an inline tick's."""
from __future__ import annotations

import asyncio
import threading

import numpy as np

from skewd import wire
from skewd.controller.service import Controller

from .helpers import RULES, offline_controller

T0 = 1_700_000_000.0


def _controller(thread: bool) -> Controller:
    ctl = offline_controller()
    ctl.tick_in_thread = thread  # what start() sets; no NATS needed for the tick itself
    ctl.feed.defer_flush = thread
    return ctl


def _summary(node: str, i: int, t: float, lag: float) -> wire.Summary:
    """Invented summary (NOTE: values made up): 4 nodes of one TP group, 20 bursts a second,
    node n3 late by ``lag``."""
    starts = {str(k): t - 1 + k * 0.05 + 0.0003 + (lag if node == "n3" else 0.0) for k in range(20)}
    return wire.Summary(node=node, cluster="c1", t=t, interval=1.0,
                        signals={"summary_gpu_util_mean_ratio": {"": 0.5 + 0.01 * i}, "collective_burst_starts": starts},
                        clock_sync=wire.ClockSync(True, 0.0005), agent_version="test",
                        labels={"tp_group": "tp0", "tp_rank": node[1:]})


class _Msg:
    def __init__(self, s: wire.Summary) -> None:
        self.subject = wire.summary_subject("c1", s.node, "tp0")
        self.data = wire.encode(s)


async def _feed(ctl: Controller, seconds: int) -> None:
    for i in range(seconds):
        for n in ("n0", "n1", "n2", "n3"):
            await ctl._on_summary(_Msg(_summary(n, i, T0 + i + 1, 0.01)))
        await ctl.evaluate_due()


async def _held_tick(ctl: Controller, gate: threading.Event, seen: dict) -> asyncio.Task:
    """A warm controller's next tick, started and on the tick thread, its computation held there
    until ``gate`` is set (``seen["thread"]``: the thread it runs on)."""
    await _feed(ctl, 5)
    derive = ctl.aligner.derive

    def held_derive(*a, **k):  # the tick's computation waits for the event loop to speak
        seen["thread"] = threading.current_thread().name
        if not gate.wait(10.0):
            raise AssertionError("the event loop did not run while the tick computed")
        return derive(*a, **k)

    ctl.aligner.derive = held_derive
    for n in ("n0", "n1", "n2", "n3"):
        await ctl._on_summary(_Msg(_summary(n, 5, T0 + 6, 0.01)))
    tick = asyncio.create_task(ctl.evaluate_due())
    for _ in range(5000):
        if ctl._on_thread:
            break
        await asyncio.sleep(0.001)
    assert ctl._on_thread
    return tick


def test_the_loop_runs_and_intake_waits_while_a_tick_computes() -> None:
    async def main() -> None:
        ctl = _controller(thread=True)
        gate = threading.Event()
        seen: dict[str, object] = {}
        tick = await _held_tick(ctl, gate, seen)
        before = ctl.stats.summaries - 4  # (the tick's own four summaries are in)
        assert ctl._ticking
        late = asyncio.create_task(ctl._on_summary(_Msg(_summary("n0", 6, T0 + 7, 0.01))))
        await asyncio.sleep(0.05)
        assert not late.done() and ctl.stats.summaries == before + 4  # intake waits for the tick
        gate.set()  # only the event loop can say this: it ran while the tick computed
        await asyncio.wait_for(tick, 10)
        await asyncio.wait_for(late, 10)
        assert ctl.stats.summaries == before + 5
        assert str(seen["thread"]).startswith("skewd-tick")

    asyncio.run(main())


def test_a_workers_controllers_share_the_intake_gate_and_a_lone_controller_has_its_own() -> None:
    """A scaled-out worker's partitions share one gate: while one computes a tick, another's
    summaries wait too (the tick thread then has the interpreter to itself); a controller of
    its own gate takes its summaries in meanwhile."""
    from skewd.controller.evaluation import TickGate

    async def main() -> None:
        ticking, shared, alone = _controller(thread=True), _controller(thread=True), _controller(thread=True)
        shared.tick_gate = ticking.tick_gate = TickGate()
        release = threading.Event()
        tick = await _held_tick(ticking, release, {})
        assert shared._ticking and not alone._ticking
        waits = asyncio.create_task(shared._on_summary(_Msg(_summary("n0", 0, T0 + 1, 0.01))))
        await alone._on_summary(_Msg(_summary("n0", 0, T0 + 1, 0.01)))
        await asyncio.sleep(0.05)
        assert alone.stats.summaries == 1 and not waits.done() and shared.stats.summaries == 0
        release.set()
        await asyncio.wait_for(tick, 10)
        await asyncio.wait_for(waits, 10)
        assert shared.stats.summaries == 1 and not shared._ticking

    asyncio.run(main())


def test_a_threaded_tick_gives_what_an_inline_tick_gives(monkeypatch) -> None:
    """Also with store flushes between ticks (a small FLUSH_ROWS), which a started controller
    runs on the tick thread and an inline one inside StoreFeed.add."""
    from skewd.controller import storefeed

    monkeypatch.setattr(storefeed, "FLUSH_ROWS", 2)  # every second summary
    flushed_on: list[str] = []

    async def run(thread: bool):
        ctl = _controller(thread)
        flush = ctl.feed.flush

        def noted_flush() -> None:
            flushed_on.append(threading.current_thread().name)
            flush()

        ctl.feed.flush = noted_flush
        await _feed(ctl, 60)
        return ctl

    a = asyncio.run(run(True))
    assert flushed_on and all(n.startswith("skewd-tick") for n in flushed_on)
    assert len(flushed_on) > 2 * a.stats.evaluations  # between ticks too, not only in them
    flushed_on.clear()
    b = asyncio.run(run(False))
    assert a.stats.evaluations == b.stats.evaluations > 0
    for sig in ("ctl_arrival_lag_excess_seconds", "ctl_aligned_steps", "summary_gpu_util_mean_ratio"):
        for node in ("n0", "n3"):
            ta, va = a.store.series(sig, node)
            tb, vb = b.store.series(sig, node)
            assert len(ta) and np.array_equal(ta, tb) and np.array_equal(va, vb, equal_nan=True), (sig, node)
    key = [(f.rule_id, f.node, f.state, f.active_at) for f in a.js.findings]
    assert key == [(f.rule_id, f.node, f.state, f.active_at) for f in b.js.findings]
    assert ("EW-1-tp-straggler-test", "n3") in {(k[0], k[1]) for k in key}  # the late node, named
