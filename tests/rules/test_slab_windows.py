"""Window functions read from the store's slabs (rules/slabwindows.py: each slab's window
columns found once per tick, the blocks' windows stacked from its rows) give, bit for bit, the
values of the per-block path (``Block.window`` per block, then ``windows._stacked`` or one kernel
call per block), and an engine that reads slabs publishes the same findings, evidence included.

The store is the controller's kind (``node_slabs``): many nodes' one-row blocks, each node on its
own clock with skipped ticks, so windows of several widths meet in one call; summaries that
leave a signal out now and then (another layout: the node's slab is undone and made again),
late and repeated ones (written block by block), missing samples, infinities and signed zeros
(the kernels' exact paths), and a gauge of several entities per node, never in a slab.
"""
from __future__ import annotations

import numpy as np
import pytest

from skewd.model import BatchBuilder, Catalogue, signal
from skewd.rules import functions, slabwindows, windows
from skewd.rules.engine import Engine
from skewd.rules.loader import load_rules
from skewd.rules.slabwindows import SlabWindows
from skewd.rules.store import WindowStore

from .windowctx import bits, window_ctx

NODE_SIGNALS = [f"g{i}" for i in range(6)]
CAT = Catalogue([signal(s, "gauge", "1", "node", "a node gauge", "t") for s in NODE_SIGNALS]
                + [signal("e0", "gauge", "1", "gpu", "a gauge of several entities", "t")])
KERNELS = {"avg": functions.avg, "min": functions.wmin, "max": functions.wmax, "sum": functions.wsum,
           "last": functions.last, "count": functions.count}


def fill(seed: int, ticks: int = 30, late: bool = True) -> WindowStore:
    """12-40 nodes' summaries, one batch per node and tick, in a store that writes slabs."""
    rng = np.random.default_rng(seed)
    store = WindowStore(CAT, horizon=25.0, initial_cap=8)
    store.node_slabs = True
    nodes = [f"n{i:02d}" for i in range(12 + int(rng.integers(0, 29)))]
    offset = {n: float(rng.uniform(0, 1)) for n in nodes}
    gpus = {n: int(rng.integers(0, 3)) for n in nodes}
    holes = float(rng.choice([0.0, 0.002, 0.01]))  # a hole leaves the node's blocks on two time axes: no slab
    nans = float(rng.choice([0.0, 0.0, 0.02]))

    def value() -> float:
        r = rng.random()
        if r < nans:
            return float("nan")
        if r < nans + 0.03:
            return -0.0
        if r < nans + 0.05:
            return 0.0
        if r < nans + 0.055:
            return float(rng.choice([np.inf, -np.inf]))
        return float(rng.normal(1.0, 3.0))

    held: list = []
    for k in range(ticks):
        for n in nodes:
            if rng.random() < 0.08:
                continue  # a summary that did not come
            b = BatchBuilder(n)
            t = k + offset[n] + float(rng.uniform(0, 0.05))
            for s in NODE_SIGNALS:
                if rng.random() >= holes:
                    b.add(t, "", s, value())
            for g in range(gpus[n]):
                b.add(t, f"gpu{g}", "e0", value())
            if not len(b):
                continue
            batch = b.build()
            if late and rng.random() < 0.01:
                held.append(batch)  # arrives a tick later: older than the node's newest column
                continue
            store.ingest(batch)
            if late and rng.random() < 0.01:
                store.ingest(batch)  # sent twice
        for batch in held:
            store.ingest(batch)
        held = []
    return store



@pytest.mark.parametrize("piece", [None, 96], ids=["pieces-as-shipped", "pieces-of-a-few-rows"])
@pytest.mark.parametrize("seed", range(30))
def test_slab_windows_are_the_per_block_values_bit_for_bit(seed, piece, monkeypatch):
    """Also with the stacked windows reduced a few rows at a time through the one reused buffer
    (what a wide window of many nodes takes: slabwindows.STACK_PIECE_BYTES)."""
    if piece is not None:
        monkeypatch.setattr(slabwindows, "STACK_PIECE_BYTES", piece)
    store = fill(seed)
    slabbed = sum(b.slab is not None for per in store.blocks.values() for b in per.values())
    assert slabbed >= len(NODE_SIGNALS)  # at least some nodes' summary blocks sit in slabs
    rng = np.random.default_rng(1000 + seed)
    reader = SlabWindows()
    kinds = sorted(KERNELS) + ["quantile"]
    with functions.quiet():
        functions._ACTIVE[0] = True
        try:
            for _ in range(20):
                kind = str(rng.choice(kinds))
                sig = str(rng.choice(NODE_SIGNALS + ["e0"]))
                dur = float(rng.choice([0.5, 1.0, 3.0, 7.0, 15.0, 100.0]))
                now = float(rng.choice([-1.0, 5.3, 17.5, 25.2, 29.9, 60.0]))
                if kind == "quantile":
                    q = float(rng.choice([0.0, 0.25, 0.5, 0.9, 1.0]))
                    kernel = (lambda t, W, q=q: functions.quantile(t, W, q))
                    key: tuple = (kind, sig, windows.identity, dur, q)
                else:
                    kernel, key = KERNELS[kind], (kind, sig, windows.identity, dur)
                got_ctx, ref_ctx = window_ctx(store, now, slabs=reader), window_ctx(store, now)
                windows.window_vec(got_ctx, sig, dur, key, kernel)
                windows.window_vec(ref_ctx, sig, dur, key, kernel)
                got, ref = got_ctx.memo[key], ref_ctx.memo[key]  # per block row, before any gather
                assert bits(got) == bits(ref), (kind, sig, dur, now, got, ref)
                # the per-block windows (for the kernels that are not stacked) too
                sl = reader.slices(store, sig, now - dur, now, {})
                blocks = list(store.signal_blocks(sig))
                if sl is None:
                    assert all(b.slab is None for b in blocks)
                    continue
                for (t1, w1), b in zip(sl, blocks):
                    t2, w2 = b.window(now - dur, now)
                    assert w1.shape == w2.shape and bits(t1) == bits(t2) and bits(w1) == bits(w2)
        finally:
            functions._ACTIVE[0] = False


