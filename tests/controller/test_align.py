"""Burst alignment: which node is late, by how much, and when clock error says "can't tell"."""
from __future__ import annotations

import numpy as np
import pytest

from skewd.catalogue import full_catalogue
from skewd.controller.align import Aligner, align, estimate_period, stage_gap
from skewd.controller.catalogue import CATALOGUE, NAMES

T0 = 1_700_000_000.0


def _feed(al: Aligner, nodes, seconds: int, lag: dict[str, float], *, period=0.1, jitter=0.0003, err=0.0005,
          synced=True, skip: dict[str, set[int]] | None = None, nbytes: dict[str, float] | None = None, seed=3):
    """Scripted summaries (invented values): a collective every ``period`` seconds."""
    rng = np.random.default_rng(seed)
    for i in range(seconds):
        for n in nodes:
            t = T0 + i + 1
            ks = range(int(i / period), int((i + 1) / period))
            bursts = [(T0 + k * period + lag.get(n, 0.0) + rng.uniform(-jitter, jitter), (nbytes or {}).get(n, 1e6))
                      for k in ks if k not in (skip or {}).get(n, set())]
            al.observe(n, t, synced, err if synced else None, bursts)


def _aligner(**kw) -> Aligner:
    args = dict(window=10.0, max_skew=0.25, unsynced_clock_error=0.05, min_fraction=0.5, stale_after=5.0,
                horizon=600.0)
    args.update(kw)
    return Aligner(**args)


NODES = ("a", "b", "c", "d")


def test_late_node_is_last_with_its_lag_and_the_spread() -> None:
    al = _aligner()
    _feed(al, NODES, 12, {"c": 0.008})
    out = al.derive(T0 + 12, {"g": NODES}, {})
    assert out["c"]["ctl_arrival_last_share_ratio"] == 1.0
    assert out["c"]["ctl_arrival_lag_seconds"] == pytest.approx(0.008, abs=0.0006)
    # 8 ms late, clocks good to 0.5 ms each: 7 ms of it is beyond doubt
    assert out["c"]["ctl_arrival_lag_excess_seconds"] == pytest.approx(0.007, abs=0.0006)
    for n in ("a", "b", "d"):
        assert out[n]["ctl_arrival_last_share_ratio"] == 0.0
        assert out[n]["ctl_arrival_lag_excess_seconds"] == 0.0
    assert {out[n]["ctl_step_spread_seconds"] for n in NODES} == {out["a"]["ctl_step_spread_seconds"]}
    assert out["a"]["ctl_step_spread_seconds"] == pytest.approx(0.008, abs=0.0006)
    assert out["a"]["ctl_aligned_steps"] >= 95  # 10 s window at 10 Hz
    assert al.reports["g"].last_share["c"] == 1.0


def test_no_straggler_means_no_node_is_consistently_last() -> None:
    al = _aligner()
    _feed(al, NODES, 12, {})
    out = al.derive(T0 + 12, {"g": NODES}, {})
    assert max(out[n]["ctl_arrival_last_share_ratio"] for n in NODES) < 0.5
    assert max(out[n]["ctl_arrival_lag_excess_seconds"] for n in NODES) == 0.0


def test_clock_error_widens_the_tolerance() -> None:
    """The same 8 ms from a node whose clock is only good to 10 ms is not blamed on it."""
    al = _aligner()
    _feed(al, NODES, 12, {"c": 0.008}, err=0.010)
    out = al.derive(T0 + 12, {"g": NODES}, {})
    assert out["c"]["ctl_arrival_lag_seconds"] == pytest.approx(0.008, abs=0.0006)  # measured, reported
    assert out["c"]["ctl_arrival_lag_excess_seconds"] == 0.0  # but within clock error
    assert out["c"]["ctl_arrival_last_share_ratio"] == 0.0
    assert out["c"]["ctl_clock_error_seconds"] == 0.010


def test_unsynced_clocks_are_not_aligned_at_all_and_the_group_says_why() -> None:
    """Unsynced nodes are assumed off by the configured worst case (50 ms): more than the step
    matching window, so steps would land in the wrong step on a peer and every member would look
    late, early or missing. Nothing is measured; the report says why."""
    al = _aligner(unsynced_clock_error=0.05)
    _feed(al, NODES, 12, {"c": 0.030}, synced=False)
    out = al.derive(T0 + 12, {"g": NODES}, {})
    assert out["c"]["ctl_clock_error_seconds"] == 0.05 and out["c"]["ctl_aligned_steps"] == 0.0
    for n in NODES:
        assert not {"ctl_arrival_lag_excess_seconds", "ctl_step_missing_ratio",
                    "ctl_collective_bytes_dev_ratio"} & set(out[n])
    assert "clock error" in al.reports["g"].unaligned


