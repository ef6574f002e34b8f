"""The wire contract: subject tokens, subjects, stream specs, message encoding and strict decoding."""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skewd import wire
from skewd.wire import decoding, fastsummary
from skewd.model import Finding, Layer, Scope, Severity, State

# What a NATS token must never contain, and the narrower set skewd promises (ACL/tool friendly).
FORBIDDEN = re.compile(r"[.*>\s]")
PROMISED = re.compile(r"[A-Za-z0-9_%-]+")


def _finding(**kw) -> Finding:
    base = dict(rule_id="GPU-2-kv-saturation", pathology="kv-cache saturation", severity=Severity.WARNING,
                layer=Layer.ENGINE, scope=Scope.ENGINE, node="gpu-node-07", entity="engine0",
                state=State.FIRING, active_at=1700000000.25, evaluated_at=1700000030.0,
                fired_at=1700000030.0, labels={"model": "llama"}, evidence={"kv": 0.97, "nan": float("nan")},
                params={"threshold": 0.9}, mitigation="lower max_num_seqs", summary="KV cache full",
                cluster="prod-a")
    base.update(kw)
    return Finding(**base)


def _summary(**kw) -> wire.Summary:
    base = dict(node="gpu-node-07", cluster="prod-a", t=1700000030.0, interval=10.0,
                signals={"gpu_utilization_ratio": {"gpu0": 0.91, "gpu1": float("nan")},
                         "node_load": {"": 3.5}},
                clock_sync=wire.ClockSync(synced=True, max_error_s=0.0004), agent_version="0.1.0")
    base.update(kw)
    return wire.Summary(**base)


def _health(**kw) -> wire.Health:
    base = dict(node="gpu-node-07", cluster="prod-a", t=1700000030.0,
                collectors={"nvml": wire.CollectorHealth("absent", "no NVIDIA driver loaded"),
                            "sysfs": wire.CollectorHealth("active")},
                rules=wire.RulesHealth(active=12, inactive={"RDMA-1-pfc-storm": "needs rdma collector"}),
                last_reload=wire.ReloadStatus(ok=False, error="rules/x.yaml:3:5: unknown key 'fro'", t=1699999990.0),
                spool_depth=4, drops={"spool_full": 2, "rejected": 0, "best_effort": 7}, agent_version="0.1.0")
    base.update(kw)
    return wire.Health(**base)


# ---- tokens ---------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, tok", [
    ("GPU-2-kv-saturation", "GPU-2-kv-saturation"),  # rule ids pass unchanged
    ("gpu_node_07", "gpu_node_07"),
    ("node.1", "node%2E1"),
    ("prod.us-east", "prod%2Eus-east"),
    ("meta-llama/Llama-3-8B/0", "meta-llama%2FLlama-3-8B%2F0"),
    ("*", "%2A"),
    (">", "%3E"),
    ("a b\tc", "a%20b%09c"),
    ("$SYS", "%24SYS"),
    ("100%", "100%25"),
    ("", "%"),
    ("nœud", "n%C5%93ud"),
])
def test_token_examples(raw: str, tok: str) -> None:
    assert wire.token(raw) == tok
    assert wire.untoken(tok) == raw


@given(st.text())
def test_token_is_safe_reversible_and_deterministic(raw: str) -> None:
    tok = wire.token(raw)
    assert tok and PROMISED.fullmatch(tok) and not FORBIDDEN.search(tok)
    assert not tok.startswith("$")
    assert wire.token(raw) == tok
    assert wire.untoken(tok) == raw


@given(st.text(), st.text())
def test_distinct_names_never_share_a_token(a: str, b: str) -> None:
    if a != b:
        assert wire.token(a) != wire.token(b)


@pytest.mark.parametrize("bad", ["a.b", "a*", "%4", "%zz", "%41", "x%", "%%", "%C5"])
def test_untoken_rejects_what_token_never_writes(bad: str) -> None:
    with pytest.raises(wire.WireError):
        wire.untoken(bad)


def test_token_refuses_non_strings() -> None:
    with pytest.raises(TypeError):
        wire.token(7)  # type: ignore[arg-type]


# ---- subjects -------------------------------------------------------------------------------

