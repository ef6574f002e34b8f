"""The fault lab: what skewd is measured against, kept apart from what a deployed agent or
controller runs.

- :mod:`skewd.lab.sim`: a seeded GPU-inference cluster simulator with an injector for every
  pathology (fast, deterministic; calibrated against the real-network lab).
- :mod:`skewd.lab.harness`: the in-process cluster harness - one agent pipeline per node and the
  controller's group evaluation on simulated time - shared by ``skewd demo``, the detection
  benchmark and cluster replay.
- :mod:`skewd.lab.demo`: ``skewd demo``.

Imports go one way: lab -> agent / controller / rules -> model. Nothing outside ``lab`` and the
tests imports it.
"""
