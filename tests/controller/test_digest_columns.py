"""The leader takes the partitions' columnar digests (schema 2) into the state the per-dict
digests (schema 1) left: the same summaries - JSON, binary, or a mix of both; values missing
(JSON null, binary NaN); several layouts; nodes whose layout changes (an engine's TTFT comes and
goes, a signal is added mid-stream) - go through partitions to a leader, and its window store,
engine timelines, topology and group reports equal those of a reference leader that took each
partition's rows the schema-1 way (topology, ``timelines.add_summary``, ``feed.samples`` and
``feed.add`` of the JSON summary's dicts). A started leader takes each digest in as it arrives,
on the tick thread, instead of at its next tick: the same state again."""
from __future__ import annotations

import asyncio
import logging
import math
import random
import re

import msgspec
import numpy as np
import pytest

from skewd import wire
from skewd.controller.catalogue import NAMES as CTL_SIGNALS
from skewd.controller.digest import (DIGEST_BYTES_PER_MESSAGE, DIGEST_SCHEMA, decode_digest, encode_digests)
from skewd.controller.roles import ROLE_LEADER, ROLE_PARTITION
from skewd.controller.service import Controller
from skewd.lab.harness import MemoryState

from .helpers import offline_controller, same_store_and_timelines
from .test_binary_intake import NODES, _messages, _Msg

#: nodes whose summaries the mixed run sends binary (the others JSON)
BINARY_IN_MIX = {"n0", "n2", "n5", "n7"}


class _Sink:
    """A partition's NATS connection as far as its digest goes."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, data))


def _partition(k: int) -> Controller:
    p = offline_controller()
    p.role, p.partition, p.nc, p.state = ROLE_PARTITION, k, _Sink(), MemoryState("c1")
    p._leader_ctl = frozenset(CTL_SIGNALS)  # every ctl_* value travels (the test rules are no cluster-wide ones)
    return p


def _leader(max_nodes: int | None = None) -> Controller:
    ctl = offline_controller()
    ctl.role = ROLE_LEADER
    if max_nodes is not None:
        ctl.nodes.max_nodes = max_nodes
    return ctl


def _take_as_schema_1(leader: Controller, rows: dict[str, tuple]) -> None:
    """The reference: the leader takes each digest row the schema-1 way, from the partition's
    own (JSON) rows, instead of the block's columns (the block still says which nodes)."""

    def take_block(b, layout, label_sets) -> None:
        for node in b.nodes:
            if node not in leader.nodes:
                continue
            t, _, labels, signals = rows[node]
            signals = {k: v for k, v in signals.items() if k not in (wire.BURST_STARTS, wire.BURST_BYTES)}
            if labels:
                leader.topology.observe(node, labels)
            leader.timelines.add_summary(node, t, signals)
            names, ents, values = leader.feed.samples(node, signals)
            if values:
                leader.feed.add(node, t, names, ents, values)

    leader._take_block = take_block  # type: ignore[method-assign]


