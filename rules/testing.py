"""Rule unit tests as data (``promtool test rules`` for skewd).

A test file names rule files, input series in expanding notation and, at evaluation times,
the findings that must be firing. ``exp_findings: []`` asserts silence. The engine runs from
t=0 at ``evaluation_interval`` up to each ``eval_time`` exactly as the agent would, so ``for``
and ``keep_firing_for`` behave as in production.

    rule_files: [../packs/gpu-engine.yaml]
    evaluation_interval: 1s
    tests:
      - name: KV saturation fires
        interval: 1s
        input_series:
          - series: 'vllm_kv_cache_usage_ratio{node="n1", entity="engine0"}'
            values: '0.5+0.01x60'
        alert_rule_test:
          - eval_time: 60s
            rule: GPU-2-kv-saturation
            exp_findings:
              - {node: n1, entity: engine0}
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from skewd.model import BatchBuilder, Catalogue, SampleBatch, State, parse_duration

from .engine import Engine
from .codes import Code
from .loader import LoadIssue, _suggest, load_rules
from .store import WindowStore
from .yamlpos import PList, PMap, Pos, YamlError, load

TEST_TOP = {"rule_files", "evaluation_interval", "tests", "lookback"}
TEST_KEYS = {"name", "interval", "node", "node_labels", "input_series", "alert_rule_test"}
SERIES_KEYS = {"series", "signal", "node", "entity", "values"}
ART_KEYS = {"eval_time", "rule", "exp_findings"}
EXP_KEYS = {"node", "entity", "labels", "state"}

_NUM = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_TERM = re.compile(rf"^(?P<a>{_NUM}|_)(?:(?P<op>[+-])(?P<b>{_NUM[2:]}))?x(?P<n>\d+)$")
_SELECTOR = re.compile(r'^\s*([a-z][a-z0-9_]*)\s*(?:\{(.*)\})?\s*$')
_LABEL = re.compile(r'\s*([a-z_]+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class SeriesError(ValueError):
    pass


#: values one input series may expand to: a week at one sample a second (``'1x99999999999'``
#: would otherwise ask for terabytes)
MAX_SERIES_VALUES = 7 * 86400


def expand_values(text: str, limit: int = MAX_SERIES_VALUES) -> list[float]:
    """promtool's expanding notation: ``'1 2 _ 3'``, ``'0+10x30'`` (31 values: 0,10,…,300),
    ``'5-1x4'``, ``'7x3'`` (7 four times), ``'_x5'`` (five missing). NaN marks a missing sample.
    Raises SeriesError past ``limit`` values."""
    out: list[float] = []
    for tok in str(text).split():
        if tok == "_":
            out.append(np.nan)
            continue
        m = _TERM.match(tok)
        if m:
            n = int(m.group("n"))
            if len(out) + n + 1 > limit:
                raise SeriesError(f"'{tok}': the series would hold more than {limit} values")
            if m.group("a") == "_":
                if m.group("op"):
                    raise SeriesError(f"'{tok}': a missing value cannot step")
                out += [np.nan] * n
                continue
            a = float(m.group("a"))
            b = float(m.group("b") or 0) * (-1 if m.group("op") == "-" else 1)
            out += [a + b * i for i in range(n + 1)]
            continue
        try:
            out.append(float(tok))
        except ValueError:
            raise SeriesError(f"'{tok}' is not a number, '_' or a+bxN") from None
    return out


def parse_selector(text: str) -> tuple[str, dict[str, str]]:
    m = _SELECTOR.match(text)
    if not m:
        raise SeriesError(f"bad series {text!r}: write name{{node=\"n1\", entity=\"gpu0\"}}")
    labels: dict[str, str] = {}
    body = m.group(2) or ""
    pos = 0
    while pos < len(body):
        lm = _LABEL.match(body, pos)
        if not lm:
            raise SeriesError(f"bad label list in {text!r} near {body[pos:]!r}")
        labels[lm.group(1)] = lm.group(2)
        pos = lm.end()
    for k in labels:
        if k not in ("node", "entity"):
            raise SeriesError(f"series label {k!r}: only node and entity are labels of a skewd series")
    return m.group(1), labels


@dataclass
class CaseResult:
    file: str
    name: str
    ok: bool
    failures: list[str] = field(default_factory=list)


@dataclass
class RuleTestRun:
    results: list[CaseResult] = field(default_factory=list)
    issues: list[LoadIssue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.issues and all(r.ok for r in self.results)


def _fmt(d: dict[str, Any]) -> str:
    parts = [f"node={d['node']}", f"entity={d['entity'] or '-'}"]
    if d.get("labels"):
        parts.append("labels={" + ", ".join(f"{k}={v}" for k, v in sorted(d["labels"].items())) + "}")
    if d.get("state") and d["state"] != "firing":
        parts.append(f"state={d['state']}")
    return " ".join(parts)


class _TestFile:
    def __init__(self, path: Path, catalogue: Catalogue) -> None:
        self.path = path
        self.catalogue = catalogue
        self.issues: list[LoadIssue] = []

    def issue(self, code: Code, msg: str, pos: Pos) -> None:
        self.issues.append(LoadIssue(code, msg, pos))

    def run(self) -> list[CaseResult]:
        name = str(self.path)
        try:
            doc, dupes = load(self.path.read_text(), name)
        except OSError as e:
            self.issue(Code.IO, f"cannot read test file: {e.strerror or e}", Pos(name, 1, 1))
            return []
        except YamlError as e:
            self.issue(Code.YAML_SYNTAX, e.message, e.pos)
            return []
        for d in dupes:
            self.issue(Code.YAML_SYNTAX, d.message, d.pos)
        if not isinstance(doc, PMap):
            self.issue(Code.BAD_VALUE, "a rule test file is a mapping with rule_files and tests", Pos(name, 1, 1))
            return []
        self._keys(doc, TEST_TOP, "test file")
        files = doc.get("rule_files")
        if not isinstance(files, list) or not files:
            self.issue(Code.MISSING_KEY, "rule_files: must list the rule files under test", doc.pos)
            return []
        paths = [self.path.parent / f for f in files]
        res = load_rules(paths, self.catalogue)
        if not res.ok:
            self.issues += res.issues
            return []
        try:
            step = parse_duration(doc.get("evaluation_interval", "1s"))
            lookback = parse_duration(doc.get("lookback", "60s"))
        except ValueError as e:
            self.issue(Code.BAD_DURATION, str(e), doc.pos)
            return []
        if step <= 0:
            self.issue(Code.BAD_DURATION, "evaluation_interval must be longer than 0s", doc.pos)
            return []
        tests = doc.get("tests")
        if not isinstance(tests, PList):
            self.issue(Code.MISSING_KEY, "tests: must be a list of test cases", doc.pos)
            return []
        out = []
        for case in tests:
            if not isinstance(case, PMap):
                self.issue(Code.BAD_VALUE, "each test is a mapping", tests.pos)
                continue
            r = self._case(case, res.ruleset, step, lookback)
            if r is not None:
                out.append(r)
        return out

    def _keys(self, m: PMap, allowed: set[str], what: str) -> bool:
        ok = True
        for k in m:
            if k not in allowed:
                self.issue(Code.UNKNOWN_KEY, f"unknown key {k!r} in {what}{_suggest(k, allowed)}", m.key_pos[k])
                ok = False
        return ok

    def _case(self, case: PMap, ruleset, step: float, lookback: float) -> CaseResult | None:
        n_before = len(self.issues)
        name = str(case.get("name", f"line {case.pos.line}"))
        self._keys(case, TEST_KEYS, "test")
        try:
            interval = parse_duration(case.get("interval", "1s"))
        except ValueError as e:
            self.issue(Code.BAD_DURATION, str(e), case.val_pos.get("interval", case.pos))
            return None
        default_node = str(case.get("node", "n1"))
        rows: list[tuple[float, str, str, str, float]] = []
        for s in case.get("input_series") or []:
            if not isinstance(s, PMap):
                self.issue(Code.BAD_VALUE, "input_series items are mappings", case.pos)
                continue
            self._keys(s, SERIES_KEYS, "input series")
            try:
                if "series" in s:
                    sig, labels = parse_selector(str(s["series"]))
                else:
                    sig, labels = str(s.get("signal", "")), {}
                node = str(s.get("node", labels.get("node", default_node)))
                entity = str(s.get("entity", labels.get("entity", "")))
                values = expand_values(s.get("values", ""))
            except SeriesError as e:
                self.issue(Code.BAD_VALUE, str(e), s.pos)
                continue
            if sig not in self.catalogue:
                self.issue(Code.UNCATALOGUED_SIGNAL, f"{sig!r} is not a catalogued signal{_suggest(sig, self.catalogue)}", s.pos)
                continue
            for i, v in enumerate(values):
                if v == v:
                    rows.append((i * interval, node, entity, sig, v))
        checks = []
        rule_ids = {r.id for r in ruleset.rules}
        for a in case.get("alert_rule_test") or []:
            if not isinstance(a, PMap):
                self.issue(Code.BAD_VALUE, "alert_rule_test items are mappings", case.pos)
                continue
            self._keys(a, ART_KEYS, "alert_rule_test")
            try:
                et = parse_duration(a.get("eval_time", ""))
            except ValueError as e:
                self.issue(Code.BAD_DURATION, f"eval_time: {e}", a.val_pos.get("eval_time", a.pos))
                continue
            rid = a.get("rule")
            if rid not in rule_ids:
                self.issue(Code.OVERRIDE_TARGET, f"rule {rid!r} is not in the rule files{_suggest(rid, rule_ids)}",
                           a.val_pos.get("rule", a.pos))
                continue
            exp = a.get("exp_findings")
            if not isinstance(exp, list):
                self.issue(Code.MISSING_KEY, "exp_findings: must be a list ([] asserts no finding)", a.pos)
                continue
            want = []
            for e in exp:
                if not isinstance(e, PMap):
                    self.issue(Code.BAD_VALUE, "exp_findings items are mappings", a.pos)
                    continue
                self._keys(e, EXP_KEYS, "expected finding")
                want.append({"node": str(e.get("node", default_node)), "entity": str(e.get("entity", "")),
                             "labels": {str(k): str(v) for k, v in (e.get("labels") or {}).items()},
                             "state": str(e.get("state", "firing"))})
            checks.append((et, rid, want, a.pos))
        node_labels = case.get("node_labels") or {}
        if len(self.issues) > n_before:
            return None
        return self._execute(name, ruleset, rows, checks, step, lookback, node_labels)

    def _execute(self, name, ruleset, rows, checks, step, lookback, node_labels) -> CaseResult:
        store = WindowStore(self.catalogue, horizon=max(600.0, max((r.compiled.max_window for r in ruleset.rules), default=0) * 2))
        for n, labels in node_labels.items():
            store.registry.set_node_labels(str(n), {str(k): str(v) for k, v in labels.items()})
        engine = Engine(ruleset, store, lookback=lookback)
        rows.sort(key=lambda r: r[0])
        times = np.array([r[0] for r in rows])
        batch_all = SampleBatch.from_rows(rows)
        result = CaseResult(str(self.path), name, True)
        checks = sorted(checks, key=lambda c: c[0])
        t = 0.0
        fed = 0
        ci = 0
        by_id = ruleset.by_id()
        errored: set[str] = set()
        end = max((c[0] for c in checks), default=0.0)
        n_steps = int(round(end / step))
        for k in range(n_steps + 1):
            t = k * step
            hi = int(np.searchsorted(times, t + 1e-9, side="right"))
            if hi > fed:
                store.ingest(batch_all.select(np.arange(fed, hi)))
                fed = hi
            engine.evaluate(t)
            # an evaluation error fails the case (promtool fails on a rule's last error): it
            # would otherwise read as "expected, not firing" and hide the broken expression
            for rid, err in engine.last_eval_errors.items():
                if rid not in errored:
                    errored.add(rid)
                    rule = by_id[rid]
                    result.failures.append(f"{rule.source or self.path}: rule {rid} at {t:g}s: evaluation error: {err}")
            while ci < len(checks) and checks[ci][0] <= t + 1e-9:
                et, rid, want, pos = checks[ci]
                got = [{"node": st.node, "entity": st.entity, "labels": dict(st.labels), "state": st.state.value}
                       for st in engine.alerts() if st.rule_id == rid and st.state in (State.FIRING, State.PENDING)]
                want_states = {w["state"] for w in want}
                got = [g for g in got if g["state"] == "firing" or "pending" in want_states]
                result.failures += _diff(want, got, et, rid, pos)
                ci += 1
        result.ok = not result.failures
        return result


def _matches(w: dict, g: dict) -> bool:
    return (w["node"] == g["node"] and w["entity"] == g["entity"] and w["state"] == g["state"]
            and all(g["labels"].get(k) == v for k, v in w["labels"].items()))


def _diff(want: list[dict], got: list[dict], et: float, rid: str, pos: Pos) -> list[str]:
    missing = [w for w in want if not any(_matches(w, g) for g in got)]
    extra = [g for g in got if not any(_matches(w, g) for w in want)]
    if not missing and not extra:
        return []
    lines = [f"{pos}: rule {rid} at {et:g}s:"]
    lines += [f"  - expected, not firing: {_fmt(w)}" for w in missing]
    lines += [f"  + firing, not expected: {_fmt(g)}" for g in extra]
    return ["\n".join(lines)]


def find_test_files(paths: Iterable[str | Path]) -> list[Path]:
    out = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out += sorted(f for f in p.rglob("*.test.yaml"))
        else:
            out.append(p)
    return out


def run_tests(paths: Iterable[str | Path], catalogue: Catalogue) -> RuleTestRun:
    run = RuleTestRun()
    for f in find_test_files(paths):
        tf = _TestFile(f, catalogue)
        run.results += tf.run()
        run.issues += tf.issues
    return run


def series_batch(signal_name: str, node: str, entity: str, values: str, interval: float = 1.0,
                 t0: float = 0.0) -> SampleBatch:
    """Build samples from expanding notation (handy in Python tests and the fault lab)."""
    b = BatchBuilder(node)
    for i, v in enumerate(expand_values(values)):
        if v == v:
            b.add(t0 + i * interval, entity, signal_name, v)
    return b.build()