def test_subjects_are_versioned_and_hierarchical() -> None:
    assert wire.finding_subject("prod-a", "node.1", "GPU-2-kv-saturation") == \
        "skewd.v1.finding.prod-a.node%2E1.GPU-2-kv-saturation"
    assert wire.summary_subject("prod-a", "n7") == "skewd.v1.summary.prod-a.n7"
    assert wire.health_subject("prod-a", "n7") == "skewd.v1.health.prod-a.n7"
    assert wire.remap_subject("prod-a") == "skewd.v1.remap.prod-a"
    assert wire.phase_subject("prod-a", "n7", "llama/0") == "skewd.v1.phase.prod-a.n7.llama%2F0"


@given(st.text(), st.text(), st.text())
def test_any_names_give_a_valid_subject_that_parses_back(cluster: str, node: str, rule: str) -> None:
    subj = wire.finding_subject(cluster, node, rule)
    tokens = subj.split(".")
    assert len(tokens) == 6 and all(t and not FORBIDDEN.search(t) for t in tokens)
    parsed = wire.parse_subject(subj)
    assert parsed.kind is wire.MessageKind.FINDING
    assert parsed.tokens == {"cluster": cluster, "node": node, "rule": rule}


def _matches(filt: str, subject: str) -> bool:
    """NATS subject matching (``*`` one token, ``>`` the rest), for checking our filters/streams."""
    f, s = filt.split("."), subject.split(".")
    for i, tok in enumerate(f):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(f) == len(s)


def test_subject_filter_pins_named_tokens_and_wildcards_the_rest() -> None:
    filt = wire.subject_filter("finding", cluster="prod.a")
    assert filt == "skewd.v1.finding.prod%2Ea.*.*"
    assert _matches(filt, wire.finding_subject("prod.a", "n1", "R-1"))
    assert not _matches(filt, wire.finding_subject("prod-b", "n1", "R-1"))
    assert wire.subject_filter(wire.MessageKind.HEALTH) == "skewd.v1.health.*.*"
    with pytest.raises(wire.WireError, match="rule"):
        wire.subject_filter("summary", rule="x")


@pytest.mark.parametrize("bad", ["skewd.v2.finding.a.b.c", "skewd.v1.nope.a", "skewd.v1.finding.a.b",
                                 "other.v1.summary.a.b", "skewd.v1.summary.a.b%zz"])
def test_parse_subject_rejects_foreign_subjects(bad: str) -> None:
    with pytest.raises(wire.WireError):
        wire.parse_subject(bad)


def test_streams_capture_durable_kinds_and_nothing_else() -> None:
    subjects = {
        wire.MessageKind.FINDING: wire.finding_subject("c", "n", "R-1"),
        wire.MessageKind.REMAP: wire.remap_subject("c"),
        wire.MessageKind.SUMMARY: wire.summary_subject("c", "n"),
        wire.MessageKind.HEALTH: wire.health_subject("c", "n"),
        wire.MessageKind.PHASE: wire.phase_subject("c", "n", "e"),
    }
    owners = {k: [s.name for s in wire.STREAMS if any(_matches(f, subj) for f in s.subjects)]
              for k, subj in subjects.items()}
    assert owners == {wire.MessageKind.FINDING: ["SKEWD_FINDINGS"], wire.MessageKind.REMAP: ["SKEWD_REMAPS"],
                      wire.MessageKind.SUMMARY: [], wire.MessageKind.HEALTH: [], wire.MessageKind.PHASE: []}
    assert wire.BEST_EFFORT_KINDS == {k for k, v in owners.items() if not v}
    for s in wire.STREAMS:
        assert s.storage == "file" and s.duplicate_window_s >= 60 and s.discard == "old"


# ---- encoding -------------------------------------------------------------------------------

def test_summary_roundtrip_is_compact_sorted_and_maps_nan_to_null() -> None:
    s = _summary()
    data = wire.encode(s)
    assert b" " not in data and b"NaN" not in data
    d = json.loads(data)
    assert list(d) == sorted(d) and d["kind"] == "summary" and d["schema"] == 1
    assert d["signals"]["gpu_utilization_ratio"] == {"gpu0": 0.91, "gpu1": None}
    back = wire.decode(data)
    assert isinstance(back, wire.Summary)
    assert back == _summary(signals={"gpu_utilization_ratio": {"gpu0": 0.91, "gpu1": None}, "node_load": {"": 3.5}})


