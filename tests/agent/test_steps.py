"""Node summaries carry each node's collective steps on its own clock (agent/steps.py): the
period, the compute gap and the wait per step, and every step entry once for cross-node
alignment. A straggler computes longer and does not wait; its peers wait for it. A port
without collectives (token streams only) has no steps worth the name."""
from __future__ import annotations

import json

import numpy as np
import pytest

from skewd.agent import steps as steps_mod
from skewd.agent import summary as summary_mod
from skewd.agent.pipeline import Pipeline
from skewd.collectors.pkt.catalogue import CATALOGUE as PKT
from skewd.collectors.pkt.features import NS
from skewd.collectors.pkt.frames import DIR_IN, DIR_OUT
from skewd.collectors.pkt.samples import to_batch
from skewd.model import Catalogue
from skewd.rules.engine import RuleSet
from tests.collective_traffic import T0, collect, entries, node_packets
from tests.pkt_packets import udp_packets


def pipeline_of(pk, node: str = "n1", phase: float = 0.3) -> Pipeline:
    cat = Catalogue(PKT).merge(summary_mod.CATALOGUE)
    pipe = Pipeline(cat, RuleSet([]), node=node)
    for t, f in collect(pk, 1.0, phase):
        pipe.ingest(to_batch(f, node, t))
    return pipe


def test_a_stragglers_summary_shows_longer_compute_and_no_wait() -> None:
    rng = np.random.default_rng(1)
    e, fin = entries(rng, 4, 400, lag={3: 0.012})
    vals = {}
    for node in range(4):
        pipe = pipeline_of(node_packets(rng, e, fin, node), f"n{node}")
        t = float(np.floor(fin[-1])) - 1
        vals[node] = summary_mod.make_summary(pipe.store, f"n{node}", "c", t, 1.0).signals
    comp = {n: v["summary_collective_compute_seconds"][""] for n, v in vals.items()}
    wait = {n: v["summary_collective_wait_seconds"][""] for n, v in vals.items()}
    peers = np.median([comp[n] for n in range(3)])
    assert comp[3] - peers == pytest.approx(0.012, abs=0.0025)
    assert wait[3] < 0.002 and min(wait[n] for n in range(3)) > 0.008
    true_period = float(np.median(np.diff(e[:, 0])))
    for n in range(4):
        assert vals[n]["summary_collective_period_seconds"][""] == pytest.approx(true_period, rel=0.05)
        assert vals[n]["summary_collective_regularity_ratio"][""] > 0.9
        assert vals[n]["summary_collective_step_bytes"][""] > 1e6
        # a healthy rank loses the steps it entered within ``react`` (2 ms) of a neighbour's
        # notification (this traffic's entry jitter is exponential, 2 ms mean: about half; real
        # lab: 83-94 % recognised); the straggler none; never more steps than there were
        lo = 0.9 if n == 3 else 0.35
        assert lo <= vals[n]["summary_collective_steps"][""] / (steps_mod.LOOKBACK / true_period) <= 1.02


def test_a_straggler_late_in_bursts_moves_the_time_shares_not_the_median() -> None:
    """A rank held up in one step of four by 40 ms (a CPU quota spent, a GC pause): its median
    compute gap stays with its peers', but the share of the time it computes rises by what it
    costs the group, and its peers' share of the time waiting by as much."""
    rng = np.random.default_rng(3)
    burst = np.where(np.arange(300) % 4 == 0, 0.04, 0.0)
    e, fin = entries(rng, 4, 300, lag={3: burst})
    vals = {}
    for node in range(4):
        pipe = pipeline_of(node_packets(rng, e, fin, node), f"n{node}")
        t = float(np.floor(fin[-1])) - 1
        vals[node] = summary_mod.make_summary(pipe.store, f"n{node}", "c", t, 1.0).signals

    def v(name: str, n: int) -> float:
        return vals[n][name][""]
    comp, share, waited = ("summary_collective_compute_seconds", "summary_collective_compute_share_ratio",
                           "summary_collective_waited_share_ratio")
    assert v(comp, 3) - np.median([v(comp, n) for n in range(3)]) < 0.005  # under EW-1-tp-straggler's lag
    # 10 ms a step on average over a ~70 ms step: about a seventh of the time
    excess = v(share, 3) - np.median([v(share, n) for n in range(3)])
    assert 0.1 < excess < 0.25
    assert min(v(waited, n) for n in range(3)) - v(waited, 3) > 0.5 * excess
    for n in range(4):
        assert 0 < v(share, n) < 1 and 0 <= v(waited, n) < 1


@pytest.mark.parametrize("interval", [1.0, 5.0])
def test_every_recognised_step_entry_reaches_one_summary(interval: float) -> None:
    rng = np.random.default_rng(2)
    e, fin = entries(rng, 2, 300)
    pipe = pipeline_of(node_packets(rng, e, fin, 0), "n0")
    got: list[float] = []
    t = T0 + 12.0
    while t <= fin[-1] - 1:
        msg = summary_mod.make_summary(pipe.store, "n0", "c", t, interval)
        s = msg.signals.get("collective_burst_starts", {})
        assert list(s) == list(msg.signals.get("collective_burst_bytes", {}))
        assert summary_mod.burst_starts(pipe.store, "n0", t, interval) == list(s.values())
        got += list(s.values())
        t += interval
    assert got == sorted(got) and len(set(got)) == len(got)  # once each, in order
    j = np.clip(np.searchsorted(e[:, 0], got), 1, len(e) - 1)
    assert (np.minimum(abs(e[j, 0] - got), abs(e[j - 1, 0] - got)) < 2e-6).all()  # real entries
    covered = (e[:, 0] > T0 + 12.0 - interval - 1.0) & (e[:, 0] < fin[-1] - 3)
    # entries a rank made within ``react`` of its peer's notification are not recognised (a pair
    # with this traffic's 2 ms exponential entry jitter: about a quarter)
    assert len(got) >= 0.6 * covered.sum()


