"""The vectorised evaluator equals a plain per-entity reference on random data.

Random series (missing samples, counter resets and 32-bit wraps included) go through the real
path: SampleBatch → WindowStore → compiled expression → one value per entity. The reference
below recomputes each function with ordinary Python loops over one entity's samples.
"""
from __future__ import annotations

import math
import statistics

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skewd.model import BatchBuilder, Catalogue, signal
from skewd.rules.expr import CompileEnv, compile_expr
from skewd.rules.windows import EvalContext
from skewd.model import Scope
from skewd.rules.store import WindowStore

CAT = Catalogue([
    signal("g_val", "gauge", "1", "gpu", "a gauge", "t"),
    signal("c_val", "counter", "1", "gpu", "a counter", "t"),
    signal("w_val", "counter", "1", "gpu", "a 32-bit counter", "t", wrap_bits=32),
])
WRAP = 2.0 ** 32


def window(samples, now, d):
    return [(t, v) for t, v in samples if now - d < t <= now and not math.isnan(v)]


def ref_increase(w, wrap=False):
    if len(w) < 2:
        return math.nan
    inc = 0.0
    for (_, a), (_, b) in zip(w, w[1:]):
        if b >= a:
            inc += b - a
        elif wrap and a >= 0.75 * WRAP:
            inc += b + (WRAP - a)
        else:
            inc += b
    return inc


def ref_rate(w, wrap=False):
    if len(w) < 2 or w[-1][0] == w[0][0]:
        return math.nan
    return ref_increase(w, wrap) / (w[-1][0] - w[0][0])


def vals(w):
    return [v for _, v in w]


def pstd(xs):
    return statistics.pstdev(xs) if xs else math.nan


def ref_gaps(w, thr):
    runs, prev = 0, True
    for _, v in w:
        cond = v > thr
        if not cond and prev:
            runs += 1
        prev = cond
    return float(runs) if w else math.nan


def ref_longest_gap(w, thr, now, d):
    if not w:
        return math.nan
    edges = [now - d] + [t for t, v in w if v > thr] + [now]
    return max(b - a for a, b in zip(edges, edges[1:]))


def ref_changes(w):
    if not w:
        return math.nan
    return float(sum(1 for (_, a), (_, b) in zip(w, w[1:]) if a != b))


def q(xs, p):
    return float(np.quantile(np.array(xs), p)) if xs else math.nan


REF = {
    "avg": lambda w, **k: statistics.fmean(vals(w)) if w else math.nan,
    "min": lambda w, **k: min(vals(w)) if w else math.nan,
    "max": lambda w, **k: max(vals(w)) if w else math.nan,
    "sum": lambda w, **k: sum(vals(w)) if w else math.nan,
    "count": lambda w, **k: float(len(w)),
    "stddev": lambda w, **k: pstd(vals(w)),
    "cov": lambda w, **k: (pstd(vals(w)) / abs(statistics.fmean(vals(w)))
                           if w and statistics.fmean(vals(w)) != 0 else math.nan),
    "burstiness": lambda w, **k: (max(vals(w)) / statistics.fmean(vals(w))
                                  if w and statistics.fmean(vals(w)) > 0 else math.nan),
    "delta": lambda w, **k: (w[-1][1] - w[0][1]) if len(w) >= 2 else math.nan,
    "changes": lambda w, **k: ref_changes(w),
    "absent": lambda w, **k: 1.0 if not w else 0.0,
    "present": lambda w, **k: 1.0 if w else 0.0,
    "p50": lambda w, **k: q(vals(w), 0.5),
    "p99": lambda w, **k: q(vals(w), 0.99),
    "last": lambda w, **k: w[-1][1] if w else math.nan,
}

# values whose squares float64 can hold: below ~1e-154 a deviation's square underflows to 0, so
# stddev (numpy's, as Prometheus' stddev_over_time) reads 0 where the exact reference does not
# (Hypothesis found [0.0, 4.66e-243]: cov 0 against 1). No metric lives there; such values are 0
finite = st.floats(-1e6, 1e6, allow_nan=False).map(lambda x: 0.0 if abs(x) < 1e-150 else x)
series_values = st.lists(st.one_of(finite, st.just(math.nan)), min_size=1, max_size=30)


