"""A node's binary summaries alike (same subject, cluster and layout as its last one taken in)
skip the checks those decide (controller/intake.py, ``_take_binary``'s lanes); nothing else may
change. The same stream, hostile summaries among good ones after the lanes are made, goes to a
controller with lanes and to one whose lanes never hold anything: both refuse the same
summaries for the same reasons and end in the same state, and the lanes were really taken."""
from __future__ import annotations

import asyncio
import dataclasses
import math
import struct

import msgspec
import pytest

from skewd import wire
from skewd.controller import ingest
from skewd.controller.service import Controller

from .helpers import offline_controller, same_store_and_timelines

T0 = 1_700_000_000.0
#: summary signals sent (NOTE: values made up, value + position; names from the controller's catalogue)
SIGNALS = ["summary_gpu_util_mean_ratio", "summary_gpu_power_watts", "summary_pcie_rx_bytes_per_second",
           "summary_kv_cache_usage_ratio", "summary_requests_waiting", "summary_engine_phase"]


class _NoLanes(dict):
    """A lane dict that never keeps one (every summary takes every check); counts the lanes
    the intake would have made."""

    refused = 0

    def __setitem__(self, key, value) -> None:
        self.refused += 1


class _Msg:
    def __init__(self, subject: str, data: bytes) -> None:
        self.subject, self.data = subject, data


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _controller(lanes: bool, skew: str) -> tuple[Controller, _Clock]:
    clock = _Clock()
    ctl = offline_controller(ingest={"max_clock_skew": skew, "max_nodes": 2, "silent_intervals": 5})
    ctl.wall = clock  # the clock check is on: summary times are near this clock's
    if not lanes:
        ctl._lanes = _NoLanes()
    return ctl, clock


def _summary(node: str, t: float, extra: bool = False, cluster: str = "c1", value: float = 1.0) -> wire.Summary:
    sig = {s: {"": value + k} for k, s in enumerate(SIGNALS)}
    if extra:
        sig["summary_cpu_busy_cores"] = {"": 3.0}  # another layout
    sig["collective_burst_starts"] = {str(k): t - 1 + 0.05 * k for k in range(5)}
    return wire.Summary(node=node, cluster=cluster, t=t, interval=1.0, signals=sig,
                        clock_sync=wire.ClockSync(True, 0.0005), agent_version="test",
                        labels={"tp_group": "tp0", "tp_rank": str(int(node[1:]))})


def _subject(node: str) -> str:
    return wire.summary_subject("c1", node, "tp0")


def _repacked(data: bytes, **change) -> bytes:
    """A binary summary with some fields replaced (what a broken or hostile agent could send)."""
    return wire.pack(msgspec.structs.replace(wire.read_binary(data), **change))


def _stream() -> list:
    """(wall clock, subject, payload, verdict) in arrival order; the verdict is the rejection
    reason, or None for a summary taken in."""
    enc = {n: wire.SummaryEncoder(layout_every=2.0) for n in ("n0", "n1", "n2")}  # the layout rides along at times
    out: list = []

    def good(node: str, t: float, **kw) -> bytes:
        return enc[node].encode(_summary(node, t, **kw))

    for i in range(4):  # the lanes are made
        for node in ("n0", "n1"):
            out.append((T0 + i, _subject(node), good(node, T0 + i, value=i), None))
    t = T0 + 4
    ok = good("n0", t)
    values = wire.read_binary(ok).values
    out += [
        (t, _subject("n1"), ok, ingest.SUBJECT_MISMATCH),  # n0's body on n1's subject
        (t, _subject("n0"), good("n0", t + 3600), ingest.CLOCK_SKEW),  # an hour ahead
        (t, _subject("n0"), _repacked(ok, values=values[:-8]), None),  # one value short of its layout
        (t, _subject("n0"), _repacked(ok, values=values[:-8] + struct.pack("<d", math.inf)), None),  # infinite
        (t, _subject("n0"), _repacked(ok, layout=b"\x91\x92\xa1x\x91\xa0"), None),  # carried, not its id's
        (t, _subject("n0"), _repacked(ok, cluster="c2"), ingest.SUBJECT_MISMATCH),  # another cluster's body
        (t, _subject("n0"), ok, None),
        (t + 1, _subject("n0"), good("n0", t + 1, extra=True), None),  # a new layout: the lane follows it
        (t + 1, _subject("n0"), good("n0", t + 2, extra=True), None),
        (t + 1, _subject("n0"), good("n0", t + 3), None),  # back to the first one: still kept
        (t + 1, _subject("n1"), good("n1", t + 1), None),
    ]
    # n0 falls silent and is forgotten; n2 takes its place under ingest.max_nodes = 2
    t += 600  # (silent after ingest.silent_intervals of the longer of its interval and the evaluation's)
    out += [(t, _subject("n1"), good("n1", t), None), (t, _subject("n2"), good("n2", t), None),
            (t, _subject("n0"), good("n0", t), ingest.TOO_MANY_NODES)]
    return out


