"""The fault lab: a seeded GPU-inference cluster simulator with an injector for every pathology.

    from skewd.lab.sim import simulate, load_scenario, list_scenarios
    sim = simulate("ew1-tp-straggler", seed=1)   # a shipped scenario name, a path, or a Scenario
    for t, node, batch in sim:                    # every collector's SampleBatch, in time order
        ...
    sim.truth                                     # what was injected: GroundTruth per fault
    sim.node_labels()                             # tp_group / pp_group / model labels per node

:class:`~skewd.lab.harness.Harness` runs a simulation through the agent pipeline and
the controller's group evaluation; ``bench/detection.py`` scores it.
"""
from __future__ import annotations

from .scenario import Scenario, ScenarioError, list_scenarios, load_scenario
from .simulator import GroundTruth, Simulation, simulate

__all__ = ["GroundTruth", "Scenario", "ScenarioError", "Simulation", "list_scenarios", "load_scenario", "simulate"]
