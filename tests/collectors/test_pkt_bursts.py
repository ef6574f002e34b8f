"""The pkt tracker lists every burst of what a port sent (``pkt_burst_ended_*``), not only the
latest per collection: each burst exactly once, with all its bytes, wherever the collection
boundaries fall (a burst open at the end of one collection is listed once, later), stamped so
that the stamps never go back, and at most ``max_listed_bursts`` per collection (the rest
counted in ``pkt_bursts_unlisted_total``)."""
from __future__ import annotations

import numpy as np
import pytest

from skewd.agent.pipeline import Pipeline, by_time
from skewd.collectors.pkt.catalogue import CATALOGUE, NAMES
from skewd.collectors.pkt.features import NS, FlowTracker
from skewd.collectors.pkt.frames import DIR_IN, DIR_OUT
from skewd.collectors.pkt.parse import Packets
from skewd.collectors.pkt.samples import ENDED_BYTES, ENDED_START, to_batch
from skewd.model import Catalogue
from skewd.rules.engine import RuleSet
from skewd.rules.store import WindowStore
from tests.pkt_packets import udp_packets

T0 = 1_700_000_000  # synthetic epoch start (invented)


def packets(ts: np.ndarray, wl: np.ndarray, direction: np.ndarray | None = None) -> Packets:
    """UDP packets of one flow (RoCE port) at ``ts`` (ns), ``wl`` wire bytes."""
    return udp_packets(ts, wl, payload=100, direction=direction)


def steps(rng: np.random.Generator, n: int = 300, per: int = 25) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode-step-like traffic: ``n`` bursts 20-60 ms apart, ``per`` packets 40 us apart.
    Returns (packet times ns, wire bytes, burst start per burst)."""
    starts = T0 * NS + np.cumsum(rng.uniform(20e6, 60e6, n)).astype(np.int64)
    ts = (starts[:, None] + np.arange(per)[None, :] * 40_000).ravel()
    return ts, rng.integers(64, 4200, len(ts)), starts


def run(pk: Packets, bounds: np.ndarray, t_bounds: np.ndarray, **kw) -> tuple[list, list, int]:
    """Feed packets [bounds[k], bounds[k+1]) as collection k ending at t_bounds[k+1] (ns)."""
    tr = FlowTracker(0.001, **kw)
    listed, stamps, unlisted = [], [], 0
    for k in range(len(bounds) - 1):
        f = tr.update(pk.take(np.arange(bounds[k], bounds[k + 1])), t_bounds[k] / NS, t_bounds[k + 1] / NS, ["eth1"])
        (p,) = f.ports
        assert len(p.ended_start) <= tr.max_listed_bursts
        listed += list(zip(p.ended_start.tolist(), p.ended_bytes.tolist()))
        stamps += p.ended_stamp.tolist()
        unlisted = p.bursts_unlisted_total
    return listed, stamps, unlisted


def cuts_between(ts: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Collection ends just before packets ``idx`` (half way to the previous packet)."""
    return (ts[idx - 1] + ts[idx]) // 2


