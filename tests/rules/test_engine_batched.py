"""Counter rates computed together (``windows.batch_plan``/``_batched``) are bit for bit the rates
each signal's own kernel call gives, and an engine that stacks them publishes the same findings,
evidence included, as one that computes every window function alone.

The data mixes what makes the kernels leave their dense path: missing samples, resets, wraps,
infinities, signed zeros, blocks of different lengths and row counts, several nodes, empty and
one-column windows, and time axes that differ between signals.
"""
from __future__ import annotations

import numpy as np
import pytest

from skewd.model import BatchBuilder, Catalogue, signal
from skewd.rules import functions, windows
from skewd.rules.engine import Engine
from skewd.rules.loader import load_rules
from skewd.rules.store import WindowStore
from skewd.rules.windows import batch_plan

from .windowctx import bits, window_ctx

SIGS = [("c0", None), ("c1", None), ("c2", 8), ("c3", None), ("c4", 8)]
CAT = Catalogue([signal(n, "counter", "1", "gpu", "a counter", "t", wb) for n, wb in SIGS]
                + [signal("big", "counter", "1", "gpu", "a counter on many rows", "t")])


def batches(seed: int, ticks: int = 40) -> list[list]:
    """Per tick, one batch per node: counters of 2-5 GPUs on 1-3 nodes; each signal skips
    ticks of its own, so the signals' time axes differ."""
    rng = np.random.default_rng(seed)
    nodes = [f"n{i}" for i in range(1 + seed % 3)]
    gpus = {n: 2 + int(rng.integers(0, 4)) for n in nodes}
    acc: dict = {}
    holes = {s: float(rng.choice([0.0, 0.0, 0.0, 0.02, 0.2])) for s, _ in SIGS}  # most signals dense
    out = []
    for k in range(ticks):
        tick = []
        for node in nodes:
            b = BatchBuilder(node)
            for s, wb in SIGS:
                if rng.random() < holes[s] * 0.5:
                    continue  # no sample of this signal at all at this tick: its own time axis
                for g in range(gpus[node]):
                    if rng.random() < holes[s]:
                        continue  # one missing sample
                    key = (node, s, g)
                    v = acc.get(key, float(rng.integers(0, 3)))
                    r = rng.random()
                    if r < 0.06:
                        v = 0.0  # a reset
                    elif r < 0.09 and wb:
                        v = 2.0 ** wb - 1 - float(rng.integers(0, 3))  # near the wrap
                    elif r < 0.1:
                        v = -0.0
                    elif r < 0.102:
                        v = float("inf")
                    else:
                        v = float(v + rng.choice([0.0, 0.0, 1.0, 2.5, -0.0]))
                    if wb and v >= 2.0 ** wb and v != float("inf"):
                        v -= 2.0 ** wb
                    acc[key] = v
                    b.add(float(k), f"gpu{g}", s, v)
            if k % 3:
                for g in range(150):  # a block too large to stack for windows of 28+ columns
                    b.add(float(k), f"gpu{10 + g}", "big", float(k * g))
            if len(b):
                tick.append(b.build())
        out.append(tick)
    return out


def fill(seed: int, ticks: int = 40) -> WindowStore:
    store = WindowStore(CAT, horizon=1e6, initial_cap=16)
    for tick in batches(seed, ticks):
        for b in tick:
            store.ingest(b)
    return store



