"""The vectorised aligner equals the reference one (the pre-vectorisation code, kept in
align_reference.py) exactly - same ctl_* values, same GroupReports - on scripted summaries
that exercise every path: clean steps, lags near the alignment window, missed and duplicated
bursts, re-sent and reordered summaries, time ties between nodes, stale peers, pipelines."""
from __future__ import annotations

import math

import numpy as np
import pytest

from skewd.controller import align as fast
from skewd.controller.align import Aligner, align, align_arrays, aligned_metrics, group_metrics

from . import align_reference as ref

T0 = 1_700_000_000.0
ARGS = dict(window=10.0, max_skew=0.25, unsynced_clock_error=0.05, min_fraction=0.5, stale_after=5.0, horizon=40.0)


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN, nested through dicts/lists; floats compared exactly."""
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b)


def _script(seed: int, seconds: int = 25):
    """Summaries (node, t, synced, max_error, bursts) for two TP groups and a PP stage node,
    with invented timing: a 50-100 ms step period, lags and jitter up to the window."""
    rng = np.random.default_rng(seed)
    groups = {"g0": [f"a{i}" for i in range(int(rng.integers(2, 9)))],
              "g1": [f"b{i}" for i in range(int(rng.integers(2, 6)))]}
    nodes = [n for g in groups.values() for n in g] + ["x"]
    period = float(rng.uniform(0.05, 0.1))
    jitter = float(rng.choice([0.0003, 0.01, 0.03]))  # 0.03: around half the period, segments merge
    lag = {n: float(rng.choice([0.0, 0.0, 0.008, 0.04])) for n in nodes}
    drop = {n: float(rng.choice([0.0, 0.0, 0.1, 0.5])) for n in nodes}
    with_bytes = bool(rng.integers(0, 2))
    quantise = bool(rng.integers(0, 2))  # starts on a 1 ms grid: time ties between nodes
    stops = {n: int(rng.integers(seconds // 2, seconds)) if rng.random() < 0.15 else seconds for n in nodes}
    out = []
    for i in range(seconds):
        tick = []
        for n in nodes:
            if i >= stops[n]:
                continue
            ks = range(int(i / period), int((i + 1) / period))
            bursts = []
            for k in ks:
                if rng.random() < drop[n]:
                    continue
                t = T0 + k * period + lag[n] + float(rng.uniform(-jitter, jitter))
                if quantise:
                    t = round(t, 3)
                b = float(rng.choice([1e6, 2e6])) if with_bytes else float("nan")
                bursts.append((t, b))
                if rng.random() < 0.01:
                    bursts.append((t, b))  # a burst reported twice
            bursts.sort()
            synced = bool(rng.random() > 0.1)
            tick.append((n, T0 + i + 1, synced, 0.0005 if synced else None, bursts))
        rng.shuffle(tick)
        if tick and rng.random() < 0.1:
            tick.append(tick[0])  # a re-sent summary
        if i > 2 and rng.random() < 0.1:  # a late summary, out of order
            n, t, s, e, bursts = tick[-1]
            tick.append((n, t - 1.5, s, e, [(bt - 1.5, bb) for bt, bb in bursts]))
        out.append(tick)
    return groups, out


@pytest.mark.parametrize("seed", range(16))
def test_vectorised_aligner_equals_reference(seed: int) -> None:
    groups, script = _script(seed)
    new, old = Aligner(**ARGS), ref.Aligner(**ARGS)
    pp = {"pp": [tuple(groups["g0"]), ("x",)], "pp2": [tuple(groups["g0"]), tuple(groups["g1"])]}
    tp = {k: tuple(v) for k, v in groups.items()}
    for i, tick in enumerate(script):
        for n, t, s, e, bursts in tick:
            new.observe(n, t, s, e, list(bursts))
            old.observe(n, t, s, e, list(bursts))
        if i % 2 or i == len(script) - 1:
            now = T0 + i + 1
            a, b = new.derive(now, tp, pp), old.derive(now, tp, pp)
            assert _same(a, b), (seed, i)
            assert list(new.reports) == list(old.reports)
            for g in new.reports:
                assert _same(vars(new.reports[g]), vars(old.reports[g])), (seed, i, g)
    for n in old.bursts:
        assert new.bursts[n].items == list(old.bursts[n].items)


def _random_events(rng, k: int, n: int, spread: float):
    nodes = [f"n{j}" for j in rng.permutation(k)]
    ev = {m: np.sort(rng.uniform(0, spread, size=int(rng.integers(0, n)))) for m in nodes}
    if rng.random() < 0.3:
        ev = {m: np.round(v, 2) for m, v in ev.items()}  # ties, also within one node
    by = {m: rng.choice([1.0, 2.0, np.nan], size=len(v)) for m, v in ev.items()}
    return nodes, ev, by


@pytest.mark.parametrize("seed", range(120))
def test_align_arrays_equals_the_walk(seed: int) -> None:
    """Random bursts, including ties and windows wider than the gaps: the same steps."""
    rng = np.random.default_rng(seed)
    nodes, ev, by = _random_events(rng, int(rng.integers(1, 7)), 30, float(rng.uniform(0.1, 5.0)))
    w = float(rng.choice([0.01, 0.05, 0.2, 1.0]))
    want = align(ev, by, w)
    got = align_arrays(nodes, [ev[m] for m in nodes], [by[m] for m in nodes], w).steps()
    assert _same([s.members for s in got], [s.members for s in want])
    clock = {m: float(rng.choice([0.0, 0.001, 0.05])) for m in nodes}
    live = [m for m in nodes if rng.random() < 0.8]
    assert _same(group_metrics(want, live, clock, 0.5)[0], ref.group_metrics(want, live, clock, 0.5)[0])
    assert _same(vars(group_metrics(want, live, clock, 0.5)[1]), vars(ref.group_metrics(want, live, clock, 0.5)[1]))
    al = align_arrays(nodes, [ev[m] for m in nodes], [by[m] for m in nodes], w)
    assert _same(aligned_metrics(al, clock, 0.5)[0], ref.group_metrics(want, nodes, clock, 0.5)[0])


def test_short_bytes_arrays_read_as_unknown() -> None:
    steps = align_arrays(["a", "b"], [np.array([0.0, 1.0]), np.array([0.01])], [np.array([5.0]), np.array([])],
                         0.1).steps()
    assert _same([s.members for s in steps], [s.members for s in align({"a": np.array([0.0, 1.0]), "b": np.array([0.01])},
                                                                       {"a": np.array([5.0]), "b": np.array([])}, 0.1)])


def test_burst_log_window_matches_a_filter() -> None:
    log = fast.BurstLog()
    rng = np.random.default_rng(1)
    kept: list[tuple[float, float]] = []
    for i in range(50):
        bursts = sorted((float(x), 1.0) for x in rng.uniform(i, i + 1, size=5))
        if i % 7 == 3:
            bursts = [(b[0] - 2.0, b[1]) for b in bursts]  # reordered: inserted in place
        log.add(bursts)
        if i % 10 == 9:
            log.prune(i - 20)
        lo, hi = i - 5.5, i + 0.5
        t, b = log.window(lo, hi)
        kept = [x for x in log.items if lo < x[0] <= hi]
        assert t.tolist() == [x[0] for x in kept] and b.tolist() == [x[1] for x in kept]
    assert log.items == sorted(log.items)
