"""One syntax across the ``skewd`` subcommands: durations, speeds, did-you-mean for names, and
outputs checked before the long work that fills them (issue 20, item 7)."""
from __future__ import annotations

import io
import time

import pytest

from skewd.cli import main as skewd_main
from skewd.model import parse_duration, parse_speed


def test_one_duration_syntax():
    assert parse_duration("5m30s") == 330.0
    assert parse_duration("5") == 5.0 and parse_duration("1.5") == 1.5 and parse_duration(5) == 5.0
    assert parse_duration("250ms") == 0.25
    # a 400-digit integer (a rule's `for:` in a tampered bundle: fuzz input bundle 193272 raised
    # OverflowError out of the rule loader) and its text are not a number of seconds either
    for bad in ("5 minutes", "-5", "", "5x", "nan", 10 ** 400, "9" * 400):
        with pytest.raises(ValueError, match="bad duration"):
            parse_duration(bad)


def test_speeds_are_their_own_syntax_shared_by_replay_and_demo():
    from skewd.agent.replay import build_parser as replay_parser
    from skewd.agent.replay import parse_speed as replay_speed
    from skewd.lab.demo import parse as demo_parse

    for text, v in (("1x", 1.0), ("4x", 4.0), ("4", 4.0), ("0.5x", 0.5)):
        assert replay_speed(text) == v
        assert demo_parse(["--speed", text]).speed == v
    assert replay_speed("max") is None and parse_speed("max") is None
    with pytest.raises(ValueError):
        parse_speed("max", allow_max=False)
    with pytest.raises(SystemExit):
        demo_parse(["--speed", "max"])  # the demo is a live view: it has no unpaced mode
    assert replay_parser().parse_args(["b", "--speed", "1x"]).speed == "1x"


def test_duration_flags_take_the_one_syntax(capsys):
    from skewd.agent.up import parse as up_parse
    from skewd.collectors.pkt.cli import build_parser as pkt_parser

    assert up_parse(["--duration", "5m30s"]).duration == 330.0
    assert up_parse(["--duration", "90"]).duration == 90.0
    assert pkt_parser().parse_args(["f.pcap", "--interval", "5"]).interval == 5.0
    assert pkt_parser().parse_args(["f.pcap", "--interval", "100ms"]).interval == 0.1
    with pytest.raises(SystemExit):
        up_parse(["--duration", "0s"])
    assert "must be longer than 0s" in capsys.readouterr().err


def test_rules_explain_suggests_the_rule_meant(capsys):
    rc = skewd_main(["rules", "explain", "GPU-2-kv-saturaton"])
    out = capsys.readouterr().out
    assert rc == 1 and "did you mean GPU-2-kv-saturation?" in out


def test_rules_test_suggests_the_rule_meant(tmp_path, capsys):
    from skewd.rules.cli import PACKS

    (tmp_path / "t.test.yaml").write_text(f"""\
rule_files: [{PACKS}/gpu-engine.yaml]
tests:
  - name: typo
    input_series:
      - {{signal: vllm_kv_cache_usage_ratio, entity: engine0, values: '0.95x10'}}
    alert_rule_test:
      - {{eval_time: 5s, rule: GPU-2-kv-saturaton, exp_findings: []}}
""")
    rc = skewd_main(["rules", "test", str(tmp_path)])
    assert rc == 1 and "did you mean GPU-2-kv-saturation?" in capsys.readouterr().out


def test_demo_suggests_the_scenario_meant(capsys):
    rc = skewd_main(["demo", "--scenario", "ew1-tp-stragler"])
    err = capsys.readouterr().err
    assert rc == 2 and "did you mean ew1-tp-straggler?" in err


def test_record_checks_its_output_before_starting(tmp_path, capsys):
    t0 = time.monotonic()
    rc = skewd_main(["record", "--out", "/proc/nope", "--duration", "30s"])
    assert rc == 2 and time.monotonic() - t0 < 20
    assert "--out: cannot write in /proc/nope" in capsys.readouterr().err
