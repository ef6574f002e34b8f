"""The real-traffic lab's scenarios: a seed draws what a real cluster varies, within the ranges
the issue sets, reproducibly; pinned values win; the machine's load cap is recorded, not hidden."""
from __future__ import annotations

import pytest

from skewd.lab.netlab.faults import FAULTS
from skewd.lab.netlab.scenario import MAX_RANK_BYTES_PER_S, SCENARIOS, make_plan, rank_wire_bytes_per_step


def test_every_scenario_names_a_known_fault_with_expected_ids() -> None:
    assert "healthy" in SCENARIOS and SCENARIOS["healthy"].fault is None
    for s in SCENARIOS.values():
        if s.fault:
            assert FAULTS[s.fault].expected, s.name


def test_draws_are_reproducible_and_vary_across_seeds() -> None:
    a = [make_plan("straggler", seed).to_dict() for seed in range(1, 21)]
    b = [make_plan("straggler", seed).to_dict() for seed in range(1, 21)]
    assert a == b
    assert len({p["period_s"] for p in a}) == 20
    assert {p["dedicated_port"] for p in a} == {True, False}
    assert len({p["faulty_node"] for p in a}) == 4


def test_drawn_values_stay_in_the_ranges_a_cluster_varies() -> None:
    for name in SCENARIOS:
        for seed in range(1, 40):
            p = make_plan(name, seed, duration_s=300)
            assert 0.020 <= p.period_s <= 0.100
            assert 0.25e6 * 0.99 <= p.message_bytes <= 8e6 or p.message_capped
            # what this machine sustains: a bigger draw is shrunk, and the plan says so
            per_s = rank_wire_bytes_per_step(p.nodes, p.message_bytes) / p.period_s
            assert per_s <= MAX_RANK_BYTES_PER_S * 1.001
            if p.fault:
                assert 60 <= p.onset_s <= 0.45 * 300 and 0 <= p.faulty_node < p.nodes
            if p.fault in ("straggler", "straggler_cpu"):
                assert 0.010 <= p.lag_s <= 0.030
            else:
                assert p.lag_s is None


def test_overrides_pin_draws_and_unknown_ones_are_refused() -> None:
    p = make_plan("straggler", 7, duration_s=170, overrides={"period_s": 0.04, "message_bytes": 2_000_000,
                                                              "dedicated_port": False, "lag_s": 0.02,
                                                              "onset_s": 60, "faulty_node": 2})
    assert (p.period_s, p.message_bytes, p.dedicated_port, p.lag_s, p.onset_s, p.faulty_node) == \
        (0.04, 2_000_000, False, 0.02, 60.0, 2)
    with pytest.raises(KeyError, match="perod_s"):
        make_plan("straggler", 1, overrides={"perod_s": 0.04})
    with pytest.raises(ValueError, match="onset"):
        make_plan("straggler", 1, duration_s=100, overrides={"onset_s": 90})
    with pytest.raises(KeyError, match="unknown scenario"):
        make_plan("stragler", 1)
