"""Alert state the Prometheus way, hot reload, determinism, store behaviour."""
from __future__ import annotations

import numpy as np

from skewd.model import BatchBuilder, SampleBatch, State
from skewd.rules.engine import Engine
from skewd.rules.loader import load_rules
from skewd.rules.reload import RuleManager
from skewd.rules.store import WindowStore

RULE = """
required_engine_version: 1
rules:
  - id: HOT
    pathology: GPU-5
    scope: gpu
    layer: gpu
    params: {limit: 0.8}
    expr: last(gpu_util_ratio, 5s) > limit
    for: {for_}
    keep_firing_for: {keep}
    mitigation: cool it
"""


def make(cat, tmp_path, for_="3s", keep="0s"):
    f = tmp_path / "r.yaml"
    f.write_text(RULE.replace("{for_}", for_).replace("{keep}", keep))
    res = load_rules([f], cat)
    assert res.ok, res.issues
    store = WindowStore(cat)
    return f, store, Engine(res.ruleset, store)


def feed(store, t, values, node="n1"):
    b = BatchBuilder(node)
    for ent, v in values.items():
        b.add(t, ent, "gpu_util_ratio", v)
    store.ingest(b.build())


def run(engine, store, series, start=0):
    """series: list of {entity: value} per second → list of (t, rule, entity, state)."""
    out = []
    for i, vals in enumerate(series):
        t = float(start + i)
        feed(store, t, vals)
        out += [(t, f.rule_id, f.entity, f.state.value) for f in engine.evaluate(t)]
    return out


def test_pending_then_firing_after_for_then_resolved(cat, tmp_path):
    _, store, eng = make(cat, tmp_path)
    hot = {"gpu0": 0.9, "gpu1": 0.1}
    cold = {"gpu0": 0.1, "gpu1": 0.1}
    got = run(eng, store, [hot] * 5 + [cold] * 2)
    assert got == [(0.0, "HOT", "gpu0", "pending"), (3.0, "HOT", "gpu0", "firing"), (5.0, "HOT", "gpu0", "resolved")]


def test_pending_that_clears_before_for_never_fires(cat, tmp_path):
    _, store, eng = make(cat, tmp_path)
    got = run(eng, store, [{"gpu0": 0.9}] * 2 + [{"gpu0": 0.1}] + [{"gpu0": 0.9}] * 2)
    assert [s for *_, s in got] == ["pending", "pending"]
    assert got[1][0] == 3.0  # a new occurrence starts its own pending period


def test_keep_firing_for_bridges_short_dips(cat, tmp_path):
    _, store, eng = make(cat, tmp_path, for_="0s", keep="3s")
    got = run(eng, store, [{"gpu0": 0.9}, {"gpu0": 0.1}, {"gpu0": 0.1}, {"gpu0": 0.9}, {"gpu0": 0.1},
                           {"gpu0": 0.1}, {"gpu0": 0.1}, {"gpu0": 0.1}])
    assert got == [(0.0, "HOT", "gpu0", "firing"), (6.0, "HOT", "gpu0", "resolved")]


def test_finding_carries_evidence_params_and_stable_id(cat, tmp_path):
    _, store, eng = make(cat, tmp_path, for_="1s")
    fs = []
    for t in range(3):
        feed(store, float(t), {"gpu0": 0.95})
        fs += eng.evaluate(float(t))
    pending, firing = fs
    assert firing.state is State.FIRING and firing.evidence == {"last(gpu_util_ratio, 5s)": 0.95}
    assert firing.params == {"limit": 0.8} and firing.mitigation == "cool it"
    assert pending.id == firing.id and pending.event_id != firing.event_id
    assert firing.fired_at == 1.0 and firing.active_at == 0.0


