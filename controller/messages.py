"""Wire messages the controller adds to :mod:`skewd.wire`: incidents, remap suggestions, the
request/reply that acknowledges them, and the vLLM plugin's phase records.

Same conventions as :mod:`skewd.wire`: a dataclass per message, an ``int`` ``schema`` and a
string ``kind`` in every payload, compact sorted JSON, and strict decoding that names the field
that is wrong. Within schema 1 fields are only ever added (optional) and readers ignore keys
they do not know.

Subjects::

    skewd.v1.remap.<cluster>          JetStream SKEWD_REMAPS (wire.REMAPS_STREAM), Nats-Msg-Id = key
    skewd.v1.incident.<cluster>       JetStream SKEWD_INCIDENTS (below), Nats-Msg-Id = incident id + digest
    skewd.v1.remap_reply.<cluster>    core NATS request/reply: RemapReply in, RemapReceipt back
    skewd.v1.phase.<cluster>.<node>.<engine>   core NATS, best effort (vLLM plugin)

The reply subject sits outside ``skewd.v1.remap.>`` on purpose: a request published on a
stream subject would be stored and answered by JetStream itself with a PubAck.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Sequence, Union

from skewd import wire
from skewd.wire import SchemaVersionError, WireError

SCHEMA = 1
SUBJECT_PREFIX = wire.SUBJECT_PREFIX


class Kind(str, Enum):
    INCIDENT = "incident"
    REMAP = wire.MessageKind.REMAP.value
    REMAP_REPLY = "remap_reply"
    REMAP_RECEIPT = "remap_receipt"
    PHASE = wire.MessageKind.PHASE.value


def incident_subject(cluster: str) -> str:
    return f"{SUBJECT_PREFIX}.incident.{wire.token(cluster)}"


def reply_subject(cluster: str) -> str:
    """Where consumers send :class:`RemapReply` requests (core NATS request/reply)."""
    return f"{SUBJECT_PREFIX}.remap_reply.{wire.token(cluster)}"


#: Incidents (correlated findings with culprit, cause, phase and effect): durable so a client
#: that connects late can read the open ones; de-duplicated on id + content digest because
#: every controller replica publishes the same incident update.
INCIDENTS_STREAM = wire.StreamSpec(
    name="SKEWD_INCIDENTS",
    subjects=(f"{SUBJECT_PREFIX}.incident.>",),
    description="skewd incidents: correlated findings with culprit, root cause, phase and effect",
    max_age_s=7 * 86400.0,
    max_bytes=256 << 20,
)


class Phase(str, Enum):
    """What an engine spent its steps on. Codes match ``summary_engine_phase`` (0, 1, 2)."""

    IDLE = "idle"
    DECODE = "decode_heavy"
    PREFILL = "prefill_heavy"

    @property
    def code(self) -> int:
        return {"idle": 0, "decode_heavy": 1, "prefill_heavy": 2}[self.value]

    @classmethod
    def from_code(cls, code: float | None) -> "Phase | None":
        if code is None or code != code:
            return None
        return _PHASE_OF_CODE.get(int(round(code)))


_PHASE_OF_CODE = {0: Phase.IDLE, 1: Phase.DECODE, 2: Phase.PREFILL}


class ActionType(str, Enum):
    """Remap actions, with how disruptive each is (planner orders by it, lowest first)."""

    HOST_TUNING = "host_tuning"  # a command on one host; no traffic moves
    REROUTE = "reroute"  # change a router weight; requests move, nothing restarts
    CAP_CONCURRENCY = "cap_concurrency"  # lower max-num-seqs / max-model-len: fewer requests in flight
    REBALANCE_SHARDS = "rebalance_shards"  # re-split work across ranks
    MOVE_PP_RANK = "move_pp_rank"  # restart a pipeline stage elsewhere
    MOVE_TP_RANK = "move_tp_rank"  # restart a tensor-parallel group with a node replaced
    DRAIN_RECLAIM = "drain_reclaim"  # take a GPU/node out of service

    @property
    def disruption(self) -> int:
        return DISRUPTION[self]


DISRUPTION = {ActionType.HOST_TUNING: 0, ActionType.REROUTE: 1, ActionType.CAP_CONCURRENCY: 2,
              ActionType.REBALANCE_SHARDS: 3, ActionType.MOVE_PP_RANK: 4, ActionType.MOVE_TP_RANK: 4,
              ActionType.DRAIN_RECLAIM: 5}


class Decision(str, Enum):
    ACK = "ack"
    REJECT = "reject"


class ReceiptStatus(str, Enum):
    RECORDED = "recorded"  # first reply of this consumer with this decision
    DUPLICATE = "duplicate"  # same consumer, same decision, already recorded
    UNKNOWN = "unknown"  # no suggestion with that key
    EXPIRED = "expired"  # recorded, but the suggestion's TTL had passed
    INVALID = "invalid"  # the request could not be parsed


class SuggestionStatus(str, Enum):
    """Lifecycle of a suggestion in the controller's KV (not on the wire message itself)."""

    PLANNED = "planned"  # stored, not yet confirmed published
    PUBLISHED = "published"
    ACKED = "acked"
    REJECTED = "rejected"
    EXPIRED = "expired"


