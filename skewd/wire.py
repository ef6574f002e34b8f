"""Wire contract between agents, the controller and client libraries: NATS subjects, JetStream
stream definitions and the typed messages that travel on them.

Defined once here and imported by every side, so an agent and a controller built from the same
skewd agree by construction, and one built from another release fails loudly (``schema``)
instead of misreading data. ``docs/wire.md`` is the long-form description of the same contract.

Subjects (``<...>`` are tokens made safe with :func:`token`)::

    skewd.v1.finding.<cluster>.<node>.<rule>     JetStream SKEWD_FINDINGS (durable, de-duplicated)
    skewd.v1.remap.<cluster>                     JetStream SKEWD_REMAPS   (durable, de-duplicated)
    skewd.v1.summary.<cluster>.<node>            core NATS, best effort
    skewd.v1.health.<cluster>.<node>             core NATS, best effort
    skewd.v1.phase.<cluster>.<node>.<engine>     core NATS, best effort (vLLM plugin steps)

Why two delivery classes: a finding is a state transition (pending → firing → resolved). Losing
one leaves the controller believing something false until the next transition, which may never
come, so findings are stored (JetStream, file storage) and published with ``Nats-Msg-Id`` =
:attr:`skewd.model.Finding.event_id` so re-sends after an outage or crash are dropped by the
server's duplicate window. Summaries, health and phase records are periodic snapshots: each one
supersedes the last, they are the high-rate traffic (every node, every interval), and a
missing one is detected as staleness by the consumer. Storing them would cost disk and an
acknowledgement round-trip per message for data nobody replays (capture bundles exist for
replay), so they go over core NATS and are dropped, counted, while disconnected.

The version lives in the subject (``v1``) *and* in every payload (``schema``): the subject lets
a v1 and a future v2 controller subscribe side by side during a rolling upgrade; the payload
field lets a reader refuse a message it cannot parse even when it arrived some other way
(replay files, KV). Within one schema version fields are only ever *added*, optional, and
readers ignore keys they do not know; any change of meaning or type bumps ``schema``.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Union

from skewd.model import SCHEMA_VERSION as FINDING_SCHEMA_VERSION
from skewd.model import Finding, Layer, Scope, Severity, State

#: Schema version of the messages defined in this module (Summary, Health). Findings carry
#: :data:`skewd.model.SCHEMA_VERSION`; both are 1 today and bump independently.
WIRE_SCHEMA = 1

#: Root of every skewd subject. The ``v1`` token is the subject-space version (see module doc).
SUBJECT_PREFIX = "skewd.v1"

#: Header carrying the JetStream de-duplication id (server-defined name).
HDR_MSG_ID = "Nats-Msg-Id"
#: Headers we add so a consumer can route or refuse a message without parsing its body.
HDR_KIND = "Skewd-Kind"
HDR_SCHEMA = "Skewd-Schema"


class MessageKind(str, Enum):
    """What a message is; also the third subject token."""

    FINDING = "finding"
    SUMMARY = "summary"
    HEALTH = "health"
    REMAP = "remap"
    PHASE = "phase"


#: The variable tokens after ``skewd.v1.<kind>`` for each kind, in subject order.
SUBJECT_TOKENS: dict[MessageKind, tuple[str, ...]] = {
    MessageKind.FINDING: ("cluster", "node", "rule"),
    MessageKind.SUMMARY: ("cluster", "node"),
    MessageKind.HEALTH: ("cluster", "node"),
    MessageKind.REMAP: ("cluster",),
    MessageKind.PHASE: ("cluster", "node", "engine"),
}


class WireError(ValueError):
    """A message or subject that does not follow this contract (bad JSON, missing field, ...)."""


class SchemaVersionError(WireError):
    """A message from a different schema version than this skewd reads."""


# --------------------------------------------------------------------------------------------
# Subject tokens
# --------------------------------------------------------------------------------------------

_SAFE = re.compile(r"[A-Za-z0-9_-]")
_SAFE_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPED = re.compile(r"(?:%[0-9A-F]{2}|[A-Za-z0-9_-])+")

#: The token that stands for the empty string (a NATS token cannot be empty).
EMPTY_TOKEN = "%"


def token(value: str) -> str:
    """Map any string to one safe NATS subject token, reversibly (:func:`untoken`).

    NATS splits subjects on ``.``, treats ``*`` and ``>`` as wildcards, forbids whitespace and
    reserves a leading ``$``; tools and ACLs are happiest with ``[A-Za-z0-9_-]``. So those
    characters pass through unchanged (``GPU-2-kv-saturation``, ``node-17``, ``gpu_0``) and
    every other character is percent-encoded as the ``%XX`` (upper-case hex) of each of its
    UTF-8 bytes, ``%`` itself included: ``node.1`` → ``node%2E1``,
    ``meta-llama/Llama-3-8B/0`` → ``meta-llama%2FLlama-3-8B%2F0``. The empty string becomes a
    lone ``%`` (no encoding produces it otherwise).

    The mapping is deterministic and injective: equal inputs give equal tokens, different
    inputs different tokens, so a subscriber can build a filter from a raw name with the same
    function. Case is preserved (NATS subjects are case-sensitive).
    """
    if not isinstance(value, str):
        raise TypeError(f"subject token must be a str, got {type(value).__name__}")
    if value == "":
        return EMPTY_TOKEN
    if _SAFE_TOKEN.fullmatch(value):
        return value
    out = []
    for ch in value:
        if _SAFE.fullmatch(ch):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def untoken(tok: str) -> str:
    """Inverse of :func:`token`. Raises :class:`WireError` on a token :func:`token` cannot produce."""
    if tok == EMPTY_TOKEN:
        return ""
    if not _ESCAPED.fullmatch(tok):
        raise WireError(f"subject token {tok!r} is not in skewd's escaped form ([A-Za-z0-9_-] and %XX)")
    if "%" not in tok:
        return tok
    raw = bytearray()
    i = 0
    while i < len(tok):
        if tok[i] == "%":
            raw.append(int(tok[i + 1:i + 3], 16))
            i += 3
        else:
            raw.extend(tok[i].encode("ascii"))
            i += 1
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WireError(f"subject token {tok!r} does not decode to UTF-8: {e}") from None
    if token(text) != tok:  # e.g. '%41' for 'A': not what token() emits, so not canonical
        raise WireError(f"subject token {tok!r} is not canonical (token() would write {token(text)!r})")
    return text


# --------------------------------------------------------------------------------------------
# Subjects
# --------------------------------------------------------------------------------------------

def _subject(kind: MessageKind, *values: str) -> str:
    return ".".join((SUBJECT_PREFIX, kind.value, *(token(v) for v in values)))


def finding_subject(cluster: str, node: str, rule_id: str) -> str:
    """``skewd.v1.finding.<cluster>.<node>.<rule>``: per rule, so a consumer can filter on it."""
    return _subject(MessageKind.FINDING, cluster, node, rule_id)


def summary_subject(cluster: str, node: str) -> str:
    """``skewd.v1.summary.<cluster>.<node>``."""
    return _subject(MessageKind.SUMMARY, cluster, node)


def health_subject(cluster: str, node: str) -> str:
    """``skewd.v1.health.<cluster>.<node>``."""
    return _subject(MessageKind.HEALTH, cluster, node)


def remap_subject(cluster: str) -> str:
    """``skewd.v1.remap.<cluster>``: the controller's remap actions for one cluster."""
    return _subject(MessageKind.REMAP, cluster)


