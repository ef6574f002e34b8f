"""Every benchmark runs from its documented command in a tiny configuration and prints its
figures, its goal and its peer (no timing is asserted: machines here are noisy, and a missed
goal is reported by the benchmark, never an error)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .. import vllm_venv

BENCH = Path(__file__).resolve().parents[2] / "bench"

pytestmark = pytest.mark.timeout(240)


def run(script: str, *args: str) -> tuple[list[str], dict | None]:
    p = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=220)
    assert p.returncode == 0, f"{script} exited {p.returncode}:\n{p.stdout}\n{p.stderr[-3000:]}"
    lines = p.stdout.splitlines()
    figures = next((json.loads(line) for line in lines if line.startswith('{"benchmark"')), None)
    return lines, figures


def test_digest_intake_times_a_leader_taking_the_partitions_digests() -> None:
    lines, f = run("digest_intake.py", "--nodes", "40", "--partitions", "3", "--seconds", "4", "--warm", "1",
                   "--encoding", "json", "--json")
    assert f is not None and f["benchmark"] == "digest_intake" and f["seconds_measured"] == 3
    assert f["take_digests_ms"]["max"] > 0 and 0 < f["largest_message_bytes"] < 1 << 20
    assert any("leader _take_digests (tick)" in line for line in lines)


def test_intake_dispatch_times_nats_py_and_direct_delivery_on_the_same_frames() -> None:
    lines, f = run("intake_dispatch.py", "--messages", "3000", "--repeat", "1", "--headers", "--json")
    assert f is not None and f["benchmark"] == "intake_dispatch" and f["headers"] is True
    assert set(f["us_per_message"]) == {"nats-py", "direct", "parse only"}
    assert all(v > 0 for v in f["us_per_message"].values())
    assert any("x nats-py" in line for line in lines)


def test_pkt_offline_times_skewd_and_both_peers_on_the_same_file() -> None:
    lines, f = run("pkt_offline.py", "--packets", "3000", "--flows", "40", "--repeat", "1",
                   "--scapy-packets", "300", "--cli", "--json")
    assert f is not None and f["benchmark"] == "pkt_offline"
    assert f["skewd"]["pps_cpu"] > 0 and f["skewd"]["flows"] == 40
    # --cli: the command users run, timed as a new process against its wall-clock goal
    cli = f["skewd_cli"]
    assert cli["runs"] == 1 and cli["pps_wall_median"] > 0 and cli["cpu_s"][0] > 0
    assert cli["ratio_wall_vs_scapy"] > 0
    assert any("skewd pkt FILE --json (new process each run" in line and "goal >= 1.5 M packets/s wall" in line
               for line in lines)
    # both peers ran on the generated file and computed the same per-flow numbers as skewd
    assert f["dpkt"]["packets"] == 3000 and not f["dpkt"]["prefix"] and f["dpkt"]["agrees_with_skewd"]
    assert f["scapy"]["packets"] == 300 and f["scapy"]["prefix"] and f["scapy"]["agrees_with_skewd"]
    for peer in ("dpkt", "scapy"):
        assert f[peer]["pps_cpu"] > 0 and f[peer]["ratio_cpu"] > 0
    assert any(line.startswith("  skewd:") and "goal >= 1.5 M packets/s" in line for line in lines)
    assert any("peer dpkt" in line and "all 3,000 packets" in line for line in lines)
    assert any("peer scapy PcapReader (full dissection)" in line and "first 300 of 3,000 packets only" in line
               for line in lines)
    assert any("ratio" in line and "skewd/dpkt" in line and "skewd/scapy" in line for line in lines)


def test_replay_speed_records_and_replays_every_sample() -> None:
    lines, f = run("replay_speed.py", "--hours", "0.005", "--cpus", "2", "--flows", "2", "--json")
    assert f is not None and f["benchmark"] == "replay_speed"
    # 18 recorded seconds, every series at 10 Hz, all of it written and replayed
    assert f["samples"] == f["series"] * 10 * 18
    assert f["evaluations"] == 18
    assert f["day_s"] > 0 and not f["day_measured"]
    assert any("goal <= 90 s" in line and "extrapolated" in line for line in lines)
    assert any("naive one-sample batches" in line for line in lines)


def test_controller_ingest_reports_controller_and_bare_transport() -> None:
    """The single-process controller (0) and one scaled-out worker behind the partition mapping
    (1) each handle summaries, beside the bare subscriber on the same server."""
    lines, f = run("controller_ingest.py", "--seconds", "1", "--warmup", "2", "--nodes", "16", "--latency-rate", "200",
                   "--workers", "0,1", "--partitions", "2", "--json")
    assert f is not None and f["partitions"] == 2
    runs = [f["peer"], f["peer_latency"]] + [r[k] for r in f["skewd"].values() for k in ("saturation", "latency")]
    for r in runs:
        assert 0 < r["handled"] <= r["sent"]
    assert not f["skewd"]["1"]["latency"]["saturated"]  # 16 agents at 200/s: all handled
    # a saturation run that handled all it was offered is reported as held back by its load
    held = [r for r in [f["peer"]] + [r["saturation"] for r in f["skewd"].values()] if not r["saturated"]]
    assert sum("not saturated: it handled all it was offered" in line for line in lines) == len(held)
    # 16 agents in TP groups of 8, learned from their labels; counters reported per phase
    for w in ("0", "1"):
        steady = f["skewd"][w]["saturation"]["steady"]
        assert steady["tp_groups"] == 2 and steady["cpu_us_per_summary"] > 0
    assert f["skewd"]["1"]["saturation"]["steady"]["partitions"] == [0, 1]
    for phase in ("saturation", "latency"):  # each tick's CPU time beside its wall time (a tick's own work)
        p = f["skewd"]["1"][phase]["steady"]
        # (CPU within wall; 1 ms for the two clocks' readings, taken one after the other)
        assert 0 <= p["tick_cpu_max_s"] <= p["tick_max_s"] + 1e-3
        assert 0 <= p["leader_tick_cpu_max_s"] <= p["leader_tick_max_s"] + 1e-3
    assert any("goal >= 50,000 summaries/s" in line for line in lines)
    assert sum("ratio to the peer" in line for line in lines) == 2


def test_controller_ingest_spreads_the_agents_over_several_publishers() -> None:
    """``--publishers 2``: the agents split between two processes, and the consumers hear every
    one of them."""
    lines, f = run("controller_ingest.py", "--seconds", "1", "--warmup", "2", "--nodes", "16", "--latency-rate", "200",
                   "--workers", "1", "--partitions", "2", "--publishers", "2", "--json")
    assert f is not None and f["publishers"] == 2
    assert any("2 publisher processes" in line for line in lines)
    sat = f["skewd"]["1"]["saturation"]
    assert 0 < sat["handled"] <= sat["sent"] and sat["steady"]["nodes"] == 16
    assert 0 < f["peer"]["handled"] <= f["peer"]["sent"]


@pytest.mark.parametrize("encoding", ["json", "binary"])
def test_controller_ingest_offline_takes_in_every_summary_of_either_encoding(encoding: str) -> None:
    lines, f = run("controller_ingest.py", "--offline", "200", "--warm", "10", "--seconds", "3", "--nodes", "16",
                   "--encoding", encoding, "--json")
    assert f is not None and f["encoding"] == encoding
    assert f["rejected"] == 0 and f["errors"] == 0 and f["evaluations"] > 0  # past the rules' warm-up
    assert f["warm"]["summaries"] + f["steady"]["summaries"] == 200 * 13
    assert any(f"{encoding} summaries" in line for line in lines)


def test_agent_footprint_runs_the_real_agent() -> None:
    lines, f = run("agent_footprint.py", "--minutes", "0.1", "--warmup", "5", "--pkt-interface", "none", "--json")
    assert f is not None
    assert "host" in f["collectors"] and "pkt" not in f["collectors"]
    assert f["peak_rss_mib"] > 10 and f["cpu_pct"] > 0
    assert f["summaries"] > 0  # the agent published to the benchmark's nats-server
    assert any("dcgm-exporter" in line and "less memory" in line for line in lines)


def test_e2e_latency_measures_a_straggler_found_and_remapped() -> None:
    """The real controller finds the straggler the benchmark's agents report and publishes a
    remap for it: both latencies are measured (after the rule's own delays), not assumed."""
    lines, f = run("e2e_latency.py", "--groups", "1", "--first-onset", "3", "--spread", "0", "--tail", "120",
                   "--json")
    assert f is not None and len(f["groups"]) == 1
    g = f["groups"][0]
    assert g["culprit"] == "g0n1" and g["onset"] is not None
    # EW-1 averages 30 s and holds 15 s (for:), the correlator group_wait 30 s before a remap
    assert 15 < g["finding_s"] < 90 and g["finding_s"] < g["suggestion_s"] < 120
    assert any("onset -> remap suggestion published" in line for line in lines)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and AF_PACKET sockets need root")
@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip command")
@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="needs gcc for bench/sender.c")
def test_live_capture_both_phases_and_cleans_up() -> None:
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    lines, f = run("live_capture.py", "--seconds", "1", "--rate", "20000", "--senders", "1", "--json")
    assert f is not None
    for side in ("skewd", "peer"):
        r = f[side]
        assert r["sent"] > 1000 and r["arrived"] == r["sent"]  # every datagram crossed the veth
        assert 0 < r["captured"] <= r["sent"]
    # at 20k packets/s the ring keeps everything
    assert f["skewd"]["captured"] == f["skewd"]["sent"] and f["skewd"]["kernel_drops"] == 0
    assert any(line.startswith("  ratio:") for line in lines)
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "skwbench-" not in after.replace(before, "")


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and AF_PACKET sockets need root")
@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip command")
def test_agent_footprint_under_gloo_traffic_measures_busy_and_idle_port_and_cleans_up(monkeypatch) -> None:
    """The real-traffic run: gloo ranks between namespaces, one agent capturing their port and one
    an idle port of the same bridge, both measured; every namespace it made is gone after."""
    # the shared vLLM CPU venv carries torch; build it here (once) rather than skip when this test
    # runs before the tests that used to build it, as it does in a fresh clone
    monkeypatch.setenv("SKEWD_LAB_TORCH_PYTHON", vllm_venv.python_or_skip())
    prefix = os.environ.get("SKEWD_BENCH_NETNS_PREFIX", "skwbench-")
    lines, f = run("agent_footprint.py", "--traffic", "gloo", "--minutes", "0.1", "--warmup", "5",
                   "--netns-prefix", prefix, "--json")
    assert f is not None and f["benchmark"] == "agent_footprint_traffic"
    busy, idle = f["traffic"], f["idle"]
    assert busy["port_pps"] > 100 and busy["port_mbps"] > 1  # the collective really crossed the port
    assert idle["port_pps"] < busy["port_pps"] / 10  # the peer's port is idle
    for x in (busy, idle):
        assert x["cpu_s"] > 0 and x["hwm_kib"] > 10_000 and x["summaries"] > 0
    assert any(line.startswith("  busy / idle:") for line in lines)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{prefix}fp-" not in left