# --------------------------------------------------------------------------------------------
# Shared parts
# --------------------------------------------------------------------------------------------

def _f(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


@dataclass(frozen=True)
class Target:
    """What an action applies to. Empty strings are "not applicable"."""

    node: str = ""
    entity: str = ""
    tp_group: str = ""
    pp_group: str = ""
    model: str = ""
    engine: str = ""

    def to_dict(self) -> dict[str, str]:
        return {k: v for k, v in self.__dict__.items() if v}


@dataclass(frozen=True)
class Cause:
    """Root-cause attribution: which layer, why (runbook logic), how sure."""

    layer: str  # skewd.model.Layer value, or "unknown"
    reason: str
    confidence: float
    evidence: dict[str, float | None] = field(default_factory=dict)
    findings: tuple[str, ...] = ()  # ids of the findings the attribution rests on

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "reason": self.reason, "confidence": round(self.confidence, 4),
                "evidence": {k: _f(v) for k, v in self.evidence.items()}, "findings": list(self.findings)}


@dataclass(frozen=True)
class PhaseContext:
    """The engine's state when the incident started: from plugin phase records or summaries."""

    engine: str  # "<node>/<engine>" or "<node>" when only the summary phase is known
    phase: str  # Phase value or "unknown"
    kv_usage_ratio: float | None = None
    waiting: float | None = None
    running: float | None = None
    t: float | None = None
    source: str = ""  # "plugin" | "summary" | ""

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "phase": self.phase, "kv_usage_ratio": _f(self.kv_usage_ratio),
                "waiting": _f(self.waiting), "running": _f(self.running), "t": _f(self.t), "source": self.source}


@dataclass(frozen=True)
class Effect:
    """What the engine's users saw: TTFT, inter-token latency and queue growth during the
    incident, against the baseline just before it. ``None`` = not observed (no plugin data)."""

    ttft_s: float | None = None
    ttft_baseline_s: float | None = None
    itl_s: float | None = None
    itl_baseline_s: float | None = None
    queue_growth_per_s: float | None = None
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"ttft_s": _f(self.ttft_s), "ttft_baseline_s": _f(self.ttft_baseline_s), "itl_s": _f(self.itl_s),
                "itl_baseline_s": _f(self.itl_baseline_s), "queue_growth_per_s": _f(self.queue_growth_per_s),
                "description": self.description}


@dataclass(frozen=True)
class RemapAction:
    """One typed action. ``key`` is its own idempotency key (a consumer may ack actions singly)."""

    key: str
    type: ActionType
    target: Target
    rationale: str
    evidence: tuple[str, ...]
    confidence: float
    expected_effect: str
    ttl_s: float
    params: dict[str, Any] = field(default_factory=dict)
    command: str = ""  # host_tuning: the concrete command to run on target.node

    @property
    def disruption(self) -> int:
        return self.type.disruption

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "type": self.type.value, "target": self.target.to_dict(),
                "rationale": self.rationale, "evidence": list(self.evidence),
                "confidence": round(self.confidence, 4), "expected_effect": self.expected_effect,
                "ttl_s": self.ttl_s, "params": dict(self.params), "command": self.command,
                "disruption": self.disruption}


# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------

