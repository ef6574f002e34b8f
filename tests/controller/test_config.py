"""Controller config: strict, every problem at once with file:line:col, env overrides."""
from __future__ import annotations

from pathlib import Path

import pytest

from skewd.controller.config import ConfigError, load_config
from skewd.controller.main import main

HERE = Path(__file__).parent / "configs"


def test_full_config_loads_with_every_setting() -> None:
    cfg = load_config(HERE / "full.good.yaml", env={})
    assert cfg.cluster == "prod-east" and cfg.controller_id == "ctl-a"
    assert cfg.nats.servers == ("nats://nats-0:4222", "nats://nats-1:4222") and cfg.nats.user == "skewd"
    assert (cfg.align_window, cfg.max_skew, cfg.unsynced_clock_error) == (30.0, 0.2, 0.02)
    assert cfg.group_wait == 10.0 and cfg.never_inhibit == ("GPU-6",) and cfg.effect_window == 60.0
    assert cfg.remap_ttl == 900.0 and cfg.concurrency_factor == 0.5
    assert (cfg.durable, cfg.queue, cfg.ack_wait, cfg.batch) == ("ctl-prod", "ctl-prod", 30.0, 128)
    assert cfg.bucket == "SKEWD_CTL_PROD" and cfg.state_max_age == 3 * 86400
    assert cfg.tp_groups["tp0"].nodes == ("gpu-a1", "gpu-a2", "gpu-a3", "gpu-a4")
    assert cfg.tp_groups["tp0"].engine == "gpu-a1/engine0"
    assert cfg.pp_groups["pp0"].stages == ("tp0", "tp1")
    assert cfg.models["llama-70b"].max_num_seqs == 256 and cfg.models["llama-70b"].router == "pool-llama"


def test_empty_config_is_a_working_default() -> None:
    cfg = load_config(None, env={})
    assert cfg.cluster == "default" and cfg.durable == "skewd-controller-default"
    assert cfg.rules == [] and cfg.tp_groups == {}


def test_every_error_is_reported_at_once_with_positions() -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(HERE / "typo.bad.yaml", env={})
    text = "\n".join(ei.value.problems)
    f = str(HERE / "typo.bad.yaml")
    expected = [
        f"{f}:2:1: unknown key 'evaluaton_interval'; did you mean evaluation_interval?",
        "alignment.window: bad duration '30 seconds'",
        "unknown key alignment.max_skw; did you mean max_skew?",
        "remap.min_confidence must be a number in [0, 1], got 2",
        "unknown key topology.tp_groups.tp0.modle; did you mean model?",
        "node 'b' is in tp groups 'tp0' and 'tp1'",
        "pp group 'pp0': stages must list at least two",
        "max_num_seqs must be a positive integer",
        "nats.tokn: unknown key",
    ]
    for e in expected:
        assert e in text, f"missing {e!r} in:\n{text}"
    assert f"{f}:7:" in text  # the tp0 typo points at its line


def test_bad_nats_url_is_reported() -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(None, env={}, overrides={"nats": {"servers": "http://nats:4222"}})
    assert "scheme must be nats://, tls://, ws:// or wss://" in str(ei.value)


def test_environment_overrides_file() -> None:
    cfg = load_config(HERE / "full.good.yaml", env={"SKEWD_CLUSTER": "other", "SKEWD_NATS_URL": "nats://x:1,nats://y:2",
                                                     "SKEWD_RULES": "/a:/b", "SKEWD_CONTROLLER_ID": "c9"})
    assert cfg.cluster == "other" and cfg.nats.servers == ("nats://x:1", "nats://y:2")
    assert cfg.rules == ["/a", "/b"] and cfg.controller_id == "c9"


def test_cli_check_prints_rules_and_topology(capsys, tmp_path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(f"cluster: c\nrules: [{Path(__file__).parent / 'rules'}]\n"
                 "topology: {tp_groups: {tp0: {nodes: [a, b]}}}\n")
    assert main(["--config", str(p), "--check"]) == 0
    out = capsys.readouterr().out
    assert "EW-1-tp-straggler-test" in out and "tp group tp0: a, b" in out


def test_cli_bad_config_exits_1_with_the_problems(capsys) -> None:
    assert main(["--config", str(HERE / "typo.bad.yaml")]) == 1
    assert "did you mean evaluation_interval" in capsys.readouterr().err