def test_one_unsynced_member_stops_its_groups_alignment_but_not_anothers() -> None:
    al = _aligner(unsynced_clock_error=0.05)
    _feed(al, NODES, 12, {"c": 0.030}, synced=True)
    _feed(al, ("e", "f"), 12, {}, synced=False)
    out = al.derive(T0 + 12, {"g": NODES, "h": ("e", "f")}, {})
    assert out["c"]["ctl_arrival_lag_excess_seconds"] > 0.02 and not al.reports["g"].unaligned
    assert "ctl_arrival_lag_seconds" not in out["e"] and al.reports["h"].unaligned


def test_early_stop_node_misses_steps() -> None:
    al = _aligner()
    _feed(al, NODES, 12, {}, skip={"d": set(range(0, 200, 2))})  # d sends only every other step
    out = al.derive(T0 + 12, {"g": NODES}, {})
    assert out["d"]["ctl_step_missing_ratio"] == pytest.approx(0.5, abs=0.05)
    assert out["a"]["ctl_step_missing_ratio"] == 0.0


def test_bytes_skew_per_collective() -> None:
    al = _aligner()
    _feed(al, NODES, 12, {}, nbytes={"a": 1e6, "b": 1e6, "c": 1e6, "d": 2e6})
    out = al.derive(T0 + 12, {"g": NODES}, {})
    assert out["d"]["ctl_collective_bytes_dev_ratio"] == pytest.approx(1.0)
    assert out["a"]["ctl_collective_bytes_dev_ratio"] == 0.0


def test_a_pair_member_that_skips_steps_is_missing_in_them() -> None:
    """Two-node TP groups: a step where only the partner sent counts (quorum 1, not 2)."""
    al = _aligner()
    _feed(al, ("a", "b"), 12, {}, skip={"b": set(range(0, 200, 3))})  # b skips every third step
    out = al.derive(T0 + 12, {"g": ("a", "b")}, {})
    assert out["b"]["ctl_step_missing_ratio"] == pytest.approx(1 / 3, abs=0.05)
    assert out["a"]["ctl_step_missing_ratio"] == 0.0


def test_healthy_pair_misses_nothing() -> None:
    al = _aligner()
    _feed(al, ("a", "b"), 12, {"b": 0.008})  # a straggler is late, not missing
    out = al.derive(T0 + 12, {"g": ("a", "b")}, {})
    assert out["a"]["ctl_step_missing_ratio"] == 0.0
    assert out["b"]["ctl_step_missing_ratio"] == 0.0


def test_bytes_reference_from_other_groups_names_the_pair_member_that_is_off() -> None:
    """Inside a pair both members deviate (b sends 60 %, so a receives 60 %): ±25 % from the
    pair's median each. Against the other pair of the same size only b is off."""
    al = _aligner()
    _feed(al, ("a", "b"), 12, {}, nbytes={"a": 1e6, "b": 0.6e6})
    _feed(al, ("c", "d"), 12, {}, nbytes={"c": 1e6, "d": 1e6}, seed=4)
    _feed(al, ("e", "f", "g"), 12, {}, nbytes={"e": 5e6, "f": 5e6, "g": 5e6}, seed=5)  # another size: not a reference
    out = al.derive(T0 + 12, {"p": ("a", "b"), "q": ("c", "d"), "r": ("e", "f", "g")}, {})
    assert out["a"]["ctl_collective_bytes_dev_ratio"] == pytest.approx(0.25)
    assert out["b"]["ctl_collective_bytes_dev_ratio"] == pytest.approx(-0.25)
    # rates over the window: a burst more or less at its edges (jitter) moves them by 1 %
    assert out["a"]["ctl_collective_bytes_ref_ratio"] == pytest.approx(1.0, rel=0.02)
    assert out["b"]["ctl_collective_bytes_ref_ratio"] == pytest.approx(0.6, rel=0.02)
    assert out["c"]["ctl_collective_bytes_ref_ratio"] == pytest.approx(1.25, rel=0.02)  # against the mixed pair
    assert "ctl_collective_bytes_ref_ratio" not in out["e"]


