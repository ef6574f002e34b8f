"""Load and strictly validate an exporter mapping file (exporter metric names → skewd signals).

Every problem in a file is reported at once, each as ``file:line:col: message`` (Prometheus
``rulefmt`` / Falco style): unknown or duplicate keys, missing keys, wrong types, signals that
no collector catalogues, entity templates that do not match the signal's scope.

File format::

    source: dcgm-exporter          # what exports these names
    confirmed: true                # were the names checked against the real exporter?
    rules:
      - metric: DCGM_FI_DEV_GPU_UTIL      # exporter metric name as written on the page
        signal: gpu_utilization_ratio     # a catalogued skewd signal
        entity: "gpu{gpu}"                # template over the series' labels; "" = node
        scale: 0.01                       # optional multiplier (percent → ratio)
        bits: 0x4                         # optional: 1 if int(value) & bits else 0
        where: {GPU_I_ID: ""}             # optional: only series with these label values
        combine: sum                      # optional: sum|max|min|first, see Rule.combine
"""
from __future__ import annotations

import difflib
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from skewd.model import Kind, Scope, SignalSpec

MAPPINGS_DIR = Path(__file__).resolve().parent / "mappings"
COMBINES = ("sum", "max", "min", "first")
_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_TOP_KEYS = {"source": True, "confirmed": True, "rules": True, "description": False}
_RULE_KEYS = {"metric": True, "signal": True, "entity": True, "scale": False, "bits": False,
              "where": False, "combine": False}


#: a bit field's values are 0 .. 2^64-1 (the uint64 DCGM and NVML report event reasons in)
_BIT_FIELD_END = float(1 << 64)


