"""Hostile payloads: every decoder is total. Whatever bytes arrive (50,000 levels of nesting,
wrong types, NaN/Infinity/1e400/10**400, out-of-range times, a 5,000-digit integer, invalid
UTF-8, an oversized body), decoding either returns a message or raises ``WireError``: never
RecursionError, AttributeError, OverflowError, ValueError or TypeError, which would stop a
consumer that (rightly) catches only WireError. These are the payloads issue 21 reproduced."""
from __future__ import annotations

import json
import random
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skewd import wire
from skewd.controller import messages
from skewd.model import Finding, Layer, Scope, Severity, State

T = 1_700_000_030.0


def _finding_dict() -> dict:
    f = Finding(rule_id="GPU-3-engine-stall", pathology="GPU-3", severity=Severity.CRITICAL, layer=Layer.ENGINE,
                scope=Scope.ENGINE, node="gpu-node-17", entity="engine0", state=State.FIRING, active_at=T - 30,
                evaluated_at=T, fired_at=T, labels={"model": "llama"}, evidence={"tokens": 0.0},
                params={"window": 30.0}, summary="engine stalled", cluster="prod")
    return json.loads(wire.encode(f))


def _summary_dict() -> dict:
    s = wire.Summary(node="gpu-node-17", cluster="prod", t=T, interval=1.0,
                     signals={"summary_gpu_util_mean_ratio": {"": 0.5}}, clock_sync=wire.ClockSync(True, 0.001),
                     agent_version="test", labels={"tp_group": "tp0"})
    return json.loads(wire.encode(s))


def _health_dict() -> dict:
    h = wire.Health(node="gpu-node-17", cluster="prod", t=T, collectors={"nvml": wire.CollectorHealth("active")},
                    rules=wire.RulesHealth(3), last_reload=wire.ReloadStatus(True), spool_depth=0, drops={},
                    agent_version="test")
    return json.loads(wire.encode(h))


def _phase_dict() -> dict:
    rec = messages.PhaseRecord(node="gpu-node-17", cluster="prod", engine="engine0", model="m", t_start=T - 1, t=T,
                               phase=messages.Phase.DECODE,
                               steps=[messages.StepStat(T, 1, 0, 0, 4, 4, 0.02, 4, 0, 0.5)], finished=[], ttft_s=[0.1],
                               itl_count=4, itl_sum_s=0.08, itl_max_s=0.03, dropped={})
    return json.loads(messages.encode(rec))


def _reply_dict() -> dict:
    return json.loads(messages.encode(messages.RemapReply(key="k", decision=messages.Decision.ACK, consumer="router")))


DECODERS = {
    "finding": (_finding_dict, wire.decode_finding),
    "summary": (_summary_dict, wire.decode_summary),
    "health": (_health_dict, wire.decode_health),
    "phase": (_phase_dict, lambda b: messages.decode(b, messages.Kind.PHASE)),
    "remap_reply": (_reply_dict, lambda b: messages.decode(b, messages.Kind.REMAP_REPLY)),
}


def _outcome(decode, payload: bytes) -> str:
    """'ok' or 'rejected'; anything else escapes and fails the test."""
    try:
        decode(payload)
        return "ok"
    except wire.WireError:
        return "rejected"


def _with(d: dict, key: str, raw_json: str) -> bytes:
    """``d`` encoded with ``key`` set to a raw JSON text (so NaN, 1e400 and deep nesting can be
    written as an attacker would)."""
    d = dict(d)
    d[key] = "@@X@@"
    return json.dumps(d).replace('"@@X@@"', raw_json).encode()


DEEP = "[" * 50_000 + "]" * 50_000


@pytest.mark.parametrize("key, raw", [
    ("labels", DEEP), ("evidence", '{"a":' + DEEP + "}"), ("params", '{"a":' + DEEP + "}"),
    ("labels", "[1, 2]"), ("labels", '{"a": 1}'), ("labels", '{"a": {"b": "c"}}'),
    ("active_at", "NaN"), ("active_at", "Infinity"), ("active_at", "-Infinity"), ("active_at", "1e400"),
    ("active_at", str(10 ** 400)), ("active_at", "9" * 5000), ("active_at", "-5"), ("active_at", "1e17"),
    ("evaluated_at", "true"), ("fired_at", '"yesterday"'), ("evidence", '{"v": 1e400}'),
    ("evidence", '{"v": [1]}'), ("params", '{"p": {"q": 1}}'), ("params", '{"p": 1e999}'),
    ("severity", '"apocalyptic"'), ("scope", "7"), ("state", "null"), ("node", '"' + "n" * 300 + '"'),
    ("schema", "1.0"), ("schema", "[]"), ("kind", "{}"), ("id", '"forged"'),
])
def test_poison_findings_are_rejected_as_wire_errors(key: str, raw: str) -> None:
    assert _outcome(wire.decode_finding, _with(_finding_dict(), key, raw)) == "rejected"


