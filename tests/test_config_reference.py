"""docs/config.md is generated from the config schemas and complete: a key a loader accepts
without a line there, a line for a key that is gone, an environment variable read but not
documented, or a stale file fails here."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from skewd import configref
from skewd.agent import config as agent_cfg
from skewd.controller import config as ctl_cfg

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "config.md"


def test_every_config_key_is_documented():
    assert configref.undocumented() == []


def test_docs_config_md_is_the_generated_reference():
    assert DOC.read_text() == configref.render(), \
        "docs/config.md is stale: run python -m skewd.configref --write docs/config.md"


def test_an_undocumented_key_is_caught(monkeypatch):
    """The check has teeth: a key added to a schema without its doc line is reported."""
    monkeypatch.setitem(agent_cfg.SECTION_KEYS, "spool", agent_cfg.SECTION_KEYS["spool"] | {"compress"})
    monkeypatch.setitem(ctl_cfg.DEFAULTS, "stale_nodes", {"after_intervals": 3})
    monkeypatch.setitem(ctl_cfg.SECTIONS, "stale_nodes", {"after_intervals"})
    missing = configref.undocumented()
    assert "agent: spool.compress" in missing and "controller: stale_nodes.after_intervals" in missing


def test_every_environment_variable_the_code_reads_is_in_the_reference():
    text = DOC.read_text()
    read = set()
    for d in ("agent", "collectors", "controller", "rules", "skewd", "lab"):
        for f in (ROOT / d).rglob("*.py"):
            src = f.read_text()
            read |= set(re.findall(r"""(?:environ(?:\.get)?|getenv|env\.get)\(\s*["'](SKEWD_[A-Z_]+)["']""", src))
            read |= set(re.findall(r"""environ\[["'](SKEWD_[A-Z_]+)["']\]""", src))
    read |= set(agent_cfg.ENV_VARS) | set(ctl_cfg.ENV_VARS)
    assert len(read) >= 10
    assert sorted(v for v in read if f"`{v}`" not in text) == []


@pytest.mark.parametrize("var,value,check", [
    ("SKEWD_NODE", "n7", lambda c: c.node == "n7"),
    ("SKEWD_CLUSTER", "c7", lambda c: c.cluster == "c7"),
    ("SKEWD_SYS_ROOT", "/host/sys", lambda c: str(c.sys_root) == "/host/sys"),
    ("SKEWD_PROC_ROOT", "/host/proc", lambda c: str(c.proc_root) == "/host/proc"),
    ("SKEWD_RULES", "shipped:/etc/site.yaml", lambda c: c.rules == ["shipped", "/etc/site.yaml"]),
    ("SKEWD_NATS_URL", "nats://n:4222", lambda c: c.nats["url"] == "nats://n:4222"),
    ("SKEWD_METRICS_LISTEN", "127.0.0.1:9999", lambda c: c.metrics_listen == "127.0.0.1:9999"),
    ("SKEWD_SPOOL_DIR", "/srv/spool", lambda c: c.spool["dir"] == "/srv/spool"),
])
def test_agent_environment_variables_set_their_key(var, value, check):
    assert set(agent_cfg.ENV_VARS) >= {var}
    assert check(agent_cfg.load_config(None, env={var: value}))


@pytest.mark.parametrize("var,value,check", [
    ("SKEWD_CLUSTER", "c7", lambda c: c.cluster == "c7"),
    ("SKEWD_CONTROLLER_ID", "ctl-9", lambda c: c.controller_id == "ctl-9"),
    ("SKEWD_RULES", "shipped:/etc/site.yaml", lambda c: c.rules == ["shipped", "/etc/site.yaml"]),
    ("SKEWD_NATS_URL", "nats://a:4222,nats://b:4222", lambda c: c.nats.servers == ("nats://a:4222", "nats://b:4222")),
])
def test_controller_environment_variables_set_their_key(var, value, check):
    assert set(ctl_cfg.ENV_VARS) >= {var}
    assert check(ctl_cfg.load_config(None, env={var: value}))


def test_the_reference_is_linked_from_the_readme():
    assert "(docs/config.md)" in (ROOT / "README.md").read_text()
