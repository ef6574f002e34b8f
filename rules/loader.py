"""Loading rule files in stages (Falco's reader → collector → compiler).

1. **read**: each file is parsed keeping positions (``yamlpos``); syntax errors and duplicate
   keys are reported with ``file:line:col``.
2. **collect**: top-level keys, rule/macro/list items and their keys are validated strictly
   (unknown keys are errors, with a did-you-mean); ``override`` items (Falco style) are applied
   in load order to rules defined earlier, so a site file can tune shipped packs.
3. **compile**: every rule's ``expr`` (with its macros, lists and params) is compiled; names
   must be params, macros, lists or catalogued signals.

Every error from every stage is collected so one run reports them all, each with a code.
"""
from __future__ import annotations

import copy
import difflib
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from skewd.model import Catalogue, Layer, Scope, Severity, parse_duration

from . import paths as _paths

from .codes import Code, ExprError
from .engine import ENGINE_VERSION, Rule, RuleSet
from .expr import CompileEnv, compile_expr
from .limits import DEFAULT_LIMITS, RuleLimits
from .pathologies import PATHOLOGIES
from .yamlpos import PList, PMap, Pos, YamlError, YamlLimitError, load, scalar_offset_pos

TOP_KEYS = {"required_engine_version", "rules", "macros", "lists"}
RULE_KEYS = {"id", "pathology", "desc", "scope", "requires", "params", "expr", "for", "keep_firing_for",
             "severity", "layer", "mitigation", "summary", "labels", "tags", "enabled", "override", "peers_by"}
REQUIRED_RULE_KEYS = ("id", "pathology", "scope", "expr", "layer")
MACRO_KEYS = {"name", "expr", "desc"}
LIST_KEYS = {"name", "items", "desc"}
MATURITY = ("stable", "incubating", "sandbox")
#: which keys an override may touch, and how
OVERRIDABLE = {
    "params": ("append", "replace"), "expr": ("append", "replace"), "tags": ("append", "replace"),
    "requires": ("append", "replace"), "labels": ("append", "replace"), "desc": ("append", "replace"),
    "mitigation": ("append", "replace"), "summary": ("append", "replace"), "for": ("replace",),
    "keep_firing_for": ("replace",), "severity": ("replace",), "enabled": ("replace",),
    "layer": ("replace",), "pathology": ("replace",), "peers_by": ("replace",),
}
_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]*$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a Prometheus label name


@dataclass
class LoadIssue:
    code: Code
    message: str
    pos: Pos
    rule_id: str = ""

    def __str__(self) -> str:
        rid = f" [{self.rule_id}]" if self.rule_id else ""
        return f"{self.pos}: {self.code.value} {self.code.slug}{rid}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.pos.file, "line": self.pos.line, "col": self.pos.col, "code": self.code.value,
                "name": self.code.slug, "rule": self.rule_id, "message": self.message}


class RuleLoadError(Exception):
    def __init__(self, issues: list[LoadIssue]) -> None:
        super().__init__("\n".join(str(i) for i in issues))
        self.issues = issues


@dataclass
class _RuleDef:
    data: dict[str, Any]
    pos: Pos
    key_pos: dict[str, Pos]
    val_pos: dict[str, Pos]
    val_style: dict[str, Any]
    expr_parts: list[tuple[str, Pos, Any]] = field(default_factory=list)  # (text, pos, style)
    lines: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class LoadResult:
    ruleset: RuleSet | None
    issues: list[LoadIssue]

    @property
    def ok(self) -> bool:
        return not self.issues


def rule_files(paths: Iterable[str | Path]) -> list[Path]:
    """The rule files ``paths`` name, in load order: ``shipped`` is the packs, directories are
    read recursively (:mod:`skewd.rules.paths`)."""
    return _paths.rule_files(paths)


def _suggest(word: str, options: Iterable[str]) -> str:
    m = difflib.get_close_matches(str(word), list(options), n=1)
    return f"; did you mean {m[0]}?" if m else ""


