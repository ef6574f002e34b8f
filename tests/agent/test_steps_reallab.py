"""Straggler detection on real traffic, from the pkt collector's recorded output: the real-traffic
lab's gloo all_reduce over TCP (tests/fixtures/pkt/reallab-gloo/export.py says how it was
recorded; export_pcap.py for the ``netlab-*`` runs of the lab itself, captured packets through
the collector's current code). Each node's silences go through the agent's step analysis into
its summaries, the summaries into the controller's group evaluation of the shipped clock-free
EW-1 rules: the straggler is named and only it (a rank under a CPU quota, late in bursts, too),
in a group of four and in a pair; healthy traffic, on a quiet and on a heavily loaded host, and
a shaped (slow) link name nobody. No clock is shared between nodes here: only each node's own
durations are used."""
from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import pytest

from skewd.agent import steps as steps_mod
from skewd.agent import summary as summary_mod
from skewd.catalogue import full_catalogue
from skewd.model import BatchBuilder, Scope
from skewd.rules.cli import PACKS
from skewd.rules.engine import Engine
from skewd.rules.loader import load_rules_or_raise
from skewd.rules.store import WindowStore

FIX = Path(__file__).parents[1] / "fixtures" / "pkt" / "reallab-gloo"


def recorded(run: str) -> dict[str, tuple[np.ndarray, ...]]:
    rows = list(csv.DictReader(gzip.open(FIX / f"{run}.csv.gz", "rt")))
    out = {}
    for node in sorted({r["node"] for r in rows}):
        mine = [r for r in rows if r["node"] == node]
        out[node] = tuple(np.array([float(r[k]) for r in mine]) for k in ("t", "seconds", "by_send", "sent_bytes"))
    return out


def node_summaries(run: str) -> tuple[dict[str, list[dict[str, float]]], float]:
    """Each node's summary values once a second, from its recorded silences (the agent's code)."""
    rec = recorded(run)
    lo = max(v[0][0] for v in rec.values()) + steps_mod.LOOKBACK
    hi = min(v[0][-1] for v in rec.values())
    out: dict[str, list[dict[str, float]]] = {}
    for node, (t, L, k, b) in rec.items():
        out[node] = []
        for now in np.arange(lo, hi, 1.0):
            sel = (t > now - steps_mod.LOOKBACK) & (t <= now)
            st = steps_mod.analyse(t[sel], L[sel], k[sel], b[sel], now - steps_mod.LOOKBACK, now)
            out[node].append(steps_mod.summary_values(st) if st else {})
    return out, lo


#: the clock-free EW-1 rules: medians per step, and shares of the time (a straggler late in bursts)
CLOCK_FREE = ("EW-1-tp-straggler", "EW-1-tp-straggler-time-share")


def ew1_findings(run: str, rules: tuple[str, ...] = CLOCK_FREE) -> set[str]:
    """Nodes the shipped clock-free EW-1 rules name after 90 s of these summaries (the recorded
    seconds repeated: step statistics of a steady run)."""
    sums, _ = node_summaries(run)
    cat = full_catalogue()
    rs = load_rules_or_raise([PACKS], cat)
    rs.rules = [r for r in rs.rules if r.id in rules]
    store = WindowStore(cat)
    for node in sums:
        store.registry.set_node_labels(node, {"tp_group": "tp0"})
    eng = Engine(rs, store, scopes={Scope.TP_GROUP})
    named: set[str] = set()
    t0 = 1_800_000_000.0
    for i in range(90):
        for node, vals in sums.items():
            b = BatchBuilder(node)
            for name, v in vals[i % len(vals)].items():
                b.add(t0 + i, "", name, v)
            store.ingest(b.build())
        for f in eng.evaluate(t0 + i):
            if f.state.value == "firing":
                named.add(f.node)
    return named


@pytest.mark.parametrize("run,straggler", [("strag20", "n2"), ("strag10", "n1"), ("pairstrag", "n1"),
                                           ("netlab-straggler", "n3"), ("netlab-straggler-cpu", "n1")])