def _run(seed: int, max_nodes: int | None = None) -> dict[str, Controller]:
    """Leaders fed by partitions (tp0's nodes on one, tp1's on the other) that took the same
    summaries as JSON, as binary and as a mix; "reference" took the JSON partitions' rows the
    schema-1 way. ``max_nodes``: the leaders' ingest.max_nodes."""
    msgs = _messages(seed, 40, change_at=20)
    runs = {name: [_partition(0), _partition(1)] for name in ("json", "binary", "mixed")}
    leaders = {name: _leader(max_nodes) for name in (*runs, "reference", "on_arrival")}
    # "on_arrival": the binary partitions' digests, taken in as they arrive, on the tick thread,
    # as a started leader takes them (not at its next tick)
    arriving = leaders["on_arrival"]
    arriving.tick_in_thread = True
    fed = {"json": ("json", "reference"), "binary": ("binary", "on_arrival"), "mixed": ("mixed",)}
    rows: dict[str, tuple] = {}  # the JSON partitions' rows of this round (the reference's)
    _take_as_schema_1(leaders["reference"], rows)
    for p in runs["json"]:
        publish = p._publish_digest

        async def snapshot(t, derived, p=p, publish=publish) -> None:
            rows.update(p._digest_rows)
            await publish(t, derived)

        p._publish_digest = snapshot  # type: ignore[method-assign]

    async def drive() -> None:
        for m in msgs:
            if m is None:
                for name, parts in runs.items():
                    for p in parts:
                        await p.evaluate_due()
                        for subject, data in p.nc.sent:
                            for leader in (leaders[k] for k in fed[name]):
                                await leader._on_digest(_Msg(subject, data))
                            assert not arriving._digests and not arriving.feed._pending  # in its store already
                        p.nc.sent.clear()
                for leader in leaders.values():
                    if leader is not arriving:
                        leader._take_digests()
                        leader.feed.flush()
                rows.clear()
                continue
            subject, js, bn = m
            node = wire.parse_subject(subject).tokens["node"]
            k = 0 if NODES.index(node) < 4 else 1
            await runs["json"][k]._on_summary(_Msg(subject, js))
            await runs["binary"][k]._on_summary(_Msg(subject, bn))
            await runs["mixed"][k]._on_summary(_Msg(subject, bn if node in BINARY_IN_MIX else js))
        for leader in leaders.values():
            await leader.evaluate_due()

    asyncio.run(drive())
    for name, parts in runs.items():
        assert all(p.stats.errors == 0 and p.stats.summaries_rejected == 0 for p in parts), name
        # warm partitions saved their alert states, each under its own name (as in KV: engine.p<k>)
        assert all(set(p.state.engine_saved) == {f"p{p.partition}"} for p in parts), name
    return leaders


def test_columnar_digests_leave_the_leader_the_state_per_dict_digests_leave() -> None:
    for seed in range(3):
        leaders = _run(seed)
        ref = leaders["reference"]
        assert ref.digests_in > 0 and set(ref.nodes.heard) == set(NODES)
        assert ref.store.blocks and any(tl.ttft for tl in ref.timelines.engines.values())
        assert any(k.startswith("ctl_") for k in ref.store.blocks)  # the partitions' derived values came too
        for name in ("json", "binary", "mixed", "on_arrival"):
            ctl = leaders[name]
            assert ctl.stats.errors == 0 and ctl.digests_in == ref.digests_in, name
            same_store_and_timelines(ref, ctl)
            assert ctl.topology.reported == ref.topology.reported, name
            assert ctl.nodes.heard == ref.nodes.heard and ctl.watermark == ref.watermark, name
            assert repr(ctl._reports) == repr(ref._reports) and ctl._reports, name
            assert ctl.stats.evaluations == ref.stats.evaluations > 0, name
        # several layouts reached the leader, and a node changed its layout on the way
        assert len(leaders["binary"].layouts.book.layouts) >= 4
        assert max(len(ids) for ids in leaders["mixed"].layouts.book._nodes.values()) >= 2


def test_rows_of_nodes_the_leader_refused_are_left_out_alike() -> None:
    leaders = _run(4, max_nodes=5)
    ref = leaders["reference"]
    # (the partitions' derived ctl_* values go in for every node, as they always did)
    summarised = {n for sig, per in ref.store.blocks.items() if not sig.startswith("ctl_") for n in per}
    assert len(ref.nodes.heard) == 5 and summarised == set(ref.nodes.heard)
    for name in ("json", "binary", "mixed", "on_arrival"):
        same_store_and_timelines(ref, leaders[name])
        assert leaders[name].topology.reported == ref.topology.reported
        assert set(leaders[name].layouts.book._nodes) <= set(ref.nodes.heard)  # no layout kept for them