class Loader:
    def __init__(self, catalogue: Catalogue, limits: RuleLimits = DEFAULT_LIMITS) -> None:
        self.catalogue = catalogue
        self.limits = limits
        self._too_many_rules = False
        self.issues: list[LoadIssue] = []
        self.rules: dict[str, _RuleDef] = {}
        self.order: list[str] = []
        self.macros: dict[str, str] = {}
        self.lists: dict[str, list] = {}
        self.files: list[str] = []
        self._file_lines: dict[str, list[str]] = {}

    def issue(self, code: Code, message: str, pos: Pos, rule_id: str = "") -> None:
        self.issues.append(LoadIssue(code, message, pos, rule_id))

    # -- stage 1: read ------------------------------------------------------------------------
    def read(self, path: Path, text: str | None = None) -> None:
        name = str(path)
        cap = self.limits.file_bytes
        if text is None:
            try:
                with open(path, "rb") as f:  # never more than the limit into memory
                    raw = f.read(cap + 1)
                text = raw.decode("utf-8") if len(raw) <= cap else ""
            except OSError as e:
                self.issue(Code.IO, f"cannot read rule file: {e.strerror or e}", Pos(name, 1, 1))
                return
            except UnicodeDecodeError as e:
                self.issue(Code.IO, f"not UTF-8 text: {e}", Pos(name, 1, 1))
                return
            if len(raw) > cap:
                self.issue(Code.LIMIT, f"rule file larger than {cap} bytes (rule_limits.file_bytes)", Pos(name, 1, 1))
                return
        self.files.append(name)
        try:
            doc, dupes = load(text, name, self.limits.yaml())
        except YamlLimitError as e:
            key = {"bytes": " (rule_limits.file_bytes)", "depth": " (rule_limits.yaml_depth)",
                   "nodes": " (rule_limits.yaml_alias_ratio, yaml_nodes)"}.get(e.limit, "")
            self.issue(Code.LIMIT, e.message + key, e.pos)
            return
        except YamlError as e:
            self.issue(Code.YAML_SYNTAX, e.message, e.pos)
            return
        self._file_lines[name] = text.splitlines()
        for d in dupes:
            self.issue(Code.YAML_SYNTAX, d.message, d.pos)
        self.collect(doc, name)

    # -- stage 2: collect ---------------------------------------------------------------------
    def collect(self, doc: Any, name: str) -> None:
        top = Pos(name, 1, 1)
        if doc is None:
            self.issue(Code.MISSING_KEY, "empty rule file: expected required_engine_version and rules", top)
            return
        if not isinstance(doc, PMap):
            self.issue(Code.BAD_VALUE, "a rule file is a mapping with required_engine_version, rules, macros, lists",
                       getattr(doc, "pos", top))
            return
        for k in doc:
            if k not in TOP_KEYS:
                self.issue(Code.UNKNOWN_KEY, f"unknown top-level key {k!r}{_suggest(k, TOP_KEYS)}", doc.key_pos[k])
        if "required_engine_version" not in doc:
            self.issue(Code.MISSING_KEY, f"missing required_engine_version (this engine is {ENGINE_VERSION})", doc.pos)
        else:
            v = doc["required_engine_version"]
            if isinstance(v, bool) or not isinstance(v, int):
                self.issue(Code.BAD_VALUE, "required_engine_version must be an integer", doc.val_pos["required_engine_version"])
            elif v > ENGINE_VERSION:
                self.issue(Code.ENGINE_VERSION, f"file needs engine version {v}, this skewd has {ENGINE_VERSION}: "
                                                "upgrade skewd", doc.val_pos["required_engine_version"])
        for section, fn in (("lists", self._collect_list), ("macros", self._collect_macro),
                            ("rules", self._collect_rule)):
            items = doc.get(section)
            if items is None:
                continue
            if not isinstance(items, PList):
                self.issue(Code.BAD_VALUE, f"{section} must be a list", doc.val_pos[section])
                continue
            for item, pos in zip(items, items.item_pos):
                if not isinstance(item, PMap):
                    self.issue(Code.BAD_VALUE, f"each item of {section} must be a mapping", pos)
                    continue
                fn(item)

    def _unknown_keys(self, item: PMap, allowed: set[str], what: str, rid: str = "") -> None:
        for k in item:
            if k not in allowed:
                self.issue(Code.UNKNOWN_KEY, f"unknown key {k!r} in {what}{_suggest(k, allowed)}", item.key_pos[k], rid)

    def _collect_list(self, item: PMap) -> None:
        self._unknown_keys(item, LIST_KEYS, "list")
        name = item.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            self.issue(Code.MISSING_KEY if name is None else Code.BAD_VALUE,
                       "a list needs name: (lower_snake_case)", item.pos)
            return
        items = item.get("items")
        if not isinstance(items, list) or any(isinstance(i, bool) or not isinstance(i, (int, float, str))
                                              for i in items):
            self.issue(Code.BAD_VALUE, f"list {name}: items must be a list of numbers or strings",
                       item.val_pos.get("items", item.pos))
            return
        for i, v in enumerate(items):
            why = self.limits.number_problem(v)
            if why:
                at = items.item_pos[i] if isinstance(items, PList) else item.val_pos.get("items", item.pos)
                self.issue(Code.OUT_OF_RANGE, f"list {name}: {why}", at)
                return
        self.lists[name] = list(items)

    def _collect_macro(self, item: PMap) -> None:
        self._unknown_keys(item, MACRO_KEYS, "macro")
        name = item.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            self.issue(Code.MISSING_KEY if name is None else Code.BAD_VALUE,
                       "a macro needs name: (lower_snake_case)", item.pos)
            return
        expr = item.get("expr")
        if not isinstance(expr, str):
            self.issue(Code.MISSING_KEY, f"macro {name} needs expr:", item.pos)
            return
        self.macros[name] = expr

    def _collect_rule(self, item: PMap) -> None:
        rid = item.get("id")
        rid_s = rid if isinstance(rid, str) else ""
        self._unknown_keys(item, RULE_KEYS, "rule", rid_s)
        if not isinstance(rid, str) or not _ID.match(rid):
            self.issue(Code.MISSING_KEY if rid is None else Code.BAD_VALUE,
                       "a rule needs id: (letters, digits, - _ . :)", item.pos, rid_s)
            return
        override = item.get("override")
        toggle_only = set(item) <= {"id", "enabled"} and "enabled" in item
        if override is not None or (toggle_only and rid in self.rules):
            self._apply_override(item, rid, override)
            return
        if rid in self.rules:
            first = self.rules[rid].pos
            self.issue(Code.DUPLICATE_ID, f"rule id {rid} already defined at {first}; use override: to change it",
                       item.key_pos["id"], rid)
            return
        for k in REQUIRED_RULE_KEYS:
            if k not in item:
                self.issue(Code.MISSING_KEY, f"rule {rid} is missing {k}:", item.pos, rid)
        rd = _RuleDef(dict(item), item.pos, dict(item.key_pos), dict(item.val_pos), dict(item.val_style))
        if isinstance(item.get("expr"), str):
            rd.expr_parts = [(item["expr"], item.val_pos["expr"], item.val_style.get("expr"))]
        if len(self.rules) >= self.limits.rules:
            if not self._too_many_rules:
                self._too_many_rules = True
                self.issue(Code.LIMIT, f"more than {self.limits.rules} rules in this rule set (rule_limits.rules)",
                           item.pos, rid)
            return
        self.rules[rid] = rd
        self.order.append(rid)

    def _apply_override(self, item: PMap, rid: str, override: Any) -> None:
        if rid not in self.rules:
            self.issue(Code.OVERRIDE_TARGET, f"override of rule {rid}, which is not defined in an earlier file"
                                             f"{_suggest(rid, self.rules)}", item.key_pos["id"], rid)
            return
        target = self.rules[rid]
        if override is None:
            override = {"enabled": "replace"}
            opos: dict = {}
        elif not isinstance(override, PMap):
            self.issue(Code.BAD_VALUE, "override: must map keys to append or replace", item.val_pos["override"], rid)
            return
        else:
            opos = override.val_pos
        for key, how in override.items():
            p = opos.get(key, item.pos)
            if key not in OVERRIDABLE:
                self.issue(Code.UNKNOWN_KEY, f"override of {key!r} is not supported{_suggest(key, OVERRIDABLE)}", p, rid)
                continue
            if how not in OVERRIDABLE[key]:
                self.issue(Code.BAD_VALUE, f"override {key}: must be {' or '.join(OVERRIDABLE[key])}", p, rid)
                continue
            if key not in item:
                self.issue(Code.MISSING_KEY, f"override names {key} but gives no {key}: value", p, rid)
                continue
            new = item[key]
            vpos = item.val_pos[key]
            cur = target.data.get(key)
            if key == "params":
                if not isinstance(new, dict):
                    self.issue(Code.BAD_VALUE, "params must be a mapping", vpos, rid)
                    continue
                base = dict(cur or {})
                for pk, pv in new.items():
                    if pk not in base and how == "replace":
                        self.issue(Code.UNKNOWN_PARAM, f"rule {rid} has no param {pk}{_suggest(pk, base)} "
                                                       "(use override params: append to add one)",
                                   new.key_pos.get(pk, vpos) if isinstance(new, PMap) else vpos, rid)
                        continue
                    base[pk] = pv
                target.data["params"] = base
            elif key == "expr":
                if not isinstance(new, str):
                    self.issue(Code.BAD_VALUE, "expr must be a string", vpos, rid)
                    continue
                part = (new, vpos, item.val_style.get("expr"))
                target.expr_parts = target.expr_parts + [part] if how == "append" else [part]
                target.data["expr"] = " and ".join(f"({t})" for t, _, _ in target.expr_parts) \
                    if len(target.expr_parts) > 1 else new
            elif how == "append" and key in ("tags", "requires"):
                target.data[key] = list(cur or []) + list(new if isinstance(new, list) else [new])
            elif how == "append" and key == "labels":
                target.data[key] = {**(cur or {}), **(new if isinstance(new, dict) else {})}
            elif how == "append":
                target.data[key] = f"{cur or ''}\n{new}".strip()
            else:
                target.data[key] = new
            target.val_pos[key] = vpos
        for key in item:
            if key not in ("id", "override") and key not in override:
                self.issue(Code.BAD_VALUE, f"{key}: given in an override item but not listed under override:",
                           item.key_pos[key], rid)

    # -- stage 3: compile ---------------------------------------------------------------------
    def compile(self) -> list[Rule]:
        out = []
        for rid in self.order:
            r = self._compile_rule(rid, self.rules[rid])
            if r is not None:
                out.append(r)
        return out

    def _compile_rule(self, rid: str, rd: _RuleDef) -> Rule | None:
        d = rd.data
        vp = lambda k: rd.val_pos.get(k, rd.pos)  # noqa: E731
        bad = len(self.issues)

        def enum(key: str, cls: type, default: Any = None) -> Any:
            v = d.get(key, default)
            if v is None:
                if key in d:  # written as null (`severity:` with nothing after it)
                    self.issue(Code.BAD_VALUE, f"{key} is empty: use one of {', '.join(e.value for e in cls)}",
                               vp(key), rid)
                return None
            try:
                return cls(v)
            except ValueError:
                opts = [e.value for e in cls]
                self.issue(Code.BAD_VALUE, f"{key}: {v!r} is not one of {', '.join(opts)}{_suggest(v, opts)}", vp(key), rid)
                return None

        scope = enum("scope", Scope)
        layer = enum("layer", Layer)
        severity = enum("severity", Severity, "warning")
        path = d.get("pathology")
        if path is not None and not isinstance(path, str):
            self.issue(Code.BAD_VALUE, "pathology must be an ID such as GPU-2 (see docs/pathologies.md) or "
                                       "custom-<name>", vp("pathology"), rid)
        elif path is not None and path not in PATHOLOGIES and not str(path).startswith("custom"):
            self.issue(Code.BAD_VALUE, f"pathology {path!r} is not in the catalogue{_suggest(path, PATHOLOGIES)} "
                                       "(use an ID from docs/pathologies.md, or custom-<name>)", vp("pathology"), rid)
        durations = {}
        for key in ("for", "keep_firing_for"):
            v = d.get(key, "0s")
            try:
                durations[key] = parse_duration(v)
            except (ValueError, TypeError) as e:
                self.issue(Code.BAD_DURATION, f"{key}: {e}", vp(key), rid)
                continue
            why = self.limits.duration_problem(durations[key])
            if why:
                self.issue(Code.OUT_OF_RANGE, f"{key}: {why}", vp(key), rid)
        params = d.get("params") or {}
        if not isinstance(params, dict):
            self.issue(Code.BAD_VALUE, "params must be a mapping of name: number, duration, string or list", vp("params"), rid)
            params = {}
        usable: dict[Any, Any] = {}  # what the expression compiles against: a bad param reads as a neutral one
        for pk, pv in params.items():
            ppos = params.val_pos.get(pk, vp("params")) if isinstance(params, PMap) else vp("params")
            problem = self._param_problem(pk, pv)
            if problem is None:
                usable[pk] = pv
                continue
            code, msg = problem
            self.issue(code, msg, ppos, rid)
            if isinstance(pk, str):  # a name the expression can still use; a key like null or 3 is none
                usable[pk] = "1s" if isinstance(pv, str) else [] if isinstance(pv, list) else 0.0
        for key, typ, what in (("labels", dict, "a mapping of strings"), ("tags", list, "a list of strings"),
                               ("requires", list, "a list of signal names")):
            v = d.get(key)
            if v is not None and not isinstance(v, typ):
                self.issue(Code.BAD_VALUE, f"{key} must be {what}", vp(key), rid)
        for key in ("desc", "mitigation", "summary"):
            if key in d and not isinstance(d[key], str):
                self.issue(Code.BAD_VALUE, f"{key} must be text", vp(key), rid)
        peers_by = self._peers_by(d, scope, vp("peers_by"), rid)
        enabled = d.get("enabled", True)
        if not isinstance(enabled, bool):
            self.issue(Code.BAD_VALUE, "enabled must be true or false", vp("enabled"), rid)
        tags = [str(t) for t in (d.get("tags") or [])] if isinstance(d.get("tags"), list) else []
        if len([t for t in tags if t in MATURITY]) > 1:
            self.issue(Code.BAD_VALUE, f"tags: at most one maturity tag ({', '.join(MATURITY)})", vp("tags"), rid)
        requires = d.get("requires") if isinstance(d.get("requires"), list) else []
        rpos = rd.val_pos.get("requires")
        for i, s in enumerate(requires):
            p = rpos
            if isinstance(d.get("requires"), PList) and i < len(d["requires"].item_pos):
                p = d["requires"].item_pos[i]
            if not isinstance(s, str):
                kind = "a mapping" if isinstance(s, dict) else "a list" if isinstance(s, list) else repr(s)[:40]
                self.issue(Code.BAD_VALUE, f"requires: item {i + 1} must be a signal name, not {kind}",
                           p or rd.pos, rid)
            elif s not in self.catalogue:
                self.issue(Code.UNCATALOGUED_SIGNAL, f"requires {s!r}: not a catalogued signal"
                                                     f"{_suggest(s, self.catalogue)}", p or rd.pos, rid)
        requires = [s for s in requires if isinstance(s, str)]  # the others are reported above
        compiled = None
        if scope is not None and isinstance(d.get("expr"), str):
            env = CompileEnv(self.catalogue, scope, usable, self.macros, self.lists, self.limits)
            try:
                compiled = compile_expr(d["expr"], env)
            except ExprError as e:
                self.issue(e.code, e.message, self._expr_pos(rd, e.offset), rid)
            if compiled is not None:
                missing = sorted(compiled.signals - set(requires))
                if "requires" in d and missing:
                    self.issue(Code.REQUIRES_MISMATCH, f"expr uses {', '.join(missing)} but requires: does not list it",
                               rpos or rd.pos, rid)
                group = scope in (Scope.TP_GROUP, Scope.CLUSTER)
                want = Scope.NODE if group else scope
                if compiled.signals and not any(self.catalogue[s].scope == want for s in compiled.signals):
                    self.issue(Code.SCOPE_MISMATCH, f"scope {scope.value} needs at least one per-{want.value} signal "
                                                    "in expr", vp("scope"), rid)
                if not compiled.signals:
                    self.issue(Code.WRONG_TYPE, "expr references no signal, so it can never change", vp("expr"), rid)
        elif "expr" in d and not isinstance(d.get("expr"), str):
            self.issue(Code.BAD_VALUE, "expr must be text", vp("expr"), rid)
        if len(self.issues) > bad or compiled is None:
            return None
        req = list(dict.fromkeys(list(requires) + sorted(compiled.signals)))
        definition = {k: d.get(k) for k in sorted(RULE_KEYS - {"override"})}
        if not peers_by:  # the digests of rules written before peers_by existed stay as they were
            definition.pop("peers_by")
        digest = hashlib.sha256(json.dumps(definition, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return Rule(
            id=rid, pathology=str(path), desc=str(d.get("desc", "")), scope=scope, requires=req,
            params=dict(params), expr=d["expr"], for_s=durations.get("for", 0.0),
            keep_firing_for_s=durations.get("keep_firing_for", 0.0), severity=severity, layer=layer,
            mitigation=str(d.get("mitigation", "")).strip(), labels={str(k): str(v) for k, v in (d.get("labels") or {}).items()},
            tags=tags, enabled=bool(enabled), summary=str(d.get("summary", "")), compiled=compiled, digest=digest,
            source=str(rd.pos), peers_by=peers_by,
        )

    def _param_problem(self, pk: Any, pv: Any) -> tuple[Code, str] | None:
        """Why a param cannot be used as written (None: it can)."""
        if not isinstance(pk, str) or not _NAME.match(pk):
            return Code.BAD_VALUE, f"param name {pk!r} must be lower_snake_case"
        if isinstance(pv, bool) or not isinstance(pv, (int, float, str, list)):
            return Code.BAD_VALUE, f"param {pk} must be a number, a duration, a string or a list"
        if isinstance(pv, str):
            # a string that reads as a duration is one and must be in range; any other string is
            # checked where the expression uses it (E009 as a duration, a plain string beside
            # entity/node: port: eth1)
            try:
                d = parse_duration(pv)
            except ValueError:
                return None
            why = self.limits.duration_problem(d)
            return (Code.OUT_OF_RANGE, f"param {pk}: {why}") if why else None
        if isinstance(pv, list):
            if any(isinstance(i, bool) or not isinstance(i, (int, float, str)) for i in pv):
                return Code.BAD_VALUE, f"param {pk}: a list param holds numbers or strings"
            why = next((w for w in map(self.limits.number_problem, pv) if w), None)
            return (Code.OUT_OF_RANGE, f"param {pk}: {why}") if why else None
        why = self.limits.number_problem(pv)
        return (Code.OUT_OF_RANGE, f"param {pk}: {why}") if why else None

    def _peers_by(self, d: dict, scope: Scope | None, pos: Pos, rid: str) -> tuple[str, ...]:
        """``peers_by``: node labels that split a group scope's peers (like PromQL's ``by``)."""
        v = d.get("peers_by")
        if v is None:
            return ()
        if not isinstance(v, list) or not v or not all(isinstance(x, str) and _LABEL.match(x) for x in v):
            self.issue(Code.BAD_VALUE, "peers_by must be a list of node label names (e.g. [model, role])", pos, rid)
            return ()
        if scope is not None and scope not in (Scope.TP_GROUP, Scope.CLUSTER):
            self.issue(Code.BAD_VALUE, f"peers_by splits the nodes of a group scope (tp_group, cluster); scope "
                                       f"{scope.value} compares the entities of one node", pos, rid)
            return ()
        return tuple(dict.fromkeys(v))

    def _expr_pos(self, rd: _RuleDef, offset: int) -> Pos:
        """Map an offset in the (possibly override-combined) expr back to its file position."""
        parts = rd.expr_parts
        if not parts:
            return rd.pos
        if len(parts) > 1:
            # combined text is "(a) and (b) ..."; find which part the offset falls in
            pos = 0
            for text, p, style in parts:
                start = pos + 1
                end = start + len(text)
                if offset < end + 1:
                    return scalar_offset_pos(p, style, text, offset - start, self._file_lines.get(p.file, []))
                pos = end + len(") and (") - 1
            text, p, style = parts[-1]
            return scalar_offset_pos(p, style, text, len(text), self._file_lines.get(p.file, []))
        text, p, style = parts[0]
        return scalar_offset_pos(p, style, text, offset, self._file_lines.get(p.file, []))


def load_rules(paths: Sequence[str | Path], catalogue: Catalogue,
               texts: dict[str, str] | None = None, limits: RuleLimits = DEFAULT_LIMITS) -> LoadResult:
    """Load rule files/directories in order (later files may override earlier rules), within
    ``limits`` (see :mod:`skewd.rules.limits`)."""
    loader = Loader(catalogue, limits)
    files = rule_files(paths)
    if not files:
        loader.issue(Code.IO, "no rule files found", Pos(",".join(map(str, paths)) or "-", 1, 1))
    for f in files:
        loader.read(f, (texts or {}).get(str(f)))
    rules = loader.compile()
    if loader.issues:
        return LoadResult(None, loader.issues)
    version = hashlib.sha256("".join(r.digest for r in rules).encode()).hexdigest()[:12]
    return LoadResult(RuleSet(rules, loader.files, version), [])


def load_rules_or_raise(paths: Sequence[str | Path], catalogue: Catalogue,
                        limits: RuleLimits = DEFAULT_LIMITS) -> RuleSet:
    res = load_rules(paths, catalogue, limits=limits)
    if not res.ok:
        raise RuleLoadError(res.issues)
    return res.ruleset


def deepcopy_rules(rs: RuleSet) -> RuleSet:
    return copy.deepcopy(rs)