@dataclass
class Incident:
    """Correlated findings: grouped (Alertmanager ``group_by``), with the culprit, the victims
    whose findings are inhibited, the attributed cause, the engine phase and the effect."""

    id: str
    cluster: str
    pathology: str
    rule_id: str
    state: str  # "open" | "resolved" | "inhibited"
    group: dict[str, str]  # e.g. {"tp_group": "tp0"} or {"node": "n3"}
    culprit: Target | None
    cause: Cause | None
    victims: list[str]
    findings: list[str]  # member finding ids (not inhibited)
    inhibited: list[str]  # finding ids suppressed because this incident explains them
    phase: PhaseContext | None
    effect: Effect | None
    summary: str
    opened_at: float
    updated_at: float
    resolved_at: float | None = None
    #: set when every member finding became explained by another incident (state "inhibited")
    inhibited_by: str = ""
    #: why a resolved incident resolved when it was not its findings' own verdict: "node silent"
    #: (the controller stopped hearing from the node: docs/controller.md, Stale nodes)
    resolved_reason: str = ""
    schema: int = SCHEMA
    kind: Kind = field(default=Kind.INCIDENT, init=False)

    def digest(self) -> str:
        """Identity of the incident's *content* that matters for de-duplication: state,
        membership, culprit and cause layer (not the drifting phase/effect numbers)."""
        key = [self.id, self.state, sorted(self.findings), sorted(self.inhibited),
               self.culprit.node if self.culprit else "", self.cause.layer if self.cause else ""]
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "kind": self.kind.value, "id": self.id, "cluster": self.cluster,
                "pathology": self.pathology, "rule_id": self.rule_id, "state": self.state,
                "group": dict(self.group), "culprit": self.culprit.to_dict() if self.culprit else None,
                "cause": self.cause.to_dict() if self.cause else None, "victims": list(self.victims),
                "findings": list(self.findings), "inhibited": list(self.inhibited),
                "phase": self.phase.to_dict() if self.phase else None,
                "effect": self.effect.to_dict() if self.effect else None, "summary": self.summary,
                "opened_at": self.opened_at, "updated_at": self.updated_at, "resolved_at": _f(self.resolved_at),
                "inhibited_by": self.inhibited_by,
                **({"resolved_reason": self.resolved_reason} if self.resolved_reason else {})}


@dataclass
class RemapSuggestion:
    """A plan for one incident: actions ordered least disruptive first. ``key`` is the
    idempotency key (``Nats-Msg-Id``; the KV record's key); consumers reply with it."""

    key: str
    cluster: str
    incident: str
    pathology: str
    created_at: float
    expires_at: float
    ttl_s: float
    culprit: Target | None
    cause: Cause | None
    phase: PhaseContext | None
    effect: Effect | None
    actions: list[RemapAction]
    evidence: list[str]
    confidence: float
    summary: str
    controller: str = ""
    schema: int = SCHEMA
    kind: Kind = field(default=Kind.REMAP, init=False)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "kind": self.kind.value, "key": self.key, "cluster": self.cluster,
                "incident": self.incident, "pathology": self.pathology, "created_at": self.created_at,
                "expires_at": self.expires_at, "ttl_s": self.ttl_s,
                "culprit": self.culprit.to_dict() if self.culprit else None,
                "cause": self.cause.to_dict() if self.cause else None,
                "phase": self.phase.to_dict() if self.phase else None,
                "effect": self.effect.to_dict() if self.effect else None,
                "actions": [a.to_dict() for a in self.actions], "evidence": list(self.evidence),
                "confidence": round(self.confidence, 4), "summary": self.summary, "controller": self.controller}


@dataclass
class RemapReply:
    """A consumer's answer to a suggestion (request on :func:`reply_subject`). ``actions``
    narrows the answer to some action keys; empty = the whole suggestion."""

    key: str
    decision: Decision
    consumer: str
    reason: str = ""
    t: float = 0.0
    actions: list[str] = field(default_factory=list)
    schema: int = SCHEMA
    kind: Kind = field(default=Kind.REMAP_REPLY, init=False)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "kind": self.kind.value, "key": self.key, "decision": self.decision.value,
                "consumer": self.consumer, "reason": self.reason, "t": self.t, "actions": list(self.actions)}


