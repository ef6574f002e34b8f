"""The systemd example: its agent config loads with the agent's own loader, listens on
loopback only, and the unit grants no capability beyond what the agent uses."""
from __future__ import annotations

import re
from pathlib import Path

from skewd.agent.config import load_config
from skewd.agent.scheduler import collector_config_keys
from skewd.metrics import parse_listen

SYSTEMD = Path(__file__).resolve().parents[2] / "deploy" / "systemd"


def test_example_agent_config_loads() -> None:
    cfg = load_config(SYSTEMD / "agent.yaml", env={"SKEWD_NODE": "gpu-node-17"}, collector_keys=collector_config_keys())
    assert parse_listen(cfg.metrics_listen)[0] == "127.0.0.1"
    assert cfg.rules[0] == "shipped" and cfg.nats["nkey_seed_file"].endswith(".nk")  # the installed packs


def test_agent_unit_grants_only_net_raw() -> None:
    unit = (SYSTEMD / "skewd-agent.service").read_text()
    for key in ("AmbientCapabilities", "CapabilityBoundingSet"):
        assert re.search(rf"^{key}=CAP_NET_RAW$", unit, re.M), key
    # the unit refuses to start an agent whose config or rules do not load (agent --check exits non-zero)
    assert re.search(r"^ExecStartPre=\S+ agent --check --config \S+$", unit, re.M)
