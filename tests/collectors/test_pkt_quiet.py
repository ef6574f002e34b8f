"""The pkt tracker's quiet-interval path (no packets, no tracked flow: an idle capture port)
gives exactly what the general path gives: same flow columns (names, order, dtypes), same port
figures, same samples, same state afterwards, over random traffic with idle stretches."""
from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pytest

from skewd.collectors.pkt.features import FLOW_COLUMNS, FlowTracker, IntervalFeatures
from skewd.collectors.pkt.frames import DIR_IN, DIR_OUT
from skewd.collectors.pkt.parse import Packets
from skewd.collectors.pkt.samples import to_batch

T0 = 1_700_000_000.0


def packets(rng: np.random.Generator, t0: float, t1: float, n: int, ports: int) -> Packets:
    p = Packets.alloc(n)
    p.ts_ns[:] = np.sort((rng.uniform(t0, t1, n) * 1e9).astype(np.int64))
    p.wirelen[:] = rng.integers(60, 1500, n)
    ip = rng.random(n) < 0.9  # a few non-IP frames (ARP and the like)
    p.decoded[:] = True
    p.outer_ip[:] = ip
    p.ipver[:] = np.where(ip, 4, 0)
    tcp = ip & (rng.random(n) < 0.5)
    p.proto[:] = np.where(ip, np.where(tcp, 6, 17), -1)
    p.src_lo[:] = np.where(ip, rng.integers(1, 4, n), 0).astype(np.uint64)
    p.dst_lo[:] = np.where(ip, rng.integers(1, 4, n), 0).astype(np.uint64)
    p.sport[:] = np.where(ip, rng.integers(1000, 1003, n), 0)
    p.dport[:] = np.where(ip, 80, 0)
    p.l4ok[:] = ip
    p.payload[:] = np.where(ip, rng.integers(0, 1400, n), 0)
    p.tcp_flags[:] = np.where(tcp, 0x18, -1)
    p.tcp_seq[:] = np.where(tcp, rng.integers(0, 1 << 32, n), 0)
    p.ecn[:] = np.where(ip, rng.integers(0, 4, n), 0)
    p.direction[:] = rng.choice([0, DIR_IN, DIR_OUT], n)
    p.iface[:] = rng.integers(0, ports, n)
    return p


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def same_value(a, b) -> bool:
    if isinstance(a, dict) or isinstance(b, dict):  # a nested dataclass (the port's silences)
        return isinstance(a, dict) and isinstance(b, dict) and list(a) == list(b) and all(
            same_value(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and same_array(a, b)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def assert_same(got: IntervalFeatures, ref: IntervalFeatures) -> None:
    assert (got.t0, got.t1, got.entities) == (ref.t0, ref.t1, ref.entities)
    assert list(got.flows) == list(ref.flows)
    for k in ref.flows:
        assert same_array(got.flows[k], ref.flows[k]), k
    assert len(got.ports) == len(ref.ports)
    for gp, rp in zip(got.ports, ref.ports):
        g, r = asdict(gp), asdict(rp)
        assert list(g) == list(r)
        for k in r:
            assert same_value(g[k], r[k]), (gp.name, k, g[k], r[k])


def assert_same_state(a: FlowTracker, b: FlowTracker) -> None:
    assert a.slots == b.slots and a.free == b.free and a.evicted == b.evicted and a.cap == b.cap
    for k in b.s:
        assert same_array(a.s[k], b.s[k]), k
    assert same_array(a.b_gap, b.b_gap)
    assert sorted(a.ports) == sorted(b.ports)
    for p in b.ports:
        assert vars(a.ports[p]).keys() == vars(b.ports[p]).keys()
        for k, v in vars(b.ports[p]).items():
            assert same_value(vars(a.ports[p])[k], v), (p, k)


def test_flow_columns_name_the_general_path_columns() -> None:
    tr = FlowTracker(0.001, flow_timeout=5.0)
    tr.quiet_fast_path = False
    iv = tr.update(packets(np.random.default_rng(1), T0, T0 + 1, 50, 1), T0, T0 + 1)
    assert tuple(iv.flows) == FLOW_COLUMNS


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("ports", [1, 2])
def test_quiet_intervals_match_the_general_path(seed: int, ports: int) -> None:
    rng = np.random.default_rng(seed)
    fast = FlowTracker(0.001, flow_timeout=3.0)
    ref = FlowTracker(0.001, flow_timeout=3.0)
    ref.quiet_fast_path = False
    names = [f"eth{i}" for i in range(ports)][: rng.integers(0, ports + 1)]  # some ports unnamed
    t, quiet_taken, drops = T0, 0, 0
    for i in range(60):
        # traffic, then idle stretches long enough for every flow to time out
        busy = (i // 10) % 2 == 0 and rng.random() < 0.8
        dur = float(rng.choice([1.0, 1.0, 0.5, 0.0]))  # a zero-length interval has no rates
        n = int(rng.integers(1, 40)) if busy else 0
        pk = packets(rng, t, t + dur, n, ports)
        drops += int(rng.integers(0, 2))
        d = {0: drops} if rng.random() < 0.7 else {}
        quiet_taken += int(n == 0 and not fast.slots)
        got = fast.update(pk, t, t + dur, names, d)
        want = ref.update(pk, t, t + dur, names, d)
        assert_same(got, want)
        gb, wb = to_batch(got, "n1", t + dur), to_batch(want, "n1", t + dur)
        for col in ("t", "node", "entity", "signal", "value"):
            assert same_array(getattr(gb, col), getattr(wb, col)), col
        assert_same_state(fast, ref)
        t += dur
    assert quiet_taken >= 10  # the fast path was exercised, also after flows expired


def test_quiet_interval_on_a_fresh_tracker() -> None:
    pk = Packets.alloc(0)
    fast, ref = FlowTracker(), FlowTracker()
    ref.quiet_fast_path = False
    for t in (T0, T0 + 1, T0 + 2):
        assert_same(fast.update(pk, t, t + 1, ["eth0"], {0: 3}), ref.update(pk, t, t + 1, ["eth0"], {0: 3}))
        assert_same(fast.update(pk, t, t + 1), ref.update(pk, t, t + 1))
    assert_same_state(fast, ref)
