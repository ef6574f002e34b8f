"""The aligner's tick with the groups' windows held in step tables (controller/align_batch.py)
gives exactly what the aligner did before: the same ctl_* values and GroupReports at every tick
as the pre-vectorisation reference (align_reference.py) and as aligning every window from
scratch, on a realistic stream: the controller's 30 s window and a summary a second, TP groups
of 8, 4 and 2 members and a group of one, bursts on a 50-100 ms step grid with jitter, a
straggler, a node that sits out steps, steps reported once settled (a second or two late, as
agents do) by nodes on phases of their own, summaries that arrive 1-3 s late or twice, nodes
that go silent past ``stale_after`` and come back, clocks that lose their sync, burst bytes
with gaps (NaN).
NOTE: the timing is invented to reach every path, not measured."""
from __future__ import annotations

import numpy as np
import pytest

from skewd.controller.align import Aligner
from skewd.controller.align_batch import StepTable

from . import align_reference as ref
from .test_align_equivalence import T0, _same

#: the controller's defaults (controller/config.py), the horizon shortened to prune within the test
ARGS = dict(window=30.0, max_skew=0.25, unsynced_clock_error=0.05, min_fraction=0.5, stale_after=5.0, horizon=45.0)


def _stream(seed: int, seconds: int = 80):
    """Per second, the summaries (node, t, synced, max_error, bursts, with bytes) that arrive,
    and the TP and PP groups. As agents send them (agent/steps.py settled_steps): a summary at
    t reports the steps that started in (t - 1 - settle, t - settle], every node on its own
    phase within the second."""
    rng = np.random.default_rng(seed)
    sizes = [8, 4, 2, 1] if seed % 2 else [8, 8, 4, 2]
    groups = {f"tp{g}": [f"g{g}n{i}" for i in range(k)] for g, k in enumerate(sizes)}
    nodes = [n for g in groups.values() for n in g]
    period = float(rng.choice([0.05, 0.0625, 0.1]))
    jitter = float(rng.choice([0.0, 0.0002, 0.002]))
    settle = float(rng.choice([0.0, 1.0, 2.0]))
    phase = {n: float(rng.choice([0.0, rng.uniform(0, 0.9)])) for n in nodes}
    lag = {n: 0.0 for n in nodes}
    lag[nodes[int(rng.integers(len(nodes)))]] = float(rng.choice([0.003, 0.012, 0.3 * period]))
    skipper = nodes[int(rng.integers(len(nodes)))]
    with_bytes = {g: bool(rng.integers(0, 2)) for g in groups}
    nsteps = int((seconds + 2) / period)
    steps = {}
    for g, members in groups.items():
        for n in members:
            t = T0 + np.arange(nsteps) * period + 0.0003 + lag[n] + rng.uniform(-jitter, jitter, nsteps)
            keep = rng.random(nsteps) >= (0.2 if n == skipper else 0.0)
            b = rng.choice([4e6, 4.1e6, np.nan], nsteps) if with_bytes[g] else np.full(nsteps, np.nan)
            steps[n] = (t[keep], b[keep])
    silent = {n: (int(rng.integers(10, 60)), int(rng.integers(2, 12))) if rng.random() < 0.12 else (-1, 0) for n in nodes}
    unsynced = {n: int(rng.integers(5, seconds)) if rng.random() < 0.05 else seconds for n in nodes}
    late: list = []
    out = []
    for i in range(seconds):
        tick = []
        for g, members in groups.items():
            for n in members:
                start, span = silent[n]
                if start <= i < start + span or rng.random() < 0.01:
                    continue  # silent (past stale_after when the span is long), or one summary lost
                t = T0 + i + phase[n]
                st, sb = steps[n]
                sel = (st > t - 1 - settle) & (st <= t - settle)
                bursts = list(zip(st[sel].tolist(), sb[sel].tolist()))
                synced = not (unsynced[n] <= i < unsynced[n] + 6)
                msg = (n, t, synced, 0.0005 if synced else None, bursts, with_bytes[g])
                if i > 3 and rng.random() < 0.02:
                    late.append((i + int(rng.integers(1, 4)), msg))
                    continue
                tick.append(msg)
                if rng.random() < 0.01:
                    tick.append(msg)  # sent twice
        tick += [m for due, m in late if due == i]
        late = [(due, m) for due, m in late if due != i]
        rng.shuffle(tick)
        out.append(tick)
    pp = {"pp": [tuple(groups["tp0"]), tuple(groups["tp1"])]}
    return {g: tuple(v) for g, v in groups.items()}, pp, out


