"""The pkt tracker lists every silence of a port's collective traffic with how it ended
(``pkt_collective_silence_*``, collectors/pkt/collective.py): what straggler detection reads on
each node's own clock. A straggler's compute silences are longer and ended by its own send; its
peers' waits inside the collective are ended by data. ACKs, token streams, the agent's NATS
connection and peers' small notifications do not make or break silences."""
from __future__ import annotations

import numpy as np
import pytest

from skewd.collectors.pkt.catalogue import NAMES
from skewd.collectors.pkt.collective import CollectiveTracker
from skewd.collectors.pkt.features import NS, FlowTracker
from skewd.collectors.pkt.frames import DIR_IN, DIR_OUT
from skewd.collectors.pkt.samples import SILENCE, SILENCE_BY_SEND, SILENCE_SENT, to_batch
from tests.collective_traffic import collect, entries, node_packets
from tests.pkt_packets import udp_packets


def listing(pk, every: float = 1.0, phase: float = 0.3) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    e, n, k, b = [], [], [], []
    for _, f in collect(pk, every, phase):
        if not f.ports:  # before the first packet
            continue
        (p,) = f.ports
        s = p.silences
        e += (s.end_ns / NS).tolist()
        n += (s.length_ns / NS).tolist()
        k += s.by_send.tolist()
        b += s.sent_bytes.tolist()
    return np.array(e), np.array(n), np.array(k), np.array(b)


def test_a_stragglers_compute_silences_are_longer_and_its_peers_wait() -> None:
    rng = np.random.default_rng(3)
    e, fin = entries(rng, 4, 150, lag={2: 0.015})
    per_node = {}
    for node in range(4):
        end, length, by_send, _ = listing(node_packets(rng, e, fin, node))
        entry = by_send == 1
        # one compute silence per step, ended by the node's own send at its entry
        # (a healthy rank loses the steps it entered within ``react`` (2 ms) of a neighbour's
        # notification: with this traffic's exponential entry jitter (2 ms mean) about half; the
        # straggler, entering 15 ms after everybody, none)
        kept = (entry & (end > e[0, node] + 1e-4) & (end <= fin[-1])).sum()
        assert (0.95 if node == 2 else 0.35) * 149 <= kept <= 149, node
        # ...at its entry (stamped with that send)
        late = (end > e[0, 0] + 1.0) & (end <= fin[-1])  # around them the token stream is the heaviest
        x = end[entry & late]
        j = np.clip(np.searchsorted(e[:, node], x), 1, len(e) - 1)
        nearest = np.minimum(np.abs(e[j, node] - x), np.abs(e[j - 1, node] - x))
        assert (nearest < 2e-6).all(), node
        per_node[node] = (np.median(length[entry]), np.median(np.r_[0.0, length[~entry]][-100:]))
    strag, peers = per_node[2][0], [per_node[n][0] for n in (0, 1, 3)]
    assert strag - np.median(peers) == pytest.approx(0.015, abs=0.002)
    # the peers waited for the straggler's data: silences ended by data of about its lag
    for n in (0, 1, 3):
        end, length, by_send, _ = listing(node_packets(rng, e, fin, n))
        waits = length[by_send == 0]
        assert len(waits) >= 100 and np.median(waits) > 0.010, n
    end, length, by_send, _ = listing(node_packets(rng, e, fin, 2))
    assert (by_send == 0).sum() < 20  # the straggler hardly ever waits


def test_acks_token_streams_and_nats_on_the_port_change_nothing() -> None:
    rng = np.random.default_rng(4)
    e, fin = entries(rng, 3, 80, lag={1: 0.01})
    for node in range(3):
        plain = listing(node_packets(np.random.default_rng(9), e, fin, node, extra=False))
        busy = listing(node_packets(np.random.default_rng(9), e, fin, node, extra=True))
        # (before and after the collectives the busy port's heaviest connection is a token stream)
        p_in = (plain[0] > e[0, 0] + 2.0) & (plain[0] <= fin[-1])
        b_in = (busy[0] > e[0, 0] + 2.0) & (busy[0] <= fin[-1])
        for a, b in zip(plain, busy):
            assert np.array_equal(a[p_in], b[b_in]), node


def test_silences_are_the_same_wherever_collections_end() -> None:
    rng = np.random.default_rng(5)
    e, fin = entries(rng, 2, 100)
    pk = node_packets(rng, e, fin, 0)
    ref = listing(pk, 1.0, 0.3)
    for every, phase in ((0.5, 0.11), (2.0, 0.77), (0.1, 0.05)):
        got = listing(pk, every, phase)
        # the first seconds of the collectives set the connections' weights (before them the
        # token stream is the heaviest connection); from then on every silence is the same
        keep = ref[0] > e[0, 0] + 2.0
        keep_g = got[0] > e[0, 0] + 2.0
        for a, b in zip(ref, got):
            assert np.array_equal(a[keep], b[keep_g]), (every, phase)
    # bytes: every byte sent on the collective connections is counted once, before some silence
    sent = pk.payload[(pk.direction == DIR_OUT) & (pk.payload > 300)].sum()
    assert ref[3].sum() <= sent and ref[3].sum() > 0.9 * sent


