"""What a rule author sees when something is off but nothing refuses to load: an evaluation error
fails a rule unit test (promtool fails on a rule's last error) instead of passing as "not firing",
and ``skewd rules lint`` warns about unused macros and lists with the offending source line."""
from __future__ import annotations

import argparse
import io

import pytest

from skewd.rules import cli
from skewd.rules.engine import Engine
from skewd.rules.lint import Warn, lint_warnings

from .conftest import DATA


def call(cat, *argv) -> tuple[int, str]:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd")
    cli.add_parser(sub)
    out = io.StringIO()
    rc = cli.run(p.parse_args(["rules", *argv]), cat, None, out)
    return rc, out.getvalue()


@pytest.fixture
def quiet_rule_test(tmp_path):
    """A test asserting EX-2-kv does *not* fire: an erroring rule would pass it silently."""
    f = tmp_path / "quiet.test.yaml"
    f.write_text(f"""rule_files: [{DATA / 'example.good.yaml'}]
evaluation_interval: 1s
tests:
  - name: a healthy engine raises nothing
    input_series:
      - series: 'vllm_kv_cache_usage_ratio{{node="n1", entity="engine0"}}'
        values: '0.2x60'
      - series: 'vllm_num_requests_waiting{{node="n1", entity="engine0"}}'
        values: '0x60'
    alert_rule_test:
      - eval_time: 60s
        rule: EX-2-kv
        exp_findings: []
""")
    return f


def test_the_quiet_test_passes_when_the_rule_evaluates(cat, quiet_rule_test) -> None:
    rc, out = call(cat, "test", str(quiet_rule_test))
    assert rc == 0, out


def test_an_evaluation_error_fails_the_rule_test(cat, quiet_rule_test, monkeypatch) -> None:
    # a kernel bug, as the engine meets one: an error out of the rule's evaluation, which the
    # engine contains (the agent keeps running) and records in last_eval_errors
    real = Engine._tick_context

    def failing(self, rule, frame, now, memo, *rest):
        if rule.id == "EX-2-kv":
            raise FloatingPointError("overflow in a window kernel")
        return real(self, rule, frame, now, memo, *rest)

    monkeypatch.setattr(Engine, "_tick_context", failing)
    rc, out = call(cat, "test", str(quiet_rule_test))
    assert rc == 1, out
    lines = [line for line in out.splitlines() if "evaluation error" in line]
    assert len(lines) == 1, out  # once per rule and case, not once per tick
    assert f"{DATA / 'example.good.yaml'}:" in lines[0]  # at the rule's own position
    assert "rule EX-2-kv at 0s: evaluation error: FloatingPointError: overflow in a window kernel" in lines[0]


UNUSED = """\
required_engine_version: 1
lists:
  - name: hot_nics
    items: [eth0]
  - name: cold_nics
    items: [eth9]
macros:
  - name: kv_full
    expr: vllm_kv_cache_usage_ratio > 0.9 and entity in hot_nics
  - name: queue_growing
    expr: vllm_num_requests_waiting > 0 and entity in cold_nics
  - name: never_used
    expr: queue_growing
rules:
  - id: T-1
    pathology: custom-test
    scope: engine
    layer: engine
    expr: kv_full
"""


def test_lint_warns_about_unused_macros_and_lists_with_the_source_line(cat, tmp_path) -> None:
    f = tmp_path / "unused.yaml"
    f.write_text(UNUSED)
    rc, out = call(cat, "lint", str(f))
    assert rc == 0, out  # warnings never fail a lint: the file loads
    assert out.splitlines()[-1].startswith("ok: 1 rules")
    got = [(w.code, w.pos.line, w.pos.col) for w in lint_warnings([f])]
    # queue_growing is used only by an unused macro, and cold_nics only by queue_growing
    assert got == [(Warn.UNUSED_LIST, 5, 11), (Warn.UNUSED_MACRO, 10, 11), (Warn.UNUSED_MACRO, 12, 11)]
    assert (f"{f}:12:11: W001 unused-macro: macro 'never_used' is defined but no rule uses it\n"
            "      - name: never_used\n"
            "              ^\n") in out


def test_shipped_packs_lint_without_warnings() -> None:
    assert [str(w) for w in lint_warnings(["shipped"])] == []
