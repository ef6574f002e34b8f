"""The controller against a real nats-server: four scripted agents in one TP group, one of them
late at every collective. The controller must name it, inhibit the peers' findings, publish
exactly one remap suggestion and record the acknowledgement; and a suggestion interrupted
between storing and publishing must be published exactly once after a restart."""
from __future__ import annotations

import asyncio
import json

import nats
import pytest

from skewd import wire
from skewd.controller import client
from skewd.controller import messages as M
from skewd.controller.planner import suggestion_key
from skewd.controller.service import Controller
from skewd.controller.state import StateStore

from skewd.model import Layer

from .helpers import config, incidents, play, remaps, stored
from .sim import ScriptedGroup, finding, publish_finding

pytestmark = pytest.mark.timeout(180)


async def _run_straggler(url: str, cluster: str, late_s: float) -> tuple[Controller, list[M.RemapSuggestion]]:
    ctl = Controller(config(url, cluster))
    await asyncio.wait_for(ctl.start(), 30)
    nc = await nats.connect(url)
    try:
        g = ScriptedGroup(cluster=cluster, late_s=late_s, late_from=8)
        await play(nc, g, 0, 45, victims_at=12)
        await asyncio.sleep(1.5)  # let the last ticks publish
        return ctl, await remaps(url, cluster)
    finally:
        await nc.close()


async def test_straggler_named_victims_inhibited_one_remap_acknowledged(nats_server) -> None:
    url = nats_server.url
    ctl, sugs = await _run_straggler(url, "strag", late_s=0.008)
    try:
        assert len(sugs) == 1, [s.summary for s in sugs]
        s = sugs[0]
        assert s.culprit is not None and s.culprit.node == "n2" and s.culprit.tp_group == "tp0"
        assert s.pathology == "EW-1"
        assert s.cause is not None and s.cause.layer == "pcie", s.cause
        # ordered least disruptive first, every action fully specified
        assert [a.disruption for a in s.actions] == sorted(a.disruption for a in s.actions)
        assert s.actions[0].type is M.ActionType.HOST_TUNING
        assert "numactl" in s.actions[0].command and "0000:3b:00.0" in s.actions[0].command
        types = [a.type for a in s.actions]
        assert M.ActionType.REROUTE in types and M.ActionType.MOVE_TP_RANK in types
        move = next(a for a in s.actions if a.type is M.ActionType.MOVE_TP_RANK)
        assert move.params["from_node"] == "n2" and move.params["rank"] == 2
        assert len({a.key for a in s.actions}) == len(s.actions)
        for a in s.actions:
            assert a.rationale and a.expected_effect and 0 < a.confidence <= 1 and a.ttl_s == 600.0
        assert s.expires_at - s.created_at == pytest.approx(600.0)
        assert s.key == suggestion_key("strag", s.incident)
        # evidence: the controller's EW-1 finding and the culprit's own PCIe finding
        fid = {f.rule_id: f.id for f in ctl.correlator.findings.values()}
        assert fid["EW-1-tp-straggler-test"] in s.evidence and fid["PCIE-1-test"] in s.evidence
        # phase correlation: the front end was decode-heavy and its users saw TTFT grow
        assert s.phase is not None and s.phase.phase == "decode_heavy" and s.phase.engine == "n0/engine0"
        assert s.effect is not None and s.effect.ttft_s > s.effect.ttft_baseline_s
        assert s.effect.queue_growth_per_s and s.effect.queue_growth_per_s > 0

        # victims: their GPU-8 findings are inhibited by the culprit incident; the culprit rule
        # fired within group_wait of them, so their own incidents were closed as inhibited while
        # still held: never published to subscribers (and they produced no suggestion)
        incs = await incidents(url, "strag")
        latest = {i.id: i for i in incs}
        culprit_inc = latest[s.incident]
        victim_ids = {f.id for f in ctl.correlator.findings.values() if f.rule_id == "GPU-8-test"}
        assert len(victim_ids) == 3 and set(culprit_inc.inhibited) == victim_ids
        assert culprit_inc.victims == ["n0", "n1", "n3"]
        assert [i for i in incs if i.group.get("node") in ("n0", "n1", "n3")] == []
        held = [i for i in ctl.correlator.incidents.values() if i.group.get("node") in ("n0", "n1", "n3")]
        assert len(held) == 3 and all(i.state == "inhibited" and i.inhibited_by == s.incident for i in held)
        assert ctl.stats.incidents_withheld >= 3
        # the culprit's incident was first shown open, once its own hold was over
        first = next(i for i in incs if i.id == s.incident)
        assert first.state == "open" and first.updated_at - first.opened_at >= 8.0
        assert "phase decode_heavy" in culprit_inc.summary and "TTFT" in culprit_inc.summary

        # the controller's own finding is on the findings stream, stating phase and effect
        msgs = await stored(url, wire.FINDINGS_STREAM.name, wire.finding_subject("strag", "n2", "EW-1-tp-straggler-test"))
        ew1 = [wire.decode_finding(m.data) for m in msgs]
        assert ew1 and ew1[0].labels == {"tp_group": "tp0"} and ew1[0].scope.value == "tp_group"
        fired = [f for f in ew1 if f.state.value == "firing"]
        assert len(fired) == 1 and "phase: decode_heavy" in fired[0].summary and "TTFT" in fired[0].summary
        assert fired[0].evidence["ttft_seconds"] > fired[0].evidence["ttft_baseline_seconds"]
        assert fired[0].evidence["phase_code"] == 1.0

        # acknowledgement by request/reply, recorded in the controller's KV state
        nc = await nats.connect(url)
        try:
            r = await client.ack(nc, s, consumer="router-1", reason="weights changed")
            assert r.status is M.ReceiptStatus.RECORDED and r.ok
            again = await client.ack(nc, s, consumer="router-1", reason="weights changed")
            assert again.status is M.ReceiptStatus.DUPLICATE
            rec = await client.suggestion_record(nc, "strag", s.key)
            assert rec["status"] == "acked"
            assert [(x["consumer"], x["decision"], x["reason"]) for x in rec["replies"]] == [
                ("router-1", "ack", "weights changed")]
            unknown = await client.reject(nc, "nope", consumer="router-1", cluster="strag")
            assert unknown.status is M.ReceiptStatus.UNKNOWN and not unknown.ok
            bad = await nc.request(M.reply_subject("strag"), b'{"schema":1,"kind":"remap_reply"}', timeout=5)
            assert M.decode(bad.data).status is M.ReceiptStatus.INVALID
        finally:
            await nc.close()
    finally:
        await ctl.stop()


