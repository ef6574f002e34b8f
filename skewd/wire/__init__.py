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

Where each part lives (this package's ``__init__`` is the public API: ``from skewd import wire``
and ``wire.<name>`` are how every side uses it):

* :mod:`skewd.wire.base` - schema version, subject root, header names, message kinds, errors;
* :mod:`skewd.wire.subjects` - subject naming and token escaping, partitions, parsing subjects;
* :mod:`skewd.wire.streams` - the JetStream streams and the best-effort kinds;
* :mod:`skewd.wire.messages` - Summary and Health, and writing any message (JSON, headers, subject);
* :mod:`skewd.wire.reader` - bounded JSON and typed field access for untrusted payloads;
* :mod:`skewd.wire.decoding` - strict decoders of findings, summaries and health;
* :mod:`skewd.wire.fastsummary` - the summary's fast decoding paths (same result as the strict one);
* :mod:`skewd.wire.binsummary` - the summary's binary encoding (layout + float64 values), its
  reader and the agent's encoder.
"""
from __future__ import annotations

from .base import (BINARY_MAGIC, HDR_KIND, HDR_MSG_ID, HDR_SCHEMA, SUBJECT_PREFIX, WIRE_SCHEMA, MessageKind, SchemaVersionError,
                   WireError)
from .binsummary import (BINARY_PREFIX, BURST_BYTES, BURST_STARTS, MAX_LAYOUT_SAMPLES, BinarySummary, LayoutBook,
                         LayoutUnknownError, SummaryEncoder, SummaryLayout, decode_binary_summary, floats, layout_id,
                         make_layout, pack, read_binary, read_layout, read_values, starts_of, summary_of, values_of)
from .decoding import (MATURITIES, BinarySummaryReader, decode, decode_finding, decode_health, decode_summary,
                       finding_from_dict, health_from_dict, summary_from_dict, summary_view)
from .messages import (ClockHealth, ClockSync, CollectorHealth, Health, ReloadStatus, RulesHealth, Summary,
                       WireMessage, encode, headers_for, subject_for, to_dict)
from .reader import (MAX_INT, MAX_JSON_DEPTH, MAX_NAME_CHARS, MAX_PAYLOAD_BYTES, MAX_TIME, decode_totally,
                     is_finite_number, json_depth_exceeds, load_json, show_value)
from .streams import BEST_EFFORT_KINDS, FINDINGS_STREAM, REMAPS_STREAM, STREAMS, StreamSpec
from .subjects import (EMPTY_TOKEN, PARTITIONED_SUMMARY, SUBJECT_TOKENS, ParsedSubject, digest_subject,
                       finding_subject, health_subject, parse_subject, partition_mapping_conf, partition_mappings,
                       partition_of, phase_subject, placement_of, remap_subject, subject_filter, summary_filters,
                       summary_subject, token, untoken)

__all__ = [
    "BINARY_MAGIC", "BINARY_PREFIX", "BURST_BYTES", "BURST_STARTS", "MAX_LAYOUT_SAMPLES", "BinarySummary", "BinarySummaryReader", "LayoutBook",
    "LayoutUnknownError", "SummaryEncoder", "SummaryLayout", "decode_binary_summary", "floats", "layout_id", "starts_of", "make_layout",
    "pack", "read_binary", "read_layout", "read_values", "summary_of", "values_of",
    "BEST_EFFORT_KINDS", "EMPTY_TOKEN", "FINDINGS_STREAM", "HDR_KIND", "HDR_MSG_ID", "HDR_SCHEMA", "MATURITIES",
    "MAX_INT", "MAX_JSON_DEPTH", "MAX_NAME_CHARS", "MAX_PAYLOAD_BYTES", "MAX_TIME", "PARTITIONED_SUMMARY",
    "REMAPS_STREAM", "STREAMS", "SUBJECT_PREFIX", "SUBJECT_TOKENS", "WIRE_SCHEMA", "ClockHealth", "ClockSync",
    "CollectorHealth", "Health", "MessageKind", "ParsedSubject", "ReloadStatus", "RulesHealth", "SchemaVersionError",
    "StreamSpec", "Summary", "WireError", "WireMessage", "decode", "decode_finding", "decode_health",
    "decode_summary", "decode_totally", "digest_subject", "encode", "finding_from_dict", "finding_subject",
    "headers_for", "health_from_dict", "health_subject", "is_finite_number", "json_depth_exceeds", "load_json",
    "parse_subject", "partition_mapping_conf", "partition_mappings", "partition_of", "phase_subject",
    "placement_of", "remap_subject", "show_value", "subject_filter", "subject_for", "summary_filters",
    "summary_from_dict", "summary_subject", "summary_view", "to_dict", "token", "untoken",
]
