"""The window store's fast ingest (cached batch layouts, several collections written at once)
leaves exactly the store that ingesting one batch at a time through the general path leaves:
same windows, rows, entity ids, drops, compaction and ageing out."""
from __future__ import annotations

import random

import numpy as np
import pytest

from skewd.model import BatchBuilder, SampleBatch
from skewd.rules import functions as F
from skewd.rules.store import WindowStore


class GeneralPathStore(WindowStore):
    """The reference: every batch through the general per-signal path, never a cached layout."""

    def _known_layout(self, batch, shared=False):
        return None


ENTITIES = {
    "gpu_util_ratio": ["gpu0", "gpu1", "gpu2", "gpu3"],
    "gpu_power_watts": ["gpu0", "gpu1", "gpu2"],
    "pcie_rx_bytes_total": ["gpu0", "gpu1", "gpu2", "gpu3"],
    "rdma_port_xmit_bytes_total": ["mlx5_0/1", "mlx5_1/1"],
    "host_tcp_retrans_segs_total": [""],
    "netdev_qdisc_backlog_bytes": ["eth0", "eth1"],
    "not_catalogued_signal": ["x"],
}
#: blocks of many rows: stored time-major from store.WIDE_ROWS rows on (an agent's flows), and
#: back to row-major when gc leaves fewer
WIDE = {
    "gpu_util_ratio": [f"gpu{i}" for i in range(90)],
    "pcie_rx_bytes_total": [f"gpu{i}" for i in range(70)],
    "rdma_port_xmit_bytes_total": [f"mlx5_{i}/1" for i in range(150)],
    "netdev_qdisc_backlog_bytes": ["eth0", "eth1"],
}


def snapshot(store: WindowStore) -> dict:
    """Everything a reader can see, and the bookkeeping that decides what it will see later."""
    blocks = {}
    for sig, per_node in store.blocks.items():
        for node, b in per_node.items():
            blocks[sig, node] = (b.n, b.times.shape[0], list(b.rows.items()), b.eids[: b.nrows].tolist(),
                                 b.last_seen[: b.nrows].tolist(), b.times[: b.n].tolist(),
                                 np.nan_to_num(b.values[: b.nrows, : b.n], nan=-1.5).tolist())
    reg = store.registry
    return {"blocks": blocks, "registry": (reg.keys, reg._free, reg._refs),
            "ingested": store.samples_ingested, "out_of_order": store.dropped_out_of_order,
            "uncatalogued": list(store.dropped_uncatalogued.items()), "latest": store.latest_t}


