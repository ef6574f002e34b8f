"""The controller's per-summary ingest shortcuts change nothing: a flush with one summary per
node takes the store's per-summary fast path for every node (the window store keeps all nodes'
layouts) and stores what the general path stores; the topology skips labels it has seen."""
from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from skewd import wire
from skewd.controller import storefeed
from skewd.controller.config import TPGroup
from skewd.controller.topology import Topology

from .test_ingest_flush import T0, _controller, _store_state

SIGNALS = ("summary_gpu_util_mean_ratio", "summary_gpu_power_watts", "summary_requests_waiting",
           "summary_kv_cache_usage_ratio", "summary_engine_phase", "summary_cpu_busy_cores",
           "summary_net_rx_bytes_per_second", "not_a_catalogued_signal")


def _ticks(seed: int, nodes: int, ticks: int, per_tick: int):
    """``per_tick`` summaries per node between evaluations (1: what a 1 s agent interval gives),
    values that come and go (None), nodes joining late, two going quiet and coming back, late
    and repeated summaries."""
    rng = np.random.default_rng(seed)
    names = [f"n{i:03d}" for i in range(nodes)]
    out = []
    for k in range(ticks):
        tick = []
        for j in range(per_tick):
            t = T0 + k + j / per_tick
            for i, n in enumerate(names):
                if i % 17 == 0 and k < 3:
                    continue  # joins late
                if i in (5, 6) and 1 <= k < 8:
                    continue  # go quiet, forgotten by the store's gc (tick 6), come back
                sig: dict = {s: {"": float(rng.uniform(0, 1))} for s in SIGNALS}
                if i % 5 == 3 and (k + j) % 2:
                    sig["summary_requests_waiting"][""] = None
                sig["gpu_utilization_ratio"] = {f"gpu{g}": float(rng.uniform(0, 1)) for g in range(1 + i % 3)}
                # one GPU more in a later signal: a node's new entities then get their ids in a
                # different order on the general path (signal by signal) than on its own (node by node)
                sig["pcie_gpu_rx_bytes_per_second"] = {f"gpu{g}": float(rng.uniform(0, 1)) for g in range(2 + i % 3)}
                sig["collective_burst_starts"] = {"0": t - 0.1}
                tick.append(wire.Summary(node=n, cluster="c1", t=t, interval=1.0 / per_tick, signals=sig,
                                         clock_sync=wire.ClockSync(True, 0.001), agent_version="test",
                                         labels={"tp_group": f"tp{i // 4}", "tp_rank": str(i % 4)}))
        if k % 3 == 1:
            tick.insert(0, tick[-1])  # repeated
            late = tick[5]
            tick.append(wire.Summary(node=late.node, cluster="c1", t=late.t - 0.3, interval=1.0,
                                     signals=late.signals, clock_sync=late.clock_sync, agent_version="test",
                                     labels=late.labels))
        rng.shuffle(tick)
        out.append(tick)
    return out


@pytest.mark.parametrize("per_tick,flush_rows", [(1, None), (2, None), (1, 700)])
def test_one_summary_per_node_per_flush_takes_the_fast_path_and_stores_the_same(
        monkeypatch, per_tick: int, flush_rows: int | None) -> None:
    if flush_rows is not None:  # flushes between ticks too, a few summaries per node in each
        monkeypatch.setattr(storefeed, "FLUSH_ROWS", flush_rows)
    fast, slow = _controller(False), _controller(True)
    general = []
    orig = fast.store._ingest_general
    fast.store._ingest_general = lambda b: (general.append(len(b)), orig(b))[1]
    loop = asyncio.new_event_loop()
    between: list[int] = []  # store general-path batches while summaries come in (FLUSH_ROWS), per tick
    during: list[int] = []  # ... during each tick (its flush, the derived ctl_* batch)
    try:
        for k, tick in enumerate(_ticks(7, 120, 15, per_tick)):
            for ctl in (fast, slow):
                n0 = len(general)
                for s in tick:
                    ctl.ingest_summary(s, s.labels)
                if ctl is fast:
                    between.append(len(general) - n0)
                n0 = len(general)
                loop.run_until_complete(ctl.tick(T0 + k + 1))
                if ctl is fast:
                    during.append(len(general) - n0)
                if k == 6:
                    assert ctl.gc_store(T0 + ctl.cfg.horizon + 2.5) > 0
            assert _store_state(fast) == _store_state(slow)
            assert [f.event_id for f in fast.state.findings] == [f.event_id for f in slow.state.findings]
    finally:
        loop.close()
    assert fast.feed.fast_flushes >= 5 and not slow.feed.fast_flushes
    # every node's layout stays in the store's cache: once all layouts are known (the last
    # ticks), neither summaries nor the tick's derived ctl_* values go the general way
    assert fast.store.layout_budget > 120 * 10
    assert during[-3:] == [0, 0, 0] and between[-3:] == [0, 0, 0], (during, between)