def phase_subject(cluster: str, node: str, engine: str) -> str:
    """``skewd.v1.phase.<cluster>.<node>.<engine>``: per-step phase records from the vLLM plugin."""
    return _subject(MessageKind.PHASE, cluster, node, engine)


def subject_filter(kind: MessageKind | str, **values: str | None) -> str:
    """A subscription filter for ``kind``: named tokens given are pinned (raw names, escaped
    here), the rest are ``*``. ``subject_filter("finding", cluster="prod")`` →
    ``skewd.v1.finding.prod.*.*``. Unknown token names are an error, not a silent wildcard.
    """
    kind = MessageKind(kind)
    names = SUBJECT_TOKENS[kind]
    unknown = set(values) - set(names)
    if unknown:
        raise WireError(f"{kind.value} subjects have tokens {names}, not {sorted(unknown)}")
    parts = [SUBJECT_PREFIX, kind.value]
    parts += ["*" if values.get(n) is None else token(values[n]) for n in names]  # type: ignore[arg-type]
    return ".".join(parts)


@dataclass(frozen=True)
class ParsedSubject:
    """A skewd subject split back into its kind and raw (unescaped) token values."""

    kind: MessageKind
    tokens: dict[str, str]

    def __getitem__(self, name: str) -> str:
        return self.tokens[name]