def test_a_plan_follows_slabs_undone_and_made_again():
    """A slab undone by a late summary (and made again by the next ones) is read from the
    blocks' own arrays meanwhile, and from the new slab after: never from the old one."""
    store = fill(3, ticks=12, late=False)
    reader = SlabWindows()
    sig = NODE_SIGNALS[0]
    now = 11.9

    def same() -> None:
        with functions.quiet():
            functions._ACTIVE[0] = True
            try:
                key = ("avg", sig, windows.identity, 5.0)
                a, b = window_ctx(store, now, slabs=reader), window_ctx(store, now)
                windows.window_vec(a, sig, 5.0, key, functions.avg)
                windows.window_vec(b, sig, 5.0, key, functions.avg)
                assert bits(a.memo[key]) == bits(b.memo[key])
            finally:
                functions._ACTIVE[0] = False

    same()
    blk = next(b for b in store.signal_blocks(sig) if b.slab is not None)
    old = blk.slab
    late = BatchBuilder(blk.node)
    t_late = float(blk.times[blk.n - 2]) + 1e-3
    for s in NODE_SIGNALS:
        late.add(t_late, "", s, 123.0)
    store.ingest(late.build())  # older than the newest column: written block by block, slab undone
    assert blk.slab is None
    same()
    for k in (12.5, 13.5):
        nxt = BatchBuilder(blk.node)
        for s in NODE_SIGNALS:
            nxt.add(k, "", s, 7.0)
        store.ingest(nxt.build())
    now = 13.9
    assert blk.slab is not None and blk.slab is not old
    same()


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
    scope: cluster
    layer: network
    expr: peer_dev(min(g2, 4s)) < -0.5 or quantile(g3, 0.5, 6s) > 4 or sum(g4, 6s) < -6
    for: 0s
    mitigation: none
  - id: R3
    pathology: EW-1
    scope: tp_group
    layer: network
    expr: last(g5, 2s) > peer_median(avg(g5, 10s)) + 2 and count(g0, 3s) >= 2
    for: 1s
    mitigation: none
"""


def _findings(seed: int, tmp_path, read_slabs: bool) -> list:
    p = tmp_path / "r.yaml"
    p.write_text(RULES)
    res = load_rules([p], CAT)
    assert res.ok, res.issues
    full = fill(seed, ticks=30)
    store = WindowStore(CAT, horizon=25.0, initial_cap=8)
    store.node_slabs = True
    nodes = sorted({n for per in full.blocks.values() for n in per})
    for i, n in enumerate(nodes):  # TP groups of four
        store.registry.set_node_labels(n, {"tp_group": f"tp{i // 4}"})
    eng = Engine(res.ruleset, store)
    eng.read_slabs = read_slabs
    # the filled store's samples again, a node's batch per time, tick by tick
    per_t: dict = {}
    for sig, per in full.blocks.items():
        for n, blk in per.items():
            for ent in blk.rows:
                t, v = full.series(sig, n, ent)
                for a, b in zip(t.tolist(), v.tolist()):
                    per_t.setdefault((a, n), []).append((ent, sig, b))
    out = []
    keys = sorted(per_t)
    j = 0
    for k in range(1, 31):
        while j < len(keys) and keys[j][0] <= k:
            a, n = keys[j]
            b = BatchBuilder(n)
            for ent, sig, v in sorted(per_t[keys[j]], key=lambda x: (x[1], x[0])):
                b.add(a, ent, sig, v)
            store.ingest(b.build())
            j += 1
        out.append([(f.rule_id, f.node, f.entity, f.state, f.evidence, f.active_at, f.fired_at)
                    for f in eng.evaluate(float(k))])
    assert sum(b.slab is not None for per in store.blocks.values() for b in per.values())
    return out


@pytest.mark.parametrize("seed", range(8))
def test_engine_findings_with_and_without_reading_slabs(seed, tmp_path):
    got = _findings(seed, tmp_path, True)
    ref = _findings(seed, tmp_path, False)
    assert repr(got) == repr(ref)  # repr: -0.0 and 0.0 in evidence differ too
    assert any(got)
