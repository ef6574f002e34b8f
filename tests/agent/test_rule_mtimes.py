"""The reload poll's snapshot (rule files' mtimes, rules directories' entry counts) taken with
one scandir per directory equals the one built from ``rule_files`` and pathlib (the reference,
kept here), so the agent reloads on exactly the same changes, in subdirectories too."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from skewd.agent.runner import rule_mtimes
from skewd.rules.loader import rule_files


def ref_mtimes(paths: list[str]) -> dict[str, float]:
    out = {}
    for f in rule_files(paths):
        try:
            out[str(f)] = f.stat().st_mtime
        except OSError:
            out[str(f)] = -1.0

    def count(d: Path, key: str) -> None:
        out[key] = float(len(list(d.iterdir())))
        for sub in d.iterdir():
            if sub.is_dir() and not sub.is_symlink() and not sub.name.startswith("."):
                count(sub, f"{sub}/")

    for p in paths:
        if Path(p).is_dir():
            count(Path(p), f"{p}/")
    return out


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    d = tmp_path / "rules"
    d.mkdir()
    for name in ("a.yaml", "b.yml", "c.test.yaml", "d.test.yml", ".yaml", "..yaml", "e.yaml.", "f.txt",
                 "G.YAML", "h.j.yaml", ".hidden.yaml"):
        (d / name).write_text("rules: []\n")
    (d / "sub.yaml").mkdir()  # a directory named like a rule file is not one
    (d / "link.yaml").symlink_to(d / "a.yaml")
    (d / "broken.yaml").symlink_to(d / "missing.yaml")
    (d / "dirlink.yml").symlink_to(d / "sub.yaml")
    (d / "site").mkdir()  # read recursively
    (d / "site" / "zz.yaml").write_text("rules: []\n")
    (d / ".git").mkdir()  # hidden: not entered
    (d / ".git" / "x.yaml").write_text("rules: []\n")
    (tmp_path / "single.yaml").write_text("rules: []\n")
    return tmp_path


def test_same_snapshot_as_rule_files(tree: Path, monkeypatch) -> None:
    d = tree / "rules"
    cases = [[str(d)], [str(d) + "/"], [str(d), str(tree / "single.yaml")], [str(tree / "single.yaml")],
             [str(tree / "missing")], [str(tree / "missing.yaml"), str(d)], [str(d), str(d)], [str(d / "site")]]
    for paths in cases:
        assert rule_mtimes(paths) == ref_mtimes(paths), paths
    monkeypatch.chdir(d)
    for paths in (["."], ["./"], ["a.yaml"], [".", "../single.yaml"]):
        assert rule_mtimes(paths) == ref_mtimes(paths), paths


def test_changes_are_seen_alike(tree: Path) -> None:
    d = tree / "rules"
    paths = [str(d), str(tree / "single.yaml")]
    before = rule_mtimes(paths)
    os.utime(d / "a.yaml", (1, 1))  # edited
    (d / "new.yml").write_text("rules: []\n")  # added
    (d / "b.yml").unlink()  # removed
    os.utime(tree / "single.yaml", (2, 2))
    after = rule_mtimes(paths)
    assert after == ref_mtimes(paths) and after != before
    (d / "notes.txt").write_text("")  # not a rule file: only the entry count moves
    assert rule_mtimes(paths) == ref_mtimes(paths)
    assert rule_mtimes(paths) != after
    after = rule_mtimes(paths)
    (d / "site" / "new.yaml").write_text("rules: []\n")  # a new file in a subdirectory
    assert rule_mtimes(paths) == ref_mtimes(paths) and rule_mtimes(paths) != after


def test_agent_uses_it(tree: Path) -> None:
    from skewd.agent.config import load_config
    from skewd.agent.runner import Agent

    cfg = load_config(None, env={}, overrides={"rules": [str(tree / "rules")], "node": "n1"})
    a = Agent(cfg, slots=[])
    assert a._mtimes() == ref_mtimes([str(tree / "rules")])


def test_rule_files_recurse_in_path_order_and_name_the_shipped_packs(tree: Path) -> None:
    from skewd.rules.paths import PACKS

    d = tree / "rules"
    names = [str(f.relative_to(d)) for f in rule_files([str(d)])]
    assert names == ["..yaml", ".hidden.yaml", "a.yaml", "b.yml", "h.j.yaml", "link.yaml",
                     "site/zz.yaml"]
    assert rule_files(["shipped"]) == rule_files([PACKS]) and len(rule_files(["shipped"])) >= 4
    assert rule_files(["shipped", str(tree / "single.yaml")])[-1] == tree / "single.yaml"
