"""The binary summary's intake is the JSON summary's, bit for bit: the same stream of summaries
sent as JSON to one offline controller and as binary to another leaves the same window store,
engine timelines, burst logs, alignment reports and published findings and incidents -
including missing values (JSON null, binary NaN), a None burst start and NaN burst bytes,
engine keys coming and going (the layout changes), a signal added mid-stream, summaries out of
order and twice, and a controller that starts mid-stream and refuses binary summaries until it
learns their layouts (then both controllers are compared on what each took in)."""
from __future__ import annotations

import asyncio
import dataclasses
import random
import struct

import numpy as np

from skewd import wire
from skewd.controller import ingest
from skewd.controller.roles import ROLE_PARTITION
from skewd.controller.service import Controller

from .helpers import arrival_order, offline_controller, same_store_and_timelines

T0 = 1_700_000_000.0
NODES = [f"n{i}" for i in range(8)]
#: summary signals sent (NOTE: values made up; names from the controller's catalogue)
SIGNALS = ["summary_gpu_util_mean_ratio", "summary_gpu_util_min_ratio", "summary_gpu_power_watts",
           "summary_pcie_rx_bytes_per_second", "summary_rdma_xmit_bytes_per_second",
           "summary_rdma_rcv_bytes_per_second", "summary_net_rx_bytes_per_second"]


def _summary(rng: random.Random, i: int, n: int, change_at: int) -> wire.Summary:
    node = NODES[n]
    t = T0 + i + 1
    sig: dict = {s: {"": None if rng.random() < 0.04 else rng.random() * 100} for s in SIGNALS}
    if i >= change_at and n % 2 == 0:
        sig["summary_cpu_busy_cores"] = {"": rng.random() * 10}  # a signal added mid-stream: a new layout
    if n in (0, 4):  # two engines: their own keys (not store samples), TTFT only in some intervals
        engines = ["engine0", "engine1"]
        sig["engine_phase"] = {e: float(rng.randrange(3)) for e in engines}
        sig["engine_kv_cache_usage_ratio"] = {e: None if rng.random() < 0.1 else rng.random() for e in engines}
        sig["engine_requests_waiting"] = {e: float(rng.randrange(5)) for e in engines}
        if rng.random() < 0.5:
            sig["engine_ttft_p50_seconds"] = {"engine0": rng.random()}
    sig["summary_engine_phase"] = {"": float(rng.randrange(3))}
    sig["summary_kv_cache_usage_ratio"] = {"": rng.random()}
    sig["summary_requests_waiting"] = {"": None if rng.random() < 0.1 else float(rng.randrange(9))}
    lag = 0.01 if node == "n3" else 0.0
    starts: dict = {str(k): t - 1 + k * 0.05 + 0.0003 + lag + rng.uniform(-2e-4, 2e-4) for k in range(20)}
    if node == "n5" and rng.random() < 0.3:
        starts["3"] = None  # a start without a value
    if node == "n2" and i % 3 == 1:  # (not drawn from rng: the arrival order stays the seed's)
        starts = {}  # an interval without collective traffic: no starts at all
    elif node == "n4" and i % 4 == 2:
        starts = {"0": None}  # nor here (JSON's null: no start)
    if starts:
        sig["collective_burst_starts"] = starts
    if node in ("n6", "n7") and starts:
        sig["collective_burst_bytes"] = {k: None if rng.random() < 0.2 else 64e6 for k in starts}
    g = "tp0" if n < 4 else "tp1"
    return wire.Summary(node=node, cluster="c1", t=t, interval=1.0, signals=sig,
                        clock_sync=wire.ClockSync(True, 0.0005), agent_version="test",
                        labels={"tp_group": g, "tp_rank": str(n % 4)})


def _messages(seed: int, seconds: int, change_at: int) -> list:
    """(subject, JSON, binary) per summary in arrival order, None for an evaluation after each
    second: mostly every node each second, sometimes one silent, sent twice or held back."""
    rng = random.Random(seed)
    encoders = {n: wire.SummaryEncoder(layout_every=10.0) for n in NODES}

    def summary(i: int, node: str) -> tuple[str, bytes, bytes] | None:
        if rng.random() < 0.03:
            return None  # silent this second
        s = _summary(rng, i, NODES.index(node), change_at)
        return wire.summary_subject("c1", node, s.labels["tp_group"]), wire.encode(s), encoders[node].encode(s)

    out = arrival_order(rng, seconds, NODES, summary)
    assert all(e.json_fallbacks == 0 for e in encoders.values())
    return out


class _Msg:
    def __init__(self, subject: str, data: bytes) -> None:
        self.subject, self.data = subject, data


def _unknown(ctl: Controller) -> int:
    return ctl.rejections.counts.get("summary", {}).get(ingest.LAYOUT_UNKNOWN, 0)


async def _pair(msgs: list, start: int = 0) -> tuple[Controller, Controller]:
    """JSON controller, binary controller, both fed from ``msgs[start:]``; the JSON one takes
    exactly what the binary one took (not the summaries whose layout it did not know yet)."""
    a, b = offline_controller(), offline_controller()
    for m in msgs[start:]:
        if m is None:
            await a.evaluate_due()
            await b.evaluate_due()
            continue
        subject, js, bn = m
        before = _unknown(b)
        await b._on_summary(_Msg(subject, bn))
        if _unknown(b) == before:
            await a._on_summary(_Msg(subject, js))
    return a, b


def _bits(x: object) -> bytes:
    """A float (or list of floats) as its bytes: NaN payloads and -0.0 compare too."""
    xs = x if isinstance(x, (list, tuple)) else [x]
    return b"".join(struct.pack("<d", v) if isinstance(v, float) else repr(v).encode() for v in xs)


