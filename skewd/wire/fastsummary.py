"""The summary's fast paths: the one message every node sends every interval, read in a
fraction of the strict reader's time, with the same result.

Two paths, each of which either returns exactly what the strict reader
(:func:`skewd.wire.decoding.summary_from_dict`) would, or None and leaves the payload to it, so
what is accepted, refused and how an error is worded never depends on the path:
:func:`fast_summary` checks a ``json.loads`` dict with exact type tests, and :func:`typed_summary`
decodes and validates the bytes in one C pass (msgspec). tests/test_wire.py compares both with
the strict reader on arbitrary JSON.
"""
from __future__ import annotations

from typing import Annotated, Any, Mapping, Optional

import msgspec

from .base import WIRE_SCHEMA
from .messages import ClockSync, Summary
from .reader import MAX_INT, MAX_NAME_CHARS, MAX_PAYLOAD_BYTES, MAX_TIME, is_finite_number

_NUMBER = (int, float)  # exact types: bool (an int subclass) is not a number on the wire


def fast_summary(d: Mapping[str, Any]) -> Summary | None:
    """:func:`summary_from_dict` for the shape every agent sends (plain dicts and lists as
    ``json.loads`` makes them, every field of the right type and range), with exact ``type``
    checks instead of ABC ``isinstance`` calls. None for anything else, valid or not: the
    strict reader then decides and words the error, so bad input fails exactly as before."""
    if type(d) is not dict or d.get("schema") != WIRE_SCHEMA or type(d.get("schema")) is not int \
            or d.get("kind") != "summary":
        return None
    sig = d.get("signals")
    cs = d.get("clock_sync")
    node, cluster, version = d.get("node"), d.get("cluster"), d.get("agent_version")
    t, interval = d.get("t"), d.get("interval")
    if (type(sig) is not dict or type(cs) is not dict or type(node) is not str or type(cluster) is not str
            or type(version) is not str or type(t) not in _NUMBER or type(interval) not in _NUMBER
            or len(node) > MAX_NAME_CHARS or len(cluster) > MAX_NAME_CHARS
            or not 0.0 <= t <= MAX_TIME or not is_finite_number(interval) or interval < 0):
        return None
    synced = cs.get("synced")
    err = cs.get("max_error_s")
    if type(synced) is not bool or (err is not None and (type(err) not in _NUMBER or not 0.0 <= err <= MAX_TIME)):
        return None
    labels = d.get("labels") or {}
    if type(labels) is not dict:
        return None
    for k, v in labels.items():
        if type(v) is not str or len(v) > MAX_NAME_CHARS or len(k) > MAX_NAME_CHARS:
            return None
    signals: dict[str, dict[str, float | None]] = {}
    for name, ents in sig.items():
        if type(ents) is not dict:
            return None
        out = dict(ents)
        for e, v in ents.items():
            tv = type(v)
            if tv is float:
                if v - v != 0.0:  # inf or NaN (JSON's 1e400)
                    return None
                continue
            if v is None:
                continue
            if tv is not int or not -MAX_INT <= v <= MAX_INT:
                return None
            out[e] = float(v)
        signals[name] = out
    return Summary(node=node, cluster=cluster, t=float(t), interval=float(interval), signals=signals,
                   clock_sync=ClockSync(synced=synced, max_error_s=None if err is None else float(err)),
                   agent_version=version, labels={str(k): v for k, v in labels.items()}, schema=WIRE_SCHEMA)


_Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]


class _TypedClockSync(msgspec.Struct, forbid_unknown_fields=True):
    synced: bool
    max_error_s: Optional[Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TIME)]] = None


class TypedSummary(msgspec.Struct, forbid_unknown_fields=True):
    """A summary exactly as :func:`to_dict` writes it, typed for msgspec's C decoder. Unknown
    keys are *refused* here (not ignored): the strict reader then decides, so the nesting a
    payload can have on this path is the three levels of these types, and the strict reader's
    depth limit never has anything to catch."""

    schema: int
    kind: str
    node: _Name
    cluster: _Name
    t: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TIME)]
    interval: Annotated[float, msgspec.Meta(ge=0.0)]
    signals: dict[str, dict[str, Optional[float]]]
    clock_sync: _TypedClockSync
    agent_version: str
    labels: dict[_Name, _Name] = {}


_TYPED_SUMMARY = msgspec.json.Decoder(TypedSummary)
#: an integer literal that may not fit int64 (the strict reader refuses those; msgspec would
#: read it as a float): such payloads take the strict path
_DIGITS_AS_NINE = bytes.maketrans(b"012345678", b"999999999")
_LONG_DIGITS = b"9" * 19  # searched in the payload with every digit made a 9: two C passes, no regex


def _long_integer(raw: bytes) -> bool:
    """Whether ``raw`` may hold an integer literal of 19 digits or more (beyond int64, which
    the strict reader refuses and msgspec would read as a float). A run of digits after a
    ``.`` (a fraction: ``0.00012345678901234567``) or before ``.``/``e`` (a float) is not one;
    anything else with such a run (a string, an exponent) is treated as one: the strict path
    then decides, which is only slower."""
    tr = raw.translate(_DIGITS_AS_NINE)
    i = tr.find(_LONG_DIGITS)
    while i >= 0:
        j = i
        while j > 0 and tr[j - 1] == 57:  # b"9"
            j -= 1
        k = i + 19
        while k < len(tr) and tr[k] == 57:
            k += 1
        if tr[j - 1:j] != b"." and tr[k:k + 1] not in (b".", b"e", b"E"):
            return True
        i = tr.find(_LONG_DIGITS, k)
    return False


def typed_struct(data: bytes | str) -> "TypedSummary | None":
    raw = data if type(data) is bytes else (data.encode("utf-8", "surrogatepass") if isinstance(data, str)
                                             else bytes(data))
    if len(raw) > MAX_PAYLOAD_BYTES or not raw.isascii() or _long_integer(raw):
        return None
    try:
        m = _TYPED_SUMMARY.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError):
        return None
    if m.schema != WIRE_SCHEMA or m.kind != "summary":
        return None
    return m


def typed_summary(data: bytes | str) -> Summary | None:
    """The summary in ``data`` decoded and validated in one C pass (msgspec), or None when the
    payload is anything but the plain shape agents send: then :func:`decode` decides, so what
    is accepted, refused and how an error is worded never depends on the path. None for
    non-ASCII text (UTF-8 edge cases are the strict reader's), 19-digit numbers (int64 bound),
    unknown keys (see :class:`TypedSummary`), a wrong ``schema``/``kind`` and every msgspec
    error. Four times faster than ``json.loads`` plus the checks, for the same result
    (tests/test_wire.py compares the two on arbitrary JSON)."""
    m = typed_struct(data)
    if m is None:
        return None
    cs = m.clock_sync
    return Summary(node=m.node, cluster=m.cluster, t=m.t, interval=m.interval, signals=m.signals,
                   clock_sync=ClockSync(synced=cs.synced, max_error_s=cs.max_error_s),
                   agent_version=m.agent_version, labels=m.labels, schema=WIRE_SCHEMA)
