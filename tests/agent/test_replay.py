"""``skewd replay``: same findings as live, byte-identical output, damage, diffs, multi-node."""
from __future__ import annotations

import asyncio
import io
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from skewd.agent import bundle as B
from skewd.agent import replay as R
from skewd.model import Scope, State

from .test_record import T0, catalogue, run_live, write_rules


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = R.main([str(a) for a in args], out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    return write_rules(tmp_path / "rules.yaml")


@pytest.fixture
def live(tmp_path: Path, rules_file: Path):
    return run_live(tmp_path / "cap", [rules_file])


def test_replay_gives_the_findings_the_live_agent_raised(live) -> None:
    assert [f.state for f in live.findings] == [State.PENDING, State.FIRING, State.RESOLVED]
    rc, out, err = cli(live.bundle, "--json")
    assert rc == 0, err
    assert out.splitlines() == [R.finding_json(f) for f in live.findings]
    # and through the API, field for field
    segs, dmg = R.open_segments([live.bundle])
    res = R.Replayer(segs, catalogue()).run()
    assert [f.to_dict() for f in res.findings] == [f.to_dict() for f in live.findings]
    assert res.evaluations == 40 and res.damage == [] and res.nodes == ["n1"]


def test_replay_output_is_byte_identical_across_runs(live, tmp_path: Path) -> None:
    runs = [cli(live.bundle, "--json", "--report", tmp_path / f"r{i}.html") for i in range(2)]
    assert runs[0][0] == runs[1][0] == 0
    assert runs[0][1] == runs[1][1] and runs[0][1].count("\n") == 3
    assert (tmp_path / "r0.html").read_bytes() == (tmp_path / "r1.html").read_bytes()
    table = [cli(live.bundle)[1] for _ in range(2)]
    assert table[0] == table[1]
    lines = table[0].splitlines()
    assert lines[0].startswith("TIME (UTC)") and len(lines) == 4
    assert "firing" in lines[2] and "NS5-BACKLOG" in lines[2] and "egress backlog on n1/eth0" in lines[2]
    assert lines[2].startswith("2023-11-14T22:13:35.000Z")


def _tick_batches(bundle: Path) -> np.ndarray:
    seg = B.Segment(B.segment_dirs(bundle)[0])
    return seg.ticks()[1]


def _sample_chunk_for_tick(bundle: Path, tick: int) -> dict:
    seg_dir = B.segment_dirs(bundle)[0]
    nb = _tick_batches(bundle)
    entries = [json.loads(x) for x in (seg_dir / B.INDEX).read_text().splitlines()]
    samples = [e for e in entries if e["file"] == B.SAMPLES and "batches" in e]
    return next(e for e in samples if e["batches"][1] >= nb[tick])


def _expected_before(live, bundle: Path, first_lost_batch: int) -> list[str]:
    nb = _tick_batches(bundle)
    return [R.finding_json(f) for f in live.findings if nb[int(f.evaluated_at - T0)] <= first_lost_batch]


def test_truncated_bundle_replays_what_precedes_the_cut(live) -> None:
    chunk = _sample_chunk_for_tick(live.bundle, 20)
    p = B.segment_dirs(live.bundle)[0] / B.SAMPLES
    with open(p, "r+b") as f:
        f.truncate(chunk["offset"] + 7)
    rc, out, err = cli(live.bundle, "--json")
    assert rc == R.EXIT_DAMAGED
    assert f"{p}: byte offset {chunk['offset']}: truncated" in err
    assert "everything before the damage was replayed" in err
    expected = _expected_before(live, live.bundle, chunk["batches"][0])
    assert out.splitlines() == expected
    assert [json.loads(x)["state"] for x in expected] == ["pending", "firing"]  # the resolve came after the cut


def test_bit_flipped_bundle_names_file_and_offset(live) -> None:
    chunk = _sample_chunk_for_tick(live.bundle, 22)
    p = B.segment_dirs(live.bundle)[0] / B.SAMPLES
    data = bytearray(p.read_bytes())
    data[chunk["offset"] + chunk["length"] // 2] ^= 0x04
    p.write_bytes(bytes(data))
    rc, out, err = cli(live.bundle, "--json")
    assert rc == R.EXIT_DAMAGED
    assert f"{p}: byte offset {chunk['offset']}: CRC32 mismatch" in err
    assert out.splitlines() == _expected_before(live, live.bundle, chunk["batches"][0])
    assert len(out.splitlines()) == 2


def test_diff_shows_a_changed_thresholds_effect(live, tmp_path: Path) -> None:
    a = write_rules(tmp_path / "a.yaml", limit=100_000)
    lower = write_rules(tmp_path / "lower.yaml", limit=50_000)
    higher = write_rules(tmp_path / "higher.yaml", limit=400_000)
    rc, out, err = cli("--diff", a, lower, live.bundle)
    assert rc == R.EXIT_DIFF, err
    lines = out.splitlines()
    # the backlog passes 50 kB at tick 10 instead of 100 kB at tick 13: fires 3 s earlier
    assert lines[0].startswith("~ timing      NS5-BACKLOG n1/eth0  fired 2023-11-14T22:13:35.000Z → "
                               "2023-11-14T22:13:32.000Z (3.000s earlier)")
    assert lines[-1].endswith("0 appear, 0 disappear, 1 change timing (1 vs 1 fired occurrences)")
    rc, out, _ = cli("--diff", a, higher, live.bundle)
    assert rc == R.EXIT_DIFF
    assert out.splitlines()[0].startswith("- disappears  NS5-BACKLOG n1/eth0  fired 2023-11-14T22:13:35.000Z")
    rc, out, _ = cli("--diff", higher, a, live.bundle, "--json")
    (entry,) = [json.loads(x) for x in out.splitlines()]
    assert entry["change"] == "appears" and entry["a"] is None and entry["b"]["fired_at"] == T0 + 15
    rc, out, _ = cli("--diff", a, a, live.bundle)
    assert rc == 0 and out.splitlines()[-1].endswith("0 appear, 0 disappear, 0 change timing (1 vs 1 fired occurrences)")


def test_diff_at_incident_level_says_what_the_on_call_engineer_would_have_seen(live, tmp_path: Path) -> None:
    """With the controller's group_wait at 2 s the backlog's incident is published within the
    recording; a lower threshold opens it 3 s earlier, a higher one not at all."""
    ctl = tmp_path / "controller.yaml"
    ctl.write_text("correlation:\n  group_wait: 2s\n")
    a = write_rules(tmp_path / "a.yaml", limit=100_000)
    lower = write_rules(tmp_path / "lower.yaml", limit=50_000)
    higher = write_rules(tmp_path / "higher.yaml", limit=400_000)
    rc, out, err = cli("--diff", a, lower, live.bundle, "--controller-config", ctl)
    assert rc == R.EXIT_DIFF, err
    first = out.splitlines()[0]
    assert re.match(r"~ incident \w+ NS-5 on n1/eth0 \(opened 2023-11-14T22:13:35.000Z\): would have opened "
                    r"3.000s earlier \(2023-11-14T22:13:35.000Z → 2023-11-14T22:13:32.000Z\); been published "
                    r"3.000s earlier", first), first
    assert "incidents 0 new, 0 gone, 1 changed (1 vs 1 published)" in out.splitlines()[-1]
    rc, out, _ = cli("--diff", a, higher, live.bundle, "--controller-config", ctl)
    assert rc == R.EXIT_DIFF
    assert re.match(r"- incident \w+ NS-5 on n1/eth0 \(opened 2023-11-14T22:13:35.000Z\): would not have opened "
                    r"at all$", out.splitlines()[0]), out
    rc, out, _ = cli("--diff", higher, a, live.bundle, "--controller-config", ctl, "--json")
    inc = [json.loads(x) for x in out.splitlines() if json.loads(x)["level"] == "incident"]
    assert [(i["change"], i["a"], i["b"]["culprit"]) for i in inc] == [("new", None, {"node": "n1", "entity": "eth0"})]
    rc, out, _ = cli("--diff", a, a, live.bundle, "--controller-config", ctl)
    assert rc == 0 and "incidents 0 new, 0 gone, 0 changed (1 vs 1 published)" in out


def test_cluster_replay_is_byte_identical_across_processes(tmp_path: Path, rules_file: Path) -> None:
    """Same bytes from two processes with different hash seeds (set and dict orders differ)."""
    import os
    import subprocess
    import sys

    _three_nodes(tmp_path, rules_file)
    outs = []
    for seed in ("1", "4242"):
        p = subprocess.run([sys.executable, "-m", "skewd.cli", "replay", str(tmp_path / "root"), "--json", "-q"],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": seed})
        assert p.returncode == 0, p.stderr
        outs.append(p.stdout)
    assert outs[0] == outs[1] and '"scope":"cluster"' in outs[0]


def test_from_to_limit_the_evaluated_range(live) -> None:
    rc, out, err = cli(live.bundle, "--json", "--from", "14s", "--to", "20s")
    assert rc == 0, err
    got = [json.loads(x) for x in out.splitlines()]
    # state starts fresh at --from (windows are warm): pending at 14, firing 2 s later
    assert [(g["state"], g["evaluated_at"] - T0) for g in got] == [("pending", 14.0), ("firing", 16.0)]
    assert "7 evaluations" in err
    rc, out, _ = cli(live.bundle, "--json", "--to", str(T0 + 13.5))
    assert [json.loads(x)["state"] for x in out.splitlines()] == ["pending"]
    rc, _, err = cli(live.bundle, "--from", "yesterday")
    assert rc == R.EXIT_USAGE and "bad time" in err


def test_speed_paces_the_replay(tmp_path: Path, rules_file: Path) -> None:
    run = run_live(tmp_path / "cap", [rules_file], ticks=20)
    t = time.monotonic()
    rc, out, _ = cli(run.bundle, "--speed", "20x", "--json")
    assert rc == 0 and time.monotonic() - t >= 19 / 20 * 0.95
    assert out == cli(run.bundle, "--json")[1]


def test_rules_option_overrides_the_recorded_rules(live, tmp_path: Path) -> None:
    rc, out, _ = cli(live.bundle, "--json", "--rules", write_rules(tmp_path / "x.yaml", limit=400_000))
    assert rc == 0 and out == ""
    bad = tmp_path / "bad.yaml"
    bad.write_text("required_engine_version: 1\nrules:\n  - id: X\n    scope: nic_port\n")
    rc, _, err = cli(live.bundle, "--rules", bad)
    assert rc == R.EXIT_USAGE and f"{bad}:3:5: E003" in err and "missing layer" in err


def test_hot_reload_during_recording_replays_the_same(tmp_path: Path) -> None:
    a = write_rules(tmp_path / "a.yaml", limit=100_000)
    rs_b = __import__("skewd.rules.loader", fromlist=["load_rules"]).load_rules(
        [write_rules(tmp_path / "b.yaml", limit=250_000)], catalogue()).ruleset

    def reload(i, pipe, rec):
        if i == 18:
            pipe.engine.replace_rules(rs_b)
            rec.set_rules(rs_b)

    run = run_live(tmp_path / "cap", [a], on_tick=reload)
    # a changed rule starts with fresh state (engine.replace_rules): pending/firing again at 250 kB
    assert [f.state.value for f in run.findings] == ["pending", "firing", "pending", "firing", "resolved"]
    rc, out, err = cli(run.bundle, "--json")
    assert rc == 0, err
    assert out.splitlines() == [R.finding_json(f) for f in run.findings]


def test_rotated_bundle_replays_its_remaining_segments(tmp_path: Path, rules_file: Path) -> None:
    run = run_live(tmp_path / "cap", [rules_file], ticks=80, max_duration=60.0, rotate=3)
    segs = B.segment_dirs(run.bundle)
    assert len(segs) == 3 and segs[0].name != "seg-000001"  # the oldest was rotated away
    first = B.Segment(segs[0]).ticks()[0][0]
    n_ticks = sum(len(B.Segment(s).ticks()[0]) for s in segs)
    rc, out, err = cli(run.bundle, "--json")
    assert rc == 0, err
    assert f"{n_ticks} evaluations" in err  # the kept segments replay as one continuous run
    got = [(json.loads(x)["state"], json.loads(x)["evaluated_at"]) for x in out.splitlines()]
    # the alert was already firing when the kept data begins: a cold start re-detects it
    assert got == [("pending", first), ("firing", first + 2), ("resolved", T0 + 28)]
    rc, out, err = cli(segs[-1], "--json")
    assert rc == 0 and f"{len(B.Segment(segs[-1]).ticks()[0])} evaluations" in err


def test_a_recording_cut_short_by_a_crash_replays_what_was_flushed(tmp_path: Path, rules_file: Path) -> None:
    """The agent died: no close(), no end-of-stream marker, meta.json still says incomplete."""
    from skewd.agent.record import Recorder

    crashed: list = []

    def crash(i, pipe, rec):
        if i == 30:  # SIGKILL: nothing more reaches the recorder, no final flush, no close
            crashed.append(rec)
            rec.closed = True

    run = run_live(tmp_path / "cap", [rules_file], on_tick=crash, threaded=False)
    assert isinstance(crashed[0], Recorder)
    seg = B.Segment(B.segment_dirs(run.bundle)[0])
    assert seg.meta["complete"] is False
    n = len(seg.ticks()[0])
    assert n == 30  # flushed every second of tick time up to the crash
    rc, out, err = cli(run.bundle, "--json")
    assert rc == 0, err
    assert out.splitlines() == [R.finding_json(f) for f in run.findings if f.evaluated_at < T0 + n]


def _three_nodes(tmp_path: Path, rules: Path, summaries: bool = True):
    runs = {}
    for node, rate in (("n1", 1e6), ("n2", 1.1e6), ("n3", 1e5)):
        runs[node] = run_live(tmp_path / "root" / node, [rules], node=node, tx_rate=rate, t0=T0 + 0.01 * int(node[1]))
        if not summaries:
            for seg in B.segment_dirs(tmp_path / "root" / node):
                _drop_summaries(seg)
    return runs


def _drop_summaries(seg: Path) -> None:
    """A bundle from an agent that never sent summaries: no summaries file, nothing indexed."""
    (seg / B.SUMMARIES).unlink()
    idx = seg / B.INDEX
    idx.write_text("".join(x for x in idx.read_text().splitlines(keepends=True)
                           if json.loads(x)["file"] != B.SUMMARIES))


@pytest.mark.parametrize("summaries", [True, False], ids=["recorded-summaries", "recomputed-summaries"])
def test_multi_node_bundles_run_group_rules_in_the_controller(tmp_path: Path, rules_file: Path, summaries: bool) -> None:
    runs = _three_nodes(tmp_path, rules_file, summaries)
    rc, out, err = cli(tmp_path / "root", "--json")
    assert rc == 0, err
    got = [json.loads(x) for x in out.splitlines()]
    group = [g for g in got if g["scope"] == Scope.CLUSTER.value]
    assert {(g["rule_id"], g["node"], g["state"]) for g in group} == {("LOW-TX-PEER", "n3", "pending"),
                                                                       ("LOW-TX-PEER", "n3", "firing")}
    assert group[0]["labels"] == {"cluster": "c1"} and group[0]["evidence"]
    # node rules per node, exactly as each agent raised them
    for node, run in runs.items():
        mine = [x for x in out.splitlines() if json.loads(x)["scope"] != "cluster" and json.loads(x)["node"] == node]
        assert mine == [R.finding_json(f) for f in run.findings]
    assert "controller: " in err and " 0 evaluations" not in err.split("controller:")[1]
    # the finding's incident is still held at the end (group_wait 30 s): never published
    assert "1 still held at the end" in err and not [g for g in got if "kind" in g]
    # deterministic with the controller too
    assert cli(tmp_path / "root", "--json")[1] == out
    # a single node has no peers: the controller's cluster rule finds nobody to compare with
    rc, out1, err1 = cli(tmp_path / "root", "--json", "--node", "n3")
    assert rc == 0 and all(json.loads(x)["node"] == "n3" and json.loads(x)["scope"] != "cluster"
                           for x in out1.splitlines())
    # and without the controller no group rule runs at all
    rc, out2, err2 = cli(tmp_path / "root", "--json", "--no-controller")
    assert rc == 0 and "no controller" in err2
    assert [x for x in out2.splitlines()] == [x for x in out.splitlines() if json.loads(x)["scope"] != "cluster"]


def test_missing_bundle_and_unknown_format(tmp_path: Path) -> None:
    rc, _, err = cli(tmp_path / "nope")
    assert rc == R.EXIT_USAGE and "no such file" in err
    seg = tmp_path / "b" / "seg-000001"
    seg.mkdir(parents=True)
    (seg / "meta.json").write_text('{"format": "something-else"}')
    rc, _, err = cli(tmp_path / "b")
    assert rc == R.EXIT_DAMAGED and "not a skewd capture segment" in err


@pytest.mark.timeout(60)
def test_publish_sends_findings_to_nats(live, nats_server) -> None:
    import nats

    rc, out, err = cli(live.bundle, "--json", "--publish", nats_server.url)
    assert rc == 0, err
    assert "published 3 findings" in err

    async def check() -> tuple[int, dict]:
        nc = await asyncio.wait_for(nats.connect(nats_server.url), 5)
        try:
            js = nc.jetstream(timeout=20)
            info = await js.stream_info("SKEWD_FINDINGS")
            msg = await js.get_last_msg("SKEWD_FINDINGS", "skewd.v1.finding.c1.n1.NS5-BACKLOG")
            return info.state.messages, json.loads(msg.data)
        finally:
            await nc.close()

    count, last = asyncio.run(check())
    assert count == 3 and last["state"] == "resolved" and last["node"] == "n1"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal_for_long_replays(tmp_path: Path, rules_file: Path) -> None:
    run = run_live(tmp_path / "cap", [rules_file], ticks=90)
    segs, _ = R.open_segments([run.bundle])
    tty, out = _Tty(), io.StringIO()
    asyncio.run(R.drive(R.Replayer(segs, catalogue()), None, None, out, True, tty, quiet=False))
    shown = tty.getvalue()
    assert "[" in shown and "%" in shown and shown.endswith("\r")
    # how much recorded time is covered, of how much, and how fast
    assert re.search(r"\d+\.\d% +\d+s of 1m\d\ds recorded +(\d+x|…) real time +\d+ transitions", shown), shown
    assert out.getvalue() == cli(run.bundle, "--json")[1]  # stdout unaffected
    plain = io.StringIO()
    asyncio.run(R.drive(R.Replayer(R.open_segments([run.bundle])[0], catalogue()), None, None, io.StringIO(),
                         True, plain, quiet=False))
    assert plain.getvalue() == ""  # not a terminal: no bar
    short = run_live(tmp_path / "short", [rules_file], ticks=20)
    tty2 = _Tty()
    asyncio.run(R.drive(R.Replayer(R.open_segments([short.bundle])[0], catalogue()), None, None, io.StringIO(),
                         True, tty2, quiet=False))
    assert tty2.getvalue() == ""  # 20 s of data: too short to need one


@pytest.mark.timeout(60)
def test_bundle_recorded_by_a_running_agent_replays_to_its_findings(tmp_path: Path) -> None:
    """The real agent loop (agent.runner.Agent with record.dir set) on this host's netdev
    collector, real clock; the rule fires on every interface after 1 s."""
    from skewd.agent.config import load_config
    from skewd.agent.runner import Agent
    from skewd.agent.scheduler import build_slots

    rules = tmp_path / "up.yaml"
    rules.write_text("required_engine_version: 1\nrules:\n  - id: IFACE-SEEN\n    pathology: custom-iface-seen\n"
                     "    scope: nic_port\n    layer: network\n    expr: last(netdev_rx_packets_total, 5s) >= 0\n"
                     "    for: 1s\n")
    cfg = load_config(None, env={}, overrides={
        "node": "agentnode", "cluster": "lab", "rules": [str(rules)], "record": {"dir": str(tmp_path / "cap")},
        "metrics": {"listen": "127.0.0.1:0"}, "evaluation_interval": "500ms",
        "collectors": {"netdev": {"interval": "250ms"}}})
    agent = Agent(cfg, slots=build_slots(cfg, names=["netdev"]))

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(3.0, stop.set)
        await agent.run(stop)

    asyncio.run(run())
    live = [R.finding_json(f) for f in agent.findings.items]
    assert {json.loads(x)["state"] for x in live} == {"pending", "firing"}
    rc, out, err = cli(tmp_path / "cap" / "agentnode", "--json")
    assert rc == 0, err
    assert out.splitlines() == live


def test_a_bundle_recorded_without_rules_replays_with_given_rules(tmp_path: Path, rules_file: Path) -> None:
    from skewd.rules.engine import RuleSet

    run = run_live(tmp_path / "cap", [rules_file], ruleset=RuleSet([], [], ""))
    rc, out, err = cli(run.bundle, "--json")
    assert rc == 0 and out == "" and "recorded without rules; pass --rules" in err
    rc, out, err = cli(run.bundle, "--json", "--rules", rules_file)
    assert rc == 0 and [json.loads(x)["state"] for x in out.splitlines()] == ["pending", "firing", "resolved"]


def test_rules_inactive_live_stay_inactive_in_replay(tmp_path: Path) -> None:
    """A rule needing a signal the host lacked was inactive live; `A or B` would fire on A alone
    if replay evaluated it, so the recorded availability must carry over."""
    rules = tmp_path / "or.yaml"
    rules.write_text("required_engine_version: 1\nrules:\n  - id: BACKLOG-OR-CRC\n    pathology: NS-5\n"
                     "    scope: nic_port\n    layer: network\n    expr: last(netdev_qdisc_backlog_bytes, 5s) > 100000"
                     " or last(netdev_rx_crc_errors_total, 5s) > 0\n")
    available = {s for s in catalogue() if s != "netdev_rx_crc_errors_total"}
    run = run_live(tmp_path / "cap", [rules], available=available)
    assert run.findings == [] and "BACKLOG-OR-CRC" in run.pipeline.engine.inactive
    rc, out, err = cli(run.bundle, "--json")
    assert rc == 0 and out == "", err
    # without the recorded availability (an older bundle, or another host) the rule does fire
    everything = run_live(tmp_path / "cap2", [rules])
    assert [f.state.value for f in everything.findings] == ["firing", "resolved"]
    assert cli(everything.bundle, "--json")[1].splitlines() == [R.finding_json(f) for f in everything.findings]


def test_replay_ingests_each_tick_at_once_into_the_store_the_live_agent_had(live) -> None:
    """Replay hands every batch due before a tick to the store in one call (late batches
    included); what the store then holds is what the live agent's store held, batch by batch."""
    segs, _ = R.open_segments([live.bundle])
    rep = R.Replayer(segs, catalogue())
    rep.run()
    got, want = rep.pipelines["n1"].store, live.pipeline.store
    assert sorted(got.blocks) == sorted(want.blocks)
    for sig, per_node in want.blocks.items():
        for node, blk in per_node.items():
            assert list(got.blocks[sig][node].rows) == list(blk.rows)
            for ent in blk.rows:
                for a, b in zip(got.series(sig, node, ent), want.series(sig, node, ent)):
                    np.testing.assert_array_equal(a, b)
    assert got.registry.keys == want.registry.keys
    assert (got.samples_ingested, got.dropped_out_of_order) == (want.samples_ingested, want.dropped_out_of_order)


def test_report_path_is_checked_before_replaying(live, tmp_path: Path) -> None:
    """An unwritable --report fails at once with the path, not with a traceback at the end."""
    rc, out, err = cli(live.bundle, "--report", "/nonexistent/x.html")
    assert rc == R.EXIT_USAGE
    assert "cannot write /nonexistent/x.html: directory /nonexistent does not exist" in err
    assert out == ""  # nothing was replayed
    report = tmp_path / "r.html"
    rc, out, err = cli(live.bundle, "--report", report, "--quiet")
    assert rc == 0 and report.stat().st_size > 1000
