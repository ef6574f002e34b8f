"""The binary summary (skewd/wire/binsummary.py): it means what the JSON summary means, every
problem is a WireError naming the field, the layout rides along when a reader may lack it, and
what a reader keeps of layouts is bounded."""
from __future__ import annotations

import json
import math
import random

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skewd import wire
from skewd.wire import binsummary

from .test_wire_hostile import mutated

T = 1_700_000_030.0


def _summary(**kw) -> wire.Summary:
    base = dict(node="gpu-node-07", cluster="prod-a", t=T, interval=1.0,
                signals={"summary_gpu_util_mean_ratio": {"": 0.91}, "summary_requests_waiting": {"": None},
                         "engine_phase": {"engine0": 1.0, "engine1": 2.0},
                         "collective_burst_starts": {str(k): T - 1 + 0.05 * k for k in range(12)},
                         "collective_burst_bytes": {str(k): None if k % 3 else 6.4e7 for k in range(12)}},
                clock_sync=wire.ClockSync(synced=True, max_error_s=0.0004), agent_version="0.1.0",
                labels={"tp_group": "tp0", "tp_rank": "3"})
    base.update(kw)
    return wire.Summary(**base)


def _header(**kw) -> wire.BinarySummary:
    """A valid binary summary's fields (carrying its layout), ``kw`` replaced."""
    lay = wire.make_layout({"a": [""], "b": ["x", "y"]})
    base = dict(cluster="c", node="n1", t=T, interval=1.0, synced=True, max_error_s=0.001, agent_version="v",
                labels={"tp_group": "g"}, layout_id=lay.id, layout=lay.raw,
                values=np.array([1.0, 2.0, float("nan")]).tobytes(), starts=np.array([T - 0.5]).tobytes(),
                burst_bytes=b"")
    base.update(kw)
    return wire.BinarySummary(**base)


def _as_json(s: wire.Summary) -> wire.Summary:
    return wire.decode_summary(wire.encode(s))


# ---- the same meaning as JSON -----------------------------------------------------------------

def test_a_binary_summary_decodes_to_the_json_summary_and_is_smaller() -> None:
    s = _summary()
    raw = wire.SummaryEncoder().encode(s)
    assert raw[:4] == wire.BINARY_PREFIX and raw[0] == 0x93
    assert wire.decode_summary(raw) == _as_json(s)
    assert len(raw) < len(wire.encode(s))
    # JSON payloads are told apart by their first byte: the JSON reader names the binary form
    with pytest.raises(wire.WireError, match="binary summary, not JSON"):
        wire.load_json(raw)


_names = st.text(st.characters(codec="utf-8"), max_size=6)
_values = st.none() | st.floats(allow_nan=True, allow_infinity=True) | st.integers(-2 ** 53, 2 ** 53)


@settings(max_examples=200, deadline=None)
@given(signals=st.dictionaries(_names, st.dictionaries(_names, _values, max_size=4), max_size=6),
       starts=st.lists(st.none() | st.floats(0, 1e10), max_size=15), with_bytes=st.booleans(),
       labels=st.dictionaries(_names, _names, max_size=3), err=st.none() | st.floats(0, 10),
       t=st.floats(0, 1e11), interval=st.floats(0, 1e6), seed=st.integers(0, 99))
def test_any_summary_round_trips_to_what_its_json_gives(signals, starts, with_bytes, labels, err, t, interval,
                                                        seed) -> None:
    """Property: whatever an agent's Summary holds, its binary bytes decode to the Summary its
    JSON bytes decode to (None, NaN and infinities as JSON has them: null), on the first send
    (layout carried) and through a reader that learned the layout (later sends)."""
    signals = {k: v for k, v in signals.items() if k not in (wire.BURST_STARTS, wire.BURST_BYTES)}
    if starts:
        signals[wire.BURST_STARTS] = {str(k): v for k, v in enumerate(starts)}
        if with_bytes:
            rng = random.Random(seed)
            signals[wire.BURST_BYTES] = {str(k): None if rng.random() < 0.3 else rng.random() * 1e8
                                         for k in range(len(starts))}
    s = wire.Summary(node="n1", cluster="c", t=t, interval=interval, signals=signals,
                     clock_sync=wire.ClockSync(err is not None, err), agent_version="v", labels=labels)
    enc = wire.SummaryEncoder()
    first, second = enc.encode(s), enc.encode(s)
    assert enc.json_fallbacks == 0
    want = _as_json(s)
    reader = wire.BinarySummaryReader()
    assert reader.read(first) == want
    assert reader.read(second) == want
    assert not binsummary.read_binary(second).layout  # it rode along once


