"""Cluster replay against a live run: three real agents (``agent.runner.Agent``, recording with
``record.dir``) scrape real vLLM ``/metrics`` pages over HTTP, publish to a real nats-server, and
the controller service correlates; one node's engine saturates while its TP peers starve. The
agents' bundles then replay - agents and controller on the recorded time - to the incidents and
suggestions the live controller published, byte-identical across two replays.

The pages are the genuine vLLM 0.33 fixtures (tests/fixtures/vllm/v0.33: ``busy`` KV 0.72 with
64 running, ``saturated`` KV 0.99 with 40 waiting, ``idle`` nothing running); which node serves
which page when is the test's script. The rules below are test rules (thresholds chosen for the
script, not tuned values): the saturated engine (GPU-2, node scope), the TP group's KV skew
naming the culprit (EW-3, the controller's tp_group scope), and the starved peers' engines
(GPU-8, node scope) - symptoms the culprit's incident must inhibit.
"""
from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import time
from pathlib import Path

import pytest

from skewd.agent import replay as R
from skewd.agent.config import load_config
from skewd.agent.runner import Agent
from skewd.agent.scheduler import build_slots, collector_config_keys
from skewd.controller.config import load_config as controller_config
from skewd.controller.service import Controller

from ..controller.helpers import incidents, remaps

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "fixtures" / "vllm" / "v0.33"
CLUSTER = "live"
NODES = ("n0", "n1", "n2")
CULPRIT = "n1"

RULES = """\
required_engine_version: 1
rules:
  - id: KV-SATURATED-TEST
    pathology: GPU-2
    scope: engine
    layer: engine
    severity: warning
    tags: [stable]
    expr: last(vllm_kv_cache_usage_ratio, 5s) > 0.95
    for: 2s
    summary: "KV cache of {node}/{entity} saturated"
  - id: KV-SKEW-TEST
    pathology: EW-3
    scope: tp_group
    layer: engine
    severity: warning
    tags: [stable]
    params: {kv: 0.95, share: 0.5}
    expr: summary_kv_cache_usage_ratio > kv and peer_mean(summary_kv_cache_usage_ratio < 0.5) >= share
    for: 2s
    summary: "{node} holds far more KV than its TP peers"
  - id: ENGINE-STARVED-TEST
    pathology: GPU-8
    scope: engine
    layer: engine
    severity: info
    tags: [stable]
    expr: last(vllm_requests_running, 5s) < 1
    for: 3s
    summary: "{node}/{entity} runs nothing"
"""


def _page_server():
    spec = importlib.util.spec_from_file_location("vllm_pageserver", ROOT / "collectors" / "test_vllm_pageserver.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.PageServer


def _controller_yaml(path: Path, url: str, rules: Path) -> Path:
    correlation: dict = {"group_wait": "4s"}
    from skewd.controller.config import ControllerConfig

    if "culprit_evidence" in ControllerConfig.__dataclass_fields__:
        # a controller with the culprit-evidence contract (controller/culprit.py) names a culprit
        # only from the measurement its rule says singles it out: the culprit's KV usage over the bar
        correlation["culprit_evidence"] = {"KV-SKEW-TEST": {"measure": "summary_kv_cache_usage_ratio", "above": "kv"}}
    path.write_text(json.dumps({
        "cluster": CLUSTER, "controller_id": "live", "nats": {"url": url}, "rules": [str(rules)],
        "evaluation_interval": "1s", "warmup": "3s", "correlation": correlation,
    }))
    return path


def _agent(node: str, rank: int, url: str, page_url: str, rules: Path, tmp: Path) -> Agent:
    cfg = load_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": node, "cluster": CLUSTER, "rules": [str(rules)],
        "evaluation_interval": "1s", "summary_interval": "1s",
        "labels": {"tp_group": "tp0", "tp_rank": str(rank), "model": "m1"},
        "nats": {"url": url}, "spool": {"dir": str(tmp / f"spool-{node}")},
        "record": {"dir": str(tmp / "capture")},
        "metrics": {"listen": "127.0.0.1:0"},
        "collectors": {"vllm": {"endpoints": [page_url], "interval": "500ms"}},
    })
    return Agent(cfg, slots=build_slots(cfg, ["vllm"]))


def _incident_view(incs) -> dict:
    """Per incident id, the story a subscriber was told: pathology, rule, group, culprit and cause
    layer; every member finding and inhibited symptom it ever listed; how it ended; and when it
    was first published. (The order of the last updates as an incident closes - a symptom's
    resolution reaching the controller just before or after its cause's - rides JetStream's
    delivery, so the story is compared, not the count of updates.)"""
    out: dict = {}
    for i in incs:
        v = out.setdefault(i.id, {"first_published": i.updated_at, "findings": set(), "inhibited": set()})
        v.update({"pathology": i.pathology, "rule": i.rule_id, "group": i.group, "opened_at": i.opened_at,
                  "culprit": (i.culprit.node, i.culprit.entity) if i.culprit else None,
                  "cause": i.cause.layer if i.cause else None, "victims": i.victims, "state": i.state})
        v["findings"] |= set(i.findings)
        v["inhibited"] |= set(i.inhibited)
    return out


def _suggestion_view(sugs) -> dict:
    return {s.key: {"incident": s.incident, "pathology": s.pathology,
                    "culprit": (s.culprit.node, s.culprit.entity) if s.culprit else None,
                    "cause": s.cause.layer if s.cause else None,
                    "actions": [(a.type.value, a.target.node, a.key) for a in s.actions], "created_at": s.created_at}
            for s in sugs}