async def test_without_a_straggler_each_victim_gets_its_own_suggestion(nats_server) -> None:
    """Control for the test above: with every node on time no culprit exists, nothing inhibits
    the GPU-8 findings, and each node's incident is planned on its own (concurrency cap)."""
    url = nats_server.url
    ctl, sugs = await _run_straggler(url, "nostrag", late_s=0.0)
    try:
        assert not [f for f in ctl.correlator.findings.values() if f.pathology == "EW-1"]
        by_node = sorted(s.culprit.node for s in sugs if s.pathology == "GPU-8")
        assert by_node == ["n0", "n1", "n3"], [s.summary for s in sugs]
        for s in sugs:
            if s.pathology == "GPU-8":
                assert s.actions[0].type is M.ActionType.CAP_CONCURRENCY
                assert s.actions[0].params["max_num_seqs"] == 192  # 256 x concurrency_factor 0.75
    finally:
        await ctl.stop()


def _suggestion(cluster: str, incident: str) -> M.RemapSuggestion:
    key = suggestion_key(cluster, incident)
    act = M.RemapAction(key="a1", type=M.ActionType.REROUTE, target=M.Target(node="n9"), rationale="test",
                        evidence=("f1",), confidence=0.7, expected_effect="less load", ttl_s=600.0,
                        params={"weight": 0.5})
    return M.RemapSuggestion(key=key, cluster=cluster, incident=incident, pathology="GPU-2", created_at=1.0,
                             expires_at=1e12, ttl_s=600.0, culprit=M.Target(node="n9"), cause=None, phase=None,
                             effect=None, actions=[act], evidence=["f1"], confidence=0.7, summary="crash window test")