def test_run_all_runs_the_selection_and_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    p = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--quick", "--only", "replay_speed",
                        "--replay-hours", "0.003", "--out", str(out)], capture_output=True, text=True, timeout=220)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 of 1 benchmarks ran" in p.stdout and "machine:" in p.stdout
    res = json.loads(out.read_text())
    assert res["machine"]["nproc"] == str(os.cpu_count())
    assert res["results"]["replay_speed"]["figures"]["benchmark"] == "replay_speed"


def test_controller_ingest_reads_its_tick_figures_when_told_to_stop_not_after_the_report(monkeypatch) -> None:
    """A consumer's report sums up millions of latencies, holding the interpreter meanwhile; a
    tick still running then waits for it. The tick figures (``extra``) are read when the run
    ends, before that work, so such a tick is not counted as the run's longest."""
    sys.path.insert(0, str(BENCH))
    try:
        import controller_ingest
    finally:
        sys.path.remove(str(BENCH))
    import numpy as np

    order: list[str] = []
    percentile = np.percentile
    monkeypatch.setattr(np, "percentile", lambda *a, **k: order.append("latencies") or percentile(*a, **k))
    ticks = [0.02]

    def extra() -> dict:
        order.append("ticks")
        return {"ticks": len(ticks), "tick_max_s": max(ticks)}

    rec = controller_ingest.Recorder(warm=0.0, on_steady=extra)
    for _ in range(3):
        rec.hit(0.0)
    order.clear()
    res = rec.result(extra)
    assert order[0] == "ticks" and order.count("ticks") == 1 and "latencies" in order
    assert res["steady"]["tick_max_s"] == 0.02 and res["steady"]["handled"] == 3