async def _run(ctl: Controller, clock: _Clock, stream: list) -> list:
    verdicts = []
    for wall, subject, data, _ in stream:
        if wall > clock.now:
            clock.now = wall
            await ctl.expire_silent_nodes(wall)
        before = dict(ctl.rejections.counts.get("summary", {}))
        taken = ctl.stats.summaries
        await ctl._on_summary(_Msg(subject, data))
        after = ctl.rejections.counts.get("summary", {})
        new = [r for r, n in after.items() if n > before.get(r, 0)]
        verdicts.append(None if ctl.stats.summaries > taken else (new[0] if new else "lost"))
    return verdicts


@pytest.mark.parametrize("skew", ["30s", "0s"])  # the clock check on (it also checks the subject) and off
def test_summaries_on_a_lane_are_refused_and_taken_in_as_with_every_check(skew: str) -> None:
    stream = _stream()
    fast, fast_clock = _controller(True, skew)
    full, full_clock = _controller(False, skew)
    resolved = {"fast": 0, "full": 0}
    for name, ctl in (("fast", fast), ("full", full)):
        def counted(h, name=name, resolve=ctl.layouts.resolve):
            resolved[name] += 1
            return resolve(h)

        ctl.layouts.resolve = counted  # type: ignore[method-assign]
    got = asyncio.run(_run(fast, fast_clock, stream))
    want = asyncio.run(_run(full, full_clock, stream))
    assert got == want
    # the verdicts the stream expects where it names one; the broken fields are refused too
    for (_, subject, _, expect), v in zip(stream, got):
        if expect == ingest.CLOCK_SKEW and skew == "0s":
            expect = None  # taken in: no clock check
        if expect is not None:
            assert v == expect, (subject, v)
    assert got.count(None) == len(got) - (7 if skew != "0s" else 6) and "lost" not in got
    assert fast.stats.errors == full.stats.errors == 0
    assert fast.rejections.counts == full.rejections.counts
    # the same state: store, timelines, aligner, topology, node book, layouts kept
    same_store_and_timelines(fast, full)
    assert {n: dataclasses.astuple(c) for n, c in fast.aligner.clocks.items()} == \
        {n: dataclasses.astuple(c) for n, c in full.aligner.clocks.items()}
    assert {n: list(b.ts) for n, b in fast.aligner.bursts.items()} == \
        {n: list(b.ts) for n, b in full.aligner.bursts.items()}
    assert fast.topology.reported == full.topology.reported
    assert list(fast.nodes.heard.items()) == list(full.nodes.heard.items())
    assert fast.nodes.interval == full.nodes.interval
    assert fast.layouts.book._nodes == full.layouts.book._nodes
    assert sorted(fast.layouts.plans) == sorted(full.layouts.plans)
    # and the lanes were taken: the node's next summaries alike never looked their layout up
    assert resolved["full"] == len(stream) and resolved["fast"] <= resolved["full"] - 10
    assert full._lanes.refused == got.count(None)  # without lanes, each summary taken in would have made one
    assert "n0" not in fast._lanes and set(fast._lanes) == {"n1", "n2"}  # n0 forgotten, refused since
