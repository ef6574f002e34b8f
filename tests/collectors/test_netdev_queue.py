"""netdev's view of egress queues: shaping rates (recorded tbf/htb dumps), the sampled queue's
peak, mean, busy share and delay (pure tracker), and the sampler's lean decoder."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from skewd.collectors.netdev import COLLECTOR as Netdev
from skewd.collectors.netdev import parse, rtnl
from skewd.collectors.netdev.backlog import QueueTracker, queue_samples
from skewd.collectors.netdev.collector import RecordedNetlink, RecordedWire
from skewd.model import SampleBatch

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "netdev"
#: tbf 300mbit, tbf 40gbit (TCA_TBF_RATE64), htb with two top-level classes, noqueue (record.py --shapers)
SHAPERS = FIX / "veth-shapers-wire-linux-6.18"
WIRE = [FIX / "veth-tbf-wire-linux-6.18", FIX / "vm-virtio-wire-linux-6.18", SHAPERS]


def values(batch: SampleBatch) -> dict[tuple[str, str], float]:
    return {(e, s): v for _, _, e, s, v in batch.rows()}


# -- shaping rate ---------------------------------------------------------------------------------

def test_shaping_rates_of_recorded_tbf_and_htb_roots() -> None:
    v = values(Netdev("n", {}, sys_root=SHAPERS / "sys", source=RecordedWire(SHAPERS)).collect(1.0))
    assert v[("skwtbf", "netdev_qdisc_rate_bytes")] == 300e6 / 8  # tc's 300mbit, in bytes/s
    # 40 Gbit/s does not fit the u32 bytes/s of tc_tbf_qopt (the kernel sends 0xffffffff there)
    # and comes in TCA_TBF_RATE64
    assert v[("skwtbf64", "netdev_qdisc_rate_bytes")] == 40e9 / 8
    # htb: top-level classes 1:1 (ceil 200mbit) and 1:2 (ceil 50mbit); the child 1:10 is inside 1:1
    assert v[("skwhtb", "netdev_qdisc_rate_bytes")] == (200e6 + 50e6) / 8
    assert ("skwnoq", "netdev_qdisc_rate_bytes") not in v  # unshaped: absent, not 0
    assert v[("skwnoq", "netdev_qdisc_busy_ratio")] == 0


def test_shaping_rates_agree_with_pyroute2s_decoding_of_the_same_bytes() -> None:
    ours = values(Netdev("n", {}, sys_root=SHAPERS / "sys", source=RecordedWire(SHAPERS)).collect(1.0))
    theirs = values(Netdev("n", {}, sys_root=SHAPERS / "sys", source=RecordedNetlink(SHAPERS)).collect(1.0))
    # pyroute2 0.9 does not know TCA_TBF_RATE64 (it shows attribute 4 as UNKNOWN) and so reads
    # the saturated u32: the one place the two differ, and ours is right
    assert theirs.pop(("skwtbf64", "netdev_qdisc_rate_bytes")) == 0xFFFFFFFF
    assert ours.pop(("skwtbf64", "netdev_qdisc_rate_bytes")) == 5e9
    assert ours == theirs


def test_htb_rate_counts_top_level_classes_of_that_interface_only() -> None:
    classes = json.loads((SHAPERS / "classes.json").read_text())
    root = {"index": classes[0]["index"], "parent": parse.TC_H_ROOT, "attrs": [["TCA_KIND", "htb"]]}
    assert parse.shaping_rate(root, classes) == 31.25e6
    other = dict(root, index=root["index"] + 1)
    assert parse.shaping_rate(other, classes) is None  # another interface's classes do not count
    assert parse.shaping_rate(root, []) is None  # htb without classes shapes nothing we know of


@pytest.mark.parametrize("d", WIRE, ids=lambda d: d.name)
def test_lean_queue_decoder_agrees_with_the_full_decoder(d: Path) -> None:
    """The sampler reads only (backlog, qlen, drops, sent bytes) from each answer; on every
    recorded qdisc message that must be what the collector's full decode says."""
    msgs, _ = rtnl.messages((d / "qdiscs.nl").read_bytes(), None)
    assert msgs
    for t, payload in msgs:
        full = rtnl.decode_qdisc(payload)
        st2 = parse.attr_map(parse.attr_map(full)["TCA_STATS2"])
        q, b = st2["TCA_STATS_QUEUE"], st2["TCA_STATS_BASIC"]
        assert rtnl.queue_stats(payload) == (q["backlog"], q["qlen"], q["drops"], b["bytes"], q["overlimits"])


