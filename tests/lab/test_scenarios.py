"""Scenario files are validated strictly, every problem at once, with file:line:col."""
from __future__ import annotations

import pytest

from skewd.lab.sim import ScenarioError, list_scenarios, load_scenario
from skewd.lab.sim.faults import INJECTORS
from skewd.rules.pathologies import PATHOLOGIES


def _errors(tmp_path, text: str) -> list[str]:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ScenarioError) as ei:
        load_scenario(p)
    return ei.value.errors


def test_shipped_scenarios_load_and_cover_every_pathology():
    paths = list_scenarios()
    covered = set()
    healthy = []
    for p in paths:
        sc = load_scenario(p)  # raises on any problem
        covered |= {f.pathology for f in sc.faults}
        if not sc.faults:
            healthy.append(sc.shape)
    assert covered == set(PATHOLOGIES) == set(INJECTORS)
    assert {"dp", "pergpu", "tp", "pp", "disagg"} <= set(healthy)


def test_typos_are_reported_with_position_and_suggestion(tmp_path):
    errs = _errors(tmp_path, """\
name: x
shape: tp
duration: 5m
cluster:
  nodse: 4
faults:
  - pathology: EW-1
    onset: 90s
    duraton: 1m
""")
    assert any(e.startswith(f"{tmp_path / 'bad.yaml'}:5:3:") and "'nodse'" in e and "did you mean 'nodes'" in e
               for e in errs), errs
    assert any(":9:5:" in e and "'duraton'" in e and "did you mean 'duration'" in e for e in errs), errs
    assert any("missing key 'duration'" in e for e in errs), errs


def test_all_errors_at_once(tmp_path):
    errs = _errors(tmp_path, """\
name: x
shape: dpp
duration: forever
faults:
  - pathology: EW-42
    onset: 10s
    duration: 1m
""")
    joined = "\n".join(errs)
    assert ":2:8:" in joined and "unknown shape 'dpp'" in joined and "did you mean" in joined
    assert ":3:11:" in joined and "bad duration" in joined
    assert ":5:16:" in joined and "unknown pathology 'EW-42'" in joined
    assert len(errs) >= 3


def test_fault_the_cluster_cannot_host(tmp_path):
    errs = _errors(tmp_path, """\
name: x
shape: dp
duration: 6m
faults:
  - pathology: EW-2
    onset: 90s
    duration: 2m
  - pathology: EW-1
    node: node9
    onset: 90s
    duration: 2m
""")
    assert any(":5:16:" in e and "EW-2 cannot happen on this cluster" in e for e in errs), errs
    assert any(":8:16:" in e and "EW-1 cannot happen" in e for e in errs), errs


def test_ranges_entities_variants_params(tmp_path):
    errs = _errors(tmp_path, """\
name: x
shape: tp
duration: 5m
faults:
  - pathology: EW-6
    node: node1
    entity: mlx5_9/1
    variant: bad_optic
    onset: [3m, 1m]
    duration: 4m
    severity: 1.5
    params: {speed: 2}
  - pathology: EW-1
    onset: 2m
    duration: 4m
""")
    j = "\n".join(errs)
    assert ":7:13:" in j and "mlx5_0/1" in j  # the valid choices are listed
    assert ":8:14:" in j and "did you mean 'bad_optics'" in j
    assert ":9:12:" in j and "lo <= hi" in j
    assert "severity is in [0, 1]" in j
    assert "EW-6 takes no params" in j
    assert "fault ends after the scenario" in j


def test_yaml_syntax_and_duplicate_keys(tmp_path):
    errs = _errors(tmp_path, "name: x\nshape: [dp\n")
    assert errs and errs[0].startswith(f"{tmp_path / 'bad.yaml'}:") and "YAML syntax" in errs[0]
    errs = _errors(tmp_path, "name: x\nshape: dp\nshape: tp\nduration: 5m\n")
    assert any(":3:1:" in e and "duplicate key 'shape'" in e for e in errs)


def test_warm_up_is_required(tmp_path):
    errs = _errors(tmp_path, "name: x\nshape: dp\nduration: 5m\nfaults:\n  - {pathology: GPU-2, onset: 10s, duration: 1m}\n")
    assert any("warm-up" in e for e in errs)
