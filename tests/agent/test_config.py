"""Agent config: strict keys with positions and hints, env overrides, timeouts < intervals."""
from __future__ import annotations

import pytest

from skewd.agent.config import ConfigError, load_config

KEYS = {"pkt": {"interface", "filter"}, "gpu": set()}


def write(tmp_path, text):
    f = tmp_path / "agent.yaml"
    f.write_text(text)
    return f


def test_defaults_make_a_working_config():
    cfg = load_config(None, env={})
    assert cfg.cluster == "default" and cfg.node and cfg.evaluation_interval == 1.0
    assert cfg.metrics_listen.startswith("127.0.0.1:")


def test_every_problem_is_reported_with_its_position(tmp_path):
    f = write(tmp_path, "node: n1\ncolectors: {}\ncollectors:\n  pkt:\n    interfce: eth0\n    interval: 1s\n"
                        "    timeout: 2s\n  gpuu: {}\nevaluation_interval: soon\n")
    with pytest.raises(ConfigError) as ei:
        load_config(f, env={}, collector_keys=KEYS)
    msgs = ei.value.problems
    assert any(m.startswith(f"{f}:2:1: unknown key 'colectors'; did you mean collectors?") for m in msgs)
    assert any(f"{f}:5:5: unknown key collectors.pkt.interfce; did you mean interface?" in m for m in msgs)
    assert any(":7:5:" in m and "timeout must be shorter than its interval" in m for m in msgs)
    assert any(":8:3:" in m and "unknown collector 'gpuu'; did you mean gpu?" in m for m in msgs)
    assert any(":9:1:" in m and "evaluation_interval" in m for m in msgs)
    assert len(msgs) == 5


def test_env_overrides_file(tmp_path):
    f = write(tmp_path, "node: n1\ncluster: c1\ncollectors: {pkt: {interface: eth0}}\n")
    cfg = load_config(f, env={"SKEWD_NODE": "n9", "SKEWD_NATS_URL": "nats://127.0.0.1:4222",
                              "SKEWD__collectors__pkt__interface": "veth1", "SKEWD_RULES": "/a:/b"},
                      collector_keys=KEYS)
    assert cfg.node == "n9" and cfg.cluster == "c1" and cfg.nats["url"] == "nats://127.0.0.1:4222"
    assert cfg.collector_config("pkt")["interface"] == "veth1" and cfg.rules == ["/a", "/b"]


def test_node_name_must_be_a_subject_token(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, "node: my.node\n"), env={})
    assert "NATS subject token" in ei.value.problems[0]


def test_yaml_syntax_error_names_the_line(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, "node: n1\ncollectors: [\n"), env={})
    assert str(tmp_path / "agent.yaml") in ei.value.problems[0]


def test_spool_and_rule_limit_settings_are_checked_at_load_with_their_position(tmp_path):
    f = write(tmp_path, "node: n1\nspool:\n  dir: /tmp/x\n  fsync: sometimes\n  memory_bytes: -1\n"
                        "  fsync_interval: soon\nrule_limits: {yaml_deep: 3, max_duration: forever}\n")
    with pytest.raises(ConfigError) as ei:
        load_config(f, env={})
    msgs = "\n".join(ei.value.problems)
    assert f"{f}:4:3: spool.fsync must be always, interval or never, got 'sometimes'" in msgs
    assert f"{f}:5:3: spool.memory_bytes must be an integer >= 0" in msgs
    assert f"{f}:6:3: spool.fsync_interval" in msgs
    assert "unknown rule limit 'yaml_deep'" in msgs and "max_duration: bad duration 'forever'" in msgs
    f = write(tmp_path, "node: n1\nspool: {fsync: always, fsync_interval: 250ms}\nrule_limits: {yaml_depth: 128}\n")
    cfg = load_config(f, env={})
    assert cfg.spool["fsync"] == "always" and cfg.spool["fsync_interval"] == 0.25
    assert cfg.rule_limits.yaml_depth == 128


def test_summary_encoding_is_json_unless_told_and_checked_at_load(tmp_path):
    cfg = load_config(None, env={})
    assert cfg.summary_encoding == "json" and cfg.summary_layout_every == 10.0
    f = write(tmp_path, "node: n1\npublish:\n  summary_encoding: msgpack\n  summary_layout_every: 0s\n"
                        "  sumary_encoding: binary\n")
    with pytest.raises(ConfigError) as ei:
        load_config(f, env={})
    msgs = "\n".join(ei.value.problems)
    assert f"{f}:3:3: publish.summary_encoding must be json or binary, got 'msgpack'" in msgs
    assert f"{f}:4:3: publish.summary_layout_every: must be longer than 0s" in msgs
    assert f"{f}:5:3: unknown key publish.sumary_encoding; did you mean summary_encoding?" in msgs
    cfg = load_config(write(tmp_path, "node: n1\npublish: {summary_encoding: binary, summary_layout_every: 30s}\n"),
                      env={"SKEWD__publish__summary_layout_every": "20s"})
    assert cfg.summary_encoding == "binary" and cfg.summary_layout_every == 20.0