def test_missing_data_never_fires_through_negation(cat, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("required_engine_version: 1\nrules:\n  - id: NEG\n    pathology: GPU-5\n    scope: gpu\n"
                 "    layer: gpu\n    expr: not (last(gpu_util_ratio, 2s) > 0.5) and gpu_power_watts > -1\n")
    res = load_rules([f], cat)
    store = WindowStore(cat)
    eng = Engine(res.ruleset, store)
    b = BatchBuilder("n1")
    b.add(0.0, "gpu0", "gpu_power_watts", 100.0)  # util never reported for gpu0
    b.add(0.0, "gpu1", "gpu_power_watts", 100.0)
    b.add(0.0, "gpu1", "gpu_util_ratio", 0.1)
    store.ingest(b.build())
    assert [(x.entity, x.state.value) for x in eng.evaluate(0.0)] == [("gpu1", "firing")]


def test_hot_reload_keeps_state_of_unchanged_rules_and_rejects_bad_files(cat, tmp_path):
    f, store, eng = make(cat, tmp_path, for_="2s")
    mgr = RuleManager([f], cat)
    run(eng, store, [{"gpu0": 0.9}] * 3)
    assert [a.state for a in eng.alerts()] == [State.FIRING]
    # identical content: state carried, no re-fire
    res = mgr.reload(eng)
    assert res.ok and res.carried == ["HOT"]
    assert run(eng, store, [{"gpu0": 0.9}], start=3) == []
    # a broken edit is rejected with its position; the old rule keeps evaluating
    f.write_text(f.read_text().replace("last(gpu_util_ratio, 5s) > limit", "last(gpu_util_ratio, 5s) > > limit"))
    res = mgr.reload(eng)
    assert not res.ok and res.issues[0].pos.line == 9 and res.issues[0].code.value == "E006"
    assert "previous rules still running" in res.describe()
    assert run(eng, store, [{"gpu0": 0.1}], start=4) == [(4.0, "HOT", "gpu0", "resolved")]
    # a changed threshold is a new rule definition: its state starts fresh
    f.write_text(RULE.replace("{for_}", "2s").replace("{keep}", "0s").replace("limit: 0.8", "limit: 0.5"))
    res = mgr.reload(eng)
    assert res.ok and res.carried == []


def test_evaluation_is_deterministic(cat, tmp_path):
    rng = np.random.default_rng(7)
    series = [{f"gpu{i}": float(rng.random()) for i in range(8)} for _ in range(60)]
    results = []
    for _ in range(2):
        _, store, eng = make(cat, tmp_path, for_="2s", keep="1s")
        results.append([(t, e, s) for t, _, e, s in run(eng, store, series)])
    assert results[0] == results[1] and results[0]


def test_peer_groups_are_per_node_for_gpu_scope(cat, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("required_engine_version: 1\nrules:\n  - id: LOW\n    pathology: PCIE-4\n    scope: gpu\n"
                 "    layer: pcie\n    expr: last(gpu_util_ratio, 5s) < 0.5 * peer_median(last(gpu_util_ratio, 5s))\n")
    store = WindowStore(cat)
    eng = Engine(load_rules([f], cat).ruleset, store)
    feed(store, 0.0, {"gpu0": 0.9, "gpu1": 0.9, "gpu2": 0.2}, node="a")
    feed(store, 0.0, {"gpu0": 0.2, "gpu1": 0.2, "gpu2": 0.2}, node="b")  # uniformly low: no outlier
    assert [(x.node, x.entity) for x in eng.evaluate(0.0)] == [("a", "gpu2")]


def test_rank_scope_peers_are_the_same_communicators_ranks_on_the_node(tmp_path):
    # a rank's peers are its communicator's ranks: node b's ranks and the other communicator's
    # ranks on node a (which run other collectives) are not compared with it
    from skewd.model import Catalogue, signal

    cat = Catalogue([signal("nccl_wait_seconds", "gauge", "seconds", "rank", "wait", "nccl")])
    f = tmp_path / "r.yaml"
    f.write_text("required_engine_version: 1\nrules:\n  - id: QUICK\n    pathology: EW-1\n    scope: rank\n"
                 "    layer: gpu\n    expr: peer_median(nccl_wait_seconds) - nccl_wait_seconds > 0.001\n")
    store = WindowStore(cat)
    eng = Engine(load_rules([f], cat).ruleset, store)
    for node, vals in (("a", {"0xaa/r0": 0.003, "0xaa/r1": 0.0, "0xbb/r0": 0.0, "0xbb/r1": 0.0, "0xbb/r2": 0.0}),
                       ("b", {"0xaa/r2": 0.0, "0xaa/r3": 0.003, "0xaa/r4": 0.003})):
        b = BatchBuilder(node)
        for ent, v in vals.items():
            b.add(1.0, ent, "nccl_wait_seconds", v)
        store.ingest(b.build())
    assert sorted((x.node, x.entity) for x in eng.evaluate(1.0)) == [("a", "0xaa/r1"), ("b", "0xaa/r2")]


def test_tp_group_scope_groups_nodes_by_label(cat, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("required_engine_version: 1\nrules:\n  - id: LATE\n    pathology: EW-1\n    scope: tp_group\n"
                 "    layer: network\n    params: {tol: 2ms}\n"
                 "    expr: spread(summary_burst_start_seconds) > tol and rank(summary_burst_start_seconds) == 1\n")
    store = WindowStore(cat)
    eng = Engine(load_rules([f], cat).ruleset, store)
    for n, g in (("a", "tp0"), ("b", "tp0"), ("c", "tp1"), ("d", "tp1"), ("e", None)):
        if g:
            store.registry.set_node_labels(n, {"tp_group": g})
    starts = {"a": 10.000, "b": 10.010, "c": 10.000, "d": 10.001, "e": 11.0}
    for n, v in starts.items():
        b = BatchBuilder(n)
        b.add(1.0, "", "summary_burst_start_seconds", v)
        store.ingest(b.build())
    fs = eng.evaluate(1.0)
    assert [(x.node, x.labels) for x in fs] == [("b", {"tp_group": "tp0"})]


def test_peers_by_compares_a_node_only_with_nodes_of_the_same_labels(cat, tmp_path):
    # a disaggregated cluster: prefill nodes hold little KV by design, decode nodes a lot. Across
    # the whole cluster the prefill nodes are "far below their peers"; within their role, only
    # the prefill node that really is (p2) stands out
    rule = ("required_engine_version: 1\nrules:\n  - id: LOW\n    pathology: GPU-7\n    scope: cluster\n"
            "    layer: gpu\n{by}    expr: summary_burst_start_seconds < 0.5 * peer_median(summary_burst_start_seconds)\n")
    kv = {"p0": 0.20, "p1": 0.22, "p2": 0.05, "d0": 0.90, "d1": 0.92, "d2": 0.88}
    found = {}
    for by in ("", "    peers_by: [role]\n"):
        f = tmp_path / "r.yaml"
        f.write_text(rule.format(by=by))
        store = WindowStore(cat)
        eng = Engine(load_rules([f], cat).ruleset, store)
        for n, v in kv.items():
            store.registry.set_node_labels(n, {"role": "prefill" if n[0] == "p" else "decode"})
            b = BatchBuilder(n)
            b.add(1.0, "", "summary_burst_start_seconds", v)  # (the test catalogue's node signal)
            store.ingest(b.build())
        found[by] = [(x.node, x.labels) for x in eng.evaluate(1.0)]
    assert sorted(n for n, _ in found[""]) == ["p0", "p1", "p2"]
    assert found["    peers_by: [role]\n"] == [("p2", {"role": "prefill"})]  # the finding names its peer group


def test_store_drops_out_of_order_and_compacts_beyond_horizon(cat):
    store = WindowStore(cat, horizon=10.0, initial_cap=4)
    for t in range(100):
        feed(store, float(t), {"gpu0": float(t)})
    feed(store, 50.0, {"gpu0": -1.0})
    assert store.dropped_out_of_order == 1
    times, vals = store.series("gpu_util_ratio", "n1", "gpu0")
    # everything inside the horizon is kept; memory stays bounded by a small multiple of it
    assert set(range(89, 100)) <= set(times.astype(int)) and len(times) <= 32
    assert store.blocks["gpu_util_ratio"]["n1"].times.shape[0] <= 32


def test_store_gc_forgets_entities_that_went_quiet(cat):
    store = WindowStore(cat, horizon=10.0)
    feed(store, 0.0, {"gpu0": 1.0, "gpu1": 1.0})
    for t in range(1, 30):
        feed(store, float(t), {"gpu0": 1.0})
    assert store.gc(29.0) == 1
    assert list(store.blocks["gpu_util_ratio"]["n1"].rows) == ["gpu0"]
    times, _ = store.series("gpu_util_ratio", "n1", "gpu0")
    assert len(times) > 0


def test_uncatalogued_samples_are_counted_not_stored(cat):
    store = WindowStore(cat)
    store.ingest(SampleBatch.from_rows([(0.0, "n1", "gpu0", "bogus_signal", 1.0)]))
    assert store.dropped_uncatalogued == {"bogus_signal": 1} and not store.blocks
