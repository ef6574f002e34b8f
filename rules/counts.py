"""How many rules run where: the one count that ``skewd up``, ``skewd agent --check``,
``skewd record``, ``skewd demo``, the agent's health message and its ``/metrics`` all show.

Every rule falls in exactly one class, so the three numbers add up to the rules loaded:

- **active**: this engine evaluates it (its scope is one of the engine's) and every signal it
  requires is available;
- **inactive**: switched off (``enabled: false``) or, within the engine's scopes, missing a
  signal (``inactive_reasons`` says which and why);
- **controller**: a group-scope rule (``tp_group``, ``cluster``) an agent leaves to the
  controller, which evaluates it over the nodes' summaries.

Over several engines (the demo's simulated nodes) a rule is active when any node runs it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .engine import Engine


@dataclass(frozen=True)
class RuleCounts:
    active: int
    inactive: int
    controller: int
    #: rule id → why it does not run, for every rule counted inactive
    inactive_reasons: dict[str, str] = field(default_factory=dict, compare=False)
    #: the rule ids of the other two classes, in load order
    active_ids: tuple[str, ...] = field(default=(), compare=False)
    controller_ids: tuple[str, ...] = field(default=(), compare=False)

    @property
    def total(self) -> int:
        return self.active + self.inactive + self.controller

    def describe(self) -> str:
        """``"31 active, 2 inactive, 4 controller-evaluated"``: the wording every command uses."""
        return f"{self.active} active, {self.inactive} inactive, {self.controller} controller-evaluated"


def rule_counts(engines: Engine | Sequence[Engine]) -> RuleCounts:
    """Classify the rules of ``engines`` (all loaded with the same rule set)."""
    engs = [engines] if isinstance(engines, Engine) else list(engines)
    if not engs:
        return RuleCounts(0, 0, 0)
    active: list[str] = []
    controller: list[str] = []
    reasons: dict[str, str] = {}
    for r in engs[0].rules.rules:
        if not r.enabled:
            reasons[r.id] = "disabled"
        elif not engs[0].evaluates(r):
            controller.append(r.id)
        elif any(r.id not in e.inactive for e in engs):
            active.append(r.id)
        else:
            reasons[r.id] = engs[0].inactive.get(r.id, "")
    return RuleCounts(len(active), len(reasons), len(controller), reasons, tuple(active), tuple(controller))
