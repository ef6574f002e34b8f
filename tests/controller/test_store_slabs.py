"""The controller's store writes a node's summary signals as one slab (rules/store.py
``node_slabs``): a controller fed the same summaries with slabs and without ends with the same
store series and publishes the same findings, with summaries that leave a signal out now and
then (another layout, which undoes a slab), arrive late, carry NaN-free gaps and new nodes."""
from __future__ import annotations

import asyncio
import random

import numpy as np

from skewd import wire
from skewd.controller.service import Controller

from .helpers import RULES, arrival_order, offline_controller

T0 = 1_700_000_000.0
NODES = [f"n{i}" for i in range(8)]
#: summary signals sent (NOTE: values made up; names from the controller's catalogue)
SIGNALS = ["summary_gpu_util_mean_ratio", "summary_gpu_util_min_ratio", "summary_gpu_power_watts",
           "summary_pcie_rx_bytes_per_second", "summary_rdma_xmit_bytes_per_second",
           "summary_rdma_rcv_bytes_per_second", "summary_net_rx_bytes_per_second"]


def _controller(slabs: bool) -> Controller:
    ctl = offline_controller()
    ctl.store.node_slabs = slabs
    return ctl


def _messages(seed: int, seconds: int) -> list[tuple[float, object]]:
    """Invented summaries of two TP groups of 4 (node n3 late in its steps), in arrival order:
    mostly every node each second, sometimes one a second late or twice at one time, sometimes
    a signal left out (None) or a node silent."""
    rng = random.Random(seed)

    def summary(i: int, n: str) -> tuple[str, bytes] | None:
        if rng.random() < 0.03:
            return None  # silent this second
        t = T0 + i + 1
        sig: dict = {}
        for s in SIGNALS:
            v = None if rng.random() < 0.04 else rng.random() * 100
            sig[s] = {"": v}
        lag = 0.01 if n == "n3" else 0.0
        sig["collective_burst_starts"] = {str(k): t - 1 + k * 0.05 + 0.0003 + lag for k in range(20)}
        g = "tp0" if n in NODES[:4] else "tp1"
        s_ = wire.Summary(node=n, cluster="c1", t=t, interval=1.0, signals=sig,
                          clock_sync=wire.ClockSync(True, 0.0005), agent_version="test",
                          labels={"tp_group": g, "tp_rank": str(NODES.index(n) % 4)})
        return wire.summary_subject("c1", n, g), wire.encode(s_)

    return arrival_order(rng, seconds, NODES, summary)


class _Msg:
    def __init__(self, subject: str, data: bytes) -> None:
        self.subject, self.data = subject, data


async def _run(ctl: Controller, msgs: list) -> Controller:
    for m in msgs:
        if m is None:
            await ctl.evaluate_due()
        else:
            await ctl._on_summary(_Msg(*m))
    return ctl


def test_slabs_leave_the_store_and_findings_of_per_block_writes() -> None:
    for seed in range(3):
        msgs = _messages(seed, 50)
        a = asyncio.run(_run(_controller(True), msgs))
        b = asyncio.run(_run(_controller(False), msgs))
        assert a.stats.evaluations == b.stats.evaluations > 0
        slabbed = sum(blk.slab is not None for per in a.store.blocks.values() for blk in per.values())
        assert slabbed > 0 and not any(blk.slab is not None for per in b.store.blocks.values() for blk in per.values())
        assert sorted(a.store.blocks) == sorted(b.store.blocks)
        for sig, per in a.store.blocks.items():
            assert sorted(per) == sorted(b.store.blocks[sig])
            for node in per:
                ta, va = a.store.series(sig, node)
                tb, vb = b.store.series(sig, node)
                assert np.array_equal(ta, tb) and np.array_equal(va, vb, equal_nan=True), (seed, sig, node)
        key = [(f.rule_id, f.node, f.state, f.active_at) for f in a.js.findings]
        assert key == [(f.rule_id, f.node, f.state, f.active_at) for f in b.js.findings]
        assert ("EW-1-tp-straggler-test", "n3") in {(k[0], k[1]) for k in key}  # the late node, named
