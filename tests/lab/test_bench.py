"""The detection benchmark's scoring, and one simulated fault found end to end by the shipped
rules through the agent pipelines and the controller's group evaluation."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from skewd.catalogue import full_catalogue
from skewd.lab.sim import simulate
from skewd.lab.harness import Harness
from skewd.rules.cli import PACKS
from skewd.rules.loader import load_rules

from .helpers import scenario

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("skewd_bench_detection", ROOT / "bench" / "detection.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _finding(pid, node, at, entity="", scope="node", rule=None):
    return {"rule": rule or f"{pid}-r", "pathology": pid, "node": node, "entity": entity, "scope": scope,
            "active_at": at, "fired_at": at + 30}


def _truth(pid, nodes, onset, end, entity=""):
    return {"pathology": pid, "nodes": nodes, "entity": entity, "onset": onset, "end": end, "severity": 0.5,
            "variant": "v", "params": {}, "detectable": ""}


def _incident(pid, nodes, at):
    return {"id": f"{pid}-{at}", "pathology": pid, "rule": f"{pid}-r", "nodes": nodes, "entity": "",
            "opened_at": at, "findings": 1}


def test_scoring():
    D = _bench()
    R = D.RunResult
    fault = R("s1", "EW-1", "tp", 1, 4, 600.0, 0.0, [_truth("EW-1", ["node2"], 100.0, 300.0)],
              [_finding("EW-1", "node0", 90.0),  # before onset: false
               _finding("EW-1", "node3", 150.0),  # right time, wrong node: first detection, mislocalised
               _finding("EW-1", "node2", 160.0),  # the detection
               _finding("GPU-8", "node2", 170.0, "engine0", "engine")],  # another ID: false for GPU-8
              [{"t": 200.0, "nodes": ["node2"], "actions": [], "summary": ""}], 1.0, 10)
    miss = R("s2", "GPU-5", "dp", 1, 4, 600.0, 0.0, [_truth("GPU-5", ["node1"], 100.0, 300.0, "gpu3")],
             [_finding("GPU-5", "node1", 120.0, "gpu2", "gpu")], [], 1.0, 10)  # wrong GPU
    fault.incidents = [_incident("EW-1", ["node3"], 150.0),  # the wrong culprit: false
                       _incident("EW-1", ["node2"], 160.0),  # shows the fault
                       _incident("GPU-8", ["node2"], 170.0)]  # not inhibited: a false incident of GPU-8
    healthy = R("h", "healthy", "dp", 1, 4, 900.0, 0.0, [], [_finding("NS-6", "node0", 50.0, "tcp x", "flow")],
                [], 1.0, 10, incidents=[_incident("NS-6", ["node0"], 50.0)])
    sc, extra = D.score([fault, miss, healthy], ["EW-1", "GPU-5", "GPU-8", "NS-6"])
    ew1 = sc["EW-1"]
    assert (ew1.faults, ew1.detected, ew1.localised, ew1.tp, ew1.fp) == (1, 1, 0, 1, 2)
    assert ew1.latencies == [80.0] and ew1.sugg_latencies == [100.0]
    g5 = sc["GPU-5"]
    assert (g5.detected, g5.localised, g5.tp, g5.fp) == (1, 0, 0, 1)
    assert sc["GPU-8"].fp == 1 and sc["NS-6"].fp_healthy == 1
    assert extra["healthy_node_hours"] == 1.0
    text = D.render(sc, extra, [fault, miss, healthy], {"command": "x", "rules_commit": "c", "rules": 1, "seeds": "1",
                                                        "eval_interval": 5.0, "bursts": "every", "clock_report": "sim", "wall": 1.0,
                                                        "jobs": 1, "machine": "m"})
    assert (ew1.inc_tp, ew1.inc_fp) == (1, 1) and (sc["GPU-8"].inc_tp, sc["GPU-8"].inc_fp) == (0, 1)
    assert sc["NS-6"].inc_fp_healthy == 1
    assert "| EW-1 | TP straggler | 1.00 (1/1) | 0.50 (1/2) | 0.33 (1/3) | 0.00 (0/1) | 80s | 100s |" in text
    assert "1 false finding(s) in 1.00 node-hours = 24.0 per node-day (target: at most 1); 1 incident(s) published" in text
    assert "| GPU-8 | 1 | s1 (1) |" in text
    # each target says whether it is met: recall 2/2, incidents 1/4, findings 1/6, localisation 0/2, healthy 24
    assert "| recall | >= 0.95 | 1.00 (2/2) | yes |" in text
    assert "| precision (incidents: what a subscriber is shown) | >= 0.95 | 0.25 (1/4) | **no** |" in text
    assert "symptoms included) | >= 0.95 | 0.16 (1/6) | **no** |" in text
    assert "| localisation | >= 0.95 | 0.00 (0/2) | **no** |" in text
    assert "| false findings per node-day, healthy runs | <= 1 | 24.0 | **no** |" in text


def test_ratios_are_rounded_down_so_a_missed_target_never_reads_as_met():
    b = _bench()
    assert b._ratio(35, 37) == "0.94 (35/37)"  # 0.946: under a 0.95 target, and it says so
    assert b._ratio(19, 20) == "0.95 (19/20)"
    # a target is judged on the unrounded ratio: 0.9459 is not 0.95
    tot = b.IdScore("all", faults=37, detected=35, localised=35, tp=1, fp=0, inc_tp=1)
    rows = b._targets(tot, 1.0)
    assert "| recall | >= 0.95 | 0.94 (35/37) | **no** |" in rows
    assert "| localisation | >= 0.95 | 1.00 (35/35) | yes |" in rows
    assert b._ratio(2, 3) == "0.66 (2/3)"
    assert b._ratio(0, 0) == "-"


def test_a_simulated_engine_stall_is_found_on_its_engine(tmp_path):
    cat = full_catalogue()
    res = load_rules([PACKS], cat)
    assert res.ok, res.issues
    sc = scenario(tmp_path, """\
