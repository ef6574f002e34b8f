"""The typed messages an agent sends about itself (Summary, Health; Finding is
:mod:`skewd.model`'s) and how they are written: deterministic JSON, headers, subject.

Writing is kept apart from reading (:mod:`skewd.wire.decoding`): what a producer emits is fixed
here once, and the strict readers are checked against it (tests/test_wire.py round-trips).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Union

from skewd.model import Finding

from .base import HDR_KIND, HDR_MSG_ID, HDR_SCHEMA, WIRE_SCHEMA, MessageKind
from .subjects import finding_subject, health_subject, placement_of, summary_subject


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
        return summary_subject(c, msg.node, placement_of(msg.labels))
    if isinstance(msg, Health):
        return health_subject(c, msg.node)
    raise TypeError(f"not a skewd wire message: {type(msg).__name__}")
