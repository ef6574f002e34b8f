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


def test_a_drops_fault_queue_is_a_fraction_of_the_step_burst() -> None:
    """The drops fault's pfifo holds 10-35 % of one step's burst (in 64 KiB GSO super-packets),
    2-16 packets: each step's burst overflows it whatever the message size. (A fixed 4-10
    packets held a whole 360 KB step of 4 ranks, and the fault dropped 2 packets in 150 s.)"""
    from skewd.lab.netlab.scenario import GSO_MAX_BYTES

    for seed, name in ((s, n) for s in range(1, 60) for n in ("drops", "ingress-drops")):
        p = make_plan(name, seed, duration_s=300)  # a ring node receives what it sends
        kind, n = p.queue.split()
        limit, burst = int(n), rank_wire_bytes_per_step(p.nodes, p.message_bytes) / GSO_MAX_BYTES
        assert kind == "limit" and 2 <= limit <= 16
        assert limit < burst, (seed, limit, burst)
        assert limit <= max(2, round(0.35 * burst)), (seed, limit, burst)
    small = make_plan("drops", 1, duration_s=300, overrides={"message_bytes": 360_000})
    assert int(small.queue.split()[1]) <= 3  # 8.2 super-packets per step


def test_qdisc_drops_are_read_from_tc_output_without_double_counting() -> None:
    """`tc -s qdisc show` as this kernel prints it for the drops fault (htb root over a pfifo
    leaf: the root repeats the leaf's drops)."""
    from skewd.lab.netlab.faults import qdisc_dropped

    out = ("qdisc htb 1: root refcnt 2 r2q 10 default 0x10 direct_packets_stat 0 direct_qlen 1000\n"
           " Sent 709369446 bytes 535220 pkt (dropped 533, overlimits 29132 requeues 0) \n"
           " backlog 0b 0p requeues 0\n"
           "qdisc pfifo 10: parent 1:10 limit 7p\n"
           " Sent 709369315 bytes 535219 pkt (dropped 533, overlimits 0 requeues 0) \n"
           " backlog 0b 0p requeues 0\n")
    assert qdisc_dropped(out) == 533
    assert qdisc_dropped("qdisc noqueue 0: root refcnt 2 \n Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0) \n") == 0
    assert qdisc_dropped("") == 0


def test_a_fault_duration_is_pinned_only_and_must_leave_time_to_recover() -> None:
    base = make_plan("drops", 5, duration_s=400)
    ended = make_plan("drops", 5, duration_s=400, overrides={"fault_duration_s": 120})
    assert base.fault_duration_s is None and ended.fault_duration_s == 120.0
    # the other draws of the seed are unchanged
    assert {k: v for k, v in ended.to_dict().items() if k not in ("fault_duration_s", "overrides")} == \
        {k: v for k, v in base.to_dict().items() if k not in ("fault_duration_s", "overrides")}
    with pytest.raises(ValueError, match="at least 60 s before"):
        make_plan("drops", 5, duration_s=300, overrides={"onset_s": 100, "fault_duration_s": 150})
    with pytest.raises(ValueError, match="at least 60 s before"):
        make_plan("healthy", 5, duration_s=300, overrides={"fault_duration_s": 60})


def test_clearing_a_straggler_stops_its_extra_compute(tmp_path) -> None:
    import json

    from skewd.lab.netlab.faults import clear

    ctl = tmp_path / "ctl.json"
    ctl.write_text(json.dumps({"extra_sleep_s": 0.02}))
    plan = make_plan("straggler", 3, duration_s=400, overrides={"fault_duration_s": 100})
    clear(plan, ns="unused", iface="eth0", ctl_file=ctl, cgroup_name="unused")
    assert json.loads(ctl.read_text()) == {"extra_sleep_s": 0.0}