def _same_state(a: Controller, b: Controller) -> None:
    assert a.stats.summaries == b.stats.summaries > 0 and a.stats.errors == b.stats.errors == 0
    assert a.stats.evaluations == b.stats.evaluations > 0
    same_store_and_timelines(a, b)
    # the aligner: burst logs (starts and bytes, NaN included) and clocks
    assert sorted(a.aligner.bursts) == sorted(b.aligner.bursts)
    for node, log in a.aligner.bursts.items():
        assert _bits(list(log.ts)) == _bits(list(b.aligner.bursts[node].ts)), node
        assert _bits(list(log.bs)) == _bits(list(b.aligner.bursts[node].bs)), node
    assert {n: dataclasses.astuple(c) for n, c in a.aligner.clocks.items()} == \
        {n: dataclasses.astuple(c) for n, c in b.aligner.clocks.items()}
    assert repr(a.aligner.reports) == repr(b.aligner.reports)
    # what the controller published: finding transitions and incidents, in order
    assert [f.to_dict() for f in a.js.findings] == [f.to_dict() for f in b.js.findings]
    assert [repr(i) for i in a.js.incidents] == [repr(i) for i in b.js.incidents]
    assert a.topology.reported == b.topology.reported


def test_binary_summaries_leave_the_state_json_summaries_leave() -> None:
    for seed in range(3):
        msgs = _messages(seed, 50, change_at=25)
        a, b = asyncio.run(_pair(msgs))
        assert _unknown(b) == 0  # every layout rode along with its first summary
        assert b.feed.fast_flushes > 0 and len(b.layouts.book.layouts) >= 4  # the layouts changed
        _same_state(a, b)
        key = {(f.rule_id, f.node) for f in b.js.findings}
        assert ("EW-1-tp-straggler-test", "n3") in key, key  # the late node, named
        assert b.aligner.reports  # the groups were aligned


def test_a_controller_starting_mid_stream_learns_the_layouts_from_the_periodic_ones() -> None:
    msgs = _messages(5, 60, change_at=40)
    start = next(k for k, m in enumerate(msgs) if m is None and k > len(msgs) // 4)  # ~15 s in
    a, b = asyncio.run(_pair(msgs, start))
    refused = _unknown(b)
    assert refused > 0  # the summaries before their layout came round again
    # the layout rides along every 10 s: every node was taken in again within that
    cut = next(k for k, m in enumerate(msgs) if m is None and k > start + len(msgs) // 5)
    _, fresh = asyncio.run(_pair(msgs[start:cut + 1]))
    assert set(fresh.aligner.clocks) == set(NODES)
    _same_state(a, b)
    assert b.status()["rejected"]["summary"] == {ingest.LAYOUT_UNKNOWN: refused}


def test_a_partition_hands_the_leader_the_same_digest_for_both_encodings() -> None:
    from skewd.controller.digest import encode_digests

    msgs = [m for m in _messages(2, 6, change_at=3) if m is not None]
    a, b = offline_controller(), offline_controller()
    a.role = b.role = ROLE_PARTITION

    async def feed() -> None:
        for subject, js, bn in msgs:
            await a._on_summary(_Msg(subject, js))
            await b._on_summary(_Msg(subject, bn))

    asyncio.run(feed())

    assert all(type(r[3]) is dict for r in a._digest_rows.values())  # JSON: made columns with the digest
    assert all(type(r[3]) is tuple for r in b._digest_rows.values())  # binary: (layout, values) as they came
    assert encode_digests("c1", 0, T0, a._digest_rows, {}, {}) == encode_digests("c1", 0, T0, b._digest_rows, {}, {})
    assert len(a._digest_rows) == len(NODES)


def test_burst_starts_whose_sum_overflows_are_taken_in_not_lost_as_errors() -> None:
    """Found by the wire-binary fuzz target: starts near 1e308 made ``math.fsum`` raise
    OverflowError in the intake (JSON too), and the summary was lost as an error."""
    sig = {"summary_gpu_util_mean_ratio": {"": 0.5},
           "collective_burst_starts": {"0": T0, "1": 1e308, "2": 1e308}}
    s = wire.Summary(node="n1", cluster="c1", t=T0, interval=1.0, signals=sig,
                     clock_sync=wire.ClockSync(True, 0.0005), agent_version="test")
    subject = wire.summary_subject("c1", "n1")
    a, b = asyncio.run(_pair([(subject, wire.encode(s), wire.SummaryEncoder().encode(s)), None]))
    assert a.stats.errors == b.stats.errors == 0 and a.stats.summaries == b.stats.summaries == 1
    assert list(a.aligner.bursts["n1"].ts) == list(b.aligner.bursts["n1"].ts) == [T0, 1e308, 1e308]


def test_rows_the_store_no_longer_caches_go_in_one_summary_at_a_time_alike() -> None:
    """The store's layout cache is bounded: a run of rows whose layout it dropped goes in as
    one SampleBatch per summary (ingest_many), from float64 bytes as from lists."""
    msgs = _messages(1, 20, change_at=10)

    async def run() -> tuple[Controller, Controller]:
        a, b = offline_controller(), offline_controller()
        for ctl in (a, b):
            ctl.store.ingest_collections = lambda *args: False  # as if every layout had been dropped
        for m in msgs:
            if m is None:
                await a.evaluate_due()
                await b.evaluate_due()
                continue
            subject, js, bn = m
            await a._on_summary(_Msg(subject, js))
            await b._on_summary(_Msg(subject, bn))
        return a, b

    a, b = asyncio.run(run())
    assert b.feed.fast_flushes > 0
    _same_state(a, b)
