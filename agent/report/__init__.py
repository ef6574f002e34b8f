"""The HTML post-mortem report of a replay: one self-contained file (inline CSS and SVG, no
external URL, readable without JavaScript), incident first.

- :mod:`.page` - the page: a headline card per incident (what, where, cause, when, impact,
  suggested actions), the evidence under it, findings grouped by rule and node, rules and bundle
  folded away; a quiet run in one line;
- :mod:`.data` - what to show: incident stories, evidence signals, culprit against like-for-like
  peers, finding groups;
- :mod:`.svg` - the plots; :mod:`.units` - human units.

Called by ``skewd replay --report`` (:mod:`skewd.agent.replay.cli`). Deterministic: the same
replay result renders byte-identical HTML.
"""
from __future__ import annotations

from pathlib import Path

from ..replay.core import ReplayResult
from .page import Page


def render(result: ReplayResult, title: str = "skewd post-mortem") -> str:
    return Page(result, title).render()


def write_report(result: ReplayResult, path: str | Path, title: str = "skewd post-mortem") -> Path:
    p = Path(path)
    p.write_text(render(result, title), encoding="utf-8")
    return p


__all__ = ["render", "write_report"]
