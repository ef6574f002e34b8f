"""How replay prints what it found: one line per finding transition, incident publication or
remap suggestion, as a table or as canonical JSON lines.

Every format here is deterministic (sorted keys, Python's shortest round-trip floats, NaN and
infinities as ``null``): the same replay prints the same bytes.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
from typing import Any

from skewd.controller import messages as controller_messages
from skewd.model import Finding


def clean(v: Any) -> Any:
    """JSON-able with a fixed form: non-finite floats as None, -0.0 as 0.0."""
    if isinstance(v, float):
        if not math.isfinite(v):
            return None
        return 0.0 if v == 0 else v
    if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
    return v


def canonical_json(d: Any) -> str:
    return json.dumps(clean(d), sort_keys=True, separators=(",", ":"), allow_nan=False)


def finding_json(f: Finding) -> str:
    """One canonical JSON line: sorted keys, no spaces, floats in Python's shortest round-trip
    form (a fixed rule, so equal findings print equal bytes), NaN/inf as null."""
    return canonical_json(f.to_dict())


def incident_json(inc: controller_messages.Incident) -> str:
    """An incident message as published (``"kind": "incident"``)."""
    return canonical_json(inc.to_dict())


def suggestion_json(s: controller_messages.RemapSuggestion) -> str:
    """A remap suggestion as published (``"kind": "remap"``)."""
    return canonical_json(s.to_dict())


def utc(t: float) -> _dt.datetime | None:
    """``t`` (Unix seconds) as a UTC datetime; None when no calendar date holds it (a damaged
    capture's time of 1e30 s is beyond year 9999 and the platform's time_t)."""
    try:
        return _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None


def fmt_t(t: float | None) -> str:
    """``2023-11-14T22:13:33.000Z`` (UTC, milliseconds); ``-`` for none; the number itself
    (``t=1e+30``) for a time no date holds."""
    if t is None or not math.isfinite(t):
        return "-"
    d = utc(t)
    if d is None:
        return f"t={t:g}"
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


TABLE_HEADER = f"{'TIME (UTC)':24}  {'STATE':8}  {'SEVERITY':8}  {'RULE':28}  {'NODE':14}  {'ENTITY':16}  SUMMARY"


def finding_row(f: Finding) -> str:
    ent = f.entity or "-"
    return (f"{fmt_t(f.evaluated_at):24}  {f.state.value:8}  {f.severity.value:8}  {f.rule_id:28}  "
            f"{f.node:14}  {ent:16}  {f.summary}")


def incident_row(inc: controller_messages.Incident) -> str:
    """``incident`` in the state column, the incident's state (open, resolved, inhibited) in the
    severity column, its pathology and rule, the culprit (or the first victim) and its summary."""
    where = inc.culprit.node if inc.culprit is not None and inc.culprit.node else ",".join(inc.victims[:3])
    ent = (inc.culprit.entity if inc.culprit is not None else "") or "-"
    state = "inhibit" if inc.state == "inhibited" else inc.state
    return (f"{fmt_t(inc.updated_at):24}  {'incident':8}  {state:8}  {inc.pathology + ' ' + inc.rule_id:28}  "
            f"{where:14}  {ent:16}  {inc.summary}")


def suggestion_row(s: controller_messages.RemapSuggestion) -> str:
    """``suggest`` in the state column, the confidence in the severity column, then the actions
    (type → target node), least disruptive first."""
    where = s.culprit.node if s.culprit is not None and s.culprit.node else "-"
    ent = (s.culprit.entity if s.culprit is not None else "") or "-"
    acts = ", ".join(f"{a.type.value}→{a.target.node or a.target.tp_group or '-'} ({a.confidence:.2f})"
                     for a in s.actions)
    return (f"{fmt_t(s.created_at):24}  {'suggest':8}  {s.confidence:<8.2f}  {s.pathology + ' ' + s.incident:28}  "
            f"{where:14}  {ent:16}  {acts}")