def test_the_real_straggler_is_named_and_only_it(run: str, straggler: str) -> None:
    assert ew1_findings(run) == {straggler}


@pytest.mark.parametrize("run", ["healthy", "pair", "tbf", "netlab-healthy", "netlab-healthy-loaded"])
def test_healthy_traffic_and_a_shaped_link_name_nobody(run: str) -> None:
    assert ew1_findings(run) == set()


def test_the_straggler_computes_longer_and_its_peers_wait_in_the_recording() -> None:
    sums, _ = node_summaries("strag20")
    med = {n: {k: float(np.median([v[k] for v in vs if k in v])) for k in
               ("summary_collective_compute_seconds", "summary_collective_wait_seconds",
                "summary_collective_period_seconds")} for n, vs in sums.items()}
    peers = [med[n]["summary_collective_compute_seconds"] for n in ("n0", "n1", "n3")]
    assert med["n2"]["summary_collective_compute_seconds"] - np.median(peers) == pytest.approx(0.02, abs=0.004)
    assert med["n2"]["summary_collective_wait_seconds"] < 0.005
    assert all(med[n]["summary_collective_wait_seconds"] > 0.012 for n in ("n0", "n1", "n3"))
    periods = [m["summary_collective_period_seconds"] for m in med.values()]
    assert max(periods) / min(periods) < 1.1  # lock step: every node measures the same period


def test_the_medians_miss_the_cpu_quota_straggler_and_the_time_shares_name_it() -> None:
    assert ew1_findings("netlab-straggler-cpu", ("EW-1-tp-straggler",)) == set()
    assert ew1_findings("netlab-straggler-cpu", ("EW-1-tp-straggler-time-share",)) == {"n1"}


def _medians(run: str, keys: tuple[str, ...]) -> dict[str, dict[str, float]]:
    sums, _ = node_summaries(run)
    return {n: {k: float(np.median([v[k] for v in vs if k in v])) for k in keys} for n, vs in sums.items()}


def test_a_cpu_quota_straggler_is_late_in_bursts_which_only_the_time_shares_see() -> None:
    """Rank n1 under a cgroup CPU quota: it runs until its quota is spent, then waits for the next
    CFS period, so a few steps are very late and most are not. Its median compute gap barely moves
    (under EW-1's 5 ms lag) and its own period estimate halves (stalls inside the collective read as
    steps), but the share of the time it spends computing is far above its peers', and theirs
    waiting far above its own - what EW-1's second condition reads."""
    keys = ("summary_collective_compute_seconds", "summary_collective_period_seconds",
            "summary_collective_compute_share_ratio", "summary_collective_waited_share_ratio")
    med = _medians("netlab-straggler-cpu", keys)
    peers = ("n0", "n2", "n3")

    def others(k: str) -> float:
        return float(np.median([med[n][k] for n in peers]))
    assert med["n1"][keys[0]] - others(keys[0]) < 0.007  # the median: a few ms, no more
    assert med["n1"][keys[1]] < 0.7 * others(keys[1])  # its period estimate: stalls read as steps
    assert med["n1"][keys[2]] - others(keys[2]) > 0.2
    assert others(keys[3]) - med["n1"][keys[3]] > 0.2


def test_time_shares_of_healthy_nodes_stay_close_on_a_loaded_host() -> None:
    """Healthy ranks on a host loaded far beyond its cores (load average up to 27 on 2): their
    compute medians lie up to 13 ms apart, their time shares within a few hundredths."""
    keys = ("summary_collective_compute_share_ratio", "summary_collective_waited_share_ratio")
    for run in ("netlab-healthy-loaded", "netlab-healthy", "healthy"):
        med = _medians(run, keys)
        shares = [m[keys[0]] for m in med.values()]
        assert 0.2 < min(shares) and max(shares) - min(shares) < 0.1, (run, shares)