def test_a_port_of_token_streams_has_no_collective_steps() -> None:
    rng = np.random.default_rng(3)
    tok = T0 + np.cumsum(rng.uniform(0.02, 0.04, 1500))
    ts = np.sort(np.r_[tok, tok + 0.003])
    d = np.where(np.isin(ts, tok), DIR_OUT, DIR_IN)
    pay = np.where(d == DIR_OUT, 520, 0)
    pk = udp_packets(np.round(ts * NS).astype(np.int64), pay + 66, dst=np.where(d == DIR_OUT, 2, 1),
                     direction=d, payload=pay, sport=np.where(d == DIR_OUT, 443, 5555),
                     dport=np.where(d == DIR_OUT, 5555, 443))
    pk.src_lo[:] = np.where(d == DIR_OUT, 1, 2)
    pipe = pipeline_of(pk)
    v = summary_mod.make_summary(pipe.store, "n1", "c", T0 + 30, 1.0).signals
    # a token "step" carries a token line: far under EW-1's collective floor (64 KB)
    assert v.get("summary_collective_step_bytes", {"": 0.0})[""] < 2000


def test_a_transport_without_pauses_still_gives_steps() -> None:
    """RoCE collectives do not pause inside a step: every send-ended silence is an entry."""
    n = 200
    entry = T0 + np.arange(n) * 0.03
    length = np.full(n, 0.004) + np.linspace(0, 0.0005, n)
    st = steps_mod.analyse(entry, length, np.ones(n), np.full(n, 5e6), T0 - 1, T0 + 7)
    assert st is not None and st.steps >= n - 1
    assert st.period == pytest.approx(0.03, rel=1e-6) and st.compute == pytest.approx(np.median(length))
    assert st.wait == 0.0


def test_nothing_periodic_gives_no_steps() -> None:
    assert steps_mod.analyse(np.array([T0, T0 + 1.0]), np.array([0.01, 0.01]), np.ones(2), np.ones(2),
                             T0 - 1, T0 + 2) is None


def test_a_replayed_capture_gives_the_same_steps(tmp_path) -> None:
    """Captures record what the agent ingests (the pkt batches with their per-silence stamps):
    replaying one without its recorded summaries recomputes the same steps."""
    from skewd.agent import bundle
    from skewd.agent import replay
    from skewd.agent.record import Recorder
    from skewd.catalogue import full_catalogue
    from skewd.model import NODE_SCOPES
    from skewd.rules.loader import load_rules

    from .test_record import SETTINGS, write_rules

    cat = full_catalogue()
    rs = load_rules([write_rules(tmp_path / "rules.yaml")], cat).ruleset
    rec = Recorder(tmp_path / "cap", node="n1", cluster="c1", labels={"tp_group": "tp0"}, ruleset=rs,
                   catalogue=cat, settings=SETTINGS)
    pipe = Pipeline(cat, rs, node="n1", cluster="c1", labels={"tp_group": "tp0"}, sinks=[rec])
    pipe.engine.scopes = set(NODE_SCOPES)
    rng = np.random.default_rng(4)
    e, fin = entries(rng, 2, 200)
    live = []
    for t, f in collect(node_packets(rng, e, fin, 1), 1.0, 0.4):
        pipe.ingest(to_batch(f, "n1", t))
        pipe.evaluate(t + 0.6)
        msg = summary_mod.make_summary(pipe.store, "n1", "c1", t + 0.6, 1.0)
        rec.on_summary(msg)
        live.append({k: v for k, v in msg.signals.items() if k.startswith(("collective_", "summary_collective_"))})
    rec.stop()
    assert sum(len(x.get("collective_burst_starts", {})) for x in live) > 50
    for seg in bundle.segment_dirs(tmp_path / "cap"):  # an agent that sent no summaries: recompute them
        (seg / bundle.SUMMARIES).unlink()
        idx = seg / bundle.INDEX
        idx.write_text("".join(x for x in idx.read_text().splitlines(keepends=True)
                               if json.loads(x)["file"] != bundle.SUMMARIES))
    segs, _ = replay.open_segments([tmp_path / "cap"])
    assert not segs[0].summaries()
    rep = replay.Replayer(segs, replay.replay_catalogue(segs))
    rep.run()
    again = [{k: v for k, v in s.signals.items() if k.startswith(("collective_", "summary_collective_"))}
             for s in rep.summaries]
    assert again == live[: len(again)] and len(again) >= len(live) - 1


def test_steps_of_two_lengths_without_pauses_are_all_steps() -> None:
    """A pipeline stage's hand-off silences: one compute gap per step, ended by its own send, no
    pauses - decode steps of ~40 ms with a prefill step of ~300 ms now and then. The short gaps
    fill most of the time, so they are steps, not pauses inside a collective: the period is the
    decode step's, and no decode gap reads as a wait between two prefill 'entries'."""
    rng = np.random.default_rng(2)
    gaps = np.where(rng.random(400) < 0.12, rng.uniform(0.25, 0.35, 400), rng.uniform(0.035, 0.045, 400))
    end = T0 + np.cumsum(gaps)
    sel = end <= end[0] + 10
    s = steps_mod.analyse(end[sel], gaps[sel], np.ones(sel.sum()), np.full(sel.sum(), 1e6), end[0], end[0] + 10)
    assert s is not None
    assert 0.035 <= s.period <= 0.05 and s.wait == 0.0
    assert s.steps >= 0.8 * sel.sum()
