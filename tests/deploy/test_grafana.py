"""The shipped Grafana dashboards: importable structure (unique ids, grid inside 24 columns,
every panel on the templated Prometheus datasource), counters only ever plotted through
rate()/increase(), and the findings and incidents panels an operator looks for first.
(Which metric names exist is checked against a live scrape in tests/agent and tests/controller.)"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASHBOARDS = sorted(GRAFANA.glob("*.json"))
COUNTER = re.compile(r"\b[a-z_:]+_total\b")


def _panels(d: dict) -> list[dict]:
    return [p for p in d["panels"] if p.get("type") != "row"]


def _inside_rate(expr: str, at: int) -> bool:
    """True when position ``at`` sits inside the parentheses of rate(), irate() or increase()."""
    depth_funcs: list[str] = []
    i = 0
    while i < at:
        c = expr[i]
        if c == "(":
            m = re.search(r"([a-z_]+)\s*$", expr[:i])
            depth_funcs.append(m.group(1) if m else "")
        elif c == ")" and depth_funcs:
            depth_funcs.pop()
        i += 1
    return any(f in ("rate", "irate", "increase") for f in depth_funcs)


def test_both_dashboards_ship() -> None:
    assert {p.name for p in DASHBOARDS} == {"skewd-agent.json", "skewd-controller.json"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_structure_is_importable(path: Path) -> None:
    d = json.loads(path.read_text())
    assert d["title"] and re.fullmatch(r"[a-z0-9-]{1,40}", d["uid"]) and isinstance(d["schemaVersion"], int)
    names = {v["name"]: v for v in d["templating"]["list"]}
    assert names["datasource"]["type"] == "datasource" and names["datasource"]["query"] == "prometheus"
    assert "instance" in names
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    occupied: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, (p["title"], g)
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"panel {p['title']!r} overlaps another"
        occupied |= cells
    for p in _panels(d):
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
            assert 'instance=~"$instance"' in t["expr"], t["expr"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_counters_are_plotted_as_rates(path: Path) -> None:
    """A cumulative counter plotted raw is a line that only climbs and resets on restart."""
    for p in _panels(json.loads(path.read_text())):
        for t in p["targets"]:
            for m in COUNTER.finditer(t["expr"]):
                assert _inside_rate(t["expr"], m.start()), f"{path.name} / {p['title']}: raw counter {m.group()}"


def test_findings_and_incidents_are_on_the_dashboards() -> None:
    agent = json.loads((GRAFANA / "skewd-agent.json").read_text())
    ctl = json.loads((GRAFANA / "skewd-controller.json").read_text())
    agent_exprs = " ".join(t["expr"] for p in _panels(agent) for t in p["targets"])
    ctl_exprs = " ".join(t["expr"] for p in _panels(ctl) for t in p["targets"])
    assert "rate(skewd_findings_total" in agent_exprs and "skewd_alerts{" in agent_exprs
    assert "skewd_controller_incidents{" in ctl_exprs and "rate(skewd_controller_incidents_shown_total" in ctl_exprs
    assert "rate(skewd_controller_findings_in_total" in ctl_exprs and "skewd_controller_suggestions{" in ctl_exprs


def test_the_rate_check_catches_a_raw_counter() -> None:
    assert not _inside_rate("skewd_findings_total", 0)
    e = 'sum by (x) (rate(skewd_findings_total{a="b"}[5m]))'
    assert _inside_rate(e, e.index("skewd_findings_total"))
    e = "sum(skewd_findings_total) / rate(other_total[5m])"
    assert not _inside_rate(e, e.index("skewd_findings_total"))
