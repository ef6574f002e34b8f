"""Controller wire messages: exact round trips and strict decoding that names the bad field."""
from __future__ import annotations

import json

import pytest

from skewd.controller import messages as M
from skewd.wire import SchemaVersionError, WireError


def _suggestion() -> M.RemapSuggestion:
    tgt = M.Target(node="n2", entity="0000:3b:00.0", tp_group="tp0", model="m1", engine="n0/engine0")
    acts = [M.RemapAction(key="k1", type=M.ActionType.HOST_TUNING, target=tgt, rationale="why", evidence=("f1", "f2"),
                          confidence=0.85, expected_effect="better", ttl_s=600.0, command="tuned-adm profile network-latency"),
            M.RemapAction(key="k2", type=M.ActionType.REROUTE, target=tgt, rationale="why", evidence=("f1",),
                          confidence=0.7, expected_effect="less", ttl_s=600.0, params={"weight": 0.5})]
    return M.RemapSuggestion(
        key="s1", cluster="c", incident="i1", pathology="EW-1", created_at=10.0, expires_at=610.0, ttl_s=600.0,
        culprit=tgt, cause=M.Cause("pcie", "thin feed", 0.85, {"x": 1.0, "y": None}, ("f2",)),
        phase=M.PhaseContext("n0/engine0", "decode_heavy", 0.62, 5.0, 8.0, 9.0, "plugin"),
        effect=M.Effect(0.4, 0.1, 0.035, 0.02, 1.0, "TTFT up"), actions=acts, evidence=["f1", "f2"],
        confidence=0.85, summary="s", controller="ctl-a")


def test_suggestion_round_trip_is_exact() -> None:
    s = _suggestion()
    data = M.encode(s)
    back = M.decode(data)
    assert isinstance(back, M.RemapSuggestion)
    assert M.encode(back) == data
    assert back.actions[0].disruption == 0 and back.actions[1].disruption == 1
    assert M.headers(s, s.key)["Nats-Msg-Id"] == "s1"


def test_incident_reply_receipt_and_phase_round_trip() -> None:
    s = _suggestion()
    inc = M.Incident(id="i1", cluster="c", pathology="EW-1", rule_id="r", state="open", group={"tp_group": "tp0"},
                     culprit=s.culprit, cause=s.cause, victims=["n0"], findings=["f1"], inhibited=["f9"],
                     phase=s.phase, effect=s.effect, summary="x", opened_at=1.0, updated_at=2.0)
    rep = M.RemapReply(key="s1", decision=M.Decision.REJECT, consumer="router", reason="no", t=3.0, actions=["k2"])
    rec = M.RemapReceipt(key="s1", status=M.ReceiptStatus.RECORDED, decision="reject", recorded_at=4.0)
    ph = M.PhaseRecord(node="n", cluster="c", engine="engine0", model="m", t_start=1.0, t=2.0, phase=M.Phase.PREFILL,
                       steps=[M.StepStat(1.5, 3, 2, 512, 0, 0, 0.04, 2, 7, 0.3)],
                       finished=[M.FinishedStat(1.9, 0.1, 0.2, 1.0, 512, 100, "stop")], ttft_s=[0.3],
                       itl_count=10, itl_sum_s=0.12, itl_max_s=0.02, dropped={"queue_full": 1})
    for msg in (inc, rep, rec, ph):
        data = M.encode(msg)
        assert M.encode(M.decode(data)) == data


def test_incident_digest_ignores_drifting_numbers_but_not_membership() -> None:
    s = _suggestion()
    base = dict(id="i1", cluster="c", pathology="EW-1", rule_id="r", state="open", group={}, culprit=s.culprit,
                cause=s.cause, victims=[], findings=["f1"], inhibited=[], phase=s.phase, effect=s.effect, summary="x",
                opened_at=1.0, updated_at=2.0)
    a = M.Incident(**base)
    b = M.Incident(**{**base, "effect": M.Effect(0.9), "updated_at": 3.0, "summary": "y"})
    c = M.Incident(**{**base, "inhibited": ["f7"]})
    assert a.digest() == b.digest() != c.digest()


@pytest.mark.parametrize("mutate,error", [
    (lambda d: d.pop("key"), "remap: missing field 'key'"),
    (lambda d: d["actions"][0].update(type="teleport"), "field 'type' is 'teleport', not one of"),
    (lambda d: d["actions"][0].update(confidence="high"), "field 'confidence' must be a finite number"),
    (lambda d: d["actions"][0]["params"].update(x=[1]), "must be a finite number or a string"),
    (lambda d: d.update(evidence="f1"), "field 'evidence' must be a list"),
    (lambda d: d.update(kind="incident"), "expected a remap message"),
])
def test_strict_decoding_names_the_field(mutate, error) -> None:
    d = json.loads(M.encode(_suggestion()))
    mutate(d)
    with pytest.raises(WireError) as ei:
        M.decode(json.dumps(d), M.Kind.REMAP)
    assert error in str(ei.value)


def test_other_schema_versions_are_refused() -> None:
    d = json.loads(M.encode(_suggestion()))
    d["schema"] = 2
    with pytest.raises(SchemaVersionError):
        M.decode(json.dumps(d))
    with pytest.raises(WireError):
        M.decode(b"not json")
    with pytest.raises(WireError, match="consumer"):
        M.decode(json.dumps({"schema": 1, "kind": "remap_reply", "key": "k", "decision": "ack", "consumer": ""}))


def test_subjects_and_phase_classification() -> None:
    assert M.reply_subject("prod.eu") == "skewd.v1.remap_reply.prod%2Eeu"
    assert M.incident_subject("c") == "skewd.v1.incident.c"
    assert not M.INCIDENTS_STREAM.subjects[0].startswith("skewd.v1.remap.")
    def step(ctx_reqs: int, ctx: int, gen_reqs: int, gen: int, elapsed: float | None = 0.03) -> M.StepStat:
        return M.StepStat(t=0.0, index=0, ctx_reqs=ctx_reqs, ctx_tokens=ctx, gen_reqs=gen_reqs, gen_tokens=gen,
                          elapsed_s=elapsed, running=ctx_reqs + gen_reqs, waiting=0, kv_usage_ratio=0.5)

    assert M.classify_steps([]) is M.Phase.IDLE and M.classify_steps([step(0, 0, 0, 0)]) is M.Phase.IDLE
    assert M.classify_steps([step(4, 2048, 0, 0, 0.04)]) is M.Phase.PREFILL
    assert M.classify_steps([step(0, 0, 16, 16)]) is M.Phase.DECODE
    # chat-like: a 2048-token prompt chunk beside 31 decoding requests, then pure decode steps - the
    # token mix is mostly prompt (2048 vs 31 + 5 x 32) but the requests spend their time decoding
    chat = [step(1, 2048, 31, 31, 0.05)] + [step(0, 0, 32, 32) for _ in range(5)]
    assert M.classify_steps(chat) is M.Phase.DECODE
    # summarising: most running requests are still in (chunked) prefill
    assert M.classify_steps([step(6, 4096, 2, 2, 0.2), step(6, 4096, 2, 2, None)]) is M.Phase.PREFILL
    assert [p.code for p in M.Phase] == [0, 1, 2] and M.Phase.from_code(2.0) is M.Phase.PREFILL
