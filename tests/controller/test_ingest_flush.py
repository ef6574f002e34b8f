"""Summary samples reach the window store the same whichever path the controller's flush takes:
one batch per summary (the store's fast path, for layouts it holds) or one multi-node batch."""
from __future__ import annotations

import asyncio

import numpy as np

from skewd import wire
from skewd.controller.config import load_config
from skewd.controller.service import Controller
from skewd.lab.harness import CaptureJetStream, MemoryState

from .helpers import RULES

T0 = 1_700_000_000.0
SIGNALS = ("summary_gpu_util_mean_ratio", "summary_gpu_power_watts", "summary_requests_waiting",
           "summary_kv_cache_usage_ratio", "summary_engine_phase", "not_a_catalogued_signal")


def _controller(general_only: bool) -> Controller:
    cfg = load_config(None, env={}, overrides={"cluster": "c1", "warmup": "2s", "rules": [RULES]})
    ctl = Controller(cfg, wall_clock=lambda: 0.0)
    ctl.state = MemoryState(cfg.cluster)
    ctl.js = CaptureJetStream()
    if general_only:
        ctl.feed._in_store = lambda p: False  # never learns a layout: the general path every time
    return ctl


def _summaries(seed: int):
    """Invented summaries: 12 nodes, 4 per second each, with values that come and go (None),
    a node that joins late, a late (out of order) and a repeated summary, gpu entities."""
    rng = np.random.default_rng(seed)
    nodes = [f"n{i}" for i in range(12)]
    out = []
    for k in range(60):
        t = T0 + k * 0.25
        tick = []
        for i, n in enumerate(nodes):
            if n == "n11" and k < 20:
                continue
            sig: dict[str, dict[str, float | None]] = {s: {"": float(rng.uniform(0, 1))} for s in SIGNALS}
            if i == 3 and rng.random() < 0.5:
                sig["summary_requests_waiting"][""] = None  # a value that comes and goes
            if i == 5 and k == 40:
                sig["summary_requests_running"] = {"": 1.0}  # a new signal, once
            sig["gpu_utilization_ratio"] = {f"gpu{g}": float(rng.uniform(0, 1)) for g in range(2 if i % 2 else 1)}
            sig["collective_burst_starts"] = {"0": t - 0.1}
            tick.append(wire.Summary(node=n, cluster="c1", t=t, interval=0.25, signals=sig,
                                     clock_sync=wire.ClockSync(True, 0.001), agent_version="test",
                                     labels={"tp_group": f"tp{i // 4}", "tp_rank": str(i % 4)}))
        if k % 7 == 3:
            tick.insert(0, tick[-1])  # repeated
            late = tick[2]
            tick.append(wire.Summary(node=late.node, cluster="c1", t=late.t - 0.1, interval=0.25,
                                     signals=late.signals, clock_sync=late.clock_sync, agent_version="test",
                                     labels=late.labels))
        rng.shuffle(tick)
        out.append(tick)
    return out


def _store_state(ctl: Controller):
    st = ctl.store
    blocks = {(sig, node): (b.times[: b.n].tolist(), np.nan_to_num(b.values[: b.nrows, : b.n], nan=-1.0).tolist(),
                            dict(b.rows), b.eids[: b.nrows].tolist())
              for sig, per in st.blocks.items() for node, b in per.items()}
    return (blocks, list(st.registry.keys), st.dropped_out_of_order, dict(st.dropped_uncatalogued),
            st.samples_ingested)


def test_per_summary_batches_store_what_the_general_path_stores() -> None:
    fast, slow = _controller(False), _controller(True)
    loop = asyncio.new_event_loop()
    try:
        for k, tick in enumerate(_summaries(5)):
            for ctl in (fast, slow):
                for s in tick:
                    ctl.ingest_summary(s, s.labels)
            if k % 4 in (0, 3):  # flushes of 1 and 3 summaries per node: both store paths
                for ctl in (fast, slow):
                    loop.run_until_complete(ctl.tick(T0 + (k + 1) * 0.25))
                assert _store_state(fast) == _store_state(slow)
                assert [f.event_id for f in fast.state.findings] == [f.event_id for f in slow.state.findings]
    finally:
        loop.close()
    assert fast.feed.fast_flushes > 5 and not slow.feed.fast_flushes


def test_the_general_path_gives_new_entities_their_ids_in_arrival_order() -> None:
    """Summaries wait per node for the flush; one that takes the general path (new nodes)
    still writes them as one batch in the order they came, as the store would have them."""
    from skewd.controller.storefeed import NOT_SAMPLES
    from skewd.model import SampleBatch
    from skewd.rules.store import WindowStore

    ctl = _controller(True)
    ticks = _summaries(7)
    arrived = [s for tick in ticks[20:23] for s in tick]  # shuffled: nodes interleave
    for s in arrived:
        ctl.ingest_summary(s, s.labels)
    ctl.feed.flush()
    ref = WindowStore(ctl.catalogue, horizon=ctl.cfg.horizon)
    ref.ingest(SampleBatch.from_rows([(s.t, s.node, e, name, float(v)) for s in arrived
                                      for name, es in s.signals.items() if name not in NOT_SAMPLES
                                      for e, v in es.items() if v is not None]))
    assert list(ctl.store.registry.keys) == list(ref.registry.keys)
    assert len(ref.registry.keys) > 12