def test_encoding_is_deterministic_whatever_the_dict_order() -> None:
    a = _summary(signals={"b": {"y": 1.0, "x": 2.0}, "a": {"": 0.5}})
    b = _summary(signals={"a": {"": 0.5}, "b": {"x": 2.0, "y": 1.0}})
    assert wire.encode(a) == wire.encode(b)


def test_health_roundtrip() -> None:
    h = _health()
    back = wire.decode(wire.encode(h))
    assert back == h and back.kind is wire.MessageKind.HEALTH


def test_finding_roundtrip_through_the_wire() -> None:
    f = _finding()
    data = wire.encode(f)
    assert json.loads(data)["kind"] == "finding"
    back = wire.decode(data)
    assert isinstance(back, Finding)
    assert back.to_dict() == f.to_dict() and back.event_id == f.event_id
    # the model's own JSON (no "kind") decodes too when the kind is known from the subject
    assert wire.decode_finding(f.to_json()).event_id == f.event_id


def test_a_finding_whose_evidence_is_infinite_encodes_it_as_null() -> None:
    """An average of a signal that overflowed, or a ratio over zero, is +-inf: JSON has no such
    number. Like NaN it is sent as null, and the finding is published (fuzz input bundle 505240:
    a replayed finding with avg(...) = inf raised ValueError out of the encoder)."""
    f = _finding(evidence={"kv": 0.97, "up": float("inf"), "down": float("-inf")})
    d = json.loads(wire.encode(f))
    assert d["evidence"] == {"kv": 0.97, "up": None, "down": None}
    assert wire.decode(wire.encode(f)).evidence == {"kv": 0.97, "up": None, "down": None}


def test_headers_and_subject_for_a_finding() -> None:
    f = _finding(node="n.1")
    assert wire.headers_for(f) == {"Nats-Msg-Id": f.event_id, "Skewd-Kind": "finding", "Skewd-Schema": "1"}
    assert wire.subject_for(f) == "skewd.v1.finding.prod-a.n%2E1.GPU-2-kv-saturation"
    assert wire.subject_for(_finding(cluster=""), cluster="fallback").startswith("skewd.v1.finding.fallback.")


# ---- strict decoding ------------------------------------------------------------------------

def _mutated(msg, **changes) -> bytes:
    d = wire.to_dict(msg)
    for k, v in changes.items():
        if v is ...:
            del d[k]
        else:
            d[k] = v
    return json.dumps(d).encode()


@pytest.mark.parametrize("msg", [_summary(), _health(), _finding()], ids=["summary", "health", "finding"])
def test_unknown_schema_version_is_a_clear_error(msg) -> None:
    with pytest.raises(wire.SchemaVersionError, match=r"schema 2.*reads schema 1.*upgrade"):
        wire.decode(_mutated(msg, schema=2))
    with pytest.raises(wire.SchemaVersionError):
        wire.decode(_mutated(msg, schema=...))


def test_missing_and_mistyped_fields_are_named() -> None:
    with pytest.raises(wire.WireError, match="summary: missing field 'node'"):
        wire.decode(_mutated(_summary(), node=...))
    with pytest.raises(wire.WireError, match=r"summary: field 't' must be a finite number"):
        wire.decode(_mutated(_summary(), t="now"))
    with pytest.raises(wire.WireError, match=r"health.rules: field 'active' must be an integer"):
        wire.decode(_mutated(_health(), rules={"active": True, "inactive": {}}))
    with pytest.raises(wire.WireError, match=r"summary.signals.x: field 'gpu0' must be a finite number"):
        wire.decode(_mutated(_summary(), signals={"x": {"gpu0": "hot"}}))
    with pytest.raises(wire.WireError, match="finding: field 'node' must be a string"):
        wire.decode(_mutated(_finding(), node=7))
    with pytest.raises(wire.WireError, match="finding: field 'id'"):
        wire.decode(_mutated(_finding(), id="forged"))


def test_kind_mismatch_and_garbage_are_rejected() -> None:
    with pytest.raises(wire.WireError, match="expected a health message, got kind 'summary'"):
        wire.decode(wire.encode(_summary()), expect="health")
    with pytest.raises(wire.WireError, match="unknown or missing kind"):
        wire.decode(b'{"schema":1,"kind":"gossip"}')
    with pytest.raises(wire.WireError, match="not JSON"):
        wire.decode(b"\xff\xfe")
    with pytest.raises(wire.WireError, match="JSON object"):
        wire.decode(b"[1,2]")


