"""Shared bits for the fault-lab tests: short scenarios written on the fly."""
from __future__ import annotations

from pathlib import Path

from skewd.lab.sim.scenario import Scenario, load_scenario


def scenario(tmp: Path, body: str, name: str = "t") -> Scenario:
    p = tmp / f"{name}.yaml"
    p.write_text(body)
    return load_scenario(p)