def test_a_peers_notification_does_not_end_a_compute_silence_but_a_send_right_after_it_is_a_reaction() -> None:
    t = (1_700_000_000 + np.array([0.000, 0.0003, 0.0006,          # sent data (heavy connection)
                                   0.0200,                         # a 48-byte notification arrives
                                   0.0500, 0.0503,                 # the node sends 30 ms later: an entry
                                   0.0800,                         # a notification
                                   0.0802, 0.0805])) * NS          # a send 0.2 ms after it: a reaction
    pay = np.array([60000, 60000, 60000, 48, 60000, 60000, 48, 60000, 60000])
    d = np.array([DIR_OUT, DIR_OUT, DIR_OUT, DIR_IN, DIR_OUT, DIR_OUT, DIR_IN, DIR_OUT, DIR_OUT])
    out = d == DIR_OUT
    pk = udp_packets(t.astype(np.int64), pay + 66, dst=np.where(out, 2, 1), sport=np.where(out, 5000, 6000),
                     dport=np.where(out, 6000, 5000), direction=d, payload=pay)
    pk.src_lo[:] = np.where(out, 1, 2)
    f = FlowTracker(0.001).update(pk, 1_700_000_000, 1_700_000_001, ["eth0"])
    s = f.ports[0].silences
    assert (s.length_ns / 1e6).round(1).tolist() == [49.4, 29.9]
    assert s.by_send.tolist() == [1, 0]
    assert s.sent_bytes.tolist() == [180000, 120000]


def test_only_the_heavy_connections_count() -> None:
    tr = CollectiveTracker()
    conn = np.array([1, 1, 2, 2, 3], np.uint64)
    pay = np.array([5_000_000, 5_000_000, 2_000_000, 1, 40_000])
    ts = np.arange(5, dtype=np.int64) * 10_000_000
    d = np.full(5, DIR_OUT)
    s = tr.update(0, ts, d, pay, conn, np.full(5, -1), 1.0)
    assert s.connections == 2  # 10 MB and 2 MB connections; 40 kB is under a tenth of the heaviest
    assert s.length_ns.tolist() == [10_000_000, 10_000_000, 10_000_000]  # packets 1-3; 4 is light


def test_the_listing_is_capped_and_the_rest_counted() -> None:
    rng = np.random.default_rng(6)
    e, fin = entries(rng, 2, 200, compute=0.004, active=0.003)
    pk = node_packets(rng, e, fin, 0, extra=False)
    f = FlowTracker(0.001, max_listed_silences=5).update(pk, pk.ts_ns[0] / NS - 1, pk.ts_ns[-1] / NS + 1, ["eth0"])
    s = f.ports[0].silences
    assert len(s) == 5 and s.unlisted_total > 100
    b = to_batch(f, "n1", pk.ts_ns[-1] / NS + 1)
    assert b.value[b.signal == "pkt_collective_silences_unlisted_total"].tolist() == [s.unlisted_total]
    with pytest.raises(ValueError):
        FlowTracker(0.001, max_listed_silences=0)


def test_samples_are_catalogued_and_stamped_with_the_packet_that_ended_the_silence() -> None:
    rng = np.random.default_rng(7)
    e, fin = entries(rng, 2, 30)
    pk = node_packets(rng, e, fin, 1)
    t1 = pk.ts_ns[-1] / NS + 0.5
    f = FlowTracker(0.001).update(pk, pk.ts_ns[0] / NS - 0.5, t1, ["eth0"])
    b = to_batch(f, "n1", t1)
    assert {SILENCE, SILENCE_BY_SEND, SILENCE_SENT, "pkt_collective_connections"} <= set(b.signal.tolist()) <= NAMES
    s = f.ports[0].silences
    for sig in (SILENCE, SILENCE_BY_SEND, SILENCE_SENT):
        assert np.array_equal(b.t[b.signal == sig], s.end_ns / NS)


def test_a_capture_without_direction_lists_nothing() -> None:
    rng = np.random.default_rng(8)
    e, fin = entries(rng, 2, 30)
    pk = node_packets(rng, e, fin, 0)
    pk.direction[:] = 0
    f = FlowTracker(0.001).update(pk, pk.ts_ns[0] / NS - 0.5, pk.ts_ns[-1] / NS + 0.5, ["eth0"])
    assert len(f.ports[0].silences) == 0


def test_roce_directions_of_one_address_pair_are_one_connection() -> None:
    """A pipeline hand-off over RoCE: the receiving stage writes a 64-byte clear-to-send when it
    is ready (its own send, from its QP's UDP source port), the sender then writes 2 MB to port
    4791 from another source port. The receiver's clear-to-send ends its compute silence (the
    two directions are one connection, heavy), and the data that follows ends its wait."""
    T = 1_700_000_000
    t = np.array([0.0, 0.0001, 0.0002,   # data in (the previous hand-off)
                  0.0400,                # clear-to-send out, 40 ms later: computed 40 ms
                  0.0600, 0.0601])       # data in 20 ms later: waited 20 ms
    pay = np.array([700_000, 700_000, 600_000, 64, 1_000_000, 1_000_000])
    d = np.array([DIR_IN, DIR_IN, DIR_IN, DIR_OUT, DIR_IN, DIR_IN])
    out = d == DIR_OUT
    pk = udp_packets(((T + t) * NS).astype(np.int64), pay + 66, dst=np.where(out, 2, 1),
                     sport=np.where(out, 49152, 61000), dport=np.full(len(t), 4791), direction=d, payload=pay)
    pk.src_lo[:] = np.where(out, 1, 2)
    s = FlowTracker(0.001).update(pk, T, T + 1, ["eth1"]).ports[0].silences
    assert (s.length_ns / 1e6).round(1).tolist() == [39.8, 20.0]
    assert s.by_send.tolist() == [1, 0]
    assert s.connections == 1