def build_store(table, times, sig):
    store = WindowStore(CAT, horizon=1e6)
    for k, t in enumerate(times):
        b = BatchBuilder("n1")
        for e, row in enumerate(table):
            if k < len(row) and not math.isnan(row[k]):
                b.add(t, f"gpu{e}", sig, row[k])
        store.ingest(b.build())
    return store


def evaluate(store, expr, now, lookback=60.0):
    comp = compile_expr(expr, CompileEnv(CAT, Scope.GPU))
    reg = store.registry
    eids = np.unique(np.concatenate([store.entities(s) for s in comp.signals]))
    names = np.array([reg.keys[e][2] for e in eids], dtype=object)
    nodes = np.array([reg.keys[e][1] for e in eids], dtype=object)
    node_eids = np.array([reg.node_id(n) for n in nodes], dtype=np.int64)
    ctx = EvalContext(store, now, eids, node_eids, node_eids.copy(), names, nodes, lookback, {})
    out = np.broadcast_to(np.asarray(comp.fn(ctx), dtype=float), (len(eids),))
    return dict(zip(names, out))


def close(a, b):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-7, abs_tol=1e-6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=st.lists(series_values, min_size=1, max_size=5), d=st.integers(1, 40), now=st.integers(0, 35),
       fn=st.sampled_from(sorted(REF)))
def test_gauge_window_functions_match_reference(table, d, now, fn):
    n = max(len(r) for r in table)
    times = [float(k) for k in range(n)]
    store = build_store(table, times, "g_val")
    got = evaluate(store, f"{fn}(g_val, {d}s)", float(now))
    for e, row in enumerate(table):
        if all(math.isnan(v) for v in row):
            continue
        w = window(list(zip(times, row)), now, d)
        want = REF[fn](w)
        assert close(got[f"gpu{e}"], want), (fn, e, w, got[f"gpu{e}"], want)


counter_steps = st.lists(st.tuples(st.integers(0, 1000), st.booleans(), st.booleans()), min_size=1, max_size=30)


def counter_rows(steps, wrap):
    """Monotonic with resets (to a small value) and, for wrap counters, passes over 2**32."""
    v = WRAP - 2500.0 if wrap else 0.0
    row = []
    for inc, reset, missing in steps:
        v = float(inc) if reset and not wrap else (v + inc) % WRAP if wrap else v + inc
        row.append(math.nan if missing else v)
    return row


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(counter_steps, min_size=1, max_size=4), d=st.integers(2, 40), now=st.integers(0, 35),
       fn=st.sampled_from(["rate", "increase"]), wrap=st.booleans())
def test_counter_rate_increase_survive_resets_and_wraps(steps, d, now, fn, wrap):
    table = [counter_rows(s, wrap) for s in steps]
    n = max(len(r) for r in table)
    times = [float(k) * 0.5 for k in range(n)]
    sig = "w_val" if wrap else "c_val"
    store = build_store(table, times, sig)
    got = evaluate(store, f"{fn}({sig}, {d}s)", float(now) * 0.5)
    for e, row in enumerate(table):
        if all(math.isnan(v) for v in row):
            continue
        w = window(list(zip(times, row)), now * 0.5, d)
        want = (ref_rate if fn == "rate" else ref_increase)(w, wrap)
        assert close(got[f"gpu{e}"], want), (fn, e, w, got[f"gpu{e}"], want)
        if not math.isnan(want):
            assert want >= 0


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=st.lists(series_values, min_size=1, max_size=5), d=st.integers(1, 40), now=st.integers(0, 35),
       thr=st.floats(-1e6, 1e6, allow_nan=False))