def parse_subject(subject: str) -> ParsedSubject:
    """Split ``skewd.v1.<kind>.<tokens...>`` into kind and raw values. Raises :class:`WireError`
    for anything that is not a concrete skewd v1 subject."""
    parts = subject.split(".")
    prefix = SUBJECT_PREFIX.split(".")
    if parts[:len(prefix)] != prefix or len(parts) < len(prefix) + 1:
        raise WireError(f"subject {subject!r} is not under {SUBJECT_PREFIX}.")
    try:
        kind = MessageKind(parts[len(prefix)])
    except ValueError:
        raise WireError(f"subject {subject!r}: unknown message kind {parts[len(prefix)]!r}") from None
    names = SUBJECT_TOKENS[kind]
    rest = parts[len(prefix) + 1:]
    if len(rest) != len(names):
        raise WireError(f"subject {subject!r}: {kind.value} subjects have {len(names)} tokens "
                        f"({'.'.join(names)}), got {len(rest)}")
    return ParsedSubject(kind, {n: untoken(v) for n, v in zip(names, rest)})


# --------------------------------------------------------------------------------------------
# JetStream streams
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StreamSpec:
    """A JetStream stream skewd relies on, as plain data (``skewd.natsutil.stream_config``
    turns it into a nats-py ``StreamConfig``). Limits are what an agent creates by default;
    an operator can raise them on the server, and :attr:`replicas` should match the cluster."""

    name: str
    subjects: tuple[str, ...]
    description: str
    #: "file" survives a server restart; "memory" does not.
    storage: str = "file"
    #: window in which a repeated ``Nats-Msg-Id`` is dropped by the server, seconds
    duplicate_window_s: float = 120.0
    max_age_s: float = 7 * 86400.0
    max_bytes: int = 1 << 30
    max_msgs: int = -1
    max_msg_size: int = 1 << 20
    #: at a limit, drop the oldest stored messages (never refuse a new finding)
    discard: str = "old"
    replicas: int = 1


#: Findings: every state transition of every rule on every node. Durable, de-duplicated on
#: ``Nats-Msg-Id`` for two minutes (longer than a publisher's retry backoff and a typical
#: agent restart, short enough that the server's id table stays small). Seven days of
#: history let a controller that was down over a weekend catch up from its durable consumer.
FINDINGS_STREAM = StreamSpec(
    name="SKEWD_FINDINGS",
    subjects=(f"{SUBJECT_PREFIX}.{MessageKind.FINDING.value}.>",),
    description="skewd findings (rule state transitions), one subject per cluster/node/rule",
    max_age_s=7 * 86400.0,
    max_bytes=1 << 30,
)

#: Remap actions planned by the controller: durable so an inference controller that
#: reconnects sees what it missed; a day is plenty, a stale remap must not be acted on later.
REMAPS_STREAM = StreamSpec(
    name="SKEWD_REMAPS",
    subjects=(f"{SUBJECT_PREFIX}.{MessageKind.REMAP.value}.>",),
    description="skewd remap actions planned by the controller, one subject per cluster",
    max_age_s=86400.0,
    max_bytes=256 << 20,
)

STREAMS: tuple[StreamSpec, ...] = (FINDINGS_STREAM, REMAPS_STREAM)

#: Kinds sent over core NATS, best effort (see module doc for why).
BEST_EFFORT_KINDS = frozenset({MessageKind.SUMMARY, MessageKind.HEALTH, MessageKind.PHASE})


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ClockSync:
    """How far this node's clock can be trusted: the controller joins timelines across nodes and
    must know when a 5 ms skew is real and when it is clock error."""

    synced: bool
    #: upper bound of the clock error in seconds (e.g. chrony/NTP max error); None = unknown
    max_error_s: float | None = None


@dataclass
class Summary:
    """One node's per-interval digest: the signals the controller compares across peers.

    ``signals`` maps signal name (catalogued, e.g. ``gpu_utilization_ratio``) to
    ``{entity: value}`` with entities named as in the catalogue (``gpu0``, ``mlx5_0/1``,
    ``""`` for node scope). Values are floats in the signal's base unit, already reduced over
    the interval (rates for counters); ``None`` means "no valid value this interval" (NaN and
    ±inf are sent as ``None`` because JSON has neither).
    """

    node: str
    cluster: str
    t: float  # end of the interval, seconds since the epoch (the agent's tick time)
    interval: float  # seconds covered by this summary
    signals: dict[str, dict[str, float | None]]
    clock_sync: ClockSync
    agent_version: str
    #: the node's labels from its config (tp_group, tp_rank, pp_group, pp_stage, model): the
    #: controller learns topology from them when its own config does not say (added in schema 1)
    labels: dict[str, str] = field(default_factory=dict)
    schema: int = WIRE_SCHEMA
    kind: MessageKind = field(default=MessageKind.SUMMARY, init=False)


