"""The incremental aligner (controller/align_window.py) equals aligning every window from
scratch, bit for bit: same ctl_* values and GroupReports at every tick, on invented summaries
(NOTE: timing made up to reach every path, not measured) with late and out-of-order bursts,
re-sent summaries, ties between nodes, members that go stale and come back, windows whose start
cuts through a step, and clock errors that change (synced, unsynced, a different bound)."""
from __future__ import annotations

import numpy as np
import pytest

from skewd.controller.align import Aligner

from .test_align_equivalence import ARGS, T0, _same, _script


def _clocky_script(seed: int, seconds: int = 45):
    """Summaries of three TP groups, one burst per step and member, where members' clock error
    bounds change over time and some summaries arrive late (their bursts older than ones already
    taken) or twice."""
    rng = np.random.default_rng(1000 + seed)
    groups = {f"g{g}": [f"g{g}n{i}" for i in range(int(rng.integers(2, 9)))] for g in range(3)}
    nodes = [n for g in groups.values() for n in g]
    period = float(rng.uniform(0.04, 0.1))
    lag = {n: float(rng.choice([0.0, 0.0, 0.002, 0.012, 0.3 * period])) for n in nodes}
    jitter = float(rng.choice([0.0, 0.0002, 0.004, 0.25 * period]))
    err_of = {n: 0.0005 for n in nodes}
    late: list = []
    out = []
    for i in range(seconds):
        tick = []
        if rng.random() < 0.15:  # a member's clock bound changes (resync, a worse source)
            n = nodes[int(rng.integers(len(nodes)))]
            err_of[n] = [0.0002, 0.0005, 0.002, None][int(rng.integers(4))]  # None: unsynced
        for n in nodes:
            if rng.random() < 0.03:
                continue  # a summary lost
            ks = range(int(np.ceil(i / period)), int(np.ceil((i + 1) / period)))
            starts = sorted(T0 + k * period + lag[n] + float(rng.uniform(-jitter, jitter)) for k in ks
                            if rng.random() > 0.05)
            if rng.random() < 0.2:
                starts = [round(s, 3) for s in starts]  # ties between nodes
                starts = sorted(set(starts))
            e = err_of[n]
            msg = (n, T0 + i + 1, e is not None, e, starts)
            if i > 3 and rng.random() < 0.04:
                late.append((i + int(rng.integers(1, 4)), msg))  # arrives 1-3 s late
                continue
            tick.append(msg)
            if rng.random() < 0.02:
                tick.append(msg)  # re-sent
        tick += [m for due, m in late if due == i]
        late = [(due, m) for due, m in late if due != i]
        rng.shuffle(tick)
        out.append(tick)
    return groups, out


def _run(groups, script, observe_starts: bool, pp: bool = False) -> tuple[int, int]:
    inc, full = Aligner(**ARGS), Aligner(**ARGS, incremental=False)
    tp = {k: tuple(v) for k, v in groups.items()}
    pps = {"pp": [tp[g] for g in list(tp)[:2]]} if pp else {}
    for i, tick in enumerate(script):
        for n, t, s, e, bursts in tick:
            for a in (inc, full):
                if observe_starts:
                    a.observe_starts(n, t, s, e, list(bursts))
                else:
                    a.observe(n, t, s, e, list(bursts))
        now = T0 + i + 1
        got, want = inc.derive(now, tp, pps), full.derive(now, tp, pps)
        assert _same(got, want), i
        assert list(inc.reports) == list(full.reports)
        for g in inc.reports:
            assert _same(vars(inc.reports[g]), vars(full.reports[g])), (i, g)
    return sum(w.reused for w in inc.windows.values()), sum(w.full for w in inc.windows.values())


@pytest.mark.parametrize("seed", range(24))
def test_incremental_equals_full_alignment_with_clock_changes(seed: int) -> None:
    groups, script = _clocky_script(seed)
    reused, _ = _run(groups, script, observe_starts=True, pp=seed % 2 == 0)
    assert reused > 0  # the incremental path was taken, not only the fallback


@pytest.mark.parametrize("seed", range(16))
def test_incremental_equals_full_alignment_on_reordered_bursts(seed: int) -> None:
    """The vectorised aligner's own scripts (bytes, re-sent and reordered summaries, stale
    members), derived at every tick."""
    groups, script = _script(seed, seconds=40)
    _run(groups, [[(n, t, s, e, bursts) for n, t, s, e, bursts in tick] for tick in script], observe_starts=False)


def test_steady_groups_are_measured_incrementally() -> None:
    """With clean steps the full alignment runs once per group, then only incrementally; a
    window start that cuts through a step (jitter) still reuses the middle."""
    rng = np.random.default_rng(7)
    groups = {"g": [f"n{i}" for i in range(8)]}
    script = []
    for i in range(40):
        script.append([(n, T0 + i + 1, True, 0.0005,
                        [T0 + k * 0.05 + float(rng.uniform(0, 0.004)) for k in range(i * 20, i * 20 + 20)])
                       for n in groups["g"]])
    reused, full = _run(groups, script, observe_starts=True)
    assert full == 1 and reused == 39
