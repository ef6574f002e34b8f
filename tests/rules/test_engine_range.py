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
