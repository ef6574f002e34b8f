"""Reading JSON nobody vouches for: bounded parsing and typed field access.

Every skewd consumer (the controller's NATS callbacks, KV state, replay files) reads payloads a
misbehaving or hostile producer may have written. The rule is that *every* failure is a
:class:`~skewd.wire.base.WireError` naming the field, never another exception and never an
unbounded cost: :func:`load_json` refuses oversize, over-deep and non-finite input before it is
parsed, :class:`FieldReader` checks each field's type and range, :func:`decode_totally` turns
anything else into a WireError. The message decoders (:mod:`skewd.wire.decoding`) and the
controller's own messages (:mod:`skewd.controller.messages`) are built from these.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping

from .base import BINARY_MAGIC, MessageKind, SchemaVersionError, WireError

#: Largest payload any decoder reads: the streams' ``max_msg_size`` and NATS's default
#: ``max_payload`` (1 MiB). A larger body is refused before it is parsed.
MAX_PAYLOAD_BYTES = 1 << 20
#: Deepest JSON nesting a decoder accepts. Every skewd message is at most 4 levels deep
#: (a phase record's steps); 16 leaves room for fields added within schema 1 and stops a
#: 50,000-level payload before a single object is built.
MAX_JSON_DEPTH = 16
#: Longest identifier (node, cluster, rule id, pathology, entity, label value) accepted: a
#: DNS host name is at most 253 characters; flow entities and model paths fit as well.
MAX_NAME_CHARS = 256
#: Times are seconds since the epoch: finite, not negative, and before year 5138 (1e11 s).
#: Whether a time is *plausible* (near the reader's clock) is the reader's call: the
#: controller checks ``ingest.max_clock_skew``; a replay reads recorded times.
MAX_TIME = 1e11
#: Integers beyond int64 are refused (``float()`` of 10**400 overflows; no counter gets there).
MAX_INT = 1 << 63

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
#: bytes.translate tables for the depth check: brackets become "(" / ")", quotes stay, the rest goes
_PARENS = bytes.maketrans(b"[{]}", b"(())")
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')


def _reject_constant(name: str) -> Any:
    raise WireError(f"payload holds {name}, which JSON does not allow (numbers must be finite)")


#: one decoder for every payload (json.loads with an argument would build one per call)
_JSON = json.JSONDecoder(parse_constant=_reject_constant)


def json_depth_exceeds(raw: bytes, max_depth: int) -> bool:
    """Whether the JSON text ``raw`` nests arrays/objects deeper than ``max_depth`` (or its
    brackets do not balance), found without building anything and in C-speed passes: strings
    are set aside, brackets kept, and innermost pairs removed once per level. About 8 µs for
    a 2 kB summary; a 1 MiB bracket bomb stops after ``max_depth`` passes."""
    if b"\\" in raw:  # escaped quotes: blank every string exactly (slower, and rare)
        raw = _JSON_STRING.sub(b'""', raw)
    small = raw.translate(_PARENS, _NOT_STRUCTURE)  # only '"', '(' and ')' left
    if small.count(b"(") <= max_depth:
        return False
    rest = small.replace(b'""', b"")
    if b'"' in rest:  # a string held brackets: drop every string's content exactly
        rest = b"".join(small.split(b'"')[0::2])
    for _ in range(max_depth + 1):
        if not rest:
            return False
        rest = rest.replace(b"()", b"")
    return True


def load_json(data: bytes | str, *, max_bytes: int = MAX_PAYLOAD_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` bounded for input nobody vouches for: at most ``max_bytes``, nesting at
    most ``max_depth`` (checked before parsing), no ``NaN``/``Infinity`` literals, and every
    failure (bad UTF-8, bad JSON, a 5,000-digit integer, ...) raised as :class:`WireError`."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise WireError(f"payload is {len(raw)} bytes; the limit is {max_bytes}")
    if raw[:3] == BINARY_MAGIC:
        raise WireError("payload is a binary summary, not JSON (docs/wire.md, Binary summaries)")
    if json_depth_exceeds(raw, max_depth):
        raise WireError(f"payload nests deeper than {max_depth} levels (or its brackets do not balance)")
    try:
        return _JSON.decode(raw.decode("utf-8"))
    except WireError:
        raise
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WireError(f"payload is not JSON: {e}") from None
    except Exception as e:  # noqa: BLE001 - e.g. ValueError for an integer over 4300 digits
        raise WireError(f"payload is not readable JSON: {type(e).__name__}: {e}") from None


def is_finite_number(v: Any) -> bool:
    """An exact int (not bool) within int64, or a finite float."""
    t = type(v)
    if t is float:
        return v - v == 0.0  # False for inf and NaN
    return t is int and -MAX_INT <= v <= MAX_INT


def decode_totally(kind: str, fn: Any, d: Any) -> Any:
    """Run a decoder so that *every* failure is a :class:`WireError`: a consumer that catches
    WireError can then never be stopped by a message, whatever shape it has."""
    try:
        return fn(d)
    except WireError:
        raise
    except Exception as e:  # noqa: BLE001 - by design: no message may raise anything else
        raise WireError(f"{kind}: malformed: {type(e).__name__}: {str(e)[:200]}") from None


def show_value(v: Any) -> str:
    """A short, safe rendering of a bad value for an error message (never raises)."""
    try:
        if type(v) is int and abs(v) > MAX_INT:
            return f"an integer of {len(str(abs(v)))} digits"
        return f"{v!r:.60}"
    except Exception:  # noqa: BLE001 - e.g. an int too long to print
        return "(unprintable)"


class FieldReader:
    """Typed field access with errors that name the message kind and the field path."""

    def __init__(self, d: Any, where: str) -> None:
        if not isinstance(d, Mapping):
            raise WireError(f"{where}: expected a JSON object, got {type(d).__name__}")
        self.d = d
        self.where = where

    def _get(self, key: str, optional: bool) -> Any:
        if key not in self.d:
            if optional:
                return None
            raise WireError(f"{self.where}: missing field {key!r}")
        return self.d[key]

    def _fail(self, key: str, want: str, v: Any) -> WireError:
        return WireError(f"{self.where}: field {key!r} must be {want}, got {type(v).__name__} {show_value(v)}")

    def text(self, key: str, default: str | None = None) -> str:
        v = self._get(key, default is not None)
        if v is None and default is not None:
            return default
        if not isinstance(v, str):
            raise self._fail(key, "a string", v)
        return v

    def name(self, key: str, default: str | None = None) -> str:
        """An identifier (node, cluster, rule id, entity): a string of at most MAX_NAME_CHARS."""
        v = self.text(key, default)
        if len(v) > MAX_NAME_CHARS:
            raise WireError(f"{self.where}: field {key!r} is {len(v)} characters long; at most "
                            f"{MAX_NAME_CHARS} are accepted")
        return v

    def num(self, key: str, optional: bool = False, lo: float = -math.inf, hi: float = math.inf) -> float | None:
        """A finite number in [lo, hi] (``null`` allowed when ``optional``)."""
        v = self._get(key, optional)
        if v is None and optional:
            return None
        if not is_finite_number(v):
            raise self._fail(key, "a finite number", v)
        f = float(v)
        if not lo <= f <= hi:
            raise self._fail(key, f"a number in [{lo:g}, {hi:g}]", v)
        return f

    def time(self, key: str, optional: bool = False) -> float | None:
        """Seconds since the epoch: finite, in [0, MAX_TIME]."""
        return self.num(key, optional, 0.0, MAX_TIME)

    def integer(self, key: str, lo: int = -MAX_INT, hi: int = MAX_INT) -> int:
        v = self._get(key, False)
        if type(v) is not int or not lo <= v <= hi:
            raise self._fail(key, f"an integer in [{lo}, {hi}]", v)
        return v

    def boolean(self, key: str) -> bool:
        v = self._get(key, False)
        if not isinstance(v, bool):
            raise self._fail(key, "true or false", v)
        return v

    def obj(self, key: str, optional: bool = False) -> "FieldReader":
        v = self._get(key, optional)
        return FieldReader({} if v is None else v, f"{self.where}.{key}")

    def names(self, key: str) -> dict[str, str]:
        """An optional object of identifiers (labels): string keys and values, each bounded.
        A missing or empty value (``null``, ``[]``, ``""``) means no labels, as it always has."""
        o = FieldReader(self.d.get(key) or {}, f"{self.where}.{key}")
        for k in o.d:
            o.name(k)
            if len(k) > MAX_NAME_CHARS:
                raise WireError(f"{o.where}: a key of {len(k)} characters; at most {MAX_NAME_CHARS}")
        return {str(k): v for k, v in o.d.items()}


def check_header(d: Any, kind: MessageKind, version: int) -> None:
    if not isinstance(d, Mapping):
        raise WireError(f"{kind.value}: expected a JSON object, got {type(d).__name__}")
    schema = d.get("schema")
    if type(schema) is not int or schema != version:
        raise SchemaVersionError(
            f"{kind.value} message has schema {show_value(schema)}; this skewd reads schema {version} only "
            f"(producer and consumer run incompatible skewd versions: upgrade the older side)")
    got = d.get("kind", kind.value if kind is MessageKind.FINDING else None)
    if got != kind.value:
        raise WireError(f"expected a {kind.value} message, got kind {show_value(got)}")