@dataclass
class RemapReceipt:
    """The controller's answer to a :class:`RemapReply`: whether and how it was recorded."""

    key: str
    status: ReceiptStatus
    decision: str = ""
    error: str = ""
    recorded_at: float | None = None
    schema: int = SCHEMA
    kind: Kind = field(default=Kind.REMAP_RECEIPT, init=False)

    @property
    def ok(self) -> bool:
        return self.status in (ReceiptStatus.RECORDED, ReceiptStatus.DUPLICATE, ReceiptStatus.EXPIRED)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "kind": self.kind.value, "key": self.key, "status": self.status.value,
                "decision": self.decision, "error": self.error, "recorded_at": _f(self.recorded_at)}


@dataclass(frozen=True)
class StepStat:
    """One engine step (SchedulerStats.iteration_details + gauges at that step)."""

    t: float
    index: int
    ctx_reqs: int
    ctx_tokens: int
    gen_reqs: int
    gen_tokens: int
    elapsed_s: float | None
    running: int
    waiting: int
    kv_usage_ratio: float

    def to_dict(self) -> dict[str, Any]:
        return {"t": self.t, "i": self.index, "ctx_reqs": self.ctx_reqs, "ctx_tokens": self.ctx_tokens,
                "gen_reqs": self.gen_reqs, "gen_tokens": self.gen_tokens, "elapsed_s": _f(self.elapsed_s),
                "running": self.running, "waiting": self.waiting, "kv": self.kv_usage_ratio}


@dataclass(frozen=True)
class FinishedStat:
    """A finished request's phase times (IterationStats.finished_requests)."""

    t: float
    queued_s: float
    prefill_s: float
    decode_s: float
    prompt_tokens: int
    gen_tokens: int
    finish_reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"t": self.t, "queued_s": self.queued_s, "prefill_s": self.prefill_s, "decode_s": self.decode_s,
                "prompt_tokens": self.prompt_tokens, "gen_tokens": self.gen_tokens,
                "finish_reason": self.finish_reason}


@dataclass
class PhaseRecord:
    """What one vLLM engine did during ``[t_start, t]``: its steps (prefill/decode split, KV,
    queue), the requests that finished and the TTFT / ITL it observed. Published by the
    stat-logger plugin at a bounded rate (one record per engine per period)."""

    node: str
    cluster: str
    engine: str
    model: str
    t_start: float
    t: float
    phase: Phase
    steps: list[StepStat]
    finished: list[FinishedStat]
    ttft_s: list[float]
    itl_count: int
    itl_sum_s: float
    itl_max_s: float | None
    dropped: dict[str, int]  # cumulative since the plugin started: queue_full, disconnected, truncated
    plugin_version: str = ""
    schema: int = SCHEMA
    kind: Kind = field(default=Kind.PHASE, init=False)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "kind": self.kind.value, "node": self.node, "cluster": self.cluster,
                "engine": self.engine, "model": self.model, "t_start": self.t_start, "t": self.t,
                "phase": self.phase.value, "steps": [s.to_dict() for s in self.steps],
                "finished": [f.to_dict() for f in self.finished], "ttft_s": list(self.ttft_s),
                "itl_count": self.itl_count, "itl_sum_s": self.itl_sum_s, "itl_max_s": _f(self.itl_max_s),
                "dropped": dict(self.dropped), "plugin_version": self.plugin_version}


def classify_steps(steps: Sequence[StepStat]) -> Phase:
    """What the period's requests spent their time on: every request in a step spends that
    step's time in its phase, so prefill time is the sum of ``elapsed_s x ctx_reqs`` over the
    steps and decode time the sum of ``elapsed_s x gen_reqs`` (a step without a duration counts
    as one unit). That is the request-time split vLLM's own prefill/decode time histograms
    measure, which the vllm collector's phase uses too. Not tokens: a chat engine with prompts
    five times its answers processes mostly prompt tokens but spends nearly all its time
    decoding, since prompt tokens go through in parallel and each generated token costs a step.
    Idle when no step did any work."""
    if not any(s.ctx_tokens > 0 or s.gen_tokens > 0 for s in steps):
        return Phase.IDLE
    prefill = sum((s.elapsed_s if s.elapsed_s is not None else 1.0) * s.ctx_reqs for s in steps)
    decode = sum((s.elapsed_s if s.elapsed_s is not None else 1.0) * s.gen_reqs for s in steps)
    return Phase.PREFILL if prefill > decode else Phase.DECODE


