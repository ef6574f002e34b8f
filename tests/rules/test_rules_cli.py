"""The rule author's commands, as a network engineer runs them."""
from __future__ import annotations

import argparse
import io
import json

import jsonschema
import yaml

from skewd.rules import cli
from skewd.rules.testing import SeriesError, expand_values

from .conftest import DATA


def call(cat, *argv, availability=None):
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd")
    cli.add_parser(sub)
    args = p.parse_args(["rules", *argv])
    out = io.StringIO()
    rc = cli.run(args, cat, availability, out)
    return rc, out.getvalue()


def test_lint_clean_exits_zero(cat):
    rc, out = call(cat, "lint", str(DATA / "example.good.yaml"))
    assert rc == 0 and out.startswith("ok: 7 rules")


def test_lint_reports_every_error_and_exits_one(cat):
    rc, out = call(cat, "lint", str(DATA / "errors.bad.yaml"))
    assert rc == 1
    lines = [line for line in out.splitlines() if ": E0" in line]
    assert len(lines) == (DATA / "errors.bad.yaml").read_text().count("# expect: E")  # one per marked line
    assert lines[0].startswith(f"{DATA / 'errors.bad.yaml'}:9:5: E002 unknown-key [BAD-1]")


def test_lint_json(cat):
    rc, out = call(cat, "lint", "--json", str(DATA / "errors.bad.yaml"))
    errs = json.loads(out)
    assert rc == 1 and {e["code"] for e in errs} >= {"E002", "E004", "E005", "E006", "E007", "E008", "E009", "E010"}
    assert all({"file", "line", "col", "code", "rule", "message"} <= set(e) for e in errs)


def test_rule_tests_pass(cat):
    rc, out = call(cat, "test", str(DATA / "example.test.yaml"))
    assert rc == 0, out
    assert "rule tests: 2 passed, 0 failed" in out


def test_wrong_expectation_fails_with_a_diff(cat):
    rc, out = call(cat, "test", str(DATA / "wrong.test.yaml"))
    assert rc == 1
    assert "FAIL" in out and "expects the wrong engine" in out
    assert "- expected, not firing: node=n1 entity=engine7" in out
    assert "+ firing, not expected: node=n1 entity=engine0" in out
    assert "wrong.test.yaml:11:" in out  # points at the failing alert_rule_test item


def test_explain(cat):
    rc, out = call(cat, "explain", "EX-1-starved-feed", "--rules", str(DATA / "example.good.yaml"))
    assert rc == 0
    assert "PCIE-4" in out and "busy_util = 0.5" in out and "Check the GPU's PCIe link" in out
    assert "pcie_rx_bytes_total (counter, bytes, per gpu" in out


def test_schema_accepts_good_and_rejects_typos(cat):
    rc, out = call(cat, "schema")
    schema = json.loads(out)
    jsonschema.validate(yaml.safe_load((DATA / "example.good.yaml").read_text()), schema)
    bad = yaml.safe_load((DATA / "example.good.yaml").read_text())
    bad["rules"][0]["severty"] = "warning"
    try:
        jsonschema.validate(bad, schema)
    except jsonschema.ValidationError as e:
        assert "severty" in e.message
    else:
        raise AssertionError("schema accepted an unknown key")


def test_coverage_lists_every_pathology_and_marks_inactive(cat):
    avail = ({"gpu_util_ratio", "pcie_rx_bytes_total"}, {"vllm_kv_cache_usage_ratio": "no vLLM endpoint"})
    rc, out = call(cat, "coverage", "--json", "--rules", str(DATA / "example.good.yaml"), availability=lambda: avail)
    data = json.loads(out)
    assert rc == 1  # the example file does not cover all 36
    assert len(data["pathologies"]) == 36 and "GPU-1" in data["missing"]
    by = {p["pathology"]: p["rules"] for p in data["pathologies"]}
    assert by["PCIE-4"][0]["status"] == "active"
    assert by["GPU-2"][0]["status"] == "inactive" and "no vLLM endpoint" in by["GPU-2"][0]["reason"]


def test_expanding_notation():
    vals = expand_values("0+10x3 _ 5-1x2 7x1 _x2 1.5e3")
    assert vals[:4] == [0, 10, 20, 30] and vals[5:10] == [5, 4, 3, 7, 7] and vals[-1] == 1500.0
    assert [v != v for v in vals] == [False] * 4 + [True] + [False] * 5 + [True, True, False]
    try:
        expand_values("1 two")
    except SeriesError as e:
        assert "two" in str(e)
    else:
        raise AssertionError("a bad token was accepted")
    try:
        expand_values("0+1x99999999999999")  # would be terabytes
    except SeriesError as e:
        assert "more than 604800 values" in str(e)
    else:
        raise AssertionError("an unbounded series was accepted")
