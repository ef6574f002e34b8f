"""A simulated run written as a capture bundle replays through ``skewd replay``'s engine to the
node findings the live pipelines raised."""
from __future__ import annotations

import json

from skewd.agent import bundle as B
from skewd.agent.replay import ClusterReplay, Replayer, open_segments, replay_catalogue
from skewd.catalogue import full_catalogue
from skewd.lab.sim import simulate
from skewd.lab.bundle import write_bundle
from skewd.lab.harness import Harness
from skewd.model import NODE_SCOPES
from skewd.rules.cli import PACKS
from skewd.rules.loader import load_rules

from .helpers import scenario

BODY = """\
name: bun
shape: dp
duration: 3m
faults:
  - pathology: NS-7
    onset: 70s
    duration: 90s
    severity: 0.9
"""


def test_bundle_replays_to_the_same_node_findings_and_incidents(tmp_path):
    sc = scenario(tmp_path, BODY)
    seg = write_bundle(simulate(sc, 3), tmp_path / "bundle")
    s = B.Segment(seg)
    assert s.verify() == []
    meta = json.loads((seg / "meta.json").read_text())
    assert meta["fault_lab"]["truth"][0]["pathology"] == "NS-7" and meta["cluster"] == "bun"
    assert len(s.summaries()) == 4 * 180

    segs, damage = open_segments([tmp_path / "bundle"])
    assert not damage
    rep = Replayer(segs, replay_catalogue(segs))
    replayed = {(f.rule_id, f.node, f.entity, f.state.value, round(f.evaluated_at, 3))
                for f in rep.run().findings}

    cat = full_catalogue()
    rs = load_rules([PACKS], cat).ruleset
    h = Harness(simulate(sc, 3), rs, cat, eval_interval=1, summary_interval=1, filter_signals=False)
    for p in h.pipes.values():  # replay evaluates every node rule; the agent the ones it can feed
        p.engine.set_available_signals(None)
        p.engine.scopes = set(NODE_SCOPES)
    run = h.run()
    live = {(f.rule_id, f.node, f.entity, f.state.value, round(f.evaluated_at, 3)) for f in run.findings
            if f.scope in NODE_SCOPES}
    assert replayed == live
    # the controller the harness runs and the one cluster replay runs are one: same incidents
    rep = ClusterReplay(Replayer(segs, replay_catalogue(segs))).run()
    shown = list(dict.fromkeys(i.id for i in rep.incidents if i.state == "open"))
    assert shown and shown == [o["id"] for o in run.opened]
    assert any(r[0].startswith("NS-7") and r[1] == meta["fault_lab"]["truth"][0]["nodes"][0] for r in live)
