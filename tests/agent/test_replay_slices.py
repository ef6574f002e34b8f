"""Time-sliced parallel replay (``ParallelReplayer(jobs=N)``, :mod:`skewd.agent.replay.slices`) gives the
very events of the serial replay on a recording with faults: a slice whose state at its boundary
equals the serial state is handed over, one after an alert that began before its warm-up is not
(the serial replay goes on through it), and either way every finding, its evidence and start
time, and every summary are those of the serial replay, in the same order."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from skewd.agent.replay import Replayer, finding_json, open_segments, replay_catalogue
from skewd.agent.replay.slices import ParallelReplayer

ROOT = Path(__file__).resolve().parents[2]

# Test rules: the shipped GPU-6 AER rule with a 30 s window so that a 20-minute recording holds
# three slices (the shipped 10m window needs a 12-minute warm-up); the threshold is the pack's.
RULES = """\
required_engine_version: 1
rules:
  - id: TEST-aer-errors
    pathology: GPU-6
    desc: A PCI device reports a burst of correctable AER errors (GPU-6-pcie-aer-errors, 30 s window).
    scope: pci_device
    layer: pcie
    params:
      window: 30s
      correctable: 50
    expr: increase(pcie_aer_correctable_errors_total, window) > correctable
    for: 5s
    keep_firing_for: 20s
    severity: warning
"""
DEV = "0000:18:00.0"
# one burst across the first boundary that began before that slice's warm-up (its start time is
# in every later transition: no handover), one across the second that began inside its warm-up
FAULTS = [("pcie_aer_correctable_errors_total", DEV, 150.0, 450.0),
          ("pcie_aer_correctable_errors_total", DEV, 700.0, 820.0)]


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> tuple[Path, Path]:
    spec = importlib.util.spec_from_file_location("replay_speed_bench", ROOT / "bench" / "replay_speed.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    d = tmp_path_factory.mktemp("slices")
    rules = d / "rules.yaml"
    rules.write_text(RULES)
    # 20 minutes of the benchmark's 8-GPU node (2 CPUs, 2 flows) at 1 Hz, healthy but for FAULTS
    mod.record(d / mod.NODE, 1200 / 3600, 1.0, 2, 2, fault=FAULTS)
    return d / mod.NODE, rules


def _run(bundle: Path, rules: Path, jobs: int) -> tuple[list, Replayer]:
    segs, damage = open_segments([bundle])
    assert not damage
    rep = ParallelReplayer(segs, replay_catalogue(segs), rules=[str(rules)], jobs=jobs)
    rep.horizon = 60.0  # what the test rules need: a 3-minute warm-up
    evs = [(ev.t, [finding_json(f) for f in ev.findings], [repr(s) for s in ev.summaries]) for ev in rep.events()]
    return evs, rep


def test_sliced_replay_equals_serial_on_a_recording_with_faults(recording: tuple[Path, Path]) -> None:
    bundle, rules = recording
    want, serial = _run(bundle, rules, 1)
    got, sliced = _run(bundle, rules, 3)
    states = [f for _, fs, _ in want for f in fs]
    assert sum('"firing"' in f for f in states) == 2 and sum('"resolved"' in f for f in states) == 2, states
    assert len(sliced.slice_stats.boundaries) == 2
    # the first boundary falls inside an alert older than its slice's warm-up; the second inside
    # one that began within it
    assert sliced.slice_stats.handed_over == [False, True]
    assert got == want
    assert (sliced.evaluations, sliced.start, sliced.end) == (serial.evaluations, serial.start, serial.end)
    assert [repr(s) for s in sliced.summaries] == [repr(s) for s in serial.summaries]


def test_digest_differs_where_the_alert_started_before_the_warm_up(recording: tuple[Path, Path]) -> None:
    """The check the handover rests on: a replay warmed up from too late has another state."""
    bundle, rules = recording
    segs, _ = open_segments([bundle])
    b = segs[0].start + 400.0
    out = {}
    for name, warm in (("serial", None), ("late", b - 180.0), ("long", b - 390.0)):
        rep = Replayer(segs, replay_catalogue(segs), rules=[str(rules)])
        rep.horizon = 60.0
        out[name] = next(x.digest for x in rep.steps(warm, b if warm else None, [b]) if hasattr(x, "digest"))
    assert out["late"] != out["serial"]  # the burst began at 150 s: before the warm-up at 220 s
    assert out["long"] == out["serial"]  # warmed up from before it began: the same state
