"""Which rule files a list of ``rules:`` paths names, in load order.

- The word ``shipped`` names the rule packs that come with skewd (``skewd/rules/packs`` inside
  the installed package, wherever pip put it), so a config says "the shipped packs plus my
  site file" as ``rules: [shipped, /etc/skewd/site-rules.yaml]``. Write ``./shipped`` for a
  directory of that name.
- A directory is read recursively: every ``*.yaml`` / ``*.yml`` file below it except rule
  tests (``*.test.yaml``), in the sorted order of their paths below the directory (so name an
  override file to sort after what it overrides, e.g. ``zz-site.yaml``). Hidden directories
  (``.git``, Kubernetes' ``..data``) and symlinked subdirectories are not entered; a symlinked
  file is read.
- A file is read as given, whatever its name; a path that does not exist is passed on, so the
  loader reports it (E018) with the other errors.

One scan serves the loader (:func:`rule_files`) and the agent's reload poll
(:func:`rule_mtimes`, one ``scandir`` per directory every ``reload.poll_interval``), so the
agent reloads on exactly the files it loads.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

PACKS = Path(__file__).resolve().parent / "packs"
SHIPPED = "shipped"


def resolve(path: str | Path) -> str:
    """``shipped`` → the packs directory; anything else unchanged (as a string)."""
    return str(PACKS) if str(path) == SHIPPED else str(path)


def _is_rule_name(name: str) -> bool:
    i = name.rfind(".")
    return (0 < i < len(name) - 1 and name[i:] in (".yaml", ".yml")
            and not name.endswith((".test.yaml", ".test.yml")))


def _scan(paths: Iterable[str | Path], mtimes: bool) -> tuple[list[str], dict[str, float], dict[str, float]]:
    """(files in load order, {file: mtime or -1} if ``mtimes``, {"<dir>/": entry count})."""
    files: list[str] = []
    stamps: dict[str, float] = {}
    counts: dict[str, float] = {}
    for p in paths:
        given = resolve(p)
        base = str(Path(given))
        try:
            top = list(os.scandir(base))
        except OSError:
            if os.path.isdir(base):
                raise  # an unreadable rules directory is the operator's to fix
            files.append(base)
            if mtimes:
                try:
                    stamps[base] = os.stat(base).st_mtime
                except OSError:
                    stamps[base] = -1.0
            continue
        counts[f"{given}/"] = float(len(top))
        # (relative path parts, path, entry): sorted by the path below the given directory
        found: list[tuple[tuple[str, ...], str, os.DirEntry]] = []
        stack: list[tuple[tuple[str, ...], str, list[os.DirEntry]]] = [((), base, top)]
        while stack:
            rel, d, entries = stack.pop()
            for e in entries:
                key = e.name if d == "." else os.path.join(d, e.name)
                if _is_rule_name(e.name) and e.is_file():
                    found.append((rel + (e.name,), key, e))
                elif not e.name.startswith(".") and e.is_dir(follow_symlinks=False):
                    sub = list(os.scandir(key))
                    counts[f"{key}/"] = float(len(sub))
                    stack.append((rel + (e.name,), key, sub))
        for _, key, e in sorted(found, key=lambda x: x[0]):
            files.append(key)
            if mtimes:
                try:
                    stamps[key] = e.stat().st_mtime
                except OSError:
                    stamps[key] = -1.0
    return files, stamps, counts


def rule_files(paths: Iterable[str | Path]) -> list[Path]:
    """The rule files ``paths`` name, in load order (module docstring)."""
    return [Path(f) for f in _scan(paths, False)[0]]


def rule_mtimes(paths: Iterable[str | Path]) -> dict[str, float]:
    """What the agent's reload poll compares: ``{file: mtime}`` for :func:`rule_files` (-1.0
    where stat fails) plus ``{"<dir>/": entry count}`` for every directory read (a new file,
    in any of them, counts as a change)."""
    _, stamps, counts = _scan(paths, True)
    return {**stamps, **counts}