async def _leave_planned(url: str, cluster: str, s: M.RemapSuggestion, *, also_publish: bool) -> None:
    """What a controller killed between storing and publishing (or between publishing and
    recording it) leaves behind."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        from skewd.natsutil import ensure_streams

        await ensure_streams(js, [wire.REMAPS_STREAM])
        st = await StateStore.open(js, "SKEWD_CONTROLLER", cluster, 3600.0)
        rec = {"suggestion": s.to_dict(), "status": "planned", "semantic": "x", "planned_wall": 0.0,
               "controller": "crashed", "replies": []}
        assert await st.create_remap(s.key, rec)
        if also_publish:
            await js.publish(wire.remap_subject(cluster), json.dumps(s.to_dict()).encode(),
                             headers={wire.HDR_MSG_ID: s.key})
    finally:
        await nc.close()


@pytest.mark.parametrize("published_before_crash", [False, True])
async def test_crash_between_store_and_publish_is_repaired_exactly_once(nats_server, published_before_crash) -> None:
    url = nats_server.url
    cluster = f"crash{int(published_before_crash)}"
    s = _suggestion(cluster, "inc-1")
    await _leave_planned(url, cluster, s, also_publish=published_before_crash)
    for _ in range(2):  # start, stop, start again: the second start must not publish again
        ctl = Controller(config(url, cluster))
        await asyncio.wait_for(ctl.start(), 30)
        await ctl.stop()
    got = await remaps(url, cluster)
    assert [x.key for x in got] == [s.key]
    nc = await nats.connect(url)
    try:
        rec = await client.suggestion_record(nc, cluster, s.key)
        assert rec["status"] == "published" and rec["seq"] >= 1
    finally:
        await nc.close()


async def test_two_replicas_share_the_work_and_publish_once(nats_server) -> None:
    """Two controllers for one cluster (same durable consumer, same KV): findings are split
    between them, yet both correlate over all of them and the suggestion is published once."""
    url = nats_server.url
    cluster = "repl"
    a = Controller(config(url, cluster, controller_id="ctl-a"))
    b = Controller(config(url, cluster, controller_id="ctl-b"))
    await asyncio.wait_for(a.start(), 30)
    await asyncio.wait_for(b.start(), 30)
    nc = await nats.connect(url)
    try:
        await play(nc, ScriptedGroup(cluster=cluster, late_from=8), 0, 45, victims_at=12)
        await asyncio.sleep(1.5)
        sugs = await remaps(url, cluster)
        assert len(sugs) == 1 and sugs[0].culprit.node == "n2"
        taken = (a.stats.findings_in - a.stats.findings_duplicate, b.stats.findings_in - b.stats.findings_duplicate)
        for ctl in (a, b):  # each replica knows every agent finding, whichever replica took it in
            assert sum(1 for f in ctl.correlator.findings.values() if f.rule_id in ("GPU-8-test", "PCIE-1-test")) == 4
        assert a.stats.remaps_published + b.stats.remaps_published == 1
        assert sum(taken) >= 4  # the four agent findings were taken in (by one replica or the other)
    finally:
        await nc.close()
        await a.stop()
        await b.stop()


_EW9_RULES = """required_engine_version: 1
rules:
  - id: EW-9-missing-steps-test
    pathology: EW-9
    desc: A node sends no burst in most of its TP group's steps (test rule; its threshold is a test choice).
    scope: tp_group
    layer: network
    requires: [ctl_step_missing_ratio]
    params: {missing: 0.5}
    expr: ctl_step_missing_ratio > missing
    for: 3s
    tags: [MATURITY]
"""


@pytest.mark.parametrize("maturity", ["incubating", "stable"])
async def test_drops_on_the_faulty_node_stay_its_incident_under_a_missing_steps_claim_on_a_healthy_one(
        nats_server, tmp_path, maturity) -> None:
    """Issue 19's real-lab case through the service: qdisc drops on n3 (NS-7, an agent finding)
    while the controller's own EW-9 rule reads a healthy n1 as missing steps (its capture lists
    bursts in 30 % of them). Incubating, the claim names nobody (nothing else points at n1) and
    is listed as refused; even a stable claim that names n1 never takes n3's drops in as a
    victim's: the NS-7 incident is published on n3 and never inhibited."""
    url, cluster = nats_server.url, f"direct-{maturity}"
    rules = tmp_path / "ew9.yaml"
    rules.write_text(_EW9_RULES.replace("MATURITY", maturity))
    ctl = Controller(config(url, cluster, rules=[str(rules)], correlation={
        "group_wait": "4s", "effect_window": "10s",
        "culprit_evidence": {"EW-9-missing-steps-test": {"measure": "ctl_step_missing_ratio", "above": "missing"}}}))
    await asyncio.wait_for(ctl.start(), 30)
    nc = await nats.connect(url)
    try:
        g = ScriptedGroup(cluster=cluster, late_s=0.0, sparse_node="n1")
        js = nc.jetstream()
        for i in range(30):
            for n in g.nodes:
                await nc.publish(wire.summary_subject(cluster, n), g.summary(i, n))
            if i == 6:  # the drops start before the controller could say anything about steps
                await publish_finding(js, finding("n3", "NS-7-egress-drops", "NS-7", Layer.NETWORK, g.t0 + i,
                                                  cluster=cluster, entity="eth0"))
            await nc.flush()
            await asyncio.sleep(0.03)
        await asyncio.sleep(1.5)
        claims = [f for f in ctl.correlator.findings.values() if f.rule_id == "EW-9-missing-steps-test"
                  and f.state.value == "firing"]
        assert [f.node for f in claims] == ["n1"], ctl.status()
        assert claims[0].evidence["culprit_measure"] > 0.5 and claims[0].evidence["culprit_bar"] == 0.5
        shown = await incidents(url, cluster)
        ns7 = [i for i in shown if i.pathology == "NS-7"]
        assert ns7 and {i.culprit.node for i in ns7} == {"n3"}, [i.summary for i in shown]
        assert all(i.state == "open" for i in ns7), [(i.state, i.inhibited_by) for i in ns7]
        ew9 = [i for i in shown if i.pathology == "EW-9"]
        refused = ctl.status()["correlation"]["culprit_claims_refused"]
        if maturity == "incubating":
            assert not ew9 and [r["node"] for r in refused] == ["n1"]
            assert "nothing else points at n1" in refused[0]["reason"]
            assert not [s for s in await remaps(url, cluster) if s.culprit and s.culprit.node == "n1"]
        else:
            assert ew9 and {i.culprit.node for i in ew9} == {"n1"} and not refused
            assert all(f.id not in i.inhibited for i in ew9 for f in ctl.correlator.findings.values()
                       if f.pathology == "NS-7")
    finally:
        await nc.close()
        await ctl.stop()
