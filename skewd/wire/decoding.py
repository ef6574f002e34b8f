"""Strict decoding of the agents' messages (finding, summary, health) from bytes or dicts.

:func:`decode` is what a consumer calls: bounded JSON, a known kind and supported schema, every
field type- and range-checked, a finding's derived id and fingerprint compared with its body,
and every failure a :class:`~skewd.wire.base.WireError` naming the field. Summaries go through
their fast paths first (:mod:`skewd.wire.fastsummary`) when the payload has the plain shape
agents send.
"""
from __future__ import annotations

from enum import Enum
from typing import Any, Mapping

from skewd.model import SCHEMA_VERSION as FINDING_SCHEMA_VERSION
from skewd.model import Finding, Layer, Scope, Severity, State

from .base import BINARY_MAGIC, WIRE_SCHEMA, MessageKind, WireError
from .binsummary import LayoutBook, decode_binary_summary
from .fastsummary import TypedSummary, fast_summary, typed_struct, typed_summary
from .messages import (ClockHealth, ClockSync, CollectorHealth, Health, ReloadStatus, RulesHealth, Summary,
                       WireMessage)
from .reader import MAX_TIME, FieldReader, check_header, decode_totally, is_finite_number, load_json, show_value


def summary_view(data: bytes | str) -> "Summary | TypedSummary":
    """A summary for a reader that only reads its attributes (the controller's hot path): the
    msgspec object itself when the typed decoder takes the payload (the same fields, names and
    values as the :class:`Summary` :func:`decode_summary` would build, without building it),
    else :func:`decode_summary`'s result or error."""
    m = typed_struct(data)
    return m if m is not None else decode(data, MessageKind.SUMMARY)  # type: ignore[return-value]


def summary_from_dict(d: Mapping[str, Any]) -> Summary:
    """A summary from its JSON object; every problem raises :class:`WireError`."""
    fast = fast_summary(d)
    return fast if fast is not None else decode_totally("summary", _strict_summary_from_dict, d)


def _strict_summary_from_dict(d: Mapping[str, Any]) -> Summary:
    check_header(d, MessageKind.SUMMARY, WIRE_SCHEMA)
    r = FieldReader(d, "summary")
    sig = r.obj("signals")
    signals: dict[str, dict[str, float | None]] = {}
    for name in sig.d:
        ents = sig.obj(name)
        signals[name] = {e: ents.num(e, optional=True) for e in ents.d}
    cs = r.obj("clock_sync")
    return Summary(node=r.name("node"), cluster=r.name("cluster"), t=r.time("t"),  # type: ignore[arg-type]
                   interval=r.num("interval", lo=0.0),  # type: ignore[arg-type]
                   signals=signals,
                   clock_sync=ClockSync(synced=cs.boolean("synced"),
                                        max_error_s=cs.num("max_error_s", optional=True, lo=0.0, hi=MAX_TIME)),
                   agent_version=r.text("agent_version"), labels=r.names("labels"),
                   schema=WIRE_SCHEMA)


def health_from_dict(d: Mapping[str, Any]) -> Health:
    """A health report from its JSON object; every problem raises :class:`WireError`."""
    return decode_totally("health", _health_from_dict, d)


def _health_from_dict(d: Mapping[str, Any]) -> Health:
    check_header(d, MessageKind.HEALTH, WIRE_SCHEMA)
    r = FieldReader(d, "health")
    cols = r.obj("collectors")
    collectors = {}
    for name in cols.d:
        c = cols.obj(name)
        collectors[name] = CollectorHealth(state=c.name("state"), reason=c.text("reason", default=""))
    rules = r.obj("rules")
    inactive = rules.obj("inactive", optional=True)
    weakened = rules.obj("clock_weakened", optional=True)
    ctl = rules.d.get("controller") or []
    if not isinstance(ctl, list) or not all(isinstance(x, str) for x in ctl):
        raise WireError("health.rules.controller: expected a list of rule ids")
    rl = r.obj("last_reload")
    drops = r.obj("drops")
    clock = None
    if d.get("clock") is not None:
        c = r.obj("clock")
        clock = ClockHealth(synced=c.boolean("synced"), max_error_s=c.num("max_error_s", optional=True),
                            source=c.text("source", default=""))
    return Health(
        node=r.name("node"), cluster=r.name("cluster"), t=r.time("t"),  # type: ignore[arg-type]
        collectors=collectors,
        rules=RulesHealth(active=rules.integer("active", lo=0), inactive={k: inactive.text(k) for k in inactive.d},
                          controller=list(ctl), clock_weakened={k: weakened.text(k) for k in weakened.d}),
        last_reload=ReloadStatus(ok=rl.boolean("ok"), error=rl.text("error", default=""), t=rl.time("t", optional=True)),
        spool_depth=r.integer("spool_depth", lo=0), drops={k: drops.integer(k, lo=0) for k in drops.d},
        agent_version=r.text("agent_version"), clock=clock, schema=WIRE_SCHEMA)


def finding_from_dict(d: Mapping[str, Any]) -> Finding:
    """A finding from its JSON object, every field type- and range-checked and the derived
    ``id``/``fingerprint`` compared with the body; every problem raises :class:`WireError`."""
    return decode_totally("finding", _finding_from_dict, d)


