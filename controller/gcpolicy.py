"""Keep CPython's full garbage collections off a warm controller's ticks.

At 1,000 nodes a warm controller holds ~420k GC-tracked objects that live as long as it does:
per-node store blocks, timelines, node book entries, compiled rules. CPython collects its oldest
generation whenever the objects that survived into it since the last full collection exceed a
quarter of those already there, and a full collection walks them all: 50-300 ms here, about once
every 6 s of a 2,500 summaries/s flood, on whatever thread allocates at that moment - often the
tick thread, so a group-rule tick of 40 ms read 230-250 ms (docs/benchmarks.md, "Controller
ingest, 2026-11-27 13:10").

:func:`settle` does what long-running Python servers do after warm-up (``gc.freeze()``, CPython's
documented use for it): one full collection, then every survivor is moved to the permanent
generation, which later collections do not walk. Objects made later are collected as usual,
and objects freed by reference count (almost all of ours: no cycles) are freed as usual; only
a reference *cycle* among the frozen objects, broken later, would stay until exit. A controller
settles once its first tick is warm and again whenever the nodes it knows grew by a quarter
since (new nodes bring their own long-lived blocks), so the walked set stays small.

It also lets the young generation grow (:data:`YOUNG_THRESHOLD` container allocations between
young collections instead of CPython's 700), as long-running Python servers tune it: a summary
allocates a few dozen short-lived containers, almost all freed by reference count, yet every 700
allocations the collector walked the young generation; at 50,000 summaries/s that walk was ~12 %
of the intake's CPU (offline `bench/controller_ingest.py --offline 50000`: 15-16.7 -> 13.2-13.8 us
a summary). What waits uncollected is only cyclic garbage, bounded by the threshold.

Process-wide: only a started controller (``Controller.start``, the ``skewd controller``
process) settles; a harness, replay or test that drives ticks itself does not, unless it asks.
"""
from __future__ import annotations

import gc
import logging

log = logging.getLogger("skewd.controller")

#: settle again when the nodes known grew by this factor since the last settle: a new node's
#: blocks and book entries are long-lived like the first ones (choice: CPython's own
#: full-collection trigger is a growth of a quarter of the oldest generation)
REGROW = 1.25

#: young-generation collections every this many net container allocations (CPython: 700), and
#: the middle and old generations every 20 of the one before (CPython: 10); set at the first settle
YOUNG_THRESHOLD = (20_000, 20, 20)


class GcPolicy:
    """When a controller freezes what it holds (see the module doc). ``enabled`` is off for a
    controller that is not the process's server."""

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self.settled_at_nodes = 0  # nodes known at the last settle; 0: never settled
        self.settles = 0

    def after_tick(self, warm: bool, nodes: int) -> bool:
        """Called after each tick: settle on the first warm tick and when ``nodes`` grew by
        :data:`REGROW` since. Returns whether it settled."""
        if not (self.enabled and warm):
            return False
        if self.settled_at_nodes and nodes < self.settled_at_nodes * REGROW:
            return False
        settle()
        if not self.settles:
            young, *_ = gc.get_threshold()
            if young and young < YOUNG_THRESHOLD[0]:  # 0: collection switched off; leave it so
                gc.set_threshold(*YOUNG_THRESHOLD)
        self.settled_at_nodes = max(1, nodes)
        self.settles += 1
        log.debug("froze %d long-lived objects at %d nodes (gc.freeze)", gc.get_freeze_count(), nodes)
        return True


def settle() -> None:
    """One full collection, then the survivors out of the collector's walks (``gc.freeze``)."""
    gc.collect()
    gc.freeze()