def test_unknown_fields_within_a_schema_version_are_ignored() -> None:
    """Additive evolution: an agent one release ahead may add optional fields."""
    back = wire.decode(_mutated(_health(), gpu_count=8))
    assert back == _health()


# ---- the summary fast path: same results, same errors ---------------------------------------

def _outcome(fn, d):
    """What decoding ``d`` gives: the Summary's repr (floats as floats: 1 and 1.0 differ) or the
    error's type and message."""
    try:
        return ("ok", repr(fn(d)))
    except Exception as e:  # noqa: BLE001 - the comparison is the point
        return (type(e).__name__, str(e))


def _good_summary_dict() -> dict:
    d = wire.to_dict(_summary(labels={"tp_group": "tp0", "tp_rank": "3"}))
    d["signals"]["collective_burst_starts"] = {"0": 1700000029.05, "1": 1700000029.1}
    return json.loads(json.dumps(d))


_ODD = [None, True, False, 0, 7, -1.5, float("nan"), "x", "", [], [1], {}, {"a": 1}, {"a": None}]
_PATHS = [("schema",), ("kind",), ("node",), ("cluster",), ("t",), ("interval",), ("agent_version",),
          ("signals",), ("signals", "node_load"), ("signals", "node_load", ""),
          ("signals", "gpu_utilization_ratio", "gpu0"), ("clock_sync",), ("clock_sync", "synced"),
          ("clock_sync", "max_error_s"), ("labels",), ("labels", "tp_rank")]


@pytest.mark.parametrize("path", _PATHS)
def test_summary_fast_path_accepts_and_rejects_exactly_like_the_strict_reader(path) -> None:
    for value in [*_ODD, "<missing>"]:
        d = _good_summary_dict()
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        if value == "<missing>":
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = value
        assert _outcome(wire.summary_from_dict, d) == _outcome(decoding._strict_summary_from_dict, d), (path, value)


def test_summary_fast_path_is_taken_for_what_agents_send_and_converts_integers() -> None:
    d = _good_summary_dict()
    d["signals"]["node_load"][""] = 3  # an integral value, as JSON may carry it
    d["t"] = 1700000030
    fast = fastsummary.fast_summary(d)
    assert fast is not None
    assert repr(fast) == repr(decoding._strict_summary_from_dict(d))
    assert type(fast.t) is float and type(fast.signals["node_load"][""]) is float


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8)


@given(st.sampled_from(_PATHS), _json_values)
def test_summary_fast_path_matches_the_strict_reader_on_any_json(path, value) -> None:
    d = _good_summary_dict()
    parent = d
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = value
    assert _outcome(wire.summary_from_dict, d) == _outcome(decoding._strict_summary_from_dict, d)


# ---- the typed (msgspec) summary decoder: same results, same errors -------------------------

def _strict_decode(raw: bytes):
    return wire.decode(raw, wire.MessageKind.SUMMARY)


def _raw_with(path, value, *, text_value: str | None = None) -> bytes:
    d = _good_summary_dict()
    parent = d
    for k in path[:-1]:
        parent = parent[k]
    if value == "<missing>":
        parent.pop(path[-1], None)
    else:
        parent[path[-1]] = value
    raw = json.dumps(d, allow_nan=True)
    if text_value is not None:  # a literal JSON cannot produce from a Python value
        raw = raw.replace('"@@"', text_value)
    return raw.encode()


@pytest.mark.parametrize("path", _PATHS + [("extra",), ("clock_sync", "extra")])
def test_typed_summary_decoder_accepts_and_rejects_exactly_like_the_strict_reader(path) -> None:
    literals = ["1e400", "-1e400", "12345678901234567890", "123456789012345678901234567890.5", "1.0", "-0",
                "-98765432109876543210", "0.00012345678901234567", "1e-12345678901234567890",
                "12345678901234567890e3", "9223372036854775807", "9223372036854775808",
                '"\\ud800"', '"caf\\u00e9"', "[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]", "1E3"]
    for value in [*_ODD, "<missing>", "n" * 257]:
        raw = _raw_with(path, value)
        assert _outcome(wire.decode_summary, raw) == _outcome(_strict_decode, raw), (path, value)
    for lit in literals:
        raw = _raw_with(path, "@@", text_value=lit)
        assert _outcome(wire.decode_summary, raw) == _outcome(_strict_decode, raw), (path, lit)


