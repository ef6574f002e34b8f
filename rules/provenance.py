"""Where each rule parameter's value comes from: the source tags at the start of its comment.

A parameter's line ends in a comment that starts with one or more source tags, then says why
(docs/rules.md, "Where a parameter's value comes from"): ``lag: 5ms  # [real-lab] compute gap``.
Only the raw text keeps comments, so this reads the text at the loader's key positions
(rules/yamlpos.py). The provenance test holds the shipped packs to it, and the detection
benchmark counts the sources of the packs it measured: a figure is only as good as the values
behind it, and the simulator-only ones are scored against the simulator that placed them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from skewd.model import parse_duration

from . import yamlpos
from .paths import PACKS

#: the sources a parameter may name (docs/rules.md); ``choice`` only for durations
TAGS = ("runbook", "vendor", "physics", "real-lab", "sim", "choice")
_TAGS_AT_START = re.compile(r"((?:\[[^\]\s]*\]\s*)+)(.*)")
_TAG = re.compile(r"\[([^\]\s]*)\]")


@dataclass(frozen=True)
class ParamSource:
    """One rule parameter and what its comment says about where its value comes from."""

    rule: str
    param: str
    where: str  # file:line
    tags: tuple[str, ...]
    why: str

    @property
    def simulator_only(self) -> bool:
        """Nothing but the simulator supports the value (a window chosen with it counts too)."""
        return "sim" in self.tags and set(self.tags) <= {"sim", "choice"}


def trailing_comment(line: str) -> str | None:
    """The text after the ``#`` that starts the line's trailing comment (outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i > 0 and line[i - 1] in " \t":
            return line[i + 1:].strip()
    return None


def is_duration(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        parse_duration(value)
    except ValueError:
        return False
    return True


def param_sources(text: str, file: str) -> tuple[list[ParamSource], list[str]]:
    """Every rule parameter of one rule file with its source tags, and what is wrong with them
    (each problem names file:line, the rule and the parameter, and what to write)."""
    data, errors = yamlpos.load(text, file)
    if errors:
        return [], [f"{e.pos}: {e.message}" for e in errors]
    lines = text.splitlines()
    found: list[ParamSource] = []
    problems: list[str] = []
    for rule in (data or {}).get("rules") or []:
        params = rule.get("params") or {}
        for name, value in params.items():
            pos = params.key_pos[name]
            where = f"{pos.file}:{pos.line}"
            label = f"{where}: {rule.get('id')} param {name}"
            comment = trailing_comment(lines[pos.line - 1])
            m = _TAGS_AT_START.match(comment or "")
            if not m:
                problems.append(f"{label}: no source tag - end its line with '# [tag] why' "
                                f"(tags: {', '.join(sorted(TAGS))}; docs/rules.md)")
                continue
            tags = tuple(_TAG.findall(m.group(1)))
            why = m.group(2).strip()
            unknown = [t for t in tags if t not in TAGS]
            if unknown:
                problems.append(f"{label}: unknown source tag {', '.join(f'[{t}]' for t in unknown)} "
                                f"(tags: {', '.join(sorted(TAGS))})")
            if len(set(tags)) != len(tags):
                problems.append(f"{label}: a tag given twice")
            if not why:
                problems.append(f"{label}: the tags need a why after them")
            if "choice" in tags and not is_duration(value):
                problems.append(f"{label}: [choice] is for window lengths only; a threshold names its source")
            found.append(ParamSource(str(rule.get("id")), str(name), where, tags, why))
    return found, problems


def pack_sources(files: Iterable[Path] | None = None) -> tuple[list[ParamSource], list[str]]:
    """:func:`param_sources` over rule files (default: the shipped packs), paths shown relative
    to the source tree (``rules/packs/east-west.yaml``) when they are below it."""
    sources: list[ParamSource] = []
    problems: list[str] = []
    for f in sorted(files if files is not None else PACKS.glob("*.yaml")):
        f = Path(f)
        try:
            shown = str(f.resolve().relative_to(PACKS.parent.parent))
        except ValueError:
            shown = str(f)
        s, p = param_sources(f.read_text(), shown)
        sources += s
        problems += p
    return sources, problems


def tag_counts(sources: Iterable[ParamSource]) -> dict[str, int]:
    """How many parameters name each source (a parameter with two tags counts under both)."""
    out = {t: 0 for t in TAGS}
    for s in sources:
        for t in s.tags:
            if t in out:
                out[t] += 1
    return out
