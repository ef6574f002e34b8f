"""The simulator's collective timing is calibrated against the real-traffic lab: the silences it
lists for TCP collectives (lab/sim/steps.py, ``collective_transport: tcp``) have the same
distribution as those the real pkt collector recorded from gloo all_reduce over TCP
(tests/fixtures/pkt/reallab-gloo), within stated bounds, and a simulated straggler shows the
real signature (it computes longer and does not wait; its peers wait about its lag)."""
from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import pytest

from skewd.agent import steps as steps_mod
from skewd.lab.sim import steps as sim_steps

FIX = Path(__file__).parents[1] / "fixtures" / "pkt" / "reallab-gloo"
SHORT = 0.005  # pauses inside a collective; longer silences are compute gaps or waits


def pause_stats(end, length, by_send, sent) -> tuple[float, float, float]:
    """(short pauses per step, their median length, share of them ended by a send) of one node."""
    st = steps_mod.analyse(end, length, by_send, sent, end[0] - 1, end[-1])
    assert st is not None
    entry = np.isin(end, st.starts)
    short = ~entry & (length < SHORT)
    return short.sum() / st.steps, float(np.median(length[short])), float(by_send[short].mean())


def real_nodes(run: str) -> dict[str, tuple[np.ndarray, ...]]:
    rows = list(csv.DictReader(gzip.open(FIX / f"{run}.csv.gz", "rt")))
    return {n: tuple(np.array([float(r[k]) for r in rows if r["node"] == n])
                     for k in ("t", "seconds", "by_send", "sent_bytes")) for n in sorted({r["node"] for r in rows})}


def sim_node(seed: int, steps: int = 600, lag: float = 0.0, waiting_for: float = 0.0, members: int = 4):
    """One member's silences as the simulator lists them for TCP collectives: a 70 ms step (real
    lab: ~75 ms), all-reduce ~20 ms, ``lag`` its own extra compute, ``waiting_for`` a peer's."""
    rng = np.random.default_rng(seed)
    T = 1_800_000_000.0
    period = 0.07 + max(lag, waiting_for)
    start = T + np.arange(steps) * period + rng.normal(0, 0.001, steps)
    entry = start + lag
    latest = start + max(lag, waiting_for)
    end = latest + 0.02
    sil, _ = sim_steps.step_silences(rng, float("nan"), entry, latest, end, np.full(steps, 3e6), "tcp", members)
    return sil.end, sil.length, sil.by_send.astype(float), sil.sent


@pytest.mark.parametrize("run,members", [("healthy", 4), ("pair", 2)])
def test_pauses_inside_collectives_match_the_real_lab(run: str, members: int) -> None:
    real = [pause_stats(*v) for v in real_nodes(run).values()]
    sim = [pause_stats(*sim_node(s, members=members)) for s in range(4)]
    r = np.median(np.array(real), axis=0)
    s = np.median(np.array(sim), axis=0)
    assert s[0] == pytest.approx(r[0], rel=0.35), ("pauses per step", s[0], r[0])
    assert s[1] == pytest.approx(r[1], rel=0.3), ("median pause", s[1], r[1])
    assert abs(s[2] - r[2]) < 0.1, ("share ended by a send", s[2], r[2])


def test_a_simulated_straggler_has_the_real_signature() -> None:
    real = {n: steps_mod.analyse(*v, v[0][0] - 1, v[0][-1]) for n, v in real_nodes("strag20").items()}
    lag = 0.02
    strag = steps_mod.analyse(*(x := sim_node(7, lag=lag)), x[0][0] - 1, x[0][-1])
    peer = steps_mod.analyse(*(x := sim_node(8, waiting_for=lag)), x[0][0] - 1, x[0][-1])
    # real: the straggler (n2) computes ~20 ms longer than its peers and waits ~2-3 ms; they wait ~18 ms
    r_excess = real["n2"].compute - np.median([real[n].compute for n in ("n0", "n1", "n3")])
    assert strag.compute - peer.compute == pytest.approx(r_excess, abs=0.005)
    assert strag.wait < 0.25 * lag and real["n2"].wait < 0.25 * lag
    assert peer.wait == pytest.approx(np.median([real[n].wait for n in ("n0", "n1", "n3")]), rel=0.3)
