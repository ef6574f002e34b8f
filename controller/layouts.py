"""What the controller works out once per binary summary layout, so that taking in a binary
summary (:meth:`~skewd.controller.intake.Intake.ingest_binary`) reads its values by position
instead of walking a dict of dicts.

A layout (:class:`skewd.wire.SummaryLayout`: the ordered (signal, entity) pairs of a node's
summaries) is the same summary after summary, and usually the same on every node of a cluster;
its :class:`IntakePlan` knows which values are window-store samples (and their signal and
entity lists, which the store feed recognises once per node), where the engine timelines find
their inputs (:func:`~skewd.controller.timeline.summary_plan`); the scaled-out leader reads the
partitions' digests (controller/digest.py: rows of a layout as columns) with the same plans.
:class:`IntakeLayouts` holds the layouts the controller has learned (:class:`skewd.wire.LayoutBook`,
bounded by the nodes it admits) and their plans.
"""
from __future__ import annotations

import numpy as np

from skewd import wire

from .storefeed import NOT_SAMPLES
from .timeline import SummaryPlan, summary_plan

_F8 = np.dtype("<f8")


class IntakePlan:
    """One layout's reading plan (see the module doc); made when a node first uses the layout."""

    __slots__ = ("layout", "id", "sample_idx", "names", "entities", "timeline")

    def __init__(self, layout: wire.SummaryLayout) -> None:
        self.layout = layout
        self.id = layout.id
        idx = [i for i, name in enumerate(layout.names) if name not in NOT_SAMPLES]
        #: positions of the window-store samples (None: every value is one)
        self.sample_idx: np.ndarray | None = None if len(idx) == len(layout) else np.array(idx, dtype=np.intp)
        self.names = [layout.names[i] for i in idx]
        self.entities = [layout.entities[i] for i in idx]
        self.timeline: SummaryPlan = summary_plan(layout.signals)

    def sample_bytes(self, values: bytes) -> bytes:
        """The store samples' float64s out of all the values' (``sample_idx`` set)."""
        return np.frombuffer(values, _F8)[self.sample_idx].tobytes()

    def complete(self, values: list[float]) -> bool:
        """No store sample among ``values`` is NaN (missing)."""
        if self.sample_idx is None:
            return not any(v != v for v in values)
        return not any(values[i] != values[i] for i in self.sample_idx.tolist())

    def samples(self, values: list[float]) -> tuple[list[str], list[str], list[float]]:
        """(signals, entities, values) of the store samples, NaN left out: what
        :meth:`~skewd.controller.storefeed.StoreFeed.samples` gives for the same summary sent
        as JSON (NaN there is ``null``)."""
        if self.sample_idx is None:
            keep = [i for i, v in enumerate(values) if v == v]
        else:
            keep = [i for i in self.sample_idx.tolist() if values[i] == values[i]]
        names, ents = self.layout.names, self.layout.entities
        return [names[i] for i in keep], [ents[i] for i in keep], [values[i] for i in keep]


class IntakeLayouts:
    """The binary layouts the controller has learned and their plans: owned by the
    :class:`~skewd.controller.service.Controller`, used by its summary intake, told when a
    node is forgotten (:meth:`forget_node`)."""

    def __init__(self) -> None:
        self.book = wire.LayoutBook()
        self.plans: dict[int, IntakePlan] = {}

    def resolve(self, h: wire.BinarySummary) -> wire.SummaryLayout | None:
        """The summary's layout, carried or learned (None: unknown yet); learns nothing."""
        return self.book.resolve(h)

    def keep(self, node: str, layout: wire.SummaryLayout) -> IntakePlan:
        """Note that ``node`` (admitted) uses ``layout``; its plan."""
        for lid in self.book.keep(node, layout):
            self.plans.pop(lid, None)
        plan = self.plans.get(layout.id)
        if plan is None:
            plan = self.plans[layout.id] = IntakePlan(layout)
        return plan

    def forget_node(self, node: str) -> None:
        for lid in self.book.forget_node(node):
            self.plans.pop(lid, None)