name: stall
shape: dp
duration: 4m
faults:
  - pathology: GPU-3
    variant: scheduler_deadlock
    onset: 70s
    duration: 150s
""")
    sim = simulate(sc, 1)
    r = Harness(sim, res.ruleset, cat, eval_interval=5, summary_interval=5, group_interval=5).run()
    t = sim.truth[0]
    hits = [f for f in r.findings if f.pathology == "GPU-3" and f.state.value == "firing"]
    assert hits, [(f.rule_id, f.node) for f in r.findings if f.state.value == "firing"]
    assert {(f.node, f.entity) for f in hits} == {(t.nodes[0], t.entity)}
    assert all(t.onset <= f.active_at <= t.end for f in hits)
    assert r.node_evaluations == 4 * (240 // 5)
    # what the controller showed: the stall as an incident on its node, opened during the fault
    stalls = [i for i in r.opened if i["pathology"] == "GPU-3"]
    assert stalls and stalls[0]["nodes"] == list(t.nodes) and t.onset <= stalls[0]["opened_at"] <= t.end + 120
    # shown when the controller published it: held correlation.group_wait (30 s) after it opened
    assert stalls[0]["published_at"] >= stalls[0]["opened_at"] + 30.0
    # every incident counted was published; none was counted twice
    assert len({i["id"] for i in r.opened}) == len(r.opened)


def test_a_table_on_tuning_seeds_is_refused_and_the_default_seeds_were_never_tuned_on(tmp_path):
    """Honest evaluation: the table is written from seeds no rule tuning looked at."""
    det = _bench()
    ledger = det.seed_ledger()
    assert set(ledger["tuning"]).isdisjoint(ledger["evaluation"])
    a = det.parse_args([])
    assert a.seed_base == min(ledger["evaluation"]) and not det.tuned_seeds_used(range(a.seed_base, a.seed_base + 3))
    out = tmp_path / "d.md"
    rc = det.main(["--scenario", "healthy-dp", "--seeds", "1", "--healthy-seeds", "1", "--seed-base",
                   str(ledger["tuning"][0]), "--out", str(out)])
    assert rc == 2 and not out.exists()
    assert det.main(["--tuning", "--scenario", "healthy-dp", "--out", str(out)]) == 2 and not out.exists()


def test_tuning_runs_draw_only_from_the_tuning_seeds_and_never_walk_into_unlisted_ones():
    """`--tuning --seeds N` once ran 1..N: past the first block of tuning seeds into seeds nobody
    listed (and towards the evaluation ones). It now takes the listed tuning seeds, from
    --seed-base on, and refuses to ask for more than exist."""
    det = _bench()
    tuning = sorted(det.seed_ledger()["tuning"])
    a = det.parse_args(["--tuning", "--seeds", str(len(tuning))])
    assert a.seed_list == tuning and not set(a.seed_list) - set(tuning)
    later = [s for s in tuning if s >= tuning[-3]]
    assert det.parse_args(["--tuning", "--seed-base", str(tuning[-3]), "--seeds", "3"]).seed_list == later
    with pytest.raises(SystemExit):
        det.parse_args(["--tuning", "--seeds", str(len(tuning) + 1)])
    assert det.seed_span([107, 108, 109]) == "107..109" and det.seed_span([5, 6, 101]) == "5, 6, 101"

def test_the_honest_section_counts_the_sources_and_lists_only_simulator_bound_params():
    """Every parameter the detection page says still sits on a simulator constant is [sim]-only in
    the shipped packs (one that found a real source must leave the list), and the page counts the
    measured packs' sources from their tags."""
    from skewd.rules.provenance import pack_sources

    D = _bench()
    sources, problems = pack_sources()
    assert not problems
    sim_only = {(s.rule, s.param) for s in sources if s.simulator_only}
    listed = {(rule, p) for rule, params, _, _ in D.SIM_BOUND for p in params}
    assert listed and not listed - sim_only, f"no longer [sim]-only, drop from SIM_BOUND: {sorted(listed - sim_only)}"
    prov = D.provenance([str(PACKS)])
    assert prov["params"] == len(sources) and prov["sim_only"] == len(sim_only)
    assert prov["tags"]["sim"] >= prov["sim_only"] > 0
    text = "\n".join(D.honest_section({"tuning_seeds": [1, 2], "provenance": prov}))
    assert "## Honest evaluation" in text and f"**{prov['sim_only']}** rest on the simulator alone" in text
    assert "rules were tuned on seeds 1, 2" in text
    for rule, params, _, _ in D.SIM_BOUND:
        assert f"| `{rule}` | " in text
