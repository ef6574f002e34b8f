"""What a replay step yields (:class:`Event`) and where a time slice's replay hands over
(:class:`Checkpoint`): shared by the replay loop (core) and its parallel time slices (slices)."""
from __future__ import annotations

from dataclasses import dataclass, field

from skewd import wire
from skewd.controller import messages as controller_messages
from skewd.model import Finding


@dataclass
class Event:
    """One step of the replay: an evaluation time and what it produced - the node findings (and,
    in a cluster replay, the controller's), the node summaries made or recorded at it, and what
    the controller published: incident messages and remap suggestions."""

    t: float
    findings: list[Finding]
    summaries: list[wire.Summary] = field(default_factory=list)
    incidents: list[controller_messages.Incident] = field(default_factory=list)
    suggestions: list[controller_messages.RemapSuggestion] = field(default_factory=list)


@dataclass
class Checkpoint:
    """A time slice's boundary in :meth:`Replayer.steps`: everything before ``t`` has been
    ingested and evaluated, nothing at or after it; ``digest`` is :meth:`Replayer.state_digest`
    there."""

    t: float
    digest: str
