"""Lint warnings: what loads fine but is probably a mistake (Falco's LOAD_UNUSED_MACRO and
LOAD_UNUSED_LIST), each printed with the offending source line and a caret under it.

Warnings never stop a load, so they are a stage of their own after it: this module re-reads the
same files with positions (:mod:`.yamlpos`) and needs nothing of the loader's internals. A macro
or list counts as used when a rule's expression names it, directly or through a used macro,
across every file loaded together (a pack's macro may serve an override file's rule).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterable

from .loader import rule_files
from .yamlpos import PMap, Pos, YamlError, load


class Warn(str, Enum):
    UNUSED_MACRO = "W001"
    UNUSED_LIST = "W002"

    @property
    def slug(self) -> str:
        return self.name.lower().replace("_", "-")


@dataclass
class LintWarning:
    code: Warn
    message: str
    pos: Pos
    #: the source line the position points into ("" when the file could not be read again)
    line: str = ""

    def __str__(self) -> str:
        head = f"{self.pos}: {self.code.value} {self.code.slug}: {self.message}"
        if not self.line:
            return head
        caret = " " * (max(self.pos.col, 1) - 1) + "^"
        return f"{head}\n    {self.line}\n    {caret}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.pos.file, "line": self.pos.line, "col": self.pos.col, "code": self.code.value,
                "name": self.code.slug, "rule": "", "message": self.message, "severity": "warning"}


_STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _names(expr: Any) -> set[str]:
    """Identifiers an expression (or an override's append/replace text) mentions, strings aside."""
    if isinstance(expr, dict):
        return set().union(*(_names(v) for v in expr.values())) if expr else set()
    if not isinstance(expr, str):
        return set()
    return set(_NAME.findall(_STRING.sub(" ", expr)))


def lint_warnings(paths: Iterable[str | Path]) -> list[LintWarning]:
    """Unused macros and lists in the rule files ``paths`` name (as :func:`load_rules` reads them)."""
    macros: dict[str, tuple[Pos, set[str]]] = {}  # name → (where, names its expr mentions)
    lists: dict[str, Pos] = {}
    used: set[str] = set()
    texts: dict[str, list[str]] = {}
    for f in rule_files(paths):
        name = str(f)
        try:
            text = Path(f).read_text()
            doc, _ = load(text, name)
        except (OSError, YamlError):
            continue  # the loader reports it as an error
        texts[name] = text.splitlines()
        if not isinstance(doc, PMap):
            continue
        for section in ("macros", "lists", "rules"):
            items = doc.get(section)
            for item in items if isinstance(items, list) else []:
                if not isinstance(item, PMap):
                    continue
                if section == "rules":
                    used |= _names(item.get("expr"))
                elif isinstance(item.get("name"), str):
                    where = item.val_pos.get("name", item.pos)
                    if section == "macros":
                        macros[item["name"]] = (where, _names(item.get("expr")))
                    else:
                        lists[item["name"]] = where
    # a macro used by a used macro is used: follow the chain from the rules
    frontier = [m for m in macros if m in used]
    while frontier:
        for n in macros[frontier.pop()][1]:
            if n in macros and n not in used:
                frontier.append(n)
            used.add(n)
    out = [LintWarning(Warn.UNUSED_MACRO, f"macro {m!r} is defined but no rule uses it", pos)
           for m, (pos, _) in macros.items() if m not in used]
    out += [LintWarning(Warn.UNUSED_LIST, f"list {n!r} is defined but no rule or macro uses it", pos)
            for n, pos in lists.items() if n not in used]
    for w in out:
        lines = texts.get(w.pos.file, [])
        w.line = lines[w.pos.line - 1] if 0 < w.pos.line <= len(lines) else ""
    return sorted(out, key=lambda w: (w.pos.file, w.pos.line, w.pos.col))
