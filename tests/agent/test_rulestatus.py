"""What an agent says about its rules and its clock: --check, the health message and /metrics
give one answer (issue 19: health listed EW-1 as "inactive: no collector on this host supplies
it" although the controller evaluates it, and nothing said that the node's unsynced clock rules
EW-1 out)."""
from __future__ import annotations

import io
import json

from skewd import wire
from skewd.agent.check import run_check
from skewd.agent.clock import ClockState, clock_state
from skewd.agent.config import load_config
from skewd.agent.metrics import AgentMetrics
from skewd.agent.runner import Agent
from skewd.agent.scheduler import build_slots, collector_config_keys

UNSYNCED = ClockState(False, None, "adjtimex")  # what a node without chrony/ntpd reports
SYNCED = ClockState(True, 0.0004, "adjtimex")  # chrony against a LAN server (invented bound)
T = 1_700_000_000.0


def _cfg(tmp_path):
    return load_config(None, env={}, collector_keys=collector_config_keys(), overrides={
        "node": "n1", "cluster": "rs", "spool": {"dir": str(tmp_path / "spool")}})


def test_check_puts_group_rules_under_the_controller_and_names_what_an_unsynced_clock_weakens(tmp_path) -> None:
    out = io.StringIO()
    assert run_check(_cfg(tmp_path), out, clock=UNSYNCED) == 0
    text = out.getvalue()
    assert "clock NOT synced (unknown error bound; adjtimex)" in text
    assert "controller EW-1-tp-straggler (EW-1)" in text
    assert "inactive EW-1-tp-straggler" not in text
    assert not any("no collector on this host supplies it" in line for line in text.splitlines()
                   if line.strip().startswith("controller "))
    weak = [line for line in text.splitlines() if line.strip().startswith("weakened ")]
    assert any("EW-1-tp-straggler-aligned" in w and "ctl_arrival_lag_excess_seconds" in w
               and "alignment.unsynced_clock_error" in w for w in weak), weak
    # clock-free rules are not listed: EW-4 compares ECN rates; EW-1-tp-straggler each node's own
    # durations (summary_collective_*), which no clock offset touches
    assert not any("EW-4-fabric-congestion" in w for w in weak)
    assert not any("EW-1-tp-straggler " in w for w in weak), weak

    js = io.StringIO()
    run_check(_cfg(tmp_path), js, as_json=True, clock=UNSYNCED)
    doc = json.loads(js.getvalue())
    ew1 = next(r for r in doc["rules"] if r["rule"] == "EW-1-tp-straggler")
    assert ew1["controller"] and not ew1["active"] and ew1["reason"] == "evaluated by the controller over node summaries"
    assert not ew1["clock_weakened"] and "EW-1-tp-straggler-aligned" in doc["clock"]["weakens"]
    assert doc["clock"] == {**doc["clock"], "synced": False, "max_error_s": None}


def test_a_synced_clock_with_a_tight_bound_weakens_nothing(tmp_path) -> None:
    out = io.StringIO()
    run_check(_cfg(tmp_path), out, clock=SYNCED)
    text = out.getvalue()
    assert "clock synced (error bound 0.4 ms; adjtimex)" in text and "weakened" not in text
    coarse = io.StringIO()  # synced, but 20 ms: larger than EW-1's lag bar
    run_check(_cfg(tmp_path), coarse, clock=ClockState(True, 0.02, "adjtimex"))
    assert "weakened EW-1-tp-straggler-aligned" in coarse.getvalue() \
        and "subtracts this node's clock error bound (20 ms)" in coarse.getvalue()


def test_this_hosts_real_clock_is_read_and_reported(tmp_path) -> None:
    real = clock_state()  # adjtimex, read-only
    out = io.StringIO()
    run_check(_cfg(tmp_path), out, as_json=True)
    doc = json.loads(out.getvalue())
    assert doc["clock"]["synced"] == real.synced and doc["clock"]["source"] == real.source


def test_health_metrics_and_check_agree_on_every_rule(tmp_path) -> None:
    cfg = _cfg(tmp_path)
    agent = Agent(cfg, clock=lambda: T, slots=build_slots(cfg, ["netdev", "host"]))
    agent.setup()
    agent._clock = (T, UNSYNCED)  # the kernel's answer on an unsynced node
    h = wire.decode_health(wire.encode(agent.health(T)))  # as the controller receives it
    assert h.clock == wire.ClockHealth(False, None, "adjtimex")
    assert "EW-1-tp-straggler" in h.rules.controller and "EW-1-tp-straggler" not in h.rules.inactive
    assert "EW-1-tp-straggler-aligned" in h.rules.clock_weakened and "EW-1-tp-straggler" not in h.rules.clock_weakened
    n_rules = len(agent.pipeline.engine.rules.rules)
    assert h.rules.active + len(h.rules.inactive) + len(h.rules.controller) == n_rules

    fams = {f.name: f for f in AgentMetrics(agent).collect()}
    by = {s.labels["status"]: s.value for s in fams["skewd_rules"].samples}
    assert by == {"active": h.rules.active, "inactive": len(h.rules.inactive), "controller": len(h.rules.controller),
                  "clock_weakened": len(h.rules.clock_weakened)}
    assert fams["skewd_clock_synced"].samples[0].value == 0.0

    out = io.StringIO()
    run_check(cfg, out, as_json=True, clock=UNSYNCED)
    rows = json.loads(out.getvalue())["rules"]
    # --check probes every collector; the agent here runs two of them: compare what must match
    assert sorted(r["rule"] for r in rows if r["controller"]) == sorted(h.rules.controller)
    assert sorted(r["rule"] for r in rows if r["clock_weakened"]) == sorted(h.rules.clock_weakened)


def test_a_health_message_from_an_older_agent_still_decodes() -> None:
    old = {"schema": 1, "kind": "health", "node": "n", "cluster": "c", "t": 1.0, "collectors": {},
           "rules": {"active": 3, "inactive": {}}, "last_reload": {"ok": True, "error": "", "t": None},
           "spool_depth": 0, "drops": {}, "agent_version": "0.0.9"}
    h = wire.decode_health(json.dumps(old))
    assert h.clock is None and h.rules.controller == [] and h.rules.clock_weakened == {}
