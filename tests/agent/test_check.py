"""``skewd agent --check`` as a systemd ExecStartPre: its exit status says whether the agent can
do its job (0 ready, 1 rules do not load, 2 invalid config, 3 a required collector missing)."""
from __future__ import annotations

import json

import pytest

from skewd.cli import main as skewd_main


def _agent_yaml(tmp_path, body: str) -> str:
    p = tmp_path / "agent.yaml"
    p.write_text(body)
    return str(p)


def test_check_exits_0_when_ready(tmp_path, capsys):
    assert skewd_main(["agent", "--check", "--config", _agent_yaml(tmp_path, "cluster: c\n")]) == 0
    assert "rules: " in capsys.readouterr().out


def test_check_exits_1_when_the_rules_do_not_load(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("required_engine_version: 1\nrules:\n  - id: X\n    pathology: GPU-2\n    scope: engine\n"
                   "    layer: engine\n    expr: vllm_num_requests_waiting > 1\n")
    cfg = _agent_yaml(tmp_path, f"rules: [{bad}]\n")
    assert skewd_main(["agent", "--check", "--config", cfg]) == 1
    out = capsys.readouterr().out
    assert "rules: NOT LOADED" in out and f"{bad}:7:" in out and "did you mean vllm_requests_waiting?" in out


def test_check_exits_2_on_a_collector_setting_an_operator_must_fix(tmp_path, capsys):
    """A bad endpoint is an operator error at load time, not a collector 'unavailable' forever."""
    cfg = _agent_yaml(tmp_path, "collectors:\n  vllm:\n    endpoints: [127.0.0.1:8000/metrics]\n")
    assert skewd_main(["agent", "--check", "--config", cfg]) == 2
    err = capsys.readouterr().err
    assert "invalid config" in err and f"{cfg}:2:" in err and "collectors.vllm.endpoints[0]" in err


def test_check_exits_3_when_a_required_collector_is_not_active(tmp_path, capsys):
    # an empty sysfs: no RDMA device, whatever the machine running the test has
    (tmp_path / "sys").mkdir()
    cfg = _agent_yaml(tmp_path, f"sys_root: {tmp_path}/sys\ncollectors:\n  rdma: {{required: true}}\n")
    assert skewd_main(["agent", "--check", "--config", cfg]) == 3
    out = capsys.readouterr().out
    assert "REQUIRED collector(s) not active: rdma" in out
    assert skewd_main(["agent", "--check", "--json", "--config", cfg]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["required_missing"] == ["rdma"] and doc["exit_code"] == 3
    rdma = next(c for c in doc["collectors"] if c["name"] == "rdma")
    assert rdma["state"] == "needs_operator" and "required" in rdma["reason"]


@pytest.mark.parametrize("body,msg", [
    ("collectors:\n  rdma: {required: yes-please}\n", "collectors.rdma.required must be true or false"),
    ("collectors:\n  rdma: {required: true, enabled: false}\n", "both disabled and required"),
    ("reprobe: {min_interval: 1m, max_interval: 10s}\n", "reprobe.max_interval must not be shorter"),
    ("log: {format: xml}\n", "log.format must be json or text"),
    ("spool: {fsync: sometimes}\n", "spool.fsync must be always, interval or never"),
])
def test_contradictory_settings_are_config_errors(tmp_path, capsys, body, msg):
    assert skewd_main(["agent", "--check", "--config", _agent_yaml(tmp_path, body)]) == 2
    assert msg in capsys.readouterr().err
