"""Rule engine benchmark: every shipped pack over 1,024 entities of one node, 60 s windows.

    python bench/rule_engine.py [--ticks 60] [--random] [--json] [--packs DIR]

Fills a window store with 10 minutes of 1 Hz samples for every catalogued signal of every
entity (counters increase, gauges wander), then times ``Engine.evaluate`` once per tick while a
new second of samples arrives, as the agent does. The peer, measured in the same run, is the
plain per-entity evaluation of the same window functions (the reference the property tests
use): how an engine that loops over entities in Python would fare.
Goal: <= 2 ms per tick. Exits non-zero only if it could not run.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

from skewd.catalogue import full_catalogue
from skewd.model import BatchBuilder, Kind, NODE_SCOPES, Scope
from skewd.rules.cli import PACKS
from skewd.rules.engine import Engine
from skewd.rules.loader import load_rules
from skewd.rules.store import WindowStore

# entities per scope adding up to 1,024 on one node (a busy 8-GPU serving node)
LAYOUT = {Scope.FLOW: 984, Scope.GPU: 8, Scope.RDMA_PORT: 8, Scope.NIC_PORT: 4, Scope.ENGINE: 4,
          Scope.PCI_DEVICE: 12, Scope.CPU: 3, Scope.NODE: 1}


def entities(scope: Scope) -> list[str]:
    n = LAYOUT.get(scope, 0)
    if scope is Scope.NODE:
        return [""]
    return [f"{scope.value}{i}" for i in range(n)]


def make_batch(cat, t: float, state: dict, rng) -> BatchBuilder:
    """One second of a healthy node: each entity's gauges sit at their own level with 5 %
    noise and counters grow at their own rate with 5 % noise (few rules fire, as in
    production; firing rules cost more, see --random)."""
    b = BatchBuilder("n1")
    for spec in cat.values():
        if spec.scope not in LAYOUT:
            continue
        ents = entities(spec.scope)
        base = state.setdefault(("base", spec.name), rng.random(len(ents)) + 0.5)
        noise = 1.0 + 0.05 * rng.standard_normal(len(ents)) if not RANDOM[0] else rng.random(len(ents)) * 2
        if spec.kind is Kind.COUNTER:
            acc = state.setdefault(("acc", spec.name), np.zeros(len(ents)))
            acc += 1000.0 * base * noise
            vals = acc
        else:
            vals = base * noise
        for e, v in zip(ents, vals.tolist()):
            b.add(t, e, spec.name, v)
    return b


RANDOM = [False]


def run(n_ticks: int, packs=PACKS) -> dict:
    cat = full_catalogue()
    res = load_rules([packs], cat)
    if not res.ok:
        raise SystemExit("packs do not load:\n" + "\n".join(map(str, res.issues)))
    store = WindowStore(cat, horizon=960.0)
    eng = Engine(res.ruleset, store, scopes=NODE_SCOPES)
    rng = np.random.default_rng(1)
    state: dict = {}
    n_ent = sum(LAYOUT.values())
    t0 = 1_700_000_000.0
    warm = 600
    for k in range(warm):
        store.ingest(make_batch(cat, t0 + k, state, rng).build())
    batches = [make_batch(cat, t0 + warm + k, state, rng).build() for k in range(n_ticks)]
    eng.evaluate(t0 + warm - 1)  # builds the entity frames once
    times = []
    cpu = []
    ingest = []
    for k, b in enumerate(batches):
        t = t0 + warm + k
        a = time.perf_counter()
        store.ingest(b)
        m = time.perf_counter()
        c = time.thread_time()
        eng.evaluate(t)
        cpu.append(time.thread_time() - c)
        times.append(time.perf_counter() - m)
        ingest.append(m - a)
    evaluated = [r for r in res.ruleset.rules if eng.evaluates(r)]
    # peer: per-entity Python evaluation of a 60 s avg() and rate() for every flow-scope signal
    sigs = [s for s in cat.values() if s.scope is Scope.FLOW]
    now = t0 + warm + n_ticks - 1
    a = time.perf_counter()
    for s in sigs:
        for blk in store.signal_blocks(s.name):
            times_col = blk.times[: blk.n]
            for r in range(blk.nrows):
                vals = blk.values[r, : blk.n]
                w = [(tt, v) for tt, v in zip(times_col, vals) if now - 60 < tt <= now and not math.isnan(v)]
                if s.kind is Kind.COUNTER and len(w) > 1:
                    inc = sum((b - a_) if b >= a_ else b for (_, a_), (_, b) in zip(w, w[1:]))
                    _ = inc / (w[-1][0] - w[0][0])
                elif w:
                    _ = sum(v for _, v in w) / len(w)
    peer = time.perf_counter() - a
    a = time.perf_counter()
    from skewd.rules import functions
    for s in sigs:
        for blk in store.signal_blocks(s.name):
            tt, W = blk.window(now - 60, now)
            _ = functions.rate(tt, W) if s.kind is Kind.COUNTER else functions.avg(tt, W)
    ours_same = time.perf_counter() - a
    return {"entities": n_ent, "rules": len(evaluated), "ticks": n_ticks,
            "eval_ms_p50": statistics.median(times) * 1e3, "eval_ms_p99": float(np.percentile(times, 99)) * 1e3,
            "eval_cpu_ms_p50": statistics.median(cpu) * 1e3, "eval_cpu_ms_p99": float(np.percentile(cpu, 99)) * 1e3,
            "ingest_ms_p50": statistics.median(ingest) * 1e3,
            "peer_python_ms": peer * 1e3, "ours_same_work_ms": ours_same * 1e3,
            "samples_per_tick": len(batches[0])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=60)
    ap.add_argument("--random", action="store_true", help="uniform random values: many rules fire")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    ap.add_argument("--packs", default=str(PACKS),
                    help="rule packs directory (default: the shipped packs); a pinned copy keeps "
                         "before/after comparisons apart from pack edits")
    args = ap.parse_args()
    RANDOM[0] = args.random
    r = run(args.ticks, args.packs)
    print(f"rule engine: {r['rules']} node rules x {r['entities']} entities, 60 s windows, {r['samples_per_tick']} samples/tick")
    print(f"  evaluate per tick: p50 {r['eval_ms_p50']:.2f} ms, p99 {r['eval_ms_p99']:.2f} ms   (goal <= 2 ms)")
    # on a shared machine the wall time includes waiting for a core; the thread's CPU time does not
    print(f"  evaluate CPU time: p50 {r['eval_cpu_ms_p50']:.2f} ms, p99 {r['eval_cpu_ms_p99']:.2f} ms")
    print(f"  ingest per tick:   p50 {r['ingest_ms_p50']:.2f} ms")
    print(f"  peer (per-entity Python, avg/rate of every flow signal): {r['peer_python_ms']:.1f} ms; "
          f"same work vectorised: {r['ours_same_work_ms']:.2f} ms; ratio {r['peer_python_ms'] / r['ours_same_work_ms']:.0f}x")
    if args.json:  # for run_all.py's results file
        print(json.dumps({"benchmark": "rule_engine", "random": args.random, **r,
                          "ratio": r["peer_python_ms"] / r["ours_same_work_ms"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