def stream(seed: int, steps: int = 300, entities: dict = ENTITIES, signals: tuple[int, int] = (1, 3),
           disjoint: bool = False, churn: float = 0.04) -> list:
    """Collector batches as an agent sees them: a few collectors at 10 Hz whose entity sets change
    (a flow appears, a GPU goes quiet), counters that reset, late and out-of-order batches, a
    batch spanning two timestamps or two nodes, a repeated entity, uncatalogued signals - and gc
    calls between them (``("gc", t)``)."""
    rng = random.Random(seed)
    names = list(entities)
    if disjoint:
        rng.shuffle(names)
    collectors = []
    for c in range(3):
        if disjoint and c < 2:  # two collectors of their own signals (the third shares the first's)
            mine = names[c * len(names) // 2: (c + 1) * len(names) // 2]
        elif disjoint:
            mine = rng.sample(names[: len(names) // 2], 2)
        else:
            mine = rng.sample(names, rng.randint(*signals))
        collectors.append([(s, e) for s in mine for e in entities[s]])
    counters: dict = {}
    out: list = []
    t = 100.0
    for _ in range(steps):
        r = rng.random()
        if r < 0.03:
            out.append(("gc", t))
            continue
        if r < 0.03 + churn:  # an entity appears or goes away
            c = rng.randrange(len(collectors))
            cols = list(collectors[c])
            if len(cols) > 1 and rng.random() < 0.5:
                cols.pop(rng.randrange(len(cols)))
            else:
                s = rng.choice(names)
                cols.append((s, rng.choice(entities[s] + [f"new{rng.randint(0, 3)}"])))
            collectors[c] = cols
        t += rng.choice([0.1, 0.1, 0.1, 0.0, 0.7, 4.0, 15.0])
        cols = list(rng.choice(collectors))
        if rng.random() < 0.03:
            cols.append(cols[0])  # the same entity twice in one collection
        ts = np.full(len(cols), t - (rng.choice([0.05, 0.3, 6.0]) if rng.random() < 0.06 else 0.0))
        if rng.random() < 0.04:
            ts += np.array([rng.choice([0.0, 0.05, -0.05]) for _ in cols])
        nodes = np.full(len(cols), "n1" if rng.random() < 0.9 else "n2", dtype=object)
        if rng.random() < 0.03:
            nodes[: len(cols) // 2] = "n2"
        vals = []
        for s, e in cols:
            if s.endswith("_total"):
                v = 0.0 if rng.random() < 0.03 else counters.get((s, e), 0.0) + rng.random() * 1e3  # resets
                counters[s, e] = v
            else:
                v = np.nan if rng.random() < 0.02 else rng.random()
            vals.append(v)
        out.append(("batch", SampleBatch(ts, nodes, np.array([e for _, e in cols], dtype=object),
                                         np.array([s for s, _ in cols], dtype=object), np.array(vals))))
    return out


def sharing(events: list) -> list:
    """The same stream with equal signal/entity/node columns as one set of arrays, as replay
    builds them for ``shared_columns``."""
    seen: dict = {}
    out = []
    for kind, x in events:
        if kind == "batch":
            key = (tuple(x.signal), tuple(x.entity), tuple(x.node))
            sig, ent, node = seen.setdefault(key, (x.signal, x.entity, x.node))
            x = SampleBatch(x.t, node, ent, sig, x.value)
        out.append((kind, x))
    return out


def play(store: WindowStore, events: list, group: random.Random | None, shared: bool = False) -> WindowStore:
    """Batches one by one (``group`` None) or in runs of random length through ingest_many."""
    pending: list = []
    for kind, x in events:
        if kind == "gc":
            store.ingest_many(pending, shared)
            pending = []
            store.gc(x)
        elif group is None:
            store.ingest(x)
        else:
            pending.append(x)
            if group.random() < 0.15:
                store.ingest_many(pending, shared)
                pending = []
    store.ingest_many(pending, shared)
    return store


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("horizon,cap", [(600.0, 64), (5.0, 4), (2.0, 2)])
def test_fast_ingest_leaves_the_store_of_the_general_path(cat, seed, horizon, cap) -> None:
    events = stream(seed, entities=WIDE if seed % 4 == 3 else ENTITIES)
    want = snapshot(play(GeneralPathStore(cat, horizon=horizon, initial_cap=cap), events, None))
    assert snapshot(play(WindowStore(cat, horizon=horizon, initial_cap=cap), events, None)) == want
    assert snapshot(play(WindowStore(cat, horizon=horizon, initial_cap=cap), events, random.Random(seed))) == want
    shared = sharing(events)
    assert snapshot(play(WindowStore(cat, horizon=horizon, initial_cap=cap), shared, random.Random(seed), True)) == want


def collections(start: float, n: int, values, entities=("gpu0", "gpu1"), node="n1",
                signal="pcie_rx_bytes_total") -> list[SampleBatch]:
    out = []
    for k in range(n):
        b = BatchBuilder(node)
        for e, v in zip(entities, values(k)):
            b.add(start + 0.1 * k, e, signal, v)
        out.append(b.build())
    return out


def test_a_second_of_collections_at_once_gives_the_windows_of_one_at_a_time(cat) -> None:
    # a counter that resets at collection 23, and a GPU that goes quiet after 5 s
    def counter(k):
        return [1e6 * (k if k < 23 else k - 23), 5e5 * k]

    batches = collections(0.0, 80, counter)
    batches += collections(8.0, 80, lambda k: [2e6 * k], entities=("gpu0",))
    one, many = WindowStore(cat, horizon=5.0, initial_cap=4), WindowStore(cat, horizon=5.0, initial_cap=4)
    for second in range(0, len(batches), 10):
        for b in batches[second: second + 10]:
            one.ingest(b)
        many.ingest_many(batches[second: second + 10])
        now = float(batches[second + 9].t[0])
        for store in (one, many):
            store.gc(now)
        a = [b for b in one.signal_blocks("pcie_rx_bytes_total")]
        m = [b for b in many.signal_blocks("pcie_rx_bytes_total")]
        assert [list(b.rows) for b in a] == [list(b.rows) for b in m]
        for x, y in zip(a, m):
            for dur in (1.0, 3.0, 5.0):
                (ta, Wa), (tm, Wm) = x.window(now - dur, now), y.window(now - dur, now)
                np.testing.assert_array_equal(ta, tm)
                np.testing.assert_array_equal(Wa, Wm)
                np.testing.assert_array_equal(F.increase(ta, Wa), F.increase(tm, Wm))
                np.testing.assert_array_equal(F.resets(ta, Wa), F.resets(tm, Wm))
    # gpu1 went quiet at t=7.9: gone from both once it aged out
    assert list(many.blocks["pcie_rx_bytes_total"]["n1"].rows) == ["gpu0"]
    assert snapshot(one) == snapshot(many)


def test_late_and_out_of_order_collections_in_one_ingest_are_dropped_as_one_by_one(cat) -> None:
    batches = collections(10.0, 5, lambda k: [float(k), float(k)])
    late = collections(10.15, 1, lambda k: [-1.0, -1.0])  # older than the newest (10.4): dropped
    same = collections(10.4, 1, lambda k: [7.0, 7.0])  # the newest timestamp again: overwrites
    seq = batches + late + same + collections(10.5, 3, lambda k: [9.0, 9.0])
    one, many = WindowStore(cat), WindowStore(cat)
    for b in seq:
        one.ingest(b)
    many.ingest_many(seq)
    assert snapshot(one) == snapshot(many)
    assert many.dropped_out_of_order == 2 and many.samples_ingested == 20
    t, v = many.series("pcie_rx_bytes_total", "n1", "gpu0")
    assert t.tolist() == pytest.approx([10.0, 10.1, 10.2, 10.3, 10.4, 10.5, 10.6, 10.7])
    assert v.tolist() == [0.0, 1.0, 2.0, 3.0, 7.0, 9.0, 9.0, 9.0]


def test_a_new_entity_mid_ingest_gets_the_id_it_gets_one_by_one(cat) -> None:
    util = collections(0.0, 3, lambda k: [0.5, 0.5], signal="gpu_util_ratio")
    power = collections(0.0, 3, lambda k: [300.0], entities=("gpu7",), signal="gpu_power_watts")
    grown = collections(0.3, 2, lambda k: [0.5, 0.5, 0.9], entities=("gpu0", "gpu1", "gpu9"),
                        signal="gpu_util_ratio")
    seq = [b for pair in zip(util, power) for b in pair] + grown + power
    one, many = WindowStore(cat), WindowStore(cat)
    for b in seq:
        one.ingest(b)
    many.ingest_many(seq)
    assert snapshot(one) == snapshot(many)
    assert many.registry.lookup(many.blocks["gpu_util_ratio"]["n1"].scope, "n1", "gpu9") == 3


def test_a_full_layout_cache_is_forgotten_not_trusted(cat, monkeypatch) -> None:
    from skewd.rules import store as store_mod

    monkeypatch.setattr(store_mod, "_LAYOUT_BUDGET", 12)  # a couple of layouts at most
    for seed in range(5):
        events = stream(seed)
        want = snapshot(play(GeneralPathStore(cat, horizon=5.0, initial_cap=4), events, None))
        got = play(WindowStore(cat, horizon=5.0, initial_cap=4), events, random.Random(seed))
        assert snapshot(got) == want and got._layout_size <= 12 + 20


def _window_reference(blk, start: float, end: float):
    """Block.window as it was: both numpy searches over the used columns only."""
    lo = int(np.searchsorted(blk.times[: blk.n], start, side="right"))
    hi = int(np.searchsorted(blk.times[: blk.n], end, side="right"))
    return blk.times[lo:hi], blk.values[: blk.nrows, lo:hi]


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("horizon,cap", [(600.0, 64), (5.0, 4)])
def test_window_searches_the_whole_time_axis_with_the_same_columns(cat, seed, horizon, cap) -> None:
    # Block.window searches times[:cap] (unused columns are +inf) instead of times[:n]: the
    # same columns at every point of a stream with compaction, growth and gc, for bounds
    # before, inside and after the samples, on them, and non-finite
    rng = random.Random(seed)
    store = WindowStore(cat, horizon=horizon, initial_cap=cap)
    checked = 0
    for kind, x in stream(seed, 200, WIDE if seed >= 12 else ENTITIES):
        if kind == "gc":
            store.gc(x)
        else:
            store.ingest(x)
        for per_node in store.blocks.values():
            for blk in per_node.values():
                ts = blk.times[: blk.n].tolist()
                for _ in range(3):
                    a = rng.choice(ts + [-np.inf, np.inf, np.nan, 0.0, 1e12]) if ts else 0.0
                    a += rng.choice([0.0, 0.0, -0.05, 0.05, -30.0])
                    b = a + rng.choice([0.0, 0.1, 1.0, 60.0, np.inf])
                    t1, w1 = blk.window(a, b)
                    t2, w2 = _window_reference(blk, a, b)
                    assert t1.tolist() == t2.tolist() and w1.shape == w2.shape
                    assert np.array_equal(w1, w2, equal_nan=True)
                    checked += 1
    assert checked > 100


def test_wide_blocks_are_time_major_and_read_as_the_samples_written(cat) -> None:
    # GPUs join two a second while samples accumulate: the block grows through 4, 8, ... 64 rows
    # (there it turns time-major) to 128; gc then leaves 20 and the block is row-major again -
    # every window reads the samples as written all along
    from skewd.rules.store import WIDE_ROWS

    store = WindowStore(cat, horizon=30.0, initial_cap=4)
    written: dict = {}
    layouts = set()
    for k in range(120):
        t = 100.0 + k
        n_ent = min(90, 10 + 2 * k) if k < 60 else 20
        b = BatchBuilder("n1")
        for i in range(n_ent):
            v = float(k * 1000 + i) if (k + i) % 7 else np.nan
            b.add(t, f"gpu{i}", "gpu_util_ratio", v)
            written[t, f"gpu{i}"] = v
        store.ingest(b.build())
        store.gc(t)
        blk = store.blocks["gpu_util_ratio"]["n1"]
        assert blk.time_major == (blk.values.shape[0] >= WIDE_ROWS)  # the layout follows the row capacity
        layouts.add(blk.time_major)
        tt, W = blk.window(t - 12.0, t)
        for e, r in blk.rows.items():
            want = [written.get((x, e), np.nan) for x in tt.tolist()]
            assert np.array_equal(W[r], want, equal_nan=True), (k, e)
        assert tt.tolist() == [x for x in np.arange(max(100.0, t - 11.0), t + 0.5)]
    assert layouts == {True, False}


#: one entity per signal: the controller's store (a node's summary signals, one row each), where
#: a layout's blocks are written as one slab (WindowStore.node_slabs)
SINGLE = {"gpu_util_ratio": [""], "gpu_power_watts": [""], "pcie_rx_bytes_total": [""],
          "rdma_port_xmit_bytes_total": [""], "host_tcp_retrans_segs_total": [""],
          "netdev_qdisc_backlog_bytes": [""], "vllm_kv_cache_usage_ratio": ["0"],
          "vllm_num_requests_waiting": ["0"], "summary_burst_start_seconds": [""],
          "not_catalogued_signal": [""]}


class SlabStore(WindowStore):
    """node_slabs on, counting the collections written through a slab."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.node_slabs = True
        self.slab_writes = 0

    def _slab_put(self, sl, ts, V, cols) -> None:
        self.slab_writes += len(ts)
        self._in_put = True
        try:
            super()._slab_put(sl, ts, V, cols)
        finally:
            self._in_put = False

    def _slab_put_one(self, sl, t, column) -> None:  # (ingest_collection's, or _slab_put's: counted there)
        self.slab_writes += not getattr(self, "_in_put", False)
        super()._slab_put_one(sl, t, column)


def row_capacities(store: WindowStore) -> dict:
    """Each block's row capacity once every slab is undone (what a later new row will see)."""
    for per_node in store.blocks.values():
        for b in per_node.values():
            if b.slab is not None:
                store._detach(b.slab)
    return {(sig, node): (b.values.shape, b.last_seen.shape, b.slab)
            for sig, per_node in store.blocks.items() for node, b in per_node.items()}


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("horizon,cap", [(600.0, 64), (5.0, 4), (2.0, 2)])
def test_slab_writes_leave_the_store_of_the_general_path(cat, seed, horizon, cap) -> None:
    """Layouts of one-row blocks written as one slab: the same store as the general path, with
    late, repeated and NaN samples, entities that appear (a second row undoes the slab), layouts
    that change (another layout writing a slab's block), compaction, growth and gc."""
    events = stream(seed, steps=400, entities=SINGLE, disjoint=True, churn=0.01)
    ref = play(GeneralPathStore(cat, horizon=horizon, initial_cap=cap), events, None)
    want = snapshot(ref)
    for store, group, shared in ((SlabStore(cat, horizon=horizon, initial_cap=cap), None, False),
                                 (SlabStore(cat, horizon=horizon, initial_cap=cap), random.Random(seed), False),
                                 (SlabStore(cat, horizon=horizon, initial_cap=cap), random.Random(seed), True)):
        events_in = sharing(events) if shared else events
        got = play(store, events_in, group, shared)
        assert snapshot(got) == want
        assert row_capacities(got) == row_capacities(ref)


def test_the_slab_streams_take_the_slab_path(cat) -> None:
    """The streams above exercise slabs (not only the per-block writes they fall back to): most
    seeds write collections through one."""
    taken = 0
    for seed in range(30):
        events = stream(seed, steps=400, entities=SINGLE, disjoint=True, churn=0.01)
        taken += play(SlabStore(cat, horizon=5.0, initial_cap=4), events, random.Random(seed)).slab_writes > 0
    assert taken >= 25


def test_slab_ingest_collections_matches_one_at_a_time(cat) -> None:
    """Replay's and the controller's matrix write (ingest_collections) through a slab, with a
    horizon that compacts and a capacity that grows, against one ingest per collection."""
    rng = np.random.default_rng(7)
    names = [s for s in SINGLE if s != "not_catalogued_signal"]
    sig = np.array(names + ["not_catalogued_signal"], dtype=object)
    ent = np.array([SINGLE[s][0] for s in sig], dtype=object)
    node = np.array(["n1"] * len(sig), dtype=object)
    ref = WindowStore(cat, horizon=3.0, initial_cap=4)
    slab = SlabStore(cat, horizon=3.0, initial_cap=4)
    t = 10.0
    first = rng.random(len(sig))
    for s in (ref, slab):
        s.ingest(SampleBatch(np.full(len(sig), t), node, ent, sig, first))
    for _ in range(60):
        k = int(rng.integers(1, 6))
        ts = t + np.cumsum(rng.choice([0.1, 0.5, 2.0], size=k))
        t = float(ts[-1])
        V = rng.random((k, len(sig)))
        V[rng.random(V.shape) < 0.1] = np.nan
        for j in range(k):
            ref.ingest(SampleBatch(np.full(len(sig), ts[j]), node, ent, sig, V[j]))
        assert slab.ingest_collections(sig, ent, node, ts, V)
        assert snapshot(slab) == snapshot(ref)
    assert slab.slab_writes > 0


@pytest.mark.parametrize("horizon,cap", [(3.0, 4), (600.0, 2)])
@pytest.mark.parametrize("uncatalogued", [False, True])
def test_slab_ingest_collection_matches_one_at_a_time(cat, horizon, cap, uncatalogued) -> None:
    """The controller's write of one collection (ingest_collection: a node's one summary since
    the last flush, a digest row) against one ingest per collection: through slab growth and
    compaction, and the collections it must hand to the general write (a late or repeated
    time, a full slab, a layout the store does not cache yet, a block outside the slab)."""
    rng = np.random.default_rng(11)
    names = [s for s in SINGLE if s != "not_catalogued_signal"]
    sig = np.array(names + ["not_catalogued_signal"] * uncatalogued, dtype=object)
    ent = np.array([SINGLE[s][0] for s in sig], dtype=object)
    node = np.array(["n1"] * len(sig), dtype=object)
    ref = WindowStore(cat, horizon=horizon, initial_cap=cap)
    slab = SlabStore(cat, horizon=horizon, initial_cap=cap)
    t = 10.0
    back = (sig[::-1].copy(), ent[::-1].copy(), node[::-1].copy())  # the same samples in another order
    for k in range(140):
        t += {40: 0.0, 41: -0.4, 90: -0.4}.get(k, float(rng.choice([0.3, 0.7, 2.0])))  # repeated, late
        if k == 60:  # two of the signals alone, at a time of their own: the slab is undone
            part = SampleBatch(np.full(2, t - 0.1), node[:2], ent[:2], sig[:2], rng.random(2))
            ref.ingest(part)
            slab.ingest(part)
        s_, e_, n_ = back if 20 <= k < 40 and k % 2 else (sig, ent, node)
        v = rng.random(len(sig))
        v[rng.random(len(sig)) < 0.1] = np.nan
        ref.ingest(SampleBatch(np.full(len(sig), t), n_, e_, s_, v))
        slab.ingest_collection(s_, e_, n_, t, v)  # (k 0 and 21: a layout the store does not know yet)
        assert snapshot(slab) == snapshot(ref), k
    assert slab.slab_writes > 100


def test_another_layout_writing_a_slab_block_alone_undoes_the_slab(cat) -> None:
    """A node's full summary (layout A, a slab once its blocks share a time axis) and a partial
    one (layout B, two of A's signals) already cached: B's newer sample on its own must not land
    on the slab's shared time axis (A's next write would take its column)."""
    names = ["gpu_util_ratio", "gpu_power_watts", "pcie_rx_bytes_total", "host_tcp_retrans_segs_total",
             "netdev_qdisc_backlog_bytes"]

    def batch(t: float, sigs: list[str], v: float) -> SampleBatch:
        n = len(sigs)
        return SampleBatch(np.full(n, t), np.full(n, "n1", dtype=object), np.full(n, "", dtype=object),
                           np.array(sigs, dtype=object), np.arange(n) + v)

    seq = [batch(1.0, names, 0.0), batch(2.0, names, 10.0), batch(2.0, names[:2], 20.0),  # B at A's time
           batch(3.0, names, 30.0),  # A: its blocks share a time axis again (a slab)
           batch(3.5, names[:2], 40.0),  # B cached, a time of its own
           batch(4.0, names, 50.0), batch(4.5, names[:2], 60.0), batch(5.0, names, 70.0)]
    ref = WindowStore(cat)
    slab = SlabStore(cat)
    for b in seq:
        ref.ingest(b)
        slab.ingest(b)
        assert snapshot(slab) == snapshot(ref)
    assert slab.slab_writes > 0
    assert slab.series("gpu_util_ratio", "n1")[0].tolist() == [1.0, 2.0, 3.0, 3.5, 4.0, 4.5, 5.0]


#: a node's summary signals of one entity each (SINGLE without the uncatalogued one)
SUMMARY = [s for s, e in SINGLE.items() if e == [""] and s != "not_catalogued_signal"]


def _summary(t: float, sigs: list[str], v: float) -> SampleBatch:
    n = len(sigs)
    return SampleBatch(np.full(n, t), np.full(n, "n1", dtype=object), np.array([SINGLE[s][0] for s in sigs], dtype=object),
                       np.array(sigs, dtype=object), np.arange(n) + v)


def _slab_of(store: WindowStore, sigs: list[str]) -> set:
    return {id(store.blocks[s]["n1"].slab) if store.blocks[s]["n1"].slab is not None else None for s in sigs}


def test_a_summary_missing_a_signal_once_costs_the_slab_that_block_only(cat) -> None:
    """A summary that leaves one signal out once (its source had nothing in the interval) puts
    that signal's block on a time axis of its own for good: per-block writes never give it the
    column back, so it can never share the others' axis. The node's other blocks still share
    one and are written as one slab from the next summary on, through compaction and growth,
    the store exactly the general path's all along."""
    hole = SUMMARY[2]
    ref, slab = GeneralPathStore(cat, horizon=5.0, initial_cap=4), SlabStore(cat, horizon=5.0, initial_cap=4)
    for k in range(1, 61):
        sigs = [s for s in SUMMARY if s != hole] if k == 10 else SUMMARY
        before = slab.slab_writes
        for s in (ref, slab):
            s.ingest(_summary(float(k), sigs, 10.0 * k))
        assert snapshot(slab) == snapshot(ref)
        if k > 11:
            assert slab.slab_writes == before + 1, k  # the collection went through a slab
    others = [s for s in SUMMARY if s != hole]
    assert len(_slab_of(slab, others)) == 1 and None not in _slab_of(slab, others)
    assert _slab_of(slab, [hole]) == {None}
    alone, shared = slab.blocks[hole]["n1"], slab.blocks[others[0]]["n1"]
    assert alone.times[: alone.n].tolist() != shared.times[: shared.n].tolist()  # 50 summaries on


def test_a_signal_that_comes_and_goes_shares_one_slab_between_the_layouts(cat) -> None:
    """Summaries with and without one signal in turn (two layouts of the node, e.g. an engine
    value absent while the engine idles): both write the blocks they have in common through the
    same slab, made once, instead of one layout undoing it and the other making it again at
    every summary."""
    hole = SUMMARY[-1]
    ref, slab = GeneralPathStore(cat, horizon=5.0, initial_cap=4), SlabStore(cat, horizon=5.0, initial_cap=4)
    made: list = []  # every slab written through (held: ids stay unique)
    for k in range(1, 41):
        sigs = [s for s in SUMMARY if s != hole] if k % 2 else SUMMARY
        before = slab.slab_writes
        for s in (ref, slab):
            s.ingest(_summary(float(k), sigs, 10.0 * k))
        assert snapshot(slab) == snapshot(ref)
        sl = slab.blocks[SUMMARY[0]]["n1"].slab
        if sl is not None and all(sl is not m for m in made):
            made.append(sl)
        if k > 3:
            assert slab.slab_writes == before + 1, k
    assert len(made) <= 2


def test_signals_that_appear_later_get_a_slab_of_their_own(cat) -> None:
    """A node's summaries gain signals after a while (its engine came up): those blocks are
    younger than the others, on a time axis of their own for good, and are written as a slab of
    their own beside the older blocks' one - not every block alone for the rest of the node's
    life."""
    ref, slab = GeneralPathStore(cat, horizon=5.0, initial_cap=4), SlabStore(cat, horizon=5.0, initial_cap=4)
    early, later = SUMMARY[:4], SUMMARY[4:] + ["vllm_kv_cache_usage_ratio", "vllm_num_requests_waiting"]
    for k in range(1, 31):
        sigs = early if k < 8 else early + later
        for s in (ref, slab):
            s.ingest(_summary(float(k), sigs, 10.0 * k))
        assert snapshot(slab) == snapshot(ref)
    a, b = _slab_of(slab, early), _slab_of(slab, later)
    assert len(a) == len(b) == 1 and None not in a | b and a != b


def _nodes_at_one_pace(nodes: int, steps: int, per_flush: int, dt: float):
    """Flushes of ``nodes`` nodes' collections (the SINGLE signals, one entity each), every node
    sending at the same pace ``dt``: ``per_flush`` collections a node per flush, written as one
    matrix (ingest_collections), as the controller's flush writes a node's summaries."""
    names = [s for s in SINGLE if s != "not_catalogued_signal"]
    sig = np.array(names, dtype=object)
    ent = np.array([SINGLE[s][0] for s in sig], dtype=object)
    node = [np.array([f"n{i}"] * len(sig), dtype=object) for i in range(nodes)]  # shared: layouts by identity
    rng = np.random.default_rng(3)
    for f in range(steps):
        out = []
        for i in range(nodes):
            ts = 100.0 + dt * (np.arange(per_flush) + f * per_flush) + i * 1e-4
            V = rng.random((per_flush, len(sig)))
            out.append((sig, ent, node[i], ts, V))
        yield out


def _whole(store: WindowStore) -> dict:
    """Every block's arrays to their capacity (unused columns included), slabs undone."""
    row_capacities(store)  # detaches
    return {(sig, node): (b.times.tolist(), np.nan_to_num(b.values, nan=-1.5).tolist())
            for sig, per_node in store.blocks.items() for node, b in per_node.items()}


@pytest.mark.parametrize("deferred", [None, 1, 7], ids=["in-the-write", "deferred-drained-each-flush",
                                                     "deferred-drained-every-7th-flush"])
@pytest.mark.parametrize("per_flush,dt,horizon", [(1, 1.0, 1e9), (3, 0.5, 1e9), (2, 1.0, 40.0), (5, 0.1, 7.0)])
def test_slab_growth_prepared_ahead_is_the_doubling(cat, per_flush, dt, horizon, deferred) -> None:
    """Slabs that fill at one pace prepare their doubled arrays each at its own point before
    full (SLAB_PREPARE_SHARE): the store is the per-block writes' store at every flush, with
    growths through several capacities and, with a short horizon, room made by dropping
    columns (a preparation made before the horizon was reached is then left unused). Also
    when the preparations are queued (``defer_prepare``, as the controller's store does) and
    made between flushes, or so seldom that slabs grow before theirs is made (it is then
    passed over)."""
    ref = WindowStore(cat, horizon=horizon, initial_cap=4)
    slab = SlabStore(cat, horizon=horizon, initial_cap=4)
    slab.defer_prepare = deferred is not None
    used = []
    room = slab._slab_room

    def counting_room(sl, t):
        used.append(sl.spare is not None and sl.times.shape[0] * 2 == (sl.spare[0].shape[0]))
        room(sl, t)

    slab._slab_room = counting_room
    flushes = 0
    for flush in _nodes_at_one_pace(12, 70, per_flush, dt):
        for cols in flush:
            ts, V = cols[3], cols[4]
            for j in range(len(ts)):
                ref.ingest(SampleBatch(np.full(len(cols[0]), ts[j]), cols[2], cols[1], cols[0], V[j]))
            if not slab.ingest_collections(*cols):  # a new node: its layout learned on the way
                slab.ingest_many([SampleBatch(np.full(len(cols[0]), ts[j]), cols[2], cols[1], cols[0], V[j])
                                  for j in range(len(ts))], shared_columns=True)
        assert snapshot(slab) == snapshot(ref)
        flushes += 1
        if deferred is not None and flushes % deferred == 0:
            queued = slab.preparations_queued
            # each call makes (or passes over) the oldest one and says how many are left
            assert [slab.prepare_next() for _ in range(queued)] == list(range(queued - 1, -1, -1))
            assert slab.prepare_next() == 0
        elif deferred is None:
            assert slab.preparations_queued == 0
    assert slab.slab_writes > 0 and any(used)
    if deferred == 7:
        assert not all(used)  # some slabs grew before their queued preparation was made
    assert _whole(slab) == _whole(ref)


def test_slabs_at_one_pace_do_not_all_grow_in_one_flush(cat) -> None:
    """40 nodes' slabs filling together: no flush prepares or makes more than a fifth of the
    doublings (without the spread, every slab doubled in the flush that filled it)."""
    slab = SlabStore(cat, horizon=1e9, initial_cap=64)
    costly = []  # per flush: slabs that allocated doubled arrays (prepared or at the growth)
    prepare, room = slab._slab_prepare, slab._slab_room
    count = [0]

    def counting_prepare(sl, t):
        had = sl.spare
        prepare(sl, t)
        count[0] += had is None and sl.spare is not None

    def counting_room(sl, t):
        count[0] += sl.spare is None
        room(sl, t)

    slab._slab_prepare, slab._slab_room = counting_prepare, counting_room
    for flush in _nodes_at_one_pace(40, 300, 1, 1.0):
        count[0] = 0
        for cols in flush:
            if not slab.ingest_collections(*cols):  # a new node
                slab.ingest_many([SampleBatch(np.full(len(cols[0]), cols[3][0]), cols[2], cols[1], cols[0],
                                              cols[4][0])], shared_columns=True)
        costly.append(count[0])
    caps = {b.times.shape[0] for per in slab.blocks.values() for b in per.values()}
    assert caps == {512}  # grew 64 -> 128 -> 256 -> 512
    assert sum(costly) >= 3 * 40 - 40  # every slab prepared its growths (the first ones may not have)
    assert max(costly) <= 8, costly
