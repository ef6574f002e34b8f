"""Hot reload: validate a new rule set completely before it replaces the running one.

A rule set that fails validation leaves the last good set evaluating and returns the errors
(with file:line:col) for logs and the health subject. State of unchanged rules carries over.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from skewd.model import Catalogue

from .engine import Engine, RuleSet
from .limits import DEFAULT_LIMITS, RuleLimits
from .loader import LoadIssue, load_rules


@dataclass
class ReloadResult:
    ok: bool
    issues: list[LoadIssue] = field(default_factory=list)
    carried: list[str] = field(default_factory=list)
    version: str = ""

    def describe(self) -> str:
        if self.ok:
            return f"rules reloaded (version {self.version}; state kept for {len(self.carried)} unchanged rules)"
        return "rule reload rejected, previous rules still running:\n" + "\n".join(str(i) for i in self.issues)


class RuleManager:
    """Owns the rule paths and their budgets; the agent calls :meth:`reload` on SIGHUP or a
    file change. A reload reads under the same :class:`RuleLimits` as the first load, so a
    hostile or broken file costs a bounded amount of memory and leaves the running rules as
    they were."""

    def __init__(self, paths: Sequence[str | Path], catalogue: Catalogue,
                 limits: RuleLimits = DEFAULT_LIMITS) -> None:
        self.paths = list(paths)
        self.catalogue = catalogue
        self.limits = limits
        self.last_result: ReloadResult | None = None

    def load_initial(self) -> RuleSet:
        res = load_rules(self.paths, self.catalogue, limits=self.limits)
        if not res.ok:
            from .loader import RuleLoadError

            raise RuleLoadError(res.issues)
        self.last_result = ReloadResult(True, [], [], res.ruleset.version)
        return res.ruleset

    def reload(self, engine: Engine) -> ReloadResult:
        res = load_rules(self.paths, self.catalogue, limits=self.limits)
        if not res.ok:
            self.last_result = ReloadResult(False, res.issues, [], engine.rules.version)
            return self.last_result
        carried = engine.replace_rules(res.ruleset)
        self.last_result = ReloadResult(True, [], carried, res.ruleset.version)
        return self.last_result
