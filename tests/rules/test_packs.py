"""The shipped rule packs: lint clean, every rule tested with a firing case and a near miss,
every pathology ID covered. Run as a user would, through the skewd command."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import yaml

from skewd.catalogue import full_catalogue
from skewd.rules.cli import PACK_TESTS, PACKS
from skewd.rules.loader import load_rules
from skewd.rules.pathologies import PATHOLOGIES


def skewd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skewd.cli", *args], capture_output=True, text=True, timeout=300)


def test_packs_lint_clean():
    p = skewd("rules", "lint", str(PACKS))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("ok: ")


def test_pack_tests_pass_with_a_firing_case_and_a_near_miss_per_rule():
    p = skewd("rules", "test", "--json", str(PACK_TESTS))
    report = json.loads(p.stdout)
    assert p.returncode == 0 and report["ok"], [r for r in report["results"] if not r["ok"]] or report["issues"]
    rules = load_rules([PACKS], full_catalogue()).ruleset.rules
    firing: dict[str, int] = defaultdict(int)
    silent: dict[str, int] = defaultdict(int)
    for f in PACK_TESTS.glob("*.test.yaml"):
        for case in yaml.safe_load(f.read_text())["tests"]:
            for check in case["alert_rule_test"]:
                (firing if check["exp_findings"] else silent)[check["rule"]] += 1
    for r in rules:
        assert firing[r.id] >= 1 and silent[r.id] >= 1, f"{r.id}: {firing[r.id]} firing, {silent[r.id]} silent cases"


def test_coverage_lists_all_36_ids_each_with_a_rule():
    p = skewd("rules", "coverage", "--json")
    data = json.loads(p.stdout)
    assert p.returncode == 0 and data["missing"] == []
    assert [row["pathology"] for row in data["pathologies"]] == list(PATHOLOGIES) and len(PATHOLOGIES) == 36
    for row in data["pathologies"]:
        for e in row["rules"]:
            assert e["status"] in ("active", "inactive", "controller")
            if e["status"] == "inactive":
                assert e["reason"], row  # an inactive rule always says why
