"""Each collector's settings are checked when the agent loads its config: a wrong type or value
is an operator error at the offending key's file:line:col, naming ``collectors.<name>.<key>``,
all at once, never a collector "unavailable" for the agent's whole life."""
from __future__ import annotations

import pytest

from skewd.agent.config import ConfigError, load_config
from skewd.collectors.registry import collector_config_keys

BAD = """\
node: n1
collectors:
  host:
    interval: 1s
    user_hz: 0
    loadavg: "no"
  rdma:
    resources: off-please
  netdev:
    intervall: 2s
    qdisc_sample_hz: fast
  pkt:
    interface: lo
    snaplen: big
    burst_gap: soon
  pcie:
    classes: "0x0302"
"""


def _problems(tmp_path, text: str) -> list[str]:
    f = tmp_path / "agent.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_config(f, env={}, collector_keys=collector_config_keys())
    return [p.replace(f"{f}:", "") for p in ei.value.problems]


def test_collector_settings_are_operator_errors_at_their_key(tmp_path) -> None:
    got = _problems(tmp_path, BAD)
    # one per collector (a constructor stops at its first bad setting), each at its key's line
    assert "5:5: collectors.host.user_hz must be an integer of at least 1, not 0 (Linux uses 100)" in got
    assert "8:5: collectors.rdma.resources must be true or false, not 'off-please'" in got
    assert "10:5: unknown key collectors.netdev.intervall; did you mean interval?" in got
    assert any(p.startswith("11:5: collectors.netdev.qdisc_sample_hz must be a number") for p in got), got
    assert any(p.startswith("14:5: collectors.pkt.snaplen must be an integer from 64 to 65535, not 'big'")
               for p in got), got
    assert "17:5: collectors.pcie.classes must be a list, not '0x0302'" in got
    assert len(got) == 6, got


def test_a_yaml_string_is_not_a_boolean(tmp_path) -> None:
    # bool("no") is True: the typo would have kept load averages on, silently
    got = _problems(tmp_path, "node: n1\ncollectors:\n  host:\n    loadavg: 'no'\n")
    assert got == ["4:5: collectors.host.loadavg must be true or false, not 'no'"]


def test_a_bad_duration_names_its_key(tmp_path) -> None:
    got = _problems(tmp_path, "node: n1\ncollectors:\n  pkt:\n    interface: lo\n    burst_gap: soon\n")
    assert len(got) == 1 and got[0].startswith("5:5: collectors.pkt.burst_gap: "), got


def test_good_settings_load(tmp_path) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text("node: n1\ncollectors:\n  host: {user_hz: 100, loadavg: false}\n  rdma: {resources: false}\n"
                 "  pkt: {interface: lo, snaplen: 256, burst_gap: 2ms, ring_blocks: 8}\n")
    cfg = load_config(f, env={}, collector_keys=collector_config_keys())
    assert cfg.collector_config("host")["loadavg"] is False