def test_a_digest_is_columns_bounded_in_size_and_read_back() -> None:
    rng = random.Random(7)
    lay = wire.make_layout({"s_a": [""], "s_b": ["gpu0", "gpu1"]})
    rows: dict[str, tuple] = {}
    for i in range(5000):
        if i % 3 == 0:  # JSON rows: signals as dicts, null missing
            sig = {"s_a": {"": 1.0 * i}, "s_b": {"gpu1": None, "gpu0": 2.5}, "collective_burst_starts": {"0": 99.5}}
            rows[f"n{i}"] = (100.0 + i, 1.0, {"tp_group": f"g{i // 8}"}, sig)
        else:  # binary rows: (layout, float64 values) as they came
            v = np.array([1.0 * i, 2.5, math.nan if rng.random() < 0.2 else 7.0], dtype="<f8").tobytes()
            rows[f"n{i}"] = (100.0 + i, 1.0, {} if i % 5 == 0 else {"tp_group": f"g{i // 8}"}, (lay, v))
    derived = {"n1": {"ctl_aligned_steps": 20.0, "ctl_arrival_lag_seconds": float("nan")}}
    msgs = encode_digests("c", 3, 101.0, rows, derived, {})
    assert len(msgs) >= 2 and max(len(m) for m in msgs) <= DIGEST_BYTES_PER_MESSAGE < 1 << 20
    back = {}
    for m in msgs:
        d, layouts = decode_digest(m)
        assert d.schema == DIGEST_SCHEMA and d.partition == 3
        assert len(layouts) == 1 and layouts[0].id == lay.id  # JSON signals became the binary rows' layout
        for b in d.blocks:
            vals = np.frombuffer(b.values, "<f8").reshape(len(b.nodes), 3).tolist()
            for i, node in enumerate(b.nodes):
                back[node] = (b.t[i], b.interval[i], d.labels[b.labels[i]] if b.labels[i] >= 0 else {}, vals[i])
        if "n1" in back and "n1" in d.derived:
            assert d.derived == {"n1": {"ctl_aligned_steps": 20.0}}  # NaN left out
    assert list(back) == list(rows)  # every node once, in the partition's order
    assert back["n3"][0] == 103.0 and back["n3"][2] == {"tp_group": "g0"}
    assert back["n3"][3][:2] == [3.0, 2.5] and math.isnan(back["n3"][3][2])  # sorted entities; null is NaN
    assert back["n5"][2] == {}


def test_a_digest_of_another_schema_is_refused_with_a_clear_error(caplog) -> None:
    old = msgspec.msgpack.encode([1, "c1", 0, 101.0, [["n1", 100.0, 1.0, {}, {"s_a": {"": 1.0}}]], {}, {}])
    with pytest.raises(ValueError, match=r"digest schema 1; this controller reads 2"):
        decode_digest(old)
    leader = _leader()
    with caplog.at_level(logging.ERROR, logger="skewd.controller"):
        asyncio.run(leader._on_digest(_Msg(wire.digest_subject("c1", 0), old)))
    assert leader.digests_refused == 1 and leader.digests_in == 0 and not leader._digests
    assert "digest schema 1; this controller reads 2" in caplog.text
    leader._take_digests()  # nothing taken, nothing broken
    with pytest.raises(ValueError):
        decode_digest(b"\x93\x01\x02")


@pytest.mark.parametrize("field, change, says", [
    ("layout", lambda b: setattr(b, "layout", 3), "digest.blocks[0].layout"),
    ("values", lambda b: setattr(b, "values", b.values[:-8]), "digest.blocks[0].values"),
    ("labels", lambda b: setattr(b, "labels", [5] * len(b.labels)), "digest.blocks[0].labels"),
    ("t", lambda b: setattr(b, "t", b.t[:-1]), "digest.blocks[0]: 2 nodes, 1 t"),
    ("inf", lambda b: setattr(b, "values", b"\x00\x00\x00\x00\x00\x00\xf0\x7f" + b.values[8:]), "digest.blocks[0]: an infinite"),
])
def test_an_inconsistent_digest_block_is_refused_naming_the_field(field, change, says) -> None:
    from skewd.controller.digest import _DIGEST, _ENCODER

    lay = wire.make_layout({"s_a": [""]})
    rows = {n: (100.0, 1.0, {"tp_group": "g"}, (lay, b"\x00" * 8)) for n in ("n1", "n2")}
    (msg,) = encode_digests("c1", 0, 101.0, rows, {}, {})
    d = _DIGEST.decode(msg)
    change(d.blocks[0])
    with pytest.raises(ValueError, match=r"\A" + re.escape(says)):
        decode_digest(_ENCODER.encode(d))
    bad_layout = _DIGEST.decode(msg)
    bad_layout.layouts[0] = (bad_layout.layouts[0][0] ^ 1, bad_layout.layouts[0][1])
    with pytest.raises(ValueError, match=r"digest.layouts\[0\]"):
        decode_digest(_ENCODER.encode(bad_layout))


