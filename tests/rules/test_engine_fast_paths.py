"""The engine's fast paths change how much is computed, never what comes out.

- ``Compiled.fires`` (true/false masks with short-circuit ``and``/``or``) marks exactly the
  entities where the full three-valued value ``Compiled.fn`` is 1, for random expressions
  over random windows with missing samples.
- An engine driven by ``fires`` publishes the same findings, evidence included, as one that
  evaluates every expression in full on every tick.
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skewd.model import BatchBuilder, Catalogue, Scope, signal
from skewd.rules import functions as F
from skewd.rules.engine import Engine
from skewd.rules.expr import CompileEnv, compile_expr
from skewd.rules.windows import EvalContext
from skewd.rules.loader import load_rules
from skewd.rules.store import WindowStore

CAT = Catalogue([
    signal("g_val", "gauge", "1", "gpu", "a gauge", "t"),
    signal("k_val", "gauge", "1", "gpu", "another gauge", "t"),
    signal("c_val", "counter", "1", "gpu", "a counter", "t"),
    signal("h_val", "gauge", "1", "node", "a node gauge", "t"),
])

# -- random expressions ------------------------------------------------------------------------
OPS = ["<", "<=", ">", ">=", "==", "!="]
thr = st.sampled_from(["0", "1", "2", "2.5", "3", "-1"])
dur = st.sampled_from(["2s", "3s", "5s", "8s"])
gauge = st.sampled_from(["g_val", "k_val"])
wfn = st.sampled_from(["avg", "max", "min", "last", "sum", "count", "p50", "delta", "stddev", "changes",
                       "absent", "present", "burstiness"])
peer = st.sampled_from(["peer_median", "peer_dev", "peer_others", "peer_mean", "rank", "peer_count", "spread"])
op = st.sampled_from(OPS)

value = st.one_of(
    st.builds(lambda f, s, d: f"{f}({s}, {d})", wfn, gauge, dur),
    st.builds(lambda f, d: f"{f}(c_val, {d})", st.sampled_from(["rate", "increase"]), dur),
    st.builds(lambda p, s, d: f"{p}(avg({s}, {d}))", peer, gauge, dur),
    st.builds(lambda s, d, c: f"default(avg({s}, {d}), {c})", gauge, dur, thr),
    st.builds(lambda d: f"avg(h_val, {d})", dur),
    st.builds(lambda s, t, d: f"gaps({s} > {t}, {d})", gauge, thr, dur),
    gauge,
    st.just("h_val"),
)
atom = st.one_of(
    st.builds(lambda v, o, t: f"{v} {o} {t}", value, op, thr),
    st.builds(lambda a, o, v, t: f"{a} {o} {v} <= {t}", thr, st.sampled_from(["<", "<="]), value, thr),
    st.builds(lambda v, w, o: f"{v} {o} {w}", value, value, op),
    st.sampled_from(['entity == "gpu1"', 'entity != "gpu0"', 'entity in ("gpu0", "gpu2")', 'node == "n1"',
                     "1", "0"]),
    st.builds(lambda v, t: f"{v} in ({t}, 2)", value, thr),
    value,  # a plain value in a boolean context: true where non-zero
)


def _combine(children):
    return st.one_of(
        st.builds(lambda a, b: f"({a} and {b})", children, children),
        st.builds(lambda a, b: f"({a} or {b})", children, children),
        st.builds(lambda a: f"not ({a})", children),
        st.builds(lambda a, b, c: f"({a} and {b} or {c})", children, children, children),
    )


expr = st.recursive(atom, _combine, max_leaves=6)
# a rule's root may also be a plain value: it fires where that value is exactly 1
root = st.one_of(expr, value, st.builds(lambda v, t: f"{v} - {t}", value, thr))

cell = st.one_of(st.integers(0, 4).map(float), st.just(math.nan))
tables = st.lists(st.lists(cell, min_size=12, max_size=12), min_size=7, max_size=7)  # 6 gpus + 1 node row


def build_store(table, ticks=12):
    store = WindowStore(CAT, horizon=1e6)
    for k in range(ticks):
        for ni, node in enumerate(("n1", "n2")):
            b = BatchBuilder(node)
            for e in range(3):
                row = table[ni * 3 + e]
                if not math.isnan(row[k]):
                    b.add(float(k), f"gpu{e}", "g_val", row[k])
                    b.add(float(k), f"gpu{e}", "k_val", 4.0 - row[k])
                    b.add(float(k), f"gpu{e}", "c_val", float(k * (e + 1)) if row[k] < 4 else 0.0)
            if not math.isnan(table[6][k]):
                b.add(float(k), "", "h_val", table[6][k] + ni)
            if len(b.build()):
                store.ingest(b.build())
    return store


def contexts(store, comp, now):
    reg = store.registry
    parts = [store.entities(s) for s in comp.signals if CAT[s].scope is Scope.GPU]
    eids = np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
    names = np.array([reg.keys[e][2] for e in eids], dtype=object)
    nodes = np.array([reg.keys[e][1] for e in eids], dtype=object)
    node_eids = np.array([reg.node_id(n) for n in nodes], dtype=np.int64)
    return EvalContext(store, now, eids, node_eids, node_eids.copy(), names, nodes, 60.0, {})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=tables, text=root, now=st.sampled_from([3.0, 7.5, 11.0, 20.0]))
def test_fires_marks_exactly_where_the_full_value_is_one(table, text, now):
    store = build_store(table)
    comp = compile_expr(text, CompileEnv(CAT, Scope.GPU))
    ctx = contexts(store, comp, now)
    n = len(ctx.eids)
    if n == 0:
        return
    with F.quiet():
        F._ACTIVE[0] = True
        try:
            full = np.broadcast_to(np.asarray(comp.fn(ctx), dtype=float), (n,))
            fires = np.broadcast_to(np.asarray(comp.fires(contexts(store, comp, now)), dtype=bool), (n,))
        finally:
            F._ACTIVE[0] = False
    assert np.array_equal(fires, full == 1.0), (text, full, fires)


# -- engine: fires + lazy evidence == full evaluation --------------------------------------------
def _rules_yaml(exprs, fors, keeps):
    out = ["required_engine_version: 1", "rules:"]
    for i, (e, f, k) in enumerate(zip(exprs, fors, keeps)):
        if not any(s in e for s in ("g_val", "k_val", "c_val")):  # a gpu rule needs a gpu signal
            e = f"{e} or k_val > 99"
        out += [f"  - id: R{i}", "    pathology: GPU-5", "    scope: gpu", "    layer: gpu",
                f"    expr: '{e}'", f"    for: {f}s", f"    keep_firing_for: {k}s", "    mitigation: none"]
    return "\n".join(out) + "\n"


def _engine(text):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "r.yaml"
        p.write_text(text)
        res = load_rules([p], CAT)
    assert res.ok, res.issues
    return res.ruleset


def _full_fires(comp):
    return lambda ctx: np.asarray(comp.fn(ctx), dtype=float) == 1.0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=tables, exprs=st.lists(root, min_size=1, max_size=4),
       fors=st.lists(st.integers(0, 3), min_size=4, max_size=4),
       keeps=st.lists(st.integers(0, 2), min_size=4, max_size=4))
def test_engine_findings_equal_full_evaluation(table, exprs, fors, keeps):
    text = _rules_yaml(exprs, fors, keeps)
    fast_rules, ref_rules = _engine(text), _engine(text)
    for r in ref_rules.rules:
        r.compiled.fires = _full_fires(r.compiled)
    full_store = build_store(table)
    fast_store, ref_store = WindowStore(CAT, horizon=1e6), WindowStore(CAT, horizon=1e6)
    fast, ref = Engine(fast_rules, fast_store), Engine(ref_rules, ref_store)
    # replay the same samples tick by tick into both stores
    for k in range(12):
        for blk_store in (fast_store, ref_store):
            for sig, per_node in full_store.blocks.items():
                for node, blk in per_node.items():
                    b = BatchBuilder(node)
                    col = np.flatnonzero(blk.times[: blk.n] == float(k))
                    for ent, row in blk.rows.items():
                        if len(col) and not math.isnan(blk.values[row, col[0]]):
                            b.add(float(k), ent, sig, float(blk.values[row, col[0]]))
                    if len(b.build()):
                        blk_store.ingest(b.build())
        assert fast.evaluate(float(k)) == ref.evaluate(float(k)), (k, exprs)
        assert fast.last_eval_errors == ref.last_eval_errors


def test_a_failing_node_wide_guard_skips_the_per_entity_windows():
    """``fires`` tries an and's node-wide parts first, whatever the author's order: a guard on
    one node value that fails leaves the per-GPU windows before it uncomputed, and one that holds
    gives the same entities as the full value."""
    table = [[1.0] * 12 for _ in range(6)] + [[0.0] * 12]  # h_val: 0 on n1, 1 on n2
    store = build_store(table)
    for guard, want in (("h_val > 5", []), ("h_val > 0.5", ["gpu0", "gpu1", "gpu2"])):
        comp = compile_expr(f"max(g_val, 5s) > 0 and {guard}", CompileEnv(CAT, Scope.GPU))
        ctx = contexts(store, comp, 11.0)
        with F.quiet():
            F._ACTIVE[0] = True
            try:
                fires = np.broadcast_to(np.asarray(comp.fires(ctx), dtype=bool), (len(ctx.eids),))
                full = np.asarray(comp.fn(contexts(store, comp, 11.0)), dtype=float) == 1.0
            finally:
                F._ACTIVE[0] = False
        windows_read = {k[0] for k in ctx.memo if isinstance(k, tuple) and isinstance(k[0], str)}
        assert ("max" in windows_read) == bool(want), (guard, windows_read)
        assert np.array_equal(fires, full)
        assert sorted(f"{n}/{e}" for n, e in zip(ctx.nodes[fires], ctx.names[fires])) == [f"n2/{g}" for g in want]
