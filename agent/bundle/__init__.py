"""Capture bundles: the on-disk format the recorder writes and replay reads (docs/capture-format.md).

A bundle is a directory of *segments*; a segment is a directory holding one stretch of one
agent's life: ``meta.json`` (what, where, which rules), ``samples.arrow`` and ``ticks.arrow``
(Arrow IPC *stream* format, so a segment cut short by a crash still opens with pyarrow),
``findings.jsonl`` and ``summaries.jsonl`` (what the agent raised and reported), optionally
``packets.pcapng``, a copy of the rule files in ``rules/``, and ``index.jsonl``.

Why an index: Arrow IPC and JSON lines carry no checksums, and a post-mortem tool must not
silently evaluate rules over flipped bits. Every append to a data file is one *chunk*, and
``index.jsonl`` records its file, byte offset, length and CRC32 (plus the time range and the
batch numbers it covers, which replay uses to stop exactly where damage begins). Each index
line carries a CRC32 of itself too. Nothing is pickled: the formats are Arrow, JSON and
pcapng, readable without skewd.

One idea per module; this package re-exports what the recorder, replay, the lab and the tools
use, so ``from skewd.agent import bundle`` is the way in:

- :mod:`.format`: file names, Arrow schemas, canonical index lines and their CRC;
- :mod:`.validate`: :class:`BundleLimits` and the field-by-field checks of untrusted content;
- :mod:`.writer`: :class:`SegmentWriter` (one CRC-indexed chunk per append);
- :mod:`.pcapng`: the pcapng blocks of ``packets.pcapng``;
- :mod:`.reader`: :class:`Segment` (verification, :class:`Damage`, :class:`BundleError`);
- :mod:`.columns`: Arrow columns as numpy arrays.
"""
from __future__ import annotations

from .format import (CAPTURES_DIR, FINDINGS, FORMAT, FORMAT_VERSION, INDEX, META, PACKETS, RULES_DIR, SAMPLES,
                     SAMPLES_SCHEMA, SUMMARIES, TICKS, TICKS_SCHEMA, canon, line_crc, spec_from_dict, spec_to_dict)
from .pcapng import pcapng_interface, pcapng_packet, pcapng_section_header
from .reader import BundleError, Chunk, Damage, FileView, Segment, find_segments, is_segment
from .validate import DEFAULT_LIMITS, BundleLimits, loads_bounded, loads_bounded_lenient
from .writer import SegmentWriter, remove_segment, segment_dirs

__all__ = [
    "CAPTURES_DIR", "FINDINGS", "FORMAT", "FORMAT_VERSION", "INDEX", "META", "PACKETS", "RULES_DIR", "SAMPLES",
    "SAMPLES_SCHEMA", "SUMMARIES", "TICKS", "TICKS_SCHEMA", "canon", "line_crc", "spec_from_dict", "spec_to_dict",
    "pcapng_interface", "pcapng_packet", "pcapng_section_header",
    "BundleError", "Chunk", "Damage", "FileView", "Segment", "find_segments", "is_segment",
    "DEFAULT_LIMITS", "BundleLimits", "loads_bounded", "loads_bounded_lenient",
    "SegmentWriter", "remove_segment", "segment_dirs",
]