def _run(stream, tp, pp, aligners, starts_path: bool) -> None:
    """Feed every aligner the stream (the byte-less groups' summaries through observe_starts,
    as agents send them, when ``starts_path``), derive at every tick, compare with the first."""
    new = aligners[0]
    for i, tick in enumerate(stream):
        for n, t, synced, err, bursts, with_bytes in tick:
            for a in aligners:
                if starts_path and not with_bytes:
                    a.observe_starts(n, t, synced, err, [bt for bt, _ in bursts])
                else:
                    a.observe(n, t, synced, err, list(bursts))
        now = T0 + i + 1
        got = new.derive(now, tp, pp)
        for other in aligners[1:]:
            assert _same(got, other.derive(now, tp, pp)), i
            assert list(new.reports) == list(other.reports)
            for g in new.reports:
                assert _same(vars(new.reports[g]), vars(other.reports[g])), (i, g)


@pytest.mark.parametrize("seed", range(8))
def test_held_windows_give_what_the_aligner_gave(seed: int) -> None:
    tp, pp, stream = _stream(seed)
    new = Aligner(**ARGS)
    # the pre-vectorisation reference takes bursts one way only (observe)
    _run(stream, tp, pp, [new, Aligner(**ARGS, incremental=False), ref.Aligner(**ARGS)], starts_path=False)
    held = [w for w in new.windows.values() if w.slot is not None]
    assert held and sum(w.reused for w in held) > 5 * len(held)  # mostly moved on in the tables
    assert any(w.full > 1 for w in new.windows.values())  # and some fell back (late summaries, stale peers)
    _run(stream, tp, pp, [Aligner(**ARGS), Aligner(**ARGS, incremental=False)], starts_path=True)


def test_a_window_start_cutting_through_a_step_aligns_that_group_from_scratch() -> None:
    """Group a's steps spread over 4 ms and its window start falls 2 ms into the step grid: most
    ticks it cuts through a step, and that group is aligned from scratch then; group b's start
    never does, and b is only moved on."""
    rng = np.random.default_rng(3)
    tp = {"a": tuple(f"a{i}" for i in range(4)), "b": tuple(f"b{i}" for i in range(4))}
    offset = {"a": 0.003, "b": 0.0}  # summary times past the second
    bursts = {n: T0 + np.arange(1300) * 0.05 + 0.001 + (rng.uniform(0, 0.004, 1300) if g == "a" else 0.0)
              for g, members in tp.items() for n in members}
    new, full = Aligner(**ARGS), Aligner(**ARGS, incremental=False)
    for i in range(60):
        for g, members in tp.items():
            t0, t1 = T0 + i + offset[g], T0 + i + 1 + offset[g]
            for n in members:
                b = bursts[n]
                starts = b[(b > t0) & (b <= t1)].tolist()  # the summary's interval's bursts
                for a in (new, full):
                    a.observe_starts(n, t1, True, 0.0005, list(starts))
        now = T0 + i + 1.5
        assert _same(new.derive(now, tp, {}), full.derive(now, tp, {})), i
    a, b = new.windows["a"], new.windows["b"]
    assert b.full == 1 and b.reused == 59
    assert 10 < a.full < 59 and a.reused > 0


@pytest.mark.parametrize("phases", [False, True])
def test_steps_reported_once_settled_are_measured_incrementally(phases: bool) -> None:
    """Agents report a step a second after it started (agent/steps.py settled_steps), so every
    summary carries bursts older than the previous tick's settled time. Those are new bursts
    like any other: a steady group is aligned from scratch once, then only moved on (before,
    every tick aligned every group from scratch), with members on phases of their own too."""
    rng = np.random.default_rng(11)
    tp = {"g": tuple(f"n{i}" for i in range(8))}
    phase = {n: float(rng.uniform(0, 0.9)) if phases else 0.0 for n in tp["g"]}
    bursts = {n: T0 + np.arange(2000) * 0.05 + 0.0003 + rng.uniform(0, 0.0005, 2000) for n in tp["g"]}
    new, full = Aligner(**ARGS), Aligner(**ARGS, incremental=False)
    for i in range(45):
        for n in tp["g"]:
            t = T0 + i + 1 + phase[n]
            b = bursts[n]
            starts = b[(b > t - 2.0) & (b <= t - 1.0)].tolist()  # settled: a second old
            for a in (new, full):
                a.observe_starts(n, t, True, 0.0005, list(starts))
        now = T0 + i + 2
        assert _same(new.derive(now, tp, {}), full.derive(now, tp, {})), i
    gw = new.windows["g"]
    assert gw.full <= 2 and gw.reused >= 43


def test_step_tables_reuse_the_slots_of_groups_that_went() -> None:
    t = StepTable(4, 2)
    slots = [t.alloc() for _ in range(10)]
    assert slots == list(range(10)) and t.gcap >= 10
    t.release(3)
    assert t.alloc() == 3
    with pytest.raises(ValueError):
        StepTable(1, 1)