@pytest.mark.parametrize("key, raw", [
    ("t", "1e17"), ("t", "Infinity"), ("t", "NaN"), ("t", "1e400"), ("t", str(10 ** 400)), ("t", "-1"),
    ("interval", "-1"), ("interval", "Infinity"), ("labels", "[1, 2]"), ("labels", '{"a": 1}'),
    ("signals", '{"x": {"": 1e400}}'), ("signals", '{"x": {"": NaN}}'), ("signals", '{"x": {"": ' + str(10 ** 30) + "}}"),
    ("signals", '{"x": ' + DEEP + "}"), ("clock_sync", '{"synced": true, "max_error_s": -1}'),
    ("clock_sync", '{"synced": true, "max_error_s": Infinity}'), ("clock_sync", "[]"),
])
def test_poison_summaries_are_rejected_as_wire_errors(key: str, raw: str) -> None:
    assert _outcome(wire.decode_summary, _with(_summary_dict(), key, raw)) == "rejected"


@pytest.mark.parametrize("kind", sorted(DECODERS))
@pytest.mark.parametrize("payload", [
    b"\xff\xfe not utf-8", b"[]", b"7", b"null", b'"x"', ("[" * 50_000).encode(), b'{"a":' * 50_000,
    b'{"kind": "' + b"x" * (2 << 20) + b'"}', b"", b"{", b"NaN",
], ids=["bad-utf8", "list", "number", "null", "string", "deep-open", "deep-objects", "oversized", "empty",
        "truncated", "nan"])
def test_garbage_of_every_shape_is_rejected_by_every_decoder(kind: str, payload: bytes) -> None:
    assert _outcome(DECODERS[kind][1], payload) == "rejected"


def test_good_messages_still_decode_and_brackets_in_strings_are_not_nesting() -> None:
    for kind, (make, decode) in DECODERS.items():
        assert _outcome(decode, json.dumps(make()).encode()) == "ok", kind
    d = _finding_dict()
    d["summary"] = "[" * 5000 + "{" * 5000 + '\\"]'  # text, not structure
    d.pop("id")
    assert wire.decode_finding(json.dumps(d).encode()).summary.startswith("[[[")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(DECODERS)), st.data())
def test_any_field_set_to_any_json_is_decoded_or_rejected(kind: str, data: st.DataObject) -> None:
    make, decode = DECODERS[kind]
    d = make()
    # walk to a random object in the message and set a random key of it (or a new one)
    parent = d
    while True:
        objs = [k for k, v in parent.items() if isinstance(v, dict) and v]
        if not objs or data.draw(st.booleans()):
            break
        parent = parent[data.draw(st.sampled_from(objs))]
    key = data.draw(st.sampled_from(sorted(parent)) | st.text(max_size=4))
    parent[key] = data.draw(_json)
    _outcome(decode, json.dumps(d, allow_nan=True).encode())


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(DECODERS)), st.integers(0, 2 ** 32), st.integers(1, 8))
def test_any_byte_mutation_is_decoded_or_rejected(kind: str, seed: int, n: int) -> None:
    make, decode = DECODERS[kind]
    rng = random.Random(seed)
    _outcome(decode, mutated(json.dumps(make()).encode(), rng, n, lambda: rng.choice(
        [b"[", b"{", b"]", b"}", b'"', b"\\", b"1e999", b"NaN", b"-", b"9" * 50])))


def mutated(raw: bytes, rng: random.Random, n: int, insert: Callable[[], bytes]) -> bytes:
    """``raw`` with ``n`` random bytes replaced, ``insert()``-ed or deleted."""
    out = bytearray(raw)
    for _ in range(n):
        i = rng.randrange(len(out))
        op = rng.randrange(3)
        if op == 0:
            out[i] = rng.randrange(256)
        elif op == 1:
            out[i:i] = insert()
        else:
            del out[i]
    return bytes(out)


@given(_json)
def test_depth_check_agrees_with_the_parsed_nesting(value) -> None:
    def depth(v) -> int:
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    raw = json.dumps(value).encode()
    for limit in (0, 1, 2, 3, 5):
        assert wire.json_depth_exceeds(raw, limit) == (depth(value) > limit), (raw, limit)