def test_answers_split_a_datagram_and_report_errors_by_sequence_number() -> None:
    data = (SHAPERS / "qdiscs.nl").read_bytes()
    got = list(rtnl.answers(data))
    assert [m[0] for m in got[:-1]] == [rtnl.RTM_NEWQDISC] * (len(got) - 1)
    err = rtnl._NLMSG.pack(36, rtnl.NLMSG_ERROR, 0, 77, 0) + (-19).to_bytes(4, "little", signed=True) + b"\0" * 16
    (mtype, seq, errno_, _), = rtnl.answers(err)
    assert (mtype, seq, errno_) == (rtnl.NLMSG_ERROR, 77, 19)  # ENODEV: the interface went away


# -- the sampled queue -----------------------------------------------------------------------------

def lockstep(tracker: QueueTracker, seconds: float, hz: float, period: float, busy: float, peak: float,
             drain: float, rng: random.Random, t0: float = 0.0) -> float:
    """Feed samples of a queue that rises to ``peak`` at the start of every step and drains
    linearly over ``busy`` of the step; the qdisc sends ``drain`` bytes/s while it stands."""
    t, sent = t0, 0.0
    while t < t0 + seconds:
        t += rng.uniform(0.5, 1.5) / hz
        phase = (t % period) / period
        backlog = peak * (1 - phase / busy) if phase < busy else 0.0
        sent = drain * busy * period * (t // period) + drain * period * min(phase, busy)
        tracker.add(t, backlog, sent)
    return t


def test_a_queue_that_fills_every_step_reads_its_peak_busy_share_mean_and_delay() -> None:
    """A 300 Mbit/s shaper's queue under lock-step traffic: 200 kB at the start of each 115 ms
    step, drained in 70 % of it (the real lab's picture). 20 samples a second at jittered
    instants see what a once-a-second dump cannot."""
    rng = random.Random(7)
    tr = QueueTracker(1 / 20)
    lockstep(tr, 1.0, 20, 0.115, 0.7, 200e3, 37.5e6, rng, t0=100.0)
    tr.take()  # the first window has no prior sample; judge the steady ones
    peaks, busy, means, delays = [], [], [], []
    for k in range(30):
        lockstep(tr, 1.0, 20, 0.115, 0.7, 200e3, 37.5e6, rng, t0=101.0 + k)
        s = {x.signal: x.value for x in queue_samples("eth0", tr.take(), 37.5e6)}
        peaks.append(s["netdev_qdisc_backlog_max_bytes"])
        busy.append(s["netdev_qdisc_busy_ratio"])
        means.append(s["netdev_qdisc_backlog_mean_bytes"])
        delays.append(s["netdev_qdisc_delay_max_seconds"])
    med = sorted(peaks)[15]
    assert 150e3 < med <= 200e3  # the random phases of ~20 samples reach near the peak
    assert 0.6 < sum(busy) / 30 < 0.8  # time-weighted: the true busy share is 0.7
    assert 55e3 < sum(means) / 30 < 85e3  # a linear drain over 0.7 of the step: 0.35 x 200 kB
    assert 0.004 < sorted(delays)[15] <= 200e3 / 37.5e6 + 1e-9


def test_samples_are_weighted_by_the_time_they_stand_for() -> None:
    tr = QueueTracker(0.05, max_weight=1.0)
    tr.add(0.0, 0.0, 0.0)
    tr.take()
    tr.add(0.9, 1000.0, 0.0)  # 0.9 s since the last sample: this queue stood for most of it
    tr.add(1.0, 0.0, 0.0)
    w = tr.take()
    assert w.busy_ratio == pytest.approx(0.9)
    assert w.mean_backlog == pytest.approx(900.0)


def test_a_starved_sampler_gap_is_capped() -> None:
    tr = QueueTracker(0.05, max_weight=1.0)
    tr.add(0.0, 0.0, 0.0)
    tr.add(30.0, 5000.0, 0.0)  # the thread did not run for 30 s: the sample counts for 1 s only
    tr.add(30.5, 0.0, 0.0)
    w = tr.take()
    assert w.time == pytest.approx(0.05 + 1.0 + 0.5)
    assert w.busy_time == pytest.approx(1.0)


def test_delay_uses_the_measured_drain_capped_by_the_nominal_rate() -> None:
    tr = QueueTracker(0.05, max_weight=1.0)
    tr.add(0.0, 0.0, 0.0)
    tr.add(0.5, 100e3, 10e6)  # 0.5 s of standing queue, 10 MB dequeued: 20 MB/s
    tr.add(1.0, 0.0, 10e6)
    w = tr.take()
    assert w.drain_rate(None) == pytest.approx(20e6)  # speed unknown (virtio): measured
    assert w.drain_rate(1.25e9) == pytest.approx(20e6)  # a 10 Gb/s NIC draining at 20 MB/s
    assert w.drain_rate(12.5e6) == pytest.approx(12.5e6)  # never faster than the shaper
    s = {x.signal: x.value for x in queue_samples("eth0", w, 1.25e9)}
    assert s["netdev_qdisc_delay_max_seconds"] == pytest.approx(100e3 / 20e6)


def test_a_queue_that_never_moves_waited_at_least_as_long_as_it_stood() -> None:
    tr = QueueTracker(0.05)
    tr.add(-0.05, 0.0, 5e6)
    tr.take()
    for k in range(20):
        tr.add(k * 0.05, 64e3, 5e6)  # nothing dequeued for a second: a stuck TX ring
    s = {x.signal: x.value for x in queue_samples("eth0", tr.take(), 1.25e9)}
    assert s["netdev_qdisc_busy_ratio"] == 1
    assert s["netdev_qdisc_delay_max_seconds"] == pytest.approx(1.0)


def test_no_queue_means_no_delay_and_a_replaced_qdisc_is_not_a_drain() -> None:
    tr = QueueTracker(0.05)
    tr.add(0.0, 0.0, 9e9)
    tr.add(0.05, 0.0, 100.0)  # the qdisc was replaced: its counter restarted
    w = tr.take()
    assert w.sent_bytes == 0
    s = {x.signal: x.value for x in queue_samples("eth0", w, None)}
    assert s == {"netdev_qdisc_backlog_max_bytes": 0, "netdev_qdisc_backlog_mean_bytes": 0,
                 "netdev_qdisc_busy_ratio": 0, "netdev_qdisc_delay_max_seconds": 0}
    assert queue_samples("eth0", tr.take(), None) == []  # no sample in the interval: nothing


@pytest.mark.parametrize("hz", ["20", -1, 500, True, None])
def test_bad_sample_rate_is_rejected(hz: object) -> None:
    with pytest.raises(ValueError, match="qdisc_sample_hz"):
        Netdev("n", {"qdisc_sample_hz": hz})


def test_dump_only_collector_still_reports_the_queue_it_saw() -> None:
    """With the sampler off (or replaying recordings) the collection's own dump is the only
    sample: the recorded tbf had 2084 bytes queued at that instant."""
    d = FIX / "veth-tbf-linux-6.18"
    c = Netdev("n", {"qdisc_sample_hz": 0}, sys_root=d / "sys", source=RecordedNetlink(d))
    v = values(c.collect(1.0))
    assert v[("skwva", "netdev_qdisc_backlog_max_bytes")] == 2084
    assert v[("skwva", "netdev_qdisc_busy_ratio")] == 1
    assert v[("skwva", "netdev_qdisc_rate_bytes")] == 125000  # tbf 1mbit
    assert c.sampler is None