def _reference_observe(topo: Topology, node: str, labels: dict) -> bool:
    topo._seen.clear()  # every call computed in full, as before the shortcut
    return topo.observe(node, labels)


def test_topology_skipping_seen_labels_changes_nothing() -> None:
    rng = random.Random(11)
    cfg = {"tp0": TPGroup("tp0", ("n0", "n1"), "m1")}
    a, b = Topology("c1", dict(cfg)), Topology("c1", dict(cfg))
    label_sets = [{"tp_group": "tp0", "tp_rank": "0"}, {"tp_group": "tp1", "tp_rank": "1", "model": "m1"},
                  {"tp_group": "tp1", "tp_rank": "x"}, {}, {"tp_group": "tp2", "pp_group": "p", "pp_stage": "1"}]
    for _ in range(3000):
        node = f"n{rng.randrange(6)}"
        labels = dict(rng.choice(label_sets))
        assert a.observe(node, labels) == _reference_observe(b, node, labels)
        assert (a.learned, a.conflicts, a.version) == (b.learned, b.conflicts, b.version)
        if rng.random() < 0.01:  # the configured groups change: seen labels are weighed again
            name = rng.choice(["tp1", "tp3"])
            g = None if rng.random() < 0.3 else TPGroup(name, (f"n{rng.randrange(6)}", "n1"), "")
            a.configure_tp(name, g)
            b.configure_tp(name, g)
        for n in (f"n{i}" for i in range(6)):  # the node → configured group index, against a scan
            scan = next((g.name for g in a.configured_tp.values() if n in g.nodes), "")
            assert a._configured_group_of(n) == scan, n
    assert a.tp_groups() == b.tp_groups() and a.conflicts


def test_housekeeping_forgets_silent_entities_within_a_twentieth_of_the_horizon_late() -> None:
    """The housekeeping loop (every evaluation interval) forgets a store entity silent for the
    horizon, at most 5 % of the horizon late, and walks the store no more often than that:
    a walk covers every node's blocks, and every second it cost a worker 3 % of its loop."""
    from skewd.controller import service

    from skewd.controller.config import load_config
    from skewd.controller.offline import CaptureJetStream, MemoryState
    from skewd.controller.service import Controller

    cfg = load_config(None, env={}, overrides={"cluster": "c1", "warmup": "2s", "horizon": "100s",
                                              "evaluation_interval": "20ms"})
    ctl = Controller(cfg, wall_clock=lambda: 0.0)
    ctl.state, ctl.js = MemoryState(cfg.cluster), CaptureJetStream()
    walks: list[float] = []
    orig = ctl.store.gc
    ctl.store.gc = lambda now: (walks.append(now), orig(now))[1]
    sig = {"summary_gpu_util_mean_ratio": {"": 0.5}}

    def summary(node: str, t: float) -> wire.Summary:
        return wire.Summary(node=node, cluster="c1", t=t, interval=1.0, signals=sig,
                            clock_sync=wire.ClockSync(True, 0.001), agent_version="test")

    async def run() -> None:
        task = asyncio.create_task(ctl._housekeeping_loop())
        try:
            for k in range(130):  # n0 goes silent at T0 + 10; n1 keeps sending
                t = T0 + k
                ctl.ingest_summary(summary("n1", t))
                if k <= 10:
                    ctl.ingest_summary(summary("n0", t))
                ctl.feed.flush()
                ctl.now = t
                await asyncio.sleep(0.03)  # at least one housekeeping round per summary second
                if k == 10 + 100 + 100 * service.STORE_GC_SHARE + 1:
                    assert "n0" not in ctl.store.blocks["summary_gpu_util_mean_ratio"], k
        finally:
            task.cancel()

    asyncio.run(run())
    assert "n1" in ctl.store.blocks["summary_gpu_util_mean_ratio"]
    gaps = np.diff(walks)
    assert len(walks) >= 20 and gaps.min() >= 100 * service.STORE_GC_SHARE, walks
