"""No data is not healthy data: a firing alert is held across a gap in its data instead of
resolving (rules/engine.py, module doc). The case that broke: a 45 s agent freeze resolved two
GPU-3 (engine stall) findings whose engine was still stalled - its window held one sample, so
``increase()`` said nothing - and fired them again 31 s later."""
from __future__ import annotations

from skewd.model import BatchBuilder
from skewd.rules.engine import Engine
from skewd.rules.loader import load_rules
from skewd.rules.store import WindowStore

# GPU-3's shape (rules/packs/gpu-engine.yaml) over this test catalogue's signals: busy, and no
# progress of a counter over the window
STALL = """
required_engine_version: 1
rules:
  - id: STALL
    pathology: GPU-3
    scope: gpu
    layer: engine
    params: {window: 30s}
    expr: last(gpu_util_ratio, window) > 0 and increase(pcie_rx_bytes_total, window) == 0
    for: 30s
    keep_firing_for: 30s
"""
# a rule that reads *false*, not unknown, on a half-empty window
DENSE = """
required_engine_version: 1
rules:
  - id: DENSE
    pathology: GPU-5
    scope: gpu
    layer: gpu
    expr: count(gpu_util_ratio, 20s) >= 10 and avg(gpu_util_ratio, 20s) > 0.8
    for: 5s
"""


def _engine(cat, tmp_path, text: str, horizon: float = 600.0) -> tuple[WindowStore, Engine]:
    f = tmp_path / "r.yaml"
    f.write_text(text)
    res = load_rules([f], cat)
    assert res.ok, res.issues
    store = WindowStore(cat, horizon=horizon)
    return store, Engine(res.ruleset, store)


def _sample(store: WindowStore, t: float, util: float, counter: float, ents=("gpu0", "gpu1")) -> None:
    b = BatchBuilder("n1")
    for e in ents:
        b.add(t, e, "gpu_util_ratio", util)
        b.add(t, e, "pcie_rx_bytes_total", counter)
    store.ingest(b.build())


def _live(store, eng, t0: int, t1: int, util, counter, out: list, ents=("gpu0", "gpu1"), gc: bool = False) -> None:
    """What an agent does each second of [t0, t1): collect, then evaluate at the tick time."""
    for t in range(t0, t1):
        _sample(store, float(t), util(t), counter(t), ents)
        if gc:
            store.gc(float(t))
        out += [(int(f.evaluated_at), f.entity, f.state.value, f.id) for f in eng.evaluate(float(t))]


def _stalled(t: int) -> float:
    return 5e9  # the counter does not move


def test_a_freeze_longer_than_the_window_keeps_a_still_stalled_engine_firing(cat, tmp_path) -> None:
    store, eng = _engine(cat, tmp_path, STALL)
    out: list = []
    _live(store, eng, 0, 100, lambda t: 0.5, _stalled, out, ents=("gpu0",))
    # the process is frozen for 45 s (SIGSTOP, a VM pause): no collection, no evaluation
    _live(store, eng, 145, 200, lambda t: 0.5, _stalled, out, ents=("gpu0",))
    states = [(t, s) for t, _, s, _ in out]
    assert states == [(1, "pending"), (31, "firing")], states  # no resolution, no second firing
    assert len({i for *_, i in out}) == 1  # one occurrence, one id
    # the engine recovers: the counter moves, the alert resolves keep_firing_for after its last truth
    _live(store, eng, 200, 240, lambda t: 0.5, lambda t: 5e9 + (t - 199) * 1e6, out, ents=("gpu0",))
    assert [(t, s) for t, _, s, _ in out][2:] == [(229, "resolved")]  # 30 s after its last true tick (199)


def test_without_the_hold_the_freeze_resolved_and_refired(cat, tmp_path) -> None:
    """What the old engine did (and what this change stops): the reproduction of the report,
    kept as a check that the scenario above really has empty windows after the freeze."""
    store, eng = _engine(cat, tmp_path, STALL)
    eng._no_evidence_of_end = lambda *a, **k: False  # the old rule: not true → resolve
    out: list = []
    _live(store, eng, 0, 100, lambda t: 0.5, _stalled, out, ents=("gpu0",))
    _live(store, eng, 145, 200, lambda t: 0.5, _stalled, out, ents=("gpu0",))
    assert [(t, s) for t, _, s, _ in out] == [(1, "pending"), (31, "firing"), (145, "resolved"),
                                              (146, "pending"), (176, "firing")]