def test_every_burst_is_listed_once_with_its_bytes_wherever_collections_end() -> None:
    rng = np.random.default_rng(5)
    ts, wl, starts = steps(rng, 200)  # within the default cap even as one collection
    pk = packets(ts, wl)
    truth = [(int(s), int(b)) for s, b in zip(starts, wl.reshape(len(starts), -1).sum(1))]
    end = ts[-1] + NS // 2  # the port quiet for 0.5 s at the end: the last burst ends too
    one, stamps1, _ = run(pk, np.array([0, len(ts)]), np.array([ts[0] - 1, end]))
    assert one == truth
    # 1 s collections (a dozen bursts open at a boundary), then cuts inside bursts and gaps
    for cut in (np.flatnonzero(np.diff(ts // NS)) + 1, np.sort(rng.choice(np.arange(1, len(ts)), 80, replace=False))):
        bounds = np.r_[0, cut, len(ts)]
        t_b = np.r_[ts[0] - 1, cuts_between(ts, cut), end]
        listed, stamps, unlisted = run(pk, bounds, t_b)
        assert listed == truth and unlisted == 0
        assert np.all(np.diff(stamps) > 0)  # stamps never go back: the store keeps them all
    # a burst is stamped with the first packet after it (the next burst's start)
    # (the last with the collection end that found the port quiet; t1 is float seconds)
    assert stamps1[:-1] == [s for s, _ in truth[1:]] and abs(stamps1[-1] - end) < 1000


def test_received_packets_make_no_listed_burst() -> None:
    """A straggler's receive side starts with its peers' sends: only what the host sent counts."""
    rng = np.random.default_rng(2)
    ts, wl, starts = steps(rng, 40)
    d = np.full(len(ts), DIR_OUT)
    d.reshape(len(starts), -1)[:, :3] = DIR_IN  # the peers' first packets arrive before ours leave
    early = np.r_[ts[0] - 5_000_000, ts]  # and one stray received packet on its own
    pk = packets(early, np.r_[100, wl], np.r_[DIR_IN, d])
    listed, _, _ = run(pk, np.array([0, len(early)]), np.array([early[0] - 1, ts[-1] + NS]))
    sent_start = starts + 3 * 40_000
    assert [s for s, _ in listed] == sent_start.tolist()
    assert [b for _, b in listed] == wl.reshape(len(starts), -1)[:, 3:].sum(1).tolist()


def test_open_burst_waits_for_quiet_plus_settle() -> None:
    ts = T0 * NS + np.arange(10) * 100_000  # one 1 ms burst
    pk = packets(ts, np.full(10, 1000))
    tr = FlowTracker(0.001, burst_settle=0.1)
    f = tr.update(pk, T0, (ts[-1] + 50_000_000) / NS, ["eth1"])  # 50 ms quiet: may still grow
    assert len(f.ports[0].ended_start) == 0
    empty = pk.take(np.arange(0))
    t_end = ts[-1] + 200_000_000
    f = tr.update(empty, (ts[-1] + 50_000_000) / NS, t_end / NS, ["eth1"])
    assert f.ports[0].ended_start.tolist() == [ts[0]] and f.ports[0].ended_bytes.tolist() == [10_000]
    assert abs(int(f.ports[0].ended_stamp[0]) - t_end) < 1000
    f = tr.update(empty, t_end / NS, t_end / NS + 1, ["eth1"])
    assert len(f.ports[0].ended_start) == 0  # listed once


def test_cap_per_collection_is_counted() -> None:
    rng = np.random.default_rng(9)
    ts, wl, starts = steps(rng, 60, per=4)
    pk = packets(ts, wl)
    cut = np.flatnonzero(np.diff(ts // NS)) + 1  # 1 s collections, ~25 bursts each
    bounds = np.r_[0, cut, len(ts)]
    listed, _, unlisted = run(pk, bounds, np.r_[ts[0] - 1, cuts_between(ts, cut), ts[-1] + NS], max_listed_bursts=5)
    assert len(listed) == 5 * len(bounds[:-1]) and unlisted == len(starts) - len(listed)
    assert set(s for s, _ in listed) <= set(starts.tolist())
    f = FlowTracker(0.001, max_listed_bursts=5).update(pk, T0, ts[-1] / NS + 1, ["eth1"])
    b = to_batch(f, "n1", ts[-1] / NS + 1)
    assert (b.signal == ENDED_START).sum() == 5
    assert b.value[b.signal == "pkt_bursts_unlisted_total"].tolist() == [len(starts) - 5]
    with pytest.raises(ValueError):
        FlowTracker(0.001, max_listed_bursts=0)


def test_samples_carry_their_own_stamps_and_reach_the_store() -> None:
    assert {ENDED_START, ENDED_BYTES, "pkt_bursts_unlisted_total"} <= NAMES
    rng = np.random.default_rng(4)
    ts, wl, starts = steps(rng, 30)
    t1 = ts[-1] / NS + 1
    f = FlowTracker(0.001).update(packets(ts, wl), T0, t1, ["eth1"])
    b = to_batch(f, "n1", t1)
    m = b.signal == ENDED_START
    assert b.value[m].tolist() == (starts / NS).tolist()
    assert b.t[m].tolist() == np.r_[starts[1:] / NS, t1].tolist()
    assert b.value[b.signal == ENDED_BYTES].tolist() == wl.reshape(len(starts), -1).sum(1).astype(float).tolist()
    assert (b.t[~np.isin(b.signal, [ENDED_START, ENDED_BYTES])] == t1).all()
    # the agent splits the batch by timestamp; the store ends up as with the whole batch
    cat = Catalogue(CATALOGUE)
    parts = by_time(b)
    assert len(parts) == len(starts) and all((p.t == p.t[0]).all() for p in parts)
    whole = WindowStore(cat)
    whole.ingest(b)
    pipe = Pipeline(cat, RuleSet([]), node="n1")
    pipe.ingest(b)
    for sig in (ENDED_START, ENDED_BYTES, "pkt_packets_total"):
        a, w = pipe.store.series(sig, "n1", "eth1"), whole.series(sig, "n1", "eth1")
        assert a[0].tolist() == w[0].tolist() and a[1].tolist() == w[1].tolist()
    assert pipe.store.dropped_out_of_order == 0