def _enum(r: FieldReader, key: str, cls: type[Enum]) -> Any:
    v = r.text(key)
    try:
        return cls(v)
    except ValueError:
        raise WireError(f"{r.where}: field {key!r} is {show_value(v)}, not one of "
                        f"{', '.join(str(m.value) for m in cls)}") from None  # type: ignore[attr-defined]


MATURITIES = ("", "stable", "incubating", "sandbox")


def _maturity(r: FieldReader) -> str:
    """A finding's optional maturity tag (docs/rules.md, Maturity): one of the rule tags, or
    empty (an agent older than the field; the controller then takes its own rule's tag)."""
    v = r.text("maturity", default="")
    if v not in MATURITIES:
        raise WireError(f"{r.where}: field 'maturity' is {show_value(v)}, not one of stable, incubating, sandbox")
    return v


def _finding_from_dict(d: Mapping[str, Any]) -> Finding:
    check_header(d, MessageKind.FINDING, FINDING_SCHEMA_VERSION)
    r = FieldReader(d, "finding")
    evidence = r.obj("evidence", optional=True)
    params = r.obj("params", optional=True)
    pv: dict[str, Any] = {}
    for k, v in params.d.items():
        if type(v) is str or type(v) is bool:
            pv[k] = v
        elif is_finite_number(v):
            pv[k] = v
        else:
            raise WireError(f"finding.params: {k!r} must be a finite number, a string or a boolean, "
                            f"got {type(v).__name__} {show_value(v)}")
    f = Finding(
        rule_id=r.name("rule_id"), pathology=r.name("pathology"), severity=_enum(r, "severity", Severity),
        layer=_enum(r, "layer", Layer), scope=_enum(r, "scope", Scope), node=r.name("node"),
        entity=r.name("entity"), state=_enum(r, "state", State),
        active_at=r.time("active_at"), evaluated_at=r.time("evaluated_at"),  # type: ignore[arg-type]
        fired_at=r.time("fired_at", optional=True), resolved_at=r.time("resolved_at", optional=True),
        labels=r.names("labels"), evidence={k: evidence.num(k, optional=True) for k in evidence.d},
        params=pv, mitigation=r.text("mitigation", default=""), summary=r.text("summary", default=""),
        cluster=r.name("cluster", default=""), maturity=_maturity(r), schema=FINDING_SCHEMA_VERSION)
    for key in ("id", "fingerprint"):  # derived fields: a mismatch means a tampered or foreign body
        if key in d and d[key] != getattr(f, key):
            raise WireError(f"finding: field {key!r} is {show_value(d[key])} but the body derives {getattr(f, key)!r}")
    return f


_DECODERS = {
    MessageKind.FINDING: finding_from_dict,
    MessageKind.SUMMARY: summary_from_dict,
    MessageKind.HEALTH: health_from_dict,
}


def decode(data: bytes | str, expect: MessageKind | str | None = None) -> WireMessage:
    """Parse a payload strictly: bounded JSON (:func:`load_json`: size, depth, no NaN), a
    JSON object, known ``kind`` (or ``expect``), supported ``schema``, required fields present
    with the right types and finite, in-range numbers. *Every* failure raises
    :class:`WireError` (:class:`SchemaVersionError` for a version mismatch) with a message
    naming the field, so a consumer catching WireError is never stopped by a payload.

    A binary summary (:mod:`skewd.wire.binsummary`) is read when it carries its layout
    (:class:`~skewd.wire.binsummary.LayoutUnknownError` otherwise: a stream of them is read
    with a :class:`~skewd.wire.binsummary.BinarySummaryReader`, which learns the layouts)."""
    if not isinstance(data, str) and data[:3] == BINARY_MAGIC and (expect is None or expect == MessageKind.SUMMARY):
        return decode_binary_summary(data)
    d = load_json(data)
    if not isinstance(d, dict):
        raise WireError(f"payload must be a JSON object, got {type(d).__name__}")
    if expect is not None:
        kind = MessageKind(expect)
    else:
        raw = d.get("kind")
        try:
            kind = MessageKind(raw)
        except (ValueError, TypeError):
            raise WireError(f"payload has unknown or missing kind {show_value(raw)}") from None
    dec = _DECODERS.get(kind)
    if dec is None:
        raise WireError(f"no decoder for {kind.value} messages in this module")
    return dec(d)


def decode_finding(data: bytes | str) -> Finding:
    return decode(data, MessageKind.FINDING)  # type: ignore[return-value]


def decode_summary(data: bytes | str) -> Summary:
    """:func:`decode` of a summary, through the typed C decoder when the payload has the plain
    shape agents send (:func:`_typed_summary`; same result, a quarter of the time)."""
    fast = typed_summary(data)
    return fast if fast is not None else decode(data, MessageKind.SUMMARY)  # type: ignore[return-value]


class BinarySummaryReader:
    """Reads a stream of summaries in either encoding, learning binary summaries' layouts as
    they come (:mod:`skewd.wire.binsummary`): what a subscriber other than the controller uses
    (the client library)."""

    def __init__(self) -> None:
        self.book = LayoutBook()

    def read(self, data: bytes) -> Summary:
        if data[:3] == BINARY_MAGIC:
            return decode_binary_summary(data, self.book)
        return decode_summary(data)


def decode_health(data: bytes | str) -> Health:
    return decode(data, MessageKind.HEALTH)  # type: ignore[return-value]