def test_gaps_and_longest_gap_match_reference(table, d, now, thr):
    n = max(len(r) for r in table)
    times = [float(k) for k in range(n)]
    store = build_store(table, times, "g_val")
    got_g = evaluate(store, f"gaps(g_val > {thr!r}, {d}s)", float(now))
    got_l = evaluate(store, f"longest_gap(g_val > {thr!r}, {d}s)", float(now))
    for e, row in enumerate(table):
        if all(math.isnan(v) for v in row):
            continue
        w = window(list(zip(times, row)), now, d)
        assert close(got_g[f"gpu{e}"], ref_gaps(w, thr)), (w, got_g[f"gpu{e}"])
        assert close(got_l[f"gpu{e}"], ref_longest_gap(w, thr, now, d)), (w, got_l[f"gpu{e}"])


def ref_peer(xs, fn):
    ok = [x for x in xs if not math.isnan(x)]
    out = []
    for x in xs:
        if fn == "peer_median":
            out.append(statistics.median(ok) if ok else math.nan)
        elif fn == "peer_mean":
            out.append(statistics.fmean(ok) if ok else math.nan)
        elif fn == "spread":
            out.append(max(ok) - min(ok) if ok else math.nan)
        elif fn == "rank":
            out.append(math.nan if math.isnan(x) else 1.0 + sum(1 for y in ok if y > x))
        elif fn == "peer_zscore":
            s = pstd(ok) if ok else 0
            out.append((x - statistics.fmean(ok)) / s if ok and s > 0 and not math.isnan(x) else math.nan)
        elif fn == "peer_count":
            out.append(float(len(ok)))
        elif fn in ("peer_dev", "peer_others"):
            others = [y for j, y in enumerate(xs) if j != len(out) and not math.isnan(y)]
            if len(xs) < 2 or not others or math.isnan(x):
                out.append(math.nan)
            elif fn == "peer_others":
                out.append(statistics.median(others))
            else:
                m = statistics.median(others)
                out.append((x - m) / abs(m) if m != 0 else math.nan)
    return out


# signal values as collectors report them: 0 or at least 1e-9 in magnitude. Around 1e-308 the
# group variance underflows to 0 in numpy but not in the reference's exact arithmetic.
REAL = st.one_of(st.just(0.0), st.floats(1e-9, 1e3), st.floats(-1e3, -1e-9))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(st.lists(st.one_of(REAL, st.just(math.nan)),
                               min_size=1, max_size=6), min_size=1, max_size=3),
       fn=st.sampled_from(["peer_median", "peer_mean", "spread", "rank", "peer_zscore", "peer_count", "peer_dev",
                           "peer_others"]))
def test_peer_functions_match_reference_per_node_group(nodes, fn):
    """GPU-scope peers are the GPUs of the same node: each node is its own group."""
    store = WindowStore(CAT, horizon=1e6)
    for ni, row in enumerate(nodes):
        b = BatchBuilder(f"n{ni}")
        for e, v in enumerate(row):
            if not math.isnan(v):
                b.add(1.0, f"gpu{e}", "g_val", v)
        store.ingest(b.build())
    if not store.samples_ingested:
        return
    comp = compile_expr(f"{fn}(last(g_val, 10s))", CompileEnv(CAT, Scope.GPU))
    reg = store.registry
    eids = np.unique(store.entities("g_val"))
    keys = [reg.keys[e] for e in eids]
    nodes_a = np.array([k[1] for k in keys], dtype=object)
    names = np.array([k[2] for k in keys], dtype=object)
    node_eids = np.array([reg.node_id(n) for n in nodes_a], dtype=np.int64)
    ctx = EvalContext(store, 1.0, eids, node_eids, node_eids.copy(), names, nodes_a, 60.0, {})
    got = dict(zip(zip(nodes_a, names), comp.fn(ctx)))
    for ni, row in enumerate(nodes):
        present = [(e, v) for e, v in enumerate(row) if not math.isnan(v)]
        if not present:
            continue
        want = ref_peer([v for _, v in present], fn)
        for (e, _), wv in zip(present, want):
            gv = got[(f"n{ni}", f"gpu{e}")]
            assert close(gv, wv), (fn, row, e, gv, wv)
