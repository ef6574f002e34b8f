"""``skewd agent --check``: which collectors and rules work on this host, and why not; which
rules the controller evaluates for it; and whether its clock is good enough for the cross-node
ones (agent/rulestatus.py gives health and /metrics the same answer).

Usable as a systemd ``ExecStartPre=``: the exit status says whether the agent can do its job.

- 0: the rules load and every collector marked ``required: true`` is active (an absent GPU on
  a host that did not require one is information, not a failure);
- 1: the rules do not load (the errors are printed with file:line:col);
- 2: the config is invalid (printed by ``skewd agent`` before the check runs);
- 3: a ``required: true`` collector is not active (its reason is printed).

When the rules fail and a required collector is missing too, the status is 1.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, TextIO

from skewd.collectors.base import Availability
from skewd.model import NODE_SCOPES

from .config import AgentConfig, load_config

EXIT_OK = 0
EXIT_RULES = 1
EXIT_CONFIG = 2
EXIT_REQUIRED = 3
from .scheduler import availability, build_slots, collector_config_keys

if TYPE_CHECKING:
    from .clock import ClockState


def host_availability(cfg: AgentConfig | None = None) -> tuple[set[str], dict[str, str]]:
    """Probe every collector (nothing is started) → (available signals, reasons for the rest)."""
    if cfg is None:
        cfg = load_config(None, env={}, collector_keys=collector_config_keys())
    slots = build_slots(cfg)
    try:
        signals, reasons = availability(slots)
        from skewd.catalogue import full_catalogue

        return signals | _derived_signals(full_catalogue()), reasons
    finally:
        for s in slots:
            if s.collector is not None:
                s.collector.stop()


def run_check(cfg: AgentConfig, out: TextIO, as_json: bool = False, clock: "ClockState | None" = None) -> int:
    """``clock``: the kernel's clock state (read with adjtimex when not given)."""
    from skewd.catalogue import full_catalogue
    from skewd.rules.cli import PACKS
    from skewd.rules.counts import rule_counts
    from skewd.rules.engine import Engine
    from skewd.rules.loader import load_rules
    from skewd.rules.store import WindowStore

    from .clock import clock_state
    from .rulestatus import clock_weak, clock_words, rule_status

    clock = clock if clock is not None else clock_state()
    slots = build_slots(cfg)
    signals, reasons = availability(slots)
    for s in slots:
        if s.collector is not None:
            s.collector.stop()
    required_missing = [s.name for s in slots
                        if cfg.collector_config(s.name).get("required") and not s.active]
    cat = full_catalogue()
    res = load_rules(cfg.rules or [PACKS], cat)
    code = EXIT_RULES if not res.ok else EXIT_REQUIRED if required_missing else EXIT_OK
    rule_rows: list[dict] = []
    counts = None
    if res.ok:
        eng = Engine(res.ruleset, WindowStore(cat), scopes=NODE_SCOPES)
        eng.set_available_signals(signals | _derived_signals(cat), reasons)
        counts = rule_counts(eng)
        st = rule_status(eng, cat, clock)
        for r in res.ruleset.rules:
            controller = r.id in st.controller
            why = ("evaluated by the controller over node summaries" if controller
                   else st.inactive.get(r.id, ""))
            rule_rows.append({"rule": r.id, "pathology": r.pathology, "active": r.id in st.active,
                              "controller": controller, "reason": why,
                              "clock_weakened": st.clock_weakened.get(r.id, "")})
    clock_row = {"synced": clock.synced, "max_error_s": clock.max_error_s, "source": clock.source,
                 "weakens": [r["rule"] for r in rule_rows if r["clock_weakened"]]}
    if as_json:
        out.write(json.dumps({
            "node": cfg.node, "cluster": cfg.cluster, "config": cfg.source, "clock": clock_row,
            "collectors": [{"name": s.name, "state": s.status.availability.value, "reason": s.status.reason,
                            "interval": s.interval} for s in slots],
            "rules": rule_rows, "rule_errors": [str(i) for i in res.issues],
            "rule_counts": None if counts is None else {"active": counts.active, "inactive": counts.inactive,
                                                        "controller": counts.controller},
            "required_missing": required_missing, "exit_code": code,
        }, indent=2) + "\n")
        return code
    out.write(f"skewd agent check · node {cfg.node} · cluster {cfg.cluster} · config {cfg.source}\n")
    out.write(f"  sys_root {cfg.sys_root} · proc_root {cfg.proc_root}\n")
    out.write(f"  clock {clock_words(clock)}\n\ncollectors:\n")
    for s in slots:
        mark = "active  " if s.status.availability is Availability.ACTIVE else "INACTIVE"
        extra = f" every {s.interval:g}s" if s.status.availability is Availability.ACTIVE else ""
        out.write(f"  {mark} {s.name:9}{extra}  {s.status.reason}\n")
    if required_missing:
        out.write(f"\nREQUIRED collector(s) not active: {', '.join(required_missing)} "
                  "(collectors.<name>.required: true); exit status 3\n")
    if counts is None:
        out.write("\nrules: NOT LOADED (exit status 1)\n")
        for i in res.issues:
            out.write(f"  {i}\n")
        return code
    local = [r for r in rule_rows if not r["controller"]]
    remote = [r for r in rule_rows if r["controller"]]
    out.write(f"\nrules: {counts.describe()}\n")
    for r in local:
        if r["active"]:
            out.write(f"  active   {r['rule']} ({r['pathology']})\n")
    for r in local:
        if not r["active"]:
            out.write(f"  inactive {r['rule']} ({r['pathology']}): {r['reason']}\n")
    for r in remote:
        out.write(f"  controller {r['rule']} ({r['pathology']}): evaluated by the controller over node summaries\n")
    weak = [r for r in rule_rows if r["clock_weakened"]]
    if clock_weak(clock):
        out.write(f"\nclock {clock_words(clock)}: too coarse for cross-node timing. Run chrony/ntpd (or PTP) "
                  "against a nearby server so the kernel reports it synchronised with an error bound under "
                  f"1 ms. It weakens {len(weak)} rule(s):\n")
        for r in weak:
            out.write(f"  weakened {r['rule']} ({r['pathology']}): {r['clock_weakened']}\n")
        out.write("  rules measuring this node's own durations or byte rates are not affected\n")
    return code


def _derived_signals(cat) -> set[str]:
    """Signals the agent computes itself (node summaries) are always available."""
    return {s.name for s in cat.values() if s.collector == "agent"}
