"""A window function over many blocks computed on their stacked windows (``windows._stacked``:
the controller's one block per node and signal) gives, bit for bit, the values of one kernel
call per block, and an engine that stacks publishes the same findings, evidence included, as
one that does not.

The data mixes what makes the kernels leave their dense path: missing samples, infinities,
signed zeros, blocks of one and of several rows, a block wide enough to be stored time-major,
empty and one-column windows, and nodes whose time axes differ (each its own clock and
skipped ticks), so windows of different column counts meet in one call.
"""
from __future__ import annotations

import numpy as np
import pytest

from skewd.model import BatchBuilder, Catalogue, signal
from skewd.rules import functions, windows
from skewd.rules.engine import Engine
from skewd.rules.loader import load_rules
from skewd.rules.store import WindowStore

from .windowctx import bits, window_ctx

CAT = Catalogue([signal("g0", "gauge", "1", "node", "a node gauge", "t"),
                 signal("g1", "gauge", "1", "node", "another node gauge", "t"),
                 signal("e0", "gauge", "1", "gpu", "a gauge of several entities", "t")])
KINDS = sorted(windows._DENSE)


def fill(seed: int, ticks: int = 30) -> WindowStore:
    """12-40 nodes, each on its own clock (offset, jitter, skipped ticks)."""
    rng = np.random.default_rng(seed)
    store = WindowStore(CAT, horizon=1e6, initial_cap=8)
    nodes = [f"n{i:02d}" for i in range(12 + int(rng.integers(0, 29)))]
    offset = {n: float(rng.uniform(0, 1)) for n in nodes}
    gpus = {n: (70 if i == 3 and seed % 2 else 1 + int(rng.integers(0, 3))) for i, n in enumerate(nodes)}
    holes = float(rng.choice([0.0, 0.0, 0.05, 0.3]))

    def value() -> float:
        r = rng.random()
        if r < 0.03:
            return -0.0
        if r < 0.05:
            return 0.0
        if r < 0.055:
            return float(rng.choice([np.inf, -np.inf]))
        return float(rng.normal(1.0, 3.0))

    for k in range(ticks):
        for n in nodes:
            if rng.random() < 0.1:
                continue  # a summary that did not come: this node's time axis skips a tick
            b = BatchBuilder(n)
            t = k + offset[n] + float(rng.uniform(0, 0.05))
            for s in ("g0", "g1"):
                if rng.random() >= holes:
                    b.add(t, "", s, value())
            for g in range(gpus[n]):
                if rng.random() >= holes:
                    b.add(t, f"gpu{g}", "e0", value())
            if len(b):
                store.ingest(b.build())
    return store



@pytest.mark.parametrize("seed", range(40))
def test_stacked_windows_are_the_kernels_values_bit_for_bit(seed, monkeypatch):
    store = fill(seed)
    rng = np.random.default_rng(1000 + seed)
    kernels = {"avg": functions.avg, "min": functions.wmin, "max": functions.wmax, "sum": functions.wsum,
               "last": functions.last}
    assert set(kernels) == set(KINDS)  # a new stacked kind gets its kernel here
    stacked = 0
    orig = windows._stacked

    def counting(*a):
        nonlocal stacked
        stacked += 1
        return orig(*a)

    with functions.quiet():
        functions._ACTIVE[0] = True
        try:
            for _ in range(15):
                kind = str(rng.choice(KINDS))
                sig = str(rng.choice(["g0", "g1", "e0"]))
                dur = float(rng.choice([0.5, 1.0, 2.0, 3.0, 7.0, 15.0, 100.0]))
                now = float(rng.choice([-1.0, 0.0, 5.3, 17.5, 29.9, 60.0]))
                key = (kind, sig, windows.identity, dur)
                monkeypatch.setattr(windows, "_stacked", counting)
                ctx = window_ctx(store, now)
                windows.window_vec(ctx, sig, dur, key, kernels[kind])
                monkeypatch.setattr(windows, "STACK_MIN_BLOCKS", 1 << 30)
                alone = window_ctx(store, now)
                windows.window_vec(alone, sig, dur, key, kernels[kind])
                monkeypatch.undo()
                got, ref = ctx.memo[key], alone.memo[key]  # per block row, before any gather
                assert bits(got) == bits(ref), (kind, sig, dur, now, got, ref)
        finally:
            functions._ACTIVE[0] = False
    assert stacked  # the stacked path was taken, not only the kernels


RULES = """
required_engine_version: 1
rules:
  - id: R1
    pathology: EW-1
    scope: tp_group
    layer: network
    expr: avg(g0, 5s) - peer_others(avg(g0, 5s)) > 1 and max(g1, 3s) > 0
    for: 2s
    keep_firing_for: 1s
    mitigation: none
  - id: R2
    pathology: EW-1
    scope: tp_group
    layer: network
    expr: peer_dev(min(g1, 4s)) < -0.5 or g0 > 4 or sum(g0, 6s) < -6
    for: 0s
    mitigation: none
"""


def _findings(seed: int, tmp_path, stack: bool, monkeypatch) -> list:
    p = tmp_path / "r.yaml"
    p.write_text(RULES)
    res = load_rules([p], CAT)
    assert res.ok, res.issues
    if not stack:
        monkeypatch.setattr(windows, "STACK_MIN_BLOCKS", 1 << 30)
    full = fill(seed, ticks=30)
    store = WindowStore(CAT, horizon=1e6, initial_cap=8)
    nodes = sorted({n for per in full.blocks.values() for n in per})
    for i, n in enumerate(nodes):  # TP groups of four
        store.registry.set_node_labels(n, {"tp_group": f"tp{i // 4}"})
    eng = Engine(res.ruleset, store)
    # the same samples, fed tick by tick from the filled store's series
    rows = []
    for sig, per in full.blocks.items():
        for n, blk in per.items():
            for ent in blk.rows:
                t, v = full.series(sig, n, ent)
                rows += [(float(a), n, ent, sig, float(b)) for a, b in zip(t, v)]
    rows.sort(key=lambda r: r[0])
    out = []
    j = 0
    for k in range(1, 31):
        while j < len(rows) and rows[j][0] <= k:
            a, n, ent, sig, v = rows[j]
            b = BatchBuilder(n)
            b.add(a, ent, sig, v)
            store.ingest(b.build())
            j += 1
        out.append([(f.rule_id, f.node, f.entity, f.state, f.evidence, f.active_at, f.fired_at)
                    for f in eng.evaluate(float(k))])
    monkeypatch.undo()
    return out


@pytest.mark.parametrize("seed", range(8))
def test_engine_findings_with_and_without_stacking(seed, tmp_path, monkeypatch):
    got = _findings(seed, tmp_path, True, monkeypatch)
    ref = _findings(seed, tmp_path, False, monkeypatch)
    assert repr(got) == repr(ref)  # repr: -0.0 and 0.0 in evidence differ too
    assert any(got)