def test_what_binary_cannot_carry_exactly_goes_as_json() -> None:
    enc = wire.SummaryEncoder()
    odd = [
        {**_summary().signals, wire.BURST_STARTS: {"a": T}},  # burst keys other than 0..n-1
        {**_summary().signals, wire.BURST_BYTES: {"0": 1.0}},  # bytes keyed unlike the starts
        {"x" * 300: {"": 1.0}},  # a name over MAX_NAME_CHARS
        {"s": {str(k): 1.0 for k in range(wire.MAX_LAYOUT_SAMPLES + 1)}},
    ]
    for sig in odd:
        raw = enc.encode(_summary(signals=sig))
        assert raw[:1] == b"{", sig.keys()
        assert wire.decode_summary(raw) == _as_json(_summary(signals=sig))
    assert enc.json_fallbacks == len(odd)


# ---- when the layout rides along --------------------------------------------------------------

def _carries(raw: bytes) -> bool:
    return bool(binsummary.read_binary(raw).layout)


def test_the_layout_rides_along_when_new_changed_periodically_and_after_a_reconnect() -> None:
    enc = wire.SummaryEncoder(layout_every=10.0)
    a = _summary()
    b = _summary(signals={**a.signals, "summary_cpu_busy_cores": {"": 3.0}})
    sent = []
    for i, s in enumerate([a, a, a, b, b, a, a]):
        sent.append(_carries(enc.encode(wire.Summary(**{**s.__dict__, "t": T + i}))))
    # first of a; a again; a; b is new; b again; a is one of the node's last layouts: no need
    assert sent == [True, False, False, True, False, False, False]
    assert _carries(enc.encode(wire.Summary(**{**a.__dict__, "t": T + 10.0})))  # 10 s after it last rode along
    assert not _carries(enc.encode(wire.Summary(**{**a.__dict__, "t": T + 11.0})))
    enc.resend_layout()
    assert _carries(enc.encode(wire.Summary(**{**a.__dict__, "t": T + 12.0})))
    # more layouts than a reader keeps per node: the oldest must ride along again
    enc = wire.SummaryEncoder(layout_every=1e9)
    shapes = [_summary(signals={f"s{k}": {"": 1.0}}) for k in range(wire.binsummary.LAYOUTS_PER_NODE + 1)]
    assert all(_carries(enc.encode(s)) for s in shapes)
    assert _carries(enc.encode(shapes[0])) and not _carries(enc.encode(shapes[-1]))


def test_a_reader_refuses_an_unknown_layout_until_it_rides_along() -> None:
    enc = wire.SummaryEncoder(layout_every=5.0)
    msgs = [enc.encode(wire.Summary(**{**_summary().__dict__, "t": T + i})) for i in range(8)]
    reader = wire.BinarySummaryReader()  # starts at the second summary: a restarted controller
    for i in (1, 2, 3, 4):
        with pytest.raises(wire.LayoutUnknownError, match="not known yet"):
            reader.read(msgs[i])
    assert reader.read(msgs[5]).t == T + 5  # the periodic layout
    assert reader.read(msgs[6]).t == T + 6 and not _carries(msgs[6])


def test_a_reader_keeps_a_bounded_set_of_layouts_shared_between_nodes() -> None:
    book = wire.LayoutBook(per_node=2)
    lays = [wire.make_layout({f"s{k}": [""]}) for k in range(4)]
    for node in ("n1", "n2"):
        assert book.keep(node, lays[0]) == []
    assert len(book.layouts) == 1  # one copy for both nodes
    assert book.keep("n1", lays[1]) == [] and book.keep("n1", lays[2]) == []  # n1 dropped lays[0]; n2 keeps it
    assert set(book.layouts) == {lays[0].id, lays[1].id, lays[2].id}
    assert book.keep("n1", lays[3]) == [lays[1].id]  # nobody else keeps it: forgotten
    assert book.forget_node("n2") == [lays[0].id]
    assert set(book.layouts) == {lays[2].id, lays[3].id}


# ---- strict reading: every problem a WireError naming the field ------------------------------

def _pack(h: wire.BinarySummary) -> bytes:
    return wire.pack(h)


