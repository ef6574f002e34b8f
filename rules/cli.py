"""``skewd rules lint|test|explain|schema|coverage``: the rule author's tools.

Functions here take the catalogue (and, for coverage, the host's signal availability) as
arguments, so the rules package stays ignorant of collectors.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence, TextIO

from skewd.cliargs import did_you_mean
from skewd.model import GROUP_SCOPES, Catalogue, format_duration

from .engine import RuleSet
from .limits import DEFAULT_LIMITS, RuleLimits
from .loader import load_rules
from .lint import lint_warnings  # after the loader: the stage that follows it
from .paths import PACKS, SHIPPED
from .pathologies import PATHOLOGIES
from .schema import rule_file_schema
from .testing import run_tests

PACK_TESTS = Path(__file__).resolve().parent / "tests"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rules", help="lint, test, explain rule files")
    rs = p.add_subparsers(dest="rules_cmd", required=True)
    lint = rs.add_parser("lint", help="validate rule files; exit 1 on any error")
    lint.add_argument("paths", nargs="*", help=f"files or directories, read recursively; '{SHIPPED}' names the "
                                               f"shipped packs (default: {SHIPPED}, i.e. {PACKS})")
    lint.add_argument("--json", action="store_true", help="errors as a JSON list")
    lint.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                      help="raise or lower a loading budget, as the agent's rule_limits: does "
                           "(e.g. --limit yaml_depth=128 --limit max_duration=30d)")
    t = rs.add_parser("test", help="run rule unit tests (*.test.yaml)")
    t.add_argument("paths", nargs="*", help=f"test files or directories (default: {PACK_TESTS})")
    t.add_argument("--json", action="store_true")
    e = rs.add_parser("explain", help="what a rule watches, its params and mitigation")
    e.add_argument("rule_id")
    e.add_argument("--rules", action="append", help=f"rule files/dirs (default: {SHIPPED}, the shipped packs)")
    rs.add_parser("schema", help="JSON Schema of rule files (for yaml-language-server)")
    c = rs.add_parser("coverage", help="each pathology ID → rules and whether they are active on this host")
    c.add_argument("--rules", action="append", help=f"rule files/dirs (default: {SHIPPED}, the shipped packs)")
    c.add_argument("--json", action="store_true")
    c.add_argument("--no-probe", action="store_true", help="do not probe this host's collectors")


def run(args: argparse.Namespace, catalogue: Catalogue,
        availability: Callable[[], tuple[set[str], Mapping[str, str]]] | None = None,
        out: TextIO | None = None) -> int:
    out = out or sys.stdout
    cmd = args.rules_cmd
    if cmd == "lint":
        limits, problems = parse_limits(args.limit)
        if problems:
            for p in problems:
                out.write(f"--limit: {p}\n")
            return 2
        return lint(args.paths or [PACKS], catalogue, args.json, out, limits)
    if cmd == "test":
        return test(args.paths or [PACK_TESTS], catalogue, args.json, out)
    if cmd == "schema":
        out.write(json.dumps(rule_file_schema(sorted(catalogue)), indent=2) + "\n")
        return 0
    rs = _load_or_print(args.rules or [PACKS], catalogue, out)
    if rs is None:
        return 1
    if cmd == "explain":
        return explain(rs, args.rule_id, catalogue, out)
    if cmd == "coverage":
        avail = None if args.no_probe or availability is None else availability()
        return coverage(rs, avail, args.json, out)
    raise AssertionError(cmd)


def _load_or_print(paths: Sequence, catalogue: Catalogue, out: TextIO) -> RuleSet | None:
    res = load_rules(paths, catalogue)
    if not res.ok:
        for i in res.issues:
            out.write(f"{i}\n")
        return None
    return res.ruleset


def parse_limits(items: Sequence[str]) -> tuple[RuleLimits, list[str]]:
    """``KEY=VALUE`` strings → RuleLimits (numbers as numbers, durations as text)."""
    d: dict[str, object] = {}
    problems = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            problems.append(f"{item!r}: write KEY=VALUE")
            continue
        v: object = value.strip()
        for conv in (int, float):
            try:
                v = conv(value)
                break
            except ValueError:
                pass
        d[key.strip()] = v
    limits, bad = RuleLimits.from_mapping(d)
    return limits, problems + bad


def lint(paths: Sequence, catalogue: Catalogue, as_json: bool, out: TextIO,
         limits: RuleLimits = DEFAULT_LIMITS) -> int:
    res = load_rules(paths, catalogue, limits=limits)
    if as_json:
        out.write(json.dumps([i.to_dict() for i in res.issues] + [w.to_dict() for w in lint_warnings(paths)],
                             indent=2) + "\n")
    else:
        for i in res.issues:
            out.write(f"{i}\n")
        for w in lint_warnings(paths):  # never fail the lint: they load fine
            out.write(f"{w}\n")
        if res.ok:
            n = len(res.ruleset.rules)
            out.write(f"ok: {n} rules in {len(res.ruleset.files)} files\n")
        else:
            out.write(f"{len(res.issues)} error(s)\n")
    return 0 if res.ok else 1


def test(paths: Sequence, catalogue: Catalogue, as_json: bool, out: TextIO) -> int:
    run_ = run_tests(paths, catalogue)
    if as_json:
        out.write(json.dumps({"ok": run_.ok, "issues": [i.to_dict() for i in run_.issues],
                              "results": [{"file": r.file, "name": r.name, "ok": r.ok, "failures": r.failures}
                                          for r in run_.results]}, indent=2) + "\n")
        return 0 if run_.ok else 1
    for i in run_.issues:
        out.write(f"{i}\n")
    for r in run_.results:
        if r.ok:
            continue
        out.write(f"FAIL {r.file}: {r.name}\n")
        for f in r.failures:
            out.write(f"{f}\n")
    passed = sum(r.ok for r in run_.results)
    failed = len(run_.results) - passed
    out.write(f"rule tests: {passed} passed, {failed} failed" + (f", {len(run_.issues)} file error(s)" if run_.issues else "") + "\n")
    return 0 if run_.ok and run_.results else 1


def explain(rs: RuleSet, rule_id: str, catalogue: Catalogue, out: TextIO) -> int:
    rules = rs.by_id()
    r = rules.get(rule_id)
    if r is None:
        matches = [x for x in rules if x.startswith(rule_id) or rules[x].pathology == rule_id]
        if len(matches) == 1:
            r = rules[matches[0]]
        else:
            hint = f"; candidates: {', '.join(matches)}" if matches else did_you_mean(rule_id, rules)
            out.write(f"no rule {rule_id!r}{hint} (skewd rules coverage lists every rule)\n")
            return 1
    p = PATHOLOGIES.get(r.pathology)
    out.write(f"{r.id}  ({r.pathology}{': ' + p.title if p else ''})\n")
    out.write(f"  {r.desc}\n" if r.desc else "")
    out.write(f"  scope {r.scope.value} · layer {r.layer.value} · severity {r.severity.value} · "
              f"maturity {r.maturity} · defined at {r.source}\n")
    out.write(f"  fires when: {' '.join(r.expr.split())}\n")
    if r.peers_by:
        out.write(f"  peers: the nodes of its {r.scope.value} with the same {', '.join(r.peers_by)}\n")
    if r.for_s:
        out.write(f"  for: {format_duration(r.for_s)}\n")
    if r.keep_firing_for_s:
        out.write(f"  keep_firing_for: {format_duration(r.keep_firing_for_s)}\n")
    out.write("  watches:\n")
    for s in r.requires:
        spec = catalogue.get(s)
        if spec:
            out.write(f"    {s} ({spec.kind.value}, {spec.unit}, per {spec.scope.value}, from {spec.collector}): {spec.desc}\n")
    if r.params:
        out.write("  params (override per site with an override: file):\n")
        for k, v in r.params.items():
            out.write(f"    {k} = {v}\n")
    if r.mitigation:
        out.write("  mitigation:\n")
        for line in r.mitigation.splitlines():
            out.write(f"    {line}\n")
    return 0


def coverage(rs: RuleSet, avail: tuple[set[str], Mapping[str, str]] | None, as_json: bool, out: TextIO) -> int:
    rows = []
    for pid, p in PATHOLOGIES.items():
        rules = [r for r in rs.rules if r.pathology == pid]
        entries = []
        for r in rules:
            if not r.enabled:
                status, why = "disabled", ""
            elif r.scope in GROUP_SCOPES:
                status, why = "controller", "cross-node rule: the controller evaluates it over node summaries"
            elif avail is None:
                status, why = "not probed", ""
            else:
                signals, reasons = avail
                missing = [s for s in r.requires if s not in signals]
                status = "inactive" if missing else "active"
                by_reason: dict[str, list[str]] = {}
                for sig in missing:
                    by_reason.setdefault(reasons.get(sig, "no collector supplies it"), []).append(sig)
                why = "; ".join(f"{', '.join(sigs)}: {r}" for r, sigs in sorted(by_reason.items()))
            entries.append({"rule": r.id, "status": status, "reason": why, "scope": r.scope.value})
        rows.append({"pathology": pid, "title": p.title, "rules": entries})
    missing = [r["pathology"] for r in rows if not r["rules"]]
    if as_json:
        out.write(json.dumps({"pathologies": rows, "missing": missing}, indent=2) + "\n")
    else:
        for row in rows:
            if not row["rules"]:
                out.write(f"{row['pathology']:8} {row['title']}: MISSING (no rule)\n")
                continue
            for e in row["rules"]:
                extra = f" ({e['reason']})" if e["reason"] else ""
                out.write(f"{row['pathology']:8} {row['title'][:34]:34} {e['rule']:40} {e['status']}{extra}\n")
        covered = len(rows) - len(missing)
        out.write(f"{covered}/{len(rows)} pathologies covered" + (f"; missing: {', '.join(missing)}" if missing else "") + "\n")
    return 0 if not missing else 1

