"""``Engine.evaluate_range`` publishes, tick for tick, exactly the findings (evidence included) of
``Engine.evaluate`` called at each tick, for random rules over random data with missing samples,
entities that appear mid-range, samples that arrive after the tick stamped with its time, and
ranges cut anywhere."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skewd.model import BatchBuilder
from skewd.rules.engine import Engine
from skewd.rules.windows import RANGE_KERNELS
from skewd.rules.store import WindowStore

from .test_engine_fast_paths import CAT, _engine, _rules_yaml, build_store, root, tables

TICKS = 12


def _batches(full_store, k: int) -> list:
    out = []
    for sig, per_node in full_store.blocks.items():
        for node, blk in per_node.items():
            b = BatchBuilder(node)
            col = np.flatnonzero(blk.times[: blk.n] == float(k))
            for ent, row in blk.rows.items():
                if len(col) and not math.isnan(blk.values[row, col[0]]):
                    b.add(float(k), ent, sig, float(blk.values[row, col[0]]))
            if len(b.build()):
                out.append(b.build())
    return out


def _run(table, exprs, fors, keeps, late, cuts):
    text = _rules_yaml(exprs, fors, keeps)
    full_store = build_store(table, TICKS)
    one_store, many_store = WindowStore(CAT, horizon=1e6), WindowStore(CAT, horizon=1e6)
    one, many = Engine(_engine(text), one_store), Engine(_engine(text), many_store)
    want: list = []
    got: list = []
    waiting: list[float] = []
    seen: list[float] = []

    def flush():
        if waiting:
            got.extend(many.evaluate_range(waiting, many_store.take_births(), seen))
            waiting.clear()
            seen.clear()

    for k in range(TICKS):
        t = float(k) + (0.0 if not late[k] else 0.5)
        if not late[k]:  # the batch stamped k arrives before tick k
            for b in _batches(full_store, k):
                one_store.ingest(b)
                many_store.track_births(len(waiting))
                many_store.ingest(b)
        want.append(one.evaluate(t))
        waiting.append(t)
        seen.append(many_store.latest_t)
        if late[k]:  # ... or after it: tick k.5 did not see it, tick k+1 does
            for b in _batches(full_store, k):
                one_store.ingest(b)
                many_store.track_births(len(waiting))
                many_store.ingest(b)
        if cuts[k]:
            flush()
    flush()
    return want, got


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=tables, exprs=st.lists(root, min_size=1, max_size=4),
       fors=st.lists(st.integers(0, 3), min_size=4, max_size=4),
       keeps=st.lists(st.integers(0, 2), min_size=4, max_size=4),
       late=st.lists(st.booleans(), min_size=TICKS, max_size=TICKS),
       cuts=st.lists(st.booleans(), min_size=TICKS, max_size=TICKS))
def test_range_findings_equal_per_tick(table, exprs, fors, keeps, late, cuts):
    want, got = _run(table, exprs, fors, keeps, late, cuts)
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(want, got)):
        assert a == b, (k, exprs)


def test_one_range_over_every_tick_with_entities_appearing_late():
    nan = math.nan
    table = [[1, 2, 3, 4, 0, 0, 1, 2, 3, 4, 4, 4],
             [nan] * 5 + [9, 9, 9, 9, 0, 0, 0],  # gpu1 appears at tick 5
             [3] * 12,
             [nan] * 8 + [0, 0, 0, 0],  # gpu3 at tick 8
             [2, nan, 2, nan, 2, nan, 2, nan, 2, nan, 2, nan],
             [nan] * 12,
             [1] * 12]
    exprs = ["count(g_val, 5s) >= 1 and last(g_val, 3s) > 1", "peer_dev(avg(g_val, 3s)) > 0.2",
             "default(avg(k_val, 3s), 0) == 0 and absent(g_val, 2s)", "delta(g_val, 5s) < 0 or present(k_val, 2s)"]
    want, got = _run(table, exprs, [0, 1, 2, 0], [0, 1, 0, 2], [False] * TICKS, [False] * TICKS)
    assert got == want
    assert sum(len(w) for w in want) > 5


def test_range_kernels_are_the_exact_ones():
    # sums and means must stay per tick (summation order), min/max too (sign of zero)
    assert set(RANGE_KERNELS) == {"count", "present", "absent", "last", "delta"}


def test_counter_range_kernel_is_the_per_tick_kernel_bit_for_bit():
    # increase/rate inside a range sum each tick's slice of counter steps computed once for the
    # range (windows._r_counter): compare them with the per-tick kernels, bytes and all, on a
    # wide time-major block (flows) and a narrow row-major one, with resets, wraps at 2**32,
    # gaps (NaN: the exact path) and windows too short for a step. Values are invented.
    from skewd.model import Catalogue, SampleBatch, signal
    from skewd.rules.windows import EvalContext, window_vec

    cat = Catalogue([signal("f_bytes_total", "counter", "bytes", "flow", "a wrapping counter", "t", 32),
                     signal("c_total", "counter", "1", "gpu", "a counter", "t")])
    rng = np.random.default_rng(7)
    store = WindowStore(cat, horizon=1e6)
    flows = np.array([f"flow{i}" for i in range(80)], dtype=object)
    gpus = np.array([f"gpu{i}" for i in range(4)], dtype=object)
    level = {"f_bytes_total": rng.uniform(0, 2.0 ** 32, len(flows)), "c_total": rng.uniform(0, 100, len(gpus))}
    for k in range(120):
        t = 1000.0 + k * 0.5
        for sig, ents in (("f_bytes_total", flows), ("c_total", gpus)):
            lv = level[sig] + rng.exponential(1e6 if sig == "f_bytes_total" else 3.0, len(ents))
            if sig == "f_bytes_total":
                lv = np.where(lv >= 2.0 ** 32, lv - 2.0 ** 32, lv)  # wraps
            lv = np.where(rng.random(len(ents)) < 0.02, rng.uniform(0, 10, len(ents)), lv)  # resets
            level[sig] = lv
            v = np.where(rng.random(len(ents)) < (0.01 if k < 60 else 0.0), np.nan, lv)  # gaps early on
            keep = rng.random(len(ents)) < 0.97 if k % 7 == 3 else np.ones(len(ents), bool)  # missing samples
            n = int(keep.sum())
            store.ingest(SampleBatch(np.full(n, t), np.full(n, "n1", dtype=object), ents[keep],
                                     np.full(n, sig, dtype=object), v[keep]))
    from skewd.rules.windows import identity
    ticks = 1000.0 + np.arange(0, 120) * 0.5 + 0.25
    for sig in ("f_bytes_total", "c_total"):
        blocks = list(store.signal_blocks(sig))
        eids = np.concatenate([b.eids[: b.nrows] for b in blocks])
        assert blocks[0].time_major == (sig == "f_bytes_total")
        for kind in ("increase", "rate"):
            for dur in (0.4, 3.0, 20.0):
                wb = cat[sig].wrap_bits
                fn = getattr(__import__("skewd.rules.functions", fromlist=["x"]), kind)
                kernel = (lambda t, W, fn=fn, wb=wb: fn(t, W, wb))
                key = (kind, sig, identity, dur)

                def ctx(now, tk=None):
                    return EvalContext(store, now, eids, eids, np.zeros(len(eids), np.int64),
                                       np.array(eids, dtype=object), np.array(["n1"] * len(eids), dtype=object),
                                       60.0, {}, [], None, tk)

                got = window_vec(ctx(float(ticks[-1]), ticks), sig, dur, key, kernel)
                for j, tk in enumerate(ticks):
                    want = window_vec(ctx(float(tk)), sig, dur, key, kernel)
                    assert got[j].tobytes() == np.asarray(want, dtype=float).tobytes(), (sig, kind, dur, j)