class MappingError(ValueError):
    """All problems found in one mapping file, one ``file:line:col: message`` per line."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class Rule:
    metric: str
    signal: str
    entity: str
    scale: float = 1.0
    bits: int | None = None
    where: tuple[tuple[str, str], ...] = ()
    #: how several values landing on one (signal, entity) are combined — several series (MIG
    #: instances, links) or several rules (FB used + reserved). Default: sum for counter
    #: signals, max for gauges; "first" takes the first rule (file order) that has a value.
    combine: str = "max"
    line: int = 0

    def entity_for(self, labels: Mapping[str, str]) -> str | None:
        """The entity of a series, or None when it lacks a label the template needs."""
        try:
            return self.entity.format_map(_Strict(labels))
        except KeyError:
            return None

    def accepts(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k, "") == v for k, v in self.where)

    def value(self, raw: float) -> float | None:
        """The signal's value of a sample, or None when the sample cannot carry it: a bit field
        is an unsigned 64-bit integer (DCGM's clock event reasons), so +Inf, a negative value or
        one past 2^64 (what a page's overlong integer reads as) is not a sample of its bits."""
        if self.bits is not None:
            if not 0.0 <= raw < _BIT_FIELD_END:  # NaN fails this too
                return None
            return 1.0 if int(raw) & self.bits else 0.0
        return raw * self.scale


class _Strict(dict):
    def __missing__(self, key: str) -> str:
        raise KeyError(key)


@dataclass
class MappingFile:
    """A validated mapping file."""

    source: str
    confirmed: bool
    rules: list[Rule]
    path: str = ""
    description: str = ""
    signals: list[SignalSpec] = field(default_factory=list)

    def by_metric(self) -> dict[str, list[Rule]]:
        out: dict[str, list[Rule]] = {}
        for r in self.rules:
            out.setdefault(r.metric, []).append(r)
        return out


def resolve(name_or_path: str) -> Path:
    """A shipped mapping by name (``dcgm-exporter``, ``dts``) or a file path."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.is_file():
        return p
    shipped = MAPPINGS_DIR / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    known = sorted(q.stem for q in MAPPINGS_DIR.glob("*.yaml"))
    raise FileNotFoundError(f"no mapping {name_or_path!r}: give a .yaml path or one of {known}")


def load(path: str | Path, known: Mapping[str, SignalSpec]) -> MappingFile:
    """Read and validate ``path``; ``known`` is every catalogued signal a rule may target."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise MappingError([f"{path}: cannot read: {e.strerror or e}"]) from None
    return loads(text, known, str(path))


def loads(text: str, known: Mapping[str, SignalSpec], name: str = "<mapping>") -> MappingFile:
    v = _Validator(name, known)
    m = v.run(text)
    if v.errors or m is None:
        raise MappingError(v.errors or [f"{name}: empty mapping"])
    return m


class _Validator:
    def __init__(self, name: str, known: Mapping[str, SignalSpec]) -> None:
        self.name = name
        self.known = known
        self.errors: list[str] = []
        self.loader: yaml.SafeLoader | None = None

    def err(self, node: yaml.Node | None, msg: str) -> None:
        if node is None:
            self.errors.append(f"{self.name}: {msg}")
        else:
            m = node.start_mark
            self.errors.append(f"{self.name}:{m.line + 1}:{m.column + 1}: {msg}")

    def value(self, node: yaml.Node) -> Any:
        assert self.loader is not None
        return self.loader.construct_object(node, deep=True)

    def keys(self, node: yaml.MappingNode, allowed: Mapping[str, bool], where: str
             ) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for k, val in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if not isinstance(key, str):
                self.err(k, f"{where}: keys must be plain strings")
                continue
            if key in out:
                self.err(k, f"{where}: duplicate key {key!r}")
                continue
            if key not in allowed:
                hint = difflib.get_close_matches(key, list(allowed), n=1)
                self.err(k, f"{where}: unknown key {key!r}"
                         + (f" (did you mean {hint[0]!r}?)" if hint else "")
                         + f"; known: {', '.join(allowed)}")
                continue
            out[key] = (k, val)
        for key, required in allowed.items():
            if required and key not in out:
                self.err(node, f"{where}: missing required key {key!r}")
        return out

    def scalar(self, node: yaml.Node, types: tuple[type, ...], what: str, where: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            self.err(node, f"{where}: expected {what}")
            return None
        v = self.value(node)
        if isinstance(v, bool) and bool not in types:
            self.err(node, f"{where}: expected {what}, got {v!r}")
            return None
        if not isinstance(v, types):
            self.err(node, f"{where}: expected {what}, got {v!r}")
            return None
        return v

    def run(self, text: str) -> MappingFile | None:
        self.loader = yaml.SafeLoader(text)
        try:
            try:
                root = self.loader.get_single_node()
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                pos = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
                self.errors.append(f"{self.name}{pos}: not valid YAML: "
                                   f"{getattr(e, 'problem', None) or e}")
                return None
            if root is None:
                self.err(None, "empty file")
                return None
            if not isinstance(root, yaml.MappingNode):
                self.err(root, "expected a mapping with source, confirmed and rules")
                return None
            top = self.keys(root, _TOP_KEYS, "mapping")
            source = (self.scalar(top["source"][1], (str,), "a string", "source")
                      if "source" in top else "")
            confirmed = (self.scalar(top["confirmed"][1], (bool,), "true or false", "confirmed")
                         if "confirmed" in top else False)
            desc = (self.scalar(top["description"][1], (str,), "a string", "description")
                    if "description" in top else "")
            rules: list[Rule] = []
            if "rules" in top:
                node = top["rules"][1]
                if not isinstance(node, yaml.SequenceNode) or not node.value:
                    self.err(node, "rules: expected a non-empty list of rules")
                else:
                    for i, rn in enumerate(node.value):
                        r = self.rule(rn, f"rules[{i}]")
                        if r is not None:
                            rules.append(r)
            self.cross_check(rules)
            specs = []
            seen = set()
            for r in rules:
                if r.signal not in seen and r.signal in self.known:
                    seen.add(r.signal)
                    specs.append(self.known[r.signal])
            return MappingFile(source or "", bool(confirmed), rules, self.name, desc or "", specs)
        finally:
            self.loader.dispose()

    def rule(self, node: yaml.Node, where: str) -> Rule | None:
        if not isinstance(node, yaml.MappingNode):
            self.err(node, f"{where}: expected a mapping with metric, signal and entity")
            return None
        n_before = len(self.errors)
        k = self.keys(node, _RULE_KEYS, where)
        metric = signal = entity = None
        if "metric" in k:
            metric = self.scalar(k["metric"][1], (str,), "an exporter metric name", f"{where}.metric")
            if metric is not None and not _METRIC.match(metric):
                self.err(k["metric"][1], f"{where}.metric: {metric!r} is not a Prometheus metric name")
        spec = None
        if "signal" in k:
            signal = self.scalar(k["signal"][1], (str,), "a skewd signal name", f"{where}.signal")
            if signal is not None:
                spec = self.known.get(signal)
                if spec is None:
                    hint = difflib.get_close_matches(signal, list(self.known), n=1)
                    self.err(k["signal"][1], f"{where}.signal: {signal!r} is not a catalogued signal"
                             + (f" (did you mean {hint[0]!r}?)" if hint else ""))
        if "entity" in k:
            entity = self.scalar(k["entity"][1], (str,), "an entity template string",
                                 f"{where}.entity")
            if entity is not None:
                self.template(k["entity"][1], entity, f"{where}.entity")
                if spec is not None and (spec.scope is Scope.NODE) != (entity == ""):
                    need = ("its entity must be \"\"" if spec.scope is Scope.NODE
                            else "its entity must not be empty")
                    self.err(k["entity"][1], f"{where}.entity: signal {signal} has scope "
                             f"{spec.scope.value}: {need}")
        scale = 1.0
        if "scale" in k:
            s = self.scalar(k["scale"][1], (int, float), "a number", f"{where}.scale")
            if s is not None:
                if s == 0:
                    self.err(k["scale"][1], f"{where}.scale: must not be 0")
                scale = float(s)
        bits = None
        if "bits" in k:
            bits = self.scalar(k["bits"][1], (int,), "a positive integer bit mask (e.g. 0x8)",
                               f"{where}.bits")
            if bits is not None and bits <= 0:
                self.err(k["bits"][1], f"{where}.bits: must be a positive bit mask")
            if "scale" in k:
                self.err(k["bits"][0], f"{where}: bits and scale cannot be combined")
        where_t: tuple[tuple[str, str], ...] = ()
        if "where" in k:
            wn = k["where"][1]
            wv = self.value(wn) if isinstance(wn, yaml.MappingNode) else None
            if not isinstance(wv, dict) or not all(isinstance(a, str) and _LABEL.match(a)
                                                   and isinstance(b, str) for a, b in wv.items()):
                self.err(wn, f"{where}.where: expected a map of label name → string value")
            else:
                where_t = tuple(sorted(wv.items()))
        default_combine = "sum" if spec is not None and spec.kind is Kind.COUNTER else "max"
        combine = default_combine
        if "combine" in k:
            c = self.scalar(k["combine"][1], (str,), f"one of {', '.join(COMBINES)}",
                            f"{where}.combine")
            if c is not None and c not in COMBINES:
                self.err(k["combine"][1], f"{where}.combine: {c!r} is not one of {', '.join(COMBINES)}")
            elif c is not None:
                combine = c
        if len(self.errors) != n_before or metric is None or signal is None or entity is None:
            return None
        return Rule(metric, signal, entity, scale, bits, where_t, combine, node.start_mark.line + 1)

    def template(self, node: yaml.Node, text: str, where: str) -> None:
        try:
            parts = list(string.Formatter().parse(text))
        except ValueError as e:
            self.err(node, f"{where}: bad template {text!r}: {e}")
            return
        for _, fname, spec, conv in parts:
            if fname is None:
                continue
            if not _LABEL.match(fname) or spec or conv:
                self.err(node, f"{where}: {{{fname}}} must name a label, as in \"gpu{{gpu}}\"")

    def cross_check(self, rules: list[Rule]) -> None:
        """Rules sharing a signal must agree on how values are combined."""
        first: dict[str, Rule] = {}
        for r in rules:
            f = first.setdefault(r.signal, r)
            if f is not r and f.combine != r.combine:
                self.errors.append(
                    f"{self.name}:{r.line}:1: rules for {r.signal} disagree on combine "
                    f"({f.combine!r} at line {f.line}, {r.combine!r} here)")