@dataclass(frozen=True)
class CollectorHealth:
    """One collector's state: the values of ``skewd.collectors.base.Availability``
    (``active``, ``absent``, ``unavailable``, ``needs_operator``, ``disabled``) and the
    reason a user can act on."""

    state: str
    reason: str = ""


@dataclass(frozen=True)
class RulesHealth:
    """How many rules evaluate on this node, why each of the others does not, which ones the
    controller evaluates over the node summaries (not inactive: they run elsewhere), and which
    ones this node's clock weakens (see ``skewd.agent.rulestatus``)."""

    active: int
    inactive: dict[str, str] = field(default_factory=dict)  # rule id → reason
    controller: list[str] = field(default_factory=list)  # rule ids the controller evaluates
    clock_weakened: dict[str, str] = field(default_factory=dict)  # rule id → what the unsynced clock costs it


@dataclass(frozen=True)
class ClockHealth:
    """The node's clock discipline as the kernel reports it (adjtimex): the controller compares
    this node's timestamps with its peers', which is only as good as this."""

    synced: bool
    max_error_s: float | None = None
    source: str = ""


@dataclass(frozen=True)
class ReloadStatus:
    """Outcome of the last config/rules (re)load."""

    ok: bool
    error: str = ""
    t: float | None = None  # when it happened, seconds since the epoch


@dataclass
class Health:
    """An agent's report on itself, published periodically: collectors, rules, last reload and
    the transport's own backlog, so an operator sees a blind or backlogged agent from the
    controller rather than by logging into the node.

    ``drops`` counts messages this agent discarded since it started, by reason:
    ``spool_full`` (oldest findings evicted from a full spool; persisted across restarts),
    ``rejected`` (refused for good, e.g. too large), ``spool_error`` (the spool could not write,
    e.g. disk full), ``best_effort`` (summaries/health/phase not sent while disconnected).
    """

    node: str
    cluster: str
    t: float
    collectors: dict[str, CollectorHealth]
    rules: RulesHealth
    last_reload: ReloadStatus
    spool_depth: int
    drops: dict[str, int]
    agent_version: str
    clock: ClockHealth | None = None  # None: not read (older agents)
    schema: int = WIRE_SCHEMA
    kind: MessageKind = field(default=MessageKind.HEALTH, init=False)


WireMessage = Union[Finding, Summary, Health]


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def to_dict(msg: WireMessage) -> dict[str, Any]:
    """The JSON-ready dict of a message (what :func:`encode` serialises)."""
    if isinstance(msg, Finding):
        d = msg.to_dict()
        d["kind"] = MessageKind.FINDING.value
        return d
    if isinstance(msg, Summary):
        return {
            "schema": msg.schema, "kind": msg.kind.value, "node": msg.node, "cluster": msg.cluster,
            "t": float(msg.t), "interval": float(msg.interval),
            "signals": {s: {e: _finite(v) for e, v in ents.items()} for s, ents in msg.signals.items()},
            "clock_sync": {"synced": msg.clock_sync.synced, "max_error_s": _finite(msg.clock_sync.max_error_s)},
            "agent_version": msg.agent_version,
            **({"labels": dict(msg.labels)} if msg.labels else {}),
        }
    if isinstance(msg, Health):
        return {
            "schema": msg.schema, "kind": msg.kind.value, "node": msg.node, "cluster": msg.cluster,
            "t": float(msg.t),
            "collectors": {n: {"state": c.state, "reason": c.reason} for n, c in msg.collectors.items()},
            "rules": {"active": msg.rules.active, "inactive": dict(msg.rules.inactive),
                      **({"controller": list(msg.rules.controller)} if msg.rules.controller else {}),
                      **({"clock_weakened": dict(msg.rules.clock_weakened)} if msg.rules.clock_weakened else {})},
            "last_reload": {"ok": msg.last_reload.ok, "error": msg.last_reload.error, "t": msg.last_reload.t},
            "spool_depth": msg.spool_depth, "drops": dict(msg.drops),
            "agent_version": msg.agent_version,
            **({"clock": {"synced": msg.clock.synced, "max_error_s": _finite(msg.clock.max_error_s),
                          "source": msg.clock.source}} if msg.clock is not None else {}),
        }
    raise TypeError(f"not a skewd wire message: {type(msg).__name__}")