ControllerMessage = Union[Incident, RemapSuggestion, RemapReply, RemapReceipt, PhaseRecord]


def encode(msg: ControllerMessage) -> bytes:
    return json.dumps(msg.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


# --------------------------------------------------------------------------------------------
# Strict decoding
# --------------------------------------------------------------------------------------------

class _R:
    """Typed access to one JSON object; errors name the message and the field path."""

    def __init__(self, d: Any, where: str) -> None:
        if not isinstance(d, Mapping):
            raise WireError(f"{where}: expected a JSON object, got {type(d).__name__}")
        self.d, self.where = d, where

    def _get(self, k: str, optional: bool) -> Any:
        if k not in self.d or self.d[k] is None:
            if optional:
                return None
            raise WireError(f"{self.where}: missing field {k!r}")
        return self.d[k]

    def _bad(self, k: str, want: str, v: Any) -> WireError:
        return WireError(f"{self.where}: field {k!r} must be {want}, got {type(v).__name__} {wire.show_value(v)}")

    def s(self, k: str, default: str | None = None) -> str:
        v = self._get(k, default is not None)
        if v is None:
            return default  # type: ignore[return-value]
        if not isinstance(v, str):
            raise self._bad(k, "a string", v)
        return v

    def n(self, k: str, optional: bool = False) -> float | None:
        """A finite number (``wire``'s rule: an int within int64 or a finite float)."""
        v = self._get(k, optional)
        if v is None:
            return None
        if not wire.is_finite_number(v):
            raise self._bad(k, "a finite number", v)
        return float(v)

    def i(self, k: str, default: int | None = None) -> int:
        v = self._get(k, default is not None)
        if v is None:
            return default  # type: ignore[return-value]
        if type(v) is not int or not -wire.MAX_INT <= v <= wire.MAX_INT:
            raise self._bad(k, "an integer", v)
        return v

    def o(self, k: str, optional: bool = False) -> "_R | None":
        v = self._get(k, optional)
        return None if v is None else _R(v, f"{self.where}.{k}")

    def lst(self, k: str, optional: bool = True) -> list:
        v = self._get(k, optional)
        if v is None:
            return []
        if not isinstance(v, list):
            raise self._bad(k, "a list", v)
        return v

    def strs(self, k: str) -> list[str]:
        out = self.lst(k)
        if not all(isinstance(x, str) for x in out):
            raise WireError(f"{self.where}: field {k!r} must be a list of strings")
        return out

    def nums(self, k: str) -> list[float]:
        out = self.lst(k)
        if not all(wire.is_finite_number(x) for x in out):
            raise WireError(f"{self.where}: field {k!r} must be a list of finite numbers")
        return [float(x) for x in out]

    def enum(self, k: str, cls: type[Enum]) -> Any:
        v = self.s(k)
        try:
            return cls(v)
        except ValueError:
            raise WireError(f"{self.where}: field {k!r} is {v!r}, not one of "
                            f"{', '.join(m.value for m in cls)}") from None  # type: ignore[attr-defined]

    def num_map(self, k: str) -> dict[str, float | None]:
        o = self.o(k, optional=True)
        return {} if o is None else {x: o.n(x, optional=True) for x in o.d}

    def int_map(self, k: str) -> dict[str, int]:
        o = self.o(k, optional=True)
        return {} if o is None else {x: o.i(x) for x in o.d}


def _header(d: Any, kind: Kind) -> _R:
    if not isinstance(d, Mapping):
        raise WireError(f"{kind.value}: expected a JSON object, got {type(d).__name__}")
    if d.get("schema") != SCHEMA:
        raise SchemaVersionError(f"{kind.value} message has schema {d.get('schema')!r}; this skewd reads "
                                 f"schema {SCHEMA} only (upgrade the older side)")
    if d.get("kind") != kind.value:
        raise WireError(f"expected a {kind.value} message, got kind {d.get('kind')!r}")
    return _R(d, kind.value)


def _target(r: _R | None) -> Target | None:
    if r is None:
        return None
    return Target(**{k: r.s(k, default="") for k in Target.__dataclass_fields__})


def _cause(r: _R | None) -> Cause | None:
    if r is None:
        return None
    return Cause(layer=r.s("layer"), reason=r.s("reason", default=""), confidence=r.n("confidence") or 0.0,
                 evidence=r.num_map("evidence"), findings=tuple(r.strs("findings")))


def _phase(r: _R | None) -> PhaseContext | None:
    if r is None:
        return None
    return PhaseContext(engine=r.s("engine", default=""), phase=r.s("phase", default="unknown"),
                        kv_usage_ratio=r.n("kv_usage_ratio", True), waiting=r.n("waiting", True),
                        running=r.n("running", True), t=r.n("t", True), source=r.s("source", default=""))


def _effect(r: _R | None) -> Effect | None:
    if r is None:
        return None
    return Effect(ttft_s=r.n("ttft_s", True), ttft_baseline_s=r.n("ttft_baseline_s", True),
                  itl_s=r.n("itl_s", True), itl_baseline_s=r.n("itl_baseline_s", True),
                  queue_growth_per_s=r.n("queue_growth_per_s", True), description=r.s("description", default=""))


def _action(d: Any, where: str) -> RemapAction:
    r = _R(d, where)
    params = r.o("params", optional=True)
    pv: dict[str, Any] = {}
    for k, v in (params.d.items() if params else ()):
        if type(v) is not str and not wire.is_finite_number(v):
            raise WireError(f"{where}.params: {k!r} must be a finite number or a string")
        pv[k] = v
    return RemapAction(key=r.s("key"), type=r.enum("type", ActionType), target=_target(r.o("target")) or Target(),
                       rationale=r.s("rationale", default=""), evidence=tuple(r.strs("evidence")),
                       confidence=r.n("confidence") or 0.0, expected_effect=r.s("expected_effect", default=""),
                       ttl_s=r.n("ttl_s") or 0.0, params=pv, command=r.s("command", default=""))


def incident_from_dict(d: Mapping[str, Any]) -> Incident:
    r = _header(d, Kind.INCIDENT)
    grp = r.o("group", optional=True)
    return Incident(id=r.s("id"), cluster=r.s("cluster"), pathology=r.s("pathology"), rule_id=r.s("rule_id"),
                    state=r.s("state"), group={k: grp.s(k) for k in grp.d} if grp else {},
                    culprit=_target(r.o("culprit", True)), cause=_cause(r.o("cause", True)),
                    victims=r.strs("victims"), findings=r.strs("findings"), inhibited=r.strs("inhibited"),
                    phase=_phase(r.o("phase", True)), effect=_effect(r.o("effect", True)),
                    summary=r.s("summary", default=""), opened_at=r.n("opened_at"),  # type: ignore[arg-type]
                    updated_at=r.n("updated_at"), resolved_at=r.n("resolved_at", True),  # type: ignore[arg-type]
                    inhibited_by=r.s("inhibited_by", default=""), resolved_reason=r.s("resolved_reason", default=""))


def suggestion_from_dict(d: Mapping[str, Any]) -> RemapSuggestion:
    r = _header(d, Kind.REMAP)
    actions = [_action(a, f"remap.actions[{i}]") for i, a in enumerate(r.lst("actions", optional=False))]
    return RemapSuggestion(
        key=r.s("key"), cluster=r.s("cluster"), incident=r.s("incident"), pathology=r.s("pathology"),
        created_at=r.n("created_at"), expires_at=r.n("expires_at"), ttl_s=r.n("ttl_s"),  # type: ignore[arg-type]
        culprit=_target(r.o("culprit", True)), cause=_cause(r.o("cause", True)), phase=_phase(r.o("phase", True)),
        effect=_effect(r.o("effect", True)), actions=actions, evidence=r.strs("evidence"),
        confidence=r.n("confidence") or 0.0, summary=r.s("summary", default=""),
        controller=r.s("controller", default=""))


def reply_from_dict(d: Mapping[str, Any]) -> RemapReply:
    r = _header(d, Kind.REMAP_REPLY)
    consumer = r.s("consumer")
    if not consumer:
        raise WireError("remap_reply: field 'consumer' must name who answers (e.g. the router's id)")
    return RemapReply(key=r.s("key"), decision=r.enum("decision", Decision), consumer=consumer,
                      reason=r.s("reason", default=""), t=r.n("t", True) or 0.0, actions=r.strs("actions"))


def receipt_from_dict(d: Mapping[str, Any]) -> RemapReceipt:
    r = _header(d, Kind.REMAP_RECEIPT)
    return RemapReceipt(key=r.s("key", default=""), status=r.enum("status", ReceiptStatus),
                        decision=r.s("decision", default=""), error=r.s("error", default=""),
                        recorded_at=r.n("recorded_at", True))


def phase_from_dict(d: Mapping[str, Any]) -> PhaseRecord:
    r = _header(d, Kind.PHASE)
    steps = []
    for i, s in enumerate(r.lst("steps")):
        q = _R(s, f"phase.steps[{i}]")
        steps.append(StepStat(t=q.n("t"), index=q.i("i", 0), ctx_reqs=q.i("ctx_reqs", 0),  # type: ignore[arg-type]
                              ctx_tokens=q.i("ctx_tokens", 0), gen_reqs=q.i("gen_reqs", 0),
                              gen_tokens=q.i("gen_tokens", 0), elapsed_s=q.n("elapsed_s", True),
                              running=q.i("running", 0), waiting=q.i("waiting", 0), kv_usage_ratio=q.n("kv") or 0.0))
    fin = []
    for i, f in enumerate(r.lst("finished")):
        q = _R(f, f"phase.finished[{i}]")
        fin.append(FinishedStat(t=q.n("t"), queued_s=q.n("queued_s") or 0.0, prefill_s=q.n("prefill_s") or 0.0,  # type: ignore[arg-type]
                                decode_s=q.n("decode_s") or 0.0, prompt_tokens=q.i("prompt_tokens", 0),
                                gen_tokens=q.i("gen_tokens", 0), finish_reason=q.s("finish_reason", default="")))
    return PhaseRecord(node=r.s("node"), cluster=r.s("cluster"), engine=r.s("engine"), model=r.s("model", default=""),
                       t_start=r.n("t_start"), t=r.n("t"), phase=r.enum("phase", Phase),  # type: ignore[arg-type]
                       steps=steps, finished=fin, ttft_s=r.nums("ttft_s"), itl_count=r.i("itl_count", 0),
                       itl_sum_s=r.n("itl_sum_s", True) or 0.0, itl_max_s=r.n("itl_max_s", True),
                       dropped=r.int_map("dropped"), plugin_version=r.s("plugin_version", default=""))


_DECODERS = {Kind.INCIDENT: incident_from_dict, Kind.REMAP: suggestion_from_dict, Kind.REMAP_REPLY: reply_from_dict,
             Kind.REMAP_RECEIPT: receipt_from_dict, Kind.PHASE: phase_from_dict}


def decode(data: bytes | str, expect: Kind | str | None = None) -> ControllerMessage:
    """Strict parse of one of this module's messages (see :func:`skewd.wire.decode`): bounded
    JSON (size, depth, no NaN/Infinity), finite numbers, and *every* failure raised as
    :class:`WireError`, so a consumer catching it is never stopped by a payload."""
    d = wire.load_json(data)
    if not isinstance(d, dict):
        raise WireError(f"payload must be a JSON object, got {type(d).__name__}")
    try:
        kind = Kind(expect if expect is not None else d.get("kind"))
    except (ValueError, TypeError):
        raise WireError(f"payload has unknown or missing kind {wire.show_value(d.get('kind'))}") from None
    return wire.decode_totally(kind.value, _DECODERS[kind], d)


def headers(msg: ControllerMessage, msg_id: str | None = None) -> dict[str, str]:
    h = {wire.HDR_KIND: msg.kind.value, wire.HDR_SCHEMA: str(msg.schema)}
    if msg_id:
        h[wire.HDR_MSG_ID] = msg_id
    return h


def stable_key(*parts: Any, n: int = 20) -> str:
    """A short deterministic id from JSON-able parts: the same inputs on any replica, after any
    restart, give the same key (idempotency keys, action keys)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:n]
