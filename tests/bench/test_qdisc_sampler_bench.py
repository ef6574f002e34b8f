"""bench/qdisc_sampler.py runs from its documented command in a tiny configuration: the sampler,
netdev's own dump and pyroute2 each measured, the 2 Hz watch too, and its namespaces removed
(no timing asserted: machines here are noisy)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

pytestmark = [
    pytest.mark.root,
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="the benchmark builds network namespaces: needs root"),
]


def test_qdisc_sampler_bench_measures_all_three_and_cleans_up() -> None:
    prefix = os.environ.get("SKEWD_BENCH_NETNS_PREFIX", "skwbench-")
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    p = subprocess.run([sys.executable, str(BENCH / "qdisc_sampler.py"), "--seconds", "0.5", "--rates", "20",
                        "--json"], capture_output=True, text=True, timeout=100)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    f = next(json.loads(line) for line in p.stdout.splitlines() if line.startswith('{"benchmark"'))
    row, watch = f["results"]
    assert row["hz"] == 20
    for method in ("sampler", "own dump", "pyroute2"):
        assert row[method]["pct_core"] > 0 and row[method]["us_per_round"] > 0
    assert 0.5 <= watch["watch"]["rounds_per_s"] <= 4  # the watch: twice a second
    assert "sampler targets: ['qb0', 'qb1', 'qb2']" in p.stdout  # the noqueue veth is skipped
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    new = set(after.splitlines()) - set(before.splitlines())
    assert not [n for n in new if n.startswith(prefix)], new