def encode(msg: WireMessage) -> bytes:
    """Compact, deterministic JSON (sorted keys, no spaces, UTF-8): equal messages give equal
    bytes, which keeps de-duplication, hashing and golden-file tests honest."""
    return json.dumps(to_dict(msg), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def headers_for(msg: WireMessage) -> dict[str, str]:
    """Headers to publish ``msg`` with. Findings carry ``Nats-Msg-Id`` = ``event_id`` so the
    stream drops re-sends; every message carries its kind and schema."""
    if isinstance(msg, Finding):
        return {HDR_MSG_ID: msg.event_id, HDR_KIND: MessageKind.FINDING.value, HDR_SCHEMA: str(msg.schema)}
    return {HDR_KIND: msg.kind.value, HDR_SCHEMA: str(msg.schema)}


def subject_for(msg: WireMessage, cluster: str | None = None) -> str:
    """The subject ``msg`` is published on; ``cluster`` overrides an empty ``msg.cluster``."""
    c = msg.cluster or (cluster or "")
    if isinstance(msg, Finding):
        return finding_subject(c, msg.node, msg.rule_id)
    if isinstance(msg, Summary):
        return summary_subject(c, msg.node)
    if isinstance(msg, Health):
        return health_subject(c, msg.node)
    raise TypeError(f"not a skewd wire message: {type(msg).__name__}")


# ---- strict decoding ------------------------------------------------------------------------

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


class _Reader:
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

    def obj(self, key: str, optional: bool = False) -> "_Reader":
        v = self._get(key, optional)
        return _Reader({} if v is None else v, f"{self.where}.{key}")

    def names(self, key: str) -> dict[str, str]:
        """An optional object of identifiers (labels): string keys and values, each bounded.
        A missing or empty value (``null``, ``[]``, ``""``) means no labels, as it always has."""
        o = _Reader(self.d.get(key) or {}, f"{self.where}.{key}")
        for k in o.d:
            o.name(k)
            if len(k) > MAX_NAME_CHARS:
                raise WireError(f"{o.where}: a key of {len(k)} characters; at most {MAX_NAME_CHARS}")
        return {str(k): v for k, v in o.d.items()}


def _check_header(d: Any, kind: MessageKind, version: int) -> None:
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


_NUMBER = (int, float)  # exact types: bool (an int subclass) is not a number on the wire


def _fast_summary(d: Mapping[str, Any]) -> Summary | None:
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


def summary_from_dict(d: Mapping[str, Any]) -> Summary:
    """A summary from its JSON object; every problem raises :class:`WireError`."""
    fast = _fast_summary(d)
    return fast if fast is not None else decode_totally("summary", _strict_summary_from_dict, d)


def _strict_summary_from_dict(d: Mapping[str, Any]) -> Summary:
    _check_header(d, MessageKind.SUMMARY, WIRE_SCHEMA)
    r = _Reader(d, "summary")
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
    _check_header(d, MessageKind.HEALTH, WIRE_SCHEMA)
    r = _Reader(d, "health")
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


def _enum(r: _Reader, key: str, cls: type[Enum]) -> Any:
    v = r.text(key)
    try:
        return cls(v)
    except ValueError:
        raise WireError(f"{r.where}: field {key!r} is {show_value(v)}, not one of "
                        f"{', '.join(str(m.value) for m in cls)}") from None  # type: ignore[attr-defined]


MATURITIES = ("", "stable", "incubating", "sandbox")


def _maturity(r: _Reader) -> str:
    """A finding's optional maturity tag (docs/rules.md, Maturity): one of the rule tags, or
    empty (an agent older than the field; the controller then takes its own rule's tag)."""
    v = r.text("maturity", default="")
    if v not in MATURITIES:
        raise WireError(f"{r.where}: field 'maturity' is {show_value(v)}, not one of stable, incubating, sandbox")
    return v


def _finding_from_dict(d: Mapping[str, Any]) -> Finding:
    _check_header(d, MessageKind.FINDING, FINDING_SCHEMA_VERSION)
    r = _Reader(d, "finding")
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
    naming the field, so a consumer catching WireError is never stopped by a payload."""
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
    return decode(data, MessageKind.SUMMARY)  # type: ignore[return-value]


def decode_health(data: bytes | str) -> Health:
    return decode(data, MessageKind.HEALTH)  # type: ignore[return-value]
