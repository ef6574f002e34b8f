"""Resource budgets of the rule language: how large, deep and wide a rule set may be.

Why: rule files are read by every agent on hot reload, by the controller and by replay of a
bundle someone else recorded, under a memory cap (256 MiB in the systemd unit). Without
bounds a 600-byte YAML "billion laughs", a few hundred open brackets, a 10**400 parameter or a
chain of macros each naming the previous one ten times turns a lint or a reload into an
out-of-memory restart loop or a traceback. Every bound here is checked while loading, is
reported as a rule error with ``file:line:col`` (E019 ``limit``, E020 ``out-of-range``), and
can be raised by an operator (agent config ``rule_limits:``, ``skewd rules lint --limit``).

The defaults sit far above what the shipped packs use (the largest pack is 31 KB, nests 6
levels, has no alias, its longest expression is under 1 KB and its longest window 10m) and far
below what hurts (a 256 KiB file holds at most ~40,000 nodes and reads in well under a second;
its aliases may expand it to at most a million).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from skewd.model import format_duration, parse_duration

from .yamlpos import YamlLimits

#: float64 holds every integer exactly only up to 2**53; evaluation is in float64
EXACT_INTEGER = 2 ** 53


@dataclass(frozen=True)
class RuleLimits:
    """Budgets for loading one rule set (see module doc); the keys of ``rule_limits:``."""

    file_bytes: int = 256 << 10  # one rule file's text
    yaml_depth: int = 64  # nesting of YAML collections (through aliases)
    yaml_alias_ratio: float = 10.0  # nodes after alias expansion / the file's own nodes
    yaml_nodes: int = 1_000_000  # nodes after alias expansion, absolute
    rules: int = 10_000  # rules in one rule set (all files)
    expr_chars: int = 8192  # characters of one expr or macro
    expr_depth: int = 64  # nesting of an expression, macros included
    expr_nodes: int = 10_000  # syntax nodes of one rule's expression with its macros expanded
    max_integer: int = EXACT_INTEGER  # largest magnitude of a number in params, lists and exprs
    max_duration: float = 7 * 86400.0  # longest window, for, keep_firing_for or duration param

    def yaml(self) -> YamlLimits:
        return YamlLimits(max_bytes=self.file_bytes, max_depth=self.yaml_depth,
                          alias_ratio=self.yaml_alias_ratio, max_nodes=self.yaml_nodes)

    def number_problem(self, v: Any) -> str | None:
        """Why a number cannot be a rule constant (None: it can)."""
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if isinstance(v, int):
            if abs(v) > self.max_integer:
                digits = len(str(abs(v))) if abs(v) < 10 ** 60 else "more than 60"
                return (f"integer of {digits} digits is outside +-{self.max_integer} (rule values are "
                        f"float64, exact for integers up to 2**53)")
            return None
        if not math.isfinite(v):
            return f"{v} is not a finite number"
        return None

    def duration_problem(self, seconds: float) -> str | None:
        """Why a duration cannot be used (None: it can)."""
        if not math.isfinite(seconds):
            return "duration is not finite"
        if seconds > self.max_duration:
            return (f"duration {format_duration(seconds) if seconds < 1e12 else f'{seconds:.3g}s'} is longer "
                    f"than the {format_duration(self.max_duration)} limit (raise rule_limits.max_duration)")
        return None

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> tuple["RuleLimits", list[str]]:
        """Limits from a config mapping: (limits, problems naming each bad key)."""
        base = cls()
        known = {f.name: f for f in fields(cls)}
        problems: list[str] = []
        changes: dict[str, Any] = {}
        for k, v in (d or {}).items():
            if k not in known:
                problems.append(f"unknown rule limit {k!r} (known: {', '.join(known)})")
                continue
            if k == "max_duration":
                try:
                    changes[k] = parse_duration(v)
                except ValueError as e:
                    problems.append(f"max_duration: {e}")
                continue
            if k == "yaml_alias_ratio":
                ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v >= 1
                if not ok:
                    problems.append(f"yaml_alias_ratio must be a number >= 1, got {v!r}")
                else:
                    changes[k] = float(v)
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                problems.append(f"{k} must be a positive integer, got {v!r}")
                continue
            changes[k] = v
        return replace(base, **changes), problems


DEFAULT_LIMITS = RuleLimits()