def test_a_condition_that_ended_during_the_gap_resolves_one_window_after_data_returns(cat, tmp_path) -> None:
    store, eng = _engine(cat, tmp_path, STALL)
    out: list = []
    _live(store, eng, 0, 100, lambda t: 0.5, _stalled, out, ents=("gpu0",))
    # frozen 45 s; the engine came back meanwhile: the counter moves again from the resume on
    _live(store, eng, 145, 200, lambda t: 0.5, lambda t: 5e9 + (t - 144) * 1e6, out, ents=("gpu0",))
    assert [(t, s) for t, _, s, _ in out] == [(1, "pending"), (31, "firing"), (175, "resolved")]
    assert eng.held == {}


def test_a_false_verdict_on_a_refilling_window_is_not_trusted(cat, tmp_path) -> None:
    store, eng = _engine(cat, tmp_path, DENSE)
    out: list = []
    _live(store, eng, 0, 40, lambda t: 0.9, _stalled, out)
    # frozen 30 s (longer than the 20 s window): at the resume the window holds one sample, so
    # count() >= 10 reads false - from the gap, not from the GPUs
    _live(store, eng, 70, 100, lambda t: 0.9, _stalled, out)
    assert [(t, e, s) for t, e, s, _ in out] == [(9, "gpu0", "pending"), (9, "gpu1", "pending"),
                                                 (14, "gpu0", "firing"), (14, "gpu1", "firing")]
    # ... and a real end after the refill resolves at once (keep_firing_for 0)
    _live(store, eng, 100, 105, lambda t: 0.1, _stalled, out)
    assert [(t, s) for t, _, s, _ in out[4:]] == [(102, "resolved"), (102, "resolved")]  # avg over 20 s drops below 0.8 at 102


def test_an_entity_that_vanished_is_held_until_the_store_forgets_it(cat, tmp_path) -> None:
    store, eng = _engine(cat, tmp_path, STALL, horizon=60.0)
    out: list = []
    _live(store, eng, 0, 40, lambda t: 0.5, _stalled, out, gc=True)
    # gpu1 stops reporting (its exporter died, the GPU fell off the bus); gpu0 goes on, stalled
    _live(store, eng, 40, 130, lambda t: 0.5, _stalled, out, ents=("gpu0",), gc=True)
    gpu1 = [(t, s) for t, e, s, _ in out if e == "gpu1"]
    # unknown while the store keeps gpu1's rows (until 60 s after its last sample), then gone
    assert gpu1 == [(1, "pending"), (31, "firing"), (100, "resolved")], gpu1
    assert [s for _, e, s, _ in out if e == "gpu0"] == ["pending", "firing"]


def test_range_evaluation_holds_exactly_as_tick_by_tick(cat, tmp_path) -> None:
    """Replay evaluates ranges of ticks at once (Engine.evaluate_range): the same holds."""
    want: list = []
    store, eng = _engine(cat, tmp_path, STALL)
    _live(store, eng, 0, 100, lambda t: 0.5, _stalled, want, ents=("gpu0",))
    _live(store, eng, 145, 240, lambda t: 0.5, lambda t: 5e9 + max(0, t - 199) * 1e6, want, ents=("gpu0",))

    store, eng = _engine(cat, tmp_path, STALL)
    got: list = []
    for lo, hi in ((0, 100), (145, 240)):
        for start in range(lo, hi, 13):  # ranges of 13 ticks, cut anywhere
            ticks = [float(t) for t in range(start, min(hi, start + 13))]
            for k, t in enumerate(ticks):
                store.track_births(k)
                _sample(store, t, 0.5, 5e9 + max(0, int(t) - 199) * 1e6, ("gpu0",))
            for fs in eng.evaluate_range(ticks, store.take_births(), ticks):
                got += [(int(f.evaluated_at), f.entity, f.state.value, f.id) for f in fs]
    assert got == want and [s for _, _, s, _ in want] == ["pending", "firing", "resolved"]


def test_a_restored_firing_alert_is_held_while_the_restarted_process_refills_its_windows(cat, tmp_path) -> None:
    store, eng = _engine(cat, tmp_path, STALL)
    out: list = []
    _live(store, eng, 0, 100, lambda t: 0.5, _stalled, out, ents=("gpu0",))
    saved = eng.states
    # a restart: new store and engine, alert states restored from the snapshot taken at t=99
    store2, eng2 = _engine(cat, tmp_path, STALL)
    eng2.states = saved
    eng2.resume_from(99.0)
    out2: list = []
    _live(store2, eng2, 160, 200, lambda t: 0.5, lambda t: 7e9, out2, ents=("gpu0",))
    assert out2 == []  # still firing, never re-fired