def test_a_json_summary_larger_than_a_binary_layout_may_be_still_reaches_the_leader() -> None:
    """The agent sends a summary of more than MAX_LAYOUT_SAMPLES values as JSON (its binary
    encoder falls back); at the partition it becomes a layout that large, which the leader
    reads (its digest is bounded by bytes, not by the binary layout's bound)."""
    n = wire.MAX_LAYOUT_SAMPLES + 10
    sig = {"summary_gpu_util_mean_ratio": {f"e{k:05d}": (None if k == 3 else k / n) for k in range(n)}}
    rows = {"n1": (100.0, 1.0, {"tp_group": "g"}, sig)}
    msgs = encode_digests("c1", 0, 101.0, rows, {}, {})
    assert max(len(m) for m in msgs) <= DIGEST_BYTES_PER_MESSAGE
    leader = _leader()
    for m in msgs:
        asyncio.run(leader._on_digest(_Msg(wire.digest_subject("c1", 0), m)))
    assert leader.digests_refused == 0 and "n1" in leader.nodes.heard
    leader._take_digests()
    ((pending,),) = leader.feed._pending.values()
    assert len(pending.values) == n - 1 and pending.entities[:4] == ["e00000", "e00001", "e00002", "e00004"]


def test_a_digest_carries_alignment_reports_as_asdict_would_without_sharing_their_dicts() -> None:
    import dataclasses

    from skewd.controller.align_steps import GroupReport
    from skewd.controller.digest import _report_dict

    rep = GroupReport("tp0", 101.0, 7, 0.004, {"n1": 0.01, "n2": 0.0}, {"n1": 0.009}, {"n1": 0.7}, {"n2": 0.1},
                      0.05, "")
    d = _report_dict(rep)
    assert d == dataclasses.asdict(rep) and GroupReport(**d) == rep
    d["lag_median_s"]["n1"] = 9.0  # the digest's copy, not the report's
    assert rep.lag_median_s["n1"] == 0.01


def test_a_digest_a_started_leader_cannot_take_in_is_counted_and_the_next_is_taken(caplog) -> None:
    lay = wire.make_layout({"summary_gpu_util_mean_ratio": ["0"]})
    rows = {"n1": (100.0, 1.0, {"tp_group": "g"}, (lay, np.float64(0.5).tobytes()))}
    (msg,) = encode_digests("c1", 0, 101.0, rows, {}, {})
    leader = _leader()
    leader.tick_in_thread = True
    take_block = leader._take_block

    def broken(*a) -> None:
        raise RuntimeError("store full")

    leader._take_block = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="skewd.controller"):
        asyncio.run(leader._on_digest(_Msg(wire.digest_subject("c1", 0), msg)))
    assert leader.stats.errors == 1 and "digest on skewd.v1.digest.c1.0 not taken in" in caplog.text
    leader._take_block = take_block  # type: ignore[method-assign]
    asyncio.run(leader._on_digest(_Msg(wire.digest_subject("c1", 0), msg)))
    assert leader.stats.errors == 1 and not leader._digests
    assert "n1" in leader.store.blocks["summary_gpu_util_mean_ratio"]  # in the store before any tick
