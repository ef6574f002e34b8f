"""Which rules this agent evaluates, which it cannot and why, which the controller evaluates for
it, and which its clock weakens: one answer for ``skewd agent --check``, the health message and
``/metrics``, so the three never disagree.

A tp_group or cluster rule (EW-1, say) is not "inactive" on an agent because no collector here
supplies ``ctl_*`` signals: the controller evaluates it over every node's summaries. It is
weakened, though, when this node's clock is not synchronised (or its error bound is unknown or
above a millisecond) and the rule reads signals computed by matching timestamps taken on
different nodes (``SignalSpec.needs_synced_clock``): the controller then assumes
``alignment.unsynced_clock_error`` for the node (or subtracts its error bound) and a lag smaller
than that is not attributed to it. Measures that need no cross-node clock (a node's own durations,
byte rates) are unaffected.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from skewd.model import Catalogue

if TYPE_CHECKING:
    from skewd.rules.engine import Engine

    from .clock import ClockState

#: what the controller's default is called and worth, for the words an operator reads
UNSYNCED_ERROR_SETTING = "alignment.unsynced_clock_error (default 50 ms)"


@dataclass
class RuleStatus:
    """The rules of one agent by where and whether they run."""

    active: list[str] = field(default_factory=list)  # evaluated here
    inactive: dict[str, str] = field(default_factory=dict)  # rule id → why it cannot run (here or anywhere)
    controller: list[str] = field(default_factory=list)  # evaluated by the controller over node summaries
    clock_weakened: dict[str, str] = field(default_factory=dict)  # rule id → what this node's clock costs it


#: an error bound above this weakens cross-node timing: two nodes at 1 ms each use up EW-1's
#: default 2 ms lag bar (rules/packs/east-west.yaml), since the controller subtracts both bounds
MAX_GOOD_ERROR_S = 0.001


def _dur(s: float) -> str:
    return f"{s * 1000:.3g} ms" if s < 1 else f"{s:.3g} s"


def clock_words(clock: "ClockState | None") -> str:
    """The clock state in one line, as --check and the log print it."""
    if clock is None:
        return "unknown (not read)"
    err = "unknown error bound" if clock.max_error_s is None else f"error bound {_dur(clock.max_error_s)}"
    return f"{'synced' if clock.synced else 'NOT synced'} ({err}; {clock.source})"


def clock_weak(clock: "ClockState | None") -> bool:
    """Whether this node's timestamps cannot be placed against a peer's finely enough: an
    unsynced clock, one whose error bound nobody keeps, or a bound above MAX_GOOD_ERROR_S."""
    return (clock is None or not clock.synced or clock.max_error_s is None
            or clock.max_error_s > MAX_GOOD_ERROR_S)


def _cost(clock: "ClockState | None") -> str:
    if clock is None or not clock.synced or clock.max_error_s is None:
        state = "unknown" if clock is None else "unsynced" if not clock.synced else "without an error bound"
        return (f"with this node's clock {state} the controller assumes {UNSYNCED_ERROR_SETTING} for it, "
                "so lags and gaps smaller than that are not attributed to it and steps may be matched wrongly")
    return (f"the controller subtracts this node's clock error bound ({_dur(clock.max_error_s)}) from every "
            "lag it measures against a peer")


def rule_status(engine: "Engine", catalogue: Catalogue, clock: "ClockState | None" = None) -> RuleStatus:
    """:func:`skewd.rules.counts.rule_counts`' classes (the one classification every command
    shows) with the rules this node's clock weakens."""
    from skewd.rules.counts import rule_counts

    c = rule_counts(engine)
    out = RuleStatus(active=list(c.active_ids), inactive=dict(c.inactive_reasons), controller=list(c.controller_ids))
    if clock_weak(clock):
        for r in engine.rules.rules:
            if not r.enabled:
                continue
            sigs = sorted(s for s in {*r.requires, *r.compiled.signals}
                          if (spec := catalogue.get(s)) is not None and spec.needs_synced_clock)
            if sigs:
                out.clock_weakened[r.id] = (f"reads {', '.join(sigs)}, computed by matching timestamps of "
                                            f"different nodes: {_cost(clock)}")
    return out
