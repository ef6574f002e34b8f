"""Range evaluation in replay (``Engine.evaluate_range``, ``Replayer(range_eval=True)``) gives the
very events of evaluating at every tick: the same findings, evidence and summaries, in the same
order, on the replay benchmark's simulated bundle and on fault-lab bundles."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from skewd.agent.replay import Replayer, finding_json, open_segments, replay_catalogue
from skewd.lab.sim import simulate
from skewd.lab.bundle import write_bundle
from skewd.rules.cli import PACKS

from ..lab.helpers import scenario

ROOT = Path(__file__).resolve().parents[2]


def _events(bundle: Path, range_eval: bool, horizon: float | None = None, **kw) -> tuple[list, Replayer]:
    segs, damage = open_segments([bundle])
    assert not damage
    rep = Replayer(segs, replay_catalogue(segs), rules=[str(PACKS)], range_eval=range_eval, **kw)
    if horizon is not None:
        rep.horizon = horizon  # a short horizon: blocks make room (drop columns) within the span
    evs = [(ev.t, [finding_json(f) for f in ev.findings], [s.to_dict() if hasattr(s, "to_dict") else repr(s)
                                                           for s in ev.summaries])
           for ev in rep.events()]
    return evs, rep


def _same(bundle: Path, **kw) -> list:
    want, ref = _events(bundle, False, **kw)
    got, rep = _events(bundle, True, **kw)
    assert len(got) == len(want)
    for a, b in zip(want, got):
        assert a == b, kw
    assert rep.evaluations == ref.evaluations
    for node, p in ref.pipelines.items():  # the stores end as they did tick by tick
        q = rep.pipelines[node]
        assert (q.ticks, q.findings_total, q.store.version, q.store.latest_t) == \
            (p.ticks, p.findings_total, p.store.version, p.store.latest_t)
        assert {(s, n, b.n, b.times.shape[0]) for s, per in q.store.blocks.items() for n, b in per.items()} == \
            {(s, n, b.n, b.times.shape[0]) for s, per in p.store.blocks.items() for n, b in per.items()}
    return want


@pytest.fixture(scope="module")
def bench_bundle(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location("replay_speed_bench", ROOT / "bench" / "replay_speed.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    d = tmp_path_factory.mktemp("bench") / mod.NODE
    # 100 s of the benchmark's 8-GPU node at 10 Hz, the unhealthy variant: many rules fire
    mod.record(d, 100 / 3600, 10.0, 16, 16, healthy=False)
    return d


def test_benchmark_bundle_same_events_by_range(bench_bundle: Path) -> None:
    evs = _same(bench_bundle)
    assert sum(len(e[1]) for e in evs) > 20  # the packs do fire on it
    # and most samples went through the held-back bulk path (replay/ahead.py), not batch by batch
    _, rep = _events(bench_bundle, True)
    ingested = sum(p.store.samples_ingested for p in rep.pipelines.values())
    assert rep._ahead.written > 0.8 * ingested, (rep._ahead.written, ingested)


def test_benchmark_bundle_short_ranges_and_from(bench_bundle: Path) -> None:
    # ranges cut every few ticks, and evaluation starting mid-way (alert state starts fresh)
    _same(bench_bundle, max_range=3)
    segs, _ = open_segments([bench_bundle])
    start = float(segs[0].ticks()[0][0])
    _same(bench_bundle, t_from=start + 37.0, t_to=start + 90.0)


def test_benchmark_bundle_with_columns_dropped(bench_bundle: Path) -> None:
    # a 20 s horizon: blocks make room (dropping columns) many times, and windows up to 15 min
    # see only what the store kept, so a range must end before any block makes room
    _same(bench_bundle, horizon=20.0)


FAULTS = {
    "ns7": """\
name: ns7
shape: dp
duration: 3m
faults:
  - pathology: NS-7
    onset: 70s
    duration: 90s
    severity: 0.9
""",
    "ew1": """\
name: ew1
shape: tp
duration: 4m
faults:
  - pathology: EW-1
    node: any
    onset: 75s
    duration: 2m
""",
    "gpu3": """\
name: gpu3
shape: dp
duration: 4m
faults:
  - pathology: GPU-3
    node: any
    onset: 75s
    duration: 2m
""",
    "gpu6": """\
name: gpu6
shape: dp
duration: 3m
faults:
  - pathology: GPU-6
    node: any
    onset: 60s
    duration: 90s
""",
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_lab_bundle_same_events_by_range(tmp_path: Path, name: str) -> None:
    sc = scenario(tmp_path, FAULTS[name], name)
    write_bundle(simulate(sc, 5), tmp_path / "bundle")
    evs = _same(tmp_path / "bundle")
    assert any(e[1] for e in evs)
    _same(tmp_path / "bundle", max_range=4, horizon=45.0)