@pytest.mark.parametrize("raw, message", [
    (b"\x93SK\x02" + msgspec.msgpack.encode([]), "version 2; this skewd reads version 1"),
    (b"\x93SX\x01", "magic"),
    (b"\x93SK\x01", "not a binary summary"),
    (b"\x93SK\x01\x9d\xa1c", "not a binary summary"),
    (b"\x93SK\x01" + msgspec.msgpack.encode(["c", "n"]), "at least length 13"),
    (_pack(_header())[:-3], "not a binary summary"),
    (_pack(_header(node="n" * 257)), "field 'node'"),
    (_pack(_header(t=1e12)), "field 't'"),
    (_pack(_header(t=float("nan"))), "field 't'"),
    (_pack(_header(interval=float("inf"))), "field 'interval'"),
    (_pack(_header(interval=-1.0)), "field 'interval'"),
    (_pack(_header(max_error_s=-1.0)), "field 'max_error_s'"),
    (_pack(_header(labels={"a": "x" * 300})), "field 'labels'"),
    (_pack(_header(values=b"\0" * 13)), "field 'values' holds 13 bytes"),
    (_pack(_header(values=np.zeros(4).tobytes())), "field 'values' holds 4 values; layout"),
    (_pack(_header(values=np.array([1.0, math.inf, 2.0]).tobytes())), r"field 'values'\[1\] is inf"),
    (_pack(_header(starts=np.array([T, -math.inf]).tobytes())), r"field 'starts'\[1\] is -inf"),
    (_pack(_header(burst_bytes=np.zeros(2).tobytes())), "field 'burst_bytes' holds 2 values for 1 starts"),
    (_pack(_header(layout_id=7)), "field 'layout' hashes to layout id"),
    (_pack(_header(layout_id=-1)), "field 'layout_id'"),
    (b"\x93SK\x01" + msgspec.msgpack.encode(["c", "n1", T, 1.0, "yes", None, "v", {}, 0, b"", b"", b"", b""]),
     "field 'synced'"),
    (b"x" * (wire.MAX_PAYLOAD_BYTES + 1), "payload is"),
])
def test_bad_binary_summaries_are_refused_naming_the_field(raw: bytes, message: str) -> None:
    with pytest.raises(wire.WireError, match=message):
        reader = wire.BinarySummaryReader()
        binsummary.decode_binary_summary(raw, reader.book) if raw[:1] == b"\x93" else binsummary.read_binary(raw)


def _with_layout(pairs: list) -> bytes:
    raw = msgspec.msgpack.encode(pairs)
    n = sum(len(es) for _, es in pairs) if all(isinstance(p, list) and len(p) == 2 and isinstance(p[1], list)
                                             for p in pairs) else 0
    return _pack(_header(layout=raw, layout_id=wire.layout_id(raw), values=np.zeros(n).tobytes()))


@pytest.mark.parametrize("pairs, message", [
    ([["a", [""]], ["a", ["x"]]], "signal 'a' appears twice"),
    ([["a", ["x", "x"]]], "signal 'a' lists an entity twice"),
    ([[wire.BURST_STARTS, ["0"]]], "travels in its own field"),
    ([["a", ["e" * 257]]], "summary.layout"),
    ([["a", "x"]], "summary.layout"),
    ([["a", [""]], 7], "summary.layout"),
    ([["s", [str(k) for k in range(wire.MAX_LAYOUT_SAMPLES + 1)]]], "at most 4096"),
])
def test_bad_layouts_are_refused(pairs: list, message: str) -> None:
    with pytest.raises(wire.WireError, match=message):
        wire.decode_binary_summary(_with_layout(pairs))


def test_a_layout_that_is_not_messagepack_is_refused() -> None:
    raw = b"\xc1garbage"
    with pytest.raises(wire.WireError, match="not a MessagePack layout"):
        wire.decode_binary_summary(_pack(_header(layout=raw, layout_id=wire.layout_id(raw))))


def test_trailing_fields_a_later_skewd_may_add_are_ignored() -> None:
    h = _header()
    raw = wire.BINARY_PREFIX + msgspec.msgpack.encode([*msgspec.structs.astuple(h), "a field added later"])
    assert wire.decode_summary(raw) == wire.decode_summary(_pack(h))


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2 ** 32), st.integers(1, 8), st.booleans())
def test_any_byte_mutation_is_decoded_or_rejected(seed: int, n: int, known: bool) -> None:
    enc = wire.SummaryEncoder()
    first = enc.encode(_summary())
    rng = random.Random(seed)
    raw = mutated(first if not known else enc.encode(_summary()), rng, n,
                  lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9))))
    reader = wire.BinarySummaryReader()
    reader.read(first)
    try:
        got = reader.read(raw)
    except wire.WireError:
        return  # refused with the wire's own error, never another exception
    # accepted: then it is a summary the strict JSON reader accepts as it stands
    assert isinstance(got, wire.Summary)
    assert wire.decode_summary(wire.encode(got)) == got


def test_the_hexdumps_in_docs_wire_md_are_what_the_encoder_writes() -> None:
    """docs/wire.md shows a binary summary and its layout byte by byte: they are the bytes."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "wire.md").read_text()
    section = doc[doc.index("### Binary summaries"):]
    dumps = []
    for block in section.split("```")[1::2][:2]:
        dumps.append(bytes.fromhex("".join(line[6:54] for line in block.strip().splitlines())))
    s = wire.Summary(node="gpu-node-07", cluster="prod-a", t=1700000030.0, interval=1.0,
                     signals={"summary_gpu_util_mean_ratio": {"": 0.91}, "engine_kv_cache_usage_ratio": {"engine0": 0.62},
                              "summary_requests_waiting": {"": None},
                              "collective_burst_starts": {"0": 1700000029.05, "1": 1700000029.55}},
                     clock_sync=wire.ClockSync(True, 0.0004), agent_version="0.1.0", labels={"tp_group": "tp0"})
    enc = wire.SummaryEncoder()
    enc.encode(s)
    assert dumps == [enc.encode(s), wire.make_layout(s.signals).raw]
    assert str(wire.read_binary(dumps[0]).layout_id) in section