def test_typed_summary_decoder_is_taken_for_what_agents_send() -> None:
    raw = json.dumps(_good_summary_dict()).encode()
    fast = fastsummary.typed_summary(raw)
    assert fast is not None and repr(fast) == repr(_strict_decode(raw))
    # a float whose repr has a long run of digits after the point is no long integer
    d = _good_summary_dict()
    d["interval"] = 0.00012345678901234567
    tiny = json.dumps(d).encode()
    assert b"00012345678901234567" in tiny and fastsummary.typed_summary(tiny) is not None
    # a repeated key: the last one counts on both paths (json.loads' rule)
    dup = raw[:-1] + b',"t":1700000099}'
    assert _outcome(wire.decode_summary, dup) == _outcome(_strict_decode, dup)
    assert wire.decode_summary(dup).t == 1700000099.0


@given(st.sampled_from(_PATHS + [("extra",)]), _json_values)
def test_typed_summary_decoder_matches_the_strict_reader_on_any_json(path, value) -> None:
    raw = _raw_with(path, value)
    assert _outcome(wire.decode_summary, raw) == _outcome(_strict_decode, raw)


def test_summary_view_reads_as_the_decoded_summary() -> None:
    """The controller's hot path reads the msgspec object: every attribute it reads equals the
    decoded Summary's, and a payload the typed decoder leaves to the strict reader comes back
    as that reader's Summary (or error)."""
    raw = json.dumps(_good_summary_dict()).encode()
    v, s = wire.summary_view(raw), wire.decode_summary(raw)
    assert type(v) is not wire.Summary
    for attr in ("node", "cluster", "t", "interval", "signals", "labels", "agent_version", "schema"):
        assert getattr(v, attr) == getattr(s, attr), attr
    assert (v.clock_sync.synced, v.clock_sync.max_error_s) == (s.clock_sync.synced, s.clock_sync.max_error_s)
    odd = raw[:-1] + b',"future_field":1}'
    assert type(wire.summary_view(odd)) is wire.Summary
    with pytest.raises(wire.WireError):
        wire.summary_view(raw.replace(b'"schema": 1', b'"schema": 2'))


def test_a_grouped_nodes_summary_carries_its_placement_in_the_subject() -> None:
    """Members of a TP group or pipeline share the placement token the server's partition
    mapping hashes; a pipeline wins over the TP group (a pipeline's stages must stay together)."""
    assert wire.subject_for(_summary(labels={"tp_group": "tp0", "tp_rank": "3"})) == "skewd.v1.summary.prod-a.gpu-node-07.tp0"
    assert wire.subject_for(_summary(labels={"tp_group": "tp0", "pp_group": "pp.1"})) == \
        "skewd.v1.summary.prod-a.gpu-node-07.pp%2E1"
    assert wire.subject_for(_summary()) == "skewd.v1.summary.prod-a.gpu-node-07"
    p = wire.parse_subject("skewd.v1.psummary.prod-a.5.gpu-node-07.pp%2E1")
    assert p.kind is wire.MessageKind.SUMMARY and p.tokens == {
        "cluster": "prod-a", "partition": "5", "node": "gpu-node-07", "placement": "pp.1"}
    assert wire.partition_of("pp.1", 8) == wire.partition_of("pp.1", 8) < 8


def test_a_findings_maturity_survives_the_wire_and_a_bad_one_is_refused() -> None:
    """The controller decides what a finding may do from its maturity tag (docs/rules.md): the
    decoder must carry it, and refuse a tag no rule can have."""
    import json as _json

    from skewd import wire as W
    from skewd.model import Finding, Layer, Scope, Severity, State

    f = Finding(rule_id="r", pathology="NS-7", severity=Severity.WARNING, layer=Layer.NETWORK, scope=Scope.NODE,
                node="n1", entity="", state=State.FIRING, active_at=1e9, evaluated_at=1e9 + 1, fired_at=1e9 + 1,
                cluster="c", maturity="sandbox")
    assert W.decode(W.encode(f)).maturity == "sandbox"
    d = _json.loads(W.encode(f))
    d["maturity"] = "trusted"
    import pytest as _pytest

    with _pytest.raises(W.WireError, match="maturity"):
        W.decode(_json.dumps(d))