async def _live_run(tmp: Path, url: str, rules: Path, ctl_yaml: Path) -> tuple[list, list]:
    PageServer = _page_server()
    busy, saturated, idle = ((PAGES / f"{n}.prom").read_text() for n in ("busy", "saturated", "idle"))
    servers = {n: PageServer() for n in NODES}
    for s in servers.values():
        s.body = busy
    ctl = Controller(controller_config(str(ctl_yaml)))
    stop = asyncio.Event()
    agents = [_agent(n, i, url, servers[n].url, rules, tmp) for i, n in enumerate(NODES)]
    await asyncio.wait_for(ctl.start(), 30)
    tasks = [asyncio.create_task(a.run(stop)) for a in agents]
    try:
        for a in agents:
            await asyncio.wait_for(a.started.wait(), 20)
            assert [s.name for s in a.slots if s.active] == ["vllm"], [s.status for s in a.slots]
        await asyncio.sleep(8)  # healthy: every engine busy alike
        servers[CULPRIT].body = saturated  # the culprit's engine saturates...
        for n in NODES:
            if n != CULPRIT:
                servers[n].body = idle  # ... and its TP peers wait for it with nothing to run
        await asyncio.sleep(16)
        for s in servers.values():
            s.body = busy
        await asyncio.sleep(10)  # recovery: findings resolve, the incident closes
    finally:
        stop.set()
        await asyncio.gather(*[asyncio.wait_for(t, 20) for t in tasks], return_exceptions=True)
        await asyncio.sleep(1.5)  # the controller takes in the last findings and summaries
        await ctl.stop()
        for s in servers.values():
            s.close()
    return await incidents(url, CLUSTER), await remaps(url, CLUSTER)


def _replay(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = R.main([str(a) for a in args], out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def test_a_recorded_live_fault_replays_to_the_incidents_and_suggestions_the_controller_published(
        tmp_path: Path, nats_server) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    ctl_yaml = _controller_yaml(tmp_path / "controller.yaml", nats_server.url, rules)
    live_incs, live_sugs = asyncio.run(_live_run(tmp_path, nats_server.url, rules, ctl_yaml))

    # the live system told the story: EW-3 names the culprit, its peers' symptoms are inhibited
    live = _incident_view(live_incs)
    culprit = [v for v in live.values() if v["pathology"] == "EW-3"]
    assert len(culprit) == 1, live
    assert culprit[0]["culprit"][0] == CULPRIT and culprit[0]["cause"] == "engine"
    assert len(culprit[0]["inhibited"]) == 2 and sorted(culprit[0]["victims"]) == ["n0", "n2"]
    assert culprit[0]["state"] == "resolved"  # the recovery closed it
    assert live_sugs and {s.pathology for s in live_sugs} == {"EW-3"}

    # the recording: one bundle per node, a cluster bundle
    capture = tmp_path / "capture"
    assert sorted(p.name for p in capture.iterdir()) == list(NODES)
    runs = [_replay(capture, "--json", "--controller-config", ctl_yaml) for _ in range(2)]
    assert runs[0][0] == 0, runs[0][2]
    assert runs[0][1] == runs[1][1], "two replays of the same bundles differ"
    lines = [json.loads(x) for x in runs[0][1].splitlines()]
    from skewd.controller import messages as M

    rep_incs = [M.incident_from_dict(d) for d in lines if d.get("kind") == "incident"]
    rep_sugs = [M.suggestion_from_dict(d) for d in lines if d.get("kind") == "remap"]
    replayed = _incident_view(rep_incs)

    # the same incidents (ids derive from the recorded findings), telling the same story
    assert sorted(replayed) == sorted(live), (sorted(live.items()), sorted(replayed.items()))
    for iid, want in live.items():
        got = replayed[iid]
        for k in ("pathology", "rule", "group", "opened_at", "culprit", "cause", "victims", "findings", "inhibited",
                  "state"):
            assert got[k] == want[k], (iid, k, want[k], got[k])
        # live, a finding rides JetStream and may reach the controller an evaluation later than
        # the summary of its tick; replay hands it over first
        assert abs(got["first_published"] - want["first_published"]) <= 2.0, (want, got)
    # the same suggestions: same keys, incidents, culprits and actions (keys and targets)
    ls, rs = _suggestion_view(live_sugs), _suggestion_view(rep_sugs)
    assert sorted(ls) == sorted(rs)
    for key, want in ls.items():
        got = rs[key]
        assert {k: v for k, v in got.items() if k != "created_at"} == {k: v for k, v in want.items() if k != "created_at"}
        assert abs(got["created_at"] - want["created_at"]) <= 2.0

    # the agents' findings replay to what they raised live (the recorded findings.jsonl)
    from skewd.agent import bundle as B

    for node in NODES:
        recorded = [json.loads(x) for seg in B.segment_dirs(capture / node)
                    for x in (seg / B.FINDINGS).read_text().splitlines()]
        mine = [d for d in lines if "kind" not in d and d["node"] == node and d["scope"] not in ("tp_group", "cluster")]
        assert [(d["rule_id"], d["state"], d["evaluated_at"]) for d in mine] == \
            [(d["rule_id"], d["state"], d["evaluated_at"]) for d in recorded]
