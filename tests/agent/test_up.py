"""``skewd up`` starts the embedded stack on this GPU-less machine and stops cleanly."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def test_skewd_up_starts_and_stops_cleanly(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, "-m", "skewd.cli", "up", "--duration", "6", "--plain",
                        "--state-dir", str(tmp_path / "state")],
                       capture_output=True, text=True, timeout=90, env=env, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert out.startswith("skewd up · cluster local · node ")
    # the host's collectors are listed with their state, and inactive ones say why
    assert "collector netdev: active" in out
    # ...as this host's own probe sees them (a GPU host lists the gpu collector active)
    from skewd.collectors.registry import collector_class

    gpu = collector_class("gpu")("probe")
    st = gpu.probe()
    gpu.stop()
    assert ("collector gpu: active" if st.active else f"collector gpu: inactive: {st.reason}") in out
    assert "rules:" in out and "active" in out
    assert out.rstrip().endswith("skewd up: stopped cleanly")
    # nothing is left behind: the embedded nats-server is gone
    ps = subprocess.run(["pgrep", "-f", f"nats-server.*{tmp_path}"], capture_output=True, text=True)
    assert ps.stdout.strip() == ""
