"""The fault lab: what skewd is measured against, kept apart from what a deployed agent or
controller runs.

- :mod:`skewd.lab.sim`: a seeded GPU-inference cluster simulator with an injector for every
  pathology (fast, deterministic; calibrated against the real-network lab).
- :mod:`skewd.lab.harness`: the simulated cluster through skewd itself - one agent pipeline per
  node fed by the simulator, and the controller service on simulated time
  (:class:`skewd.controller.offline.OfflineController`, the same in-process controller cluster
  replay runs over recorded bundles); used by the detection benchmark and the lab's tests.
- :mod:`skewd.lab.bundle`: a simulated run written as a capture bundle (``skewd replay`` input).
- :mod:`skewd.lab.demo`: ``skewd demo``.

Imports go one way: lab -> agent / controller / rules -> model. Nothing outside ``lab`` and the
tests imports it.
"""
