"""The JetStream streams skewd relies on, and which kinds of message are stored at all.

Findings and remap suggestions are state that must not be lost, so they are stored (file
storage, de-duplicated on ``Nats-Msg-Id``); summaries, health and phase records are periodic
snapshots sent best effort over core NATS (the reasoning is in :mod:`skewd.wire`'s docstring).
The specs are plain data; :func:`skewd.natsutil.stream_config` turns them into nats-py's.
"""
from __future__ import annotations

from dataclasses import dataclass

from .base import SUBJECT_PREFIX, MessageKind


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
