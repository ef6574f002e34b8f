"""``skewd agent --check``: which collectors and rules work on this host, and why not.

Exit status 0 whenever the check itself ran: an absent GPU is information, not a failure.
"""
from __future__ import annotations

import json
from typing import TextIO

from skewd.collectors.base import Availability
from skewd.model import NODE_SCOPES

from .config import AgentConfig, load_config
from .scheduler import availability, build_slots, collector_config_keys


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


def run_check(cfg: AgentConfig, out: TextIO, as_json: bool = False) -> int:
    from skewd.catalogue import full_catalogue
    from skewd.rules.cli import PACKS
    from skewd.rules.counts import rule_counts
    from skewd.rules.engine import Engine
    from skewd.rules.loader import load_rules
    from skewd.rules.store import WindowStore

    slots = build_slots(cfg)
    signals, reasons = availability(slots)
    for s in slots:
        if s.collector is not None:
            s.collector.stop()
    cat = full_catalogue()
    res = load_rules(cfg.rules or [PACKS], cat)
    rule_rows: list[dict] = []
    counts = None
    if res.ok:
        eng = Engine(res.ruleset, WindowStore(cat), scopes=NODE_SCOPES)
        eng.set_available_signals(signals | _derived_signals(cat), reasons)
        counts = rule_counts(eng)
        for r in res.ruleset.rules:
            if r.enabled and not eng.evaluates(r):
                rule_rows.append({"rule": r.id, "pathology": r.pathology, "active": False, "controller": True,
                                  "reason": f"{r.scope.value} scope: evaluated by the controller over node summaries"})
                continue
            why = counts.inactive_reasons.get(r.id, "")
            rule_rows.append({"rule": r.id, "pathology": r.pathology, "active": r.id not in counts.inactive_reasons,
                              "reason": why, "controller": False})
    if as_json:
        out.write(json.dumps({
            "node": cfg.node, "cluster": cfg.cluster, "config": cfg.source,
            "collectors": [{"name": s.name, "state": s.status.availability.value, "reason": s.status.reason,
                            "interval": s.interval} for s in slots],
            "rules": rule_rows, "rule_errors": [str(i) for i in res.issues],
            "rule_counts": None if counts is None else {"active": counts.active, "inactive": counts.inactive,
                                                        "controller": counts.controller},
        }, indent=2) + "\n")
        return 0
    out.write(f"skewd agent check · node {cfg.node} · cluster {cfg.cluster} · config {cfg.source}\n")
    out.write(f"  sys_root {cfg.sys_root} · proc_root {cfg.proc_root}\n\ncollectors:\n")
    for s in slots:
        mark = "active  " if s.status.availability is Availability.ACTIVE else "INACTIVE"
        extra = f" every {s.interval:g}s" if s.status.availability is Availability.ACTIVE else ""
        out.write(f"  {mark} {s.name:9}{extra}  {s.status.reason}\n")
    if counts is None:
        out.write("\nrules: NOT LOADED\n")
        for i in res.issues:
            out.write(f"  {i}\n")
        return 0
    remote = [r["rule"] for r in rule_rows if r["controller"]]
    out.write(f"\nrules: {counts.describe()}"
              + (f" (the controller runs {', '.join(remote)})" if remote else "") + "\n")
    local = [r for r in rule_rows if not r["controller"]]
    for r in local:
        if r["active"]:
            out.write(f"  active   {r['rule']} ({r['pathology']})\n")
    for r in local:
        if not r["active"]:
            out.write(f"  inactive {r['rule']} ({r['pathology']}): {r['reason']}\n")
    return 0


def _derived_signals(cat) -> set[str]:
    """Signals the agent computes itself (node summaries) are always available."""
    return {s.name for s in cat.values() if s.collector == "agent"}
