"""What every part of the wire contract shares: the schema version, the subject root, the
header names, the kinds of message, and the error a reader raises.

The bottom of :mod:`skewd.wire`: subjects, streams, messages and decoders all name these, so they
live apart from each of them (a reader of subjects must not import the message decoders).
"""
from __future__ import annotations

from enum import Enum

#: Schema version of the messages of :mod:`skewd.wire.messages` (Summary, Health). Findings carry
#: :data:`skewd.model.SCHEMA_VERSION`; both are 1 today and bump independently.
WIRE_SCHEMA = 1

#: Root of every skewd subject. The ``v1`` token is the subject-space version (see module doc).
SUBJECT_PREFIX = "skewd.v1"

#: Header carrying the JetStream de-duplication id (server-defined name).
HDR_MSG_ID = "Nats-Msg-Id"
#: Headers we add so a consumer can route or refuse a message without parsing its body.
HDR_KIND = "Skewd-Kind"
HDR_SCHEMA = "Skewd-Schema"

#: The first bytes of a binary summary (:mod:`skewd.wire.binsummary`): ``0x93`` is a UTF-8
#: continuation byte, which no UTF-8 text (no JSON payload) can start with, so a reader tells
#: the two encodings apart by the first byte.
BINARY_MAGIC = b"\x93SK"


class MessageKind(str, Enum):
    """What a message is; also the third subject token."""

    FINDING = "finding"
    SUMMARY = "summary"
    HEALTH = "health"
    REMAP = "remap"
    PHASE = "phase"


class WireError(ValueError):
    """A message or subject that does not follow this contract (bad JSON, missing field, ...)."""


class SchemaVersionError(WireError):
    """A message from a different schema version than this skewd reads."""