def test_no_bytes_reference_without_bytes_or_other_groups() -> None:
    al = _aligner()
    _feed(al, ("a", "b"), 12, {}, nbytes={"a": 1e6, "b": 0.6e6})
    _feed(al, ("c", "d"), 12, {}, nbytes={"c": float("nan"), "d": float("nan")}, seed=4)
    out = al.derive(T0 + 12, {"p": ("a", "b"), "q": ("c", "d")}, {})
    assert not any("ctl_collective_bytes_ref_ratio" in v for v in out.values())
    out = al.derive(T0 + 12, {"p": ("a", "b")}, {})
    assert not any("ctl_collective_bytes_ref_ratio" in v for v in out.values())


def test_stale_node_leaves_the_group_and_its_age_is_reported() -> None:
    al = _aligner()
    _feed(al, NODES, 12, {"c": 0.008})
    _feed(al, ("a", "b", "d"), 8, {}, seed=4)  # c stops reporting; the others go on
    for n in ("a", "b", "d"):
        al.clocks[n].last_summary_t += 12
    out = al.derive(T0 + 20, {"g": NODES}, {})
    assert out["c"]["ctl_summary_age_seconds"] == pytest.approx(8.0)
    assert "ctl_arrival_lag_seconds" not in out["c"]


def test_settled_watermark_ignores_a_peer_whose_summary_is_still_in_flight() -> None:
    al = _aligner()
    _feed(al, NODES, 12, {})
    _feed(al, ("a", "b", "c"), 1, {}, seed=9)  # a 13th interval from three nodes only...
    for n in ("a", "b", "c"):
        al.clocks[n].last_summary_t = T0 + 13
    out = al.derive(T0 + 13, {"g": NODES}, {})
    assert out["d"]["ctl_step_missing_ratio"] == 0.0  # ...is not counted against d yet


def test_pp_gap_between_stages() -> None:
    al = _aligner()
    # stage 0 = TP group g0 (a, b), stage 1 = node x: x's steps start 30 ms after g0's
    _feed(al, ("a", "b"), 12, {})
    _feed(al, ("x",), 12, {"x": 0.030})
    out = al.derive(T0 + 12, {"g0": ("a", "b")}, {"pp": [("a", "b"), ("x",)]})
    assert out["x"]["ctl_pp_gap_seconds"] == pytest.approx(0.030, abs=0.001)
    assert out["x"]["ctl_pp_gap_ratio"] == pytest.approx(1.0)
    # the upstream stage gets the same gap: from the hand-off times alone either side may be slow
    assert out["a"]["ctl_pp_gap_seconds"] == out["x"]["ctl_pp_gap_seconds"]
    assert out["b"]["ctl_pp_gap_ratio"] == out["x"]["ctl_pp_gap_ratio"]


def test_pp_gap_of_a_middle_stage_is_the_longer_of_its_two_hand_offs() -> None:
    al = _aligner()
    _feed(al, ("s0",), 12, {})
    _feed(al, ("s1",), 12, {"s1": 0.002}, seed=4)
    _feed(al, ("s2",), 12, {"s2": 0.032}, seed=5)  # the 1->2 hand-off takes 30 ms
    out = al.derive(T0 + 12, {}, {"pp": [("s0",), ("s1",), ("s2",)]})
    assert out["s0"]["ctl_pp_gap_seconds"] == pytest.approx(0.002, abs=0.001)
    assert out["s1"]["ctl_pp_gap_seconds"] == pytest.approx(0.030, abs=0.001)
    assert out["s2"]["ctl_pp_gap_seconds"] == pytest.approx(0.030, abs=0.001)


def test_alignment_primitives() -> None:
    ev = {"a": np.array([0.0, 0.1, 0.2]), "b": np.array([0.01, 0.11, 0.21])}
    assert estimate_period(ev) == pytest.approx(0.1)
    steps = align(ev, None, 0.05)
    assert [sorted(s.members) for s in steps] == [["a", "b"]] * 3
    assert stage_gap(np.array([0.0, 1.0]), np.array([0.3, 1.2])) == pytest.approx(0.25)
    assert np.isnan(stage_gap(np.array([]), np.array([1.0])))


