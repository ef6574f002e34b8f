"""The engine's caches never change a finding.

Per evaluation the engine shares window slices and kernel results between rules (``memo``);
across evaluations each entity frame keeps where its entities sit among a signal's block rows
(``align``) and their alert keys (``keys``), for as long as the store's shape is unchanged.
An engine that rebuilds its frames (and so those caches) on every tick must publish exactly
the same findings while entities appear, go quiet, are garbage-collected and recycled, and
nodes come and go.
"""
from __future__ import annotations

import numpy as np
import pytest

from skewd.model import BatchBuilder
from skewd.rules.engine import Engine
from skewd.rules.windows import EvalContext
from skewd.rules.loader import load_rules
from skewd.rules.store import WindowStore

RULES = """
required_engine_version: 1
rules:
  - id: HOT
    pathology: GPU-5
    scope: gpu
    layer: gpu
    expr: avg(gpu_util_ratio, 3s) > 0.6 and last(gpu_power_watts, 5s) > 150
    for: 2s
    keep_firing_for: 1s
    mitigation: none
  - id: SKEW
    pathology: GPU-5
    scope: gpu
    layer: gpu
    expr: peer_dev(avg(gpu_util_ratio, 4s)) < -0.3 or rate(pcie_rx_bytes_total, 4s) < 50
    for: 0s
    mitigation: none
  - id: NODE
    pathology: GPU-5
    scope: gpu
    layer: gpu
    expr: increase(host_tcp_retrans_segs_total, 4s) > 20 and not (max(gpu_util_ratio, 2s) < 0.2)
    for: 1s
    mitigation: none
  - id: QUIET
    pathology: GPU-5
    scope: gpu
    layer: gpu
    expr: absent(gpu_power_watts, 3s) and present(gpu_util_ratio, 3s)
    for: 0s
    mitigation: none
"""


class _NoCacheEngine(Engine):
    """Rebuilds every entity frame (with empty align/keys caches) on every evaluation."""

    def _frame(self, rule):
        return self._build_frame(rule.scope, rule.compiled.signals)


def _batches(seed: int, ticks: int = 40):
    """Per tick, per node: the batch of a node whose GPUs and signals come and go."""
    rng = np.random.default_rng(seed)
    out = []
    acc: dict = {}
    for k in range(ticks):
        tick = []
        for node in ("n1", "n2"):
            if node == "n2" and not (8 <= k < 30):
                continue
            b = BatchBuilder(node)
            n_gpu = 2 + (k // 7) % 4  # the GPU set grows and shrinks
            for g in range(n_gpu):
                if rng.random() < 0.1:
                    continue  # a missed sample
                ent = f"gpu{(g + k // 13) % 6}"  # and shifts, so ids are recycled after gc
                b.add(float(k), ent, "gpu_util_ratio", float(rng.choice([0.1, 0.5, 0.7, 0.9])))
                if rng.random() < 0.8:
                    b.add(float(k), ent, "gpu_power_watts", float(rng.choice([100.0, 200.0])))
                acc[(node, ent)] = acc.get((node, ent), 0.0) + float(rng.choice([10.0, 100.0, 1000.0]))
                b.add(float(k), ent, "pcie_rx_bytes_total", acc[(node, ent)])
            acc[node] = acc.get(node, 0.0) + float(rng.choice([0.0, 5.0, 30.0]))
            b.add(float(k), "", "host_tcp_retrans_segs_total", acc[node])
            tick.append(b.build())
        out.append(tick)
    return out


def _ruleset(cat, tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text(RULES)
    res = load_rules([f], cat)
    assert res.ok, res.issues
    return res.ruleset


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_cached_engine_equals_engine_rebuilding_every_frame(cat, tmp_path, seed):
    s1, s2 = WindowStore(cat, horizon=6.0), WindowStore(cat, horizon=6.0)
    fast, ref = Engine(_ruleset(cat, tmp_path), s1), _NoCacheEngine(_ruleset(cat, tmp_path), s2)
    fired = 0
    for k, tick in enumerate(_batches(seed)):
        for b in tick:
            s1.ingest(b)
            s2.ingest(b)
        if k % 5 == 4:  # entities that went quiet are forgotten and their ids recycled
            assert s1.gc(float(k)) == s2.gc(float(k))
        got, want = fast.evaluate(float(k)), ref.evaluate(float(k))
        assert got == want, k
        fired += len(got)
    assert fired > 10  # the scenario does exercise transitions


def test_alignment_cached_across_ticks_equals_fresh_alignment(cat, tmp_path):
    """A frame's alignment, reused tick after tick, gives every window value a fresh one gives."""
    store = WindowStore(cat, horizon=6.0)
    eng = Engine(_ruleset(cat, tmp_path), store)
    for k, tick in enumerate(_batches(7)):
        for b in tick:
            store.ingest(b)
        if k % 5 == 4:
            store.gc(float(k))
        eng.evaluate(float(k))
        memo_c: dict = {}
        memo_f: dict = {}
        for rule in eng.rules.rules:
            fr = eng._frame(rule)
            cached = EvalContext(store, float(k), fr.eids, fr.node_eids, fr.groups, fr.names, fr.nodes, 60.0,
                                 memo_c, [], fr.align)
            fresh = EvalContext(store, float(k), fr.eids, fr.node_eids, fr.groups, fr.names, fr.nodes, 60.0,
                                memo_f, [], None)
            a = np.asarray(rule.compiled.fn(cached), dtype=float)
            b = np.asarray(rule.compiled.fn(fresh), dtype=float)
            assert np.array_equal(a, b, equal_nan=True), (k, rule.id)
            assert [lbl for lbl, _ in cached.evidence] == [lbl for lbl, _ in fresh.evidence]
            for (_, x), (_, y) in zip(cached.evidence, fresh.evidence):
                assert np.array_equal(np.asarray(x, dtype=float), np.asarray(y, dtype=float), equal_nan=True)


def test_per_tick_results_do_not_leak_into_the_next_tick(cat, tmp_path):
    """After evaluating every second up to t, what is true at t equals what an engine that
    never evaluated before finds true at t."""
    store = WindowStore(cat, horizon=60.0)
    eng = Engine(_ruleset(cat, tmp_path), store)
    for k, tick in enumerate(_batches(5, ticks=24)):
        for b in tick:
            store.ingest(b)
        eng.evaluate(float(k))
        fresh = Engine(_ruleset(cat, tmp_path), store)
        fresh.evaluate(float(k))
        true_now = sorted((st.rule_id, st.node, st.entity) for st in eng.alerts() if st.last_true_at == float(k))
        assert true_now == sorted((st.rule_id, st.node, st.entity) for st in fresh.alerts()), k
