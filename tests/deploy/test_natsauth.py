"""``skewd nats-auth`` as an operator runs it: identities survive re-runs, names come from the
controller's own config, mistakes are refused with a reason."""
from __future__ import annotations

import re
import stat
import subprocess
from pathlib import Path

from skewd.natsauth import main


def _keys(conf: str) -> list[str]:
    return re.findall(r'nkey: "(U[A-Z0-9]{55})"', conf)


def test_rerun_keeps_every_seed_and_adds_new_nodes(tmp_path: Path) -> None:
    assert main(["--cluster", "c1", "--node", "a", "--node", "b", "--out", str(tmp_path)]) == 0
    first = (tmp_path / "skewd-auth.conf").read_text()
    seed_a = (tmp_path / "agent-a.nk").read_bytes()
    assert stat.S_IMODE((tmp_path / "agent-a.nk").stat().st_mode) == 0o600
    assert main(["--cluster", "c1", "--node", "a", "--node", "b", "--node", "c", "--out", str(tmp_path)]) == 0
    second = (tmp_path / "skewd-auth.conf").read_text()
    assert (tmp_path / "agent-a.nk").read_bytes() == seed_a
    assert set(_keys(first)) < set(_keys(second)) and len(_keys(second)) == len(_keys(first)) + 1
    assert "skewd.v1.finding.c1.c.>" in second


def test_names_follow_the_controller_config(tmp_path: Path) -> None:
    ctl = tmp_path / "controller.yaml"
    ctl.write_text("cluster: c1\nconsumer: {durable: my-ctl}\nstate: {bucket: MYSTATE}\n")
    assert main(["--cluster", "c1", "--node", "a", "--controller-config", str(ctl), "--out", str(tmp_path / "o")]) == 0
    conf = (tmp_path / "o" / "skewd-auth.conf").read_text()
    assert "$JS.API.CONSUMER.MSG.NEXT.SKEWD_FINDINGS.my-ctl" in conf and "$KV.MYSTATE.c1.>" in conf


def test_refuses_what_would_break_isolation(tmp_path: Path, capsys) -> None:
    assert main(["--cluster", "c1", "--out", str(tmp_path)]) == 2  # no nodes and not shared
    assert "--node" in capsys.readouterr().err
    # an inference controller whose durable would be the controller's own consumer
    ctl = tmp_path / "controller.yaml"
    ctl.write_text("cluster: c1\nconsumer: {durable: r-remap}\n")
    assert main(["--cluster", "c1", "--shared-agent", "--inference-controller", "r", "--controller-config", str(ctl),
                 "--out", str(tmp_path / "o")]) == 1
    assert "would own the controller's consumer" in capsys.readouterr().err
    assert main(["--cluster", "prod.a", "--shared-agent", "--out", str(tmp_path / "p")]) == 1
    assert "cluster 'prod.a'" in capsys.readouterr().err  # what the controller itself would refuse


def test_generated_config_is_valid_for_nats_server(tmp_path: Path, nats_server_bin: str) -> None:
    assert main(["--cluster", "prod-a", "--node", "gpu.node-1", "--shared-agent", "--inference-controller", "r1",
                 "--out", str(tmp_path)]) == 0
    conf = tmp_path / "t.conf"
    conf.write_text(f"listen: 127.0.0.1:4222\njetstream {{ store_dir: {tmp_path / 'js'} }}\ninclude ./skewd-auth.conf\n")
    r = subprocess.run([nats_server_bin, "-c", str(conf), "-t"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