def test_every_derived_signal_is_catalogued_and_every_catalogued_one_is_derived() -> None:
    al = _aligner()
    _feed(al, NODES, 12, {"c": 0.008}, skip={"d": {5}})
    _feed(al, ("x",), 12, {"x": 0.03})
    _feed(al, ("e", "f", "g", "h"), 12, {}, seed=5)  # a second group of four: the bytes reference
    out = al.derive(T0 + 12, {"g": NODES, "g2": ("e", "f", "g", "h")}, {"pp": [NODES, ("x",)]})
    emitted = {s for v in out.values() for s in v}
    assert emitted == NAMES
    cat = full_catalogue()
    for spec in CATALOGUE:
        assert cat[spec.name].collector == "controller" and spec.scope.value == "node"


def test_derive_steps_pauses_after_each_group_and_returns_what_derive_does() -> None:
    al, ref = _aligner(), _aligner()
    for a in (al, ref):
        _feed(a, NODES, 12, {"c": 0.008})
        _feed(a, ("x", "y"), 12, {})
    tp = {"g": NODES, "h": ("x", "y"), "empty": ("nobody",)}
    steps = al.derive_steps(T0 + 12, tp, {})
    paused = []
    while True:
        try:
            paused.append(next(steps))
        except StopIteration as done:
            out = done.value
            break
    assert paused == ["g", "h"]
    assert out == ref.derive(T0 + 12, tp, {})


def test_estimate_period_is_the_lower_median_of_per_node_medians() -> None:
    """The one-sort estimate equals the per-node np.median definition exactly, odd and even
    gap counts, repeated gaps, short logs and NaN starts included."""
    import numpy as np

    from skewd.controller.align import estimate_period

    def reference(events):
        gaps = sorted(float(np.median(np.diff(v))) for v in events.values() if len(v) >= 3)
        if not gaps or any(g != g for g in gaps):
            return float("nan")
        return gaps[(len(gaps) - 1) // 2]

    rng = np.random.default_rng(5)
    for _ in range(500):
        events = {}
        for j in range(int(rng.integers(0, 9))):
            n = int(rng.integers(0, 25))
            v = (np.sort(1.7e9 + rng.random(n) * 30) if rng.random() < 0.6
                 else 1.7e9 + np.cumsum(rng.choice([0.05, 0.05, 0.1, 0.0], n)))
            if n and rng.random() < 0.05:
                v[int(rng.integers(0, n))] = np.nan
            events[f"n{j}"] = v
        got, want = estimate_period(events), reference(events)
        assert got == want or (got != got and want != want), (got, want)


def test_a_pair_member_that_sits_out_most_steps_is_not_late_in_those_it_takes() -> None:
    """A node that skips four steps in five (EW-9) spaces its bursts five periods apart. The
    group's period must stay its partner's (the collective's), or the matching window (half a
    period) outgrows a step and the skipper's on-time burst joins its partner's previous step,
    a period "late": ew9 seed 101 named the early-stopping node an EW-1 straggler that way."""
    al = _aligner()
    skip = {"b": {k for k in range(1000) if k % 5}}
    _feed(al, ("a", "b"), 12, {}, period=0.027, jitter=0.00002, skip=skip)
    out = al.derive(T0 + 12, {"g": ("a", "b")}, {})
    assert out["b"]["ctl_step_missing_ratio"] == pytest.approx(4 / 5, abs=0.05)
    assert out["b"]["ctl_arrival_lag_seconds"] < 0.001
    assert out["b"]["ctl_arrival_last_share_ratio"] < 0.1


def test_pp_stages_marks_every_node_of_a_pipeline_and_no_other() -> None:
    """EW-2-pp-stage-straggler compares a stage with its own pipeline only: the nodes of a
    pipeline carry its stage count, a node outside every pipeline (a TP group's) carries none,
    even before any hand-off was timed."""
    al = _aligner()
    _feed(al, ("a", "b", "x", "y"), 12, {})
    out = al.derive(T0 + 12, {"g0": ("a", "b")}, {"pp": [("x",), ("y",)]})
    assert out["x"]["ctl_pp_stages"] == 2.0 and out["y"]["ctl_pp_stages"] == 2.0
    assert "ctl_pp_stages" not in out["a"] and "ctl_pp_stages" not in out["b"]