@pytest.mark.parametrize("seed", range(60))
def test_stacked_rates_are_the_kernels_rates_bit_for_bit(seed):
    store = fill(seed)
    rng = np.random.default_rng(1000 + seed)
    names = [s for s, _ in SIGS] + ["big"]
    stacked = 0
    with functions.quiet():
        functions._ACTIVE[0] = True
        try:
            for _ in range(12):
                kind = str(rng.choice(["rate", "increase"]))
                dur = float(rng.choice([0.5, 1.0, 2.0, 3.0, 7.0, 15.0, 100.0]))
                now = float(rng.choice([-1.0, 0.0, 5.0, 17.5, 39.0, 60.0]))
                wanted = [((kind, s, windows.identity, dur), s, kind, dur, CAT[s].wrap_bits) for s in names]
                plan = batch_plan(wanted)
                ctx = window_ctx(store, now, batches=plan)
                base = functions.rate if kind == "rate" else functions.increase
                for key, s, _, _, wb in wanted:
                    kernel = lambda t, W, wb=wb: base(t, W, wb)
                    windows.window_vec(ctx, s, dur, key, kernel)
                    alone = window_ctx(store, now)
                    windows.window_vec(alone, s, dur, key, kernel)
                    got, ref = ctx.memo[key], alone.memo[key]  # per block row, before any gather
                    assert bits(got) == bits(ref), (kind, s, dur, now, got, ref)
                # the values came from the stack when _batched memoised them
                alone = window_ctx(store, now, batches=plan)
                windows._batched(alone, plan[wanted[0][0]])
                stacked += sum(w[0] in alone.memo for w in wanted)
        finally:
            functions._ACTIVE[0] = False
    assert stacked  # the stacked path was taken, not only the kernels


def test_groups_are_one_kind_window_and_wrap():
    w = [(("rate", "a", windows.identity, 60.0), "a", "rate", 60.0, None),
         (("rate", "b", windows.identity, 60.0), "b", "rate", 60.0, None),
         (("rate", "c", windows.identity, 60.0), "c", "rate", 60.0, 32),
         (("rate", "d", windows.identity, 30.0), "d", "rate", 30.0, None),
         (("increase", "e", windows.identity, 60.0), "e", "increase", 60.0, None),
         (("rate", "a", windows.identity, 60.0), "a", "rate", 60.0, None)]
    plan = batch_plan(w)
    assert set(plan) == {w[0][0], w[1][0]}  # c wraps, d has another window, e another function
    assert plan[w[0][0]] is plan[w[1][0]]
    assert plan[w[0][0]][1] == {"a": [w[0][0]], "b": [w[1][0]]}


RULES = """
required_engine_version: 1
rules:
  - id: R1
    pathology: GPU-5
    scope: gpu
    layer: gpu
    expr: rate(c0, 5s) > 0.5 and increase(c2, 5s) >= 1
    for: 2s
    keep_firing_for: 1s
    mitigation: none
  - id: R2
    pathology: GPU-5
    scope: gpu
    layer: gpu
    expr: rate(c1, 5s) + rate(c3, 5s) > 1 or increase(c4, 5s) > 3 or rate(big, 5s) > 10
    for: 0s
    mitigation: none
  - id: R3
    pathology: GPU-5
    scope: gpu
    layer: gpu
    expr: increase(c0, 5s) > 2 and not (rate(c2, 5s) < 0.2) and increase(c3, 8s) >= increase(c1, 8s)
    for: 1s
    mitigation: none
  - id: R4
    pathology: GPU-5
    scope: gpu
    layer: gpu
    expr: peer_dev(rate(c1, 5s)) < -0.3 or rate(c4, 5s) > 0.8
    for: 0s
    mitigation: none
"""


class _AloneEngine(Engine):
    """Computes every window function alone (no stacking)."""

    def _batch_plan(self):
        return {}


def _findings(engine_cls, seed: int, tmp_path) -> list:
    p = tmp_path / "r.yaml"
    p.write_text(RULES)
    res = load_rules([p], CAT)
    assert res.ok, res.issues
    rng = np.random.default_rng(seed)
    store = WindowStore(CAT, horizon=1e6, initial_cap=16)
    eng = engine_cls(res.ruleset, store)
    out = []
    for k, tick in enumerate(batches(seed)):
        for b in tick:
            store.ingest(b)
        out.append([(f.rule_id, f.node, f.entity, f.state, f.evidence, f.active_at, f.fired_at)
                    for f in eng.evaluate(float(k) + float(rng.choice([0.0, 0.5])))])
    return out


@pytest.mark.parametrize("seed", range(12))
def test_engine_findings_with_and_without_stacking(seed, tmp_path):
    got = _findings(Engine, seed, tmp_path)
    ref = _findings(_AloneEngine, seed, tmp_path)
    assert repr(got) == repr(ref)  # repr: -0.0 and 0.0 in evidence differ too
    assert any(got)
